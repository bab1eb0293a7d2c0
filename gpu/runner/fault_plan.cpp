// fault_plan.cpp: see fault_plan.hpp.
#include "gpu/runner/fault_plan.hpp"

#include <algorithm>

namespace ordo::gpu {

status fault_plan::arm(const inject_fault& f) {
    fault_kind kind = f.kind == "device_lost"  ? fault_kind::device_lost
                      : f.kind == "hang"       ? fault_kind::hang
                      : f.kind == "nan_logits" ? fault_kind::nan_logits
                                               : fault_kind::none;
    if (kind == fault_kind::none) {
        return make_error("gpu_bad_fault", "fault kind '" + f.kind +
                                               "' is not device_lost, hang or nan_logits");
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
        if (a.seen <= a.f.after_steps || out.kind != fault_kind::none) continue;
        out = {a.kind, a.f.layer};
        a.fired++;
    }
    std::erase_if(_armed, [](const armed_fault& a) { return a.fired >= a.f.count; });
    return out;
}

}  // namespace ordo::gpu
