// front_door.hpp: what every front door does alike, above the connection layer: the listening
// socket, accepting and admitting connections (the API-key cut-off, the connection limit), the
// timeout sweep, the net faults (net_fin, net_rst, net_stop_reading), drain, health, the
// counters both doors report, and the one client_gone a stopping connection with live requests
// becomes, through a delivery that never loses it.
//
// A component, not an actor: the msgpack door (net/net_actor.hpp) and the HTTP door
// (http/http_actor.hpp) each own one and run it on their own loop; nothing here is touched from
// another thread but the counters (atomics). What the bytes mean, what is live on a connection,
// and how an answer is written stay the door's: front_door asks it through front_door_owner,
// the way tcp_conns asks front_door through tcp_conn_owner. So a door keeps only decode, route
// and encode; the skeleton is written once.
#pragma once

#include <spdlog/spdlog.h>
#include <uv.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "actors/runtime/delivery.hpp"
#include "actors/runtime/outbox.hpp"
#include "door/api_keys.hpp"
#include "door/conn_ids.hpp"
#include "door/door_msgs.hpp"
#include "door/error_code.hpp"
#include "door/read_pauses.hpp"
#include "door/tcp_conn.hpp"
#include "door/tcp_listener.hpp"

namespace ordo::door {

// The door's part: what front_door asks of it, on the door's loop.
class front_door_owner {
public:
    using clock = std::chrono::steady_clock;
    // The door's connection object (derived from tcp_conn) for accepted connection `id`.
    virtual std::unique_ptr<tcp_conn> door_conn(uint64_t id) = 0;
    // `c` is refused at accept: `code` unauthorized (its address is cut off for retry_after_ms
    // more) or overloaded (`message` names the limit). The door answers in its protocol and
    // closes `c` once the answer is written.
    virtual void door_refuse(tcp_conn& c, errc code, const std::string& message,
                             uint64_t retry_after_ms) = 0;
    // `c` is admitted (it counts against connections_max): its first timeout starts, it is read.
    virtual void door_admitted(tcp_conn& c) = 0;
    // Bytes read from `c` (never once it is closing).
    virtual void door_read(tcp_conn& c, const char* data, size_t size) = 0;
    // `c` stops being served: the door forgets what is live on it, and says whether requests of
    // it are live at the scheduler (then the scheduler hears one client_gone and cancels them).
    virtual bool door_abandon(tcp_conn& c) = 0;
    // The timeout sweep, for each admitted connection that is open and not paused by a fault.
    virtual void door_sweep(tcp_conn& c) = 0;
    // The net_stop_reading pause of `c` ended at `now`: a timeout begun before it starts again,
    // and the door reads `c` again when it wants to.
    virtual void door_resumed(tcp_conn& c, clock::time_point now) = 0;

protected:
    ~front_door_owner() = default;
};

struct front_door_options {
    door_kind door = door_kind::net;  // the top byte of its conn ids
    std::string host = "127.0.0.1";
    uint16_t port = 0;  // 0 = ephemeral (tests)
    size_t connections_max = 256;
    std::string connections_max_key;  // the config key, named when a connection is refused
    // The write bound, the stop's grace and the lingering close of the connection layer; its
    // lingering_max is connections_max and its log prefix the door's.
    tcp_conn_options conns;
    // The door's shortest timeout: the sweep runs timeout_sweeps times within it.
    uint64_t timeout_ms_min = 30000;
    // At the limit, close first the admitted connections whose client has already closed them
    // (their EOF not read yet: a client that closes one connection and opens the next).
    bool reclaim_peer_closed = false;
    // The API keys and the failure table both doors share; null: no cut-off at accept.
    std::shared_ptr<auth_gate> auth;
};

// Counted on the door's loop; atomic so that another thread may read them while they move.
struct front_door_counters {
    std::atomic<uint64_t> connections_total = 0;
    std::atomic<uint64_t> connections_refused = 0;
    std::atomic<uint64_t> fault_drops = 0;    // connections closed by a net_fin / net_rst fault
    std::atomic<uint64_t> fault_pauses = 0;   // reading paused by a net_stop_reading fault
    std::atomic<uint64_t> auth_failures = 0;  // counted by the door: a request without a right key
    std::atomic<uint64_t> auth_refused = 0;   // refused: the client address is cut off
};

class front_door final : private tcp_conn_owner {
public:
    using clock = std::chrono::steady_clock;

