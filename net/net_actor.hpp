// net_actor.hpp: the connection actor. Owns the listening socket and every client connection.
//
// Runs on its own libuv loop; nothing else touches its sockets or per-connection state. It
// decodes msgpack frames under a size limit (frame_decoder), validates envelopes (protocol),
// answers the ops it owns (health, stats) and writes events through a bounded per-connection
// write buffer. Limits (all from [server] config): connections, frame bytes, in-flight requests
// per connection, queued write bytes per connection. A bad frame gets one bad_frame error and
// the connection is shut down after that error is flushed; other connections never notice.
#pragma once

#include <uv.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <deque>
#include <map>

#include "actors/runtime/actor.hpp"
#include "actors/runtime/outbox.hpp"
#include "actors/scheduler/scheduler_msgs.hpp"
#include "net/frame_decoder.hpp"
#include "net/net_msgs.hpp"
#include "net/protocol.hpp"

namespace ordo::net {

struct net_options {
    std::string host = "127.0.0.1";
    uint16_t port = 7070;  // 0 = ephemeral (tests)
    size_t connections_max = 256;
    size_t frame_bytes_max = 1 << 20;
    size_t inflight_per_connection_max = 64;
    size_t write_buffer_bytes_max = 8 << 20;
    uint64_t shutdown_grace_ms = 5000;  // at stop: how long queued events may take to flush
};

struct net_counters {
    uint64_t connections_total = 0;
    uint64_t connections_refused = 0;
    uint64_t requests = 0;
    uint64_t bad_frames = 0;
    uint64_t bad_requests = 0;
    uint64_t unknown_ops = 0;
    uint64_t slow_readers = 0;
    uint64_t bytes_in = 0;
    uint64_t bytes_out = 0;
};

class net_actor final : public actors::actor<net_actor, deliver_event, set_health> {
public:
    net_actor(net_options options, size_t mailbox_capacity);
    ~net_actor() override;

    using scheduler_outbox = actors::outbox<sched::client_request, sched::client_gone>;

    // Before start(): where requests other than `health` go. Without a scheduler, `stats` is
    // answered here (net counters only) and every other op is unknown.
    void connect_scheduler(scheduler_outbox out) {
        _to_scheduler = std::move(out);
        _health_status = "loading";  // until the scheduler reports the device ready
        _health_reason = "starting";
    }

    // Valid after start(): whether bind/listen succeeded, and the port actually bound.
    const status& listen_status() const { return _listen_status; }
    uint16_t bound_port() const { return _bound_port; }

    void on(const deliver_event& m);
    void on(const set_health& m);

protected:
    void on_start() override;
    void on_stop() override;

private:
    struct connection;
    struct write_req;

    static void connection_cb(uv_stream_t* server, int status);
    static void alloc_cb(uv_handle_t* handle, size_t suggested, uv_buf_t* buf);
    static void read_cb(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf);
    static void write_cb(uv_write_t* req, int status);
    static void shutdown_cb(uv_shutdown_t* req, int status);
    static void close_cb(uv_handle_t* handle);
    static void grace_cb(uv_timer_t* t);

    status bind_and_listen();
    void accept_one();
    void handle_bytes(connection& c, const char* data, size_t size);
    void handle_frame(connection& c, const msgpack::object& frame);
    void handle_request(connection& c, const request& r);
    void op_health(connection& c, const request& r);
    void op_stats(connection& c, const request& r);
    void forward(connection& c, const request& r);
    std::map<std::string, uint64_t> counters_map() const;
    void send_frame(connection& c, std::string frame);
    void fail_connection(connection& c, const error& e);  // bad_frame: write it, then shut down
    void close_connection(connection& c, const char* reason);

    void tell_client_gone(sched::client_gone m);
    static void gone_retry_cb(uv_timer_t* t);

    net_options _options;
    scheduler_outbox _to_scheduler;
    // client_gone messages the scheduler's full mailbox refused; retried on a timer until
    // delivered (at most one per closed connection, so bounded by connections_max).
    std::deque<sched::client_gone> _gone_pending;
    uv_timer_t _gone_timer{};
    uv_timer_t _grace_timer{};  // bounds the flush of queued events at stop
    uv_tcp_t _listener{};
    bool _listening = false;
    status _listen_status;
    uint16_t _bound_port = 0;
    uint64_t _next_conn_id = 1;
    std::unordered_map<uint64_t, std::unique_ptr<connection>> _connections;
    net_counters _counters;
    std::string _health_status = "ok";
    std::string _health_reason;
    std::chrono::steady_clock::time_point _started_at;
};

}  // namespace ordo::net
