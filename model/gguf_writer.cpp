// gguf_writer.cpp: encoding GGUF v3 (see gguf_writer.hpp). Pure byte building plus one atomic
// file write; no state shared with anything else.
#include "model/gguf_writer.hpp"

#include <cassert>
#include <cstring>
#include <set>

#include "actors/runtime/atomic_file.hpp"

namespace ordo::model {

// ---- value encoding ---------------------------------------------------------------------------

namespace {

template <typename T>
void put_pod(std::vector<uint8_t>& out, T v) {
    uint8_t buf[sizeof(T)];
    std::memcpy(buf, &v, sizeof(T));
    out.insert(out.end(), buf, buf + sizeof(T));
}

void pad_to(std::vector<uint8_t>& out, uint64_t alignment) {
    while (out.size() % alignment != 0) out.push_back(0);
}

}  // namespace

void gguf_put_u32(std::vector<uint8_t>& out, uint32_t v) {
    put_pod(out, v);
}
void gguf_put_u64(std::vector<uint8_t>& out, uint64_t v) {
    put_pod(out, v);
}

void gguf_put_string(std::vector<uint8_t>& out, std::string_view s) {
    put_pod<uint64_t>(out, s.size());
    out.insert(out.end(), s.begin(), s.end());
}

void gguf_put_value(std::vector<uint8_t>& out, const gguf_value& v) {
    std::visit(
        [&](const auto& x) {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<T, std::string>) {
                gguf_put_string(out, x);
            } else if constexpr (std::is_same_v<T, bool>) {
                out.push_back(x ? 1 : 0);
            } else if constexpr (std::is_same_v<T, gguf_array>) {
                put_pod<uint32_t>(out, static_cast<uint32_t>(x.elem_type));
                put_pod<uint64_t>(out, x.items.size());
                for (const auto& item : x.items) {
                    // A mixed array cannot be encoded; building one is a programming error.
                    assert(item.type() == x.elem_type);
                    gguf_put_value(out, item);
                }
            } else {
                put_pod(out, x);
            }
        },
        v.data);
}

// ---- metadata ---------------------------------------------------------------------------------

void gguf_writer::set(std::string key, gguf_value value) {
    for (auto& kv : _kv) {
        if (kv.key == key) {
            kv.value = std::move(value);
            return;
        }
    }
    _kv.push_back({std::move(key), std::move(value)});
}

namespace {

template <typename T>
gguf_value make_array(gguf_value_type elem, std::span<const T> v) {
    gguf_array a;
    a.elem_type = elem;
    a.items.reserve(v.size());
    for (const T& x : v) a.items.emplace_back(x);
    return gguf_value(std::move(a));
}

}  // namespace

void gguf_writer::set_string_array(std::string key, const std::vector<std::string>& v) {
    set(std::move(key), make_array<std::string>(gguf_value_type::string, std::span(v)));
}
void gguf_writer::set_f32_array(std::string key, std::span<const float> v) {
    set(std::move(key), make_array(gguf_value_type::f32, v));
}
void gguf_writer::set_i32_array(std::string key, std::span<const int32_t> v) {
    set(std::move(key), make_array(gguf_value_type::i32, v));
}
void gguf_writer::set_u32_array(std::string key, std::span<const uint32_t> v) {
    set(std::move(key), make_array(gguf_value_type::u32, v));
}

void gguf_writer::set_alignment(uint32_t alignment) {
    assert(alignment != 0 && (alignment & (alignment - 1)) == 0);
    _alignment = alignment;
    set_u32("general.alignment", alignment);
}

void gguf_writer::append_kv(std::string key, gguf_value value) {
    _kv.push_back({std::move(key), std::move(value)});
}

void gguf_writer::append_raw_kv_bytes(std::span<const uint8_t> bytes, uint64_t raw_kv_count) {
    _raw_kv.insert(_raw_kv.end(), bytes.begin(), bytes.end());
    _raw_kv_count += raw_kv_count;
}

// ---- tensors ----------------------------------------------------------------------------------

