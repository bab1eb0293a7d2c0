// gbnf.hpp: GBNF grammars (llama.cpp's notation, so users can bring the grammars they have) and
// the matcher that says which code points may come next (issue 31: grammar-constrained
// sampling; the token masks and the sampler's use build on this). Pure logic: no actors, no
// I/O; any thread, one matcher per request.
//
// Notation (docs/grammar.md):
//   name ::= alternatives        a rule; `root` is where matching starts
//   a b                          sequence
//   a | b                        alternatives
//   "text"                       literal (escapes \n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH)
//   [a-z0-9_] [^"\\]             character class, negated with ^
//   .                            any character
//   ( ... )                      group (newlines allowed inside)
//   x* x+ x? x{m} x{m,} x{m,n}   repetition
//   # ...                        comment to the end of the line
// A rule ends at a newline outside parentheses (after `::=` the definition may start on the
// next line). Every referenced rule must be defined, `root` must exist, and no rule may reach
// itself before consuming a character (left recursion): all refused at parse with line:column.
//
// Everything is bounded by named limits (gbnf_limits): source bytes, rules (after expanding
// repetitions), elements, nesting depth, repetition counts, and at match time the number of
// live parse stacks and their depth. A grammar or an input past a limit is an error naming it,
// never unbounded work.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "actors/runtime/result.hpp"

namespace ordo::grammar {

struct gbnf_limits {
    std::size_t source_bytes_max = 64 * 1024;
    std::size_t rules_max = 1024;          // after expanding repetitions into helper rules
    std::size_t elements_max = 16 * 1024;  // terminals and references over all rules
    std::size_t depth_max = 64;            // nested groups
    std::uint32_t repeat_max = 256;        // m and n of x{m,n}
    std::size_t stacks_max = 1024;         // live parse stacks while matching
    std::size_t stack_depth_max = 512;     // entries of one parse stack
};

// One element of an alternative: a terminal (a set of code-point ranges, negated or not) or a
// reference to a rule.
struct element {
    enum class kind : std::uint8_t { chars, ref };
    kind k = kind::chars;
    bool negated = false;
    std::vector<std::pair<char32_t, char32_t>> ranges;  // inclusive; chars only
    std::uint32_t rule = 0;                             // ref only

    bool matches(char32_t c) const;
    // Whether some code point of [lo, hi] matches.
    bool matches_any(char32_t lo, char32_t hi) const;
};

using alternative = std::vector<element>;  // empty: matches the empty string

struct rule {
    std::string name;  // helper rules of repetitions: "<parent>-<n>"
    std::vector<alternative> alts;
};

struct gbnf {
    std::vector<rule> rules;
    std::uint32_t root = 0;
    gbnf_limits limits;
};

// Parses and checks a grammar. Errors (code "bad_grammar") name the line and column, or the
// limit that was exceeded.
result<gbnf> parse_gbnf(std::string_view source, const gbnf_limits& limits = {});

// Which code points may come next after a prefix, and whether the prefix is a whole sentence of
// the grammar. Copyable (a sampler may try a token on a copy); advancing is all-or-nothing.
class matcher {
public:
    explicit matcher(const gbnf& g);

    // Consumes one code point. False (and the matcher unchanged) when the grammar does not allow
    // it here; an error when matching would exceed stacks_max or stack_depth_max.
    result<bool> advance(char32_t c);
    // Consumes UTF-8 bytes, which may end inside a code point (a token that splits one): the
    // partial sequence is kept for the next call. False (unchanged) on a byte the grammar or
    // UTF-8 does not allow, or that starts or continues a code point no allowed one begins
    // with.
    result<bool> advance_utf8(std::string_view bytes);

    // The prefix so far is a complete match of root (no partial UTF-8 pending).
    bool accepting() const;
    // Nothing more can follow: accepting and no stack wants another character.
    bool done() const;
    // Whether `c` could come next (without consuming it).
    bool allows(char32_t c) const;
    // Whether a byte could come next: an ASCII byte the grammar allows, or a byte that starts
    // or continues a UTF-8 sequence (the code point is checked once it is complete).
    bool allows_byte(unsigned char b) const;
    // The matcher's whole state as bytes: two matchers with equal keys allow the same futures
    // (token_masks caches masks by it).
    std::string state_key() const;

private:
    struct entry {
        std::uint32_t rule, alt, pos;
        auto operator<=>(const entry&) const = default;
    };
    using stack = std::vector<entry>;

    // Expands `s` until its top is a terminal (or it is empty: accepted), appending every
    // resulting stack to `out`.
    status expand(stack s, std::vector<stack>& out) const;
    const element& top_element(const stack& s) const;
    // The pending partial UTF-8 sequence can still become a code point some stack allows.
    bool allows_partial() const;
    status normalize(std::vector<stack>& stacks) const;

    const gbnf* _g;
    std::vector<stack> _stacks;  // sorted, unique
    status _init;
    // UTF-8 bytes of a code point not yet complete, and how many it needs in all.
    std::string _partial;
    std::size_t _partial_need = 0;
};

}  // namespace ordo::grammar
