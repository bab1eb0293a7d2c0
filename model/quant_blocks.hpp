// quant_blocks.hpp: the per-type block codecs behind model/quant.hpp's row functions; internal
// to model/quant.cpp (float types, 32-element blocks, the row dispatch) and model/quant_k.cpp
// (the K types). Not part of the public API: callers use the row functions.
//
// A codec reads or writes one whole block as raw bytes (any alignment: blocks are copied with
// memcpy, so rows may sit anywhere inside a memory-mapped GGUF file). Encoders assume finite
// input within k_quant_abs_max; quantize_row checks that before calling them.
#pragma once

#include <cstdint>
#include <cstring>

#include "model/fp16.hpp"
#include "model/ggml_types.hpp"

namespace ordo::model::detail {

using decode_block_fn = void (*)(const uint8_t* block, float* y);
using encode_block_fn = void (*)(const float* x, uint8_t* block);

// K types (quant_k.cpp): 256 elements per block.
void decode_q2_k(const uint8_t* block, float* y);
void decode_q3_k(const uint8_t* block, float* y);
void decode_q4_k(const uint8_t* block, float* y);
void decode_q5_k(const uint8_t* block, float* y);
void decode_q6_k(const uint8_t* block, float* y);
void encode_q2_k(const float* x, uint8_t* block);
void encode_q3_k(const float* x, uint8_t* block);
void encode_q4_k(const float* x, uint8_t* block);
void encode_q5_k(const float* x, uint8_t* block);
void encode_q6_k(const float* x, uint8_t* block);

// The smallest half >= v (v >= 0, finite, <= 65504): a scale stored this way never shrinks the
// grid below what the values need.
inline f16_bits f16_at_least(float v) {
    f16_bits h = f32_to_f16(v);
    if (f16_to_f32(h) < v) ++h;  // positive halves order like their bits
    return h;
}

// The largest half <= v (finite, |v| <= 65504).
inline f16_bits f16_at_most(float v) {
    f16_bits h = f32_to_f16(v);
    if (f16_to_f32(h) > v) {
        // One half toward -inf: a larger magnitude for a negative half (-0 included), the
        // smallest negative subnormal for +0, a smaller magnitude for a positive half.
        if (h & 0x8000u) {
            ++h;
        } else if (h == 0) {
            h = 0x8001u;
        } else {
            --h;
        }
    }
    return h;
}

template <typename Block>
Block load_block(const uint8_t* p) {
    Block b;
    std::memcpy(&b, p, sizeof b);
    return b;
}

template <typename Block>
void store_block(const Block& b, uint8_t* p) {
    std::memcpy(p, &b, sizeof b);
}

}  // namespace ordo::model::detail
