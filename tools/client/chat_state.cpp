// chat_state.cpp: see chat_state.hpp.
#include "tools/client/chat_state.hpp"

#include <cassert>
#include <map>
#include <nlohmann/json.hpp>

namespace ordo::client {

// ---- conversation --------------------------------------------------------------------------

conversation::conversation(std::string system) : _system(std::move(system)) {
    reset();
}

bool conversation::begin_turn(std::string user_text) {
    assert(!_in_turn);
    if (_messages.size() + 1 > messages_max) return false;
    _messages.push_back({"user", std::move(user_text)});
    _in_turn = true;
    return true;
}

void conversation::end_turn(std::string reply) {
    assert(_in_turn && _messages.back().role == "user");
    _messages.push_back({"assistant", std::move(reply)});
    _in_turn = false;
}

void conversation::abandon_turn() {
    assert(_in_turn && _messages.back().role == "user");
    _messages.pop_back();
    _in_turn = false;
}

void conversation::reset() {
    assert(!_in_turn);
    _messages.clear();
    if (!_system.empty()) _messages.push_back({"system", _system});
}

// ---- --var NAME=JSON -----------------------------------------------------------------------

result<template_var> parse_var(std::string_view arg) {
    size_t eq = arg.find('=');
    if (eq == std::string_view::npos || eq == 0) {
        return make_error("usage", "--var wants NAME=JSON, got '" + std::string(arg) + "'");
    }
    std::string_view text = arg.substr(eq + 1);
    auto value = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (value.is_discarded()) {
        return make_error("usage", "--var " + std::string(arg.substr(0, eq)) +
                                       ": the value is not JSON (a string needs its quotes: "
                                       "--var 'date_string=\"26 Jul 2024\"')");
    }
    std::vector<uint8_t> bytes = nlohmann::json::to_msgpack(value);
    return template_var{std::string(arg.substr(0, eq)), std::string(bytes.begin(), bytes.end())};
}

msgpack::sbuffer pack_vars(const std::vector<template_var>& vars) {
    std::map<std::string, const std::string*> by_name;  // the last of each name wins
    for (const auto& v : vars) by_name[v.name] = &v.value_msgpack;
    msgpack::sbuffer buf;
    msgpack::packer<msgpack::sbuffer> pk(buf);
    pk.pack_map(static_cast<uint32_t>(by_name.size()));
    for (const auto& [name, value] : by_name) {
        pk.pack(name);
        buf.write(value->data(), value->size());  // already one msgpack value
    }
    return buf;
}

// ---- input lines ---------------------------------------------------------------------------

void line_buffer::feed(std::string_view bytes) {
    assert(!_eof);
    _buf.append(bytes);
}

line_buffer::status line_buffer::take(std::string& line) {
    while (true) {
        size_t nl = _buf.find('\n');
        if (_skipping) {
            if (nl == std::string::npos) {
                _buf.clear();
                return _eof ? status::end : status::need_more;
            }
            _buf.erase(0, nl + 1);
            _skipping = false;
            continue;
        }
        size_t len = nl == std::string::npos ? _buf.size() : nl;
        if (len > line_bytes_max) {
            _skipping = true;
            return status::too_long;
        }
        if (nl == std::string::npos && !(_eof && !_buf.empty())) {
            return _eof ? status::end : status::need_more;
        }
        line.assign(_buf, 0, len);
        _buf.erase(0, nl == std::string::npos ? len : nl + 1);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        return status::line;
    }
}

// ---- commands ------------------------------------------------------------------------------

line_kind classify_line(std::string_view line) {
    const char* space = " \t\r\n\f\v";
    size_t first = line.find_first_not_of(space);
    if (first == std::string_view::npos) return line_kind::blank;
    std::string_view word = line.substr(first, line.find_last_not_of(space) - first + 1);
    if (word.size() < 2 || word[0] != '/') return line_kind::message;
    for (char ch : word.substr(1)) {
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'))) return line_kind::message;
    }
    if (word == "/exit") return line_kind::exit;
    if (word == "/reset") return line_kind::reset;
    if (word == "/help") return line_kind::help;
    return line_kind::unknown_command;
}

}  // namespace ordo::client
