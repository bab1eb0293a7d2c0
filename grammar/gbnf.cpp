// gbnf.cpp: see gbnf.hpp. The parser is recursive descent over the source with a position that
// turns into line:column for errors; repetitions become helper rules at parse time (x* is
// R ::= x R | "", right-recursive, which the matcher runs as a tail call), so the matcher only
// knows sequences, alternatives, terminals and references.
#include "grammar/gbnf.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>

namespace ordo::grammar {

bool element::matches(char32_t c) const {
    bool in = false;
    for (const auto& [lo, hi] : ranges) {
        if (lo <= c && c <= hi) {
            in = true;
            break;
        }
    }
    return in != negated;
}

bool element::matches_any(char32_t lo, char32_t hi) const {
    if (!negated) {
        return std::any_of(ranges.begin(), ranges.end(),
                           [&](const auto& r) { return r.first <= hi && lo <= r.second; });
    }
    // Negated: some point of [lo, hi] is outside every range.
    std::vector<std::pair<char32_t, char32_t>> sorted(ranges.begin(), ranges.end());
    std::sort(sorted.begin(), sorted.end());
    char32_t next = lo;  // the first point not yet known to be covered
    for (const auto& [a, b] : sorted) {
        if (b < next) continue;
        if (a > next) return true;
        if (b >= hi) return false;
        next = b + 1;
    }
    return true;
}

namespace {

constexpr char32_t code_point_max = 0x10FFFF;
constexpr char32_t surrogate_first = 0xD800, surrogate_last = 0xDFFF;

// The bytes of the UTF-8 sequence `lead` starts, or 0 when it cannot start one.
std::size_t utf8_length(unsigned char lead) {
    return lead < 0x80           ? 1
           : (lead >> 5) == 0x6  ? 2
           : (lead >> 4) == 0xE  ? 3
           : (lead >> 3) == 0x1E ? 4
                                 : 0;
}

// The code point of a whole sequence (utf8_length(seq[0]) bytes), or nothing when it is not
// UTF-8: a byte that does not continue it, an overlong form, a surrogate, past U+10FFFF.
// Per sequence length: the lead byte's value bits, and the smallest code point (shorter
// would be an overlong form).
constexpr char32_t utf8_lead_mask[] = {0, 0x7F, 0x1F, 0x0F, 0x07};
constexpr char32_t utf8_min_of[] = {0, 0, 0x80, 0x800, 0x10000};

std::optional<char32_t> utf8_value(std::string_view seq) {
    constexpr const auto& lead_mask = utf8_lead_mask;
    constexpr const auto& min_of = utf8_min_of;
    const std::size_t n = seq.size();
    char32_t v = static_cast<unsigned char>(seq[0]) & lead_mask[n];
    for (std::size_t i = 1; i < n; ++i) {
        auto b = static_cast<unsigned char>(seq[i]);
        if ((b & 0xC0) != 0x80) return std::nullopt;
        v = (v << 6) | (b & 0x3F);
    }
    if (v < min_of[n] || v > code_point_max || (v >= surrogate_first && v <= surrogate_last)) {
        return std::nullopt;
    }
    return v;
}

bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

class parser {
public:
    parser(std::string_view src, const gbnf_limits& limits) : _src(src) { _out.limits = limits; }

    result<gbnf> run() {
        if (_src.size() > _out.limits.source_bytes_max) {
            return make_error("bad_grammar", "the grammar is " + std::to_string(_src.size()) +
                                                 " bytes; the limit is " +
                                                 std::to_string(_out.limits.source_bytes_max));
        }
        for (;;) {
            skip_space(true);
            if (at_end()) break;
            if (!is_name_char(peek())) return fail("expected a rule name");
            std::size_t name_at = _pos;
            std::string name = parse_name();
            skip_space(false);
            if (_src.substr(_pos, 3) != "::=") return fail("expected ::= after '" + name + "'");
            _pos += 3;
            skip_space(true);
            auto id = rule_id(name, name_at);
            if (!id) return id.err();
            if (_defined[*id]) return fail_at(name_at, "rule '" + name + "' is defined twice");
            _defined[*id] = true;
            std::vector<alternative> alts;
            ORDO_TRY(parse_alternates(alts, 0, name));
            _out.rules[*id].alts = std::move(alts);
            skip_space(false);
            if (!at_end() && peek() != '\n' && peek() != '\r') {
                return fail("unexpected '" + std::string(1, peek()) +
                            "' (a rule ends at the "
                            "end of its line outside parentheses)");
            }
        }
        for (std::size_t i = 0; i < _out.rules.size(); ++i) {
            if (!_defined[i]) {
                return fail_at(_first_use[i], "rule '" + _out.rules[i].name + "' is not defined");
            }
        }
        auto root = _ids.find("root");
        if (root == _ids.end()) return make_error("bad_grammar", "the grammar has no 'root' rule");
        _out.root = root->second;
        ORDO_TRY(check_left_recursion());
        return std::move(_out);
    }

private:
    bool at_end() const { return _pos >= _src.size(); }
    char peek() const { return _src[_pos]; }

