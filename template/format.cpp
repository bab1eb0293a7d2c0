// format.cpp: Python's str(), repr(), json.dumps, printf-style % and str.format for values.
#include "template/format.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "template/failure.hpp"
#include "template/unicode.hpp"

namespace ordo::jinja {

namespace {

// Output under construction with the byte and depth bounds of format_limits.
class bounded_out {
public:
    explicit bounded_out(const format_limits& lim) : _lim(lim) {}
    void append(std::string_view s) {
        if (_s.size() + s.size() > _lim.bytes_max) {
            fail("formatted value exceeds the output bound of " + std::to_string(_lim.bytes_max) +
                 " bytes");
        }
        _s += s;
    }
    void enter() {
        if (++_depth > _lim.depth_max) {
            fail("value nesting exceeds the depth bound of " + std::to_string(_lim.depth_max) +
                 " while formatting (a namespace that holds itself?)");
        }
    }
    void leave() { --_depth; }
    std::string take() { return std::move(_s); }

private:
    const format_limits& _lim;
    std::string _s;
    uint32_t _depth = 0;
};

struct depth_guard {
    bounded_out& out;
    explicit depth_guard(bounded_out& o) : out(o) { out.enter(); }
    ~depth_guard() { out.leave(); }
};

void append_hex(std::string& out, uint32_t v, int digits) {
    static const char* k = "0123456789abcdef";
    for (int i = digits - 1; i >= 0; --i) out += k[(v >> (4 * i)) & 0xF];
}

void write_value(bounded_out& out, const value& v, bool repr);

void write_items(bounded_out& out, const std::vector<value>& items, const char* open,
                 const char* close, bool one_tuple) {
    depth_guard g(out);
    out.append(open);
    for (size_t i = 0; i < items.size(); ++i) {
        if (i) out.append(", ");
        write_value(out, items[i], true);
    }
    if (one_tuple && items.size() == 1) out.append(",");
    out.append(close);
}

// Python's namedtuple repr: _GroupTuple(grouper='a', list=[...]).
void write_named_tuple(bounded_out& out, const list_data& l) {
    depth_guard g(out);
    out.append(l.type_name + "(");
    for (size_t i = 0; i < l.items.size() && i < l.fields.size(); ++i) {
        if (i) out.append(", ");
        out.append(l.fields[i] + "=");
        write_value(out, l.items[i], true);
    }
    out.append(")");
}

void write_dict(bounded_out& out, const dict_data& d) {
    depth_guard g(out);
    out.append("{");
    bool first = true;
    for (const auto& [k, v] : d.entries) {
        if (!first) out.append(", ");
        first = false;
        write_value(out, k, true);
        out.append(": ");
        write_value(out, v, true);
    }
    out.append("}");
}

void write_value(bounded_out& out, const value& v, bool repr) {
    switch (v.type()) {
        case value::kind::undefined:
            out.append(repr ? "Undefined" : "");
            return;
        case value::kind::none:
            out.append("None");
            return;
        case value::kind::boolean:
            out.append(v.as_bool() ? "True" : "False");
            return;
        case value::kind::integer:
            out.append(std::to_string(v.as_int()));
            return;
        case value::kind::floating:
            out.append(float_repr(v.as_float()));
            return;
        case value::kind::string:
            out.append(repr ? string_repr(v.as_string()) : std::string_view(v.as_string()));
            return;
        case value::kind::list:
            if (!v.as_list().fields.empty()) {
                write_named_tuple(out, v.as_list());
            } else if (v.is_tuple()) {
                write_items(out, v.items(), "(", ")", true);
            } else {
                write_items(out, v.items(), "[", "]", false);
            }
            return;
        case value::kind::dict:
            write_dict(out, v.as_dict());
            return;
        case value::kind::callable:
            if (v.as_callable().is_macro) {
                out.append("<Macro '" + v.as_callable().name + "'>");
            } else {
                out.append("<function " + v.as_callable().name + ">");
            }
            return;
        case value::kind::ns:
            out.append("<Namespace ");
            write_dict(out, v.as_namespace()->attrs);
            out.append(">");
            return;
    }
}

// ---- json ---------------------------------------------------------------------------------

void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
    out += '"';
    for (size_t i = 0; i < s.size();) {
        unicode::decoded d = unicode::decode(s, i);
        const char32_t c = d.cp;
        switch (c) {
            case '"':
                out += "\\\"";
                break;
            case '\\':
                out += "\\\\";
                break;
            case '\n':
                out += "\\n";
                break;
            case '\r':
                out += "\\r";
                break;
            case '\t':
                out += "\\t";
                break;
            case '\b':
                out += "\\b";
                break;
            case '\f':
                out += "\\f";
                break;
            default:
                if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
                    if (c >= 0x10000) {  // a surrogate pair, as Python writes it
                        const char32_t u = c - 0x10000;
                        out += "\\u";
                        append_hex(out, 0xD800 + (u >> 10), 4);
                        out += "\\u";
                        append_hex(out, 0xDC00 + (u & 0x3FF), 4);
                    } else {
                        out += "\\u";
                        append_hex(out, c, 4);
                    }
                } else {
                    out.append(s.substr(i, d.length));
                }
        }
        i += d.length;
    }
    out += '"';
}

