// grammar_constraint.hpp: one request's grammar (issue 31, docs/grammar.md), turned into the
// sampler's allowed-token mask at each step and advanced by each sampled token. Pure,
// actor-free; owned by the scheduler's request state.
//
// The vocabulary side (grammar_vocab) is built once per model, on the first request with a
// grammar: every token's bytes in a trie (grammar/token_masks.hpp) and the end-of-generation
// ids. A token is allowed when its bytes keep the grammar alive, end of generation when what
// was generated is a whole sentence of the grammar; once the grammar can take nothing more
// (done) the scheduler ends the answer (reason "stop") without sampling again. A state where
// the grammar wants more but no token of the vocabulary gives it is a dead end: an error
// naming it, not a token outside the grammar.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "actors/runtime/result.hpp"
#include "grammar/gbnf.hpp"
#include "grammar/token_masks.hpp"

namespace ordo::sched {

// Greedy decoding under a grammar checks this many of its best tokens one by one before it
// computes the mask of the whole vocabulary (a check is one matcher copy; a mask a walk of
// every token's bytes).
inline constexpr uint32_t grammar_greedy_checks_max = 32;

// A lazy grammar's triggers (generate_request::grammar_triggers): how many, how long each.
inline constexpr size_t grammar_triggers_max = 16;
inline constexpr size_t grammar_trigger_bytes_max = 64;

struct grammar_vocab {
    // pieces[t]: token t's bytes in generated text ("" for control tokens: never allowed by
    // the trie); eog: the ids that end generation.
    // (`pieces` is kept: the trie is built from it first, as the members are declared.)
    grammar_vocab(std::vector<std::string> pieces, std::vector<int32_t> eog);

    grammar::vocab_trie trie;
    std::vector<int32_t> eog;
    std::vector<std::string> pieces;  // for one token's check (grammar_constraint::allows)
};

class grammar_constraint {
public:
    // Parses `source` (GBNF). Errors: "bad_grammar" naming the line and column or the limit.
    // With `triggers` the grammar is lazy: it holds from where one of them first appears in
    // the output (a trigger beginning with '^' only where the output begins, after
    // whitespace); before that every token is allowed. Where the text from a trigger on is not
    // a start of the grammar's sentences, the trigger is passed over and the output stays free.
    static result<grammar_constraint> create(std::string_view source, const grammar_vocab& vocab,
                                             std::vector<std::string> triggers = {});

    // The mask for the next token (one entry per token of the vocabulary). Errors: the
    // matcher's limits, or "grammar_dead_end".
    result<std::span<const uint8_t>> allowed();
    // Whether one token may come next, as allowed() would say (a matcher limit: false; the
    // mask then names it). Cheap: one copy of the matcher, not a walk of the vocabulary.
    bool allows(int32_t token) const;
    // Advances past a sampled token by its bytes as the vocabulary gives them (pieces; an
    // end-of-generation token advances nothing). Error: the token was not allowed (a bug: the
    // sampler was given the mask or the check).
    status accept(int32_t token);
    // The output is a whole sentence and the grammar can take nothing more: the answer ends.
    bool done() const { return _active && _m.done(); }
    // Whether the grammar holds (a lazy one once triggered).
    bool active() const { return _active; }

private:
    grammar_constraint(std::unique_ptr<grammar::gbnf> g, const grammar_vocab& vocab,
                       std::vector<std::string> triggers);
    // A lazy grammar before its trigger: looks for one in the output with `piece` added.
    void watch(std::string_view piece);

    std::unique_ptr<grammar::gbnf> _g;  // the matcher points into it: kept in place
    const grammar_vocab* _vocab;
    grammar::matcher _m;
    grammar::token_masks _masks;
    std::vector<uint8_t> _mask;  // the cached mask plus end of generation, per call
    // A lazy grammar: its triggers (anywhere; at the start, '^' dropped), the output's last
    // bytes (as long as a trigger, less one) and its first non-whitespace bytes while a start
    // trigger may still match.
    std::vector<std::string> _anywhere, _at_start;
    std::string _recent, _start;
    bool _active = true;
};

}  // namespace ordo::sched
