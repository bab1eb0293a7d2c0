// net_actor.cpp: see net_actor.hpp. Everything here runs on the net actor's loop thread.
#include "net/net_actor.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cassert>
#include <cstring>
#include <optional>

#include "net/request_fields.hpp"

namespace ordo::net {
namespace {

using door::errc;

// After an error that closes the connection (bad_frame, read_timeout, too many connections)
// the error frame is written, then the close lingers (door/tcp_conn.cpp): what the client still
// sends is read and discarded until its EOF, so its kernel does not reset the connection before
// it has read the error. Bounded: this long and this many bytes, at most max_connections
// connections at once (they count against it meanwhile).
constexpr uint64_t error_linger_ms = 2000;
constexpr size_t error_linger_bytes_max = 16 << 20;

uint64_t ms_since(std::chrono::steady_clock::time_point t) {
    return uint64_t(
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t)
            .count());
}

door::front_door_options door_options(const net_options& o) {
    door::front_door_options d;
    d.door = door::door_kind::net;
    d.host = o.host;
    d.port = o.port;
    d.connections_max = o.connections_max;
    d.connections_max_key = "server.max_connections";
    d.conns.write_buffer_bytes_max = o.write_buffer_bytes_max;
    d.conns.shutdown_grace_ms = o.shutdown_grace_ms;
    d.conns.linger_ms = error_linger_ms;
    d.conns.linger_bytes_max = error_linger_bytes_max;
    d.timeout_ms_min = std::min(o.read_timeout_ms, error_linger_ms);
    d.reclaim_peer_closed = true;
    d.auth = o.auth;
    return d;
}

}  // namespace

// A client connection: the TCP layer's part (door::tcp_conn: socket, write queue, closing;
// admitted means counted against the connection limit) and the protocol's.
struct net_actor::connection final : door::tcp_conn {
    frame_decoder decoder;
    std::unordered_set<uint64_t> inflight;  // ids of requests that have no terminal event yet
    // Since when the connection has waited for the rest of a frame (or, before its first
    // frame, for anything): what server.read_timeout_ms bounds. Unset while idle between frames.
    // It does not run while a net_stop_reading fault pauses the connection.
    std::optional<clock::time_point> waiting_since;
    bool authenticated = false;  // an `auth` with a right key was answered (keys configured)

    connection(uint64_t i, size_t frame_bytes_max, size_t frame_values_max)
        : decoder(frame_bytes_max, frame_values_max), waiting_since(clock::now()) {
        id = i;
    }
};

net_actor::net_actor(net_options options, size_t mailbox_capacity)
    : actor("net", mailbox_capacity),
      _options(std::move(options)),
      _door(door_options(_options), *this) {}

net_actor::~net_actor() = default;

void net_actor::on_start() {
    must(_door.start(loop(), log()), "delivery init");
}

void net_actor::on_stop() {
    _door.stop();
}

// ---- the front door's calls (front_door_owner) --------------------------------------------------

std::unique_ptr<door::tcp_conn> net_actor::door_conn(uint64_t id) {
    return std::make_unique<connection>(id, _options.frame_bytes_max, _options.frame_values_max);
}

// A cut-off address or one connection too many: one error frame, then the connection closes.
void net_actor::door_refuse(door::tcp_conn& c, errc code, const std::string& message, uint64_t) {
    fail_connection(static_cast<connection&>(c), code, message);
}

void net_actor::door_admitted(door::tcp_conn& t) {
    auto& c = static_cast<connection&>(t);
    c.waiting_since = clock::now();
    _door.conns().read_start(c);
    log().debug("connection {} accepted", c.id);
}

void net_actor::door_read(door::tcp_conn& c, const char* data, size_t size) {
    assert(!c.closing && "a connection that is closing is not read");
    handle_bytes(static_cast<connection&>(c), data, size);
}

// Its requests can no longer be answered: the scheduler cancels them.
bool net_actor::door_abandon(door::tcp_conn& t) {
    auto& c = static_cast<connection&>(t);
    bool live = !c.inflight.empty();
    c.inflight.clear();
    return live;
}

// A frame begun (or, on a new connection, nothing sent) longer than server.read_timeout_ms.
void net_actor::door_sweep(door::tcp_conn& t) {
    auto& c = static_cast<connection&>(t);
    if (!c.waiting_since || ms_since(*c.waiting_since) < _options.read_timeout_ms) return;
    _counters.read_timeouts++;
    fail_connection(c, errc::read_timeout,
                    c.decoder.pending_bytes() > 0
                        ? "a frame was not completed within server.read_timeout_ms = " +
                              std::to_string(_options.read_timeout_ms)
                        : "nothing was sent within server.read_timeout_ms = " +
                              std::to_string(_options.read_timeout_ms));
}

