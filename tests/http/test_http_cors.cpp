// test_http_cors.cpp: browsers (CORS, issue 27) against the real ordo-server's HTTP front door,
// over raw sockets, with API keys configured (the preflight must not need one).
//
// Each server runs a model `ordo-model mk` makes. Checks, with [http] cors_allow_origins =
// ["http://app.example:3000"] and a key:
// (1) a preflight (OPTIONS, Origin, Access-Control-Request-Method/-Headers) from the allowed
//     origin, without a key, is 204 with no body: Allow-Origin echoes the origin, Allow-Methods
//     the endpoint's method and OPTIONS, Allow-Headers Authorization, Content-Type and the
//     headers asked for, Max-Age, Vary: Origin; the kept-alive connection goes on;
// (2) a preflight from another origin is 403 origin_not_allowed with no CORS header;
// (3) the actual requests of the allowed origin carry Allow-Origin and Vary: Origin: a 401
//     without a key (so the page can read it), a 200 with one, a streamed completion's SSE
//     head; another origin's answer has Vary: Origin and no Allow-Origin;
// (4) OPTIONS without Origin is 204 with Allow; OPTIONS of an unknown path is 404;
// (5) with "*", any origin's preflight is answered and echoed;
// (6) with no origin configured (the default) a preflight is 403 and no answer has a CORS
//     header or Vary;
// (7) a bad cors_allow_origins entry stops the server at --check-config (exit 2), the message
//     naming the file, line, key and entry.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/http/http_client.hpp"
#include "tests/support/server_process.hpp"

namespace {

using namespace ordo::test;
namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string key = "sk-cors-0123456789abcdef";
const std::string app = "http://app.example:3000";

std::string temp_path(const std::string& name) {
    return scratch_path("cors", name);
}

std::string tiny_model() {
    return generated_model(ORDO_MODEL_BIN, temp_path("tiny.gguf"), tiny_model_flags);
}

// A server with `http_section` in its [http] and, when `keyed`, the API key.
bool start_with(server_process& s, const std::string& name, const std::string& http_section,
                bool keyed) {
    const std::string cfg = temp_path(name + ".toml");
    std::ofstream(cfg) << "[http]\n" << http_section << "\n";
    std::vector<std::string> args = {"--model", tiny_model(), "--config", cfg};
    if (keyed) args.insert(args.end(), {"--api-key", key});
    return s.start(ORDO_SERVER_BIN, args);
}

std::string preflight(const std::string& path, const std::string& origin,
                      const std::string& asked_headers = "authorization,content-type") {
    return "OPTIONS " + path + " HTTP/1.1\r\nHost: test\r\nOrigin: " + origin +
           "\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: " +
           asked_headers + "\r\n\r\n";
}

const std::string completion = R"({"model":"tiny","prompt":[5,6,7],"max_tokens":3})";

void expect_no_cors(const http_response& r, const std::string& what) {
    EXPECT_EQ(r.header("access-control-allow-origin"), "") << what;
    EXPECT_EQ(r.header("access-control-allow-methods"), "") << what;
    EXPECT_EQ(r.header("access-control-allow-headers"), "") << what;
}

}  // namespace

