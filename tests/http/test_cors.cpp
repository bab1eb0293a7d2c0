// test_cors.cpp: http/cors (which origins get CORS headers, and which headers), without a
// server; tests/http/test_http_cors.cpp checks the same rules over the real server.
//
// Checks: with no origin configured nothing is ever added (not even Vary); an exact origin is
// echoed only for itself (not a prefix, a case variant or another port); "*" echoes any
// well-formed origin and never a malformed or oversized one; Vary: Origin goes on every answer
// once any origin is configured; a preflight's headers list the methods, the base headers and
// the requested ones only when they are a well-formed header-name list; is_preflight needs
// OPTIONS, Origin and Access-Control-Request-Method.
#include <gtest/gtest.h>

#include "http/cors.hpp"

namespace {

using ordo::http::cors_policy;

TEST(cors, an_empty_list_adds_nothing) {
    cors_policy p(std::vector<std::string>{});
    EXPECT_FALSE(p.enabled());
    const std::string origin = "https://app.example";
    EXPECT_FALSE(p.allowed(&origin));
    EXPECT_FALSE(p.allowed(nullptr));
    EXPECT_EQ(p.answer_headers(std::nullopt), "");
}

TEST(cors, an_exact_origin_is_echoed_for_itself_only) {
    cors_policy p({"https://app.example", "http://localhost:3000"});
    EXPECT_TRUE(p.enabled());
    for (std::string o : {"https://app.example", "http://localhost:3000"}) {
        ASSERT_TRUE(p.allowed(&o)) << o;
        EXPECT_EQ(*p.allowed(&o), o);
        EXPECT_EQ(p.answer_headers(p.allowed(&o)),
                  "Access-Control-Allow-Origin: " + o + "\r\nVary: Origin\r\n");
    }
    for (std::string o : {"https://app.example.evil", "https://APP.example", "http://app.example",
                          "http://localhost:3001", "https://app.example/", "null", ""}) {
        EXPECT_FALSE(p.allowed(&o)) << o;
    }
    EXPECT_FALSE(p.allowed(nullptr));
    // A request from no origin or another one still varies by origin.
    EXPECT_EQ(p.answer_headers(std::nullopt), "Vary: Origin\r\n");
}

TEST(cors, a_star_echoes_any_well_formed_origin) {
    cors_policy p({"*"});
    EXPECT_TRUE(p.enabled());
    std::string o = "http://127.0.0.1:5173";
    ASSERT_TRUE(p.allowed(&o));
    EXPECT_EQ(*p.allowed(&o), o);
    for (std::string bad : {std::string("http://a b"), std::string("http://a\r\nX-Evil: 1"),
                            std::string(""), "https://" + std::string(2000, 'a')}) {
        EXPECT_FALSE(p.allowed(&bad)) << bad.substr(0, 40);
    }
}

TEST(cors, preflight_headers_list_methods_and_only_well_formed_requested_headers) {
    const std::string asked = "authorization,content-type,x-stainless-os";
    EXPECT_EQ(cors_policy::preflight_headers("POST, OPTIONS", &asked),
              "Access-Control-Allow-Methods: POST, OPTIONS\r\n"
              "Access-Control-Allow-Headers: Authorization, Content-Type, "
              "authorization,content-type,x-stainless-os\r\n"
              "Access-Control-Max-Age: 7200\r\n");
    const std::string base = "Access-Control-Allow-Headers: Authorization, Content-Type\r\n";
    EXPECT_NE(cors_policy::preflight_headers("GET, OPTIONS", nullptr).find(base),
              std::string::npos);
    for (std::string bad : {std::string("x-a\r\nx-b"), std::string("x-a;x-b"), std::string(""),
                            std::string(2000, 'x')}) {
        EXPECT_NE(cors_policy::preflight_headers("GET, OPTIONS", &bad).find(base),
                  std::string::npos)
            << bad.substr(0, 40);
    }
}

TEST(cors, a_preflight_is_options_with_origin_and_request_method) {
    ordo::http::http_request r;
    r.method = "OPTIONS";
    EXPECT_FALSE(ordo::http::is_preflight(r));
    r.headers.emplace_back("origin", "https://app.example");
    EXPECT_FALSE(ordo::http::is_preflight(r));
    r.headers.emplace_back("access-control-request-method", "POST");
    EXPECT_TRUE(ordo::http::is_preflight(r));
    r.method = "POST";
    EXPECT_FALSE(ordo::http::is_preflight(r));
}

}  // namespace
