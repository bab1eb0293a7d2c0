// test_tool_calls.cpp: the chat families' tool-call formats (grammar/tool_calls.hpp). Checks that
//   - the family is read from real templates (../shared/models/chat, when present) and snippets;
//   - each family's call grammar accepts its calls (one, several when parallel), arguments valid
//     against each function's schema, and refuses other functions, bad arguments and text;
//   - answers in each family's shape (content before calls, parallel calls, markers, extra
//     "type"/"id" keys, keys in another order) parse into content and calls, arguments as the
//     model wrote them; malformed or cut calls stay content, except under a grammar, where a
//     cut answer keeps its whole names and the arguments so far;
//   - a streamed answer, fed in pieces of every size, puts together into the whole answer's
//     parse, content and calls alike, constrained or not;
//   - call ids are stable per answer and index, and Mistral's are 9 letters and digits.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "grammar/gbnf.hpp"
#include "grammar/tool_calls.hpp"

namespace ordo::grammar {
namespace {

using ojson = nlohmann::ordered_json;

bool accepts(const gbnf& g, const std::string& doc) {
    matcher m(g);
    auto ok = m.advance_utf8(doc);
    return ok.ok() && *ok && m.accepting();
}

std::vector<tool_function> weather_tools() {
    return {{"get_weather", ojson::parse(R"({"type": "object", "properties": {
                "city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                "required": ["city"]})")},
            {"now", nullptr}};
}

gbnf compiled(tool_format f, bool parallel, std::span<const tool_function> tools) {
    auto src = tool_calls_gbnf(f, tools, parallel);
    EXPECT_TRUE(src.ok()) << src.err().message;
    auto g = parse_gbnf(*src);
    EXPECT_TRUE(g.ok()) << g.err().message << "\n" << *src;
    return std::move(*g);
}

TEST(tool_calls, family_from_template_snippets) {
    EXPECT_EQ(tool_format_of("{{ '<tool_call>\\n' }}"), tool_format::hermes);
    EXPECT_EQ(tool_format_of("{{- \"[TOOL_CALLS][\" }}"), tool_format::mistral);
    EXPECT_EQ(tool_format_of("<|start_header_id|>... {\"name\": function name, \"parameters\": "
                             "dictionary}"),
              tool_format::llama3_json);
    EXPECT_EQ(tool_format_of("<|start_header_id|>{{ m.content }}<|eot_id|>"), tool_format::none);
    EXPECT_EQ(tool_format_of("<|im_start|>{{ m.content }}"), tool_format::none);
}

TEST(tool_calls, family_from_real_templates) {
    const std::filesystem::path dir = std::string(ORDO_SHARED_MODELS_DIR) + "/chat/templates";
    if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no " << dir << " (../shared absent)";
    const std::map<std::string, tool_format> want = {
        {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use", tool_format::hermes},
        {"Qwen-Qwen2.5-7B-Instruct", tool_format::hermes},
        {"meta-llama-Llama-3.1-8B-Instruct", tool_format::llama3_json},
        {"meta-llama-Llama-3.2-3B-Instruct", tool_format::llama3_json},
        {"meta-llama-Llama-3.3-70B-Instruct", tool_format::llama3_json},
        {"mistralai-Mistral-Nemo-Instruct-2407", tool_format::mistral},
        {"llama3-Meta-Llama-3-8B-Instruct", tool_format::none},
        {"google-gemma-2-2b-it", tool_format::none},
        {"llama2-Llama-2-7b-chat-hf", tool_format::none},
        {"chatml-OpenHermes-2.5-Mistral-7B", tool_format::none},
    };
    for (const auto& [name, f] : want) {
        std::ifstream in(dir / (name + ".jinja"));
        ASSERT_TRUE(in) << name;
        std::stringstream text;
        text << in.rdbuf();
        EXPECT_EQ(tool_format_of(text.str()), f) << name;
    }
}

TEST(tool_calls, hermes_grammar) {
    auto tools = weather_tools();
    gbnf one = compiled(tool_format::hermes, false, tools);
    const std::string call =
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
        "{\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>";
    const std::string now = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
    EXPECT_TRUE(accepts(one, call));
    EXPECT_TRUE(accepts(one, now));
    EXPECT_FALSE(accepts(one, call + "\n" + now));  // one call without parallel
    EXPECT_FALSE(accepts(one, "Sure. " + call));
    EXPECT_FALSE(
        accepts(one, "<tool_call>\n{\"name\": \"other\", \"arguments\": {}}\n</tool_call>"));
    EXPECT_FALSE(accepts(one,
                         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                         "{\"unit\": \"c\"}}\n</tool_call>"));  // city is required
    gbnf many = compiled(tool_format::hermes, true, tools);
    EXPECT_TRUE(accepts(many, call + "\n" + now + "\n" + call));
}

TEST(tool_calls, llama3_and_mistral_grammars) {
    auto tools = weather_tools();
    gbnf llama = compiled(tool_format::llama3_json, true, tools);  // one call whatever parallel
    EXPECT_TRUE(accepts(llama, R"({"name": "get_weather", "parameters": {"city": "Oslo"}})"));
    EXPECT_FALSE(accepts(llama, R"({"name": "get_weather", "arguments": {"city": "Oslo"}})"));
    EXPECT_FALSE(
        accepts(llama, R"({"name": "now", "parameters": {}}{"name": "now", "parameters": {}})"));
    gbnf mistral = compiled(tool_format::mistral, true, tools);
    EXPECT_TRUE(accepts(mistral, R"([TOOL_CALLS][{"name": "now", "arguments": {}}])"));
    EXPECT_TRUE(accepts(
        mistral,
        R"([TOOL_CALLS][{"name": "now", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Rome"}}])"));
    EXPECT_FALSE(accepts(mistral, R"([TOOL_CALLS][])"));
    gbnf mistral_one = compiled(tool_format::mistral, false, tools);
    EXPECT_FALSE(accepts(
        mistral_one,
        R"([TOOL_CALLS][{"name": "now", "arguments": {}}, {"name": "now", "arguments": {}}])"));
}

TEST(tool_calls, grammar_refuses_parameters_it_cannot_keep) {
    std::vector<tool_function> tools = {{"f", ojson::parse(R"({"type": "string"})")}};
    auto g = tool_calls_gbnf(tool_format::hermes, tools, false);
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.err().message.find("parameters of function \"f\""), std::string::npos)
        << g.err().message;
    tools = {{"f", nullptr}, {"g", ojson::parse(R"({"type": "object", "patternProperties": {}})")}};
    g = tool_calls_gbnf(tool_format::hermes, tools, false);
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.err().message.find("parameters of function \"g\""), std::string::npos)
        << g.err().message;
    EXPECT_NE(g.err().message.find("patternProperties"), std::string::npos);
}

