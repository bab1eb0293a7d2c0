// unicode.cpp: UTF-8 decoding and Python's str character semantics over the generated tables.
#include "template/unicode.hpp"

#include <algorithm>
#include <iterator>

namespace ordo::jinja::unicode {

namespace {

struct cp_range {
    char32_t first, last;
};
// Code points first, first + stride, ..., up to last map to cp + delta.
struct case_run {
    char32_t first, last;
    uint32_t stride;
    int32_t delta;
};
struct case_multi {
    char32_t from;
    char32_t to[3];  // unused slots are 0
};

#include "template/unicode_tables.inc"

template <size_t N>
bool in_ranges(const cp_range (&table)[N], char32_t cp) {
    auto it = std::upper_bound(std::begin(table), std::end(table), cp,
                               [](char32_t c, const cp_range& r) { return c < r.first; });
    if (it == std::begin(table)) return false;
    --it;
    return cp <= it->last;
}

template <size_t R, size_t M>
void append_mapped(std::string& out, char32_t cp, const case_run (&runs)[R],
                   const case_multi (&multi)[M]) {
    auto m = std::lower_bound(std::begin(multi), std::end(multi), cp,
                              [](const case_multi& e, char32_t c) { return e.from < c; });
    if (m != std::end(multi) && m->from == cp) {
        for (char32_t t : m->to) {
            if (t != 0) append_utf8(out, t);
        }
        return;
    }
    auto it = std::upper_bound(std::begin(runs), std::end(runs), cp,
                               [](char32_t c, const case_run& r) { return c < r.first; });
    if (it != std::begin(runs)) {
        --it;
        if (cp <= it->last && (cp - it->first) % it->stride == 0) {
            append_utf8(out, char32_t(int64_t(cp) + it->delta));
            return;
        }
    }
    append_utf8(out, cp);
}

bool is_case_ignorable(char32_t cp) {
    return in_ranges(k_case_ignorable, cp);
}

// Python's lower() maps U+03A3 (capital sigma) to the final form when it ends a word: a cased
// letter precedes it and none follows (case-ignorable characters skipped both ways).
char32_t lower_sigma(const std::vector<char32_t>& cps, size_t i) {
    size_t j = i;
    while (j > 0 && is_case_ignorable(cps[j - 1])) --j;
    bool final_sigma = j > 0 && is_cased(cps[j - 1]);
    if (final_sigma) {
        size_t k = i + 1;
        while (k < cps.size() && is_case_ignorable(cps[k])) ++k;
        final_sigma = k == cps.size() || !is_cased(cps[k]);
    }
    return final_sigma ? 0x3C2 : 0x3C3;
}

std::vector<char32_t> to_code_points(std::string_view s) {
    std::vector<char32_t> out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        decoded d = decode(s, i);
        out.push_back(d.cp);
        i += d.length;
    }
    return out;
}

// Lower-cases cps[i] into out, with the final-sigma rule.
void lower_at(std::string& out, const std::vector<char32_t>& cps, size_t i) {
    if (cps[i] == 0x3A3) {
        append_utf8(out, lower_sigma(cps, i));
    } else {
        append_lower(out, cps[i]);
    }
}

}  // namespace

decoded decode(std::string_view s, size_t i) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) return {b0, 1};
    size_t n = 0;
    char32_t cp = 0;
    char32_t min = 0;
    if ((b0 & 0xE0) == 0xC0) {
        n = 2, cp = b0 & 0x1F, min = 0x80;
    } else if ((b0 & 0xF0) == 0xE0) {
        n = 3, cp = b0 & 0x0F, min = 0x800;
    } else if ((b0 & 0xF8) == 0xF0) {
        n = 4, cp = b0 & 0x07, min = 0x10000;
    } else {
        return {k_replacement, 1};
    }
    if (i + n > s.size()) return {k_replacement, 1};
    for (size_t k = 1; k < n; ++k) {
        const auto b = static_cast<unsigned char>(s[i + k]);
        if ((b & 0xC0) != 0x80) return {k_replacement, 1};
        cp = (cp << 6) | (b & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) return {k_replacement, 1};
    return {cp, n};
}

