// prng.hpp: the sampler's pseudo-random generator, owned by one sampler (one request).
//
// Sampling must give the same tokens for the same seed on every platform and compiler, so we
// do not use <random>'s distributions (their output is implementation-defined). xoshiro256**
// (Blackman & Vigna) is seeded by expanding the 64-bit seed with splitmix64, and a uniform
// double in [0, 1) is built from the top 53 bits of one output: every step is plain integer
// arithmetic with a fully specified result. Used by sampling.cpp and by tests.
#pragma once

#include <array>
#include <cstdint>

#include "actors/runtime/splitmix64.hpp"

namespace ordo::sched {

using ordo::splitmix64_next;

class xoshiro256ss {
public:
    explicit xoshiro256ss(uint64_t seed) {
        uint64_t sm = seed;
        // splitmix64 never yields four zero words from one seed, so the state is never all-zero
        // (the one state xoshiro cannot leave).
        for (auto& word : _s) word = splitmix64_next(sm);
    }

    // A generator that continues from `state` (state()'s words; never all zero).
    static xoshiro256ss from_state(const std::array<uint64_t, 4>& state) {
        xoshiro256ss g(0);
        for (int i = 0; i < 4; i++) g._s[i] = state[size_t(i)];
        return g;
    }
    std::array<uint64_t, 4> state() const { return {_s[0], _s[1], _s[2], _s[3]}; }

    uint64_t next() {
        const uint64_t result = rotl(_s[1] * 5, 7) * 9;
        const uint64_t t = _s[1] << 17;
        _s[2] ^= _s[0];
        _s[3] ^= _s[1];
        _s[1] ^= _s[2];
        _s[0] ^= _s[3];
        _s[2] ^= t;
        _s[3] = rotl(_s[3], 45);
        return result;
    }

    // Uniform in [0, 1): the top 53 bits scaled by 2^-53, exact in a double.
    double next_unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

private:
    static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

    uint64_t _s[4];
};

}  // namespace ordo::sched
