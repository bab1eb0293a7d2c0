// renderer.cpp: statement execution and expression evaluation (see renderer.hpp).
#include "template/renderer.hpp"

#include <algorithm>
#include <cmath>

#include "template/builtins.hpp"
#include "template/failure.hpp"
#include "template/unicode.hpp"

namespace ordo::jinja {

namespace {

// Steps charged per unit of bulk work: copying this many bytes or list items costs one step.
constexpr size_t k_bytes_per_step = 64;
constexpr size_t k_items_per_step = 16;
// Building a `loop` object (a dict of 13 attributes) costs about this many plain steps.
constexpr uint64_t k_loop_object_steps = 8;

[[noreturn]] void type_error(const std::string& op, const value& a, const value& b) {
    fail("unsupported operand type(s) for " + op + ": '" + std::string(type_name(a)) + "' and '" +
         std::string(type_name(b)) + "'");
}

[[noreturn]] void overflow() {
    fail("integer overflow (template integers are 64-bit)");
}

int64_t checked_add(int64_t a, int64_t b) {
    int64_t r;
    if (__builtin_add_overflow(a, b, &r)) overflow();
    return r;
}
int64_t checked_sub(int64_t a, int64_t b) {
    int64_t r;
    if (__builtin_sub_overflow(a, b, &r)) overflow();
    return r;
}
int64_t checked_mul(int64_t a, int64_t b) {
    int64_t r;
    if (__builtin_mul_overflow(a, b, &r)) overflow();
    return r;
}

int64_t floor_div(int64_t a, int64_t b) {
    if (b == 0) fail("integer division or modulo by zero");
    if (a == INT64_MIN && b == -1) overflow();
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
    return q;
}

int64_t floor_mod(int64_t a, int64_t b) {
    if (b == 0) fail("integer division or modulo by zero");
    if (b == -1) return 0;
    int64_t m = a % b;
    if (m != 0 && ((m < 0) != (b < 0))) m += b;
    return m;
}

// Python's float divmod: the remainder takes the divisor's sign.
std::pair<double, double> float_divmod(double a, double b) {
    if (b == 0.0) fail("float division by zero");
    double mod = std::fmod(a, b);
    double div = (a - mod) / b;
    if (mod != 0.0) {
        if ((b < 0) != (mod < 0)) {
            mod += b;
            div -= 1.0;
        }
    } else {
        mod = std::copysign(0.0, b);
    }
    double floordiv;
    if (div != 0.0) {
        floordiv = std::floor(div);
        if (div - floordiv > 0.5) floordiv += 1.0;
    } else {
        floordiv = std::copysign(0.0, a / b);
    }
    return {floordiv, mod};
}

value int_pow(int64_t base, int64_t exp) {
    if (exp < 0) {
        if (base == 0) fail("0.0 cannot be raised to a negative power");
        return value(std::pow(double(base), double(exp)));
    }
    int64_t result = 1;
    while (exp > 0) {
        if (exp & 1) result = checked_mul(result, base);
        exp >>= 1;
        if (exp > 0) base = checked_mul(base, base);
    }
    return value(result);
}

value float_pow(double a, double b) {
    if (a == 0.0 && b < 0) fail("0.0 cannot be raised to a negative power");
    if (a < 0 && std::floor(b) != b) fail("a negative number to a fractional power is complex");
    return value(std::pow(a, b));
}

// Python's slice.indices(): the positions a[start:stop:step] selects, in order.
std::vector<size_t> slice_positions(size_t len, const value& start, const value& stop,
                                    int64_t step) {
    const int64_t n = int64_t(len);
    auto clamp_index = [&](const value& v, int64_t lower, int64_t upper, int64_t dflt) {
        if (v.is_none() || v.is_undefined()) return dflt;
        int64_t i = v.int_of();
        if (i < 0) i += n;
        return std::clamp(i, lower, upper);
    };
    std::vector<size_t> out;
    if (step > 0) {
        const int64_t b = clamp_index(start, 0, n, 0);
        const int64_t e = clamp_index(stop, 0, n, n);
        for (int64_t i = b; i < e; i += step) out.push_back(size_t(i));
    } else {
        const int64_t b = clamp_index(start, -1, n - 1, n - 1);
        const int64_t e = clamp_index(stop, -1, n - 1, -1);
        for (int64_t i = b; i > e; i += step) out.push_back(size_t(i));
    }
    return out;
}

}  // namespace

[[noreturn]] void fail_undefined(const value& v) {
    const std::string& hint = v.undefined_hint();
    fail(hint.empty() ? "value is undefined" : hint);
}

// ---- scopes ---------------------------------------------------------------------------------

const value* scope::find(std::string_view name) const {
    for (const scope* s = this; s != nullptr; s = s->parent.get()) {
        for (const auto& [k, v] : s->vars) {
            if (k == name) return &v;
        }
    }
    return nullptr;
}

void scope::set(const std::string& name, value v) {
    for (auto& [k, old] : vars) {
        if (k == name) {
            old = std::move(v);
            return;
        }
    }
    vars.emplace_back(name, std::move(v));
}

// ---- renderer -------------------------------------------------------------------------------

struct renderer::depth_guard {
    renderer& r;
    explicit depth_guard(renderer& rr) : r(rr) {
        if (++r._depth > r._opt.bounds.depth_max) {
            fail("nesting exceeds the depth bound of " + std::to_string(r._opt.bounds.depth_max) +
                 " (deep recursion?)");
        }
    }
    ~depth_guard() { --r._depth; }
};

renderer::renderer(const variables& vars, const render_options& opt) : _vars(vars), _opt(opt) {
    if (opt.now) {
        _now = *opt.now;
    } else {
        const std::time_t t = std::time(nullptr);
        localtime_r(&t, &_now);
    }
}

renderer::~renderer() {
    // Break the reference cycles macros and namespaces may form (see renderer.hpp).
    for (auto& s : _macro_scopes) s->vars.clear();
    for (auto& n : _namespaces) n->attrs = dict_data{};
}

std::string renderer::run(const body& statements) {
    std::string out;
    _out = &out;
    auto root = std::make_shared<scope>();
    exec_body(statements, root);
    return out;
}

format_limits renderer::text_limits() const {
    return {_opt.bounds.output_bytes_max, _opt.bounds.depth_max};
}

void renderer::charge(uint64_t steps) {
    _steps += steps;
    if (_steps > _opt.bounds.steps_max) {
        fail("render exceeds the step bound of " + std::to_string(_opt.bounds.steps_max) +
             " (a loop too long?)");
    }
}

void renderer::check_string_size(size_t bytes) const {
    if (bytes > _opt.bounds.output_bytes_max) {
        fail("a string exceeds the bound of " + std::to_string(_opt.bounds.output_bytes_max) +
             " bytes");
    }
}

value renderer::new_string(std::string s) {
    check_string_size(s.size());
    charge(s.size() / k_bytes_per_step);
    return value(std::move(s));
}

value renderer::new_list(std::vector<value> items, bool tuple) {
    charge(items.size() / k_items_per_step);
    value v = tuple ? value::tuple(std::move(items)) : value::list(std::move(items));
    if (v.depth() > _opt.bounds.depth_max) {
        fail("list nesting exceeds the depth bound of " + std::to_string(_opt.bounds.depth_max));
    }
    return v;
}

value renderer::new_dict(dict_data d) {
    charge(d.entries.size() / k_items_per_step);
    value v = value::dict(std::move(d));
    if (v.depth() > _opt.bounds.depth_max) {
        fail("dict nesting exceeds the depth bound of " + std::to_string(_opt.bounds.depth_max));
    }
    return v;
}

std::shared_ptr<namespace_data> renderer::new_namespace() {
    auto n = std::make_shared<namespace_data>();
    _namespaces.push_back(n);
    return n;
}

std::string renderer::str(const value& v) {
    if (v.is_string()) return v.as_string();
    std::string s = to_str(v, text_limits());
    charge(s.size() / k_bytes_per_step);
    return s;
}

void renderer::emit(std::string_view s) {
    if (_out->size() + s.size() > _opt.bounds.output_bytes_max) {
        fail("output exceeds the bound of " + std::to_string(_opt.bounds.output_bytes_max) +
             " bytes");
    }
    charge(s.size() / k_bytes_per_step);
    _out->append(s);
}

std::string renderer::capture(const body& b, const scope_ptr& sc) {
    std::string buf;
    std::string* saved = _out;
    _out = &buf;
    try {
        exec_body(b, sc);
    } catch (...) {
        _out = saved;
        throw;
    }
    _out = saved;
    return buf;
}

// ---- statements -----------------------------------------------------------------------------

renderer::flow renderer::exec_body(const body& b, const scope_ptr& sc) {
    for (const auto& s : b) {
        flow f = exec(*s, sc);
        if (f != flow::normal) return f;
    }
    return flow::normal;
}

// Runs fn; a failure without a position yet gets `at` (the innermost node that failed).
template <typename F>
auto located(position at, F&& fn) -> decltype(fn()) {
    try {
        return fn();
    } catch (template_failure& f) {
        if (f.line == 0) {
            f.line = at.line;
            f.column = at.column;
        }
        throw;
    }
}

renderer::flow renderer::exec(const stmt& s, const scope_ptr& sc) {
    charge(1);
    depth_guard g(*this);
    return located(s.pos, [&] { return exec_stmt(s, sc); });
}

renderer::flow renderer::exec_stmt(const stmt& s, const scope_ptr& sc) {
    switch (s.kind) {
        case stmt_kind::text:
            emit(s.text);
            break;
        case stmt_kind::output: {
            value v = eval(*s.expression, sc);
            if (v.is_string()) {
                emit(v.as_string());
            } else {
                emit(str(v));
            }
            break;
        }
        case stmt_kind::if_:
            for (size_t i = 0; i < s.conds.size(); ++i) {
                if (truthy(eval(*s.conds[i], sc))) return exec_body(s.bodies[i], sc);
            }
            return exec_body(s.else_body, sc);
        case stmt_kind::for_:
            exec_for(s, sc);
            break;
        case stmt_kind::set:
            assign(s.set_target, eval(*s.expression, sc), sc);
            break;
        case stmt_kind::set_block: {
            value v = new_string(capture(s.bodies[0], std::make_shared<scope>(scope{sc, {}})));
            if (s.expression) {
                _piped = std::move(v);
                v = eval(*s.expression, sc);
            }
            assign(s.set_target, std::move(v), sc);
            break;
        }
        case stmt_kind::macro:
            sc->set(s.macro->name, define_macro(s.macro, sc));
            break;
        case stmt_kind::call_block: {
            const expr& call = *s.expression;
            value callee = eval(*call.items[0], sc);
            call_args args = eval_args(call.args, sc);
            args.keyword.emplace_back("caller", define_macro(s.macro, sc));
            emit(str(this->call(callee, std::move(args))));
            break;
        }
        case stmt_kind::filter_block:
            _piped = new_string(capture(s.bodies[0], std::make_shared<scope>(scope{sc, {}})));
            emit(str(eval(*s.expression, sc)));
            break;
        case stmt_kind::with: {
            auto inner = std::make_shared<scope>(scope{sc, {}});
            for (const auto& [t, e] : s.assignments) assign(t, eval(*e, sc), inner);
            return exec_body(s.bodies[0], inner);
        }
        case stmt_kind::break_:
            return flow::brk;
        case stmt_kind::continue_:
            return flow::cont;
    }
    return flow::normal;
}

void renderer::exec_for(const stmt& s, const scope_ptr& sc) {
    std::vector<value> items = iterate(eval(*s.expression, sc));
    run_loop(s, std::move(items), sc, 1);
}

void renderer::run_loop(const stmt& s, std::vector<value> items, const scope_ptr& sc, int depth) {
    if (s.loop_filter) {  // `for x in xs if cond`: filtered before loop.* counts anything
        std::vector<value> kept;
        for (auto& item : items) {
            charge(1);
            auto probe = std::make_shared<scope>(scope{sc, {}});
            assign(s.set_target, item, probe);
            if (truthy(eval(*s.loop_filter, probe))) kept.push_back(std::move(item));
        }
        items = std::move(kept);
    }
    if (items.empty()) {
        exec_body(s.else_body, std::make_shared<scope>(scope{sc, {}}));
        return;
    }
    std::shared_ptr<loop_state> state = s.uses_loop ? new_loop_state() : nullptr;
    for (size_t i = 0; i < items.size(); ++i) {
        charge(1);
        auto it = std::make_shared<scope>(scope{sc, {}});
        assign(s.set_target, items[i], it);
        if (state) {
            charge(k_loop_object_steps);
            it->set("loop", loop_object(s, items, i, sc, depth, *state));
        }
        if (exec_body(s.bodies[0], it) == flow::brk) break;
    }
}

// The `loop` variable: index, first, length, cycle(), ... and, in a recursive loop, callable.
// cycle() and changed() are made once per loop and read the iteration from `state`.
struct renderer::loop_state {
    int64_t index = 0;
    value changed_last;
    value cycle;
    value changed;
};

std::shared_ptr<renderer::loop_state> renderer::new_loop_state() {
    auto state = std::make_shared<loop_state>();
    auto cycle = std::make_shared<callable_data>();
    cycle->name = "loop.cycle";
    std::weak_ptr<loop_state> weak = state;  // the state holds these callables
    cycle->fn = [weak](renderer&, call_args&& args) -> value {
        if (args.positional.empty()) fail("no items for cycling given");
        auto st = weak.lock();
        if (!st) fail("loop.cycle called after its loop ended");
        return args.positional[size_t(st->index) % args.positional.size()];
    };
    auto changed = std::make_shared<callable_data>();
    changed->name = "loop.changed";
    changed->fn = [weak](renderer& r, call_args&& args) -> value {
        auto st = weak.lock();
        if (!st) fail("loop.changed called after its loop ended");
        value now = r.new_list(std::move(args.positional));
        if (!st->changed_last.is_undefined() && r.eq(st->changed_last, now)) return value(false);
        st->changed_last = now;
        return value(true);
    };
    state->cycle = value::callable(cycle);
    state->changed = value::callable(changed);
    return state;
}

value renderer::loop_object(const stmt& s, const std::vector<value>& items, size_t i,
                            const scope_ptr& sc, int depth, loop_state& state) {
    const int64_t n = int64_t(items.size());
    const int64_t k = int64_t(i);
    state.index = k;
    auto attr = [](std::string_view name, value v) { return std::pair(value(name), std::move(v)); };
    dict_data a;  // distinct keys, few: built directly, looked up by scan
    a.entries = {
        attr("index", value(k + 1)),
        attr("index0", value(k)),
        attr("revindex", value(n - k)),
        attr("revindex0", value(n - k - 1)),
        attr("first", value(k == 0)),
        attr("last", value(k == n - 1)),
        attr("length", value(n)),
        attr("depth", value(int64_t(depth))),
        attr("depth0", value(int64_t(depth - 1))),
        attr("previtem", k > 0 ? items[i - 1] : value::undefined("there is no previous item")),
        attr("nextitem", k + 1 < n ? items[i + 1] : value::undefined("there is no next item")),
        attr("cycle", state.cycle),
        attr("changed", state.changed),
    };
    auto loop = std::make_shared<callable_data>();
    loop->name = "loop";
    loop->attrs = std::make_shared<const dict_data>(std::move(a));
    const stmt* node = &s;
    const bool recursive = s.recursive;
    loop->fn = [node, sc, depth, recursive](renderer& r, call_args&& args) -> value {
        if (!recursive) fail("tried to call a non-recursive loop (add 'recursive' to the for)");
        if (args.positional.size() != 1) fail("loop() takes one iterable");
        std::string buf;
        std::string* saved = r._out;
        r._out = &buf;
        try {
            r.run_loop(*node, r.iterate(args.positional[0]), sc, depth + 1);
        } catch (...) {
            r._out = saved;
            throw;
        }
        r._out = saved;
        return r.new_string(std::move(buf));
    };
    return value::callable(loop);
}

void renderer::assign(const target& t, value v, const scope_ptr& sc) {
    if (!t.attr.empty()) {
        value obj = lookup(t.name, sc);
        if (!obj.is_namespace()) fail("cannot assign attribute on non-namespace object");
        obj.as_namespace()->attrs.set(value(t.attr), std::move(v));
        return;
    }
    if (!t.is_tuple) {
        sc->set(t.name, std::move(v));
        return;
    }
    std::vector<value> parts = iterate(v);
    if (v.is_undefined()) fail_undefined(v);
    if (parts.size() != t.items.size()) {
        fail(parts.size() > t.items.size()
                 ? "too many values to unpack (expected " + std::to_string(t.items.size()) + ")"
                 : "not enough values to unpack (expected " + std::to_string(t.items.size()) +
                       ", got " + std::to_string(parts.size()) + ")");
    }
    for (size_t i = 0; i < parts.size(); ++i) assign(t.items[i], std::move(parts[i]), sc);
}

value renderer::define_macro(const std::shared_ptr<macro_def>& m, const scope_ptr& sc) {
    _macro_scopes.push_back(sc);
    auto c = std::make_shared<callable_data>();
    c->name = m->name;
    c->is_macro = true;
    c->fn = [m, sc](renderer& r, call_args&& args) {
        return r.call_macro(*m, sc, std::move(args));
    };
    return value::callable(c);
}

value renderer::call_macro(const macro_def& m, const scope_ptr& closure, call_args&& args) {
    auto sc = std::make_shared<scope>(scope{closure, {}});
    const size_t n = m.params.size();
    if (args.positional.size() > n && !m.uses_varargs) {
        fail("macro '" + m.name + "' takes not more than " + std::to_string(n) + " argument(s)");
    }
    std::vector<bool> bound(n, false);
    for (size_t i = 0; i < n && i < args.positional.size(); ++i) {
        sc->set(m.params[i].name, args.positional[i]);
        bound[i] = true;
    }
    dict_data extra_kw;
    for (auto& [k, v] : args.keyword) {
        size_t i = 0;
        while (i < n && m.params[i].name != k) ++i;
        if (i < n) {
            if (bound[i])
                fail("macro '" + m.name + "' got multiple values for argument '" + k + "'");
            sc->set(k, std::move(v));
            bound[i] = true;
        } else if (k == "caller" && m.uses_caller) {
            sc->set(k, std::move(v));
        } else if (m.uses_kwargs) {
            extra_kw.set(value(k), std::move(v));
        } else {
            fail("macro '" + m.name + "' takes no keyword argument '" + k + "'");
        }
    }
    for (size_t i = 0; i < n; ++i) {  // defaults may read earlier parameters
        if (bound[i]) continue;
        sc->set(m.params[i].name,
                m.params[i].default_value
                    ? eval(*m.params[i].default_value, sc)
                    : value::undefined("parameter '" + m.params[i].name + "' was not provided"));
    }
    if (m.uses_varargs) {
        std::vector<value> rest;
        for (size_t i = n; i < args.positional.size(); ++i) rest.push_back(args.positional[i]);
        sc->set("varargs", new_list(std::move(rest), true));
    }
    if (m.uses_kwargs) sc->set("kwargs", new_dict(std::move(extra_kw)));
    return new_string(capture(m.statements, sc));
}

// ---- expressions ----------------------------------------------------------------------------

value renderer::eval(const expr& e, const scope_ptr& sc) {
    charge(1);
    depth_guard g(*this);
    return located(e.pos, [&] { return eval_node(e, sc); });
}

value renderer::lookup(const std::string& name, const scope_ptr& sc) {
    if (const value* v = sc->find(name)) return *v;
    if (auto it = _vars.find(name); it != _vars.end()) return it->second;
    value g = find_global(name);
    if (!g.is_undefined()) return g;
    return value::undefined("'" + name + "' is undefined");
}

call_args renderer::eval_args(const call_syntax& a, const scope_ptr& sc) {
    call_args out;
    for (const auto& p : a.positional) out.positional.push_back(eval(*p, sc));
    if (a.star) {
        for (auto& v : iterate(eval(*a.star, sc))) out.positional.push_back(std::move(v));
    }
    for (const auto& [k, p] : a.keyword) out.keyword.emplace_back(k, eval(*p, sc));
    if (a.star_star) {
        value d = eval(*a.star_star, sc);
        if (!d.is_dict()) fail("argument after ** must be a mapping");
        for (const auto& [k, v] : d.as_dict().entries) {
            if (!k.is_string()) fail("keywords must be strings");
            out.keyword.emplace_back(k.as_string(), v);
        }
    }
    return out;
}

value renderer::eval_node(const expr& e, const scope_ptr& sc) {
    switch (e.kind) {
        case expr_kind::literal:
            return e.literal;
        case expr_kind::name:
            return lookup(e.name, sc);
        case expr_kind::list:
        case expr_kind::tuple: {
            std::vector<value> items;
            items.reserve(e.items.size());
            for (const auto& i : e.items) items.push_back(eval(*i, sc));
            return new_list(std::move(items), e.kind == expr_kind::tuple);
        }
        case expr_kind::dict: {
            dict_data d;
            for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
                value k = eval(*e.items[i], sc);
                check_hashable(k);
                d.set(std::move(k), eval(*e.items[i + 1], sc));
            }
            return new_dict(std::move(d));
        }
        case expr_kind::unary: {
            value v = eval(*e.items[0], sc);
            if (e.name == "not") return value(!truthy(v));
            if (v.is_undefined()) fail_undefined(v);
            if (v.is_float()) return value(e.name == "-" ? -v.as_float() : v.as_float());
            if (v.is_int() || v.is_bool()) {
                return value(e.name == "-" ? checked_sub(0, v.int_of()) : v.int_of());
            }
            fail("bad operand type for unary " + e.name + ": '" + std::string(type_name(v)) + "'");
        }
        case expr_kind::binary: {
            value l = eval(*e.items[0], sc);
            if (e.name == "and") return truthy(l) ? eval(*e.items[1], sc) : l;
            if (e.name == "or") return truthy(l) ? l : eval(*e.items[1], sc);
            return arith(e.name, l, eval(*e.items[1], sc));
        }
        case expr_kind::compare:
            return eval_compare(e, sc);
        case expr_kind::cond:
            if (truthy(eval(*e.items[1], sc))) return eval(*e.items[0], sc);
            if (e.items[2]) return eval(*e.items[2], sc);
            return value::undefined(
                "the inline if-expression evaluated to false and no else "
                "section was defined");
        case expr_kind::getattr:
            return getattr(eval(*e.items[0], sc), e.name);
        case expr_kind::getitem:
            return getitem(eval(*e.items[0], sc), eval(*e.items[1], sc));
        case expr_kind::slice:
            return eval_slice(e, sc);
        case expr_kind::call: {
            value callee = eval(*e.items[0], sc);
            return call(callee, eval_args(e.args, sc));
        }
        case expr_kind::filter: {
            value input = e.items[0] ? eval(*e.items[0], sc) : _piped;
            if (!e.known) fail("no filter named '" + e.name + "'");
            return filter(e.name, input, eval_args(e.args, sc));
        }
        case expr_kind::test: {
            value input = eval(*e.items[0], sc);
            if (!e.known) fail("no test named '" + e.name + "'");
            return value(test(e.name, input, eval_args(e.args, sc)) != e.negated);
        }
    }
    fail("unknown expression");
}

