// seeded_fault_plan.hpp: the decisions of a [fault] plan (etc/ordo.toml, docs/protocol.md "A
// fault plan in the config") — which gpu step gets a planned fault, of which kind. Pure logic,
// no actor: the scheduler actor consults it once per step it sends and arms what it returns
// through the same path as the `fault` op (scheduler_actor::arm_fault). Not the faults an actor
// holds armed (gpu/runner/armed_faults.hpp): this decides which to arm. Unit-tested in
// tests/scheduler/seeded_fault_plan_test.cpp.
//
// Replay. The draw for step ordinal k is a function of (seed, k) only: a splitmix64 stream
// seeded with seed ^ splitmix64(k) gives, in order, the "fire?" word (fire when it is 0 modulo
// every_steps: probability 1/every_steps, bias below 2^-40 for every_steps <= 10^6), the kind
// word (an entry of `kinds`, uniformly) and the pick word (left to the kind: which actor, how
// many refusals). No state carries from one step to the next, so the same seed and the same
// sequence of step ids fire the same faults however the steps are timed. The one piece of
// state is the budget: at most faults_max faults fire in the plan's life; after that it is
// spent and next() returns nothing (so a replay matches while it keeps to the same steps).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "actors/runtime/fault_kind.hpp"

namespace ordo::sched {

class seeded_fault_plan {
public:
    struct options {
        std::uint64_t seed = 0;
        std::vector<fault_kind> kinds;   // drawn uniformly by entry; empty = no plan
        std::uint32_t every_steps = 50;  // >= 1: mean steps between faults
        std::uint32_t faults_max = 100;  // faults fired in the plan's life, at most
    };
    struct decision {
        fault_kind kind = fault_kind::device_lost;
        std::uint64_t pick = 0;  // uniform 64 bits for the kind's own choices
        bool operator==(const decision&) const = default;
    };

    seeded_fault_plan() = default;  // no plan
    explicit seeded_fault_plan(options o);

    // True when the config gave kinds to draw from.
    bool active() const { return !_opt.kinds.empty(); }
    // What step ordinal k draws, ignoring the budget: a function of (seed, k) only.
    std::optional<decision> draw(std::uint64_t k) const;
    // draw(k) within the budget; a decision returned counts as fired. Nothing once spent.
    std::optional<decision> next(std::uint64_t k);
    // A decision next() returned was not armed after all (its target refused it): it no longer
    // counts as fired, and is counted as refused instead.
    void not_fired(fault_kind kind);

    const options& opts() const { return _opt; }
    std::uint64_t fired() const { return _fired; }
    std::uint64_t refused() const { return _refused; }
    std::uint64_t fired(fault_kind kind) const { return _by_kind[static_cast<std::size_t>(kind)]; }
    // The budget is used up: no more faults fire.
    bool spent() const { return active() && _fired >= _opt.faults_max; }

private:
    options _opt;
    std::uint64_t _fired = 0;
    std::uint64_t _refused = 0;
    std::array<std::uint64_t, enum_count<fault_kind>> _by_kind{};
};

}  // namespace ordo::sched
