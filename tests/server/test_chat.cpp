// test_chat.cpp: the `chat` and `apply_template` ops on the real ordo-server over TCP.
//
// With ../shared/models (skipped visibly without it), on llama3-tiny-Q4_K_M.gguf (the Llama 3
// vocabulary and the Llama 3.2 chat template in its metadata, made by llama.cpp):
// (1) apply_template of the golden conversation (one user message, date_string pinned) gives
//     exactly the text llama.cpp's oracle tokenized and its 42 prompt ids (one BOS: the template
//     writes <|begin_of_text|>); the model op says chat_template "gguf".
// (2) chat on it: usage.prompt_tokens 42, the streamed text adds up to done.text, and the greedy
//     ids equal llama.cpp's for that prompt.
// (3) A conversation ending on the user's <|eot_id|> (add_generation_prompt false): this model
//     then samples <|eot_id|> (its tied embeddings echo the last token), and the reply stops
//     there with reason stop, the id in tokens and not in the text (not even with special).
// (4) Two turns with a session: the second turn's rendering begins with the first turn's prompt
//     and reply ids, and its cached_tokens covers every whole KV block of the first turn.
// (5) The template's raise_exception (two tool calls at once) is template_error naming the
//     template line; the server keeps serving.
// Without ../shared, on a model `ordo-model mk` makes (no chat template in it):
// (6) chat and apply_template answer no_chat_template with a hint, generate still serves, the
//     model op says chat_template "none".
// (7) `--chat-template FILE` (ChatML) serves chat with that file (model op "file:PATH").
// (8) A template file that does not parse, or cannot be read, stops the server at start (exit 2)
//     with the config key and the template line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "tests/support/scratch_dir.hpp"
#include "tests/support/server_process.hpp"
#include "tests/support/shared_models.hpp"

namespace {

using namespace ordo::test;
namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string k_llama3 = std::string(ORDO_SHARED_MODELS_DIR) + "/quant/llama3-tiny-Q4_K_M.gguf";
const std::string k_golden = std::string(ORDO_SHARED_MODELS_DIR) + "/quant/llama3-tiny.golden.json";
constexpr uint32_t k_block_tokens = 16;  // gpu.kv_block_tokens of the llama3 server
constexpr int32_t k_eot = 128009;

std::string temp_path(const std::string& name) {
    const fs::path& dir = ordo::test::scratch_dir("ordo_chat");
    return (dir / name).string();
}

// Sends {"id": id, "op": op, ...params} (nested values need JSON) and returns every event.
std::vector<event> call_all(tcp_client& c, uint64_t id, const std::string& op, json params) {
    json j = {{"id", id}, {"op", op}};
    for (auto& [k, v] : params.items()) j[k] = v;
    std::vector<uint8_t> bytes = json::to_msgpack(j);
    EXPECT_TRUE(c.send_raw(std::string(bytes.begin(), bytes.end())));
    return until_terminal(c, id);
}

event call(tcp_client& c, uint64_t id, const std::string& op, json params) {
    auto evs = call_all(c, id, op, std::move(params));
    return evs.empty() ? event{} : evs.back();
}

uint64_t usage(const event& e, const std::string& key) {
    const auto* u = field(e.o(), "usage");
    return u ? uint_field(*u, key) : ~0ull;
}

struct started_server {
    server_process server;
    std::string start_error;  // "" when it serves
};

std::unique_ptr<started_server> start(const std::vector<std::string>& args) {
    auto s = std::make_unique<started_server>();
    if (!s->server.start(ORDO_SERVER_BIN, args)) {
        s->start_error = "the server did not start:\n" + s->server.output();
    } else {
        s->start_error = wait_healthy(s->server.port());
    }
    return s;
}

// The llama3-tiny server, with persisted KV (sessions), started by the first test needing it.
started_server& llama3_server() {
    static std::unique_ptr<started_server> s = [] {
        const std::string cfg = temp_path("llama3.toml");
        fs::create_directories(temp_path("kv"));
        std::ofstream(cfg) << "[model]\npath = \"" << k_llama3 << "\"\n"
                           << "[gpu]\nkv_blocks = 128\nkv_block_tokens = " << k_block_tokens
                           << "\n[scheduler]\nmax_tokens_default = 8\n"
                           << "[kv]\nenabled = true\ndir = \"" << temp_path("kv") << "\"\n";
        return start({"--config", cfg});
    }();
    return *s;
}

// The golden conversation: case 3 of llama3-tiny.golden.json.
struct golden_chat {
    json messages;
    std::string prompt;
    std::vector<int32_t> prompt_ids, generated;
};

golden_chat read_golden_chat() {
    std::ifstream in(k_golden);
    json j = json::parse(in);
    for (const auto& cs : j["models"].back()["cases"]) {
        if (!cs.contains("chat_messages")) continue;
        return {cs["chat_messages"], cs["prompt"],
                cs["prompt_token_ids"].get<std::vector<int32_t>>(),
                cs["generated_token_ids"].get<std::vector<int32_t>>()};
    }
    ADD_FAILURE() << "no case with chat_messages in " << k_golden;
    return {};
}

const json k_date = {{"date_string", "26 Jul 2024"}};  // the golden's; else today's date

#define REQUIRE_LLAMA3()                               \
    ORDO_REQUIRE_SHARED(k_llama3);                     \
    ORDO_REQUIRE_SHARED(k_golden);                     \
    started_server& s = llama3_server();               \
    ASSERT_EQ(s.start_error, "") << s.server.output(); \
    tcp_client c;                                      \
    ASSERT_TRUE(c.connect(s.server.port()))

}  // namespace