value renderer::eval_compare(const expr& e, const scope_ptr& sc) {
    value left = eval(*e.items[0], sc);
    for (size_t i = 0; i < e.ops.size(); ++i) {
        value right = eval(*e.items[i + 1], sc);
        if (!compare(e.ops[i], left, right)) return value(false);
        left = std::move(right);
    }
    return value(true);
}

value renderer::eval_slice(const expr& e, const scope_ptr& sc) {
    value obj = eval(*e.items[0], sc);
    value parts[3];
    for (int i = 0; i < 3; ++i) {
        parts[i] = e.items[i + 1] ? eval(*e.items[i + 1], sc) : value::none();
    }
    // jinja2 subscripts slices directly (not through its forgiving getitem): errors propagate.
    if (obj.is_undefined()) fail_undefined(obj);
    if (!obj.is_string() && !obj.is_list()) {
        fail("'" + std::string(type_name(obj)) + "' object is not subscriptable");
    }
    for (const value& p : parts) {
        if (!p.is_none() && !p.is_int() && !p.is_bool()) {
            fail("slice indices must be integers or None");
        }
    }
    const int64_t step = parts[2].is_none() ? 1 : parts[2].int_of();
    if (step == 0) fail("slice step cannot be zero");
    if (obj.is_string()) {
        const std::string& s = obj.as_string();
        std::vector<size_t> offs = unicode::code_point_offsets(s);
        std::string out;
        for (size_t i : slice_positions(offs.size() - 1, parts[0], parts[1], step)) {
            out.append(s, offs[i], offs[i + 1] - offs[i]);
        }
        return new_string(std::move(out));
    }
    if (obj.is_list()) {
        const auto& items = obj.items();
        std::vector<value> out;
        for (size_t i : slice_positions(items.size(), parts[0], parts[1], step)) {
            out.push_back(items[i]);
        }
        return new_list(std::move(out), obj.is_tuple());
    }
    fail("unreachable slice");
}

