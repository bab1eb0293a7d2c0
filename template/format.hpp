// format.hpp: turning values into text the way Python does: str() and repr() (what `{{ x }}`
// prints), float repr, json.dumps (the `tojson` filter transformers installs), printf-style
// `"%s" % x` and str.format.
//
// Every function here is bounded: output longer than `bytes_max` or nesting deeper than
// `depth_max` fails (template_failure) instead of growing without limit (a namespace can hold
// itself, and [x, x] nested n times is 2^n long).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "template/value.hpp"

namespace ordo::jinja {

struct format_limits {
    size_t bytes_max;
    uint32_t depth_max;
};

std::string float_repr(double d);             // Python repr(float): 1.0, 1e-05, inf
std::string string_repr(std::string_view s);  // Python repr(str): 'a', "it's", '\n'
std::string to_str(const value& v, const format_limits& lim);   // Python str()
std::string to_repr(const value& v, const format_limits& lim);  // Python repr()

struct json_options {
    std::optional<std::string> indent;  // None: one line; else the per-level indent text
    std::string item_separator = ", ";  // Python's defaults: ", " without indent, "," with
    std::string key_separator = ": ";
    bool sort_keys = false;
    bool ensure_ascii = false;
};
std::string to_json(const value& v, const json_options& opt, const format_limits& lim);

// `fmt % args` for a str on the left (printf-style, as Python's str.__mod__).
std::string percent_format(std::string_view fmt, const value& args, const format_limits& lim);
// str.format(*positional, **keyword).
std::string brace_format(std::string_view fmt, const call_args& args, const format_limits& lim);
// format(v, spec) as Python's format() builtin for str, int, float and bool.
std::string format_spec(const value& v, std::string_view spec, const format_limits& lim);

}  // namespace ordo::jinja
