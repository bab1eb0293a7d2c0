// json.hpp: the GBNF grammar of one JSON object (RFC 8259), for JSON mode (OpenAI's
// response_format {"type": "json_object"}) and the grammar benchmark. Whitespace between tokens
// is bounded (a newline and up to 20 spaces or tabs, or one space) and so are a number's digits,
// so a model cannot loop on padding inside the grammar; the object may be preceded by
// whitespace (a SentencePiece model's first token often carries a space). Strings take any
// character but the quote, the backslash and control characters, plus the standard escapes.
#pragma once

#include <string_view>

namespace ordo::grammar {

inline constexpr std::string_view json_object_gbnf = R"(root ::= ws object
value ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})? ws
ws ::= | " " | "\n" [ \t]{0,20}
)";

}  // namespace ordo::grammar
