// armed_faults.cpp: see armed_faults.hpp.
#include "gpu/runner/armed_faults.hpp"

#include <algorithm>

namespace ordo::gpu {

status armed_faults::arm(const inject_fault& f) {
    if (!is_gpu_fault(f.kind)) {
        return make_error("gpu_bad_fault", "fault kind '" + std::string(enum_name(f.kind)) +
                                               "' is not device_lost, hang, nan_logits or "
                                               "step_delay");
    }
    const bool delay = f.kind == fault_kind::step_delay;
    if (delay && (f.delay_ms == 0 || f.delay_ms > delay_ms_max)) {
        return make_error("gpu_bad_fault",
                          "step_delay delay_ms must be 1.." + std::to_string(delay_ms_max));
    }
    if (f.phase && !enum_valid(*f.phase)) {
        return make_error(
            "gpu_bad_fault",
            "fault phase " + std::to_string(static_cast<int>(*f.phase)) + " is unknown");
    }
    if (f.count == 0 || f.count > count_max) {
        return make_error("gpu_bad_fault", "fault count must be 1.." + std::to_string(count_max));
    }
    if (_armed.size() >= armed_max) {
        return make_error("gpu_bad_fault", std::to_string(armed_max) + " faults already armed");
    }
    _armed.push_back({f, 0, 0});
    return {};
}

step_fault armed_faults::next(step_phase phase) {
    step_fault out;
    for (armed_fault& a : _armed) {
        if (a.f.phase && *a.f.phase != phase) continue;
        a.seen++;
        if (a.seen <= a.f.after_steps) continue;
        if (a.f.kind == fault_kind::step_delay) {
            if (out.delay_ms != 0) continue;
            out.delay_ms = a.f.delay_ms;
        } else {
            if (out.kind) continue;
            out.kind = a.f.kind;
            out.layer = a.f.layer;
        }
        a.fired++;
    }
    std::erase_if(_armed, [](const armed_fault& a) { return a.fired >= a.f.count; });
    return out;
}

}  // namespace ordo::gpu
