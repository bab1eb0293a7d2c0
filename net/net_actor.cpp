// net_actor.cpp: see net_actor.hpp. Everything here runs on the net actor's loop thread.
#include "net/net_actor.hpp"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>

#include <algorithm>
#include <array>
#include <cassert>
#include <cstring>
#include <optional>

#include "net/request_fields.hpp"

namespace ordo::net {
namespace {

// The read-timeout sweep runs this many times per read_timeout_ms, so a stalled frame is cut
// off between 1x and 1.25x the timeout.
constexpr uint64_t read_timeout_sweeps = 4;
// After an error that closes the connection (bad_frame, read_timeout, too many connections)
// the error frame is written, then the close lingers (net/tcp_conn.cpp): what the client still
// sends is read and discarded until its EOF, so its kernel does not reset the connection before
// it has read the error. Bounded: this long and this many bytes, at most max_connections
// connections at once (they count against it meanwhile).
constexpr uint64_t error_linger_ms = 2000;
constexpr size_t error_linger_bytes_max = 16 << 20;
// client_gone to the scheduler: its mailbox drains in microseconds; past this bound the
// scheduler is stuck or stopped and the message is given up (logged, counted).
constexpr actors::delivery_limits gone_delivery_limits{
    .pending_max = 1u << 16, .retry_ms = 5, .deadline_ms = 30'000};

uint64_t ms_since(std::chrono::steady_clock::time_point t) {
    return uint64_t(std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - t)
                        .count());
}

}  // namespace

// A client connection: the TCP layer's part (tcp_conn: socket, write queue, closing; admitted
// means counted in _open) and the protocol's.
struct net_actor::connection final : tcp_conn {
    frame_decoder decoder;
    std::unordered_set<uint64_t> inflight;  // ids of requests that have no terminal event yet
    // Since when the connection has waited for the rest of a frame (or, before its first
    // frame, for anything): what server.read_timeout_ms bounds. Unset while idle between frames.
    // It does not run while a net_stop_reading fault pauses the connection (_pauses).
    std::optional<clock::time_point> waiting_since;
    bool authenticated = false;  // an `auth` with a right key was answered (keys configured)

