// test_openai_client.cpp: OpenAI's official Node client (npm `openai`, the version tools/dev.sh
// pins, installed into build/node) drives the real ordo-server's HTTP front door.
//
// The checks are in openai_client.mjs: models.list; chat and completions, non-streamed and
// streamed (the stream adds up to the non-streamed answer; the usage chunk); a stop string;
// the same seed giving the same text; logprobs with top_logprobs; structured output
// (response_format json_schema and json_object: a whole answer parses and follows the schema);
// and the client's own error classes and fields (status, param) for a wrong model (404),
// n = 2, an unsupported schema keyword and tool_choice required on a template without a call
// format (400); tool calls (openai_tools.mjs: required, named, parallel off, streamed deltas
// against the whole answer, the next turn with the call and its result); LangChain's and the
// Vercel AI SDK's tool and structured-output paths (agent_clients.mjs); and, with a server that
// requires an API key, the client's apiKey (openai_auth.mjs: the right key served, a wrong one
// AuthenticationError 401). embeddings.create (openai_embeddings.mjs): strings (the client's
// default base64 and float), token ids and token arrays give the CPU reference's embedding
// (model::embed with the server's pooling, computed here) within 1e-4 per component with f32 KV,
// usage counts every input's tokens, dimensions = n_embd is a no-op and bad inputs are 400 naming
// the field; on the generated model and on stories260K (skipped visibly without ../shared). Without
// node or the package the tests skip with a visible message; with ORDO_HTTP_CLIENT_REQUIRED=1 (CI)
// they fail instead.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string_view>

#include "model/gguf.hpp"
#include "model/reference.hpp"
#include "model/tokenizer.hpp"
#include "tests/support/scratch_dir.hpp"
#include "tests/support/server_process.hpp"
#include "tests/support/shared_models.hpp"

namespace {

using namespace ordo::test;
namespace fs = std::filesystem;

bool client_required() {
    const char* v = std::getenv("ORDO_HTTP_CLIENT_REQUIRED");
    return v != nullptr && std::string_view(v) == "1";
}

std::string temp_path(const std::string& name) {
    const fs::path& dir = ordo::test::scratch_dir("ordo_openai");
    return (dir / name).string();
}

// Why the Node client cannot run here ("" when it can).
std::string node_client_missing() {
    const std::string modules = ORDO_NODE_MODULES;
    if (run_command("command -v node > /dev/null 2>&1").exit_code != 0) {
        return "node is not installed";
    }
    if (!fs::exists(modules + "/openai/package.json")) {
        return "the openai package is not in " + modules + " (bash tools/dev.sh setup installs it)";
    }
    return "";
}

}  // namespace

#define SKIP_WITHOUT_NODE_CLIENT()                                                            \
    if (std::string missing = node_client_missing(); !missing.empty()) {                      \
        if (client_required()) GTEST_FAIL() << "ORDO_HTTP_CLIENT_REQUIRED=1 but " << missing; \
        std::fprintf(stderr, "\n*** SKIPPING: %s ***\n\n", missing.c_str());                  \
        GTEST_SKIP() << missing;                                                              \
    }

// A tiny generated model with a ChatML template, named `name` (the model id clients send).
std::pair<std::string, std::string> tiny_model_and_template(const std::string& name) {
    const std::string model = temp_path(name + ".gguf");
    std::string mk = std::string(ORDO_MODEL_BIN) + " mk --out " + model +
                     " --n-embd 32 --n-layer 1 --n-head 2 --n-head-kv 2 --n-ff 64"
                     " --n-vocab 260 --type f32 --seed 1 --ctx 512 > /dev/null";
    EXPECT_EQ(std::system(mk.c_str()), 0) << mk;
    const std::string tmpl = temp_path(name + ".jinja");
    std::ofstream(tmpl) << "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                           "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}"
                           "<|im_start|>assistant\n{% endif %}";
    return {model, tmpl};
}

// Runs `script` (BASE_URL MODEL ARGS...) with the Node client; it must print "all checks passed".
void run_node_script(const std::string& script, uint16_t http_port, const std::string& args) {
    const std::string cmd =
        "ORDO_NODE_MODULES='" + std::string(ORDO_NODE_MODULES) + "' timeout 300 node '" + script +
        "' http://127.0.0.1:" + std::to_string(http_port) + "/v1 " + args + " 2>&1";
    command_result r = run_command(cmd);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("all checks passed"), std::string::npos) << r.output;
    std::printf("%s", r.output.c_str());
}

