// scenarios.cpp: see scenarios.hpp.
//
// Every scenario compares what a request returns with what a fault-free server returns for the
// same prompt (temperature 0; the kernels are batch-invariant, so the output of a request does
// not depend on what ran beside it or on retries): a `done` after a fault is only honest if its
// tokens are the fault-free ones (invariants 4 and 5).
#include "tools/fault/scenarios.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

namespace ordo::fault {
namespace {

namespace fs = std::filesystem;
using clock = std::chrono::steady_clock;

// A fault that did not fire stays armed: fire it with probe requests (each must still return
// the fault-free output), so the next scenario starts clean. Returns the failures seen.
uint64_t drain_fault(server& s, findings& f, const references& r, uint64_t failures_before,
                     uint64_t expected) {
    for (int probe = 0; probe < 4; probe++) {
        auto st = s.call("stats");
        if (!st) break;
        uint64_t failures = stat(*st, "scheduler", "failures") - failures_before;
        if (failures >= expected) return failures;
        s.wait_ready();
        expect_reference(f, s.generate(r.prompts[0]), r.want[0], "probe after the fault");
    }
    f.fail("the armed fault never fired");
    return 0;
}

// The server keeps serving (invariant 3) and returns fault-free output (invariant 4).
void expect_serving(server& s, findings& f, const references& r) {
    if (!s.wait_ready()) return;
    expect_reference(f, s.generate(r.prompts[1]), r.want[1], "request after recovery");
}

// ---- the table: kind x phase x batch x cancel -----------------------------------------------

struct table_case {
    std::string kind, phase;
    size_t batch = 1;
    // What happens to request 0 while its (failing) step runs: nothing, a cancel, or its client
    // disconnects (RST).
    enum class race { none, cancel, disconnect } timing = race::none;
    std::string name() const {
        return "table/" + kind + "/" + phase + "/batch" + std::to_string(batch) +
               (timing == race::cancel       ? "/cancel"
                : timing == race::disconnect ? "/disconnect"
                                             : "/nocancel");
    }
};

std::vector<table_case> table_cases() {
    std::vector<table_case> out;
    for (const char* kind : {"device_lost", "hang", "nan_logits"}) {
        for (const char* phase : {"prefill", "decode"}) {
            for (size_t batch : {1u, 3u}) {
                for (auto t : {table_case::race::none, table_case::race::cancel,
                               table_case::race::disconnect}) {
                    out.push_back({kind, phase, batch, t});
                }
            }
        }
    }
    return out;
}

void run_table_case(server& s, findings& f, const references& r, const table_case& c) {
    auto before = s.call("stats");
    if (!before) return f.fail("stats unavailable");
    const uint64_t failures0 = stat(*before, "scheduler", "failures");
    const uint64_t retries0 = stat(*before, "scheduler", "retries");
    const uint64_t epoch0 = stat(*before, "gpu", "epoch");
    if (!s.arm(c.kind, c.phase, 1)) return;
    const bool cancel = c.timing == table_case::race::cancel;
    const bool disconnect = c.timing == table_case::race::disconnect;
    std::vector<uint64_t> ids;
    // Disconnect: request 0 runs on a client of its own, which resets its connection.
    test::tcp_client own;
    if (disconnect) {
        if (!own.connect(s.port())) return f.fail("cannot connect a second client");
        if (!own.send(test::frame("id", 1, "op", "generate", "tokens", r.prompts[0], "max_tokens",
                                  max_tokens, "temperature", 0, "stream", true))) {
            return f.fail("send failed");
        }
        f.requests++;
        ids.push_back(0);  // a placeholder: nothing is collected for it
    }
    for (size_t i = ids.size(); i < c.batch; i++) ids.push_back(s.send_generate(r.prompts[i]));
    std::map<uint64_t, history> hs;
    if (cancel) {
        // Prefill: the cancel races the first (failing) step. Decode: it is sent as the first
        // token arrives, racing the first decode step, which fails.
        if (c.phase == "decode") s.wait_first_event(ids[0]);
        ids.push_back(s.send_cancel(ids[0]));
    }
    if (disconnect) {
        // The same timings, by a reset instead of a cancel: its requests end unseen.
        if (c.phase == "decode" && !test::next(own)) f.fail("no first token before the disconnect");
        own.reset();
        ids.erase(ids.begin());
    }
    hs = s.collect(ids);
    for (size_t i = disconnect ? 1 : 0; i < c.batch; i++) {
        const history& h = hs[ids[disconnect ? i - 1 : i]];
        const std::string what = "request " + std::to_string(i);
        if (cancel && i == 0) {
            const event* t = h.terminal();
            if (t == nullptr) continue;
            const std::string o = t->outcome();
            // Cancelled, or the failure of a step it was in (never masked as a cancel, F2), or
            // it finished before the cancel arrived.
            bool ok = o == "done:cancelled" || t->str("code") == "gpu_failed" ||
                      (t->str("event") == "done" && h.tokens() == r.want[i]);
            if (!ok) f.fail(what + " (cancelled): ended " + o);
            continue;
        }
        expect_reference(f, h, r.want[i], what);
    }
    const uint64_t failures = drain_fault(s, f, r, failures0, 1);
    expect_serving(s, f, r);
    auto after = s.call("stats");
    if (!after) return f.fail("stats unavailable");
    // Invariant 6: one armed fault is one failed step, its retries bounded by the batch, at
    // most one rebuild.
    if (failures != 1) f.fail("failed steps: " + std::to_string(failures) + ", armed 1");
    const uint64_t retries = stat(*after, "scheduler", "retries") - retries0;
    if (retries > c.batch) {
        f.fail("retries: " + std::to_string(retries) + " for a batch of " +
               std::to_string(c.batch) + " (invariant 6)");
    }
    const uint64_t rebuilds = stat(*after, "gpu", "epoch") - epoch0;
    const uint64_t rebuilds_expected = c.kind == "nan_logits" ? 0 : 1;
    if (rebuilds != rebuilds_expected) {
        f.fail("device rebuilds: " + std::to_string(rebuilds) + ", expected " +
               std::to_string(rebuilds_expected) + " (invariant 6)");
    }
    s.check_idle();
}

// ---- the field failures ---------------------------------------------------------------------

// F1: a compute failure, then a different prompt on the same session: no stale positions.
void f1(const context& ctx, findings& f, const references& r) {
    server_config cfg;
    cfg.retry_max = 0;
    cfg.kv_dir = ctx.work_dir + "/f1-kv";
    server s(ctx, f);
    if (!s.start(cfg, "f1")) return;
    if (!s.arm("nan_logits", "decode", 1)) return;
    history a = s.generate(r.prompts[0], "f1");
    const event* t = a.terminal();
    if (t == nullptr || t->str("code") != "gpu_failed") {
        f.fail("F1: the failed request ended " + (t ? t->outcome() : "never") +
               ", expected error gpu_failed");
    }
    expect_reference(f, s.generate(r.prompts[2], "f1"), r.want[2],
                     "F1: another prompt, same session");
    expect_reference(f, s.generate(r.prompts[0], "f1"), r.want[0], "F1: the first prompt again");
    s.check_idle();
    s.stop();
}

// F2: a cancel arriving while a failing step runs ends the request gpu_failed, not cancelled.
// The step is held by a step_delay and then fails (nan_logits); the cancel lands in between.
void f2(const context& ctx, findings& f, const references& r) {
    server_config cfg;
    cfg.retry_max = 0;
    server s(ctx, f);
    if (!s.start(cfg, "f2")) return;
    if (!s.arm_delay(1500, "decode") || !s.arm("nan_logits", "decode", 1)) return;
    uint64_t id = s.send_generate(r.prompts[0]);
    // The first token comes from the prefill; the first decode step is then delayed 1.5 s
    // before it runs and fails: the cancel is sent during the delay.
    if (!s.wait_first_event(id)) f.fail("F2: no first token");
    uint64_t c = s.send_cancel(id);
    auto hs = s.collect({id, c});
    const event* t = hs[id].terminal();
    if (t != nullptr && t->str("code") != "gpu_failed") {
        f.fail("F2: a request whose step failed while its cancel was pending ended " +
               t->outcome() + ", expected error gpu_failed");
    }
    expect_serving(s, f, r);
    s.check_idle();
    s.stop();
}

// F4: three or more heterogeneous sequences and a fault in the batched step: the batch is
// retried (bisected or sequentially, by config) and every request finishes correctly.
void f4(const context& ctx, findings& f, const references& r, const std::string& policy) {
    server_config cfg;
    cfg.batch_failure_policy = policy;
    server s(ctx, f);
    if (!s.start(cfg, "f4-" + policy)) return;
    if (!s.arm("nan_logits", "decode", 1, 1)) return;
    std::vector<uint64_t> ids;
    for (size_t i = 0; i < r.prompts.size(); i++) ids.push_back(s.send_generate(r.prompts[i]));
    auto hs = s.collect(ids);
    for (size_t i = 0; i < ids.size(); i++) {
        expect_reference(f, hs[ids[i]], r.want[i],
                         "F4 (" + policy + ") request " + std::to_string(i));
    }
    auto st = s.call("stats");
    if (st && stat(*st, "scheduler", "failures") != 1) {
        f.fail("F4: failed steps " + std::to_string(stat(*st, "scheduler", "failures")) +
               ", armed 1");
    }
    s.check_idle();
    s.stop();
}

// F5: a hang past the watchdog: timeout, rebuild, health back to ok, the queue resumes.
void f5(const context& ctx, findings& f, const references& r) {
    server_config cfg;
    cfg.watchdog_ms = 1500;
    server s(ctx, f);
    if (!s.start(cfg, "f5")) return;
    if (!s.arm("hang", "prefill", 1)) return;
    std::vector<uint64_t> ids;
    for (size_t i = 0; i < 3; i++) ids.push_back(s.send_generate(r.prompts[i]));
    auto hs = s.collect(ids);
    for (size_t i = 0; i < ids.size(); i++) {
        expect_reference(f, hs[ids[i]], r.want[i], "F5 request " + std::to_string(i));
    }
    expect_serving(s, f, r);
    auto st = s.call("stats");
    if (st) {
        if (stat(*st, "gpu", "timeouts") != 1) {
            f.fail("F5: gpu timeouts " + std::to_string(stat(*st, "gpu", "timeouts")) +
                   ", expected 1");
        }
        if (stat(*st, "gpu", "epoch") != 1) {
            f.fail("F5: device epoch " + std::to_string(stat(*st, "gpu", "epoch")) +
                   ", expected 1 (one rebuild)");
        }
    }
    s.check_idle();
    s.stop();
}

// F7: kill -9 with a persisted cache, corrupted files, restart: nothing bad is loaded, no retry
// loop, counters bounded, output correct.
void f7(const context& ctx, findings& f, const references& r) {
    server_config cfg;
    cfg.kv_dir = ctx.work_dir + "/f7-kv";
    server s(ctx, f);
    if (!s.start(cfg, "f7")) return;
    for (size_t i = 0; i < r.prompts.size(); i++) {
        expect_reference(f, s.generate(r.prompts[i]), r.want[i], "F7 first run");
    }
    // Saves are written after each request's end; wait for them, then crash.
    const auto end = clock::now() + std::chrono::seconds(20);
    while (clock::now() < end) {
        auto st = s.call("stats");
        if (st && stat(*st, "kv_disk", "saves") >= 3) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    s.kill9();
    // Corrupt every file: one bit flipped at a seeded offset.
    std::mt19937_64 rng(ctx.seed);
    size_t corrupted = 0;
    for (const auto& e : fs::directory_iterator(cfg.kv_dir)) {
        if (!e.is_regular_file() || e.path().extension() != ".kv") continue;
        std::fstream io(e.path(), std::ios::in | std::ios::out | std::ios::binary);
        const auto size = fs::file_size(e.path());
        const uint64_t at = std::uniform_int_distribution<uint64_t>(0, size - 1)(rng);
        io.seekg(std::streamoff(at));
        char b = 0;
        io.read(&b, 1);
        b = char(b ^ (1 << (at % 8)));
        io.seekp(std::streamoff(at));
        io.write(&b, 1);
        corrupted++;
    }
    if (corrupted == 0) f.fail("F7: no KV file was persisted before the kill");
    std::ofstream(cfg.kv_dir + "/p-00000000000000000000000000000000.kv") << "not a kv file";
    if (!s.start(cfg, "f7")) return;
    for (size_t i = 0; i < r.prompts.size(); i++) {
        expect_reference(f, s.generate(r.prompts[i]), r.want[i], "F7 after restart");
    }
    auto st = s.call("stats");
    if (st) {
        // Invariant 7: every corrupt or foreign file quarantined, none restored.
        const uint64_t quarantined = stat(*st, "kv_disk", "quarantined");
        const uint64_t restores = stat(*st, "kv_disk", "restores");
        if (quarantined != corrupted + 1) {
            f.fail("F7: " + std::to_string(quarantined) + " files quarantined, expected " +
                   std::to_string(corrupted + 1) + " (invariant 7)");
        }
        if (restores != 0) f.fail("F7: " + std::to_string(restores) + " corrupt files restored");
        if (stat(*st, "scheduler", "failures") != 0) f.fail("F7: failed steps after restart");
        if (stat(*st, "kv_disk", "restore_failures") > corrupted) {
            f.fail("F7: restore failures beyond one per file (invariant 6)");
        }
    }
    s.check_idle();
    s.stop();
}

// ---- kv fault points (the kv actor's real write and read paths) --------------------------

std::string health_reason(server& s) {
    auto h = s.call("health");
    return h ? h->str("status") + ": " + h->str("reason") : "no answer";
}

// A save that fails part-way with a disk error: persistence off with a reason, serving goes on.
void kv_disk_error(const context& ctx, findings& f, const references& r, const std::string& kind,
                   const std::string& code) {
    server_config cfg;
    cfg.kv_dir = ctx.work_dir + "/" + kind;
    server s(ctx, f);
    if (!s.start(cfg, kind) || !s.arm_kv(kind)) return;
    expect_reference(f, s.generate(r.prompts[0]), r.want[0],
                     kind + ": the request whose save fails");
    const auto end = clock::now() + std::chrono::seconds(10);
    std::string reason;
    while (clock::now() < end) {
        reason = health_reason(s);
        if (reason.find(code) != std::string::npos) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (reason.rfind("ok: ", 0) != 0 || reason.find(code) == std::string::npos) {
        f.fail(kind + ": health is '" + reason + "', expected ok with a reason naming " + code);
    }
    expect_reference(f, s.generate(r.prompts[2]), r.want[2], kind + ": serving goes on");
    s.check_idle();
    s.stop();
}

// A bit flipped on read: the restore fails verification, the file is quarantined, the request
// recomputes with fault-free output.
void kv_flip_read(const context& ctx, findings& f, const references& r) {
    server_config cfg;
    cfg.kv_dir = ctx.work_dir + "/kv_flip_read";
    server s(ctx, f);
    if (!s.start(cfg, "kv_flip_read")) return;
    expect_reference(f, s.generate(r.prompts[0]), r.want[0], "kv_flip_read: first run");
    s.stop();
    if (!s.start(cfg, "kv_flip_read") || !s.arm_kv("kv_flip_read")) return;
    expect_reference(f, s.generate(r.prompts[0]), r.want[0], "kv_flip_read: the corrupt restore");
    auto st = s.call("stats");
    if (st && (stat(*st, "kv_disk", "restore_failures") != 1 ||
               stat(*st, "kv_disk", "quarantined") != 1 || stat(*st, "kv_disk", "restores") != 0)) {
        f.fail("kv_flip_read: restore_failures " +
               std::to_string(stat(*st, "kv_disk", "restore_failures")) + ", quarantined " +
               std::to_string(stat(*st, "kv_disk", "quarantined")) + ", restores " +
               std::to_string(stat(*st, "kv_disk", "restores")) +
               "; expected 1, 1, 0 (invariant 7)");
    }
    s.check_idle();
    s.stop();
}

// A restore whose read does not come back in time (a slow or hung disk holding the read's
// thread): the request stops waiting after restore_wait_ms and recomputes with fault-free
// output, the scheduler counts one timeout and no restore applied, and the restore that ends
// later only releases its blocks (idle after: no pin, no block used).
void kv_stall_read(const context& ctx, findings& f, const references& r) {
    server_config cfg;
    cfg.kv_dir = ctx.work_dir + "/kv_stall_read";
    cfg.restore_wait_ms = 200;
    constexpr uint32_t stall_ms = 5000;  // 25 times the wait: the wait always ends first
    server s(ctx, f);
    if (!s.start(cfg, "kv_stall_read")) return;
    expect_reference(f, s.generate(r.prompts[0]), r.want[0], "kv_stall_read: first run");
    s.stop();
    if (!s.start(cfg, "kv_stall_read") || !s.arm_kv_stall("kv_stall_read", stall_ms)) return;
    expect_reference(f, s.generate(r.prompts[0]), r.want[0], "kv_stall_read: the stalled restore");
    auto st = s.call("stats");
    if (st && (stat(*st, "scheduler", "disk_restore_timeouts") != 1 ||
               stat(*st, "scheduler", "disk_restores") != 0 ||
               stat(*st, "scheduler", "disk_hits") != 1)) {
        f.fail("kv_stall_read: disk_restore_timeouts " +
               std::to_string(stat(*st, "scheduler", "disk_restore_timeouts")) +
               ", disk_restores " + std::to_string(stat(*st, "scheduler", "disk_restores")) +
               ", disk_hits " + std::to_string(stat(*st, "scheduler", "disk_hits")) +
               "; expected 1, 0, 1");
    }
    s.check_idle();  // the stalled read ends, its restore answers and the pin is dropped
    expect_reference(f, s.generate(r.prompts[2]), r.want[2], "kv_stall_read: serving goes on");
    s.check_idle();
    s.stop();
}

// A session_delete whose unlink the disk holds (a slow or hung disk): the client is answered
// kv_io after restore_wait_ms, exactly once (the late answer is dropped), serving goes on with
// fault-free output, the held unlink still removes the file, and the scheduler counts one
// timeout and one late answer.
void kv_stall_unlink(const context& ctx, findings& f, const references& r) {
    server_config cfg;
    cfg.kv_dir = ctx.work_dir + "/kv_stall_unlink";
    cfg.restore_wait_ms = 200;
    constexpr uint32_t stall_ms = 5000;  // 25 times the wait: the wait always ends first
    server s(ctx, f);
    if (!s.start(cfg, "kv_stall_unlink")) return;
    expect_reference(f, s.generate(r.prompts[0], "chat"), r.want[0], "kv_stall_unlink: turn 1");
    s.stop();  // the session's save is flushed; the restart's scan indexes it
    if (!s.start(cfg, "kv_stall_unlink") || !s.arm_kv_stall("kv_stall_unlink", stall_ms)) return;
    const uint64_t del = s.send_session_delete("chat");
    auto h = s.collect({del});
    const event* t = h[del].terminal();
    if (t == nullptr || t->str("code") != "kv_io") {
        f.fail("kv_stall_unlink: the held session_delete ended " +
               (t == nullptr ? std::string("with no event") : t->outcome()) + ", not kv_io");
    }
    expect_reference(f, s.generate(r.prompts[2]), r.want[2], "kv_stall_unlink: serving goes on");
    // The held unlink ends (stall_ms): then the late answer is dropped, and nothing more comes.
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(4 * stall_ms);
    uint64_t late = 0;
    while (std::chrono::steady_clock::now() < end) {
        auto st = s.call("stats");
        late = st ? stat(*st, "scheduler", "session_delete_late_answers") : 0;
        if (late != 0) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    auto st = s.call("stats");
    if (!st || late != 1 || stat(*st, "scheduler", "session_delete_timeouts") != 1 ||
        stat(*st, "kv_disk", "sessions") != 0) {
        f.fail("kv_stall_unlink: late answers " + std::to_string(late) + ", timeouts " +
               std::to_string(st ? stat(*st, "scheduler", "session_delete_timeouts") : 0) +
               ", sessions " + std::to_string(st ? stat(*st, "kv_disk", "sessions") : 0) +
               "; expected 1, 1, 0");
    }
    expect_reference(f, s.generate(r.prompts[1]), r.want[1], "kv_stall_unlink: after it");
    if (s.events_after_collect(del) != 0) {
        f.fail("kv_stall_unlink: the session_delete got a second terminal event (invariant 1)");
    }
    s.check_idle();
    s.stop();
}

// A file written with another model's fingerprint is never loaded, after a restart either.
void kv_fingerprint(const context& ctx, findings& f, const references& r) {
    server_config cfg;
    cfg.kv_dir = ctx.work_dir + "/kv_fingerprint";
    server s(ctx, f);
    if (!s.start(cfg, "kv_fingerprint") || !s.arm_kv("kv_fingerprint")) return;
    expect_reference(f, s.generate(r.prompts[0]), r.want[0], "kv_fingerprint: first run");
    s.stop();
    if (!s.start(cfg, "kv_fingerprint")) return;
    expect_reference(f, s.generate(r.prompts[0]), r.want[0], "kv_fingerprint: after restart");
    auto st = s.call("stats");
    if (st && (stat(*st, "kv_disk", "restores") != 0 || stat(*st, "kv_disk", "quarantined") != 1)) {
        f.fail("kv_fingerprint: restores " + std::to_string(stat(*st, "kv_disk", "restores")) +
               ", quarantined " + std::to_string(stat(*st, "kv_disk", "quarantined")) +
               "; expected 0, 1 (invariant 7)");
    }
    s.check_idle();
    s.stop();
}

// A crash mid-save (the process exits while its .tmp is half written): the restart loads nothing
// torn and serves fault-free output.
void kv_torn_exit(const context& ctx, findings& f, const references& r) {
    server_config cfg;
    cfg.kv_dir = ctx.work_dir + "/kv_torn_exit";
    server s(ctx, f);
    if (!s.start(cfg, "kv_torn_exit") || !s.arm_kv("kv_torn_exit")) return;
    // The request ends (its save starts after its done event) and the process exits during
    // the save; the connection dies with it, so nothing of the request is checked.
    s.send_generate(r.prompts[0]);
    const int rc = s.wait_exit();
    if (rc != 86) f.fail("kv_torn_exit: the server exited " + std::to_string(rc) + ", expected 86");
    if (!s.start(cfg, "kv_torn_exit")) return;
    for (const auto& e : fs::directory_iterator(cfg.kv_dir)) {
        if (e.path().extension() == ".tmp") f.fail("kv_torn_exit: a .tmp survived the scan");
    }
    expect_reference(f, s.generate(r.prompts[0]), r.want[0], "kv_torn_exit: after restart");
    s.check_idle();
    s.stop();
}

// ---- runtime fault points ------------------------------------------------------------------

// A cancel, or a disconnect, while a (slow) step runs: one terminal event for the cancel, and
// everything freed for the disconnect.
void delayed_step(const context& ctx, findings& f, const references& r, const std::string& phase,
                  bool disconnect) {
    server s(ctx, f);
    if (!s.start({}, "delay") || !s.arm_delay(1000, phase)) return;
    if (disconnect) {
        test::tcp_client c;
        if (!c.connect(s.port())) return f.fail("cannot connect a second client");
        if (!c.send(test::frame("id", 1, "op", "generate", "tokens", r.prompts[0], "max_tokens",
                                max_tokens, "temperature", 0, "stream", true))) {
            return f.fail("send failed");
        }
        if (phase == "decode" && !test::next(c)) f.fail("no first token before the disconnect");
        c.reset();
    } else {
        uint64_t id = s.send_generate(r.prompts[0]);
        if (phase == "decode") s.wait_first_event(id);
        uint64_t c = s.send_cancel(id);
        auto hs = s.collect({id, c});
        const event* t = hs[id].terminal();
        if (t != nullptr && t->outcome() != "done:cancelled" &&
            !(t->str("event") == "done" && hs[id].tokens() == r.want[0])) {
            f.fail("a request cancelled during a delayed step ended " + t->outcome());
        }
    }
    expect_serving(s, f, r);
    s.check_idle();
    s.stop();
}

// An actor's mailbox refuses its next messages: each sender's defined outcome, then normal
// service with fault-free output.
void refused_mailbox(const context& ctx, findings& f, const references& r,
                     const std::string& actor) {
    server_config cfg;
    if (actor == "kv") cfg.kv_dir = ctx.work_dir + "/refuse-kv";
    server s(ctx, f);
    if (!s.start(cfg, "refuse-" + actor)) return;
    const uint32_t count = actor == "net" ? 8 : actor == "kv" ? 4 : 1;
    if (!s.arm_refuse(actor, count)) return;
    if (actor == "scheduler") {
        // The net actor's outcome for a refused forward: overloaded at once.
        history h = s.generate(r.prompts[0]);
        const event* t = h.terminal();
        if (t != nullptr && t->str("code") != "overloaded") {
            f.fail("a generate refused by the scheduler's mailbox ended " + t->outcome() +
                   ", expected error overloaded");
        }
    } else {
        expect_reference(f, s.generate(r.prompts[0]), r.want[0],
                         "a generate while the " + actor + " mailbox refuses");
    }
    expect_serving(s, f, r);
    s.check_idle();
    s.stop();
}

// ---- net fault points ------------------------------------------------------------------------

// A client's connection dropped (net_fin: EOF, net_rst: reset) or not read for a while
// (net_stop_reading) when its request reaches `phase`. Dropped: the client sees its connection
// end within the bound (never a hang), no terminal event arrives after the drop, and the server
// frees the request (idle) and serves others. Paused: a cancel sent during the pause is read
// after it; the request still ends exactly once, cancelled or with its fault-free tokens.
void net_fault(const context& ctx, findings& f, const references& r, const std::string& kind,
               const std::string& phase) {
    server s(ctx, f);
    if (!s.start({}, "net")) return;
    auto before = s.call("stats");
    if (!before) return f.fail("stats unavailable");
    const bool pause = kind == "net_stop_reading";
    if (!s.arm_net(kind, phase, pause ? 1000 : 0)) return;
    test::tcp_client c;
    if (!c.connect(s.port())) return f.fail("cannot connect the client");
    if (!c.send(test::frame("id", 1, "op", "generate", "tokens", r.prompts[0], "max_tokens",
                            max_tokens, "temperature", 0, "stream", true))) {
        return f.fail("send failed");
    }
    f.requests++;
    history h;
    auto read = [&](std::chrono::milliseconds deadline) {
        while (auto e = test::next(c, deadline)) {
            if (e->u("id") == 1) h.events.push_back(*e);
            if (e->u("id") == 1 && e->terminal()) break;
        }
    };
    if (pause) {
        // Decode: the cancel goes out as the first token (from the prefill) arrives: by then
        // the first decode step is planned and the pause has fired. Otherwise at once. Events
        // are still written during a pause; the cancel is read after it.
        if (phase == "decode") {
            auto e = test::next(c, std::chrono::milliseconds(request_deadline));
            if (!e) return f.fail(kind + " at decode: no first token");
            h.events.push_back(*e);
        }
        if (!c.send(test::frame("id", 2, "op", "cancel", "target", 1))) f.fail("send failed");
        read(std::chrono::milliseconds(request_deadline));
        const event* t = h.terminal();
        if (h.terminals() != 1) {
            f.fail(kind + " at " + phase + ": " + std::to_string(h.terminals()) +
                   " terminal events (invariants 1 and 2)");
        } else if (t->outcome() != "done:cancelled" &&
                   !(t->str("event") == "done" && h.tokens() == r.want[0])) {
            f.fail(kind + " at " + phase + ": ended " + t->outcome() + " with tokens " +
                   show(h.tokens()));
        }
    } else {
        read(std::chrono::milliseconds(request_deadline));
        const std::string want = kind == "net_fin" ? "eof" : "reset";
        if (c.peer_closed().empty() &&
            !c.wait_closed(std::chrono::milliseconds(request_deadline))) {
            f.fail(kind + " at " + phase + ": the connection was not closed (invariant 2)");
        } else if (c.peer_closed() != want) {
            f.fail(kind + " at " + phase + ": the client saw " + c.peer_closed() + ", expected " +
                   want);
        }
        if (h.terminals() != 0) {
            f.fail(kind + " at " + phase + ": a terminal event (" + h.terminal()->outcome() +
                   ") before the drop: the request was not live at its phase");
        }
    }
    auto after = s.call("stats");
    if (after) {
        const uint64_t fired =
            stat(*after, "scheduler", "net_faults") - stat(*before, "scheduler", "net_faults");
        const uint64_t counted =
            pause ? stat(*after, "net", "fault_pauses") : stat(*after, "net", "fault_drops");
        if (fired != 1 || counted != 1) {
            f.fail(kind + " at " + phase + ": net_faults fired " + std::to_string(fired) +
                   ", net counter " + std::to_string(counted) + "; expected 1 and 1");
        }
    }
    s.check_idle();
    expect_serving(s, f, r);
    s.stop();
}

// ---- speculative decoding ----------------------------------------------------------------------

// A prompt that repeats itself, so prompt lookup drafts from its first decode on: a piece of a
// reference prompt three times over, the last time cut short.
std::vector<int32_t> repeating_prompt(const references& r) {
    const std::vector<int32_t>& p = r.prompts[0];
    std::vector<int32_t> piece(p.begin(), p.begin() + long(std::min<size_t>(p.size(), 12)));
    std::vector<int32_t> out;
    for (int i = 0; i < 2; i++) out.insert(out.end(), piece.begin(), piece.end());
    out.insert(out.end(), piece.begin(), piece.begin() + long(std::min<size_t>(piece.size(), 3)));
    return out;
}

// A drafter fault (draft_fail, draft_garbage, draft_eos) or a hang in a verification step (the
// watchdog's path: the step fails, the device is rebuilt, the sequence recomputes), on
// a server that speculates by prompt lookup, or (kinds draft_model_fail, draft_model_garbage)
// with a draft model, the served model drafting for itself (draft_fail then loses the draft
// model's device: its gpu actor rebuilds it): the request ends once, done, with exactly the
// tokens the same server returns with speculation off (the request's opt-out), and the fault
// is seen in the counters: a fallback for draft_fail, a verification for the others, a failed
// step for the hang.
void speculative_fault(const context& ctx, findings& f, const references& r,
                       const std::string& scenario) {
    server_config cfg;
    cfg.speculative = "ngram";
    std::string kind = scenario;
    if (kind.starts_with("draft_model_")) {
        cfg.speculative = "draft";
        cfg.draft_model = ctx.model;
        kind = "draft_" + kind.substr(std::string("draft_model_").size());
    }
    cfg.watchdog_ms = 1500;
    server s(ctx, f);
    if (!s.start(cfg, "spec")) return;
    const std::vector<int32_t> prompt = repeating_prompt(r);
    history plain = s.generate(prompt, "", false);
    const event* pt = plain.terminal();
    if (pt == nullptr || pt->str("event") != "done") {
        return f.fail(kind + ": the plain request ended " + (pt ? pt->outcome() : "never"));
    }
    auto before = s.call("stats");
    if (!before) return f.fail("stats unavailable");
    const bool hang = kind == "hang";
    // The hang: a random draft makes the first decode a verification whatever the model
    // writes, and that verification step hangs.
    if (!(hang ? s.arm("hang", "verify", 1) && s.arm_draft("draft_garbage", 1)
               : s.arm_draft(kind, 2))) {
        return;
    }
    history h = s.generate(prompt);
    if (h.terminals() != 1) {
        f.fail(kind + ": " + std::to_string(h.terminals()) + " terminal events (invariant 1)");
    }
    expect_reference(f, h, plain.tokens(), kind + ": speculative output against plain decoding");
    auto after = s.call("stats");
    if (after) {
        auto delta = [&](const std::string& group, const std::string& key) {
            return stat(*after, group, key) - stat(*before, group, key);
        };
        if (kind == "draft_fail" && delta("scheduler", "spec_fallbacks_drafter_error") != 1) {
            f.fail("draft_fail: no fallback counted (spec_fallbacks_drafter_error)");
        }
        if ((kind == "draft_garbage" || kind == "draft_eos") &&
            delta("scheduler", "spec_rounds") == 0) {
            f.fail(kind + ": no verification ran (spec_rounds)");
        }
        if (hang && delta("scheduler", "failures") == 0) {
            f.fail("hang at verify: no step failed: the fault never fired");
        }
    }
    expect_serving(s, f, r);
    s.check_idle();
    s.stop();
}

// ---- recovery exhausted ------------------------------------------------------------------------

// More device failures in a row than gpu.recovery_max allows: the configured outcome, not a
// rebuild loop. The request ends with an error (gpu_failed or gpu_unavailable; never done or
// cancelled), health says degraded with a reason, new work is refused at once with
// gpu_unavailable, the rebuilds stop at the bound, the server still answers health and stats,
// and it exits 0 on SIGTERM.
void recovery_exhausted(const context& ctx, findings& f, const references& r) {
    server_config cfg;
    cfg.recovery_max = 2;
    cfg.retry_max = 8;  // the request outlives the rebuilds; the bound that ends it is recovery
    server s(ctx, f);
    if (!s.start(cfg, "recovery")) return;
    if (!s.arm("device_lost", "", 8)) return;
    history h = s.generate(r.prompts[0]);
    const event* t = h.terminal();
    if (t == nullptr || t->str("event") != "error" ||
        (t->str("code") != "gpu_failed" && t->str("code") != "gpu_unavailable")) {
        f.fail("recovery: the request ended " + (t ? t->outcome() : "never") +
               ", expected error gpu_failed or gpu_unavailable (invariant 5)");
    }
    std::string status;
    const auto end = clock::now() + std::chrono::seconds(30);
    while (clock::now() < end) {
        auto hl = s.call("health");
        status = hl ? hl->str("status") : "no answer";
        if (status == "degraded") {
            if (hl->str("reason").find("recovery_max") == std::string::npos) {
                f.fail("recovery: degraded without naming recovery_max: " + hl->str("reason"));
            }
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (status != "degraded") f.fail("recovery: health is " + status + ", expected degraded");
    history again = s.generate(r.prompts[1]);
    const event* t2 = again.terminal();
    if (t2 == nullptr || t2->str("code") != "gpu_unavailable") {
        f.fail("recovery: a request after giving up ended " + (t2 ? t2->outcome() : "never") +
               ", expected error gpu_unavailable");
    }
    auto st = s.call("stats");
    if (!st) {
        f.fail("recovery: stats unanswered after giving up (invariant 3)");
    } else if (stat(*st, "gpu", "epoch") > cfg.recovery_max) {
        f.fail("recovery: " + std::to_string(stat(*st, "gpu", "epoch")) +
               " rebuilds for recovery_max " + std::to_string(cfg.recovery_max) + " (invariant 6)");
    }
    s.stop();
}

}  // namespace

std::vector<std::string> scenario_names() {
    std::vector<std::string> n{"F1",
                               "F2",
                               "F4-bisect",
                               "F4-sequential",
                               "F5",
                               "F7",
                               "kv/enospc",
                               "kv/eio",
                               "kv/flip_read",
                               "kv/stall_read",
                               "kv/stall_unlink",
                               "kv/fingerprint",
                               "kv/torn_exit",
                               "delay/prefill/cancel",
                               "delay/decode/cancel",
                               "delay/decode/disconnect",
                               "refuse/net",
                               "refuse/scheduler",
                               "refuse/gpu",
                               "refuse/kv",
                               "recovery/exhausted",
                               "spec/draft_fail",
                               "spec/draft_garbage",
                               "spec/draft_eos",
                               "spec/hang",
                               "spec/draft_model_fail",
                               "spec/draft_model_garbage"};
    for (const char* kind : {"fin", "rst", "stop_reading"}) {
        for (const char* phase : {"queued", "prefill", "decode"}) {
            n.push_back(std::string("net/") + kind + "/" + phase);
        }
    }
    for (const auto& c : table_cases()) n.push_back(c.name());
    return n;
}

std::vector<scenario_result> run_scenarios(const context& ctx,
                                           const std::vector<std::string>& names) {
    std::vector<std::string> want = names;
    if (want.size() == 1 && want[0] == "all") want = scenario_names();
    std::vector<scenario_result> out;
    findings setup;
    const references r = compute_references(ctx, setup);
    if (!setup.violations.empty() || r.want.size() != r.prompts.size()) {
        scenario_result bad{"setup", setup, 0};
        out.push_back(std::move(bad));
        return out;
    }
    auto timed = [&](const std::string& name, const std::function<void(findings&)>& fn) {
        auto t0 = clock::now();
        scenario_result res;
        res.name = name;
        fn(res.found);
        res.seconds = std::chrono::duration<double>(clock::now() - t0).count();
        out.push_back(std::move(res));
    };
    std::unique_ptr<server> table;  // one server for the whole table: it must keep serving
    findings table_start;
    for (const std::string& name : want) {
        if (name == "F1") timed(name, [&](findings& f) { f1(ctx, f, r); });
        if (name == "F2") timed(name, [&](findings& f) { f2(ctx, f, r); });
        if (name == "F4-bisect") timed(name, [&](findings& f) { f4(ctx, f, r, "bisect"); });
        if (name == "F4-sequential") timed(name, [&](findings& f) { f4(ctx, f, r, "sequential"); });
        if (name == "F5") timed(name, [&](findings& f) { f5(ctx, f, r); });
        if (name == "F7") timed(name, [&](findings& f) { f7(ctx, f, r); });
        if (name == "kv/enospc") {
            timed(name, [&](findings& f) { kv_disk_error(ctx, f, r, "kv_enospc", "kv_no_space"); });
        }
        if (name == "kv/eio") {
            timed(name, [&](findings& f) { kv_disk_error(ctx, f, r, "kv_eio", "kv_io_error"); });
        }
        if (name == "kv/flip_read") timed(name, [&](findings& f) { kv_flip_read(ctx, f, r); });
        if (name == "kv/stall_read") timed(name, [&](findings& f) { kv_stall_read(ctx, f, r); });
        if (name == "kv/stall_unlink") {
            timed(name, [&](findings& f) { kv_stall_unlink(ctx, f, r); });
        }
        if (name == "kv/fingerprint") timed(name, [&](findings& f) { kv_fingerprint(ctx, f, r); });
        if (name == "kv/torn_exit") timed(name, [&](findings& f) { kv_torn_exit(ctx, f, r); });
        if (name.starts_with("delay/")) {
            const std::string phase =
                name.find("prefill") != std::string::npos ? "prefill" : "decode";
            const bool disconnect = name.ends_with("disconnect");
            timed(name, [&](findings& f) { delayed_step(ctx, f, r, phase, disconnect); });
        }
        if (name.starts_with("refuse/")) {
            timed(name, [&](findings& f) { refused_mailbox(ctx, f, r, name.substr(7)); });
        }
        if (name == "recovery/exhausted")
            timed(name, [&](findings& f) { recovery_exhausted(ctx, f, r); });
        if (name.starts_with("spec/")) {
            timed(name, [&](findings& f) { speculative_fault(ctx, f, r, name.substr(5)); });
        }
        if (name.starts_with("net/")) {
            const size_t slash = name.rfind('/');
            const std::string kind = "net_" + name.substr(4, slash - 4);
            const std::string phase = name.substr(slash + 1);
            timed(name, [&](findings& f) { net_fault(ctx, f, r, kind, phase); });
        }
        for (const auto& c : table_cases()) {
            if (c.name() != name) continue;
            timed(name, [&](findings& f) {
                if (!table) {
                    table = std::make_unique<server>(ctx, f);
                    server_config cfg;
                    cfg.watchdog_ms = 1500;
                    if (!table->start(cfg, "table")) {
                        table.reset();
                        return;
                    }
                }
                // The server object reports into the findings of the scenario running now.
                server& s = *table;
                s.rebind(f);
                run_table_case(s, f, r, c);
            });
        }
    }
    if (table) {
        findings end;
        table->rebind(end);
        table->stop();
        if (!end.violations.empty()) out.push_back({"table/stop", end, 0});
    }
    return out;
}

}  // namespace ordo::fault
