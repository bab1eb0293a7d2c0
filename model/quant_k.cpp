// quant_k.cpp: the K types' block codecs (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K; 256 elements per
// super-block). Decoders follow the formulas in ggml_types.hpp in ggml's operation order, so
// they equal ggml's dequantize_row_* bit for bit; encoders follow the covering schemes of
// quant.hpp.
//
// Every encoder runs in three steps: choose each sub-block's ideal scale (and min) from its
// values, store them in a few bits against the super-block's f16 scale(s), rounding so the grid
// still covers the values, then round every value onto the stored grid. The grid an element is
// quantized against is computed with the same float operations the decoder uses.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/quant.hpp"
#include "model/quant_blocks.hpp"

namespace ordo::model::detail {

namespace {

constexpr int k_qk_k = 256;  // elements per super-block

int clamp_round(float v, int lo, int hi) {
    return static_cast<int>(
        std::clamp(std::round(v), static_cast<float>(lo), static_cast<float>(hi)));
}

// ---- asymmetric types: x = (d * sc) * q - (dmin * mn) ------------------------------------------

// One super-block's stored scales for Q2_K/Q4_K/Q5_K: per sub-block a scale and a min of
// `scale_levels` levels, and the quants (0..quant_levels) of every element.
struct asym_params {
    int sub;           // elements per sub-block (16 or 32)
    int quant_levels;  // L: largest quant (3, 15, 31)
    int scale_levels;  // S: largest stored scale or min (15, 63)
};

struct asym_encoded {
    f16_bits d = 0;
    f16_bits dmin = 0;
    uint8_t sc[16] = {};  // per sub-block
    uint8_t mn[16] = {};
    uint8_t q[k_qk_k] = {};
};

asym_encoded encode_asym(const float* x, const asym_params& p) {
    const int n_sub = k_qk_k / p.sub;
    float need_min[16];  // -min(0, lo_j): what the min must reach
    float hi[16];
    float min_max = 0.0f;
    for (int j = 0; j < n_sub; ++j) {
        const auto [lo, top] = std::minmax_element(x + j * p.sub, x + (j + 1) * p.sub);
        need_min[j] = std::max(0.0f, -*lo);
        hi[j] = *top;
        min_max = std::max(min_max, need_min[j]);
    }
    asym_encoded e;
    const auto levels_f = static_cast<float>(p.scale_levels);
    e.dmin = f16_at_least(min_max / levels_f);
    const float dmin = f16_to_f32(e.dmin);
    float need_step[16];
    float step_max = 0.0f;
    for (int j = 0; j < n_sub; ++j) {
        const float mn = dmin > 0.0f ? std::ceil(need_min[j] / dmin) : 0.0f;
        e.mn[j] = static_cast<uint8_t>(std::min(mn, levels_f));
        const float m_eff = dmin * static_cast<float>(e.mn[j]);
        need_step[j] = std::max(0.0f, (hi[j] + m_eff) / static_cast<float>(p.quant_levels));
        step_max = std::max(step_max, need_step[j]);
    }
    e.d = f16_at_least(step_max / levels_f);
    const float d = f16_to_f32(e.d);
    for (int j = 0; j < n_sub; ++j) {
        const float sc = d > 0.0f ? std::ceil(need_step[j] / d) : 0.0f;
        e.sc[j] = static_cast<uint8_t>(std::min(sc, levels_f));
        const float step = d * static_cast<float>(e.sc[j]);
        const float m_eff = dmin * static_cast<float>(e.mn[j]);
        for (int i = j * p.sub; i < (j + 1) * p.sub; ++i) {
            e.q[i] = static_cast<uint8_t>(
                step > 0.0f ? clamp_round((x[i] + m_eff) / step, 0, p.quant_levels) : 0);
        }
    }
    return e;
}

// ---- symmetric types: x = (d * sc) * q, q in -n..n-1 -------------------------------------------

struct sym_encoded {
    f16_bits d = 0;
    int sc[16] = {};
    int q[k_qk_k] = {};
};

// Sub-blocks of 16; each one's largest-magnitude element maps to quant -n; scales of
// -scale_levels..scale_levels.
sym_encoded encode_sym(const float* x, int n, int scale_levels) {
    constexpr int sub = 16;
    float ideal[16];  // s_j = m_j / -n
    float s_max = 0.0f;
    for (int j = 0; j < k_qk_k / sub; ++j) {
        float m = 0.0f;
        for (int i = j * sub; i < (j + 1) * sub; ++i) {
            if (std::fabs(x[i]) > std::fabs(m)) m = x[i];
        }
        ideal[j] = m / static_cast<float>(-n);
        s_max = std::max(s_max, std::fabs(ideal[j]));
    }
    sym_encoded e;
    const auto levels_f = static_cast<float>(scale_levels);
    e.d = f16_at_least(s_max / levels_f);
    const float d = f16_to_f32(e.d);
    for (int j = 0; j < k_qk_k / sub; ++j) {
        const float mag = d > 0.0f ? std::min(std::ceil(std::fabs(ideal[j]) / d), levels_f) : 0.0f;
        e.sc[j] = static_cast<int>(ideal[j] < 0.0f ? -mag : mag);
        const float step = d * static_cast<float>(e.sc[j]);
        for (int i = j * sub; i < (j + 1) * sub; ++i) {
            e.q[i] = step != 0.0f ? clamp_round(x[i] / step, -n, n - 1) : 0;
        }
    }
    return e;
}

// Q4_K/Q5_K: packs 8 6-bit scales and mins into 12 bytes (the inverse of k_scale_min_k4).
void pack_scale_min_k4(const uint8_t* sc, const uint8_t* mn, uint8_t* s) {
    std::memset(s, 0, 12);
    for (int j = 0; j < 8; ++j) {
        if (j < 4) {
            s[j] |= sc[j];
            s[j + 4] |= mn[j];
        } else {
            s[j + 4] = static_cast<uint8_t>((sc[j] & 0x0f) | (mn[j] & 0x0f) << 4);
            s[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
            s[j] |= static_cast<uint8_t>((mn[j] >> 4) << 6);
        }
    }
}

}  // namespace

// ---- Q2_K ----------------------------------------------------------------------------------

// Q2_K, Q3_K and Q6_K pack element e = 128h + 32g + l; sub-block j = e/16 = 8h + 2g + l/16.
// Their decoders walk (h, g, l), so each sub-block's scale is computed once.

void decode_q2_k(const uint8_t* p, float* y) {
    const auto b = load_block<block_q2_k>(p);
    const float d = f16_to_f32(b.d);
    const float dmin = f16_to_f32(b.dmin);
    for (int h = 0; h < 2; ++h) {
        for (int g = 0; g < 4; ++g) {
            for (int l0 = 0; l0 < 32; l0 += 16) {
                const uint8_t s = b.scales[8 * h + 2 * g + l0 / 16];
                const float dl = d * static_cast<float>(s & 0x0f);
                const float ml = dmin * static_cast<float>(s >> 4);
                for (int l = l0; l < l0 + 16; ++l) {
                    const int q = (b.qs[32 * h + l] >> (2 * g)) & 3;
                    y[128 * h + 32 * g + l] = dl * static_cast<float>(q) - ml;
                }
            }
        }
    }
}

void encode_q2_k(const float* x, uint8_t* p) {
    const asym_encoded e = encode_asym(x, {16, 3, 15});
    block_q2_k b{};
    for (int j = 0; j < 16; ++j) b.scales[j] = static_cast<uint8_t>(e.sc[j] | e.mn[j] << 4);
    for (int i = 0; i < k_qk_k; ++i) {
        const int h = i / 128, g = (i % 128) / 32, l = i % 32;
        b.qs[32 * h + l] |= static_cast<uint8_t>(e.q[i] << (2 * g));
    }
    b.d = e.d;
    b.dmin = e.dmin;
    store_block(b, p);
}

// ---- Q3_K ----------------------------------------------------------------------------------

namespace {

// Sub-block j's 6-bit scale (0..63, biased by 32) from the 12 packed bytes.
int q3_k_scale(const uint8_t* s, int j) {
    const int low = j < 8 ? s[j] & 0x0f : s[j - 8] >> 4;
    const int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    return low | high << 4;
}

}  // namespace

void decode_q3_k(const uint8_t* p, float* y) {
    const auto b = load_block<block_q3_k>(p);
    const float d = f16_to_f32(b.d);
    for (int h = 0; h < 2; ++h) {
        for (int g = 0; g < 4; ++g) {
            for (int l0 = 0; l0 < 32; l0 += 16) {
                const int v = q3_k_scale(b.scales, 8 * h + 2 * g + l0 / 16);
                const float dl = d * static_cast<float>(v - 32);
                for (int l = l0; l < l0 + 16; ++l) {
                    const int low = (b.qs[32 * h + l] >> (2 * g)) & 3;
                    const int q = low - ((b.hmask[l] >> (4 * h + g)) & 1 ? 0 : 4);
                    y[128 * h + 32 * g + l] = dl * static_cast<float>(q);
                }
            }
        }
    }
}

void encode_q3_k(const float* x, uint8_t* p) {
    const sym_encoded e = encode_sym(x, 4, 31);
    block_q3_k b{};
    for (int j = 0; j < 16; ++j) {
        const int v = e.sc[j] + 32;  // 1..63
        if (j < 8) {
            b.scales[j] |= static_cast<uint8_t>(v & 0x0f);
        } else {
            b.scales[j - 8] |= static_cast<uint8_t>((v & 0x0f) << 4);
        }
        b.scales[8 + j % 4] |= static_cast<uint8_t>((v >> 4) << (2 * (j / 4)));
    }
    for (int i = 0; i < k_qk_k; ++i) {
        const int h = i / 128, g = (i % 128) / 32, l = i % 32;
        const int biased = e.q[i] + 4;  // 0..7: bit 2 set means "do not subtract 4"
        b.qs[32 * h + l] |= static_cast<uint8_t>((biased & 3) << (2 * g));
        b.hmask[l] |= static_cast<uint8_t>((biased >> 2) << (4 * h + g));
    }
    b.d = e.d;
    store_block(b, p);
}

// ---- Q4_K and Q5_K ---------------------------------------------------------------------------

void decode_q4_k(const uint8_t* p, float* y) {
    const auto b = load_block<block_q4_k>(p);
    const float d = f16_to_f32(b.d);
    const float dmin = f16_to_f32(b.dmin);
    for (int j = 0; j < 8; ++j) {  // sub-block j = 2c + s: nibble s of qs[32c .. 32c + 31]
        const scale_min sm = k_scale_min_k4(b.scales, j);
        const float d1 = d * static_cast<float>(sm.scale);
        const float m1 = dmin * static_cast<float>(sm.min);
        const uint8_t* qs = b.qs + 32 * (j / 2);
        for (int l = 0; l < 32; ++l) {
            const int q = j % 2 == 0 ? qs[l] & 0x0f : qs[l] >> 4;
            y[32 * j + l] = d1 * static_cast<float>(q) - m1;
        }
    }
}

void encode_q4_k(const float* x, uint8_t* p) {
    const asym_encoded e = encode_asym(x, {32, 15, 63});
    block_q4_k b{};
    b.d = e.d;
    b.dmin = e.dmin;
    pack_scale_min_k4(e.sc, e.mn, b.scales);
    for (int i = 0; i < k_qk_k; ++i) {
        const int j = i / 32, l = i % 32;
        b.qs[32 * (j / 2) + l] |= static_cast<uint8_t>(e.q[i] << (4 * (j % 2)));
    }
    store_block(b, p);
}

void decode_q5_k(const uint8_t* p, float* y) {
    const auto b = load_block<block_q5_k>(p);
    const float d = f16_to_f32(b.d);
    const float dmin = f16_to_f32(b.dmin);
    for (int j = 0; j < 8; ++j) {
        const scale_min sm = k_scale_min_k4(b.scales, j);
        const float d1 = d * static_cast<float>(sm.scale);
        const float m1 = dmin * static_cast<float>(sm.min);
        const uint8_t* qs = b.qs + 32 * (j / 2);
        for (int l = 0; l < 32; ++l) {
            const int low = j % 2 == 0 ? qs[l] & 0x0f : qs[l] >> 4;
            const int q = low + ((b.qh[l] >> j) & 1 ? 16 : 0);
            y[32 * j + l] = d1 * static_cast<float>(q) - m1;
        }
    }
}

void encode_q5_k(const float* x, uint8_t* p) {
    const asym_encoded e = encode_asym(x, {32, 31, 63});
    block_q5_k b{};
    b.d = e.d;
    b.dmin = e.dmin;
    pack_scale_min_k4(e.sc, e.mn, b.scales);
    for (int i = 0; i < k_qk_k; ++i) {
        const int j = i / 32, l = i % 32;
        b.qs[32 * (j / 2) + l] |= static_cast<uint8_t>((e.q[i] & 0x0f) << (4 * (j % 2)));
        b.qh[l] |= static_cast<uint8_t>((e.q[i] >> 4) << j);
    }
    store_block(b, p);
}

// ---- Q6_K ----------------------------------------------------------------------------------

void decode_q6_k(const uint8_t* p, float* y) {
    const auto b = load_block<block_q6_k>(p);
    const float d = f16_to_f32(b.d);
    for (int h = 0; h < 2; ++h) {
        for (int g = 0; g < 4; ++g) {
            const uint8_t* ql = b.ql + 64 * h + 32 * (g % 2);
            const int nibble_shift = g < 2 ? 0 : 4;
            for (int l0 = 0; l0 < 32; l0 += 16) {
                const float dl = d * static_cast<float>(b.scales[8 * h + 2 * g + l0 / 16]);
                for (int l = l0; l < l0 + 16; ++l) {
                    const int low = (ql[l] >> nibble_shift) & 0x0f;
                    const int high = (b.qh[32 * h + l] >> (2 * g)) & 3;
                    const int q = (low | high << 4) - 32;
                    y[128 * h + 32 * g + l] = dl * static_cast<float>(q);
                }
            }
        }
    }
}

void encode_q6_k(const float* x, uint8_t* p) {
    const sym_encoded e = encode_sym(x, 32, 127);
    block_q6_k b{};
    for (int j = 0; j < 16; ++j) b.scales[j] = static_cast<int8_t>(e.sc[j]);
    for (int i = 0; i < k_qk_k; ++i) {
        const int h = i / 128, g = (i % 128) / 32, l = i % 32;
        const int biased = e.q[i] + 32;  // 0..63
        b.ql[64 * h + 32 * (g % 2) + l] |= static_cast<uint8_t>((biased & 0x0f) << (g < 2 ? 0 : 4));
        b.qh[32 * h + l] |= static_cast<uint8_t>((biased >> 4) << (2 * g));
    }
    b.d = e.d;
    store_block(b, p);
}

}  // namespace ordo::model::detail
