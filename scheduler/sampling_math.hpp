// sampling_math.hpp: the vocabulary-wide arithmetic of sampling.cpp (exp, sum, max).
//
// A sampler runs over the whole vocabulary (32000 entries for Llama) for every generated token
// of every sequence, so these loops matter. The exponential is our own: plain float operations
// (no libm call), so the compiler vectorises the loop, and every platform computes the same
// bits (libm exp implementations may differ in the last place). Sums use eight partial double
// accumulators in a fixed order: fast, accurate, and the same result everywhere.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <span>

namespace ordo::sched::math {

// exp(x) for x <= 0 (results below 2^-126 flush to about 1e-38). Relative error below 1e-7:
// x = k ln2 + r with |r| <= ln2 / 2, exp(r) by its Taylor series to degree 7 (truncation error
// |r|^8 / 8! < 6e-9), then scaled by 2^k through the exponent bits.
inline float exp_nonpositive(float x) {
    constexpr float log2e = 1.44269504088896341f;
    constexpr float ln2_hi = 0.693359375f;  // ln 2 split so k * ln2_hi is exact
    constexpr float ln2_lo = -2.12194440054690583e-4f;
    constexpr float round_magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to integer
    x = x < -87.0f ? -87.0f : x;
    const float kf = (x * log2e + round_magic) - round_magic;
    const float r = (x - kf * ln2_hi) - kf * ln2_lo;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t k = static_cast<int32_t>(kf);
    return p * std::bit_cast<float>(static_cast<uint32_t>(k + 127) << 23);
}

// out[i] = exp((in[i] - shift) * scale), with every in[i] <= shift and scale > 0.
inline void exp_shifted(std::span<const float> in, float shift, float scale, std::span<float> out) {
    const size_t n = in.size();
    const float* src = in.data();
    float* dst = out.data();
    for (size_t i = 0; i < n; i++) dst[i] = exp_nonpositive((src[i] - shift) * scale);
}

inline double sum(std::span<const float> v) {
    constexpr size_t lanes = 8;
    double acc[lanes] = {};
    size_t i = 0;
    for (; i + lanes <= v.size(); i += lanes) {
        for (size_t l = 0; l < lanes; l++) acc[l] += v[i + l];
    }
    for (; i < v.size(); i++) acc[0] += v[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Eight independent running maxima (max is exact and order-free, so this equals a plain
// scan) break the loop-carried dependency; the compiler vectorises it.
inline float max_value(std::span<const float> v) {
    constexpr size_t lanes = 8;
    float m[lanes];
    for (size_t l = 0; l < lanes; l++) m[l] = v[0];
    size_t i = 0;
    for (; i + lanes <= v.size(); i += lanes) {
        for (size_t l = 0; l < lanes; l++) m[l] = v[i + l] > m[l] ? v[i + l] : m[l];
    }
    for (; i < v.size(); i++) m[0] = v[i] > m[0] ? v[i] : m[0];
    for (size_t l = 1; l < lanes; l++) m[0] = m[l] > m[0] ? m[l] : m[0];
    return m[0];
}

}  // namespace ordo::sched::math