    front_door(front_door_options options, front_door_owner& owner);
    front_door(const front_door&) = delete;
    front_door& operator=(const front_door&) = delete;

    // Before start(): where client_gone goes (from `sender`); health is `loading` until the
    // scheduler reports the device ready.
    template <typename Scheduler>
    void connect_scheduler(Scheduler& s, const char* sender) {
        _gone_out = actors::outbox<client_gone>(s, sender);
        _health_status = door::health_status::loading;
        _health_reason = "starting";
    }

    // The door's on_start: the connection layer, the sweep, the pauses, the client_gone
    // delivery, then bind and listen (listen_status() says how that went). An error only when
    // the delivery could not be set up (a programming error: the door aborts).
    status start(uv_loop_t* loop, spdlog::logger& log);
    // The door's on_stop: no more accepting; connections with queued writes are flushed within
    // shutdown_grace_ms, the others closed now.
    void stop();

    // The scheduler's and the bootstrap's messages about the door as a whole.
    void on(const set_health& m);
    void on(const drop_connection& m);
    void on(const net_fault& m);
    void on(const begin_drain& m);

    // The open connection that the scheduler's `conn` names; nullptr when it is gone or belongs
    // to another door.
    tcp_conn* find(uint64_t conn);
    tcp_conns& conns() { return _conns; }
    const tcp_conns& conns() const { return _conns; }
    bool paused(uint64_t id) const { return _pauses.paused(id); }

    // Valid after start(): whether bind/listen succeeded, and the port actually bound.
    const status& listen_status() const { return _listen_status; }
    uint16_t bound_port() const { return _listener.port(); }
    // What health says: the scheduler's, or draining once begin_drain came (load balancers take
    // the server out of rotation on it while its running requests finish).
    door::health_status health_status() const {
        return _draining ? door::health_status::draining : _health_status;
    }
    const std::string& health_reason() const { return _draining ? _drain_reason : _health_reason; }
    bool draining() const { return _draining; }
    uint64_t uptime_ms() const;

    // Any thread: admitted and not closing (what connections_max bounds), the counters, and
    // the counters both doors report by the same names (connections_open, connections_total,
    // connections_refused, fault_*, auth_*, slow_readers, bytes_in, bytes_out).
    size_t open() const { return _open.load(); }
    front_door_counters& counters() { return _counters; }
    std::map<std::string, uint64_t> counters_map() const;

private:
    using gone_delivery = actors::delivery<client_gone>;

    static void connection_cb(uv_stream_t* server, int status);
    static void sweep_cb(uv_timer_t* t);
    void accept_one();
    void admit(tcp_conn& c);
    void close_peer_closed();
    void resume(uint64_t id, clock::time_point now);

    // tcp_conn_owner
    void conn_read(tcp_conn& c, const char* data, size_t size) override;
    void conn_stopping(tcp_conn& c, const std::string& reason) override;
    void conn_closed(tcp_conn& c) override;

    front_door_options _options;
    front_door_owner& _owner;
    spdlog::logger* _log = nullptr;
    std::string _prefix;  // log prefix: "" for the msgpack door (its logger says net), "http "
    actors::outbox<client_gone> _gone_out;
    gone_delivery _gone;
    tcp_listener _listener;
    tcp_conns _conns;           // every connection, by its local id
    uv_timer_t _sweep_timer{};  // timeouts and lingering closes
    read_pauses _pauses;        // net_stop_reading faults
    status _listen_status;
    uint64_t _next_conn_id = 1;
    std::atomic<size_t> _open = 0;
    front_door_counters _counters;
    door::health_status _health_status = door::health_status::ok;
    std::string _health_reason;
    std::string _drain_reason;  // begin_drain: what health says while draining
    bool _draining = false;
    clock::time_point _started_at;
};

}  // namespace ordo::door