    connection(uint64_t i, size_t frame_bytes_max, size_t frame_values_max)
        : decoder(frame_bytes_max, frame_values_max), waiting_since(clock::now()) {
        id = i;
    }
};

net_actor::net_actor(net_options options, size_t mailbox_capacity)
    : actor("net", mailbox_capacity), _options(std::move(options)) {}

net_actor::~net_actor() = default;

// ---- lifecycle ---------------------------------------------------------------------------

void net_actor::on_start() {
    _started_at = clock::now();
    tcp_conn_options conns;
    conns.write_buffer_bytes_max = _options.write_buffer_bytes_max;
    conns.shutdown_grace_ms = _options.shutdown_grace_ms;
    conns.linger_ms = error_linger_ms;
    conns.linger_bytes_max = error_linger_bytes_max;
    conns.lingering_max = _options.connections_max;
    _conns.init(loop(), *this, std::move(conns), log());
    uv_timer_init(loop(), &_sweep_timer);
    _sweep_timer.data = this;
    _pauses.init(loop(), [this](uint64_t id, clock::time_point now) { resume_reading(id, now); });
    must(_gone.init(loop(), _gone_out, gone_delivery_limits,
               [this](const gone_delivery::message& m, const error& why) {
                   if (why.code != "actor_stopped" && why.code != "not_connected") {
                       log().error("client_gone for connection {} undeliverable: {}",
                                   std::get<sched::client_gone>(m).conn, why.message);
                   }
               }),
         "delivery init");
    uint64_t sweep_ms = std::max<uint64_t>(
        1, std::min(_options.read_timeout_ms, error_linger_ms) / read_timeout_sweeps);
    uv_timer_start(&_sweep_timer, &net_actor::sweep_cb, sweep_ms, sweep_ms);
    _listen_status = bind_and_listen();
    if (!_listen_status.ok()) log().error("{}", _listen_status.err().message);
}

status net_actor::bind_and_listen() {
    if (auto st = _listener.open(loop(), _options.host, _options.port, this, &net_actor::connection_cb,
                                 "");
        !st) {
        return st;
    }
    log().info("listening on {}:{}", _options.host, _listener.port());
    return {};
}

void net_actor::on_stop() {
    _listener.close();
    uv_close(reinterpret_cast<uv_handle_t*>(&_sweep_timer), nullptr);
    _pauses.close();
    // Connections with queued events are shut down after those are written (the terminal
    // events of requests ended by the stop); the grace timer bounds a client that never reads.
    size_t flushing = _conns.stop();
    _gone.close();
    log().info("stopping: {} connections ({} flushing)", _conns.size(), flushing);
}

// ---- accepting and reading -----------------------------------------------------------------

void net_actor::connection_cb(uv_stream_t* server, int status) {
    auto* self = static_cast<net_actor*>(server->data);
    if (status < 0) {
        self->log().warn("accept failed: {}", uv_strerror(status));
        return;
    }
    self->accept_one();
}

void net_actor::accept_one() {
    tcp_conn* accepted =
        _conns.accept(_listener.stream(),
                      std::make_unique<connection>(_next_conn_id++, _options.frame_bytes_max,
                                                   _options.frame_values_max));
    if (accepted == nullptr) return;
    auto& c = static_cast<connection&>(*accepted);
    // A client address in its cool-down after repeated auth failures is turned away first.
    if (uint64_t left_ms = _options.auth ? _options.auth->cooldown_left_ms(c.peer_address) : 0;
        left_ms > 0) {
        _counters.auth_refused++;
        fail_connection(c, errc::unauthorized, cut_off_message(left_ms));
        return;
    }
    // At the limit, connections whose client already closed them (their EOF not read yet: a
    // client that closes one connection and opens the next) must not count against this one.
    if (_open >= _options.connections_max) close_peer_closed();
    if (_open < _options.connections_max) {
        admit(c);
        return;
    }
    _counters.connections_refused++;
    fail_connection(c, errc::overloaded,
                    "too many connections (server.max_connections = " +
                        std::to_string(_options.connections_max) + ")");
}

// Admitted connections whose client has closed and that have nothing left to read are closed
// here, as reading their EOF would close them. libuv accepts every connection in the backlog,
// also those that arrived after this loop pass's poll, so those EOFs may not be read yet. One
// poll() over all of them, only when a connection would otherwise be refused.
void net_actor::close_peer_closed() {
    std::vector<pollfd> fds;
    std::vector<tcp_conn*> conns;
    _conns.for_each([&](tcp_conn& c) {
        uv_os_fd_t fd;
        if (!c.admitted || c.closing ||
            uv_fileno(reinterpret_cast<const uv_handle_t*>(&c.tcp), &fd) != 0) {
            return;
        }
        fds.push_back({fd, POLLRDHUP, 0});
        conns.push_back(&c);
    });
    if (fds.empty() || ::poll(fds.data(), fds.size(), 0) <= 0) return;
    for (size_t i = 0; i < fds.size(); i++) {
        int unread = 0;
        if ((fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0 &&
            ioctl(fds[i].fd, FIONREAD, &unread) == 0 && unread == 0) {
            _conns.close(*conns[i], "client closed");
        }
    }
}

void net_actor::admit(connection& c) {
    c.admitted = true;
    _open++;
    _counters.connections_total++;
    c.waiting_since = clock::now();
    _conns.read_start(c);
    log().debug("connection {} accepted", c.id);
}

void net_actor::sweep_cb(uv_timer_t* t) {
    auto& self = *static_cast<net_actor*>(t->data);
    self._conns.sweep_lingering();
    std::vector<connection*> late;
    self._conns.for_each([&](tcp_conn& t) {
        auto& c = static_cast<connection&>(t);
        if (c.admitted && !c.closing && c.waiting_since && !self._pauses.paused(c.id) &&
            ms_since(*c.waiting_since) >= self._options.read_timeout_ms) {
            late.push_back(&c);
        }
    });
    for (connection* c : late) {
        self._counters.read_timeouts++;
        self.fail_connection(*c, errc::read_timeout,
                             c->decoder.pending_bytes() > 0
                                 ? "a frame was not completed within server.read_timeout_ms = " +
                                       std::to_string(self._options.read_timeout_ms)
                                 : "nothing was sent within server.read_timeout_ms = " +
                                       std::to_string(self._options.read_timeout_ms));
    }
}

// ---- the TCP layer's calls (tcp_conn_owner) ----------------------------------------------------

void net_actor::conn_read(tcp_conn& c, const char* data, size_t size) {
    handle_bytes(static_cast<connection&>(c), data, size);
}

// Its requests can no longer be answered: the scheduler cancels them.
void net_actor::conn_stopping(tcp_conn& t, const std::string& reason) {
    auto& c = static_cast<connection&>(t);
    if (!c.inflight.empty()) {
        _gone.send(sched::client_gone{c.id, reason});
        c.inflight.clear();
    }
    if (c.admitted) _open--;
}

void net_actor::conn_closed(tcp_conn& c) {
    _pauses.forget(c.id);
}

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
        const std::string& code = parsed.err().code;
        bool unknown = code == "unknown_op";
        (unknown ? _counters.unknown_ops : _counters.bad_requests)++;
        // chat / apply_template: the template's own errors keep their codes (net/chat.hpp).
        errc e = unknown                        ? errc::unknown_op
                 : code == k_no_chat_template   ? errc::no_chat_template
                 : code == jinja::k_template_error ? errc::template_error
                                                 : errc::bad_request;
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
        bool stopped = st.err().code == "actor_stopped";
        send_error(c, m.id, stopped ? errc::shutting_down : errc::overloaded, st.err().message);
        return;
    }
    c.inflight.insert(m.id);
}