value renderer::call(const value& callee, call_args&& args) {
    if (callee.is_callable()) {
        depth_guard g(*this);
        return callee.as_callable().fn(*this, std::move(args));
    }
    if (callee.is_undefined()) fail_undefined(callee);
    fail("'" + std::string(type_name(callee)) + "' object is not callable");
}

value renderer::getattr(const value& obj, std::string_view name) {
    switch (obj.type()) {
        case value::kind::undefined:
            fail_undefined(obj);
        case value::kind::ns: {
            const value* v = obj.as_namespace()->attrs.find(name);
            if (v) return *v;
            break;
        }
        case value::kind::callable:
            if (obj.as_callable().attrs) {
                if (const value* v = obj.as_callable().attrs->find(name)) return *v;
            }
            break;
        case value::kind::dict: {
            value m = find_method(*this, obj, name);
            if (!m.is_undefined()) return m;
            if (const value* v = obj.as_dict().find(name)) return *v;
            break;
        }
        case value::kind::list: {
            const auto& fields = obj.as_list().fields;
            for (size_t i = 0; i < fields.size(); ++i) {
                if (fields[i] == name) return obj.items()[i];
            }
            value m = find_method(*this, obj, name);
            if (!m.is_undefined()) return m;
            break;
        }
        case value::kind::integer:
        case value::kind::boolean:
        case value::kind::floating:
            // Python numbers' data attributes; their methods are not offered.
            if (name == "real") return obj.is_float() ? obj : value(obj.int_of());
            if (name == "imag") return obj.is_float() ? value(0.0) : value(0);
            if (!obj.is_float() && name == "numerator") return value(obj.int_of());
            if (!obj.is_float() && name == "denominator") return value(1);
            [[fallthrough]];
        default: {
            value m = find_method(*this, obj, name);
            if (!m.is_undefined()) return m;
        }
    }
    return value::undefined("'" + std::string(type_name(obj)) + " object' has no attribute '" +
                            std::string(name) + "'");
}

