// test_openai.cpp: http/openai (OpenAI JSON <-> ordo's typed messages), without a server.
//
// Checks: a chat body becomes the generate the `chat` op would make (template rendered, chat
// set, parameters mapped: max_completion_tokens, logprobs/top_logprobs, stop, seed); a
// completions body maps prompt strings and token-id arrays; every refusal is 400 (404 for the
// model) naming the field: unknown and unsupported fields, n != 1, non-zero penalties,
// stream_options without stream, image content parts, several prompts, malformed and too deeply
// nested JSON, and ordo's own range checks; nulls count as absent. Out: the answer, chunk and
// error objects have OpenAI's shapes, and each ordo error code has its HTTP status. Tools
// (issue 31): tools go to the template (not with tool_choice none); with a template whose call
// format ordo reads, the answer is read for calls, "required" and a named function set the
// format's grammar (parallel or not), and the refusals (an unknown named function, tools with
// response_format, logprobs or an unreadable template) name their field; history's tool-call
// arguments given as a JSON string reach the template as an object; the answer's tool_calls,
// content null and finish_reason "tool_calls", whole and streamed.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "http/openai.hpp"

namespace {

using namespace ordo::http;
using json = nlohmann::json;

const served_model k_model{"tiny", 1700000000};

ordo::net::request_limits limits() {
    ordo::net::request_limits l;
    l.max_tokens_default = 16;
    l.vocab_size = 260;
    l.chat = std::make_shared<ordo::net::chat_setup>(ordo::net::make_chat_setup(
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}",
        "file:test", "<s>", "</s>"));
    return l;
}

std::variant<api_request, api_error> parse(api_kind k, const json& body) {
    return parse_api_request(k, body.dump(), limits(), k_model);
}

api_request ok(api_kind k, const json& body) {
    auto r = parse(k, body);
    if (auto* e = std::get_if<api_error>(&r)) {
        ADD_FAILURE() << body.dump() << " -> " << e->status << " " << e->message;
        return {};
    }
    return std::get<api_request>(r);
}

api_error refused(api_kind k, const json& body) {
    auto r = parse(k, body);
    if (auto* e = std::get_if<api_error>(&r)) return *e;
    ADD_FAILURE() << body.dump() << " was accepted";
    return {};
}

// A template that teaches Hermes' <tool_call> format and renders tools and calls.
ordo::net::request_limits hermes_limits() {
    ordo::net::request_limits l = limits();
    l.chat = std::make_shared<ordo::net::chat_setup>(ordo::net::make_chat_setup(
        "{% if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}"
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
        "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>"
        "{% endfor %}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
        "file:hermes", "<s>", "</s>"));
    return l;
}

json chat(json extra = json::object()) {
    json j = {{"model", "tiny"},
              {"messages", json::array({{{"role", "user"}, {"content", "Hi"}}})}};
    for (auto& [k, v] : extra.items()) j[k] = v;
    return j;
}

}  // namespace

TEST(openai_in, chat_renders_the_template_and_maps_parameters) {
    api_request r = ok(api_kind::chat, chat({{"max_completion_tokens", 5},
                                             {"temperature", 0},
                                             {"seed", 7},
                                             {"stop", "x"},
                                             {"logprobs", true},
                                             {"top_logprobs", 3},
                                             {"user", "someone"},
                                             {"n", 1},
                                             {"presence_penalty", 0.5},
                                             {"frequency_penalty", -0.25}}));
    EXPECT_EQ(r.params.prompt.value_or(""), "<user>Hi<assistant>");
    EXPECT_TRUE(r.params.chat);
    EXPECT_EQ(r.params.max_tokens, 5u);
    EXPECT_EQ(r.params.sampling.temperature, 0.0f);
    EXPECT_EQ(r.params.sampling.seed, 7u);
    EXPECT_TRUE(r.params.seed_given);
    EXPECT_EQ(r.params.stop, std::vector<std::string>{"x"});
    EXPECT_TRUE(r.logprobs);
    EXPECT_EQ(r.top_logprobs, 3u);
    EXPECT_EQ(r.params.sampling.logprobs, 3u);
    EXPECT_EQ(r.params.sampling.presence_penalty, 0.5f);
    EXPECT_EQ(r.params.sampling.frequency_penalty, -0.25f);
    EXPECT_FALSE(r.stream);
    EXPECT_TRUE(r.params.speculative);  // the default: speculate where the server does
}

