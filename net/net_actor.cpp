// net_actor.cpp: see net_actor.hpp. Everything here runs on the net actor's loop thread.
#include "net/net_actor.hpp"

#include <spdlog/spdlog.h>

#include <array>
#include <cassert>
#include <cstring>

namespace ordo::net {
namespace {

// libuv hands every read the same buffer: reads are processed before the next alloc, and one
// 64 KiB read is enough to keep a connection moving without per-read allocations.
constexpr size_t read_buffer_bytes = 64 * 1024;
constexpr int listen_backlog = 128;
// How often a client_gone refused by a full scheduler mailbox is offered again.
constexpr uint64_t gone_retry_ms = 5;

}  // namespace

struct net_actor::connection {
    uv_tcp_t tcp{};  // tcp.data points back here
    uv_shutdown_t shutdown_req{};
    net_actor* owner = nullptr;
    uint64_t id = 0;
    frame_decoder decoder;
    std::unordered_set<uint64_t> inflight;  // ids of requests that have no terminal event yet
    size_t write_pending_bytes = 0;
    bool closing = false;  // no further reads are handled nor writes queued

    connection(net_actor* o, uint64_t i, size_t frame_bytes_max)
        : owner(o), id(i), decoder(frame_bytes_max) {}
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
    _started_at = std::chrono::steady_clock::now();
    uv_timer_init(loop(), &_gone_timer);
    uv_timer_init(loop(), &_grace_timer);
    _gone_timer.data = _grace_timer.data = this;
    _listen_status = bind_and_listen();
    if (!_listen_status.ok()) log().error("{}", _listen_status.err().message);
}

status net_actor::bind_and_listen() {
    sockaddr_storage addr{};
    bool v6 = _options.host.find(':') != std::string::npos;
    int rc = v6 ? uv_ip6_addr(_options.host.c_str(), _options.port,
                              reinterpret_cast<sockaddr_in6*>(&addr))
                : uv_ip4_addr(_options.host.c_str(), _options.port,
                              reinterpret_cast<sockaddr_in*>(&addr));
    if (rc != 0) {
        return make_error("listen_failed", "bad listen host '" + _options.host + "': " +
                                               uv_strerror(rc));
    }
    uv_tcp_init(loop(), &_listener);
    _listener.data = this;
    _listening = true;  // initialised: must be closed in on_stop whatever happens next
    std::string where = _options.host + ":" + std::to_string(_options.port);
    if ((rc = uv_tcp_bind(&_listener, reinterpret_cast<sockaddr*>(&addr), 0)) != 0 ||
        (rc = uv_listen(reinterpret_cast<uv_stream_t*>(&_listener), listen_backlog,
                        &net_actor::connection_cb)) != 0) {
        return make_error("listen_failed", "cannot listen on " + where + ": " + uv_strerror(rc));
    }
    sockaddr_storage bound{};
    int len = sizeof(bound);
    uv_tcp_getsockname(&_listener, reinterpret_cast<sockaddr*>(&bound), &len);
    _bound_port = ntohs(bound.ss_family == AF_INET6
                            ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    log().info("listening on {}:{}", _options.host, _bound_port);
    return {};
}

void net_actor::on_stop() {
    if (_listening) {
        uv_close(reinterpret_cast<uv_handle_t*>(&_listener), nullptr);
        _listening = false;
    }
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
    if (!_gone_pending.empty()) {
        log().warn("{} client_gone messages undelivered at stop", _gone_pending.size());
    }
    uv_close(reinterpret_cast<uv_handle_t*>(&_gone_timer), nullptr);
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
    if (uv_accept(reinterpret_cast<uv_stream_t*>(&_listener),
                  reinterpret_cast<uv_stream_t*>(&c.tcp)) != 0) {
        close_connection(c, "accept failed");
        return;
    }
    uv_tcp_nodelay(&c.tcp, 1);
    // _connections already holds the new one, hence the strict comparison.
    if (_connections.size() > _options.connections_max) {
        _counters.connections_refused++;
        fail_connection(c, make_error("overloaded",
                                      "too many connections (server.max_connections = " +
                                          std::to_string(_options.connections_max) + ")"));
        return;
    }
    _counters.connections_total++;
    uv_read_start(reinterpret_cast<uv_stream_t*>(&c.tcp), &net_actor::alloc_cb,
                  &net_actor::read_cb);
    log().debug("connection {} accepted", id);
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
            fail_connection(c, next.err());
            return;
        }
        if (!next->has_value()) return;  // need more bytes
        msgpack::object_handle oh = std::move(**next);
        handle_frame(c, oh.get());
    }
}

