// request_fields.hpp: typed reading of request parameters from a msgpack map, with
// bad_request errors that name the key. Used by the op parser (net/ops.cpp) and the envelope
// parser; knows nothing about what the ops mean.
//
// Strict types (docs/protocol.md §2): an integer parameter must be a msgpack integer (a float,
// even 2.0, is a wrong type); a float parameter takes floats and integers. Everything a message
// quotes back from the client (keys, op names) goes through `quote`, so an error message is
// always valid UTF-8 whatever bytes the client sent.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <msgpack.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "actors/runtime/result.hpp"

namespace ordo::net::fields {

// Parameter keys of one request, checked up front: the frame is a map, every key is a string,
// known (or "id"/"op") and given once. `get` then finds a parameter by name.
class param_map {
public:
    static result<param_map> open(const msgpack::object& frame,
                                  std::initializer_list<std::string_view> allowed);
    const msgpack::object* get(std::string_view key) const;

private:
    explicit param_map(const msgpack::object& frame) : _frame(&frame) {}
    const msgpack::object* _frame;
};

// Client bytes as a quoted, printable, valid-UTF-8 string for an error message: invalid UTF-8
// and control bytes become \xNN escapes, and it is cut at `bytes_max` bytes of input.
inline constexpr size_t quote_bytes_max = 64;
std::string quote(std::string_view client_bytes, size_t bytes_max = quote_bytes_max);

// What a msgpack value is, in words ("string", "float", "negative integer", ...).
std::string type_name(const msgpack::object& o);

error bad(std::string_view key, std::string_view expected, const msgpack::object& got);
error bad(std::string_view key, std::string_view expected, std::string_view got);

result<std::string> read_string(std::string_view key, const msgpack::object& o, size_t max_bytes);
// An unsigned integer in [min, max]; a float or negative integer is refused.
result<uint64_t> read_uint(std::string_view key, const msgpack::object& o, uint64_t min,
                           uint64_t max);
// Any finite number (integers included).
result<double> read_number(std::string_view key, const msgpack::object& o);
result<bool> read_bool(std::string_view key, const msgpack::object& o);
// An array of at most max_count token ids, each < vocab_size (when not 0) and < 2^31.
result<std::vector<int32_t>> read_token_ids(std::string_view key, const msgpack::object& o,
                                            size_t max_count, uint32_t vocab_size);
// A string or an array of strings.
result<std::vector<std::string>> read_strings(std::string_view key, const msgpack::object& o,
                                              size_t max_count, size_t max_bytes);

}  // namespace ordo::net::fields