std::map<std::string, uint64_t> net_actor::counters_map() const {
    const auto& k = _counters;
    return {{"connections_open", _open.load()},
            {"connections_total", k.connections_total},
            {"connections_refused", k.connections_refused},
            {"requests", k.requests},
            {"bad_frames", k.bad_frames},
            {"bad_requests", k.bad_requests},
            {"unknown_ops", k.unknown_ops},
            {"slow_readers", _conns.slow_readers()},
            {"read_timeouts", k.read_timeouts},
            {"responses_too_large", k.responses_too_large},
            {"fault_drops", k.fault_drops},
            {"fault_pauses", k.fault_pauses},
            {"auth_failures", k.auth_failures},
            {"auth_refused", k.auth_refused},
            {"bytes_in", _conns.bytes_in()},
            {"bytes_out", _conns.bytes_out()}};
}

void net_actor::op_health(connection& c, uint64_t id) {
    event_writer w(id, "done");
    w.field("status", _health_status);
    // A reason goes with ok too: KV persistence off after a disk fault impairs nothing that
    // serving needs, so status stays ok, but the operator must be told why.
    if (!_health_reason.empty()) w.field("reason", _health_reason);
    w.field("protocol", protocol_version);
    w.field("uptime_ms", ms_since(_started_at));
    _conns.send(c, w.finish());
}

// With keys configured: a right key authenticates the connection (done), anything else (no key:
// a first frame that is not `auth`) is unauthorized and closes it. Without keys: done, so a
// client may always send `auth`.
void net_actor::op_auth(connection& c, uint64_t id, std::optional<std::string_view> key) {
    auth_verdict v = _options.auth ? _options.auth->check(c.peer_address, key) : auth_verdict::ok;
    switch (v) {
        case auth_verdict::ok:
            c.authenticated = true;
            _conns.send(c, event_writer(id, "done").finish());
            return;
        case auth_verdict::missing:
            _counters.auth_failures++;
            fail_connection(c, errc::unauthorized,
                            "API keys are configured: the first request on a connection must be "
                            "{\"op\": \"auth\", \"key\": KEY}",
                            id);
            return;
        case auth_verdict::wrong:
            _counters.auth_failures++;
            fail_connection(c, errc::unauthorized, "the key is not one of this server's API keys",
                            id);
            return;
        case auth_verdict::cut_off:
            _counters.auth_refused++;
            fail_connection(c, errc::unauthorized, cut_off_message(0), id);
            return;
    }
}