value renderer::getitem(const value& obj, const value& key) {
    switch (obj.type()) {
        case value::kind::undefined:
            fail_undefined(obj);
        case value::kind::dict:
            if (key.is_list() && !key.is_tuple()) break;
            if (key.is_dict()) break;
            check_hashable(key);
            if (const value* v = obj.as_dict().find(key)) return *v;
            break;
        case value::kind::ns:
            if (key.is_string()) return getattr(obj, key.as_string());
            break;
        case value::kind::list:
            if (key.is_int() || key.is_bool()) {
                const auto& items = obj.items();
                int64_t i = key.int_of();
                if (i < 0) i += int64_t(items.size());
                if (i >= 0 && i < int64_t(items.size())) return items[size_t(i)];
                return value::undefined(std::string(type_name(obj)) + " index out of range");
            }
            break;
        case value::kind::string:
            if (key.is_int() || key.is_bool()) {
                const std::string& s = obj.as_string();
                std::vector<size_t> offs = unicode::code_point_offsets(s);
                int64_t i = key.int_of();
                const int64_t n = int64_t(offs.size()) - 1;
                if (i < 0) i += n;
                if (i >= 0 && i < n) return value(s.substr(offs[i], offs[i + 1] - offs[i]));
                return value::undefined("string index out of range");
            }
            break;
        default:
            break;
    }
    if (key.is_string()) return getattr(obj, key.as_string());
    return value::undefined("'" + std::string(type_name(obj)) + " object' has no item " +
                            to_repr(key, text_limits()));
}

