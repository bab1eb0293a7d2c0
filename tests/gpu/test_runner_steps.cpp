// test_runner_steps.cpp: the runner's step validation, KV staging and failure paths on the
// real device, with a generated model (64 wide, 2 layers, GQA 4/2, vocab 300).
//
// Checks: (1) every malformed step (token outside the vocab, block table too short, a block
// outside the pool, positions past the context, too many tokens or rows, two tokens writing one
// KV slot, an unknown phase) is refused with gpu_bad_step naming the problem, and the runner
// still runs a good step afterwards; (2) read_kv_blocks / write_kv_blocks round trip: blocks
// read after a prefill, the pool cleared, the bytes written back give the same next-token
// logits as without the clear, and bytes written to other block ids read back identical;
// copy_kv_out / copy_kv_in run as one labelled segment each ("kv_out#1 blocks=3") and refuse
// too many blocks or a block named twice in a copy-in with gpu_bad_request; a fresh runner's
// first KV job may be a copy-in;
// (3) an armed device loss fails the step with gpu_device_lost naming the segment of the
// chosen layer; (4) an armed hang fails with gpu_timeout, drain() then waits the spin out and
// the next step works; (5) nan_logits puts NaN in the returned row and the step says its
// logits are not all finite (step_result::logits_finite, what the gpu actor fails it on); (6) with
// row summaries on (runner_options::row_summaries, forced here: CPU devices go without them by
// default) each logits row comes with its summary (the logits_summary kernel) over the step's
// sample_vocab at its sequence's temperature, equal to the host's summarize() of the returned row,
// and a temperature that is not finite and at least 0 is refused; with them off a step says it
// wrote none (step_result::summarized) and leaves the summary output untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "gpu/vk/shaders/abi.h"
#include "gpu_fixture.hpp"
#include "scheduler/sampling.hpp"
#include "test_runner_support.hpp"

namespace ordo::gpu::testing {
namespace {

class RunnerSteps : public ::testing::Test {
protected:
    void SetUp() override {
        ORDO_REQUIRE_GPU();
        file = open_model(synth_model(model::ggml_type::f16));
        ASSERT_TRUE(file);
        auto r = runner::create(*file, test_options(true, 1));
        ASSERT_TRUE(r.ok()) << r.err().message;
        run = std::move(*r);
        logits.resize(8 * 300);
    }

    result<step_result> go(const step& s) { return run->run_step(s, logits.data()); }

    void expect_bad(const step& s, const std::string& needle) {
        auto res = go(s);
        ASSERT_FALSE(res.ok()) << needle;
        EXPECT_EQ(res.err().code, "gpu_bad_step");
        EXPECT_NE(res.err().message.find(needle), std::string::npos) << res.err().message;
    }

