// test_runner.cpp: the Llama forward pass on Vulkan (gpu/runner/runner.hpp) against the CPU
// reference (model/reference.hpp), on the real device (lavapipe in CI).
//
// Checks: (1) stories260K: logits after BOS within 1e-4 (f32 KV) of the reference and within
// 2e-4 of the golden json, and greedy decoding through runner steps reproduces both golden
// cases token for token; (2) generated models (2 layers, GQA 4/2, vocab 300; 64 wide, or 256
// wide with ff 512 for the K types) in every weight type the kernels run (F32, F16, BF16, Q8_0,
// Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K; quantized by ordo's quantizers) agree
// with the reference on the same file at every position of a sequence that crosses KV block
// boundaries (a 13-token prefill chunk, then single-token decodes), tolerance 2e-3 + 1e-3
// relative with f32 KV and 3e-2 with f16 KV; (3) a batch of 3 sequences
// of different lengths and phases (prefill chunk and decodes mixed) gives the logits each gives
// alone (within 1e-4: the mat-mul kernel depends on the batch size); (4) flush_every_layers 1, 2
// and all give bit-identical logits; (5) a context past what attention can walk on the device
// is clamped at load; (6) check_weight_types accepts every type the CPU reference runs (the
// kernels run them all) and names the one odd matrix of a mixed model whose type has no kernel
// (an IQ type: the loader refuses such a file first, so this refusal is the runner's defence
// for weights built by hand); (7) gpu.batch_invariant = false: on a device without cooperative
// matrices the runner keeps the invariant kernels (bit-identical logits to the default); with
// the emulated cooperative-matrix kernel (mul_mat_cme, the tests' stand-in for mul_mat_cm) the
// storage family's prefill chunks run on it and every position still agrees with the
// reference within 1e-2 + 5e-3 relative, what f16 inputs cost (measured: under half of it),
// in F16, Q8_0 and Q4_K.
#include <gtest/gtest.h>

#include "gpu_fixture.hpp"
#include "test_runner_support.hpp"

