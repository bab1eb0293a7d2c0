// parser.cpp: recursive descent over the token stream, one function per precedence level as
// in Jinja's grammar. Nesting (of parentheses, blocks, and of the tree itself: `a+a+a+...` is
// a tree as tall as it is long) is bounded by limits::parse_depth_max, so neither parsing nor
// evaluating nor freeing a tree can exhaust the native stack.
#include "template/parser.hpp"

#include <algorithm>
#include <set>

#include "template/builtins.hpp"
#include "template/failure.hpp"

namespace ordo::jinja {

namespace {

using names = std::vector<std::string_view>;

bool contains(const names& v, std::string_view s) {
    return std::find(v.begin(), v.end(), s) != v.end();
}

std::string describe(const token& t) {
    switch (t.type) {
        case tok::data:
            return "template data";
        case tok::var_begin:
            return "'{{'";
        case tok::var_end:
            return "end of print statement";
        case tok::block_begin:
            return "'{%'";
        case tok::block_end:
            return "end of statement block";
        case tok::name:
            return "'" + t.text + "'";
        case tok::string:
            return "string";
        case tok::integer:
            return "integer";
        case tok::floating:
            return "float";
        case tok::op:
            return "'" + t.text + "'";
        case tok::eof:
            return "end of template";
    }
    return "token";
}

class parser {
public:
    parser(std::vector<token> tokens, const limits& bounds) : _t(std::move(tokens)), _lim(bounds) {}

    parsed run() {
        parsed p;
        std::string which;
        p.statements = parse_until({}, which);
        return p;
    }

private:
    // ---- token helpers --------------------------------------------------------------------

    const token& cur() const { return _t[_i]; }
    const token& peek(size_t n = 1) const { return _t[std::min(_i + n, _t.size() - 1)]; }
    void next() {
        if (_i + 1 < _t.size()) ++_i;
    }
    bool is_op(std::string_view s) const { return cur().type == tok::op && cur().text == s; }
    bool is_name(std::string_view s) const { return cur().type == tok::name && cur().text == s; }
    bool skip_op(std::string_view s) {
        if (!is_op(s)) return false;
        next();
        return true;
    }
    bool skip_name(std::string_view s) {
        if (!is_name(s)) return false;
        next();
        return true;
    }

    [[noreturn]] void error(const token& t, std::string message) const {
        throw template_failure{std::move(message), t.line, t.column};
    }
    [[noreturn]] void error(std::string message) const { error(cur(), std::move(message)); }

    void expect_op(std::string_view s) {
        if (!skip_op(s)) error("expected '" + std::string(s) + "', got " + describe(cur()));
    }
    void expect(tok type, std::string_view what) {
        if (cur().type != type) error("expected " + std::string(what) + ", got " + describe(cur()));
        next();
    }
    void expect_block_end() { expect(tok::block_end, "end of statement block"); }
    std::string expect_name() {
        if (cur().type != tok::name) error("expected a name, got " + describe(cur()));
        std::string s = cur().text;
        next();
        return s;
    }

    position pos() const { return {cur().line, cur().column}; }

    // ---- nesting bound --------------------------------------------------------------------

    struct depth_guard {
        parser& p;
        explicit depth_guard(parser& pr) : p(pr) {
            if (++p._depth > p._lim.parse_depth_max) {
                p.error("template nesting exceeds the parse depth bound of " +
                        std::to_string(p._lim.parse_depth_max));
            }
        }
        ~depth_guard() { --p._depth; }
    };

    expr_ptr node(expr_kind k, position at) {
        auto e = std::make_unique<expr>();
        e->kind = k;
        e->pos = at;
        return e;
    }

