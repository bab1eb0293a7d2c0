// test_runner_plan.cpp: the pure host-side pieces under the runner and the gpu actor, without a
// device: step_plan (token order, KV slots, attention pairs, block tables, logits row runs),
// armed_faults (phase matching, after_steps, count, refusal of bad faults) and logits_exchange
// (acquire until gpu_busy, release, row addressing; each slot's logits rows inside one region
// that starts and ends on region_align, the regions disjoint; greedy_token from the summary where
// the step wrote one and its best id is a row id, else from the row's first n_sample entries, the
// lowest id on a tie), finite_copy (copies, and finds inf/NaN of either sign at any
// position) and kv_staging (acquire until
// kv_staging_busy, refused at once with no wait, release, byte ranges, misuse asserts).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>

#include "gpu/logits/kv_staging.hpp"
#include "gpu/logits/logits_exchange.hpp"
#include "gpu/runner/armed_faults.hpp"
#include "gpu/runner/finite_copy.hpp"
#include "gpu/runner/step_plan.hpp"
#include "tests/gpu/test_runner_support.hpp"

namespace ordo::gpu {
namespace {

using testing::make_seq;
using testing::make_step;

TEST(StepPlan, LaysOutTokensSlotsTablesAndRows) {
    step_limits lim{100, 64, 4, 32, 16, 4, 4, 16};
    step s = make_step(9, step_phase::mixed,
                       {make_seq(5, {1, 2, 3}, 0, {7}), make_seq(6, {4}, 5, {2, 3}),
                        make_seq(8, {9, 9}, 2, {11}, false), make_seq(4, {6}, 0, {12})});
    step_plan p;
    ASSERT_TRUE(plan_step(s, lim, p).ok());
    EXPECT_EQ(p.n_tokens, 7u);
    EXPECT_EQ(p.blocks_per_seq, 2u);
    EXPECT_EQ(p.positions, (std::vector<std::int32_t>{0, 1, 2, 5, 2, 3, 0}));
    EXPECT_EQ(p.slots, (std::vector<std::int32_t>{28, 29, 30, 13, 46, 47, 48}));
    EXPECT_EQ(p.attn, (std::vector<std::int32_t>{0, 0, 0, 1, 0, 2, 1, 5, 2, 2, 2, 3, 3, 0}));
    EXPECT_EQ(p.tables, (std::vector<std::int32_t>{7, 0, 2, 3, 11, 0, 12, 0}));
    EXPECT_EQ(p.row_seq_ids, (std::vector<std::uint64_t>{5, 6, 4}));
    ASSERT_EQ(p.runs.size(), 2u);  // tokens 2 and 3 are adjacent; token 6 stands alone
    EXPECT_EQ(p.runs[0].token0, 2u);
    EXPECT_EQ(p.runs[0].n, 2u);
    EXPECT_EQ(p.runs[1].token0, 6u);
    EXPECT_EQ(p.runs[1].row0, 2u);
    EXPECT_EQ(segment_label(s, 8, 15), "mixed#9 seqs=4 layers 8-15");
}

TEST(FaultPlan, MatchesPhaseAfterStepsAndCount) {
    armed_faults f;
    ASSERT_TRUE(f.arm({fault_kind::hang, step_phase::decode, 3, 1, 2, 0}).ok());
    EXPECT_FALSE(f.next(step_phase::prefill).kind);  // other phase: not counted
    EXPECT_FALSE(f.next(step_phase::decode).kind);   // decode #1: after_steps = 1
    step_fault hit = f.next(step_phase::decode);
    EXPECT_EQ(hit.kind, fault_kind::hang);
    EXPECT_EQ(hit.layer, 3);
    EXPECT_EQ(f.next(step_phase::decode).kind, fault_kind::hang);  // count 2
    EXPECT_FALSE(f.next(step_phase::decode).kind);                 // spent
    EXPECT_EQ(f.armed(), 0u);
    EXPECT_FALSE(f.arm({fault_kind::mailbox_refuse, std::nullopt, -1, 0, 1, 0}).ok());
    EXPECT_FALSE(f.arm({fault_kind::hang, static_cast<step_phase>(7), -1, 0, 1, 0}).ok());
    EXPECT_FALSE(f.arm({fault_kind::hang, std::nullopt, -1, 0, 0, 0}).ok());
    for (std::size_t i = 0; i < armed_faults::armed_max; ++i) {
        ASSERT_TRUE(f.arm({fault_kind::nan_logits, std::nullopt, -1, 0, 1, 0}).ok());
    }
    EXPECT_EQ(f.arm({fault_kind::nan_logits, std::nullopt, -1, 0, 1, 0}).err().code,
              "gpu_bad_fault");
}

// step_delay: counted like a failure fault but apart from it (a step may be delayed and fail);
// its delay must be 1..delay_ms_max.
TEST(FaultPlan, StepDelayIsCountedApartFromFailures) {
    armed_faults f;
    ASSERT_TRUE(f.arm({fault_kind::step_delay, step_phase::decode, -1, 1, 2, 250}).ok());
    ASSERT_TRUE(f.arm({fault_kind::nan_logits, step_phase::decode, -1, 1, 1, 0}).ok());
    step_fault s = f.next(step_phase::decode);  // decode #1: after_steps = 1 for both
    EXPECT_EQ(s.delay_ms, 0u);
    EXPECT_FALSE(s.kind);
    s = f.next(step_phase::prefill);  // other phase
    EXPECT_EQ(s.delay_ms, 0u);
    s = f.next(step_phase::decode);
    EXPECT_EQ(s.delay_ms, 250u);
    EXPECT_EQ(s.kind, fault_kind::nan_logits);
    s = f.next(step_phase::decode);
    EXPECT_EQ(s.delay_ms, 250u);
    EXPECT_FALSE(s.kind);
    EXPECT_EQ(f.next(step_phase::decode).delay_ms, 0u);  // spent
    EXPECT_EQ(f.armed(), 0u);
    EXPECT_FALSE(f.arm({fault_kind::step_delay, std::nullopt, -1, 0, 1, 0}).ok());
    EXPECT_FALSE(
        f.arm({fault_kind::step_delay, std::nullopt, -1, 0, 1, armed_faults::delay_ms_max + 1})
            .ok());
}

TEST(LogitsExchange, AcquireUntilBusyThenRelease) {
    logits_exchange x(2, 10);
    std::vector<std::uint32_t> held;
    for (std::uint32_t i = 0; i < logits_exchange::slots_max; ++i) {
        auto s = x.acquire();
        ASSERT_TRUE(s.ok());
        held.push_back(*s);
    }
    auto busy = x.acquire();
    ASSERT_FALSE(busy.ok());
    EXPECT_EQ(busy.err().code, "gpu_busy");
    x.row(held[1], 1)[9] = 4.5f;
    EXPECT_EQ(x.read_row(held[1], 1)[9], 4.5f);
    EXPECT_EQ(x.read_row(held[1], 1).size(), 10u);
    x.release(held[1]);
    EXPECT_FALSE(x.is_held(held[1]));
    EXPECT_EQ(x.held(), logits_exchange::slots_max - 1);
    auto again = x.acquire();
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, held[1]);
    x.release(logits_exchange::no_slot);  // a step without rows: nothing to release
    EXPECT_DEATH(x.release(logits_exchange::slots_max), "out of range");
}

TEST(LogitsExchange, EachSlotsRowsLieInOneAlignedRegion) {
    // 3 rows of 1000 floats (12000 B): each region padded to one region_align.
    logits_exchange x(3, 1000);
    std::vector<std::uint32_t> slots;
    for (std::uint32_t i = 0; i < logits_exchange::slots_max; ++i) slots.push_back(*x.acquire());
    const char* prev_end = nullptr;
    for (std::uint32_t slot = 0; slot < logits_exchange::slots_max; ++slot) {
        SCOPED_TRACE("slot " + std::to_string(slot));
        std::span<float> region = x.logits_region(slot);
        const auto start = reinterpret_cast<std::uintptr_t>(region.data());
        EXPECT_EQ(start % logits_exchange::region_align, 0u);
        EXPECT_EQ(region.size_bytes() % logits_exchange::region_align, 0u);
        EXPECT_GE(region.size(), 3u * 1000u);
        EXPECT_LT(region.size_bytes(), 3u * 1000u * 4u + logits_exchange::region_align);
        if (prev_end != nullptr) {
            EXPECT_GE(reinterpret_cast<const char*>(region.data()), prev_end) << "regions overlap";
        }
        prev_end = reinterpret_cast<const char*>(region.data() + region.size());
        for (std::uint32_t r = 0; r < 3; ++r) {
            EXPECT_EQ(x.row(slot, r), region.data() + r * 1000) << "row " << r;
        }
        EXPECT_EQ(region[0], 0.0f) << "zeroed";
    }
    EXPECT_DEATH(x.logits_region(logits_exchange::slots_max), "out of range");
}

TEST(LogitsExchange, GreedyTokenFromTheSummaryOrTheRow) {
    logits_exchange x(1, 6);
    auto s = x.acquire();
    ASSERT_TRUE(s.ok());
    float* row = x.row(*s, 0);
    const float logits[] = {0.5f, 2.0f, -1.0f, 2.0f, 0.0f, 9.0f};  // 9 past n_sample = 5
    std::copy(std::begin(logits), std::end(logits), row);
    std::uint32_t* sum = x.summary_row(*s, 0);
    sum[logits_exchange::summary_count_word] = 1;
    sum[logits_exchange::summary_best_word] = 3;  // what a summary says, right or not
    EXPECT_EQ(x.greedy_token(*s, 0, false, 5), 1) << "the row: the lower of two equal maxima";
    EXPECT_EQ(x.greedy_token(*s, 0, false, 6), 5);
    EXPECT_EQ(x.greedy_token(*s, 0, true, 5), 3) << "the summary, without a pass over the row";
    sum[logits_exchange::summary_best_word] = 5;  // outside the 5 ids sampled
    EXPECT_EQ(x.greedy_token(*s, 0, true, 5), 1);
    sum[logits_exchange::summary_count_word] = 0;  // no candidates
    EXPECT_EQ(x.greedy_token(*s, 0, true, 6), 5);
    x.release(*s);
}

TEST(FiniteCopy, CopiesAndFindsEveryNonFiniteValue) {
    std::vector<float> src(1000), dst(1000);
    for (std::size_t i = 0; i < src.size(); ++i) src[i] = float(i) * 0.25f - 100.0f;
    src[7] = std::numeric_limits<float>::max();
    src[8] = std::numeric_limits<float>::denorm_min();
    EXPECT_TRUE(copy_all_finite(dst.data(), src.data(), src.size()));
    EXPECT_EQ(dst, src);
    EXPECT_TRUE(all_finite(dst.data(), dst.size()));
    const float bad[] = {std::numeric_limits<float>::infinity(),
                         -std::numeric_limits<float>::infinity(),
                         std::numeric_limits<float>::quiet_NaN(), -std::nanf("")};
    for (std::size_t at : {std::size_t{0}, std::size_t{513}, src.size() - 1}) {
        for (float b : bad) {
            std::vector<float> v = src;
            v[at] = b;
            EXPECT_FALSE(copy_all_finite(dst.data(), v.data(), v.size())) << at << " " << b;
            EXPECT_FALSE(all_finite(v.data(), v.size())) << at << " " << b;
            EXPECT_EQ(std::memcmp(dst.data(), v.data(), v.size() * sizeof(float)), 0);
        }
    }
    EXPECT_TRUE(copy_all_finite(dst.data(), bad, 0)) << "nothing to copy";
}

TEST(KvStaging, AcquireUntilBusyRefusesAtOnceThenRelease) {
    kv_staging x(3, 100);
    std::vector<std::uint32_t> held;
    for (std::uint32_t i = 0; i < x.slots(); ++i) {
        auto s = x.acquire();
        ASSERT_TRUE(s.ok());
        held.push_back(*s);
    }
    // Exhausted: refused, and at once (a blocking acquire would wait for a release forever).
    auto t0 = std::chrono::steady_clock::now();
    auto busy = x.acquire();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(100));
    ASSERT_FALSE(busy.ok());
    EXPECT_EQ(busy.err().code, "kv_staging_busy");
    x.bytes(held[2], 100)[99] = 42;
    EXPECT_EQ(x.read(held[2], 100)[99], 42);
    EXPECT_EQ(x.read(held[2], 10).size(), 10u);
    x.bytes(held[1], 1)[0] = 7;
    EXPECT_EQ(x.read(held[2], 1)[0], 0);  // slots do not overlap
    x.release(held[2]);
    EXPECT_FALSE(x.is_held(held[2]));
    EXPECT_EQ(x.held(), 2u);
    auto again = x.acquire();
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, held[2]);
    x.release(kv_staging::no_slot);
    EXPECT_FALSE(x.is_held(kv_staging::no_slot));
    EXPECT_DEATH(x.bytes(held[0], 101), "out of bounds");
    EXPECT_DEATH(x.release(3), "out of range");
    x.release(held[0]);
    EXPECT_DEATH(x.release(held[0]), "not held");
    EXPECT_DEATH(kv_staging(0, 1), "slots must be");
}

}  // namespace
}  // namespace ordo::gpu