// ordo's extension `speculative` reaches the request; a non-boolean is 400 naming it.
TEST(openai_in, speculative_opts_out_and_is_checked) {
    EXPECT_FALSE(ok(api_kind::chat, chat({{"speculative", false}})).params.speculative);
    EXPECT_FALSE(
        ok(api_kind::completion, json{{"model", "tiny"}, {"prompt", "x"}, {"speculative", false}})
            .params.speculative);
    api_error e = refused(api_kind::chat, chat({{"speculative", "no"}}));
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "speculative");
}

TEST(openai_in, logprobs_without_alternatives_still_asks_ordo_for_one) {
    api_request r = ok(api_kind::chat, chat({{"logprobs", true}}));
    EXPECT_TRUE(r.logprobs);
    EXPECT_EQ(r.top_logprobs, 0u);
    EXPECT_EQ(r.params.sampling.logprobs, 1u);
    api_request none = ok(api_kind::chat, chat());
    EXPECT_EQ(none.params.sampling.logprobs, 0u);
    EXPECT_EQ(none.params.max_tokens, 16u);  // the server's default
}

TEST(openai_in, stream_and_include_usage) {
    api_request r =
        ok(api_kind::chat, chat({{"stream", true}, {"stream_options", {{"include_usage", true}}}}));
    EXPECT_TRUE(r.stream);
    EXPECT_TRUE(r.params.stream);
    EXPECT_TRUE(r.include_usage);
    api_error e = refused(api_kind::chat, chat({{"stream_options", {{"include_usage", true}}}}));
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "stream_options");
}

TEST(openai_in, nulls_are_absent) {
    api_request r = ok(
        api_kind::chat,
        chat({{"stop", nullptr}, {"n", nullptr}, {"seed", nullptr}, {"stream_options", nullptr}}));
    EXPECT_TRUE(r.params.stop.empty());
    EXPECT_FALSE(r.params.seed_given);
}

TEST(openai_in, text_content_parts_are_joined) {
    json body = chat();
    body["messages"][0]["content"] =
        json::array({{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}});
    EXPECT_EQ(ok(api_kind::chat, body).params.prompt.value_or(""), "<user>ab<assistant>");
    body["messages"][0]["content"][1] = {{"type", "image_url"}, {"image_url", {{"url", "x"}}}};
    api_error e = refused(api_kind::chat, body);
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "messages[0].content[1]");
}

TEST(openai_in, completions_take_a_string_or_token_ids) {
    json body = {{"model", "tiny"}, {"prompt", "Once"}, {"max_tokens", 3}, {"logprobs", 2}};
    api_request r = ok(api_kind::completion, body);
    EXPECT_EQ(r.params.prompt.value_or(""), "Once");
    EXPECT_FALSE(r.params.chat);
    EXPECT_EQ(r.top_logprobs, 2u);
    EXPECT_EQ(r.params.sampling.logprobs, 2u);
    body["prompt"] = json::array({1, 2, 3});
    EXPECT_EQ(ok(api_kind::completion, body).params.tokens, (std::vector<int32_t>{1, 2, 3}));
    body["prompt"] = json::array({"one"});
    EXPECT_EQ(ok(api_kind::completion, body).params.prompt.value_or(""), "one");
    body["prompt"] = json::array({"one", "two"});
    EXPECT_EQ(refused(api_kind::completion, body).param, "prompt");
    body["prompt"] = json::array({999999});  // beyond the vocabulary: ordo's validator
    EXPECT_EQ(refused(api_kind::completion, body).status, 400);
}

