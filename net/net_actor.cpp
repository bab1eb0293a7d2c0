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

// libuv hands every read the same buffer: reads are processed before the next alloc, and one
// 64 KiB read is enough to keep a connection moving without per-read allocations.
constexpr size_t read_buffer_bytes = 64 * 1024;
// The read-timeout sweep runs this many times per read_timeout_ms, so a stalled frame is cut
// off between 1x and 1.25x the timeout.
constexpr uint64_t read_timeout_sweeps = 4;
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

struct net_actor::connection {
    uv_tcp_t tcp{};  // tcp.data points back here
    uv_shutdown_t shutdown_req{};
    net_actor* owner = nullptr;
    uint64_t id = 0;
    frame_decoder decoder;
    std::unordered_set<uint64_t> inflight;  // ids of requests that have no terminal event yet
    size_t write_pending_bytes = 0;
    bool admitted = false;  // counted in _open and reading
    bool closing = false;   // no further reads are handled nor writes queued
    // Since when the connection has waited for the rest of a frame (or, before its first
    // frame, for anything): what server.read_timeout_ms bounds. Unset while idle between frames.
    // It does not run while a net_stop_reading fault pauses the connection (_pauses).
    std::optional<clock::time_point> waiting_since;

    connection(net_actor* o, uint64_t i, size_t frame_bytes_max)
        : owner(o), id(i), decoder(frame_bytes_max), waiting_since(clock::now()) {}
};

struct net_actor::write_req {
    uv_write_t req{};
    std::string data;
    connection* conn = nullptr;
};

net_actor::net_actor(net_options options, size_t mailbox_capacity)
    : actor("net", mailbox_capacity), _options(std::move(options)) {}

net_actor::~net_actor() = default;

// ---- lifecycle ---------------------------------------------------------------------------

void net_actor::on_start() {
    _started_at = clock::now();
    uv_timer_init(loop(), &_grace_timer);
    uv_timer_init(loop(), &_sweep_timer);
    _grace_timer.data = _sweep_timer.data = this;
    _pauses.init(loop(), [this](uint64_t id, clock::time_point now) { resume_reading(id, now); });
    must(_gone.init(loop(), _gone_out, gone_delivery_limits,
               [this](const gone_delivery::message& m, const error& why) {
                   if (why.code != "actor_stopped" && why.code != "not_connected") {
                       log().error("client_gone for connection {} undeliverable: {}",
                                   std::get<sched::client_gone>(m).conn, why.message);
                   }
               }),
         "delivery init");
    uint64_t sweep_ms = std::max<uint64_t>(1, _options.read_timeout_ms / read_timeout_sweeps);
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
    size_t flushing = 0;
    for (auto& [id, c] : _connections) {
        if (c->write_pending_bytes > 0 && !c->closing) {
            c->closing = true;
            uv_read_stop(reinterpret_cast<uv_stream_t*>(&c->tcp));
            c->shutdown_req.data = c.get();
            if (uv_shutdown(&c->shutdown_req, reinterpret_cast<uv_stream_t*>(&c->tcp),
                            &net_actor::shutdown_cb) == 0) {
                flushing++;
                continue;
            }
            c->closing = false;
        }
        close_connection(*c, "server stopping");
    }
    _gone.close();
    if (flushing > 0) {
        uv_timer_start(&_grace_timer, &net_actor::grace_cb, _options.shutdown_grace_ms, 0);
    } else {
        uv_close(reinterpret_cast<uv_handle_t*>(&_grace_timer), nullptr);
    }
    log().info("stopping: {} connections ({} flushing)", _connections.size(), flushing);
}

