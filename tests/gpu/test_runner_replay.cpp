// test_runner_replay.cpp: a runner whose stream replays its kept recordings
// (runner_options::replay_segments, the default) against one that records every segment, on the
// real device (lavapipe) with a generated model (64 wide, 2 layers, vocab 300).
//
// Checks: a prompt and its decode steps, with both kernel families (texel, storage), give the
// same logits bit for bit with replay on and off; with it on, nearly all of the 16 decode steps
// are replayed (segments_replayed()), with it off nothing is kept or replayed; three
// sequences decoding while their block tables grow (so the steps' attention differs) match too;
// a nan_logits fault in the middle (a fill recorded directly) is seen, and the steps after it are
// finite and still match.
#include <gtest/gtest.h>

#include <cstring>

#include "gpu_fixture.hpp"
#include "test_runner_support.hpp"

namespace ordo::gpu::testing {
namespace {

constexpr std::uint32_t n_vocab = 300;

runner_options options(bool texel, bool replay) {
    runner_options o = test_options(true, 4);
    o.texel_kernels = texel;
    if (!replay) o.replay_segments = 0;
    return o;
}

TEST(RunnerReplay, DecodeStepsReplayedHaveTheRecordedBits) {
    ORDO_REQUIRE_GPU();
    auto file = open_model(synth_model(model::ggml_type::f16));
    ASSERT_TRUE(file);
    const auto tokens = test_tokens(24, n_vocab, 5);
    for (bool texel : {true, false}) {
        SCOPED_TRACE(texel ? "texel" : "storage");
        auto on = make_runner(*file, options(texel, true));
        auto off = make_runner(*file, options(texel, false));
        ASSERT_TRUE(on && off);
        auto a = run_sequence(*on, tokens, 8, 0);
        auto b = run_sequence(*off, tokens, 8, 0);
        ASSERT_EQ(a.size(), 17u);
        EXPECT_TRUE(a == b) << "replayed steps changed the logits";
        // 16 decode steps of one table: nearly all replayed (the first of each shape the
        // warm-up did not record is recorded).
        EXPECT_GE(on->segments_replayed(), 12u) << on->segments_recorded() << " recorded";
        EXPECT_EQ(off->segments_replayed(), 0u);
        EXPECT_EQ(off->segments_recorded(), 0u);
    }
}

TEST(RunnerReplay, GrowingTablesAndAFaultMatchTheRecordedRun) {
    ORDO_REQUIRE_GPU();
    auto file = open_model(synth_model(model::ggml_type::f16));
    ASSERT_TRUE(file);
    std::vector<std::vector<float>> logits[2];
    std::vector<bool> finite[2];
    for (int replay = 0; replay < 2; ++replay) {
        auto run = make_runner(*file, options(false, replay == 1));
        ASSERT_TRUE(run);
        // Three sequences, 5, 9 and 3 prompt tokens, then 20 decodes each: their tables grow a
        // block (8 tokens) at a time, so the attention's grid and strides change on the way.
        std::vector<std::uint32_t> pos = {5, 9, 3};
        std::vector<float> rows(8 * n_vocab);
        step prompt =
            make_step(1, step_phase::prefill,
                      {make_seq(1, test_tokens(5, n_vocab, 1), 0, blocks_from(0, 5, 8)),
                       make_seq(2, test_tokens(9, n_vocab, 2), 0, blocks_from(8, 9, 8)),
                       make_seq(3, test_tokens(3, n_vocab, 3), 0, blocks_from(16, 3, 8))});
        auto p = run->run_step(prompt, rows.data());
        ASSERT_TRUE(p.ok()) << p.err().message;
        for (std::uint64_t i = 0; i < 20; ++i) {
            if (i == 10) run->arm_fault({fault_kind::nan_logits, -1});
            std::vector<step_seq> seqs;
            for (std::uint32_t q = 0; q < 3; ++q) {
                seqs.push_back(make_seq(q + 1, test_tokens(1, n_vocab, 100 + i * 3 + q), pos[q],
                                        blocks_from(8 * q, pos[q] + 1, 8)));
                ++pos[q];
            }
            auto r =
                run->run_step(make_step(2 + i, step_phase::decode, std::move(seqs)), rows.data());
            ASSERT_TRUE(r.ok()) << r.err().message;
            finite[replay].push_back(r->logits_finite);
            logits[replay].emplace_back(rows.begin(), rows.begin() + 3 * n_vocab);
        }
        if (replay == 1) {
            EXPECT_GT(run->segments_replayed(), 0u);
        }
    }
    ASSERT_EQ(logits[0].size(), logits[1].size());
    for (std::size_t i = 0; i < logits[0].size(); ++i) {
        // Bit for bit: the fault's step holds NaNs, which == would call different.
        EXPECT_EQ(std::memcmp(logits[0][i].data(), logits[1][i].data(), 3 * n_vocab * 4), 0)
            << "step " << i << ": replayed steps changed the logits";
    }
    std::vector<bool> want(20, true);
    want[10] = false;
    EXPECT_EQ(finite[0], want);
    EXPECT_EQ(finite[1], want);
}

}  // namespace
}  // namespace ordo::gpu::testing