void append_utf8(std::string& out, char32_t cp) {
    if (cp < 0x80) {
        out += char(cp);
    } else if (cp < 0x800) {
        out += char(0xC0 | (cp >> 6));
        out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += char(0xE0 | (cp >> 12));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    } else {
        out += char(0xF0 | (cp >> 18));
        out += char(0x80 | ((cp >> 12) & 0x3F));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    }
}

size_t count_code_points(std::string_view s) {
    size_t n = 0;
    for (size_t i = 0; i < s.size(); i += decode(s, i).length) ++n;
    return n;
}

std::vector<size_t> code_point_offsets(std::string_view s) {
    std::vector<size_t> out;
    out.reserve(s.size() + 1);
    for (size_t i = 0; i < s.size(); i += decode(s, i).length) out.push_back(i);
    out.push_back(s.size());
    return out;
}

bool is_space(char32_t cp) {
    return in_ranges(k_space, cp);
}
bool is_printable(char32_t cp) {
    return in_ranges(k_printable, cp);
}
bool is_alpha(char32_t cp) {
    return in_ranges(k_alpha, cp);
}
bool is_alnum(char32_t cp) {
    return in_ranges(k_alnum, cp);
}
bool is_decimal(char32_t cp) {
    return in_ranges(k_decimal, cp);
}
bool is_digit(char32_t cp) {
    return in_ranges(k_digit, cp);
}
bool is_cased(char32_t cp) {
    return in_ranges(k_cased, cp);
}
bool is_upper(char32_t cp) {
    return in_ranges(k_uppercase, cp);
}
bool is_title(char32_t cp) {
    return in_ranges(k_titlecase, cp);
}
bool is_lower(char32_t cp) {
    return is_cased(cp) && !is_upper(cp) && !is_title(cp);
}
bool is_word(char32_t cp) {
    return cp == '_' || is_alnum(cp);
}

void append_upper(std::string& out, char32_t cp) {
    append_mapped(out, cp, k_upper_runs, k_upper_multi);
}
void append_lower(std::string& out, char32_t cp) {
    append_mapped(out, cp, k_lower_runs, k_lower_multi);
}
void append_title(std::string& out, char32_t cp) {
    append_mapped(out, cp, k_title_runs, k_title_multi);
}

namespace {

// Maps each code point of s with fn(out, cps, i), which appends the mapping of cps[i].
template <typename F>
std::string map_code_points(std::string_view s, F&& fn) {
    std::vector<char32_t> cps = to_code_points(s);
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < cps.size(); ++i) fn(out, cps, i);
    return out;
}

}  // namespace

std::string lower(std::string_view s) {
    return map_code_points(s, lower_at);
}

std::string upper(std::string_view s) {
    return map_code_points(s, [](std::string& out, const std::vector<char32_t>& cps, size_t i) {
        append_upper(out, cps[i]);
    });
}

std::string capitalize(std::string_view s) {
    return map_code_points(s, [](std::string& out, const std::vector<char32_t>& cps, size_t i) {
        if (i == 0) {
            append_title(out, cps[0]);
        } else {
            lower_at(out, cps, i);
        }
    });
}

std::string title(std::string_view s) {
    bool previous_is_cased = false;
    return map_code_points(s, [&](std::string& out, const std::vector<char32_t>& cps, size_t i) {
        if (previous_is_cased) {
            lower_at(out, cps, i);
        } else {
            append_title(out, cps[i]);
        }
        previous_is_cased = is_cased(cps[i]);
    });
}

std::string swapcase(std::string_view s) {
    return map_code_points(s, [](std::string& out, const std::vector<char32_t>& cps, size_t i) {
        if (is_upper(cps[i])) {
            lower_at(out, cps, i);
        } else if (is_lower(cps[i])) {
            append_upper(out, cps[i]);
        } else {
            append_utf8(out, cps[i]);
        }
    });
}

}  // namespace ordo::jinja::unicode
