// fp16.hpp: IEEE 754 binary16 <-> binary32 conversion, bit-exact, no hardware dependence.
//
// Owns the one definition of half-precision conversion used by quantization (model/quant.*),
// the CPU reference forward pass, the synthetic model writer and the gpu kernel tests. It is
// header-only and pure: every function is a total function of its input bits.
//
// f32_to_f16 rounds to nearest, ties to even, exactly like a hardware conversion: finite values
// too large for half become +-inf, values too small become signed zero or a subnormal, NaN stays
// NaN (quiet, payload truncated but never turned into inf). f16_to_f32 is exact (every half is
// representable as a float).
#pragma once

#include <bit>
#include <cstdint>

namespace ordo::model {

using f16_bits = std::uint16_t;

inline f16_bits f32_to_f16(float value) {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
    const std::uint32_t sign = (x >> 16) & 0x8000u;
    const std::uint32_t exp = (x >> 23) & 0xffu;
    std::uint32_t mant = x & 0x7fffffu;

    if (exp == 0xffu) {
        // inf stays inf; NaN keeps its top payload bits and is forced quiet so it stays NaN.
        if (mant == 0) return static_cast<f16_bits>(sign | 0x7c00u);
        return static_cast<f16_bits>(sign | 0x7e00u | (mant >> 13));
    }
    // Re-bias the exponent: float bias 127, half bias 15.
    const int e = static_cast<int>(exp) - 127 + 15;
    if (e >= 31) return static_cast<f16_bits>(sign | 0x7c00u);  // >= 2^16: overflows to inf
    if (e <= 0) {
        // Result is a half subnormal (or zero). Values below 2^-25 round to zero; 2^-25 itself
        // is a tie between 0 and the smallest subnormal and goes to the even one (0).
        if (e < -10) return static_cast<f16_bits>(sign);
        mant |= 0x800000u;         // make the implicit leading bit explicit
        const int shift = 14 - e;  // express the value in units of 2^-24 (smallest subnormal)
        std::uint32_t h = mant >> shift;
        const std::uint32_t rem = mant & ((1u << shift) - 1u);
        const std::uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1u))) h++;  // may carry into the smallest normal
        return static_cast<f16_bits>(sign | h);
    }
    std::uint32_t h = (static_cast<std::uint32_t>(e) << 10) | (mant >> 13);
    const std::uint32_t rem = mant & 0x1fffu;
    // A carry out of the mantissa correctly bumps the exponent (and 65520.0 becomes inf).
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return static_cast<f16_bits>(sign | h);
}

inline float f16_to_f32(f16_bits h) {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t exp = (h >> 10) & 0x1fu;
    const std::uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        // Zero or subnormal: mant * 2^-24, exact in float.
        const float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
    return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

}  // namespace ordo::model