TEST(openai_in, refusals_name_the_field) {
    struct refusal {
        json extra;
        std::string param;
    };
    for (const refusal& c : std::vector<refusal>{
             {{{"response_format",
                {{"type", "json_schema"},
                 {"json_schema",
                  {{"name", "x"}, {"schema", {{"type", "string"}, {"pattern", "a"}}}}}}}},
              "response_format"},
             {{{"response_format", {{"type", "json_schema"}, {"json_schema", {{"nme", "x"}}}}}},
              "response_format"},
             {{{"response_format", {{"type", "json_object"}}}, {"grammar", "root ::= \"a\""}},
              "grammar"},
             {{{"tools", json::array({{{"type", "function"}, {"function", {{"name", "f g"}}}}})}},
              "tools"},
             {{{"tools",
                json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"x", 1}}}}})}},
              "tools[0].function.x"},
             {{{"tools", json::array({{{"type", "code"}}})}}, "tools"},
             {{{"tools", json::array({{{"type", "function"}, {"function", {{"name", "f"}}}},
                                      {{"type", "function"}, {"function", {{"name", "f"}}}}})}},
              "tools"},
             {{{"tool_choice", "required"}}, "tool_choice"},  // without tools
             {{{"tool_choice", "sometimes"}}, "tool_choice"},
             {{{"parallel_tool_calls", 1}}, "parallel_tool_calls"},
             {{{"logit_bias", {{"42", -100}}}}, "logit_bias"},
             {{{"response_format", {{"type", "text"}, {"extra", 1}}}}, "response_format"},
             {{{"unknown_field", 0}}, "unknown_field"},
             {{{"seed", -2}}, "seed"},
             {{{"n", 2}}, "n"},
             {{{"presence_penalty", 2.5}}, "presence_penalty"},  // OpenAI's range is [-2, 2]
             {{{"frequency_penalty", "x"}}, "frequency_penalty"},
             {{{"top_logprobs", 2}}, "top_logprobs"},  // without logprobs
             {{{"logprobs", 3}}, "logprobs"},          // chat's is a boolean
             {{{"max_tokens", 3}, {"max_completion_tokens", 3}}, "max_completion_tokens"},
             {{{"stream", "yes"}}, "stream"},
             {{{"prompt", "x"}}, "prompt"},  // a completions field
         }) {
        api_error e = refused(api_kind::chat, chat(c.extra));
        EXPECT_EQ(e.status, 400) << c.extra.dump();
        EXPECT_EQ(e.param, c.param) << c.extra.dump() << ": " << e.message;
        EXPECT_NE(e.message.find(c.param.substr(0, c.param.find('['))), std::string::npos)
            << e.message;
    }
}

// A value that asks for exactly what ordo does anyway is accepted (issue 27): what client
// libraries send by default. A null of any field counts as absent; seed -1 is llama.cpp's
// "random" (no seed passed on: the scheduler draws one).
TEST(openai_in, no_op_values_are_accepted) {
    const std::vector<json> chat_noops = {
        {{"tools", json::array()}},         {{"tools", nullptr}},
        {{"parallel_tool_calls", nullptr}}, {{"parallel_tool_calls", true}},
        {{"tool_choice", "none"}},          {{"response_format", {{"type", "text"}}}},
        {{"logit_bias", json::object()}},   {{"functions", json::array()}},
        {{"function_call", "none"}},        {{"seed", -1}},
        {{"some_future_field", nullptr}},
    };
    for (const json& extra : chat_noops) {
        api_request r = ok(api_kind::chat, chat(extra));
        if (extra.contains("seed")) {
            EXPECT_FALSE(r.params.seed_given) << extra.dump();
        }
    }
    json body = {{"model", "tiny"}, {"prompt", "x"}};
    for (const json& extra : std::vector<json>{{{"echo", false}},
                                               {{"suffix", nullptr}},
                                               {{"suffix", ""}},
                                               {{"best_of", 1}},
                                               {{"seed", -1}}}) {
        json b = body;
        b.update(extra);
        ok(api_kind::completion, b);
    }
    for (const auto& [extra, param] :
         std::vector<std::pair<json, std::string>>{{{{"echo", true}}, "echo"},
                                                   {{{"suffix", "tail"}}, "suffix"},
                                                   {{{"best_of", 2}}, "best_of"}}) {
        json b = body;
        b.update(extra);
        api_error e = refused(api_kind::completion, b);
        EXPECT_EQ(e.param, param) << e.message;
    }
    // echo is a completions field: chat refuses it as unknown.
    EXPECT_EQ(refused(api_kind::chat, chat({{"echo", false}})).param, "echo");
    // An explicit seed is passed on as given.
    api_request seeded = ok(api_kind::chat, chat({{"seed", 7}}));
    EXPECT_TRUE(seeded.params.seed_given);
    EXPECT_EQ(seeded.params.sampling.seed, 7u);
}

TEST(openai_in, ordo_range_checks_apply) {
    api_error e = refused(api_kind::chat, chat({{"temperature", -1}}));
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(e.message.find("temperature"), std::string::npos) << e.message;
    e = refused(api_kind::chat, chat({{"max_tokens", 0}}));
    EXPECT_NE(e.message.find("max_tokens"), std::string::npos) << e.message;
    e = refused(api_kind::chat,
                chat({{"messages", json::array({{{"role", "robot"}, {"content", "x"}}})}}));
    EXPECT_NE(e.message.find("messages[0].role"), std::string::npos) << e.message;
}