    // Sets e's height from its children and enforces the bound on it.
    expr_ptr finish(expr_ptr e) {
        uint32_t h = 0;
        auto see = [&h](const expr_ptr& c) {
            if (c) h = std::max(h, c->height);
        };
        for (const auto& c : e->items) see(c);
        for (const auto& c : e->args.positional) see(c);
        for (const auto& [k, c] : e->args.keyword) see(c);
        see(e->args.star);
        see(e->args.star_star);
        e->height = h + 1;
        if (e->height > _lim.parse_depth_max) {
            throw template_failure{"expression nesting exceeds the parse depth bound of " +
                                       std::to_string(_lim.parse_depth_max),
                                   e->pos.line, e->pos.column};
        }
        return e;
    }

    // Filters and tests that do not exist are a parse error, except inside a branch that may
    // not run (an if body or a conditional expression), where jinja2 reports them only if
    // reached; `soft` tracks that.
    bool soft() const { return !_soft.empty() && _soft.back(); }
    struct frame_guard {
        parser& p;
        frame_guard(parser& pr, bool soft) : p(pr) { p._soft.push_back(soft); }
        ~frame_guard() { p._soft.pop_back(); }
    };

    // ---- statements -----------------------------------------------------------------------

    body parse_until(const names& ends, std::string& which) {
        body out;
        for (;;) {
            const token& t = cur();
            switch (t.type) {
                case tok::data: {
                    auto s = std::make_unique<stmt>();
                    s->kind = stmt_kind::text;
                    s->pos = {t.line, t.column};
                    s->text = t.text;
                    out.push_back(std::move(s));
                    next();
                    break;
                }
                case tok::var_begin: {
                    auto s = std::make_unique<stmt>();
                    s->kind = stmt_kind::output;
                    s->pos = {t.line, t.column};
                    next();
                    s->expression = parse_tuple(false, true, {}, false);
                    expect(tok::var_end, "end of print statement");
                    out.push_back(std::move(s));
                    break;
                }
                case tok::block_begin: {
                    const token& n = peek();
                    if (n.type == tok::name && contains(ends, n.text)) {
                        which = n.text;
                        _i += 2;
                        return out;
                    }
                    next();
                    out.push_back(parse_statement(ends));
                    break;
                }
                case tok::eof: {
                    if (ends.empty()) return out;
                    std::string list;
                    for (size_t i = 0; i < ends.size(); ++i) {
                        list += (i ? " or '" : "'") + std::string(ends[i]) + "'";
                    }
                    error("unexpected end of template: looking for " + list);
                }
                default:
                    error("unexpected " + describe(t));
            }
        }
    }

    stmt_ptr make_stmt(stmt_kind k, position at) {
        auto s = std::make_unique<stmt>();
        s->kind = k;
        s->pos = at;
        return s;
    }

    stmt_ptr parse_statement(const names& enclosing_ends) {
        depth_guard g(*this);
        if (cur().type != tok::name) error("expected a tag name, got " + describe(cur()));
        const std::string tag = cur().text;
        const position at = pos();
        if (tag == "if") return parse_if(at);
        if (tag == "for") return parse_for(at);
        if (tag == "set") return parse_set(at);
        if (tag == "macro") return parse_macro(at);
        if (tag == "call") return parse_call_block(at);
        if (tag == "filter") return parse_filter_block(at);
        if (tag == "with" || tag == "generation") return parse_with(at, tag);
        if (tag == "break" || tag == "continue") {
            if (_loop_depth == 0) error("'" + tag + "' outside of a for loop");
            next();
            expect_block_end();
            return make_stmt(tag == "break" ? stmt_kind::break_ : stmt_kind::continue_, at);
        }
        if (tag == "include" || tag == "import" || tag == "from" || tag == "extends" ||
            tag == "block") {
            error("'" + tag + "' is not supported: a chat template renders alone and cannot " +
                  "load or extend other templates");
        }
        if (tag == "autoescape" || tag == "do" || tag == "trans") {
            error("'" + tag + "' is not supported (transformers does not enable it)");
        }
        std::string msg = "unknown tag '" + tag + "'";
        if (!enclosing_ends.empty()) {
            msg += " (looking for '" + std::string(enclosing_ends.front()) + "')";
        }
        error(msg);
    }

