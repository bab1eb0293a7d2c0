// http_actor.hpp: the HTTP front door. Owns its listening socket and every HTTP connection,
// through its front door (door/front_door.hpp: accept and admit, the timeout sweep, net faults,
// drain, health, client_gone), and what is HTTP about them.
//
// Runs on its own libuv loop; nothing else touches its sockets or per-connection state. It reads
// HTTP/1.1 requests with llhttp under limits (request_reader: header and body bytes), turns the
// OpenAI endpoints' bodies into the same typed sched::generate the msgpack front door sends
// (openai.hpp, through the one validator net/ops.hpp), /v1/embeddings' inputs into the
// scheduler's embed requests (at most embed_inputs_inflight_max at a time, answered together),
// and encodes the scheduler's typed events (door/door_msgs.hpp) as OpenAI JSON or server-sent
// events. The scheduler answers it like the net actor: its conn ids carry door::door_kind::http
// (door/conn_ids.hpp), so the scheduler routes them here through a delivery of
// their own.
//
// One request of a connection runs at a time; answers are written in request order (HTTP/1.1
// pipelining), and at most max_pipelined_requests wait behind it: then the socket is not read
// (TCP back-pressure) until one is answered. Limits (all from [http], plus the write buffer and
// shutdown grace of [server]): connections, header bytes (431), body bytes (413), the time a
// request may take to arrive (408), the idle time of a kept-alive connection, read-ahead, and
// queued write bytes per connection (a client that stops reading a stream is disconnected).
// A connection that ends while its request runs becomes one client_gone to the scheduler, the
// message the net actor sends, through a delivery that never loses it. A connection the server
// closes after an answer (an early 413 while the body is still coming, ...) closes lingering:
// FIN after the answer, and what the client still sends is discarded for a bounded time and
// bytes, so the client reads the answer and not a reset. With API keys configured
// (door/api_keys.hpp) /v1/* (and /metrics when http.metrics_require_key) need
// `Authorization: Bearer KEY` (401 otherwise), and a client address that keeps failing is
// refused at accept (429) for a cool-down; /health stays open. Browser pages of the origins in
// http.cors_allow_origins may call it (cors.hpp: preflights answered without a key, and
// Access-Control-Allow-Origin on their answers).
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
#include <unordered_map>

#include "actors/runtime/actor.hpp"
#include "actors/runtime/outbox.hpp"
#include "door/api_keys.hpp"
#include "door/door_msgs.hpp"
#include "door/front_door.hpp"
#include "http/cors.hpp"
#include "http/openai.hpp"
#include "http/request_reader.hpp"
#include "net/ops.hpp"
#include "scheduler/scheduler_msgs.hpp"

