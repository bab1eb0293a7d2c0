// stop_matcher_test.cpp: stop strings across token boundaries (scheduler/stop_matcher.hpp).
//
// Checks: a stop string inside one piece, across 2 and across 3 pieces ends generation and
// releases exactly the text before it; a partial match followed by a mismatch releases the
// held text; with several stop strings the earliest match wins and is reported; a UTF-8
// character is never split between releases (cut mid-character by the pieces, or by a stop
// string's prefix); finish() releases what is held; bad stop lists are refused naming "stop".
// A seeded randomized check feeds texts in random pieces and compares the concatenated
// output with a direct search of the whole text.
#include "scheduler/stop_matcher.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "scheduler/prng.hpp"

namespace {

using namespace ordo::sched;

stop_matcher make(std::vector<std::string> stops) {
    auto m = stop_matcher::create(std::move(stops));
    EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.err().message);
    return std::move(*m);
}

// Feeds the pieces; returns each release, and whether/which stop ended it.
struct run_result {
    std::vector<std::string> released;
    bool stopped = false;
    int32_t stop_index = -1;
    std::string all() const {
        std::string s;
        for (const auto& r : released) s += r;
        return s;
    }
};

run_result run(stop_matcher& m, const std::vector<std::string>& pieces, bool finish = true) {
    run_result r;
    for (const auto& p : pieces) {
        auto out = m.feed(p);
        r.released.push_back(out.text);
        if (out.stopped) {
            r.stopped = true;
            r.stop_index = out.stop_index;
            break;
        }
    }
    if (finish && !r.stopped) r.released.push_back(m.finish());
    return r;
}

TEST(stop_matcher, stop_inside_one_piece) {
    auto m = make({"END"});
    auto r = run(m, {"abc", "dENDxyz", "more"});
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.stop_index, 0);
    EXPECT_EQ(r.all(), "abcd");
    EXPECT_TRUE(m.stopped());
    EXPECT_EQ(m.feed("late").text, "");
}

TEST(stop_matcher, stop_across_two_pieces_is_held_then_cut) {
    auto m = make({"</s>"});
    auto out = m.feed("hello </");
    EXPECT_EQ(out.text, "hello ");  // "</" could start the stop string
    EXPECT_FALSE(out.stopped);
    out = m.feed("s> tail");
    EXPECT_TRUE(out.stopped);
    EXPECT_EQ(out.text, "");
}

TEST(stop_matcher, stop_across_three_pieces) {
    auto m = make({"STOPNOW"});
    auto r = run(m, {"x ST", "OP", "NOW y"});
    EXPECT_TRUE(r.stopped);
    ASSERT_EQ(r.released.size(), 3u);
    EXPECT_EQ(r.released[0], "x ");
    EXPECT_EQ(r.released[1], "");
    EXPECT_EQ(r.released[2], "");
}

TEST(stop_matcher, partial_match_then_mismatch_releases_text) {
    auto m = make({"</s>"});
    auto out = m.feed("a</");
    EXPECT_EQ(out.text, "a");
    EXPECT_EQ(m.held_bytes(), 2u);
    out = m.feed("b>");
    EXPECT_FALSE(out.stopped);
    EXPECT_EQ(out.text, "</b>");
    EXPECT_EQ(m.held_bytes(), 0u);
    // A new partial match at the very end is held again; finish releases it.
    EXPECT_EQ(m.feed("c<").text, "c");
    EXPECT_EQ(m.finish(), "<");
}

TEST(stop_matcher, several_stop_strings_earliest_wins) {
    auto m = make({"foo", "bar", "ba"});
    auto r = run(m, {"xx", "barfoo"});
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.stop_index, 1);  // "bar" and "ba" both at 2: the first listed
    EXPECT_EQ(r.all(), "xx");
    auto m2 = make({"foo", "bar"});
    auto r2 = run(m2, {"1fo", "2bar", "foo"});
    EXPECT_EQ(r2.stop_index, 1);
    EXPECT_EQ(r2.all(), "1fo2");
}