TEST(openai_node_client, drives_the_http_api) {
    SKIP_WITHOUT_NODE_CLIENT();
    const auto [model, tmpl] = tiny_model_and_template("tiny");
    server_process s;
    ASSERT_TRUE(s.start(ORDO_SERVER_BIN, {"--model", model, "--chat-template", tmpl}))
        << s.output();
    ASSERT_NE(s.http_port(), 0) << s.output();
    ASSERT_EQ(wait_healthy(s.port()), "") << s.output();
    run_node_script(ORDO_OPENAI_SCRIPT, s.http_port(), "tiny");
}

// Tool calls (issue 31): openai_tools.mjs, on a generated model whose template teaches Hermes'
// <tool_call> format and renders tools and earlier calls (a context long enough for the tools'
// text in a byte vocabulary).
// The server of the tool-call tests: a generated model whose template teaches Hermes'
// <tool_call> format and renders tools and earlier calls.
struct tool_model_server {
    server_process s;
    std::string problem;
};

std::unique_ptr<tool_model_server> serve_tool_model() {
    auto out = std::make_unique<tool_model_server>();
    const std::string model = temp_path("tools.gguf");
    std::string mk = std::string(ORDO_MODEL_BIN) + " mk --out " + model +
                     " --n-embd 32 --n-layer 1 --n-head 2 --n-head-kv 2 --n-ff 64"
                     " --n-vocab 260 --type f32 --seed 1 --ctx 4096 > /dev/null";
    EXPECT_EQ(std::system(mk.c_str()), 0) << mk;
    const std::string tmpl = temp_path("tools.jinja");
    std::ofstream(tmpl)
        << "{% if tools %}<|im_start|>system\nCall a function: <tool_call>\n{\"name\": ..., "
           "\"arguments\": ...}\n</tool_call>\n<tools>{% for t in tools %}{{ t | tojson }}"
           "{% endfor %}</tools><|im_end|>\n{% endif %}"
           "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content %}{{ m.content }}"
           "{% endif %}{% for c in m.tool_calls or [] %}<tool_call>\n{{ c.function | tojson }}"
           "\n</tool_call>{% endfor %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}"
           "<|im_start|>assistant\n{% endif %}";
    if (!out->s.start(ORDO_SERVER_BIN, {"--model", model, "--chat-template", tmpl})) {
        out->problem = "the server did not start";
    } else if (out->s.http_port() == 0) {
        out->problem = "no HTTP port";
    } else {
        out->problem = wait_healthy(out->s.port());
    }
    return out;
}

TEST(openai_node_client, tool_calls) {
    SKIP_WITHOUT_NODE_CLIENT();
    auto srv = serve_tool_model();
    ASSERT_EQ(srv->problem, "") << srv->s.output();
    run_node_script(ORDO_SOURCE_DIR "/tests/http/openai_tools.mjs", srv->s.http_port(), "tools");
}

// LangChain and the Vercel AI SDK (agent_clients.mjs): their tool and structured-output paths.
TEST(openai_node_client, agent_libraries) {
    SKIP_WITHOUT_NODE_CLIENT();
    const std::string modules = ORDO_NODE_MODULES;
    for (const char* pkg :
         {"@langchain/openai", "@langchain/core", "ai", "@ai-sdk/openai", "zod"}) {
        if (fs::exists(modules + "/" + pkg + "/package.json")) continue;
        const std::string missing =
            std::string(pkg) + " is not in " + modules + " (bash tools/dev.sh test installs it)";
        if (client_required()) GTEST_FAIL() << "ORDO_HTTP_CLIENT_REQUIRED=1 but " << missing;
        std::fprintf(stderr, "\n*** SKIPPING: %s ***\n\n", missing.c_str());
        GTEST_SKIP() << missing;
    }
    auto srv = serve_tool_model();
    ASSERT_EQ(srv->problem, "") << srv->s.output();
    run_node_script(ORDO_SOURCE_DIR "/tests/http/agent_clients.mjs", srv->s.http_port(), "tools");
}

