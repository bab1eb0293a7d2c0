// armed_faults.hpp: the gpu actor's armed faults (inject_fault messages) and the rule that
// matches them to steps. Pure logic, unit-tested directly; the actor turns a match into a
// runner step_fault, which fails the step through the real path (runner.hpp). Which faults the
// config's [fault] plan arms is decided elsewhere (scheduler/seeded_fault_plan.hpp).
//
// Rule: a fault counts the steps whose phase matches (no phase = any) from the moment it is
// armed; it fires on matching steps number after_steps + 1 .. after_steps + count, then is
// spent. Several faults may be armed; the first armed one that fires wins a step. Delays
// (step_delay) and failures (the other kinds) are counted apart: the first armed delay that
// fires sets the step's delay_ms, the first failure its kind, so a step may be both delayed and
// failed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "actors/runtime/result.hpp"
#include "gpu/gpu_msgs.hpp"
#include "gpu/runner/runner.hpp"

namespace ordo::gpu {

class armed_faults {
public:
    // Armed faults at once, at most (the harness arms one or two).
    static constexpr std::size_t armed_max = 8;
    // Steps one fault may fail, at most.
    static constexpr std::uint32_t count_max = 1000;
    // A step_delay's delay, at most: well below the 60 s slack of the scheduler's step
    // backstop (tools/server/server.cpp), which counts from the step's send, so it must not
    // fire for a delayed step the gpu actor still answers (net/ops.cpp bounds the op the same).
    static constexpr std::uint32_t delay_ms_max = 10000;

    // Errors (gpu_bad_fault): a kind not the gpu's or an unknown phase, count 0 or above count_max,
    // a step_delay whose delay_ms is 0 or above delay_ms_max, armed_max reached.
    status arm(const inject_fault& f);
    // The fault this step suffers (no kind when none fires); advances every matching fault.
    step_fault next(step_phase phase);
    std::size_t armed() const { return _armed.size(); }

private:
    struct armed_fault {
        inject_fault f;
        std::uint32_t seen = 0;   // matching steps so far
        std::uint32_t fired = 0;  // steps failed so far
    };
    std::vector<armed_fault> _armed;
};

}  // namespace ordo::gpu
