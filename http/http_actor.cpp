// http_actor.cpp: see http_actor.hpp. Everything here runs on the HTTP actor's loop thread.
#include "http/http_actor.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cassert>
#include <ctime>
#include <nlohmann/json.hpp>

#include "http/metrics.hpp"

namespace ordo::http {
namespace {

// As the net actor: one 64 KiB read buffer reused by every read (reads are handled before the
// next alloc).
constexpr size_t read_buffer_bytes = 64 * 1024;
// The timeout sweep runs this many times per shortest timeout, so a late request is cut off
// between 1x and 1.25x its timeout.
constexpr uint64_t timeout_sweeps = 4;
// client_gone to the scheduler, bounded as the net actor's.
constexpr actors::delivery_limits gone_delivery_limits{
    .pending_max = 1u << 16, .retry_ms = 5, .deadline_ms = 30'000};

uint64_t ms_since(std::chrono::steady_clock::time_point t) {
    return uint64_t(
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t)
            .count());
}

const char* reason_phrase(int status) {
    switch (status) {
        case 100:
            return "Continue";
        case 200:
            return "OK";
        case 400:
            return "Bad Request";
        case 404:
            return "Not Found";
        case 405:
            return "Method Not Allowed";
        case 408:
            return "Request Timeout";
        case 409:
            return "Conflict";
        case 413:
            return "Content Too Large";
        case 429:
            return "Too Many Requests";
        case 431:
            return "Request Header Fields Too Large";
        case 500:
            return "Internal Server Error";
        case 501:
            return "Not Implemented";
        case 503:
            return "Service Unavailable";
        case 505:
            return "HTTP Version Not Supported";
        default:
            return "Unknown";
    }
}

std::string hex(size_t n) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%zx", n);
    return buf;
}

uint64_t unix_seconds() {
    return uint64_t(std::time(nullptr));
}

}  // namespace

// The request a connection is answering: what the answer must look like and how far it got.
struct http_actor::live_request {
    uint64_t id = 0;  // the request id the scheduler knows (per connection)
    api_request req;
    answer_meta meta;
    bool keep_alive = true;
    bool headers_sent = false;  // a stream has begun: errors now go in the stream
    bool metrics = false;       // GET /metrics: waits for the scheduler's stats_done
};

struct http_actor::connection {
    uv_tcp_t tcp{};  // tcp.data points back here
    uv_shutdown_t shutdown_req{};
    http_actor* owner = nullptr;
    uint64_t id = 0;  // local id; the scheduler knows conn_id(front_door::http, id)
    request_reader reader;
    std::string unread;                // bytes read but not parsed yet (read-ahead bound)
    std::deque<http_request> queued;   // parsed, waiting for the live one to be answered
    std::optional<live_request> live;  // sent to the scheduler, not answered yet
    std::optional<read_error> failed;  // the stream broke after `queued`: answered last
    uint64_t next_request_id = 1;
    size_t write_pending_bytes = 0;
    bool admitted = false;
    bool reading = false;
    bool closing = false;  // no further reads handled nor writes queued
    // What http.header_timeout_ms bounds: since a request began arriving (or the connection
    // was accepted); unset between whole requests.
    std::optional<clock::time_point> waiting_since;
    // What http.keep_alive_timeout_ms bounds: since the last answer, while nothing is pending.
    // Neither timeout runs while a net_stop_reading fault pauses the connection (_pauses): it
    // is the server that is not reading.
    std::optional<clock::time_point> idle_since;
    // Lingering close (close_after_writes): since when; what http.linger_ms bounds.
    std::optional<clock::time_point> lingering_since;
    uint64_t linger_bytes = 0;  // discarded while lingering: what http.max_linger_bytes bounds
    bool write_shut = false;    // the shutdown completed: every answer is written, FIN sent
    bool peer_shut = false;     // the client's EOF was read while lingering

    connection(http_actor* o, uint64_t i, const http_options& opt)
        : owner(o), id(i), reader(opt.header_bytes_max, opt.body_bytes_max) {}
    uint64_t conn() const { return sched::conn_id(sched::front_door::http, id); }
};

