// server_spawn.hpp: ordo-load's --spawn-server mode — runs ordo-server as a child process on an
// ephemeral port, learns the port from its "ordo-server listening on H:P" stdout line, and
// stops it with SIGTERM at the end (SIGKILL after a bounded grace). Used by main.cpp and by
// test_ordo_load.cpp (which also uses it to kill a server under load).
//
// A drainer thread reads the child's stdout+stderr for its whole life, so a chatty server never
// blocks on a full pipe; the last output_tail_bytes are kept to explain a failed start.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "actors/runtime/result.hpp"

namespace ordo::load {

struct listen_endpoint {
    std::string host;  // without IPv6 brackets
    uint16_t port = 0;
};

// Finds a whole "ordo-server listening on HOST:PORT\n" line (HOST may be "[v6]") in `text`,
// or with `http` the HTTP front door's "ordo-server http listening on HOST:PORT\n"; a line
// still missing its newline does not count (the port may be cut short).
std::optional<listen_endpoint> parse_listening_line(const std::string& text, bool http = false);

class spawned_server {
public:
    static constexpr size_t output_tail_bytes = 16 * 1024;
    static constexpr std::chrono::milliseconds stop_grace{15000};  // > shutdown_grace_ms default

    spawned_server() = default;
    ~spawned_server();
    spawned_server(const spawned_server&) = delete;
    spawned_server& operator=(const spawned_server&) = delete;

    // Starts `binary args...` and waits (at most `deadline`) for its listening line (with
    // `http`, the HTTP front door's line too). Errors: "spawn_failed" (exec failed or the
    // process exited; message carries its output tail), "startup_timeout".
    status start(const std::string& binary, const std::vector<std::string>& args,
                 std::chrono::milliseconds deadline, bool http = false);
    const listen_endpoint& endpoint() const { return _endpoint; }
    const listen_endpoint& http_endpoint() const { return _http_endpoint; }
    pid_t pid() const { return _pid; }
    // False once the child has exited (reaps it).
    bool alive();
    // SIGTERM, wait up to stop_grace, then SIGKILL. Returns the exit status (128 + signal when
    // killed), or -1 when nothing was running.
    int stop();
    std::string output_tail();

private:
    status wait_listening(std::chrono::milliseconds deadline);
    void drain_loop(int fd);
    bool reap(bool block);  // true once the child has exited (status recorded)

    pid_t _pid = -1;
    int _exit_status = -1;
    listen_endpoint _endpoint;
    listen_endpoint _http_endpoint;
    bool _want_http = false;
    std::thread _drainer;
    std::mutex _mutex;                 // guards the fields below
    std::condition_variable _changed;  // output arrived or the pipe closed
    std::string _tail;
    bool _found = false;
    bool _pipe_closed = false;
    bool _stop_draining = false;
};

}  // namespace ordo::load
