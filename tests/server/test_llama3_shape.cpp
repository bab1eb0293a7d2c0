// test_llama3_shape.cpp: the real ordo-server, over TCP, on a Llama-3-shaped model it can run on
// this branch: `ordo-model mk` F16, n_embd 64, 2 layers, tied embeddings (no output.weight), a
// trained context of 131072, rope.freq_base 500000 with Llama 3.1 rope_freqs factors, and the
// real 128256-token Llama 3 vocabulary (gpt2 BPE, pre llama-bpe) copied from
// ../shared/models/vocab/ggml-vocab-llama-bpe.gguf. The server runs with a 512-token KV pool
// (32 blocks of 16, f32).
//
// Checks: (1) the server starts and serves `generate` with token ids: greedy ids equal the CPU
// reference's on the same file (as far as its top-2 logits are not a near tie), token events
// and `done` carry the ids and their text, which equals `detokenize` of them. (1b) Text ops
// with the BPE tokenizer: `tokenize` of each prompt of llama3-tiny.golden.json (add_bos and
// special as the golden's add_special and parse_special) equals llama.cpp's prompt_token_ids;
// `<|eot_id|>` is one token only with special; `detokenize` hides it unless special; a text
// `generate` with special counts <|eot_id|> as one prompt token. (2) The context is capped by the
// KV pool: the `model` op says context 512 with context_bound "kv pool" (n_ctx_train 131072), the
// server logged that once, a request within it is served and one beyond it gets
// error{context_exceeded}. (3) The `model` op reports the tensor types (f16 15: token_embd + 7 per
// layer, f32 6: norms and rope_freqs), the tokenizer, the KV pool's device bytes exactly (2 layers
// x K and V x 32 blocks x 16 tokens x 1 KV head x 16 dims x 4 bytes) and the weights' device bytes
// (the file's tensor bytes plus the norms' padding and the RoPE table: between the two bounds
// stated in the test), and the end-of-generation ids (<|end_of_text|> 128001, <|eot_id|> 128009).
// Skips visibly when ../shared/models is absent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "model/gguf.hpp"
#include "model/reference.hpp"
#include "tests/support/scratch_dir.hpp"
#include "tests/support/server_process.hpp"
#include "tests/support/shared_models.hpp"

namespace {

using namespace ordo::test;
namespace fs = std::filesystem;

const std::string k_bpe_vocab =
    std::string(ORDO_SHARED_MODELS_DIR) + "/vocab/ggml-vocab-llama-bpe.gguf";

std::string temp_path(const std::string& name) {
    const fs::path& dir = ordo::test::scratch_dir("ordo_llama3_shape");
    return (dir / name).string();
}

// The model and one server on it, made by the first test that needs them.
struct llama3_server {
    std::string model;
    server_process server;
    std::string start_error;  // why it did not start ("" when it did)
};

llama3_server& shared_server() {
    static std::unique_ptr<llama3_server> s = [] {
        auto p = std::make_unique<llama3_server>();
        p->model = temp_path("llama3_shape.gguf");
        const std::string mk = std::string(ORDO_MODEL_BIN) + " mk --out " + p->model +
                               " --n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 1 --n-ff 128 "
                               "--vocab-from " +
                               k_bpe_vocab +
                               " --type f16 --seed 3 --ctx 131072 --tied --rope-base 500000 "
                               "--rope-llama3 32 > /dev/null";
        if (std::system(mk.c_str()) != 0) {
            p->start_error = "ordo-model mk failed: " + mk;
            return p;
        }
        const std::string cfg = temp_path("llama3_shape.toml");
        std::ofstream(cfg) << "[model]\npath = \"" << p->model << "\"\n"
                           << "[gpu]\nkv_blocks = 32\nkv_block_tokens = 16\nkv_dtype = \"f32\"\n"
                           << "[scheduler]\nmax_tokens_default = 8\n";
        if (!p->server.start(ORDO_SERVER_BIN, {"--config", cfg})) {
            p->start_error = "the server did not start:\n" + p->server.output();
            return p;
        }
        p->start_error = wait_healthy(p->server.port());
        return p;
    }();
    return *s;
}

#define REQUIRE_SERVER()                               \
    ORDO_REQUIRE_SHARED(k_bpe_vocab);                  \
    llama3_server& s = shared_server();                \
    ASSERT_EQ(s.start_error, "") << s.server.output(); \
    tcp_client c;                                      \
    ASSERT_TRUE(c.connect(s.server.port()))

template <typename... kv>
event request(tcp_client& c, uint64_t id, const char* op, const kv&... params) {
    EXPECT_TRUE(c.send(frame("id", id, "op", op, params...)));
    auto evs = until_terminal(c, id);
    return evs.empty() ? event{} : evs.back();
}

// The CPU reference's greedy ids after `prompt`, up to `n` or to the first step whose top two
// logits are closer than `tie` (the GPU's own rounding could order them either way).
std::vector<int32_t> reference_greedy(const std::string& path, const std::vector<int32_t>& prompt,
                                      size_t n, float tie) {
    auto f = ordo::model::gguf_file::open(path);
    EXPECT_TRUE(f.ok()) << (f.ok() ? "" : f.err().message);
    auto m = ordo::model::reference_model::create(*f, 64);
    EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.err().message);
    std::vector<int32_t> out;
    if (!f.ok() || !m.ok()) return out;
    std::span<const float> logits;
    std::vector<int32_t> feed = prompt;
    for (uint32_t pos = 0; out.size() < n; ++pos) {
        auto r = m->forward(uint32_t(feed[pos]), pos);
        EXPECT_TRUE(r.ok());
        if (!r.ok()) return out;
        if (pos + 1 < feed.size()) continue;
        std::vector<float> top(r->begin(), r->end());
        auto best = std::max_element(top.begin(), top.end());
        const float first = *best;
        *best = -INFINITY;
        if (first - *std::max_element(top.begin(), top.end()) < tie) break;
        out.push_back(int32_t(best - top.begin()));
        feed.push_back(out.back());
    }
    return out;
}

}  // namespace

