// tcp_listener.cpp: see tcp_listener.hpp.
#include "door/tcp_listener.hpp"

namespace ordo::door {
namespace {

constexpr int listen_backlog = 128;

}  // namespace

status tcp_listener::open(uv_loop_t* loop, const std::string& host, uint16_t port, void* data,
                          uv_connection_cb cb, std::string_view door) {
    const std::string named = door.empty() ? "" : std::string(door) + " ";
    sockaddr_storage addr{};
    bool v6 = host.find(':') != std::string::npos;
    int rc = v6 ? uv_ip6_addr(host.c_str(), port, reinterpret_cast<sockaddr_in6*>(&addr))
                : uv_ip4_addr(host.c_str(), port, reinterpret_cast<sockaddr_in*>(&addr));
    if (rc != 0) {
        return make_error("listen_failed",
                          "bad " + named + "listen host '" + host + "': " + uv_strerror(rc));
    }
    uv_tcp_init(loop, &_tcp);
    _tcp.data = data;
    _initialised = true;  // must be closed whatever happens next
    std::string where = host + ":" + std::to_string(port);
    if ((rc = uv_tcp_bind(&_tcp, reinterpret_cast<sockaddr*>(&addr), 0)) != 0 ||
        (rc = uv_listen(stream(), listen_backlog, cb)) != 0) {
        return make_error("listen_failed",
                          "cannot listen " +
                              (door.empty() ? "" : "for " + std::string(door) + " ") + "on " +
                              where + ": " + uv_strerror(rc));
    }
    sockaddr_storage bound{};
    int len = sizeof(bound);
    uv_tcp_getsockname(&_tcp, reinterpret_cast<sockaddr*>(&bound), &len);
    _port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                              : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    return {};
}

void tcp_listener::close() {
    if (!_initialised) return;
    uv_close(reinterpret_cast<uv_handle_t*>(&_tcp), nullptr);
    _initialised = false;
}

}  // namespace ordo::door
