// drafter_test.cpp: prompt lookup (scheduler/drafter.hpp): the longest suffix from ngram_max
// down to ngram_min wins, of equal length the latest earlier occurrence; a draft never runs past
// the sequence's end and never exceeds `max`; nothing is drafted when nothing matches, when the
// sequence is too short, or when max is 0; the search window bounds how far back it looks.
#include "scheduler/drafter.hpp"

#include <gtest/gtest.h>

namespace {

using ordo::sched::ngram_draft;
using ordo::sched::ngram_options;
using v = std::vector<int32_t>;

TEST(ngram_draft, the_latest_occurrence_of_the_longest_suffix_wins) {
    // Suffix (7 8) occurs at 1 (followed by 9 9) and at 5 (followed by 3 4): the latest wins.
    const v t = {0, 7, 8, 9, 9, 7, 8, 3, 4, 7, 8};
    EXPECT_EQ(ngram_draft(t, 2, {2, 2}), (v{3, 4}));
    // With n up to 3, (4 7 8) occurs nowhere earlier, so (7 8) decides as above.
    EXPECT_EQ(ngram_draft(t, 2, {2, 3}), (v{3, 4}));
    // A longer match beats a later shorter one: (1 2 3) at 0 against (2 3) at 5.
    const v u = {1, 2, 3, 5, 6, 2, 3, 9, 1, 2, 3};
    EXPECT_EQ(ngram_draft(u, 2, {2, 3}), (v{5, 6}));
    EXPECT_EQ(ngram_draft(u, 2, {2, 2}), (v{9, 1}));
}

TEST(ngram_draft, drafts_stop_at_the_end_and_at_max) {
    const v t = {5, 6, 7, 5, 6};
    // (5 6) at 0 is followed by 7 5 6 and then the sequence ends.
    EXPECT_EQ(ngram_draft(t, 8, {2, 2}), (v{7, 5, 6}));
    EXPECT_EQ(ngram_draft(t, 1, {2, 2}), (v{7}));
    EXPECT_TRUE(ngram_draft(t, 0, {2, 2}).empty());
    // A run of one token: (4 4) matches at the latest place with a token after it.
    EXPECT_EQ(ngram_draft(v{4, 4, 4, 4}, 3, {2, 2}), (v{4}));
}

TEST(ngram_draft, nothing_matches_nothing_is_drafted) {
    EXPECT_TRUE(ngram_draft(v{1, 2, 3, 4, 5}, 4, {1, 3}).empty());
    EXPECT_TRUE(ngram_draft(v{}, 4, {1, 3}).empty());
    EXPECT_TRUE(ngram_draft(v{1}, 4, {1, 3}).empty());
    EXPECT_TRUE(ngram_draft(v{1, 1}, 4, {2, 3}).empty());  // too short for n = 2 plus a follower
    EXPECT_EQ(ngram_draft(v{1, 1}, 4, {1, 3}), (v{1}));
}

TEST(ngram_draft, the_window_bounds_the_search) {
    v t = {1, 2, 42};
    for (int i = 0; i < 100; i++) t.push_back(1000 + i);
    t.push_back(1), t.push_back(2);
    EXPECT_EQ(ngram_draft(t, 1, {2, 2}), (v{42}));
    ngram_options near{2, 2, 50};
    EXPECT_TRUE(ngram_draft(t, 1, near).empty());
}

}  // namespace
