// http_client.hpp: test support — a blocking HTTP/1.1 client over a raw socket, for driving the
// real server byte by byte (slow headers, pipelining, disconnects mid-stream). Every read has a
// deadline (tests/support io_deadline), so no test can hang.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/server_process.hpp"

namespace ordo::test {

struct http_response {
    int status = 0;
    std::map<std::string, std::string> headers;  // names lower-cased
    std::string body;                            // de-chunked
    std::string header(const std::string& k) const {
        auto it = headers.find(k);
        return it == headers.end() ? "" : it->second;
    }
};

class http_conn {
public:
    bool connect(uint16_t port) { return _tcp.connect(port); }
    bool send(const std::string& bytes) { return _tcp.send_raw(bytes); }
    // A whole response (Content-Length, chunked, or up to EOF); nullopt on EOF, error or deadline.
    std::optional<http_response> read(std::chrono::milliseconds deadline = io_deadline);
    // The status line and headers only; then read_chunk() for a chunked body.
    std::optional<http_response> read_head(std::chrono::milliseconds deadline = io_deadline);
    // The next chunk's data ("" for the last chunk); nullopt on EOF, error or deadline.
    std::optional<std::string> read_chunk(std::chrono::milliseconds deadline = io_deadline);
    bool wait_closed(std::chrono::milliseconds deadline = io_deadline) {
        return _buf.empty() && _tcp.wait_closed(deadline);
    }
    void close() { _tcp.close(); }
    int fd() const { return _tcp.fd(); }
    // How the server ended the connection, as the last read saw it: "", "eof" or "reset".
    const std::string& peer_closed() const { return _tcp.peer_closed(); }

private:
    bool fill(std::chrono::steady_clock::time_point end);  // more bytes into _buf
    std::optional<std::string> line(std::chrono::steady_clock::time_point end);
    tcp_client _tcp;
    std::string _buf;
};

// "METHOD PATH HTTP/1.1" with Host, Content-Length when there is a body, and `extra` headers
// (each ending in \r\n).
std::string http_request_text(const std::string& method, const std::string& path,
                              const std::string& body = "", const std::string& extra = "");

// One request on a new connection (Connection: close); nullopt when no answer came.
std::optional<http_response> http_call(uint16_t port, const std::string& method,
                                       const std::string& path, const std::string& body = "");

// The `data:` payloads of a server-sent event body, in order.
std::vector<std::string> sse_data(const std::string& body);

}  // namespace ordo::test
