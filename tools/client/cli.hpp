// cli.hpp: what the `ordo` command-line client's commands share: exit codes, the global
// options, the request builder, the sampling flags `generate` and `chat` both take, error
// printing and the SIGINT flag.
//
// The CLI is one thread. The SIGINT handler only sets a flag; the blocking waits (the socket in
// connection::recv, stdin in `chat`) are poll() calls, which return EINTR when the signal
// arrives, so a loop sees the flag at once and decides what Ctrl-C means where it is.
#pragma once

#include <chrono>
#include <cstdint>
#include <msgpack.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ordo::client {

constexpr int exit_ok = 0;
constexpr int exit_server_error = 1;
constexpr int exit_usage = 2;
constexpr int exit_unreachable = 3;

struct options {
    std::string host = "127.0.0.1";
    uint16_t port = 7070;
    std::chrono::milliseconds timeout{600000};  // per event
    std::string api_key;            // --api-key, else $ORDO_API_KEY; empty: no `auth` is sent
    std::vector<std::string> args;  // command and its arguments
};

// Prints `ordo: why` and the usage text, exits with exit_usage (main.cpp owns the text).
[[noreturn]] void usage_error(const std::string& why);

// Builds {"id": ..., "op": ..., ...} from already-packed key/value pairs. The objects live in
// `zone`: a builder whose fields are copied into another must outlive it.
struct request_builder {
    std::vector<std::pair<std::string, msgpack::object>> fields;
    msgpack::zone zone;
    template <typename T>
    void add(const std::string& key, const T& value) {
        fields.emplace_back(key, msgpack::object(value, zone));
    }
    msgpack::sbuffer pack(uint64_t id, const std::string& op) const;
};

// Takes the sampling flag at a[i] (-n, --temp, --top-k, --top-p, --min-p, --repeat-penalty,
// --seed) with its value into `b`, advancing i past the value; false when a[i] is not one.
// A missing value is a usage error; a malformed number throws std::exception (the caller turns
// it into a usage error naming its command).
bool parse_sampling_flag(const std::vector<std::string>& a, size_t& i, request_builder& b);

class connection;

// Sends `frame` and reads the next event (the answer of a one-event request). On a send or
// receive failure prints `ordo: why` and returns nothing (the caller exits exit_unreachable).
std::optional<msgpack::object_handle> exchange(connection& c, const msgpack::sbuffer& frame,
                                               std::chrono::milliseconds timeout);

// Prints an error event as `ordo: code: message` on stderr; returns exit_server_error.
int report_error(const msgpack::object& ev);

// The request id of an event; 0 when absent (the server's connection-level errors use id 0).
uint64_t event_id(const msgpack::object& ev);

// SIGINT sets a flag instead of ending the process (see the file comment).
void sigint_install();
bool sigint_pending();
void sigint_clear();

}  // namespace ordo::client
