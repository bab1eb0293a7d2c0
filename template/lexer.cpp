// lexer.cpp: Jinja's lexer rules, written from its documented behaviour: delimiters
// {{ }} {% %} {# #}, `-` and `+` whitespace control, trim_blocks (a block or comment tag eats
// the one "\n" after it), lstrip_blocks (spaces and tabs from the start of a line up to a block
// or comment tag are dropped), raw blocks, and Python-style literals inside tags.
#include "template/lexer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "template/failure.hpp"
#include "template/unicode.hpp"

namespace ordo::jinja {

namespace {

bool is_digit(char c) {
    return c >= '0' && c <= '9';
}
bool is_name_start(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_name_char(char c) {
    return is_name_start(c) || is_digit(c);
}

// "\r\n" and "\r" -> "\n"; one trailing newline dropped (keep_trailing_newline=False).
std::string normalise(std::string_view src) {
    std::string out;
    out.reserve(src.size());
    for (size_t i = 0; i < src.size(); ++i) {
        if (src[i] == '\r') {
            out += '\n';
            if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
        } else {
            out += src[i];
        }
    }
    if (!out.empty() && out.back() == '\n') out.pop_back();
    return out;
}

class lexer {
public:
    explicit lexer(std::string src) : _src(std::move(src)) {
        _line_starts.push_back(0);
        for (size_t i = 0; i < _src.size(); ++i) {
            if (_src[i] == '\n') _line_starts.push_back(i + 1);
        }
    }

    std::vector<token> run() {
        while (_pos < _src.size()) step_root();
        push(tok::eof, _src.size());
        return std::move(_out);
    }

private:
    enum class tag_kind { var, block, comment };

    [[noreturn]] void fail_at(size_t pos, std::string message) const {
        auto [line, col] = where(pos);
        throw template_failure{std::move(message), line, col};
    }

    std::pair<uint32_t, uint32_t> where(size_t pos) const {
        auto it = std::upper_bound(_line_starts.begin(), _line_starts.end(), pos);
        const size_t line = size_t(it - _line_starts.begin());
        return {uint32_t(line), uint32_t(pos - _line_starts[line - 1] + 1)};
    }

    token& push(tok type, size_t pos, std::string text = {}) {
        auto [line, col] = where(pos);
        _out.push_back(token{type, std::move(text), 0, 0, line, col});
        return _out.back();
    }

    bool starts_with(size_t pos, std::string_view s) const {
        return _src.compare(pos, s.size(), s) == 0;
    }

    // Python's str.isspace over the source from pos; returns the first non-space position.
    size_t skip_space(size_t pos) const {
        while (pos < _src.size()) {
            unicode::decoded d = unicode::decode(_src, pos);
            if (!unicode::is_space(d.cp)) break;
            pos += d.length;
        }
        return pos;
    }

    static std::string rstrip_space(std::string_view s) {
        size_t end = s.size();
        // Walk back over whole code points: find the start of each trailing one.
        while (end > 0) {
            size_t start = end - 1;
            while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
            unicode::decoded d = unicode::decode(s, start);
            if (start + d.length != end || !unicode::is_space(d.cp)) break;
            end = start;
        }
        return std::string(s.substr(0, end));
    }

    // The data before a tag with its whitespace rules applied. sign is '-', '+' or 0.
    std::string trim_before(std::string_view text, char sign, bool lstrip_applies) const {
        if (sign == '-') return rstrip_space(text);
        if (sign == '+' || !lstrip_applies) return std::string(text);
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
        if ((l_pos > 0 || _line_starting) &&
            text.find_first_not_of(" \t", l_pos) == std::string_view::npos) {
            return std::string(text.substr(0, l_pos));
        }
        return std::string(text);
    }

    void emit_data(size_t pos, std::string text) {
        if (!text.empty()) push(tok::data, pos, std::move(text));
    }

    void step_root() {
        size_t open = _pos;
        tag_kind kind = tag_kind::var;
        for (;; ++open) {
            open = _src.find('{', open);
            if (open == std::string::npos || open + 1 >= _src.size()) {
                emit_data(_pos, _src.substr(_pos));
                _pos = _src.size();
                return;
            }
            const char c = _src[open + 1];
            if (c == '{' || c == '%' || c == '#') {
                kind = c == '{' ? tag_kind::var : c == '%' ? tag_kind::block : tag_kind::comment;
                break;
            }
        }
        size_t p = open + 2;
        const char sign = (p < _src.size() && (_src[p] == '-' || _src[p] == '+')) ? _src[p] : 0;
        if (sign) ++p;
        const std::string_view text(_src.data() + _pos, open - _pos);
        if (kind == tag_kind::block && try_raw(open, p, sign, text)) return;
        emit_data(_pos, trim_before(text, sign, kind != tag_kind::var));
        if (kind == tag_kind::comment) return lex_comment(open, p);
        push(kind == tag_kind::var ? tok::var_begin : tok::block_begin, open);
        lex_tag(p, kind);
    }

    // After a tag's closing delimiter at `pos` (its end): trim_blocks, `-` and line_starting.
    void close_tag(size_t after, char sign, bool trim_newline) {
        if (sign == '-') {
            after = skip_space(after);
        } else if (sign == 0 && trim_newline && after < _src.size() && _src[after] == '\n') {
            ++after;
        }
        _line_starting = after > 0 && _src[after - 1] == '\n';
        _pos = after;
    }

    void lex_comment(size_t open, size_t p) {
        const size_t end = _src.find("#}", p);
        if (end == std::string::npos) fail_at(open, "missing end of comment tag");
        char sign = 0;
        if (end > p && (_src[end - 1] == '-' || _src[end - 1] == '+')) sign = _src[end - 1];
        close_tag(end + 2, sign, true);
    }

    // `{% raw %}...{% endraw %}`: the body is data, unlexed.
    bool try_raw(size_t open, size_t p, char sign, std::string_view text) {
        size_t q = skip_space(p);
        if (!starts_with(q, "raw")) return false;
        q = skip_space(q + 3);
        size_t body;
        char end_sign = 0;
        if (starts_with(q, "-%}")) {
            body = skip_space(q + 3);
            end_sign = '-';
        } else if (starts_with(q, "%}")) {
            body = q + 2;
        } else {
            return false;
        }
        emit_data(_pos, trim_before(text, sign, true));
        _line_starting = body > 0 && _src[body - 1] == '\n';
        (void)end_sign;
        for (size_t at = _src.find("{%", body); at != std::string::npos;
             at = _src.find("{%", at + 1)) {
            size_t r = at + 2;
            const char s2 = (r < _src.size() && (_src[r] == '-' || _src[r] == '+')) ? _src[r] : 0;
            if (s2) ++r;
            r = skip_space(r);
            if (!starts_with(r, "endraw")) continue;
            r = skip_space(r + 6);
            char close_sign = 0;
            if (starts_with(r, "-%}") || starts_with(r, "+%}")) {
                close_sign = _src[r];
                r += 3;
            } else if (starts_with(r, "%}")) {
                r += 2;
            } else {
                continue;
            }
            emit_data(body, trim_before(std::string_view(_src).substr(body, at - body), s2, true));
            close_tag(r, close_sign, true);
            return true;
        }
        fail_at(open, "missing end of raw directive");
    }

    // Inside {{ }} or {% %}: expression tokens up to the closing delimiter.
    void lex_tag(size_t p, tag_kind kind) {
        std::vector<char> brackets;
        const size_t open = p;
        for (;;) {
            p = skip_space(p);
            if (p >= _src.size()) {
                fail_at(open, kind == tag_kind::var ? "unexpected end of template: '}}' expected"
                                                    : "unexpected end of template: '%}' expected");
            }
            if (brackets.empty() && try_close(p, kind)) return;
            p = lex_one(p, brackets);
        }
    }

    bool try_close(size_t p, tag_kind kind) {
        if (kind == tag_kind::block) {
            if (starts_with(p, "-%}") || starts_with(p, "+%}")) {
                push(tok::block_end, p);
                close_tag(p + 3, _src[p], true);
                return true;
            }
            if (starts_with(p, "%}")) {
                push(tok::block_end, p);
                close_tag(p + 2, 0, true);
                return true;
            }
            return false;
        }
        if (starts_with(p, "-}}")) {
            push(tok::var_end, p);
            close_tag(p + 3, '-', false);
            return true;
        }
        if (starts_with(p, "}}")) {
            push(tok::var_end, p);
            close_tag(p + 2, 0, false);
            return true;
        }
        return false;
    }

    size_t lex_one(size_t p, std::vector<char>& brackets) {
        const char c = _src[p];
        if (is_digit(c)) return lex_number(p);
        if (is_name_start(c)) {
            size_t e = p;
            while (e < _src.size() && is_name_char(_src[e])) ++e;
            push(tok::name, p, _src.substr(p, e - p));
            return e;
        }
        if (c == '\'' || c == '"') return lex_string(p);
        static const char* k_two[] = {"//", "**", "==", "!=", "<=", ">="};
        for (const char* op : k_two) {
            if (starts_with(p, op)) {
                push(tok::op, p, op);
                return p + 2;
            }
        }
        if (std::strchr("+-*/%~<>=()[]{},.:|;", c) == nullptr || c == '\0') {
            fail_at(p, "unexpected char '" + std::string(1, c) + "'");
        }
        if (c == '(' || c == '[' || c == '{') {
            brackets.push_back(c);
        } else if (c == ')' || c == ']' || c == '}') {
            const char want = c == ')' ? '(' : c == ']' ? '[' : '{';
            if (brackets.empty() || brackets.back() != want) {
                fail_at(p, "unexpected '" + std::string(1, c) + "'");
            }
            brackets.pop_back();
        }
        push(tok::op, p, std::string(1, c));
        return p + 1;
    }

    // Digits with single underscores between them ("1_000"); returns the end, or p when none.
    size_t scan_digits(size_t p) const {
        size_t e = p;
        while (e < _src.size() && is_digit(_src[e])) {
            ++e;
            if (e + 1 < _src.size() && _src[e] == '_' && is_digit(_src[e + 1])) ++e;
        }
        return e;
    }

    static std::string without_underscores(std::string_view s) {
        std::string out;
        for (char c : s) {
            if (c != '_') out += c;
        }
        return out;
    }

    size_t lex_number(size_t p) {
        const bool after_dot = p > 0 && _src[p - 1] == '.';
        size_t e = scan_digits(p);
        if (!after_dot) {
            size_t f = e;
            bool is_float = false;
            if (f + 1 < _src.size() && _src[f] == '.' && is_digit(_src[f + 1])) {
                f = scan_digits(f + 1);
                is_float = true;
            }
            if (f < _src.size() && (_src[f] == 'e' || _src[f] == 'E')) {
                size_t x = f + 1;
                if (x < _src.size() && (_src[x] == '+' || _src[x] == '-')) ++x;
                if (x < _src.size() && is_digit(_src[x])) {
                    f = scan_digits(x);
                    is_float = true;
                }
            }
            if (is_float) {
                token& t = push(tok::floating, p);
                t.f = std::strtod(without_underscores(_src.substr(p, f - p)).c_str(), nullptr);
                return f;
            }
        }
        int base = 10;
        size_t digits_at = p;
        if (_src[p] == '0' && p + 1 < _src.size()) {
            const char b = char(_src[p + 1] | 0x20);
            base = b == 'x' ? 16 : b == 'o' ? 8 : b == 'b' ? 2 : 10;
            if (base != 10) digits_at = p + 2;
        }
        if (base != 10) {
            e = digits_at;
            while (e < _src.size()) {
                const char d = char(_src[e] | 0x20);
                const int v = is_digit(d) ? d - '0' : (d >= 'a' && d <= 'f') ? d - 'a' + 10 : 99;
                if (_src[e] == '_' || v < base) {
                    ++e;
                } else {
                    break;
                }
            }
        } else if (_src[p] == '0') {
            e = p + 1;  // "0", "0_0": a leading zero is never followed by other digits
            while (e + 1 < _src.size() && _src[e] == '_' && _src[e + 1] == '0') e += 2;
        }
        const std::string digits = without_underscores(_src.substr(digits_at, e - digits_at));
        if (digits.empty()) fail_at(p, "invalid integer literal");
        uint64_t v = 0;
        for (char d : digits) {
            const int dv = is_digit(d) ? d - '0' : (d | 0x20) - 'a' + 10;
            if (v > (uint64_t(INT64_MAX) - dv) / base) {
                fail_at(p, "integer literal does not fit in 64 bits");
            }
            v = v * base + dv;
        }
        token& t = push(tok::integer, p);
        t.i = int64_t(v);
        return e;
    }

    size_t lex_string(size_t p) {
        const char quote = _src[p];
        std::string out;
        size_t i = p + 1;
        for (;;) {
            if (i >= _src.size()) fail_at(p, "unexpected end of string literal");
            const char c = _src[i];
            if (c == quote) break;
            if (c != '\\') {
                out += c;
                ++i;
                continue;
            }
            if (i + 1 >= _src.size()) fail_at(p, "unexpected end of string literal");
            i = decode_escape(i, out);
        }
        push(tok::string, p, std::move(out));
        return i + 1;
    }

    // Python's unicode-escape rules for the escape at s[i] == '\\'; returns the index after it.
    size_t decode_escape(size_t i, std::string& out) const {
        const char e = _src[i + 1];
        switch (e) {
            case '\n':
                return i + 2;  // line continuation
            case '\\':
                out += '\\';
                return i + 2;
            case '\'':
                out += '\'';
                return i + 2;
            case '"':
                out += '"';
                return i + 2;
            case 'a':
                out += '\a';
                return i + 2;
            case 'b':
                out += '\b';
                return i + 2;
            case 'f':
                out += '\f';
                return i + 2;
            case 'n':
                out += '\n';
                return i + 2;
            case 'r':
                out += '\r';
                return i + 2;
            case 't':
                out += '\t';
                return i + 2;
            case 'v':
                out += '\v';
                return i + 2;
            case 'x':
                return hex_escape(i, 2, out);
            case 'u':
                return hex_escape(i, 4, out);
            case 'U':
                return hex_escape(i, 8, out);
            case 'N':
                fail_at(i, "\\N{...} escapes are not supported");
            default:
                break;
        }
        if (e >= '0' && e <= '7') {
            size_t j = i + 1;
            char32_t v = 0;
            for (int k = 0; k < 3 && j < _src.size() && _src[j] >= '0' && _src[j] <= '7';
                 ++k, ++j) {
                v = v * 8 + char32_t(_src[j] - '0');
            }
            unicode::append_utf8(out, v);
            return j;
        }
        out += '\\';  // unknown escapes stay as written
        return i + 1;
    }

    size_t hex_escape(size_t i, int n, std::string& out) const {
        char32_t v = 0;
        for (int k = 0; k < n; ++k) {
            const size_t j = i + 2 + k;
            const char d = j < _src.size() ? char(_src[j] | 0x20) : 0;
            const int dv = is_digit(d) ? d - '0' : (d >= 'a' && d <= 'f') ? d - 'a' + 10 : -1;
            if (dv < 0) fail_at(i, "truncated \\" + std::string(1, _src[i + 1]) + " escape");
            v = v * 16 + char32_t(dv);
        }
        if (v > 0x10FFFF) fail_at(i, "illegal Unicode character in escape");
        if (v >= 0xD800 && v < 0xE000) fail_at(i, "a surrogate escape is not valid UTF-8");
        unicode::append_utf8(out, v);
        return i + 2 + size_t(n);
    }

    std::string _src;
    std::vector<size_t> _line_starts;
    size_t _pos = 0;
    bool _line_starting = true;
    std::vector<token> _out;
};

}  // namespace

std::vector<token> tokenize(std::string_view source) {
    return lexer(normalise(source)).run();
}

}  // namespace ordo::jinja
