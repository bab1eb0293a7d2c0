// test_net_actor.cpp: the net actor on its real loop with real TCP clients, wired to a probe
// actor in place of the scheduler (tests/support/actor_probe.hpp); the test plays the
// scheduler. Sequences are asserted on the trace of deliveries.
//
// Checks: (1) a request reaches the scheduler as its typed op carrying the connection, the
// scheduler's typed event comes back to the client encoded, a live id is refused as
// duplicate_id and is free again after its terminal event; (2) a client that resets with a live
// request becomes exactly one client_gone for its connection, after its request in the trace;
// (3) drop_connection closes that client's connection (and cancels its live requests);
// (4) one event larger than server.write_buffer_bytes_max answers its request with
// error{response_too_large} and the connection stays usable; (5) a half-sent frame is cut off
// with error{read_timeout} (id 0) after server.read_timeout_ms; (6) begin_drain stops accepting
// while open connections are still served; (7) connections the client already closed do not
// count against server.max_connections (many open/close cycles, never `overloaded`); every
// loop closes cleanly.
#include <gtest/gtest.h>

#include "net/net_actor.hpp"
#include "tests/support/actor_probe.hpp"
#include "tests/support/server_process.hpp"

namespace {

using namespace ordo;
using ordo::test::frame;
using ordo::test::probe;
using ordo::test::str_field;
using ordo::test::tcp_client;
using ordo::test::trace_script;
using ordo::test::uint_field;

using sched_probe = probe<sched::generate, sched::cancel, sched::tokenize, sched::detokenize,
                          sched::model_info_query, sched::stats_query, sched::fault,
                          sched::session_delete, sched::client_gone, sched::embed>;

struct rig {
    explicit rig(net::net_options o = {}) : net(with_defaults(std::move(o)), 1024) {
        net.connect_scheduler(sched);
        net.set_trace(&trace);
        sched.set_trace(&trace);
        EXPECT_TRUE(sched.start().ok());
        EXPECT_TRUE(net.start().ok());
        EXPECT_TRUE(net.listen_status().ok());
    }
    ~rig() { stop(); }
    void stop() {
        for (actors::actor_core* a : std::initializer_list<actors::actor_core*>{&net, &sched}) {
            a->request_stop();
            EXPECT_TRUE(a->join().ok()) << a->name() << " leaked a handle";
        }
    }
    static net::net_options with_defaults(net::net_options o) {
        o.port = 0;
        o.limits = {256, 300, false};
        return o;
    }
    bool connect(tcp_client& c) { return c.connect(net.bound_port()); }

