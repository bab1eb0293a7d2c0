// test_frame_decoder.cpp: the net actor's msgpack stream framing, without sockets.
//
// Checks: frames split at every byte boundary are reassembled; many frames in one read come out
// in order; a stream that goes past max_frame_bytes without completing a frame is refused
// before the rest arrives; a complete frame over the limit is refused; a header declaring a
// 4-billion-element array is refused without allocating; malformed bytes and excessive nesting
// are refused; after an error the decoder stays failed.
//
// And the scanner's promises, each by feeding hand-written bytes and asserting exactly after
// which byte the answer comes: a str/bin/ext/array/map header declaring more than the limit is
// refused as soon as its last header byte is in (the 16-byte str32 reproduction with a 1 MiB
// limit among them), and not one byte earlier; a frame of exactly max_frame_bytes passes and one
// byte more is refused; 0xc1 and a 33rd nesting level are refused at once; a frame split at
// every byte boundary decodes to the same object as msgpack::unpack of the whole; thousands of
// frames fed in random chunks come out in order.
//
// The value bound (max_frame_values): a frame of exactly the bound passes and one value more is
// refused; an array header declaring more elements than the bound is refused at its header,
// before any element arrives; nested containers and map keys and values all count; the count
// starts again with each frame.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

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

// ---- the scanner ------------------------------------------------------------------------------

constexpr size_t one_mib = 1 << 20;

// {"id": 1, "op": <header>}: a map whose "op" value starts with `header` (no payload follows).
std::string request_with_op_header(const std::string& header) {
    return std::string("\x82\xa2id\x01\xa2op", 8) + header;
}

// Feeds `bytes` one at a time; returns how many were in when next() first failed (0: never).
// Frames that decode on the way are counted in `frames`.
size_t bytes_until_refused(frame_decoder& d, const std::string& bytes, size_t* frames = nullptr) {
    for (size_t i = 0; i < bytes.size(); i++) {
        d.feed(&bytes[i], 1);
        while (true) {
            auto r = d.next();
            if (!r.ok()) {
                EXPECT_EQ(r.err().code, "bad_frame");
                return i + 1;
            }
            if (!r->has_value()) break;
            if (frames) (*frames)++;
        }
    }
    return 0;
}

TEST(frame_decoder, str32_reproduction_is_refused_after_16_bytes) {
    // The reported stream: "op" is a str32 declaring 0xfffffff0 bytes, then "abc".
    const std::string bytes("\x82\xa2\x69\x64\x01\xa2\x6f\x70\xdb\xff\xff\xff\xf0\x61\x62\x63", 16);
    frame_decoder whole(one_mib);
    whole.feed(bytes.data(), bytes.size());
    auto r = whole.next();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.err().code, "bad_frame");
    EXPECT_NE(r.err().message.find("str32"), std::string::npos) << r.err().message;
    EXPECT_NE(r.err().message.find("max_frame_bytes 1048576"), std::string::npos)
        << r.err().message;
    // Byte by byte, the answer comes with the str32 header's last byte (the 13th), not later.
    frame_decoder d(one_mib);
    EXPECT_EQ(bytes_until_refused(d, bytes), 13u);
}

TEST(frame_decoder, oversized_headers_are_refused_when_the_header_is_in) {
    struct header_case {
        const char* name;
        std::string header;
    };
    const std::vector<header_case> cases = {
        {"bin32", std::string("\xc6\xff\xff\xff\xf0", 5)},
        {"ext32", std::string("\xc9\xff\xff\xff\xf0\x01", 6)},
        {"array32", std::string("\xdd\xff\xff\xff\xf0", 5)},
        {"map32", std::string("\xdf\x7f\xff\xff\xf0", 5)},
        {"str32", std::string("\xdb\x00\x10\x00\x00", 5)},  // exactly 1 MiB of payload
        {"array16", std::string("\xdc\xff\xff", 3)},        // at a 1 MiB limit this one fits
    };
    for (const auto& c : cases) {
        SCOPED_TRACE(c.name);
        std::string bytes = request_with_op_header(c.header) + "abc";
        frame_decoder d(one_mib);
        size_t refused_at = bytes_until_refused(d, bytes);
        if (std::string(c.name) == "array16") {
            EXPECT_EQ(refused_at, 0u);
        } else {
            EXPECT_EQ(refused_at, 8 + c.header.size());
            EXPECT_NE(d.next().err().message.find(c.name), std::string::npos);
        }
    }
}