std::vector<value> renderer::iterate(const value& v) {
    switch (v.type()) {
        case value::kind::undefined:
            return {};
        case value::kind::list:
            charge(v.items().size() / k_items_per_step);
            return v.items();
        case value::kind::dict: {
            std::vector<value> keys;
            keys.reserve(v.as_dict().entries.size());
            for (const auto& [k, x] : v.as_dict().entries) keys.push_back(k);
            charge(keys.size() / k_items_per_step);
            return keys;
        }
        case value::kind::string: {
            const std::string& s = v.as_string();
            std::vector<value> out;
            for (size_t i = 0; i < s.size();) {
                const size_t n = unicode::decode(s, i).length;
                out.emplace_back(s.substr(i, n));
                i += n;
            }
            charge(out.size() / k_items_per_step);
            return out;
        }
        default:
            fail("'" + std::string(type_name(v)) + "' object is not iterable");
    }
}

value renderer::filter(std::string_view name, const value& input, call_args&& args) {
    filter_fn f = find_filter(name);
    if (f == nullptr) fail("no filter named '" + std::string(name) + "'");
    return f(*this, input, std::move(args));
}

bool renderer::test(std::string_view name, const value& input, call_args&& args) {
    test_fn t = find_test(name);
    if (t == nullptr) fail("no test named '" + std::string(name) + "'");
    if (!test_takes_argument(name) && (!args.positional.empty() || !args.keyword.empty())) {
        fail("test '" + std::string(name) + "' takes no arguments");
    }
    return t(*this, input, std::move(args));
}