void expect_calls(const tool_output& out, const std::string& content,
                  const std::vector<tool_call>& calls) {
    EXPECT_EQ(out.content, content);
    ASSERT_EQ(out.calls.size(), calls.size());
    for (size_t i = 0; i < calls.size(); i++) {
        EXPECT_EQ(out.calls[i].name, calls[i].name) << i;
        EXPECT_EQ(out.calls[i].arguments, calls[i].arguments) << i;
    }
}

TEST(tool_calls, parses_each_family) {
    // Qwen 2.5: text, then two calls.
    expect_calls(parse_tool_output(tool_format::hermes, false,
                                   "Let me look both up.\n<tool_call>\n{\"name\": \"get_weather\", "
                                   "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
                                   "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                                   "{\"city\": \"Lyon\"}}\n</tool_call>"),
                 "Let me look both up.",
                 {{"get_weather", R"({"city": "Paris"})"}, {"get_weather", R"({"city": "Lyon"})"}});
    // Hermes 3: arguments before the name.
    expect_calls(parse_tool_output(tool_format::hermes, false,
                                   "<tool_call>\n{\"arguments\": {\"q\": [1, {\"x\": \"}\"}]}, "
                                   "\"name\": \"search\"}\n</tool_call>"),
                 "", {{"search", R"({"q": [1, {"x": "}"}]})"}});
    // Llama 3.1: the answer is the call, "<|python_tag|>" shown as its text.
    expect_calls(parse_tool_output(tool_format::llama3_json, false,
                                   "<|python_tag|>{\"name\": \"now\", \"parameters\": {}}"),
                 "", {{"now", "{}"}});
    expect_calls(parse_tool_output(tool_format::llama3_json, false,
                                   "\n{\"type\": \"function\", \"name\": \"get_weather\", "
                                   "\"parameters\": {\"city\": \"Oslo\"}}"),
                 "", {{"get_weather", R"({"city": "Oslo"})"}});
    // Mistral Nemo: a list, an id beside.
    expect_calls(parse_tool_output(tool_format::mistral, false,
                                   "[TOOL_CALLS][{\"name\": \"now\", \"arguments\": {}, \"id\": "
                                   "\"a1B2c3D4e\"}, {\"name\": \"get_weather\", \"arguments\": "
                                   "{\"city\": \"Rome\"}}]"),
                 "", {{"now", "{}"}, {"get_weather", R"({"city": "Rome"})"}});
}

