// test_ordo_fault.cpp: runs the fault harness (tools/fault, ordo-fault) as CI does: every named
// scenario (F1, F2, F4, F5, F7, the kv, runtime and net fault points, recovery exhausted and
// the kind x phase x batch x cancel table) against real ordo-server processes on the real
// model, lavapipe. Checks: exit status 0, the JSON summary's violations are 0 and it ran every
// scenario; seeded random runs with gpu, kv, net and draft faults and session deletes (each
// checked to end exactly once, kv_io only under a stalled unlink), 1000 requests speculating by
// prompt lookup (about a minute alone) and 300 with a draft model, have no violations
// (invariants 1-8, resident memory back near its baseline included) and report their memory; bad
// command lines exit 2; --list names them all.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "tests/support/server_process.hpp"
#include "tests/support/shared_models.hpp"

namespace {

using ordo::test::run_command;

const std::string tool = ORDO_FAULT_TOOL;
const std::string server = ORDO_SERVER_BIN;
const std::string stories = std::string(ORDO_SHARED_MODELS_DIR) + "/stories260K.gguf";

std::string harness(const std::string& args) {
    return "'" + tool + "' --server '" + server + "' " + args + " 2>&1";
}

size_t count_lines(const std::string& s) {
    size_t n = 0;
    for (char c : s) n += c == '\n' ? 1 : 0;
    return n;
}

TEST(ordo_fault, every_scenario_passes_without_violations) {
    ORDO_REQUIRE_SHARED(stories);
    auto list = run_command(harness("--list"));
    ASSERT_EQ(list.exit_code, 0) << list.output;
    const size_t scenarios = count_lines(list.output);
    EXPECT_GE(scenarios, 40u);
    auto r = run_command(harness("--model '" + stories + "' --scenarios all --json"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    // The JSON summary is the last line of standard output.
    std::string out = r.output;
    while (!out.empty() && out.back() == '\n') out.pop_back();
    const std::string last = out.substr(out.rfind('\n') + 1);
    EXPECT_NE(last.find("\"violations\":0,"), std::string::npos) << last;
    EXPECT_NE(last.find("\"scenarios\":" + std::to_string(scenarios) + ","), std::string::npos)
        << last;
}

// Random mode: a seeded plan of concurrent clients, cancels, disconnects, sessions, session
// deletes and faults.
TEST(ordo_fault, a_random_run_has_no_violations) {
    ORDO_REQUIRE_SHARED(stories);
#if defined(__SANITIZE_ADDRESS__)
    // ASan's allocator keeps freed memory in its quarantine: resident memory says nothing about
    // leaks there, so the memory bound is off (the sanitizers check memory instead).
    std::fprintf(stderr, "ASan build: the resident-memory bound of invariant 8 is not checked\n");
    const std::string memory = " --rss-growth-mib 0";
#else
    const std::string memory;
#endif
    // Seed 1 speculates by prompt lookup, seed 2 with a draft model (random_run.cpp).
    for (const char* run : {"--seed 1 --requests 1000", "--seed 2 --requests 300"}) {
        auto r = run_command(harness("--model '" + stories + "' " + run + " --json" + memory));
        EXPECT_EQ(r.exit_code, 0) << run << ": " << r.output;
        EXPECT_NE(r.output.find("\"violations\":0,"), std::string::npos) << r.output;
        EXPECT_NE(r.output.find("\"rss_end_bytes\":"), std::string::npos) << r.output;
        EXPECT_EQ(r.output.find("\"rss_start_bytes\":0,"), std::string::npos)
            << "no memory baseline: " << r.output;
    }
}

TEST(ordo_fault, bad_command_lines_exit_2) {
    EXPECT_EQ(run_command(harness("--scenarios nope --model x")).exit_code, 2);
    EXPECT_EQ(run_command(harness("--model /nonexistent.gguf")).exit_code, 2);
    EXPECT_EQ(run_command(harness("--seed abc")).exit_code, 2);
    EXPECT_EQ(run_command(harness("--bogus")).exit_code, 2);
    EXPECT_EQ(run_command(harness("--requests 0 --model x")).exit_code, 2);
    EXPECT_EQ(run_command(harness("--rss-growth-mib lots --model x")).exit_code, 2);
}

}  // namespace
