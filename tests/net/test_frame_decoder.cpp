// test_frame_decoder.cpp: the net actor's msgpack stream framing, without sockets.
//
// Checks: frames split at every byte boundary are reassembled; many frames in one read come out
// in order; a stream that goes past max_frame_bytes without completing a frame is refused
// before the rest arrives; a complete frame over the limit is refused; a header declaring a
// 4-billion-element array is refused without allocating; malformed bytes and excessive nesting
// are refused; after an error the decoder stays failed.
#include <gtest/gtest.h>

#include <string>

#include "net/frame_decoder.hpp"

namespace {

using ordo::net::frame_decoder;

std::string packed_request(uint64_t id, const std::string& pad = "") {
    msgpack::sbuffer b;
    msgpack::packer<msgpack::sbuffer> pk(b);
    pk.pack_map(3);
    pk.pack("id"), pk.pack(id);
    pk.pack("op"), pk.pack("health");
    pk.pack("pad"), pk.pack(pad);
    return {b.data(), b.size()};
}

TEST(frame_decoder, byte_by_byte_reassembly) {
    frame_decoder d(1024);
    std::string bytes = packed_request(1) + packed_request(2, "xyz");
    std::vector<uint64_t> ids;
    for (char c : bytes) {
        d.feed(&c, 1);
        while (true) {
            auto r = d.next();
            ASSERT_TRUE(r.ok()) << r.err().message;
            if (!r->has_value()) break;
            ids.push_back((*r)->get().via.map.ptr[0].val.via.u64);
        }
    }
    EXPECT_EQ(ids, (std::vector<uint64_t>{1, 2}));
}

TEST(frame_decoder, many_frames_in_one_read) {
    frame_decoder d(1024);
    std::string bytes;
    for (uint64_t i = 1; i <= 100; i++) bytes += packed_request(i);
    d.feed(bytes.data(), bytes.size());
    for (uint64_t i = 1; i <= 100; i++) {
        auto r = d.next();
        ASSERT_TRUE(r.ok() && r->has_value());
        EXPECT_EQ((*r)->get().via.map.ptr[0].val.via.u64, i);
    }
    auto r = d.next();
    ASSERT_TRUE(r.ok());
    EXPECT_FALSE(r->has_value());
    EXPECT_EQ(d.frames(), 100u);
}

TEST(frame_decoder, incomplete_frame_over_limit_is_refused_early) {
    frame_decoder d(256);
    std::string big = packed_request(1, std::string(10000, 'a'));
    d.feed(big.data(), 300);  // only the first 300 bytes: still incomplete, already over
    auto r = d.next();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.err().code, "bad_frame");
    // Sticky: more bytes do not revive it.
    d.feed(big.data() + 300, big.size() - 300);
    EXPECT_FALSE(d.next().ok());
}

TEST(frame_decoder, complete_frame_over_limit_is_refused) {
    frame_decoder d(64);
    std::string big = packed_request(1, std::string(60, 'a'));
    ASSERT_GT(big.size(), 64u);
    d.feed(big.data(), big.size());
    auto r = d.next();
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.err().message.find("max_frame_bytes"), std::string::npos);
}

TEST(frame_decoder, huge_declared_array_is_refused_without_allocating) {
    frame_decoder d(1 << 20);
    const char header[] = {'\xdd', '\xff', '\xff', '\xff', '\xff'};  // array32 of 2^32-1
    d.feed(header, sizeof header);
    auto r = d.next();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.err().code, "bad_frame");
}

TEST(frame_decoder, malformed_bytes_are_refused) {
    frame_decoder d(1024);
    const char bad[] = {'\xc1'};  // never used in msgpack
    d.feed(bad, 1);
    auto r = d.next();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.err().code, "bad_frame");
}

TEST(frame_decoder, deep_nesting_is_refused) {
    frame_decoder d(1024);
    std::string nested(100, '\x91');  // fixarray of 1, a hundred levels deep
    nested += '\x01';
    d.feed(nested.data(), nested.size());
    auto r = d.next();
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.err().message.find("deeper"), std::string::npos);
}

}  // namespace