TEST(http_cors, an_allowed_origin_is_answered_and_others_are_not) {
    server_process s;
    ASSERT_TRUE(start_with(s, "one", "cors_allow_origins = [\"" + app + "\"]", true)) << s.output();
    ASSERT_EQ(wait_healthy(s.port(), key), "") << s.output();
    http_conn c;
    ASSERT_TRUE(c.connect(s.http_port()));

    // (1) No key on the preflight; the connection stays usable.
    ASSERT_TRUE(c.send(
        preflight("/v1/chat/completions", app, "authorization,content-type,x-stainless-os")));
    auto ok = c.read();
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 204) << ok->body;
    EXPECT_EQ(ok->body, "");
    EXPECT_EQ(ok->header("content-length"), "");
    EXPECT_EQ(ok->header("access-control-allow-origin"), app);
    EXPECT_EQ(ok->header("access-control-allow-methods"), "POST, OPTIONS");
    const std::string allowed = ok->header("access-control-allow-headers");
    for (const char* h : {"Authorization", "Content-Type", "x-stainless-os"}) {
        EXPECT_NE(allowed.find(h), std::string::npos) << allowed;
    }
    EXPECT_EQ(ok->header("access-control-max-age"), "7200");
    EXPECT_EQ(ok->header("vary"), "Origin");

    // (2) Another origin, on the same connection.
    ASSERT_TRUE(c.send(preflight("/v1/chat/completions", "http://evil.example:3000")));
    auto refused = c.read();
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->status, 403) << refused->body;
    expect_no_cors(*refused, "another origin's preflight");
    json j = json::parse(refused->body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << refused->body;
    EXPECT_EQ(j["error"]["code"], "origin_not_allowed");
    EXPECT_NE(j["error"]["message"].get<std::string>().find("http.cors_allow_origins"),
              std::string::npos);

    // (3) The actual requests: a 401 and a 200 the page can read.
    ASSERT_TRUE(c.send(
        http_request_text("POST", "/v1/completions", completion, "Origin: " + app + "\r\n")));
    auto no_key = c.read();
    ASSERT_TRUE(no_key);
    EXPECT_EQ(no_key->status, 401) << no_key->body;
    EXPECT_EQ(no_key->header("access-control-allow-origin"), app);
    EXPECT_EQ(no_key->header("vary"), "Origin");
    const std::string keyed = "Origin: " + app + "\r\nAuthorization: Bearer " + key + "\r\n";
    ASSERT_TRUE(c.send(http_request_text("POST", "/v1/completions", completion, keyed)));
    auto served = c.read();
    ASSERT_TRUE(served);
    EXPECT_EQ(served->status, 200) << served->body;
    EXPECT_EQ(served->header("access-control-allow-origin"), app);
    EXPECT_EQ(served->header("vary"), "Origin");
    const std::string streamed =
        R"({"model":"tiny","prompt":[5,6,7],"max_tokens":3,"stream":true})";
    ASSERT_TRUE(c.send(http_request_text("POST", "/v1/completions", streamed, keyed)));
    auto stream = c.read();
    ASSERT_TRUE(stream);
    EXPECT_EQ(stream->status, 200) << stream->body;
    EXPECT_EQ(stream->header("content-type"), "text/event-stream");
    EXPECT_EQ(stream->header("access-control-allow-origin"), app);
    EXPECT_EQ(stream->header("vary"), "Origin");
    EXPECT_NE(stream->body.find("data: [DONE]"), std::string::npos) << stream->body;
    ASSERT_TRUE(c.send(http_request_text(
        "POST", "/v1/completions", completion,
        "Origin: http://evil.example:3000\r\nAuthorization: Bearer " + key + "\r\n")));
    auto other = c.read();
    ASSERT_TRUE(other);
    EXPECT_EQ(other->status, 200) << other->body;
    expect_no_cors(*other, "another origin's request");
    EXPECT_EQ(other->header("vary"), "Origin");

    // (4) Plain OPTIONS, and OPTIONS of a path that is not an endpoint.
    ASSERT_TRUE(c.send("OPTIONS /v1/models HTTP/1.1\r\nHost: test\r\n\r\n"));
    auto plain = c.read();
    ASSERT_TRUE(plain);
    EXPECT_EQ(plain->status, 204);
    EXPECT_EQ(plain->header("allow"), "GET, OPTIONS");
    expect_no_cors(*plain, "OPTIONS without Origin");
    ASSERT_TRUE(c.send(preflight("/v1/nothing", app)));
    auto missing = c.read();
    ASSERT_TRUE(missing);
    EXPECT_EQ(missing->status, 404) << missing->body;
    EXPECT_EQ(s.stop(), 0) << s.output();
}

TEST(http_cors, a_star_allows_any_origin_and_an_empty_list_none) {
    {
        // (5)
        server_process s;
        ASSERT_TRUE(start_with(s, "star", "cors_allow_origins = [\"*\"]", false)) << s.output();
        ASSERT_EQ(wait_healthy(s.port()), "") << s.output();
        http_conn c;
        ASSERT_TRUE(c.connect(s.http_port()));
        for (const std::string origin : {"http://localhost:5173", "https://x.example"}) {
            ASSERT_TRUE(c.send(preflight("/v1/completions", origin)));
            auto r = c.read();
            ASSERT_TRUE(r);
            EXPECT_EQ(r->status, 204) << origin;
            EXPECT_EQ(r->header("access-control-allow-origin"), origin);
        }
        EXPECT_EQ(s.stop(), 0) << s.output();
    }
    // (6)
    server_process s;
    ASSERT_TRUE(start_with(s, "none", "", false)) << s.output();
    ASSERT_EQ(wait_healthy(s.port()), "") << s.output();
    http_conn c;
    ASSERT_TRUE(c.connect(s.http_port()));
    ASSERT_TRUE(c.send(preflight("/v1/completions", app)));
    auto r = c.read();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 403) << r->body;
    expect_no_cors(*r, "no origin configured");
    EXPECT_EQ(r->header("vary"), "");
    ASSERT_TRUE(c.send(
        http_request_text("POST", "/v1/completions", completion, "Origin: " + app + "\r\n")));
    auto served = c.read();
    ASSERT_TRUE(served);
    EXPECT_EQ(served->status, 200) << served->body;
    expect_no_cors(*served, "no origin configured");
    EXPECT_EQ(served->header("vary"), "");
    EXPECT_EQ(s.stop(), 0) << s.output();
}

TEST(http_cors, a_bad_origin_in_the_config_names_file_line_key_and_entry) {
    const std::string cfg = temp_path("bad.toml");
    std::ofstream(cfg) << "[http]\nmax_connections = 8\ncors_allow_origins = [\"" << app
                       << "\", \"https://b.example/app\"]\n";
    auto check = run_command(std::string(ORDO_SERVER_BIN) + " --check-config " + cfg + " 2>&1");
    EXPECT_EQ(check.exit_code, 2) << check.output;
    EXPECT_NE(check.output.find(cfg + ":3: http.cors_allow_origins = "), std::string::npos)
        << check.output;
    EXPECT_NE(check.output.find("entry 2 (\"https://b.example/app\"): must be \"*\" or "
                                "scheme://host[:port] with no path"),
              std::string::npos)
        << check.output;
}