TEST(openai_in, the_model_must_be_the_served_one) {
    api_error e = refused(api_kind::chat, chat({{"model", "gpt-4o"}}));
    EXPECT_EQ(e.status, 404);
    EXPECT_EQ(e.code, "model_not_found");
    EXPECT_NE(e.message.find("tiny"), std::string::npos);
    json body = chat();
    body.erase("model");
    EXPECT_EQ(refused(api_kind::chat, body).param, "model");
}

TEST(openai_in, malformed_and_deep_json_are_400) {
    for (std::string body : {std::string("{\"model\": "), std::string("[1, 2]"), std::string(""),
                             std::string(100, '[') + std::string(100, ']')}) {
        auto r = parse_api_request(api_kind::chat, body, limits(), k_model);
        ASSERT_TRUE(std::holds_alternative<api_error>(r)) << body;
        EXPECT_EQ(std::get<api_error>(r).status, 400);
        EXPECT_EQ(std::get<api_error>(r).code, "invalid_json") << std::get<api_error>(r).message;
    }
}

TEST(openai_out, error_shape_and_statuses) {
    json e = json::parse(error_json({429, "overloaded", "busy", ""}));
    EXPECT_EQ(e["error"]["message"], "busy");
    EXPECT_EQ(e["error"]["code"], "overloaded");
    EXPECT_EQ(e["error"]["type"], "rate_limit_error");
    EXPECT_TRUE(e["error"]["param"].is_null());
    using ordo::door::errc;
    EXPECT_EQ(status_of(errc::bad_request), 400);
    EXPECT_EQ(status_of(errc::context_exceeded), 400);
    EXPECT_EQ(status_of(errc::overloaded), 429);
    EXPECT_EQ(status_of(errc::internal), 500);
    EXPECT_EQ(status_of(errc::gpu_failed), 500);
    EXPECT_EQ(status_of(errc::gpu_unavailable), 503);
    EXPECT_EQ(status_of(errc::shutting_down), 503);
}

TEST(openai_out, answer_and_chunks_have_openai_shapes) {
    answer_meta m{api_kind::chat, "chatcmpl-1", 5, "tiny"};
    api_request r;
    r.logprobs = true;
    r.top_logprobs = 1;
    r.include_usage = true;
    ordo::door::token_info t{
        65, "A", -0.5f, std::vector<ordo::door::top_logprob>{{65, "A", -0.5f}, {66, "B", -1.f}}};
    ordo::door::generate_done d;
    d.reason = ordo::door::finish_reason::length;
    d.text = "A";
    d.logprobs = std::vector<ordo::door::token_info>{t};
    d.usage.prompt_tokens = 3;
    d.usage.completion_tokens = 1;
    json a = json::parse(completion_json(m, r, d));
    EXPECT_EQ(a["object"], "chat.completion");
    EXPECT_EQ(a["choices"][0]["message"]["content"], "A");
    EXPECT_EQ(a["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(a["choices"][0]["logprobs"]["content"][0]["top_logprobs"].size(), 1u);
    EXPECT_EQ(a["usage"]["total_tokens"], 4);
    std::string chunk = sse_token_chunk(m, r, t, 0);
    ASSERT_EQ(chunk.rfind("data: ", 0), 0u);
    ASSERT_EQ(chunk.substr(chunk.size() - 2), "\n\n");
    json c = json::parse(chunk.substr(6));
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    EXPECT_EQ(c["choices"][0]["delta"]["content"], "A");
    EXPECT_TRUE(c["usage"].is_null());
    json u = json::parse(sse_usage_chunk(m, d).substr(6));
    EXPECT_TRUE(u["choices"].empty());
    EXPECT_EQ(u["usage"]["completion_tokens"], 1);
    answer_meta cm{api_kind::completion, "cmpl-1", 5, "tiny"};
    json ca = json::parse(completion_json(cm, r, d));
    EXPECT_EQ(ca["object"], "text_completion");
    EXPECT_EQ(ca["choices"][0]["text"], "A");
    EXPECT_EQ(ca["choices"][0]["logprobs"]["token_logprobs"][0], -0.5);
    // A streamed completion's text_offset counts from the start of the answer, as the
    // non-streamed one does, not from the start of each chunk.
    json sc = json::parse(sse_token_chunk(cm, r, t, 17).substr(6));
    EXPECT_EQ(sc["choices"][0]["logprobs"]["text_offset"][0], 17);
}

using ojson = nlohmann::ordered_json;  // a body in the client's key order

ojson weather_tools() {
    return ojson::parse(R"([{"type": "function", "function": {"name": "get_weather",
        "description": "now", "parameters": {"type": "object", "properties": {"city": {"type":
        "string"}}, "required": ["city"]}}}, {"type": "function", "function": {"name": "now"}}])");
}

