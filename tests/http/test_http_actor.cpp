// test_http_actor.cpp: the HTTP actor on its real loop with real TCP clients, wired to a probe
// actor in place of the scheduler (tests/support/actor_probe.hpp); the test plays the scheduler.
// Small enough to run under ASan in seconds (tools/dev.sh ORDO_SANITIZE=1).
//
// Checks: (1) a streamed completion reaches the scheduler as a typed generate whose conn names
// the HTTP front door, and the scheduler's token events and generate_done come back as SSE
// chunks ending with [DONE]; (2) a second request of the connection is not sent to the
// scheduler before the first is answered, and is answered after it; (3) an error before any
// token is an HTTP error with its status (gpu_unavailable: 503); an error after tokens ends the
// stream with an error event and no [DONE]; (4) a client that closes mid-stream is exactly one
// client_gone for its connection; (5) drop_connection closes the connection; (6) /health says
// what set_health said (200 ok; 503 with the reason when degraded) and 503 shutting_down once
// draining; (7) /metrics asks the scheduler for its stats (the query carrying this front door's
// counters, which the scheduler echoes) and answers them as Prometheus text;
// (8) the refusals that close a connection: a body over the bound (413, before the body), a
// malformed request behind a good one (answered after it), a request not finished within the
// header timeout (408); (9) a net_stop_reading fault pauses the reading of a connection, not its
// writing: a client that stops reading the stream meanwhile is still cut off at
// write_buffer_bytes_max (slow_readers, one client_gone), the pause counted (fault_pauses), and
// the connection count back to 0; every loop closes cleanly.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <nlohmann/json.hpp>

#include "http/http_actor.hpp"
#include "tests/http/http_client.hpp"
#include "tests/support/actor_probe.hpp"

namespace {

using namespace ordo;
using json = nlohmann::json;
using test::http_conn;
using test::http_request_text;
using test::probe;

using sched_probe = probe<sched::generate, sched::stats_query, sched::tokenize, sched::detokenize,
                          door::client_gone, sched::embed>;

struct rig {
    explicit rig(http::http_options o = options()) : http(std::move(o), 1024) {
        http.connect_scheduler(sched);
        EXPECT_TRUE(sched.start().ok());
        EXPECT_TRUE(http.start().ok());
        EXPECT_TRUE(http.listen_status().ok());
        // The scheduler says the device is ready.
        EXPECT_TRUE(http.tell(door::set_health{door::health_status::ok, ""}, "scheduler").ok());
    }
    ~rig() {
        for (actors::actor_core* a : std::initializer_list<actors::actor_core*>{&http, &sched}) {
            a->request_stop();
            EXPECT_TRUE(a->join().ok()) << a->name() << " leaked a handle";
        }
    }
    static http::http_options options() {
        http::http_options o;
        o.port = 0;
        o.limits = {16, 300, false};
        o.model = {"tiny", 1};
        return o;
    }
    bool connect(http_conn& c) { return c.connect(http.bound_port()); }
    template <typename T>
    void tell(const T& m) {
        EXPECT_TRUE(http.tell(m, "scheduler").ok());
    }

    sched_probe sched{"scheduler"};
    http::http_actor http;
};

std::string completion(bool stream) {
    return http_request_text(
        "POST", "/v1/completions",
        json({{"model", "tiny"}, {"prompt", "hi"}, {"stream", stream}}).dump());
}

door::token_event token(uint64_t conn, uint64_t id, const std::string& text) {
    return {conn, id, {65, text, -0.5f, std::nullopt}};
}

door::generate_done done(uint64_t conn, uint64_t id, const std::string& text) {
    door::generate_done d;
    d.conn = conn, d.id = id, d.reason = ordo::door::finish_reason::length, d.text = text;
    d.usage.prompt_tokens = 2, d.usage.completion_tokens = 2;
    return d;
}

}  // namespace