void net_actor::door_resumed(door::tcp_conn& t, clock::time_point now) {
    auto& c = static_cast<connection&>(t);
    // A frame begun before the pause gets a fresh read timeout.
    if (c.waiting_since) c.waiting_since = now;
    _door.conns().read_start(c);
}

// ---- reading -----------------------------------------------------------------------------------

void net_actor::handle_bytes(connection& c, const char* data, size_t size) {
    c.decoder.feed(data, size);
    while (!c.closing) {
        auto next = c.decoder.next();
        if (!next.ok()) {
            _counters.bad_frames++;
            fail_connection(c, errc::bad_frame, next.err().message);
            return;
        }
        if (!next->has_value()) break;  // need more bytes
        msgpack::object_handle oh = std::move(**next);
        handle_frame(c, oh.get());
    }
    // The read timeout runs while part of a frame is here; between whole frames it rests.
    if (c.decoder.pending_bytes() == 0) {
        c.waiting_since.reset();
    } else if (!c.waiting_since) {
        c.waiting_since = clock::now();
    }
}

void net_actor::handle_frame(connection& c, const msgpack::object& frame) {
    auto parsed = parse_envelope(frame);
    if (auto* bad = std::get_if<envelope_error>(&parsed)) {
        if (bad->fatal) {
            _counters.bad_frames++;
            fail_connection(c, errc::bad_frame, bad->err.message);
        } else {
            _counters.bad_requests++;
            send_error(c, bad->id, errc::bad_request, bad->err.message);
        }
        return;
    }
    handle_request(c, std::get<request>(parsed));
}

// ---- ops -------------------------------------------------------------------------------------

void net_actor::handle_request(connection& c, const request& r) {
    assert(!c.closing);  // handle_bytes stops at the frame that closed it
    _counters.requests++;
    if (c.inflight.count(r.id) != 0) {
        send_error(c, r.id, errc::duplicate_id,
                   "request id " + std::to_string(r.id) + " is still in flight");
        return;
    }
    if (c.inflight.size() >= _options.inflight_per_connection_max) {
        send_error(c, r.id, errc::too_many_inflight,
                   "server.max_inflight_per_connection = " +
                       std::to_string(_options.inflight_per_connection_max));
        return;
    }
    auto parsed = parse_op(r, _options.limits);
    if (!c.authenticated && _options.auth && _options.auth->required()) {
        // The first frame of a connection that must authenticate: `auth`, or it is refused
        // (whatever it was, also a malformed request) and the connection closes.
        const auth_op* a = parsed.ok() ? std::get_if<auth_op>(&*parsed) : nullptr;
        op_auth(c, r.id, a ? std::optional<std::string_view>(a->key) : std::nullopt);
        return;
    }
    if (!parsed.ok()) {
        // The parser's codes are the protocol's: bad_request, unknown_op, and for chat /
        // apply_template the template's own no_chat_template and template_error (net/chat.hpp).
        const errc e = door::errc_from_wire_name(parsed.err().code).value_or(errc::bad_request);
        (e == errc::unknown_op ? _counters.unknown_ops : _counters.bad_requests)++;
        send_error(c, r.id, e, parsed.err().message);
        return;
    }
    std::visit(
        [&](auto& m) {
            using T = std::decay_t<decltype(m)>;
            if constexpr (std::is_same_v<T, health_op>) {
                op_health(c, r.id);
            } else if constexpr (std::is_same_v<T, auth_op>) {
                op_auth(c, r.id, m.key);
            } else if (!_to_scheduler.bound()) {
                if constexpr (std::is_same_v<T, sched::stats_query>) {
                    op_stats_local(c, r.id);
                } else {
                    _counters.unknown_ops++;
                    send_error(c, r.id, errc::unknown_op,
                               "unknown op " + fields::quote(r.op) + " (no scheduler)");
                }
            } else {
                if constexpr (std::is_same_v<T, sched::stats_query>) {
                    m.net = counters_map();
                    if (_options.http_counters) m.http = _options.http_counters();
                }
                forward(c, std::move(m));
            }
        },
        *parsed);
}

template <typename T>
void net_actor::forward(connection& c, T m) {
    m.conn = c.id;
    if (auto st = _to_scheduler.tell(m); !st.ok()) {
        // The scheduler's mailbox is full (or it is stopping): refuse now rather than queue.
        bool stopped = st.err().outcome == actors::delivery_outcome::actor_stopped;
        send_error(c, m.id, stopped ? errc::shutting_down : errc::overloaded, st.err().message);
        return;
    }
    c.inflight.insert(m.id);
    assert(c.inflight.size() <= _options.inflight_per_connection_max);
}

