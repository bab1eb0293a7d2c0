// builtins_filters.cpp: Jinja's built-in filters, plus transformers' tojson (json.dumps with
// ensure_ascii=False). Filters jinja2 returns as generators (map, select, unique, batch ...)
// return lists here: the items are the same, only printing the bare generator differs (Python
// prints an address there, which no template can rely on).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "template/builtins.hpp"
#include "template/builtins_util.hpp"
#include "template/failure.hpp"
#include "template/unicode.hpp"

namespace ordo::jinja {

namespace {

using detail::bind;
using detail::given;
using detail::or_default;

int64_t need_int(const value& v, std::string_view what) {
    if (v.is_int() || v.is_bool()) return v.int_of();
    fail(std::string(what) + " must be an integer, not " + std::string(type_name(v)));
}

value f_abs(renderer&, const value& in, call_args&& a) {
    bind("abs", std::move(a), {});
    if (in.is_float()) return value(std::fabs(in.as_float()));
    if (in.is_int() || in.is_bool()) {
        if (in.int_of() == INT64_MIN) fail("integer overflow");
        return value(in.int_of() < 0 ? -in.int_of() : in.int_of());
    }
    if (in.is_undefined()) fail_undefined(in);
    fail("bad operand type for abs(): '" + std::string(type_name(in)) + "'");
}

// Python's getattr only: a dict's keys are not attributes here (jinja2's attr filter).
value f_attr(renderer& r, const value& in, call_args&& a) {
    auto p = bind("attr", std::move(a), {"name"});
    const std::string name = r.str(p[0]);
    if (in.is_dict()) {
        value m = find_method(r, in, name);
        if (!m.is_undefined()) return m;
        return value::undefined("'dict object' has no attribute '" + name + "'");
    }
    return r.getattr(in, name);
}

value f_batch(renderer& r, const value& in, call_args&& a) {
    auto p = bind("batch", std::move(a), {"linecount", "fill_with"});
    const int64_t n = need_int(p[0], "linecount");
    if (n <= 0) fail("batch: linecount must be positive");
    std::vector<value> out, cur;
    for (value& item : r.iterate(in)) {
        if (int64_t(cur.size()) == n) out.push_back(r.new_list(std::exchange(cur, {})));
        cur.push_back(std::move(item));
    }
    if (!cur.empty()) {
        if (given(p[1]) && !p[1].is_none()) {
            while (int64_t(cur.size()) < n) cur.push_back(p[1]);
        }
        out.push_back(r.new_list(std::move(cur)));
    }
    return r.new_list(std::move(out));
}

value f_capitalize(renderer& r, const value& in, call_args&& a) {
    bind("capitalize", std::move(a), {});
    return r.new_string(unicode::capitalize(r.str(in)));
}

value f_center(renderer& r, const value& in, call_args&& a) {
    auto p = bind("center", std::move(a), {"width"});
    const int64_t width = given(p[0]) ? need_int(p[0], "width") : 80;
    r.check_string_size(size_t(std::max<int64_t>(width, 0)));
    return r.new_string(detail::py_center(r.str(in), width, " "));
}

value f_length(renderer& r, const value& in, call_args&& a) {
    bind("length", std::move(a), {});
    switch (in.type()) {
        case value::kind::undefined:
            return value(0);
        case value::kind::string:
            return value(int64_t(unicode::count_code_points(in.as_string())));
        case value::kind::list:
            return value(int64_t(in.items().size()));
        case value::kind::dict:
            return value(int64_t(in.as_dict().entries.size()));
        default:
            fail("object of type '" + std::string(type_name(in)) + "' has no len()");
    }
    (void)r;
}

value f_default(renderer&, const value& in, call_args&& a) {
    auto p = bind("default", std::move(a), {"default_value", "boolean"});
    const bool boolean = given(p[1]) && truthy(p[1]);
    if (in.is_undefined() || (boolean && !truthy(in))) return or_default(p[0], value(""));
    return in;
}

// Jinja's ignore_case unless case_sensitive, then Python's sorted() (stable).
void sort_values(renderer& r, std::vector<value>& items, const std::vector<value>& keys,
                 bool reverse) {
    std::vector<size_t> order(items.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    r.charge(items.size() * 4);  // n log n comparisons, roughly
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
        return reverse ? r.less(keys[y], keys[x]) : r.less(keys[x], keys[y]);
    });
    std::vector<value> out;
    out.reserve(items.size());
    for (size_t i : order) out.push_back(std::move(items[i]));
    items = std::move(out);
}

value f_dictsort(renderer& r, const value& in, call_args&& a) {
    auto p = bind("dictsort", std::move(a), {"case_sensitive", "by", "reverse"});
    if (!in.is_dict()) fail("dictsort needs a mapping");
    const std::string by = given(p[1]) ? r.str(p[1]) : "key";
    if (by != "key" && by != "value") fail("You can only sort by either 'key' or 'value'");
    std::vector<value> items, keys;
    for (const auto& [k, v] : in.as_dict().entries) {
        items.push_back(r.new_list({k, v}, true));
        const value& key = by == "key" ? k : v;
        keys.push_back(truthy(p[0]) ? key : detail::fold_case(key));
    }
    sort_values(r, items, keys, truthy(p[2]));
    return r.new_list(std::move(items));
}

std::string html_escape(std::string_view s) {
    std::string out;
    for (char c : s) {
        switch (c) {
            case '&':
                out += "&amp;";
                break;
            case '<':
                out += "&lt;";
                break;
            case '>':
                out += "&gt;";
                break;
            case '"':
                out += "&#34;";
                break;
            case '\'':
                out += "&#39;";
                break;
            default:
                out += c;
        }
    }
    return out;
}

value f_escape(renderer& r, const value& in, call_args&& a) {
    bind("escape", std::move(a), {});
    return r.new_string(html_escape(r.str(in)));
}

value f_filesizeformat(renderer& r, const value& in, call_args&& a) {
    auto p = bind("filesizeformat", std::move(a), {"binary"});
    const bool binary = truthy(p[0]);
    if (!in.is_number() && !in.is_string()) fail("filesizeformat needs a number");
    const double bytes =
        in.is_string() ? std::strtod(in.as_string().c_str(), nullptr) : in.float_of();
    const double base = binary ? 1024 : 1000;
    static const char* k_dec[] = {"kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"};
    static const char* k_bin[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"};
    if (bytes == 1) return value("1 Byte");
    char buf[64];
    if (bytes < base) {
        std::snprintf(buf, sizeof buf, "%lld Bytes", (long long)bytes);
        return value(std::string(buf));
    }
    double unit = base;
    for (int i = 0; i < 8; ++i) {
        unit *= base;
        if (bytes < unit || i == 7) {
            std::snprintf(buf, sizeof buf, "%.1f %s", base * bytes / unit,
                          (binary ? k_bin : k_dec)[i]);
            break;
        }
    }
    return value(std::string(buf));
}

value f_first(renderer& r, const value& in, call_args&& a) {
    bind("first", std::move(a), {});
    auto items = r.iterate(in);
    if (items.empty()) return value::undefined("No first item, sequence was empty.");
    return items.front();
}

value f_last(renderer& r, const value& in, call_args&& a) {
    bind("last", std::move(a), {});
    auto items = r.iterate(in);
    if (items.empty()) return value::undefined("No last item, sequence was empty.");
    return items.back();
}

// Python's float(str): surrounding whitespace, underscores between digits, inf and nan.
std::optional<double> parse_float(std::string_view text) {
    std::string s = detail::py_strip(text, value::none(), true, true);
    std::string t;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '_') {
            if (i == 0 || i + 1 == s.size() || !std::isdigit((unsigned char)s[i - 1]) ||
                !std::isdigit((unsigned char)s[i + 1])) {
                return std::nullopt;
            }
            continue;
        }
        t += s[i];
    }
    if (t.empty()) return std::nullopt;
    std::string lower = unicode::lower(t);
    const std::string body = (lower[0] == '+' || lower[0] == '-') ? lower.substr(1) : lower;
    if (body == "inf" || body == "infinity" || body == "nan") {
        const double v = body == "nan" ? NAN : INFINITY;
        return lower[0] == '-' ? -v : v;
    }
    if (body.find_first_not_of("0123456789.e+-") != std::string::npos) return std::nullopt;
    char* end = nullptr;
    const double v = std::strtod(t.c_str(), &end);
    if (end != t.c_str() + t.size()) return std::nullopt;
    return v;
}

