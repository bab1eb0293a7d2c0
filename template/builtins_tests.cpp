// builtins_tests.cpp: Jinja's built-in tests (`x is defined`, `x is divisibleby 3` ...) and
// the global functions transformers' environment offers: range (capped as the sandbox caps it),
// namespace, dict, joiner, raise_exception and strftime_now.
#include <cstring>
#include <ctime>

#include "template/builtins.hpp"
#include "template/builtins_util.hpp"
#include "template/failure.hpp"

namespace ordo::jinja {

namespace {

using detail::bind;

const value& one_arg(std::string_view test, call_args& a) {
    if (a.positional.size() != 1 || !a.keyword.empty()) {
        fail("test '" + std::string(test) + "' takes one argument");
    }
    return a.positional[0];
}

bool t_boolean(renderer&, const value& v, call_args&&) {
    return v.is_bool();
}
// Python's callable(): jinja2's Undefined defines __call__, so it counts.
bool t_callable(renderer&, const value& v, call_args&&) {
    return v.is_callable() || v.is_undefined();
}
bool t_defined(renderer&, const value& v, call_args&&) {
    return !v.is_undefined();
}
bool t_undefined(renderer&, const value& v, call_args&&) {
    return v.is_undefined();
}
bool t_divisibleby(renderer& r, const value& v, call_args&& a) {
    value m = r.arith_mod(v, one_arg("divisibleby", a));
    return equals(m, value(0));
}
bool t_eq(renderer& r, const value& v, call_args&& a) {
    return r.eq(v, one_arg("eq", a));
}
bool t_ne(renderer& r, const value& v, call_args&& a) {
    return !r.eq(v, one_arg("ne", a));
}
bool t_lt(renderer& r, const value& v, call_args&& a) {
    return r.less(v, one_arg("lt", a));
}
bool t_gt(renderer& r, const value& v, call_args&& a) {
    return r.less(one_arg("gt", a), v);
}
bool t_le(renderer& r, const value& v, call_args&& a) {
    const value& o = one_arg("le", a);
    return r.less(v, o) || r.eq(v, o);
}
bool t_ge(renderer& r, const value& v, call_args&& a) {
    const value& o = one_arg("ge", a);
    return r.less(o, v) || r.eq(v, o);
}
bool t_escaped(renderer&, const value&, call_args&&) {
    return false;
}
bool t_even(renderer& r, const value& v, call_args&&) {
    return equals(r.arith_mod(v, value(2)), value(0));
}
bool t_odd(renderer& r, const value& v, call_args&&) {
    return equals(r.arith_mod(v, value(2)), value(1));
}
bool t_false(renderer&, const value& v, call_args&&) {
    return v.is_bool() && !v.as_bool();
}
bool t_true(renderer&, const value& v, call_args&&) {
    return v.is_bool() && v.as_bool();
}
bool t_filter(renderer&, const value& v, call_args&&) {
    return v.is_string() && find_filter(v.as_string()) != nullptr;
}
bool t_test(renderer&, const value& v, call_args&&) {
    return v.is_string() && find_test(v.as_string()) != nullptr;
}
bool t_float(renderer&, const value& v, call_args&&) {
    return v.is_float();
}
bool t_integer(renderer&, const value& v, call_args&&) {
    return v.is_int();
}
bool t_number(renderer&, const value& v, call_args&&) {
    return v.is_number();
}
bool t_string(renderer&, const value& v, call_args&&) {
    return v.is_string();
}
bool t_mapping(renderer&, const value& v, call_args&&) {
    return v.is_dict();
}
// Undefined is iterable (empty) and a sequence (it has __len__ and __getitem__) in jinja2.
bool t_sequence(renderer&, const value& v, call_args&&) {
    return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
}
bool t_iterable(renderer&, const value& v, call_args&&) {
    return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
}
bool t_in(renderer& r, const value& v, call_args&& a) {
    return r.contains(one_arg("in", a), v);
}
bool t_lower(renderer& r, const value& v, call_args&&) {
    return detail::py_islower(r.str(v));
}
bool t_upper(renderer& r, const value& v, call_args&&) {
    return detail::py_isupper(r.str(v));
}
bool t_none(renderer&, const value& v, call_args&&) {
    return v.is_none();
}
// Identity: shared objects by address, scalars by type and value (Python caches small ints
// and None/True/False; templates compare those).
bool t_sameas(renderer& r, const value& v, call_args&& a) {
    const value& o = one_arg("sameas", a);
    if (v.identity() != nullptr || o.identity() != nullptr) return v.identity() == o.identity();
    return v.type() == o.type() && r.eq(v, o);
}

struct named_test {
    std::string_view name;
    test_fn fn;
};

constexpr named_test k_tests[] = {
    {"!=", t_ne},
    {"<", t_lt},
    {"<=", t_le},
    {"==", t_eq},
    {">", t_gt},
    {">=", t_ge},
    {"boolean", t_boolean},
    {"callable", t_callable},
    {"defined", t_defined},
    {"divisibleby", t_divisibleby},
    {"eq", t_eq},
    {"equalto", t_eq},
    {"escaped", t_escaped},
    {"even", t_even},
    {"false", t_false},
    {"filter", t_filter},
    {"float", t_float},
    {"ge", t_ge},
    {"greaterthan", t_gt},
    {"gt", t_gt},
    {"in", t_in},
    {"integer", t_integer},
    {"iterable", t_iterable},
    {"le", t_le},
    {"lessthan", t_lt},
    {"lower", t_lower},
    {"lt", t_lt},
    {"mapping", t_mapping},
    {"ne", t_ne},
    {"none", t_none},
    {"number", t_number},
    {"odd", t_odd},
    {"sameas", t_sameas},
    {"sequence", t_sequence},
    {"string", t_string},
    {"test", t_test},
    {"true", t_true},
    {"undefined", t_undefined},
    {"upper", t_upper},
};

// ---- globals --------------------------------------------------------------------------------

// The sandbox's cap on range(): larger ranges fail instead of allocating.
constexpr int64_t k_range_max = 100000;

value g_range(renderer& r, call_args&& a) {
    if (!a.keyword.empty()) fail("range() takes no keyword arguments");
    if (a.positional.empty() || a.positional.size() > 3) fail("range expected 1 to 3 arguments");
    int64_t p[3] = {0, 0, 1};
    for (const value& v : a.positional) {
        if (!v.is_int() && !v.is_bool()) {
            fail("'" + std::string(type_name(v)) + "' object cannot be interpreted as an integer");
        }
    }
    if (a.positional.size() == 1) {
        p[1] = a.positional[0].int_of();
    } else {
        p[0] = a.positional[0].int_of();
        p[1] = a.positional[1].int_of();
        if (a.positional.size() == 3) p[2] = a.positional[2].int_of();
    }
    if (p[2] == 0) fail("range() arg 3 must not be zero");
    const __int128 span = p[2] > 0 ? __int128(p[1]) - p[0] : __int128(p[0]) - p[1];
    const __int128 step = p[2] > 0 ? p[2] : -__int128(p[2]);
    const __int128 n = span <= 0 ? 0 : (span + step - 1) / step;
    if (n > k_range_max) {
        fail("range too big: the sandbox blocks ranges larger than " + std::to_string(k_range_max));
    }
    std::vector<value> out;
    out.reserve(size_t(n));
    for (__int128 i = 0; i < n; ++i) out.emplace_back(int64_t(p[0] + i * p[2]));
    return r.new_list(std::move(out));
}

// dict(mapping or pairs, **kw), the shared part of dict() and namespace().
dict_data dict_from(renderer& r, call_args&& a, std::string_view fn) {
    if (a.positional.size() > 1) fail(std::string(fn) + "() takes at most 1 positional argument");
    dict_data d;
    if (!a.positional.empty()) {
        const value& src = a.positional[0];
        if (src.is_dict()) {
            d = src.as_dict();
        } else {
            for (const value& item : r.iterate(src)) {
                auto kv = r.iterate(item);
                if (kv.size() != 2) fail(std::string(fn) + "(): sequence elements must be pairs");
                r.check_hashable(kv[0]);
                d.set(kv[0], kv[1]);
            }
        }
    }
    for (auto& [k, v] : a.keyword) d.set(value(k), std::move(v));
    return d;
}

value g_dict(renderer& r, call_args&& a) {
    return r.new_dict(dict_from(r, std::move(a), "dict"));
}

value g_namespace(renderer& r, call_args&& a) {
    auto n = r.new_namespace();
    n->attrs = dict_from(r, std::move(a), "namespace");
    return value::make_namespace(n);
}

value g_joiner(renderer&, call_args&& a) {
    auto p = bind("joiner", std::move(a), {"sep"});
    const std::string sep = p[0].is_string() ? p[0].as_string() : ", ";
    auto used = std::make_shared<bool>(false);
    auto c = std::make_shared<callable_data>();
    c->name = "joiner";
    c->fn = [sep, used](renderer&, call_args&&) -> value {
        if (!*used) {
            *used = true;
            return value("");
        }
        return value(sep);
    };
    return value::callable(c);
}

value g_raise_exception(renderer& r, call_args&& a) {
    auto p = bind("raise_exception", std::move(a), {"message"});
    fail(r.str(p[0]));
}

// strftime_now(fmt): the render's "now" (pinned by render_options::now) through C's strftime,
// which is what Python's datetime.strftime calls on Linux.
value g_strftime_now(renderer& r, call_args&& a) {
    auto p = bind("strftime_now", std::move(a), {"format"});
    const std::string fmt = r.str(p[0]);
    if (fmt.size() > 1024) fail("strftime_now: format too long");
    if (fmt.empty()) return value("");
    std::string buf(fmt.size() * 64 + 64, '\0');
    const size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &r.now());
    if (n == 0) fail("strftime_now: the formatted date is empty or too long");
    buf.resize(n);
    return value(std::move(buf));
}

struct named_global {
    std::string_view name;
    value (*fn)(renderer&, call_args&&);
};

constexpr named_global k_globals[] = {
    {"dict", g_dict},           {"joiner", g_joiner},
    {"namespace", g_namespace}, {"raise_exception", g_raise_exception},
    {"range", g_range},         {"strftime_now", g_strftime_now},
};

}  // namespace

test_fn find_test(std::string_view name) {
    for (const auto& t : k_tests) {
        if (t.name == name) return t.fn;
    }
    return nullptr;
}

bool test_takes_argument(std::string_view name) {
    static constexpr std::string_view k_with_argument[] = {
        "!=", "<",           "<=", "==", ">",  ">=",       "divisibleby", "eq", "equalto",
        "ge", "greaterthan", "gt", "in", "le", "lessthan", "lt",          "ne", "sameas"};
    for (std::string_view n : k_with_argument) {
        if (n == name) return true;
    }
    return false;
}

value find_global(std::string_view name) {
    for (const auto& g : k_globals) {
        if (g.name == name) {
            // One shared callable per global for the whole process; they hold no state.
            static std::vector<value> cache = [] {
                std::vector<value> out;
                for (const auto& h : k_globals) {
                    auto c = std::make_shared<callable_data>();
                    c->name = std::string(h.name);
                    c->fn = h.fn;
                    out.push_back(value::callable(c));
                }
                return out;
            }();
            return cache[size_t(&g - k_globals)];
        }
    }
    return value();
}

}  // namespace ordo::jinja