std::map<std::string, uint64_t> net_actor::counters_map() const {
    const auto& k = _counters;
    std::map<std::string, uint64_t> m = _door.counters_map();
    m.insert({{"requests", k.requests},
              {"bad_frames", k.bad_frames},
              {"bad_requests", k.bad_requests},
              {"unknown_ops", k.unknown_ops},
              {"read_timeouts", k.read_timeouts},
              {"responses_too_large", k.responses_too_large}});
    return m;
}

void net_actor::op_health(connection& c, uint64_t id) {
    event_writer w(id, "done");
    w.field("status", std::string(enum_name(_door.health_status())));
    // A reason goes with ok too: KV persistence off after a disk fault impairs nothing that
    // serving needs, so status stays ok, but the operator must be told why.
    if (!_door.health_reason().empty()) w.field("reason", _door.health_reason());
    w.field("protocol", protocol_version);
    w.field("uptime_ms", _door.uptime_ms());
    _door.conns().send(c, w.finish());
}

// With keys configured: a right key authenticates the connection (done), anything else (no key:
// a first frame that is not `auth`) is unauthorized and closes it. Without keys: done, so a
// client may always send `auth`.
void net_actor::op_auth(connection& c, uint64_t id, std::optional<std::string_view> key) {
    door::auth_verdict v =
        _options.auth ? _options.auth->check(c.peer_address, key) : door::auth_verdict::ok;
    switch (v) {
        case door::auth_verdict::ok:
            c.authenticated = true;
            _door.conns().send(c, event_writer(id, "done").finish());
            return;
        case door::auth_verdict::missing:
            _door.counters().auth_failures++;
            fail_connection(c, errc::unauthorized,
                            "API keys are configured: the first request on a connection must be "
                            "{\"op\": \"auth\", \"key\": KEY}",
                            id);
            return;
        case door::auth_verdict::wrong:
            _door.counters().auth_failures++;
            fail_connection(c, errc::unauthorized, "the key is not one of this server's API keys",
                            id);
            return;
        case door::auth_verdict::cut_off:
            _door.counters().auth_refused++;
            fail_connection(c, errc::unauthorized, door::cut_off_message(0), id);
            return;
    }
}

void net_actor::op_stats_local(connection& c, uint64_t id) {
    event_writer w(id, "done");
    w.field("connections_open", uint64_t(_door.open()));
    w.field("net", counters_map());
    if (_options.http_counters) w.field("http", _options.http_counters());
    _door.conns().send(c, w.finish());
}

// ---- messages from other actors ---------------------------------------------------------------

template <typename T>
void net_actor::write_event(const T& e) {
    connection* found = find(e.conn);
    if (found == nullptr) return;  // the client is gone; the scheduler heard client_gone
    connection& c = *found;
    constexpr bool terminal = is_terminal<T>();
    if (terminal) c.inflight.erase(e.id);
    std::string frame = encode(e);
    if (frame.size() <= _options.write_buffer_bytes_max) {
        _door.conns().send(c, std::move(frame));
        return;
    }
    // One event larger than the whole write buffer could never be queued: the request gets a
    // clear error instead (a token event is never this large at the configurable minimum).
    _counters.responses_too_large++;
    std::string why = "the answer is " + std::to_string(frame.size()) +
                      " bytes, more than server.write_buffer_bytes_max = " +
                      std::to_string(_options.write_buffer_bytes_max);
    log().warn("connection {} id {}: {}", c.id, e.id, why);
    if (terminal) {
        send_error(c, e.id, errc::response_too_large, why);
    } else {
        _door.conns().close(c, "response_too_large");
    }
}

// ---- writing and closing ----------------------------------------------------------------------

void net_actor::send_error(connection& c, uint64_t id, errc code, std::string_view message) {
    _door.conns().send(c, encode_error(id, code, message));
}

void net_actor::fail_connection(connection& c, errc code, const std::string& message, uint64_t id) {
    if (c.closing) return;
    log().info("connection {} from {}: {}: {}", c.id, c.peer_address, wire_name(code), message);
    // Closed when it did not fit.
    if (!_door.conns().send(c, encode_error(id, code, message))) return;
    // Shut down after the error frame is written, lingering (error_linger_ms); then closed.
    _door.conns().close_after_writes(c, std::string(wire_name(code)).c_str(), true);
}

net_actor::connection* net_actor::find(uint64_t conn) {
    return static_cast<connection*>(_door.find(conn));
}

}  // namespace ordo::net