TEST(openai_in, tools_reach_the_template_and_choose_the_grammar) {
    auto tool_req = [](json extra) {
        ojson body = ojson::parse(chat(extra).dump());
        body["tools"] = weather_tools();
        return parse_api_request(api_kind::chat, body.dump(), hermes_limits(), k_model);
    };
    // auto: rendered, read for calls, a call the model begins follows the grammar.
    auto r = tool_req(json::object());
    ASSERT_TRUE(std::holds_alternative<api_request>(r)) << std::get<api_error>(r).message;
    api_request a = std::get<api_request>(r);
    ASSERT_TRUE(a.tools.has_value());
    EXPECT_EQ(a.tools->format, ordo::grammar::tool_format::hermes);
    EXPECT_FALSE(a.tools->constrained);
    ASSERT_TRUE(a.params.grammar.has_value());
    EXPECT_EQ(a.params.grammar_triggers, std::vector<std::string>{"<tool_call>"});
    EXPECT_TRUE(a.params.special);  // markers that are control tokens show
    EXPECT_NE(a.params.prompt->find("<tools>[{\"type\": \"function\", \"function\": {\"name\": "
                                    "\"get_weather\", \"description\""),
              std::string::npos)
        << "tools in the body's key order: " << *a.params.prompt;
    // required: the grammar of one or more calls; a named function: that one only.
    a = std::get<api_request>(tool_req({{"tool_choice", "required"}}));
    ASSERT_TRUE(a.params.grammar.has_value());
    EXPECT_TRUE(a.params.grammar_triggers.empty()) << "from the first token";
    EXPECT_TRUE(a.tools->constrained);
    EXPECT_NE(a.params.grammar->find("get_weather"), std::string::npos);
    EXPECT_NE(a.params.grammar->find("(\"\\n\" tagged)"), std::string::npos)
        << "parallel by default: " << *a.params.grammar;
    a = std::get<api_request>(
        tool_req({{"tool_choice", {{"type", "function"}, {"function", {{"name", "now"}}}}},
                  {"parallel_tool_calls", false}}));
    ASSERT_TRUE(a.params.grammar.has_value());
    EXPECT_EQ(a.params.grammar->find("get_weather"), std::string::npos);
    EXPECT_EQ(a.params.grammar->find("(\"\\n\" tagged)"), std::string::npos);
    // none: the model is not offered the tools, and nothing is read.
    a = std::get<api_request>(tool_req({{"tool_choice", "none"}}));
    EXPECT_FALSE(a.tools.has_value());
    EXPECT_EQ(a.params.prompt->find("<tools>"), std::string::npos);
    // Refusals.
    for (const auto& [extra, param] : std::vector<std::pair<json, std::string>>{
             {{{"tool_choice", {{"type", "function"}, {"function", {{"name", "other"}}}}}},
              "tool_choice"},
             {{{"tool_choice", "required"}, {"response_format", {{"type", "json_object"}}}},
              "tools"},
             {{{"grammar", "root ::= \"a\""}}, "tools"},
             {{{"logprobs", true}}, "logprobs"},
         }) {
        auto e = tool_req(extra);
        ASSERT_TRUE(std::holds_alternative<api_error>(e)) << extra.dump();
        EXPECT_EQ(std::get<api_error>(e).param, param) << std::get<api_error>(e).message;
    }
    // A schema keyword the grammar cannot keep: "auto" reads the calls as written, "required"
    // is refused naming it.
    {
        ojson body = ojson::parse(chat().dump());
        body["tools"] = ojson::parse(R"([{"type": "function", "function": {"name": "f",
            "parameters": {"type": "object", "properties": {"n": {"type": "integer",
            "minimum": 1}}}}}])");
        auto r2 = parse_api_request(api_kind::chat, body.dump(), hermes_limits(), k_model);
        ASSERT_TRUE(std::holds_alternative<api_request>(r2)) << std::get<api_error>(r2).message;
        EXPECT_FALSE(std::get<api_request>(r2).params.grammar.has_value());
        EXPECT_TRUE(std::get<api_request>(r2).tools.has_value());
        body["tool_choice"] = "required";
        auto e2 = parse_api_request(api_kind::chat, body.dump(), hermes_limits(), k_model);
        ASSERT_TRUE(std::holds_alternative<api_error>(e2));
        EXPECT_NE(std::get<api_error>(e2).message.find("minimum"), std::string::npos)
            << std::get<api_error>(e2).message;
    }
    // A template without a call format: auto answers text; required cannot be kept.
    json body = chat({{"tools", json::parse(weather_tools().dump())}});
    a = ok(api_kind::chat, body);
    EXPECT_FALSE(a.tools.has_value());
    body["tool_choice"] = "required";
    api_error e = refused(api_kind::chat, body);
    EXPECT_EQ(e.param, "tool_choice");
    EXPECT_NE(e.message.find("no tool-call format"), std::string::npos) << e.message;
}

