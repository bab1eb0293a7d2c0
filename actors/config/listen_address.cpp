// listen_address.cpp: parses `server.listen` ("127.0.0.1:7070", "[::1]:0") into host + port.
//
// Used by config validation (so a bad address is refused before anything starts) and by the
// bootstrap, which hands the result to the net actor. Only numeric addresses are accepted:
// libuv's uv_ip4_addr/uv_ip6_addr take numeric text, and resolving names at start-up would make
// the server's behaviour depend on DNS.
#include <arpa/inet.h>

#include <charconv>

#include "actors/config/config.hpp"

namespace ordo::config {
namespace {

constexpr std::size_t listen_text_bytes_max = 128;  // "[" + 45-char IPv6 + "]:65535" fits

error bad(std::string_view why) {
    return make_error("config_invalid",
                      std::string(why) + " (expected IPv4:port or [IPv6]:port, port 0..65535)");
}

}  // namespace

result<listen_address> parse_listen_address(std::string_view text) {
    if (text.size() > listen_text_bytes_max) return bad("address too long");
    const std::size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return bad("missing port");
    std::string_view host = text.substr(0, colon);
    const std::string_view port_text = text.substr(colon + 1);

    listen_address out;
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
        host = host.substr(1, host.size() - 2);
        out.ipv6 = true;
    } else if (host.find(':') != std::string_view::npos) {
        return bad("an IPv6 address must be in brackets");
    }
    if (host.empty()) return bad("missing host");
    out.host = std::string(host);

    unsigned char buf[sizeof(struct in6_addr)];
    if (inet_pton(out.ipv6 ? AF_INET6 : AF_INET, out.host.c_str(), buf) != 1) {
        return bad(out.ipv6 ? "not a numeric IPv6 address" : "not a numeric IPv4 address");
    }

    unsigned port = 0;
    const char* end = port_text.data() + port_text.size();
    auto [ptr, ec] = std::from_chars(port_text.data(), end, port);
    if (port_text.empty() || ec != std::errc{} || ptr != end || port > 65535) {
        return bad("bad port");
    }
    out.port = static_cast<std::uint16_t>(port);
    return out;
}

}  // namespace ordo::config
