// front_door.cpp: see front_door.hpp. Everything here runs on the owning door's loop thread.
#include "door/front_door.hpp"

#include <poll.h>
#include <sys/ioctl.h>

#include <algorithm>
#include <cassert>
#include <vector>

namespace ordo::door {
namespace {

// The timeout sweep runs this many times per shortest timeout, so a late connection is cut off
// between 1x and 1.25x its timeout.
constexpr uint64_t timeout_sweeps = 4;
// client_gone to the scheduler: its mailbox drains in microseconds; past this bound the
// scheduler is stuck or stopped and the message is given up (logged).
constexpr actors::delivery_limits gone_delivery_limits{
    .pending_max = 1u << 16, .retry_ms = 5, .deadline_ms = 30'000};
constexpr uint64_t local_id_mask = (uint64_t(1) << door_kind_shift) - 1;

}  // namespace

front_door::front_door(front_door_options options, front_door_owner& owner)
    : _options(std::move(options)),
      _owner(owner),
      // The msgpack door logs as it always did, unprefixed (its logger is named net).
      _prefix(_options.door == door_kind::net ? ""
                                              : std::string(door_kind_name(_options.door)) + " ") {
    _options.conns.lingering_max = _options.connections_max;
    _options.conns.door = _prefix;
}

// ---- lifecycle -------------------------------------------------------------------------------

status front_door::start(uv_loop_t* loop, spdlog::logger& log) {
    _log = &log;
    _started_at = clock::now();
    _conns.init(loop, *this, _options.conns, log);
    uv_timer_init(loop, &_sweep_timer);
    _sweep_timer.data = this;
    _pauses.init(loop, [this](uint64_t id, clock::time_point now) { resume(id, now); });
    if (auto st = _gone.init(loop, _gone_out, gone_delivery_limits,
                             [this](const gone_delivery::message& m, const actors::refusal& why) {
                                 using actors::delivery_outcome;
                                 if (why.outcome != delivery_outcome::actor_stopped &&
                                     why.outcome != delivery_outcome::not_connected) {
                                     _log->error("client_gone for connection {} undeliverable: {}",
                                                 std::get<client_gone>(m).conn, why.message);
                                 }
                             });
        !st) {
        return st;
    }
    uint64_t sweep_ms = std::max<uint64_t>(1, _options.timeout_ms_min / timeout_sweeps);
    uv_timer_start(&_sweep_timer, &front_door::sweep_cb, sweep_ms, sweep_ms);
    _listen_status =
        _listener.open(loop, _options.host, _options.port, this, &front_door::connection_cb,
                       _options.door == door_kind::net ? "" : "http");
    if (_listen_status.ok()) {
        log.info("{}listening on {}:{}", _prefix, _options.host, _listener.port());
    } else {
        log.error("{}", _listen_status.err().message);
    }
    return {};
}

void front_door::stop() {
    assert(_log != nullptr);
    _listener.close();
    uv_close(reinterpret_cast<uv_handle_t*>(&_sweep_timer), nullptr);
    _pauses.close();
    // Connections with queued writes (the answers of requests ended by the stop) are shut down
    // after those are written; the grace timer bounds a client that never reads.
    size_t flushing = _conns.stop();
    _gone.close();
    _log->info("stopping: {} connections ({} flushing)", _conns.size(), flushing);
}

uint64_t front_door::uptime_ms() const {
    return uint64_t(
        std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - _started_at).count());
}

// ---- accepting ---------------------------------------------------------------------------------

void front_door::connection_cb(uv_stream_t* server, int status) {
    auto* self = static_cast<front_door*>(server->data);
    if (status < 0) {
        self->_log->warn("accept failed: {}", uv_strerror(status));
        return;
    }
    self->accept_one();
}

void front_door::accept_one() {
    tcp_conn* accepted = _conns.accept(_listener.stream(), _owner.door_conn(_next_conn_id++));
    if (accepted == nullptr) return;
    tcp_conn& c = *accepted;
    // A client address in its cool-down after repeated auth failures is turned away first.
    if (uint64_t left_ms = _options.auth ? _options.auth->cooldown_left_ms(c.peer_address) : 0;
        left_ms > 0) {
        _counters.auth_refused++;
        _owner.door_refuse(c, errc::unauthorized, cut_off_message(left_ms), left_ms);
        return;
    }
    if (_open >= _options.connections_max && _options.reclaim_peer_closed) close_peer_closed();
    if (_open < _options.connections_max) {
        admit(c);
        return;
    }
    _counters.connections_refused++;
    _owner.door_refuse(c, errc::overloaded,
                       "too many connections (" + _options.connections_max_key + " = " +
                           std::to_string(_options.connections_max) + ")",
                       0);
}

void front_door::admit(tcp_conn& c) {
    assert(!c.admitted && !c.closing);
    c.admitted = true;
    _open++;
    _counters.connections_total++;
    _owner.door_admitted(c);
}

// Admitted connections whose client has closed and that have nothing left to read are closed
// here, as reading their EOF would close them. libuv accepts every connection in the backlog,
// also those that arrived after this loop pass's poll, so those EOFs may not be read yet. One
// poll() over all of them, only when a connection would otherwise be refused.
void front_door::close_peer_closed() {
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

// ---- the sweep and the connection layer's calls ------------------------------------------------

void front_door::sweep_cb(uv_timer_t* t) {
    auto& self = *static_cast<front_door*>(t->data);
    self._conns.sweep_lingering();
    // Collected first: what the door does to a late connection may close it.
    std::vector<tcp_conn*> open;
    self._conns.for_each([&](tcp_conn& c) {
        if (c.admitted && !c.closing && !self._pauses.paused(c.id)) open.push_back(&c);
    });
    for (tcp_conn* c : open) {
        if (!c->closing) self._owner.door_sweep(*c);
    }
}

void front_door::conn_read(tcp_conn& c, const char* data, size_t size) {
    _owner.door_read(c, data, size);
}

void front_door::conn_stopping(tcp_conn& c, const std::string& reason) {
    if (_owner.door_abandon(c)) {
        _gone.send(client_gone{conn_id(_options.door, c.id), reason});
    }
    if (c.admitted) {
        assert(_open > 0);
        _open--;
    }
}

void front_door::conn_closed(tcp_conn& c) {
    _pauses.forget(c.id);
}

tcp_conn* front_door::find(uint64_t conn) {
    if ((conn >> door_kind_shift) != uint64_t(_options.door)) return nullptr;
    return _conns.find(conn & local_id_mask);
}

// ---- messages about the door ------------------------------------------------------------------

void front_door::on(const set_health& m) {
    _health_status = m.status;
    _health_reason = m.reason;
}

void front_door::on(const drop_connection& m) {
    tcp_conn* c = find(m.conn);
    if (c == nullptr) return;
    _log->warn("{}connection {} dropped: {}", _prefix, c->id, m.reason);
    _conns.close(*c, "dropped");
}

// A net fault point fired for a request of m.conn (the scheduler saw it reach the armed phase;
// docs/protocol.md "fault"). From here on it is the path a dropped connection takes: a close
// (the scheduler hears client_gone and cancels its requests), or the one a server that stops
// reading takes (what the client sends meanwhile waits in the socket; answers are still
// written, under the same write bound).
void front_door::on(const net_fault& m) {
    tcp_conn* found = find(m.conn);
    if (found == nullptr || found->closing) return;  // already gone
    tcp_conn& c = *found;
    const bool pause = m.kind == fault_kind::net_stop_reading;
    _log->warn("{}connection {}: fault {}{}", _prefix, c.id, enum_name(m.kind),
               pause ? " for " + std::to_string(m.ms) + " ms" : "");
    switch (m.kind) {
        case fault_kind::net_rst:
            _counters.fault_drops++;
            // RST: what is queued is dropped, the client reads ECONNRESET.
            _conns.reset(c, "fault: net_rst");
            break;
        case fault_kind::net_fin:
            _counters.fault_drops++;
            // FIN after the queued writes: the client reads them, then EOF.
            _conns.close_after_writes(c, "fault: net_fin");
            break;
        case fault_kind::net_stop_reading:
            _counters.fault_pauses++;
            _pauses.pause(c.id, clock::now() + std::chrono::milliseconds(m.ms));
            _conns.read_stop(c);
            break;
        default:
            _log->error("net fault of kind {} ignored: not a net kind", enum_name(m.kind));
    }
}

// A net_stop_reading pause of connection `id` ended.
void front_door::resume(uint64_t id, clock::time_point now) {
    tcp_conn* c = _conns.find(id);
    if (c == nullptr || c->closing) return;
    _owner.door_resumed(*c, now);
}

void front_door::on(const begin_drain&) {
    // Health says draining at once, and the listener stays open, so a load balancer's health
    // checks see it and take the server out of rotation while its running requests finish. New
    // requests, on new connections or old ones, are refused with shutting_down by the scheduler
    // (retryable: they never started); the listener closes when the server stops.
    _draining = true;
    _drain_reason =
        "the server is draining: new requests are refused (shutting_down), running ones finish";
    _log->info("draining: health says draining; new requests are refused");
}

std::map<std::string, uint64_t> front_door::counters_map() const {
    const auto& k = _counters;
    return {{"connections_open", _open.load()},
            {"connections_total", k.connections_total},
            {"connections_refused", k.connections_refused},
            {"slow_readers", _conns.slow_readers()},
            {"fault_drops", k.fault_drops},
            {"fault_pauses", k.fault_pauses},
            {"auth_failures", k.auth_failures},
            {"auth_refused", k.auth_refused},
            {"bytes_in", _conns.bytes_in()},
            {"bytes_out", _conns.bytes_out()}};
}

}  // namespace ordo::door