struct http_actor::write_req {
    uv_write_t req{};
    std::string data;
    connection* conn = nullptr;
};

http_actor::http_actor(http_options options, size_t mailbox_capacity)
    : actor("http", mailbox_capacity), _options(std::move(options)) {}

http_actor::~http_actor() = default;

// ---- lifecycle ---------------------------------------------------------------------------

void http_actor::on_start() {
    uv_timer_init(loop(), &_sweep_timer);
    uv_timer_init(loop(), &_grace_timer);
    _sweep_timer.data = _grace_timer.data = this;
    _pauses.init(loop(), [this](uint64_t id, clock::time_point now) { resume_reading(id, now); });
    must(_gone.init(loop(), _gone_out, gone_delivery_limits,
                    [this](const gone_delivery::message& m, const error& why) {
                        if (why.code != "actor_stopped" && why.code != "not_connected") {
                            log().error("client_gone for connection {} undeliverable: {}",
                                        std::get<sched::client_gone>(m).conn, why.message);
                        }
                    }),
         "delivery init");
    uint64_t shortest = std::min(_options.header_timeout_ms, _options.keep_alive_timeout_ms);
    if (_options.linger_ms > 0) shortest = std::min(shortest, _options.linger_ms);
    uint64_t sweep_ms = std::max<uint64_t>(1, shortest / timeout_sweeps);
    uv_timer_start(&_sweep_timer, &http_actor::sweep_cb, sweep_ms, sweep_ms);
    _listen_status = bind_and_listen();
    if (!_listen_status.ok()) log().error("{}", _listen_status.err().message);
}

status http_actor::bind_and_listen() {
    if (auto st = _listener.open(loop(), _options.host, _options.port, this, &http_actor::connection_cb,
                                 "http");
        !st) {
        return st;
    }
    log().info("http listening on {}:{}", _options.host, _listener.port());
    return {};
}

void http_actor::on_stop() {
    _listener.close();
    uv_close(reinterpret_cast<uv_handle_t*>(&_sweep_timer), nullptr);
    _pauses.close();
    // The scheduler stopped first: the answers of requests it ended are queued here. They are
    // written, then each connection is shut down; the grace timer bounds a client not reading.
    size_t flushing = 0;
    for (auto& [id, c] : _connections) {
        if (c->lingering_since && !c->write_shut) {
            // Its answer is still being written: no more lingering; the shutdown closes it.
            if (c->reading) uv_read_stop(reinterpret_cast<uv_stream_t*>(&c->tcp));
            c->reading = false;
            flushing++;
        } else if (c->write_pending_bytes > 0 && !c->closing) {
            close_after_writes(*c, "server stopping");
            flushing++;
        } else {
            close_connection(*c, "server stopping");
        }
    }
    _gone.close();
    if (flushing > 0) {
        uv_timer_start(&_grace_timer, &http_actor::grace_cb, _options.shutdown_grace_ms, 0);
    } else {
        uv_close(reinterpret_cast<uv_handle_t*>(&_grace_timer), nullptr);
    }
    log().info("stopping: {} connections ({} flushing)", _connections.size(), flushing);
}

void http_actor::grace_cb(uv_timer_t* t) {
    auto& self = *static_cast<http_actor*>(t->data);
    for (auto& [id, c] : self._connections) {
        if (!uv_is_closing(reinterpret_cast<uv_handle_t*>(&c->tcp))) {
            uv_close(reinterpret_cast<uv_handle_t*>(&c->tcp), &http_actor::close_cb);
        }
    }
    uv_close(reinterpret_cast<uv_handle_t*>(t), nullptr);
}

// ---- accepting and reading -----------------------------------------------------------------

void http_actor::connection_cb(uv_stream_t* server, int status) {
    auto* self = static_cast<http_actor*>(server->data);
    if (status < 0) {
        self->log().warn("accept failed: {}", uv_strerror(status));
        return;
    }
    self->accept_one();
}

