// builtins.hpp: the filters, tests, global functions and str/dict/list methods templates can
// call, looked up by name. Each is written from Jinja's and Python's documented behaviour.
#pragma once

#include <string_view>

#include "template/value.hpp"

namespace ordo::jinja {

class renderer;

using filter_fn = value (*)(renderer&, const value& input, call_args&& args);
using test_fn = bool (*)(renderer&, const value& input, call_args&& args);

filter_fn find_filter(std::string_view name);  // null when there is no such filter
test_fn find_test(std::string_view name);
bool test_takes_argument(std::string_view name);  // divisibleby, eq, in, sameas, ...
// A global (range, namespace, dict, raise_exception, strftime_now, joiner, cycler...);
// undefined when there is none.
value find_global(std::string_view name);
// `obj.name` for the built-in types: a bound method, or undefined when there is none. Methods
// that would modify a list or dict fail when called, as in the immutable sandbox.
value find_method(renderer& r, const value& obj, std::string_view name);

}  // namespace ordo::jinja
