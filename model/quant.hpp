// quant.hpp: block layouts and row (de)quantization for the weight types ordo computes with:
// F32, F16, Q8_0 and Q4_0, bit-compatible with GGUF/ggml.
//
// Owns the meaning of weight bytes. Users: the CPU reference forward pass (model/cpu_ops,
// model/reference), the synthetic model generator (model/synth, `ordo-model mk`), and the gpu
// kernel tests, which check every Vulkan dequant/matvec kernel against these functions.
// Pure functions, no state, no allocation.
//
// Block layouts (little-endian, packed, as GGUF stores them):
//   Q8_0: { f16 d; int8 qs[32]; }   34 bytes, x[i] = qs[i] * d
//   Q4_0: { f16 d; uint8 qs[16]; }  18 bytes, element j (0..15) is the LOW nibble of qs[j],
//         element j + 16 is the HIGH nibble of qs[j]; x = (nibble - 8) * d
//
// Quantization (what `ordo-model mk` writes):
//   Q8_0: d = max|x| / 127, q = round(x / d) (half away from zero). |x - x'| <= d/2 plus the
//         f16 rounding of d (relative 2^-11 of max|x|).
//   Q4_0: the element with the largest magnitude, m (sign kept), sets d = m / -8 so it maps
//         exactly to nibble 0; q = clamp(floor(x / d + 8.5), 0, 15). |x - x'| <= |d| (the clamp
//         at 15 can cost a full step for values of the opposite sign to m).
// An all-zero block gets d = 0 and decodes to zeros.
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

struct block_q8_0 {
    f16_bits d;                    // scale
    int8_t qs[k_q8_0_block_size];  // quants
};
static_assert(sizeof(block_q8_0) == 34, "Q8_0 block must match the GGUF layout");

struct block_q4_0 {
    f16_bits d;                         // scale
    uint8_t qs[k_q4_0_block_size / 2];  // nibbles: low = elements 0..15, high = 16..31
};
static_assert(sizeof(block_q4_0) == 18, "Q4_0 block must match the GGUF layout");

// ---- single blocks (exposed for kernel tests and hand-built blocks) ----------------------
void quantize_block_q8_0(const float* x, block_q8_0& out);  // x: 32 floats
void dequantize_block_q8_0(const block_q8_0& b, float* y);  // y: 32 floats
void quantize_block_q4_0(const float* x, block_q4_0& out);  // x: 32 floats
void dequantize_block_q4_0(const block_q4_0& b, float* y);  // y: 32 floats

// ---- rows ----------------------------------------------------------------------------------
// Bytes taken by `n` elements of `type`, or 0 when `type` is not one of F32/F16/Q8_0/Q4_0 or
// `n` is not a whole number of blocks.
size_t row_bytes(ggml_type type, size_t n);

// Decodes `n` elements of `type` from `src` (row_bytes(type, n) bytes, any alignment) into
// `dst`. Errors: quant_unsupported_type (not F32/F16/Q8_0/Q4_0), quant_bad_length (n not a
// multiple of the block size).
status dequantize_row(ggml_type type, const void* src, float* dst, size_t n);

// Encodes `n` floats into `dst` (row_bytes(type, n) bytes, any alignment). Same errors.
status quantize_row(ggml_type type, const float* src, void* dst, size_t n);

// Dot product of one encoded row (n elements of `type`) with the float vector x, accumulated
// in float in element order within each block (the reference matvec's inner loop). The caller
// has validated type and n (asserted).
float dot_row(ggml_type type, const uint8_t* row, const float* x, size_t n);

}  // namespace ordo::model