void http_actor::accept_one() {
    uint64_t id = _next_conn_id++;
    auto owned = std::make_unique<connection>(this, id, _options);
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
    if (_open >= _options.connections_max) {
        _counters.connections_refused++;
        respond_error(c,
                      {429, "overloaded",
                       "too many connections (http.max_connections = " +
                           std::to_string(_options.connections_max) + ")",
                       ""},
                      false);
        return;
    }
    c.admitted = true;
    _open++;
    _counters.connections_total++;
    c.waiting_since = clock::now();
    update_reading(c);
}

void http_actor::alloc_cb(uv_handle_t*, size_t, uv_buf_t* buf) {
    static thread_local std::array<char, read_buffer_bytes> buffer;
    *buf = uv_buf_init(buffer.data(), buffer.size());
}

void http_actor::read_cb(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) {
    auto& c = *static_cast<connection*>(stream->data);
    http_actor& self = *c.owner;
    if (c.lingering_since) {
        self.linger_read(c, nread);
    } else if (nread == UV_EOF) {
        self.close_connection(c, "client closed");
    } else if (nread < 0) {
        self.close_connection(c, uv_strerror(static_cast<int>(nread)));
    } else if (nread > 0) {
        self._counters.bytes_in += uint64_t(nread);
        c.unread.append(buf->base, size_t(nread));
        self.parse_more(c);
    }
}

// Parses what was read, up to max_pipelined_requests waiting requests, then answers the next.
void http_actor::parse_more(connection& c) {
    while (!c.closing && !c.failed && !c.unread.empty() &&
           c.queued.size() < _options.pipelined_max) {
        auto fed = c.reader.feed(c.unread.data(), c.unread.size());
        c.unread.erase(0, fed.consumed);
        if (fed.what == request_reader::outcome::failed) {
            const read_error& e = c.reader.error();
            (e.status == 400 ? _counters.malformed : _counters.too_large)++;
            // The stream cannot be read on: nothing more is read; the requests before the bad
            // one are answered first (in order), then the error, then the connection closes.
            c.failed = e;
            c.unread.clear();
            break;
        }
        if (fed.what == request_reader::outcome::request_complete) {
            c.queued.push_back(std::move(*c.reader.take()));
        } else if (fed.what == request_reader::outcome::expect_continue) {
            // Only when nothing is owed before it: answers go out in request order.
            if (!c.live && c.queued.empty()) send_bytes(c, "HTTP/1.1 100 Continue\r\n\r\n");
        } else {
            break;  // need_more: everything consumed
        }
    }
    if (c.closing) return;
    if (c.reader.mid_request() || (c.queued.empty() && !c.live && !c.unread.empty())) {
        if (!c.waiting_since) c.waiting_since = clock::now();
    } else if (!c.queued.empty() || c.live) {
        c.waiting_since.reset();
    }
    update_reading(c);
    process_next(c);
}

// Reads while fewer than max_pipelined_requests wait, unless a net_stop_reading fault paused
// the connection; otherwise TCP holds the rest.
void http_actor::update_reading(connection& c) {
    if (c.closing) return;
    bool want = c.queued.size() < _options.pipelined_max && !c.failed && !_pauses.paused(c.id);
    if (want && !c.reading) {
        uv_read_start(reinterpret_cast<uv_stream_t*>(&c.tcp), &http_actor::alloc_cb,
                      &http_actor::read_cb);
    } else if (!want && c.reading) {
        uv_read_stop(reinterpret_cast<uv_stream_t*>(&c.tcp));
    }
    c.reading = want;
}

void http_actor::sweep_cb(uv_timer_t* t) {
    auto& self = *static_cast<http_actor*>(t->data);
    std::vector<connection*> late, idle, lingered;
    for (auto& [id, c] : self._connections) {
        if (c->lingering_since && !uv_is_closing(reinterpret_cast<uv_handle_t*>(&c->tcp)) &&
            ms_since(*c->lingering_since) >= self._options.linger_ms) {
            lingered.push_back(c.get());
        }
        if (!c->admitted || c->closing || c->live || !c->queued.empty() ||
            self._pauses.paused(c->id)) {
            continue;
        }
        if (c->waiting_since && ms_since(*c->waiting_since) >= self._options.header_timeout_ms) {
            late.push_back(c.get());
        } else if (!c->waiting_since && c->idle_since &&
                   ms_since(*c->idle_since) >= self._options.keep_alive_timeout_ms) {
            idle.push_back(c.get());
        }
    }
    for (connection* c : late) {
        self._counters.header_timeouts++;
        self.respond_error(*c,
                           {408, "read_timeout",
                            "the request did not arrive whole within http.header_timeout_ms = " +
                                std::to_string(self._options.header_timeout_ms),
                            ""},
                           false);
    }
    for (connection* c : idle) self.close_connection(*c, "keep-alive timeout");
    for (connection* c : lingered) {
        self._counters.linger_cutoffs++;
        self.close_connection(*c, "lingered http.linger_ms");
    }
}

