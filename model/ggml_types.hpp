// ggml_types.hpp: the tensor element types a GGUF file can name, numbered exactly as GGUF/ggml
// number them, with each type's block geometry (elements per block, bytes per block) and the
// byte layout of every block type ordo decodes.
//
// Used by the GGUF reader (to size and validate every tensor in the table), the writer, the
// reference loader (which accepts only the types `is_supported` says the CPU reference computes
// with), model/quant (which encodes and decodes the blocks laid out here), the gpu upload
// (which repacks every type is_supported names: gpu/vk/weight_layout.hpp) and the `ordo-model`
// tool. Header-only, constexpr, no state.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "model/fp16.hpp"

namespace ordo::model {

// Values are the on-disk type ids. Gaps (4, 5, 31..33, 36..38) are ids ggml retired; a file
// that uses them is rejected as an unknown type.
enum class ggml_type : uint32_t {
    f32 = 0,
    f16 = 1,
    q4_0 = 2,
    q4_1 = 3,
    q5_0 = 6,
    q5_1 = 7,
    q8_0 = 8,
    q8_1 = 9,
    q2_k = 10,
    q3_k = 11,
    q4_k = 12,
    q5_k = 13,
    q6_k = 14,
    q8_k = 15,
    iq2_xxs = 16,
    iq2_xs = 17,
    iq3_xxs = 18,
    iq1_s = 19,
    iq4_nl = 20,
    iq3_s = 21,
    iq2_s = 22,
    iq4_xs = 23,
    i8 = 24,
    i16 = 25,
    i32 = 26,
    i64 = 27,
    f64 = 28,
    iq1_m = 29,
    bf16 = 30,
    tq1_0 = 34,
    tq2_0 = 35,
    mxfp4 = 39,
};

struct ggml_type_traits {
    ggml_type type;
    std::string_view name;  // lower-case, as llama.cpp prints it ("q8_0")
    uint32_t block_size;    // elements per block
    uint32_t block_bytes;   // bytes per block
};

// One row per known type. Block layouts follow ggml's block_* structs (e.g. Q8_0 = fp16 scale +
// 32 int8 = 34 bytes; Q4_K = 2 fp16 + 12 scale bytes + 128 nibble bytes = 144).
inline constexpr std::array<ggml_type_traits, 32> k_ggml_types{{
    {ggml_type::f32, "f32", 1, 4},
    {ggml_type::f16, "f16", 1, 2},
    {ggml_type::q4_0, "q4_0", 32, 18},
    {ggml_type::q4_1, "q4_1", 32, 20},
    {ggml_type::q5_0, "q5_0", 32, 22},
    {ggml_type::q5_1, "q5_1", 32, 24},
    {ggml_type::q8_0, "q8_0", 32, 34},
    {ggml_type::q8_1, "q8_1", 32, 36},
    {ggml_type::q2_k, "q2_k", 256, 84},
    {ggml_type::q3_k, "q3_k", 256, 110},
    {ggml_type::q4_k, "q4_k", 256, 144},
    {ggml_type::q5_k, "q5_k", 256, 176},
    {ggml_type::q6_k, "q6_k", 256, 210},
    {ggml_type::q8_k, "q8_k", 256, 292},
    {ggml_type::iq2_xxs, "iq2_xxs", 256, 66},
    {ggml_type::iq2_xs, "iq2_xs", 256, 74},
    {ggml_type::iq3_xxs, "iq3_xxs", 256, 98},
    {ggml_type::iq1_s, "iq1_s", 256, 50},
    {ggml_type::iq4_nl, "iq4_nl", 32, 18},
    {ggml_type::iq3_s, "iq3_s", 256, 110},
    {ggml_type::iq2_s, "iq2_s", 256, 82},
    {ggml_type::iq4_xs, "iq4_xs", 256, 136},
    {ggml_type::i8, "i8", 1, 1},
    {ggml_type::i16, "i16", 1, 2},
    {ggml_type::i32, "i32", 1, 4},
    {ggml_type::i64, "i64", 1, 8},
    {ggml_type::f64, "f64", 1, 8},
    {ggml_type::iq1_m, "iq1_m", 256, 56},
    {ggml_type::bf16, "bf16", 1, 2},
    {ggml_type::tq1_0, "tq1_0", 256, 54},
    {ggml_type::tq2_0, "tq2_0", 256, 66},
    {ggml_type::mxfp4, "mxfp4", 32, 17},
}};

// The traits of a raw on-disk type id, or nullptr when the id is unknown.
constexpr const ggml_type_traits* find_type_traits(uint32_t raw_id) {
    for (const auto& t : k_ggml_types) {
        if (static_cast<uint32_t>(t.type) == raw_id) return &t;
    }
    return nullptr;
}

constexpr bool is_known_type(uint32_t raw_id) {
    return find_type_traits(raw_id) != nullptr;
}

// Traits of a valid enum value (every enumerator has a row; asserted by the table test).
constexpr const ggml_type_traits& type_traits(ggml_type t) {
    return *find_type_traits(static_cast<uint32_t>(t));
}

constexpr std::string_view type_name(ggml_type t) {
    return type_traits(t).name;
}
constexpr uint32_t block_size(ggml_type t) {
    return type_traits(t).block_size;
}
constexpr uint32_t block_bytes(ggml_type t) {
    return type_traits(t).block_bytes;
}

// The types the CPU reference decodes and computes with (model/quant has a row codec for each):
// the float types and the block types llama.cpp's llama-quantize writes for Llama files. The
// rest (IQ*, TQ*, Q8_1, Q8_K, MXFP4, the integer types, F64) parse but are refused by the loader.
// The Vulkan kernels run all of these (gpu/vk/weights.hpp: kernels_run).
constexpr bool is_supported(ggml_type t) {
    switch (t) {
        case ggml_type::f32:
        case ggml_type::f16:
        case ggml_type::bf16:
        case ggml_type::q4_0:
        case ggml_type::q4_1:
        case ggml_type::q5_0:
        case ggml_type::q5_1:
        case ggml_type::q8_0:
        case ggml_type::q2_k:
        case ggml_type::q3_k:
        case ggml_type::q4_k:
        case ggml_type::q5_k:
        case ggml_type::q6_k:
            return true;
        default:
            return false;
    }
}

// "f32, f16, q4_0, ...": the supported types in table order, for messages. `last_sep` joins the
// last two (", " or " or ").
inline std::string supported_type_names(std::string_view last_sep = ", ") {
    std::string out;
    size_t left = 0;
    for (const auto& t : k_ggml_types) left += is_supported(t.type) ? 1 : 0;
    for (const auto& t : k_ggml_types) {
        if (!is_supported(t.type)) continue;
        out += t.name;
        --left;
        if (left > 1) out += ", ";
        if (left == 1) out += last_sep;
    }
    return out;
}

// Type by its name ("q8_0", "F16"; case-insensitive), for command-line options.
constexpr std::optional<ggml_type> type_from_name(std::string_view name) {
    auto lower = [](char c) { return (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c; };
    for (const auto& t : k_ggml_types) {
        if (t.name.size() != name.size()) continue;
        bool same = true;
        for (size_t i = 0; i < name.size() && same; ++i) same = lower(name[i]) == t.name[i];
        if (same) return t.type;
    }
    return std::nullopt;
}

// Bytes taken by n_elements of type t, or nullopt when n_elements is not a whole number of
// blocks or the size overflows 64 bits.
constexpr std::optional<uint64_t> bytes_for(ggml_type t, uint64_t n_elements) {
    const auto& tr = type_traits(t);
    if (n_elements % tr.block_size != 0) return std::nullopt;
    uint64_t blocks = n_elements / tr.block_size;
    if (blocks > std::numeric_limits<uint64_t>::max() / tr.block_bytes) return std::nullopt;
    return blocks * tr.block_bytes;
}

// ---- block layouts ---------------------------------------------------------------------------
//
// The bytes of one block of each type ordo decodes, little-endian and packed exactly as ggml
// writes them (no padding: every field is 1- or 2-byte aligned and the sizes below are asserted
// against the table above). model/quant.cpp encodes and decodes them; the formulas here are
// the definition it implements, written in ggml's operation order (float, left to right);
// every product in them is exact in float, so decoding equals ggml's bit for bit.
//
// 32-element blocks. Element i (0..31) uses a 4-bit value `nib(i)`: the low nibble of qs[i] for
// i < 16, the high nibble of qs[i - 16] for i >= 16. The 5-bit types add bit i of qh (read as a
// little-endian u32) as bit 4.
//   Q4_0  x = (nib - 8) * d
//   Q4_1  x = nib * d + m
//   Q5_0  x = (q5 - 16) * d                      q5 = nib | bit_i(qh) << 4
//   Q5_1  x = q5 * d + m
//   Q8_0  x = qs[i] * d
//
// K types: a super-block of 256 elements in sub-blocks (16 of 16 or 8 of 32), each with its own
// scale (and min) stored in a few bits, multiplied by the super-block's f16 d (and dmin).
// Element e is written as e = 128*h + 32*g + l (h half 0..1, g 0..3, l 0..31) or
// e = 64*c + 32*s + l (c chunk 0..3, s 0..1), whichever the type packs by:
//   Q2_K  q = (qs[32h + l] >> 2g) & 3 (0..3); sub-block j = e/16 has 4-bit scale sc and 4-bit
//         min mn in scales[j] (low, high nibble). x = (d * sc) * q - (dmin * mn).
//   Q3_K  q = ((qs[32h + l] >> 2g) & 3) - (bit (4h + g) of hmask[l] ? 0 : 4) (-4..3);
//         sub-block j = e/16 has a 6-bit scale v in 0..63 (low 4 bits: scales[j] low nibble for
//         j < 8, scales[j - 8] high nibble for j >= 8; high 2 bits: bits 2*(j/4) of
//         scales[8 + j%4]). x = (d * (v - 32)) * q.
//   Q4_K  q = nibble s of qs[32c + l] (s = 0 low, 1 high); sub-block j = e/32 = 2c + s has a
//         6-bit scale sc and min mn packed in the 12 scale bytes (k_scale_min_k4 below).
//         x = (d * sc) * q - (dmin * mn).
//   Q5_K  as Q4_K with q += 16 * bit j of qh[l]: x = (d * sc) * q5 - (dmin * mn).
//   Q6_K  q = (4-bit part | 2-bit part << 4) - 32 (-32..31): the 4-bit part is the low (g < 2)
//         or high (g >= 2) nibble of ql[64h + 32*(g % 2) + l], the 2-bit part is bits 2g..2g+1
//         of qh[32h + l]; sub-block j = e/16 has the int8 scale scales[j]. x = (d * sc) * q.
// BF16 (2 bytes, not a block): the top half of an IEEE f32.

struct block_q4_0 {
    f16_bits d;      // scale
    uint8_t qs[16];  // nibbles: low = elements 0..15, high = 16..31
};
struct block_q4_1 {
    f16_bits d;      // scale
    f16_bits m;      // offset (the block's minimum)
    uint8_t qs[16];  // nibbles as Q4_0
};
struct block_q5_0 {
    f16_bits d;      // scale
    uint8_t qh[4];   // bit i: bit 4 of element i
    uint8_t qs[16];  // low 4 bits as Q4_0
};
struct block_q5_1 {
    f16_bits d;      // scale
    f16_bits m;      // offset
    uint8_t qh[4];   // bit i: bit 4 of element i
    uint8_t qs[16];  // low 4 bits as Q4_0
};
struct block_q8_0 {
    f16_bits d;     // scale
    int8_t qs[32];  // quants
};
struct block_q2_k {
    uint8_t scales[16];  // sub-block j: scale (low nibble), min (high nibble)
    uint8_t qs[64];      // 2-bit quants, 4 per byte
    f16_bits d;          // super-block scale of the scales
    f16_bits dmin;       // super-block scale of the mins
};
struct block_q3_k {
    uint8_t hmask[32];   // the third bit of each quant (clear: subtract 4)
    uint8_t qs[64];      // low 2 bits of each quant, 4 per byte
    uint8_t scales[12];  // 16 6-bit scales, biased by 32
    f16_bits d;          // super-block scale
};
struct block_q4_k {
    f16_bits d;          // super-block scale of the scales
    f16_bits dmin;       // super-block scale of the mins
    uint8_t scales[12];  // 8 6-bit scales and 8 6-bit mins
    uint8_t qs[128];     // 4-bit quants
};
struct block_q5_k {
    f16_bits d;          // super-block scale of the scales
    f16_bits dmin;       // super-block scale of the mins
    uint8_t scales[12];  // 8 6-bit scales and 8 6-bit mins, as Q4_K
    uint8_t qh[32];      // bit 4 of each quant
    uint8_t qs[128];     // low 4 bits of each quant
};
struct block_q6_k {
    uint8_t ql[128];    // low 4 bits of each quant
    uint8_t qh[64];     // high 2 bits of each quant
    int8_t scales[16];  // 16 8-bit scales
    f16_bits d;         // super-block scale
};

static_assert(sizeof(block_q4_0) == block_bytes(ggml_type::q4_0));
static_assert(sizeof(block_q4_1) == block_bytes(ggml_type::q4_1));
static_assert(sizeof(block_q5_0) == block_bytes(ggml_type::q5_0));
static_assert(sizeof(block_q5_1) == block_bytes(ggml_type::q5_1));
static_assert(sizeof(block_q8_0) == block_bytes(ggml_type::q8_0));
static_assert(sizeof(block_q2_k) == block_bytes(ggml_type::q2_k));
static_assert(sizeof(block_q3_k) == block_bytes(ggml_type::q3_k));
static_assert(sizeof(block_q4_k) == block_bytes(ggml_type::q4_k));
static_assert(sizeof(block_q5_k) == block_bytes(ggml_type::q5_k));
static_assert(sizeof(block_q6_k) == block_bytes(ggml_type::q6_k));
static_assert(block_size(ggml_type::q4_k) == 256 && block_size(ggml_type::q5_0) == 32);

// Q4_K/Q5_K: sub-block j's 6-bit scale and min from the 12 packed bytes. Bytes 0..3 hold the
// scales of sub-blocks 0..3 in their low 6 bits, bytes 4..7 the mins of 0..3; sub-blocks 4..7
// keep their low 4 bits in bytes 8..11 (scale low nibble, min high nibble) and their top 2 bits
// in the spare top bits of bytes 0..3 (scales) and 4..7 (mins).
struct scale_min {
    uint8_t scale;
    uint8_t min;
};
constexpr scale_min k_scale_min_k4(const uint8_t* s, int j) {
    if (j < 4) return {uint8_t(s[j] & 63), uint8_t(s[j + 4] & 63)};
    return {uint8_t((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4)),
            uint8_t((s[j + 4] >> 4) | ((s[j] >> 6) << 4))};
}

}  // namespace ordo::model
