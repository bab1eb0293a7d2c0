// renderer.hpp: one render of a parsed template: variable scopes, statement execution,
// expression evaluation with Python/Jinja semantics, and the bounds.
//
// Scopes. Jinja scoping as jinja2 behaves: `{% set %}` writes the innermost scope; every for
// loop iteration, macro call, call-block caller, `with` and captured block gets a fresh child
// scope, so a set inside a loop body is gone after that iteration and after the loop (hence
// `namespace()`); `if` opens no scope. Lookups walk outwards, then the render's variables,
// then the globals (range, namespace, ...). A macro sees its defining scope as it is when the
// macro is called, not as it was when defined.
//
// Cycles. A macro holds its defining scope, which holds the macro; a namespace can hold
// itself. The renderer remembers every such scope and namespace and empties them when the
// render ends, so nothing leaks and no destructor recurses through a cycle.
//
// Bounds (limits): every expression node, statement and loop iteration is one step, and
// string and list building cost one step per 64 bytes / 16 items; nesting of evaluation and
// of values is bounded by depth_max; output and every string by output_bytes_max.
#pragma once

#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "template/ast.hpp"
#include "template/format.hpp"
#include "template/template.hpp"

namespace ordo::jinja {

struct scope {
    std::shared_ptr<scope> parent;
    std::vector<std::pair<std::string, value>> vars;

    const value* find(std::string_view name) const;
    void set(const std::string& name, value v);
};
using scope_ptr = std::shared_ptr<scope>;

class renderer {
public:
    renderer(const variables& vars, const render_options& opt);
    ~renderer();
    renderer(const renderer&) = delete;
    renderer& operator=(const renderer&) = delete;

    std::string run(const body& statements);

    // ---- for builtins ---------------------------------------------------------------------
    const limits& bounds() const { return _opt.bounds; }
    format_limits text_limits() const;
    void charge(uint64_t steps);
    // A new string / list, charged and checked against the bounds.
    void check_string_size(size_t bytes) const;  // fails above output_bytes_max
    value new_string(std::string s);
    value new_list(std::vector<value> items, bool tuple = false);
    value new_dict(dict_data d);
    std::shared_ptr<namespace_data> new_namespace();
    std::string str(const value& v);  // Python str(), bounded

    value call(const value& callee, call_args&& args);
    value getattr(const value& obj, std::string_view name);
    value getitem(const value& obj, const value& key);
    // Python iteration: list items, dict keys, a string's characters; undefined is empty.
    std::vector<value> iterate(const value& v);
    value add(const value& a, const value& b) { return arith("+", a, b); }
    value arith_mod(const value& a, const value& b) { return arith("%", a, b); }
    bool less(const value& a, const value& b);  // Python <, TypeError between unlike types
    bool eq(const value& a, const value& b);    // Python ==, within the step bound
    // Fails unless v can be a dict key (Python's hashable: not a list or dict, also inside a
    // tuple); charges a step per tuple visited.
    void check_hashable(const value& v);
    bool contains(const value& container, const value& item);  // Python `in`
    value filter(std::string_view name, const value& input, call_args&& args);
    bool test(std::string_view name, const value& input, call_args&& args);
    const std::tm& now() const { return _now; }

private:
    enum class flow { normal, brk, cont };
    struct depth_guard;

    flow exec_body(const body& b, const scope_ptr& sc);
    flow exec(const stmt& s, const scope_ptr& sc);
    flow exec_stmt(const stmt& s, const scope_ptr& sc);
    void exec_for(const stmt& s, const scope_ptr& sc);
    void run_loop(const stmt& s, std::vector<value> items, const scope_ptr& sc, int depth);
    struct loop_state;
    std::shared_ptr<loop_state> new_loop_state();
    value loop_object(const stmt& s, const std::vector<value>& items, size_t i, const scope_ptr& sc,
                      int depth, loop_state& state);
    void assign(const target& t, value v, const scope_ptr& sc);
    value define_macro(const std::shared_ptr<macro_def>& m, const scope_ptr& sc);
    value call_macro(const macro_def& m, const scope_ptr& closure, call_args&& args);
    std::string capture(const body& b, const scope_ptr& sc);
    void emit(std::string_view s);

    value eval(const expr& e, const scope_ptr& sc);
    value eval_node(const expr& e, const scope_ptr& sc);
    value lookup(const std::string& name, const scope_ptr& sc);
    call_args eval_args(const call_syntax& a, const scope_ptr& sc);
    value eval_compare(const expr& e, const scope_ptr& sc);
    value eval_slice(const expr& e, const scope_ptr& sc);
    value arith(const std::string& op, const value& a, const value& b);
    bool compare(const std::string& op, const value& a, const value& b);

    const variables& _vars;
    const render_options& _opt;
    std::tm _now{};
    uint64_t _steps = 0;
    uint32_t _depth = 0;
    std::string* _out = nullptr;
    value _piped;  // the input of a filter block's / block set's filter chain
    std::vector<scope_ptr> _macro_scopes;
    std::vector<std::shared_ptr<namespace_data>> _namespaces;
};

// Throws template_failure for an undefined value used where a value is needed.
[[noreturn]] void fail_undefined(const value& v);

}  // namespace ordo::jinja