// ---- requests ------------------------------------------------------------------------------

void http_actor::process_next(connection& c) {
    if (c.closing || c.live) return;
    if (c.queued.empty()) {
        if (c.failed) {
            const read_error e = *c.failed;
            respond_error(
                c, {e.status, e.status == 400 ? "bad_request" : "too_large", e.message, ""}, false);
        }
        return;
    }
    http_request r = std::move(c.queued.front());
    c.queued.pop_front();
    c.idle_since.reset();
    _counters.requests++;
    route(c, r);
    update_reading(c);  // a slot in the read-ahead is free again
}

void http_actor::route(connection& c, http_request& r) {
    const bool ka = r.keep_alive;
    auto only = [&](const char* method) {
        if (r.method == method) return true;
        respond_error(
            c, {405, "method_not_allowed", r.method + " " + r.path + ": use " + method, ""}, ka);
        return false;
    };
    if (r.path == "/health") {
        if (only("GET")) get_health(c, r);
    } else if (r.path == "/metrics") {
        if (only("GET")) get_metrics(c, r);
    } else if (r.path == "/v1/models") {
        if (only("GET")) respond(c, 200, "application/json", models_json(_options.model), ka);
    } else if (r.path.rfind("/v1/models/", 0) == 0) {
        if (!only("GET")) return;
        if (r.path.substr(std::string_view("/v1/models/").size()) == _options.model.id) {
            respond(c, 200, "application/json", model_json(_options.model), ka);
        } else {
            respond_error(
                c,
                {404, "model_not_found",
                 "no such model; this server serves \"" + _options.model.id + "\"", "model"},
                ka);
        }
    } else if (r.path == "/v1/chat/completions") {
        if (only("POST")) start_generate(c, r, api_kind::chat);
    } else if (r.path == "/v1/completions") {
        if (only("POST")) start_generate(c, r, api_kind::completion);
    } else {
        respond_error(
            c,
            {404, "not_found",
             "no endpoint " + net::fields::quote(r.path) + " (docs/http.md lists them)", ""},
            ka);
    }
}

void http_actor::get_health(connection& c, const http_request& r) {
    std::string status = _draining ? "shutting_down" : _health_status;
    std::string reason = _draining ? "the server is stopping" : _health_reason;
    nlohmann::json j = {{"status", status}};
    if (!reason.empty()) j["reason"] = reason;
    respond(c, status == "ok" ? 200 : 503, "application/json",
            j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), r.keep_alive);
}

// The scheduler's stats (every counter, gauge and histogram of the stats op) with the net
// actor's and this actor's counters, as Prometheus text once the scheduler answers. Both front
// doors' counters travel in the query, as the net actor's stats op sends them, so /metrics and
// the stats op show the same maps.
void http_actor::get_metrics(connection& c, const http_request& r) {
    live_request l;
    l.id = c.next_request_id++;
    l.keep_alive = r.keep_alive;
    l.metrics = true;
    sched::stats_query q{c.conn(), l.id, {}, counters_map()};
    if (_options.net_counters) q.net = _options.net_counters();
    if (auto st = _to_scheduler.tell(q); !st.ok()) {
        bool stopped = st.err().code == "actor_stopped";
        respond_error(
            c,
            {stopped ? 503 : 429, stopped ? "shutting_down" : "overloaded", st.err().message, ""},
            r.keep_alive);
        return;
    }
    c.live = std::move(l);
}