void net_actor::grace_cb(uv_timer_t* t) {
    auto& self = *static_cast<net_actor*>(t->data);
    for (auto& [id, c] : self._connections) {
        if (!uv_is_closing(reinterpret_cast<uv_handle_t*>(&c->tcp))) {
            uv_close(reinterpret_cast<uv_handle_t*>(&c->tcp), &net_actor::close_cb);
        }
    }
    uv_close(reinterpret_cast<uv_handle_t*>(t), nullptr);
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
    uint64_t id = _next_conn_id++;
    auto owned = std::make_unique<connection>(this, id, _options.frame_bytes_max);
    connection& c = *owned;
    uv_tcp_init(loop(), &c.tcp);
    c.tcp.data = &c;
    _connections.emplace(id, std::move(owned));
    if (uv_accept(_listener.stream(),
                  reinterpret_cast<uv_stream_t*>(&c.tcp)) != 0) {
        close_connection(c, "accept failed");
        return;
    }
    uv_tcp_nodelay(&c.tcp, 1);
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
    std::vector<connection*> conns;
    for (auto& [id, c] : _connections) {
        uv_os_fd_t fd;
        if (!c->admitted || c->closing ||
            uv_fileno(reinterpret_cast<const uv_handle_t*>(&c->tcp), &fd) != 0) {
            continue;
        }
        fds.push_back({fd, POLLRDHUP, 0});
        conns.push_back(c.get());
    }
    if (fds.empty() || ::poll(fds.data(), fds.size(), 0) <= 0) return;
    for (size_t i = 0; i < fds.size(); i++) {
        int unread = 0;
        if ((fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0 &&
            ioctl(fds[i].fd, FIONREAD, &unread) == 0 && unread == 0) {
            close_connection(*conns[i], "client closed");
        }
    }
}

void net_actor::admit(connection& c) {
    c.admitted = true;
    _open++;
    _counters.connections_total++;
    c.waiting_since = clock::now();
    uv_read_start(reinterpret_cast<uv_stream_t*>(&c.tcp), &net_actor::alloc_cb,
                  &net_actor::read_cb);
    log().debug("connection {} accepted", c.id);
}

void net_actor::sweep_cb(uv_timer_t* t) {
    auto& self = *static_cast<net_actor*>(t->data);
    std::vector<connection*> late;
    for (auto& [id, c] : self._connections) {
        if (c->admitted && !c->closing && c->waiting_since && !self._pauses.paused(c->id) &&
            ms_since(*c->waiting_since) >= self._options.read_timeout_ms) {
            late.push_back(c.get());
        }
    }
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

void net_actor::alloc_cb(uv_handle_t*, size_t, uv_buf_t* buf) {
    static thread_local std::array<char, read_buffer_bytes> buffer;
    *buf = uv_buf_init(buffer.data(), buffer.size());
}

void net_actor::read_cb(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) {
    auto& c = *static_cast<connection*>(stream->data);
    net_actor& self = *c.owner;
    if (nread == UV_EOF) {
        self.close_connection(c, "client closed");
    } else if (nread < 0) {
        self.close_connection(c, uv_strerror(static_cast<int>(nread)));
    } else if (nread > 0) {
        self._counters.bytes_in += static_cast<uint64_t>(nread);
        self.handle_bytes(c, buf->base, static_cast<size_t>(nread));
    }
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
            {"slow_readers", k.slow_readers},
            {"read_timeouts", k.read_timeouts},
            {"responses_too_large", k.responses_too_large},
            {"fault_drops", k.fault_drops},
            {"fault_pauses", k.fault_pauses},
            {"bytes_in", k.bytes_in},
            {"bytes_out", k.bytes_out}};
}

void net_actor::op_health(connection& c, uint64_t id) {
    event_writer w(id, "done");
    w.field("status", _health_status);
    // A reason goes with ok too: KV persistence off after a disk fault impairs nothing that
    // serving needs, so status stays ok, but the operator must be told why.
    if (!_health_reason.empty()) w.field("reason", _health_reason);
    w.field("protocol", protocol_version);
    w.field("uptime_ms", ms_since(_started_at));
    send_frame(c, w.finish());
}

void net_actor::op_stats_local(connection& c, uint64_t id) {
    event_writer w(id, "done");
    w.field("connections_open", uint64_t(_open.load()));
    w.field("net", counters_map());
    if (_options.http_counters) w.field("http", _options.http_counters());
    send_frame(c, w.finish());
}

// ---- messages from other actors ---------------------------------------------------------------

template <typename T>
void net_actor::write_event(const T& e) {
    auto it = _connections.find(e.conn);
    if (it == _connections.end()) return;  // the client is gone; the scheduler heard client_gone
    connection& c = *it->second;
    constexpr bool terminal = is_terminal<T>();
    if (terminal) c.inflight.erase(e.id);
    std::string frame = encode(e);
    if (frame.size() <= _options.write_buffer_bytes_max) {
        send_frame(c, std::move(frame));
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
        close_connection(c, "response_too_large");
    }
}

void net_actor::on(const set_health& m) {
    _health_status = m.status;
    _health_reason = m.reason;
}

void net_actor::on(const drop_connection& m) {
    auto it = _connections.find(m.conn);
    if (it == _connections.end()) return;
    log().warn("connection {} dropped: {}", m.conn, m.reason);
    close_connection(*it->second, "dropped");
}

// A net fault point fired for a request of m.conn (the scheduler saw it reach the armed phase).
// From here on it is the path a dropped or stalled connection takes: close_connection (the
// scheduler hears client_gone and cancels its requests), or a read that stops and resumes.
void net_actor::on(const net_fault& m) {
    auto it = _connections.find(m.conn);
    if (it == _connections.end() || it->second->closing) return;  // already gone
    connection& c = *it->second;
    log().warn("connection {}: fault {}{}", c.id, m.kind,
               m.kind == "net_stop_reading" ? " for " + std::to_string(m.ms) + " ms" : "");
    if (m.kind == "net_rst") {
        _counters.fault_drops++;
        // RST: what is queued is dropped, the client reads ECONNRESET.
        stop_reading(c, "fault: net_rst");
        if (uv_tcp_close_reset(&c.tcp, &net_actor::close_cb) != 0) {
            uv_close(reinterpret_cast<uv_handle_t*>(&c.tcp), &net_actor::close_cb);
        }
    } else if (m.kind == "net_fin") {
        _counters.fault_drops++;
        // FIN after the queued events: the client reads them, then EOF.
        stop_reading(c, "fault: net_fin");
        c.shutdown_req.data = &c;
        if (uv_shutdown(&c.shutdown_req, reinterpret_cast<uv_stream_t*>(&c.tcp),
                        &net_actor::shutdown_cb) != 0) {
            uv_close(reinterpret_cast<uv_handle_t*>(&c.tcp), &net_actor::close_cb);
        }
    } else if (m.kind == "net_stop_reading") {
        _counters.fault_pauses++;
        uv_read_stop(reinterpret_cast<uv_stream_t*>(&c.tcp));
        _pauses.pause(c.id, clock::now() + std::chrono::milliseconds(m.ms));
    } else {
        log().error("unknown net fault kind '{}' ignored", m.kind);
    }
}

// A net_stop_reading pause of connection `id` ended.
void net_actor::resume_reading(uint64_t id, clock::time_point now) {
    auto it = _connections.find(id);
    if (it == _connections.end() || it->second->closing) return;
    connection& c = *it->second;
    // A frame begun before the pause gets a fresh read timeout.
    if (c.waiting_since) c.waiting_since = now;
    uv_read_start(reinterpret_cast<uv_stream_t*>(&c.tcp), &net_actor::alloc_cb,
                  &net_actor::read_cb);
}

void net_actor::on(const begin_drain&) {
    // Stop accepting; open connections go on (their new generate requests are refused by the
    // scheduler with shutting_down, their running ones finish).
    _listener.close();
    log().info("draining: no new connections");
}

// ---- writing and closing ----------------------------------------------------------------------

void net_actor::send_error(connection& c, uint64_t id, errc code, std::string_view message) {
    send_frame(c, encode_error(id, code, message));
}

bool net_actor::send_frame(connection& c, std::string frame) {
    if (c.closing) return false;
    if (c.write_pending_bytes + frame.size() > _options.write_buffer_bytes_max) {
        // The client stopped reading: buffering more would grow memory without bound.
        _counters.slow_readers++;
        log().warn("connection {}: {} bytes unread (limit {}), closing", c.id,
                   c.write_pending_bytes, _options.write_buffer_bytes_max);
        close_connection(c, "slow_reader");
        return false;
    }
    auto* w = new write_req;
    w->data = std::move(frame);
    w->conn = &c;
    w->req.data = w;
    c.write_pending_bytes += w->data.size();
    _counters.bytes_out += w->data.size();
    uv_buf_t buf = uv_buf_init(w->data.data(), static_cast<unsigned>(w->data.size()));
    int rc = uv_write(&w->req, reinterpret_cast<uv_stream_t*>(&c.tcp), &buf, 1,
                      &net_actor::write_cb);
    if (rc != 0) {
        c.write_pending_bytes -= w->data.size();
        delete w;
        close_connection(c, uv_strerror(rc));
        return false;
    }
    return true;
}

void net_actor::write_cb(uv_write_t* req, int status) {
    auto* w = static_cast<write_req*>(req->data);
    connection& c = *w->conn;
    c.write_pending_bytes -= w->data.size();
    delete w;
    if (status < 0 && status != UV_ECANCELED) c.owner->close_connection(c, uv_strerror(status));
}

void net_actor::fail_connection(connection& c, errc code, const std::string& message) {
    if (c.closing) return;
    log().info("connection {}: {}: {}", c.id, wire_name(code), message);
    if (!send_frame(c, encode_error(0, code, message))) return;  // closed: it did not fit
    stop_reading(c, std::string(wire_name(code)));
    // shutdown completes after the queued error frame is written; then the handle is closed.
    c.shutdown_req.data = &c;
    if (uv_shutdown(&c.shutdown_req, reinterpret_cast<uv_stream_t*>(&c.tcp),
                    &net_actor::shutdown_cb) != 0) {
        uv_close(reinterpret_cast<uv_handle_t*>(&c.tcp), &net_actor::close_cb);
    }
}

void net_actor::shutdown_cb(uv_shutdown_t* req, int) {
    auto& c = *static_cast<connection*>(req->data);
    if (!uv_is_closing(reinterpret_cast<uv_handle_t*>(&c.tcp))) {
        uv_close(reinterpret_cast<uv_handle_t*>(&c.tcp), &net_actor::close_cb);
    }
}

void net_actor::stop_reading(connection& c, const std::string& reason) {
    if (!c.inflight.empty()) {
        // Its requests can no longer be answered: the scheduler cancels them.
        _gone.send(sched::client_gone{c.id, reason});
        c.inflight.clear();
    }
    if (!c.closing && c.admitted) _open--;
    c.closing = true;
    uv_read_stop(reinterpret_cast<uv_stream_t*>(&c.tcp));
}

void net_actor::close_connection(connection& c, const char* reason) {
    if (uv_is_closing(reinterpret_cast<uv_handle_t*>(&c.tcp))) return;
    log().debug("connection {} closing: {}", c.id, reason);
    stop_reading(c, reason);
    uv_close(reinterpret_cast<uv_handle_t*>(&c.tcp), &net_actor::close_cb);
}

void net_actor::close_cb(uv_handle_t* handle) {
    auto& c = *static_cast<connection*>(handle->data);
    net_actor& self = *c.owner;
    self._pauses.forget(c.id);
    self._connections.erase(c.id);  // frees c
    auto* grace = reinterpret_cast<uv_handle_t*>(&self._grace_timer);
    if (self.stopping() && self._connections.empty() && !uv_is_closing(grace)) {
        uv_close(grace, nullptr);
    }
}

}  // namespace ordo::net
