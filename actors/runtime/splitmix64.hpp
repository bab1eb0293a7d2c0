// splitmix64.hpp: Steele, Lea & Flood's splitmix64, the one copy every seeded generator in the
// tree starts from (the sampler's xoshiro seeding, the reference sampler, the synthetic model's
// weights, ordo-load's request plans). Plain integer arithmetic with a fully specified result,
// so a seed gives the same numbers on every platform and compiler (std::'s distributions do
// not). Header-only; used from any thread (no shared state).
#pragma once

#include <cstdint>

namespace ordo {

// The increment of splitmix64's counter (2^64 / golden ratio).
inline constexpr std::uint64_t splitmix64_gamma = 0x9e3779b97f4a7c15ull;

// splitmix64's output function: a good 64-bit mixer of any counter value.
constexpr std::uint64_t splitmix64_mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// One step of the generator: advances `state` and returns the next output.
constexpr std::uint64_t splitmix64_next(std::uint64_t& state) {
    state += splitmix64_gamma;
    return splitmix64_mix(state);
}

}  // namespace ordo