void http_actor::on(const net::stats_done& m) {
    connection* c = live_for(m.conn, m.id);
    if (c == nullptr) return;
    if (!c->live->metrics) return unexpected(m.conn, m.id, m.msg_name);
    respond(*c, 200, "text/plain; version=0.0.4; charset=utf-8", prometheus_text(m.stats),
            c->live->keep_alive);
}

void http_actor::start_generate(connection& c, http_request& r, api_kind kind) {
    // The body is read as JSON whatever its Content-Type says: curl's -d sends
    // application/x-www-form-urlencoded, and a body that is not JSON is refused as such anyway.
    auto parsed = parse_api_request(kind, r.body, _options.limits, _options.model);
    if (auto* e = std::get_if<api_error>(&parsed)) {
        respond_error(c, *e, r.keep_alive);
        return;
    }
    live_request l;
    l.id = c.next_request_id++;
    l.req = std::move(std::get<api_request>(parsed));
    l.keep_alive = r.keep_alive;
    l.meta.kind = kind;
    l.meta.id = std::string(kind == api_kind::chat ? "chatcmpl-" : "cmpl-") + "ordo" +
                std::to_string(_options.model.created) + "-" + std::to_string(_next_answer++);
    l.meta.created = unix_seconds();
    l.meta.model = _options.model.id;
    sched::generate g{c.conn(), l.id, l.req.params};
    if (auto st = _to_scheduler.tell(g); !st.ok()) {
        // The scheduler's mailbox is full (or it is stopping): refuse now rather than queue.
        bool stopped = st.err().code == "actor_stopped";
        respond_error(
            c,
            {stopped ? 503 : 429, stopped ? "shutting_down" : "overloaded", st.err().message, ""},
            r.keep_alive);
        return;
    }
    if (l.req.stream) _counters.streams++;
    c.live = std::move(l);
}

// ---- events from the scheduler --------------------------------------------------------------

http_actor::connection* http_actor::live_for(uint64_t conn, uint64_t id) {
    if (sched::front_door_of(conn) != sched::front_door::http) return nullptr;
    auto it = _connections.find(conn & ((uint64_t(1) << sched::front_door_shift) - 1));
    if (it == _connections.end()) return nullptr;  // gone: the scheduler heard client_gone
    connection& c = *it->second;
    if (c.closing || !c.live || c.live->id != id) return nullptr;
    return &c;
}

void http_actor::on(const net::token_event& m) {
    connection* c = live_for(m.conn, m.id);
    if (c == nullptr || c->live->metrics || !c->live->req.stream || !stream_begin(*c)) return;
    const live_request& l = *c->live;
    // Text held back (a split character, a possible stop string) comes with a later token.
    if (!m.token.text.empty() || l.req.logprobs) {
        stream_chunk(*c, sse_token_chunk(l.meta, l.req, m.token));
    }
}

void http_actor::on(const net::generate_done& m) {
    connection* c = live_for(m.conn, m.id);
    if (c == nullptr) return;
    if (c->live->metrics) return unexpected(m.conn, m.id, m.msg_name);
    const live_request& l = *c->live;
    if (!l.req.stream) {
        respond(*c, 200, "application/json", completion_json(l.meta, l.req, m), l.keep_alive);
        return;
    }
    if (!stream_begin(*c)) return;
    std::string tail = sse_final_chunk(l.meta, l.req, m);
    if (l.req.include_usage) tail += sse_usage_chunk(l.meta, m);
    tail += sse_done;
    stream_chunk(*c, tail);
    stream_end(*c);
}

void http_actor::on(const net::request_error& m) {
    connection* c = live_for(m.conn, m.id);
    if (c == nullptr) return;
    api_error e = error_of(m);
    if (!c->live->headers_sent) {
        respond_error(*c, e, c->live->keep_alive);
        return;
    }
    // Mid-stream (a compute failure after tokens went out): the stream ends with the error,
    // never with a [DONE] that would pass for a complete answer.
    (e.status >= 500 ? _counters.responses_5xx : _counters.responses_4xx)++;
    stream_chunk(*c, sse_error(e));
    stream_end(*c);
}