    error fail_at(std::size_t at, const std::string& msg) const {
        std::size_t line = 1, col = 1;
        for (std::size_t i = 0; i < at && i < _src.size(); ++i) {
            if (_src[i] == '\n') {
                ++line;
                col = 1;
            } else {
                ++col;
            }
        }
        return make_error("bad_grammar", "line " + std::to_string(line) + " column " +
                                             std::to_string(col) + ": " + msg);
    }
    error fail(const std::string& msg) const { return fail_at(_pos, msg); }

    // Spaces, tabs and comments; newlines too when `newlines` (inside parentheses, between
    // rules, after ::= and |).
    void skip_space(bool newlines) {
        while (!at_end()) {
            char c = peek();
            if (c == ' ' || c == '\t' || ((c == '\n' || c == '\r') && newlines)) {
                ++_pos;
            } else if (c == '#') {
                while (!at_end() && peek() != '\n') ++_pos;
            } else {
                break;
            }
        }
    }

    std::string parse_name() {
        std::size_t start = _pos;
        while (!at_end() && is_name_char(peek())) ++_pos;
        return std::string(_src.substr(start, _pos - start));
    }

    result<std::uint32_t> rule_id(const std::string& name, std::size_t at) {
        auto it = _ids.find(name);
        if (it != _ids.end()) return it->second;
        return new_rule(name, at, true);
    }

    result<std::uint32_t> new_rule(const std::string& name, std::size_t at, bool named) {
        if (_out.rules.size() >= _out.limits.rules_max) {
            return fail_at(at, "more than " + std::to_string(_out.limits.rules_max) +
                                   " rules (repetitions and groups count as rules)");
        }
        auto id = static_cast<std::uint32_t>(_out.rules.size());
        _out.rules.push_back({name, {}});
        _defined.push_back(!named);  // helper rules are defined where they are made
        _first_use.push_back(at);
        if (named) _ids[name] = id;
        return id;
    }

    result<std::uint32_t> helper_rule(const std::string& parent, std::vector<alternative> alts) {
        auto id = new_rule(parent + "-" + std::to_string(++_helpers), _pos, false);
        if (!id) return id;
        _out.rules[*id].alts = std::move(alts);
        return id;
    }

    status count(std::size_t n) {
        _elements += n;
        if (_elements > _out.limits.elements_max) {
            return fail("more than " + std::to_string(_out.limits.elements_max) +
                        " grammar elements (after expanding repetitions)");
        }
        return {};
    }

    status parse_alternates(std::vector<alternative>& alts, std::size_t depth,
                            const std::string& rule_name) {
        alts.emplace_back();
        ORDO_TRY(parse_sequence(alts.back(), depth, rule_name));
        while (!at_end() && peek() == '|') {
            ++_pos;
            skip_space(true);
            alts.emplace_back();
            ORDO_TRY(parse_sequence(alts.back(), depth, rule_name));
        }
        return {};
    }

    status parse_sequence(alternative& seq, std::size_t depth, const std::string& rule_name) {
        for (;;) {
            skip_space(depth > 0);
            if (at_end()) return {};
            char c = peek();
            if (c == '|' || c == ')' || c == '\n' || c == '\r') return {};
            std::vector<element> atom;
            ORDO_TRY(parse_atom(atom, depth, rule_name));
            ORDO_TRY(parse_repetition(seq, std::move(atom), rule_name));
        }
    }