namespace ordo::gpu::testing {
namespace {

TEST(Runner, StoriesLogitsAfterBosMatchReferenceAndGolden) {
    ORDO_REQUIRE_GPU();
    ORDO_REQUIRE_STORIES();
    auto f = open_model(k_models + "/stories260K.gguf");
    ASSERT_TRUE(f);
    auto r = make_runner(*f, test_options());
    ASSERT_TRUE(r);
    auto ref = reference_logits(*f, {1});
    ASSERT_EQ(ref.size(), 1u);
    std::vector<float> got(512);
    auto res =
        r->run_step(make_step(1, step_phase::prefill, {make_seq(1, {1}, 0, {0})}), got.data());
    ASSERT_TRUE(res.ok()) << res.err().message;
    EXPECT_LE(max_abs_diff(got.data(), ref[0]), 1e-4);
    std::string golden = read_text(k_models + "/stories260K.golden.json");
    std::size_t at = golden.find("\"logits_after_bos_pos0\"");
    ASSERT_NE(at, std::string::npos);
    auto want = json_numbers(golden, "values", at);
    ASSERT_EQ(want.size(), 512u);
    std::vector<float> wantf(want.begin(), want.end());
    EXPECT_LE(max_abs_diff(got.data(), wantf), 2e-4);
    EXPECT_EQ(argmax(got.data(), 512), 403u);
}

// Greedy decoding of a golden case through runner steps: the prompt as one prefill step, then
// one decode step per generated token.
void check_golden_case(runner& r, const std::string& golden, const std::string& name) {
    std::size_t at = golden.find("\"" + name + "\"");
    ASSERT_NE(at, std::string::npos) << name;
    auto prompt_d = json_numbers(golden, "prompt_token_ids", at);
    auto want_d = json_numbers(golden, "generated_token_ids", at);
    ASSERT_FALSE(prompt_d.empty());
    ASSERT_FALSE(want_d.empty());
    std::vector<std::int32_t> next(prompt_d.begin(), prompt_d.end());
    std::uint32_t total = static_cast<std::uint32_t>(prompt_d.size() + want_d.size());
    auto table = blocks_from(0, total, r.limits().block_tokens);
    std::vector<float> row(r.hparams().n_vocab);
    std::uint32_t pos = 0;
    for (std::size_t i = 0; i < want_d.size(); ++i) {
        step s = make_step(i + 1, i == 0 ? step_phase::prefill : step_phase::decode,
                           {make_seq(5, next, pos, table)});
        auto res = r.run_step(s, row.data());
        ASSERT_TRUE(res.ok()) << res.err().message;
        pos += static_cast<std::uint32_t>(next.size());
        auto tok = static_cast<std::int32_t>(argmax(row.data(), row.size()));
        ASSERT_EQ(tok, static_cast<std::int32_t>(want_d[i]))
            << name << ": first mismatch at generated token " << i;
        next = {tok};
    }
}

TEST(Runner, StoriesGreedyOutputEqualsGoldenText) {
    ORDO_REQUIRE_GPU();
    ORDO_REQUIRE_STORIES();
    auto f = open_model(k_models + "/stories260K.gguf");
    ASSERT_TRUE(f);
    runner_options o = test_options();
    o.kv_blocks = 32;  // 256 positions: both golden cases fit
    o.flush_every_layers = 2;
    auto r = make_runner(*f, o);
    ASSERT_TRUE(r);
    std::string golden = read_text(k_models + "/stories260K.golden.json");
    check_golden_case(*r, golden, "bos_only_200_steps");
    check_golden_case(*r, golden, "once_upon_a_time_64_steps");
}

struct type_case {
    model::ggml_type type;
    bool kv_f16;
    double atol;
    double rtol;
};

class RunnerTypes : public ::testing::TestWithParam<type_case> {};

TEST_P(RunnerTypes, AgreesWithReferenceAcrossBlockBoundaries) {
    ORDO_REQUIRE_GPU();
    const type_case& c = GetParam();
    auto f = open_model(synth_model(c.type));
    ASSERT_TRUE(f);
    auto r = make_runner(*f, test_options(c.kv_f16));
    ASSERT_TRUE(r);
    // 13-token prefill (blocks 0 and 1 of 8 positions), then decodes up to position 27.
    auto tokens = test_tokens(28, 300, 3);
    auto ref = reference_logits(*f, tokens);
    auto got = run_sequence(*r, tokens, 13, 5);
    ASSERT_EQ(got.size(), 16u);
    ASSERT_EQ(ref.size(), 28u);
    for (std::size_t i = 0; i < got.size(); ++i) {
        const auto& want = ref[12 + i];
        for (std::size_t v = 0; v < want.size(); ++v) {
            double tol = c.atol + c.rtol * std::fabs(want[v]);
            ASSERT_LE(std::fabs(got[i][v] - want[v]), tol)
                << model::type_name(c.type) << " position " << 12 + i << " logit " << v;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Types, RunnerTypes,
                         ::testing::Values(type_case{model::ggml_type::f32, false, 2e-3, 1e-3},
                                           type_case{model::ggml_type::f16, false, 2e-3, 1e-3},
                                           type_case{model::ggml_type::bf16, false, 2e-3, 1e-3},
                                           type_case{model::ggml_type::q8_0, false, 2e-3, 1e-3},
                                           type_case{model::ggml_type::q4_0, false, 2e-3, 1e-3},
                                           type_case{model::ggml_type::q4_1, false, 2e-3, 1e-3},
                                           type_case{model::ggml_type::q5_0, false, 2e-3, 1e-3},
                                           type_case{model::ggml_type::q5_1, false, 2e-3, 1e-3},
                                           type_case{model::ggml_type::q2_k, false, 2e-3, 1e-3},
                                           type_case{model::ggml_type::q3_k, false, 2e-3, 1e-3},
                                           type_case{model::ggml_type::q4_k, false, 2e-3, 1e-3},
                                           type_case{model::ggml_type::q5_k, false, 2e-3, 1e-3},
                                           type_case{model::ggml_type::q6_k, false, 2e-3, 1e-3},
                                           type_case{model::ggml_type::f16, true, 3e-2, 0.0}),
                         [](const auto& info) {
                             return std::string(model::type_name(info.param.type)) +
                                    (info.param.kv_f16 ? "_kv_f16" : "_kv_f32");
                         });

TEST(Runner, MixedBatchEqualsEachSequenceAlone) {
    ORDO_REQUIRE_GPU();
    auto f = open_model(synth_model(model::ggml_type::f16));
    ASSERT_TRUE(f);
    auto r = make_runner(*f, test_options());
    ASSERT_TRUE(r);
    const std::uint32_t bt = 8, nv = 300;
    auto a = test_tokens(20, nv, 11), b = test_tokens(9, nv, 12), c = test_tokens(5, nv, 13);
    // History: a's first 19 tokens (blocks 0-2), b's first 3 (block 10); c is new (block 20).
    std::vector<float> sink(8 * nv);
    auto ta = blocks_from(0, 20, bt), tb = blocks_from(10, 9, bt), tc = blocks_from(20, 5, bt);
    std::vector<std::int32_t> a_hist(a.begin(), a.begin() + 19), b_hist(b.begin(), b.begin() + 3);
    ASSERT_TRUE(r->run_step(make_step(1, step_phase::prefill,
                                      {make_seq(1, a_hist, 0, ta, false),
                                       make_seq(2, b_hist, 0, tb, false)}),
                            sink.data())
                    .ok());
    // The mixed step: a decodes its 20th token, b prefills 6 more, c prefills all 5.
    std::vector<std::int32_t> b_rest(b.begin() + 3, b.end());
    step mixed = make_step(
        2, step_phase::mixed,
        {make_seq(1, {a[19]}, 19, ta), make_seq(2, b_rest, 3, tb), make_seq(3, c, 0, tc)});
    std::vector<float> batched(3 * nv);
    auto res = r->run_step(mixed, batched.data());
    ASSERT_TRUE(res.ok()) << res.err().message;
    EXPECT_EQ(res->rows, (std::vector<std::uint64_t>{1, 2, 3}));
    EXPECT_EQ(res->n_tokens, 12u);
    // Each alone, on a fresh pool each time (other blocks, same tables).
    std::vector<std::vector<std::int32_t>> all = {a, b, c};
    for (std::size_t i = 0; i < 3; ++i) {
        ASSERT_TRUE(r->clear_kv().ok());
        auto rows = run_sequence(*r, all[i], static_cast<std::uint32_t>(all[i].size()),
                                 std::array<std::uint32_t, 3>{30, 40, 50}[i]);
        ASSERT_EQ(rows.size(), 1u);
        EXPECT_LE(max_abs_diff(batched.data() + i * nv, rows[0]), 1e-4) << "sequence " << i;
    }
}

std::vector<float> run_flush(const model::gguf_file& f, std::uint32_t flush) {
    auto r = make_runner(f, test_options(true, flush));
    if (!r) return {};
    auto tokens = test_tokens(12, 300, 21);
    std::vector<float> out(2 * 300);
    step s =
        make_step(7, step_phase::prefill,
                  {make_seq(1, tokens, 0, {0, 1}), make_seq(2, {tokens[0], tokens[1]}, 0, {4})});
    auto res = r->run_step(s, out.data());
    EXPECT_TRUE(res.ok()) << (res.ok() ? "" : res.err().message);
    if (res.ok()) {
        std::uint32_t layers = std::min<std::uint32_t>(flush, 3);
        EXPECT_EQ(res->segments, (3 + layers - 1) / layers) << "flush " << flush;
    }
    return out;
}

TEST(Runner, FlushEveryOneTwoAllLayersIsBitIdentical) {
    ORDO_REQUIRE_GPU();
    auto f = open_model(synth_model(model::ggml_type::q8_0, 3));
    ASSERT_TRUE(f);
    auto all = run_flush(*f, 1024);
    auto one = run_flush(*f, 1);
    auto two = run_flush(*f, 2);
    ASSERT_EQ(all.size(), 600u);
    EXPECT_EQ(one, all);
    EXPECT_EQ(two, all);
    EXPECT_NE(all, std::vector<float>(600, 0.0f));
}

// (5) A context longer than attention can walk on the device (llvmpipe ends shader loops after
// 65535 iterations) is clamped to attention_positions_max at load, a multiple of the block size;
// a device without such a cap is bounded by the (larger) KV pool instead.
TEST(Runner, ContextIsClampedToWhatAttentionCanWalk) {
    ORDO_REQUIRE_GPU();
    model::synth_options o;
    o.n_embd = 64, o.n_layer = 1, o.n_head = 4, o.n_head_kv = 2, o.n_ff = 96, o.n_vocab = 300;
    o.n_ctx = 1'000'000;
    o.type = model::ggml_type::f32;
    o.seed = 11;
    std::string path = temp_dir() + "/synth_long_ctx.gguf";
    ASSERT_TRUE(model::write_synth_model(o, path).ok());
    auto f = open_model(path);
    ASSERT_NE(f, nullptr);
    runner_options ro = test_options(true);
    ro.kv_blocks = 40'000;  // 320000 tokens (40 MB): the pool is not the bound here
    auto r = make_runner(*f, ro);
    ASSERT_NE(r, nullptr);
    kv_geometry g{1, 2, 16, ro.kv_block_tokens, 1, ro.kv_f16};
    std::uint64_t most = attention_positions_max(*env().pipes, g);
    if (env().dev->info().loop_iterations_max == 0) {
        EXPECT_EQ(r->limits().n_ctx, 320'000u);  // the pool, then (the model's is 1000000)
        EXPECT_EQ(r->n_ctx_bound(), context_bound::kv_pool);
    } else {
        ASSERT_GT(most, 0u);
        ASSERT_LT(most, 320'000u);
        EXPECT_EQ(r->limits().n_ctx, most);
        EXPECT_EQ(r->n_ctx_bound(), context_bound::device);
        EXPECT_EQ(r->limits().n_ctx % ro.kv_block_tokens, 0u);
    }
}

// (6)
TEST(Runner, CheckWeightTypesAcceptsEveryLoadableTypeAndNamesAnOddMatrix) {
    std::size_t accepted = 0;
    for (const auto& tr : model::k_ggml_types) {
        if (!model::is_supported(tr.type)) continue;
        SCOPED_TRACE(tr.name);
        EXPECT_TRUE(kernels_run(tr.type));
        auto f = open_model(synth_model(tr.type, 1, true));
        ASSERT_TRUE(f);
        auto w = model::map_llama_weights(*f);
        ASSERT_TRUE(w.ok()) << w.err().message;
        EXPECT_TRUE(check_weight_types(*w).ok());
        ++accepted;
    }
    EXPECT_EQ(accepted, 13u);  // f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k .. q6_k

    // One odd matrix in an otherwise runnable model is found wherever it is.
    auto f = open_model(synth_model(model::ggml_type::q8_0));
    ASSERT_TRUE(f);
    auto w = model::map_llama_weights(*f);
    ASSERT_TRUE(w.ok());
    EXPECT_TRUE(check_weight_types(*w).ok());
    w->layers[1].ffn_down.type = model::ggml_type::iq2_xxs;
    auto st = check_weight_types(*w);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.err().code, "gpu_unsupported_type");
    EXPECT_NE(st.err().message.find("tensor 'blk.1.ffn_down.weight' has type iq2_xxs, which the "
                                    "Vulkan kernels do not run yet (they run f32, f16, q4_0, "
                                    "q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k, bf16)"),
              std::string::npos)
        << st.err().message;
}

// gpu.batch_invariant = false: on lavapipe the invariant kernels (the same bits); with the
// emulated cooperative-matrix kernel every position within tolerance of the CPU reference and
// not the invariant bits, its large tile measured at warm-up, and pinned, run by a prompt chunk.
TEST(Runner, NotBatchInvariantRunsCooperativeMatricesWhereTheDeviceHasThem) {
    ORDO_REQUIRE_GPU();
    auto tokens = test_tokens(28, 300, 3);
    for (model::ggml_type type :
         {model::ggml_type::f16, model::ggml_type::q8_0, model::ggml_type::q4_k}) {
        SCOPED_TRACE(std::string(model::type_name(type)));
        auto f = open_model(synth_model(type));
        ASSERT_TRUE(f);
        runner_options o = test_options();
        o.texel_kernels = false;  // the storage family: its tiled steps are the ones switched
        auto invariant = make_runner(*f, o);
        ASSERT_TRUE(invariant);
        EXPECT_FALSE(invariant->mat_coop());
        auto want = run_sequence(*invariant, tokens, 13, 5);
        o.batch_invariant = false;
        auto plain = make_runner(*f, o);
        ASSERT_TRUE(plain);
        EXPECT_EQ(plain->mat_coop(), plain->info().cooperative_matrix);
        if (!plain->mat_coop()) {
            // No cooperative matrices here: the same kernels, the same bits.
            auto got = run_sequence(*plain, tokens, 13, 5);
            EXPECT_EQ(got, want);
        }
        o.mat_coop_emulated = true;
        auto coop = make_runner(*f, o);
        ASSERT_TRUE(coop);
        EXPECT_TRUE(coop->mat_coop());
        auto got = run_sequence(*coop, tokens, 13, 5);
        auto ref = reference_logits(*f, tokens);
        ASSERT_EQ(got.size(), 16u);
        bool differs = false;
        for (std::size_t i = 0; i < got.size(); ++i) {
            differs = differs || got[i] != want[i];
            const auto& r = ref[12 + i];
            for (std::size_t v = 0; v < r.size(); ++v) {
                ASSERT_LE(std::fabs(got[i][v] - r[v]), 1e-2 + 5e-3 * std::fabs(r[v]))
                    << "position " << 12 + i << " logit " << v;
            }
        }
        // f16 inputs: the prefill's logits are not the invariant kernels' bits.
        EXPECT_TRUE(differs);
        // The large tile: measured at warm-up (max_batch_tokens 64: from 64 tokens, or never)
        // unless pinned; pinned from 17 tokens, a 24-token prompt chunk runs on it. One row
        // and the whole model in one segment: the segment's dispatch budget has no slack, so
        // it must count the split's second dispatch per mat-mul (a device whose invariant
        // kernels never split, as lavapipe's, once left it out and aborted).
        EXPECT_TRUE(coop->mat_coop_large_from() == 0 || coop->mat_coop_large_from() == 64)
            << coop->mat_coop_large_from();
        o.mat_coop_large_from = 17;
        o.rows_max = 1;
        o.flush_every_layers = 2;
        auto large = make_runner(*f, o);
        ASSERT_TRUE(large);
        EXPECT_EQ(large->mat_coop_large_from(), 17u);
        auto big = run_sequence(*large, tokens, 24, 5);
        ASSERT_EQ(big.size(), 5u);
        for (std::size_t i = 0; i < big.size(); ++i) {
            const auto& r = ref[23 + i];
            for (std::size_t v = 0; v < r.size(); ++v) {
                ASSERT_LE(std::fabs(big[i][v] - r[v]), 1e-2 + 5e-3 * std::fabs(r[v]))
                    << "large tile, position " << 23 + i << " logit " << v;
            }
        }
    }
}

}  // namespace
}  // namespace ordo::gpu::testing