std::string json_float(double d) {
    if (std::isnan(d)) return "NaN";
    if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
    return float_repr(d);
}

// A dict key as json.dumps converts it: str as is; numbers, bools and None to their JSON text.
std::string json_key(const value& k) {
    switch (k.type()) {
        case value::kind::string:
            return k.as_string();
        case value::kind::boolean:
            return k.as_bool() ? "true" : "false";
        case value::kind::integer:
            return std::to_string(k.as_int());
        case value::kind::floating:
            return json_float(k.as_float());
        case value::kind::none:
            return "null";
        default:
            fail("keys must be str, int, float, bool or None, not " + std::string(type_name(k)));
    }
}

void write_json(bounded_out& out, const value& v, const json_options& opt, int level);

void json_newline(bounded_out& out, const json_options& opt, int level) {
    std::string s = "\n";
    for (int i = 0; i < level; ++i) s += *opt.indent;
    out.append(s);
}

void write_json_list(bounded_out& out, const std::vector<value>& items, const json_options& opt,
                     int level) {
    if (items.empty()) return out.append("[]");
    depth_guard g(out);
    out.append("[");
    for (size_t i = 0; i < items.size(); ++i) {
        if (i) out.append(opt.item_separator);
        if (opt.indent) json_newline(out, opt, level + 1);
        write_json(out, items[i], opt, level + 1);
    }
    if (opt.indent) json_newline(out, opt, level);
    out.append("]");
}

void write_json_dict(bounded_out& out, const dict_data& d, const json_options& opt, int level) {
    if (d.entries.empty()) return out.append("{}");
    depth_guard g(out);
    std::vector<std::pair<std::string, const value*>> entries;
    for (const auto& [k, v] : d.entries) entries.emplace_back(json_key(k), &v);
    if (opt.sort_keys) {
        for (const auto& [k, v] : d.entries) {
            if (!k.is_string()) fail("'<' not supported between dict keys of different types");
        }
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
    }
    out.append("{");
    for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out.append(opt.item_separator);
        if (opt.indent) json_newline(out, opt, level + 1);
        std::string key;
        json_string(key, entries[i].first, opt.ensure_ascii);
        out.append(key);
        out.append(opt.key_separator);
        write_json(out, *entries[i].second, opt, level + 1);
    }
    if (opt.indent) json_newline(out, opt, level);
    out.append("}");
}

void write_json(bounded_out& out, const value& v, const json_options& opt, int level) {
    switch (v.type()) {
        case value::kind::none:
            return out.append("null");
        case value::kind::boolean:
            return out.append(v.as_bool() ? "true" : "false");
        case value::kind::integer:
            return out.append(std::to_string(v.as_int()));
        case value::kind::floating:
            return out.append(json_float(v.as_float()));
        case value::kind::string: {
            std::string s;
            json_string(s, v.as_string(), opt.ensure_ascii);
            return out.append(s);
        }
        case value::kind::list:
            return write_json_list(out, v.items(), opt, level);
        case value::kind::dict:
            return write_json_dict(out, v.as_dict(), opt, level);
        default:
            fail("Object of type " + std::string(v.is_undefined() ? "Undefined" : type_name(v)) +
                 " is not JSON serializable");
    }
}

