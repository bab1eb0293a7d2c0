// test_gbnf.cpp: GBNF grammars (grammar/gbnf.hpp). Checks that
// * the notation parses: literals with every escape, classes (ranges, negation, escapes), '.',
//   groups across lines, alternatives, * + ? {m} {m,} {m,n}, comments, rules referenced before
//   their definition, a definition starting on the line after ::=;
// * the matcher accepts exactly the sentences of the grammar: a JSON grammar in llama.cpp's
//   style against valid and invalid documents, bounded repetitions at their edges, UTF-8 input
//   split inside a code point (as tokens split it), a partial code point refused when no
//   allowed code point begins with it, and `allows` / `accepting` / `done`;
// * a failed advance leaves the matcher unchanged (a sampler tries tokens on it);
// * every bad grammar is an error naming line and column (undefined and twice-defined rules,
//   no root, left recursion direct and through a nullable prefix, unterminated literals and
//   classes, bad escapes, stray characters) and every limit (source size, rules, elements,
//   nesting, repetition counts, live stacks) is an error, never unbounded work.
#include <gtest/gtest.h>

#include <string>

#include "grammar/gbnf.hpp"

namespace ordo::grammar {
namespace {

gbnf must_parse(std::string_view src) {
    auto g = parse_gbnf(src);
    EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.err().message);
    return g.ok() ? std::move(*g) : gbnf{};
}

// Whether the whole of `text` (UTF-8) is a sentence of `g`.
bool matches(const gbnf& g, std::string_view text) {
    matcher m(g);
    auto ok = m.advance_utf8(text);
    EXPECT_TRUE(ok.ok()) << (ok.ok() ? "" : ok.err().message);
    return ok.ok() && *ok && m.accepting();
}

std::string error_of(std::string_view src, const gbnf_limits& limits = {}) {
    auto g = parse_gbnf(src, limits);
    return g.ok() ? std::string("(parsed)") : g.err().message;
}

const char* json_grammar = R"(# JSON, in the style of llama.cpp's grammars/json.gbnf
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
)";

TEST(gbnf, json_grammar_accepts_json_and_rejects_the_rest) {
    gbnf g = must_parse(json_grammar);
    for (const char* ok : {R"({})", R"({"a": 1})", R"({"a": [1, 2.5, -3e7, true, null]})",
                           R"({"k": {"nested": "v\n\"q\" \u00e9"}, "x": false})",
                           "{\"emoji\": \"\xF0\x9F\x98\x80\"}", "{\n  \"a\": 1\n}"}) {
        EXPECT_TRUE(matches(g, ok)) << ok;
    }
    for (const char* bad : {R"({)", R"([1, 2])", R"({"a" 1})", R"({"a": 01x})", R"({"a": tru})",
                            R"({"a": "\q"})", R"({'a': 1})", R"({"a": 1,})"}) {
        EXPECT_FALSE(matches(g, bad)) << bad;
    }
}

TEST(gbnf, literals_classes_and_any_character) {
    gbnf g = must_parse(R"(root ::= "a\tb\\\"\x41\u00e9\U0001F600" [^a-c] . [\]\-x])");
    EXPECT_TRUE(matches(g,
                        "a\tb\\\"A\xC3\xA9\xF0\x9F\x98\x80"
                        "d\xE2\x82\xAC]"));
    EXPECT_TRUE(matches(g,
                        "a\tb\\\"A\xC3\xA9\xF0\x9F\x98\x80"
                        "zz-"));
    EXPECT_FALSE(matches(g,
                         "a\tb\\\"A\xC3\xA9\xF0\x9F\x98\x80"
                         "bzx"));  // [^a-c]
    EXPECT_FALSE(matches(g,
                         "a\tb\\\"A\xC3\xA9\xF0\x9F\x98\x80"
                         "zzy"));  // [\]\-x]
}

TEST(gbnf, repetitions_at_their_edges) {
    gbnf g = must_parse("root ::= \"a\"{2,4} \"b\"{3} \"c\"{1,} (\"xy\")? \"z\"* \"w\"+\n");
    EXPECT_TRUE(matches(g, "aabbbcw"));
    EXPECT_TRUE(matches(g, "aaaabbbcccxyzzzww"));
    EXPECT_FALSE(matches(g, "abbbcw"));       // a{2,4}: one
    EXPECT_FALSE(matches(g, "aaaaabbbcw"));   // five
    EXPECT_FALSE(matches(g, "aabbcw"));       // b{3}: two
    EXPECT_FALSE(matches(g, "aabbbw"));       // c{1,}: none
    EXPECT_FALSE(matches(g, "aabbbcxyxyw"));  // (xy)?: twice
    EXPECT_FALSE(matches(g, "aabbbc"));       // w+: none
}

