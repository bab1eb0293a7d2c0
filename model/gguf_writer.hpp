// gguf_writer.hpp: builds GGUF v3 files, valid ones and (on purpose) malformed ones.
//
// Owns the encoding side of the format described in gguf.hpp. Users: `ordo-model mk` (synthetic
// models), tests that round-trip through gguf_file, and the malformed-file test table and fuzz
// seed corpus, which need to break the format in controlled ways. The normal API (`set`,
// `add_tensor`) refuses to build an invalid file; the escape hatches (`append_kv`,
// `add_tensor_raw`, `overrides`, byte patches on the result) build whatever a test asks for.
//
// Tensor data is laid out in insertion order, each tensor starting at a multiple of the
// alignment relative to the data section (as llama.cpp lays it out).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "actors/runtime/result.hpp"
#include "model/ggml_types.hpp"
#include "model/gguf.hpp"

namespace ordo::model {

// A tensor as the writer will emit it. Every field is written verbatim, so a test can set an
// unknown type id, 7 dims, a zero dim or an offset pointing outside the file.
struct gguf_tensor_spec {
    std::string name;
    uint32_t type_raw = 0;     // ggml_type id as written
    std::vector<uint64_t> ne;  // written as n_dims = ne.size() (unless n_dims_raw is set)
    std::optional<uint32_t> n_dims_raw;
    std::optional<uint64_t> offset_raw;  // written instead of the computed data offset
    std::vector<uint8_t> bytes;          // appended to the data section (padded to the alignment)
};

// Header fields written instead of the true ones (malformed files for tests).
struct gguf_header_overrides {
    std::optional<uint32_t> magic;
    std::optional<uint32_t> version;
    std::optional<uint64_t> n_tensors;
    std::optional<uint64_t> n_kv;
};

// Where things landed in the last `to_bytes`, so tests can truncate or patch precise spots.
struct gguf_layout {
    uint64_t kv_start = 0;                      // first key/value pair (after the 24-byte header)
    uint64_t tensor_table_start = 0;            // first tensor-info record
    std::vector<uint64_t> tensor_info_offsets;  // absolute offset of each tensor-info record
    uint64_t data_offset = 0;                   // absolute start of the data section
    std::vector<uint64_t> tensor_data_offsets;  // each tensor's offset relative to data_offset
    uint64_t total_size = 0;
};

class gguf_writer {
public:
    gguf_writer() = default;

    // ---- metadata -------------------------------------------------------------------------
    // Sets key to value, replacing an earlier value of the same key (keeps its position).
    void set(std::string key, gguf_value value);
    void set_u8(std::string key, uint8_t v) { set(std::move(key), gguf_value(v)); }
    void set_i8(std::string key, int8_t v) { set(std::move(key), gguf_value(v)); }
    void set_u16(std::string key, uint16_t v) { set(std::move(key), gguf_value(v)); }
    void set_i16(std::string key, int16_t v) { set(std::move(key), gguf_value(v)); }
    void set_u32(std::string key, uint32_t v) { set(std::move(key), gguf_value(v)); }
    void set_i32(std::string key, int32_t v) { set(std::move(key), gguf_value(v)); }
    void set_u64(std::string key, uint64_t v) { set(std::move(key), gguf_value(v)); }
    void set_i64(std::string key, int64_t v) { set(std::move(key), gguf_value(v)); }
    void set_f32(std::string key, float v) { set(std::move(key), gguf_value(v)); }
    void set_f64(std::string key, double v) { set(std::move(key), gguf_value(v)); }
    void set_bool(std::string key, bool v) { set(std::move(key), gguf_value(v)); }
    void set_string(std::string key, std::string v) { set(std::move(key), gguf_value(v)); }
    void set_string_array(std::string key, const std::vector<std::string>& v);
    void set_f32_array(std::string key, std::span<const float> v);
    void set_i32_array(std::string key, std::span<const int32_t> v);
    void set_u32_array(std::string key, std::span<const uint32_t> v);

    // Sets `general.alignment` (u32) and lays tensor data out with it. Must be a power of two
    // (asserted; a test wanting a bad alignment uses append_kv/set with a raw value).
    void set_alignment(uint32_t alignment);

    // Appends a key/value without replacing (duplicate keys for tests).
    void append_kv(std::string key, gguf_value value);
    // Appends pre-encoded bytes right after the encoded key/values (an unknown value type, a
    // string whose length runs past the end, ...). Counted as `raw_kv_count` extra pairs.
    void append_raw_kv_bytes(std::span<const uint8_t> bytes, uint64_t raw_kv_count);

    // ---- tensors --------------------------------------------------------------------------
    // Adds a valid tensor: a known type, 1..4 dims all > 0, ne[0] a whole number of blocks,
    // `data.size()` equal to the type's byte size, a name not used before. Errors:
    // gguf_bad_dims, gguf_unsupported_type, gguf_bad_tensor_size, gguf_duplicate_tensor.
    status add_tensor(std::string name, ggml_type type, std::span<const uint64_t> ne,
                      std::span<const uint8_t> data);
    // Adds a tensor with no checks at all (malformed files).
    void add_tensor_raw(gguf_tensor_spec spec);

    // ---- output ---------------------------------------------------------------------------
    gguf_header_overrides overrides;  // applied by to_bytes / write_file

    std::vector<uint8_t> to_bytes(gguf_layout* layout = nullptr) const;
    // Writes to `path` atomically (write_file_atomically: a temporary file beside it, fsync,
    // rename). Error: gguf_io.
    status write_file(const std::string& path) const;

    size_t kv_count() const { return _kv.size(); }
    size_t tensor_count() const { return _tensors.size(); }

private:
    uint64_t alignment() const { return _alignment; }

    std::vector<gguf_kv> _kv;
    std::vector<uint8_t> _raw_kv;
    uint64_t _raw_kv_count = 0;
    std::vector<gguf_tensor_spec> _tensors;
    uint32_t _alignment = k_gguf_default_alignment;
};

// Encoding of single values, shared with tests that hand-craft records.
void gguf_put_u32(std::vector<uint8_t>& out, uint32_t v);
void gguf_put_u64(std::vector<uint8_t>& out, uint64_t v);
void gguf_put_string(std::vector<uint8_t>& out, std::string_view s);
void gguf_put_value(std::vector<uint8_t>& out, const gguf_value& v);  // payload, no type id

}  // namespace ordo::model
