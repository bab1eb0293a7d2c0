// test_auth.cpp: API keys on both front doors of the real ordo-server (issue 26, part 3).
//
// Checks, over real sockets:
//   - msgpack: with keys, a first frame that is not `auth` (health, even a malformed request)
//     gets error unauthorized answering its id and the connection closes; a wrong key the
//     same; a right key (from the file or from --api-key) gets done and the connection then
//     serves; stats counts the failures (net.auth_failures);
//   - HTTP: /v1/* without `Authorization: Bearer`, or with a wrong key, is 401 in OpenAI's
//     error shape (code invalid_api_key) with WWW-Authenticate: Bearer, and the kept-alive
//     connection goes on; the right key is served; /health and (by default) /metrics stay
//     open, /metrics shows ordo_http_auth_failures_total; http.metrics_require_key keys it;
//   - the cut-off: auth_failures_max failures from one address (spread over both doors) and
//     that address is refused at accept on both doors, the right key included;
//   - without keys: `auth` is answered done, and a non-loopback listen address is warned
//     about at start, naming it (not with keys);
//   - the key file: group- or other-readable, or holding no key, stops the server at start
//     (exit 2, naming the file, never printing the key), as does --check-config; keys are
//     never in --print-config nor in the log;
//   - the clients: `ordo --api-key` and ORDO_API_KEY, and the Python client's api_key.
// Nothing here waits on a timer: the cut-off window (a minute) is far longer than the few
// connections the test makes, and every read has the support code's deadline.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "door/api_keys.hpp"
#include "tests/http/http_client.hpp"
#include "tests/support/server_process.hpp"

namespace {

using namespace ordo::test;
namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string file_key = "sk-file-0123456789abcdef";
const std::string cli_key = "sk-cli-fedcba9876543210";
// The wall-clock bound `timeout` puts on one CLI or python3 run.
constexpr int command_timeout_s = 120;

std::string temp_path(const std::string& name) {
    return scratch_path("auth", name);
}

std::string write_file(const std::string& name, const std::string& text, mode_t mode) {
    std::string p = temp_path(name);
    fs::remove(p);
    std::ofstream(p) << text;
    EXPECT_EQ(::chmod(p.c_str(), mode), 0);
    return p;
}

std::string tiny_model() {
    return generated_model(ORDO_MODEL_BIN, temp_path("tiny.gguf"), tiny_model_flags);
}

// A config whose [server] api_keys_file is `keys` (and `extra` lines appended).
std::string config_with(const std::string& name, const std::string& keys,
                        const std::string& extra = "") {
    return write_file(name, "[server]\napi_keys_file = \"" + keys + "\"\n" + extra, 0600);
}

// The server with the key file's key and the command line's.
bool start_keyed(server_process& s, const std::string& extra_config = "") {
    std::string keys = write_file("ok.keys", "# the team's key\n\n" + file_key + "\n", 0600);
    return s.start(ORDO_SERVER_BIN,
                   {"--model", tiny_model(), "--config",
                    config_with("keyed.toml", keys, extra_config), "--api-key", cli_key});
}

msgpack::sbuffer auth(uint64_t id, const std::string& key) {
    return frame("id", id, "op", "auth", "key", key);
}

// The error answering `id` on a fresh connection that sent `first`, then whether it closed.
void expect_refused(uint16_t port, const msgpack::sbuffer& first, uint64_t id,
                    const std::string& what) {
    tcp_client c;
    ASSERT_TRUE(c.connect(port)) << what;
    ASSERT_TRUE(c.send(first)) << what;
    auto e = next(c);
    ASSERT_TRUE(e) << what;
    EXPECT_EQ(e->str("event"), "error") << what;
    EXPECT_EQ(e->str("code"), "unauthorized") << what << ": " << e->outcome();
    EXPECT_EQ(e->u("id"), id) << what;
    EXPECT_TRUE(c.wait_closed()) << what << ": the connection stays open";
}

std::string bearer(const std::string& key) {
    return "Authorization: Bearer " + key + "\r\n";
}

std::optional<http_response> get(uint16_t port, const std::string& path,
                                 const std::string& headers = "") {
    http_conn c;
    if (!c.connect(port) ||
        !c.send(http_request_text("GET", path, "", headers + "Connection: close\r\n"))) {
        return std::nullopt;
    }
    return c.read();
}

void expect_401(const std::optional<http_response>& r, const std::string& what) {
    ASSERT_TRUE(r) << what;
    EXPECT_EQ(r->status, 401) << what << ": " << r->body;
    EXPECT_EQ(r->header("www-authenticate"), "Bearer") << what;
    json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r->body;
    EXPECT_EQ(j["error"]["code"], "invalid_api_key") << r->body;
    EXPECT_EQ(j["error"]["type"], "invalid_request_error") << r->body;
    EXPECT_TRUE(j["error"]["message"].is_string()) << r->body;
    EXPECT_TRUE(j["error"].contains("param")) << r->body;
}

// The stats op's `net` and `http` maps, on a connection that authenticates with `key`.
json stats_maps(uint16_t port, const std::string& key) {
    tcp_client c;
    EXPECT_TRUE(c.connect(port));
    EXPECT_TRUE(c.send(auth(1, key)));
    auto a = next(c);
    EXPECT_TRUE(a && a->str("event") == "done") << (a ? a->outcome() : "no answer");
    EXPECT_TRUE(c.send(frame("id", 2, "op", "stats")));
    auto e = next(c);
    if (!e) return {};
    json out;
    for (const char* map : {"net", "http"}) {
        const msgpack::object* m = field(e->o(), map);
        if (m == nullptr) continue;
        out[map] = m->as<std::map<std::string, uint64_t>>();
    }
    return out;
}

}  // namespace