void http_actor::unexpected(uint64_t conn, uint64_t id, const char* what) {
    connection* c = live_for(conn, id);
    log().error("{} for http connection {} request {}: never asked for", what, conn & 0xffffffff,
                id);
    if (c == nullptr) return;
    api_error e{500, "internal", std::string("unexpected answer ") + what, ""};
    if (c->live->headers_sent) {
        stream_chunk(*c, sse_error(e));
        stream_end(*c);
    } else {
        respond_error(*c, e, c->live->keep_alive);
    }
}

void http_actor::on(const net::set_health& m) {
    _health_status = m.status;
    _health_reason = m.reason;
}

void http_actor::on(const net::drop_connection& m) {
    auto it = _connections.find(m.conn & ((uint64_t(1) << sched::front_door_shift) - 1));
    if (it == _connections.end()) return;
    log().warn("http connection {} dropped: {}", it->first, m.reason);
    close_connection(*it->second, "dropped");
}

// A net fault point fired for a request of this front door (docs/protocol.md "fault"): from
// here on it is the path a dropped connection takes (net_fin, net_rst), or the one a server
// that stops reading takes (net_stop_reading: what the client sends meanwhile waits in the
// socket, pipelined requests included; answers are still written, under the same write bound).
void http_actor::on(const net::net_fault& m) {
    auto it = _connections.find(m.conn & ((uint64_t(1) << sched::front_door_shift) - 1));
    if (it == _connections.end() || it->second->closing) return;
    connection& c = *it->second;
    log().warn("http connection {}: fault {}{}", c.id, m.kind,
               m.kind == "net_stop_reading" ? " for " + std::to_string(m.ms) + " ms" : "");
    if (m.kind == "net_rst") {
        _counters.fault_drops++;
        stop_reading(c, "fault: net_rst");
        if (uv_tcp_close_reset(&c.tcp, &http_actor::close_cb) != 0) {
            uv_close(reinterpret_cast<uv_handle_t*>(&c.tcp), &http_actor::close_cb);
        }
    } else if (m.kind == "net_fin") {
        _counters.fault_drops++;
        close_after_writes(c, "fault: net_fin");
    } else if (m.kind == "net_stop_reading") {
        _counters.fault_pauses++;
        _pauses.pause(c.id, clock::now() + std::chrono::milliseconds(m.ms));
        update_reading(c);
    } else {
        log().error("unknown net fault kind '{}' ignored", m.kind);
    }
}

// A net_stop_reading pause of connection `id` ended.
void http_actor::resume_reading(uint64_t id, clock::time_point now) {
    auto it = _connections.find(id);
    if (it == _connections.end() || it->second->closing) return;
    connection& c = *it->second;
    // A request begun before the pause, or an idle spell, gets a fresh timeout.
    if (c.waiting_since) c.waiting_since = now;
    if (c.idle_since) c.idle_since = now;
    update_reading(c);
}

void http_actor::on(const net::begin_drain&) {
    _listener.close();
    _draining = true;
    log().info("draining: no new connections");
}

// ---- writing -------------------------------------------------------------------------------

void http_actor::respond(connection& c, int status, std::string_view content_type, std::string body,
                         bool keep_alive, std::string_view extra_headers) {
    (status >= 500   ? _counters.responses_5xx
     : status >= 400 ? _counters.responses_4xx
                     : _counters.responses_2xx)++;
    std::string out = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) +
                      "\r\nContent-Type: " + std::string(content_type) +
                      "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
    if (!keep_alive) out += "Connection: close\r\n";
    out += extra_headers;
    out += "\r\n";
    out += body;
    if (!send_bytes(c, std::move(out))) return;
    finish(c, keep_alive);
}

void http_actor::respond_error(connection& c, const api_error& e, bool keep_alive) {
    respond(c, e.status, "application/json", error_json(e), keep_alive);
}

bool http_actor::stream_begin(connection& c) {
    live_request& l = *c.live;
    if (l.headers_sent) return true;
    l.headers_sent = true;
    _counters.responses_2xx++;
    std::string head =
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
        "Transfer-Encoding: chunked\r\n";
    if (!l.keep_alive) head += "Connection: close\r\n";
    head += "\r\n";
    if (!send_bytes(c, std::move(head))) return false;
    if (l.meta.kind == api_kind::chat) stream_chunk(c, sse_role_chunk(l.meta));
    return c.live.has_value();
}

