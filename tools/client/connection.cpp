// connection.cpp: see connection.hpp.
#include "tools/client/connection.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ordo::client {
namespace {

constexpr size_t read_chunk_bytes = 64 * 1024;

int remaining_ms(std::chrono::steady_clock::time_point end) {
    // Rounded up: a wait of "0 ms" while time is left would return at once, and a caller that
    // loops until `end` would spin through its last millisecond.
    auto left =
        std::chrono::ceil<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

// Non-blocking connect bounded by `timeout_ms`; returns 0 or an errno value.
int connect_within(int fd, const sockaddr* addr, socklen_t len, int timeout_ms) {
    int flags = fcntl(fd, F_GETFL, 0);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    int rc = ::connect(fd, addr, len);
    if (rc != 0 && errno != EINPROGRESS) return errno;
    if (rc != 0) {
        pollfd p{fd, POLLOUT, 0};
        if (poll(&p, 1, timeout_ms) <= 0) return ETIMEDOUT;
        int err = 0;
        socklen_t err_len = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len);
        if (err != 0) return err;
    }
    fcntl(fd, F_SETFL, flags);
    return 0;
}

}  // namespace

connection::~connection() {
    if (_fd >= 0) ::close(_fd);
}

status connection::open(const std::string& host, uint16_t port, std::chrono::milliseconds timeout) {
    if (_fd >= 0) ::close(_fd), _fd = -1;
    _unpacker = msgpack::unpacker();
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    std::string port_text = std::to_string(port);
    if (int rc = getaddrinfo(host.c_str(), port_text.c_str(), &hints, &found); rc != 0) {
        return make_error("unreachable", "cannot resolve " + host + ": " + gai_strerror(rc));
    }
    int last_err = 0;
    for (addrinfo* a = found; a != nullptr && _fd < 0; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        last_err = connect_within(fd, a->ai_addr, a->ai_addrlen, static_cast<int>(timeout.count()));
        if (last_err == 0) {
            _fd = fd;
        } else {
            ::close(fd);
        }
    }
    freeaddrinfo(found);
    if (_fd < 0) {
        return make_error("unreachable", "cannot connect to " + host + ":" + port_text + ": " +
                                             std::strerror(last_err) +
                                             " (is ordo-server running? start it with "
                                             "`bash tools/dev.sh run`)");
    }
    return {};
}

status connection::send(const msgpack::sbuffer& frame) {
    return send_bytes(std::string_view(frame.data(), frame.size()));
}

status connection::send_bytes(std::string_view bytes) {
    size_t off = 0;
    while (off < bytes.size()) {
        ssize_t n = ::send(_fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
        if (n <= 0)
            return make_error("closed", std::string("send failed: ") + std::strerror(errno));
        off += static_cast<size_t>(n);
    }
    return {};
}

status connection::recv_bytes(std::string& out, std::chrono::milliseconds deadline) {
    pollfd p{_fd, POLLIN, 0};
    int ready = poll(&p, 1, static_cast<int>(deadline.count()));
    if (ready < 0 && errno == EINTR) return make_error("interrupted", "interrupted");
    if (ready <= 0) return make_error("timeout", "no answer from the server in time");
    size_t old = out.size();
    out.resize(old + read_chunk_bytes);
    ssize_t n = ::recv(_fd, out.data() + old, read_chunk_bytes, 0);
    out.resize(old + static_cast<size_t>(std::max<ssize_t>(n, 0)));
    if (n <= 0) return make_error("closed", "the server closed the connection");
    return {};
}

result<msgpack::object_handle> connection::recv(std::chrono::milliseconds deadline) {
    auto end = std::chrono::steady_clock::now() + deadline;
    msgpack::object_handle oh;
    try {
        while (!_unpacker.next(oh)) {
            pollfd p{_fd, POLLIN, 0};
            int ready = poll(&p, 1, remaining_ms(end));
            if (ready < 0 && errno == EINTR) return make_error("interrupted", "interrupted");
            if (ready <= 0) return make_error("timeout", "no answer from the server in time");
            _unpacker.reserve_buffer(read_chunk_bytes);
            ssize_t n = ::recv(_fd, _unpacker.buffer(), read_chunk_bytes, 0);
            if (n <= 0) return make_error("closed", "the server closed the connection");
            _unpacker.buffer_consumed(static_cast<size_t>(n));
        }
    } catch (const std::exception& e) {
        return make_error("bad_frame", std::string("malformed reply: ") + e.what());
    }
    return oh;
}

bool connection::peer_closed() const {
    if (_fd < 0) return true;
    pollfd p{_fd, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0) return false;
    char byte = 0;
    return ::recv(_fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

const msgpack::object* find(const msgpack::object& map, std::string_view key) {
    if (map.type != msgpack::type::MAP) return nullptr;
    for (uint32_t i = 0; i < map.via.map.size; i++) {
        const auto& kv = map.via.map.ptr[i];
        if (kv.key.type == msgpack::type::STR &&
            std::string_view(kv.key.via.str.ptr, kv.key.via.str.size) == key) {
            return &kv.val;
        }
    }
    return nullptr;
}

std::string get_str(const msgpack::object& map, std::string_view key) {
    const auto* v = find(map, key);
    return v && v->type == msgpack::type::STR ? std::string(v->via.str.ptr, v->via.str.size)
                                              : std::string();
}

}  // namespace ordo::client
