// net_actor.hpp: the msgpack front door. Owns its listening socket and every msgpack
// connection, through its front door (door/front_door.hpp: accept and admit, the timeout sweep,
// net faults, drain, health, client_gone), and what is msgpack about them.
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
// With API keys configured (door/api_keys.hpp) a connection's first frame must be `auth` with a
// right key; anything else gets unauthorized and the connection closes, and a client address
// that keeps failing is refused at accept for a cool-down.
// Writes cannot raise SIGPIPE: the process ignores it (tools/server/main.cpp), so a peer's reset is
// an ordinary write error.
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
#include "actors/runtime/outbox.hpp"
#include "door/api_keys.hpp"
#include "door/door_msgs.hpp"
#include "door/front_door.hpp"
#include "net/frame_decoder.hpp"
#include "net/ops.hpp"
#include "net/protocol.hpp"
#include "scheduler/scheduler_msgs.hpp"

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
    // The API keys and the failure table both doors share (door/api_keys.hpp); null or no key
    // configured: no connection needs to authenticate.
    std::shared_ptr<door::auth_gate> auth;
};

// Counted on the net actor's loop; atomic so that another thread (the HTTP actor's /metrics,
// through net_actor::counters) may read them while they move. Those both doors count (connections,
// faults, auth) are the front door's (door/front_door.hpp); slow_readers, bytes_in and bytes_out
// the TCP layer's (door::tcp_conns).
struct net_counters {
    std::atomic<uint64_t> requests = 0;
    std::atomic<uint64_t> bad_frames = 0;
    std::atomic<uint64_t> bad_requests = 0;
    std::atomic<uint64_t> unknown_ops = 0;
    std::atomic<uint64_t> read_timeouts = 0;
    std::atomic<uint64_t> responses_too_large = 0;
};

class net_actor final : public actors::actor_for<net_actor, door::door_messages>,
                        private door::front_door_owner {
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
        _door.connect_scheduler(s, "net");
    }

    // Valid after start(): whether bind/listen succeeded, and the port actually bound.
    const status& listen_status() const { return _door.listen_status(); }
    uint16_t bound_port() const { return _door.bound_port(); }
    // Any thread: the stats op's `net` map (counters and connections_open), as they are now.
    std::map<std::string, uint64_t> counters() const { return counters_map(); }

    // Every event of a request is encoded as a frame (net/protocol.hpp) and written.
    template <door::request_event E>
    void on(const E& m) {
        write_event(m);
    }
    void on(const door::set_health& m) { _door.on(m); }
    void on(const door::drop_connection& m) { _door.on(m); }
    void on(const door::net_fault& m) { _door.on(m); }
    void on(const door::begin_drain& m) { _door.on(m); }

protected:
    void on_start() override;
    void on_stop() override;

private:
    struct connection;
    using clock = std::chrono::steady_clock;

    // front_door_owner: a new connection, a refusal at accept, admitted, bytes read, a stopping
    // connection's live requests, the read timeout, the end of a net_stop_reading pause.
    std::unique_ptr<door::tcp_conn> door_conn(uint64_t id) override;
    void door_refuse(door::tcp_conn& c, door::errc code, const std::string& message,
                     uint64_t retry_after_ms) override;
    void door_admitted(door::tcp_conn& c) override;
    void door_read(door::tcp_conn& c, const char* data, size_t size) override;
    bool door_abandon(door::tcp_conn& c) override;
    void door_sweep(door::tcp_conn& c) override;
    void door_resumed(door::tcp_conn& c, clock::time_point now) override;
    connection* find(uint64_t conn);

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
    void send_error(connection& c, uint64_t id, door::errc code, std::string_view message);
    // One error frame (answering `id`; 0: the connection's), then the connection is shut down
    // once it is written, lingering.
    void fail_connection(connection& c, door::errc code, const std::string& message,
                         uint64_t id = 0);

    net_options _options;
    scheduler_outbox _to_scheduler;
    door::front_door _door;  // listener, connections, sweep, faults, drain, health, client_gone
    net_counters _counters;
};

}  // namespace ordo::net
