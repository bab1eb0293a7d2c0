// net_actor.hpp: the connection actor. Owns the listening socket and every client connection.
//
// Runs on its own libuv loop; nothing else touches its sockets or per-connection state. It
// decodes msgpack frames under a size limit (frame_decoder), parses each request into the typed
// op the scheduler accepts (net/ops.hpp, the one validator), answers `health` itself and encodes
// the scheduler's typed events as wire frames (net/protocol.hpp) through a bounded
// per-connection write buffer. Limits (all from [server] config): connections, frame bytes,
// in-flight requests per connection, queued write bytes per connection, and how long a frame may
// take to arrive. A bad frame gets one bad_frame error and the connection is shut down after
// that error is flushed; other connections never notice. Every socket error, EOF, timeout or
// slow reader becomes one client_gone to the scheduler, through a delivery that never loses it.
// With API keys configured (net/api_keys.hpp) a connection's first frame must be `auth` with a
// right key; anything else gets unauthorized and the connection closes, and a client address
// that keeps failing is refused at accept for a cool-down.
// Writes cannot raise SIGPIPE: the process ignores it (run_server), so a peer's reset is an
// ordinary write error.
#pragma once

#include <uv.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "actors/runtime/actor.hpp"
#include "actors/runtime/delivery.hpp"
#include "actors/runtime/outbox.hpp"
#include "actors/scheduler/scheduler_msgs.hpp"
#include "net/api_keys.hpp"
#include "net/frame_decoder.hpp"
#include "net/net_msgs.hpp"
#include "net/ops.hpp"
#include "net/protocol.hpp"
#include "net/read_pauses.hpp"
#include "net/tcp_conn.hpp"
#include "net/tcp_listener.hpp"

