// grammar_constraint_test.cpp: a request's grammar as the sampler sees it
// (scheduler/grammar_constraint.hpp), on a crafted vocabulary.
//
// Checks: the mask allows exactly the tokens whose bytes keep the grammar alive (single bytes,
// multi-byte pieces, a piece that runs past what the grammar allows is refused); end of
// generation is allowed only when the text so far is a whole sentence; done() once nothing can
// follow; accept() advances by the token's piece and refuses a token the grammar does not allow
// (a control token without a piece too); a state no token
// continues is grammar_dead_end; a bad grammar is bad_grammar naming the line; one token's
// check (allows) agrees with the mask everywhere. A lazy grammar (triggers) allows everything
// until a trigger appears in the output (across tokens too), then holds from the trigger's first
// byte; a trigger whose text the grammar refuses is passed over; a '^' trigger holds only where
// the output begins, after whitespace.
#include "scheduler/grammar_constraint.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

using namespace ordo::sched;

// 0 "a", 1 "b", 2 "ab", 3 "abc", 4 "" (a control token), 5 end of generation (no bytes), 6 "c"
grammar_vocab make_vocab() {
    std::vector<std::string> pieces = {"a", "b", "ab", "abc", "", "", "c"};
    return grammar_vocab(pieces, {5});
}

std::vector<int> allowed_ids(grammar_constraint& g) {
    auto m = g.allowed();
    EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.err().message);
    std::vector<int> ids;
    if (!m.ok()) return ids;
    for (size_t i = 0; i < m->size(); i++) {
        if ((*m)[i]) ids.push_back(int(i));
        EXPECT_EQ(g.allows(int32_t(i)), (*m)[i] != 0) << "one token's check, token " << i;
    }
    return ids;
}

TEST(grammar_constraint, masks_follow_the_grammar_and_end_only_on_a_sentence) {
    grammar_vocab v = make_vocab();
    auto g = grammar_constraint::create(R"(root ::= "a" "b"? "c"?)", v);
    ASSERT_TRUE(g.ok()) << g.err().message;
    EXPECT_EQ(allowed_ids(*g), (std::vector<int>{0, 2, 3}));  // a, ab, abc; not yet the end
    ASSERT_TRUE(g->accept(0).ok());
    EXPECT_FALSE(g->done());
    EXPECT_EQ(allowed_ids(*g), (std::vector<int>{1, 5, 6}));  // b, the end, c
    EXPECT_FALSE(g->accept(0).ok()) << "a token the grammar refuses";
    EXPECT_FALSE(g->accept(4).ok()) << "a control token: no bytes the grammar could take";
    ASSERT_TRUE(g->accept(1).ok());
    EXPECT_EQ(allowed_ids(*g), (std::vector<int>{5, 6}));
    ASSERT_TRUE(g->accept(6).ok());
    EXPECT_TRUE(g->done());
    EXPECT_EQ(allowed_ids(*g), (std::vector<int>{5}));
    EXPECT_TRUE(g->accept(5).ok()) << "end of generation advances nothing";
}

TEST(grammar_constraint, a_state_no_token_continues_is_a_dead_end) {
    grammar_vocab v = make_vocab();
    auto g = grammar_constraint::create(R"(root ::= "a" "z")", v);  // no token holds "z"
    ASSERT_TRUE(g.ok());
    ASSERT_TRUE(g->accept(0).ok());
    auto m = g->allowed();
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.err().code, "grammar_dead_end");
}

// 0 "x", 1 "<", 2 "t>", 3 "1", 4 "<t", 5 end of generation, 6 " ", 7 ">", 8 "2"
grammar_vocab make_lazy_vocab() {
    std::vector<std::string> pieces = {"x", "<", "t>", "1", "<t", "", " ", ">", "2"};
    return grammar_vocab(pieces, {5});
}

TEST(grammar_constraint, a_lazy_grammar_holds_from_its_trigger) {
    grammar_vocab v = make_lazy_vocab();
    const char* src = R"(root ::= "<t>" [12]+)";
    auto g = grammar_constraint::create(src, v, {"<t>"});
    ASSERT_TRUE(g.ok()) << g.err().message;
    EXPECT_FALSE(g->active());
    EXPECT_EQ(allowed_ids(*g).size(), 9u) << "free before the trigger";
    ASSERT_TRUE(g->accept(0).ok());
    ASSERT_TRUE(g->accept(1).ok());  // "<": the trigger begins
    EXPECT_FALSE(g->active());
    ASSERT_TRUE(g->accept(2).ok());  // "t>": across two tokens
    EXPECT_TRUE(g->active());
    EXPECT_EQ(allowed_ids(*g), (std::vector<int>{3, 8}));
    ASSERT_TRUE(g->accept(3).ok());
    EXPECT_EQ(allowed_ids(*g), (std::vector<int>{3, 5, 8}));
    EXPECT_FALSE(g->accept(0).ok()) << "held after the trigger";

    // The trigger's text, when the grammar refuses it, is passed over.
    auto h = grammar_constraint::create(R"(root ::= "<t>x")", v, {"<t"});
    ASSERT_TRUE(h.ok());
    ASSERT_TRUE(h->accept(4).ok());  // "<t": the grammar takes it
    EXPECT_TRUE(h->active());
    auto k = grammar_constraint::create(R"(root ::= "<t>>")", v, {">"});
    ASSERT_TRUE(k.ok());
    ASSERT_TRUE(k->accept(7).ok());  // ">": the grammar begins with "<", not ">"
    EXPECT_FALSE(k->active());
    ASSERT_TRUE(k->accept(0).ok());
    EXPECT_EQ(allowed_ids(*k).size(), 9u);
}

TEST(grammar_constraint, a_start_trigger_holds_only_where_the_output_begins) {
    grammar_vocab v = make_lazy_vocab();
    const char* src = R"(root ::= "<t>" [12]+)";
    auto g = grammar_constraint::create(src, v, {"^<t>"});
    ASSERT_TRUE(g.ok());
    ASSERT_TRUE(g->accept(6).ok());  // leading whitespace
    ASSERT_TRUE(g->accept(4).ok());  // "<t"
    EXPECT_FALSE(g->active());
    ASSERT_TRUE(g->accept(7).ok());  // ">"
    EXPECT_TRUE(g->active());
    EXPECT_EQ(allowed_ids(*g), (std::vector<int>{3, 8}));

    auto late = grammar_constraint::create(src, v, {"^<t>"});
    ASSERT_TRUE(late.ok());
    ASSERT_TRUE(late->accept(0).ok());  // "x": the output began otherwise
    ASSERT_TRUE(late->accept(4).ok());
    ASSERT_TRUE(late->accept(7).ok());
    EXPECT_FALSE(late->active());
    EXPECT_EQ(allowed_ids(*late).size(), 9u);
}

TEST(grammar_constraint, a_bad_grammar_names_the_line) {
    grammar_vocab v = make_vocab();
    auto g = grammar_constraint::create("root ::= \"a\"\nitem ::= (", v);
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.err().code, "bad_grammar");
    EXPECT_NE(g.err().message.find("2"), std::string::npos) << g.err().message;
}

}  // namespace