namespace ordo::http {

struct http_options {
    std::string host = "127.0.0.1";
    uint16_t port = 8080;  // 0 = ephemeral (tests)
    size_t connections_max = 256;
    size_t header_bytes_max = 16384;
    size_t body_bytes_max = 4 << 20;
    uint64_t header_timeout_ms = 30000;
    uint64_t keep_alive_timeout_ms = 5000;
    size_t pipelined_max = 8;
    uint64_t linger_ms = 5000;                // http.linger_ms; 0: no lingering close
    size_t linger_bytes_max = 64 << 20;       // http.max_linger_bytes
    size_t write_buffer_bytes_max = 8 << 20;  // server.write_buffer_bytes_max
    uint64_t shutdown_grace_ms = 5000;        // server.shutdown_grace_ms
    net::request_limits limits;               // what the validator needs of model and config
    served_model model;
    // Any thread: the msgpack front door's counters (the stats op's `net` map), sent with the
    // stats query /metrics makes; unset: /metrics has no ordo_net_ metrics.
    std::function<std::map<std::string, uint64_t>()> net_counters;
    // The API keys and the failure table both doors share (door/api_keys.hpp); null or no key
    // configured: nothing needs a key.
    std::shared_ptr<door::auth_gate> auth;
    bool metrics_require_key = false;             // http.metrics_require_key
    std::vector<std::string> cors_allow_origins;  // http.cors_allow_origins (validated)
};

// Counted on the HTTP actor's loop; atomic so that another thread (the net actor, filling the
// stats op's `http` map through http_actor::counters) may read them while they move. Those both
// doors count (connections, faults, auth) are the front door's (door/front_door.hpp);
// slow_readers, bytes_in, bytes_out and the lingering closes the TCP layer's (door::tcp_conns).
struct http_counters {
    std::atomic<uint64_t> requests = 0;
    std::atomic<uint64_t> responses_2xx = 0, responses_4xx = 0, responses_5xx = 0;
    std::atomic<uint64_t> streams = 0;          // answers sent as server-sent events
    std::atomic<uint64_t> header_timeouts = 0;  // 408
    std::atomic<uint64_t> too_large = 0;        // 413 and 431
    std::atomic<uint64_t> malformed = 0;        // 400 from the HTTP parser
    std::atomic<uint64_t> disconnects = 0;      // connections that ended while their request ran
};

class http_actor final : public actors::actor_for<http_actor, door::door_messages>,
                         private door::front_door_owner {
public:
    http_actor(http_options options, size_t mailbox_capacity);
    ~http_actor() override;

    using scheduler_outbox = actors::outbox<sched::generate, sched::stats_query, sched::tokenize,
                                            sched::detokenize, sched::embed>;

    // Before start(): where requests go.
    template <typename Scheduler>
    void connect_scheduler(Scheduler& s) {
        _to_scheduler = scheduler_outbox(s, "http");
        _door.connect_scheduler(s, "http");
    }

    // Valid after start(): whether bind/listen succeeded, and the port bound.
    const status& listen_status() const { return _door.listen_status(); }
    uint16_t bound_port() const { return _door.bound_port(); }
    // Any thread: the stats op's `http` map (counters and connections_open), as they are now.
    std::map<std::string, uint64_t> counters() const { return counters_map(); }

    void on(const door::token_event& m);
    void on(const door::generate_done& m);
    void on(const door::request_error& m);
    void on(const door::tokenize_done& m);    // POST /tokenize
    void on(const door::detokenize_done& m);  // POST /detokenize
    void on(const door::embed_done& m);       // POST /v1/embeddings
    void on(const door::stats_done& m);       // GET /metrics
    // The events of ops this front door never sends (cancel, model, fault, session_delete):
    // a bug if one names a live request.
    template <door::request_event E>
    void on(const E& m) {
        unexpected(m.conn, m.id, E::msg_name);
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
    struct live_request;
    using clock = std::chrono::steady_clock;

    // front_door_owner: a new connection, a refusal at accept, admitted, bytes read, a stopping
    // connection's live request, the header and keep-alive timeouts, the end of a
    // net_stop_reading pause.
    std::unique_ptr<door::tcp_conn> door_conn(uint64_t id) override;
    void door_refuse(door::tcp_conn& c, door::errc code, const std::string& message,
                     uint64_t retry_after_ms) override;
    void door_admitted(door::tcp_conn& c) override;
    void door_read(door::tcp_conn& c, const char* data, size_t size) override;
    bool door_abandon(door::tcp_conn& c) override;
    void door_sweep(door::tcp_conn& c) override;
    void door_resumed(door::tcp_conn& c, clock::time_point now) override;
    connection* find(uint64_t conn);

    void parse_more(connection& c);
    void update_reading(connection& c);
    void process_next(connection& c);
    void route(connection& c, http_request& r);
    // OPTIONS: a CORS preflight (cors.hpp) or a plain one (204 with Allow); never keyed.
    void answer_options(connection& c, const http_request& r, const char* method);
    void start_generate(connection& c, http_request& r, api_kind kind);
    void get_health(connection& c, const http_request& r);
    void get_metrics(connection& c, const http_request& r);
    void start_embeddings(connection& c, const http_request& r);
    // Sends the live embeddings request's next inputs, up to embed_inputs_inflight_max
    // unanswered; false when the scheduler refused one (the request is answered then).
    bool send_embed_inputs(connection& c);
    // Whether `r` may go on: true when no key is needed or it carries a right one; otherwise
    // it has been answered (401, or 429 and the connection closes for a cut-off address).
    bool authorized(connection& c, const http_request& r);
    void refuse_cut_off(connection& c, uint64_t left_ms);
    connection* live_for(uint64_t conn, uint64_t id);
    void unexpected(uint64_t conn, uint64_t id, const char* what);
    // What a live request waits for from the scheduler: generate's events, stats_done
    // (GET /metrics), tokenize_done (POST /tokenize), detokenize_done (POST /detokenize) or one
    // embed_done per input (POST /v1/embeddings).
    enum class awaited : std::uint8_t { generate, metrics, tokenize, detokenize, embeddings };
    // POST /tokenize or /detokenize, as the route chose (op: awaited::tokenize or ::detokenize).
    void start_tokens(connection& c, const http_request& r, awaited op);
    // live_for, when that request awaits `a`; an answer it does not await is unexpected().
    connection* live_awaiting(uint64_t conn, uint64_t id, awaited a, const char* what);
    // Whether the scheduler took a request (`sent`: its tell); when it refused (a full mailbox,
    // or stopping) the request is answered at once, 429 overloaded or 503 shutting_down.
    bool scheduler_took(connection& c, const actors::tell_status& sent, bool keep_alive);

    // Writing. respond: a whole answer with Content-Length (none for a 204, which has no body);
    // the stream_* ones an SSE answer in chunked transfer encoding. Each ends the request
    // (finish) when the answer is complete. Both add the CORS headers of the request answered.
    void respond(connection& c, int status, std::string_view content_type, std::string body,
                 bool keep_alive, std::string_view extra_headers = {});
    void respond_error(connection& c, const api_error& e, bool keep_alive);
    bool stream_begin(connection& c);  // false: the connection was closed
    void stream_chunk(connection& c, std::string_view data);
    void stream_end(connection& c);
    void finish(connection& c, bool keep_alive);

    std::map<std::string, uint64_t> counters_map() const;

    http_options _options;
    cors_policy _cors;
    scheduler_outbox _to_scheduler;
    door::front_door _door;     // listener, connections, sweep, faults, drain, health, client_gone
    uint64_t _next_answer = 1;  // numbers the answers' ids
    http_counters _counters;
};

}  // namespace ordo::http
