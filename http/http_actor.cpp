// http_actor.cpp: see http_actor.hpp. Everything here runs on the HTTP actor's loop thread.
#include "http/http_actor.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cassert>
#include <ctime>
#include <nlohmann/json.hpp>

#include "http/metrics.hpp"

namespace ordo::http {
namespace {

// Inputs of one POST /v1/embeddings given to the scheduler at once (each is one embed request
// there): enough to fill a CPU device's step (scheduler.max_sequences is 16 there; a GPU's 64
// takes four such requests), few enough that a request of 2,048 inputs neither fills the
// scheduler's queue (max_queue) nor starves the other clients' requests behind it.
constexpr size_t embed_inputs_inflight_max = 16;

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
        case 204:
            return "No Content";
        case 400:
            return "Bad Request";
        case 401:
            return "Unauthorized";
        case 403:
            return "Forbidden";
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

// The one method an endpoint answers (besides OPTIONS), or null: no such endpoint. A trailing
// slash has been stripped already.
const char* endpoint_method(std::string_view path) {
    for (std::string_view p : {"/health", "/metrics", "/v1/models"}) {
        if (path == p) return "GET";
    }
    if (path.starts_with("/v1/models/")) return "GET";
    for (std::string_view p : {"/tokenize", "/detokenize", "/v1/chat/completions",
                               "/v1/completions", "/v1/embeddings"}) {
        if (path == p) return "POST";
    }
    return nullptr;
}

// A connection the server closes after its answer closes lingering (door/tcp_conn.cpp): at
// most max_connections at once, so lingering ones cannot grow without bound either.
door::front_door_options door_options(const http_options& o) {
    door::front_door_options d;
    d.door = door::door_kind::http;
    d.host = o.host;
    d.port = o.port;
    d.connections_max = o.connections_max;
    d.connections_max_key = "http.max_connections";
    d.conns.write_buffer_bytes_max = o.write_buffer_bytes_max;
    d.conns.shutdown_grace_ms = o.shutdown_grace_ms;
    d.conns.linger_ms = o.linger_ms;
    d.conns.linger_bytes_max = o.linger_bytes_max;
    d.timeout_ms_min = std::min(o.header_timeout_ms, o.keep_alive_timeout_ms);
    if (o.linger_ms > 0) d.timeout_ms_min = std::min(d.timeout_ms_min, o.linger_ms);
    d.auth = o.auth;
    return d;
}

}  // namespace

// The request a connection is answering: what the answer must look like and how far it got.
struct http_actor::live_request {
    uint64_t id = 0;  // the request id the scheduler knows (per connection)
    api_request req;
    answer_meta meta;
    bool keep_alive = true;
    bool headers_sent = false;  // a stream has begun: errors now go in the stream
    awaited waits = awaited::generate;
    size_t text_offset = 0;  // bytes of text streamed so far (completions' text_offset)
    std::optional<grammar::tool_stream> tool_stream;  // a streamed answer read for tool calls
    // POST /v1/embeddings: input i is the scheduler's request id + i; at most
    // embed_inputs_inflight_max of them are unanswered at once.
    struct embeddings_state {
        std::vector<sched::embed> inputs;
        std::vector<door::embed_done> done;  // by input
        size_t sent = 0, answered = 0;
        bool base64 = false;
    };
    std::optional<embeddings_state> embeddings;
    // Whether the scheduler request `i` is this request's.
    bool owns(uint64_t i) const {
        return i == id || (embeddings && i > id && i - id < embeddings->inputs.size());
    }
};

// A connection: the TCP layer's part (tcp_conn: socket, write queue, closing, lingering; its id
// is local, the scheduler knows door::conn_id(door::door_kind::http, id); admitted means counted
// against the connection limit) and HTTP's.
struct http_actor::connection final : door::tcp_conn {
    request_reader reader;
    std::string unread;                // bytes read but not parsed yet (read-ahead bound)
    std::deque<http_request> queued;   // parsed, waiting for the live one to be answered
    std::optional<live_request> live;  // sent to the scheduler, not answered yet
    std::optional<read_error> failed;  // the stream broke after `queued`: answered last
    uint64_t next_request_id = 1;
    // What http.header_timeout_ms bounds: since a request began arriving (or the connection
    // was accepted); unset between whole requests.
    std::optional<clock::time_point> waiting_since;
    // What http.keep_alive_timeout_ms bounds: since the last answer, while nothing is pending.
    // Neither timeout runs while a net_stop_reading fault pauses the connection: it is the
    // server that is not reading.
    std::optional<clock::time_point> idle_since;
    // The Access-Control-Allow-Origin of the request being answered (cors.hpp), set by route
    // and reset by finish; nullopt: its answer gets no CORS headers.
    std::optional<std::string> cors_origin;

