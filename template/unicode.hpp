// unicode.hpp: the UTF-8 and Unicode character facts the Jinja engine needs to behave like
// Python's str: code point iteration (length, slicing and indexing count code points), case
// mapping (upper, lower, title, capitalize) and character classes (isspace, isprintable, ...).
//
// The data come from Python itself (gen_unicode_tables.py writes unicode_tables.inc), so the
// engine agrees with the interpreter that produced the reference renders. Pure functions, no
// state; any thread may call them.
//
// Invalid UTF-8 is not an error here: a byte that does not start a valid sequence decodes as
// one code point U+FFFD of length 1, so every function terminates and keeps the input's other
// bytes unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ordo::jinja::unicode {

inline constexpr char32_t k_replacement = 0xFFFD;

struct decoded {
    char32_t cp;
    size_t length;  // bytes consumed, >= 1
};

// Decodes the code point starting at s[i] (i < s.size()).
decoded decode(std::string_view s, size_t i);
void append_utf8(std::string& out, char32_t cp);

size_t count_code_points(std::string_view s);
// Byte offset of each code point start, plus s.size() at the end (size = count + 1).
std::vector<size_t> code_point_offsets(std::string_view s);

bool is_space(char32_t cp);      // str.isspace
bool is_printable(char32_t cp);  // str.isprintable (repr escapes the others)
bool is_alpha(char32_t cp);
bool is_alnum(char32_t cp);
bool is_decimal(char32_t cp);
bool is_digit(char32_t cp);
bool is_cased(char32_t cp);
bool is_upper(char32_t cp);
bool is_lower(char32_t cp);
bool is_title(char32_t cp);
bool is_word(char32_t cp);  // Python re's \w: alnum or '_'

// Python's str methods on whole strings (full case mapping, final sigma in lower()).
std::string lower(std::string_view s);
std::string upper(std::string_view s);
std::string capitalize(std::string_view s);  // str.capitalize
std::string title(std::string_view s);       // str.title
std::string swapcase(std::string_view s);

// Appends the single code point's mapping (one to three code points).
void append_upper(std::string& out, char32_t cp);
void append_lower(std::string& out, char32_t cp);
void append_title(std::string& out, char32_t cp);

}  // namespace ordo::jinja::unicode
