// drafter.hpp: where speculative decoding's drafts come from (docs/speculative.md). Pure
// functions of a sequence's tokens; the scheduler verifies what they propose.
//
// Prompt lookup (ngram_draft): the tokens that followed the latest earlier occurrence of the
// sequence's last n tokens, for n from ngram_max down to ngram_min (the longest match wins; of
// equal length, the latest). Output that repeats its input (a code edit, a quote, a summary,
// an answer from retrieved text) is drafted right; elsewhere usually nothing matches and the
// sequence decodes as without speculation.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace ordo::sched {

// How far back prompt lookup searches, in tokens: its cost per step is at most this many
// comparisons per n-gram length, whatever the context.
inline constexpr uint32_t ngram_window_max = 1u << 16;

struct ngram_options {
    uint32_t ngram_min = 2;
    uint32_t ngram_max = 4;
    uint32_t window = ngram_window_max;  // tokens searched back from the end, at most
};

// Up to `max` drafted tokens to follow `tokens` (empty when no suffix of ngram_min..ngram_max
// tokens occurs earlier, or max is 0). Never proposes past the end of `tokens`: a match's
// continuation stops where the sequence does.
std::vector<int32_t> ngram_draft(std::span<const int32_t> tokens, uint32_t max,
                                 const ngram_options& o);

}  // namespace ordo::sched