// ---- printf-style ------------------------------------------------------------------------

struct spec_flags {
    bool left = false, plus = false, space = false, alt = false, zero = false;
    int width = -1;
    int precision = -1;
};

std::string pad(std::string s, size_t width, bool left, char fill = ' ') {
    const size_t n = unicode::count_code_points(s);
    if (n >= width) return s;
    std::string p(width - n, fill);
    return left ? s + p : p + s;
}

int64_t to_int_for_format(const value& v, char conv) {
    if (v.is_int() || v.is_bool()) return v.int_of();
    if (v.is_float() && (conv == 'd' || conv == 'i' || conv == 'u')) {
        double f = v.as_float();
        if (!std::isfinite(f)) fail("cannot convert float " + float_repr(f) + " to integer");
        if (std::fabs(f) >= 9.2e18) fail("integer out of the 64-bit range in % format");
        return int64_t(f);
    }
    fail(std::string("%") + conv + " format: a number is required, not " +
         std::string(type_name(v)));
}

std::string c_format_int(int64_t v, const spec_flags& f, char conv) {
    std::string fmt = "%";
    if (f.left) fmt += '-';
    if (f.plus) fmt += '+';
    if (f.space) fmt += ' ';
    if (f.zero && !f.left) fmt += '0';
    if (f.alt && conv != 'o') fmt += '#';
    if (f.width >= 0) fmt += std::to_string(f.width);
    if (f.precision >= 0) fmt += "." + std::to_string(f.precision);
    fmt += "ll";
    fmt += (conv == 'i' || conv == 'u') ? 'd' : conv;
    char buf[512];
    if (conv == 'x' || conv == 'X' || conv == 'o') {
        // Python formats the magnitude with a sign, C formats two's complement.
        std::string digits;
        const uint64_t mag = v < 0 ? uint64_t(0) - uint64_t(v) : uint64_t(v);
        std::snprintf(buf, sizeof buf,
                      conv == 'x'   ? "%llx"
                      : conv == 'X' ? "%llX"
                                    : "%llo",
                      (unsigned long long)mag);
        digits = buf;
        if (f.precision > int(digits.size())) digits.insert(0, f.precision - digits.size(), '0');
        std::string prefix = v < 0 ? "-" : f.plus ? "+" : f.space ? " " : "";
        if (f.alt) prefix += conv == 'o' ? "0o" : conv == 'x' ? "0x" : "0X";
        if (f.zero && !f.left && f.width > int(prefix.size() + digits.size())) {
            digits.insert(0, f.width - prefix.size() - digits.size(), '0');
        }
        return pad(prefix + digits, std::max(f.width, 0), f.left);
    }
    std::snprintf(buf, sizeof buf, fmt.c_str(), (long long)v);
    return buf;
}

std::string c_format_float(double v, const spec_flags& f, char conv) {
    std::string fmt = "%";
    if (f.left) fmt += '-';
    if (f.plus) fmt += '+';
    if (f.space) fmt += ' ';
    if (f.zero && !f.left && std::isfinite(v)) fmt += '0';
    if (f.alt) fmt += '#';
    if (f.width >= 0) fmt += std::to_string(f.width);
    fmt += "." + std::to_string(f.precision >= 0 ? f.precision : 6);
    fmt += conv;
    std::vector<char> buf(std::max(f.width, 0) + std::max(f.precision, 0) + 400);
    std::snprintf(buf.data(), buf.size(), fmt.c_str(), v);
    return buf.data();
}

// Width and precision in a % or {} spec are bounded so a spec cannot ask for gigabytes.
constexpr int k_spec_number_max = 100000;

int read_number(std::string_view s, size_t& i) {
    int n = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
        n = n * 10 + (s[i++] - '0');
        if (n > k_spec_number_max) fail("format width or precision too big");
    }
    return n;
}

// ---- format spec (str.format, format()) ---------------------------------------------------

struct brace_spec {
    char32_t fill = ' ';
    char align = 0;  // < > ^ =
    char sign = 0;
    bool alt = false;
    bool zero = false;
    int width = -1;
    char grouping = 0;
    int precision = -1;
    char type = 0;
};

