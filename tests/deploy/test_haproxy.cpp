// test_haproxy.cpp: three real ordo-server replicas on loopback behind HAProxy (Debian's
// haproxy), started with the shipped deploy/haproxy/haproxy.cfg (docs/deploy.md).
//
// Checks: (1) HAProxy's health checks bring every replica into rotation in both backends;
// (2) sessions stick: conversations keyed by the X-Session-Id header, the body's `session` or
// OpenAI's `user` field each return to the replica that served their first turn, so the second
// turn reports cached tokens (a replica holds no other's KV), and the conversations spread over
// more than one replica; (3) kill -9 of the replica serving a stream: the client's stream ends
// (an error or the connection closed, never a hang), HAProxy marks that replica down, and new
// requests for the same session, and on the msgpack door, are served by the others; (4)
// SIGTERM of a replica under load: its health says draining at once, HAProxy takes it out of
// rotation while it still runs, every stream it had finishes with [DONE], every new request
// either succeeds or is refused before it started (503 shutting_down with Retry-After), and the
// replica exits 0; (5) with one [kv] dir shared by the replicas ([kv] shared), a session whose
// replica is killed -9 after saving it continues on another replica, restored from the shared
// directory (cached tokens > 0, the other replica read the session's file), and its output is
// the output a replica that never saw the session computes afresh at temperature 0.
// Skipped with a visible message where haproxy is not installed (tools/dev.sh installs it).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "tests/http/http_client.hpp"
#include "tests/support/server_process.hpp"

namespace ordo::test {
namespace {

using json = nlohmann::json;
constexpr size_t replicas = 3;
const char* const haproxy_bin = "/usr/sbin/haproxy";

// A port nothing listens on now, for HAProxy's frontends (it has no ephemeral ports to report).
uint16_t free_port() {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    uint16_t port = 0;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
        port = ntohs(a.sin_port);
    }
    ::close(fd);
    return port;
}

std::string loopback(uint16_t port) {
    return "127.0.0.1:" + std::to_string(port);
}

// HAProxy in the foreground (-db) with the shipped configuration and `env`; its output in a
// file; SIGTERM at the end.
class haproxy_process {
public:
    bool start(const std::vector<std::pair<std::string, std::string>>& env,
               const std::string& log) {
        _pid = ::fork();
        if (_pid == 0) {
            for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
            FILE* out = std::freopen(log.c_str(), "w", stdout);
            if (out != nullptr) ::dup2(::fileno(stdout), 2);
            const std::string cfg = std::string(ORDO_SOURCE_DIR) + "/deploy/haproxy/haproxy.cfg";
            ::execl(haproxy_bin, haproxy_bin, "-db", "-f", cfg.c_str(), nullptr);
            ::_exit(127);
        }
        return _pid > 0;
    }
    ~haproxy_process() {
        if (_pid <= 0) return;
        ::kill(_pid, SIGTERM);
        int st = 0;
        ::waitpid(_pid, &st, 0);
    }

private:
    pid_t _pid = -1;
};

struct fleet {
    std::array<server_process, replicas> r;
    haproxy_process lb;
    uint16_t lb_http = 0, lb_msgpack = 0, lb_stats = 0;
    std::string model_id;
    std::string lb_log;
    std::string last_error;  // complete()'s last failure

    // `shared_kv`: one [kv] dir for every replica, [kv] shared = true.
    bool start(const std::string& extra_toml = "", bool shared_kv = false) {
        const std::string model =
            generated_model(ORDO_MODEL_BIN, scratch_path("deploy", "tiny.gguf"), tiny_model_flags);
        const std::string cfg = scratch_path("deploy", "replica.toml");
        // Faults on: the kill test slows decoding with step_delay so a stream is still running.
        std::ofstream(cfg) << "[fault]\nenabled = true\n"
                           << extra_toml << (shared_kv ? "\n[kv]\nshared = true\n" : "");
        for (size_t i = 0; i < replicas; i++) {
            // KV persistence on (the body's `session` needs it), a directory per replica unless
            // shared.
            const std::string kv =
                scratch_path("deploy", shared_kv ? "kv-shared" : "kv-" + std::to_string(i));
            if (!r[i].start(ORDO_SERVER_BIN, {"--config", cfg, "--model", model, "--kv-dir", kv})) {
                return false;
            }
        }
        for (auto& p : r) {
            if (!wait_healthy(p.port()).empty()) return false;
        }
        lb_http = free_port(), lb_msgpack = free_port(), lb_stats = free_port();
        std::vector<std::pair<std::string, std::string>> env = {
            {"ORDO_LB_HTTP", loopback(lb_http)},
            {"ORDO_LB_MSGPACK", loopback(lb_msgpack)},
            {"ORDO_LB_STATS", loopback(lb_stats)}};
        for (size_t i = 0; i < replicas; i++) {
            const std::string n = "ORDO_R" + std::to_string(i + 1);
            env.push_back({n + "_HTTP", loopback(r[i].http_port())});
            env.push_back({n + "_MSGPACK", loopback(r[i].port())});
            env.push_back({n + "_HTTP_PORT", std::to_string(r[i].http_port())});
        }
        lb_log = scratch_path("deploy", "haproxy.log");
        if (!lb.start(env, lb_log)) return false;
        auto models = wait_for([&] { return http_call(lb_http, "GET", "/v1/models"); });
        if (!models || models->status != 200) return false;
        model_id = json::parse(models->body)["data"][0]["id"];
        return true;
    }

