// request_fields.cpp: see request_fields.hpp.
#include "net/request_fields.hpp"

#include <cmath>
#include <cstdio>
#include <limits>

#include "scheduler/stop_matcher.hpp"

namespace ordo::net::fields {
namespace {

std::string_view key_of(const msgpack::object_kv& kv) {
    return {kv.key.via.str.ptr, kv.key.via.str.size};
}

std::string quoted(std::string_view key) {
    return quote(key);
}

// Length of the valid UTF-8 sequence starting at s[i] (1-4), or 0 when it is not one.
size_t utf8_sequence(std::string_view s, size_t i) {
    auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
    unsigned char c = byte(i);
    if (c < 0x80) return 1;
    size_t n = (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return 0;
    uint32_t cp = c & (0x7F >> n);
    for (size_t k = 1; k < n; k++) {
        if ((byte(i + k) & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (byte(i + k) & 0x3F);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are not valid UTF-8.
    static constexpr uint32_t min_for_length[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_for_length[n] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return 0;
    return n;
}

}  // namespace

std::string quote(std::string_view client_bytes, size_t bytes_max) {
    std::string out = "\"";
    size_t i = 0;
    while (i < client_bytes.size() && i < bytes_max) {
        size_t n = utf8_sequence(client_bytes, i);
        unsigned char c = static_cast<unsigned char>(client_bytes[i]);
        if (n == 0 || (n == 1 && (c < 0x20 || c == 0x7F))) {
            char esc[8];
            std::snprintf(esc, sizeof esc, "\\x%02x", c);
            out += esc;
            i++;
        } else {
            if (n == 1 && (c == '"' || c == '\\')) out += '\\';
            out.append(client_bytes.substr(i, n));
            i += n;
        }
    }
    if (i < client_bytes.size()) out += "...";
    return out + "\"";
}

std::string type_name(const msgpack::object& o) {
    switch (o.type) {
        case msgpack::type::NIL:
            return "nil";
        case msgpack::type::BOOLEAN:
            return "bool";
        case msgpack::type::POSITIVE_INTEGER:
            return "unsigned integer " + std::to_string(o.via.u64);
        case msgpack::type::NEGATIVE_INTEGER:
            return "negative integer " + std::to_string(o.via.i64);
        case msgpack::type::FLOAT32:
        case msgpack::type::FLOAT64: {
            char number[32];
            std::snprintf(number, sizeof number, "%g", o.via.f64);
            return std::string("float ") + number;
        }
        case msgpack::type::STR:
            return "string";
        case msgpack::type::BIN:
            return "binary";
        case msgpack::type::ARRAY:
            return "array";
        case msgpack::type::MAP:
            return "map";
        case msgpack::type::EXT:
            return "ext";
    }
    return "unknown";
}

error bad(std::string_view key, std::string_view expected, std::string_view got) {
    return make_error("bad_request", quoted(key) + " must be " + std::string(expected) + ", got " +
                                         std::string(got));
}

error bad(std::string_view key, std::string_view expected, const msgpack::object& got) {
    return bad(key, expected, type_name(got));
}

result<param_map> param_map::open(const msgpack::object& frame,
                                  std::initializer_list<std::string_view> allowed) {
    if (frame.type != msgpack::type::MAP) {
        return make_error("bad_request", "a request must be a map, got " + type_name(frame));
    }
    const auto& map = frame.via.map;
    for (uint32_t i = 0; i < map.size; i++) {
        if (map.ptr[i].key.type != msgpack::type::STR) {
            return make_error("bad_request",
                              "parameter keys must be strings, got " + type_name(map.ptr[i].key));
        }
        const std::string_view key = key_of(map.ptr[i]);
        bool known = key == "id" || key == "op";
        for (auto a : allowed) known = known || a == key;
        if (!known) return make_error("bad_request", "unknown parameter " + quoted(key));
        // Quadratic, but a map with only known keys given once has at most |allowed| + 2
        // entries, and the first duplicate stops the scan.
        for (uint32_t j = 0; j < i; j++) {
            if (key_of(map.ptr[j]) == key) {
                return make_error("bad_request", "parameter " + quoted(key) + " given twice");
            }
        }
    }
    return param_map(frame);
}

const msgpack::object* param_map::get(std::string_view key) const {
    const auto& map = _frame->via.map;
    for (uint32_t i = 0; i < map.size; i++) {
        if (key_of(map.ptr[i]) == key) return &map.ptr[i].val;
    }
    return nullptr;
}

result<std::string> read_string(std::string_view key, const msgpack::object& o, size_t max_bytes) {
    if (o.type != msgpack::type::STR) return bad(key, "a string", o);
    if (o.via.str.size > max_bytes) {
        return bad(key, "at most " + std::to_string(max_bytes) + " bytes",
                   std::to_string(o.via.str.size) + " bytes");
    }
    std::string s(o.via.str.ptr, o.via.str.size);
    if (!sched::is_valid_utf8(s)) return bad(key, "valid UTF-8", "invalid bytes");
    return s;
}

result<uint64_t> read_uint(std::string_view key, const msgpack::object& o, uint64_t min,
                           uint64_t max) {
    const std::string range =
        "an unsigned integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
    if (o.type != msgpack::type::POSITIVE_INTEGER) return bad(key, range, o);
    if (o.via.u64 < min || o.via.u64 > max) return bad(key, range, o);
    return o.via.u64;
}

result<double> read_number(std::string_view key, const msgpack::object& o) {
    double v = 0.0;
    switch (o.type) {
        case msgpack::type::POSITIVE_INTEGER:
            v = static_cast<double>(o.via.u64);
            break;
        case msgpack::type::NEGATIVE_INTEGER:
            v = static_cast<double>(o.via.i64);
            break;
        case msgpack::type::FLOAT32:
        case msgpack::type::FLOAT64:
            v = o.via.f64;
            break;
        default:
            return bad(key, "a number", o);
    }
    if (!std::isfinite(v)) return bad(key, "a finite number", o);
    return v;
}

result<bool> read_bool(std::string_view key, const msgpack::object& o) {
    if (o.type != msgpack::type::BOOLEAN) return bad(key, "true or false", o);
    return o.via.boolean;
}

result<std::vector<int32_t>> read_token_ids(std::string_view key, const msgpack::object& o,
                                            size_t max_count, uint32_t vocab_size) {
    if (o.type != msgpack::type::ARRAY) return bad(key, "an array of token ids", o);
    if (o.via.array.size > max_count) {
        return bad(key, "at most " + std::to_string(max_count) + " token ids",
                   std::to_string(o.via.array.size));
    }
    const uint64_t id_max =
        vocab_size > 0 ? vocab_size - 1u : uint64_t{std::numeric_limits<int32_t>::max()};
    std::vector<int32_t> ids;
    ids.reserve(o.via.array.size);
    for (uint32_t i = 0; i < o.via.array.size; i++) {
        const msgpack::object& e = o.via.array.ptr[i];
        if (e.type != msgpack::type::POSITIVE_INTEGER || e.via.u64 > id_max) {
            return bad(std::string(key) + "[" + std::to_string(i) + "]",
                       "a token id in [0, " + std::to_string(id_max) + "]", e);
        }
        ids.push_back(static_cast<int32_t>(e.via.u64));
    }
    return ids;
}

result<std::vector<std::string>> read_strings(std::string_view key, const msgpack::object& o,
                                              size_t max_count, size_t max_bytes) {
    if (o.type == msgpack::type::STR) {
        auto s = read_string(key, o, max_bytes);
        if (!s) return s.err();
        return std::vector<std::string>{std::move(*s)};
    }
    if (o.type != msgpack::type::ARRAY) return bad(key, "a string or an array of strings", o);
    if (o.via.array.size > max_count) {
        return bad(key, "at most " + std::to_string(max_count) + " strings",
                   std::to_string(o.via.array.size));
    }
    std::vector<std::string> out;
    for (uint32_t i = 0; i < o.via.array.size; i++) {
        auto s = read_string(std::string(key) + "[" + std::to_string(i) + "]", o.via.array.ptr[i],
                             max_bytes);
        if (!s) return s.err();
        out.push_back(std::move(*s));
    }
    return out;
}

}  // namespace ordo::net::fields
