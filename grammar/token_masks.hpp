// token_masks.hpp: which tokens a grammar allows next (issue 31). A vocabulary's pieces (the
// bytes each token id decodes to) go into a byte trie once; the mask for a matcher's state is a
// depth-first walk of the trie that advances a copy of the matcher byte by byte and skips a
// whole subtree as soon as the grammar refuses its prefix, so the cost follows the tokens the
// grammar keeps alive, not the vocabulary. Masks are cached per matcher state (state_key): in
// the long runs of a JSON string or number the state repeats token after token.
//
// A token is allowed when its bytes keep the grammar alive (it may end inside a code point or
// complete the grammar). Tokens with no bytes (control tokens, end of generation) are never
// allowed here: the sampler allows end of generation itself when the matcher is accepting.
// Immutable after construction: one trie serves every request of a model, from any thread;
// a token_masks cache belongs to one request.
#pragma once

#include <array>
#include <cstdint>
#include <list>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "actors/runtime/result.hpp"
#include "grammar/gbnf.hpp"

namespace ordo::grammar {

class vocab_trie {
public:
    // pieces[i]: token i's bytes ("" for a token that never appears in generated text).
    explicit vocab_trie(std::span<const std::string> pieces);

    std::size_t n_tokens() const { return _n_tokens; }
    std::size_t n_nodes() const { return _nodes.size(); }

private:
    friend class token_masks;
    struct node {
        std::vector<std::pair<unsigned char, std::uint32_t>> next;  // sorted by byte
        std::vector<std::int32_t> ends;                             // tokens whose bytes end here
    };
    std::vector<node> _nodes;  // 0 is the root
    std::size_t _n_tokens = 0;
};

// Per-request: the allowed-token mask of a matcher state, cached.
//
// The walk follows the trie through a byte automaton built lazily from the matcher: each
// distinct matcher state (state_key) it reaches gets an id, and (state, byte) -> state once
// computed is a table lookup. Inside a JSON string, say, almost every byte leads back to the
// same state, so a walk of the whole vocabulary costs one lookup per trie edge instead of a
// matcher copy and advance per edge. The automaton lives as long as the request (its states
// recur across steps) and is bounded: past automaton_states_max it is dropped and that mask is
// computed by advancing matcher copies, as without it.
class token_masks {
public:
    // Masks kept per request (a state past them evicts the least recently used): a byte per
    // token each, so 8 MiB for a 128k vocabulary at most.
    static constexpr std::size_t cache_entries_max = 64;
    // Automaton states kept per request (each a matcher and a 1 KiB row: ~8 MiB at most).
    static constexpr std::size_t automaton_states_max = 4096;

    // `states_max`: the automaton's bound (tests make it small to exercise the fallback).
    explicit token_masks(const vocab_trie& trie, std::size_t states_max = automaton_states_max)
        : _trie(&trie), _states_max(states_max) {}

    // mask[t] != 0: token t may come next after `m`'s prefix. Errors are the matcher's limits.
    result<const std::vector<std::uint8_t>*> allowed(const matcher& m);

    std::size_t hits() const { return _hits; }
    std::size_t misses() const { return _misses; }

private:
    // The trie walk from `root`: step(state, byte) gives the state after the byte, nothing
    // when the grammar refuses it (the subtree is skipped), or an error that ends the walk.
    template <typename State, typename Step>
    status walk(State root, Step&& step, std::vector<std::uint8_t>& mask) const;
    // The automaton's walk; false when it outgrew automaton_states_max (mask incomplete).
    result<bool> compute_automaton(const matcher& m, std::vector<std::uint8_t>& mask);
    // The walk without the automaton: a matcher copy advanced per trie edge.
    status compute_direct(const matcher& m, std::vector<std::uint8_t>& mask) const;
    // The id of `m`'s state (added when new), or -1 when the automaton is full.
    std::int32_t intern(const matcher& m);
    // The state after byte b from state s: an id, dead (-1), or full (-2). Errors: the
    // matcher's limits.
    result<std::int32_t> step(std::int32_t s, unsigned char b);

    static constexpr std::int32_t k_unknown = -3, k_full = -2, k_dead = -1;
    struct automaton_state {
        matcher m;
        std::array<std::int32_t, 256> next;  // k_unknown until computed
    };

    const vocab_trie* _trie;
    std::size_t _states_max;
    std::vector<automaton_state> _states;
    std::unordered_map<std::string, std::int32_t> _state_ids;
    std::list<std::pair<std::string, std::vector<std::uint8_t>>> _lru;  // most recent first
    std::unordered_map<std::string, decltype(_lru)::iterator> _index;
    std::size_t _hits = 0, _misses = 0;
};

}  // namespace ordo::grammar
