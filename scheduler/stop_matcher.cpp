// stop_matcher.cpp: see stop_matcher.hpp.
#include "scheduler/stop_matcher.hpp"

#include <algorithm>
#include <cassert>

namespace ordo::sched {
namespace {

bool is_continuation(unsigned char c) {
    return (c & 0xC0) == 0x80;
}

// Length a UTF-8 lead byte announces; 0 for a byte that cannot start a character.
size_t utf8_length(unsigned char c) {
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

// Moves `end` back so that text[0, end) does not finish with a partial character: if the last
// character starting before `end` needs bytes at or past `end`, the cut goes before it.
size_t utf8_safe_cut(std::string_view text, size_t end) {
    assert(end <= text.size());
    constexpr size_t utf8_bytes_max = 4;
    for (size_t back = 1; back <= utf8_bytes_max && back <= end; back++) {
        const auto c = static_cast<unsigned char>(text[end - back]);
        if (is_continuation(c)) continue;
        const size_t len = utf8_length(c);
        // An invalid byte is released as is: holding it could never complete it.
        return len > back ? end - back : end;
    }
    return end;  // only continuation bytes: malformed, nothing to protect
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
    size_t i = 0;
    while (i < s.size()) {
        const auto c = static_cast<unsigned char>(s[i]);
        const size_t len = utf8_length(c);
        if (len == 0 || i + len > s.size()) return false;
        for (size_t k = 1; k < len; k++) {
            if (!is_continuation(static_cast<unsigned char>(s[i + k]))) return false;
        }
        if (len >= 3) {
            const auto c1 = static_cast<unsigned char>(s[i + 1]);
            if (c == 0xE0 && c1 < 0xA0) return false;   // overlong 3-byte form
            if (c == 0xED && c1 >= 0xA0) return false;  // UTF-16 surrogate
            if (c == 0xF0 && c1 < 0x90) return false;   // overlong 4-byte form
            if (c == 0xF4 && c1 >= 0x90) return false;  // beyond U+10FFFF
        }
        i += len;
    }
    return true;
}

status validate_stop_strings(std::span<const std::string> stops) {
    if (stops.size() > stop_strings_max) {
        return make_error("bad_request", "\"stop\" takes at most " +
                                             std::to_string(stop_strings_max) + " strings, got " +
                                             std::to_string(stops.size()));
    }
    for (size_t i = 0; i < stops.size(); i++) {
        const std::string& s = stops[i];
        if (s.empty() || s.size() > stop_string_bytes_max) {
            return make_error("bad_request", "\"stop\" string " + std::to_string(i) +
                                                 " must be 1.." +
                                                 std::to_string(stop_string_bytes_max) +
                                                 " bytes, got " + std::to_string(s.size()));
        }
        if (!is_valid_utf8(s)) {
            return make_error("bad_request",
                              "\"stop\" string " + std::to_string(i) + " is not valid UTF-8");
        }
    }
    return {};
}

result<stop_matcher> stop_matcher::create(std::vector<std::string> stops) {
    if (auto s = validate_stop_strings(stops); !s) return s.err();
    return stop_matcher(std::move(stops));
}

// Where the longest suffix of the held text that is a proper prefix of some stop string
// begins (held size when there is none). Such a suffix might still become a match.
size_t stop_matcher::partial_match_start() const {
    const std::string_view held(_held);
    size_t start = held.size();
    for (const std::string& stop : _stops) {
        const size_t longest = std::min(stop.size() - 1, held.size());
        // Longest first, and only lengths that beat the best found so far.
        for (size_t len = longest; len > 0 && held.size() - len < start; len--) {
            if (held.substr(held.size() - len) == std::string_view(stop).substr(0, len)) {
                start = held.size() - len;
                break;
            }
        }
    }
    return start;
}

stop_matcher::output stop_matcher::feed(std::string_view piece) {
    output out;
    if (_stopped) return out;
    _held.append(piece);

    // The earliest complete match wins; at equal positions, the first string listed.
    size_t match_at = std::string::npos;
    for (size_t i = 0; i < _stops.size(); i++) {
        const size_t at = _held.find(_stops[i]);
        if (at < match_at) {
            match_at = at;
            out.stop_index = static_cast<int32_t>(i);
        }
    }
    if (match_at != std::string::npos) {
        out.text = _held.substr(0, match_at);
        out.stopped = true;
        _stopped = true;
        _held.clear();
        return out;
    }
    const size_t cut = utf8_safe_cut(_held, partial_match_start());
    out.text = _held.substr(0, cut);
    _held.erase(0, cut);
    assert(_held.size() < stop_string_bytes_max + 4);
    return out;
}

std::string stop_matcher::finish() {
    std::string rest = _stopped ? std::string() : std::move(_held);
    _held.clear();
    return rest;
}

}  // namespace ordo::sched