// ---- operators ------------------------------------------------------------------------------

value renderer::arith(const std::string& op, const value& a, const value& b) {
    if (op == "~") return new_string(str(a) + str(b));
    if (op == "%" && a.is_string()) {  // printf-style: str(undefined) is ""
        return new_string(percent_format(a.as_string(), b, text_limits()));
    }
    if (a.is_undefined()) fail_undefined(a);
    if (b.is_undefined()) fail_undefined(b);
    const bool nums = a.is_number() && b.is_number();
    const bool ints = nums && !a.is_float() && !b.is_float();
    if (op == "+") {
        if (ints) return value(checked_add(a.int_of(), b.int_of()));
        if (nums) return value(a.float_of() + b.float_of());
        if (a.is_string() && b.is_string()) {
            check_string_size(a.as_string().size() + b.as_string().size());
            return new_string(a.as_string() + b.as_string());
        }
        if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
            std::vector<value> items = a.items();
            items.insert(items.end(), b.items().begin(), b.items().end());
            return new_list(std::move(items), a.is_tuple());
        }
        if (a.is_string() || b.is_string()) {
            fail("can only concatenate str (not \"" +
                 std::string(type_name(a.is_string() ? b : a)) + "\") to str");
        }
        type_error("+", a, b);
    }
    if (op == "-") {
        if (ints) return value(checked_sub(a.int_of(), b.int_of()));
        if (nums) return value(a.float_of() - b.float_of());
        type_error("-", a, b);
    }
    if (op == "*") {
        if (ints) return value(checked_mul(a.int_of(), b.int_of()));
        if (nums) return value(a.float_of() * b.float_of());
        const value& seq = (a.is_string() || a.is_list()) ? a : b;
        const value& count = (&seq == &a) ? b : a;
        if ((seq.is_string() || seq.is_list()) && (count.is_int() || count.is_bool())) {
            const int64_t n = std::max<int64_t>(0, count.int_of());
            if (seq.is_string()) {
                const size_t len = seq.as_string().size();
                if (len != 0 && uint64_t(n) > _opt.bounds.output_bytes_max / len) {
                    check_string_size(_opt.bounds.output_bytes_max + 1);
                }
                std::string out;
                out.reserve(len * size_t(n));
                for (int64_t i = 0; i < n; ++i) out += seq.as_string();
                return new_string(std::move(out));
            }
            const size_t len = seq.items().size();
            if (len != 0 && uint64_t(n) * len > _opt.bounds.steps_max) {
                fail("list repetition exceeds the step bound");
            }
            std::vector<value> out;
            charge(uint64_t(n) * len / k_items_per_step);
            for (int64_t i = 0; i < n; ++i) {
                out.insert(out.end(), seq.items().begin(), seq.items().end());
            }
            return new_list(std::move(out), seq.is_tuple());
        }
        type_error("*", a, b);
    }
    if (op == "/") {
        if (!nums) type_error("/", a, b);
        if (b.float_of() == 0.0) fail("division by zero");
        return value(a.float_of() / b.float_of());
    }
    if (op == "//") {
        if (ints) return value(floor_div(a.int_of(), b.int_of()));
        if (nums) return value(float_divmod(a.float_of(), b.float_of()).first);
        type_error("//", a, b);
    }
    if (op == "%") {
        if (a.is_string()) return new_string(percent_format(a.as_string(), b, text_limits()));
        if (ints) return value(floor_mod(a.int_of(), b.int_of()));
        if (nums) return value(float_divmod(a.float_of(), b.float_of()).second);
        type_error("%", a, b);
    }
    if (op == "**") {
        if (ints) return int_pow(a.int_of(), b.int_of());
        if (nums) return float_pow(a.float_of(), b.float_of());
        type_error("** or pow()", a, b);
    }
    fail("unknown operator " + op);
}