// Python's int(str, base).
std::optional<int64_t> parse_int(std::string_view text, int64_t base) {
    std::string s = detail::py_strip(text, value::none(), true, true);
    bool neg = false;
    size_t i = 0;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
    if (i + 1 < s.size() && s[i] == '0') {
        const char p = char(s[i + 1] | 0x20);
        const int64_t pb = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
        if (pb != 0 && (base == pb || base == 0)) {
            base = pb;
            i += 2;
            if (i < s.size() && s[i] == '_') ++i;
        }
    }
    if (base == 0) base = 10;
    if (base < 2 || base > 36 || i >= s.size()) return std::nullopt;
    uint64_t v = 0;
    bool prev_digit = false;
    for (; i < s.size(); ++i) {
        const char c = char(s[i] | 0x20);
        if (s[i] == '_' && prev_digit && i + 1 < s.size()) {
            prev_digit = false;
            continue;
        }
        const int d = std::isdigit((unsigned char)s[i]) ? s[i] - '0'
                      : (c >= 'a' && c <= 'z')          ? c - 'a' + 10
                                                        : 99;
        if (d >= base) return std::nullopt;
        if (v > (uint64_t(INT64_MAX) - d) / uint64_t(base))
            fail("int() result does not fit in 64 bits");
        v = v * uint64_t(base) + uint64_t(d);
        prev_digit = true;
    }
    if (!prev_digit) return std::nullopt;
    return neg ? -int64_t(v) : int64_t(v);
}