    stmt_ptr parse_if(position at) {
        auto s = make_stmt(stmt_kind::if_, at);
        next();
        std::string which;
        for (;;) {
            s->conds.push_back(parse_tuple(false, false, {}, false));
            expect_block_end();
            {
                frame_guard f(*this, true);
                s->bodies.push_back(parse_until({"elif", "else", "endif"}, which));
            }
            if (which == "elif") continue;
            if (which == "else") {
                expect_block_end();
                frame_guard f(*this, true);
                s->else_body = parse_until({"endif"}, which);
            }
            expect_block_end();
            return s;
        }
    }

    stmt_ptr parse_for(position at) {
        auto s = make_stmt(stmt_kind::for_, at);
        next();
        s->set_target = parse_assign_target(true, false, {"in"});
        if (!skip_name("in")) error("expected 'in', got " + describe(cur()));
        s->expression = parse_tuple(false, false, {"recursive"}, false);
        if (skip_name("if")) s->loop_filter = parse_expression(true);
        s->recursive = skip_name("recursive");
        expect_block_end();
        std::string which;
        frame_guard f(*this, false);
        ++_loop_depth;
        std::set<std::string> seen;
        _macro_names.push_back(&seen);
        s->bodies.push_back(parse_until({"endfor", "else"}, which));
        _macro_names.pop_back();
        s->uses_loop = seen.count("loop") > 0;
        --_loop_depth;
        if (which == "else") {
            expect_block_end();
            s->else_body = parse_until({"endfor"}, which);
        }
        expect_block_end();
        return s;
    }

    stmt_ptr parse_set(position at) {
        next();
        target t = parse_assign_target(true, true, {});
        if (skip_op("=")) {
            auto s = make_stmt(stmt_kind::set, at);
            s->set_target = std::move(t);
            s->expression = parse_tuple(false, true, {}, false);
            expect_block_end();
            return s;
        }
        auto s = make_stmt(stmt_kind::set_block, at);
        if (t.is_tuple) error("a block set assigns one name");
        s->set_target = std::move(t);
        if (is_op("|")) s->expression = parse_filter(nullptr, false);
        expect_block_end();
        std::string which;
        frame_guard f(*this, false);
        s->bodies.push_back(parse_until({"endset"}, which));
        expect_block_end();
        return s;
    }

    void parse_signature(macro_def& m) {
        expect_op("(");
        while (!is_op(")")) {
            if (!m.params.empty()) expect_op(",");
            if (is_op(")")) break;
            macro_param p;
            p.name = expect_name();
            if (skip_op("=")) {
                p.default_value = parse_expression(true);
            } else if (!m.params.empty() && m.params.back().default_value) {
                error("non-default argument follows default argument");
            }
            m.params.push_back(std::move(p));
        }
        expect_op(")");
    }

    // A macro's (or a call block's caller's) body, with what it reads of varargs/kwargs/caller.
    void parse_macro_body(macro_def& m, std::string_view end) {
        frame_guard f(*this, false);
        std::set<std::string> seen;
        _macro_names.push_back(&seen);
        const int saved_loop_depth = _loop_depth;
        _loop_depth = 0;
        std::string which;
        m.statements = parse_until({end}, which);
        _loop_depth = saved_loop_depth;
        _macro_names.pop_back();
        m.uses_varargs = seen.count("varargs") > 0;
        m.uses_kwargs = seen.count("kwargs") > 0;
        m.uses_caller = seen.count("caller") > 0;
        expect_block_end();
    }

    stmt_ptr parse_macro(position at) {
        auto s = make_stmt(stmt_kind::macro, at);
        next();
        s->macro = std::make_shared<macro_def>();
        s->macro->name = expect_name();
        parse_signature(*s->macro);
        expect_block_end();
        parse_macro_body(*s->macro, "endmacro");
        return s;
    }