    // Retries `f` (HAProxy starting, a health check to pass) until it answers, at most
    // device_ready_deadline.
    template <typename F>
    auto wait_for(F f) -> decltype(f()) {
        const auto until = std::chrono::steady_clock::now() + device_ready_deadline;
        for (;;) {
            auto v = f();
            if (v || std::chrono::steady_clock::now() > until) return v;
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
    }

    // Replica name -> status ("UP", "DOWN", ...) in `backend`, from HAProxy's CSV status page.
    std::map<std::string, std::string> statuses(const std::string& backend) {
        std::map<std::string, std::string> out;
        auto page = http_call(lb_stats, "GET", "/stats;csv");
        if (!page || page->status != 200) return out;
        std::istringstream lines(page->body);
        std::string line;
        int status_col = -1;
        while (std::getline(lines, line)) {
            std::vector<std::string> cols;
            std::istringstream cells(line);
            for (std::string c; std::getline(cells, c, ',');) cols.push_back(c);
            if (!line.empty() && line[0] == '#') {
                for (size_t i = 0; i < cols.size(); i++) {
                    if (cols[i] == "status") status_col = int(i);
                }
                continue;
            }
            if (status_col < 0 || cols.size() <= size_t(status_col) || cols[0] != backend) continue;
            if (cols[1] != "BACKEND" && cols[1] != "FRONTEND") out[cols[1]] = cols[status_col];
        }
        return out;
    }

    // Waits until every replica but `except` (1-based; 0 = none) is UP and that one is not, in
    // both backends.
    bool rotation_is(size_t except) {
        auto ok = wait_for([&]() -> std::optional<bool> {
            for (const char* b : {"ordo_http", "ordo_msgpack"}) {
                auto st = statuses(b);
                for (size_t i = 1; i <= replicas; i++) {
                    const std::string s = st["r" + std::to_string(i)];
                    if ((i == except) == s.starts_with("UP")) return std::nullopt;
                }
            }
            return true;
        });
        return ok.has_value();
    }

    // A completion through HAProxy (or straight to the replica on `port`); `extra` headers,
    // `fields` added to the body.
    std::optional<json> complete(const std::string& prompt, const std::string& extra,
                                 json fields = json::object(), uint16_t port = 0) {
        json body = {
            {"model", model_id}, {"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}};
        body.update(fields);
        http_conn c;
        if (!c.connect(port != 0 ? port : lb_http)) return std::nullopt;
        c.send(http_request_text("POST", "/v1/completions", body.dump(),
                                 "Content-Type: application/json\r\n" + extra));
        auto resp = c.read();
        if (!resp || resp->status != 200) {
            last_error = resp ? std::to_string(resp->status) + " " + resp->body : "no answer";
            return std::nullopt;
        }
        return json::parse(resp->body);
    }

    // Each replica's stats `section`.`key` (asked directly); 0 for a replica that is gone.
    std::array<uint64_t, replicas> per_replica(const char* section, const char* key,
                                               size_t skip = replicas) {
        std::array<uint64_t, replicas> n{};
        for (size_t i = 0; i < replicas; i++) {
            if (i == skip) continue;
            if (auto e = stats_event(r[i].port())) {
                if (const auto* s = field(e->o(), section)) n[i] = uint_field(*s, key);
            }
        }
        return n;
    }
    // Requests each replica has taken so far (stats.scheduler.requests).
    std::array<uint64_t, replicas> requests_per_replica() {
        return per_replica("scheduler", "requests");
    }
};

bool haproxy_missing() {
    if (std::filesystem::exists(haproxy_bin)) return false;
    std::fprintf(stderr, "\n*** SKIPPING: %s is not installed (bash tools/dev.sh setup) ***\n\n",
                 haproxy_bin);
    return true;
}

// Distinct prompts long enough to fill full KV blocks (what the prefix cache shares).
std::string conversation(size_t i) {
    // The tiny model's context is 128 byte-sized tokens: two turns of this fit.
    return "Conversation " + std::to_string(i) + ": a robot met a frog by the river.";
}

uint64_t cached(const json& j) {
    return j["usage"]["prompt_tokens_details"]["cached_tokens"].get<uint64_t>();
}

TEST(haproxy, sessions_stick_to_the_replica_that_holds_their_kv) {
    if (haproxy_missing()) GTEST_SKIP();
    fleet f;
    ASSERT_TRUE(f.start()) << "the fleet did not start";
    ASSERT_TRUE(f.rotation_is(0)) << "not every replica came into rotation";
    const auto before = f.requests_per_replica();
    // 4 conversations by header, 4 by the body's session, 4 by OpenAI's user.
    for (size_t i = 0; i < 12; i++) {
        const std::string key = "conv-" + std::to_string(i);
        const std::string header = i < 4 ? "X-Session-Id: " + key + "\r\n" : "";
        json fields = json::object();
        if (i >= 4) fields[i < 8 ? "session" : "user"] = key;
        auto first = f.complete(conversation(i), header, fields);
        ASSERT_TRUE(first.has_value()) << key << ": " << f.last_error;
        const std::string text = (*first)["choices"][0]["text"];
        auto second = f.complete(conversation(i) + text + " And then?", header, fields);
        ASSERT_TRUE(second.has_value()) << key << ": " << f.last_error;
        EXPECT_GT(cached(*second), 0u) << key << ": the second turn went to another replica";
    }
    const auto after = f.requests_per_replica();
    size_t used = 0;
    for (size_t i = 0; i < replicas; i++) used += after[i] > before[i] ? 1 : 0;
    EXPECT_GT(used, 1u) << "every conversation went to one replica: nothing was balanced";
}

// Slows every replica's decode steps (`ms` each), so streams outlast what the test does.
void slow_decoding(fleet& f, uint32_t ms) {
    for (auto& p : f.r) {
        tcp_client c;
        ASSERT_TRUE(c.connect(p.port()));
        ASSERT_TRUE(c.send(frame("id", 1, "op", "fault", "kind", "step_delay", "phase", "decode",
                                 "count", 1000, "ms", ms)));
        auto armed = next(c);
        ASSERT_TRUE(armed.has_value());
        ASSERT_EQ(armed->str("event"), "done") << armed->str("message");
    }
}

TEST(haproxy, a_killed_replica_ends_its_streams_and_the_others_take_its_sessions) {
    if (haproxy_missing()) GTEST_SKIP();
    fleet f;
    ASSERT_TRUE(f.start()) << "the fleet did not start";
    ASSERT_TRUE(f.rotation_is(0));
    // Decode steps wait 100 ms each on every replica, so the stream below is still running
    // when its replica is killed.
    ASSERT_NO_FATAL_FAILURE(slow_decoding(f, 100));
    const std::string session = "X-Session-Id: doomed\r\n";
    json body = {{"model", f.model_id},
                 {"prompt", conversation(99)},
                 {"max_tokens", 60},
                 {"temperature", 0},
                 {"stream", true}};
    http_conn stream;
    ASSERT_TRUE(stream.connect(f.lb_http));
    ASSERT_TRUE(stream.send(http_request_text("POST", "/v1/completions", body.dump(),
                                              "Content-Type: application/json\r\n" + session)));
    auto head = stream.read_head();
    ASSERT_TRUE(head.has_value());
    ASSERT_EQ(head->status, 200);
    ASSERT_TRUE(stream.read_chunk().has_value());  // the stream has started
    // The replica serving it: the one with a sequence running.
    size_t victim = replicas;
    for (size_t i = 0; i < replicas && victim == replicas; i++) {
        auto e = stats_event(f.r[i].port());
        if (e && uint_field(e->o(), "active_sequences") > 0) victim = i;
    }
    ASSERT_LT(victim, replicas);
    ::kill(f.r[victim].pid(), SIGKILL);
    // The stream ends with its connection closed (HAProxy closes it): not with a read that ran
    // out its deadline (a hang), and not as a finished response (it had ~6 s of tokens left).
    std::optional<std::string> chunk;
    for (int i = 0; i < 1000; i++) {
        chunk = stream.read_chunk();
        if (!chunk || chunk->empty()) break;
    }
    EXPECT_FALSE(chunk.has_value()) << "the response finished: the replica was not killed in time";
    EXPECT_TRUE(stream.wait_closed()) << "no close: the client was left hanging";
    EXPECT_TRUE(f.rotation_is(victim + 1)) << "HAProxy did not take r" << victim + 1 << " out";
    // The session goes on elsewhere, and the msgpack door serves through HAProxy too.
    auto again = f.complete(conversation(99), session);
    ASSERT_TRUE(again.has_value()) << "the session's next request failed";
    tcp_client c;
    ASSERT_TRUE(c.connect(f.lb_msgpack));
    ASSERT_TRUE(c.send(frame("id", 7, "op", "generate", "prompt", conversation(5), "max_tokens", 4,
                             "temperature", 0)));
    auto events = until_terminal(c, 7);
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events.back().str("event"), "done");
}

TEST(haproxy, a_session_survives_its_replica_through_the_shared_kv_dir) {
    if (haproxy_missing()) GTEST_SKIP();
    fleet f;
    ASSERT_TRUE(f.start("", true)) << "the fleet did not start";
    ASSERT_TRUE(f.rotation_is(0));
    const json session = {{"session", "survivor"}};
    const auto before = f.requests_per_replica();
    auto first = f.complete(conversation(7), "", session);
    ASSERT_TRUE(first.has_value()) << f.last_error;
    const auto after = f.requests_per_replica();
    size_t holder = replicas;
    for (size_t i = 0; i < replicas; i++) {
        if (after[i] > before[i]) holder = i;
    }
    ASSERT_LT(holder, replicas);
    // The session's file is written after the answer, off the loop: wait for it, then kill.
    auto saved = f.wait_for([&]() -> std::optional<bool> {
        if (f.per_replica("kv_disk", "saves")[holder] >= 1) return true;
        return std::nullopt;
    });
    ASSERT_TRUE(saved.has_value()) << "the session was never saved";
    ASSERT_EQ(::kill(f.r[holder].pid(), SIGKILL), 0);
    ASSERT_TRUE(f.rotation_is(holder + 1)) << "HAProxy did not take r" << holder + 1 << " out";

    // The next turn goes to another replica, which restores the session from the shared dir.
    const std::string turn2 =
        conversation(7) + std::string((*first)["choices"][0]["text"]) + " And then?";
    auto second = f.complete(turn2, "", session);
    ASSERT_TRUE(second.has_value()) << f.last_error;
    EXPECT_GT(cached(*second), 0u) << "the session's KV was not restored from the shared dir";
    const auto reads = f.per_replica("kv_disk", "session_reads", holder);
    const auto served = f.per_replica("scheduler", "requests", holder);
    size_t heir = replicas;
    for (size_t i = 0; i < replicas; i++) {
        if (i != holder && reads[i] > 0) heir = i;
    }
    ASSERT_LT(heir, replicas) << "no replica read the session's file";
    EXPECT_GT(served[heir], after[heir]) << "the replica that read the file did not serve it";
    // The third replica never saw this conversation: it computes the same prompt afresh.
    const size_t fresh = 3 - holder - heir;
    auto recomputed = f.complete(turn2, "", json::object(), f.r[fresh].http_port());
    ASSERT_TRUE(recomputed.has_value()) << f.last_error;
    EXPECT_EQ(cached(*recomputed), 0u) << "the check replica had the prompt cached";
    EXPECT_EQ((*recomputed)["choices"][0]["text"], (*second)["choices"][0]["text"])
        << "the restored session decoded differently from a fresh computation";
}

TEST(haproxy, a_draining_replica_leaves_rotation_and_loses_no_request) {
    if (haproxy_missing()) GTEST_SKIP();
    fleet f;
    ASSERT_TRUE(f.start("[server]\nshutdown_grace_ms = 60000\n")) << "the fleet did not start";
    ASSERT_TRUE(f.rotation_is(0));
    ASSERT_NO_FATAL_FAILURE(slow_decoding(f, 300));
    // Six streams of 60 tokens (18 s at least each), keyed to spread over the replicas.
    constexpr size_t streams = 6;
    std::array<http_conn, streams> s;
    for (size_t i = 0; i < streams; i++) {
        json body = {{"model", f.model_id},
                     {"prompt", conversation(i)},
                     {"max_tokens", 60},
                     {"temperature", 0},
                     {"stream", true}};
        ASSERT_TRUE(s[i].connect(f.lb_http));
        ASSERT_TRUE(s[i].send(http_request_text(
            "POST", "/v1/completions", body.dump(),
            "Content-Type: application/json\r\nX-Session-Id: load-" + std::to_string(i) + "\r\n")));
        auto head = s[i].read_head();
        ASSERT_TRUE(head.has_value());
        ASSERT_EQ(head->status, 200);
        ASSERT_TRUE(s[i].read_chunk().has_value());
    }
    size_t victim = replicas;
    for (size_t i = 0; i < replicas && victim == replicas; i++) {
        auto e = stats_event(f.r[i].port());
        if (e && uint_field(e->o(), "active_sequences") > 0) victim = i;
    }
    ASSERT_LT(victim, replicas);
    ASSERT_EQ(::kill(f.r[victim].pid(), SIGTERM), 0);
    // Health says draining at once (and keeps answering: the listener stays open).
    auto h = f.wait_for([&]() -> std::optional<http_response> {
        auto r = http_call(f.r[victim].http_port(), "GET", "/health");
        if (r && r->status == 503) return r;
        return std::nullopt;
    });
    ASSERT_TRUE(h.has_value());
    EXPECT_EQ(json::parse(h->body)["status"], "draining");
    // A new request that reaches it is refused before it starts, retryably: 503 shutting_down,
    // Retry-After, and the connection closed so the retry opens a new one.
    {
        json body = {{"model", f.model_id}, {"prompt", conversation(40)}, {"max_tokens", 1}};
        http_conn c;
        ASSERT_TRUE(c.connect(f.r[victim].http_port()));
        ASSERT_TRUE(c.send(http_request_text("POST", "/v1/completions", body.dump(),
                                             "Content-Type: application/json\r\n")));
        auto r = c.read();
        ASSERT_TRUE(r.has_value());
        EXPECT_EQ(r->status, 503);
        EXPECT_EQ(json::parse(r->body)["error"]["code"], "shutting_down") << r->body;
        EXPECT_EQ(r->header("retry-after"), "1");
        EXPECT_EQ(r->header("connection"), "close");
    }
    // New requests while HAProxy notices: each succeeds or is refused before it started.
    size_t refused = 0, served = 0;
    auto ask = [&](size_t i) {
        // One token: it comes from the prompt's logits, without a (slowed) decode step.
        json body = {{"model", f.model_id},
                     {"prompt", conversation(50 + i)},
                     {"max_tokens", 1},
                     {"temperature", 0}};
        http_conn c;
        ASSERT_TRUE(c.connect(f.lb_http));
        c.send(http_request_text(
            "POST", "/v1/completions", body.dump(),
            "Content-Type: application/json\r\nX-Session-Id: new-" + std::to_string(i) + "\r\n"));
        auto r = c.read();
        ASSERT_TRUE(r.has_value()) << "no answer: a request was lost";
        if (r->status == 200) {
            served++;
            return;
        }
        EXPECT_EQ(r->status, 503) << r->body;
        EXPECT_EQ(json::parse(r->body)["error"]["code"], "shutting_down") << r->body;
        EXPECT_EQ(r->header("retry-after"), "1");
        refused++;
    };
    for (size_t i = 0; i < 12; i++) ASSERT_NO_FATAL_FAILURE(ask(i));
    // HAProxy takes the replica out while it still runs (its streams have seconds left)...
    ASSERT_TRUE(f.rotation_is(victim + 1)) << "HAProxy did not take r" << victim + 1 << " out";
    auto still = http_call(f.r[victim].http_port(), "GET", "/health");
    ASSERT_TRUE(still.has_value()) << "the replica exited before HAProxy took it out";
    EXPECT_EQ(json::parse(still->body)["status"], "draining");
    // ...and from then on every new request is served by the others.
    const size_t served_before = served;
    for (size_t i = 12; i < 24; i++) ASSERT_NO_FATAL_FAILURE(ask(i));
    EXPECT_EQ(served, served_before + 12) << refused << " refused after the replica left";
    std::printf("while HAProxy noticed the drain: %zu new requests refused, retryably\n", refused);
    // Every stream finishes, the draining replica's too.
    for (size_t i = 0; i < streams; i++) {
        std::string body;
        std::optional<std::string> chunk;
        while ((chunk = s[i].read_chunk()) && !chunk->empty()) body += *chunk;
        ASSERT_TRUE(chunk.has_value()) << "stream " << i << " was cut off";
        auto events = sse_data(body);
        ASSERT_FALSE(events.empty());
        EXPECT_EQ(events.back(), "[DONE]") << "stream " << i << ": " << body;
    }
    EXPECT_EQ(f.r[victim].wait_exit(), 0) << f.r[victim].output();
}

}  // namespace
}  // namespace ordo::test