value f_float(renderer& r, const value& in, call_args&& a) {
    auto p = bind("float", std::move(a), {"default"});
    if (in.is_undefined()) fail_undefined(in);
    if (in.is_number()) return value(in.float_of());
    if (in.is_string()) {
        if (auto v = parse_float(in.as_string())) return value(*v);
    }
    (void)r;
    return or_default(p[0], value(0.0));
}

value f_int(renderer&, const value& in, call_args&& a) {
    auto p = bind("int", std::move(a), {"default", "base"});
    if (in.is_undefined()) fail_undefined(in);
    if (in.is_int() || in.is_bool()) return value(in.int_of());
    if (in.is_float()) {
        const double d = in.as_float();
        if (std::isinf(d)) fail("cannot convert float infinity to integer");
        if (std::isnan(d)) return or_default(p[0], value(0));
        if (std::fabs(d) >= 9.2e18) fail("int() result does not fit in 64 bits");
        return value(int64_t(d));
    }
    if (in.is_string()) {
        const int64_t base = given(p[1]) ? need_int(p[1], "base") : 10;
        if (auto v = parse_int(in.as_string(), base)) return value(*v);
        if (auto f = parse_float(in.as_string())) {
            if (std::isinf(*f)) fail("cannot convert float infinity to integer");
            if (!std::isnan(*f) && std::fabs(*f) < 9.2e18) return value(int64_t(*f));
        }
    }
    return or_default(p[0], value(0));
}

value f_format(renderer& r, const value& in, call_args&& a) {
    if (!a.positional.empty() && !a.keyword.empty()) {
        fail("can't handle positional and keyword arguments at the same time");
    }
    value args;
    if (!a.keyword.empty()) {
        dict_data d;
        for (auto& [k, v] : a.keyword) d.set(value(k), std::move(v));
        args = r.new_dict(std::move(d));
    } else {
        args = r.new_list(std::move(a.positional), true);
    }
    return r.new_string(percent_format(r.str(in), args, r.text_limits()));
}

value f_groupby(renderer& r, const value& in, call_args&& a) {
    auto p = bind("groupby", std::move(a), {"attribute", "default", "case_sensitive"});
    std::vector<value> items = r.iterate(in), keys;
    for (const value& item : items) {
        value k = detail::get_path(r, item, p[0]);
        if (k.is_undefined() && given(p[1])) k = p[1];
        keys.push_back(truthy(p[2]) ? k : detail::fold_case(k));
    }
    std::vector<value> raw_keys;
    for (const value& item : items) {
        value k = detail::get_path(r, item, p[0]);
        raw_keys.push_back(k.is_undefined() && given(p[1]) ? p[1] : k);
    }
    std::vector<size_t> order(items.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t x, size_t y) { return r.less(keys[x], keys[y]); });
    std::vector<value> groups;
    for (size_t k = 0; k < order.size();) {
        std::vector<value> members;
        size_t j = k;
        while (j < order.size() && r.eq(keys[order[j]], keys[order[k]])) {
            members.push_back(items[order[j]]);
            ++j;
        }
        groups.push_back(value::named_tuple("_GroupTuple", {"grouper", "list"},
                                            {raw_keys[order[k]], r.new_list(std::move(members))}));
        k = j;
    }
    return r.new_list(std::move(groups));
}

