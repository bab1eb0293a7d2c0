// test_chat_state.cpp: the pure logic of `ordo chat` (tools/client/chat_state.hpp), without a
// server or a terminal.
//
// Checks: the conversation keeps the system message through /reset, keeps a reply (also a
// cancelled one's partial text) and takes back a failed turn's user message, and refuses a
// turn past the server's 4096 messages; --var NAME=JSON encodes JSON values as msgpack, refuses
// what is not NAME=JSON, and a repeated NAME keeps its last value; input splits into lines at
// '\n' (a '\r' before it dropped, a last line without '\n' kept, bytes fed in any pieces), and
// a line past line_bytes_max is reported once and skipped without ending the lines after it;
// commands are whole '/'-words, other lines messages.
#include <gtest/gtest.h>

#include "tools/client/chat_state.hpp"

namespace {

using namespace ordo::client;

std::vector<std::string> roles(const conversation& c) {
    std::vector<std::string> r;
    for (const auto& m : c.messages()) r.push_back(m.role);
    return r;
}

TEST(chat_conversation, turns_keep_replies_and_take_back_failures) {
    conversation c("be brief");
    EXPECT_EQ(roles(c), (std::vector<std::string>{"system"}));
    ASSERT_TRUE(c.begin_turn("hi"));
    EXPECT_TRUE(c.in_turn());
    c.end_turn("hello");
    ASSERT_TRUE(c.begin_turn("and then?"));
    c.abandon_turn();  // the request failed: as if never sent
    EXPECT_FALSE(c.in_turn());
    ASSERT_TRUE(c.begin_turn("tell me more"));
    c.end_turn("Once upo");  // a cancelled reply's partial text stays
    EXPECT_EQ(roles(c),
              (std::vector<std::string>{"system", "user", "assistant", "user", "assistant"}));
    EXPECT_EQ(c.messages()[1].content, "hi");
    EXPECT_EQ(c.messages()[3].content, "tell me more");
    EXPECT_EQ(c.messages()[4].content, "Once upo");
    c.reset();
    ASSERT_EQ(c.messages().size(), 1u);
    EXPECT_EQ(c.messages()[0].content, "be brief");
}

TEST(chat_conversation, no_system_message_when_none_is_given) {
    conversation c("");
    EXPECT_TRUE(c.messages().empty());
    ASSERT_TRUE(c.begin_turn("hi"));
    c.end_turn("");
    c.reset();
    EXPECT_TRUE(c.messages().empty());
}

TEST(chat_conversation, refuses_a_turn_past_the_servers_message_bound) {
    conversation c("s");
    // system + 2047 exchanges = 4095 messages: one more user message makes 4096, the bound.
    for (size_t i = 0; i < 2047; i++) {
        ASSERT_TRUE(c.begin_turn("u"));
        c.end_turn("a");
    }
    ASSERT_TRUE(c.begin_turn("last"));
    EXPECT_EQ(c.messages().size(), conversation::messages_max);
    c.end_turn("a");
    EXPECT_FALSE(c.begin_turn("one too many"));
    EXPECT_FALSE(c.in_turn());
    EXPECT_EQ(c.messages().size(), conversation::messages_max + 1);
}

TEST(chat_conversation, messages_pack_as_role_content_maps) {
    conversation c("sys");
    ASSERT_TRUE(c.begin_turn("q"));
    msgpack::sbuffer buf;
    msgpack::pack(buf, c.messages());
    auto oh = msgpack::unpack(buf.data(), buf.size());
    auto maps = oh.get().as<std::vector<std::map<std::string, std::string>>>();
    ASSERT_EQ(maps.size(), 2u);
    EXPECT_EQ(maps[1], (std::map<std::string, std::string>{{"role", "user"}, {"content", "q"}}));
}

msgpack::object_handle unpack(const std::string& bytes) {
    return msgpack::unpack(bytes.data(), bytes.size());
}

TEST(chat_vars, json_values_become_msgpack) {
    auto s = parse_var("date_string=\"26 Jul 2024\"");
    ASSERT_TRUE(s.ok()) << s.err().message;
    EXPECT_EQ(s->name, "date_string");
    EXPECT_EQ(unpack(s->value_msgpack).get().as<std::string>(), "26 Jul 2024");
    auto b = parse_var("enable_thinking=false");
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(unpack(b->value_msgpack).get().type, msgpack::type::BOOLEAN);
    EXPECT_FALSE(unpack(b->value_msgpack).get().as<bool>());
    auto n = parse_var("n=-3");
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(unpack(n->value_msgpack).get().as<int64_t>(), -3);
    auto m = parse_var("x={\"a\": [1, \"b=c\"]}");  // '=' in the value is the value's
    ASSERT_TRUE(m.ok());
    auto obj = unpack(m->value_msgpack);
    ASSERT_EQ(obj.get().type, msgpack::type::MAP);
    auto inner = obj.get().as<std::map<std::string, msgpack::object>>();
    EXPECT_EQ(inner.at("a").via.array.size, 2u);
}

TEST(chat_vars, refuses_what_is_not_name_equals_json) {
    EXPECT_FALSE(parse_var("novalue").ok());
    EXPECT_FALSE(parse_var("=1").ok());
    auto bare = parse_var("date_string=26 Jul 2024");
    ASSERT_FALSE(bare.ok());
    EXPECT_EQ(bare.err().code, "usage");
    EXPECT_NE(bare.err().message.find("quotes"), std::string::npos) << bare.err().message;
    EXPECT_FALSE(parse_var("x=").ok());
}

TEST(chat_vars, pack_vars_makes_one_map_and_the_last_name_wins) {
    std::vector<template_var> vars;
    for (const char* a : {"a=1", "b=\"two\"", "a=3"}) {
        auto v = parse_var(a);
        ASSERT_TRUE(v.ok());
        vars.push_back(*v);
    }
    msgpack::sbuffer buf = pack_vars(vars);
    auto oh = msgpack::unpack(buf.data(), buf.size());
    auto m = oh.get().as<std::map<std::string, msgpack::object>>();
    ASSERT_EQ(m.size(), 2u);
    EXPECT_EQ(m.at("a").as<int>(), 3);
    EXPECT_EQ(m.at("b").as<std::string>(), "two");
}

// Feeds `input` to a line_buffer in pieces of `piece` bytes and collects what take() gives.
std::vector<std::string> split(const std::string& input, size_t piece, size_t* too_long = nullptr) {
    line_buffer lb;
    std::vector<std::string> lines;
    std::string line;
    size_t off = 0;
    for (size_t guard = 0; guard < 2 * input.size() + 16;
         guard++) {  // bounded: each pass feeds, gives or ends
        auto st = lb.take(line);
        if (st == line_buffer::status::line) {
            lines.push_back(line);
        } else if (st == line_buffer::status::too_long) {
            if (too_long != nullptr) ++*too_long;
        } else if (st == line_buffer::status::end) {
            return lines;
        } else if (off < input.size()) {
            size_t n = std::min(piece, input.size() - off);
            lb.feed(std::string_view(input).substr(off, n));
            off += n;
        } else {
            lb.feed_eof();
        }
    }
    ADD_FAILURE() << "line_buffer did not end";
    return lines;
}

TEST(chat_lines, splits_at_newlines_in_any_pieces) {
    const std::string input = "hello\r\n\nsecond line\nno newline at the end";
    const std::vector<std::string> want = {"hello", "", "second line", "no newline at the end"};
    for (size_t piece : {1u, 3u, 7u, 1000u}) {
        EXPECT_EQ(split(input, piece), want) << "pieces of " << piece;
    }
    EXPECT_TRUE(split("", 4).empty());
    EXPECT_EQ(split("one\n", 4), (std::vector<std::string>{"one"}));
}

TEST(chat_lines, a_too_long_line_is_skipped_and_the_rest_go_on) {
    std::string huge(line_buffer::line_bytes_max + 10, 'x');
    size_t too_long = 0;
    auto lines = split("before\n" + huge + "\nafter\n", 4096, &too_long);
    EXPECT_EQ(too_long, 1u);
    EXPECT_EQ(lines, (std::vector<std::string>{"before", "after"}));
    too_long = 0;
    lines = split(huge, 4096, &too_long);  // a too-long last line without '\n'
    EXPECT_EQ(too_long, 1u);
    EXPECT_TRUE(lines.empty());
    std::string just_fits(line_buffer::line_bytes_max, 'y');
    too_long = 0;
    lines = split(just_fits + "\n", 4096, &too_long);
    EXPECT_EQ(too_long, 0u);
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_EQ(lines[0].size(), line_buffer::line_bytes_max);
}

TEST(chat_lines, commands_are_whole_slash_words) {
    EXPECT_EQ(classify_line("/exit"), line_kind::exit);
    EXPECT_EQ(classify_line("  /reset \t"), line_kind::reset);
    EXPECT_EQ(classify_line("/help"), line_kind::help);
    EXPECT_EQ(classify_line("/exti"), line_kind::unknown_command);
    EXPECT_EQ(classify_line("   "), line_kind::blank);
    EXPECT_EQ(classify_line(""), line_kind::blank);
    EXPECT_EQ(classify_line("/usr/bin is where?"), line_kind::message);
    EXPECT_EQ(classify_line("/exit now"), line_kind::message);
    EXPECT_EQ(classify_line("/"), line_kind::message);
    EXPECT_EQ(classify_line("hello /exit"), line_kind::message);
}

}  // namespace
