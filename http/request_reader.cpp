// request_reader.cpp: see request_reader.hpp.
#include "http/request_reader.hpp"

#include <algorithm>
#include <cctype>

namespace ordo::http {
namespace {

request_reader& self_of(llhttp_t* p) {
    return *static_cast<request_reader*>(p->data);
}

// Bytes a header line costs besides its name and value (": " and CRLF), so that many tiny
// headers count against max_header_bytes as they do on the wire.
constexpr size_t header_line_overhead = 4;

}  // namespace

const std::string* http_request::header(std::string_view name) const {
    for (const auto& [k, v] : headers) {
        if (k == name) return &v;
    }
    return nullptr;
}

request_reader::request_reader(size_t header_bytes_max, size_t body_bytes_max)
    : _header_bytes_max(header_bytes_max), _body_bytes_max(body_bytes_max) {
    llhttp_settings_init(&_settings);
    _settings.on_message_begin = &request_reader::on_message_begin;
    _settings.on_method = &request_reader::on_method;
    _settings.on_url = &request_reader::on_url;
    _settings.on_header_field = &request_reader::on_header_field;
    _settings.on_header_value = &request_reader::on_header_value;
    _settings.on_header_value_complete = &request_reader::on_header_value_complete;
    _settings.on_headers_complete = &request_reader::on_headers_complete;
    _settings.on_body = &request_reader::on_body;
    _settings.on_message_complete = &request_reader::on_message_complete;
    llhttp_init(&_parser, HTTP_REQUEST, &_settings);
    _parser.data = this;
}

request_reader::fed request_reader::feed(const char* data, size_t size) {
    if (_failed) return {outcome::failed, 0};
    if (size == 0) return {outcome::need_more, 0};
    llhttp_errno_t rc = llhttp_execute(&_parser, data, size);
    if (rc == HPE_OK) return {outcome::need_more, size};
    if (rc == HPE_PAUSED || rc == HPE_PAUSED_UPGRADE) {
        const char* pos = llhttp_get_error_pos(&_parser);
        size_t consumed = pos != nullptr ? size_t(pos - data) : size;
        if (rc == HPE_PAUSED_UPGRADE) {
            // No protocol upgrades (nor CONNECT): the request is answered, then the connection
            // closes, since what follows is not HTTP.
            _upgrade = true;
            if (_done) _done->keep_alive = false;
            return {outcome::request_complete, size};
        }
        llhttp_resume(&_parser);
        if (_done) return {outcome::request_complete, consumed};
        return {outcome::expect_continue, consumed};
    }
    if (!_failed) {
        // llhttp's own refusal (a malformed request line, header or chunk).
        _failed = true;
        std::string reason = llhttp_get_error_reason(&_parser) != nullptr
                                 ? llhttp_get_error_reason(&_parser)
                                 : llhttp_errno_name(rc);
        _error = {rc == HPE_INVALID_VERSION ? 505 : 400, "malformed HTTP request: " + reason};
    }
    return {outcome::failed, 0};
}

std::optional<http_request> request_reader::take() {
    std::optional<http_request> r = std::move(_done);
    _done.reset();
    return r;
}

int request_reader::fail(int status, std::string message) {
    _failed = true;
    _error = {status, std::move(message)};
    llhttp_set_error_reason(&_parser, "limit");
    return HPE_USER;
}

int request_reader::count_header_bytes(size_t n) {
    _header_bytes += n;
    if (_header_bytes > _header_bytes_max) {
        return fail(431, "the request line and headers exceed http.max_header_bytes = " +
                             std::to_string(_header_bytes_max) + " bytes");
    }
    return HPE_OK;
}

int request_reader::on_message_begin(llhttp_t* p) {
    request_reader& r = self_of(p);
    r._current = {};
    r._field.clear();
    r._value.clear();
    r._in_value = false;
    r._header_bytes = 0;
    r._begun = true;
    r._expect_continue = false;
    return HPE_OK;
}

int request_reader::on_method(llhttp_t* p, const char* at, size_t n) {
    request_reader& r = self_of(p);
    r._current.method.append(at, n);
    return r.count_header_bytes(n);
}

int request_reader::on_url(llhttp_t* p, const char* at, size_t n) {
    request_reader& r = self_of(p);
    r._current.target.append(at, n);
    return r.count_header_bytes(n);
}

int request_reader::on_header_field(llhttp_t* p, const char* at, size_t n) {
    request_reader& r = self_of(p);
    if (r._in_value) {
        r._field.clear();
        r._value.clear();
        r._in_value = false;
    }
    if (r._field.empty()) {
        if (int rc = r.count_header_bytes(header_line_overhead); rc != HPE_OK) return rc;
    }
    r._field.append(at, n);
    return r.count_header_bytes(n);
}

int request_reader::on_header_value(llhttp_t* p, const char* at, size_t n) {
    request_reader& r = self_of(p);
    r._in_value = true;
    r._value.append(at, n);
    return r.count_header_bytes(n);
}

int request_reader::on_header_value_complete(llhttp_t* p) {
    request_reader& r = self_of(p);
    std::string name = r._field;
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return char(std::tolower(c)); });
    r._current.headers.emplace_back(std::move(name), r._value);
    r._field.clear();
    r._value.clear();
    r._in_value = false;
    return HPE_OK;
}

int request_reader::on_headers_complete(llhttp_t* p) {
    request_reader& r = self_of(p);
    const std::string& t = r._current.target;
    r._current.path = t.substr(0, t.find('?'));
    r._current.method = llhttp_method_name(llhttp_method_t(llhttp_get_method(p)));
    if ((p->flags & F_CONTENT_LENGTH) != 0 && p->content_length > r._body_bytes_max) {
        return r.fail(413,
                      "the body is " + std::to_string(p->content_length) +
                          " bytes; http.max_body_bytes = " + std::to_string(r._body_bytes_max));
    }
    const std::string* expect = r._current.header("expect");
    if (expect != nullptr && (p->flags & F_CONTENT_LENGTH) != 0 && p->content_length > 0) {
        std::string e = *expect;
        std::transform(e.begin(), e.end(), e.begin(),
                       [](unsigned char c) { return char(std::tolower(c)); });
        if (e == "100-continue") {
            r._expect_continue = true;
            return HPE_PAUSED;  // the caller writes `100 Continue`, then feeds the rest
        }
    }
    return HPE_OK;
}

int request_reader::on_body(llhttp_t* p, const char* at, size_t n) {
    request_reader& r = self_of(p);
    if (r._current.body.size() + n > r._body_bytes_max) {
        return r.fail(413, "the body exceeds http.max_body_bytes = " +
                               std::to_string(r._body_bytes_max) + " bytes");
    }
    r._current.body.append(at, n);
    return HPE_OK;
}

int request_reader::on_message_complete(llhttp_t* p) {
    request_reader& r = self_of(p);
    r._current.keep_alive = llhttp_should_keep_alive(p) != 0;
    r._done = std::move(r._current);
    r._current = {};
    r._begun = false;
    return HPE_PAUSED;  // one request per feed(): the caller bounds its read-ahead
}

}  // namespace ordo::http