TEST(tool_calls, what_is_not_a_call_stays_content) {
    const std::vector<std::pair<tool_format, std::string>> texts = {
        {tool_format::hermes, "Plain answer."},
        {tool_format::hermes, "See <tool_call>{\"name\": \"x\"}</tool_call>"},  // no arguments
        {tool_format::hermes, "<tool_call>\n{\"name\": \"x\", \"arguments\": {}}\n"},  // cut
        {tool_format::hermes, "<tool_call>{\"name\": \"x\", \"arguments\": {}}</tool_call> and"},
        {tool_format::hermes, "<tool_call>{\"name\": \"x\", \"arguments\": {,}}</tool_call>"},
        {tool_format::hermes, "<tool_call>{\"name\": \"x\", \"arguments\": [1]}</tool_call>"},
        {tool_format::llama3_json, "The answer is {\"name\": \"x\", \"parameters\": {}}"},
        {tool_format::llama3_json, "{\"name\": \"x\", \"parameters\": {}, \"other\": 1}"},
        {tool_format::mistral, "[TOOL_CALLS][{\"name\": \"x\", \"arguments\": {}}"},
        {tool_format::mistral, "[TOOL_CALLS]{\"name\": \"x\", \"arguments\": {}}"},
        {tool_format::none, "<tool_call>{\"name\": \"x\", \"arguments\": {}}</tool_call>"},
    };
    for (const auto& [f, text] : texts) {
        expect_calls(parse_tool_output(f, false, text), text, {});
    }
}

TEST(tool_calls, a_cut_constrained_answer_keeps_what_came) {
    const std::string text =
        "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n"
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa";
    expect_calls(parse_tool_output(tool_format::hermes, true, text), "",
                 {{"now", "{}"}, {"get_weather", "{\"city\": \"Pa"}});
    // A name not whole yet is no call.
    expect_calls(parse_tool_output(tool_format::mistral, true, "[TOOL_CALLS][{\"name\": \"ge"),
                 "[TOOL_CALLS][{\"name\": \"ge", {});
}

// Feeds `text` in pieces of `step` bytes and puts the deltas together.
tool_output streamed(tool_format f, bool constrained, const std::string& text, size_t step) {
    tool_stream s(f, constrained);
    tool_output out;
    std::vector<size_t> name_pieces;
    auto take = [&](const std::vector<tool_delta>& ds) {
        for (const tool_delta& d : ds) {
            if (d.index < 0) {
                out.content += d.content;
                continue;
            }
            EXPECT_TRUE(d.content.empty());
            const auto i = static_cast<size_t>(d.index);
            if (i == out.calls.size()) {
                EXPECT_FALSE(d.name.empty()) << "a call's first piece names it";
                out.calls.push_back({d.name, ""});
            } else {
                ASSERT_EQ(i + 1, out.calls.size()) << "pieces of calls in order";
                EXPECT_TRUE(d.name.empty());
            }
            out.calls[i].arguments += d.arguments;
        }
    };
    for (size_t i = 0; i < text.size(); i += step) take(s.feed(text.substr(i, step)));
    take(s.finish());
    EXPECT_EQ(s.calls(), out.calls.size());
    return out;
}