    result<char32_t> parse_escape() {
        // At the character after the backslash.
        if (at_end()) return fail("unfinished escape");
        char c = peek();
        ++_pos;
        switch (c) {
            case 'n':
                return U'\n';
            case 'r':
                return U'\r';
            case 't':
                return U'\t';
            case '\\':
                return U'\\';
            case '"':
                return U'"';
            case '[':
                return U'[';
            case ']':
                return U']';
            case '-':
                return U'-';
            case '^':
                return U'^';
            case 'x':
            case 'u':
            case 'U': {
                std::size_t digits = c == 'x' ? 2 : c == 'u' ? 4 : 8;
                char32_t v = 0;
                for (std::size_t i = 0; i < digits; ++i) {
                    if (at_end()) return fail("unfinished \\" + std::string(1, c) + " escape");
                    char h = peek();
                    int d = h >= '0' && h <= '9'   ? h - '0'
                            : h >= 'a' && h <= 'f' ? h - 'a' + 10
                            : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                                   : -1;
                    if (d < 0) return fail("bad hex digit in \\" + std::string(1, c) + " escape");
                    v = v * 16 + static_cast<char32_t>(d);
                    ++_pos;
                }
                if (v > code_point_max) return fail("escape past U+10FFFF");
                return v;
            }
            default:
                return fail("unknown escape \\" + std::string(1, c));
        }
    }

    // One source character of a literal or class: a UTF-8 sequence or an escape.
    result<char32_t> parse_char() {
        unsigned char b = static_cast<unsigned char>(peek());
        if (b == '\\') {
            ++_pos;
            return parse_escape();
        }
        std::size_t need = utf8_length(b);
        if (need == 0 || _pos + need > _src.size()) return fail("invalid UTF-8");
        auto v = utf8_value(_src.substr(_pos, need));
        if (!v) return fail("invalid UTF-8");
        _pos += need;
        return *v;
    }

    status parse_atom(std::vector<element>& atom, std::size_t depth, const std::string& rule_name) {
        char c = peek();
        if (c == '"') {
            ++_pos;
            while (!at_end() && peek() != '"') {
                if (peek() == '\n') return fail("newline inside a literal");
                auto ch = parse_char();
                if (!ch) return ch.err();
                element e;
                e.ranges.push_back({*ch, *ch});
                atom.push_back(std::move(e));
            }
            if (at_end()) return fail("unterminated literal");
            ++_pos;
            return count(atom.size());
        }
        if (c == '[') {
            ++_pos;
            element e;
            if (!at_end() && peek() == '^') {
                e.negated = true;
                ++_pos;
            }
            while (!at_end() && peek() != ']') {
                if (peek() == '\n') return fail("newline inside a character class");
                auto lo = parse_char();
                if (!lo) return lo.err();
                char32_t hi = *lo;
                if (_pos + 1 < _src.size() && peek() == '-' && _src[_pos + 1] != ']') {
                    ++_pos;
                    auto h = parse_char();
                    if (!h) return h.err();
                    if (*h < *lo) return fail("character range out of order");
                    hi = *h;
                }
                e.ranges.push_back({*lo, hi});
            }
            if (at_end()) return fail("unterminated character class");
            ++_pos;
            atom.push_back(std::move(e));
            return count(1);
        }
        if (c == '.') {
            ++_pos;
            element e;
            e.negated = true;  // no range excluded: any character
            atom.push_back(std::move(e));
            return count(1);
        }
        if (c == '(') {
            if (depth + 1 > _out.limits.depth_max) {
                return fail("groups nested deeper than " + std::to_string(_out.limits.depth_max));
            }
            ++_pos;
            skip_space(true);
            std::vector<alternative> alts;
            ORDO_TRY(parse_alternates(alts, depth + 1, rule_name));
            skip_space(true);
            if (at_end() || peek() != ')') return fail("expected ')'");
            ++_pos;
            auto id = helper_rule(rule_name, std::move(alts));
            if (!id) return id.err();
            atom.push_back(ref(*id));
            return count(1);
        }
        if (is_name_char(c)) {
            std::size_t at = _pos;
            std::string name = parse_name();
            auto id = rule_id(name, at);
            if (!id) return id.err();
            atom.push_back(ref(*id));
            return count(1);
        }
        return fail("unexpected '" + std::string(1, c) + "'");
    }

