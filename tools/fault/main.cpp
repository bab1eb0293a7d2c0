// ordo-fault: the fault harness (issue 15). Starts real ordo-server processes, injects faults
// through the `fault` op (the path a real fault takes), kills and restarts servers, corrupts
// their KV files, and checks invariants on the history of every request:
//   1. exactly one terminal event per request whose connection stayed open;
//   2. every request ends within a bound (no hang);
//   3. the server keeps serving after every fault (health back to ok);
//   4. after recovery, a temperature-0 request returns exactly what a fault-free server returns;
//   5. a compute failure is never reported as `cancelled` or `done` (a `done` after a fault
//      must carry the fault-free tokens);
//   6. failure, retry and rebuild counters stay within what the faults armed explain;
//   7. no corrupt or foreign KV file is ever loaded;
//   8. when idle: 0 active sequences, 0 queued, 0 used KV blocks, 0 pins, 0 logits slots held;
//      after a random run, resident memory back near its post-warm-up baseline.
//
// usage: ordo-fault --model GGUF [--server BIN] [--scenarios all|NAME,...] [--list] [--json]
//                   [--seed N] [--work-dir DIR] [--verbose]
//        ordo-fault --model GGUF --seed S --requests N [--rss-growth-mib N] [--json]
//        (random mode: random_run.hpp)
// Exit status: 0 no violation, 1 violations, 2 usage. With --json the last line of standard
// output is one JSON object: scenarios, requests, faults (by kind), violations, seconds (random
// mode also rss_start_bytes, rss_end_bytes, rss_peak_bytes).
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "tools/fault/random_run.hpp"
#include "tools/fault/scenarios.hpp"

namespace {

namespace fs = std::filesystem;
using namespace ordo::fault;

constexpr int exit_ok = 0, exit_violations = 1, exit_usage = 2;

const char* usage_text =
    "usage: ordo-fault --model GGUF [--server BIN] [--scenarios all|NAME,...] [--list] [--json]\n"
    "                  [--seed N] [--work-dir DIR] [--verbose]\n"
    "       ordo-fault --model GGUF --seed S --requests N [--rss-growth-mib N] [--json]\n"
    "  --model GGUF       the model every server serves (e.g. ../shared/models/stories260K.gguf)\n"
    "  --server BIN       ordo-server binary (default: ../server/ordo-server beside this one)\n"
    "  --scenarios LIST   comma-separated scenario names, or all (default all)\n"
    "  --list             print the scenario names and exit\n"
    "  --json             last line of output: one JSON object with the totals\n"
    "  --seed N           seed of prompts, corruptions and the random plan (default 1)\n"
    "  --requests N       random mode: N generate requests from 4 clients with cancels,\n"
    "                     disconnects, sessions, session deletes and random faults; the\n"
    "                     same seed replays the same plan; a failure prints the smallest plan\n"
    "                     that still fails\n"
    "  --rss-growth-mib N random mode: resident memory may end at most N MiB above its\n"
    "                     post-warm-up baseline (default 64; 0 = not checked)\n"
    "  --work-dir DIR     configs and KV dirs (default: a new directory under /tmp, removed\n"
    "                     after a run without violations)\n"
    "exit: 0 no violation, 1 violations, 2 usage\n";

std::vector<std::string> split(const std::string& s) {
    std::vector<std::string> out;
    size_t start = 0;
    while (start <= s.size()) {
        size_t comma = s.find(',', start);
        if (comma == std::string::npos) comma = s.size();
        if (comma > start) out.push_back(s.substr(start, comma - start));
        start = comma + 1;
    }
    return out;
}

std::string json_escape(const std::string& s) {
    std::string o;
    for (char c : s) {
        if (c == '"' || c == '\\') o += '\\';
        if (static_cast<unsigned char>(c) < 0x20) {
            char b[8];
            std::snprintf(b, sizeof b, "\\u%04x", c);
            o += b;
            continue;
        }
        o += c;
    }
    return o;
}

}  // namespace