value f_indent(renderer& r, const value& in, call_args&& a) {
    auto p = bind("indent", std::move(a), {"width", "first", "blank"});
    std::string indention;
    if (p[0].is_string()) {
        indention = p[0].as_string();
    } else {
        const int64_t w = given(p[0]) ? need_int(p[0], "width") : 4;
        r.check_string_size(size_t(std::max<int64_t>(w, 0)));
        indention.assign(size_t(std::max<int64_t>(w, 0)), ' ');
    }
    const std::string s = r.str(in) + "\n";
    std::vector<std::string> lines = detail::py_splitlines(s, false);
    std::string out;
    if (truthy(p[2])) {
        for (size_t i = 0; i < lines.size(); ++i) {
            if (i) out += "\n" + indention;
            out += lines[i];
            r.check_string_size(out.size());
        }
    } else {
        out = lines.empty() ? "" : lines[0];
        for (size_t i = 1; i < lines.size(); ++i) {
            out += "\n";
            if (!lines[i].empty()) out += indention;
            out += lines[i];
            r.check_string_size(out.size());
        }
    }
    if (truthy(p[1])) out = indention + out;
    return r.new_string(std::move(out));
}

value f_items(renderer& r, const value& in, call_args&& a) {
    bind("items", std::move(a), {});
    if (in.is_undefined()) return r.new_list({});
    if (!in.is_dict()) fail("Can only get item pairs from a mapping.");
    std::vector<value> out;
    for (const auto& [k, v] : in.as_dict().entries) out.push_back(r.new_list({k, v}, true));
    return r.new_list(std::move(out));
}

value f_join(renderer& r, const value& in, call_args&& a) {
    auto p = bind("join", std::move(a), {"d", "attribute"});
    const std::string sep = given(p[0]) ? r.str(p[0]) : "";
    std::string out;
    bool first = true;
    for (const value& item : r.iterate(in)) {
        if (!first) out += sep;
        first = false;
        out += r.str(given(p[1]) ? detail::get_path(r, item, p[1]) : item);
        r.check_string_size(out.size());
    }
    return r.new_string(std::move(out));
}

value f_list(renderer& r, const value& in, call_args&& a) {
    bind("list", std::move(a), {});
    return r.new_list(r.iterate(in));
}

value f_lower(renderer& r, const value& in, call_args&& a) {
    bind("lower", std::move(a), {});
    return r.new_string(unicode::lower(r.str(in)));
}

value f_upper(renderer& r, const value& in, call_args&& a) {
    bind("upper", std::move(a), {});
    return r.new_string(unicode::upper(r.str(in)));
}

value f_map(renderer& r, const value& in, call_args&& a) {
    std::vector<value> out;
    if (!truthy(in)) return r.new_list({});
    if (a.positional.empty()) {
        auto p = bind("map", std::move(a), {"attribute", "default"});
        if (!given(p[0])) fail("map() needs a filter name or attribute=");
        for (const value& item : r.iterate(in)) {
            value v = detail::get_path(r, item, p[0]);
            out.push_back(v.is_undefined() && given(p[1]) ? p[1] : v);
        }
        return r.new_list(std::move(out));
    }
    const std::string name = r.str(a.positional[0]);
    a.positional.erase(a.positional.begin());
    for (const value& item : r.iterate(in)) {
        call_args copy = a;
        out.push_back(r.filter(name, item, std::move(copy)));
    }
    return r.new_list(std::move(out));
}

// select / reject / selectattr / rejectattr.
value select_or_reject(renderer& r, const value& in, call_args&& a, bool keep, bool by_attr) {
    if (!truthy(in)) return r.new_list({});
    value attr;
    if (by_attr) {
        if (a.positional.empty()) fail("selectattr/rejectattr need an attribute name");
        attr = a.positional[0];
        a.positional.erase(a.positional.begin());
    }
    std::string test_name;
    if (!a.positional.empty()) {
        test_name = r.str(a.positional[0]);
        a.positional.erase(a.positional.begin());
    }
    std::vector<value> out;
    for (const value& item : r.iterate(in)) {
        value probe = by_attr ? detail::get_path(r, item, attr) : item;
        call_args copy = a;
        const bool hit =
            test_name.empty() ? truthy(probe) : r.test(test_name, probe, std::move(copy));
        if (hit == keep) out.push_back(item);
    }
    return r.new_list(std::move(out));
}