bool renderer::eq(const value& a, const value& b) {
    const uint64_t start = _opt.bounds.steps_max > _steps ? _opt.bounds.steps_max - _steps : 0;
    uint64_t budget = start;
    try {
        const bool same = equals_within(a, b, budget);
        charge(start - budget);
        return same;
    } catch (const compare_budget_exhausted&) {
        charge(start + 1);  // fails with the step bound
        return false;
    }
}

void renderer::check_hashable(const value& v) {
    if (v.is_list() && !v.is_tuple()) fail("unhashable type: 'list'");
    if (v.is_dict()) fail("unhashable type: 'dict'");
    if (v.is_tuple()) {
        charge(1);
        depth_guard g(*this);
        for (const value& item : v.items()) check_hashable(item);
    }
}

bool renderer::less(const value& a, const value& b) {
    charge(1);
    if (a.is_undefined()) fail_undefined(a);
    if (b.is_undefined()) fail_undefined(b);
    if (a.is_number() && b.is_number()) {
        if (!a.is_float() && !b.is_float()) return a.int_of() < b.int_of();
        return a.float_of() < b.float_of();
    }
    if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
        depth_guard g(*this);
        const auto& x = a.items();
        const auto& y = b.items();
        for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
            if (!eq(x[i], y[i])) return less(x[i], y[i]);
        }
        return x.size() < y.size();
    }
    fail("'<' not supported between instances of '" + std::string(type_name(a)) + "' and '" +
         std::string(type_name(b)) + "'");
}