status gguf_writer::add_tensor(std::string name, ggml_type type, std::span<const uint64_t> ne,
                               std::span<const uint8_t> data) {
    if (ne.empty() || ne.size() > k_gguf_max_dims) {
        return make_error("gguf_bad_dims", "tensor '" + name + "': " + std::to_string(ne.size()) +
                                               " dims, need 1.." + std::to_string(k_gguf_max_dims));
    }
    uint64_t n = 1;
    for (uint64_t d : ne) {
        if (d == 0 || n > UINT64_MAX / d) {
            return make_error("gguf_bad_dims", "tensor '" + name + "': zero or overflowing dim");
        }
        n *= d;
    }
    if (ne[0] % block_size(type) != 0) {
        return make_error("gguf_bad_shape",
                          "tensor '" + name + "': ne[0] = " + std::to_string(ne[0]) +
                              " is not a multiple of " + std::to_string(block_size(type)));
    }
    auto bytes = bytes_for(type, n);
    if (!bytes || *bytes != data.size()) {
        return make_error("gguf_bad_tensor_size",
                          "tensor '" + name + "': got " + std::to_string(data.size()) +
                              " bytes, type " + std::string(type_name(type)) + " needs " +
                              (bytes ? std::to_string(*bytes) : std::string("too many")));
    }
    for (const auto& t : _tensors) {
        if (t.name == name) {
            return make_error("gguf_duplicate_tensor", "tensor '" + name + "' added twice");
        }
    }
    gguf_tensor_spec spec;
    spec.name = std::move(name);
    spec.type_raw = static_cast<uint32_t>(type);
    spec.ne.assign(ne.begin(), ne.end());
    spec.bytes.assign(data.begin(), data.end());
    _tensors.push_back(std::move(spec));
    return {};
}

void gguf_writer::add_tensor_raw(gguf_tensor_spec spec) {
    _tensors.push_back(std::move(spec));
}

// ---- output -----------------------------------------------------------------------------------

std::vector<uint8_t> gguf_writer::to_bytes(gguf_layout* layout) const {
    gguf_layout lay;
    std::vector<uint8_t> out;
    put_pod<uint32_t>(out, overrides.magic.value_or(k_gguf_magic));
    put_pod<uint32_t>(out, overrides.version.value_or(k_gguf_version));
    put_pod<uint64_t>(out, overrides.n_tensors.value_or(_tensors.size()));
    put_pod<uint64_t>(out, overrides.n_kv.value_or(_kv.size() + _raw_kv_count));
    lay.kv_start = out.size();
    for (const auto& kv : _kv) {
        gguf_put_string(out, kv.key);
        put_pod<uint32_t>(out, static_cast<uint32_t>(kv.value.type()));
        gguf_put_value(out, kv.value);
    }
    out.insert(out.end(), _raw_kv.begin(), _raw_kv.end());

    // Data offsets first: each tensor starts at the next multiple of the alignment.
    uint64_t cursor = 0;
    for (const auto& t : _tensors) {
        lay.tensor_data_offsets.push_back(cursor);
        cursor += t.bytes.size();
        cursor += (_alignment - cursor % _alignment) % _alignment;
    }
    lay.tensor_table_start = out.size();
    for (size_t i = 0; i < _tensors.size(); ++i) {
        const auto& t = _tensors[i];
        lay.tensor_info_offsets.push_back(out.size());
        gguf_put_string(out, t.name);
        put_pod<uint32_t>(out, t.n_dims_raw.value_or(static_cast<uint32_t>(t.ne.size())));
        for (uint64_t d : t.ne) put_pod<uint64_t>(out, d);
        put_pod<uint32_t>(out, t.type_raw);
        put_pod<uint64_t>(out, t.offset_raw.value_or(lay.tensor_data_offsets[i]));
    }
    if (!_tensors.empty()) pad_to(out, _alignment);
    lay.data_offset = out.size();
    for (const auto& t : _tensors) {
        out.insert(out.end(), t.bytes.begin(), t.bytes.end());
        pad_to(out, _alignment);
    }
    lay.total_size = out.size();
    if (layout) *layout = std::move(lay);
    return out;
}

status gguf_writer::write_file(const std::string& path) const {
    std::vector<uint8_t> bytes = to_bytes();
    return write_file_atomically(path, bytes, "gguf_io");
}

}  // namespace ordo::model