TEST(stop_matcher, utf8_is_never_split) {
    // "é" is C3 A9; the pieces cut it in the middle.
    auto m = make({"zz"});
    auto out = m.feed("caf\xC3");
    EXPECT_EQ(out.text, "caf");
    out = m.feed("\xA9 \xE2\x82");  // "é " then the first two bytes of "€"
    EXPECT_EQ(out.text, "\xC3\xA9 ");
    out = m.feed("\xAC!");
    EXPECT_EQ(out.text, "\xE2\x82\xAC!");
    // A stop string starting with a multi-byte character: its prefix is held whole.
    auto m2 = make({"\xC3\xA9!"});  // "é!"
    EXPECT_EQ(m2.feed("ab\xC3").text, "ab");
    EXPECT_EQ(m2.feed("\xA9").text, "");
    auto end = m2.feed("!");
    EXPECT_TRUE(end.stopped);
    auto m3 = make({"\xC3\xA9!"});
    EXPECT_EQ(m3.feed("ab\xC3\xA9").text, "ab");
    EXPECT_EQ(m3.feed("?").text, "\xC3\xA9?");
}

TEST(stop_matcher, finish_releases_everything_held) {
    auto m = make({"END"});
    EXPECT_EQ(m.feed("abcEN").text, "abc");
    EXPECT_EQ(m.finish(), "EN");
    EXPECT_EQ(m.finish(), "");
    auto none = make({});
    EXPECT_EQ(none.feed("anything").text, "anything");
}

TEST(stop_matcher, bad_stop_lists_are_refused) {
    std::vector<std::string> too_many(stop_strings_max + 1, "x");
    const std::vector<std::vector<std::string>> bad = {
        too_many,         {"ok", ""}, {std::string(stop_string_bytes_max + 1, 'a')},
        {"\xC3"},          // truncated character
        {"\xED\xA0\x80"},  // a UTF-16 surrogate
    };
    for (const auto& stops : bad) {
        auto m = stop_matcher::create(stops);
        ASSERT_FALSE(m.ok());
        EXPECT_EQ(m.err().code, "bad_request");
        EXPECT_NE(m.err().message.find("\"stop\""), std::string::npos) << m.err().message;
    }
    EXPECT_TRUE(stop_matcher::create({std::string(stop_string_bytes_max, 'a')}).ok());
    EXPECT_TRUE(stop_matcher::create(std::vector<std::string>(stop_strings_max, "x")).ok());
}

// Random texts over a small alphabet (so stop strings occur), cut into random pieces: the
// released text is the text before the first occurrence of any stop string, whatever the cuts.
TEST(stop_matcher, randomized_pieces_match_direct_search) {
    const std::string alphabet[] = {"a", "b", "c", "\xC3\xA9", "\xE2\x82\xAC"};
    const std::vector<std::string> stops = {"abc", "\xC3\xA9\xC3\xA9", "cba", "bb\xE2\x82\xAC"};
    ordo::sched::xoshiro256ss rng(77);
    int stopped_runs = 0;
    for (int iter = 0; iter < 500; iter++) {
        std::string text;
        const size_t n_chars = 1 + rng.next() % 30;
        for (size_t i = 0; i < n_chars; i++) text += alphabet[rng.next() % 5];
        size_t first = std::string::npos;
        for (const auto& s : stops) first = std::min(first, text.find(s));
        const std::string expected = first == std::string::npos ? text : text.substr(0, first);

        auto m = make(stops);
        std::string got;
        bool stopped = false;
        for (size_t at = 0; at < text.size() && !stopped;) {
            const size_t len = std::min(text.size() - at, size_t{1 + rng.next() % 5});
            auto out = m.feed(std::string_view(text).substr(at, len));
            EXPECT_TRUE(is_valid_utf8(out.text)) << "released a split character";
            got += out.text;
            stopped = out.stopped;
            at += len;
        }
        if (!stopped) got += m.finish();
        EXPECT_EQ(stopped, first != std::string::npos) << text;
        EXPECT_EQ(got, expected) << text;
        stopped_runs += stopped;
    }
    EXPECT_GT(stopped_runs, 50);
    EXPECT_LT(stopped_runs, 480);
}

}  // namespace
