// request_reader.hpp: HTTP/1.1 requests out of a connection's byte stream, with limits. Pure:
// no sockets, no actor; the HTTP actor owns one per connection, tests feed it bytes directly.
//
// Parsing is llhttp's (the parser Node.js runs on libuv, built from Debian's node-llhttp
// sources: http/CMakeLists.txt). This file adds what a server needs around it:
//   - a bound on the request line and headers (max_header_bytes: 431 beyond) and on the body
//     (max_body_bytes: 413 as soon as Content-Length says so, or when chunks pass it);
//   - one request at a time: feed() stops right after a request is complete (or after the
//     headers of one that asks `Expect: 100-continue`), so the caller decides how many requests
//     it reads ahead (max_pipelined_requests) and keeps the unread rest;
//   - an error is final: after it the connection's stream cannot be resynchronised, the caller
//     answers with its status and closes.
#pragma once

#include <llhttp.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ordo::http {

struct http_request {
    std::string method;  // "GET", "POST", ... as llhttp names it
    std::string target;  // the request target as sent ("/v1/models?x=1")
    std::string path;    // the target up to '?'
    std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
    std::string body;
    bool keep_alive = true;  // the connection may carry another request after this one
    // The first header named `name` (lower case), or nullptr.
    const std::string* header(std::string_view name) const;
};

// Why the stream cannot be read on: the status to answer (400, 413, 431, 505) and a message.
struct read_error {
    int status = 400;
    std::string message;
};

class request_reader {
public:
    request_reader(size_t header_bytes_max, size_t body_bytes_max);
    ~request_reader() = default;
    request_reader(const request_reader&) = delete;
    request_reader& operator=(const request_reader&) = delete;

    // What one feed() call ended with.
    enum class outcome {
        need_more,         // every byte consumed, no request complete
        request_complete,  // a request is ready (take()); bytes after it are not consumed
        expect_continue,   // headers of a request that wants `100 Continue` before its body
        failed,            // error() says why; nothing more will be read
    };
    struct fed {
        outcome what = outcome::need_more;
        size_t consumed = 0;  // bytes of `data` taken
    };
    fed feed(const char* data, size_t size);

    // The request completed by the last feed (once).
    std::optional<http_request> take();
    const read_error& error() const { return _error; }
    // Bytes of a request have arrived and it is not complete yet (what the header timeout
    // bounds).
    bool mid_request() const { return _begun; }

private:
    static int on_message_begin(llhttp_t* p);
    static int on_method(llhttp_t* p, const char* at, size_t n);
    static int on_url(llhttp_t* p, const char* at, size_t n);
    static int on_header_field(llhttp_t* p, const char* at, size_t n);
    static int on_header_value(llhttp_t* p, const char* at, size_t n);
    static int on_header_value_complete(llhttp_t* p);
    static int on_headers_complete(llhttp_t* p);
    static int on_body(llhttp_t* p, const char* at, size_t n);
    static int on_message_complete(llhttp_t* p);

    int fail(int status, std::string message);  // from a callback: HPE_USER
    int count_header_bytes(size_t n);

    llhttp_settings_t _settings{};
    llhttp_t _parser{};
    size_t _header_bytes_max;
    size_t _body_bytes_max;
    http_request _current;
    std::string _field, _value;  // the header being read
    bool _in_value = false;
    size_t _header_bytes = 0;
    bool _begun = false;
    bool _expect_continue = false;
    bool _upgrade = false;
    std::optional<http_request> _done;
    read_error _error;
    bool _failed = false;
};

}  // namespace ordo::http
