// builtins_methods.cpp: methods of the built-in types as templates call them
// (`s.strip()`, `s.split('</think>')`, `d.items()`, `d.get('k', 0)` ...), with Python's
// semantics on UTF-8 (indexes count code points). Methods that modify a list or dict exist but
// fail when called, as jinja2's ImmutableSandboxedEnvironment (transformers' setting) refuses
// them.
#include <algorithm>
#include <cmath>

#include "template/builtins.hpp"
#include "template/builtins_util.hpp"
#include "template/failure.hpp"
#include "template/unicode.hpp"

namespace ordo::jinja {

namespace {

using detail::bind;
using detail::given;
using method_fn = value (*)(renderer&, const value& self, call_args&&);

int64_t int_arg(const value& v, int64_t dflt) {
    if (!given(v) || v.is_none()) return dflt;
    if (!v.is_int() && !v.is_bool())
        fail("an integer is required, not " + std::string(type_name(v)));
    return v.int_of();
}

const std::string& str_arg(const value& v, std::string_view what) {
    if (!v.is_string()) fail(std::string(what) + " must be str, not " + std::string(type_name(v)));
    return v.as_string();
}

std::string_view self_str(const value& self) {
    return self.as_string();
}

// ---- str ------------------------------------------------------------------------------------

value s_strip(renderer& r, const value& self, call_args&& a) {
    auto p = bind("strip", std::move(a), {"chars"});
    return r.new_string(detail::py_strip(self_str(self), p[0], true, true));
}
value s_lstrip(renderer& r, const value& self, call_args&& a) {
    auto p = bind("lstrip", std::move(a), {"chars"});
    return r.new_string(detail::py_strip(self_str(self), p[0], true, false));
}
value s_rstrip(renderer& r, const value& self, call_args&& a) {
    auto p = bind("rstrip", std::move(a), {"chars"});
    return r.new_string(detail::py_strip(self_str(self), p[0], false, true));
}

value split_common(renderer& r, const value& self, call_args&& a, bool from_right) {
    auto p = bind(from_right ? "rsplit" : "split", std::move(a), {"sep", "maxsplit"});
    if (given(p[0]) && !p[0].is_none()) str_arg(p[0], "separator");
    std::vector<value> out;
    for (auto& part : detail::py_split(self_str(self), p[0], int_arg(p[1], -1), from_right)) {
        out.emplace_back(std::move(part));
    }
    return r.new_list(std::move(out));
}
value s_split(renderer& r, const value& self, call_args&& a) {
    return split_common(r, self, std::move(a), false);
}
value s_rsplit(renderer& r, const value& self, call_args&& a) {
    return split_common(r, self, std::move(a), true);
}

value s_splitlines(renderer& r, const value& self, call_args&& a) {
    auto p = bind("splitlines", std::move(a), {"keepends"});
    std::vector<value> out;
    for (auto& line : detail::py_splitlines(self_str(self), truthy(p[0])))
        out.emplace_back(std::move(line));
    return r.new_list(std::move(out));
}

// startswith / endswith: a str or a tuple of them; optional start/end in code points.
bool affix_match(const value& self, const value& affix, const value& start, const value& end,
                 bool prefix) {
    std::vector<size_t> offs = unicode::code_point_offsets(self_str(self));
    const int64_t n = int64_t(offs.size()) - 1;
    auto norm = [n](int64_t i) { return std::clamp(i < 0 ? i + n : i, int64_t(0), n); };
    const int64_t b = norm(int_arg(start, 0)), e = norm(int_arg(end, n));
    if (b > e) return false;
    const std::string_view s = self_str(self).substr(offs[b], offs[e] - offs[b]);
    std::vector<value> options = affix.is_tuple() ? affix.items() : std::vector<value>{affix};
    for (const value& o : options) {
        const std::string& x = str_arg(o, prefix ? "startswith first arg" : "endswith first arg");
        if (prefix ? s.starts_with(x) : s.ends_with(x)) return true;
    }
    return false;
}
value s_startswith(renderer&, const value& self, call_args&& a) {
    auto p = bind("startswith", std::move(a), {"prefix", "start", "end"});
    return value(affix_match(self, p[0], p[1], p[2], true));
}
value s_endswith(renderer&, const value& self, call_args&& a) {
    auto p = bind("endswith", std::move(a), {"suffix", "start", "end"});
    return value(affix_match(self, p[0], p[1], p[2], false));
}

value s_replace(renderer& r, const value& self, call_args&& a) {
    auto p = bind("replace", std::move(a), {"old", "new", "count"});
    const std::string& old = str_arg(p[0], "replace() argument 1");
    const std::string& with = str_arg(p[1], "replace() argument 2");
    const std::string_view s = self_str(self);
    const int64_t hits =
        old.empty() ? int64_t(unicode::count_code_points(s)) + 1 : detail::py_count(s, old);
    r.check_string_size(s.size() + size_t(hits) * with.size());
    return r.new_string(detail::py_replace(s, old, with, int_arg(p[2], -1)));
}

value s_upper(renderer& r, const value& self, call_args&& a) {
    bind("upper", std::move(a), {});
    return r.new_string(unicode::upper(self_str(self)));
}
value s_lower(renderer& r, const value& self, call_args&& a) {
    bind("lower", std::move(a), {});
    return r.new_string(unicode::lower(self_str(self)));
}
value s_title(renderer& r, const value& self, call_args&& a) {
    bind("title", std::move(a), {});
    return r.new_string(unicode::title(self_str(self)));
}
value s_capitalize(renderer& r, const value& self, call_args&& a) {
    bind("capitalize", std::move(a), {});
    return r.new_string(unicode::capitalize(self_str(self)));
}
value s_swapcase(renderer& r, const value& self, call_args&& a) {
    bind("swapcase", std::move(a), {});
    return r.new_string(unicode::swapcase(self_str(self)));
}

value find_common(const value& self, call_args&& a, const char* fn, bool from_right, bool must) {
    auto p = bind(fn, std::move(a), {"sub", "start", "end"});
    const std::string& sub = str_arg(p[0], "must be str");
    std::vector<size_t> offs = unicode::code_point_offsets(self_str(self));
    const int64_t n = int64_t(offs.size()) - 1;
    auto norm = [n](int64_t i) { return std::clamp(i < 0 ? i + n : i, int64_t(0), n); };
    const int64_t b = norm(int_arg(p[1], 0)), e = norm(int_arg(p[2], n));
    int64_t at = -1;
    if (b <= e) {
        at = detail::py_find(self_str(self).substr(offs[b], offs[e] - offs[b]), sub, from_right);
        if (at >= 0) at += b;
    }
    if (at < 0 && must) fail("substring not found");
    return value(at);
}
value s_find(renderer&, const value& self, call_args&& a) {
    return find_common(self, std::move(a), "find", false, false);
}
value s_rfind(renderer&, const value& self, call_args&& a) {
    return find_common(self, std::move(a), "rfind", true, false);
}
value s_index(renderer&, const value& self, call_args&& a) {
    return find_common(self, std::move(a), "index", false, true);
}
value s_rindex(renderer&, const value& self, call_args&& a) {
    return find_common(self, std::move(a), "rindex", true, true);
}

value s_count(renderer&, const value& self, call_args&& a) {
    auto p = bind("count", std::move(a), {"sub"});
    return value(detail::py_count(self_str(self), str_arg(p[0], "count() argument")));
}

value s_join(renderer& r, const value& self, call_args&& a) {
    auto p = bind("join", std::move(a), {"iterable"});
    std::string out;
    bool first = true;
    for (const value& item : r.iterate(p[0])) {
        if (!item.is_string())
            fail("sequence item: expected str instance, " + std::string(type_name(item)) +
                 " found");
        if (!first) out += self_str(self);
        first = false;
        out += item.as_string();
        r.check_string_size(out.size());
    }
    return r.new_string(std::move(out));
}

value s_format(renderer& r, const value& self, call_args&& a) {
    return r.new_string(brace_format(self_str(self), a, r.text_limits()));
}

value pad_common(renderer& r, const value& self, call_args&& a, const char* fn, char how) {
    auto p = bind(fn, std::move(a), {"width", "fillchar"});
    const int64_t width = int_arg(p[0], 0);
    const std::string fill = given(p[1]) ? str_arg(p[1], "fill character") : " ";
    if (unicode::count_code_points(fill) != 1)
        fail("The fill character must be exactly one character long");
    r.check_string_size(size_t(std::max<int64_t>(width, 0)) * fill.size());
    const std::string_view s = self_str(self);
    const int64_t len = int64_t(unicode::count_code_points(s));
    if (how == 'c') return r.new_string(detail::py_center(s, width, fill));
    std::string pad;
    for (int64_t i = len; i < width; ++i) pad += fill;
    return r.new_string(how == 'l' ? std::string(s) + pad : pad + std::string(s));
}
value s_center(renderer& r, const value& self, call_args&& a) {
    return pad_common(r, self, std::move(a), "center", 'c');
}
value s_ljust(renderer& r, const value& self, call_args&& a) {
    return pad_common(r, self, std::move(a), "ljust", 'l');
}
value s_rjust(renderer& r, const value& self, call_args&& a) {
    return pad_common(r, self, std::move(a), "rjust", 'r');
}

value s_zfill(renderer& r, const value& self, call_args&& a) {
    auto p = bind("zfill", std::move(a), {"width"});
    const int64_t width = int_arg(p[0], 0);
    r.check_string_size(size_t(std::max<int64_t>(width, 0)));
    std::string s(self_str(self));
    const int64_t len = int64_t(unicode::count_code_points(s));
    if (len >= width) return r.new_string(s);
    const size_t at = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
    s.insert(at, size_t(width - len), '0');
    return r.new_string(s);
}

value s_removeprefix(renderer& r, const value& self, call_args&& a) {
    auto p = bind("removeprefix", std::move(a), {"prefix"});
    std::string_view s = self_str(self);
    const std::string& x = str_arg(p[0], "removeprefix() argument");
    if (s.starts_with(x)) s.remove_prefix(x.size());
    return r.new_string(std::string(s));
}
value s_removesuffix(renderer& r, const value& self, call_args&& a) {
    auto p = bind("removesuffix", std::move(a), {"suffix"});
    std::string_view s = self_str(self);
    const std::string& x = str_arg(p[0], "removesuffix() argument");
    if (!x.empty() && s.ends_with(x)) s.remove_suffix(x.size());
    return r.new_string(std::string(s));
}

value partition_common(renderer& r, const value& self, call_args&& a, bool from_right) {
    auto p = bind(from_right ? "rpartition" : "partition", std::move(a), {"sep"});
    const std::string& sep = str_arg(p[0], "separator");
    if (sep.empty()) fail("empty separator");
    const std::string_view s = self_str(self);
    const size_t at = from_right ? s.rfind(sep) : s.find(sep);
    if (at == std::string_view::npos) {
        return from_right ? r.new_list({value(""), value(""), self}, true)
                          : r.new_list({self, value(""), value("")}, true);
    }
    return r.new_list({value(s.substr(0, at)), value(sep), value(s.substr(at + sep.size()))}, true);
}
value s_partition(renderer& r, const value& self, call_args&& a) {
    return partition_common(r, self, std::move(a), false);
}
value s_rpartition(renderer& r, const value& self, call_args&& a) {
    return partition_common(r, self, std::move(a), true);
}

// is*(): true when non-empty and every code point passes (istitle/islower/isupper differ).
template <bool (*pred)(char32_t)>
value all_chars(renderer&, const value& self, call_args&& a) {
    bind("is...", std::move(a), {});
    const std::string_view s = self_str(self);
    if (s.empty()) return value(false);
    for (size_t i = 0; i < s.size();) {
        unicode::decoded d = unicode::decode(s, i);
        if (!pred(d.cp)) return value(false);
        i += d.length;
    }
    return value(true);
}

value s_isascii(renderer&, const value& self, call_args&& a) {
    bind("isascii", std::move(a), {});
    for (char c : self_str(self)) {
        if (static_cast<unsigned char>(c) >= 0x80) return value(false);
    }
    return value(true);
}
value s_islower(renderer&, const value& self, call_args&& a) {
    bind("islower", std::move(a), {});
    return value(detail::py_islower(self_str(self)));
}
value s_isupper(renderer&, const value& self, call_args&& a) {
    bind("isupper", std::move(a), {});
    return value(detail::py_isupper(self_str(self)));
}
value s_istitle(renderer&, const value& self, call_args&& a) {
    bind("istitle", std::move(a), {});
    const std::string_view s = self_str(self);
    bool cased = false, previous_cased = false;
    for (size_t i = 0; i < s.size();) {
        unicode::decoded d = unicode::decode(s, i);
        if (unicode::is_upper(d.cp) || unicode::is_title(d.cp)) {
            if (previous_cased) return value(false);
            previous_cased = cased = true;
        } else if (unicode::is_lower(d.cp)) {
            if (!previous_cased) return value(false);
            previous_cased = cased = true;
        } else {
            previous_cased = false;
        }
        i += d.length;
    }
    return value(cased);
}

// ---- dict, list -----------------------------------------------------------------------------

value d_items(renderer& r, const value& self, call_args&& a) {
    bind("items", std::move(a), {});
    std::vector<value> out;
    for (const auto& [k, v] : self.as_dict().entries) out.push_back(r.new_list({k, v}, true));
    return r.new_list(std::move(out));
}
value d_keys(renderer& r, const value& self, call_args&& a) {
    bind("keys", std::move(a), {});
    return r.new_list(r.iterate(self));
}
value d_values(renderer& r, const value& self, call_args&& a) {
    bind("values", std::move(a), {});
    std::vector<value> out;
    for (const auto& [k, v] : self.as_dict().entries) out.push_back(v);
    return r.new_list(std::move(out));
}
value d_get(renderer& r, const value& self, call_args&& a) {
    auto p = bind("get", std::move(a), {"key", "default"});
    r.check_hashable(p[0]);
    if (const value* v = self.as_dict().find(p[0])) return *v;
    return given(p[1]) ? p[1] : value::none();
}
value d_copy(renderer&, const value& self, call_args&& a) {
    bind("copy", std::move(a), {});
    return self;  // immutable: a copy is indistinguishable
}

value l_count(renderer& r, const value& self, call_args&& a) {
    auto p = bind("count", std::move(a), {"value"});
    r.charge(self.items().size() / 16);
    return value(int64_t(std::count_if(self.items().begin(), self.items().end(),
                                       [&](const value& v) { return r.eq(v, p[0]); })));
}
value l_index(renderer& r, const value& self, call_args&& a) {
    auto p = bind("index", std::move(a), {"value"});
    r.charge(self.items().size() / 16);
    const auto& items = self.items();
    for (size_t i = 0; i < items.size(); ++i) {
        if (r.eq(items[i], p[0])) return value(int64_t(i));
    }
    fail(to_repr(p[0], r.text_limits()) + " is not in list");
}

value unsafe(renderer&, const value& self, call_args&&) {
    fail("modifying a " + std::string(type_name(self)) +
         " is not allowed: templates render in an immutable sandbox (use namespace())");
}

value f_is_integer(renderer&, const value& self, call_args&& a) {
    bind("is_integer", std::move(a), {});
    return value(std::isfinite(self.as_float()) && std::floor(self.as_float()) == self.as_float());
}

struct named_method {
    std::string_view name;
    method_fn fn;
};

constexpr named_method k_str_methods[] = {
    {"capitalize", s_capitalize},
    {"casefold", s_lower},
    {"center", s_center},
    {"count", s_count},
    {"endswith", s_endswith},
    {"find", s_find},
    {"format", s_format},
    {"index", s_index},
    {"isalnum", all_chars<unicode::is_alnum>},
    {"isalpha", all_chars<unicode::is_alpha>},
    {"isascii", s_isascii},
    {"isdecimal", all_chars<unicode::is_decimal>},
    {"isdigit", all_chars<unicode::is_digit>},
    {"islower", s_islower},
    {"isspace", all_chars<unicode::is_space>},
    {"istitle", s_istitle},
    {"isupper", s_isupper},
    {"join", s_join},
    {"ljust", s_ljust},
    {"lower", s_lower},
    {"lstrip", s_lstrip},
    {"partition", s_partition},
    {"removeprefix", s_removeprefix},
    {"removesuffix", s_removesuffix},
    {"replace", s_replace},
    {"rfind", s_rfind},
    {"rindex", s_rindex},
    {"rjust", s_rjust},
    {"rpartition", s_rpartition},
    {"rsplit", s_rsplit},
    {"rstrip", s_rstrip},
    {"split", s_split},
    {"splitlines", s_splitlines},
    {"startswith", s_startswith},
    {"strip", s_strip},
    {"swapcase", s_swapcase},
    {"title", s_title},
    {"upper", s_upper},
    {"zfill", s_zfill},
};

constexpr named_method k_dict_methods[] = {
    {"clear", unsafe},  {"copy", d_copy},     {"get", d_get},      {"items", d_items},
    {"keys", d_keys},   {"pop", unsafe},      {"popitem", unsafe}, {"setdefault", unsafe},
    {"update", unsafe}, {"values", d_values},
};

constexpr named_method k_list_methods[] = {
    {"append", unsafe}, {"clear", unsafe},   {"copy", d_copy},   {"count", l_count},
    {"extend", unsafe}, {"index", l_index},  {"insert", unsafe}, {"pop", unsafe},
    {"remove", unsafe}, {"reverse", unsafe}, {"sort", unsafe},
};

constexpr named_method k_tuple_methods[] = {{"count", l_count}, {"index", l_index}};
constexpr named_method k_float_methods[] = {{"is_integer", f_is_integer}};

template <size_t N>
method_fn lookup(const named_method (&table)[N], std::string_view name) {
    for (const auto& m : table) {
        if (m.name == name) return m.fn;
    }
    return nullptr;
}

}  // namespace

value find_method(renderer&, const value& obj, std::string_view name) {
    method_fn fn = nullptr;
    std::string_view type;
    switch (obj.type()) {
        case value::kind::string:
            fn = lookup(k_str_methods, name), type = "str";
            break;
        case value::kind::dict:
            fn = lookup(k_dict_methods, name), type = "dict";
            break;
        case value::kind::list:
            fn = obj.is_tuple() ? lookup(k_tuple_methods, name) : lookup(k_list_methods, name);
            type = obj.is_tuple() ? "tuple" : "list";
            break;
        case value::kind::floating:
            fn = lookup(k_float_methods, name), type = "float";
            break;
        default:
            break;
    }
    if (fn == nullptr) return value();
    auto c = std::make_shared<callable_data>();
    c->name = std::string(type) + "." + std::string(name);
    c->fn = [fn, obj](renderer& r, call_args&& args) { return fn(r, obj, std::move(args)); };
    return value::callable(c);
}

}  // namespace ordo::jinja