brace_spec parse_brace_spec(std::string_view s) {
    brace_spec b;
    size_t i = 0;
    auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
    if (!s.empty()) {
        unicode::decoded d = unicode::decode(s, 0);
        if (d.length < s.size() && is_align(s[d.length])) {
            b.fill = d.cp;
            b.align = s[d.length];
            i = d.length + 1;
        } else if (is_align(s[0])) {
            b.align = s[0];
            i = 1;
        }
    }
    if (i < s.size() && (s[i] == '+' || s[i] == '-' || s[i] == ' ')) b.sign = s[i++];
    if (i < s.size() && s[i] == '#') b.alt = true, ++i;
    if (i < s.size() && s[i] == '0') b.zero = true, ++i;
    if (i < s.size() && s[i] >= '0' && s[i] <= '9') b.width = read_number(s, i);
    if (i < s.size() && (s[i] == ',' || s[i] == '_')) b.grouping = s[i++];
    if (i < s.size() && s[i] == '.') {
        ++i;
        if (i >= s.size() || s[i] < '0' || s[i] > '9') fail("Format specifier missing precision");
        b.precision = read_number(s, i);
    }
    if (i < s.size()) b.type = s[i++];
    if (i != s.size()) fail("Invalid format specifier '" + std::string(s) + "'");
    return b;
}

std::string group_digits(std::string digits, char sep) {
    std::string out;
    const size_t n = digits.size();
    for (size_t i = 0; i < n; ++i) {
        if (i && (n - i) % 3 == 0) out += sep;
        out += digits[i];
    }
    return out;
}

std::string apply_width(std::string sign, std::string body, const brace_spec& b, char def_align) {
    char align = b.align ? b.align : (b.zero ? '=' : def_align);
    char32_t fill = b.align ? b.fill : (b.zero ? U'0' : b.fill);
    const size_t n = unicode::count_code_points(sign) + unicode::count_code_points(body);
    if (b.width < 0 || n >= size_t(b.width)) return sign + body;
    const size_t total = size_t(b.width) - n;
    std::string f;
    unicode::append_utf8(f, fill);
    auto rep = [&](size_t k) {
        std::string s;
        for (size_t i = 0; i < k; ++i) s += f;
        return s;
    };
    switch (align) {
        case '<':
            return sign + body + rep(total);
        case '^':
            return rep(total / 2) + sign + body + rep(total - total / 2);
        case '=':
            return sign + rep(total) + body;
        default:
            return rep(total) + sign + body;
    }
}

std::string format_number(const value& v, const brace_spec& b) {
    char type = b.type;
    const bool as_float =
        v.is_float() || std::string_view("eEfFgG%").find(type) != std::string_view::npos;
    if (as_float && type != 0 && std::string_view("eEfFgG%").find(type) == std::string_view::npos) {
        fail("Unknown format code '" + std::string(1, type) + "' for object of type 'float'");
    }
    std::string body;
    bool negative = false;
    if (!as_float) {
        const int64_t n = v.int_of();
        negative = n < 0;
        const uint64_t mag = negative ? uint64_t(0) - uint64_t(n) : uint64_t(n);
        char buf[80];
        switch (type) {
            case 0:
            case 'd':
            case 'n':
                std::snprintf(buf, sizeof buf, "%llu", (unsigned long long)mag);
                break;
            case 'x':
                std::snprintf(buf, sizeof buf, "%llx", (unsigned long long)mag);
                break;
            case 'X':
                std::snprintf(buf, sizeof buf, "%llX", (unsigned long long)mag);
                break;
            case 'o':
                std::snprintf(buf, sizeof buf, "%llo", (unsigned long long)mag);
                break;
            case 'b': {
                std::string bits;
                for (uint64_t m = mag; m; m >>= 1) bits.insert(bits.begin(), char('0' + (m & 1)));
                std::snprintf(buf, sizeof buf, "%s", bits.empty() ? "0" : bits.c_str());
                break;
            }
            case 'c': {
                std::string s;
                unicode::append_utf8(s, char32_t(mag));
                return apply_width("", s, b, '<');
            }
            default:
                fail("Unknown format code '" + std::string(1, type) + "' for object of type 'int'");
        }
        body = buf;
        if (b.grouping) body = group_digits(body, b.grouping);
        if (b.alt && type != 0 && type != 'd' && type != 'n') {
            body = std::string("0") + (type == 'X' ? 'X' : type) + body;
        }
    } else {
        double d = v.float_of();
        negative = std::signbit(d) && !std::isnan(d);
        d = std::fabs(d);
        if (type == '%') d *= 100.0;
        if (type == 0 && b.precision < 0) {
            body = float_repr(d);
        } else {
            char conv = type == 0 ? 'g' : type == '%' ? 'f' : type;
            spec_flags f;
            f.precision = b.precision >= 0 ? b.precision : (type == 0 ? 12 : 6);
            f.alt = b.alt;
            body = c_format_float(d, f, conv);
            if (type == 0 && body.find_first_of(".einfa") == std::string::npos) body += ".0";
            if (type == '%') body += '%';
        }
        if (b.grouping) {
            size_t dot = body.find_first_not_of("0123456789");
            body = group_digits(body.substr(0, dot), b.grouping) +
                   (dot == std::string::npos ? "" : body.substr(dot));
        }
    }
    std::string sign = negative ? "-" : b.sign == '+' ? "+" : b.sign == ' ' ? " " : "";
    return apply_width(sign, body, b, '>');
}

}  // namespace

