// test_fault_plan.cpp: the config's fault plan ([fault] plan, docs/protocol.md "A fault plan in
// the config") end to end: the real ordo-server binary over TCP on an ephemeral port, the real
// stories260K model (../shared; the test skips visibly without it), the gpu actor on the real
// Vulkan device (lavapipe in CI), and no client arming anything.
//
// How: a server with `[fault] enabled = true, seed = S, plan = ["nan_logits"],
// plan_every_steps = 2` (nan_logits fails a step without rebuilding the device, so the test
// stays fast) serves a sequential workload — one temperature-0 generate at a time, each read
// to its terminal event before the next is sent. Checks: every request gets exactly one
// terminal event, `done` or error gpu_failed (retries exhausted: scheduler.retry_max is 8
// here; with this seed both outcomes occur), and nothing after it (the next event read is the
// next request's, or the stats answer); every `done` has the same text (temperature 0:
// faults change no output); stats.fault_plan has the seed, fired > 0, by_kind =
// {nan_logits: fired}, not spent; each planned fault failed exactly its step
// (scheduler.failures and gpu.nan_logits equal fired) and was logged once at warn with its
// step. Then a second server with the same seed and the same workload replays it: the same
// faults fire (count, by_kind, the logged steps) and every request ends the same way. A third
// with another seed fires on other steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <thread>

#include "tests/support/scratch_dir.hpp"
#include "tests/support/server_process.hpp"
#include "tests/support/shared_models.hpp"