void http_actor::stream_chunk(connection& c, std::string_view data) {
    if (data.empty()) return;  // an empty chunk would end the body
    std::string out = hex(data.size()) + "\r\n";
    out += data;
    out += "\r\n";
    send_bytes(c, std::move(out));
}

void http_actor::stream_end(connection& c) {
    if (!send_bytes(c, "0\r\n\r\n")) return;
    finish(c, c.live->keep_alive);
}

// The answer of the live (or refused) request is written: the next may run.
void http_actor::finish(connection& c, bool keep_alive) {
    c.live.reset();
    if (!keep_alive) {
        close_after_writes(c, "Connection: close", true);
        return;
    }
    if (c.queued.empty()) c.idle_since = clock::now();
    parse_more(c);
}

bool http_actor::send_bytes(connection& c, std::string bytes) {
    if (c.closing) return false;
    if (c.write_pending_bytes + bytes.size() > _options.write_buffer_bytes_max) {
        // The client stopped reading: buffering more would grow memory without bound.
        _counters.slow_readers++;
        log().warn("http connection {}: {} bytes unread (limit {}), closing", c.id,
                   c.write_pending_bytes, _options.write_buffer_bytes_max);
        close_connection(c, "slow_reader");
        return false;
    }
    auto* w = new write_req;
    w->data = std::move(bytes);
    w->conn = &c;
    w->req.data = w;
    c.write_pending_bytes += w->data.size();
    _counters.bytes_out += w->data.size();
    uv_buf_t buf = uv_buf_init(w->data.data(), static_cast<unsigned>(w->data.size()));
    int rc =
        uv_write(&w->req, reinterpret_cast<uv_stream_t*>(&c.tcp), &buf, 1, &http_actor::write_cb);
    if (rc != 0) {
        c.write_pending_bytes -= w->data.size();
        delete w;
        close_connection(c, uv_strerror(rc));
        return false;
    }
    return true;
}

void http_actor::write_cb(uv_write_t* req, int status) {
    auto* w = static_cast<write_req*>(req->data);
    connection& c = *w->conn;
    c.write_pending_bytes -= w->data.size();
    delete w;
    if (status < 0 && status != UV_ECANCELED) c.owner->close_connection(c, uv_strerror(status));
}

// ---- closing -------------------------------------------------------------------------------

void http_actor::stop_reading(connection& c, const std::string& reason) {
    if (c.live) {
        // Its request can no longer be answered: the scheduler cancels it (no events).
        _counters.disconnects++;
        _gone.send(sched::client_gone{c.conn(), reason});
        c.live.reset();
    }
    c.queued.clear();
    if (!c.closing && c.admitted) _open--;
    c.closing = true;
    if (c.reading) uv_read_stop(reinterpret_cast<uv_stream_t*>(&c.tcp));
    c.reading = false;
}

// The lingering close. The server closes a connection after an answer while the client may
// still be sending: an early 413 (Content-Length over the limit, answered before the body) or
// 431, a 408 or parser 400 mid-request, a 429 at max_connections, or simply more bytes behind a
// Connection: close request. Closing a socket that holds unread bytes makes the kernel send a
// reset, and a reset can reach the client before it has read the answer (its send fails with
// ECONNRESET, or its unread input is discarded): it sees "connection reset", not our 413. So,
// as RFC 9112 9.6 asks: the answer is queued, the socket is shut down for writing once it is
// written (FIN), and reading goes on, every byte discarded, until the client's EOF, then the
// handle is closed. A client that never stops sending is cut off (closed, a reset if bytes are
// unread; counted in linger_cutoffs) at http.max_linger_bytes discarded or http.linger_ms after
// the close began (the sweep, between 1x and 1.25x). At most max_connections connections linger at
// once; beyond, and with linger_ms 0, the connection closes right after its writes as before.
// Faults (net_fin) and the stop do not linger.
void http_actor::close_after_writes(connection& c, const char* reason, bool linger) {
    if (c.closing) return;
    stop_reading(c, reason);
    linger = linger && _options.linger_ms > 0 && _lingering < _options.connections_max;
    if (linger) {
        c.lingering_since = clock::now();
        _lingering++;
        _counters.lingering_closes++;
        c.reading = uv_read_start(reinterpret_cast<uv_stream_t*>(&c.tcp), &http_actor::alloc_cb,
                                  &http_actor::read_cb) == 0;
    }
    // shutdown completes after the queued writes; then the handle is closed, or lingers.
    c.shutdown_req.data = &c;
    if (uv_shutdown(&c.shutdown_req, reinterpret_cast<uv_stream_t*>(&c.tcp),
                    &http_actor::shutdown_cb) != 0) {
        uv_close(reinterpret_cast<uv_handle_t*>(&c.tcp), &http_actor::close_cb);
    }
}