std::string float_repr(double d) {
    if (std::isnan(d)) return "nan";
    if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
    std::string_view sci(buf, size_t(r.ptr - buf));  // "-1.2345e+05", shortest round trip
    std::string out;
    if (sci.front() == '-') {
        out += '-';
        sci.remove_prefix(1);
    }
    const size_t e = sci.find('e');
    std::string digits;
    for (char c : sci.substr(0, e)) {
        if (c != '.') digits += c;
    }
    int exp10 = 0;
    std::from_chars(sci.data() + e + 1 + (sci[e + 1] == '+'), sci.data() + sci.size(), exp10);
    const int decpt = exp10 + 1;  // value = 0.DIGITS * 10^decpt
    const int n = int(digits.size());
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            out += "0." + std::string(-decpt, '0') + digits;
        } else if (decpt >= n) {
            out += digits + std::string(decpt - n, '0') + ".0";
        } else {
            out += digits.substr(0, decpt) + "." + digits.substr(decpt);
        }
        return out;
    }
    out += digits[0];
    if (n > 1) out += "." + digits.substr(1);
    const int x = decpt - 1;
    out += x < 0 ? "e-" : "e+";
    const int ax = x < 0 ? -x : x;
    if (ax < 10) out += '0';
    out += std::to_string(ax);
    return out;
}

std::string string_repr(std::string_view s) {
    const bool has_single = s.find('\'') != std::string_view::npos;
    const bool has_double = s.find('"') != std::string_view::npos;
    const char quote = (has_single && !has_double) ? '"' : '\'';
    std::string out(1, quote);
    for (size_t i = 0; i < s.size();) {
        unicode::decoded d = unicode::decode(s, i);
        const char32_t c = d.cp;
        if (c == char32_t(quote) || c == '\\') {
            out += '\\';
            out += char(c);
        } else if (c == '\t') {
            out += "\\t";
        } else if (c == '\n') {
            out += "\\n";
        } else if (c == '\r') {
            out += "\\r";
        } else if (c < 0x20 || c == 0x7F) {
            out += "\\x";
            append_hex(out, c, 2);
        } else if (c < 0x7F || unicode::is_printable(c)) {
            out.append(s.substr(i, d.length));
        } else if (c <= 0xFF) {
            out += "\\x";
            append_hex(out, c, 2);
        } else if (c <= 0xFFFF) {
            out += "\\u";
            append_hex(out, c, 4);
        } else {
            out += "\\U";
            append_hex(out, c, 8);
        }
        i += d.length;
    }
    out += quote;
    return out;
}

std::string to_str(const value& v, const format_limits& lim) {
    if (v.is_string()) return v.as_string();
    bounded_out out(lim);
    write_value(out, v, false);
    return out.take();
}