// (1)
TEST(http_actor, a_stream_in_typed_messages_out_as_sse) {
    rig r;
    http_conn c;
    ASSERT_TRUE(r.connect(c));
    ASSERT_TRUE(c.send(completion(true)));
    auto g = r.sched.next<sched::generate>();
    ASSERT_TRUE(g);
    EXPECT_EQ(door::door_kind_of(g->conn), door::door_kind::http);
    EXPECT_EQ(g->params.prompt.value_or(""), "hi");
    EXPECT_TRUE(g->params.stream);
    r.tell(token(g->conn, g->id, "a"));
    r.tell(token(g->conn, g->id, "b"));
    r.tell(done(g->conn, g->id, "ab"));
    auto resp = c.read();
    ASSERT_TRUE(resp);
    EXPECT_EQ(resp->status, 200);
    auto events = test::sse_data(resp->body);
    ASSERT_EQ(events.size(), 4u) << resp->body;
    EXPECT_EQ(json::parse(events[0])["choices"][0]["text"], "a");
    EXPECT_EQ(json::parse(events[1])["choices"][0]["text"], "b");
    EXPECT_EQ(json::parse(events[2])["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(events[3], "[DONE]");
}

// (2)
TEST(http_actor, one_request_of_a_connection_runs_at_a_time) {
    rig r;
    http_conn c;
    ASSERT_TRUE(r.connect(c));
    ASSERT_TRUE(c.send(completion(false) + completion(false)));
    auto first = r.sched.next<sched::generate>();
    ASSERT_TRUE(first);
    EXPECT_FALSE(r.sched.next<sched::generate>(std::chrono::milliseconds(200)))
        << "the second request went to the scheduler before the first was answered";
    r.tell(done(first->conn, first->id, "one"));
    auto a = c.read();
    ASSERT_TRUE(a);
    EXPECT_EQ(json::parse(a->body)["choices"][0]["text"], "one");
    auto second = r.sched.next<sched::generate>();
    ASSERT_TRUE(second);
    EXPECT_EQ(second->conn, first->conn);
    EXPECT_NE(second->id, first->id);
    r.tell(done(second->conn, second->id, "two"));
    auto b = c.read();
    ASSERT_TRUE(b);
    EXPECT_EQ(json::parse(b->body)["choices"][0]["text"], "two");
}

// (3)
TEST(http_actor, errors_before_and_after_the_first_token) {
    rig r;
    http_conn c;
    ASSERT_TRUE(r.connect(c));
    ASSERT_TRUE(c.send(completion(true)));
    auto g = r.sched.next<sched::generate>();
    ASSERT_TRUE(g);
    r.tell(door::request_error{g->conn, g->id, door::errc::gpu_unavailable, "no device"});
    auto early = c.read();
    ASSERT_TRUE(early);
    EXPECT_EQ(early->status, 503);
    EXPECT_EQ(json::parse(early->body)["error"]["code"], "gpu_unavailable");

    ASSERT_TRUE(c.send(completion(true)));
    auto h = r.sched.next<sched::generate>();
    ASSERT_TRUE(h);
    r.tell(token(h->conn, h->id, "a"));
    r.tell(door::request_error{h->conn, h->id, door::errc::gpu_failed, "retries spent"});
    auto late = c.read();
    ASSERT_TRUE(late);
    EXPECT_EQ(late->status, 200);
    auto events = test::sse_data(late->body);
    ASSERT_EQ(events.size(), 2u) << late->body;
    EXPECT_EQ(json::parse(events[1])["error"]["code"], "gpu_failed");
}

// (4)
TEST(http_actor, a_client_closing_mid_stream_is_one_client_gone) {
    rig r;
    http_conn c;
    ASSERT_TRUE(r.connect(c));
    ASSERT_TRUE(c.send(completion(true)));
    auto g = r.sched.next<sched::generate>();
    ASSERT_TRUE(g);
    r.tell(token(g->conn, g->id, "a"));
    ASSERT_TRUE(c.read_head());
    c.close();
    auto gone = r.sched.next<door::client_gone>();
    ASSERT_TRUE(gone);
    EXPECT_EQ(gone->conn, g->conn);
    EXPECT_FALSE(r.sched.next<door::client_gone>(std::chrono::milliseconds(200)));
    // Events still in flight for the gone connection are dropped quietly.
    r.tell(done(g->conn, g->id, "a"));
}

// (5)
TEST(http_actor, drop_connection_closes_it) {
    rig r;
    http_conn c;
    ASSERT_TRUE(r.connect(c));
    ASSERT_TRUE(c.send(completion(false)));
    auto g = r.sched.next<sched::generate>();
    ASSERT_TRUE(g);
    r.tell(door::drop_connection{g->conn, "events undeliverable"});
    EXPECT_TRUE(c.wait_closed());
    EXPECT_TRUE(r.sched.next<door::client_gone>());
}

// (6)
TEST(http_actor, health_follows_set_health_and_drain) {
    rig r;
    auto ok = test::http_call(r.http.bound_port(), "GET", "/health");
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200);
    r.tell(door::set_health{door::health_status::degraded, "the device could not be rebuilt"});
    auto bad = test::http_call(r.http.bound_port(), "GET", "/health");
    ASSERT_TRUE(bad);
    EXPECT_EQ(bad->status, 503);
    EXPECT_EQ(json::parse(bad->body)["status"], "degraded");
    EXPECT_EQ(json::parse(bad->body)["reason"], "the device could not be rebuilt");
    // Draining: a connection already open is told draining, and so is a new one (the
    // listener stays open for load balancers' health checks).
    http_conn c;
    ASSERT_TRUE(r.connect(c));
    r.tell(door::begin_drain{});
    ASSERT_TRUE(c.send(http_request_text("GET", "/health")));
    auto draining = c.read();
    ASSERT_TRUE(draining);
    EXPECT_EQ(draining->status, 503);
    EXPECT_EQ(json::parse(draining->body)["status"], "draining");
    auto fresh = test::http_call(r.http.bound_port(), "GET", "/health");
    ASSERT_TRUE(fresh) << "a draining server must answer health on a new connection";
    EXPECT_EQ(fresh->status, 503);
    EXPECT_EQ(json::parse(fresh->body)["status"], "draining");
}

// (7)
TEST(http_actor, metrics_come_from_the_scheduler_stats) {
    rig r;
    http_conn c;
    ASSERT_TRUE(r.connect(c));
    ASSERT_TRUE(c.send(http_request_text("GET", "/metrics")));
    auto q = r.sched.next<sched::stats_query>();
    ASSERT_TRUE(q);
    EXPECT_EQ(door::door_kind_of(q->conn), door::door_kind::http);
    // The query carries this front door's counters; the scheduler echoes them in its report.
    EXPECT_EQ(q->http.at("requests"), 1u);
    EXPECT_EQ(q->http.at("connections_open"), 1u);
    door::stats_done d{q->conn, q->id, {}};
    d.stats.http = q->http;
    d.stats.active_sequences = 3;
    d.stats.scheduler = {{"requests", 9}};
    d.stats.histograms = {{"prompt_tokens", door::histogram({1, 10})}};
    d.stats.histograms["prompt_tokens"].observe(5);
    r.tell(d);
    auto m = c.read();
    ASSERT_TRUE(m);
    EXPECT_EQ(m->status, 200);
    for (const char* line :
         {"ordo_active_sequences 3\n", "ordo_scheduler_requests_total 9\n",
          "ordo_prompt_tokens_bucket{le=\"1\"} 0\n", "ordo_prompt_tokens_bucket{le=\"10\"} 1\n",
          "ordo_prompt_tokens_bucket{le=\"+Inf\"} 1\n", "ordo_prompt_tokens_sum 5\n",
          "ordo_http_requests_total 1\n"}) {
        EXPECT_NE(m->body.find(line), std::string::npos) << line << " not in\n" << m->body;
    }
}

// (8)
TEST(http_actor, refusals_that_close_the_connection) {
    http::http_options o = rig::options();
    o.body_bytes_max = 1024;
    o.header_timeout_ms = 200;
    rig r(o);
    http_conn big;
    ASSERT_TRUE(r.connect(big));
    ASSERT_TRUE(big.send("POST /v1/completions HTTP/1.1\r\nContent-Length: 5000\r\n\r\n"));
    auto a = big.read();
    ASSERT_TRUE(a);
    EXPECT_EQ(a->status, 413);
    EXPECT_TRUE(big.wait_closed());

    http_conn bad;
    ASSERT_TRUE(r.connect(bad));
    ASSERT_TRUE(bad.send(http_request_text("GET", "/v1/models") + "GET / HTTP/9.9.9\r\n\r\n"));
    auto models = bad.read();
    ASSERT_TRUE(models);
    EXPECT_EQ(models->status, 200);
    auto refused = bad.read();
    ASSERT_TRUE(refused);
    EXPECT_GE(refused->status, 400);
    EXPECT_TRUE(bad.wait_closed());

    http_conn slow;
    ASSERT_TRUE(r.connect(slow));
    ASSERT_TRUE(slow.send("POST /v1/completions HTTP/1.1\r\nContent-Length: 10\r\n\r\n{\"a\""));
    auto late = slow.read();
    ASSERT_TRUE(late);
    EXPECT_EQ(late->status, 408);
    EXPECT_TRUE(slow.wait_closed());
}

// (9)
TEST(http_actor, a_paused_connection_is_still_cut_off_at_the_write_bound) {
    http::http_options o = rig::options();
    o.write_buffer_bytes_max = 64 * 1024;
    rig r(o);
    http_conn c;
    ASSERT_TRUE(r.connect(c));
    int small = 4096;
    setsockopt(c.fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    ASSERT_TRUE(c.send(completion(true)));
    auto g = r.sched.next<sched::generate>();
    ASSERT_TRUE(g);
    // Reading stops for far longer than the test; writing goes on, and the client reads nothing:
    // 800 tokens of 16 KiB (12.5 MiB) pass the kernel's buffers and the 64 KiB bound.
    r.tell(door::net_fault{g->conn, ordo::fault_kind::net_stop_reading, 60'000});
    const std::string text(16 * 1024, 'x');
    for (int i = 0; i < 800; i++) r.tell(token(g->conn, g->id, text));
    auto gone = r.sched.next<door::client_gone>();
    ASSERT_TRUE(gone) << "the paused connection that stopped reading was never cut off";
    EXPECT_EQ(gone->conn, g->conn);
    EXPECT_EQ(gone->reason, "slow_reader");
    EXPECT_TRUE(c.wait_closed());
    auto k = r.http.counters();
    EXPECT_EQ(k["fault_pauses"], 1u);
    EXPECT_EQ(k["slow_readers"], 1u);
    EXPECT_EQ(k["disconnects"], 1u);
    EXPECT_EQ(k["connections_open"], 0u);
}
