// random_run.hpp: ordo-fault's random mode (--seed S --requests N). A seeded plan of actions —
// concurrent clients sending generate requests (streaming or not, shared prompt prefixes,
// sessions), session deletes, cancels, disconnects and random faults (gpu kinds, step delays,
// mailbox refusals, kv write/read faults and stalled reads and unlinks, and net kinds that drop
// or stall a client's connection at a request phase) — runs against one real server; the same
// seed builds the same plan. The invariants are checked on every request whose connection
// stayed open; a request whose connection the server dropped (a net fault) may end unseen. A
// failing plan is shrunk (faults removed, then whole clients) to the smallest plan that still
// fails, which is printed with the seed.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "tools/fault/harness.hpp"

namespace ordo::fault {

inline constexpr uint32_t random_clients = 4;
inline constexpr uint32_t random_requests_max = 1000000;
inline constexpr uint32_t shrink_runs_max = 24;              // reruns while shrinking, at most
inline constexpr std::chrono::seconds shrink_time_max{300};  // and time spent shrinking
inline constexpr uint32_t recovery_max_limit = 100;          // gpu.recovery_max's upper bound
// How far the idle server's resident memory may end above its post-warm-up baseline, at most
// (--rss-growth-mib; context::rss_growth_max, default 64 MiB). Device rebuilds reallocate the
// device's memory (host memory on lavapipe) and the allocator keeps some of what it freed, so
// the bound is not 0; a leak per request grows past it in a soak.
inline constexpr uint32_t rss_growth_mib_max = 1u << 20;

struct action {
    enum class kind { generate, cancel, disconnect, fault, session_delete } k = kind::generate;
    uint32_t client = 0;
    uint32_t prompt = 0;  // index into the prompt set
    bool stream = true;
    std::string session;  // generate: non-empty for a session request; session_delete: whose
    std::string fault_kind, phase;
    uint32_t ms = 0;        // net_stop_reading: the pause; step_delay, the kv stalls: the delay
    std::string actor;      // mailbox_refuse: whose mailbox
    uint32_t count = 1;     // mailbox_refuse: how many pushes
    uint32_t pause_ms = 0;  // before the action
    std::string describe() const;
};

struct plan {
    uint64_t seed = 0;
    std::vector<action> actions;
};

plan make_plan(uint64_t seed, uint32_t requests);

struct random_result {
    findings found;
    plan minimal;  // the smallest failing plan (empty when none failed)
    double seconds = 0;
};

random_result run_random(const context& ctx, uint64_t seed, uint32_t requests);

}  // namespace ordo::fault