    actors::memory_trace_sink trace;
    sched_probe sched{"scheduler"};
    net::net_actor net;
};

TEST(net_actor, typed_op_in_typed_event_out_and_ids_are_freed_by_the_terminal_event) {
    rig r;
    tcp_client c;
    ASSERT_TRUE(r.connect(c));
    ASSERT_TRUE(c.send(frame("id", 4, "op", "tokenize", "text", "hi")));
    auto t = r.sched.next<sched::tokenize>();
    ASSERT_TRUE(t);
    EXPECT_EQ(t->id, 4u);
    EXPECT_EQ(t->text, "hi");
    EXPECT_NE(t->conn, 0u);
    ASSERT_TRUE(c.send(frame("id", 4, "op", "tokenize", "text", "again")));
    auto dup = c.recv();
    ASSERT_TRUE(dup);
    EXPECT_EQ(str_field(dup->get(), "code"), "duplicate_id");
    ASSERT_TRUE(r.net.tell(door::tokenize_done{t->conn, 4, {7, 8}}, "scheduler").ok());
    auto done = c.recv();
    ASSERT_TRUE(done);
    EXPECT_EQ(str_field(done->get(), "event"), "done");
    EXPECT_EQ(done->get().via.map.size, 3u);  // id, event, tokens
    ASSERT_TRUE(c.send(frame("id", 4, "op", "tokenize", "text", "reused")));
    auto reused = r.sched.next<sched::tokenize>();
    ASSERT_TRUE(reused);
    EXPECT_EQ(reused->text, "reused");
}

TEST(net_actor, a_reset_client_becomes_one_client_gone_after_its_request) {
    rig r;
    uint64_t conn = 0;
    {
        tcp_client c;
        ASSERT_TRUE(r.connect(c));
        ASSERT_TRUE(c.send(frame("id", 1, "op", "generate", "prompt", "x")));
        auto g = r.sched.next<sched::generate>();
        ASSERT_TRUE(g);
        conn = g->conn;
        c.reset();
    }
    auto gone = r.sched.next<sched::client_gone>();
    ASSERT_TRUE(gone);
    EXPECT_EQ(gone->conn, conn);
    EXPECT_TRUE(r.sched.stays_empty(std::chrono::milliseconds(100)));
    r.stop();
    trace_script t(r.trace.snapshot());
    t.expect<sched::generate>("net", "scheduler");
    t.expect<sched::client_gone>("net", "scheduler");
}

TEST(net_actor, drop_connection_closes_the_client) {
    rig r;
    tcp_client c;
    ASSERT_TRUE(r.connect(c));
    ASSERT_TRUE(c.send(frame("id", 1, "op", "generate", "prompt", "x")));
    auto g = r.sched.next<sched::generate>();
    ASSERT_TRUE(g);
    ASSERT_TRUE(r.net.tell(door::drop_connection{g->conn, "test"}, "scheduler").ok());
    EXPECT_TRUE(c.wait_closed());
    auto gone = r.sched.next<sched::client_gone>();
    ASSERT_TRUE(gone);
    EXPECT_EQ(gone->conn, g->conn);
}

TEST(net_actor, an_answer_larger_than_the_write_buffer_is_a_clear_error) {
    net::net_options o;
    o.write_buffer_bytes_max = 4096;
    rig r(o);
    tcp_client c;
    ASSERT_TRUE(r.connect(c));
    ASSERT_TRUE(c.send(frame("id", 2, "op", "tokenize", "text", "long")));
    auto t = r.sched.next<sched::tokenize>();
    ASSERT_TRUE(t);
    std::vector<int32_t> many(5000, 1000);  // 3 bytes each on the wire: over 4096
    ASSERT_TRUE(r.net.tell(door::tokenize_done{t->conn, 2, many}, "scheduler").ok());
    auto e = c.recv();
    ASSERT_TRUE(e) << "the reading client got nothing";
    EXPECT_EQ(uint_field(e->get(), "id"), 2u);
    EXPECT_EQ(str_field(e->get(), "code"), "response_too_large");
    ASSERT_TRUE(c.send(frame("id", 3, "op", "health")));
    auto h = c.recv();
    ASSERT_TRUE(h) << "the connection must stay usable";
    EXPECT_EQ(str_field(h->get(), "event"), "done");
}

TEST(net_actor, a_half_sent_frame_times_out) {
    net::net_options o;
    o.read_timeout_ms = 200;
    rig r(o);
    tcp_client c;
    ASSERT_TRUE(r.connect(c));
    std::string whole(frame("id", 1, "op", "health").data(), frame("id", 1, "op", "health").size());
    ASSERT_TRUE(c.send_raw(whole.substr(0, whole.size() - 2)));
    auto e = c.recv(std::chrono::milliseconds(5000));
    ASSERT_TRUE(e);
    EXPECT_EQ(uint_field(e->get(), "id"), 0u);
    EXPECT_EQ(str_field(e->get(), "code"), "read_timeout");
    EXPECT_TRUE(c.wait_closed());
    // A client between whole frames is not timed.
    tcp_client idle;
    ASSERT_TRUE(r.connect(idle));
    ASSERT_TRUE(idle.send(frame("id", 1, "op", "health")));
    ASSERT_TRUE(idle.recv());
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ASSERT_TRUE(idle.send(frame("id", 2, "op", "health")));
    auto h = idle.recv();
    ASSERT_TRUE(h);
    EXPECT_EQ(str_field(h->get(), "event"), "done");
}

// Draining: open connections are served and health says draining on them and on new ones
// (the listener stays open so load balancers see it).
TEST(net_actor, drain_says_draining_on_open_and_new_connections) {
    rig r;
    tcp_client open;
    ASSERT_TRUE(r.connect(open));
    // One round trip first: the connection is accepted, not still in the listen backlog.
    ASSERT_TRUE(open.send(frame("id", 9, "op", "health")));
    ASSERT_TRUE(open.recv());
    ASSERT_TRUE(r.net.tell(door::begin_drain{}, "main").ok());
    // begin_drain travels by mailbox, the health by TCP: ask until the drain is seen.
    std::string status;
    for (uint64_t id = 1; id < 200 && status != "draining"; id++) {
        ASSERT_TRUE(open.send(frame("id", id, "op", "health")));
        auto h = open.recv();
        ASSERT_TRUE(h);
        EXPECT_EQ(str_field(h->get(), "event"), "done");
        status = str_field(h->get(), "status");
        if (status != "draining") std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(status, "draining");
    tcp_client late;
    ASSERT_TRUE(r.connect(late)) << "a draining server must still accept (health checks)";
    ASSERT_TRUE(late.send(frame("id", 1, "op", "health")));
    auto h = late.recv();
    ASSERT_TRUE(h);
    EXPECT_EQ(str_field(h->get(), "status"), "draining");
}

TEST(net_actor, closed_connections_do_not_count_against_the_limit) {
    net::net_options o;
    o.connections_max = 2;
    rig r(o);
    tcp_client keep;
    ASSERT_TRUE(r.connect(keep));
    for (int i = 0; i < 300; i++) {
        tcp_client c;
        ASSERT_TRUE(r.connect(c));
        ASSERT_TRUE(c.send(frame("id", 1, "op", "health")));
        auto h = c.recv();
        ASSERT_TRUE(h) << "round " << i;
        ASSERT_EQ(str_field(h->get(), "event"), "done")
            << "round " << i << ": " << str_field(h->get(), "code");
        c.close();
    }
}

}  // namespace
