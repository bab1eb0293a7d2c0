// fault_plan.cpp: see fault_plan.hpp.
#include "gpu/runner/fault_plan.hpp"

#include <algorithm>

namespace ordo::gpu {

status fault_plan::arm(const inject_fault& f) {
    fault_kind kind = f.kind == "device_lost"  ? fault_kind::device_lost
                      : f.kind == "hang"       ? fault_kind::hang
                      : f.kind == "nan_logits" ? fault_kind::nan_logits
                                               : fault_kind::none;
    const bool delay = f.kind == "step_delay";
    if (kind == fault_kind::none && !delay) {
        return make_error("gpu_bad_fault", "fault kind '" + f.kind +
                                               "' is not device_lost, hang, nan_logits or "
                                               "step_delay");
    }
    if (delay && (f.delay_ms == 0 || f.delay_ms > delay_ms_max)) {
        return make_error("gpu_bad_fault",
                          "step_delay delay_ms must be 1.." + std::to_string(delay_ms_max));
    }
    if (!f.phase.empty() && f.phase != "prefill" && f.phase != "decode" && f.phase != "mixed") {
        return make_error("gpu_bad_fault", "fault phase '" + f.phase + "' is unknown");
    }
    if (f.count == 0 || f.count > count_max) {
        return make_error("gpu_bad_fault", "fault count must be 1.." + std::to_string(count_max));
    }
    if (_armed.size() >= armed_max) {
        return make_error("gpu_bad_fault", std::to_string(armed_max) + " faults already armed");
    }
    _armed.push_back({f, kind, 0, 0});
    return {};
}

step_fault fault_plan::next(const std::string& phase) {
    step_fault out;
    for (armed_fault& a : _armed) {
        if (!a.f.phase.empty() && a.f.phase != phase) continue;
        a.seen++;
        if (a.seen <= a.f.after_steps) continue;
        if (a.kind == fault_kind::none) {  // step_delay
            if (out.delay_ms != 0) continue;
            out.delay_ms = a.f.delay_ms;
        } else {
            if (out.kind != fault_kind::none) continue;
            out.kind = a.kind;
            out.layer = a.f.layer;
        }
        a.fired++;
    }
    std::erase_if(_armed, [](const armed_fault& a) { return a.fired >= a.f.count; });
    return out;
}

}  // namespace ordo::gpu
