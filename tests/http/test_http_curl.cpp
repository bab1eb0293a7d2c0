// test_http_curl.cpp: curl, a second real HTTP client besides OpenAI's Node client, against the
// real ordo-server's HTTP front door (the byte-level cases are in test_http_server.cpp, over
// raw sockets).
//
// Checks, each through curl's own behaviour:
// (1) a streamed completion read by curl through `head -c`, which leaves after the first bytes
//     (curl then fails writing and closes): the server counts one client disconnect and frees
//     every sequence, queued request and KV block (the msgpack stats op, polled);
// (2) malformed JSON: 400 with code invalid_json, and the connection is reused for a good
//     request (curl's --next on one connection: "Re-using existing connection");
// (3) a body over [http] max_body_bytes sent by curl with `Expect: 100-continue` (what curl does
//     for large uploads): a 413 in OpenAI's error shape, without the server reading the body;
// (4) the same body without Expect: still the whole 413 answer, not a reset.
// Without curl the test skips with a visible message; with ORDO_HTTP_CLIENT_REQUIRED=1 (CI) it
// fails instead.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string_view>
#include <thread>

#include "tests/support/server_process.hpp"

namespace {

using namespace ordo::test;
using nlohmann::json;
namespace fs = std::filesystem;

constexpr int k_body_max = 65536;

bool client_required() {
    const char* v = std::getenv("ORDO_HTTP_CLIENT_REQUIRED");
    return v != nullptr && std::string_view(v) == "1";
}

std::string temp_path(const std::string& name) {
    fs::path dir = fs::temp_directory_path() / ("ordo_curl_" + std::to_string(getpid()));
    fs::create_directories(dir);
    return (dir / name).string();
}

// The msgpack stats op polled until nothing is live (bounded: 200 polls of 50 ms); the
// scheduler's disconnect count, or -1 when it never settled.
int64_t settled_disconnects(uint16_t port) {
    tcp_client c;
    if (!c.connect(port)) return -1;
    for (uint64_t i = 1; i <= 200; i++) {
        if (!c.send(frame("id", i, "op", "stats"))) return -1;
        auto e = next(c);
        if (!e) return -1;
        if (e->u("active_sequences") == 0 && e->u("queued_requests") == 0 &&
            e->u("kv_blocks_used") == 0) {
            const auto* sched = field(e->o(), "scheduler");
            return sched ? int64_t(uint_field(*sched, "disconnects")) : -1;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return -1;
}

// The JSON object in curl's output (between its first '{' and last '}').
json body_of(const std::string& output) {
    size_t start = output.find('{'), end = output.rfind('}');
    if (start == std::string::npos || end == std::string::npos || end < start) return json();
    return json::parse(output.substr(start, end - start + 1), nullptr, false);
}

}  // namespace

TEST(http_curl, disconnects_malformed_json_and_oversized_bodies) {
    if (run_command("command -v curl > /dev/null 2>&1").exit_code != 0) {
        if (client_required()) GTEST_FAIL() << "ORDO_HTTP_CLIENT_REQUIRED=1 but curl is missing";
        std::fprintf(stderr, "\n*** SKIPPING: curl is not installed ***\n\n");
        GTEST_SKIP() << "curl is not installed";
    }
    const std::string model = temp_path("tiny.gguf");
    std::string mk = std::string(ORDO_MODEL_BIN) + " mk --out " + model +
                     " --n-embd 32 --n-layer 1 --n-head 2 --n-head-kv 2 --n-ff 64"
                     " --n-vocab 260 --type f32 --seed 1 --ctx 512 > /dev/null";
    ASSERT_EQ(std::system(mk.c_str()), 0) << mk;
    const std::string cfg = temp_path("curl.toml");
    std::ofstream(cfg) << "[http]\nmax_body_bytes = " << k_body_max << "\n[fault]\nenabled = true\n";
    server_process s;
    ASSERT_TRUE(s.start(ORDO_SERVER_BIN, {"--config", cfg, "--model", model})) << s.output();
    ASSERT_NE(s.http_port(), 0) << s.output();
    ASSERT_EQ(wait_healthy(s.port()), "") << s.output();
    const std::string url = "http://127.0.0.1:" + std::to_string(s.http_port());

    // (1) Slow decode steps, so the request is still running when curl leaves.
    tcp_client p;
    ASSERT_TRUE(p.connect(s.port()));
    ASSERT_TRUE(p.send(frame("id", 1, "op", "fault", "kind", "step_delay", "ms", 50, "count", 60,
                             "phase", "decode")));
    auto armed = next(p);
    ASSERT_TRUE(armed && armed->str("event") == "done") << (armed ? armed->outcome() : "none");
    const std::string stream_body =
        R"({"model":"tiny","prompt":[5,6,7],"max_tokens":60,"stream":true})";
    command_result cut = run_command("timeout 60 curl -sS -N " + url +
                                     "/v1/completions -H 'Content-Type: application/json' -d '" +
                                     stream_body + "' 2>&1 | head -c 200");
    EXPECT_NE(cut.output.find("data: {"), std::string::npos) << cut.output;
    EXPECT_EQ(settled_disconnects(s.port()), 1) << "not freed, or not counted as client_gone";

    // (2) Malformed JSON, then a good request on the same connection.
    command_result two = run_command(
        "timeout 60 curl -sS -v " + url + "/v1/completions -d '{\"model\": \"tiny\", bad' " +
        "--next -sS " + url + "/v1/completions -d '{\"model\":\"tiny\",\"prompt\":\"ab\","
        "\"max_tokens\":2}' 2>&1");
    EXPECT_NE(two.output.find("< HTTP/1.1 400"), std::string::npos) << two.output;
    EXPECT_NE(two.output.find("\"invalid_json\""), std::string::npos) << two.output;
    EXPECT_NE(two.output.find("< HTTP/1.1 200"), std::string::npos) << two.output;
    EXPECT_NE(two.output.find("\"text_completion\""), std::string::npos) << two.output;
    EXPECT_NE(two.output.find("Re-using existing connection"), std::string::npos) << two.output;

    // (3), (4) A body 16x the limit, with and without Expect: 100-continue.
    const std::string big = temp_path("big.json");
    {
        std::ofstream out(big);
        out << R"({"model":"tiny","prompt":")" << std::string(16 * k_body_max, 'a') << "\"}";
    }
    for (const char* expect : {"", " -H 'Expect:'"}) {
        command_result r = run_command("timeout 60 curl -sS -w '\\nstatus=%{http_code}\\n' " +
                                       url + "/v1/completions -H 'Content-Type: application/json'" +
                                       expect + " --data-binary @" + big + " 2>&1");
        EXPECT_NE(r.output.find("status=413"), std::string::npos) << expect << "\n" << r.output;
        json j = body_of(r.output);
        ASSERT_TRUE(j.is_object() && j.contains("error")) << expect << "\n" << r.output;
        EXPECT_EQ(j["error"]["code"], "too_large") << r.output;
    }
    EXPECT_EQ(settled_disconnects(s.port()), 1);
    EXPECT_EQ(s.stop(), 0) << s.output();
}
