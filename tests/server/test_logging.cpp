// test_logging.cpp: a log reader that stops reading does not stall the server (issue 26).
//
// Checks, against the real ordo-server binary over TCP on a small model made with
// `ordo-model mk`, on the real Vulkan device (lavapipe in CI):
// - with its stderr a one-page pipe that nobody reads, log.level = "debug" (a line per
//   connection opened and closed) and log.queue_lines = 16, the server serves 1,000 generate
//   requests, each on its own connection, every one to its terminal event; answers stats, whose
//   log_lines_dropped is non-zero (the oldest queued lines were dropped, not waited on); and on
//   SIGTERM exits 0 (shutdown waits a bounded time for a writer stuck behind the reader).
// With synchronous logging the server stalled in write(2) after ~64 KiB of log; here the pipe
// holds 4 KiB, so without the asynchronous writer the first few dozen requests would hang.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/support/scratch_dir.hpp"
#include "tests/support/server_process.hpp"

namespace {

using namespace ordo::test;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

std::string temp_path(const std::string& name) {
    const fs::path& dir = ordo::test::scratch_dir("ordo_logging");
    return (dir / name).string();
}

std::string small_model() {
    std::string p = temp_path("small.gguf");
    std::string mk = std::string(ORDO_MODEL_BIN) + " mk --out " + p +
                     " --n-embd 32 --n-layer 2 --n-head 2 --n-head-kv 2 --n-ff 64"
                     " --n-vocab 260 --type f32 --seed 1 --ctx 128 > /dev/null";
    EXPECT_EQ(std::system(mk.c_str()), 0);
    return p;
}

TEST(logging, a_reader_that_stops_reading_does_not_stall_the_server) {
    const std::string config = temp_path("stalled.toml");
    std::ofstream(config) << "[model]\npath = \"" << small_model() << "\"\n"
                          << "[log]\nlevel = \"debug\"\nqueue_lines = 16\n";
    server_process server;
    server.stderr_to_unread_pipe(4096);
    ASSERT_TRUE(server.start(ORDO_SERVER_BIN, {"--config", config})) << server.output();
    ASSERT_EQ(wait_healthy(server.port()), "");

    constexpr int requests = 1000;
    int done = 0;
    for (int i = 1; i <= requests; i++) {
        tcp_client c;
        ASSERT_TRUE(c.connect(server.port())) << "request " << i;
        ASSERT_TRUE(c.send(frame("id", uint64_t(i), "op", "generate", "tokens",
                                 std::vector<int>{1, 2, 3}, "max_tokens", 1, "temperature", 0)));
        auto evs = until_terminal(c, uint64_t(i));
        ASSERT_FALSE(evs.empty()) << "request " << i
                                  << " got no terminal event: the server "
                                     "stalled behind its log reader";
        EXPECT_EQ(evs.back().str("event"), "done") << evs.back().outcome();
        done += evs.back().str("event") == "done";
    }
    EXPECT_EQ(done, requests);

    tcp_client c;
    ASSERT_TRUE(c.connect(server.port()));
    ASSERT_TRUE(c.send(frame("id", uint64_t(1), "op", "stats")));
    auto stats = next(c);
    ASSERT_TRUE(stats.has_value()) << "stats unanswered";
    ASSERT_EQ(stats->str("event"), "done") << stats->outcome();
    EXPECT_GT(stats->u("log_lines_dropped"), 0u)
        << "2,000 debug lines through a 4 KiB pipe nobody reads and a 16-line queue dropped none";
    c.close();
    EXPECT_EQ(server.stop(), 0) << "the server did not exit cleanly with its reader stalled";
}

}  // namespace