    static element ref(std::uint32_t id) {
        element e;
        e.k = element::kind::ref;
        e.rule = id;
        return e;
    }

    result<std::uint32_t> parse_count() {
        std::size_t start = _pos;
        std::uint64_t v = 0;
        while (!at_end() && peek() >= '0' && peek() <= '9') {
            v = v * 10 + static_cast<std::uint64_t>(peek() - '0');
            if (v > _out.limits.repeat_max) {
                return fail("repetition count above " + std::to_string(_out.limits.repeat_max));
            }
            ++_pos;
        }
        if (_pos == start) return fail("expected a number");
        return static_cast<std::uint32_t>(v);
    }

    // Appends `atom` to `seq`, repeated as a postfix operator (if any) says.
    status parse_repetition(alternative& seq, std::vector<element> atom,
                            const std::string& rule_name) {
        char c = at_end() ? '\0' : peek();
        if (c != '*' && c != '+' && c != '?' && c != '{') {
            seq.insert(seq.end(), atom.begin(), atom.end());
            return {};
        }
        std::uint32_t min = 0, max = 0;
        bool unbounded = false;
        ++_pos;
        if (c == '*') {
            unbounded = true;
        } else if (c == '+') {
            min = 1;
            unbounded = true;
        } else if (c == '?') {
            max = 1;
        } else {
            skip_space(false);
            auto m = parse_count();
            if (!m) return m.err();
            min = max = *m;
            skip_space(false);
            if (!at_end() && peek() == ',') {
                ++_pos;
                skip_space(false);
                if (!at_end() && peek() == '}') {
                    unbounded = true;
                } else {
                    auto n = parse_count();
                    if (!n) return n.err();
                    if (*n < min) return fail("repetition {m,n} with n < m");
                    max = *n;
                }
                skip_space(false);
            }
            if (at_end() || peek() != '}') return fail("expected '}'");
            ++_pos;
        }
        // A literal of several characters repeats as one unit: a rule of its own.
        element unit;
        if (atom.size() == 1) {
            unit = atom[0];
        } else {
            auto id = helper_rule(rule_name, {atom});
            if (!id) return id.err();
            unit = ref(*id);
        }
        for (std::uint32_t i = 0; i < min; ++i) seq.push_back(unit);
        ORDO_TRY(count(min));
        if (unbounded) {
            // R ::= unit R | ""
            auto id = helper_rule(rule_name, {});
            if (!id) return id.err();
            _out.rules[*id].alts = {{unit, ref(*id)}, {}};
            seq.push_back(ref(*id));
            return count(3);
        }
        // Up to max - min more: R_k ::= unit R_(k-1) | "", R_1 ::= unit | "".
        std::uint32_t optional = max - min;
        if (optional == 0) return {};
        auto last = helper_rule(rule_name, {{unit}, {}});
        if (!last) return last.err();
        for (std::uint32_t k = 1; k < optional; ++k) {
            auto next = helper_rule(rule_name, {{unit, ref(*last)}, {}});
            if (!next) return next.err();
            last = next;
            ORDO_TRY(count(2));
        }
        seq.push_back(ref(*last));
        return count(2);
    }

