// gguf_metadata.cpp: metadata values and the typed getters of gguf_file (see gguf.hpp).
//
// Pure functions over an already-validated gguf_file. The getters keep "absent"
// (gguf_key_missing) apart from "present with the wrong type" (gguf_key_wrong_type) so a loader
// can apply a documented default only when a key is truly absent.
#include <cmath>
#include <cstdio>
#include <limits>

#include "model/gguf.hpp"

namespace ordo::model {

std::string_view value_type_name(gguf_value_type t) {
    switch (t) {
        case gguf_value_type::u8:
            return "u8";
        case gguf_value_type::i8:
            return "i8";
        case gguf_value_type::u16:
            return "u16";
        case gguf_value_type::i16:
            return "i16";
        case gguf_value_type::u32:
            return "u32";
        case gguf_value_type::i32:
            return "i32";
        case gguf_value_type::f32:
            return "f32";
        case gguf_value_type::boolean:
            return "bool";
        case gguf_value_type::string:
            return "string";
        case gguf_value_type::array:
            return "array";
        case gguf_value_type::u64:
            return "u64";
        case gguf_value_type::i64:
            return "i64";
        case gguf_value_type::f64:
            return "f64";
    }
    return "unknown";
}

std::optional<int64_t> gguf_value::as_i64() const {
    return std::visit(
        [](const auto& v) -> std::optional<int64_t> {
            using T = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<T, bool> || !std::is_integral_v<T>) {
                return std::nullopt;
            } else if constexpr (std::is_same_v<T, uint64_t>) {
                if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
                    return std::nullopt;
                }
                return static_cast<int64_t>(v);
            } else {
                return static_cast<int64_t>(v);
            }
        },
        data);
}

std::optional<uint64_t> gguf_value::as_u64() const {
    if (const auto* u = std::get_if<uint64_t>(&data)) return *u;
    auto i = as_i64();
    if (!i || *i < 0) return std::nullopt;
    return static_cast<uint64_t>(*i);
}

std::optional<double> gguf_value::as_f64() const {
    if (const auto* f = std::get_if<float>(&data)) return *f;
    if (const auto* d = std::get_if<double>(&data)) return *d;
    return std::nullopt;
}

// ---- getters ----------------------------------------------------------------------------------

namespace {

error missing(std::string_view key) {
    return make_error("gguf_key_missing", "metadata key '" + std::string(key) + "' is absent");
}

error wrong_type(std::string_view key, const gguf_value& v, std::string_view want) {
    std::string got(value_type_name(v.type()));
    if (const auto* a = v.as_array()) got += " of " + std::string(value_type_name(a->elem_type));
    return make_error("gguf_key_wrong_type", "metadata key '" + std::string(key) + "' is " + got +
                                                 " = " + format_value(v, 4) + ", expected " +
                                                 std::string(want));
}

}  // namespace

result<uint32_t> gguf_file::get_u32(std::string_view key) const {
    const gguf_value* v = find(key);
    if (!v) return missing(key);
    auto u = v->as_u64();
    if (!u || *u > std::numeric_limits<uint32_t>::max()) return wrong_type(key, *v, "u32");
    return static_cast<uint32_t>(*u);
}

result<int64_t> gguf_file::get_i64(std::string_view key) const {
    const gguf_value* v = find(key);
    if (!v) return missing(key);
    auto i = v->as_i64();
    if (!i) return wrong_type(key, *v, "an integer that fits i64");
    return *i;
}

result<float> gguf_file::get_f32(std::string_view key) const {
    const gguf_value* v = find(key);
    if (!v) return missing(key);
    auto f = v->as_f64();
    if (!f) return wrong_type(key, *v, "f32");
    return static_cast<float>(*f);
}

result<bool> gguf_file::get_bool(std::string_view key) const {
    const gguf_value* v = find(key);
    if (!v) return missing(key);
    if (const auto* b = std::get_if<bool>(&v->data)) return *b;
    return wrong_type(key, *v, "bool");
}

result<std::string> gguf_file::get_string(std::string_view key) const {
    const gguf_value* v = find(key);
    if (!v) return missing(key);
    if (const auto* s = v->as_string()) return *s;
    return wrong_type(key, *v, "string");
}

result<const gguf_array*> gguf_file::get_array(std::string_view key) const {
    const gguf_value* v = find(key);
    if (!v) return missing(key);
    if (const auto* a = v->as_array()) return a;
    return wrong_type(key, *v, "array");
}