value f_select(renderer& r, const value& in, call_args&& a) {
    return select_or_reject(r, in, std::move(a), true, false);
}
value f_reject(renderer& r, const value& in, call_args&& a) {
    return select_or_reject(r, in, std::move(a), false, false);
}
value f_selectattr(renderer& r, const value& in, call_args&& a) {
    return select_or_reject(r, in, std::move(a), true, true);
}
value f_rejectattr(renderer& r, const value& in, call_args&& a) {
    return select_or_reject(r, in, std::move(a), false, true);
}

// min / max with Jinja's case folding and attribute=.
value min_max(renderer& r, const value& in, call_args&& a, bool want_max, const char* fn) {
    auto p = bind(fn, std::move(a), {"case_sensitive", "attribute"});
    std::vector<value> items = r.iterate(in);
    if (items.empty()) return value::undefined("No aggregated item, sequence was empty.");
    auto key = [&](const value& v) {
        value k = given(p[1]) ? detail::get_path(r, v, p[1]) : v;
        return truthy(p[0]) ? k : detail::fold_case(k);
    };
    size_t best = 0;
    value best_key = key(items[0]);
    for (size_t i = 1; i < items.size(); ++i) {
        value k = key(items[i]);
        if (want_max ? r.less(best_key, k) : r.less(k, best_key)) {
            best = i;
            best_key = std::move(k);
        }
    }
    return items[best];
}

value f_min(renderer& r, const value& in, call_args&& a) {
    return min_max(r, in, std::move(a), false, "min");
}
value f_max(renderer& r, const value& in, call_args&& a) {
    return min_max(r, in, std::move(a), true, "max");
}

// pprint.pformat sorts dict keys; the copy here is sorted the same way before repr (pformat's
// line wrapping of values over 80 columns is not reproduced).
value sorted_dicts(renderer& r, const value& v) {
    r.charge(16);  // each node is rebuilt
    if (v.is_list() && v.as_list().fields.empty()) {
        std::vector<value> items;
        for (const value& i : v.items()) items.push_back(sorted_dicts(r, i));
        return r.new_list(std::move(items), v.is_tuple());
    }
    if (!v.is_dict()) return v;
    std::vector<std::pair<value, value>> entries = v.as_dict().entries;
    std::stable_sort(entries.begin(), entries.end(),
                     [&](const auto& x, const auto& y) { return r.less(x.first, y.first); });
    dict_data d;
    for (auto& [k, x] : entries) d.set(k, sorted_dicts(r, x));
    return r.new_dict(std::move(d));
}

value f_pprint(renderer& r, const value& in, call_args&& a) {
    bind("pprint", std::move(a), {});
    return r.new_string(to_repr(sorted_dicts(r, in), r.text_limits()));
}

value f_replace(renderer& r, const value& in, call_args&& a) {
    auto p = bind("replace", std::move(a), {"old", "new", "count"});
    const std::string s = r.str(in), old = r.str(p[0]), with = r.str(p[1]);
    const int64_t count = given(p[2]) && !p[2].is_none() ? need_int(p[2], "count") : -1;
    const uint64_t worst = uint64_t(s.size() + 1) * (with.size() + 1);
    if (worst > r.bounds().output_bytes_max)
        r.check_string_size(s.size() + with.size() * (detail::py_count(s, old)));
    return r.new_string(detail::py_replace(s, old, with, count));
}

value f_reverse(renderer& r, const value& in, call_args&& a) {
    bind("reverse", std::move(a), {});
    if (in.is_string()) {
        std::vector<size_t> offs = unicode::code_point_offsets(in.as_string());
        std::string out;
        for (size_t i = offs.size() - 1; i > 0; --i) {
            out.append(in.as_string(), offs[i - 1], offs[i] - offs[i - 1]);
        }
        return r.new_string(std::move(out));
    }
    std::vector<value> items = r.iterate(in);
    std::reverse(items.begin(), items.end());
    return r.new_list(std::move(items));
}