TEST(openai_in, history_tool_calls_reach_the_template_as_objects) {
    ojson body = ojson::parse(chat().dump());
    body["messages"] = ojson::parse(R"([{"role": "user", "content": "Weather?"},
        {"role": "assistant", "refusal": null, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}])");
    auto r = parse_api_request(api_kind::chat, body.dump(), hermes_limits(), k_model);
    ASSERT_TRUE(std::holds_alternative<api_request>(r)) << std::get<api_error>(r).message;
    EXPECT_EQ(*std::get<api_request>(r).params.prompt,
              "<user>Weather?<assistant>None<tool_call>{\"name\": \"get_weather\", \"arguments\": "
              "{\"city\": \"Paris\"}}</tool_call><tool>sunny<assistant>");
}

TEST(openai_out, tool_calls_whole_and_streamed) {
    answer_meta m{api_kind::chat, "chatcmpl-7", 5, "tiny"};
    api_request r;
    r.tools = tool_use{ordo::grammar::tool_format::hermes, false};
    ordo::door::generate_done d;
    d.reason = ordo::door::finish_reason::stop;
    d.text = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
    json a = json::parse(completion_json(m, r, d));
    const json& msg = a["choices"][0]["message"];
    EXPECT_TRUE(msg["content"].is_null());
    ASSERT_EQ(msg["tool_calls"].size(), 1u);
    EXPECT_EQ(msg["tool_calls"][0]["type"], "function");
    EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "now");
    EXPECT_EQ(msg["tool_calls"][0]["function"]["arguments"], "{}");
    EXPECT_EQ(msg["tool_calls"][0]["id"], ordo::grammar::tool_call_id(r.tools->format, m.id, 0));
    EXPECT_EQ(a["choices"][0]["finish_reason"], "tool_calls");
    d.reason =
        ordo::door::finish_reason::length;  // cut: the calls that parsed, but the answer was cut
    d.text = "Plain text.";
    a = json::parse(completion_json(m, r, d));
    EXPECT_EQ(a["choices"][0]["message"]["content"], "Plain text.");
    EXPECT_FALSE(a["choices"][0]["message"].contains("tool_calls"));
    EXPECT_EQ(a["choices"][0]["finish_reason"], "length");
    // Stream pieces: the first names the call (with its id), later ones carry arguments.
    std::vector<ordo::grammar::tool_delta> pieces = {
        {"Hm.", -1, "", ""}, {"", 0, "now", ""}, {"", 0, "", "{}"}};
    std::string text = sse_tool_chunks(m, r, pieces);
    std::vector<json> chunks;
    for (size_t at = 0; (at = text.find("data: ", at)) != std::string::npos;) {
        const size_t end = text.find("\n\n", at);
        chunks.push_back(json::parse(text.substr(at + 6, end - at - 6)));
        at = end;
    }
    ASSERT_EQ(chunks.size(), 3u);
    EXPECT_EQ(chunks[0]["choices"][0]["delta"]["content"], "Hm.");
    const json& first = chunks[1]["choices"][0]["delta"]["tool_calls"][0];
    EXPECT_EQ(first["index"], 0);
    EXPECT_EQ(first["function"]["name"], "now");
    EXPECT_EQ(first["id"], ordo::grammar::tool_call_id(r.tools->format, m.id, 0));
    const json& more = chunks[2]["choices"][0]["delta"]["tool_calls"][0];
    EXPECT_FALSE(more.contains("id"));
    EXPECT_EQ(more["function"]["arguments"], "{}");
    d.reason = ordo::door::finish_reason::stop;
    json fin = json::parse(sse_final_chunk(m, r, d, 1).substr(6));
    EXPECT_EQ(fin["choices"][0]["finish_reason"], "tool_calls");
}