TEST(auth_msgpack, the_first_frame_must_be_auth_with_a_right_key) {
    server_process s;
    ASSERT_TRUE(start_keyed(s)) << s.output();
    expect_refused(s.port(), frame("id", 7, "op", "health"), 7, "health first");
    expect_refused(s.port(), auth(3, "sk-not-a-key"), 3, "a wrong key");
    // A malformed first request (no key) is refused the same way, not as bad_request.
    expect_refused(s.port(), frame("id", 4, "op", "auth"), 4, "auth without a key");
    for (const std::string& key : {file_key, cli_key}) {
        tcp_client c;
        ASSERT_TRUE(c.connect(s.port()));
        ASSERT_TRUE(c.send(auth(1, key)));
        auto a = next(c);
        ASSERT_TRUE(a);
        EXPECT_EQ(a->outcome(), "done");
        EXPECT_EQ(a->u("id"), 1u);
        ASSERT_TRUE(c.send(frame("id", 2, "op", "health")));
        auto h = next(c);
        ASSERT_TRUE(h);
        EXPECT_EQ(h->str("event"), "done") << h->outcome();
        // auth again on an authenticated connection: answered like any op.
        ASSERT_TRUE(c.send(auth(3, key)));
        auto again = next(c);
        ASSERT_TRUE(again);
        EXPECT_EQ(again->outcome(), "done");
    }
    json m = stats_maps(s.port(), cli_key);
    EXPECT_EQ(m["net"]["auth_failures"], 3) << m.dump();
    EXPECT_EQ(m["net"]["auth_refused"], 0) << m.dump();
    // Never logged: neither key appears in the server's output.
    s.stop();
    EXPECT_EQ(s.output().find(file_key), std::string::npos);
    EXPECT_EQ(s.output().find(cli_key), std::string::npos);
}

TEST(auth_http, v1_needs_a_bearer_key_health_and_metrics_stay_open) {
    server_process s;
    ASSERT_TRUE(start_keyed(s)) << s.output();
    ASSERT_NE(s.http_port(), 0u);
    expect_401(get(s.http_port(), "/v1/models"), "no Authorization");
    expect_401(get(s.http_port(), "/v1/models", bearer("sk-wrong")), "a wrong key");
    expect_401(get(s.http_port(), "/v1/models", "Authorization: Basic " + file_key + "\r\n"),
               "another scheme");
    // A 401 keeps a kept-alive connection: the right key on the same connection is served.
    {
        http_conn c;
        ASSERT_TRUE(c.connect(s.http_port()));
        ASSERT_TRUE(c.send(http_request_text("POST", "/v1/chat/completions", "{}")));
        expect_401(c.read(), "POST without a key");
        // llama.cpp's token endpoints are keyed like /v1/*.
        ASSERT_TRUE(c.send(http_request_text("POST", "/tokenize", "{\"content\": \"x\"}")));
        expect_401(c.read(), "/tokenize without a key");
        ASSERT_TRUE(c.send(http_request_text("GET", "/v1/models", "", bearer(file_key))));
        auto r = c.read();
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 200) << r->body;
    }
    auto ok = get(s.http_port(), "/v1/models", bearer(cli_key));
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200) << ok->body;
    auto health = get(s.http_port(), "/health");
    ASSERT_TRUE(health);
    EXPECT_TRUE(health->status == 200 || health->status == 503) << health->status;
    auto metrics = get(s.http_port(), "/metrics");
    ASSERT_TRUE(metrics);
    EXPECT_EQ(metrics->status, 200) << metrics->body;
    EXPECT_NE(metrics->body.find("ordo_http_auth_failures_total 5"), std::string::npos)
        << metrics->body;
    EXPECT_NE(metrics->body.find("ordo_net_auth_failures_total 0"), std::string::npos);
    json m = stats_maps(s.port(), file_key);
    EXPECT_EQ(m["http"]["auth_failures"], 5) << m.dump();
}

