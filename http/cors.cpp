// cors.cpp: see cors.hpp.
#include "http/cors.hpp"

#include <algorithm>
#include <cassert>

namespace ordo::http {
namespace {

// The headers every preflight allows: what OpenAI's clients and a fetch() with a JSON body
// send. A wildcard would not do: the Fetch standard never lets `*` cover Authorization.
constexpr std::string_view base_allowed_headers = "Authorization, Content-Type";

// Visible ASCII without spaces: what an origin serialisation is made of.
bool well_formed_origin(std::string_view v) {
    if (v.empty() || v.size() > cors_policy::origin_bytes_max) return false;
    return std::all_of(v.begin(), v.end(), [](char c) { return c > ' ' && c < 0x7f; });
}

// RFC 9110 tchar: the characters of a header field name.
bool is_tchar(char c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
    return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

// A comma-separated list of header names (browsers send "authorization,content-type").
bool well_formed_header_list(std::string_view v) {
    if (v.empty() || v.size() > cors_policy::request_headers_bytes_max) return false;
    return std::all_of(v.begin(), v.end(),
                       [](char c) { return is_tchar(c) || c == ',' || c == ' '; });
}

}  // namespace

cors_policy::cors_policy(std::vector<std::string> allow_origins) {
    for (std::string& o : allow_origins) {
        if (o == "*") {
            _any = true;
        } else {
            assert(well_formed_origin(o) && "config validated http.cors_allow_origins");
            _origins.push_back(std::move(o));
        }
    }
}

std::optional<std::string> cors_policy::allowed(const std::string* origin) const {
    if (origin == nullptr || !enabled() || !well_formed_origin(*origin)) return std::nullopt;
    if (_any || std::find(_origins.begin(), _origins.end(), *origin) != _origins.end()) {
        return *origin;
    }
    return std::nullopt;
}

std::string cors_policy::answer_headers(const std::optional<std::string>& origin) const {
    if (!enabled()) {
        assert(!origin);
        return "";
    }
    std::string out;
    if (origin) out = "Access-Control-Allow-Origin: " + *origin + "\r\n";
    return out + "Vary: Origin\r\n";
}

std::string cors_policy::preflight_headers(std::string_view methods,
                                           const std::string* request_headers) {
    std::string out = "Access-Control-Allow-Methods: " + std::string(methods) + "\r\n";
    out += "Access-Control-Allow-Headers: " + std::string(base_allowed_headers);
    if (request_headers != nullptr && well_formed_header_list(*request_headers)) {
        out += ", " + *request_headers;
    }
    return out + "\r\nAccess-Control-Max-Age: " + std::to_string(max_age_s) + "\r\n";
}

bool is_preflight(const http_request& r) {
    return r.method == "OPTIONS" && r.header("origin") != nullptr &&
           r.header("access-control-request-method") != nullptr;
}

}  // namespace ordo::http
