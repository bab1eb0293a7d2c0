// test_chat_ops.cpp: the `chat` and `apply_template` ops at the edge (net/chat.hpp, net/ops.hpp),
// without a server: requests are JSON turned into msgpack (nlohmann's to_msgpack).
//
// Checks: (1) a chat request renders the template into the generate prompt (chat flag set), with
// every generate parameter carried over; the template sees messages (keys in the client's
// order), add_generation_prompt (default true), bos_token / eos_token, tools, the
// chat_template_kwargs and strftime_now. (2) apply_template becomes a chat tokenize of the same
// text. (3) A table of bad conversations, each bad_request naming the key (messages[i].role,
// chat_template_kwargs.add_generation_prompt, ...), including prompt/tokens on a chat. (4) No
// template: no_chat_template with a hint; a template that did not parse: template_error naming
// its line; raise_exception: template_error with the template's message and line. (5) The
// server's render bounds apply: a loop of 4M steps (under the engine's default 10M, over the
// server's 1M) and a string doubling past 32 MiB end with template_error naming a bound.
#include <gtest/gtest.h>

#include <memory>
#include <msgpack.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "net/chat.hpp"
#include "net/ops.hpp"

namespace {

using namespace ordo;
using namespace ordo::net;
using json = nlohmann::ordered_json;

// The request {"id": 1, "op": op, ...params} as msgpack.
msgpack::object_handle make(const std::string& op, json params) {
    json j = {{"id", 1}, {"op", op}};
    for (auto& [k, v] : params.items()) j[k] = v;
    std::vector<uint8_t> bytes = json::to_msgpack(j);
    return msgpack::unpack(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// ChatML with every variable the server passes, so a render shows what the template saw.
const char* k_chatml =
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    "{% if tools %}[tools {{ tools | length }}: {{ tools[0].name }}]{% endif %}"
    "{% if date_string is defined %}[date {{ date_string }}]{% endif %}"
    "{% if show_json is defined %}{{ messages[0] | tojson }}{% endif %}"
    "{% if show_year is defined %}[{{ strftime_now('%Y') | length }}]{% endif %}"
    "{{ eos_token if end is defined else '' }}";

request_limits limits_with(std::string_view tmpl, bool kv = true) {
    request_limits l{256, 0, kv};
    l.chat =
        std::make_shared<const chat_setup>(make_chat_setup(tmpl, "file:test.jinja", "<s>", "</s>"));
    return l;
}

const json k_hi = json::array({{{"role", "user"}, {"content", "Hi"}}});

result<op> parse(const std::string& o, json params, const request_limits& l) {
    msgpack::object_handle h = make(o, std::move(params));
    return parse_op(request{1, o, &h.get()}, l);
}

std::string prompt_of(const result<op>& r) {
    if (!r.ok()) return "error " + r.err().code + ": " + r.err().message;
    const auto* g = std::get_if<sched::generate>(&*r);
    if (g == nullptr || !g->params.prompt) return "not a generate with a prompt";
    return *g->params.prompt;
}

// (1)
TEST(chat_op, renders_the_template_into_the_prompt_with_generate_parameters) {
    const auto l = limits_with(k_chatml);
    json p = {{"messages", json::array({{{"role", "system"}, {"content", "Be brief."}},
                                        {{"role", "user"}, {"content", "Hi"}}})},
              {"max_tokens", 7},
              {"temperature", 0},
              {"stream", true},
              {"stop", "\n"},
              {"session", "conv-1"},
              {"special", true}};
    auto r = parse("chat", p, l);
    ASSERT_TRUE(r.ok()) << r.err().message;
    const auto& g = std::get<sched::generate>(*r);
    EXPECT_EQ(g.id, 1u);
    EXPECT_TRUE(g.params.chat);
    EXPECT_EQ(*g.params.prompt,
              "<s><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
              "<|im_start|>assistant\n");
    EXPECT_EQ(g.params.max_tokens, 7u);
    EXPECT_EQ(g.params.sampling.temperature, 0.0f);
    EXPECT_TRUE(g.params.stream);
    EXPECT_EQ(g.params.stop, std::vector<std::string>{"\n"});
    EXPECT_EQ(g.params.session, "conv-1");
    EXPECT_TRUE(g.params.special);
    EXPECT_TRUE(g.params.tokens.empty());
}

TEST(chat_op, the_template_sees_every_variable) {
    const auto l = limits_with(k_chatml);
    EXPECT_EQ(prompt_of(parse("chat", {{"messages", k_hi}, {"add_generation_prompt", false}}, l)),
              "<s><|im_start|>user\nHi<|im_end|>\n");
    json tools = json::array({{{"name", "get_weather"}, {"parameters", {{"type", "object"}}}}});
    EXPECT_EQ(prompt_of(parse("chat",
                              {{"messages", k_hi},
                               {"add_generation_prompt", false},
                               {"tools", tools},
                               {"chat_template_kwargs",
                                {{"date_string", "26 Jul 2024"}, {"end", true}, {"show_year", 1}}}},
                              l)),
              "<s><|im_start|>user\nHi<|im_end|>\n[tools 1: get_weather][date 26 Jul 2024][4]</s>");
    // Keys in the order sent; a nil content with tool_calls; tool messages.
    json msgs =
        json::array({{{"content", "Hi"}, {"role", "user"}, {"name", "ann"}},
                     {{"role", "assistant"},
                      {"content", nullptr},
                      {"tool_calls", json::array({{{"name", "f"}, {"arguments", {{"x", 1}}}}})}},
                     {{"role", "tool"}, {"content", "42"}, {"tool_call_id", "c1"}}});
    EXPECT_EQ(prompt_of(parse("chat",
                              {{"messages", msgs},
                               {"add_generation_prompt", false},
                               {"chat_template_kwargs", {{"show_json", true}}}},
                              l)),
              "<s><|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nNone<|im_end|>\n"
              "<|im_start|>tool\n42<|im_end|>\n"
              "{\"content\": \"Hi\", \"role\": \"user\", \"name\": \"ann\"}");
}

// (2)
TEST(chat_op, apply_template_is_a_chat_tokenize_of_the_same_text) {
    const auto l = limits_with(k_chatml);
    auto r = parse("apply_template", {{"messages", k_hi}}, l);
    ASSERT_TRUE(r.ok()) << r.err().message;
    const auto& t = std::get<sched::tokenize>(*r);
    EXPECT_TRUE(t.chat);
    EXPECT_EQ(t.text, "<s><|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    EXPECT_EQ(t.text, prompt_of(parse("chat", {{"messages", k_hi}}, l)));
    // apply_template takes no generate parameters.
    auto bad = parse("apply_template", {{"messages", k_hi}, {"max_tokens", 3}}, l);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.err().message.find("max_tokens"), std::string::npos) << bad.err().message;
}

// (3)
TEST(chat_op, bad_conversations_are_bad_requests_naming_the_key) {
    const auto l = limits_with(k_chatml);
    json deep = 1;
    for (int i = 0; i < 40; i++) deep = json::array({deep});
    json many = json::array();
    for (int i = 0; i < 4097; i++) many.push_back({{"role", "user"}, {"content", "x"}});
    struct bad_case {
        json params;
        std::string names;  // the message must contain this
    };
    const std::vector<bad_case> cases = {
        {json::object(), "\"messages\" is required"},
        {{{"messages", json::array()}}, "\"messages\""},
        {{{"messages", "Hi"}}, "\"messages\""},
        {{{"messages", many}}, "\"messages\""},
        {{{"messages", json::array({"Hi"})}}, "messages[0]"},
        {{{"messages", json::array({{{"content", "x"}}})}}, "messages[0].role"},
        {{{"messages", json::array({{{"role", "bot"}, {"content", "x"}}})}}, "messages[0].role"},
        {{{"messages", json::array({{{"role", 1}, {"content", "x"}}})}}, "messages[0].role"},
        {{{"messages", json::array({{{"role", "user"}}})}}, "messages[0].content"},
        {{{"messages", json::array({{{"role", "user"}, {"content", nullptr}}})}},
         "messages[0].content"},
        {{{"messages", json::array({{{"role", "user"}, {"content", 5}}})}}, "messages[0].content"},
        {{{"messages", json::array({k_hi[0], {{"role", "user"}, {"content", "x"}, {"foo", 1}}})}},
         "messages[1].foo"},
        {{{"messages",
           json::array({{{"role", "assistant"}, {"content", "x"}, {"tool_calls", 1}}})}},
         "messages[0].tool_calls"},
        {{{"messages", json::array({{{"role", "user"}, {"content", "x"}, {"name", deep}}})}},
         "messages[0].name"},
        {{{"messages", k_hi}, {"tools", "all"}}, "\"tools\""},
        {{{"messages", k_hi}, {"tools", json::array({1})}}, "tools[0]"},
        {{{"messages", k_hi}, {"add_generation_prompt", "yes"}}, "add_generation_prompt"},
        {{{"messages", k_hi}, {"chat_template_kwargs", json::array()}}, "chat_template_kwargs"},
        {{{"messages", k_hi}, {"chat_template_kwargs", {{"bos_token", "x"}}}},
         "chat_template_kwargs.bos_token"},
        {{{"messages", k_hi}, {"chat_template_kwargs", {{"v", deep}}}}, "chat_template_kwargs.v"},
        {{{"messages", k_hi}, {"prompt", "Hi"}}, "prompt"},
        {{{"messages", k_hi}, {"tokens", json::array({1})}}, "tokens"},
        {{{"messages", k_hi}, {"max_tokens", 0}}, "max_tokens"},
    };
    for (const auto& c : cases) {
        auto r = parse("chat", c.params, l);
        ASSERT_FALSE(r.ok()) << c.params.dump();
        EXPECT_EQ(r.err().code, "bad_request") << c.params.dump();
        EXPECT_NE(r.err().message.find(c.names), std::string::npos)
            << c.params.dump() << " -> " << r.err().message;
    }
    // Invalid UTF-8 in a content string (msgpack built by hand: JSON cannot carry it).
    msgpack::sbuffer buf;
    msgpack::packer<msgpack::sbuffer> pk(buf);
    pk.pack_map(3);
    pk.pack("id"), pk.pack(1), pk.pack("op"), pk.pack("chat"), pk.pack("messages");
    pk.pack_array(1), pk.pack_map(2), pk.pack("role"), pk.pack("user"), pk.pack("content");
    pk.pack_str(2), pk.pack_str_body("\xff\xfe", 2);
    auto h = msgpack::unpack(buf.data(), buf.size());
    request rq{1, "chat", &h.get()};
    auto r = parse_op(rq, l);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.err().message.find("messages[0].content"), std::string::npos) << r.err().message;
}

// (4)
TEST(chat_op, no_template_and_failing_templates_have_their_own_codes) {
    request_limits none{256, 0, false};
    auto r = parse("chat", {{"messages", k_hi}}, none);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.err().code, "no_chat_template");
    EXPECT_NE(r.err().message.find("--chat-template"), std::string::npos) << r.err().message;
    none.chat = std::make_shared<const chat_setup>(make_chat_setup("", "none", "", ""));
    EXPECT_EQ(parse("apply_template", {{"messages", k_hi}}, none).err().code, "no_chat_template");
    // A bad request is refused as such even without a template.
    EXPECT_EQ(parse("chat", {{"messages", "x"}}, none).err().code, "bad_request");

    auto broken = limits_with("line one\n{% for m in messages %}\n{{ m.content }");
    ASSERT_TRUE(broken.chat->problem.size() > 0);
    r = parse("chat", {{"messages", k_hi}}, broken);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.err().code, "template_error");
    EXPECT_NE(r.err().message.find("line 3"), std::string::npos) << r.err().message;

