// builtins_util.cpp: argument binding, attribute paths and Python's str operations.
#include "template/builtins_util.hpp"

#include <algorithm>

#include "template/failure.hpp"
#include "template/unicode.hpp"

namespace ordo::jinja::detail {

namespace {

std::vector<char32_t> code_points(std::string_view s) {
    std::vector<char32_t> out;
    for (size_t i = 0; i < s.size();) {
        unicode::decoded d = unicode::decode(s, i);
        out.push_back(d.cp);
        i += d.length;
    }
    return out;
}

// Byte ranges of the whitespace-separated words of s.
std::vector<std::pair<size_t, size_t>> words(std::string_view s) {
    std::vector<std::pair<size_t, size_t>> out;
    size_t i = 0;
    while (i < s.size()) {
        unicode::decoded d = unicode::decode(s, i);
        if (unicode::is_space(d.cp)) {
            i += d.length;
            continue;
        }
        const size_t start = i;
        while (i < s.size()) {
            d = unicode::decode(s, i);
            if (unicode::is_space(d.cp)) break;
            i += d.length;
        }
        out.emplace_back(start, i);
    }
    return out;
}

}  // namespace

std::vector<value> bind(std::string_view fn, call_args&& args,
                        std::initializer_list<std::string_view> params) {
    std::vector<value> out(params.size());
    if (args.positional.size() > params.size()) {
        fail(std::string(fn) + "() takes at most " + std::to_string(params.size()) +
             " argument(s) (" + std::to_string(args.positional.size()) + " given)");
    }
    for (size_t i = 0; i < args.positional.size(); ++i) out[i] = std::move(args.positional[i]);
    for (auto& [k, v] : args.keyword) {
        auto it = std::find(params.begin(), params.end(), k);
        if (it == params.end()) {
            fail(std::string(fn) + "() got an unexpected keyword argument '" + k + "'");
        }
        const size_t i = size_t(it - params.begin());
        if (i < args.positional.size()) {
            fail(std::string(fn) + "() got multiple values for argument '" + k + "'");
        }
        out[i] = std::move(v);
    }
    return out;
}

value or_default(const value& v, value dflt) {
    return given(v) ? v : std::move(dflt);
}

value get_path(renderer& r, const value& item, const value& path) {
    if (!path.is_string()) return r.getitem(item, path);
    value cur = item;
    std::string_view p = path.as_string();
    for (;;) {
        const size_t dot = p.find('.');
        std::string_view part = p.substr(0, dot);
        const bool digits =
            !part.empty() && part.find_first_not_of("0123456789") == std::string_view::npos;
        cur = digits ? r.getitem(cur, value(int64_t(std::stoll(std::string(part.substr(0, 18))))))
                     : r.getitem(cur, value(part));
        if (dot == std::string_view::npos) return cur;
        p.remove_prefix(dot + 1);
    }
}

value fold_case(const value& v) {
    return v.is_string() ? value(unicode::lower(v.as_string())) : v;
}

std::string py_strip(std::string_view s, const value& chars, bool left, bool right) {
    std::vector<char32_t> set;
    const bool whitespace = !chars.is_string();
    if (!whitespace) set = code_points(chars.as_string());
    auto strip_it = [&](char32_t c) {
        return whitespace ? unicode::is_space(c)
                          : std::find(set.begin(), set.end(), c) != set.end();
    };
    std::vector<size_t> offs = unicode::code_point_offsets(s);
    size_t b = 0, e = offs.size() - 1;
    if (left) {
        while (b < e && strip_it(unicode::decode(s, offs[b]).cp)) ++b;
    }
    if (right) {
        while (e > b && strip_it(unicode::decode(s, offs[e - 1]).cp)) --e;
    }
    return std::string(s.substr(offs[b], offs[e] - offs[b]));
}

std::vector<std::string> py_split(std::string_view s, const value& sep, int64_t maxsplit,
                                  bool from_right) {
    std::vector<std::string> out;
    if (!sep.is_string()) {
        auto w = words(s);
        if (maxsplit < 0 || size_t(maxsplit) >= w.size()) {
            for (auto [b, e] : w) out.emplace_back(s.substr(b, e - b));
            return out;
        }
        if (w.empty()) return out;
        if (!from_right) {
            for (int64_t i = 0; i < maxsplit; ++i)
                out.emplace_back(s.substr(w[i].first, w[i].second - w[i].first));
            std::string rest(s.substr(w[maxsplit].first));
            out.push_back(rest);
        } else {
            const size_t keep = w.size() - size_t(maxsplit);
            out.emplace_back(s.substr(0, w[keep - 1].second));
            for (size_t i = keep; i < w.size(); ++i)
                out.emplace_back(s.substr(w[i].first, w[i].second - w[i].first));
        }
        return out;
    }
    const std::string& d = sep.as_string();
    if (d.empty()) fail("empty separator");
    std::vector<size_t> cuts;  // start offsets of separators used
    if (!from_right) {
        for (size_t at = s.find(d);
             at != std::string_view::npos && (maxsplit < 0 || int64_t(cuts.size()) < maxsplit);
             at = s.find(d, at + d.size())) {
            cuts.push_back(at);
        }
    } else {
        size_t end = s.size();
        while (maxsplit < 0 || int64_t(cuts.size()) < maxsplit) {
            if (end < d.size()) break;
            const size_t at = s.rfind(d, end - d.size());
            if (at == std::string_view::npos) break;
            cuts.push_back(at);
            end = at;
        }
        std::reverse(cuts.begin(), cuts.end());
    }
    size_t prev = 0;
    for (size_t at : cuts) {
        out.emplace_back(s.substr(prev, at - prev));
        prev = at + d.size();
    }
    out.emplace_back(s.substr(prev));
    return out;
}

std::vector<std::string> py_splitlines(std::string_view s, bool keepends) {
    std::vector<std::string> out;
    size_t start = 0, i = 0;
    while (i < s.size()) {
        unicode::decoded d = unicode::decode(s, i);
        const char32_t c = d.cp;
        const bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C ||
                         c == 0x1D || c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
        if (!brk) {
            i += d.length;
            continue;
        }
        size_t end = i + d.length;
        if (c == '\r' && end < s.size() && s[end] == '\n') ++end;
        out.emplace_back(s.substr(start, (keepends ? end : i) - start));
        start = i = end;
    }
    if (start < s.size()) out.emplace_back(s.substr(start));
    return out;
}

std::string py_replace(std::string_view s, std::string_view old, std::string_view with,
                       int64_t count) {
    std::string out;
    int64_t done = 0;
    if (old.empty()) {
        std::vector<size_t> offs = unicode::code_point_offsets(s);
        for (size_t k = 0; k + 1 < offs.size(); ++k) {
            if (count < 0 || done < count) {
                out += with;
                ++done;
            }
            out.append(s.substr(offs[k], offs[k + 1] - offs[k]));
        }
        if (count < 0 || done < count) out += with;
        return out;
    }
    size_t prev = 0;
    for (size_t at = s.find(old); at != std::string_view::npos && (count < 0 || done < count);
         at = s.find(old, prev)) {
        out.append(s.substr(prev, at - prev));
        out.append(with);
        prev = at + old.size();
        ++done;
    }
    out.append(s.substr(prev));
    return out;
}

int64_t py_find(std::string_view s, std::string_view sub, bool from_right) {
    const size_t at = from_right ? s.rfind(sub) : s.find(sub);
    if (at == std::string_view::npos) return -1;
    return int64_t(unicode::count_code_points(s.substr(0, at)));
}

int64_t py_count(std::string_view s, std::string_view sub) {
    if (sub.empty()) return int64_t(unicode::count_code_points(s)) + 1;
    int64_t n = 0;
    for (size_t at = s.find(sub); at != std::string_view::npos; at = s.find(sub, at + sub.size())) {
        ++n;
    }
    return n;
}

std::string py_center(std::string_view s, int64_t width, std::string_view fill) {
    const int64_t len = int64_t(unicode::count_code_points(s));
    const int64_t marg = width - len;
    if (marg <= 0) return std::string(s);
    const int64_t left = marg / 2 + (marg & width & 1);
    std::string out;
    for (int64_t i = 0; i < left; ++i) out += fill;
    out += s;
    for (int64_t i = 0; i < marg - left; ++i) out += fill;
    return out;
}

// str.islower / str.isupper: some cased character, and none of the other case.
bool cased_only(std::string_view s, bool (*wanted)(char32_t), bool (*other)(char32_t)) {
    bool cased = false;
    for (size_t i = 0; i < s.size();) {
        unicode::decoded d = unicode::decode(s, i);
        if (other(d.cp) || unicode::is_title(d.cp)) return false;
        if (wanted(d.cp)) cased = true;
        i += d.length;
    }
    return cased;
}

bool py_islower(std::string_view s) {
    return cased_only(s, unicode::is_lower, unicode::is_upper);
}
bool py_isupper(std::string_view s) {
    return cased_only(s, unicode::is_upper, unicode::is_lower);
}

}  // namespace ordo::jinja::detail