void http_actor::shutdown_cb(uv_shutdown_t* req, int status) {
    auto& c = *static_cast<connection*>(req->data);
    c.write_shut = true;
    // Lingering: the answer is out; reads go on until the client's EOF or a bound.
    if (c.lingering_since && c.reading && !c.peer_shut && status == 0 && !c.owner->stopping()) {
        return;
    }
    if (!uv_is_closing(reinterpret_cast<uv_handle_t*>(&c.tcp))) {
        uv_close(reinterpret_cast<uv_handle_t*>(&c.tcp), &http_actor::close_cb);
    }
}

// A read while lingering: bytes are discarded (up to the bound); EOF ends the lingering once the
// answer is written (else the shutdown's callback closes); an error closes at once.
void http_actor::linger_read(connection& c, ssize_t nread) {
    if (nread > 0) {
        _counters.bytes_in += uint64_t(nread);
        c.linger_bytes += uint64_t(nread);
        if (c.linger_bytes > _options.linger_bytes_max) {
            _counters.linger_cutoffs++;
            close_connection(c, "lingered http.max_linger_bytes");
        }
        return;
    }
    if (nread == 0) return;  // nothing this time (EAGAIN)
    uv_read_stop(reinterpret_cast<uv_stream_t*>(&c.tcp));
    c.reading = false;
    c.peer_shut = true;
    if (nread != UV_EOF || c.write_shut) {
        close_connection(c, nread == UV_EOF ? "client closed" : uv_strerror(int(nread)));
    }
}

void http_actor::close_connection(connection& c, const char* reason) {
    if (uv_is_closing(reinterpret_cast<uv_handle_t*>(&c.tcp))) return;
    log().debug("http connection {} closing: {}", c.id, reason);
    stop_reading(c, reason);
    uv_close(reinterpret_cast<uv_handle_t*>(&c.tcp), &http_actor::close_cb);
}

void http_actor::close_cb(uv_handle_t* handle) {
    auto& c = *static_cast<connection*>(handle->data);
    http_actor& self = *c.owner;
    self._pauses.forget(c.id);
    if (c.lingering_since) self._lingering--;
    self._connections.erase(c.id);  // frees c
    auto* grace = reinterpret_cast<uv_handle_t*>(&self._grace_timer);
    if (self.stopping() && self._connections.empty() && !uv_is_closing(grace)) {
        uv_close(grace, nullptr);
    }
}

std::map<std::string, uint64_t> http_actor::counters_map() const {
    const auto& k = _counters;
    return {{"connections_open", _open.load()},
            {"connections_lingering", _lingering.load()},
            {"connections_total", k.connections_total},
            {"connections_refused", k.connections_refused},
            {"requests", k.requests},
            {"responses_2xx", k.responses_2xx},
            {"responses_4xx", k.responses_4xx},
            {"responses_5xx", k.responses_5xx},
            {"streams", k.streams},
            {"header_timeouts", k.header_timeouts},
            {"too_large", k.too_large},
            {"malformed", k.malformed},
            {"slow_readers", k.slow_readers},
            {"disconnects", k.disconnects},
            {"fault_drops", k.fault_drops},
            {"fault_pauses", k.fault_pauses},
            {"lingering_closes", k.lingering_closes},
            {"linger_cutoffs", k.linger_cutoffs},
            {"bytes_in", k.bytes_in},
            {"bytes_out", k.bytes_out}};
}

}  // namespace ordo::http