// The client's `apiKey` against a server that requires one (issue 26): openai_auth.mjs.
TEST(openai_node_client, api_key) {
    SKIP_WITHOUT_NODE_CLIENT();
    const auto [model, tmpl] = tiny_model_and_template("tiny-auth");
    const std::string key = "sk-node-0123456789";
    server_process s;
    ASSERT_TRUE(
        s.start(ORDO_SERVER_BIN, {"--model", model, "--chat-template", tmpl, "--api-key", key}))
        << s.output();
    ASSERT_NE(s.http_port(), 0) << s.output();
    ASSERT_EQ(wait_healthy(s.port(), key), "") << s.output();
    run_node_script(ORDO_SOURCE_DIR "/tests/http/openai_auth.mjs", s.http_port(),
                    "tiny-auth " + key);
}

// The expectations openai_embeddings.mjs checks, computed by the CPU reference on `model_path`
// with mean pooling (the default: neither model names a pooling_type), written as JSON.
std::string embedding_expectations(const std::string& model_path, const std::string& name) {
    auto f = ordo::model::gguf_file::open(model_path);
    EXPECT_TRUE(f.ok());
    auto tok = ordo::model::tokenizer::from_gguf(*f);
    EXPECT_TRUE(tok.ok());
    auto ref = ordo::model::reference_model::create(*f, 256);
    EXPECT_TRUE(ref.ok());
    if (!f || !tok || !ref) return "";
    auto embed = [&](const std::vector<int32_t>& ids) {
        std::vector<uint32_t> u(ids.begin(), ids.end());
        auto e = ordo::model::embed(*ref, u, ordo::model::pooling::mean);
        EXPECT_TRUE(e.ok());
        return e.ok() ? *e : std::vector<float>{};
    };
    const std::vector<std::string> texts = {
        "Once upon a time", "the cat sat on the mat, and then it slept for a while"};
    nlohmann::json j;
    j["texts"] = texts;
    j["text_vectors"] = nlohmann::json::array();
    uint64_t text_tokens = 0;
    for (const std::string& t : texts) {
        auto ids = tok->encode(t, true);
        text_tokens += ids.size();
        j["text_vectors"].push_back(embed(ids));
    }
    const std::vector<int32_t> ids = {1, 5, 9, 17, 33, 65, 129, 200, 7};
    j["ids"] = ids;
    j["ids_vector"] = embed(ids);
    j["text_tokens"] = text_tokens;
    j["n_embd"] = ref->hparams().n_embd;
    j["tolerance"] = 1e-4;
    const std::string path = temp_path(name + ".expect.json");
    std::ofstream(path) << j.dump();
    return path;
}

void check_embeddings(const std::string& model_path, const std::string& name) {
    const std::string expect = embedding_expectations(model_path, name);
    ASSERT_FALSE(expect.empty());
    // f32 KV: the 1e-4 tolerance is the reference's float math against the kernels', without
    // f16 rounding of K and V on top.
    const std::string cfg = temp_path(name + ".toml");
    std::ofstream(cfg) << "[gpu]\nkv_dtype = \"f32\"\n";
    server_process s;
    ASSERT_TRUE(s.start(ORDO_SERVER_BIN, {"--config", cfg, "--model", model_path})) << s.output();
    ASSERT_NE(s.http_port(), 0) << s.output();
    ASSERT_EQ(wait_healthy(s.port()), "") << s.output();
    run_node_script(ORDO_SOURCE_DIR "/tests/http/openai_embeddings.mjs", s.http_port(),
                    name + " '" + expect + "'");
    EXPECT_EQ(s.stop(), 0);
    EXPECT_NE(s.output().find("embeddings pool by mean (model.embedding_pooling)"),
              std::string::npos)
        << s.output();
}

// embeddings.create on the generated model (issue 27): openai_embeddings.mjs.
TEST(openai_node_client, embeddings) {
    SKIP_WITHOUT_NODE_CLIENT();
    const auto [model, tmpl] = tiny_model_and_template("tiny-embed");
    check_embeddings(model, "tiny-embed");
}

// The same on the trained stories260K (../shared/models).
TEST(openai_node_client, embeddings_stories260K) {
    SKIP_WITHOUT_NODE_CLIENT();
    const std::string stories = std::string(ORDO_SHARED_MODELS_DIR) + "/stories260K.gguf";
    ORDO_REQUIRE_SHARED(stories);
    check_embeddings(stories, "stories260K");
}
