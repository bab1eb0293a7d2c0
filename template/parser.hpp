// parser.hpp: tokens -> syntax tree, following Jinja's grammar and operator precedence
// (lowest first): `x if c else y`, or, and, not, comparisons and in / not in (chained),
// + -, ~, * / // %, **, unary - +, then postfix . [] () and the | filter / is test chains.
#pragma once

#include <string_view>

#include "template/ast.hpp"
#include "template/lexer.hpp"
#include "template/template.hpp"

namespace ordo::jinja {

struct parsed {
    body statements;
};

// Throws template_failure with the position of the offending token.
parsed parse_tokens(std::vector<token> tokens, const limits& bounds);

}  // namespace ordo::jinja