value f_round(renderer& r, const value& in, call_args&& a) {
    auto p = bind("round", std::move(a), {"precision", "method"});
    const int64_t precision = given(p[0]) ? need_int(p[0], "precision") : 0;
    const std::string method = given(p[1]) ? r.str(p[1]) : "common";
    if (method != "common" && method != "ceil" && method != "floor") {
        fail("method must be common, ceil or floor");
    }
    if (!in.is_number()) fail("round() needs a number, not " + std::string(type_name(in)));
    if (method == "common") {
        if (!in.is_float()) {  // Python's round(int, n) stays an int
            if (precision >= 0) return value(in.int_of());
            int64_t scale = 1;
            for (int64_t i = 0; i < -precision && scale < INT64_MAX / 10; ++i) scale *= 10;
            const int64_t v = in.int_of();
            int64_t q = v / scale, rem = v % scale;
            if (rem < 0) rem += scale, --q;
            if (2 * rem > scale || (2 * rem == scale && (q & 1))) ++q;
            return value(q * scale);
        }
        const double d = in.as_float();
        if (!std::isfinite(d) || precision > 300) return value(d);
        if (precision < -308) return value(0.0 * d);
        // printf rounds the exact binary value half-to-even, as Python's round does.
        char buf[512];
        if (precision >= 0) {
            std::snprintf(buf, sizeof buf, "%.*f", int(precision), d);
            return value(std::strtod(buf, nullptr));
        }
        const double scale = std::pow(10.0, double(-precision));
        std::snprintf(buf, sizeof buf, "%.0f", d / scale);
        return value(std::strtod(buf, nullptr) * scale);
    }
    const double scale = std::pow(10.0, double(precision));
    const double v = in.float_of() * scale;
    return value((method == "ceil" ? std::ceil(v) : std::floor(v)) / scale);
}

value f_safe(renderer& r, const value& in, call_args&& a) {
    bind("safe", std::move(a), {});
    return r.new_string(r.str(in));
}

value f_slice(renderer& r, const value& in, call_args&& a) {
    auto p = bind("slice", std::move(a), {"slices", "fill_with"});
    const int64_t slices = need_int(p[0], "slices");
    if (slices <= 0 || slices > int64_t(r.bounds().steps_max))
        fail("slice: slices must be positive");
    std::vector<value> seq = r.iterate(in);
    const int64_t length = int64_t(seq.size());
    const int64_t per = length / slices, extra = length % slices;
    int64_t offset = 0;
    std::vector<value> out;
    for (int64_t n = 0; n < slices; ++n) {
        r.charge(1);
        const int64_t start = offset + n * per;
        if (n < extra) ++offset;
        const int64_t end = offset + (n + 1) * per;
        std::vector<value> part(seq.begin() + start, seq.begin() + end);
        if (given(p[1]) && !p[1].is_none() && n >= extra) part.push_back(p[1]);
        out.push_back(r.new_list(std::move(part)));
    }
    return r.new_list(std::move(out));
}

// sort(reverse=False, case_sensitive=False, attribute=None); attribute may list several, "a,b".
value f_sort(renderer& r, const value& in, call_args&& a) {
    auto p = bind("sort", std::move(a), {"reverse", "case_sensitive", "attribute"});
    std::vector<value> items = r.iterate(in), keys;
    std::vector<value> attrs;
    if (given(p[2]) && !p[2].is_none()) {
        if (p[2].is_string()) {
            for (auto& part : detail::py_split(p[2].as_string(), value(","), -1, false)) {
                attrs.push_back(value(detail::py_strip(part, value::none(), true, true)));
            }
        } else {
            attrs.push_back(p[2]);
        }
    }
    for (const value& item : items) {
        std::vector<value> parts;
        for (const value& at : attrs) {
            value k = detail::get_path(r, item, at);
            parts.push_back(truthy(p[1]) ? k : detail::fold_case(k));
        }
        if (attrs.empty()) {
            keys.push_back(truthy(p[1]) ? item : detail::fold_case(item));
        } else if (parts.size() == 1) {
            keys.push_back(parts[0]);
        } else {
            keys.push_back(r.new_list(std::move(parts)));
        }
    }
    sort_values(r, items, keys, truthy(p[0]));
    return r.new_list(std::move(items));
}

value f_string(renderer& r, const value& in, call_args&& a) {
    bind("string", std::move(a), {});
    return r.new_string(r.str(in));
}

