// quant.cpp: the row functions of quant.hpp (type dispatch, length and value checks), the float
// types (F32, F16, BF16) and the 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0). The K
// types live in quant_k.cpp. Layouts and formulas: ggml_types.hpp; encoding schemes and their
// error bounds: quant.hpp.
#include "model/quant.hpp"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstring>
#include <string>

#include "model/quant_blocks.hpp"

namespace ordo::model {

using namespace detail;

// ---- single blocks -------------------------------------------------------------------------

void quantize_block_q8_0(const float* x, block_q8_0& out) {
    float amax = 0.0f;
    for (size_t i = 0; i < k_q8_0_block_size; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out.d = f32_to_f16(d);
    for (size_t i = 0; i < k_q8_0_block_size; ++i) {
        // |x * id| <= 127 by construction; the clamp only guards against float rounding.
        const float q = std::round(x[i] * id);
        out.qs[i] = static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f));
    }
}

void dequantize_block_q8_0(const block_q8_0& b, float* y) {
    const float d = f16_to_f32(b.d);
    for (size_t i = 0; i < k_q8_0_block_size; ++i) y[i] = static_cast<float>(b.qs[i]) * d;
}

void quantize_block_q4_0(const float* x, block_q4_0& out) {
    // The largest-magnitude element (sign kept) maps exactly to nibble 0.
    float amax = 0.0f;
    float m = 0.0f;
    for (size_t i = 0; i < k_q4_0_block_size; ++i) {
        if (std::fabs(x[i]) > amax) {
            amax = std::fabs(x[i]);
            m = x[i];
        }
    }
    const float d = m / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out.d = f32_to_f16(d);
    constexpr size_t half = k_q4_0_block_size / 2;
    for (size_t j = 0; j < half; ++j) {
        const float lo = std::floor(x[j] * id + 8.5f);
        const float hi = std::floor(x[j + half] * id + 8.5f);
        const auto q_lo = static_cast<uint8_t>(std::clamp(lo, 0.0f, 15.0f));
        const auto q_hi = static_cast<uint8_t>(std::clamp(hi, 0.0f, 15.0f));
        out.qs[j] = static_cast<uint8_t>(q_lo | (q_hi << 4));
    }
}

void dequantize_block_q4_0(const block_q4_0& b, float* y) {
    const float d = f16_to_f32(b.d);
    constexpr size_t half = k_q4_0_block_size / 2;
    for (size_t j = 0; j < half; ++j) {
        y[j] = static_cast<float>(static_cast<int>(b.qs[j] & 0x0f) - 8) * d;
        y[j + half] = static_cast<float>(static_cast<int>(b.qs[j] >> 4) - 8) * d;
    }
}

// ---- BF16 ----------------------------------------------------------------------------------

bf16_bits f32_to_bf16(float value) {
    const uint32_t u = std::bit_cast<uint32_t>(value);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return static_cast<bf16_bits>((u >> 16) | 0x0040u);  // NaN: keep it NaN, make it quiet
    }
    // Round to nearest even on the 16 bits dropped; a carry correctly bumps the exponent (and
    // turns the largest floats into inf, as a conversion does).
    const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return static_cast<bf16_bits>((u + rounding) >> 16);
}

