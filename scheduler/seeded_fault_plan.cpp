// seeded_fault_plan.cpp: see seeded_fault_plan.hpp.
#include "scheduler/seeded_fault_plan.hpp"

#include <cassert>

#include "scheduler/prng.hpp"

namespace ordo::sched {

seeded_fault_plan::seeded_fault_plan(options o) : _opt(std::move(o)) {
    assert(_opt.every_steps >= 1);
}

std::optional<seeded_fault_plan::decision> seeded_fault_plan::draw(std::uint64_t k) const {
    if (!active()) return std::nullopt;
    std::uint64_t at_k = k;
    std::uint64_t stream = _opt.seed ^ splitmix64_next(at_k);
    const std::uint64_t fire = splitmix64_next(stream);
    if (fire % _opt.every_steps != 0) return std::nullopt;
    const std::uint64_t which = splitmix64_next(stream);
    decision d;
    d.kind = _opt.kinds[which % _opt.kinds.size()];
    d.pick = splitmix64_next(stream);
    return d;
}

std::optional<seeded_fault_plan::decision> seeded_fault_plan::next(std::uint64_t k) {
    if (spent()) return std::nullopt;
    auto d = draw(k);
    if (!d) return std::nullopt;
    _fired++;
    _by_kind[static_cast<std::size_t>(d->kind)]++;
    return d;
}

void seeded_fault_plan::not_fired(fault_kind kind) {
    auto& n = _by_kind[static_cast<std::size_t>(kind)];
    assert(n > 0 && _fired > 0);  // only a decision next() returned is taken back
    if (n == 0 || _fired == 0) return;
    n--;
    _fired--;
    _refused++;
}

}  // namespace ordo::sched
