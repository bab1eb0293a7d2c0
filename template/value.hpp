// value.hpp: the values a Jinja template computes with, with Python's data model: undefined,
// None, bool, int (64-bit), float, str (UTF-8), list, tuple, dict (insertion ordered),
// callables (macros, builtins, bound methods) and namespace objects.
//
// A value is small (a tag and a pointer or a scalar) and cheap to copy: strings, lists, dicts
// and callables are immutable and shared by reference, like Python objects. Lists and dicts
// never change after construction (transformers renders in jinja2's ImmutableSandboxed-
// Environment, where list.append and dict.update are refused), so the only mutable object is a
// namespace, whose attributes `{% set ns.x = ... %}` assigns.
//
// The server builds these from a chat op's msgpack fields and the CLI from JSON
// (value_json.hpp); neither needs anything but the constructors below. Not thread-safe to
// share across threads while rendering (reference counts are atomic, namespaces are not).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace ordo::jinja {

class value;
class renderer;

// Python's dict: insertion order, key equality as Python's == (1 == 1.0 == True).
struct dict_data {
    std::vector<std::pair<value, value>> entries;
    uint32_t depth = 1;  // nesting: 1 + the deepest list or dict value (set by value::dict)

    const value* find(const value& key) const;
    const value* find(std::string_view key) const;
    // Adds or replaces (a replaced key keeps its first position, as in Python).
    void set(value key, value v);

private:
    // String keys' positions, built once a dict has more than a handful of entries.
    std::unordered_map<std::string_view, size_t> _index;
};

struct list_data {
    std::vector<value> items;
    bool tuple = false;
    uint32_t depth = 1;  // nesting: 1 + the deepest list or dict item (set by value::list)
    // A named tuple's type and field names (groupby's (grouper, list)); empty otherwise.
    std::string type_name;
    std::vector<std::string> fields;
};

// Positional and keyword arguments of a call, already evaluated.
struct call_args {
    std::vector<value> positional;
    std::vector<std::pair<std::string, value>> keyword;
};

struct callable_data {
    std::string name;  // for messages and repr: "range", "m" (a macro), "str.strip"
    bool is_macro = false;
    std::function<value(renderer&, call_args&&)> fn;
    // Attributes read with `.name` (a recursive for loop's `loop` is callable and has them).
    std::shared_ptr<const dict_data> attrs;
};

struct namespace_data {
    dict_data attrs;
};

class value {
public:
    enum class kind : uint8_t {
        undefined,
        none,
        boolean,
        integer,
        floating,
        string,
        list,
        dict,
        callable,
        ns
    };

    value() : _v(undefined_t{}) {}  // undefined without a hint
    static value undefined(std::string hint);
    static value none() { return value(none_t{}); }
    value(bool b) : _v(b) {}
    value(int v) : _v(int64_t(v)) {}
    value(int64_t v) : _v(v) {}
    value(double v) : _v(v) {}
    value(std::string s) : _v(std::make_shared<const std::string>(std::move(s))) {}
    value(std::string_view s) : value(std::string(s)) {}
    value(const char* s) : value(std::string(s)) {}
    static value list(std::vector<value> items);
    static value tuple(std::vector<value> items);
    // A tuple whose items are also attributes: named_tuple("_GroupTuple", {"grouper", "list"},
    // ...).
    static value named_tuple(std::string type, std::vector<std::string> fields,
                             std::vector<value> items);
    static value dict(dict_data d);
    static value dict(std::vector<std::pair<std::string, value>> entries);
    static value callable(std::shared_ptr<const callable_data> c) { return value(std::move(c)); }
    static value make_namespace(std::shared_ptr<namespace_data> n) { return value(std::move(n)); }

    kind type() const { return kind(_v.index()); }
    bool is_undefined() const { return type() == kind::undefined; }
    bool is_none() const { return type() == kind::none; }
    bool is_bool() const { return type() == kind::boolean; }
    bool is_int() const { return type() == kind::integer; }
    bool is_float() const { return type() == kind::floating; }
    bool is_number() const { return is_int() || is_float() || is_bool(); }  // Python's Number
    bool is_string() const { return type() == kind::string; }
    bool is_list() const { return type() == kind::list; }  // list or tuple
    bool is_dict() const { return type() == kind::dict; }
    bool is_callable() const { return type() == kind::callable; }
    bool is_namespace() const { return type() == kind::ns; }

    bool as_bool() const { return std::get<bool>(_v); }
    int64_t as_int() const { return std::get<int64_t>(_v); }
    double as_float() const { return std::get<double>(_v); }
    // Numbers as Python sees them in arithmetic (bool is an int).
    int64_t int_of() const { return is_bool() ? int64_t(as_bool()) : as_int(); }
    double float_of() const { return is_float() ? as_float() : double(int_of()); }
    const std::string& as_string() const { return *std::get<str_ptr>(_v); }
    const list_data& as_list() const { return *std::get<list_ptr>(_v); }
    const std::vector<value>& items() const { return as_list().items; }
    bool is_tuple() const { return is_list() && as_list().tuple; }
    const dict_data& as_dict() const { return *std::get<dict_ptr>(_v); }
    const callable_data& as_callable() const { return *std::get<call_ptr>(_v); }
    const std::shared_ptr<namespace_data>& as_namespace() const { return std::get<ns_ptr>(_v); }
    // Why an undefined value is undefined ("'x' is undefined"); empty when unknown.
    const std::string& undefined_hint() const;

    // Nesting of lists and dicts: 0 for anything else (a namespace included).
    uint32_t depth() const;

    // Identity of a shared object (for `is sameas`); null for scalars.
    const void* identity() const;

private:
    struct undefined_t {
        std::shared_ptr<const std::string> hint;
    };
    struct none_t {};
    using str_ptr = std::shared_ptr<const std::string>;
    using list_ptr = std::shared_ptr<const list_data>;
    using dict_ptr = std::shared_ptr<const dict_data>;
    using call_ptr = std::shared_ptr<const callable_data>;
    using ns_ptr = std::shared_ptr<namespace_data>;

    static value sequence(std::vector<value> items, bool tuple);
    explicit value(undefined_t u) : _v(std::move(u)) {}
    explicit value(none_t n) : _v(n) {}
    explicit value(list_ptr l) : _v(std::move(l)) {}
    explicit value(dict_ptr d) : _v(std::move(d)) {}
    explicit value(call_ptr c) : _v(std::move(c)) {}
    explicit value(ns_ptr n) : _v(std::move(n)) {}

    // The order is kind's order.
    std::variant<undefined_t, none_t, bool, int64_t, double, str_ptr, list_ptr, dict_ptr, call_ptr,
                 ns_ptr>
        _v;
};

// Python's == between two values (int/float/bool compare numerically; lists, tuples and dicts
// element-wise, an object always equal to itself; undefined equals only undefined).
bool equals(const value& a, const value& b);
// The same, visiting at most `budget` containers (shared sub-lists make a value's expansion
// exponential in its size): throws compare_budget_exhausted past it.
struct compare_budget_exhausted {};
bool equals_within(const value& a, const value& b, uint64_t& budget);
// Python's truth value: "", 0, 0.0, None, empty containers and undefined are false.
bool truthy(const value& v);
// Python's type name, for messages: "str", "int", "NoneType", "dict", "list", "undefined".
std::string_view type_name(const value& v);

}  // namespace ordo::jinja