    // A rule that can reach itself before consuming a character would expand forever.
    status check_left_recursion() {
        const std::size_t n = _out.rules.size();
        std::vector<bool> nullable(n, false);
        for (bool changed = true; changed;) {
            changed = false;
            for (std::size_t r = 0; r < n; ++r) {
                if (nullable[r]) continue;
                for (const alternative& a : _out.rules[r].alts) {
                    bool all = std::all_of(a.begin(), a.end(), [&](const element& e) {
                        return e.k == element::kind::ref && nullable[e.rule];
                    });
                    if (all) {
                        nullable[r] = changed = true;
                        break;
                    }
                }
            }
        }
        std::vector<std::vector<std::uint32_t>> starts(n);
        for (std::size_t r = 0; r < n; ++r) {
            for (const alternative& a : _out.rules[r].alts) {
                for (const element& e : a) {
                    if (e.k != element::kind::ref) break;
                    starts[r].push_back(e.rule);
                    if (!nullable[e.rule]) break;
                }
            }
        }
        // Iterative DFS (no recursion on user-controlled depth): 0 new, 1 on path, 2 done.
        std::vector<std::uint8_t> state(n, 0);
        for (std::uint32_t s = 0; s < n; ++s) {
            if (state[s] != 0) continue;
            std::vector<std::pair<std::uint32_t, std::size_t>> path{{s, 0}};
            state[s] = 1;
            while (!path.empty()) {
                auto& [r, next] = path.back();
                if (next == starts[r].size()) {
                    state[r] = 2;
                    path.pop_back();
                    continue;
                }
                std::uint32_t t = starts[r][next++];
                if (state[t] == 1) {
                    return make_error("bad_grammar", "rule '" + visible_name(t) +
                                                         "' is left-recursive (it can reach "
                                                         "itself before matching a character)");
                }
                if (state[t] == 0) {
                    state[t] = 1;
                    path.push_back({t, 0});
                }
            }
        }
        return {};
    }

    // A helper rule's user-facing name is its parent's.
    std::string visible_name(std::uint32_t r) const {
        const std::string& name = _out.rules[r].name;
        auto dash = name.rfind('-');
        if (dash != std::string::npos && _ids.find(name) == _ids.end()) return name.substr(0, dash);
        return name;
    }

