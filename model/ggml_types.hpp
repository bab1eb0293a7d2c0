// ggml_types.hpp: the tensor element types a GGUF file can name, numbered exactly as GGUF/ggml
// number them, with each type's block geometry (elements per block, bytes per block).
//
// Used by the GGUF reader (to size and validate every tensor in the table), the writer, the
// reference loader (which accepts only the types `is_supported` says we can compute) and the
// `ordo-model` tool. Header-only, constexpr, no state.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>

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

constexpr bool is_known_type(uint32_t raw_id) { return find_type_traits(raw_id) != nullptr; }

// Traits of a valid enum value (every enumerator has a row; asserted by the table test).
constexpr const ggml_type_traits& type_traits(ggml_type t) {
    return *find_type_traits(static_cast<uint32_t>(t));
}

constexpr std::string_view type_name(ggml_type t) { return type_traits(t).name; }
constexpr uint32_t block_size(ggml_type t) { return type_traits(t).block_size; }
constexpr uint32_t block_bytes(ggml_type t) { return type_traits(t).block_bytes; }

// The four types the reference path and kernels compute with today.
constexpr bool is_supported(ggml_type t) {
    return t == ggml_type::f32 || t == ggml_type::f16 || t == ggml_type::q8_0 ||
           t == ggml_type::q4_0;
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

}  // namespace ordo::model