// Markup.striptags: drop comments and tags, collapse whitespace, unescape entities.
value f_striptags(renderer& r, const value& in, call_args&& a) {
    bind("striptags", std::move(a), {});
    const std::string s = r.str(in);
    std::string text;
    for (size_t i = 0; i < s.size();) {
        if (s.compare(i, 4, "<!--") == 0) {
            const size_t e = s.find("-->", i + 4);
            if (e != std::string::npos) {
                i = e + 3;
                continue;
            }
        }
        if (s[i] == '<') {
            const size_t e = s.find('>', i + 1);
            if (e != std::string::npos) {
                i = e + 1;
                continue;
            }
        }
        text += s[i++];
    }
    std::string joined;
    for (const auto& w : detail::py_split(text, value::none(), -1, false)) {
        if (!joined.empty()) joined += ' ';
        joined += w;
    }
    static const std::pair<const char*, const char*> k_entities[] = {
        {"&amp;", "&"},  {"&lt;", "<"},  {"&gt;", ">"},   {"&quot;", "\""},
        {"&#34;", "\""}, {"&#39;", "'"}, {"&apos;", "'"}, {"&nbsp;", "\xC2\xA0"}};
    std::string out;
    for (size_t i = 0; i < joined.size();) {
        bool hit = false;
        for (const auto& [from, to] : k_entities) {
            if (joined.compare(i, std::strlen(from), from) == 0) {
                out += to;
                i += std::strlen(from);
                hit = true;
                break;
            }
        }
        if (!hit) out += joined[i++];
    }
    return r.new_string(std::move(out));
}

value f_sum(renderer& r, const value& in, call_args&& a) {
    auto p = bind("sum", std::move(a), {"attribute", "start"});
    value total = or_default(p[1], value(0));
    for (const value& item : r.iterate(in)) {
        const value v = given(p[0]) ? detail::get_path(r, item, p[0]) : item;
        total = r.add(total, v);
    }
    return total;
}

// Jinja's title filter (not str.title): each run after [-\s({\[<] starts upper-case.
value f_title(renderer& r, const value& in, call_args&& a) {
    bind("title", std::move(a), {});
    const std::string s = r.str(in);
    std::string out;
    bool word_start = true;
    for (size_t i = 0; i < s.size();) {
        unicode::decoded d = unicode::decode(s, i);
        const bool sep = unicode::is_space(d.cp) || d.cp == '-' || d.cp == '(' || d.cp == '{' ||
                         d.cp == '[' || d.cp == '<';
        if (sep) {
            if (!word_start) word_start = true;
            out.append(s, i, d.length);
        } else if (word_start) {
            unicode::append_upper(out, d.cp);
            word_start = false;
        } else {
            out += unicode::lower(s.substr(i, d.length));
        }
        i += d.length;
    }
    return r.new_string(std::move(out));
}

// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False).
value f_tojson(renderer& r, const value& in, call_args&& a) {
    auto p = bind("tojson", std::move(a), {"ensure_ascii", "indent", "separators", "sort_keys"});
    json_options opt;
    opt.ensure_ascii = truthy(p[0]);
    if (given(p[1]) && !p[1].is_none()) {
        if (p[1].is_string()) {
            opt.indent = p[1].as_string();
        } else {
            const int64_t n = std::max<int64_t>(0, need_int(p[1], "indent"));
            r.check_string_size(size_t(n));
            opt.indent = std::string(size_t(n), ' ');
        }
        opt.item_separator = ",";
    }
    if (given(p[2]) && !p[2].is_none()) {
        if (!p[2].is_list() || p[2].items().size() != 2) fail("separators must be a pair");
        opt.item_separator = r.str(p[2].items()[0]);
        opt.key_separator = r.str(p[2].items()[1]);
    }
    opt.sort_keys = truthy(p[3]);
    return r.new_string(to_json(in, opt, r.text_limits()));
}

value f_trim(renderer& r, const value& in, call_args&& a) {
    auto p = bind("trim", std::move(a), {"chars"});
    return r.new_string(detail::py_strip(r.str(in), p[0], true, true));
}

value f_truncate(renderer& r, const value& in, call_args&& a) {
    auto p = bind("truncate", std::move(a), {"length", "killwords", "end", "leeway"});
    const std::string s = r.str(in);
    const int64_t length = given(p[0]) ? need_int(p[0], "length") : 255;
    const std::string end = given(p[2]) ? r.str(p[2]) : "...";
    const int64_t leeway = given(p[3]) && !p[3].is_none() ? need_int(p[3], "leeway") : 5;
    const int64_t end_len = int64_t(unicode::count_code_points(end));
    if (length < end_len) fail("expected length >= " + std::to_string(end_len));
    std::vector<size_t> offs = unicode::code_point_offsets(s);
    const int64_t n = int64_t(offs.size()) - 1;
    if (n <= length + leeway) return in.is_string() ? in : r.new_string(s);
    std::string head = s.substr(0, offs[size_t(length - end_len)]);
    if (!truthy(p[1])) {
        const size_t sp = head.rfind(' ');
        if (sp != std::string::npos) head.resize(sp);
    }
    return r.new_string(head + end);
}

