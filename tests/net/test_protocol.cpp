// test_protocol.cpp: envelope parsing and event encoding (net/protocol.hpp).
//
// Checks: a frame that is not a map, or has no usable id (missing, 0, negative, string), is a
// fatal bad_frame with id 0; a usable id with a missing or non-string op is a non-fatal
// bad_request answering that id; parse_op names unknown parameter keys (also for stats and
// model, which take none) and unknown ops, quoting client bytes as valid UTF-8 whatever they
// were; events written by event_writer and the typed encoders decode to the expected maps
// (field count in the header matches); every error code has its wire name; stats carries a
// fault_plan map only when a fault plan is configured.
#include <gtest/gtest.h>

#include <set>

#include "net/ops.hpp"
#include "net/protocol.hpp"
#include "net/request_fields.hpp"
#include "scheduler/stop_matcher.hpp"

namespace {

using namespace ordo::net;
using namespace ordo::door;

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
    auto st = parse_op(*req, {});
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.err().code, "bad_request");
    EXPECT_NE(st.err().message.find("bogus"), std::string::npos);
}

// docs/protocol.md: ops without parameters refuse any (the issue saw `stats` answer `done`).
TEST(protocol, parameterless_ops_refuse_unknown_keys) {
    for (const char* op : {"stats", "model", "health"}) {
        auto f = map_of("id", 1, "op", op, "bogus", 1);
        auto oh = decode(f);
        auto r = parse_envelope(oh.get());
        auto st = parse_op(std::get<request>(r), {});
        ASSERT_FALSE(st.ok()) << op;
        EXPECT_EQ(st.err().code, "bad_request") << op;
        EXPECT_NE(st.err().message.find("\"bogus\""), std::string::npos) << st.err().message;
        auto good = map_of("id", 1, "op", op);
        auto gh = decode(good);
        EXPECT_TRUE(parse_op(std::get<request>(parse_envelope(gh.get())), {}).ok()) << op;
    }
}

// The issue's `{"id":1,"op":"\xff"}` got a message with the raw byte; a strict client then failed
// to decode the stream. Unknown ops and unknown keys are quoted as escapes.
TEST(protocol, messages_quoting_client_bytes_are_valid_utf8) {
    msgpack::sbuffer b;
    msgpack::packer<msgpack::sbuffer> pk(b);
    pk.pack_map(2);
    pk.pack("id"), pk.pack(1);
    pk.pack("op"), pk.pack_str(1), pk.pack_str_body("\xff", 1);
    auto oh = decode(b);
    auto st = parse_op(std::get<request>(parse_envelope(oh.get())), {});
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.err().code, "unknown_op");
    EXPECT_TRUE(ordo::sched::is_valid_utf8(st.err().message)) << st.err().message;
    EXPECT_NE(st.err().message.find("\\xff"), std::string::npos) << st.err().message;

    msgpack::sbuffer k;
    msgpack::packer<msgpack::sbuffer> kp(k);
    kp.pack_map(3);
    kp.pack("id"), kp.pack(1), kp.pack("op"), kp.pack("stats");
    kp.pack_str(3), kp.pack_str_body("a\xc3\x28", 3), kp.pack(1);  // a broken 2-byte sequence
    auto kh = decode(k);
    auto ks = parse_op(std::get<request>(parse_envelope(kh.get())), {});
    ASSERT_FALSE(ks.ok());
    EXPECT_TRUE(ordo::sched::is_valid_utf8(ks.err().message)) << ks.err().message;
    // Valid multi-byte text passes through unchanged; long input is cut.
    EXPECT_EQ(fields::quote("h\xc3\xa9"), "\"h\xc3\xa9\"");
    EXPECT_EQ(fields::quote(std::string(100, 'a')).size(), 64u + 2 + 3);
    // Every wire name is a distinct snake_case string.
    std::set<std::string_view> names;
    for (int c = 0; c <= int(errc_last); c++) names.insert(wire_name(errc(c)));
    EXPECT_EQ(names.size(), size_t(errc_last) + 1);
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

    std::string err = encode_error(3, errc::unknown_op, "nope");
    auto eh = msgpack::unpack(err.data(), err.size());
    std::map<std::string, msgpack::object> e;
    eh.get().convert(e);
    EXPECT_EQ(e["code"].as<std::string>(), "unknown_op");
    EXPECT_EQ(e["event"].as<std::string>(), "error");
}

}  // namespace

namespace {

// Float fields are msgpack float64 on the wire even when whole (msgpack-c would write 0.0 as 0).
TEST(protocol, float_fields_stay_floats) {
    generate_done d;
    d.id = 5;
    d.reason = ordo::door::finish_reason::length;
    d.usage.prefill_ms = 2.0;
    d.usage.decode_ms = 0.0;
    d.logprobs = std::vector<token_info>{token_info{7, "a", 0.0f, std::nullopt}};
    std::string bytes = encode(d);
    auto oh = msgpack::unpack(bytes.data(), bytes.size());
    std::map<std::string, msgpack::object> m;
    oh.get().convert(m);
    auto usage = m["usage"].as<std::map<std::string, msgpack::object>>();
    EXPECT_EQ(usage["prefill_ms"].type, msgpack::type::FLOAT64);
    EXPECT_EQ(usage["prefill_ms"].via.f64, 2.0);
    EXPECT_EQ(usage["decode_ms"].type, msgpack::type::FLOAT64);
    EXPECT_EQ(usage["prompt_tokens"].type, msgpack::type::POSITIVE_INTEGER);
    auto lp = m["logprobs"].as<std::vector<std::map<std::string, msgpack::object>>>();
    ASSERT_EQ(lp.size(), 1u);
    EXPECT_EQ(lp[0]["logprob"].type, msgpack::type::FLOAT64);
    EXPECT_EQ(lp[0]["event"].as<std::string>(), "token");
}

// The stats answer's fault_plan map: absent without a plan, the five documented fields with one.
TEST(protocol, stats_has_a_fault_plan_map_only_with_a_plan) {
    stats_done d;
    d.id = 4;
    auto decoded = [&] {
        std::string bytes = encode(d);
        auto oh = msgpack::unpack(bytes.data(), bytes.size());
        std::map<std::string, msgpack::object> m;
        oh.get().convert(m);
        return std::make_pair(std::move(oh), m);
    };
    {
        auto [oh, m] = decoded();
        EXPECT_EQ(m.count("fault_plan"), 0u);
        EXPECT_EQ(m.count("kv_disk"), 1u);
    }
    d.stats.fault_plan = {true, 77, 3, 1, true, {{"nan_logits", 2}, {"hang", 1}}};
    auto [oh, m] = decoded();
    ASSERT_EQ(m.count("fault_plan"), 1u);
    auto p = m["fault_plan"].as<std::map<std::string, msgpack::object>>();
    EXPECT_EQ(p.size(), 5u);
    EXPECT_EQ(p["seed"].as<uint64_t>(), 77u);
    EXPECT_EQ(p["fired"].as<uint64_t>(), 3u);
    EXPECT_EQ(p["refused"].as<uint64_t>(), 1u);
    EXPECT_TRUE(p["spent"].as<bool>());
    EXPECT_EQ((p["by_kind"].as<std::map<std::string, uint64_t>>()),
              (std::map<std::string, uint64_t>{{"hang", 1}, {"nan_logits", 2}}));
}

}  // namespace
