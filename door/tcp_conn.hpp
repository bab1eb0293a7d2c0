// tcp_conn.hpp: the TCP connection layer of a front door (the net actor's msgpack connections,
// the HTTP actor's): accepting a connection, reading into the owner, the bounded write queue
// (a client that stops reading is cut off at write_buffer_bytes_max: a slow reader), shutdown
// after the queued writes (optionally a lingering close), reset, close, and at stop the flush
// of queued writes bounded by a grace timer. One place for what both doors did alike; what the
// bytes mean (frames, HTTP requests), what is live on a connection and the connection limit
// stay the owner's (the front door, door/front_door.hpp, owns the limit; its door the rest).
//
// Runs on the owner's loop; nothing here is touched from another thread but the counters
// (atomics). The owner's connection type derives from tcp_conn and adds its protocol state;
// tcp_conns owns every connection, from accept() to its close callback, and tells the owner
// through tcp_conn_owner what it must know.
#pragma once

#include <spdlog/spdlog.h>
#include <uv.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

namespace ordo::door {

class tcp_conns;

// One accepted connection. Fields are the layer's; the owner reads them.
struct tcp_conn {
    using clock = std::chrono::steady_clock;
    virtual ~tcp_conn() = default;

    uv_tcp_t tcp{};  // tcp.data points back here
    uv_shutdown_t shutdown_req{};
    tcp_conns* set = nullptr;
    uint64_t id = 0;  // the owner's, set before accept()
    // The client's IP address, numeric ("127.0.0.1", "::1"), set by accept(); "" if unknown.
    // What the API-key failure table (door/api_keys.hpp) counts by.
    std::string peer_address;
    size_t write_pending_bytes = 0;
    bool admitted = false;  // the owner counts it against its connection limit
    bool reading = false;
    bool closing = false;  // no further reads handled nor writes queued
    // Lingering close (tcp_conns::close_after_writes): since when, what linger_ms bounds.
    std::optional<clock::time_point> lingering_since;
    uint64_t linger_bytes = 0;  // discarded while lingering: what linger_bytes_max bounds
    bool write_shut = false;    // the shutdown completed: every write is out, FIN sent
    bool peer_shut = false;     // the client's EOF was read while lingering
};

// What the layer tells its owner, on the owner's loop.
class tcp_conn_owner {
public:
    // Bytes read from `c` (never once it is closing).
    virtual void conn_read(tcp_conn& c, const char* data, size_t size) = 0;
    // `c` stops being served (EOF, an error, a slow reader, a close the owner asked for): once,
    // as it begins closing. The owner ends what is live on it and counts it out.
    virtual void conn_stopping(tcp_conn& c, const std::string& reason) = 0;
    // `c`'s handle is closed; the layer frees it right after.
    virtual void conn_closed(tcp_conn& c) = 0;

protected:
    ~tcp_conn_owner() = default;
};

struct tcp_conn_options {
    size_t write_buffer_bytes_max = 8 << 20;  // server.write_buffer_bytes_max
    uint64_t shutdown_grace_ms = 5000;        // server.shutdown_grace_ms
    // The lingering close (close_after_writes with linger): at most this long and this many
    // bytes discarded, at most lingering_max connections at once. linger_ms 0: none.
    uint64_t linger_ms = 0;
    size_t linger_bytes_max = 0;
    size_t lingering_max = 0;
    std::string door;  // log prefix: "" (msgpack) or "http "
};

class tcp_conns {
public:
    // In the owner's on_start.
    void init(uv_loop_t* loop, tcp_conn_owner& owner, tcp_conn_options options,
              spdlog::logger& log);
    // Accepts one connection of `listener` into `c` (its id set): nodelay, not read yet.
    // nullptr when the accept failed (the connection is then closing).
    tcp_conn* accept(uv_stream_t* listener, std::unique_ptr<tcp_conn> c);
    tcp_conn* find(uint64_t id);
    template <typename F>
    void for_each(F&& f) {
        for (auto& [id, c] : _conns) f(*c);
    }
    size_t size() const { return _conns.size(); }

    void read_start(tcp_conn& c);
    void read_stop(tcp_conn& c);
    // Queues `bytes`; false when the connection is closing or was closed now: a slow reader
    // (write_pending_bytes would pass write_buffer_bytes_max) or a write error.
    bool send(tcp_conn& c, std::string bytes);
    // No more reads or writes: the owner hears conn_stopping (once); the handle stays open.
    void stop_reading(tcp_conn& c, const std::string& reason);
    void close(tcp_conn& c, const char* reason);
    // Shuts `c` down once its queued writes are out, then closes it; with `linger`, reads go
    // on meanwhile and after, discarded (the lingering close, tcp_conn.cpp).
    void close_after_writes(tcp_conn& c, const char* reason, bool linger = false);
    // Closes `c` with a RST: queued writes are dropped.
    void reset(tcp_conn& c, const char* reason);
    // The owner's timeout sweep: lingering connections past linger_ms are closed.
    void sweep_lingering();
    // In the owner's on_stop: connections with queued writes are flushed then closed, within
    // shutdown_grace_ms; the others are closed now. Returns how many are flushing.
    size_t stop();

    // Any thread.
    uint64_t slow_readers() const { return _slow_readers; }
    uint64_t bytes_in() const { return _bytes_in; }
    uint64_t bytes_out() const { return _bytes_out; }
    uint64_t lingering() const { return _lingering; }
    uint64_t lingering_closes() const { return _lingering_closes; }
    uint64_t linger_cutoffs() const { return _linger_cutoffs; }

private:
    static void alloc_cb(uv_handle_t* handle, size_t suggested, uv_buf_t* buf);
    static void read_cb(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf);
    static void write_cb(uv_write_t* req, int status);
    static void shutdown_cb(uv_shutdown_t* req, int status);
    static void close_cb(uv_handle_t* handle);
    static void grace_cb(uv_timer_t* t);
    void linger_read(tcp_conn& c, ssize_t nread);

    uv_loop_t* _loop = nullptr;
    tcp_conn_owner* _owner = nullptr;
    spdlog::logger* _log = nullptr;
    tcp_conn_options _options;
    uv_timer_t _grace_timer{};  // bounds the flush of queued writes at stop
    bool _stopping = false;
    std::unordered_map<uint64_t, std::unique_ptr<tcp_conn>> _conns;
    std::atomic<uint64_t> _slow_readers = 0, _bytes_in = 0, _bytes_out = 0;
    std::atomic<uint64_t> _lingering = 0;  // lingering closes under way (a gauge)
    std::atomic<uint64_t> _lingering_closes = 0, _linger_cutoffs = 0;
};

}  // namespace ordo::door
