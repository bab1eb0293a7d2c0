// test_runner_embed.cpp: the runner's hidden rows (step_seq::hidden, what embeddings pool)
// against the CPU reference (model/reference.hpp embed), on the real device (lavapipe in CI).
//
// Checks: (1) plan_step places hidden runs (every token for sum, one for last and first) and
// refuses more hidden rows than rows_max; run_step refuses a step that asks for hidden rows
// without an output for them; (2) on stories260K (skipped visibly without ../shared) and on a
// generated 2-layer model (always), an input of 21 tokens run in prefill chunks of 8, 8 and 5
// gives, for each pooling, the reference's embedding within 1e-4 per component once pooled
// across the chunks and L2-normalized the way the scheduler does (sum of the chunks' sums for
// mean, the last chunk's last token for last, the first chunk's first token for cls); (3) a
// step mixing an embedding chunk with a decoding sequence gives that sequence the logits it
// gets alone (within 1e-4) and the embedding its reference value. Tolerance: the f32 KV
// logits tolerance of test_runner.cpp; a normalized component is O(0.1), its error O(1e-6).
#include <gtest/gtest.h>

#include <cmath>

#include "gpu/runner/step_plan.hpp"
#include "gpu_fixture.hpp"
#include "test_runner_support.hpp"

namespace ordo::gpu::testing {
namespace {

constexpr double k_tolerance = 1e-4;

step_seq hidden_seq(std::uint64_t id, std::vector<std::int32_t> tokens, std::uint32_t pos0,
                    std::vector<std::uint32_t> table, hidden_output h) {
    step_seq q = make_seq(id, std::move(tokens), pos0, std::move(table), false);
    q.hidden = h;
    return q;
}

// What the scheduler asks of a chunk [pos0, pos0 + n) of an input of `total` tokens.
hidden_output hidden_for(model::pooling p, std::uint32_t pos0, std::uint32_t n,
                         std::uint32_t total) {
    switch (p) {
        case model::pooling::mean:
            return hidden_output::sum;
        case model::pooling::last:
            return pos0 + n == total ? hidden_output::last : hidden_output::none;
        case model::pooling::cls:
            return pos0 == 0 ? hidden_output::first : hidden_output::none;
    }
    return hidden_output::none;
}

std::vector<float> normalized(const std::vector<double>& v) {
    double norm = 0.0;
    for (double x : v) norm += x * x;
    norm = std::sqrt(norm);
    std::vector<float> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<float>(v[i] / norm);
    return out;
}

// The input run through the runner in chunks of `chunk`, pooled as the scheduler pools.
std::vector<float> runner_embedding(runner& r, const std::vector<std::int32_t>& tokens,
                                    std::uint32_t chunk, model::pooling p,
                                    std::uint32_t first_block, std::uint64_t& step_id) {
    const std::uint32_t n_embd = r.hparams().n_embd;
    const auto total = static_cast<std::uint32_t>(tokens.size());
    auto table = blocks_from(first_block, total, r.limits().block_tokens);
    std::vector<double> pooled(n_embd, 0.0);
    std::vector<float> hidden(n_embd);
    for (std::uint32_t pos = 0; pos < total; pos += chunk) {
        const std::uint32_t n = std::min(chunk, total - pos);
        const hidden_output h = hidden_for(p, pos, n, total);
        std::vector<std::int32_t> part(tokens.begin() + pos, tokens.begin() + pos + n);
        auto res = r.run_step(
            make_step(++step_id, step_phase::prefill, {hidden_seq(3, part, pos, table, h)}),
            nullptr, hidden.data());
        EXPECT_TRUE(res.ok()) << (res.ok() ? "" : res.err().message);
        if (!res) return {};
        EXPECT_TRUE(res->rows.empty());
        EXPECT_EQ(res->hidden_rows.size(), h == hidden_output::none ? 0u : 1u);
        if (h == hidden_output::none) continue;
        for (std::uint32_t e = 0; e < n_embd; ++e) pooled[e] += hidden[e];
    }
    return normalized(pooled);
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                  const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    EXPECT_LE(max_abs_diff(got.data(), want), k_tolerance) << what;
}

void check_every_pooling(const model::gguf_file& f, std::uint32_t n_vocab) {
    auto r = make_runner(f, test_options());
    ASSERT_TRUE(r);
    auto ref = model::reference_model::create(f, 64);
    ASSERT_TRUE(ref.ok()) << ref.err().message;
    const auto tokens = test_tokens(21, n_vocab, 5);
    std::vector<std::uint32_t> ids(tokens.begin(), tokens.end());
    std::uint64_t step_id = 0;
    for (model::pooling p : {model::pooling::mean, model::pooling::last, model::pooling::cls}) {
        auto want = model::embed(*ref, ids, p);
        ASSERT_TRUE(want.ok()) << want.err().message;
        auto got = runner_embedding(*r, tokens, 8, p, 0, step_id);
        expect_close(got, *want, "pooling " + std::to_string(int(p)));
    }
}

TEST(RunnerEmbed, PlanPlacesHiddenRunsAndBoundsThem) {
    step_limits lim{300, 64, 8, 16, 64, 2, 8, 8};
    step s = make_step(
        1, step_phase::prefill,
        {hidden_seq(1, {1, 2, 3}, 0, {0}, hidden_output::sum), make_seq(2, {4, 5}, 0, {1}),
         hidden_seq(3, {6, 7, 8, 9}, 0, {2}, hidden_output::last)});
    step_plan p;
    ASSERT_TRUE(plan_step(s, lim, p).ok());
    ASSERT_EQ(p.hidden_rows(), 2u);
    EXPECT_EQ(p.hidden_seq_ids, (std::vector<std::uint64_t>{1, 3}));
    EXPECT_EQ(p.hidden_runs[0].token0, 0u);
    EXPECT_EQ(p.hidden_runs[0].n, 3u);
    EXPECT_EQ(p.hidden_runs[1].token0, 8u);  // the last of tokens 5..8
    EXPECT_EQ(p.hidden_runs[1].row0, 3u);
    EXPECT_EQ(p.hidden_runs[1].n, 1u);
    EXPECT_EQ(p.hidden_tokens, 4u);
    EXPECT_EQ(p.rows(), 1u);
    s.seqs[1].hidden = hidden_output::first;  // a third hidden row: rows_max is 2
    auto refused = plan_step(s, lim, p);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.err().message.find("3 hidden rows; at most 2"), std::string::npos)
        << refused.err().message;
}

TEST(RunnerEmbed, AStepAskingForHiddenRowsNeedsAnOutput) {
    ORDO_REQUIRE_GPU();
    auto f = open_model(synth_model(model::ggml_type::f32));
    ASSERT_TRUE(f);
    auto r = make_runner(*f, test_options());
    ASSERT_TRUE(r);
    auto res = r->run_step(
        make_step(1, step_phase::prefill, {hidden_seq(1, {1, 2}, 0, {0}, hidden_output::sum)}),
        nullptr, nullptr);
    ASSERT_FALSE(res.ok());
    EXPECT_EQ(res.err().code, "gpu_bad_step");
}

TEST(RunnerEmbed, GeneratedModelPoolsAsTheReference) {
    ORDO_REQUIRE_GPU();
    auto f = open_model(synth_model(model::ggml_type::f32));
    ASSERT_TRUE(f);
    check_every_pooling(*f, 300);
}

TEST(RunnerEmbed, StoriesPoolsAsTheReference) {
    ORDO_REQUIRE_GPU();
    ORDO_REQUIRE_STORIES();
    auto f = open_model(k_models + "/stories260K.gguf");
    ASSERT_TRUE(f);
    check_every_pooling(*f, 512);
}

TEST(RunnerEmbed, AnEmbeddingBatchedWithADecodeLeavesItsLogitsAlone) {
    ORDO_REQUIRE_GPU();
    auto f = open_model(synth_model(model::ggml_type::f32));
    ASSERT_TRUE(f);
    auto r = make_runner(*f, test_options());
    ASSERT_TRUE(r);
    const std::uint32_t n_vocab = r->hparams().n_vocab, n_embd = r->hparams().n_embd;
    // The decoding sequence: a 6-token prefix (blocks 10..), then one decode, alone.
    const auto prefix = test_tokens(7, n_vocab, 9);
    auto table = blocks_from(10, 7, r->limits().block_tokens);
    std::vector<float> alone(n_vocab), batched(n_vocab), hidden(n_embd);
    std::vector<std::int32_t> head(prefix.begin(), prefix.begin() + 6);
    ASSERT_TRUE(r->run_step(make_step(1, step_phase::prefill, {make_seq(7, head, 0, table, false)}),
                            nullptr)
                    .ok());
    ASSERT_TRUE(r->run_step(make_step(2, step_phase::decode, {make_seq(7, {prefix[6]}, 6, table)}),
                            alone.data())
                    .ok());
    // The same decode again (its KV slot is rewritten with the same values), now beside a
    // whole 12-token embedding input.
    const auto input = test_tokens(12, n_vocab, 11);
    auto res =
        r->run_step(make_step(3, step_phase::mixed,
                              {make_seq(7, {prefix[6]}, 6, table),
                               hidden_seq(8, input, 0, blocks_from(0, 12, 8), hidden_output::sum)}),
                    batched.data(), hidden.data());
    ASSERT_TRUE(res.ok()) << res.err().message;
    EXPECT_EQ(res->rows, std::vector<std::uint64_t>{7});
    EXPECT_EQ(res->hidden_rows, std::vector<std::uint64_t>{8});
    EXPECT_LE(max_abs_diff(batched.data(), alone), k_tolerance);
    auto ref = model::reference_model::create(*f, 64);
    ASSERT_TRUE(ref.ok());
    std::vector<std::uint32_t> ids(input.begin(), input.end());
    auto want = model::embed(*ref, ids, model::pooling::mean);
    ASSERT_TRUE(want.ok());
    expect_close(normalized(std::vector<double>(hidden.begin(), hidden.end())), *want,
                 "batched embedding");
}

}  // namespace
}  // namespace ordo::gpu::testing