TEST(tool_calls, streamed_pieces_make_the_whole_answer) {
    const std::vector<std::pair<tool_format, std::string>> texts = {
        {tool_format::hermes,
         "Let me check.  \n<tool_call>\n{\"name\": \"now\", \"arguments\": "
         "{}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", "
         "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"},
        {tool_format::hermes, "a < b <tool and <tool_cal but no call\n"},
        {tool_format::hermes, "Broken <tool_call>{\"name\": \"x\"}</tool_call> tail"},
        {tool_format::hermes,
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa"},
        {tool_format::llama3_json, "  <|python_tag|>{\"name\": \"now\", \"parameters\": {}}"},
        {tool_format::llama3_json,
         "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}"},
        {tool_format::llama3_json, "  <|pyth not a tag, and {\"name\": 1}"},
        {tool_format::llama3_json, "Hello there.\n\n"},
        {tool_format::mistral,
         "Sure [TOOL_CALLS][{\"name\": \"now\", \"arguments\": {}}, "
         "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"R\\\"ome\"}}]"},
        {tool_format::mistral, "[TOOL_CALLS][{\"name\": \"now\", \"arguments\": {}}, "},
    };
    for (const auto& [f, text] : texts) {
        for (bool constrained : {false, true}) {
            const tool_output whole = parse_tool_output(f, constrained, text);
            for (size_t step : {size_t(1), size_t(2), size_t(3), size_t(7), text.size()}) {
                SCOPED_TRACE(text + " constrained " + std::to_string(constrained) + " step " +
                             std::to_string(step));
                const tool_output s = streamed(f, constrained, text, step);
                expect_calls(s, whole.content, whole.calls);
            }
        }
    }
}

TEST(tool_calls, constrained_streams_arguments_as_they_come) {
    tool_stream s(tool_format::hermes, true);
    EXPECT_TRUE(s.feed("<tool_call>\n{\"name\": \"get_").empty());
    auto d = s.feed("weather\", \"arguments\": {\"ci");
    ASSERT_EQ(d.size(), 2u);
    EXPECT_EQ(d[0].name, "get_weather");
    EXPECT_EQ(d[1].arguments, "{\"ci");
    d = s.feed("ty\": \"Paris\"}}\n</tool_call>");
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].arguments, "ty\": \"Paris\"}");
    EXPECT_TRUE(s.finish().empty());
}

TEST(tool_calls, ids) {
    EXPECT_EQ(tool_call_id(tool_format::hermes, "chatcmpl-1", 0),
              tool_call_id(tool_format::hermes, "chatcmpl-1", 0));
    EXPECT_NE(tool_call_id(tool_format::hermes, "chatcmpl-1", 0),
              tool_call_id(tool_format::hermes, "chatcmpl-1", 1));
    EXPECT_NE(tool_call_id(tool_format::hermes, "chatcmpl-1", 0),
              tool_call_id(tool_format::hermes, "chatcmpl-2", 0));
    const std::string h = tool_call_id(tool_format::hermes, "x", 3);
    EXPECT_EQ(h.rfind("call_", 0), 0u);
    EXPECT_EQ(h.size(), 29u);
    // Every character position varies between answers (no block of low entropy).
    std::set<std::string> tails;
    for (int a = 0; a < 50; a++) {
        tails.insert(
            tool_call_id(tool_format::hermes, "chatcmpl-" + std::to_string(a), 0).substr(25));
    }
    EXPECT_GT(tails.size(), 45u);
    const std::string m = tool_call_id(tool_format::mistral, "x", 3);
    ASSERT_EQ(m.size(), 9u);
    for (char c : m) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << m;
}

}  // namespace
}  // namespace ordo::grammar
