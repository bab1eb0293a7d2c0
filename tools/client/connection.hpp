// connection.hpp: a small blocking client for the ordo protocol (used by the `ordo` CLI).
//
// One TCP connection; requests are msgpack maps, events come back as msgpack maps. Every read
// waits at most a deadline, so the CLI never hangs on a silent server.
#pragma once

#include <msgpack.hpp>

#include <chrono>
#include <optional>
#include <string>

#include "actors/runtime/result.hpp"

namespace ordo::client {

class connection {
public:
    connection() = default;
    ~connection();
    connection(const connection&) = delete;
    connection& operator=(const connection&) = delete;

    // Resolves host (name or numeric, IPv4/IPv6) and connects within `timeout`.
    status open(const std::string& host, uint16_t port, std::chrono::milliseconds timeout);
    status send(const msgpack::sbuffer& frame);
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