    std::unique_ptr<model::gguf_file> file;
    std::unique_ptr<runner> run;
    std::vector<float> logits;
};

TEST_F(RunnerSteps, MalformedStepsAreRefused) {
    expect_bad(make_step(1, step_phase::decode, {make_seq(1, {300}, 0, {0})}), "outside the vocab");
    expect_bad(make_step(1, step_phase::decode, {make_seq(1, {-1}, 0, {0})}), "outside the vocab");
    expect_bad(make_step(1, step_phase::decode, {make_seq(1, {5}, 8, {0})}), "needs 2 KV blocks");
    expect_bad(make_step(1, step_phase::decode, {make_seq(1, {5}, 0, {64})}), "outside the pool");
    expect_bad(make_step(1, step_phase::decode, {make_seq(1, {5}, 256, blocks_from(0, 257, 8))}),
               "past the context");
    expect_bad(make_step(1, step_phase::prefill,
                         {make_seq(1, test_tokens(65, 300, 1), 0, blocks_from(0, 65, 8))}),
               "tokens; at most 64");
    std::vector<step_seq> many;
    for (std::uint32_t i = 0; i < 9; ++i) many.push_back(make_seq(i, {1}, 0, {i}));
    expect_bad(make_step(1, step_phase::decode, many), "sequences");
    expect_bad(
        make_step(1, step_phase::decode, {make_seq(1, {1}, 0, {3}), make_seq(2, {2}, 0, {3})}),
        "write KV slot 24");
    expect_bad(make_step(1, static_cast<step_phase>(7), {make_seq(1, {1}, 0, {0})}), "phase");
    expect_bad(make_step(1, step_phase::decode, {make_seq(1, {}, 0, {0})}), "has no tokens");
    expect_bad(make_step(1, step_phase::decode, {}), "0 sequences");
    auto ok = go(make_step(2, step_phase::decode, {make_seq(1, {5}, 0, {0})}));
    ASSERT_TRUE(ok.ok()) << ok.err().message;
    EXPECT_TRUE(std::isfinite(logits[0]));
}

TEST_F(RunnerSteps, KvBlocksRoundTripThroughHostStaging) {
    auto tokens = test_tokens(20, 300, 5);
    std::vector<std::int32_t> hist(tokens.begin(), tokens.begin() + 19);
    std::vector<std::uint32_t> table = {3, 9, 4};
    ASSERT_TRUE(go(make_step(1, step_phase::prefill, {make_seq(1, hist, 0, table, false)})).ok());
    std::vector<std::uint8_t> bytes(table.size() * run->kv_block_bytes());
    ASSERT_EQ(run->kv_block_bytes(), 2u * 2 * (2 * 8 * 16 * 2));  // K,V x layers x block
    ASSERT_TRUE(run->read_kv_blocks(table, bytes).ok());
    EXPECT_NE(bytes, std::vector<std::uint8_t>(bytes.size(), 0));
    step next = make_step(2, step_phase::decode, {make_seq(1, {tokens[19]}, 19, table)});
    ASSERT_TRUE(go(next).ok());
    std::vector<float> want(logits.begin(), logits.begin() + 300);
    // Lose the pool, restore the three blocks from staging, decode again.
    ASSERT_TRUE(run->clear_kv().ok());
    ASSERT_TRUE(run->write_kv_blocks(table, bytes).ok());
    ASSERT_TRUE(go(next).ok());
    EXPECT_EQ(std::vector<float>(logits.begin(), logits.begin() + 300), want);
    // The same bytes under other block ids read back unchanged.
    std::vector<std::uint32_t> other = {60, 61, 0};
    ASSERT_TRUE(run->write_kv_blocks(other, bytes).ok());
    std::vector<std::uint8_t> back(bytes.size());
    ASSERT_TRUE(run->read_kv_blocks(other, back).ok());
    EXPECT_EQ(back, bytes);
    // Bad requests are errors, not crashes.
    std::vector<std::uint32_t> outside = {64};
    std::vector<std::uint8_t> one(run->kv_block_bytes());
    EXPECT_EQ(run->read_kv_blocks(outside, one).err().code, "gpu_bad_request");
    EXPECT_EQ(run->write_kv_blocks(table, one).err().code, "gpu_bad_request");
}

TEST_F(RunnerSteps, KvCopyJobsAreOneSegmentAndRefuseBadRequests) {
    auto tokens = test_tokens(19, 300, 5);
    std::vector<std::uint32_t> table = {3, 9, 4};
    ASSERT_TRUE(go(make_step(1, step_phase::prefill, {make_seq(1, tokens, 0, table, false)})).ok());
    std::vector<std::uint8_t> bytes(table.size() * run->kv_block_bytes());
    ASSERT_TRUE(run->copy_kv_out(table, bytes).ok());
    EXPECT_EQ(run->last_segment(), "kv_out#1 blocks=3");
    std::vector<std::uint32_t> other = {10, 11, 12};
    ASSERT_TRUE(run->copy_kv_in(other, bytes).ok());
    EXPECT_EQ(run->last_segment(), "kv_in#2 blocks=3");
    std::vector<std::uint8_t> back(bytes.size());
    ASSERT_TRUE(run->copy_kv_out(other, back).ok());
    EXPECT_EQ(back, bytes);
    std::vector<std::uint32_t> twice = {10, 11, 10};
    EXPECT_EQ(run->copy_kv_in(twice, bytes).err().code, "gpu_bad_request");
    // write_kv_blocks keeps its old rule for repeats: the later bytes win.
    ASSERT_TRUE(run->write_kv_blocks(twice, bytes).ok());
    std::vector<std::uint32_t> ten = {10};
    std::vector<std::uint8_t> one(run->kv_block_bytes());
    ASSERT_TRUE(run->copy_kv_out(ten, one).ok());
    EXPECT_TRUE(std::equal(one.begin(), one.end(), bytes.begin() + 2 * one.size()));
    std::vector<std::uint32_t> many(run->kv_copy_blocks_max() + 1, 0);
    std::vector<std::uint8_t> big(many.size() * run->kv_block_bytes());
    EXPECT_EQ(run->copy_kv_out(many, big).err().code, "gpu_bad_request");
    std::vector<std::uint32_t> none;
    EXPECT_EQ(run->copy_kv_out(none, {}).err().code, "gpu_bad_request");
}

// A fresh runner's first KV job may be a copy-in (a restore right after start): the host side
// of copies is made by whichever job comes first (a copy-in first once wrote through null).
TEST_F(RunnerSteps, FirstKvJobMayBeACopyIn) {
    std::vector<std::uint32_t> ids = {5, 6};
    std::vector<std::uint8_t> bytes(ids.size() * run->kv_block_bytes());
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::uint8_t(i * 7 + 1);
    ASSERT_TRUE(run->copy_kv_in(ids, bytes).ok());
    std::vector<std::uint8_t> back(bytes.size());
    ASSERT_TRUE(run->copy_kv_out(ids, back).ok());
    EXPECT_EQ(back, bytes);
}

TEST_F(RunnerSteps, InjectedDeviceLossNamesTheSegment) {
    run->arm_fault({fault_kind::device_lost, 1});
    auto res = go(make_step(812, step_phase::decode, {make_seq(1, {5}, 0, {0})}));
    ASSERT_FALSE(res.ok());
    EXPECT_EQ(res.err().code, "gpu_device_lost");
    EXPECT_NE(res.err().message.find("decode#812 seqs=1 layers 1-1"), std::string::npos)
        << res.err().message;
    EXPECT_EQ(run->last_segment(), "decode#812 seqs=1 layers 1-1");
}

TEST_F(RunnerSteps, InjectedHangTimesOutThenDrains) {
    run->arm_fault({fault_kind::hang, 1});
    auto res = go(make_step(3, step_phase::prefill, {make_seq(1, {5, 6}, 0, {0})}));
    ASSERT_FALSE(res.ok());
    EXPECT_EQ(res.err().code, "gpu_timeout");
    EXPECT_NE(res.err().message.find("prefill#3 seqs=1 layers 1-1"), std::string::npos)
        << res.err().message;
    ASSERT_TRUE(run->drain(test_watchdog_ms).ok());
    auto again = go(make_step(4, step_phase::prefill, {make_seq(1, {5, 6}, 0, {0})}));
    ASSERT_TRUE(again.ok()) << again.err().message;
}

TEST_F(RunnerSteps, NanLogitsFaultReachesTheRow) {
    run->arm_fault({fault_kind::nan_logits, -1});
    auto bad = go(make_step(1, step_phase::decode, {make_seq(1, {5}, 0, {0})}));
    ASSERT_TRUE(bad.ok()) << bad.err().message;
    EXPECT_TRUE(std::isnan(logits[0]));
    EXPECT_FALSE(bad->logits_finite) << "the copy out of the readback buffer checks the rows";
    auto good = go(make_step(2, step_phase::decode, {make_seq(1, {5}, 0, {0})}));
    ASSERT_TRUE(good.ok()) << good.err().message;
    EXPECT_FALSE(std::isnan(logits[0])) << "a fault is armed for one step only";
    EXPECT_TRUE(good->logits_finite);
}

TEST_F(RunnerSteps, EachLogitsRowComesWithItsSummary) {
    // Three sequences, the last asking for two rows (a verification), each its own temperature;
    // the summaries cover the first 250 of the 300 entries.
    step s = make_step(1, step_phase::prefill,
                       {make_seq(1, test_tokens(5, 300, 1), 0, blocks_from(0, 5, 8)),
                        make_seq(2, test_tokens(9, 300, 2), 0, blocks_from(1, 9, 8)),
                        make_seq(3, test_tokens(3, 300, 3), 0, blocks_from(3, 3, 8))});
    const float temps[] = {0.0f, 0.7f, 1.3f, 1.3f};
    s.seqs[0].temperature = temps[0];
    s.seqs[1].temperature = temps[1];
    s.seqs[2].temperature = temps[2];
    s.seqs[2].logits_rows = 2;
    s.sample_vocab = 250;
    constexpr std::uint32_t untouched = 0xA5A5A5A5u;
    std::vector<std::uint32_t> words(8 * abi::ORDO_SUMMARY_WORDS, untouched);
    runner_options off = test_options(true, 1);
    off.row_summaries = false;
    auto plain = make_runner(*file, off);
    ASSERT_NE(plain, nullptr);
    EXPECT_FALSE(plain->row_summaries());
    auto none = plain->run_step(s, logits.data(), nullptr, words.data());
    ASSERT_TRUE(none.ok()) << none.err().message;
    EXPECT_FALSE(none->summarized);
    EXPECT_EQ(std::count(words.begin(), words.end(), untouched), std::ptrdiff_t(words.size()));
    plain.reset();

    runner_options on = test_options(true, 1);
    on.row_summaries = true;
    run = make_runner(*file, on);
    ASSERT_NE(run, nullptr);
    EXPECT_TRUE(run->row_summaries());
    auto res = run->run_step(s, logits.data(), nullptr, words.data());
    ASSERT_TRUE(res.ok()) << res.err().message;
    EXPECT_TRUE(res->summarized);
    ASSERT_EQ(res->rows.size(), 4u);
    for (std::uint32_t r = 0; r < 4; ++r) {
        SCOPED_TRACE("row " + std::to_string(r));
        std::span<const float> row(logits.data() + r * 300, 250);
        const auto want = sched::summarize(row, temps[r]);
        auto got = sched::read_summary(std::span<const std::uint32_t>(words).subspan(
                                           r * abi::ORDO_SUMMARY_WORDS, abi::ORDO_SUMMARY_WORDS),
                                       250, temps[r]);
        ASSERT_TRUE(got.ok()) << got.err().message;
        EXPECT_EQ(got->ids, want.ids);
        EXPECT_EQ(got->max, want.max);
        EXPECT_NEAR(got->mass, want.mass, 1e-5 * want.mass);
        EXPECT_NEAR(got->mass_t, want.mass_t, 1e-5 * want.mass_t);
    }
    step bad = make_step(2, step_phase::decode, {make_seq(1, {5}, 5, blocks_from(0, 6, 8))});
    bad.seqs[0].temperature = -1.0f;
    expect_bad(bad, "temperature");
    bad.seqs[0].temperature = std::nanf("");
    expect_bad(bad, "temperature");
}

}  // namespace
}  // namespace ordo::gpu::testing