void net_actor::op_stats_local(connection& c, uint64_t id) {
    event_writer w(id, "done");
    w.field("connections_open", uint64_t(_open.load()));
    w.field("net", counters_map());
    if (_options.http_counters) w.field("http", _options.http_counters());
    _conns.send(c, w.finish());
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
        _conns.send(c, std::move(frame));
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
        _conns.close(c, "response_too_large");
    }
}

void net_actor::on(const set_health& m) {
    _health_status = m.status;
    _health_reason = m.reason;
}

void net_actor::on(const drop_connection& m) {
    connection* c = find(m.conn);
    if (c == nullptr) return;
    log().warn("connection {} dropped: {}", m.conn, m.reason);
    _conns.close(*c, "dropped");
}

// A net fault point fired for a request of m.conn (the scheduler saw it reach the armed phase).
// From here on it is the path a dropped or stalled connection takes: a close (the
// scheduler hears client_gone and cancels its requests), or a read that stops and resumes.
void net_actor::on(const net_fault& m) {
    connection* found = find(m.conn);
    if (found == nullptr || found->closing) return;  // already gone
    connection& c = *found;
    log().warn("connection {}: fault {}{}", c.id, m.kind,
               m.kind == "net_stop_reading" ? " for " + std::to_string(m.ms) + " ms" : "");
    if (m.kind == "net_rst") {
        _counters.fault_drops++;
        // RST: what is queued is dropped, the client reads ECONNRESET.
        _conns.reset(c, "fault: net_rst");
    } else if (m.kind == "net_fin") {
        _counters.fault_drops++;
        // FIN after the queued events: the client reads them, then EOF.
        _conns.close_after_writes(c, "fault: net_fin");
    } else if (m.kind == "net_stop_reading") {
        _counters.fault_pauses++;
        _conns.read_stop(c);
        _pauses.pause(c.id, clock::now() + std::chrono::milliseconds(m.ms));
    } else {
        log().error("unknown net fault kind '{}' ignored", m.kind);
    }
}

// A net_stop_reading pause of connection `id` ended.
void net_actor::resume_reading(uint64_t id, clock::time_point now) {
    connection* c = find(id);
    if (c == nullptr || c->closing) return;
    // A frame begun before the pause gets a fresh read timeout.
    if (c->waiting_since) c->waiting_since = now;
    _conns.read_start(*c);
}

void net_actor::on(const begin_drain&) {
    // Stop accepting; open connections go on (their new generate requests are refused by the
    // scheduler with shutting_down, their running ones finish).
    _listener.close();
    log().info("draining: no new connections");
}

// ---- writing and closing ----------------------------------------------------------------------

void net_actor::send_error(connection& c, uint64_t id, errc code, std::string_view message) {
    _conns.send(c, encode_error(id, code, message));
}

void net_actor::fail_connection(connection& c, errc code, const std::string& message,
                                uint64_t id) {
    if (c.closing) return;
    log().info("connection {} from {}: {}: {}", c.id, c.peer_address, wire_name(code), message);
    if (!_conns.send(c, encode_error(id, code, message))) return;  // closed: it did not fit
    // Shut down after the error frame is written, lingering (error_linger_ms); then closed.
    _conns.close_after_writes(c, std::string(wire_name(code)).c_str(), true);
}

net_actor::connection* net_actor::find(uint64_t id) {
    return static_cast<connection*>(_conns.find(id));
}

}  // namespace ordo::net
