// test_grammar_server.cpp: grammar-constrained generation (issue 31, docs/grammar.md) on the
// real ordo-server, over both front doors, on a made byte-vocabulary model (always) and on
// stories260K (skipped visibly without ../shared/models).
//
// Checks: a GBNF `grammar` on the msgpack generate op gives text that is a whole sentence of
// the grammar, ended with reason "stop" when the grammar can take nothing more, for several
// seeds at temperature 1 and greedily; the same seed gives the same text; the same grammar on
// HTTP /v1/completions too; response_format {"type": "json_object"} gives text every prefix of
// which the JSON grammar accepts, parsing as one JSON object when it ends with "stop";
// response_format json_schema gives answers that validate against the schema (python3-
// jsonschema, draft 2020-12); a bad grammar is bad_request (msgpack) and 400 (HTTP) naming the
// line and column; a schema keyword ordo does not support is 400 naming response_format; a
// cancel mid-generation ends the request once with "cancelled", and after a client leaves
// mid-generation the server answers the next grammar request; a lazy grammar (grammar_triggers)
// holds from its trigger on and ends the answer. The unconstrained model's text for the same seed
// is not a sentence of the grammar (so the constraint, not luck, made it one).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "grammar/gbnf.hpp"
#include "grammar/json.hpp"
#include "tests/http/http_client.hpp"
#include "tests/http/json_schema_check.hpp"
#include "tests/support/server_process.hpp"
#include "tests/support/shared_models.hpp"