    auto raising = limits_with(
        "{% for m in messages %}\n{% if m.role == 'tool' %}\n"
        "{{ raise_exception('tools are not supported') }}\n{% endif %}{{ m.content }}{% endfor %}");
    EXPECT_EQ(prompt_of(parse("chat", {{"messages", k_hi}}, raising)), "Hi");
    r = parse("apply_template", {{"messages", json::array({{{"role", "tool"}, {"content", "1"}}})}},
              raising);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.err().code, "template_error");
    EXPECT_NE(r.err().message.find("tools are not supported"), std::string::npos)
        << r.err().message;
    EXPECT_NE(r.err().message.find("line 3"), std::string::npos) << r.err().message;
}

// (5)
TEST(chat_op, renders_are_bounded_by_the_server_limits) {
    const auto l = limits_with(
        "{% if n is defined %}{% for i in range(n) %}{% for j in range(n) %}{% endfor %}"
        "{% endfor %}{% endif %}"
        "{% if d is defined %}{% set s = namespace(v='0123456789abcdef') %}"
        "{% for i in range(d) %}{% set s.v = s.v ~ s.v %}{% endfor %}{{ s.v | length }}{% endif %}"
        "ok");
    EXPECT_EQ(
        prompt_of(parse("chat", {{"messages", k_hi}, {"chat_template_kwargs", {{"n", 10}}}}, l)),
        "ok");
    auto r = parse("chat", {{"messages", k_hi}, {"chat_template_kwargs", {{"n", 2000}}}}, l);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.err().code, "template_error");
    EXPECT_NE(r.err().message.find("step bound of 1000000"), std::string::npos) << r.err().message;
    r = parse("chat", {{"messages", k_hi}, {"chat_template_kwargs", {{"d", 40}}}}, l);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.err().code, "template_error");
    // A string of 2^40 x 16 bytes: the copies' steps or the 32 MiB string bound, whichever first.
    EXPECT_NE(r.err().message.find("bound"), std::string::npos) << r.err().message;
}

}  // namespace
