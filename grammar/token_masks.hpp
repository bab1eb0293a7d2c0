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
class token_masks {
public:
    // Masks kept per request (a state past them evicts the least recently used).
    static constexpr std::size_t cache_entries_max = 256;

    explicit token_masks(const vocab_trie& trie) : _trie(&trie) {}

    // mask[t] != 0: token t may come next after `m`'s prefix. Errors are the matcher's limits.
    result<const std::vector<std::uint8_t>*> allowed(const matcher& m);

    std::size_t hits() const { return _hits; }
    std::size_t misses() const { return _misses; }

private:
    status compute(const matcher& m, std::vector<std::uint8_t>& mask) const;

    const vocab_trie* _trie;
    std::list<std::pair<std::string, std::vector<std::uint8_t>>> _lru;  // most recent first
    std::unordered_map<std::string, decltype(_lru)::iterator> _index;
    std::size_t _hits = 0, _misses = 0;
};

}  // namespace ordo::grammar