std::string to_repr(const value& v, const format_limits& lim) {
    bounded_out out(lim);
    write_value(out, v, true);
    return out.take();
}

std::string to_json(const value& v, const json_options& opt, const format_limits& lim) {
    bounded_out out(lim);
    write_json(out, v, opt, 0);
    return out.take();
}

std::string percent_format(std::string_view fmt, const value& args, const format_limits& lim) {
    std::vector<value> positional;
    const dict_data* mapping = nullptr;
    if (args.is_tuple()) {
        positional = args.items();
    } else {
        if (args.is_dict()) mapping = &args.as_dict();
        positional.push_back(args);
    }
    size_t next = 0;
    bool used_mapping = false;
    bounded_out out(lim);
    auto next_arg = [&]() -> const value& {
        if (next >= positional.size()) fail("not enough arguments for format string");
        return positional[next++];
    };
    for (size_t i = 0; i < fmt.size();) {
        const size_t pct = fmt.find('%', i);
        out.append(fmt.substr(i, pct == std::string_view::npos ? pct : pct - i));
        if (pct == std::string_view::npos) break;
        i = pct + 1;
        if (i >= fmt.size()) fail("incomplete format");
        const value* arg = nullptr;
        if (fmt[i] == '(') {
            const size_t close = fmt.find(')', i);
            if (close == std::string_view::npos) fail("incomplete format key");
            if (mapping == nullptr) fail("format requires a mapping");
            const value* found = mapping->find(fmt.substr(i + 1, close - i - 1));
            if (found == nullptr)
                fail("KeyError: '" + std::string(fmt.substr(i + 1, close - i - 1)) + "'");
            arg = found;
            used_mapping = true;
            i = close + 1;
        }
        spec_flags f;
        for (; i < fmt.size(); ++i) {
            const char c = fmt[i];
            if (c == '-')
                f.left = true;
            else if (c == '+')
                f.plus = true;
            else if (c == ' ')
                f.space = true;
            else if (c == '#')
                f.alt = true;
            else if (c == '0')
                f.zero = true;
            else
                break;
        }
        if (i < fmt.size() && fmt[i] == '*') {
            ++i;
            const value& w = next_arg();
            if (!w.is_int()) fail("* wants int");
            f.width = int(std::clamp<int64_t>(w.as_int(), -k_spec_number_max, k_spec_number_max));
            if (f.width < 0) f.left = true, f.width = -f.width;
        } else if (i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') {
            f.width = read_number(fmt, i);
        }
        if (i < fmt.size() && fmt[i] == '.') {
            ++i;
            f.precision = read_number(fmt, i);
        }
        while (i < fmt.size() && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) ++i;
        if (i >= fmt.size()) fail("incomplete format");
        const char conv = fmt[i++];
        if (conv == '%') {
            out.append("%");
            continue;
        }
        const value& a = arg ? *arg : next_arg();
        switch (conv) {
            case 's':
            case 'r':
            case 'a': {
                std::string s = conv == 's' ? to_str(a, lim) : to_repr(a, lim);
                if (f.precision >= 0) {
                    auto offs = unicode::code_point_offsets(s);
                    if (size_t(f.precision) + 1 < offs.size()) s.resize(offs[f.precision]);
                }
                out.append(pad(s, std::max(f.width, 0), f.left));
                break;
            }
            case 'd':
            case 'i':
            case 'u':
            case 'x':
            case 'X':
            case 'o':
                out.append(c_format_int(to_int_for_format(a, conv), f, conv));
                break;
            case 'e':
            case 'E':
            case 'f':
            case 'F':
            case 'g':
            case 'G':
                if (!a.is_number()) fail("must be real number, not " + std::string(type_name(a)));
                out.append(c_format_float(a.float_of(), f, conv));
                break;
            case 'c': {
                std::string s;
                if (a.is_int()) {
                    if (a.as_int() < 0 || a.as_int() > 0x10FFFF)
                        fail("%c arg not in range(0x110000)");
                    unicode::append_utf8(s, char32_t(a.as_int()));
                } else if (a.is_string() && unicode::count_code_points(a.as_string()) == 1) {
                    s = a.as_string();
                } else {
                    fail("%c requires int or char");
                }
                out.append(pad(s, std::max(f.width, 0), f.left));
                break;
            }
            default:
                fail("unsupported format character '" + std::string(1, conv) + "'");
        }
    }
    if (!used_mapping && mapping == nullptr && next < positional.size()) {
        fail("not all arguments converted during string formatting");
    }
    return out.take();
}

