// gguf.hpp: read-only view of a GGUF (v2/v3) model file: metadata, tensor table, tensor bytes.
//
// Owns the parsing and validation of the file format; knows nothing about what a Llama model
// is. Users: the reference loader and hyperparameters (model/), the gpu actor's weight upload,
// the tokenizer's vocab loader, the `ordo-model` tool, and the libFuzzer target.
//
// Trust model: the file is hostile. Every count, length, offset and size is checked against the
// bytes actually present before it is used, so a malformed file yields an ordo::error whose
// code names the class of problem ("gguf_truncated", "gguf_tensor_overlap", ...) and whose
// message names the key or tensor and the offsets involved. Nothing here throws, crashes or
// reads out of bounds.
//
// Layout (little-endian): "GGUF" u32 version, u64 n_tensors, u64 n_kv, then n_kv x
// {string key, u32 value_type, value}, then n_tensors x {string name, u32 n_dims, u64 ne[n_dims],
// u32 type, u64 offset}, padding to `general.alignment` (default 32), then the data section.
// Tensor offsets are relative to the data section start. A string is u64 length + bytes.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "actors/runtime/result.hpp"
#include "model/ggml_types.hpp"

namespace ordo::model {

inline constexpr uint32_t k_gguf_magic = 0x46554747;  // "GGUF" read as a little-endian u32
inline constexpr uint32_t k_gguf_version = 3;         // what the writer produces
inline constexpr uint32_t k_gguf_default_alignment = 32;
inline constexpr uint32_t k_gguf_max_dims = 4;
// Arrays nest (an array of arrays); real files use one level. Deeper nesting is refused so a
// crafted file cannot recurse the parser off the stack.
inline constexpr uint32_t k_gguf_array_depth_max = 4;
// Total metadata values (array items included) one file may hold. Each parsed value costs ~40
// bytes of memory, so without a cap a 1 GiB array of u8 would cost 40 GiB. Real files hold under
// 1M (a 128K-token vocab with scores, types and 280K merges); the cap leaves ample headroom.
inline constexpr uint64_t k_gguf_metadata_values_max = uint64_t{1} << 23;
// Tensors one file may list: the largest real models list a few tens of thousands.
inline constexpr uint64_t k_gguf_tensors_max = uint64_t{1} << 20;

// Metadata value type ids, as numbered on disk.
enum class gguf_value_type : uint32_t {
    u8 = 0,
    i8 = 1,
    u16 = 2,
    i16 = 3,
    u32 = 4,
    i32 = 5,
    f32 = 6,
    boolean = 7,
    string = 8,
    array = 9,
    u64 = 10,
    i64 = 11,
    f64 = 12,
};

std::string_view value_type_name(gguf_value_type t);

struct gguf_value;

// An array value: every item has type `elem_type` (items of an array of arrays are arrays).
struct gguf_array {
    gguf_value_type elem_type = gguf_value_type::u8;
    std::vector<gguf_value> items;
};

// One metadata value. The variant's index equals the on-disk type id (u8 = 0 ... f64 = 12), so
// `type()` is `data.index()`.
struct gguf_value {
    using storage = std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool,
                                 std::string, gguf_array, uint64_t, int64_t, double>;
    storage data;

    gguf_value() = default;
    template <typename T>
    requires std::is_constructible_v<storage, T> gguf_value(T v) : data(std::move(v)) {}

    gguf_value_type type() const { return static_cast<gguf_value_type>(data.index()); }

    // Any integer type (not bool), widened, when it fits; nullopt otherwise.
    std::optional<int64_t> as_i64() const;
    std::optional<uint64_t> as_u64() const;
    // f32 or f64 (f64 narrowed); nullopt for other types.
    std::optional<double> as_f64() const;
    const std::string* as_string() const { return std::get_if<std::string>(&data); }
    const gguf_array* as_array() const { return std::get_if<gguf_array>(&data); }
};

struct gguf_kv {
    std::string key;
    gguf_value value;
};

// One row of the tensor table, validated: n_dims in 1..4, every ne > 0, ne[0] a whole number of
// blocks, bytes inside the file, aligned, not overlapping any other tensor.
struct gguf_tensor_info {
    std::string name;
    ggml_type type = ggml_type::f32;
    uint32_t n_dims = 0;
    std::array<uint64_t, k_gguf_max_dims> ne{1, 1, 1, 1};  // unused dims are 1
    uint64_t offset = 0;                                   // relative to the data section start
    uint64_t n_elements = 0;                               // product of ne
    uint64_t n_bytes = 0;                                  // from the type's block geometry
    // The tensor's bytes inside the file's mapping: valid while the gguf_file that produced it
    // lives (moving the gguf_file keeps it valid; the mapping does not move).
    std::span<const uint8_t> data;
};

class gguf_file {
public:
    // Maps `path` read-only and parses it. Errors: gguf_io (cannot open/stat/map) plus every
    // format error listed in parse order in gguf.cpp; each message names `path` once, so a
    // caller passes it on unchanged (and prefixes the path only to its own later errors).
    static result<gguf_file> open(const std::string& path);
    // Parses a copy of `bytes` (tests, the fuzzer, files built in memory by gguf_writer).
    static result<gguf_file> from_bytes(std::span<const uint8_t> bytes);