    connection(uint64_t i, const http_options& opt)
        : reader(opt.header_bytes_max, opt.body_bytes_max) {
        id = i;
    }
    uint64_t conn() const { return door::conn_id(door::door_kind::http, id); }
};

http_actor::http_actor(http_options options, size_t mailbox_capacity)
    : actor("http", mailbox_capacity),
      _options(std::move(options)),
      _cors(_options.cors_allow_origins),
      _door(door_options(_options), *this) {}

http_actor::~http_actor() = default;

void http_actor::on_start() {
    must(_door.start(loop(), log()), "delivery init");
}

// The scheduler stopped first: the answers of requests it ended are queued here. They are
// written, then each connection is shut down; the grace timer bounds a client not reading.
void http_actor::on_stop() {
    _door.stop();
}

// ---- the front door's calls (front_door_owner) --------------------------------------------------

std::unique_ptr<door::tcp_conn> http_actor::door_conn(uint64_t id) {
    return std::make_unique<connection>(id, _options);
}

// A cut-off address (429 with Retry-After) or one connection too many (429); then the
// connection closes, lingering.
void http_actor::door_refuse(door::tcp_conn& t, door::errc code, const std::string& message,
                             uint64_t retry_after_ms) {
    auto& c = static_cast<connection&>(t);
    if (code == door::errc::unauthorized) return refuse_cut_off(c, retry_after_ms);
    assert(code == door::errc::overloaded);
    respond_error(c, {429, "overloaded", message, ""}, false);
}

void http_actor::door_admitted(door::tcp_conn& t) {
    auto& c = static_cast<connection&>(t);
    c.waiting_since = clock::now();
    update_reading(c);
}

void http_actor::door_read(door::tcp_conn& t, const char* data, size_t size) {
    auto& c = static_cast<connection&>(t);
    assert(!c.closing && "a connection that is closing is not read");
    c.unread.append(data, size);
    parse_more(c);
}

// Its request can no longer be answered: the scheduler cancels it (no events).
bool http_actor::door_abandon(door::tcp_conn& t) {
    auto& c = static_cast<connection&>(t);
    bool live = c.live.has_value();
    if (live) _counters.disconnects++;
    c.live.reset();
    c.queued.clear();
    return live;
}

// A request that does not arrive whole within http.header_timeout_ms (408), or a kept-alive
// connection idle for http.keep_alive_timeout_ms (closed). Neither runs while a request is
// live or waiting.
void http_actor::door_sweep(door::tcp_conn& t) {
    auto& c = static_cast<connection&>(t);
    if (c.live || !c.queued.empty()) return;
    if (c.waiting_since && ms_since(*c.waiting_since) >= _options.header_timeout_ms) {
        _counters.header_timeouts++;
        respond_error(c,
                      {408, "read_timeout",
                       "the request did not arrive whole within http.header_timeout_ms = " +
                           std::to_string(_options.header_timeout_ms),
                       ""},
                      false);
    } else if (!c.waiting_since && c.idle_since &&
               ms_since(*c.idle_since) >= _options.keep_alive_timeout_ms) {
        _door.conns().close(c, "keep-alive timeout");
    }
}

void http_actor::door_resumed(door::tcp_conn& t, clock::time_point now) {
    auto& c = static_cast<connection&>(t);
    // A request begun before the pause, or an idle spell, gets a fresh timeout.
    if (c.waiting_since) c.waiting_since = now;
    if (c.idle_since) c.idle_since = now;
    update_reading(c);
}

http_actor::connection* http_actor::find(uint64_t conn) {
    return static_cast<connection*>(_door.find(conn));
}

// ---- reading -----------------------------------------------------------------------------------

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
            if (!c.live && c.queued.empty()) {
                _door.conns().send(c, "HTTP/1.1 100 Continue\r\n\r\n");
            }
        } else {
            break;  // need_more: everything consumed
        }
    }
    assert(c.queued.size() <= _options.pipelined_max);  // the read-ahead bound
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
    bool want = c.queued.size() < _options.pipelined_max && !c.failed && !_door.paused(c.id);
    if (want) {
        _door.conns().read_start(c);
    } else {
        _door.conns().read_stop(c);
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
    assert(!c.live && !c.cors_origin);
    const bool ka = r.keep_alive;
    // "/v1/chat/completions/" is "/v1/chat/completions": clients that join a base URL and a path
    // leave a trailing slash.
    if (r.path.size() > 1 && r.path.back() == '/') r.path.pop_back();
    c.cors_origin = _cors.allowed(r.header("origin"));
    const char* method = endpoint_method(r.path);
    // Before the key check: a browser sends its preflight without credentials.
    if (r.method == "OPTIONS") return answer_options(c, r, method);
    const bool keyed = r.path == "/v1" || r.path.rfind("/v1/", 0) == 0 || r.path == "/tokenize" ||
                       r.path == "/detokenize" ||
                       (r.path == "/metrics" && _options.metrics_require_key);
    if (keyed && !authorized(c, r)) return;
    if (method == nullptr) {
        respond_error(
            c,
            {404, "not_found",
             "no endpoint " + net::fields::quote(r.path) + " (docs/http.md lists them)", ""},
            ka);
        return;
    }
    if (r.method != method) {
        respond_error(
            c, {405, "method_not_allowed", r.method + " " + r.path + ": use " + method, ""}, ka);
        return;
    }
    if (r.path == "/health") {
        get_health(c, r);
    } else if (r.path == "/metrics") {
        get_metrics(c, r);
    } else if (r.path == "/tokenize") {
        start_tokens(c, r, awaited::tokenize);
    } else if (r.path == "/detokenize") {
        start_tokens(c, r, awaited::detokenize);
    } else if (r.path == "/v1/models") {
        respond(c, 200, "application/json", models_json(_options.model), ka);
    } else if (r.path.rfind("/v1/models/", 0) == 0) {
        if (r.path.substr(std::string_view("/v1/models/").size()) == _options.model.id) {
            respond(c, 200, "application/json", model_json(_options.model), ka);
        } else {
            respond_error(
                c,
                {404, "model_not_found",
                 "no such model; this server serves \"" + _options.model.id + "\"", "model"},
                ka);
        }
    } else if (r.path == "/v1/embeddings") {
        start_embeddings(c, r);
    } else if (r.path == "/v1/chat/completions") {
        start_generate(c, r, api_kind::chat);
    } else {
        assert(r.path == "/v1/completions");
        start_generate(c, r, api_kind::completion);
    }
}