std::string format_spec(const value& v, std::string_view spec, const format_limits& lim) {
    if (spec.empty()) return to_str(v, lim);
    brace_spec b = parse_brace_spec(spec);
    if (v.is_string()) {
        if (b.type != 0 && b.type != 's') {
            fail("Unknown format code '" + std::string(1, b.type) + "' for object of type 'str'");
        }
        std::string s = v.as_string();
        if (b.precision >= 0) {
            auto offs = unicode::code_point_offsets(s);
            if (size_t(b.precision) + 1 < offs.size()) s.resize(offs[b.precision]);
        }
        return apply_width("", s, b, '<');
    }
    if (v.is_number()) return format_number(v, b);
    fail("unsupported format string passed to " + std::string(type_name(v)) + ".__format__");
}

std::string brace_format(std::string_view fmt, const call_args& args, const format_limits& lim) {
    bounded_out out(lim);
    size_t auto_index = 0;
    bool manual = false, automatic = false;
    for (size_t i = 0; i < fmt.size();) {
        const char c = fmt[i];
        if (c == '}') {
            if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
                out.append("}");
                i += 2;
                continue;
            }
            fail("Single '}' encountered in format string");
        }
        if (c != '{') {
            const size_t next = fmt.find_first_of("{}", i);
            out.append(fmt.substr(i, next == std::string_view::npos ? next : next - i));
            i = next == std::string_view::npos ? fmt.size() : next;
            continue;
        }
        if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
            out.append("{");
            i += 2;
            continue;
        }
        const size_t close = fmt.find('}', i);
        if (close == std::string_view::npos) fail("Single '{' encountered in format string");
        std::string_view field = fmt.substr(i + 1, close - i - 1);
        if (field.find('{') != std::string_view::npos)
            fail("nested format fields are not supported");
        i = close + 1;
        std::string_view spec, conv;
        if (size_t colon = field.find(':'); colon != std::string_view::npos) {
            spec = field.substr(colon + 1);
            field = field.substr(0, colon);
        }
        if (size_t bang = field.find('!'); bang != std::string_view::npos) {
            conv = field.substr(bang + 1);
            field = field.substr(0, bang);
        }
        const size_t name_end = field.find_first_of(".[");
        std::string_view name = field.substr(0, name_end);
        if (name_end != std::string_view::npos)
            fail("attribute and index access in format fields are not supported");
        const value* arg = nullptr;
        if (name.empty()) {
            if (manual)
                fail("cannot switch from manual field specification to automatic field numbering");
            automatic = true;
            if (auto_index >= args.positional.size())
                fail("Replacement index " + std::to_string(auto_index) +
                     " out of range for positional args tuple");
            arg = &args.positional[auto_index++];
        } else if (name.find_first_not_of("0123456789") == std::string_view::npos) {
            if (automatic)
                fail("cannot switch from automatic field numbering to manual field specification");
            manual = true;
            size_t k = 0;
            const int idx = read_number(name, k);
            if (size_t(idx) >= args.positional.size())
                fail("Replacement index " + std::to_string(idx) +
                     " out of range for positional args tuple");
            arg = &args.positional[idx];
        } else {
            for (const auto& [k, v] : args.keyword) {
                if (k == name) arg = &v;
            }
            if (arg == nullptr) fail("KeyError: '" + std::string(name) + "'");
        }
        value shown = *arg;
        if (conv == "r" || conv == "a") {
            shown = value(to_repr(*arg, lim));
        } else if (conv == "s") {
            shown = value(to_str(*arg, lim));
        } else if (!conv.empty()) {
            fail("Unknown conversion specifier " + std::string(conv));
        }
        out.append(format_spec(shown, spec, lim));
    }
    return out.take();
}

}  // namespace ordo::jinja