TEST(gbnf, rules_groups_comments_and_layout) {
    gbnf g = must_parse(
        "# a comment line\n"
        "root ::= greeting (\" \" name)* # trailing comment\n"
        "\n"
        "greeting ::=\n"
        "  \"hi\" | \"hello\"\n"
        "name ::= (\n"
        "    [A-Z] [a-z]*\n"
        "  | \"you\"\n"
        ")\n");
    EXPECT_TRUE(matches(g, "hi"));
    EXPECT_TRUE(matches(g, "hello Ann you Bo"));
    EXPECT_FALSE(matches(g, "hello ann"));
    EXPECT_FALSE(matches(g, "hey"));
}

TEST(gbnf, matcher_state_queries) {
    gbnf g = must_parse("root ::= \"ab\" | \"abc\"\n");
    matcher m(g);
    EXPECT_TRUE(m.allows(U'a'));
    EXPECT_FALSE(m.allows(U'b'));
    EXPECT_FALSE(m.accepting());
    ASSERT_TRUE(*m.advance(U'a'));
    ASSERT_TRUE(*m.advance(U'b'));
    EXPECT_TRUE(m.accepting());
    EXPECT_FALSE(m.done()) << "'c' may still follow";
    EXPECT_TRUE(m.allows(U'c'));
    // A refused character leaves the matcher as it was.
    EXPECT_FALSE(*m.advance(U'x'));
    EXPECT_TRUE(m.accepting());
    ASSERT_TRUE(*m.advance(U'c'));
    EXPECT_TRUE(m.done());
    EXPECT_FALSE(m.allows(U'c'));
}

TEST(gbnf, utf8_split_across_calls_and_invalid_utf8) {
    gbnf g = must_parse("root ::= \"\xE2\x82\xAC\" [a-z]\n");  // the euro sign, then a letter
    matcher m(g);
    ASSERT_TRUE(*m.advance_utf8("\xE2"));
    EXPECT_FALSE(m.accepting());
    ASSERT_TRUE(*m.advance_utf8("\x82"));
    ASSERT_TRUE(*m.advance_utf8("\xACq"));
    EXPECT_TRUE(m.accepting());
    matcher bad(g);
    EXPECT_FALSE(*bad.advance_utf8("\xE2\x28"));       // not a continuation byte
    EXPECT_FALSE(*bad.advance_utf8("\xC0\x80"));       // overlong
    EXPECT_FALSE(*bad.advance_utf8("\xED\xA0\x80"));   // a surrogate
    EXPECT_FALSE(*bad.advance_utf8("\xE2\x82\xACQ"));  // the grammar: lowercase only
    // All or nothing: the refused calls consumed nothing.
    EXPECT_TRUE(
        *bad.advance_utf8("\xE2\x82\xAC"
                          "z"));
    EXPECT_TRUE(bad.accepting());
}

TEST(gbnf, a_partial_code_point_goes_on_only_if_an_allowed_one_begins_with_it) {
    // A token may end inside a code point; it is allowed only when some code point the grammar
    // takes there begins with its bytes (else a sampler would walk into a dead end).
    gbnf euro = must_parse("root ::= \"\xE2\x82\xAC\"\n");
    matcher m(euro);
    EXPECT_TRUE(*m.advance_utf8("\xE2"));
    EXPECT_FALSE(*m.advance_utf8("\x83")) << "U+20C0.. is not the euro sign";
    EXPECT_TRUE(*m.advance_utf8("\x82"));
    EXPECT_FALSE(*matcher(euro).advance_utf8("\xC3")) << "no two-byte code point is allowed";
    gbnf ascii = must_parse("root ::= [a-z]+\n");
    EXPECT_FALSE(*matcher(ascii).advance_utf8("\xC3"));
    gbnf not_quote = must_parse("root ::= [^\"]\n");  // negated: almost everything
    EXPECT_TRUE(*matcher(not_quote).advance_utf8("\xF0\x9F"));
    gbnf latin = must_parse("root ::= [\\u00E0-\\u00FF]\n");  // U+00E0..U+00FF: lead C3 only
    EXPECT_TRUE(*matcher(latin).advance_utf8("\xC3"));
    EXPECT_FALSE(*matcher(latin).advance_utf8("\xC2"));
    gbnf most = must_parse("root ::= [^\\u0080-\\u00BF]\n");  // C2's code points all refused
    EXPECT_FALSE(*matcher(most).advance_utf8("\xC2"));
    EXPECT_TRUE(*matcher(most).advance_utf8("\xC3"));
    // A surrogate's bytes never complete (no UTF-8 encodes U+D800..U+DFFF), even where the
    // grammar takes "anything": ED A0..BF is refused, ED 80..9F goes on (U+D000..U+D7FF).
    EXPECT_FALSE(*matcher(not_quote).advance_utf8("\xED\xAC"));
    EXPECT_TRUE(*matcher(not_quote).advance_utf8("\xED\x9F"));
    EXPECT_TRUE(*matcher(not_quote).advance_utf8("\xED"));
    gbnf surrogates_only = must_parse("root ::= [\\uD800-\\uDFFF]\n");
    EXPECT_FALSE(*matcher(surrogates_only).advance_utf8("\xED"));
}