TEST(frame_decoder, str16_over_a_small_limit_is_refused_at_its_header) {
    // 100-byte limit: a root str16 takes 3 header bytes, so 97 payload bytes fit and 98 do not.
    frame_decoder fits(100);
    std::string ok = std::string("\xda\x00\x61", 3) + std::string(97, 'x');
    EXPECT_EQ(bytes_until_refused(fits, ok), 0u);
    EXPECT_EQ(fits.frames(), 1u);

    frame_decoder over(100);
    std::string bad = std::string("\xda\x00\x62", 3) + std::string(98, 'x');
    EXPECT_EQ(bytes_until_refused(over, bad), 3u);
    auto r = over.next();
    EXPECT_NE(r.err().message.find("str16"), std::string::npos) << r.err().message;
    EXPECT_NE(r.err().message.find("max_frame_bytes 100"), std::string::npos) << r.err().message;
}

TEST(frame_decoder, elements_still_to_come_count_a_byte_each) {
    // fixarray of 15 needs 16 bytes at least: refused at its header under a 10-byte limit.
    frame_decoder d(10);
    EXPECT_EQ(bytes_until_refused(d, std::string("\x9f\x01\x02", 3)), 1u);
    // [str of 5, 1, 2, 3]: 1 + 6 + 3 = 10 fits; a str of 6 needs 11.
    frame_decoder fits(10);
    EXPECT_EQ(bytes_until_refused(fits, std::string("\x94\xa5xxxxx\x01\x02\x03", 10)), 0u);
    EXPECT_EQ(fits.frames(), 1u);
    frame_decoder over(10);
    EXPECT_EQ(bytes_until_refused(over, std::string("\x94\xa6xxxxxx\x01\x02\x03", 11)), 2u);
}

// An array of n one-byte integers: 1 + n values.
std::string int_array(uint32_t n) {
    msgpack::sbuffer b;
    msgpack::packer<msgpack::sbuffer> pk(b);
    pk.pack_array(n);
    for (uint32_t i = 0; i < n; i++) pk.pack(1);
    return {b.data(), b.size()};
}

TEST(frame_decoder, values_bound_is_exact_and_counts_every_value) {
    for (uint32_t n : {1u, 14u, 15u, 16u, 1000u, 70000u}) {
        SCOPED_TRACE(n);
        frame_decoder exact(1 << 20, n + 1);
        EXPECT_EQ(bytes_until_refused(exact, int_array(n)), 0u);
        EXPECT_EQ(exact.frames(), 1u);
        frame_decoder short_by_one(1 << 20, n);
        // The array's header declares n elements: refused at its last header byte.
        const std::string bytes = int_array(n);
        const size_t header = n < 16 ? 1 : n < 65536 ? 3 : 5;
        EXPECT_EQ(bytes_until_refused(short_by_one, bytes), header);
        auto r = short_by_one.next();
        ASSERT_FALSE(r.ok());
        EXPECT_EQ(r.err().code, "bad_frame");
        EXPECT_NE(r.err().message.find("max_frame_values"), std::string::npos) << r.err().message;
    }
    // {"a": [1, 2], "b": {}}: the map, 2 keys, the array, 2 ints, the empty map = 7 values.
    const std::string nested(
        "\x82\xa1"
        "a"
        "\x92\x01\x02\xa1"
        "b"
        "\x80",
        9);
    frame_decoder seven(1024, 7);
    EXPECT_EQ(bytes_until_refused(seven, nested), 0u);
    EXPECT_EQ(seven.frames(), 1u);
    frame_decoder six(1024, 6);
    EXPECT_NE(bytes_until_refused(six, nested), 0u);
}

