// lexer.hpp: template source -> tokens, with Jinja's whitespace rules as transformers
// configures them (trim_blocks, lstrip_blocks, keep_trailing_newline off).
//
// The source is first normalised as Jinja's lexer does: "\r\n" and "\r" become "\n", and one
// newline at the very end is dropped. Data between tags becomes `data` tokens (already
// trimmed); the inside of `{{ }}` and `{% %}` becomes expression tokens between a begin and an
// end token; comments and `{% raw %}` are resolved here.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ordo::jinja {

enum class tok : uint8_t {
    data,         // text: literal template text
    var_begin,    // {{
    var_end,      // }}
    block_begin,  // {%
    block_end,    // %}
    name,         // text: identifier
    string,       // text: decoded literal
    integer,      // i
    floating,     // f
    op,           // text: one of + - * / // % ** ~ == != < <= > >= = ( ) [ ] { } , . : |
    eof,
};

struct token {
    tok type;
    std::string text;
    int64_t i = 0;
    double f = 0;
    uint32_t line = 0;  // 1-based, in the normalised source
    uint32_t column = 0;
};

// Throws template_failure (with line and column) on an unterminated tag, comment or string, a
// character that starts no token, or unbalanced brackets.
std::vector<token> tokenize(std::string_view source);

}  // namespace ordo::jinja