// (1)
TEST(chat_llama3, apply_template_renders_and_tokenizes_like_llama_cpp) {
    REQUIRE_LLAMA3();
    const golden_chat g = read_golden_chat();
    ASSERT_EQ(g.prompt_ids.size(), 42u);
    event r =
        call(c, 1, "apply_template", {{"messages", g.messages}, {"chat_template_kwargs", k_date}});
    ASSERT_EQ(r.str("event"), "done") << r.outcome();
    EXPECT_EQ(r.str("text"), g.prompt);
    EXPECT_EQ(r.ints("tokens"), g.prompt_ids);
    EXPECT_EQ(call(c, 2, "model", json::object()).str("chat_template"), "gguf");
}

// (2)
TEST(chat_llama3, chat_generates_from_the_rendered_prompt) {
    REQUIRE_LLAMA3();
    const golden_chat g = read_golden_chat();
    auto evs = call_all(c, 1, "chat",
                        {{"messages", g.messages},
                         {"chat_template_kwargs", k_date},
                         {"max_tokens", 8},
                         {"temperature", 0},
                         {"stream", true}});
    ASSERT_FALSE(evs.empty());
    const event& done = evs.back();
    ASSERT_EQ(done.outcome(), "done:length");
    EXPECT_EQ(usage(done, "prompt_tokens"), 42u);
    std::string streamed;
    for (size_t i = 0; i + 1 < evs.size(); ++i) streamed += evs[i].str("text");
    EXPECT_EQ(streamed, done.str("text"));
    ASSERT_GE(g.generated.size(), 8u);
    EXPECT_EQ(done.ints("tokens"),
              std::vector<int32_t>(g.generated.begin(), g.generated.begin() + 8));
}

// (3)
TEST(chat_llama3, the_reply_stops_at_eot_id) {
    REQUIRE_LLAMA3();
    const json msgs = json::array({{{"role", "user"}, {"content", "Hi"}}});
    event r = call(c, 1, "chat",
                   {{"messages", msgs},
                    {"add_generation_prompt", false},
                    {"chat_template_kwargs", k_date},
                    {"max_tokens", 16},
                    {"temperature", 0}});
    ASSERT_EQ(r.outcome(), "done:stop");
    EXPECT_EQ(r.ints("tokens"), std::vector<int32_t>{k_eot});
    EXPECT_EQ(r.str("text"), "");
    EXPECT_EQ(field(r.o(), "stop"), nullptr);  // no stop string: the end-of-generation token
    event sp = call(c, 2, "chat",
                    {{"messages", msgs},
                     {"add_generation_prompt", false},
                     {"chat_template_kwargs", k_date},
                     {"max_tokens", 16},
                     {"temperature", 0},
                     {"special", true}});
    ASSERT_EQ(sp.outcome(), "done:stop");
    EXPECT_EQ(sp.ints("tokens"), std::vector<int32_t>{k_eot});
    EXPECT_EQ(sp.str("text"), "");  // the token that ends a reply is never part of its text
}

// (4)
TEST(chat_llama3, a_session_reuses_the_earlier_turns) {
    REQUIRE_LLAMA3();
    json msgs = json::array({{{"role", "system"}, {"content", "You are terse."}},
                             {{"role", "user"}, {"content", "Hi there"}}});
    const json turn = {{"chat_template_kwargs", k_date},
                       {"max_tokens", 4},
                       {"temperature", 0},
                       {"session", "chat-test"}};
    json p1 = turn;
    p1["messages"] = msgs;
    event t1 = call(c, 1, "chat", p1);
    ASSERT_EQ(t1.outcome(), "done:length");
    const uint64_t n1 = usage(t1, "prompt_tokens") + usage(t1, "completion_tokens");
    const std::vector<int32_t> prompt1 =
        call(c, 2, "apply_template", {{"messages", msgs}, {"chat_template_kwargs", k_date}})
            .ints("tokens");
    ASSERT_EQ(prompt1.size(), usage(t1, "prompt_tokens"));

    msgs.push_back({{"role", "assistant"}, {"content", t1.str("text")}});
    msgs.push_back({{"role", "user"}, {"content", "And then?"}});
    const std::vector<int32_t> prompt2 =
        call(c, 3, "apply_template", {{"messages", msgs}, {"chat_template_kwargs", k_date}})
            .ints("tokens");
    // The second rendering continues the first turn: its prompt, then the reply's ids.
    std::vector<int32_t> first_turn = prompt1;
    for (int32_t t : t1.ints("tokens")) first_turn.push_back(t);
    ASSERT_GT(prompt2.size(), first_turn.size());
    EXPECT_EQ(std::vector<int32_t>(prompt2.begin(), prompt2.begin() + long(first_turn.size())),
              first_turn);

    json p2 = turn;
    p2["messages"] = msgs;
    event t2 = call(c, 4, "chat", p2);
    ASSERT_EQ(t2.outcome(), "done:length");
    EXPECT_EQ(usage(t2, "prompt_tokens"), prompt2.size());
    EXPECT_GE(usage(t2, "cached_tokens"), n1 / k_block_tokens * k_block_tokens);
    EXPECT_GT(usage(t2, "cached_tokens"), usage(t1, "cached_tokens"));
}

