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
// client_gone for its connection; (5) drop_connection closes the connection; every loop closes
// cleanly.
#include <gtest/gtest.h>

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

using sched_probe = probe<sched::generate, sched::stats_query, sched::client_gone>;

struct rig {
    rig() : http(options(), 1024) {
        http.connect_scheduler(sched);
        EXPECT_TRUE(sched.start().ok());
        EXPECT_TRUE(http.start().ok());
        EXPECT_TRUE(http.listen_status().ok());
        // The scheduler says the device is ready.
        EXPECT_TRUE(http.tell(net::set_health{"ok", ""}, "scheduler").ok());
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
    void tell(const T& m) { EXPECT_TRUE(http.tell(m, "scheduler").ok()); }

    sched_probe sched{"scheduler"};
    http::http_actor http;
};

std::string completion(bool stream) {
    return http_request_text("POST", "/v1/completions",
                             json({{"model", "tiny"}, {"prompt", "hi"}, {"stream", stream}}).dump());
}

net::token_event token(uint64_t conn, uint64_t id, const std::string& text) {
    return {conn, id, {65, text, -0.5f, std::nullopt}};
}

net::generate_done done(uint64_t conn, uint64_t id, const std::string& text) {
    net::generate_done d;
    d.conn = conn, d.id = id, d.reason = "length", d.text = text;
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
    EXPECT_EQ(sched::front_door_of(g->conn), sched::front_door::http);
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
    r.tell(net::request_error{g->conn, g->id, net::errc::gpu_unavailable, "no device"});
    auto early = c.read();
    ASSERT_TRUE(early);
    EXPECT_EQ(early->status, 503);
    EXPECT_EQ(json::parse(early->body)["error"]["code"], "gpu_unavailable");

    ASSERT_TRUE(c.send(completion(true)));
    auto h = r.sched.next<sched::generate>();
    ASSERT_TRUE(h);
    r.tell(token(h->conn, h->id, "a"));
    r.tell(net::request_error{h->conn, h->id, net::errc::gpu_failed, "retries spent"});
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
    auto gone = r.sched.next<sched::client_gone>();
    ASSERT_TRUE(gone);
    EXPECT_EQ(gone->conn, g->conn);
    EXPECT_FALSE(r.sched.next<sched::client_gone>(std::chrono::milliseconds(200)));
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
    r.tell(net::drop_connection{g->conn, "events undeliverable"});
    EXPECT_TRUE(c.wait_closed());
    EXPECT_TRUE(r.sched.next<sched::client_gone>());
}