result<std::vector<std::string>> gguf_file::get_string_array(std::string_view key) const {
    auto a = get_array(key);
    if (!a) return a.err();
    if ((*a)->elem_type != gguf_value_type::string) {
        return wrong_type(key, *find(key), "array of string");
    }
    std::vector<std::string> out;
    out.reserve((*a)->items.size());
    for (const auto& item : (*a)->items) out.push_back(*item.as_string());
    return out;
}

result<std::vector<float>> gguf_file::get_f32_array(std::string_view key) const {
    auto a = get_array(key);
    if (!a) return a.err();
    auto t = (*a)->elem_type;
    if (t != gguf_value_type::f32 && t != gguf_value_type::f64) {
        return wrong_type(key, *find(key), "array of f32");
    }
    std::vector<float> out;
    out.reserve((*a)->items.size());
    for (const auto& item : (*a)->items) out.push_back(static_cast<float>(*item.as_f64()));
    return out;
}

result<std::vector<int32_t>> gguf_file::get_i32_array(std::string_view key) const {
    auto a = get_array(key);
    if (!a) return a.err();
    std::vector<int32_t> out;
    out.reserve((*a)->items.size());
    for (const auto& item : (*a)->items) {
        auto i = item.as_i64();
        if (!i || *i < std::numeric_limits<int32_t>::min() ||
            *i > std::numeric_limits<int32_t>::max()) {
            return wrong_type(key, *find(key), "array of integers that fit i32");
        }
        out.push_back(static_cast<int32_t>(*i));
    }
    return out;
}

result<uint32_t> gguf_file::get_u32_or(std::string_view key, uint32_t fallback) const {
    return has(key) ? get_u32(key) : result<uint32_t>(fallback);
}
result<int64_t> gguf_file::get_i64_or(std::string_view key, int64_t fallback) const {
    return has(key) ? get_i64(key) : result<int64_t>(fallback);
}
result<float> gguf_file::get_f32_or(std::string_view key, float fallback) const {
    return has(key) ? get_f32(key) : result<float>(fallback);
}
result<bool> gguf_file::get_bool_or(std::string_view key, bool fallback) const {
    return has(key) ? get_bool(key) : result<bool>(fallback);
}
result<std::string> gguf_file::get_string_or(std::string_view key, std::string fallback) const {
    return has(key) ? get_string(key) : result<std::string>(std::move(fallback));
}

// ---- formatting -------------------------------------------------------------------------------

namespace {

void append_escaped(std::string& out, std::string_view s) {
    constexpr size_t k_string_print_max = 200;  // keep `info` lines readable
    out += '"';
    size_t n = 0;
    for (unsigned char ch : s) {
        if (n++ == k_string_print_max) {
            out += "...";
            break;
        }
        if (ch == '"' || ch == '\\') {
            out += '\\';
            out += static_cast<char>(ch);
        } else if (ch < 0x20 || ch == 0x7f) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", ch);
            out += buf;
        } else {
            out += static_cast<char>(ch);
        }
    }
    out += '"';
}

}  // namespace

std::string format_value(const gguf_value& v, size_t items_max) {
    std::string out;
    std::visit(
        [&](const auto& x) {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<T, std::string>) {
                append_escaped(out, x);
            } else if constexpr (std::is_same_v<T, bool>) {
                out = x ? "true" : "false";
            } else if constexpr (std::is_same_v<T, gguf_array>) {
                out = "[" + std::string(value_type_name(x.elem_type)) + " x " +
                      std::to_string(x.items.size()) + "]";
                if (x.items.empty()) return;
                out += " [";
                for (size_t i = 0; i < x.items.size() && i < items_max; ++i) {
                    if (i) out += ", ";
                    out += format_value(x.items[i], items_max);
                }
                out += x.items.size() > items_max ? ", ...]" : "]";
            } else if constexpr (std::is_floating_point_v<T>) {
                char buf[40];
                std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(x));
                out = buf;
            } else {
                out = std::to_string(x);
            }
        },
        v.data);
    return out;
}

std::vector<tensor_type_count> tensor_type_histogram(const gguf_file& f) {
    std::vector<tensor_type_count> out;
    for (const auto& tr : k_ggml_types) {
        tensor_type_count c{tr.type};
        for (const auto& t : f.tensors()) {
            if (t.type != tr.type) continue;
            c.tensors++;
            c.bytes += t.n_bytes;
        }
        if (c.tensors > 0) out.push_back(c);
    }
    return out;
}

}  // namespace ordo::model
