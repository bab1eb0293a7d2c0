// connection.hpp: a small blocking client for the ordo protocol (used by the `ordo` CLI).
//
// One TCP connection; requests are msgpack maps, events come back as msgpack maps. Every read
// waits at most a deadline, so the CLI never hangs on a silent server.
#pragma once

#include <chrono>
#include <msgpack.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "actors/runtime/result.hpp"

namespace ordo::client {

class connection {
public:
    connection() = default;
    ~connection();
    connection(const connection&) = delete;
    connection& operator=(const connection&) = delete;

    // Resolves host (name or numeric, IPv4/IPv6) and connects within `timeout` (closing the
    // connection it had, if any).
    status open(const std::string& host, uint16_t port, std::chrono::milliseconds timeout);
    status send(const msgpack::sbuffer& frame);
    // Raw bytes, for clients of other protocols on the same connection code (ordo-load's HTTP
    // mode): send_bytes writes them all; recv_bytes appends what one read returns to `out`
    // (errors as recv's: "timeout", "interrupted", "closed").
    status send_bytes(std::string_view bytes);
    status recv_bytes(std::string& out, std::chrono::milliseconds deadline);
    // True when the peer has closed its side and nothing is left to read (checked without
    // waiting): an HTTP server that closes idle connections, as llama-server does after a
    // streamed answer.
    bool peer_closed() const;
    // The next event; error "timeout" after `deadline`, "closed" on EOF.
    result<msgpack::object_handle> recv(std::chrono::milliseconds deadline);

private:
    int _fd = -1;
    msgpack::unpacker _unpacker;
};

// Field access on a decoded event map.
const msgpack::object* find(const msgpack::object& map, std::string_view key);
std::string get_str(const msgpack::object& map, std::string_view key);

}  // namespace ordo::client