void net_actor::handle_frame(connection& c, const msgpack::object& frame) {
    auto parsed = parse_envelope(frame);
    if (auto* bad = std::get_if<envelope_error>(&parsed)) {
        if (bad->fatal) {
            _counters.bad_frames++;
            fail_connection(c, bad->err);
        } else {
            _counters.bad_requests++;
            send_frame(c, encode_error(bad->id, bad->err.code, bad->err.message));
        }
        return;
    }
    handle_request(c, std::get<request>(parsed));
}

// ---- ops -------------------------------------------------------------------------------------

void net_actor::handle_request(connection& c, const request& r) {
    using handler = void (net_actor::*)(connection&, const request&);
    struct op_entry {
        std::string_view name;
        handler fn;
    };
    static constexpr std::array<op_entry, 2> ops{{
        {"health", &net_actor::op_health},
        {"stats", &net_actor::op_stats},
    }};
    _counters.requests++;
    if (c.inflight.count(r.id) != 0) {
        send_frame(c, encode_error(r.id, "duplicate_id",
                                   "request id " + std::to_string(r.id) + " is still in flight"));
        return;
    }
    if (c.inflight.size() >= _options.inflight_per_connection_max) {
        send_frame(c, encode_error(r.id, "too_many_inflight",
                                   "server.max_inflight_per_connection = " +
                                       std::to_string(_options.inflight_per_connection_max)));
        return;
    }
    for (const auto& op : ops) {
        // With a scheduler, `stats` goes there (it adds the net counters to its own).
        if (op.name == r.op && !(r.op == "stats" && _to_scheduler.bound())) {
            (this->*op.fn)(c, r);
            return;
        }
    }
    if (_to_scheduler.bound()) {
        forward(c, r);
        return;
    }
    _counters.unknown_ops++;
    send_frame(c, encode_error(r.id, "unknown_op", "unknown op \"" + r.op + "\""));
}

void net_actor::forward(connection& c, const request& r) {
    sched::client_request m;
    m.conn = c.id;
    m.id = r.id;
    m.op = r.op;
    msgpack::sbuffer frame;
    msgpack::pack(frame, *r.map);
    m.frame.assign(frame.data(), frame.data() + frame.size());
    if (r.op == "stats") m.net = counters_map();
    if (auto st = _to_scheduler.tell(m); !st.ok()) {
        // The scheduler's mailbox is full (or it is stopping): refuse now rather than queue.
        bool stopping = st.err().code == "actor_stopped";
        send_frame(c, encode_error(r.id, stopping ? "shutting_down" : "overloaded",
                                   st.err().message));
        return;
    }
    c.inflight.insert(r.id);
}

std::map<std::string, uint64_t> net_actor::counters_map() const {
    const auto& k = _counters;
    return {{"connections_open", _connections.size()},
            {"connections_total", k.connections_total},
            {"connections_refused", k.connections_refused},
            {"requests", k.requests},
            {"bad_frames", k.bad_frames},
            {"bad_requests", k.bad_requests},
            {"unknown_ops", k.unknown_ops},
            {"slow_readers", k.slow_readers},
            {"bytes_in", k.bytes_in},
            {"bytes_out", k.bytes_out}};
}

void net_actor::op_health(connection& c, const request& r) {
    if (auto st = check_param_keys(*r.map, {}); !st.ok()) {
        _counters.bad_requests++;
        send_frame(c, encode_error(r.id, st.err().code, st.err().message));
        return;
    }
    auto uptime = std::chrono::steady_clock::now() - _started_at;
    event_writer w(r.id, "done");
    w.field("status", _health_status);
    if (_health_status != "ok") w.field("reason", _health_reason);
    w.field("protocol", protocol_version);
    w.field("uptime_ms",
            std::chrono::duration_cast<std::chrono::milliseconds>(uptime).count());
    send_frame(c, w.finish());
}