float bf16_to_f32(bf16_bits h) {
    return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

namespace {

// ---- the other 32-element blocks -------------------------------------------------------------

constexpr size_t k_qk = 32;  // elements per block of the 32-element types

void decode_q8_0(const uint8_t* p, float* y) {
    dequantize_block_q8_0(load_block<block_q8_0>(p), y);
}
void decode_q4_0(const uint8_t* p, float* y) {
    dequantize_block_q4_0(load_block<block_q4_0>(p), y);
}

void encode_q8_0(const float* x, uint8_t* p) {
    block_q8_0 b;
    quantize_block_q8_0(x, b);
    store_block(b, p);
}

void encode_q4_0(const float* x, uint8_t* p) {
    block_q4_0 b;
    quantize_block_q4_0(x, b);
    store_block(b, p);
}

// The 4-bit part of element i (0..31): low nibbles hold 0..15, high nibbles 16..31.
int nibble(const uint8_t* qs, size_t i) {
    return i < 16 ? qs[i] & 0x0f : qs[i - 16] >> 4;
}

// Bit 4 of element i of a 5-bit block: bit i of qh read as a little-endian u32.
int high_bit(const uint8_t* qh, size_t i) {
    return (qh[i / 8] >> (i % 8)) & 1;
}

// Packs 32 quants of 4 or 5 bits into the nibbles (and qh when not null).
void pack_quants(const int* q, uint8_t* qs, uint8_t* qh) {
    for (size_t j = 0; j < 16; ++j)
        qs[j] = static_cast<uint8_t>((q[j] & 15) | (q[j + 16] & 15) << 4);
    if (qh == nullptr) return;
    std::memset(qh, 0, 4);
    for (size_t i = 0; i < k_qk; ++i)
        qh[i / 8] |= static_cast<uint8_t>(((q[i] >> 4) & 1) << (i % 8));
}

void decode_q4_1(const uint8_t* p, float* y) {
    const auto b = load_block<block_q4_1>(p);
    const float d = f16_to_f32(b.d);
    const float m = f16_to_f32(b.m);
    for (size_t i = 0; i < k_qk; ++i) y[i] = static_cast<float>(nibble(b.qs, i)) * d + m;
}

void decode_q5_0(const uint8_t* p, float* y) {
    const auto b = load_block<block_q5_0>(p);
    const float d = f16_to_f32(b.d);
    for (size_t i = 0; i < k_qk; ++i) {
        const int q = (nibble(b.qs, i) | high_bit(b.qh, i) << 4) - 16;
        y[i] = static_cast<float>(q) * d;
    }
}

void decode_q5_1(const uint8_t* p, float* y) {
    const auto b = load_block<block_q5_1>(p);
    const float d = f16_to_f32(b.d);
    const float m = f16_to_f32(b.m);
    for (size_t i = 0; i < k_qk; ++i) {
        const int q = nibble(b.qs, i) | high_bit(b.qh, i) << 4;
        y[i] = static_cast<float>(q) * d + m;
    }
}

// Q4_1/Q5_1: the grid m + q*d (q = 0..levels) from the block's min (f16 down) to its max (the
// step f16 up), so every value is at most half a step from a grid point.
void encode_offset(const float* x, int levels, f16_bits& d_out, f16_bits& m_out, int* q) {
    const auto [lo, hi] = std::minmax_element(x, x + k_qk);
    m_out = f16_at_most(*lo);
    const float m = f16_to_f32(m_out);
    d_out = f16_at_least((*hi - m) / static_cast<float>(levels));
    const float d = f16_to_f32(d_out);
    for (size_t i = 0; i < k_qk; ++i) {
        const float v = d > 0.0f ? std::round((x[i] - m) / d) : 0.0f;
        q[i] = static_cast<int>(std::clamp(v, 0.0f, static_cast<float>(levels)));
    }
}

void encode_q4_1(const float* x, uint8_t* p) {
    block_q4_1 b;
    int q[k_qk];
    encode_offset(x, 15, b.d, b.m, q);
    pack_quants(q, b.qs, nullptr);
    store_block(b, p);
}

void encode_q5_1(const float* x, uint8_t* p) {
    block_q5_1 b;
    int q[k_qk];
    encode_offset(x, 31, b.d, b.m, q);
    pack_quants(q, b.qs, b.qh);
    store_block(b, p);
}

void encode_q5_0(const float* x, uint8_t* p) {
    // The largest-magnitude element m (sign kept) maps to quant 0 (value -16 d).
    float m = 0.0f;
    for (size_t i = 0; i < k_qk; ++i) {
        if (std::fabs(x[i]) > std::fabs(m)) m = x[i];
    }
    block_q5_0 b;
    b.d = f32_to_f16(m / -16.0f);
    const float d = f16_to_f32(b.d);
    int q[k_qk];
    for (size_t i = 0; i < k_qk; ++i) {
        const float v = d != 0.0f ? std::round(x[i] / d) + 16.0f : 16.0f;
        q[i] = static_cast<int>(std::clamp(v, 0.0f, 31.0f));
    }
    pack_quants(q, b.qs, b.qh);
    store_block(b, p);
}

// ---- the type table --------------------------------------------------------------------------

struct block_codec {
    ggml_type type;
    decode_block_fn decode;
    encode_block_fn encode;
};

// Every block type of is_supported (the float types are handled inline by the row functions).
constexpr block_codec k_block_codecs[] = {
    {ggml_type::q4_0, decode_q4_0, encode_q4_0}, {ggml_type::q4_1, decode_q4_1, encode_q4_1},
    {ggml_type::q5_0, decode_q5_0, encode_q5_0}, {ggml_type::q5_1, decode_q5_1, encode_q5_1},
    {ggml_type::q8_0, decode_q8_0, encode_q8_0}, {ggml_type::q2_k, decode_q2_k, encode_q2_k},
    {ggml_type::q3_k, decode_q3_k, encode_q3_k}, {ggml_type::q4_k, decode_q4_k, encode_q4_k},
    {ggml_type::q5_k, decode_q5_k, encode_q5_k}, {ggml_type::q6_k, decode_q6_k, encode_q6_k},
};

const block_codec* find_codec(ggml_type type) {
    for (const auto& c : k_block_codecs) {
        if (c.type == type) return &c;
    }
    return nullptr;
}

bool is_float_type(ggml_type t) {
    return t == ggml_type::f32 || t == ggml_type::f16 || t == ggml_type::bf16;
}

status check_row(ggml_type type, size_t n) {
    // The codec table and is_supported must list the same types.
    assert(is_supported(type) == (is_float_type(type) || find_codec(type) != nullptr));
    if (!is_supported(type)) {
        return make_error("quant_unsupported_type",
                          "no row codec for tensor type " + std::string(type_name(type)) +
                              " (supported: " + supported_type_names() + ")");
    }
    if (n % block_size(type) != 0) {
        return make_error("quant_bad_length", std::to_string(n) +
                                                  " elements is not a whole number of " +
                                                  std::string(type_name(type)) + " blocks of " +
                                                  std::to_string(block_size(type)));
    }
    return {};
}

// Block types store scales as halves: refuse what they cannot hold instead of writing NaNs.
status check_values(ggml_type type, const float* x, size_t n) {
    if (is_float_type(type)) return {};
    for (size_t i = 0; i < n; ++i) {
        if (!(std::fabs(x[i]) <= k_quant_abs_max)) {
            return make_error("quant_bad_value",
                              "element " + std::to_string(i) + " is " + std::to_string(x[i]) +
                                  ": " + std::string(type_name(type)) +
                                  " encodes only finite values within +-65504 (its scales are "
                                  "f16)");
        }
    }
    return {};
}

}  // namespace

// ---- rows ----------------------------------------------------------------------------------

size_t row_bytes(ggml_type type, size_t n) {
    if (!check_row(type, n).ok()) return 0;
    return n / block_size(type) * block_bytes(type);
}

status dequantize_row(ggml_type type, const void* src, float* dst, size_t n) {
    if (auto st = check_row(type, n); !st) return st;
    const auto* p = static_cast<const uint8_t*>(src);
    switch (type) {
        case ggml_type::f32:
            std::memcpy(dst, p, n * sizeof(float));
            return {};
        case ggml_type::f16:
            for (size_t i = 0; i < n; ++i) {
                f16_bits h;
                std::memcpy(&h, p + 2 * i, sizeof h);
                dst[i] = f16_to_f32(h);
            }
            return {};
        case ggml_type::bf16:
            for (size_t i = 0; i < n; ++i) {
                bf16_bits h;
                std::memcpy(&h, p + 2 * i, sizeof h);
                dst[i] = bf16_to_f32(h);
            }
            return {};
        default:
            break;
    }
    const block_codec* c = find_codec(type);
    const size_t bs = block_size(type);
    const size_t bb = block_bytes(type);
    for (size_t b = 0; b < n / bs; ++b) c->decode(p + b * bb, dst + b * bs);
    return {};
}

status quantize_row(ggml_type type, const float* src, void* dst, size_t n) {
    if (auto st = check_row(type, n); !st) return st;
    if (auto st = check_values(type, src, n); !st) return st;
    auto* p = static_cast<uint8_t*>(dst);
    switch (type) {
        case ggml_type::f32:
            std::memcpy(p, src, n * sizeof(float));
            return {};
        case ggml_type::f16:
            for (size_t i = 0; i < n; ++i) {
                const f16_bits h = f32_to_f16(src[i]);
                std::memcpy(p + 2 * i, &h, sizeof h);
            }
            return {};
        case ggml_type::bf16:
            for (size_t i = 0; i < n; ++i) {
                const bf16_bits h = f32_to_bf16(src[i]);
                std::memcpy(p + 2 * i, &h, sizeof h);
            }
            return {};
        default:
            break;
    }
    const block_codec* c = find_codec(type);
    const size_t bs = block_size(type);
    const size_t bb = block_bytes(type);
    for (size_t b = 0; b < n / bs; ++b) c->encode(src + b * bs, p + b * bb);
    return {};
}

float dot_row(ggml_type type, const uint8_t* row, const float* x, size_t n) {
    assert(check_row(type, n).ok());
    float sum = 0.0f;
    switch (type) {
        case ggml_type::f32:
            for (size_t i = 0; i < n; ++i) {
                float w;
                std::memcpy(&w, row + 4 * i, sizeof w);
                sum += w * x[i];
            }
            return sum;
        case ggml_type::f16:
            for (size_t i = 0; i < n; ++i) {
                f16_bits h;
                std::memcpy(&h, row + 2 * i, sizeof h);
                sum += f16_to_f32(h) * x[i];
            }
            return sum;
        case ggml_type::bf16:
            for (size_t i = 0; i < n; ++i) {
                bf16_bits h;
                std::memcpy(&h, row + 2 * i, sizeof h);
                sum += bf16_to_f32(h) * x[i];
            }
            return sum;
        case ggml_type::q8_0:
            for (size_t b = 0; b < n / k_q8_0_block_size; ++b) {
                const auto blk = load_block<block_q8_0>(row + b * sizeof(block_q8_0));
                const float* xb = x + b * k_q8_0_block_size;
                float block_sum = 0.0f;  // integer quants times x, scaled once per block
                for (size_t i = 0; i < k_q8_0_block_size; ++i) block_sum += blk.qs[i] * xb[i];
                sum += block_sum * f16_to_f32(blk.d);
            }
            return sum;
        case ggml_type::q4_0:
            for (size_t b = 0; b < n / k_q4_0_block_size; ++b) {
                const auto blk = load_block<block_q4_0>(row + b * sizeof(block_q4_0));
                const float* xb = x + b * k_q4_0_block_size;
                constexpr size_t half = k_q4_0_block_size / 2;
                float block_sum = 0.0f;
                for (size_t j = 0; j < half; ++j) {
                    block_sum += static_cast<float>((blk.qs[j] & 0x0f) - 8) * xb[j];
                    block_sum += static_cast<float>((blk.qs[j] >> 4) - 8) * xb[j + half];
                }
                sum += block_sum * f16_to_f32(blk.d);
            }
            return sum;
        default:
            break;
    }
    // The other block types: decode a block, then accumulate its products in element order.
    const block_codec* c = find_codec(type);
    const size_t bs = block_size(type);
    const size_t bb = block_bytes(type);
    float w[256];
    assert(bs <= 256);
    for (size_t b = 0; b < n / bs; ++b) {
        c->decode(row + b * bb, w);
        const float* xb = x + b * bs;
        float block_sum = 0.0f;
        for (size_t i = 0; i < bs; ++i) block_sum += w[i] * xb[i];
        sum += block_sum;
    }
    return sum;
}

}  // namespace ordo::model
