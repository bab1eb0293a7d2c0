// test_token_masks.cpp: grammar/token_masks.hpp. Checks that the allowed-token mask of a
// matcher state holds exactly the tokens whose bytes keep the grammar alive: against a brute
// force (every token tried on a copy of the matcher) over a vocabulary with multi-byte pieces,
// pieces that split a code point, pieces that complete the grammar and empty (control) pieces,
// at every prefix of a JSON document, through the byte automaton and through its fallback when
// it outgrows its bound; that masks are cached per state (a repeated state is a hit and returns
// the same mask); and that the cache stays within cache_entries_max.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "grammar/gbnf.hpp"
#include "grammar/token_masks.hpp"

namespace ordo::grammar {
namespace {

const char* json_object = R"(root ::= "{" ws (pair ("," ws pair)*)? "}"
pair ::= str ":" ws val ws
val ::= str | [0-9]+ | "true" | "false"
str ::= "\"" [^"\\]* "\""
ws ::= " "?
)";

std::vector<std::string> test_vocab() {
    std::vector<std::string> v = {"",
                                  "{",
                                  "}",
                                  "\"",
                                  ":",
                                  ",",
                                  " ",
                                  "a",
                                  "ab",
                                  "\"a",
                                  "a\"",
                                  "\":",
                                  "{\"",
                                  "\"}",
                                  "1",
                                  "12",
                                  "true",
                                  "tru",
                                  "false",
                                  "x",
                                  "\xE2\x82",
                                  "\xAC",
                                  "\xE2\x82\xAC",
                                  "\xC3\xA9\"",
                                  "}}",
                                  "\\"};
    // Every printable ASCII byte alone, so no state runs out of tokens.
    for (char c = 32; c < 127; ++c) v.push_back(std::string(1, c));
    return v;
}

std::vector<std::uint8_t> brute_force(const matcher& m, const std::vector<std::string>& vocab) {
    std::vector<std::uint8_t> mask(vocab.size(), 0);
    for (std::size_t t = 0; t < vocab.size(); ++t) {
        if (vocab[t].empty()) continue;
        matcher copy = m;
        auto ok = copy.advance_utf8(vocab[t]);
        EXPECT_TRUE(ok.ok());
        mask[t] = ok.ok() && *ok ? 1 : 0;
    }
    return mask;
}

TEST(token_masks, mask_equals_brute_force_at_every_prefix) {
    auto g = parse_gbnf(json_object);
    ASSERT_TRUE(g.ok()) << g.err().message;
    auto vocab = test_vocab();
    vocab_trie trie(vocab);
    // The automaton at its bound, and so small that walks outgrow it and fall back (1: every
    // walk; 6: some).
    for (std::size_t states : {token_masks::automaton_states_max, std::size_t{6}, std::size_t{1}}) {
        SCOPED_TRACE("automaton states " + std::to_string(states));
        token_masks masks(trie, states);
        matcher m(*g);
        const std::string doc = "{\"a\xE2\x82\xAC\": 12, \"\xC3\xA9\":true}";
        for (std::size_t i = 0; i <= doc.size(); ++i) {
            SCOPED_TRACE("after " + std::to_string(i) + " bytes");
            auto got = masks.allowed(m);
            ASSERT_TRUE(got.ok()) << got.err().message;
            EXPECT_EQ(**got, brute_force(m, vocab));
            EXPECT_EQ((**got)[0], 0) << "an empty piece is never allowed";
            if (i == doc.size()) break;
            auto ok = m.advance_utf8(doc.substr(i, 1));
            ASSERT_TRUE(ok.ok() && *ok) << "byte " << i;
        }
        EXPECT_TRUE(m.accepting());
    }
}

TEST(token_masks, masks_are_cached_per_state) {
    auto g = parse_gbnf(json_object);
    ASSERT_TRUE(g.ok());
    auto vocab = test_vocab();
    vocab_trie trie(vocab);
    token_masks masks(trie);
    matcher m(*g);
    ASSERT_TRUE(*m.advance_utf8("{\"a"));
    auto first = masks.allowed(m);
    ASSERT_TRUE(first.ok());
    std::vector<std::uint8_t> copy = **first;
    // Inside the string the state repeats: the next letters hit the cache.
    ASSERT_TRUE(*m.advance_utf8("b"));
    auto second = masks.allowed(m);
    ASSERT_TRUE(second.ok());
    EXPECT_EQ(masks.misses(), 1u);
    EXPECT_EQ(masks.hits(), 1u);
    EXPECT_EQ(**second, copy);
}

TEST(token_masks, cache_is_bounded) {
    // A grammar whose state differs after every character: digits counted up to a bound.
    gbnf_limits limits;
    limits.repeat_max = 300;
    limits.elements_max = 1000;
    auto g = parse_gbnf("root ::= [0-9]{0,300}\n", limits);
    ASSERT_TRUE(g.ok()) << g.err().message;
    std::vector<std::string> vocab = {"0", "1", "12"};
    vocab_trie trie(vocab);
    token_masks masks(trie);
    matcher m(*g);
    for (std::size_t i = 0; i < token_masks::cache_entries_max + 10; ++i) {
        auto got = masks.allowed(m);
        ASSERT_TRUE(got.ok());
        EXPECT_EQ(**got, brute_force(m, vocab)) << i;
        ASSERT_TRUE(*m.advance(U'1'));
    }
    EXPECT_EQ(masks.misses(), token_masks::cache_entries_max + 10);
    // The digit bound: with 299 digits "12" no longer fits, with 300 nothing does.
    for (int i = 0; i < 300; ++i) {  // bounded: 300 digits at most
        auto got = masks.allowed(m);
        ASSERT_TRUE(got.ok());
        if ((**got)[2] == 0) break;
        ASSERT_TRUE(*m.advance(U'1'));
    }
    auto one_left = masks.allowed(m);
    ASSERT_TRUE(one_left.ok());
    EXPECT_EQ(**one_left, (std::vector<std::uint8_t>{1, 1, 0}));
    ASSERT_TRUE(*m.advance(U'0'));
    auto at_end = masks.allowed(m);
    ASSERT_TRUE(at_end.ok());
    EXPECT_EQ(**at_end, (std::vector<std::uint8_t>{0, 0, 0}));
    EXPECT_TRUE(m.done());
}

}  // namespace
}  // namespace ordo::grammar
