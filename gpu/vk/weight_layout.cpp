// weight_layout.cpp: see weight_layout.hpp. Each repacker reads one GGUF block (its byte layout:
// model/ggml_types.hpp), takes every element's raw quant bits out of it with the formulas the
// CPU decoder uses (model/quant.cpp, model/quant_k.cpp), and writes them into the planes of
// gpu/vk/shaders/weight_units.glsl, with the scales where that file's load_raw() looks for them.
#include "gpu/vk/weight_layout.hpp"

#include <cstring>

namespace ordo::gpu {

namespace {

using model::ggml_type;

constexpr std::uint32_t texel_bytes = 16;
constexpr std::uint32_t qk = 32;     // elements per unit of every block type
constexpr std::uint32_t qk_k = 256;  // elements per K-type super-block
constexpr std::uint32_t units_per_super_block = qk_k / qk;
constexpr std::uint32_t q2_k_group = 4;  // Q2_K super-blocks per 21-texel group

std::uint64_t round_up(std::uint64_t n, std::uint64_t m) {
    return (n + m - 1) / m * m;
}

bool k_type(ggml_type t) {
    return t == ggml_type::q2_k || t == ggml_type::q3_k || t == ggml_type::q4_k ||
           t == ggml_type::q5_k || t == ggml_type::q6_k;
}

bool legacy_block(ggml_type t) {
    return t == ggml_type::q8_0 || t == ggml_type::q4_0 || t == ggml_type::q4_1 ||
           t == ggml_type::q5_0 || t == ggml_type::q5_1;
}

// Legacy block types: quant-region and aux-region bytes per 32-element unit.
std::uint32_t unit_quant_bytes(ggml_type t) {
    return t == ggml_type::q8_0 ? 32 : 16;
}
std::uint32_t unit_aux_bytes(ggml_type t) {
    switch (t) {
        case ggml_type::q8_0:
        case ggml_type::q4_0:
            return 2;  // f16 d
        case ggml_type::q4_1:
            return 4;  // d | m << 16
        default:
            return 8;  // Q5_0/Q5_1: 1-bit plane, d (| m)
    }
}

// K types: device texels per super-block (Q2_K: per group of q2_k_group).
std::uint32_t super_block_texels(ggml_type t) {
    switch (t) {
        case ggml_type::q4_k:
            return 9;
        case ggml_type::q5_k:
            return 11;
        case ggml_type::q6_k:
            return 14;
        case ggml_type::q3_k:
            return 7;
        default:
            return 21;  // Q2_K, per group
    }
}

// ---- planes of a 32-element unit (element i = 4j + c: part j, byte lane c) ------------------

struct unit_planes {
    std::uint8_t nibbles[16] = {};  // bits 0..3 (Q2_K: unused)
    std::uint32_t bits2[2] = {};    // Q2_K/Q3_K: bits 0..1; Q6_K: bits 4..5
    std::uint32_t bit = 0;          // Q5_*: bit 4; Q3_K: bit 2
};

void put_nibble(unit_planes& p, std::uint32_t i, std::uint32_t v) {
    p.nibbles[i % 16] |= static_cast<std::uint8_t>((v & 15) << (4 * (i / 16)));
}
void put_bits2(unit_planes& p, std::uint32_t i, std::uint32_t v) {
    const std::uint32_t j = i / 4, c = i % 4;
    p.bits2[j % 2] |= (v & 3) << (8 * c + 2 * (j / 2));
}
void put_bit(unit_planes& p, std::uint32_t i, std::uint32_t v) {
    p.bit |= (v & 1) << (8 * (i % 4) + i / 4);
}

// 32-bit little-endian words (the host is little-endian, as Vulkan's buffers are read).
void put_word(std::uint8_t* dst, std::uint32_t w) {
    std::memcpy(dst, &w, 4);
}
std::uint32_t get_word(const std::uint8_t* src) {
    std::uint32_t w;
    std::memcpy(&w, src, 4);
    return w;
}

// The 1-bit plane of GGUF's 32-bit qh (bit i = bit 4 of element i).
std::uint32_t bit_plane_of(std::uint32_t qh) {
    unit_planes p;
    for (std::uint32_t i = 0; i < qk; ++i) put_bit(p, i, qh >> i);
    return p.bit;
}

// ---- 32-element block types: quants, then the aux region -------------------------------------

void repack_legacy(ggml_type t, std::uint64_t units, const std::uint8_t* src, std::uint8_t* dst) {
    const std::uint32_t in_bytes = model::block_bytes(t), qb = unit_quant_bytes(t);
    const std::uint32_t ab = unit_aux_bytes(t);
    std::uint8_t* aux = dst + units * qb;
    for (std::uint64_t u = 0; u < units; ++u) {
        const std::uint8_t* b = src + u * in_bytes;
        std::uint8_t* a = aux + u * ab;
        switch (t) {
            case ggml_type::q8_0:
            case ggml_type::q4_0:  // d, qs
                std::memcpy(a, b, 2);
                std::memcpy(dst + u * qb, b + 2, qb);
                break;
            case ggml_type::q4_1:  // d, m, qs
                std::memcpy(a, b, 4);
                std::memcpy(dst + u * qb, b + 4, qb);
                break;
            case ggml_type::q5_0:  // d, qh, qs
                put_word(a, bit_plane_of(get_word(b + 2)));
                std::memcpy(a + 4, b, 2);
                std::memcpy(dst + u * qb, b + 6, qb);
                break;
            default:  // Q5_1: d, m, qh, qs
                put_word(a, bit_plane_of(get_word(b + 4)));
                std::memcpy(a + 4, b, 4);
                std::memcpy(dst + u * qb, b + 8, qb);
                break;
        }
    }
}

// ---- K types: one super-block at a time ------------------------------------------------------

// Writes unit u's planes of a super-block whose raw quants (bits 0..5, per element) are q.
void write_nibbles(const std::uint8_t* q, std::uint8_t* texels) {
    for (std::uint32_t u = 0; u < units_per_super_block; ++u) {
        unit_planes p;
        for (std::uint32_t i = 0; i < qk; ++i) put_nibble(p, i, q[qk * u + i]);
        std::memcpy(texels + texel_bytes * u, p.nibbles, 16);
    }
}

// The 1-bit planes (bit `shift` of each quant) of units 0..7, one word each (two texels).
void write_bits(const std::uint8_t* q, std::uint32_t shift, std::uint8_t* texels) {
    for (std::uint32_t u = 0; u < units_per_super_block; ++u) {
        unit_planes p;
        for (std::uint32_t i = 0; i < qk; ++i) put_bit(p, i, q[qk * u + i] >> shift);
        put_word(texels + 4 * u, p.bit);
    }
}

// The 2-bit planes (bits shift, shift + 1) of units 0..7, two words each (four texels).
void write_bits2(const std::uint8_t* q, std::uint32_t shift, std::uint8_t* texels) {
    for (std::uint32_t u = 0; u < units_per_super_block; ++u) {
        unit_planes p;
        for (std::uint32_t i = 0; i < qk; ++i) put_bits2(p, i, q[qk * u + i] >> shift);
        put_word(texels + 8 * u, p.bits2[0]);
        put_word(texels + 8 * u + 4, p.bits2[1]);
    }
}

void repack_q4_k(const std::uint8_t* b, std::uint8_t* dst) {  // d, dmin, scales[12], qs[128]
    std::uint8_t q[qk_k];
    for (std::uint32_t e = 0; e < qk_k; ++e) {  // e = 32j + l: nibble j % 2 of qs[32(j/2) + l]
        const std::uint32_t j = e / 32, l = e % 32;
        q[e] = (b[16 + 32 * (j / 2) + l] >> (4 * (j % 2))) & 15;
    }
    std::memcpy(dst, b, 16);
    write_nibbles(q, dst + texel_bytes);
}

void repack_q5_k(const std::uint8_t* b, std::uint8_t* dst) {  // header, qh[32], qs[128]
    std::uint8_t q[qk_k];
    for (std::uint32_t e = 0; e < qk_k; ++e) {
        const std::uint32_t j = e / 32, l = e % 32;
        const std::uint32_t low = (b[48 + 32 * (j / 2) + l] >> (4 * (j % 2))) & 15;
        q[e] = static_cast<std::uint8_t>(low | ((b[16 + l] >> j) & 1) << 4);
    }
    std::memcpy(dst, b, 16);
    write_bits(q, 4, dst + texel_bytes);
    write_nibbles(q, dst + 3 * texel_bytes);
}

void repack_q6_k(const std::uint8_t* b, std::uint8_t* dst) {  // ql[128], qh[64], scales[16], d
    std::uint8_t q[qk_k];
    for (std::uint32_t e = 0; e < qk_k; ++e) {  // e = 128h + 32g + l
        const std::uint32_t h = e / 128, g = (e % 128) / 32, l = e % 32;
        const std::uint32_t low = (b[64 * h + 32 * (g % 2) + l] >> (g < 2 ? 0 : 4)) & 15;
        const std::uint32_t high = (b[128 + 32 * h + l] >> (2 * g)) & 3;
        q[e] = static_cast<std::uint8_t>(low | high << 4);
    }
    for (std::uint32_t half = 0; half < 2; ++half) {  // two headers: 8 scales and d each
        std::memcpy(dst + texel_bytes * half, b + 192 + 8 * half, 8);
        std::memcpy(dst + texel_bytes * half + 8, b + 208, 2);
    }
    write_bits2(q, 4, dst + 2 * texel_bytes);
    write_nibbles(q, dst + 6 * texel_bytes);
}

void repack_q3_k(const std::uint8_t* b, std::uint8_t* dst) {  // hmask[32], qs[64], scales[12], d
    std::uint8_t q[qk_k];
    for (std::uint32_t e = 0; e < qk_k; ++e) {  // raw 3 bits: low 2 | "do not subtract 4" << 2
        const std::uint32_t h = e / 128, g = (e % 128) / 32, l = e % 32;
        const std::uint32_t low = (b[32 + 32 * h + l] >> (2 * g)) & 3;
        q[e] = static_cast<std::uint8_t>(low | ((b[l] >> (4 * h + g)) & 1) << 2);
    }
    std::memcpy(dst, b + 96, 14);  // scales, d
    write_bits(q, 2, dst + texel_bytes);
    write_bits2(q, 0, dst + 3 * texel_bytes);
}

// Super-block s (0..3) of a Q2_K group at `group`.
void repack_q2_k(const std::uint8_t* b, std::uint32_t s, std::uint8_t* group) {
    std::uint8_t q[qk_k];  // scales[16], qs[64], d, dmin
    for (std::uint32_t e = 0; e < qk_k; ++e) {
        const std::uint32_t h = e / 128, g = (e % 128) / 32, l = e % 32;
        q[e] = (b[16 + 32 * h + l] >> (2 * g)) & 3;
    }
    std::memcpy(group + texel_bytes * s, b, 16);
    std::memcpy(group + 4 * texel_bytes + 4 * s, b + 80, 4);
    write_bits2(q, 0, group + (5 + 4 * s) * texel_bytes);
}

void repack_k(ggml_type t, std::uint64_t super_blocks, const std::uint8_t* src, std::uint8_t* dst) {
    const std::uint32_t in_bytes = model::block_bytes(t);
    const std::uint64_t out_bytes = std::uint64_t(super_block_texels(t)) * texel_bytes;
    for (std::uint64_t s = 0; s < super_blocks; ++s) {
        const std::uint8_t* b = src + s * in_bytes;
        switch (t) {
            case ggml_type::q4_k:
                repack_q4_k(b, dst + s * out_bytes);
                break;
            case ggml_type::q5_k:
                repack_q5_k(b, dst + s * out_bytes);
                break;
            case ggml_type::q6_k:
                repack_q6_k(b, dst + s * out_bytes);
                break;
            case ggml_type::q3_k:
                repack_q3_k(b, dst + s * out_bytes);
                break;
            default:
                repack_q2_k(b, static_cast<std::uint32_t>(s % q2_k_group),
                            dst + s / q2_k_group * out_bytes);
                break;
        }
    }
}

}  // namespace

bool layout_known(ggml_type type) {
    return row_multiple(type) != 0;
}

std::uint32_t row_multiple(ggml_type type) {
    if (type == ggml_type::f32 || type == ggml_type::f16 || type == ggml_type::bf16) return 8;
    if (legacy_block(type)) return qk;
    if (k_type(type)) return qk_k;
    return 0;
}

std::uint64_t aux_offset_bytes(ggml_type type, std::uint32_t n_in, std::uint32_t rows) {
    if (!legacy_block(type)) return 0;
    return std::uint64_t(rows) * (n_in / qk) * unit_quant_bytes(type);
}

std::uint64_t packed_bytes(ggml_type type, std::uint32_t n_in, std::uint32_t rows) {
    const std::uint64_t elements = std::uint64_t(rows) * n_in;
    if (legacy_block(type)) {
        const std::uint64_t units = elements / qk;
        return aux_offset_bytes(type, n_in, rows) +
               round_up(units * unit_aux_bytes(type), texel_bytes);
    }
    if (k_type(type)) {
        const std::uint64_t super_blocks = elements / qk_k;
        const std::uint64_t groups =
            type == ggml_type::q2_k ? (super_blocks + q2_k_group - 1) / q2_k_group : super_blocks;
        return groups * super_block_texels(type) * texel_bytes;
    }
    return round_up(elements * (type == ggml_type::f32 ? 4 : 2), texel_bytes);
}

void repack_rows(ggml_type type, std::uint32_t n_in, std::uint32_t rows, const std::uint8_t* src,
                 std::uint8_t* dst) {
    const std::uint64_t elements = std::uint64_t(rows) * n_in;
    if (legacy_block(type)) {
        repack_legacy(type, elements / qk, src, dst);
    } else if (k_type(type)) {
        repack_k(type, elements / qk_k, src, dst);
    } else {
        std::memcpy(dst, src, elements * (type == ggml_type::f32 ? 4 : 2));
    }
}

}  // namespace ordo::gpu
