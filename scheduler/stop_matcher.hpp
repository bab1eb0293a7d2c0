// stop_matcher.hpp: stop strings that may span token boundaries (pure, actor-free).
//
// Owned by the scheduler actor, one per generate request. The detokenizer hands it the text of
// each new token; it answers with the text that is safe to send to the client now. Text that
// could still be the beginning of a stop string is held back (the protocol's `token` event then
// carries "" and the held text goes out with a later token), so the concatenation of what it
// releases is exactly the generated text up to, and excluding, the first stop string. A UTF-8
// character is never split between two releases: an incomplete trailing character (a piece cut
// mid-character) is held until it is whole. Bounded: at most stop_strings_max strings of at most
// stop_string_bytes_max bytes, so the held text never exceeds stop_string_bytes_max - 1 bytes
// plus one incomplete character.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "actors/runtime/result.hpp"

namespace ordo::sched {

inline constexpr size_t stop_strings_max = 16;        // per request (docs/protocol.md)
inline constexpr size_t stop_string_bytes_max = 256;  // per string; also bounds the held text

// bad_request (naming "stop") unless there are at most stop_strings_max strings, each
// 1..stop_string_bytes_max bytes of valid UTF-8.
status validate_stop_strings(std::span<const std::string> stops);

// True when `s` is well-formed UTF-8 (no overlong forms, surrogates or values past U+10FFFF).
bool is_valid_utf8(std::string_view s);

class stop_matcher {
public:
    struct output {
        std::string text;         // safe to emit now (may be empty)
        bool stopped = false;     // a stop string matched: `text` ends right before it
        int32_t stop_index = -1;  // which string matched (index into the list), when stopped
    };

    static result<stop_matcher> create(std::vector<std::string> stops);

    // Feeds the next piece of generated text. After a match, further pieces are ignored.
    output feed(std::string_view piece);

    // Generation ended for another reason (EOS, length, cancel): releases everything held.
    std::string finish();

    bool stopped() const { return _stopped; }
    size_t held_bytes() const { return _held.size(); }
    const std::vector<std::string>& stops() const { return _stops; }

private:
    explicit stop_matcher(std::vector<std::string> stops) : _stops(std::move(stops)) {}

    size_t partial_match_start() const;

    std::vector<std::string> _stops;
    std::string _held;  // text received but not yet released
    bool _stopped = false;
};

}  // namespace ordo::sched
