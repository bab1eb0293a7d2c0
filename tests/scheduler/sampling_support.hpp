// sampling_support.hpp: what the sampler's tests share: a sampler from valid parameters, and
// seeded random logits.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "scheduler/sampling.hpp"

namespace ordo::sched::testing {

inline sampler make(const sampling_params& p) {
    auto s = sampler::create(p);
    EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.err().message);
    return std::move(*s);
}

// n logits uniform in [-scale, scale], from the seeded generator.
inline std::vector<float> random_logits(size_t n, uint64_t seed, float scale) {
    xoshiro256ss rng(seed);
    std::vector<float> l(n);
    for (auto& x : l) x = static_cast<float>((rng.next_unit() * 2.0 - 1.0) * scale);
    return l;
}

}  // namespace ordo::sched::testing
