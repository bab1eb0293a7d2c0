// tcp_conn.cpp: see tcp_conn.hpp. Everything here runs on the owner's loop thread.
#include "door/tcp_conn.hpp"

#include <algorithm>
#include <array>
#include <cassert>
#include <vector>

namespace ordo::door {
namespace {

// libuv hands every read the same buffer: reads are handled before the next alloc, and one
// 64 KiB read is enough to keep a connection moving without per-read allocations.
constexpr size_t read_buffer_bytes = 64 * 1024;

struct write_req {
    uv_write_t req{};
    std::string data;
    tcp_conn* conn = nullptr;
};

uv_stream_t* stream_of(tcp_conn& c) {
    return reinterpret_cast<uv_stream_t*>(&c.tcp);
}

uv_handle_t* handle_of(tcp_conn& c) {
    return reinterpret_cast<uv_handle_t*>(&c.tcp);
}

uint64_t ms_since(std::chrono::steady_clock::time_point t) {
    return uint64_t(
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t)
            .count());
}

std::string peer_address_of(const uv_tcp_t& tcp) {
    sockaddr_storage addr{};
    int len = sizeof addr;
    if (uv_tcp_getpeername(&tcp, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
    char text[INET6_ADDRSTRLEN] = {};
    int rc = addr.ss_family == AF_INET6
                 ? uv_ip6_name(reinterpret_cast<const sockaddr_in6*>(&addr), text, sizeof text)
                 : uv_ip4_name(reinterpret_cast<const sockaddr_in*>(&addr), text, sizeof text);
    return rc == 0 ? text : "";
}

}  // namespace

void tcp_conns::init(uv_loop_t* loop, tcp_conn_owner& owner, tcp_conn_options options,
                     spdlog::logger& log) {
    _loop = loop;
    _owner = &owner;
    _log = &log;
    _options = std::move(options);
    _stopping = false;
    uv_timer_init(loop, &_grace_timer);
    _grace_timer.data = this;
}

// ---- accepting and reading -----------------------------------------------------------------

tcp_conn* tcp_conns::accept(uv_stream_t* listener, std::unique_ptr<tcp_conn> owned) {
    tcp_conn& c = *owned;
    c.set = this;
    uv_tcp_init(_loop, &c.tcp);
    c.tcp.data = &c;
    [[maybe_unused]] const bool added = _conns.emplace(c.id, std::move(owned)).second;
    assert(added && "the owner gives every connection its own id");
    if (uv_accept(listener, stream_of(c)) != 0) {
        close(c, "accept failed");
        return nullptr;
    }
    uv_tcp_nodelay(&c.tcp, 1);
    c.peer_address = peer_address_of(c.tcp);
    return &c;
}

tcp_conn* tcp_conns::find(uint64_t id) {
    auto it = _conns.find(id);
    return it == _conns.end() ? nullptr : it->second.get();
}

void tcp_conns::read_start(tcp_conn& c) {
    if (c.reading || c.closing) return;
    c.reading = uv_read_start(stream_of(c), &tcp_conns::alloc_cb, &tcp_conns::read_cb) == 0;
}

void tcp_conns::read_stop(tcp_conn& c) {
    if (c.reading) uv_read_stop(stream_of(c));
    c.reading = false;
}

void tcp_conns::alloc_cb(uv_handle_t*, size_t, uv_buf_t* buf) {
    static thread_local std::array<char, read_buffer_bytes> buffer;
    *buf = uv_buf_init(buffer.data(), buffer.size());
}

void tcp_conns::read_cb(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) {
    auto& c = *static_cast<tcp_conn*>(stream->data);
    tcp_conns& self = *c.set;
    if (c.lingering_since) {
        self.linger_read(c, nread);
    } else if (nread == UV_EOF) {
        self.close(c, "client closed");
    } else if (nread < 0) {
        self.close(c, uv_strerror(static_cast<int>(nread)));
    } else if (nread > 0) {
        // stop_reading stops the reads of a closing connection; only lingering ones read on.
        assert(!c.closing);
        self._bytes_in += uint64_t(nread);
        self._owner->conn_read(c, buf->base, size_t(nread));
    }
}

// ---- writing ---------------------------------------------------------------------------------

bool tcp_conns::send(tcp_conn& c, std::string bytes) {
    if (c.closing) return false;
    if (c.write_pending_bytes + bytes.size() > _options.write_buffer_bytes_max) {
        // The client stopped reading: buffering more would grow memory without bound.
        _slow_readers++;
        _log->warn("{}connection {}: {} bytes unread (limit {}), closing", _options.door, c.id,
                   c.write_pending_bytes, _options.write_buffer_bytes_max);
        close(c, "slow_reader");
        return false;
    }
    auto* w = new write_req;
    w->data = std::move(bytes);
    w->conn = &c;
    w->req.data = w;
    c.write_pending_bytes += w->data.size();
    assert(c.write_pending_bytes <= _options.write_buffer_bytes_max);
    _bytes_out += w->data.size();
    uv_buf_t buf = uv_buf_init(w->data.data(), static_cast<unsigned>(w->data.size()));
    int rc = uv_write(&w->req, stream_of(c), &buf, 1, &tcp_conns::write_cb);
    if (rc != 0) {
        c.write_pending_bytes -= w->data.size();
        delete w;
        close(c, uv_strerror(rc));
        return false;
    }
    return true;
}

void tcp_conns::write_cb(uv_write_t* req, int status) {
    auto* w = static_cast<write_req*>(req->data);
    tcp_conn& c = *w->conn;
    assert(c.write_pending_bytes >= w->data.size());  // send() counted it
    c.write_pending_bytes -= w->data.size();
    delete w;
    if (status < 0 && status != UV_ECANCELED) c.set->close(c, uv_strerror(status));
}

// ---- closing -------------------------------------------------------------------------------

void tcp_conns::stop_reading(tcp_conn& c, const std::string& reason) {
    if (!c.closing) {
        _owner->conn_stopping(c, reason);
        c.closing = true;
    }
    read_stop(c);
}

void tcp_conns::close(tcp_conn& c, const char* reason) {
    if (uv_is_closing(handle_of(c))) return;
    _log->debug("{}connection {} closing: {}", _options.door, c.id, reason);
    stop_reading(c, reason);
    uv_close(handle_of(c), &tcp_conns::close_cb);
}

void tcp_conns::reset(tcp_conn& c, const char* reason) {
    stop_reading(c, reason);
    if (uv_tcp_close_reset(&c.tcp, &tcp_conns::close_cb) != 0) {
        uv_close(handle_of(c), &tcp_conns::close_cb);
    }
}

// The lingering close. An owner closes a connection after an answer while the client may still
// be sending (HTTP: an early 413 answered before the body, a 431, a 408 or parser 400
// mid-request, a 429 at max_connections, more bytes behind a Connection: close request).
// Closing a socket that holds unread bytes makes the kernel send a reset, and a reset can reach
// the client before it has read the answer (its send fails with ECONNRESET, or its unread input
// is discarded): it sees "connection reset", not the answer. So, as RFC 9112 9.6 asks: the
// answer is queued, the socket is shut down for writing once it is written (FIN), and reading
// goes on, every byte discarded, until the client's EOF, then the handle is closed. A client
// that never stops sending is cut off (closed, a reset if bytes are unread; counted in
// linger_cutoffs) at linger_bytes_max discarded or linger_ms after the close began (the owner's
// sweep). At most lingering_max connections linger at once; beyond, and with linger_ms 0, the
// connection closes right after its writes.
void tcp_conns::close_after_writes(tcp_conn& c, const char* reason, bool linger) {
    if (c.closing) return;
    stop_reading(c, reason);
    if (linger && _options.linger_ms > 0 && _lingering < _options.lingering_max) {
        c.lingering_since = tcp_conn::clock::now();
        _lingering++;
        assert(_lingering <= _options.lingering_max);
        _lingering_closes++;
        c.reading = uv_read_start(stream_of(c), &tcp_conns::alloc_cb, &tcp_conns::read_cb) == 0;
    }
    // shutdown completes after the queued writes; then the handle is closed, or lingers.
    c.shutdown_req.data = &c;
    if (uv_shutdown(&c.shutdown_req, stream_of(c), &tcp_conns::shutdown_cb) != 0) {
        uv_close(handle_of(c), &tcp_conns::close_cb);
    }
}

void tcp_conns::shutdown_cb(uv_shutdown_t* req, int status) {
    auto& c = *static_cast<tcp_conn*>(req->data);
    c.write_shut = true;
    // Lingering: the writes are out; reads go on until the client's EOF or a bound.
    if (c.lingering_since && c.reading && !c.peer_shut && status == 0 && !c.set->_stopping) {
        return;
    }
    if (!uv_is_closing(handle_of(c))) uv_close(handle_of(c), &tcp_conns::close_cb);
}

// A read while lingering: bytes are discarded (up to the bound); EOF ends the lingering once the
// writes are out (else the shutdown's callback closes); an error closes at once.
void tcp_conns::linger_read(tcp_conn& c, ssize_t nread) {
    if (nread > 0) {
        _bytes_in += uint64_t(nread);
        c.linger_bytes += uint64_t(nread);
        if (c.linger_bytes > _options.linger_bytes_max) {
            _linger_cutoffs++;
            close(c, "lingered past its byte bound");
        }
        return;
    }
    if (nread == 0) return;  // nothing this time (EAGAIN)
    read_stop(c);
    c.peer_shut = true;
    if (nread != UV_EOF || c.write_shut) {
        close(c, nread == UV_EOF ? "client closed" : uv_strerror(int(nread)));
    }
}

void tcp_conns::sweep_lingering() {
    std::vector<tcp_conn*> lingered;
    for (auto& [id, c] : _conns) {
        if (c->lingering_since && !uv_is_closing(handle_of(*c)) &&
            ms_since(*c->lingering_since) >= _options.linger_ms) {
            lingered.push_back(c.get());
        }
    }
    for (tcp_conn* c : lingered) {
        _linger_cutoffs++;
        close(*c, "lingered past its time bound");
    }
}

size_t tcp_conns::stop() {
    _stopping = true;
    size_t flushing = 0;
    for (auto& [id, c] : _conns) {
        if (c->lingering_since && !c->write_shut) {
            // Its writes are still going out: no more lingering; the shutdown closes it.
            read_stop(*c);
            flushing++;
        } else if (c->write_pending_bytes > 0 && !c->closing) {
            close_after_writes(*c, "server stopping");
            flushing++;
        } else {
            close(*c, "server stopping");
        }
    }
    if (flushing > 0) {
        uv_timer_start(&_grace_timer, &tcp_conns::grace_cb, _options.shutdown_grace_ms, 0);
    } else {
        uv_close(reinterpret_cast<uv_handle_t*>(&_grace_timer), nullptr);
    }
    return flushing;
}

void tcp_conns::grace_cb(uv_timer_t* t) {
    auto& self = *static_cast<tcp_conns*>(t->data);
    for (auto& [id, c] : self._conns) {
        if (!uv_is_closing(handle_of(*c))) uv_close(handle_of(*c), &tcp_conns::close_cb);
    }
    uv_close(reinterpret_cast<uv_handle_t*>(t), nullptr);
}

void tcp_conns::close_cb(uv_handle_t* handle) {
    auto& c = *static_cast<tcp_conn*>(handle->data);
    tcp_conns& self = *c.set;
    assert(!c.lingering_since || self._lingering > 0);
    if (c.lingering_since) self._lingering--;
    self._owner->conn_closed(c);
    self._conns.erase(c.id);  // frees c
    auto* grace = reinterpret_cast<uv_handle_t*>(&self._grace_timer);
    if (self._stopping && self._conns.empty() && !uv_is_closing(grace)) uv_close(grace, nullptr);
}

}  // namespace ordo::door