TEST(gbnf, bad_grammars_name_line_and_column) {
    const std::pair<const char*, const char*> cases[] = {
        {"root ::= a\n", "line 1 column 10: rule 'a' is not defined"},
        {"root ::= \"x\"\nroot ::= \"y\"\n", "line 2 column 1: rule 'root' is defined twice"},
        {"start ::= \"x\"\n", "the grammar has no 'root' rule"},
        {"root ::= \"x\n", "line 1 column 12: newline inside a literal"},
        {"root ::= \"x", "line 1 column 12: unterminated literal"},
        {"root ::= [a-", "line 1 column 13: unterminated character class"},
        {"root ::= [z-a]\n", "line 1 column 14: character range out of order"},
        {"root ::= \"\\q\"\n", "line 1 column 13: unknown escape \\q"},
        {"root ::= \"\\xZ1\"\n", "line 1 column 13: bad hex digit in \\x escape"},
        {"root ::= \"a\" )\n",
         "line 1 column 14: unexpected ')' (a rule ends at the end of "
         "its line outside parentheses)"},
        {"root := \"a\"\n", "line 1 column 6: expected ::= after 'root'"},
        {"root ::= (\"a\"\n", "line 2 column 1: expected ')'"},
        {"root ::= \"a\"{3,1}\n", "line 1 column 17: repetition {m,n} with n < m"},
        {"root ::= \"a\" @\n", "line 1 column 14: unexpected '@'"},
        {"root ::= \"a\"\n  | \"b\"\n", "line 2 column 3: expected a rule name"},
    };
    for (const auto& [grammar, message] : cases) EXPECT_EQ(error_of(grammar), message) << grammar;
}

TEST(gbnf, left_recursion_is_refused) {
    EXPECT_EQ(error_of("root ::= root \"a\" | \"b\"\n"),
              "rule 'root' is left-recursive (it can reach itself before matching a character)");
    // Through a rule that can match nothing, and through a group.
    EXPECT_NE(error_of("root ::= e x\ne ::= \"\" | \"q\"\nx ::= root \"a\" | \"b\"\n")
                  .find("left-recursive"),
              std::string::npos);
    EXPECT_NE(error_of("root ::= (\"a\"? root) \"b\" | \"c\"\n").find("left-recursive"),
              std::string::npos);
    // Right recursion is fine.
    gbnf g = must_parse("root ::= \"a\" root | \"b\"\n");
    EXPECT_TRUE(matches(g, "aaab"));
}

TEST(gbnf, limits_are_errors) {
    gbnf_limits small;
    small.source_bytes_max = 16;
    EXPECT_EQ(error_of("root ::= \"abcdefghijklmnop\"\n", small),
              "the grammar is 28 bytes; the limit is 16");
    gbnf_limits few_rules;
    few_rules.rules_max = 3;
    EXPECT_NE(error_of("root ::= a b c\na ::= \"a\"\nb ::= \"b\"\nc ::= \"c\"\n", few_rules)
                  .find("more than 3 rules"),
              std::string::npos);
    gbnf_limits shallow;
    shallow.depth_max = 2;
    EXPECT_NE(error_of("root ::= (((\"a\")))\n", shallow).find("nested deeper than 2"),
              std::string::npos);
    EXPECT_NE(error_of("root ::= \"a\"{1000}\n").find("repetition count above 256"),
              std::string::npos);
    gbnf_limits few_elements;
    few_elements.elements_max = 50;
    EXPECT_NE(error_of("root ::= \"a\"{60}\n", few_elements).find("grammar elements"),
              std::string::npos);
    // An ambiguous grammar: after n 'a's, n + 1 parses differ in how many 'b's they still
    // owe, until stacks_max stops it (and a deep nesting, until stack_depth_max does).
    gbnf_limits stacks;
    stacks.stacks_max = 16;
    const char* owing = "root ::= \"a\" root | \"a\" root \"b\" | \"\"\n";
    auto g = parse_gbnf(owing, stacks);
    ASSERT_TRUE(g.ok()) << g.err().message;
    matcher m(*g);
    std::string failure;
    for (int i = 0; i < 64 && failure.empty(); ++i) {
        auto r = m.advance(U'a');
        if (!r) failure = r.err().message;
    }
    EXPECT_NE(failure.find("parses alive at once"), std::string::npos) << failure;
    gbnf_limits shallow_stacks;
    shallow_stacks.stack_depth_max = 8;
    auto deep = parse_gbnf("root ::= \"(\" root \")\" | \"x\"\n", shallow_stacks);
    ASSERT_TRUE(deep.ok()) << deep.err().message;
    matcher d(*deep);
    failure.clear();
    for (int i = 0; i < 64 && failure.empty(); ++i) {
        auto r = d.advance(U'(');
        if (!r) failure = r.err().message;
    }
    EXPECT_NE(failure.find("deeper than 8"), std::string::npos) << failure;
}

}  // namespace
}  // namespace ordo::grammar
