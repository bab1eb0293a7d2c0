// cors.hpp: Cross-Origin Resource Sharing for the HTTP front door: which browser pages may call
// the API, and the headers that say so. Pure: no sockets, no actor; the HTTP actor holds one
// policy built from [http] cors_allow_origins and asks it about each request; tests call it
// directly.
//
// A browser lets a page read an answer from another origin only when the answer carries
// `Access-Control-Allow-Origin` naming the page's origin (or `*`). Before a request that is not
// "simple" (a POST with `Content-Type: application/json`, or any request with `Authorization`:
// every OpenAI call) it first sends a preflight, `OPTIONS` with `Origin` and
// `Access-Control-Request-Method`, without credentials, and goes on only if that answer allows
// the origin, the method and the headers it means to send. So:
//
//   - An allowed origin's preflight: 204 with Allow-Origin (the origin echoed), Allow-Methods
//     (the endpoint's method and OPTIONS), Allow-Headers (Authorization and Content-Type, plus
//     whatever the page asked for in Access-Control-Request-Headers, when well-formed: OpenAI's
//     browser client sends its own x-stainless-* headers), Max-Age and Vary: Origin. No API
//     key needed: a browser never sends one on a preflight. The request that follows still
//     needs one.
//   - Another origin's preflight: 403 origin_not_allowed in OpenAI's error shape, and no CORS
//     header, so the browser stops there (it shows the page a network error either way; curl
//     and logs see why).
//   - Every other answer (errors and SSE streams included) to an allowed origin carries
//     Allow-Origin, so the page can read a 401 or a 400 as well as a 200.
//   - While any origin is configured every answer carries `Vary: Origin`, so a cache never hands
//     one origin's answer to another. With the list empty (the default) nothing here adds a
//     header and the browser's same-origin policy holds.
//
// The allowed origin is echoed rather than `*` even when the list says "*": an echo works for
// every request mode, a literal `*` not for credentialed ones. An Origin is only echoed when it
// is well-formed (visible ASCII, at most origin_bytes_max), so a header is never written from
// bytes a client chose beyond that.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "http/request_reader.hpp"

namespace ordo::http {

class cors_policy {
public:
    // Chromium caps a preflight's cache at 2 hours (Firefox at 24): a longer Max-Age buys
    // nothing, and a shorter one costs a preflight per request in a busy page.
    static constexpr uint32_t max_age_s = 7200;
    // An origin is scheme://host:port; no real one is this long, and the bound keeps what is
    // echoed small.
    static constexpr size_t origin_bytes_max = 1024;
    // Access-Control-Request-Headers echoed at most; a longer list gets only the base headers.
    static constexpr size_t request_headers_bytes_max = 1024;

    cors_policy() = default;
    // `allow_origins` as http.cors_allow_origins holds them (validated there): exact origins,
    // or "*" for any.
    explicit cors_policy(std::vector<std::string> allow_origins);

    // Whether any origin is configured (else no header is ever added).
    bool enabled() const { return !_origins.empty() || _any; }

    // The value of Access-Control-Allow-Origin for a request whose Origin header is `origin`
    // (null: none sent), or nullopt when its answer gets no CORS headers.
    std::optional<std::string> allowed(const std::string* origin) const;

    // Header lines ("Name: value\r\n"...) for an answer whose request `allowed` said `origin`
    // of: Allow-Origin when allowed, Vary: Origin whenever enabled(); "" otherwise.
    std::string answer_headers(const std::optional<std::string>& origin) const;

    // The header lines a preflight of an allowed origin adds to answer_headers: Allow-Methods
    // (`methods`, "POST, OPTIONS"), Allow-Headers (base headers and `request_headers`, the
    // Access-Control-Request-Headers sent, when well-formed) and Max-Age. (Browsers key their
    // preflight cache by origin and URL themselves; answer_headers' Vary: Origin covers the
    // rest.)
    static std::string preflight_headers(std::string_view methods,
                                         const std::string* request_headers);

private:
    std::vector<std::string> _origins;  // exact origins, "*" removed
    bool _any = false;                  // "*" was listed
};

// Whether `r` is a CORS preflight: OPTIONS with Origin and Access-Control-Request-Method.
bool is_preflight(const http_request& r);

}  // namespace ordo::http
