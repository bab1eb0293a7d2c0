// seeded_fault_plan_test.cpp: checks the [fault] plan's decisions
// (scheduler/seeded_fault_plan.hpp) directly, without an actor: the draw for a step is a
// function of (seed, step) only — the same seed gives the same decisions for steps 0..10000
// whatever order they are asked in, another seed gives others; the rate of faults is close to
// 1/every_steps over many steps (a loose bound; deterministic for the fixed seeds used); every kind
// drawn is from the list, each of them is drawn, and a kind listed twice is drawn about twice as
// often; plan_faults_max bounds what fires (0 = spent at once), after which the plan is spent; a
// fault taken back (not_fired) frees its budget and counts as refused; no kinds = no plan.
#include "scheduler/seeded_fault_plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <vector>

namespace {

using ordo::fault_kind;
using ordo::sched::seeded_fault_plan;

constexpr std::uint64_t steps_n = 10001;  // step ordinals 0..10000

seeded_fault_plan make_plan(std::uint64_t seed, std::vector<fault_kind> kinds, std::uint32_t every,
                            std::uint32_t max = 1000000) {
    return seeded_fault_plan(seeded_fault_plan::options{seed, std::move(kinds), every, max});
}

std::vector<std::optional<seeded_fault_plan::decision>> draws(const seeded_fault_plan& p,
                                                              std::uint64_t n) {
    std::vector<std::optional<seeded_fault_plan::decision>> out;
    for (std::uint64_t k = 0; k < n; ++k) out.push_back(p.draw(k));
    return out;
}

const std::vector<fault_kind> three = {fault_kind::nan_logits, fault_kind::step_delay,
                                       fault_kind::mailbox_refuse};

TEST(seeded_fault_plan, the_same_seed_draws_the_same_faults_in_any_order) {
    const seeded_fault_plan a = make_plan(42, three, 7);
    const seeded_fault_plan b = make_plan(42, three, 7);
    const auto first = draws(a, steps_n);
    EXPECT_EQ(first, draws(b, steps_n));
    // Backwards, and through next() on a fresh plan: a step's draw does not depend on which
    // steps were asked before it.
    for (std::uint64_t k = steps_n; k-- > 0;) EXPECT_EQ(b.draw(k), first[k]) << "step " << k;
    seeded_fault_plan c = make_plan(42, three, 7);
    for (std::uint64_t k = 0; k < steps_n; ++k) EXPECT_EQ(c.next(k), first[k]) << "step " << k;
}

TEST(seeded_fault_plan, another_seed_draws_other_faults) {
    const auto a = draws(make_plan(1, three, 7), steps_n);
    const auto b = draws(make_plan(2, three, 7), steps_n);
    EXPECT_NE(a, b);
    // Not merely shifted or thinned: the steps that fire differ in many places.
    std::size_t differ = 0;
    for (std::uint64_t k = 0; k < steps_n; ++k) differ += a[k].has_value() != b[k].has_value();
    EXPECT_GT(differ, 1000u);
}

TEST(seeded_fault_plan, fires_at_a_rate_close_to_one_in_every_steps) {
    constexpr std::uint64_t n = 200000;
    for (const std::uint32_t every : {1u, 2u, 10u, 50u, 1000u}) {
        const seeded_fault_plan p = make_plan(7, three, every);
        std::uint64_t fired = 0;
        for (std::uint64_t k = 0; k < n; ++k) fired += p.draw(k).has_value();
        const double expected = double(n) / every;
        // Loose: the standard deviation is below sqrt(expected), at most 448 here.
        EXPECT_NEAR(double(fired), expected, std::max(5.0, 0.1 * expected)) << "every " << every;
    }
}

TEST(seeded_fault_plan, draws_only_listed_kinds_each_of_them_and_weights_repeats) {
    const std::vector<fault_kind> kinds = {fault_kind::hang, fault_kind::kv_eio, fault_kind::hang};
    const seeded_fault_plan p = make_plan(99, kinds, 1);
    std::map<fault_kind, std::uint64_t> seen;
    for (std::uint64_t k = 0; k < 30000; ++k) {
        auto d = p.draw(k);
        ASSERT_TRUE(d.has_value()) << "every_steps 1 fires on every step";
        seen[d->kind]++;
    }
    ASSERT_EQ(seen.size(), 2u);  // hang and kv_eio, nothing else
    // hang is listed twice: about 20000 against 10000.
    EXPECT_NEAR(double(seen[fault_kind::hang]) / double(seen[fault_kind::kv_eio]), 2.0, 0.2);
}

TEST(seeded_fault_plan, the_pick_word_varies_between_faults) {
    const seeded_fault_plan p = make_plan(5, {fault_kind::mailbox_refuse}, 1);
    std::map<std::uint64_t, int> by_actor;  // pick modulo 4, as the scheduler chooses an actor
    for (std::uint64_t k = 0; k < 4000; ++k) by_actor[p.draw(k)->pick % 4]++;
    ASSERT_EQ(by_actor.size(), 4u);
    for (const auto& [actor, n] : by_actor) EXPECT_NEAR(n, 1000, 150) << "actor " << actor;
}

TEST(seeded_fault_plan, faults_max_bounds_what_fires_then_the_plan_is_spent) {
    seeded_fault_plan p = make_plan(3, three, 2, 25);
    EXPECT_FALSE(p.spent());
    std::uint64_t returned = 0, last_fire = 0;
    for (std::uint64_t k = 0; k < steps_n; ++k) {
        if (p.next(k)) {
            returned++;
            last_fire = k;
        }
    }
    EXPECT_EQ(returned, 25u);
    EXPECT_EQ(p.fired(), 25u);
    EXPECT_TRUE(p.spent());
    std::uint64_t by_kind = 0;
    for (fault_kind k : three) by_kind += p.fired(k);
    EXPECT_EQ(by_kind, 25u);
    // The 25 that fired are the first 25 the draws give.
    std::uint64_t drawn = 0;
    for (std::uint64_t k = 0; k <= last_fire; ++k) drawn += p.draw(k).has_value();
    EXPECT_EQ(drawn, 25u);

    seeded_fault_plan none = make_plan(3, three, 1, 0);
    EXPECT_TRUE(none.spent());
    EXPECT_FALSE(none.next(0).has_value());
    EXPECT_EQ(none.fired(), 0u);
}

TEST(seeded_fault_plan, a_fault_taken_back_frees_its_budget_and_counts_as_refused) {
    seeded_fault_plan p = make_plan(11, {fault_kind::nan_logits}, 1, 2);
    ASSERT_TRUE(p.next(1));
    ASSERT_TRUE(p.next(2));
    EXPECT_TRUE(p.spent());
    EXPECT_FALSE(p.next(3));
    p.not_fired(fault_kind::nan_logits);
    EXPECT_FALSE(p.spent());
    EXPECT_EQ(p.fired(), 1u);
    EXPECT_EQ(p.fired(fault_kind::nan_logits), 1u);
    EXPECT_EQ(p.refused(), 1u);
    EXPECT_TRUE(p.next(4));
    EXPECT_TRUE(p.spent());
}

TEST(seeded_fault_plan, no_kinds_is_no_plan) {
    seeded_fault_plan p;
    EXPECT_FALSE(p.active());
    EXPECT_FALSE(p.spent());
    for (std::uint64_t k = 0; k < 100; ++k) EXPECT_FALSE(p.next(k));
    seeded_fault_plan q = make_plan(1, {}, 1, 10);
    EXPECT_FALSE(q.active());
    EXPECT_FALSE(q.next(0));
}

}  // namespace
