// test_runner_llama3.cpp: the Llama 3 shape on the Vulkan runner (gpu/runner/runner.hpp) against
// the CPU reference (model/reference.hpp), on models made by the synthetic generator (F16 and
// F32: the Q4_K kernels that ../shared's llama3-tiny needs are not on this branch).
//
// Checks: (1) RoPE: a model with Llama 3 heads (head_dim 128, rope.freq_base 500000), a
// rope_freqs.weight of Llama 3.1 factors (llama3_rope_factors, factor 32) and linear scaling 2
// agrees with the reference at every position of a 48-token sequence (prefill chunk, then
// decodes; f32 KV, 2e-3 + 1e-3 relative, as test_runner's types), while the same model without
// the factors is more than 4 tolerances away at the last position, and so is the runner's
// output: the runner applies them.
// (2) A 128256-token vocabulary with tied embeddings (no output.weight), F16, n_embd 64, with the
// weight arena's pages lowered to 4 MiB so the 16 MiB embedding is split into row chunks (one
// binding each) for both the lookup and the classifier: all 128256 logits of every position
// agree with the reference, and the classifier's chunks are counted once in weight_bytes(); more
// logits rows than one storage binding holds is a gpu_bad_config naming scheduler.max_sequences.
// (3) choose_context picks the smallest of the trained context, the configured one, the KV
// pool's tokens and the device's bound, naming it, earlier bounds winning ties; and a runner
// on a model trained for 131072 positions with a 512-token pool serves 512 (bound "kv pool").
#include <gtest/gtest.h>

#include "gpu_fixture.hpp"
#include "test_runner_support.hpp"

namespace ordo::gpu::testing {
namespace {

std::string write_model(const std::string& name, const model::synth_options& o) {
    const std::string path = temp_dir() + "/" + name;
    status s = model::write_synth_model(o, path);
    EXPECT_TRUE(s.ok()) << s.err().message;
    return path;
}

// Llama 3 heads: 2 query heads and 1 KV head of 128, base 500000.
model::synth_options llama3_heads(float factor, float linear) {
    model::synth_options o;
    o.n_embd = 256, o.n_layer = 2, o.n_head = 2, o.n_head_kv = 1, o.n_ff = 256;
    o.n_vocab = 300, o.n_ctx = 4096, o.type = model::ggml_type::f16, o.seed = 21;
    o.rope_freq_base = 500000.0f;
    o.rope_llama3_factor = factor;
    o.rope_linear = linear;
    return o;
}

double worst_excess(const std::vector<float>& got, const std::vector<float>& want, double atol,
                    double rtol) {
    double worst = 0.0;  // max of |got - want| / (atol + rtol |want|): <= 1 passes
    for (std::size_t v = 0; v < want.size(); ++v) {
        double d = std::fabs(double(got[v]) - want[v]) / (atol + rtol * std::fabs(want[v]));
        if (!(d <= worst)) worst = std::isnan(d) ? INFINITY : d;
    }
    return worst;
}

// (1)
TEST(RunnerLlama3, RopeFactorsAndLinearScalingMatchTheReference) {
    ORDO_REQUIRE_GPU();
    auto f = open_model(write_model("llama3_rope.gguf", llama3_heads(32.0f, 2.0f)));
    auto plain = open_model(write_model("llama3_plain.gguf", llama3_heads(0.0f, 2.0f)));
    ASSERT_TRUE(f && plain);
    auto r = make_runner(*f, test_options());
    ASSERT_TRUE(r);
    auto tokens = test_tokens(48, 300, 5);
    auto ref = reference_logits(*f, tokens);
    auto ref_plain = reference_logits(*plain, tokens);
    auto got = run_sequence(*r, tokens, 13, 0);
    ASSERT_EQ(ref.size(), 48u);
    ASSERT_EQ(got.size(), 36u);  // after token 12 (the chunk), then 13..47
    const double atol = 2e-3, rtol = 1e-3;
    for (std::size_t i = 0; i < got.size(); ++i) {
        EXPECT_LE(worst_excess(got[i], ref[12 + i], atol, rtol), 1.0) << "position " << 12 + i;
    }
    // The factors matter here: the model without them is several tolerances away (measured
    // 8.1 at position 47), and so is the runner's output.
    const double factors_effect = worst_excess(ref_plain.back(), ref.back(), atol, rtol);
    std::printf("without rope_freqs the last logits move by %.1f x the tolerance\n",
                factors_effect);
    EXPECT_GT(factors_effect, 4.0);
    EXPECT_GT(worst_excess(got.back(), ref_plain.back(), atol, rtol), 2.0);
}

// (2)
TEST(RunnerLlama3, TiedVocab128kInChunksMatchesTheReference) {
    ORDO_REQUIRE_GPU();
    model::synth_options o;
    o.n_embd = 64, o.n_layer = 1, o.n_head = 4, o.n_head_kv = 2, o.n_ff = 128;
    o.n_vocab = 128256, o.n_ctx = 256, o.type = model::ggml_type::f16, o.seed = 8, o.tied = true;
    auto f = open_model(write_model("vocab128k_tied.gguf", o));
    ASSERT_TRUE(f);
    ASSERT_EQ(f->find_tensor("output.weight"), nullptr);
    runner_options ro = test_options();
    ro.weight_page_bytes = 4u << 20;  // the 16 MiB embedding: 5 chunks
    auto r = make_runner(*f, ro);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->hparams().n_vocab, 128256u);
    // The classifier reuses the embedding's chunks: counted once.
    const std::uint64_t embd = 64ull * 128256 * 2;
    EXPECT_GE(r->weight_bytes(), embd);
    EXPECT_LT(r->weight_bytes(), embd + embd / 2);
    auto tokens = test_tokens(6, 128256, 9);
    tokens[1] = 128255;  // the last row of the last chunk
    tokens[2] = 0;
    auto ref = reference_logits(*f, tokens);
    auto got = run_sequence(*r, tokens, 3, 0);
    ASSERT_EQ(got.size(), 4u);
    for (std::size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i].size(), 128256u);
        EXPECT_LE(worst_excess(got[i], ref[2 + i], 2e-3, 1e-3), 1.0) << "position " << 2 + i;
        EXPECT_EQ(argmax(got[i].data(), got[i].size()),
                  argmax(ref[2 + i].data(), ref[2 + i].size()))
            << "position " << 2 + i;
    }
    // Logits rows are 513 KB each here: more rows than one binding holds is a config error
    // naming the buffer and the key that sizes it (where a step may hold that many rows).
    const std::uint64_t rows = env().dev->info().max_storage_buffer_range / (128256ull * 4) + 1;
    if (rows > runner_seqs_max_max) return;
    runner_options big = ro;
    big.rows_max = big.seqs_max = big.max_batch_tokens = static_cast<std::uint32_t>(rows);
    auto refused = runner::create(*f, big);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.err().code, "gpu_bad_config");
    EXPECT_NE(refused.err().message.find("the logits buffer of"), std::string::npos)
        << refused.err().message;
    EXPECT_NE(refused.err().message.find("lower scheduler.max_sequences"), std::string::npos)
        << refused.err().message;
}