bool renderer::contains(const value& container, const value& item) {
    switch (container.type()) {
        case value::kind::undefined:
            return false;
        case value::kind::string:
            if (!item.is_string()) {
                fail("'in <string>' requires string as left operand, not " +
                     std::string(type_name(item)));
            }
            charge(container.as_string().size() / k_bytes_per_step);
            return container.as_string().find(item.as_string()) != std::string::npos;
        case value::kind::list:
            charge(container.items().size() / k_items_per_step);
            for (const value& v : container.items()) {
                if (eq(v, item)) return true;
            }
            return false;
        case value::kind::dict:
            if (item.is_dict() || (item.is_list() && !item.is_tuple())) {
                fail("unhashable type: '" + std::string(type_name(item)) + "'");
            }
            check_hashable(item);
            return container.as_dict().find(item) != nullptr;
        default:
            fail("argument of type '" + std::string(type_name(container)) + "' is not iterable");
    }
}

bool renderer::compare(const std::string& op, const value& a, const value& b) {
    if (op == "==") return eq(a, b);
    if (op == "!=") return !eq(a, b);
    if (op == "in") return contains(b, a);
    if (op == "notin") return !contains(b, a);
    if (op == "<") return less(a, b);
    if (op == ">") return less(b, a);
    if (op == "<=") return less(a, b) || eq(a, b);
    if (op == ">=") return less(b, a) || eq(a, b);
    fail("unknown comparison " + op);
}

}  // namespace ordo::jinja
