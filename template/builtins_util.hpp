// builtins_util.hpp: helpers shared by the builtins_*.cpp files (not part of the engine's
// interface): argument binding with Python's positional/keyword rules, Jinja's attribute
// getter ("a.b.0"), and Python's str operations on UTF-8 (strip, split, find ...).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "template/renderer.hpp"

namespace ordo::jinja::detail {

// Binds call arguments to parameter names in order; a missing one is undefined. Fails on an
// unknown keyword, a duplicate, or too many positional arguments.
std::vector<value> bind(std::string_view fn, call_args&& args,
                        std::initializer_list<std::string_view> params);
inline bool given(const value& v) {
    return !v.is_undefined();
}
value or_default(const value& v, value dflt);

// Jinja's make_attrgetter: "a.b.0" looked up with getitem part by part.
value get_path(renderer& r, const value& item, const value& path);
// Lowercases strings (Jinja's ignore_case for sort, unique, min, max, dictsort).
value fold_case(const value& v);

// Python str methods on UTF-8 text.
std::string py_strip(std::string_view s, const value& chars, bool left, bool right);
std::vector<std::string> py_split(std::string_view s, const value& sep, int64_t maxsplit,
                                  bool from_right);
std::vector<std::string> py_splitlines(std::string_view s, bool keepends);
std::string py_replace(std::string_view s, std::string_view old, std::string_view with,
                       int64_t count);
// Code point index of `sub` in s (find) or from the right (rfind); -1 when absent.
int64_t py_find(std::string_view s, std::string_view sub, bool from_right);
int64_t py_count(std::string_view s, std::string_view sub);
std::string py_center(std::string_view s, int64_t width, std::string_view fill);
bool py_islower(std::string_view s);
bool py_isupper(std::string_view s);

}  // namespace ordo::jinja::detail