    stmt_ptr parse_call_block(position at) {
        auto s = make_stmt(stmt_kind::call_block, at);
        next();
        s->macro = std::make_shared<macro_def>();
        s->macro->name = "caller";
        if (is_op("(")) parse_signature(*s->macro);
        s->expression = parse_expression(true);
        if (s->expression->kind != expr_kind::call) error("a call block needs a call expression");
        expect_block_end();
        parse_macro_body(*s->macro, "endcall");
        return s;
    }

    stmt_ptr parse_filter_block(position at) {
        auto s = make_stmt(stmt_kind::filter_block, at);
        next();
        s->expression = parse_filter(nullptr, true);
        expect_block_end();
        std::string which;
        frame_guard f(*this, false);
        s->bodies.push_back(parse_until({"endfilter"}, which));
        expect_block_end();
        return s;
    }

    stmt_ptr parse_with(position at, const std::string& tag) {
        auto s = make_stmt(stmt_kind::with, at);
        next();
        while (tag == "with" && cur().type != tok::block_end) {
            if (!s->assignments.empty()) expect_op(",");
            target t = parse_assign_target(true, false, {});
            expect_op("=");
            s->assignments.emplace_back(std::move(t), parse_expression(true));
        }
        expect_block_end();
        std::string which;
        frame_guard f(*this, false);
        s->bodies.push_back(parse_until({tag == "with" ? "endwith" : "endgeneration"}, which));
        expect_block_end();
        return s;
    }

    // ---- assignment targets ---------------------------------------------------------------

    target to_target(const expr& e) {
        target t;
        if (e.kind == expr_kind::name) {
            t.name = e.name;
            return t;
        }
        if (e.kind == expr_kind::tuple) {
            t.is_tuple = true;
            for (const auto& item : e.items) t.items.push_back(to_target(*item));
            return t;
        }
        throw template_failure{"cannot assign to this expression", e.pos.line, e.pos.column};
    }

    target parse_assign_target(bool with_tuple, bool with_namespace, const names& ends) {
        if (with_namespace && cur().type == tok::name && peek().type == tok::op &&
            peek().text == ".") {
            target t;
            t.name = expect_name();
            next();
            t.attr = expect_name();
            return t;
        }
        if (cur().type == tok::name) {
            const std::string& n = cur().text;
            if (n == "true" || n == "false" || n == "none" || n == "True" || n == "False" ||
                n == "None") {
                error("cannot assign to the constant '" + n + "'");
            }
        }
        expr_ptr e = with_tuple ? parse_tuple(true, true, ends, false) : parse_primary();
        return to_target(*e);
    }

    // ---- expressions ----------------------------------------------------------------------

    bool is_tuple_end(const names& ends) const {
        const token& t = cur();
        if (t.type == tok::var_end || t.type == tok::block_end || t.type == tok::eof) return true;
        if (t.type == tok::op && t.text == ")") return true;
        return t.type == tok::name && contains(ends, t.text);
    }

    expr_ptr parse_tuple(bool simplified, bool with_condexpr, const names& ends,
                         bool explicit_parentheses) {
        const position at = pos();
        std::vector<expr_ptr> args;
        bool is_tuple = false;
        for (;;) {
            if (!args.empty()) expect_op(",");
            if (is_tuple_end(ends)) break;
            args.push_back(simplified ? parse_primary() : parse_expression(with_condexpr));
            if (is_op(",")) {
                is_tuple = true;
            } else {
                break;
            }
        }
        if (!is_tuple) {
            if (!args.empty()) return std::move(args[0]);
            if (!explicit_parentheses) error("expected an expression, got " + describe(cur()));
        }
        auto t = node(expr_kind::tuple, at);
        t->items = std::move(args);
        return finish(std::move(t));
    }