namespace {

using namespace ordo::test;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

const std::string stories = std::string(ORDO_SHARED_MODELS_DIR) + "/stories260K.gguf";

constexpr int requests_n = 6;
constexpr uint32_t max_tokens = 6;
constexpr uint64_t seed = 20240615;

std::string write_config(uint64_t plan_seed) {
    const fs::path& dir = ordo::test::scratch_dir("ordo_fault_plan");
    fs::path p = dir / ("plan_" + std::to_string(plan_seed) + ".toml");
    std::ofstream(p) << "[model]\npath = \"" << stories << "\"\n"
                     << "[scheduler]\nretry_max = 8\n"
                     << "[fault]\nenabled = true\nseed = " << plan_seed
                     << "\nplan = [\"nan_logits\"]\nplan_every_steps = 2\n";
    return p.string();
}

// Asks health until ok (the device build compiles every pipeline first).
void wait_ready(tcp_client& c) {
    auto end = std::chrono::steady_clock::now() + device_ready_deadline;
    for (uint64_t id = 1000000; std::chrono::steady_clock::now() < end; id++) {
        ASSERT_TRUE(c.send(frame("id", id, "op", "health")));
        auto r = next(c);
        ASSERT_TRUE(r.has_value()) << "no answer to health";
        if (r->str("status") == "ok") return;
        std::this_thread::sleep_for(10ms);
    }
    FAIL() << "the server never became healthy";
}

// What one server run gave: each request's outcome, the stats, the planned steps it logged.
struct run_result {
    std::vector<std::string> outcomes;  // "done:<text>" or "error:<code>", by request
    std::string done_text;              // the text every done had
    uint64_t fired = 0, refused = 0, plan_seed = 0;
    bool spent = true;
    std::map<std::string, uint64_t> by_kind;
    uint64_t failures = 0, nan_logits = 0, gpu_failed_errors = 0, gpu_failed_counter = 0;
    std::vector<uint64_t> logged_steps;  // from "fault plan: step N: nan_logits"
};

void run_workload(uint64_t plan_seed, run_result& out) {
    server_process server;
    ASSERT_TRUE(server.start(ORDO_SERVER_BIN, {"--config", write_config(plan_seed)}))
        << server.output();
    tcp_client c;
    ASSERT_TRUE(c.connect(server.port()));
    ASSERT_NO_FATAL_FAILURE(wait_ready(c));

    for (uint64_t id = 1; id <= requests_n; id++) {
        ASSERT_TRUE(c.send(frame("id", id, "op", "generate", "prompt", "Once upon a time",
                                 "max_tokens", max_tokens, "temperature", 0)));
        // Read to the terminal event. A second one for this id would be read with the next
        // request's events (or before the stats answer) and fail the id check: one scheduler
        // sends them all, in order.
        std::optional<event> terminal;
        while (!terminal) {
            auto e = next(c);
            ASSERT_TRUE(e.has_value()) << "request " << id << " never ended";
            ASSERT_EQ(e->u("id"), id) << e->outcome();
            if (e->terminal()) terminal = e;
        }
        if (terminal->str("event") == "done") {
            const std::string text = terminal->str("text");
            if (out.done_text.empty()) out.done_text = text;
            EXPECT_EQ(text, out.done_text) << "request " << id << ": temperature 0 must give the "
                                           << "same text whatever faults fired";
            out.outcomes.push_back("done:" + text);
        } else {
            EXPECT_EQ(terminal->str("code"), "gpu_failed") << terminal->outcome();
            out.gpu_failed_errors++;
            out.outcomes.push_back("error:" + terminal->str("code"));
        }
    }

    ASSERT_TRUE(c.send(frame("id", 100, "op", "stats")));
    auto s = next(c);
    ASSERT_TRUE(s.has_value()) << "no answer to stats";
    ASSERT_EQ(s->u("id"), 100u) << "an event after a request's terminal one: " << s->outcome();
    const msgpack::object* plan = field(s->o(), "fault_plan");
    ASSERT_NE(plan, nullptr) << "stats has no fault_plan map";
    out.plan_seed = uint_field(*plan, "seed");
    out.fired = uint_field(*plan, "fired");
    out.refused = uint_field(*plan, "refused");
    out.spent = field(*plan, "spent")->as<bool>();
    out.by_kind = field(*plan, "by_kind")->as<std::map<std::string, uint64_t>>();
    out.failures = uint_field(*field(s->o(), "scheduler"), "failures");
    out.gpu_failed_counter = uint_field(*field(s->o(), "scheduler"), "gpu_failed");
    out.nan_logits = uint_field(*field(s->o(), "gpu"), "nan_logits");

    EXPECT_EQ(server.stop(), 0);
    const std::string log = server.output();
    static const std::regex planned(R"(fault plan: step (\d+): nan_logits \(seed (\d+))");
    for (auto it = std::sregex_iterator(log.begin(), log.end(), planned);
         it != std::sregex_iterator(); ++it) {
        out.logged_steps.push_back(std::stoull((*it)[1].str()));
        EXPECT_EQ(std::stoull((*it)[2].str()), plan_seed) << "the log names the seed";
    }
}

// The checks every run must pass on its own.
void check_run(const run_result& r, uint64_t plan_seed) {
    std::string steps;
    for (uint64_t k : r.logged_steps) steps += (steps.empty() ? "" : " ") + std::to_string(k);
    std::printf("seed %llu: %llu faults fired, at steps %s; %llu of %d requests gpu_failed\n",
                static_cast<unsigned long long>(plan_seed),
                static_cast<unsigned long long>(r.fired), steps.c_str(),
                static_cast<unsigned long long>(r.gpu_failed_errors), requests_n);
    EXPECT_EQ(r.outcomes.size(), size_t(requests_n));
    EXPECT_EQ(r.plan_seed, plan_seed);
    EXPECT_GT(r.fired, 0u);
    EXPECT_EQ(r.refused, 0u);
    EXPECT_FALSE(r.spent) << "plan_faults_max is 100";
    EXPECT_EQ(r.by_kind, (std::map<std::string, uint64_t>{{"nan_logits", r.fired}}));
    // Each planned fault failed exactly the step it was drawn for: no other step failed, and
    // every failed step was a NaN the gpu actor found.
    EXPECT_EQ(r.failures, r.fired);
    EXPECT_EQ(r.nan_logits, r.fired);
    EXPECT_EQ(r.gpu_failed_counter, r.gpu_failed_errors);
    EXPECT_EQ(r.logged_steps.size(), r.fired);
    EXPECT_TRUE(std::is_sorted(r.logged_steps.begin(), r.logged_steps.end()));
}

TEST(fault_plan_server, fires_planned_faults_and_the_same_seed_replays_them) {
    ORDO_REQUIRE_SHARED(stories);
    run_result first, second, other;
    ASSERT_NO_FATAL_FAILURE(run_workload(seed, first));
    ASSERT_NO_FATAL_FAILURE(check_run(first, seed));
    EXPECT_FALSE(first.done_text.empty()) << "no request completed: the test says nothing "
                                             "about faults that change no output";

    ASSERT_NO_FATAL_FAILURE(run_workload(seed, second));
    ASSERT_NO_FATAL_FAILURE(check_run(second, seed));
    EXPECT_EQ(second.fired, first.fired) << "the same seed and workload replay the same faults";
    EXPECT_EQ(second.by_kind, first.by_kind);
    EXPECT_EQ(second.logged_steps, first.logged_steps);
    EXPECT_EQ(second.outcomes, first.outcomes);

    ASSERT_NO_FATAL_FAILURE(run_workload(seed + 1, other));
    ASSERT_NO_FATAL_FAILURE(check_run(other, seed + 1));
    EXPECT_NE(other.logged_steps, first.logged_steps) << "another seed fires on other steps";
}

}  // namespace