TEST(auth_http, metrics_require_key_keys_metrics) {
    server_process s;
    ASSERT_TRUE(start_keyed(s, "[http]\nmetrics_require_key = true\n")) << s.output();
    expect_401(get(s.http_port(), "/metrics"), "/metrics without a key");
    auto ok = get(s.http_port(), "/metrics", bearer(file_key));
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200);
    auto health = get(s.http_port(), "/health");
    ASSERT_TRUE(health);
    EXPECT_NE(health->status, 401);
}

TEST(auth_cut_off, repeated_failures_refuse_the_address_on_both_doors) {
    server_process s;
    ASSERT_TRUE(start_keyed(s)) << s.output();
    // Half the failures on each door: the table is shared.
    for (uint32_t i = 0; i < ordo::door::auth_failures_max; i++) {
        if (i % 2 == 0) {
            expect_refused(s.port(), auth(1, "sk-guess-" + std::to_string(i)), 1, "a guess");
        } else {
            expect_401(get(s.http_port(), "/v1/models", bearer("sk-guess-" + std::to_string(i))),
                       "a guess");
        }
    }
    // Cut off: refused at accept, the right key included, on both doors.
    tcp_client c;
    ASSERT_TRUE(c.connect(s.port()));
    auto e = next(c);  // sent at accept, before any frame
    ASSERT_TRUE(e);
    EXPECT_EQ(e->str("code"), "unauthorized") << e->outcome();
    EXPECT_EQ(e->u("id"), 0u);
    EXPECT_NE(e->str("message").find("too many failed authentications"), std::string::npos);
    EXPECT_TRUE(c.wait_closed());
    auto r = get(s.http_port(), "/v1/models", bearer(file_key));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 429) << r->body;
    EXPECT_FALSE(r->header("retry-after").empty());
    EXPECT_NE(r->body.find("too many failed authentications"), std::string::npos) << r->body;
    // The output says which address; the metrics are not reachable from it now, so the
    // counters are read from the log instead: the refusals were logged with the address.
    s.stop();
    EXPECT_NE(s.output().find("from 127.0.0.1: unauthorized: too many failed"), std::string::npos)
        << s.output();
}

TEST(auth_open, without_keys_auth_is_accepted_and_a_public_address_is_warned_about) {
    server_process s;
    ASSERT_TRUE(s.start(ORDO_SERVER_BIN, {"--model", tiny_model(), "--listen", "0.0.0.0:0",
                                          "--http-listen", "0.0.0.0:0"}))
        << s.output();
    tcp_client c;
    ASSERT_TRUE(c.connect(s.port()));
    ASSERT_TRUE(c.send(auth(1, "anything")));
    auto a = next(c);
    ASSERT_TRUE(a);
    EXPECT_EQ(a->outcome(), "done");
    ASSERT_TRUE(c.send(frame("id", 2, "op", "health")));
    auto h = next(c);
    ASSERT_TRUE(h);
    EXPECT_EQ(h->str("event"), "done");
    auto r = get(s.http_port(), "/v1/models");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    // Logging is asynchronous: stopping the server flushes every line it logged.
    EXPECT_EQ(s.stop(), 0);
    std::string out = s.output();
    EXPECT_NE(out.find("server.listen = 0.0.0.0:0 is not a loopback address and no API key"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("http.listen = 0.0.0.0:0 is not a loopback address"), std::string::npos)
        << out;

    server_process keyed;
    ASSERT_TRUE(keyed.start(ORDO_SERVER_BIN, {"--model", tiny_model(), "--listen", "0.0.0.0:0",
                                              "--http-listen", "0.0.0.0:0", "--api-key", cli_key}))
        << keyed.output();
    EXPECT_EQ(keyed.output().find("is not a loopback address"), std::string::npos)
        << keyed.output();
    server_process loopback;
    ASSERT_TRUE(loopback.start(ORDO_SERVER_BIN, {"--model", tiny_model()})) << loopback.output();
    EXPECT_EQ(loopback.output().find("is not a loopback address"), std::string::npos);
}

TEST(auth_key_file, refused_when_others_may_read_it_or_it_holds_no_key) {
    const std::string secret = "sk-should-never-print";
    struct bad {
        std::string file;
        mode_t mode;
        std::string text, expect;
    };
    for (const bad& b : {bad{"group.keys", 0640, secret + "\n", "chmod 600"},
                         bad{"world.keys", 0604, secret + "\n", "chmod 600"},
                         bad{"writable.keys", 0622, secret + "\n", "chmod 600"},
                         bad{"none.keys", 0600, "# no key here\n\n", "holds no key"}}) {
        std::string keys = write_file(b.file, b.text, b.mode);
        std::string cfg = config_with("bad.toml", keys);
        server_process s;
        EXPECT_FALSE(s.start(ORDO_SERVER_BIN, {"--model", tiny_model(), "--config", cfg}))
            << b.file;
        EXPECT_EQ(s.exit_status(), 2) << s.output();
        EXPECT_NE(s.output().find("server.api_keys_file = " + keys + ": "), std::string::npos)
            << s.output();
        EXPECT_NE(s.output().find(b.expect), std::string::npos) << s.output();
        EXPECT_EQ(s.output().find(secret), std::string::npos) << s.output();
        auto check = run_command(std::string(ORDO_SERVER_BIN) + " --check-config " + cfg + " 2>&1");
        EXPECT_EQ(check.exit_code, 2) << check.output;
        EXPECT_NE(check.output.find(keys), std::string::npos) << check.output;
    }
    std::string missing = config_with("missing.toml", temp_path("absent.keys"));
    server_process s;
    EXPECT_FALSE(s.start(ORDO_SERVER_BIN, {"--model", tiny_model(), "--config", missing}));
    EXPECT_EQ(s.exit_status(), 2);
    EXPECT_NE(s.output().find("absent.keys: cannot be read"), std::string::npos) << s.output();
}

TEST(auth_key_file, print_config_shows_the_path_never_a_key) {
    std::string keys = write_file("print.keys", file_key + "\n", 0600);
    auto r =
        run_command(std::string(ORDO_SERVER_BIN) + " --config " + config_with("print.toml", keys) +
                    " --api-key " + cli_key + " --print-config 2>&1");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("api_keys_file = \"" + keys + "\""), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("1 API key(s) given with --api-key (not shown)"), std::string::npos)
        << r.output;
    EXPECT_EQ(r.output.find(cli_key), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find(file_key), std::string::npos) << r.output;
    auto bad = run_command(std::string(ORDO_SERVER_BIN) + " --api-key 'has space' 2>&1");
    EXPECT_EQ(bad.exit_code, 2) << bad.output;
    EXPECT_EQ(bad.output.find("has space"), std::string::npos) << bad.output;
}

