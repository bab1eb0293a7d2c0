// ast.hpp: the parsed template. Expressions and statements are plain structs owned by
// unique_ptr; the parser builds them once and the renderer only reads them, so one parsed
// template can be rendered many times (and from several threads at once).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "template/value.hpp"

namespace ordo::jinja {

struct expr;
struct stmt;
using expr_ptr = std::unique_ptr<expr>;
using stmt_ptr = std::unique_ptr<stmt>;
using body = std::vector<stmt_ptr>;

struct position {
    uint32_t line = 0;
    uint32_t column = 0;
};

enum class expr_kind : uint8_t {
    literal,  // value
    name,     // name
    list,     // items
    tuple,    // items
    dict,     // items as key, value, key, value, ...
    unary,    // op ("-", "+", "not"), items[0]
    binary,   // op ("+", "-", "*", "/", "//", "%", "**", "~", "and", "or"), items[0..1]
    compare,  // items[0] then ops[i] applied with items[i + 1] ("==", "in", "notin", ...)
    cond,     // items: then, test, else (else may be null: undefined)
    getattr,  // items[0] . name
    getitem,  // items[0] [ items[1] ]
    slice,    // items[0] [ items[1] : items[2] : items[3] ] (null parts are absent)
    call,     // items[0] ( args )
    filter,   // items[0] | name ( args ); items[0] null inside a filter block
    test,     // items[0] is [not] name ( args ); negated
};

struct call_syntax {
    std::vector<expr_ptr> positional;
    std::vector<std::pair<std::string, expr_ptr>> keyword;
    expr_ptr star;       // *args
    expr_ptr star_star;  // **kwargs
};

struct expr {
    expr_kind kind;
    position pos;
    std::string name;  // name, getattr attribute, filter/test name, operator
    value literal;
    std::vector<expr_ptr> items;
    std::vector<std::string> ops;  // compare operators
    call_syntax args;              // call, filter, test
    bool negated = false;          // test
    bool known = true;             // filter/test: the name exists (else an error when reached)
    uint32_t height = 1;           // 1 + the tallest child: bounds evaluation recursion
};

// An assignment target: a name, `ns.attr`, or a tuple of targets to unpack.
struct target {
    std::string name;
    std::string attr;  // non-empty: name.attr (namespace attribute)
    std::vector<target> items;
    bool is_tuple = false;
};

enum class stmt_kind : uint8_t {
    text,          // text
    output,        // expr
    if_,           // conds[i] guards bodies[i]; else_body
    for_,          // loop_target in expr [if cond] body else else_body
    set,           // set_target = expr
    set_block,     // set_target = rendered body, piped through expression (a filter chain) if any
    macro,         // name(params) body
    call_block,    // expr (a call) with caller(params) = body
    filter_block,  // expression (a filter chain whose innermost operand is null) of the body
    with,          // assignments then body
    break_,
    continue_,
};

struct macro_param {
    std::string name;
    expr_ptr default_value;  // null: required
};

struct macro_def {
    std::string name;
    std::vector<macro_param> params;
    body statements;
    bool uses_varargs = false;
    bool uses_kwargs = false;
    bool uses_caller = false;
};

struct stmt {
    stmt_kind kind;
    position pos;
    std::string text;
    expr_ptr expression;
    std::vector<expr_ptr> conds;
    std::vector<body> bodies;
    body else_body;
    target set_target;
    expr_ptr loop_filter;  // for ... if cond
    bool recursive = false;
    bool uses_loop = true;             // for: the body reads `loop` (else no loop object is built)
    std::shared_ptr<macro_def> macro;  // macro, call_block (the caller)
    std::vector<std::pair<target, expr_ptr>> assignments;  // with
};

}  // namespace ordo::jinja
