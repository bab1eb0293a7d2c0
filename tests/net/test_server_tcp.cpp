// test_server_tcp.cpp: the real ordo-server binary over real TCP on an ephemeral port.
//
// Checks: health and stats answer with done events; unknown ops and bad requests get errors
// while the connection stays usable; malformed msgpack, a non-map frame, a frame without an
// id and an oversized frame each get one bad_frame error with id 0 and the connection closed,
// while a second client connected all along keeps being served; connections beyond
// server.max_connections are refused with `overloaded`; a client that never reads is cut off
// at the write-buffer bound (slow_readers counted) instead of growing memory; a reset client
// does not disturb the server; SIGTERM stops it with exit 0 after closing everything; bad
// configs and flags exit 2 naming the key, file and line; a busy port exits 1.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/support/scratch_dir.hpp"
#include "tests/support/server_process.hpp"

namespace {

using namespace ordo::test;
namespace fs = std::filesystem;

std::string write_config(const std::string& name, const std::string& text) {
    const fs::path& dir = ordo::test::scratch_dir("ordo_net_test");
    fs::path p = dir / name;
    std::ofstream(p) << text;
    return p.string();
}

// A small model made once per test process with `ordo-model mk` (the server needs one).
const std::string& tiny_model() {
    static const std::string path = [] {
        const fs::path& dir = ordo::test::scratch_dir("ordo_net_test");
        std::string p = (dir / "tiny.gguf").string();
        std::string mk = std::string(ORDO_MODEL_BIN) + " mk --out " + p +
                         " --n-embd 32 --n-layer 1 --n-head 2 --n-head-kv 2 --n-ff 64"
                         " --n-vocab 260 --type f32 --seed 1 --ctx 128 > /dev/null";
        EXPECT_EQ(std::system(mk.c_str()), 0);
        return p;
    }();
    return path;
}

std::vector<std::string> with_model(std::vector<std::string> args) {
    args.insert(args.end(), {"--model", tiny_model()});
    return args;
}

// Sends {id, op: health} and expects a done with status ok (asking again while the device is
// still loading), within device_ready_deadline.
void expect_healthy(tcp_client& c, uint64_t id) {
    auto end = std::chrono::steady_clock::now() + device_ready_deadline;
    while (std::chrono::steady_clock::now() < end) {
        ASSERT_TRUE(c.send(frame("id", id, "op", "health")));
        auto r = c.recv();
        ASSERT_TRUE(r.has_value()) << "no answer to health";
        EXPECT_EQ(uint_field(r->get(), "id"), id);
        EXPECT_EQ(str_field(r->get(), "event"), "done");
        if (str_field(r->get(), "status") == "ok") return;
        EXPECT_EQ(str_field(r->get(), "status"), "loading");
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    FAIL() << "the server never became healthy";
}

// Expects {id: 0, event: error, code: bad_frame} and then EOF.
void expect_bad_frame_and_close(tcp_client& c) {
    auto r = c.recv();
    ASSERT_TRUE(r.has_value()) << "no bad_frame error";
    EXPECT_EQ(uint_field(r->get(), "id"), 0u);
    EXPECT_EQ(str_field(r->get(), "event"), "error");
    EXPECT_EQ(str_field(r->get(), "code"), "bad_frame");
    EXPECT_FALSE(str_field(r->get(), "message").empty());
    EXPECT_TRUE(c.wait_closed());
}

class server_tcp : public ::testing::Test {
protected:
    void SetUp() override {
        std::string cfg = write_config("small_frames.toml",
                                       "[server]\nmax_frame_bytes = 1024\n"
                                       "write_buffer_bytes_max = 65536\n");
        ASSERT_TRUE(
            server.start(ORDO_SERVER_BIN, with_model({"--config", cfg, "--log-level", "warn"})))
            << server.output();
    }
    server_process server;
};

TEST_F(server_tcp, health_and_stats) {
    tcp_client c;
    ASSERT_TRUE(c.connect(server.port()));
    expect_healthy(c, 1);
    ASSERT_TRUE(c.send(frame("id", 2, "op", "stats")));
    auto r = c.recv();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(str_field(r->get(), "event"), "done");
    EXPECT_EQ(uint_field(r->get(), "connections_open"), 1u);
    const auto* net = field(r->get(), "net");
    ASSERT_NE(net, nullptr);
    EXPECT_GE(uint_field(*net, "requests"), 2u);
}

TEST_F(server_tcp, unknown_op_and_bad_requests_keep_the_connection) {
    tcp_client c;
    ASSERT_TRUE(c.connect(server.port()));
    ASSERT_TRUE(c.send(frame("id", 5, "op", "teleport")));
    auto r = c.recv();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(uint_field(r->get(), "id"), 5u);
    EXPECT_EQ(str_field(r->get(), "code"), "unknown_op");
    ASSERT_TRUE(c.send(frame("id", 6)));  // no op
    r = c.recv();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(uint_field(r->get(), "id"), 6u);
    EXPECT_EQ(str_field(r->get(), "code"), "bad_request");
    ASSERT_TRUE(c.send(frame("id", 7, "op", "health", "verbose", true)));  // unknown key
    r = c.recv();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(str_field(r->get(), "code"), "bad_request");
    EXPECT_NE(str_field(r->get(), "message").find("verbose"), std::string::npos);
    expect_healthy(c, 8);
}

TEST_F(server_tcp, bad_frames_close_only_their_connection) {
    tcp_client bystander;
    ASSERT_TRUE(bystander.connect(server.port()));
    expect_healthy(bystander, 1);

    std::vector<std::string> bad_streams = {
        std::string("\xc1\x00\x01", 3),      // malformed msgpack
        std::string("\x93\x01\x02\x03", 4),  // an array, not a map
        [] {
            auto f = frame("op", "health");
            return std::string(f.data(), f.size());
        }(),
        [] {  // a 4 KiB frame against max_frame_bytes = 1024
            auto f = frame("id", 1, "op", "health", "pad", std::string(4096, 'x'));
            return std::string(f.data(), f.size());
        }(),
    };
    for (const auto& bytes : bad_streams) {
        tcp_client c;
        ASSERT_TRUE(c.connect(server.port()));
        ASSERT_TRUE(c.send_raw(bytes));
        expect_bad_frame_and_close(c);
        expect_healthy(bystander, 2);
    }
}

TEST_F(server_tcp, reset_client_does_not_disturb_the_server) {
    for (int i = 0; i < 5; i++) {
        tcp_client c;
        ASSERT_TRUE(c.connect(server.port()));
        ASSERT_TRUE(c.send_raw(std::string(frame("id", 1, "op", "stats").data(), 5)));  // partial
        c.reset();
    }
    tcp_client c;
    ASSERT_TRUE(c.connect(server.port()));
    expect_healthy(c, 1);
}

TEST_F(server_tcp, slow_reader_is_cut_off_at_the_write_bound) {
    tcp_client slow;
    ASSERT_TRUE(slow.connect(server.port()));
    int small = 4096;
    setsockopt(slow.fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    // ~50 bytes of answer per request; 200k answers far exceed the kernel buffers plus the
    // 64 KiB write bound, so the server must give up on this client rather than buffer.
    std::string burst;
    for (uint64_t id = 1; id <= 2000; id++) {
        auto f = frame("id", id, "op", "health");
        burst.append(f.data(), f.size());
    }
    for (int round = 0; round < 100; round++) {
        if (!slow.send_raw(burst)) break;  // the server closed us: done
    }
    tcp_client observer;
    ASSERT_TRUE(observer.connect(server.port()));
    uint64_t slow_readers = 0;
    for (uint64_t id = 1; id <= 100 && slow_readers == 0; id++) {
        ASSERT_TRUE(observer.send(frame("id", id, "op", "stats")));
        auto r = observer.recv();
        ASSERT_TRUE(r.has_value());
        slow_readers = uint_field(*field(r->get(), "net"), "slow_readers");
        if (slow_readers == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(slow_readers, 1u);
}

TEST(server_process_lifecycle, sigterm_stops_cleanly) {
    server_process server;
    ASSERT_TRUE(server.start(ORDO_SERVER_BIN, with_model({}))) << server.output();
    tcp_client c;
    ASSERT_TRUE(c.connect(server.port()));
    expect_healthy(c, 1);
    EXPECT_EQ(server.stop(), 0) << server.output();
    EXPECT_NE(server.output().find("stopped cleanly"), std::string::npos) << server.output();
    EXPECT_TRUE(c.wait_closed());
}

TEST(server_process_lifecycle, connection_limit_refuses_with_overloaded) {
    std::string cfg = write_config("two_conns.toml", "[server]\nmax_connections = 2\n");
    server_process server;
    ASSERT_TRUE(server.start(ORDO_SERVER_BIN, with_model({"--config", cfg}))) << server.output();
    tcp_client a, b, c;
    ASSERT_TRUE(a.connect(server.port()));
    ASSERT_TRUE(b.connect(server.port()));
    expect_healthy(a, 1);
    expect_healthy(b, 1);
    ASSERT_TRUE(c.connect(server.port()));
    auto r = c.recv();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(str_field(r->get(), "code"), "overloaded");
    EXPECT_TRUE(c.wait_closed());
    a.close();
    // Once a slot frees up a new client is served (the close is processed asynchronously).
    bool served = false;
    for (int attempt = 0; attempt < 50 && !served; attempt++) {
        tcp_client d;
        ASSERT_TRUE(d.connect(server.port()));
        ASSERT_TRUE(d.send(frame("id", 1, "op", "health")));
        auto answer = d.recv();
        served = answer.has_value() && str_field(answer->get(), "event") == "done";
        if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_TRUE(served);
}

TEST(server_process_lifecycle, bad_config_exits_2_naming_key_and_line) {
    std::string cfg = write_config("bad.toml", "[server]\n\nmax_connections = 0\n");
    server_process server;
    EXPECT_FALSE(server.start(ORDO_SERVER_BIN, with_model({"--config", cfg})));
    EXPECT_EQ(server.exit_status(), 2);
    std::string out = server.output();
    EXPECT_NE(out.find("bad.toml:3"), std::string::npos) << out;
    EXPECT_NE(out.find("server.max_connections"), std::string::npos) << out;

    server_process check;
    EXPECT_FALSE(check.start(ORDO_SERVER_BIN, with_model({"--check-config", cfg})));
    EXPECT_EQ(check.exit_status(), 2);
    EXPECT_NE(check.output().find("server.max_connections"), std::string::npos);
}

TEST(server_process_lifecycle, busy_port_fails_to_start) {
    server_process first;
    ASSERT_TRUE(first.start(ORDO_SERVER_BIN, with_model({}))) << first.output();
    server_process second;
    std::string addr = "127.0.0.1:" + std::to_string(first.port());
    EXPECT_FALSE(second.start(ORDO_SERVER_BIN, with_model({"--listen", addr})));
    EXPECT_EQ(second.exit_status(), 1);
    EXPECT_NE(second.output().find("listen_failed"), std::string::npos) << second.output();
}

}  // namespace