TEST(auth_clients, ordo_cli_and_python_client_with_a_key) {
    server_process s;
    ASSERT_TRUE(start_keyed(s)) << s.output();
    const std::string cli = "timeout " + std::to_string(command_timeout_s) + " " +
                            std::string(ORDO_CLI_BIN) + " --port " + std::to_string(s.port());
    auto flag = run_command(cli + " --api-key " + file_key + " health 2>&1");
    EXPECT_EQ(flag.exit_code, 0) << flag.output;
    EXPECT_NE(flag.output.find("\"protocol\""), std::string::npos) << flag.output;
    auto env = run_command("ORDO_API_KEY=" + cli_key + " " + cli + " health 2>&1");
    EXPECT_EQ(env.exit_code, 0) << env.output;
    auto none = run_command(cli + " health 2>&1");
    EXPECT_EQ(none.exit_code, 1) << none.output;
    EXPECT_NE(none.output.find("ordo: unauthorized: "), std::string::npos) << none.output;
    auto wrong = run_command(cli + " --api-key sk-wrong health 2>&1");
    EXPECT_EQ(wrong.exit_code, 1) << wrong.output;
    EXPECT_NE(wrong.output.find("ordo: unauthorized: "), std::string::npos) << wrong.output;

    const std::string script =
        "import sys\n"
        "sys.path.insert(0, '" ORDO_SOURCE_DIR
        "/clients/python')\n"
        "from ordo_client import Client, OrdoError\n"
        "port = int(sys.argv[1])\n"
        "with Client(port=port, api_key='" +
        file_key +
        "') as c:\n"
        "    assert c.health()['event'] == 'done'\n"
        "    assert c.stats()['net']['auth_failures'] == 2, c.stats()['net']\n"
        "try:\n"
        "    Client(port=port, api_key='sk-wrong')\n"
        "    sys.exit('a wrong key was accepted')\n"
        "except OrdoError as e:\n"
        "    assert e.code == 'unauthorized', e\n"
        "print('python client ok')\n";
    std::string path = temp_path("auth_check.py");
    std::ofstream(path) << script;
    auto py = run_command("timeout " + std::to_string(command_timeout_s) + " /usr/bin/python3 " +
                          path + " " + std::to_string(s.port()) + " 2>&1");
    EXPECT_EQ(py.exit_code, 0) << py.output;
    EXPECT_NE(py.output.find("python client ok"), std::string::npos) << py.output;
}
