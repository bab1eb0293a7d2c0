// drafter.cpp: prompt lookup (drafter.hpp).
#include "scheduler/drafter.hpp"

#include <algorithm>
#include <cstddef>

namespace ordo::sched {

std::vector<int32_t> ngram_draft(std::span<const int32_t> tokens, uint32_t max,
                                 const ngram_options& o) {
    const size_t len = tokens.size();
    if (max == 0 || o.ngram_min == 0 || len < size_t(o.ngram_min) + 1) return {};
    // The earliest start a match may have: the window back from the end.
    const size_t lowest = len > o.window ? len - o.window : 0;
    for (size_t n = std::min<size_t>(o.ngram_max, len - 1); n >= o.ngram_min; n--) {
        const auto suffix = tokens.subspan(len - n);
        // Latest first: an occurrence starting at i, ending before the suffix itself starts
        // over (i + n < len, so at least one token follows it).
        for (size_t i = len - n; i-- > lowest;) {
            if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + long(i))) continue;
            const size_t from = i + n;
            const size_t count = std::min<size_t>(max, len - from);
            return {tokens.begin() + long(from), tokens.begin() + long(from + count)};
        }
        if (n == 1) break;
    }
    return {};
}

}  // namespace ordo::sched