// (5)
TEST(chat_llama3, a_raising_template_is_a_template_error) {
    REQUIRE_LLAMA3();
    const json calls = json::array({{{"name", "a"}}, {{"name", "b"}}});
    event r = call(
        c, 1, "chat",
        {{"messages",
          json::array({{{"role", "user"}, {"content", "x"}},
                       {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", calls}}})}});
    ASSERT_EQ(r.str("event"), "error");
    EXPECT_EQ(r.str("code"), "template_error");
    EXPECT_NE(r.str("message").find("template line "), std::string::npos) << r.str("message");
    EXPECT_NE(r.str("message").find("single tool-calls"), std::string::npos) << r.str("message");
    event ok = call(c, 2, "apply_template",
                    {{"messages", json::array({{{"role", "user"}, {"content", "x"}}})}});
    EXPECT_EQ(ok.str("event"), "done") << ok.outcome();
}

namespace {

const std::string& mk_model() {
    static const std::string p = [] {
        std::string path = temp_path("tiny.gguf");
        std::string mk = std::string(ORDO_MODEL_BIN) + " mk --out " + path +
                         " --n-embd 32 --n-layer 1 --n-head 2 --n-head-kv 2 --n-ff 64"
                         " --n-vocab 260 --type f32 --seed 1 --ctx 256 > /dev/null";
        EXPECT_EQ(std::system(mk.c_str()), 0) << mk;
        return path;
    }();
    return p;
}

std::string write_file(const std::string& name, const std::string& text) {
    std::string p = temp_path(name);
    std::ofstream(p) << text;
    return p;
}

}  // namespace

// (6)
TEST(chat_server, a_model_without_a_template_answers_no_chat_template) {
    auto s = start({"--model", mk_model()});
    ASSERT_EQ(s->start_error, "");
    tcp_client c;
    ASSERT_TRUE(c.connect(s->server.port()));
    const json msgs = json::array({{{"role", "user"}, {"content", "Hi"}}});
    for (const char* op : {"chat", "apply_template"}) {
        event r = call(c, 1, op, {{"messages", msgs}});
        EXPECT_EQ(r.str("code"), "no_chat_template") << op << ": " << r.outcome();
        EXPECT_NE(r.str("message").find("--chat-template"), std::string::npos) << r.str("message");
    }
    EXPECT_EQ(call(c, 2, "generate", {{"prompt", "Hi"}, {"max_tokens", 2}}).outcome(),
              "done:length");
    EXPECT_EQ(call(c, 3, "model", json::object()).str("chat_template"), "none");
}

// (7)
TEST(chat_server, chat_template_flag_overrides_the_file) {
    const std::string tmpl = write_file(
        "chatml.jinja",
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}");
    auto s = start({"--model", mk_model(), "--chat-template", tmpl});
    ASSERT_EQ(s->start_error, "");
    tcp_client c;
    ASSERT_TRUE(c.connect(s->server.port()));
    const json msgs = json::array(
        {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi"}}});
    event r = call(c, 1, "apply_template", {{"messages", msgs}});
    ASSERT_EQ(r.str("event"), "done") << r.outcome();
    EXPECT_EQ(r.str("text"),
              "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
              "<|im_start|>assistant\n");
    // The same text as a plain prompt: the same ids (this vocab has no control tokens to parse).
    event t = call(c, 2, "tokenize", {{"text", r.str("text")}});
    EXPECT_EQ(r.ints("tokens"), t.ints("tokens"));
    event g = call(c, 3, "chat", {{"messages", msgs}, {"max_tokens", 3}, {"temperature", 0}});
    ASSERT_EQ(g.outcome(), "done:length");
    EXPECT_EQ(usage(g, "prompt_tokens"), r.ints("tokens").size());
    EXPECT_EQ(call(c, 4, "model", json::object()).str("chat_template"), "file:" + tmpl);
}

// (8)
TEST(chat_server, a_template_that_does_not_parse_stops_the_start) {
    const std::string bad = write_file("bad.jinja", "ok\n{% for m in messages %}\n{{ m.content }");
    for (const std::string& path : {bad, temp_path("missing.jinja")}) {
        server_process server;
        EXPECT_FALSE(
            server.start(ORDO_SERVER_BIN, {"--model", mk_model(), "--chat-template", path}));
        EXPECT_EQ(server.exit_status(), 2);
        const std::string out = server.output();
        EXPECT_NE(out.find("model.chat_template_path = " + path), std::string::npos) << out;
        EXPECT_NE(out.find(path == bad ? "line 3" : "cannot read"), std::string::npos) << out;
    }
}