    expr_ptr parse_expression(bool with_condexpr) {
        return with_condexpr ? parse_condexpr() : parse_or();
    }

    expr_ptr parse_condexpr() {
        depth_guard g(*this);
        const position at = pos();
        expr_ptr e = parse_or();
        while (is_name("if")) {
            next();
            frame_guard f(*this, true);
            auto c = node(expr_kind::cond, at);
            expr_ptr test = parse_or();
            expr_ptr otherwise;
            if (skip_name("else")) otherwise = parse_condexpr();
            c->items.push_back(std::move(e));
            c->items.push_back(std::move(test));
            c->items.push_back(std::move(otherwise));
            e = finish(std::move(c));
        }
        return e;
    }

    expr_ptr binary(std::string op, expr_ptr l, expr_ptr r, position at) {
        auto b = node(expr_kind::binary, at);
        b->name = std::move(op);
        b->items.push_back(std::move(l));
        b->items.push_back(std::move(r));
        return finish(std::move(b));
    }

    // One left-associative level: operand (op operand)*, ops being names or operators.
    expr_ptr parse_level(const names& ops, expr_ptr (parser::*operand)()) {
        expr_ptr e = (this->*operand)();
        for (;;) {
            const token& t = cur();
            if ((t.type != tok::op && t.type != tok::name) || !contains(ops, t.text)) return e;
            const position at = pos();
            std::string op = t.text;
            next();
            e = binary(std::move(op), std::move(e), (this->*operand)(), at);
        }
    }

    expr_ptr parse_or() { return parse_level({"or"}, &parser::parse_and); }
    expr_ptr parse_and() { return parse_level({"and"}, &parser::parse_not); }

    expr_ptr parse_not() {
        if (is_name("not")) {
            depth_guard g(*this);
            auto u = node(expr_kind::unary, pos());
            next();
            u->name = "not";
            u->items.push_back(parse_not());
            return finish(std::move(u));
        }
        return parse_compare();
    }

    expr_ptr parse_compare() {
        const position at = pos();
        expr_ptr first = parse_math1();
        auto c = node(expr_kind::compare, at);
        for (;;) {
            static const names k_ops = {"==", "!=", "<", "<=", ">", ">="};
            if (cur().type == tok::op && contains(k_ops, cur().text)) {
                c->ops.push_back(cur().text);
                next();
            } else if (is_name("in")) {
                c->ops.push_back("in");
                next();
            } else if (is_name("not") && peek().type == tok::name && peek().text == "in") {
                c->ops.push_back("notin");
                next();
                next();
            } else {
                break;
            }
            c->items.push_back(parse_math1());
        }
        if (c->ops.empty()) return first;
        c->items.insert(c->items.begin(), std::move(first));
        return finish(std::move(c));
    }

    expr_ptr parse_math1() { return parse_level({"+", "-"}, &parser::parse_concat); }
    expr_ptr parse_concat() { return parse_level({"~"}, &parser::parse_math2); }
    expr_ptr parse_math2() { return parse_level({"*", "/", "//", "%"}, &parser::parse_pow); }
    expr_ptr parse_pow() { return parse_level({"**"}, &parser::parse_unary_filtered); }
    expr_ptr parse_unary_filtered() { return parse_unary(true); }

    expr_ptr parse_unary(bool with_filter) {
        depth_guard g(*this);
        const position at = pos();
        expr_ptr e;
        if (is_op("-") || is_op("+")) {
            auto u = node(expr_kind::unary, at);
            u->name = cur().text;
            next();
            u->items.push_back(parse_unary(false));
            e = finish(std::move(u));
        } else {
            e = parse_primary();
        }
        e = parse_postfix(std::move(e));
        if (with_filter) e = parse_filter_expr(std::move(e));
        return e;
    }