namespace ordo::net {

struct net_options {
    std::string host = "127.0.0.1";
    uint16_t port = 7070;  // 0 = ephemeral (tests)
    size_t connections_max = 256;
    size_t frame_bytes_max = 1 << 20;
    size_t frame_values_max = frame_values_max_default;  // msgpack values in one frame
    size_t inflight_per_connection_max = 64;
    size_t write_buffer_bytes_max = 8 << 20;
    uint64_t shutdown_grace_ms = 5000;  // at stop: how long queued events may take to flush
    uint64_t read_timeout_ms = 30000;   // a frame begun (or a silent new connection), at most
    request_limits limits;              // what the op parser needs of the model and config
    // Any thread: the HTTP front door's counters (the stats op's `http` map), sent with each
    // stats query; unset (HTTP off): the stats op has no `http` map.
    std::function<std::map<std::string, uint64_t>()> http_counters;
    // The API keys and the failure table both doors share (net/api_keys.hpp); null or no key
    // configured: no connection needs to authenticate.
    std::shared_ptr<auth_gate> auth;
};

// Counted on the net actor's loop; atomic so that another thread (the HTTP actor's /metrics,
// through net_actor::counters) may read them while they move.
struct net_counters {
    std::atomic<uint64_t> connections_total = 0;
    std::atomic<uint64_t> connections_refused = 0;
    std::atomic<uint64_t> requests = 0;
    std::atomic<uint64_t> bad_frames = 0;
    std::atomic<uint64_t> bad_requests = 0;
    std::atomic<uint64_t> unknown_ops = 0;
    std::atomic<uint64_t> read_timeouts = 0;
    std::atomic<uint64_t> responses_too_large = 0;
    std::atomic<uint64_t> fault_drops = 0;   // connections closed by a net_fin / net_rst fault
    std::atomic<uint64_t> fault_pauses = 0;  // reading paused by a net_stop_reading fault
    std::atomic<uint64_t> auth_failures = 0;  // a first frame without a right key (closed)
    std::atomic<uint64_t> auth_refused = 0;   // connections refused: their address cut off
    // slow_readers, bytes_in and bytes_out are the TCP layer's (tcp_conns).
};

class net_actor final
    : public actors::actor<net_actor, token_event, generate_done, tokenize_done, detokenize_done,
                           cancel_done, model_done, stats_done, fault_done, session_delete_done,
                           request_error, embed_done, set_health, drop_connection, net_fault,
                           begin_drain>,
      private tcp_conn_owner {
public:
    net_actor(net_options options, size_t mailbox_capacity);
    ~net_actor() override;

    using scheduler_outbox =
        actors::outbox<sched::generate, sched::cancel, sched::tokenize, sched::detokenize,
                       sched::model_info_query, sched::stats_query, sched::fault,
                       sched::session_delete, sched::embed>;

    // Before start(): where ops other than `health` go. Without a scheduler, `stats` is
    // answered here (net counters only) and every other op is unknown.
    template <typename Scheduler>
    void connect_scheduler(Scheduler& s) {
        _to_scheduler = scheduler_outbox(s, "net");
        _gone_out = actors::outbox<sched::client_gone>(s, "net");
        _health_status = "loading";  // until the scheduler reports the device ready
        _health_reason = "starting";
    }

    // Valid after start(): whether bind/listen succeeded, and the port actually bound.
    const status& listen_status() const { return _listen_status; }
    uint16_t bound_port() const { return _listener.port(); }
    // Any thread: the stats op's `net` map (counters and connections_open), as they are now.
    std::map<std::string, uint64_t> counters() const { return counters_map(); }

    void on(const token_event& m) { write_event(m); }
    void on(const generate_done& m) { write_event(m); }
    void on(const tokenize_done& m) { write_event(m); }
    void on(const detokenize_done& m) { write_event(m); }
    void on(const cancel_done& m) { write_event(m); }
    void on(const model_done& m) { write_event(m); }
    void on(const stats_done& m) { write_event(m); }
    void on(const fault_done& m) { write_event(m); }
    void on(const session_delete_done& m) { write_event(m); }
    void on(const request_error& m) { write_event(m); }
    void on(const embed_done& m) { write_event(m); }
    void on(const set_health& m);
    void on(const drop_connection& m);
    void on(const net_fault& m);
    void on(const begin_drain& m);

protected:
    void on_start() override;
    void on_stop() override;

private:
    struct connection;
    using clock = std::chrono::steady_clock;
    using gone_delivery = actors::delivery<sched::client_gone>;

    static void connection_cb(uv_stream_t* server, int status);
    static void sweep_cb(uv_timer_t* t);

    // tcp_conn_owner: bytes read, a connection stopping (its requests become one client_gone),
    // a connection closed.
    void conn_read(tcp_conn& c, const char* data, size_t size) override;
    void conn_stopping(tcp_conn& c, const std::string& reason) override;
    void conn_closed(tcp_conn& c) override;
    connection* find(uint64_t id);

    status bind_and_listen();
    void accept_one();
    void admit(connection& c);
    void close_peer_closed();
    void handle_bytes(connection& c, const char* data, size_t size);
    void handle_frame(connection& c, const msgpack::object& frame);
    void handle_request(connection& c, const request& r);
    void op_health(connection& c, uint64_t id);
    // `auth`, and a first frame on a connection that must authenticate.
    void op_auth(connection& c, uint64_t id, std::optional<std::string_view> key);
    void op_stats_local(connection& c, uint64_t id);
    template <typename T>
    void forward(connection& c, T m);
    std::map<std::string, uint64_t> counters_map() const;
    template <typename T>
    void write_event(const T& e);
    void send_error(connection& c, uint64_t id, errc code, std::string_view message);
    // One error frame (answering `id`; 0: the connection's), then the connection is shut down
    // once it is written, lingering.
    void fail_connection(connection& c, errc code, const std::string& message, uint64_t id = 0);
    // The net_stop_reading pause of connection `id` ended: reading restarts.
    void resume_reading(uint64_t id, clock::time_point now);

    net_options _options;
    scheduler_outbox _to_scheduler;
    actors::outbox<sched::client_gone> _gone_out;
    gone_delivery _gone;
    tcp_conns _conns;           // every client connection, by id
    uv_timer_t _sweep_timer{};  // read timeouts
    read_pauses _pauses;        // net_stop_reading faults
    tcp_listener _listener;
    status _listen_status;
    uint64_t _next_conn_id = 1;
    std::atomic<size_t> _open = 0;  // admitted and not closing: what max_connections bounds
    net_counters _counters;
    std::string _health_status = "ok";
    std::string _health_reason;
    clock::time_point _started_at;
};

}  // namespace ordo::net