// (1)
TEST(llama3_shape_server, serves_token_ids_with_their_text) {
    REQUIRE_SERVER();
    // 128000 is <|begin_of_text|>; the rest are ordinary ids spread over the vocabulary.
    const std::vector<int32_t> prompt = {128000, 9906, 1917, 0, 128255, 40};
    ASSERT_TRUE(c.send(frame("id", 1, "op", "generate", "tokens", prompt, "max_tokens", 6,
                             "temperature", 0, "stream", true)));
    auto gen = until_terminal(c, 1);
    ASSERT_FALSE(gen.empty());
    ASSERT_EQ(gen.back().outcome(), "done:length");
    std::vector<int32_t> streamed;
    for (size_t i = 0; i + 1 < gen.size(); ++i) {
        ASSERT_EQ(gen[i].str("event"), "token");
        streamed.push_back(int32_t(gen[i].u("token")));
    }
    EXPECT_EQ(gen.back().ints("tokens"), streamed);
    EXPECT_NE(gen.back().str("text"), "");
    ASSERT_EQ(streamed.size(), 6u);
    auto want = reference_greedy(s.model, prompt, 6, 0.01f);
    ASSERT_FALSE(want.empty()) << "the reference's first choice is a near tie: pick another prompt";
    std::printf("greedy ids compared with the reference: %zu of 6\n", want.size());
    EXPECT_EQ(std::vector<int32_t>(streamed.begin(), streamed.begin() + long(want.size())), want);

    auto detok = request(c, 2, "detokenize", "tokens", streamed);
    ASSERT_EQ(detok.str("event"), "done");
    std::string streamed_text;
    for (size_t i = 0; i + 1 < gen.size(); ++i) streamed_text += gen[i].str("text");
    EXPECT_EQ(streamed_text, gen.back().str("text"));
    // A random model's ids may end mid-character: the stream holds those bytes back, detokenize
    // replaces them at the end; up to the last whole character they agree.
    EXPECT_EQ(detok.str("text").substr(0, streamed_text.size()), streamed_text);
}

