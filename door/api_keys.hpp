// api_keys.hpp: the API keys both front doors check, and the record of failed attempts that
// cuts off a client that keeps guessing (docs/protocol.md "auth", docs/http.md
// "Authentication"). Pure: no sockets, no actor, no clock of its own (callers pass `now`), so
// every rule here is unit-tested directly (tests/net/test_api_keys.cpp).
//
// Where keys come from: `[server] api_keys_file` (one key per line) and `ordo-server --api-key
// KEY`, read once by the bootstrap before any actor starts. A key is never logged, printed or
// quoted in an error: messages name the file and the line, never the text.
//
// How a key is compared: against every configured key, each padded to api_key_bytes_max bytes,
// with no early exit, so the time taken depends on neither where a guess first differs nor
// which key it matches (only on how many keys are configured).
//
// The cut-off (auth_failures): a client address that fails auth_failures_max times within
// auth_failure_window_ms is refused at accept, on both doors, for auth_cooldown_ms. The table
// is bounded (auth_clients_max addresses; the least recently seen is forgotten first), so a
// flood of addresses costs bounded memory; its price is that such a flood can make the table
// forget an address that was cut off. auth_gate is the keys and the one table both doors share
// (they run on different threads, hence its mutex); each door counts its own failures.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "actors/runtime/result.hpp"

namespace ordo::door {

// A key is 1..api_key_bytes_max printable ASCII bytes without spaces (what fits a Bearer
// token): generated keys are 32..64 characters; the bound is what every comparison pads to.
inline constexpr size_t api_key_bytes_max = 256;
// Keys at most: each check compares against all of them.
inline constexpr size_t api_keys_max = 1024;
// An api_keys_file larger than this is refused: api_keys_max keys of the longest kind, with
// room for comments.
inline constexpr size_t api_keys_file_bytes_max = 1 << 20;

// The cut-off. Eight mistakes a minute is more than a person or a misconfigured client makes
// before noticing; a guesser is then held to 8 tries per cool-down (a minute).
inline constexpr uint32_t auth_failures_max = 8;
inline constexpr uint64_t auth_failure_window_ms = 60'000;
inline constexpr uint64_t auth_cooldown_ms = 60'000;
// Client addresses remembered at most (about 100 bytes each).
inline constexpr size_t auth_clients_max = 4096;

// "" when `key` is a usable key, else what is wrong with it (never quoting it).
std::string check_api_key(std::string_view key);

// The keys of an api_keys_file's text: one per line, whitespace around it trimmed; blank lines
// and lines whose first non-blank character is '#' are skipped. Error config_invalid naming
// `source` and the line (never the key) for a malformed key or more than api_keys_max.
result<std::vector<std::string>> parse_api_keys(std::string_view text, std::string_view source);

// Reads an api_keys_file. Refused (config_invalid, the message names the file): a file that
// cannot be read, one that group or others may read or write (it holds secrets: chmod 600), one
// that is not a regular file, larger than api_keys_file_bytes_max, or that holds no key.
result<std::vector<std::string>> load_api_keys_file(const std::string& path);

// The configured keys, each padded to api_key_bytes_max.
class api_keys {
public:
    api_keys() = default;
    // Every key must pass check_api_key; duplicates are kept (harmless).
    explicit api_keys(const std::vector<std::string>& keys);
    // Keys configured: every connection must authenticate.
    bool required() const { return !_keys.empty(); }
    size_t size() const { return _keys.size(); }
    // Whether `candidate` is one of the keys, in time that depends only on size() (see the
    // file comment). False when no key is configured.
    bool matches(std::string_view candidate) const;

private:
    struct padded {
        std::array<uint8_t, api_key_bytes_max> bytes{};
        uint32_t size = 0;
    };
    std::vector<padded> _keys;
};

struct auth_limits {
    uint32_t failures_max = auth_failures_max;
    uint64_t window_ms = auth_failure_window_ms;
    uint64_t cooldown_ms = auth_cooldown_ms;
    size_t clients_max = auth_clients_max;
};

// Failed attempts per client address (not thread-safe: auth_gate locks around it).
class auth_failures {
public:
    using clock = std::chrono::steady_clock;
    explicit auth_failures(auth_limits limits = {});

    // Milliseconds `address` stays cut off at `now`; 0 when it is not.
    uint64_t cooldown_left_ms(std::string_view address, clock::time_point now);
    // One failed attempt of `address` at `now`; true when it starts a cool-down.
    bool failed(std::string_view address, clock::time_point now);
    // A successful attempt: the address's failures are forgotten.
    void succeeded(std::string_view address);
    size_t size() const { return _by_address.size(); }

private:
    struct entry {
        std::string address;
        uint32_t failures = 0;  // within the window begun at window_start
        clock::time_point window_start{};
        std::optional<clock::time_point> cut_off_until;
    };
    using order = std::list<entry>;  // most recently seen first

    order::iterator touch(std::string_view address, clock::time_point now);

    auth_limits _limits;
    order _entries;
    std::unordered_map<std::string_view, order::iterator> _by_address;  // views into _entries
};

// What a door's check found.
enum class auth_verdict : uint8_t {
    ok,       // the key matches (or no key is configured)
    missing,  // no key was given
    wrong,    // a key was given and matches none
    cut_off,  // the address is in its cool-down: refused whatever the key
};

// The keys and the failure table both doors share. Any thread.
class auth_gate {
public:
    using clock = std::chrono::steady_clock;
    explicit auth_gate(api_keys keys, auth_limits limits = {});

    bool required() const { return _keys.required(); }
    // Milliseconds `address` stays cut off (0: not cut off), checked at accept.
    uint64_t cooldown_left_ms(std::string_view address, clock::time_point now = clock::now());
    // Checks `key` (nullopt: none given) for a client at `address`; a missing or wrong key is
    // a failure recorded against the address, a right one clears its record. Always ok when
    // no key is configured.
    auth_verdict check(std::string_view address, std::optional<std::string_view> key,
                       clock::time_point now = clock::now());

private:
    const api_keys _keys;
    std::mutex _mutex;  // guards _table
    auth_failures _table;
};

// What a cut-off client is told, on either door: left_ms the cool-down still to run (0: not
// said, as when the cut-off is found at a request rather than at accept).
std::string cut_off_message(uint64_t left_ms);

// The key of an HTTP Authorization header's value "Bearer KEY" (the scheme in any case, spaces
// around the key ignored); nullopt for another scheme or no key.
std::optional<std::string_view> bearer_key(std::string_view authorization);

// Whether a numeric listen host is a loopback address (127.0.0.0/8, ::1, ::ffff:127.x.y.z).
bool is_loopback_host(std::string_view host);

}  // namespace ordo::door