TEST(frame_decoder, values_count_starts_again_with_each_frame) {
    // Many frames each within the bound, in one feed: all pass although together they exceed it.
    frame_decoder d(1 << 20, 101);
    std::string bytes;
    for (int i = 0; i < 50; i++) bytes += int_array(100);
    d.feed(bytes.data(), bytes.size());
    for (int i = 0; i < 50; i++) {
        auto r = d.next();
        ASSERT_TRUE(r.ok()) << r.err().message;
        ASSERT_TRUE(r->has_value());
    }
}

TEST(frame_decoder, huge_declared_array_is_refused_by_values_before_bytes_arrive) {
    // array32 of 1,000,000 elements under a 64 MiB byte limit (where bytes alone would let the
    // whole frame in): refused after its 5 header bytes by the default value bound.
    frame_decoder d(64 << 20);
    const std::string header("\xdd\x00\x0f\x42\x40", 5);
    EXPECT_EQ(bytes_until_refused(d, header), 5u);
}

TEST(frame_decoder, frame_of_exactly_the_limit_passes_one_byte_more_is_refused) {
    const std::string frame = packed_request(7, std::string(200, 'p'));
    for (bool byte_by_byte : {false, true}) {
        SCOPED_TRACE(byte_by_byte ? "byte by byte" : "whole");
        frame_decoder exact(frame.size());
        frame_decoder short_by_one(frame.size() - 1);
        if (byte_by_byte) {
            EXPECT_EQ(bytes_until_refused(exact, frame), 0u);
            EXPECT_EQ(exact.frames(), 1u);
            EXPECT_NE(bytes_until_refused(short_by_one, frame), 0u);
        } else {
            exact.feed(frame.data(), frame.size());
            auto r = exact.next();
            ASSERT_TRUE(r.ok() && r->has_value());
            EXPECT_EQ((*r)->get().via.map.ptr[0].val.via.u64, 7u);
            short_by_one.feed(frame.data(), frame.size());
            EXPECT_FALSE(short_by_one.next().ok());
        }
    }
}

TEST(frame_decoder, reserved_byte_inside_a_frame_is_refused_at_once) {
    frame_decoder d(1024);
    std::string bytes = request_with_op_header("\xc1") + "more";
    EXPECT_EQ(bytes_until_refused(d, bytes), 9u);
    auto r = d.next();
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.err().message.find("0xc1"), std::string::npos) << r.err().message;
}

TEST(frame_decoder, depth_limit_is_exact_and_refused_at_once) {
    const size_t depth = ordo::net::frame_depth_max;
    // frame_depth_max nested arrays around a 1 decode, as msgpack-c itself allows.
    frame_decoder ok(1024);
    std::string deepest(depth, '\x91');
    deepest += '\x01';
    EXPECT_EQ(bytes_until_refused(ok, deepest), 0u);
    EXPECT_EQ(ok.frames(), 1u);
    // One level more, even an empty array, is refused on that level's header byte.
    for (char innermost : {'\x91', '\x90'}) {
        frame_decoder d(1024);
        std::string nested(depth, '\x91');
        nested += innermost;
        nested += "\x01\x01";
        EXPECT_EQ(bytes_until_refused(d, nested), depth + 1);
        EXPECT_NE(d.next().err().message.find("deeper"), std::string::npos);
    }
}

// A frame touching every kind of header (fix*, 8/16/32-bit lengths, ext, floats, negatives).
std::string packed_everything() {
    msgpack::sbuffer b;
    msgpack::packer<msgpack::sbuffer> pk(b);
    pk.pack_map(9);
    pk.pack("id"), pk.pack(uint64_t{1} << 40);
    pk.pack("op"), pk.pack("generate");
    pk.pack("str8"), pk.pack(std::string(40, 's'));
    pk.pack("str16"), pk.pack(std::string(300, 't'));
    pk.pack("bin"), pk.pack_bin(3), pk.pack_bin_body("\x00\x01\x02", 3);
    pk.pack("ext"), pk.pack_ext(5, 7), pk.pack_ext_body("abcde", 5);
    pk.pack("fixext"), pk.pack_ext(4, -3), pk.pack_ext_body("wxyz", 4);
    pk.pack("nums");
    pk.pack_array(8);
    pk.pack(-1), pk.pack(-200), pk.pack(-70000), pk.pack(int64_t{-1} << 40);
    pk.pack(1.5f), pk.pack(2.25), pk.pack(true), pk.pack_nil();
    pk.pack("nested");
    pk.pack_array(20);
    for (int i = 0; i < 20; i++) {
        pk.pack_map(1);
        pk.pack(i), pk.pack_array(0);
    }
    return {b.data(), b.size()};
}