    expr_ptr parse_primary() {
        depth_guard g(*this);
        const token& t = cur();
        const position at = pos();
        switch (t.type) {
            case tok::name: {
                auto e = node(expr_kind::literal, at);
                const std::string& n = t.text;
                if (n == "true" || n == "True") {
                    e->literal = value(true);
                } else if (n == "false" || n == "False") {
                    e->literal = value(false);
                } else if (n == "none" || n == "None") {
                    e->literal = value::none();
                } else {
                    e->kind = expr_kind::name;
                    e->name = n;
                    for (auto* seen : _macro_names) seen->insert(n);
                }
                next();
                return finish(std::move(e));
            }
            case tok::string: {
                std::string s;
                while (cur().type == tok::string) {  // adjacent literals concatenate
                    s += cur().text;
                    next();
                }
                auto e = node(expr_kind::literal, at);
                e->literal = value(std::move(s));
                return finish(std::move(e));
            }
            case tok::integer:
            case tok::floating: {
                auto e = node(expr_kind::literal, at);
                e->literal = t.type == tok::integer ? value(t.i) : value(t.f);
                next();
                return finish(std::move(e));
            }
            case tok::op:
                if (t.text == "(") {
                    next();
                    expr_ptr e = parse_tuple(false, true, {}, true);
                    expect_op(")");
                    return e;
                }
                if (t.text == "[") return parse_list(at);
                if (t.text == "{") return parse_dict(at);
                break;
            default:
                break;
        }
        error("unexpected " + describe(t));
    }

    expr_ptr parse_list(position at) {
        next();
        auto e = node(expr_kind::list, at);
        while (!is_op("]")) {
            if (!e->items.empty()) expect_op(",");
            if (is_op("]")) break;
            e->items.push_back(parse_expression(true));
        }
        expect_op("]");
        return finish(std::move(e));
    }

    expr_ptr parse_dict(position at) {
        next();
        auto e = node(expr_kind::dict, at);
        while (!is_op("}")) {
            if (!e->items.empty()) expect_op(",");
            if (is_op("}")) break;
            e->items.push_back(parse_expression(true));
            expect_op(":");
            e->items.push_back(parse_expression(true));
        }
        expect_op("}");
        return finish(std::move(e));
    }

    expr_ptr parse_postfix(expr_ptr e) {
        for (;;) {
            if (is_op(".") || is_op("[")) {
                e = parse_subscript(std::move(e));
            } else if (is_op("(")) {
                e = parse_call(std::move(e));
            } else {
                return e;
            }
        }
    }

    expr_ptr parse_filter_expr(expr_ptr e) {
        for (;;) {
            if (is_op("|")) {
                e = parse_filter(std::move(e), false);
            } else if (is_name("is")) {
                e = parse_test(std::move(e));
            } else if (is_op("(")) {
                e = parse_call(std::move(e));
            } else {
                return e;
            }
        }
    }

    expr_ptr parse_subscript(expr_ptr e) {
        const position at = pos();
        if (skip_op(".")) {
            if (cur().type == tok::name) {
                auto g = node(expr_kind::getattr, at);
                g->name = cur().text;
                next();
                g->items.push_back(std::move(e));
                return finish(std::move(g));
            }
            if (cur().type == tok::integer) {
                auto idx = node(expr_kind::literal, pos());
                idx->literal = value(cur().i);
                next();
                auto g = node(expr_kind::getitem, at);
                g->items.push_back(std::move(e));
                g->items.push_back(finish(std::move(idx)));
                return finish(std::move(g));
            }
            error("expected a name or number after '.', got " + describe(cur()));
        }
        expect_op("[");
        // One index, or a slice a:b:c (any part may be absent).
        expr_ptr parts[3];
        bool is_slice = false;
        if (!is_op(":")) parts[0] = parse_expression(true);
        if (skip_op(":")) {
            is_slice = true;
            if (!is_op("]") && !is_op(":")) parts[1] = parse_expression(true);
            if (skip_op(":") && !is_op("]")) parts[2] = parse_expression(true);
        }
        if (is_op(",")) error("tuple subscripts are not supported");
        expect_op("]");
        auto g = node(is_slice ? expr_kind::slice : expr_kind::getitem, at);
        g->items.push_back(std::move(e));
        if (!is_slice && !parts[0]) error("empty subscript");
        g->items.push_back(std::move(parts[0]));
        if (is_slice) {
            g->items.push_back(std::move(parts[1]));
            g->items.push_back(std::move(parts[2]));
        }
        return finish(std::move(g));
    }