int main(int argc, char** argv) {
    context ctx;
    std::vector<std::string> names{"all"};
    bool json = false, list = false, own_dir = true;
    uint32_t random_requests = 0;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto value = [&]() -> const char* {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "ordo-fault: %s needs a value\n%s", a.c_str(), usage_text);
                std::exit(exit_usage);
            }
            return argv[++i];
        };
        if (a == "--model") {
            ctx.model = value();
        } else if (a == "--server") {
            ctx.server_bin = value();
        } else if (a == "--scenarios") {
            names = split(value());
        } else if (a == "--seed") {
            char* end = nullptr;
            const char* v = value();
            ctx.seed = std::strtoull(v, &end, 10);
            if (end == v || *end != '\0') {
                std::fprintf(stderr, "ordo-fault: --seed must be an unsigned integer\n");
                return exit_usage;
            }
        } else if (a == "--requests") {
            char* end = nullptr;
            const char* v = value();
            unsigned long long n = std::strtoull(v, &end, 10);
            if (end == v || *end != '\0' || n == 0 || n > random_requests_max) {
                std::fprintf(stderr, "ordo-fault: --requests must be 1..%u\n", random_requests_max);
                return exit_usage;
            }
            random_requests = uint32_t(n);
        } else if (a == "--rss-growth-mib") {
            char* end = nullptr;
            const char* v = value();
            unsigned long long n = std::strtoull(v, &end, 10);
            if (end == v || *end != '\0' || n > rss_growth_mib_max) {
                std::fprintf(stderr, "ordo-fault: --rss-growth-mib must be 0..%u\n",
                             rss_growth_mib_max);
                return exit_usage;
            }
            ctx.rss_growth_max = uint64_t(n) << 20;
        } else if (a == "--work-dir") {
            ctx.work_dir = value();
            own_dir = false;
        } else if (a == "--json") {
            json = true;
        } else if (a == "--list") {
            list = true;
        } else if (a == "--verbose") {
            ctx.verbose = true;
        } else if (a == "--help" || a == "-h") {
            std::fputs(usage_text, stdout);
            return exit_ok;
        } else {
            std::fprintf(stderr, "ordo-fault: unknown argument '%s'\n%s", a.c_str(), usage_text);
            return exit_usage;
        }
    }
    const auto known = scenario_names();
    if (list) {
        for (const auto& n : known) std::printf("%s\n", n.c_str());
        return exit_ok;
    }
    for (const auto& n : names) {
        if (n != "all" && std::find(known.begin(), known.end(), n) == known.end()) {
            std::fprintf(stderr, "ordo-fault: unknown scenario '%s' (--list names them)\n",
                         n.c_str());
            return exit_usage;
        }
    }
    if (ctx.model.empty() || !fs::exists(ctx.model)) {
        std::fprintf(stderr, "ordo-fault: --model must name an existing GGUF file\n%s", usage_text);
        return exit_usage;
    }
    if (ctx.server_bin.empty()) {
        ctx.server_bin =
            (fs::path(argv[0]).parent_path() / ".." / "server" / "ordo-server").lexically_normal();
    }
    if (!fs::exists(ctx.server_bin)) {
        std::fprintf(stderr, "ordo-fault: no ordo-server at %s (--server)\n",
                     ctx.server_bin.c_str());
        return exit_usage;
    }
    if (own_dir) {
        std::string tmpl = (fs::temp_directory_path() / "ordo-fault-XXXXXX").string();
        if (::mkdtemp(tmpl.data()) == nullptr) {
            std::perror("ordo-fault: mkdtemp");
            return exit_usage;
        }
        ctx.work_dir = tmpl;
    } else {
        fs::create_directories(ctx.work_dir);
    }

    const auto t0 = std::chrono::steady_clock::now();
    std::vector<scenario_result> results;
    std::array<uint64_t, 3> rss{};  // random mode: start, end, peak
    if (random_requests > 0) {
        random_result rr = run_random(ctx, ctx.seed, random_requests);
        results.push_back({"random/seed" + std::to_string(ctx.seed), rr.found, rr.seconds});
        rss = {rr.found.rss_start, rr.found.rss_end, rr.found.rss_peak};
        std::printf(
            "resident memory: %.1f MiB after warm-up, %.1f MiB at the end (idle), "
            "%.1f MiB peak\n",
            double(rss[0]) / (1 << 20), double(rss[1]) / (1 << 20), double(rss[2]) / (1 << 20));
        if (!rr.minimal.actions.empty()) {
            std::printf("smallest failing plan (seed %llu, %zu actions):\n",
                        static_cast<unsigned long long>(ctx.seed), rr.minimal.actions.size());
            for (const auto& a : rr.minimal.actions) std::printf("    %s\n", a.describe().c_str());
        }
    } else {
        results = run_scenarios(ctx, names);
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    size_t violations = 0;
    uint64_t requests = 0;
    std::map<std::string, uint64_t> faults;
    std::vector<std::string> failed;
    for (const auto& r : results) {
        const bool ok = r.found.violations.empty();
        std::printf("%-44s %s  %.1f s\n", r.name.c_str(), ok ? "ok  " : "FAIL", r.seconds);
        for (const auto& v : r.found.violations) std::printf("    violation: %s\n", v.c_str());
        violations += r.found.violations.size();
        requests += r.found.requests;
        for (const auto& [k, n] : r.found.faults) faults[k] += n;
        if (!ok) failed.push_back(r.name);
    }
    std::printf("%zu scenarios, %llu requests, %zu violations, %.1f s (seed %llu)\n",
                results.size(), static_cast<unsigned long long>(requests), violations, seconds,
                static_cast<unsigned long long>(ctx.seed));
    if (json) {
        std::string f = "{";
        for (const auto& [k, n] : faults) {
            f += (f.size() > 1 ? "," : "") + std::string("\"") + json_escape(k) +
                 "\":" + std::to_string(n);
        }
        f += "}";
        std::string fl = "[";
        for (const auto& n : failed)
            fl += (fl.size() > 1 ? "," : "") + ("\"" + json_escape(n) + "\"");
        fl += "]";
        std::string mem;
        if (random_requests > 0) {
            mem = ",\"rss_start_bytes\":" + std::to_string(rss[0]) +
                  ",\"rss_end_bytes\":" + std::to_string(rss[1]) +
                  ",\"rss_peak_bytes\":" + std::to_string(rss[2]);
        }
        std::printf(
            "{\"scenarios\":%zu,\"requests\":%llu,\"faults\":%s,\"violations\":%zu,"
            "\"failed\":%s,\"seconds\":%.1f,\"seed\":%llu%s}\n",
            results.size(), static_cast<unsigned long long>(requests), f.c_str(), violations,
            fl.c_str(), seconds, static_cast<unsigned long long>(ctx.seed), mem.c_str());
    }
    if (violations == 0 && own_dir) fs::remove_all(ctx.work_dir);
    if (violations != 0) std::printf("work dir kept: %s\n", ctx.work_dir.c_str());
    return violations == 0 ? exit_ok : exit_violations;
}