    gguf_file(gguf_file&&) noexcept;
    gguf_file& operator=(gguf_file&&) noexcept;
    gguf_file(const gguf_file&) = delete;
    gguf_file& operator=(const gguf_file&) = delete;
    ~gguf_file();

    uint32_t version() const { return _version; }
    uint64_t alignment() const { return _alignment; }
    // Absolute start of tensor data. A file with no tensors (vocab-only) may end before the
    // padding that precedes it, so this can exceed file_size() only when tensors() is empty.
    uint64_t data_offset() const { return _data_offset; }
    uint64_t file_size() const { return _size; }
    std::span<const uint8_t> bytes() const { return {_base, static_cast<size_t>(_size)}; }

    // ---- metadata -------------------------------------------------------------------------
    const std::vector<gguf_kv>& metadata() const { return _kv; }
    const gguf_value* find(std::string_view key) const;  // nullptr when absent
    bool has(std::string_view key) const { return find(key) != nullptr; }

    // Typed getters. An absent key is error "gguf_key_missing"; a present key of the wrong type
    // (or an integer that does not fit) is "gguf_key_wrong_type". The *_or forms return the
    // default when the key is absent but still fail on a wrong type.
    result<uint32_t> get_u32(std::string_view key) const;  // any integer type that fits
    result<int64_t> get_i64(std::string_view key) const;   // any integer type that fits
    result<float> get_f32(std::string_view key) const;     // f32, or f64 narrowed
    result<bool> get_bool(std::string_view key) const;
    result<std::string> get_string(std::string_view key) const;
    result<std::vector<std::string>> get_string_array(std::string_view key) const;
    result<std::vector<float>> get_f32_array(std::string_view key) const;    // f32/f64 items
    result<std::vector<int32_t>> get_i32_array(std::string_view key) const;  // ints that fit
    result<const gguf_array*> get_array(std::string_view key) const;

    result<uint32_t> get_u32_or(std::string_view key, uint32_t fallback) const;
    result<int64_t> get_i64_or(std::string_view key, int64_t fallback) const;
    result<float> get_f32_or(std::string_view key, float fallback) const;
    result<bool> get_bool_or(std::string_view key, bool fallback) const;
    result<std::string> get_string_or(std::string_view key, std::string fallback) const;

    // ---- tensors --------------------------------------------------------------------------
    const std::vector<gguf_tensor_info>& tensors() const { return _tensors; }
    const gguf_tensor_info* find_tensor(std::string_view name) const;  // nullptr when absent

    // ok when every tensor's type is one we compute with (is_supported); otherwise
    // "gguf_unsupported_type" naming the first offending tensor and its type. The file itself
    // stays readable: the table lists such tensors.
    status require_supported_types() const;

private:
    gguf_file() = default;
    status parse();
    status place_tensors();
    void release();

    const uint8_t* _base = nullptr;  // start of the bytes (mapping or _owned.data())
    uint64_t _size = 0;
    void* _map = nullptr;  // mmap base when mapped, else nullptr
    std::vector<uint8_t> _owned;
    uint32_t _version = 0;
    uint64_t _alignment = k_gguf_default_alignment;
    uint64_t _data_offset = 0;
    std::vector<gguf_kv> _kv;
    std::vector<gguf_tensor_info> _tensors;
};

// Helper for loaders: "gguf_unsupported_type" unless the CPU reference computes with `t`'s type
// (is_supported).
status require_supported(const gguf_tensor_info& t);

// Renders a value for humans (`ordo-model info`): scalars as text, strings quoted, long arrays
// abbreviated to their type, length and first `items_max` items.
std::string format_value(const gguf_value& v, size_t items_max = 8);

// Tensors and bytes of one type in a file.
struct tensor_type_count {
    ggml_type type = ggml_type::f32;
    size_t tensors = 0;
    uint64_t bytes = 0;
};

// The file's tensor types, in type-id order, types with no tensor left out: `ordo-model info`
// prints it, the server's `model` op reports it.
std::vector<tensor_type_count> tensor_type_histogram(const gguf_file& f);

}  // namespace ordo::model
