// chat_state.hpp: the logic of `ordo chat` that needs neither the terminal nor the socket, so it
// is unit-tested directly (tests/client/test_chat_state.cpp): the conversation and its rules,
// `--var NAME=JSON`, the splitting of input into lines, and what a line asks for. Nothing here
// does I/O; chat.cpp owns the loop that does.
#pragma once

#include <cstddef>
#include <msgpack.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "actors/runtime/result.hpp"

namespace ordo::client {

// One entry of the `messages` array the chat op takes (docs/protocol.md "chat").
struct chat_message {
    std::string role;  // "system", "user" or "assistant"
    std::string content;
    MSGPACK_DEFINE_MAP(role, content);
};

// The history sent, whole, with every turn.
//
// Shape: an optional system message, then user and assistant messages alternating. Between
// turns the last message is an assistant reply (or there is none); during a turn it is the
// user message being answered. A turn ends one of two ways:
//   - end_turn(reply): the server ended the request with `done`. The reply is done.text, also
//     for a turn cancelled with Ctrl-C: the partial reply stays, so what the model sees next is
//     what the user saw on the screen, and roles keep alternating (templates that check
//     alternation would refuse two user messages in a row).
//   - abandon_turn(): the request failed (an error event). Its user message is removed, as if
//     the turn had never been sent; the user can type it again.
class conversation {
public:
    // The server's bound on the `messages` array (docs/protocol.md "chat").
    static constexpr size_t messages_max = 4096;

    explicit conversation(std::string system);

    // Starts a turn with the user's text; false (nothing changes) when sending it would exceed
    // messages_max: the caller says /reset.
    bool begin_turn(std::string user_text);
    void end_turn(std::string reply);
    void abandon_turn();
    // Back to the system message alone. Not during a turn.
    void reset();

    bool in_turn() const { return _in_turn; }
    const std::vector<chat_message>& messages() const { return _messages; }

private:
    std::string _system;  // "" = no system message
    std::vector<chat_message> _messages;
    bool _in_turn = false;
};

// A `--var NAME=JSON` argument: a chat_template_kwargs entry, its value encoded as msgpack.
struct template_var {
    std::string name;
    std::string value_msgpack;
};

// Parses NAME=JSON. Errors (code "usage"): no '=', an empty name, a value that is not JSON (the
// message reminds that a string needs its quotes: --var 'date_string="26 Jul 2024"').
result<template_var> parse_var(std::string_view arg);

// Packs the vars as one msgpack map, NAME -> value; a later NAME replaces an earlier one.
msgpack::sbuffer pack_vars(const std::vector<template_var>& vars);

// Splits input bytes into lines: '\n' ends a line and a '\r' before it is dropped; the bytes
// after the last '\n' become a line at end of input. Memory is bounded: a line longer than
// line_bytes_max is reported once as too_long and its bytes are skipped up to its '\n'.
class line_buffer {
public:
    static constexpr size_t line_bytes_max = 256 * 1024;

    enum class status { line, need_more, too_long, end };

    void feed(std::string_view bytes);
    void feed_eof() { _eof = true; }
    // The next complete line into `line` (status::line); need_more until more bytes or the end
    // arrive; end once the input is over and every line was taken.
    status take(std::string& line);

private:
    std::string _buf;
    bool _skipping = false;  // inside a too-long line, dropping bytes up to its '\n'
    bool _eof = false;
};

// What a line of input asks for. A command is a whole line of '/' and letters (spaces around it
// ignored): /exit, /reset, /help, or an unknown one (likely a typo, so it is not sent). Any other
// line is a message, also one that begins with '/' and goes on ("/usr/bin is ...").
enum class line_kind { message, blank, exit, reset, help, unknown_command };
line_kind classify_line(std::string_view line);

}  // namespace ordo::client
