// quant.hpp: row (de)quantization for every weight type the CPU reference computes with
// (ggml_types.hpp: is_supported): F32, F16, BF16, the 32-element block types Q4_0, Q4_1, Q5_0,
// Q5_1, Q8_0 and the 256-element K types Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, bit-compatible with
// GGUF/ggml. The block layouts and decoding formulas are written out in ggml_types.hpp.
//
// Owns the meaning of weight bytes. Users: the CPU reference forward pass (model/cpu_ops,
// model/reference), the synthetic model generator (model/synth, `ordo-model mk`), and the gpu
// kernel tests, which check every Vulkan dequant/matvec kernel against these functions.
// Pure functions, no state, no allocation.
//
// Decoding reproduces ggml's dequantize_row_* bit for bit (tests/model/test_quant_ggml.cpp
// compares against ggml's own output). That holds whatever the evaluation order or fused
// multiply-adds a compiler picks: every product in the formulas (ggml_types.hpp) is exact in
// float, an f16 scale's 11 significant bits times integers of at most 13 bits (Q6_K: |sc * q|
// <= 128 * 32), so the one rounding is the final addition of the min or offset, which ggml
// rounds the same way.
//
// Encoding is ordo's own (not ggml's search-based quantizers): each scheme makes the block's
// grid cover its values, so every element lands within a stated bound. Below, L is the largest
// quant, amax the largest |x| of a block (or sub-block), range = max - min, and "f16 up/down"
// means the scale is stored rounded up/down to the next half so the grid still covers the
// values. Bounds ignore float rounding (a few ulps of amax), which the tests allow for.
//   Q8_0  d = amax / 127, q = round(x / d). |x - x'| <= d/2 plus the f16 rounding of d (2^-11
//         of amax).
//   Q4_0  the largest-magnitude element m (sign kept) sets d = m / -8, so it maps exactly to
//         quant 0; q = clamp(floor(x / d + 8.5), 0, 15). |x - x'| <= |d| (the clamp at 15 can
//         cost a full step for values of the opposite sign to m).
//   Q5_0  as Q4_0 with 32 levels: d = m / -16 (f16), q = clamp(round(x / d) + 16, 0, 31).
//         |x - x'| <= |d| = amax / 16 (up to the f16 rounding of d).
//   Q4_1, Q5_1 (L = 15, 31): m = min (f16 down), d = (max - m) / L (f16 up),
//         q = round((x - m) / d). |x - x'| <= d / 2, about range / (2L).
//   Q2_K, Q4_K, Q5_K (asymmetric; sub-blocks of 16, 32, 32 elements; L = 3, 15, 31; scales and
//         mins of S = 15, 63, 63 levels): sub-block j needs a min mn_j >= -min(0, lo_j) and a
//         step >= (hi_j + mn_j) / L. dmin = max_j(-min(0, lo_j)) / S (f16 up), mn_j =
//         ceil(-min(0, lo_j) / dmin); d = max_j(step_j) / S (f16 up), sc_j = ceil(step_j / d);
//         q = round((x + dmin*mn_j) / (d*sc_j)). |x - x'| <= (d*sc_j) / 2, and d*sc_j <=
//         (range_j + dmin) / L + d, where range_j = hi_j - min(0, lo_j).
//   Q3_K, Q6_K (symmetric; sub-blocks of 16; quants -N..N-1 with N = 4, 32; scales of
//         S = 31, 127 levels each side): sub-block j's largest-magnitude element m_j sets
//         s_j = m_j / -N; d = max_j |s_j| / S (f16 up), sc_j = sign(s_j) ceil(|s_j| / d);
//         q = clamp(round(x / (d*sc_j)), -N, N-1). |x - x'| <= |d*sc_j| <= amax_j / N + d (a
//         full step only where the clamp at N-1 bites, as for Q4_0; half a step elsewhere).
//   BF16  round to nearest even; NaN stays NaN. |x - x'| <= 2^-8 |x| (half of 7 mantissa bits).
// An all-zero block gets zero scales and decodes to zeros. Every block type needs finite input
// within the f16 range (|x| <= 65504, so its scales are finite halves): anything else is
// refused (quant_bad_value) rather than encoded as a block that decodes to NaN.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "actors/runtime/result.hpp"
#include "model/fp16.hpp"
#include "model/ggml_types.hpp"

namespace ordo::model {

inline constexpr size_t k_q8_0_block_size = 32;
inline constexpr size_t k_q4_0_block_size = 32;
// Largest |x| a block type encodes: its scales are halves.
inline constexpr float k_quant_abs_max = 65504.0f;

// ---- single blocks (exposed for kernel tests and hand-built blocks) ----------------------
void quantize_block_q8_0(const float* x, block_q8_0& out);  // x: 32 floats
void dequantize_block_q8_0(const block_q8_0& b, float* y);  // y: 32 floats
void quantize_block_q4_0(const float* x, block_q4_0& out);  // x: 32 floats
void dequantize_block_q4_0(const block_q4_0& b, float* y);  // y: 32 floats

// ---- BF16 ----------------------------------------------------------------------------------
using bf16_bits = std::uint16_t;
bf16_bits f32_to_bf16(float value);  // round to nearest even, NaN kept NaN (quiet)
float bf16_to_f32(bf16_bits h);      // exact

// ---- rows ----------------------------------------------------------------------------------
// Bytes taken by `n` elements of `type`, or 0 when `type` is not supported (is_supported) or
// `n` is not a whole number of blocks.
size_t row_bytes(ggml_type type, size_t n);

// Decodes `n` elements of `type` from `src` (row_bytes(type, n) bytes, any alignment) into
// `dst`. Errors: quant_unsupported_type (not is_supported), quant_bad_length (n not a multiple
// of the block size; the message names the type and its block size).
status dequantize_row(ggml_type type, const void* src, float* dst, size_t n);

// Encodes `n` floats into `dst` (row_bytes(type, n) bytes, any alignment). Same errors, plus
// quant_bad_value for a block type given a non-finite value or one beyond k_quant_abs_max
// (F32, F16 and BF16 store any float: F16 overflows to inf as a conversion does).
status quantize_row(ggml_type type, const float* src, void* dst, size_t n);

// Dot product of one encoded row (n elements of `type`) with the float vector x, accumulated
// in float, block by block in element order (the reference matvec's inner loop). The caller
// has validated type and n (asserted).
float dot_row(ggml_type type, const uint8_t* row, const float* x, size_t n);

}  // namespace ordo::model