void net_actor::op_stats(connection& c, const request& r) {
    if (auto st = check_param_keys(*r.map, {}); !st.ok()) {
        _counters.bad_requests++;
        send_frame(c, encode_error(r.id, st.err().code, st.err().message));
        return;
    }
    event_writer w(r.id, "done");
    w.field("connections_open", _connections.size());
    w.field("net", counters_map());
    send_frame(c, w.finish());
}

// ---- messages from other actors ---------------------------------------------------------------

void net_actor::on(const deliver_event& m) {
    auto it = _connections.find(m.conn);
    if (it == _connections.end()) return;  // the client is gone; the scheduler hears ClientGone
    connection& c = *it->second;
    if (m.terminal) c.inflight.erase(m.id);
    send_frame(c, std::string(m.frame.begin(), m.frame.end()));
}

void net_actor::on(const set_health& m) {
    _health_status = m.status;
    _health_reason = m.reason;
}

// ---- writing and closing ----------------------------------------------------------------------

void net_actor::send_frame(connection& c, std::string frame) {
    if (c.closing) return;
    if (c.write_pending_bytes + frame.size() > _options.write_buffer_bytes_max) {
        // The client stopped reading: buffering more would grow memory without bound.
        _counters.slow_readers++;
        log().warn("connection {}: {} bytes unread (limit {}), closing", c.id,
                   c.write_pending_bytes, _options.write_buffer_bytes_max);
        close_connection(c, "slow_reader");
        return;
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
    }
}

void net_actor::write_cb(uv_write_t* req, int status) {
    auto* w = static_cast<write_req*>(req->data);
    connection& c = *w->conn;
    c.write_pending_bytes -= w->data.size();
    delete w;
    if (status < 0 && status != UV_ECANCELED) c.owner->close_connection(c, uv_strerror(status));
}

void net_actor::fail_connection(connection& c, const error& e) {
    if (c.closing) return;
    log().info("connection {}: {}: {}", c.id, e.code, e.message);
    send_frame(c, encode_error(0, e.code, e.message));
    if (c.closing) return;  // the error itself did not fit
    c.closing = true;
    uv_read_stop(reinterpret_cast<uv_stream_t*>(&c.tcp));
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

void net_actor::close_connection(connection& c, const char* reason) {
    if (uv_is_closing(reinterpret_cast<uv_handle_t*>(&c.tcp))) return;
    log().debug("connection {} closing: {}", c.id, reason);
    if (_to_scheduler.bound() && !c.inflight.empty()) {
        // The scheduler cancels this connection's requests; nothing more is written here.
        tell_client_gone(sched::client_gone{c.id, reason});
        c.inflight.clear();
    }
    c.closing = true;
    uv_read_stop(reinterpret_cast<uv_stream_t*>(&c.tcp));
    uv_close(reinterpret_cast<uv_handle_t*>(&c.tcp), &net_actor::close_cb);
}

void net_actor::tell_client_gone(sched::client_gone m) {
    // Order matters: a later client_gone must not overtake an earlier refused one.
    if (_gone_pending.empty() && _to_scheduler.tell(m).ok()) return;
    _gone_pending.push_back(std::move(m));
    if (!stopping() && !uv_is_active(reinterpret_cast<uv_handle_t*>(&_gone_timer))) {
        uv_timer_start(&_gone_timer, &net_actor::gone_retry_cb, gone_retry_ms, gone_retry_ms);
    }
}

void net_actor::gone_retry_cb(uv_timer_t* t) {
    auto& self = *static_cast<net_actor*>(t->data);
    while (!self._gone_pending.empty()) {
        auto st = self._to_scheduler.tell(self._gone_pending.front());
        if (!st.ok() && st.err().code == "mailbox_full") break;  // again on the next tick
        if (!st.ok()) {
            // The scheduler has stopped and ended every request itself.
            self._gone_pending.clear();
            break;
        }
        self._gone_pending.pop_front();
    }
    if (self._gone_pending.empty()) uv_timer_stop(t);
}

void net_actor::close_cb(uv_handle_t* handle) {
    auto& c = *static_cast<connection*>(handle->data);
    net_actor& self = *c.owner;
    self._connections.erase(c.id);  // frees c
    auto* grace = reinterpret_cast<uv_handle_t*>(&self._grace_timer);
    if (self.stopping() && self._connections.empty() && !uv_is_closing(grace)) {
        uv_close(grace, nullptr);
    }
}

}  // namespace ordo::net