value f_unique(renderer& r, const value& in, call_args&& a) {
    auto p = bind("unique", std::move(a), {"case_sensitive", "attribute"});
    std::vector<value> out, seen;
    for (const value& item : r.iterate(in)) {
        value k = given(p[1]) ? detail::get_path(r, item, p[1]) : item;
        if (!truthy(p[0])) k = detail::fold_case(k);
        r.charge(seen.size() / 16);
        if (std::none_of(seen.begin(), seen.end(), [&](const value& s) { return r.eq(s, k); })) {
            seen.push_back(k);
            out.push_back(item);
        }
    }
    return r.new_list(std::move(out));
}

value f_urlencode(renderer& r, const value& in, call_args&& a) {
    bind("urlencode", std::move(a), {});
    auto quote = [](const std::string& s, bool for_qs) {
        std::string out;
        for (unsigned char c : s) {
            if (std::isalnum(c) || c == '_' || c == '.' || c == '-' || c == '~' ||
                (!for_qs && c == '/')) {
                out += char(c);
            } else if (for_qs && c == ' ') {
                out += '+';
            } else {
                char buf[4];
                std::snprintf(buf, sizeof buf, "%%%02X", c);
                out += buf;
            }
        }
        return out;
    };
    if (in.is_string() || !(in.is_list() || in.is_dict() || in.is_undefined())) {
        return r.new_string(quote(r.str(in), false));
    }
    std::vector<std::pair<value, value>> pairs;
    if (in.is_dict()) {
        pairs = in.as_dict().entries;
    } else {
        for (const value& item : r.iterate(in)) {
            auto kv = r.iterate(item);
            if (kv.size() != 2) fail("urlencode needs a mapping or pairs");
            pairs.emplace_back(kv[0], kv[1]);
        }
    }
    std::string out;
    for (const auto& [k, v] : pairs) {
        if (!out.empty()) out += '&';
        out += quote(r.str(k), true) + "=" + quote(r.str(v), true);
    }
    return r.new_string(std::move(out));
}

value f_wordcount(renderer& r, const value& in, call_args&& a) {
    bind("wordcount", std::move(a), {});
    const std::string s = r.str(in);
    int64_t n = 0;
    bool in_word = false;
    for (size_t i = 0; i < s.size();) {
        unicode::decoded d = unicode::decode(s, i);
        const bool w = unicode::is_word(d.cp);
        if (w && !in_word) ++n;
        in_word = w;
        i += d.length;
    }
    return value(n);
}

struct named_filter {
    std::string_view name;
    filter_fn fn;
};

constexpr named_filter k_filters[] = {
    {"abs", f_abs},
    {"attr", f_attr},
    {"batch", f_batch},
    {"capitalize", f_capitalize},
    {"center", f_center},
    {"count", f_length},
    {"d", f_default},
    {"default", f_default},
    {"dictsort", f_dictsort},
    {"e", f_escape},
    {"escape", f_escape},
    {"filesizeformat", f_filesizeformat},
    {"first", f_first},
    {"float", f_float},
    {"forceescape", f_escape},
    {"format", f_format},
    {"groupby", f_groupby},
    {"indent", f_indent},
    {"int", f_int},
    {"items", f_items},
    {"join", f_join},
    {"last", f_last},
    {"length", f_length},
    {"list", f_list},
    {"lower", f_lower},
    {"map", f_map},
    {"max", f_max},
    {"min", f_min},
    {"pprint", f_pprint},
    {"reject", f_reject},
    {"rejectattr", f_rejectattr},
    {"replace", f_replace},
    {"reverse", f_reverse},
    {"round", f_round},
    {"safe", f_safe},
    {"select", f_select},
    {"selectattr", f_selectattr},
    {"slice", f_slice},
    {"sort", f_sort},
    {"string", f_string},
    {"striptags", f_striptags},
    {"sum", f_sum},
    {"title", f_title},
    {"tojson", f_tojson},
    {"trim", f_trim},
    {"truncate", f_truncate},
    {"unique", f_unique},
    {"upper", f_upper},
    {"urlencode", f_urlencode},
    {"wordcount", f_wordcount},
};

}  // namespace

filter_fn find_filter(std::string_view name) {
    for (const auto& f : k_filters) {
        if (f.name == name) return f.fn;
    }
    return nullptr;
}

}  // namespace ordo::jinja