// cors.hpp has the rules. A preflight's answer has no body; a refused one is 403 without CORS
// headers, so the browser stops there, while curl and the log see why.
void http_actor::answer_options(connection& c, const http_request& r, const char* method) {
    const bool ka = r.keep_alive;
    if (method == nullptr) {
        respond_error(
            c,
            {404, "not_found",
             "no endpoint " + net::fields::quote(r.path) + " (docs/http.md lists them)", ""},
            ka);
        return;
    }
    const std::string methods = std::string(method) + ", OPTIONS";
    if (!is_preflight(r)) {
        respond(c, 204, "", "", ka, "Allow: " + methods + "\r\n");
        return;
    }
    if (!c.cors_origin) {
        const std::string* origin = r.header("origin");
        log().info("http connection {}: preflight from origin {} refused", c.id,
                   net::fields::quote(*origin));
        respond_error(c,
                      {403, "origin_not_allowed",
                       "origin " + net::fields::quote(*origin) +
                           " may not call this server (http.cors_allow_origins)",
                       ""},
                      ka);
        return;
    }
    respond(c, 204, "", "", ka,
            cors_policy::preflight_headers(methods, r.header("access-control-request-headers")));
}

bool http_actor::authorized(connection& c, const http_request& r) {
    if (!_options.auth || !_options.auth->required()) return true;
    const std::string* header = r.header("authorization");
    std::optional<std::string_view> key = header ? door::bearer_key(*header) : std::nullopt;
    switch (_options.auth->check(c.peer_address, key)) {
        case door::auth_verdict::ok:
            return true;
        case door::auth_verdict::cut_off:
            _door.counters().auth_refused++;
            refuse_cut_off(c, 0);
            return false;
        case door::auth_verdict::missing:
        case door::auth_verdict::wrong:
            break;
    }
    _door.counters().auth_failures++;
    log().info("http connection {} from {}: {} {}: 401 ({})", c.id, c.peer_address, r.method,
               net::fields::quote(r.path), key ? "a wrong key" : "no key");
    api_error e{401, std::string(invalid_api_key_code),
                key ? "Incorrect API key provided."
                    : "No API key provided: send the header Authorization: Bearer KEY.",
                ""};
    respond(c, e.status, "application/json", error_json(e), r.keep_alive,
            "WWW-Authenticate: Bearer\r\n");
    return false;
}