// max_tokens' range errors name the field the client sent, in the message and in param.
TEST(openai_in, max_tokens_errors_name_the_field_sent) {
    api_error e = refused(api_kind::chat, chat({{"max_completion_tokens", 0}}));
    EXPECT_EQ(e.param, "max_completion_tokens");
    EXPECT_NE(e.message.find("max_completion_tokens"), std::string::npos) << e.message;
    e = refused(api_kind::chat, chat({{"max_tokens", 0}}));
    EXPECT_EQ(e.param, "max_tokens");
    EXPECT_EQ(e.message.find("max_completion_tokens"), std::string::npos) << e.message;
}

// Seeded mutations of valid bodies (bytes flipped, fields dropped or retyped): every body is
// either accepted as a request whose parameters hold ordo's bounds, or refused with 400/404 and a
// message; nothing throws. (Run under ASan by ORDO_SANITIZE=1.)
TEST(openai_in, mutated_bodies_are_accepted_or_refused_never_crash) {
    std::mt19937_64 rng(7);
    const std::vector<json> seeds = {chat({{"stream", true},
                                           {"stream_options", {{"include_usage", true}}},
                                           {"logprobs", true},
                                           {"top_logprobs", 2},
                                           {"stop", json::array({"a", "b"})},
                                           {"seed", 3}}),
                                     json({{"model", "tiny"},
                                           {"prompt", json::array({1, 2, 3})},
                                           {"max_tokens", 4},
                                           {"logprobs", 1}})};
    const std::vector<json> values = {nullptr,
                                      true,
                                      -1,
                                      0,
                                      1,
                                      2.5,
                                      1e300,
                                      "x",
                                      json::array(),
                                      json::object(),
                                      json::array({1, "a", nullptr})};
    for (int round = 0; round < 4000; round++) {
        const bool is_chat = round % 2 == 0;
        json body = seeds[is_chat ? 0 : 1];
        std::string text;
        if (round % 3 == 0) {
            text = body.dump();
            for (int flips = 1 + int(rng() % 4); flips > 0; flips--) {
                text[rng() % text.size()] = char(rng());
            }
        } else {
            auto it = body.begin();
            std::advance(it, rng() % body.size());
            if (rng() % 3 == 0) {
                body.erase(it.key());
            } else {
                *it = values[rng() % values.size()];
            }
            text = body.dump();
        }
        auto r = parse_api_request(is_chat ? api_kind::chat : api_kind::completion, text, limits(),
                                   k_model);
        if (auto* e = std::get_if<api_error>(&r)) {
            EXPECT_TRUE(e->status == 400 || e->status == 404) << e->status;
            EXPECT_FALSE(e->message.empty());
        } else {
            const api_request& a = std::get<api_request>(r);
            EXPECT_GE(a.params.max_tokens, 1u);
            EXPECT_LE(a.params.sampling.logprobs, 20u);
            EXPECT_TRUE(a.params.prompt.has_value() != !a.params.tokens.empty());
        }
    }
}

