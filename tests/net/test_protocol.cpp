// test_protocol.cpp: envelope parsing and event encoding (net/protocol.hpp).
//
// Checks: a frame that is not a map, or has no usable id (missing, 0, negative, string), is a
// fatal bad_frame with id 0; a usable id with a missing or non-string op is a non-fatal
// bad_request answering that id; unknown parameter keys are named; events written by
// event_writer decode to the expected maps (field count in the header matches).
#include <gtest/gtest.h>

#include "net/protocol.hpp"

namespace {

using namespace ordo::net;

msgpack::object_handle decode(const msgpack::sbuffer& b) {
    return msgpack::unpack(b.data(), b.size());
}

template <typename... kv>
msgpack::sbuffer map_of(const kv&... args) {
    msgpack::sbuffer b;
    msgpack::packer<msgpack::sbuffer> pk(b);
    pk.pack_map(sizeof...(args) / 2);
    (pk.pack(args), ...);
    return b;
}

TEST(protocol, not_a_map_is_fatal) {
    msgpack::sbuffer b;
    msgpack::pack(b, std::vector<int>{1, 2});
    auto oh = decode(b);
    auto r = parse_envelope(oh.get());
    auto* e = std::get_if<envelope_error>(&r);
    ASSERT_NE(e, nullptr);
    EXPECT_TRUE(e->fatal);
    EXPECT_EQ(e->id, 0u);
    EXPECT_EQ(e->err.code, "bad_frame");
}

TEST(protocol, unusable_ids_are_fatal) {
    std::vector<msgpack::sbuffer> frames;
    frames.push_back(map_of("op", "health"));
    frames.push_back(map_of("id", 0, "op", "health"));
    frames.push_back(map_of("id", -3, "op", "health"));
    frames.push_back(map_of("id", "7", "op", "health"));
    for (auto& f : frames) {
        auto oh = decode(f);
        auto r = parse_envelope(oh.get());
        auto* e = std::get_if<envelope_error>(&r);
        ASSERT_NE(e, nullptr);
        EXPECT_TRUE(e->fatal);
        EXPECT_EQ(e->err.code, "bad_frame");
    }
}

TEST(protocol, bad_op_answers_the_id) {
    std::vector<msgpack::sbuffer> frames;
    frames.push_back(map_of("id", 9));
    frames.push_back(map_of("id", 9, "op", 5));
    for (auto& f : frames) {
        auto oh = decode(f);
        auto r = parse_envelope(oh.get());
        auto* e = std::get_if<envelope_error>(&r);
        ASSERT_NE(e, nullptr);
        EXPECT_FALSE(e->fatal);
        EXPECT_EQ(e->id, 9u);
        EXPECT_EQ(e->err.code, "bad_request");
    }
}

TEST(protocol, good_request_and_param_keys) {
    auto f = map_of("id", 4, "op", "generate", "max_tokens", 3, "bogus", true);
    auto oh = decode(f);
    auto r = parse_envelope(oh.get());
    auto* req = std::get_if<request>(&r);
    ASSERT_NE(req, nullptr);
    EXPECT_EQ(req->id, 4u);
    EXPECT_EQ(req->op, "generate");
    auto st = check_param_keys(*req->map, {"max_tokens"});
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.err().code, "bad_request");
    EXPECT_NE(st.err().message.find("bogus"), std::string::npos);
    EXPECT_TRUE(check_param_keys(*req->map, {"max_tokens", "bogus"}).ok());
}

TEST(protocol, event_writer_encodes_a_map) {
    event_writer w(12, "done");
    w.field("status", "ok");
    auto& nested = w.nested("usage");
    nested.pack_map(1);
    nested.pack("prompt_tokens"), nested.pack(5);
    std::string bytes = w.finish();
    auto oh = msgpack::unpack(bytes.data(), bytes.size());
    std::map<std::string, msgpack::object> m;
    oh.get().convert(m);
    EXPECT_EQ(m.size(), 4u);
    EXPECT_EQ(m["id"].as<uint64_t>(), 12u);
    EXPECT_EQ(m["event"].as<std::string>(), "done");
    EXPECT_EQ(m["status"].as<std::string>(), "ok");
    using usage_map = std::map<std::string, int>;
    EXPECT_EQ(m["usage"].as<usage_map>().at("prompt_tokens"), 5);

    std::string err = encode_error(3, "unknown_op", "nope");
    auto eh = msgpack::unpack(err.data(), err.size());
    std::map<std::string, msgpack::object> e;
    eh.get().convert(e);
    EXPECT_EQ(e["code"].as<std::string>(), "unknown_op");
    EXPECT_EQ(e["event"].as<std::string>(), "error");
}

}  // namespace