    void parse_call_args(call_syntax& a) {
        expect_op("(");
        bool first = true;
        while (!is_op(")")) {
            if (!first) {
                expect_op(",");
                if (is_op(")")) break;
            }
            first = false;
            if (skip_op("*")) {
                if (a.star) error("only one *args is supported");
                a.star = parse_expression(true);
            } else if (skip_op("**")) {
                if (a.star_star) error("only one **kwargs is supported");
                a.star_star = parse_expression(true);
            } else if (cur().type == tok::name && peek().type == tok::op && peek().text == "=") {
                std::string key = cur().text;
                next();
                next();
                a.keyword.emplace_back(std::move(key), parse_expression(true));
            } else {
                if (!a.keyword.empty() || a.star || a.star_star) error("invalid argument syntax");
                a.positional.push_back(parse_expression(true));
            }
        }
        expect_op(")");
    }

    expr_ptr parse_call(expr_ptr e) {
        auto c = node(expr_kind::call, e->pos);  // errors point at what is called
        c->items.push_back(std::move(e));
        parse_call_args(c->args);
        return finish(std::move(c));
    }

    std::string parse_dotted_name() {
        std::string name = expect_name();
        while (is_op(".") && peek().type == tok::name) {
            next();
            name += "." + expect_name();
        }
        return name;
    }

    expr_ptr parse_filter(expr_ptr e, bool start_inline) {
        while (is_op("|") || start_inline) {
            if (!start_inline) next();
            start_inline = false;
            auto f = node(expr_kind::filter, pos());
            f->name = parse_dotted_name();
            f->items.push_back(std::move(e));
            if (is_op("(")) parse_call_args(f->args);
            f->known = find_filter(f->name) != nullptr;
            if (!f->known && !soft()) {
                throw template_failure{"no filter named '" + f->name + "'", f->pos.line,
                                       f->pos.column};
            }
            e = finish(std::move(f));
        }
        return e;
    }

    expr_ptr parse_test(expr_ptr e) {
        next();  // is
        auto t = node(expr_kind::test, pos());
        t->negated = skip_name("not");
        t->name = parse_dotted_name();
        t->items.push_back(std::move(e));
        const token& c = cur();
        if (is_op("(")) {
            parse_call_args(t->args);
        } else if ((c.type == tok::name || c.type == tok::string || c.type == tok::integer ||
                    c.type == tok::floating || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
            if (is_name("is")) error("you cannot chain multiple tests with is");
            t->args.positional.push_back(parse_postfix(parse_primary()));
        }
        t->known = find_test(t->name) != nullptr;
        if (!t->known && !soft()) {
            throw template_failure{"no test named '" + t->name + "'", t->pos.line, t->pos.column};
        }
        return finish(std::move(t));
    }

    std::vector<token> _t;
    size_t _i = 0;
    const limits& _lim;
    uint32_t _depth = 0;
    int _loop_depth = 0;
    std::vector<bool> _soft;
    // Names read inside the macro and loop bodies being parsed (what varargs, kwargs, caller
    // and loop a body needs).
    std::vector<std::set<std::string>*> _macro_names;
};

}  // namespace

parsed parse_tokens(std::vector<token> tokens, const limits& bounds) {
    return parser(std::move(tokens), bounds).run();
}

}  // namespace ordo::jinja