namespace {

using namespace ordo::test;
using json = nlohmann::json;

// Ends by itself: after "}" the grammar can take nothing more.
constexpr const char* k_record =
    R"(root ::= "{\"n\": " [1-9] [0-9]{0,2} ", \"ok\": " ("true" | "false") "}")";

// Whether `text` is a whole sentence of `source` (whole = true) or a prefix of one.
bool follows(const std::string& source, const std::string& text, bool whole) {
    auto g = ordo::grammar::parse_gbnf(source);
    if (!g) return false;
    ordo::grammar::matcher m(*g);
    auto ok = m.advance_utf8(text);
    return ok.ok() && *ok && (!whole || m.accepting());
}

struct served {
    server_process proc;
    std::string error;
};

std::unique_ptr<served> serve(const std::string& model) {
    auto s = std::make_unique<served>();
    if (!s->proc.start(ORDO_SERVER_BIN, {"--model", model})) {
        s->error = "the server did not start:\n" + s->proc.output();
    } else {
        s->error = wait_healthy(s->proc.port());
    }
    return s;
}

event generate(tcp_client& c, uint64_t id, const std::string& prompt, double temperature,
               uint64_t seed, const std::string* grammar, uint32_t max_tokens = 40) {
    msgpack::sbuffer f =
        grammar ? frame("id", id, "op", "generate", "prompt", prompt, "max_tokens", max_tokens,
                        "temperature", temperature, "seed", seed, "grammar", *grammar)
                : frame("id", id, "op", "generate", "prompt", prompt, "max_tokens", max_tokens,
                        "temperature", temperature, "seed", seed);
    EXPECT_TRUE(c.send(f));
    auto events = until_terminal(c, id);
    return events.back();
}

void check_model(const std::string& model, const std::string& prompt) {
    auto srv = serve(model);
    ASSERT_EQ(srv->error, "") << srv->proc.output();
    tcp_client c;
    ASSERT_TRUE(c.connect(srv->proc.port()));
    const std::string record = k_record;
    uint64_t id = 1;
    for (uint64_t seed : {1u, 2u, 3u, 4u}) {
        event e = generate(c, id++, prompt, 1.0, seed, &record);
        ASSERT_EQ(e.outcome(), "done:stop") << "seed " << seed;
        EXPECT_TRUE(follows(record, e.str("text"), true))
            << "seed " << seed << ": " << e.str("text");
        event again = generate(c, id++, prompt, 1.0, seed, &record);
        EXPECT_EQ(again.str("text"), e.str("text")) << "seed " << seed << ": not deterministic";
        event free = generate(c, id++, prompt, 1.0, seed, nullptr, 12);
        EXPECT_FALSE(follows(record, free.str("text"), false))
            << "seed " << seed << ": the model alone wrote the grammar's text";
    }
    event greedy = generate(c, id++, prompt, 0.0, 1, &record);
    ASSERT_EQ(greedy.outcome(), "done:stop");
    EXPECT_TRUE(follows(record, greedy.str("text"), true)) << greedy.str("text");

    // A lazy grammar (grammar_triggers): free text until one of the letters a..p, then three
    // digits and "!", and the answer ends there.
    const std::string lazy = R"(root ::= [a-p] [0-9]{3} "!")";
    std::vector<std::string> triggers;
    for (char ch = 'a'; ch <= 'p'; ch++) triggers.emplace_back(1, ch);
    int triggered = 0;
    for (uint64_t seed : {1u, 2u, 3u, 4u}) {
        ASSERT_TRUE(c.send(frame("id", id, "op", "generate", "prompt", prompt, "max_tokens", 100,
                                 "temperature", 1.0, "seed", seed, "grammar", lazy,
                                 "grammar_triggers", triggers)));
        event e = until_terminal(c, id++).back();
        const std::string text = e.str("text");
        if (e.outcome() == "done:length") continue;  // not triggered within max_tokens
        ASSERT_EQ(e.outcome(), "done:stop") << e.str("message");
        triggered++;
        ASSERT_GE(text.size(), 5u) << text;
        EXPECT_TRUE(follows(lazy, text.substr(text.size() - 5), true))
            << "seed " << seed << ": " << text;
    }
    EXPECT_GE(triggered, 2) << "the triggers hardly ever appeared";

    // Cancel and disconnect mid-generation behave as in any request: one terminal event, and
    // the server goes on (a grammar that cannot end before 90 tokens).
    const std::string long_one = "root ::= \"a\"{90}";
    const uint64_t cid = id++;
    ASSERT_TRUE(c.send(frame("id", cid, "op", "generate", "prompt", prompt, "max_tokens", 100,
                             "temperature", 1.0, "seed", 9, "stream", true, "grammar", long_one)));
    std::size_t tokens = 0, terminals = 0;
    std::string reason;
    while (auto e = next(c)) {
        if (e->u("id") != cid) continue;
        if (e->str("event") == "token" && ++tokens == 3) {
            ASSERT_TRUE(c.send(frame("id", id++, "op", "cancel", "target", cid)));
        }
        if (e->terminal()) {
            terminals++;
            reason = e->str("reason");
            break;
        }
    }
    EXPECT_EQ(terminals, 1u);
    EXPECT_EQ(reason, "cancelled");
    {
        tcp_client gone;
        ASSERT_TRUE(gone.connect(srv->proc.port()));
        ASSERT_TRUE(gone.send(frame("id", 1, "op", "generate", "prompt", prompt, "max_tokens", 100,
                                    "stream", true, "grammar", long_one)));
        ASSERT_TRUE(next(gone).has_value());
    }  // closed mid-generation
    event after = generate(c, id++, prompt, 0.0, 1, &record);
    EXPECT_EQ(after.outcome(), "done:stop") << "the server after a cancel and a disconnect";

    // A bad grammar: bad_request naming where.
    const std::string bad = "root ::= \"a\" (\n";
    event refused = generate(c, id++, prompt, 1.0, 1, &bad);
    EXPECT_EQ(refused.str("code"), "bad_request") << refused.outcome();
    EXPECT_NE(refused.str("message").find("\"grammar\""), std::string::npos) << refused.outcome();
    EXPECT_NE(refused.str("message").find("line"), std::string::npos) << refused.outcome();

    // HTTP: the grammar field, JSON mode, and the refusals.
    const uint16_t port = srv->proc.http_port();
    ASSERT_NE(port, 0);
    auto models = http_call(port, "GET", "/v1/models");
    ASSERT_TRUE(models.has_value());
    const std::string name = json::parse(models->body)["data"][0]["id"];
    auto complete = [&](json body) {
        body["model"] = name;
        body["prompt"] = prompt;
        return http_call(port, "POST", "/v1/completions", body.dump());
    };
    auto r = complete({{"grammar", record}, {"seed", 5}, {"max_tokens", 40}});
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->status, 200) << r->body;
    json j = json::parse(r->body);
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop") << r->body;
    EXPECT_TRUE(follows(record, j["choices"][0]["text"], true)) << r->body;
    for (int seed : {1, 2, 3}) {
        auto o = complete(
            {{"response_format", {{"type", "json_object"}}}, {"seed", seed}, {"max_tokens", 60}});
        ASSERT_TRUE(o.has_value());
        ASSERT_EQ(o->status, 200) << o->body;
        json oj = json::parse(o->body);
        const std::string text = oj["choices"][0]["text"];
        EXPECT_TRUE(follows(std::string(ordo::grammar::json_object_gbnf), text, false))
            << "seed " << seed << ": " << text;
        if (oj["choices"][0]["finish_reason"] == "stop") {
            json parsed = json::parse(text, nullptr, false);
            EXPECT_TRUE(parsed.is_object()) << text;
        }
    }
    // json_schema: the answer, when whole, validates against the schema (Debian's
    // python3-jsonschema, draft 2020-12); cut by max_tokens, it is a prefix of a valid one.
    const json schema = json::parse(R"({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 6}, "age": {"type": "integer"},
        "pet": {"enum": ["cat", "dog", null]}},
        "required": ["name", "age"], "additionalProperties": false})");
    const bool validator = json_schema_validator();
    int whole = 0;
    for (int seed : {1, 2, 3, 4}) {
        auto o = complete(
            {{"response_format",
              {{"type", "json_schema"},
               {"json_schema", {{"name", "person"}, {"strict", true}, {"schema", schema}}}}},
             {"seed", seed},
             {"max_tokens", 100}});
        ASSERT_TRUE(o.has_value());
        ASSERT_EQ(o->status, 200) << o->body;
        json oj = json::parse(o->body);
        const std::string text = oj["choices"][0]["text"];
        if (oj["choices"][0]["finish_reason"] != "stop") continue;
        ++whole;
        json doc = json::parse(text, nullptr, false);
        ASSERT_TRUE(doc.is_object()) << text;
        EXPECT_TRUE(doc["name"].is_string() && doc["age"].is_number_integer()) << text;
        if (validator) {
            EXPECT_EQ(json_schema_violation(text, schema.dump(), "grammar"), "") << text;
        }
    }
    EXPECT_GE(whole, 1) << "no json_schema answer ended within max_tokens";
    auto b = complete({{"grammar", bad}, {"max_tokens", 10}});
    ASSERT_TRUE(b.has_value());
    EXPECT_EQ(b->status, 400) << b->body;
    EXPECT_NE(b->body.find("line"), std::string::npos) << b->body;
    auto unsupported = complete(
        {{"response_format",
          {{"type", "json_schema"},
           {"json_schema", {{"name", "x"}, {"schema", {{"type", "string"}, {"pattern", "^a"}}}}}}},
         {"max_tokens", 10}});
    ASSERT_TRUE(unsupported.has_value());
    EXPECT_EQ(unsupported->status, 400) << unsupported->body;
    json uj = json::parse(unsupported->body);
    EXPECT_EQ(uj["error"]["param"], "response_format") << unsupported->body;
    EXPECT_NE(uj["error"]["message"].get<std::string>().find("pattern"), std::string::npos)
        << unsupported->body;
    EXPECT_EQ(srv->proc.stop(), 0) << srv->proc.output();
}

TEST(grammar_server, made_model_follows_the_grammar_on_both_doors) {
    const std::string model = generated_model(ORDO_MODEL_BIN, scratch_path("grammar", "tiny.gguf"),
                                              std::string(tiny_model_flags));
    check_model(model, "Once");
}

TEST(grammar_server, stories260K_follows_the_grammar_on_both_doors) {
    const std::string stories = std::string(ORDO_SHARED_MODELS_DIR) + "/stories260K.gguf";
    ORDO_REQUIRE_SHARED(stories);
    check_model(stories, "Once upon a time");
}

}  // namespace