TEST(frame_decoder, every_split_point_decodes_identically) {
    const std::string frame = packed_everything();
    const std::string stream = frame + packed_request(9) + frame;
    msgpack::object_handle want = msgpack::unpack(frame.data(), frame.size());
    for (size_t split = 0; split <= stream.size(); split++) {
        frame_decoder d(1024);
        d.feed(stream.data(), split);
        std::vector<msgpack::object_handle> got;
        for (bool fed_rest : {false, true}) {
            if (fed_rest) d.feed(stream.data() + split, stream.size() - split);
            while (true) {
                auto r = d.next();
                ASSERT_TRUE(r.ok()) << "split " << split << ": " << r.err().message;
                if (!r->has_value()) break;
                got.push_back(std::move(**r));
            }
        }
        ASSERT_EQ(got.size(), 3u) << "split " << split;
        EXPECT_EQ(got[0].get(), want.get()) << "split " << split;
        EXPECT_EQ(got[1].get().via.map.ptr[0].val.via.u64, 9u);
        EXPECT_EQ(got[2].get(), want.get()) << "split " << split;
    }
}

TEST(frame_decoder, several_frames_and_a_partial_one_in_one_feed) {
    const std::string third = packed_everything();
    std::string bytes = packed_request(1) + packed_everything() + third.substr(0, 50);
    frame_decoder d(1024);
    d.feed(bytes.data(), bytes.size());
    for (int i = 0; i < 2; i++) {
        auto r = d.next();
        ASSERT_TRUE(r.ok() && r->has_value()) << i;
    }
    auto r = d.next();
    ASSERT_TRUE(r.ok());
    EXPECT_FALSE(r->has_value());
    d.feed(third.data() + 50, third.size() - 50);
    r = d.next();
    ASSERT_TRUE(r.ok() && r->has_value());
    EXPECT_EQ(d.frames(), 3u);
}

TEST(frame_decoder, thousands_of_frames_in_random_chunks_come_out_in_order) {
    std::string stream;
    const uint64_t frames = 5000;
    for (uint64_t i = 1; i <= frames; i++) stream += packed_request(i, std::string(i % 97, 'q'));
    std::mt19937 rng(42);  // fixed seed: a failure reproduces
    frame_decoder d(256);
    uint64_t expect = 1;
    for (size_t at = 0; at < stream.size();) {
        size_t n = std::min<size_t>(stream.size() - at, rng() % 700);
        d.feed(stream.data() + at, n);
        at += n;
        while (true) {
            auto r = d.next();
            ASSERT_TRUE(r.ok()) << r.err().message;
            if (!r->has_value()) break;
            ASSERT_EQ((*r)->get().via.map.ptr[0].val.via.u64, expect++);
        }
    }
    EXPECT_EQ(expect, frames + 1);
    EXPECT_EQ(d.frames(), frames);
}

TEST(frame_decoder, error_is_sticky_and_repeated) {
    frame_decoder d(64);
    const char bad[] = {'\x91', '\xc1'};
    d.feed(bad, sizeof bad);
    auto first = d.next();
    ASSERT_FALSE(first.ok());
    std::string good = packed_request(1);
    d.feed(good.data(), good.size());
    for (int i = 0; i < 3; i++) {
        auto again = d.next();
        ASSERT_FALSE(again.ok());
        EXPECT_EQ(again.err().code, first.err().code);
        EXPECT_EQ(again.err().message, first.err().message);
    }
}

}  // namespace