// POST /v1/embeddings (issue 27): each input form becomes its embed requests, in order; bad
// bodies are 400 naming the field; the answer lists the vectors as floats or base64 of their
// little-endian float32 bytes, with usage counting every input's tokens.
TEST(openai_embeddings, inputs_become_embed_requests) {
    served_model m = k_model;
    m.n_embd = 4;
    auto parse = [&](const json& body) {
        return parse_embeddings_request(body.dump(), limits(), m);
    };
    auto ok = [&](const json& body) {
        auto r = parse(body);
        EXPECT_TRUE(std::holds_alternative<embeddings_request>(r))
            << body.dump() << ": " << std::get<api_error>(r).message;
        return std::holds_alternative<embeddings_request>(r) ? std::get<embeddings_request>(r)
                                                             : embeddings_request{};
    };
    auto one = ok({{"model", "tiny"}, {"input", "hello"}});
    ASSERT_EQ(one.inputs.size(), 1u);
    EXPECT_EQ(one.inputs[0].text, std::optional<std::string>("hello"));
    EXPECT_FALSE(one.base64);
    auto texts = ok({{"model", "tiny"}, {"input", {"a", "b", "c"}}, {"encoding_format", "base64"}});
    ASSERT_EQ(texts.inputs.size(), 3u);
    EXPECT_EQ(texts.inputs[2].text, std::optional<std::string>("c"));
    EXPECT_TRUE(texts.base64);
    auto ids = ok({{"model", "tiny"}, {"input", {1, 2, 3}}, {"dimensions", 4}, {"user", "u"}});
    ASSERT_EQ(ids.inputs.size(), 1u);
    EXPECT_EQ(ids.inputs[0].tokens, (std::vector<int32_t>{1, 2, 3}));
    auto nested = ok({{"model", "tiny"},
                      {"input", json::array({json::array({1, 2}), json::array({3})})},
                      {"encoding_format", nullptr}});
    ASSERT_EQ(nested.inputs.size(), 2u);
    EXPECT_EQ(nested.inputs[1].tokens, (std::vector<int32_t>{3}));

    struct bad_case {
        json body;
        const char* param;
    };
    const bad_case bad[] = {
        {{{"model", "tiny"}}, "input"},
        {{{"model", "tiny"}, {"input", ""}}, "input"},
        {{{"model", "tiny"}, {"input", json::array()}}, "input"},
        {{{"model", "tiny"}, {"input", {"a", 5}}}, "input"},
        {{{"model", "tiny"}, {"input", {1, 260}}}, "input"},  // the vocabulary is 260
        {{{"model", "tiny"}, {"input", {1, -1}}}, "input"},
        {{{"model", "tiny"}, {"input", json::array({json::array({1}), json::array()})}}, "input"},
        {{{"model", "tiny"}, {"input", 7}}, "input"},
        {{{"model", "tiny"}, {"input", json(std::vector<std::string>(2049, "x"))}}, "input"},
        {{{"model", "tiny"}, {"input", "x"}, {"encoding_format", "int8"}}, "encoding_format"},
        {{{"model", "tiny"}, {"input", "x"}, {"dimensions", 3}}, "dimensions"},
        {{{"model", "tiny"}, {"input", "x"}, {"user", 1}}, "user"},
        {{{"model", "tiny"}, {"input", "x"}, {"stream", true}}, "stream"},
    };
    for (const bad_case& b : bad) {
        auto r = parse(b.body);
        ASSERT_TRUE(std::holds_alternative<api_error>(r)) << b.body.dump().substr(0, 80);
        const api_error& e = std::get<api_error>(r);
        EXPECT_EQ(e.status, 400) << b.body.dump().substr(0, 80);
        EXPECT_EQ(e.param, b.param) << e.message;
    }
    auto other = parse({{"model", "gpt"}, {"input", "x"}});
    ASSERT_TRUE(std::holds_alternative<api_error>(other));
    EXPECT_EQ(std::get<api_error>(other).status, 404);
}

TEST(openai_embeddings, answer_as_floats_or_base64) {
    std::vector<ordo::door::embed_done> done(2);
    done[0].embedding = {1.0f, -0.5f};
    done[0].prompt_tokens = 3;
    done[1].embedding = {0.25f, 0.0f};
    done[1].prompt_tokens = 4;
    json f = json::parse(embeddings_json("tiny", done, false));
    EXPECT_EQ(f["object"], "list");
    EXPECT_EQ(f["model"], "tiny");
    ASSERT_EQ(f["data"].size(), 2u);
    EXPECT_EQ(f["data"][1]["object"], "embedding");
    EXPECT_EQ(f["data"][1]["index"], 1);
    EXPECT_EQ(f["data"][0]["embedding"], json({1.0, -0.5}));
    EXPECT_EQ(f["usage"]["prompt_tokens"], 7);
    EXPECT_EQ(f["usage"]["total_tokens"], 7);
    json b = json::parse(embeddings_json("tiny", done, true));
    // 1.0f = 00 00 80 3f, -0.5f = 00 00 00 bf (little-endian): "AACAPwAAAL8="
    EXPECT_EQ(b["data"][0]["embedding"], "AACAPwAAAL8=");
    // 0.25f = 00 00 80 3e, 0.0f = 00 00 00 00
    EXPECT_EQ(b["data"][1]["embedding"], "AACAPgAAAAA=");
}