    std::string_view _src;
    std::size_t _pos = 0;
    gbnf _out;
    std::map<std::string, std::uint32_t> _ids;
    std::vector<bool> _defined;
    std::vector<std::size_t> _first_use;
    std::size_t _elements = 0;
    std::uint32_t _helpers = 0;
};

}  // namespace

result<gbnf> parse_gbnf(std::string_view source, const gbnf_limits& limits) {
    return parser(source, limits).run();
}

// ---- matcher --------------------------------------------------------------------------------

matcher::matcher(const gbnf& g) : _g(&g) {
    std::vector<stack> start;
    for (std::uint32_t a = 0; a < g.rules[g.root].alts.size(); ++a) {
        _init = expand({{g.root, a, 0}}, start);
        if (!_init) return;
    }
    _stacks = std::move(start);
    _init = normalize(_stacks);
}

const element& matcher::top_element(const stack& s) const {
    const entry& e = s.back();
    return _g->rules[e.rule].alts[e.alt][e.pos];
}

status matcher::expand(stack first, std::vector<stack>& out) const {
    const gbnf_limits& lim = _g->limits;
    std::vector<stack> work{std::move(first)};
    // Every step either ends a stack or grows the work; the grammar has no left recursion, so
    // this ends, and the bound keeps a pathological grammar from taking long doing it.
    std::size_t steps = 0;
    const std::size_t steps_max = lim.stacks_max * lim.stack_depth_max;
    while (!work.empty()) {
        if (++steps > steps_max) {
            return make_error("grammar_limit", "matching needs more than " +
                                                   std::to_string(steps_max) + " expansions");
        }
        stack s = std::move(work.back());
        work.pop_back();
        if (s.size() > lim.stack_depth_max) {
            return make_error("grammar_limit",
                              "a parse stack deeper than " + std::to_string(lim.stack_depth_max));
        }
        if (s.empty()) {
            out.push_back(std::move(s));  // the whole of root matched
            continue;
        }
        entry& top = s.back();
        const alternative& alt = _g->rules[top.rule].alts[top.alt];
        if (top.pos == alt.size()) {  // this alternative is done: back to its caller
            s.pop_back();
            work.push_back(std::move(s));
            continue;
        }
        const element& e = alt[top.pos];
        if (e.k == element::kind::chars) {
            out.push_back(std::move(s));
            continue;
        }
        // A reference: the caller resumes after it (dropped when that ends its alternative: a
        // tail call keeps x* = R ::= x R | "" from growing the stack).
        ++top.pos;
        if (top.pos == alt.size()) s.pop_back();
        for (std::uint32_t a = 0; a < _g->rules[e.rule].alts.size(); ++a) {
            stack t = s;
            t.push_back({e.rule, a, 0});
            work.push_back(std::move(t));
        }
    }
    return {};
}

status matcher::normalize(std::vector<stack>& stacks) const {
    std::sort(stacks.begin(), stacks.end());
    stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
    if (stacks.size() > _g->limits.stacks_max) {
        return make_error("grammar_limit", "more than " + std::to_string(_g->limits.stacks_max) +
                                               " parses alive at once (an ambiguous grammar)");
    }
    return {};
}

result<bool> matcher::advance(char32_t c) {
    if (!_init) return _init.err();
    std::vector<stack> next;
    for (const stack& s : _stacks) {
        if (s.empty() || !top_element(s).matches(c)) continue;
        stack t = s;
        ++t.back().pos;
        ORDO_TRY(expand(std::move(t), next));
    }
    if (next.empty()) return false;
    ORDO_TRY(normalize(next));
    _stacks = std::move(next);
    return true;
}

result<bool> matcher::advance_utf8(std::string_view bytes) {
    matcher m = *this;  // all or nothing
    for (char ch : bytes) {
        auto b = static_cast<unsigned char>(ch);
        if (m._partial.empty()) {
            m._partial_need = utf8_length(b);
            if (m._partial_need == 0) return false;
        } else if ((b & 0xC0) != 0x80) {
            return false;
        }
        m._partial.push_back(ch);
        if (m._partial.size() < m._partial_need) {
            // Inside a code point: go on only if some code point it may still become is
            // allowed (a token that ends on a lead byte the grammar can never complete would
            // otherwise be sampled into a dead end).
            if (!m.allows_partial()) return false;
            continue;
        }
        auto v = utf8_value(m._partial);
        if (!v) return false;
        m._partial.clear();
        auto ok = m.advance(*v);
        if (!ok) return ok.err();
        if (!*ok) return false;
    }
    *this = std::move(m);
    return true;
}

bool matcher::accepting() const {
    return _init.ok() && _partial.empty() &&
           std::any_of(_stacks.begin(), _stacks.end(), [](const stack& s) { return s.empty(); });
}

bool matcher::done() const {
    return accepting() &&
           std::all_of(_stacks.begin(), _stacks.end(), [](const stack& s) { return s.empty(); });
}

bool matcher::allows(char32_t c) const {
    return _init.ok() && std::any_of(_stacks.begin(), _stacks.end(), [&](const stack& s) {
               return !s.empty() && top_element(s).matches(c);
           });
}

bool matcher::allows_partial() const {
    char32_t v = static_cast<unsigned char>(_partial[0]) & utf8_lead_mask[_partial_need];
    for (std::size_t i = 1; i < _partial.size(); ++i) {
        v = (v << 6) | (static_cast<unsigned char>(_partial[i]) & 0x3F);
    }
    const auto rest = static_cast<unsigned>(6 * (_partial_need - _partial.size()));
    const char32_t lo = std::max<char32_t>(v << rest, utf8_min_of[_partial_need]);
    const char32_t hi =
        std::min<char32_t>((v << rest) | ((char32_t{1} << rest) - 1), code_point_max);
    // The code points it may still become, less the surrogates (no UTF-8 encodes them: a
    // partial "\xED\xA0" can never complete).
    auto any_allowed = [&](char32_t a, char32_t b) {
        return a <= b && std::any_of(_stacks.begin(), _stacks.end(), [&](const stack& s) {
                   return !s.empty() && top_element(s).matches_any(a, b);
               });
    };
    return _init.ok() && (any_allowed(lo, std::min<char32_t>(hi, surrogate_first - 1)) ||
                          any_allowed(std::max<char32_t>(lo, surrogate_last + 1), hi));
}

bool matcher::allows_byte(unsigned char b) const {
    if (!_partial.empty()) return (b & 0xC0) == 0x80;
    if (b < 0x80) return allows(b);
    return utf8_length(b) != 0;
}

std::string matcher::state_key() const {
    std::string key;
    auto put = [&](std::uint32_t v) { key.append(reinterpret_cast<const char*>(&v), sizeof v); };
    put(static_cast<std::uint32_t>(_partial.size()));
    key += _partial;
    for (const stack& s : _stacks) {
        put(static_cast<std::uint32_t>(s.size()));
        for (const entry& e : s) {
            put(e.rule);
            put(e.alt);
            put(e.pos);
        }
    }
    return key;
}

}  // namespace ordo::grammar