// (3)
TEST(RunnerLlama3, ContextIsTheSmallestBound) {
    struct bound_case {
        std::uint32_t trained, configured;
        std::uint64_t pool, device;
        std::uint32_t want;
        context_bound bound;
    };
    const bound_case cases[] = {
        {131072, 0, 1u << 24, 0, 131072, context_bound::trained},
        {131072, 8192, 1u << 24, 0, 8192, context_bound::config},
        {131072, 8192, 4096, 0, 4096, context_bound::kv_pool},
        {131072, 0, 1u << 24, 131056, 131056, context_bound::device},
        {131072, 131072, 131072, 131072, 131072, context_bound::trained},  // ties: the first
        {2048, 4096, 1024, 512, 512, context_bound::device},
    };
    for (const auto& c : cases) {
        context_choice got = choose_context(c.trained, c.configured, c.pool, c.device);
        EXPECT_EQ(got.n_ctx, c.want) << c.trained << " " << c.configured << " " << c.pool;
        EXPECT_EQ(got.bound, c.bound) << context_bound_name(got.bound);
    }
    EXPECT_EQ(context_bound_name(context_bound::kv_pool), "kv pool");
}

TEST(RunnerLlama3, LongTrainedContextIsCappedByTheKvPool) {
    ORDO_REQUIRE_GPU();
    model::synth_options o;
    o.n_embd = 64, o.n_layer = 1, o.n_head = 4, o.n_head_kv = 2, o.n_ff = 96;
    o.n_vocab = 300, o.n_ctx = 131072, o.type = model::ggml_type::f16, o.seed = 4;
    auto f = open_model(write_model("ctx131072.gguf", o));
    ASSERT_TRUE(f);
    runner_options ro = test_options();  // 64 blocks of 8 tokens
    auto r = make_runner(*f, ro);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->limits().n_ctx, 512u);
    EXPECT_EQ(r->n_ctx_bound(), context_bound::kv_pool);
    EXPECT_EQ(r->kv_bytes(), 2ull * 1 * 64 * (2 * 8 * 16 * 4));  // K and V, f32
}

}  // namespace
}  // namespace ordo::gpu::testing