// 429 and the connection closes (lingering): the address failed auth too often lately.
void http_actor::refuse_cut_off(connection& c, uint64_t left_ms) {
    std::string retry =
        left_ms > 0 ? "Retry-After: " + std::to_string((left_ms + 999) / 1000) + "\r\n" : "";
    api_error e{429, std::string(door::wire_name(door::errc::unauthorized)),
                door::cut_off_message(left_ms), ""};
    respond(c, e.status, "application/json", error_json(e), false, retry);
}

void http_actor::get_health(connection& c, const http_request& r) {
    const door::health_status status = _door.health_status();
    const std::string& reason = _door.health_reason();
    nlohmann::json j = {{"status", std::string(enum_name(status))}};
    if (!reason.empty()) j["reason"] = reason;
    respond(c, status == door::health_status::ok ? 200 : 503, "application/json",
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
    l.waits = awaited::metrics;
    sched::stats_query q{c.conn(), l.id, {}, counters_map()};
    if (_options.net_counters) q.net = _options.net_counters();
    if (scheduler_took(c, _to_scheduler.tell(q), r.keep_alive)) c.live = std::move(l);
}

// llama.cpp server's /tokenize and /detokenize: the scheduler's tokenize and detokenize ops.
void http_actor::start_tokens(connection& c, const http_request& r, awaited op) {
    assert(op == awaited::tokenize || op == awaited::detokenize);
    live_request l;
    l.id = c.next_request_id++;
    l.keep_alive = r.keep_alive;
    actors::tell_status sent;
    if (op == awaited::tokenize) {
        auto t = parse_tokenize_request(r.body);
        if (auto* e = std::get_if<api_error>(&t)) return respond_error(c, *e, r.keep_alive);
        auto& m = std::get<sched::tokenize>(t);
        m.conn = c.conn(), m.id = l.id;
        l.waits = awaited::tokenize;
        sent = _to_scheduler.tell(m);
    } else {
        auto d = parse_detokenize_request(r.body, _options.limits);
        if (auto* e = std::get_if<api_error>(&d)) return respond_error(c, *e, r.keep_alive);
        auto& m = std::get<sched::detokenize>(d);
        m.conn = c.conn(), m.id = l.id;
        l.waits = awaited::detokenize;
        sent = _to_scheduler.tell(m);
    }
    if (scheduler_took(c, sent, r.keep_alive)) c.live = std::move(l);
}

// OpenAI's embeddings: one scheduler embed request per input, at most
// embed_inputs_inflight_max at a time, answered together once every input has its vector. The
// first error answers the whole request at once; inputs still running then finish unread (their
// answers name ids no live request owns) and the rest are never sent.
void http_actor::start_embeddings(connection& c, const http_request& r) {
    auto parsed = parse_embeddings_request(r.body, _options.limits, _options.model);
    if (auto* e = std::get_if<api_error>(&parsed)) return respond_error(c, *e, r.keep_alive);
    auto& req = std::get<embeddings_request>(parsed);
    assert(!req.inputs.empty() && req.inputs.size() <= embedding_inputs_max);
    live_request l;
    l.id = c.next_request_id;
    c.next_request_id += req.inputs.size();
    l.keep_alive = r.keep_alive;
    l.waits = awaited::embeddings;
    auto& e = l.embeddings.emplace();
    e.inputs = std::move(req.inputs);
    e.done.resize(e.inputs.size());
    e.base64 = req.base64;
    c.live = std::move(l);
    send_embed_inputs(c);
}

bool http_actor::send_embed_inputs(connection& c) {
    live_request& l = *c.live;
    auto& e = *l.embeddings;
    while (e.sent < e.inputs.size() && e.sent - e.answered < embed_inputs_inflight_max) {
        sched::embed m = std::move(e.inputs[e.sent]);
        m.conn = c.conn();
        m.id = l.id + e.sent;
        e.sent++;
        if (!scheduler_took(c, _to_scheduler.tell(m), l.keep_alive)) return false;
    }
    return true;
}

void http_actor::on(const door::embed_done& m) {
    connection* c = live_awaiting(m.conn, m.id, awaited::embeddings, m.msg_name);
    if (c == nullptr) return;
    live_request& l = *c->live;
    auto& e = *l.embeddings;
    const uint64_t i = m.id - l.id;
    assert(i < e.sent && e.answered < e.sent);
    if (m.cancelled) {
        // Nothing here cancels an input: the scheduler must not either.
        api_error err{500, "internal", "input " + std::to_string(i) + " was cancelled", ""};
        return respond_error(*c, err, l.keep_alive);
    }
    e.done[i] = m;
    e.answered++;
    if (e.answered < e.inputs.size()) {
        send_embed_inputs(*c);
        return;
    }
    respond(*c, 200, "application/json", embeddings_json(_options.model.id, e.done, e.base64),
            l.keep_alive);
}

bool http_actor::scheduler_took(connection& c, const actors::tell_status& sent, bool keep_alive) {
    if (sent.ok()) return true;
    // The scheduler's mailbox is full (or it is stopping): refuse now rather than queue.
    bool stopped = sent.err().outcome == actors::delivery_outcome::actor_stopped;
    const door::errc code = stopped ? door::errc::shutting_down : door::errc::overloaded;
    respond_error(c,
                  {stopped ? 503 : 429, std::string(door::wire_name(code)), sent.err().message, ""},
                  keep_alive);
    return false;
}

http_actor::connection* http_actor::live_awaiting(uint64_t conn, uint64_t id, awaited a,
                                                  const char* what) {
    connection* c = live_for(conn, id);
    if (c == nullptr || c->live->waits == a) return c;
    unexpected(conn, id, what);
    return nullptr;
}

void http_actor::on(const door::tokenize_done& m) {
    if (connection* c = live_awaiting(m.conn, m.id, awaited::tokenize, m.msg_name)) {
        respond(*c, 200, "application/json", tokenize_json(m), c->live->keep_alive);
    }
}

void http_actor::on(const door::detokenize_done& m) {
    if (connection* c = live_awaiting(m.conn, m.id, awaited::detokenize, m.msg_name)) {
        respond(*c, 200, "application/json", detokenize_json(m), c->live->keep_alive);
    }
}

void http_actor::on(const door::stats_done& m) {
    if (connection* c = live_awaiting(m.conn, m.id, awaited::metrics, m.msg_name)) {
        respond(*c, 200, "text/plain; version=0.0.4; charset=utf-8", prometheus_text(m.stats),
                c->live->keep_alive);
    }
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
    if (l.req.stream && l.req.tools)
        l.tool_stream.emplace(l.req.tools->format, l.req.tools->constrained);
    sched::generate g{c.conn(), l.id, l.req.params};
    if (!scheduler_took(c, _to_scheduler.tell(g), r.keep_alive)) return;
    if (l.req.stream) _counters.streams++;
    c.live = std::move(l);
}

// ---- events from the scheduler --------------------------------------------------------------

http_actor::connection* http_actor::live_for(uint64_t conn, uint64_t id) {
    connection* found = find(conn);
    if (found == nullptr) return nullptr;  // gone: the scheduler heard client_gone
    connection& c = *found;
    if (c.closing || !c.live || !c.live->owns(id)) return nullptr;
    return &c;
}

void http_actor::on(const door::token_event& m) {
    connection* c = live_for(m.conn, m.id);
    if (c == nullptr || c->live->waits != awaited::generate || !c->live->req.stream ||
        !stream_begin(*c)) {
        return;
    }
    live_request& l = *c->live;
    if (l.tool_stream) {
        stream_chunk(*c, sse_tool_chunks(l.meta, l.req, l.tool_stream->feed(m.token.text)));
        return;
    }
    // Text held back (a split character, a possible stop string) comes with a later token.
    if (!m.token.text.empty() || l.req.logprobs) {
        stream_chunk(*c, sse_token_chunk(l.meta, l.req, m.token, l.text_offset));
        l.text_offset += m.token.text.size();
    }
}

void http_actor::on(const door::generate_done& m) {
    connection* c = live_awaiting(m.conn, m.id, awaited::generate, m.msg_name);
    if (c == nullptr) return;
    live_request& l = *c->live;
    if (!l.req.stream) {
        respond(*c, 200, "application/json", completion_json(l.meta, l.req, m), l.keep_alive);
        return;
    }
    if (!stream_begin(*c)) return;
    std::string tail;
    if (l.tool_stream) tail = sse_tool_chunks(l.meta, l.req, l.tool_stream->finish());
    tail += sse_final_chunk(l.meta, l.req, m, l.tool_stream ? l.tool_stream->calls() : 0);
    if (l.req.include_usage) tail += sse_usage_chunk(l.meta, m);
    tail += sse_done;
    stream_chunk(*c, tail);
    stream_end(*c);
}

void http_actor::on(const door::request_error& m) {
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

// ---- writing -------------------------------------------------------------------------------

void http_actor::respond(connection& c, int status, std::string_view content_type, std::string body,
                         bool keep_alive, std::string_view extra_headers) {
    (status >= 500   ? _counters.responses_5xx
     : status >= 400 ? _counters.responses_4xx
                     : _counters.responses_2xx)++;
    std::string out = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) + "\r\n";
    // RFC 9110: a 204 has no body and no Content-Length.
    assert(status != 204 || body.empty());
    if (status != 204) {
        out += "Content-Type: " + std::string(content_type) +
               "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
    }
    if (!keep_alive) out += "Connection: close\r\n";
    out += _cors.answer_headers(c.cors_origin);
    out += extra_headers;
    out += "\r\n";
    out += body;
    if (!_door.conns().send(c, std::move(out))) return;
    finish(c, keep_alive);
}

void http_actor::respond_error(connection& c, const api_error& e, bool keep_alive) {
    // Refusals a client should take elsewhere or retry shortly say when (RFC 9110
    // Retry-After). A draining server also closes the connection, so the client's next request
    // opens a new one, which a load balancer sends to another replica.
    const bool stopping = e.code == door::wire_name(door::errc::shutting_down);
    const bool retry = stopping || e.code == door::wire_name(door::errc::overloaded);
    respond(c, e.status, "application/json", error_json(e), keep_alive && !stopping,
            retry ? "Retry-After: 1\r\n" : "");
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
    head += _cors.answer_headers(c.cors_origin);
    head += "\r\n";
    if (!_door.conns().send(c, std::move(head))) return false;
    if (l.meta.kind == api_kind::chat) stream_chunk(c, sse_role_chunk(l.meta));
    return c.live.has_value();
}

void http_actor::stream_chunk(connection& c, std::string_view data) {
    if (data.empty()) return;  // an empty chunk would end the body
    std::string out = hex(data.size()) + "\r\n";
    out += data;
    out += "\r\n";
    _door.conns().send(c, std::move(out));
}

void http_actor::stream_end(connection& c) {
    if (!_door.conns().send(c, "0\r\n\r\n")) return;
    // Only a close ends a live request before its answer, and a closing connection takes no
    // more writes.
    assert(c.live.has_value());
    finish(c, c.live->keep_alive);
}

// The answer of the live (or refused) request is written: the next may run.
void http_actor::finish(connection& c, bool keep_alive) {
    c.live.reset();
    c.cors_origin.reset();
    if (!keep_alive) {
        // Lingering: the client may still be sending (a refused body, pipelined requests).
        _door.conns().close_after_writes(c, "Connection: close", true);
        return;
    }
    if (c.queued.empty()) c.idle_since = clock::now();
    parse_more(c);
}

std::map<std::string, uint64_t> http_actor::counters_map() const {
    const auto& k = _counters;
    const door::tcp_conns& conns = _door.conns();
    std::map<std::string, uint64_t> m = _door.counters_map();
    m.insert({{"connections_lingering", conns.lingering()},
              {"requests", k.requests},
              {"responses_2xx", k.responses_2xx},
              {"responses_4xx", k.responses_4xx},
              {"responses_5xx", k.responses_5xx},
              {"streams", k.streams},
              {"header_timeouts", k.header_timeouts},
              {"too_large", k.too_large},
              {"malformed", k.malformed},
              {"disconnects", k.disconnects},
              {"lingering_closes", conns.lingering_closes()},
              {"linger_cutoffs", conns.linger_cutoffs()}});
    return m;
}

}  // namespace ordo::http
