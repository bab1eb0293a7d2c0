// finite_copy.hpp: the host's check that a step's output holds no inf or NaN (an exponent field
// of all ones), alone or while copying it out of the readback buffer. Branch-free integer
// scans the compiler vectorises. Used by the runner (the logits rows, copied and checked in one
// pass) and the gpu actor (the pooled hidden rows).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ordo::gpu {

namespace detail {
inline std::uint32_t non_finite_bit(float v) {
    constexpr std::uint32_t exponent = 0x7f800000u;
    std::uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    return static_cast<std::uint32_t>((bits & exponent) == exponent);
}
}  // namespace detail

// Whether every float of v[0, n) is finite (std::isfinite one by one took 2.5x as long).
inline bool all_finite(const float* v, std::size_t n) {
    std::uint32_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) bad |= detail::non_finite_bit(v[i]);
    return bad == 0;
}

// dst[0, n) = src[0, n), and whether every float is finite: one pass over the rows instead of
// a copy and a scan (64 rows of a 128k vocabulary, this VM: 2.3-2.5 ms against 3.5-5.9 ms,
// gpu/PERF.md session 22). dst and src do not overlap.
inline bool copy_all_finite(float* __restrict dst, const float* __restrict src, std::size_t n) {
    std::uint32_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
        const float v = src[i];
        bad |= detail::non_finite_bit(v);
        dst[i] = v;
    }
    return bad == 0;
}

}  // namespace ordo::gpu