// (1b)
TEST(llama3_shape_server, tokenizes_like_llama_cpp_and_parses_special_tokens) {
    REQUIRE_SERVER();
    const std::string golden =
        std::string(ORDO_SHARED_MODELS_DIR) + "/quant/llama3-tiny.golden.json";
    ORDO_REQUIRE_SHARED(golden);
    std::ifstream in(golden);
    auto j = nlohmann::json::parse(in);
    uint64_t id = 1;
    size_t checked = 0;
    for (const auto& cs : j["models"][0]["cases"]) {
        const std::string prompt = cs["prompt"];
        auto want = cs["prompt_token_ids"].get<std::vector<int32_t>>();
        event r =
            request(c, id++, "tokenize", "text", prompt, "add_bos", cs["add_special"].get<bool>(),
                    "special", cs["parse_special"].get<bool>());
        ASSERT_EQ(r.str("event"), "done") << r.str("message");
        EXPECT_EQ(r.ints("tokens"), want) << prompt;
        ++checked;
    }
    EXPECT_GE(checked, 3u);

    const std::string text = "Hi<|eot_id|>";
    event special = request(c, id++, "tokenize", "text", text, "add_bos", false, "special", true);
    EXPECT_EQ(special.ints("tokens"), (std::vector<int32_t>{13347, 128009}));
    event plain = request(c, id++, "tokenize", "text", text, "add_bos", false);
    const std::vector<int32_t> plain_ids = plain.ints("tokens");
    EXPECT_GT(plain_ids.size(), 2u);
    EXPECT_EQ(std::count(plain_ids.begin(), plain_ids.end(), 128009), 0);
    EXPECT_EQ(request(c, id++, "detokenize", "tokens", special.ints("tokens")).str("text"), "Hi");
    EXPECT_EQ(request(c, id++, "detokenize", "tokens", special.ints("tokens"), "special", true)
                  .str("text"),
              text);
    EXPECT_EQ(request(c, id++, "detokenize", "tokens", plain_ids).str("text"), text);

    // generate: BOS + "Hi" + <|eot_id|> with special, more tokens without.
    event with = request(c, id++, "generate", "prompt", text, "special", true, "max_tokens", 1);
    ASSERT_EQ(with.str("event"), "done") << with.str("message");
    ASSERT_NE(field(with.o(), "usage"), nullptr);
    EXPECT_EQ(uint_field(*field(with.o(), "usage"), "prompt_tokens"), 3u);
    event without = request(c, id++, "generate", "prompt", text, "max_tokens", 1);
    ASSERT_EQ(without.str("event"), "done") << without.str("message");
    ASSERT_NE(field(without.o(), "usage"), nullptr);
    EXPECT_EQ(uint_field(*field(without.o(), "usage"), "prompt_tokens"), 1 + plain_ids.size());
}

// (2)
TEST(llama3_shape_server, context_is_capped_by_the_kv_pool) {
    REQUIRE_SERVER();
    event m = request(c, 1, "model");
    ASSERT_EQ(m.str("event"), "done");
    EXPECT_EQ(m.u("n_ctx_train"), 131072u);
    EXPECT_EQ(m.u("context"), 512u);
    EXPECT_EQ(m.str("context_bound"), "kv pool");
    const std::string log = s.server.output();
    EXPECT_NE(log.find("runner: context 512 positions (bound: kv pool; trained 131072, config "
                       "unset, kv pool 512 tokens"),
              std::string::npos)
        << log;
    std::vector<int32_t> prompt(500, 40);
    prompt[0] = 128000;
    EXPECT_EQ(request(c, 2, "generate", "tokens", prompt, "max_tokens", 12).outcome(),
              "done:length");
    event over = request(c, 3, "generate", "tokens", prompt, "max_tokens", 13);
    EXPECT_EQ(over.str("code"), "context_exceeded") << over.outcome();
    EXPECT_NE(over.str("message").find("exceeds the context of 512 tokens"), std::string::npos)
        << over.str("message");
}

// (3)
TEST(llama3_shape_server, model_op_reports_device_bytes_tensor_types_and_tokenizer) {
    REQUIRE_SERVER();
    event m = request(c, 1, "model");
    ASSERT_EQ(m.str("event"), "done");
    const auto* types = field(m.o(), "tensor_types");
    ASSERT_NE(types, nullptr);
    auto histogram = types->as<std::map<std::string, uint64_t>>();
    EXPECT_EQ(histogram, (std::map<std::string, uint64_t>{{"f16", 15}, {"f32", 6}}));
    EXPECT_EQ(m.str("tokenizer"), "gpt2 (pre llama-bpe)");
    const auto* supported = field(m.o(), "tokenizer_supported");
    ASSERT_NE(supported, nullptr);
    EXPECT_TRUE(supported->as<bool>());
    EXPECT_EQ(m.ints("eog_tokens"), (std::vector<int32_t>{128001, 128009}));
    EXPECT_EQ(m.u("n_vocab"), 128256u);
    EXPECT_EQ(m.u("kv_device_bytes"), 2ull * 2 * 32 * 16 * 1 * 16 * 4);
    auto f = ordo::model::gguf_file::open(s.model);
    ASSERT_TRUE(f.ok());
    uint64_t tensor_bytes = 0;
    for (const auto& t : f->tensors()) tensor_bytes += t.n_bytes;
    // Norm vectors are padded to 64 floats each (5 of them), the RoPE table is 8 pairs of two
    // floats; rope_freqs.weight itself (8 floats of the file) is not uploaded.
    EXPECT_GE(m.u("weights_device_bytes"), tensor_bytes - 8 * 4);
    EXPECT_LE(m.u("weights_device_bytes"), tensor_bytes + 5 * 64 * 4 + 8 * 8);
}
