// http_client.cpp: see http_client.hpp.
#include "tests/http/http_client.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>

namespace ordo::test {
namespace {

using clock = std::chrono::steady_clock;

int ms_left(clock::time_point end) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(end - clock::now()).count();
    return int(std::max<int64_t>(0, ms));
}

}  // namespace

bool http_conn::fill(clock::time_point end) {
    // tcp_client's msgpack reader is not used here: read the socket directly.
    pollfd p{_tcp.fd(), POLLIN, 0};
    if (poll(&p, 1, ms_left(end)) <= 0) return false;
    char buf[65536];
    ssize_t n = ::recv(_tcp.fd(), buf, sizeof buf, 0);
    if (n <= 0) return false;
    _buf.append(buf, size_t(n));
    return true;
}

std::optional<std::string> http_conn::line(clock::time_point end) {
    size_t at;
    while ((at = _buf.find("\r\n")) == std::string::npos) {
        if (!fill(end)) return std::nullopt;
    }
    std::string l = _buf.substr(0, at);
    _buf.erase(0, at + 2);
    return l;
}

std::optional<http_response> http_conn::read_head(std::chrono::milliseconds deadline) {
    auto end = clock::now() + deadline;
    auto status = line(end);
    if (!status || status->rfind("HTTP/1.1 ", 0) != 0) return std::nullopt;
    http_response r;
    r.status = std::stoi(status->substr(9, 3));
    while (true) {
        auto h = line(end);
        if (!h) return std::nullopt;
        if (h->empty()) break;
        size_t colon = h->find(':');
        std::string k = h->substr(0, colon);
        std::transform(k.begin(), k.end(), k.begin(),
                       [](unsigned char c) { return std::tolower(c); });
        std::string v = colon == std::string::npos ? "" : h->substr(colon + 1);
        v.erase(0, v.find_first_not_of(' '));
        r.headers[k] = v;
    }
    return r;
}

std::optional<std::string> http_conn::read_chunk(std::chrono::milliseconds deadline) {
    auto end = clock::now() + deadline;
    auto size_line = line(end);
    if (!size_line) return std::nullopt;
    size_t n = std::stoul(*size_line, nullptr, 16);
    while (_buf.size() < n + 2) {
        if (!fill(end)) return std::nullopt;
    }
    std::string data = _buf.substr(0, n);
    _buf.erase(0, n + 2);
    return data;
}

std::optional<http_response> http_conn::read(std::chrono::milliseconds deadline) {
    auto end = clock::now() + deadline;
    auto r = read_head(deadline);
    if (!r) return std::nullopt;
    if (r->status == 204 || r->status == 304) return r;  // never a body (RFC 9110)
    if (r->header("transfer-encoding") == "chunked") {
        while (true) {
            auto c = read_chunk(std::chrono::milliseconds(ms_left(end)));
            if (!c) return std::nullopt;
            if (c->empty()) return r;
            r->body += *c;
        }
    }
    if (!r->header("content-length").empty()) {
        size_t n = std::stoul(r->header("content-length"));
        while (_buf.size() < n) {
            if (!fill(end)) return std::nullopt;
        }
        r->body = _buf.substr(0, n);
        _buf.erase(0, n);
        return r;
    }
    while (fill(end)) {
    }
    r->body = std::move(_buf);
    _buf.clear();
    return r;
}

std::string http_request_text(const std::string& method, const std::string& path,
                              const std::string& body, const std::string& extra) {
    std::string s = method + " " + path + " HTTP/1.1\r\nHost: test\r\n" + extra;
    if (!body.empty() || method == "POST") {
        s += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
             "\r\n";
    }
    return s + "\r\n" + body;
}

std::optional<http_response> http_call(uint16_t port, const std::string& method,
                                       const std::string& path, const std::string& body) {
    http_conn c;
    if (!c.connect(port) ||
        !c.send(http_request_text(method, path, body, "Connection: close\r\n"))) {
        return std::nullopt;
    }
    return c.read();
}

std::vector<std::string> sse_data(const std::string& body) {
    std::vector<std::string> out;
    size_t at = 0;
    while (at < body.size()) {
        size_t end = body.find("\n\n", at);
        if (end == std::string::npos) end = body.size();
        std::string ev = body.substr(at, end - at);
        if (ev.rfind("data: ", 0) == 0) out.push_back(ev.substr(6));
        at = end + 2;
    }
    return out;
}

}  // namespace ordo::test
