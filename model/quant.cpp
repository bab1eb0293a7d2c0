// quant.cpp: F32/F16/Q8_0/Q4_0 row encoding and decoding (see quant.hpp for the layouts and the
// error bounds). Blocks are copied out of the source bytes with memcpy, so rows may sit at any
// alignment inside a memory-mapped GGUF file.
#include "model/quant.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <string>

namespace ordo::model {

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

// ---- rows ----------------------------------------------------------------------------------

namespace {

bool is_quant_type(ggml_type type) {
    return type == ggml_type::f32 || type == ggml_type::f16 || type == ggml_type::q8_0 ||
           type == ggml_type::q4_0;
}

status check_row(ggml_type type, size_t n) {
    if (!is_quant_type(type)) {
        return make_error("quant_unsupported_type", "no row codec for tensor type " +
                                                        std::string(type_name(type)) +
                                                        " (supported: f32, f16, q8_0, q4_0)");
    }
    if (n % block_size(type) != 0) {
        return make_error("quant_bad_length", std::to_string(n) +
                                                  " elements is not a whole number of " +
                                                  std::string(type_name(type)) + " blocks of " +
                                                  std::to_string(block_size(type)));
    }
    return {};
}

}  // namespace

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
            break;
        case ggml_type::f16:
            for (size_t i = 0; i < n; ++i) {
                f16_bits h;
                std::memcpy(&h, p + 2 * i, sizeof h);
                dst[i] = f16_to_f32(h);
            }
            break;
        case ggml_type::q8_0:
            for (size_t b = 0; b < n / k_q8_0_block_size; ++b) {
                block_q8_0 blk;
                std::memcpy(&blk, p + b * sizeof blk, sizeof blk);
                dequantize_block_q8_0(blk, dst + b * k_q8_0_block_size);
            }
            break;
        case ggml_type::q4_0:
            for (size_t b = 0; b < n / k_q4_0_block_size; ++b) {
                block_q4_0 blk;
                std::memcpy(&blk, p + b * sizeof blk, sizeof blk);
                dequantize_block_q4_0(blk, dst + b * k_q4_0_block_size);
            }
            break;
        default:
            assert(false && "check_row admitted an unsupported type");
    }
    return {};
}

status quantize_row(ggml_type type, const float* src, void* dst, size_t n) {
    if (auto st = check_row(type, n); !st) return st;
    auto* p = static_cast<uint8_t*>(dst);
    switch (type) {
        case ggml_type::f32:
            std::memcpy(p, src, n * sizeof(float));
            break;
        case ggml_type::f16:
            for (size_t i = 0; i < n; ++i) {
                const f16_bits h = f32_to_f16(src[i]);
                std::memcpy(p + 2 * i, &h, sizeof h);
            }
            break;
        case ggml_type::q8_0:
            for (size_t b = 0; b < n / k_q8_0_block_size; ++b) {
                block_q8_0 blk;
                quantize_block_q8_0(src + b * k_q8_0_block_size, blk);
                std::memcpy(p + b * sizeof blk, &blk, sizeof blk);
            }
            break;
        case ggml_type::q4_0:
            for (size_t b = 0; b < n / k_q4_0_block_size; ++b) {
                block_q4_0 blk;
                quantize_block_q4_0(src + b * k_q4_0_block_size, blk);
                std::memcpy(p + b * sizeof blk, &blk, sizeof blk);
            }
            break;
        default:
            assert(false && "check_row admitted an unsupported type");
    }
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
            break;
        case ggml_type::f16:
            for (size_t i = 0; i < n; ++i) {
                f16_bits h;
                std::memcpy(&h, row + 2 * i, sizeof h);
                sum += f16_to_f32(h) * x[i];
            }
            break;
        case ggml_type::q8_0:
            for (size_t b = 0; b < n / k_q8_0_block_size; ++b) {
                block_q8_0 blk;
                std::memcpy(&blk, row + b * sizeof blk, sizeof blk);
                const float* xb = x + b * k_q8_0_block_size;
                float block_sum = 0.0f;  // integer quants times x, scaled once per block
                for (size_t i = 0; i < k_q8_0_block_size; ++i) block_sum += blk.qs[i] * xb[i];
                sum += block_sum * f16_to_f32(blk.d);
            }
            break;
        case ggml_type::q4_0:
            for (size_t b = 0; b < n / k_q4_0_block_size; ++b) {
                block_q4_0 blk;
                std::memcpy(&blk, row + b * sizeof blk, sizeof blk);
                const float* xb = x + b * k_q4_0_block_size;
                constexpr size_t half = k_q4_0_block_size / 2;
                float block_sum = 0.0f;
                for (size_t j = 0; j < half; ++j) {
                    block_sum += static_cast<float>((blk.qs[j] & 0x0f) - 8) * xb[j];
                    block_sum += static_cast<float>((blk.qs[j] >> 4) - 8) * xb[j + half];
                }
                sum += block_sum * f16_to_f32(blk.d);
            }
            break;
        default:
            assert(false && "dot_row on an unsupported type");
    }
    return sum;
}

}  // namespace ordo::model
