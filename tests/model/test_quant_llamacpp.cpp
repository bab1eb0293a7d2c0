// test_quant_llamacpp.cpp: checks ordo's CPU reference forward pass (model/reference.hpp) on
// files quantized by llama.cpp's own llama-quantize against llama.cpp's logits and greedy tokens
// for the same files (../shared/models/quant/, its README says how they were made).
//
// How: tests/support/quant_golden.hpp (shared with the GPU runner's test,
// tests/gpu/test_runner_llamacpp.cpp) runs every model entry of stories260K-quant.golden.json
// (the F32 original and its Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and Q4_K_M files: Q5_0 + Q8_0 + F16)
// and ktiny.golden.json (the random 256-wide model in Q2_K, Q3_K_S, Q4_K_S, Q5_K_S, Q6_K,
// Q4_K_M, Q5_K_M) with each of its three prompts on the reference: the logits after the prompt
// and at llama.cpp's top-20 ids of the next 7 positions within a per-file fraction of the
// logits' std, llama.cpp's 48 greedy tokens each ordo's argmax or a near tie, ordo's own greedy
// tokens equal up to the first such tie (the trained stories260K files: at most two ties
// closer than 0.5% of the std). The tolerances, what was measured and why the engines differ
// are in that header. Skips with a message when ../shared/models is absent.
//
// Not compared here: llama3-tiny-Q4_K_M.gguf. It needs the rope_freqs tensor (Llama 3.1 RoPE
// scaling) applied, the next part of issue 16; until then map_llama_weights refuses it with
// llama_unsupported_rope naming the tensor (checked below) instead of running it with plain
// RoPE, which would give wrong logits silently.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/gguf.hpp"
#include "model/reference.hpp"
#include "tests/support/quant_golden.hpp"

using namespace ordo::model;
using ordo::test::k_quant_dir;

namespace {

// The CPU reference as an engine: one token per forward, its cache overwritten from position 0
// by every new run. The model and file live as long as the returned function.
ordo::test::logits_fn reference_engine(const std::string& path) {
    auto f = gguf_file::open(path);
    EXPECT_TRUE(f.ok()) << f.err().message;
    if (!f) return {};
    auto file = std::make_shared<gguf_file>(std::move(*f));
    auto m = reference_model::create(*file, 128);
    EXPECT_TRUE(m.ok()) << m.err().code << ": " << m.err().message;
    if (!m) return {};
    auto model = std::make_shared<reference_model>(std::move(*m));
    return [file, model](const std::vector<uint32_t>& tokens, uint32_t pos0) {
        std::vector<float> out;
        for (size_t i = 0; i < tokens.size(); ++i) {
            auto r = model->forward(tokens[i], pos0 + static_cast<uint32_t>(i));
            EXPECT_TRUE(r.ok()) << r.err().message;
            if (!r) return std::vector<float>{};
            out.assign(r->begin(), r->end());
        }
        return out;
    };
}

}  // namespace

TEST(QuantLlamaCpp, Stories260KFilesMatchLlamaCpp) {
    ordo::test::check_golden_file("stories260K-quant.golden.json", 7, reference_engine, "cpu");
}

TEST(QuantLlamaCpp, KtinyFilesMatchLlamaCpp) {
    ordo::test::check_golden_file("ktiny.golden.json", 8, reference_engine, "cpu");
}

// A Llama 3.1 file (rope_freqs) is refused, naming the tensor, rather than run with plain RoPE.
TEST(QuantLlamaCpp, RopeFreqsIsRefusedUntilImplemented) {
    const std::string path = k_quant_dir + "llama3-tiny-Q4_K_M.gguf";
    ORDO_REQUIRE_SHARED(path);
    auto f = gguf_file::open(path);
    ASSERT_TRUE(f.ok()) << f.err().message;
    auto w = map_llama_weights(*f);
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.err().code, "llama_unsupported_rope");
    EXPECT_NE(w.err().message.find("rope_freqs.weight"), std::string::npos) << w.err().message;
}
