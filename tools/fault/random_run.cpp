// random_run.cpp: see random_run.hpp.
#include "tools/fault/random_run.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <thread>

namespace ordo::fault {
namespace {

using clock = std::chrono::steady_clock;
using test::frame;

// What one client connection sent and read.
struct client {
    std::unique_ptr<test::tcp_client> conn;
    uint64_t next_id = 1;
    std::map<uint64_t, history> requests;  // generate requests on this connection
    std::map<uint64_t, uint32_t> prompt_of;
    std::set<uint64_t> cancelled;  // targets of a cancel
    std::set<uint64_t> session_requests;
    std::set<uint64_t> deletes;       // session_delete requests (in `requests` too)
    std::vector<uint64_t> other_ids;  // cancel requests (their done is read, not checked)
    // A session request was sent, on this connection or an earlier one (whose request may
    // still hold the session after a disconnect): a session_delete may get session_busy.
    bool sent_session = false;
};

bool net_kind(const std::string& kind) {
    return kind.starts_with("net_");
}

// What the plan has armed so far: what explains an outcome that only a fault may cause.
struct armed_faults {
    uint64_t steps = 0;  // steps that may fail: failing gpu kinds, gpu mailbox refusals
    uint64_t net = 0;    // net faults (a connection the server drops or pauses)
    bool scheduler_refusals = false;  // a scheduler mailbox refusal (requests get overloaded)
    // A kv_stall_unlink, or a kv mailbox refusal (a kv request given up is answered as the
    // disk's failure): a session_delete may get kv_io.
    bool delete_kv_io = false;
};

bool connect(client& c, uint16_t port) {
    c.conn = std::make_unique<test::tcp_client>();
    c.requests.clear();
    c.prompt_of.clear();
    c.cancelled.clear();
    c.session_requests.clear();
    c.deletes.clear();
    c.other_ids.clear();
    return c.conn->connect(port);
}

// Reads until every request of `c` has ended (bounded); records histories.
void drain(client& c) {
    const auto end = clock::now() + request_deadline;
    auto open = [&] {
        for (const auto& [id, h] : c.requests) {
            if (h.terminals() == 0) return true;
        }
        return false;
    };
    while (open() && clock::now() < end) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - clock::now());
        auto e = test::next(*c.conn, left);
        if (!e) break;
        uint64_t id = e->u("id");
        auto it = c.requests.find(id);
        if (it != c.requests.end()) it->second.events.push_back(std::move(*e));
    }
    while (auto e = test::next(*c.conn, std::chrono::milliseconds(20))) {
        auto it = c.requests.find(e->u("id"));
        if (it != c.requests.end()) it->second.events.push_back(std::move(*e));
    }
}

// A session_delete's one terminal event: done with `deleted`; session_busy while a request of
// its session ran (only a client that sent one); kv_io only for a stalled unlink, overloaded
// only for a scheduler mailbox refusal.
void check_delete(findings& f, const event& t, const armed_faults& armed, bool no_session_sent,
                  const std::string& what) {
    const std::string ev = t.str("event"), code = t.str("code");
    if (ev == "done") {
        const msgpack::object* d = test::field(t.o(), "deleted");
        if (d == nullptr || d->type != msgpack::type::BOOLEAN) {
            f.fail(what + ": session_delete done without a deleted flag");
        }
    } else if (code == "session_busy") {
        if (no_session_sent) f.fail(what + ": session_busy with no session request sent");
    } else if (code == "kv_io") {
        if (!armed.delete_kv_io) f.fail(what + ": kv_io with no unlink stalled");
    } else if (code == "overloaded") {
        if (!armed.scheduler_refusals) f.fail(what + ": overloaded with no mailbox refusal armed");
    } else {
        f.fail(what + ": session_delete ended " + ev + " " + code);
    }
}

// Checks the requests of `c` once its connection is done with. `net_faults`: net faults armed
// so far; a request with no terminal event on a connection the server closed is excused only
// then (the fault dropped it).
void check(findings& f, const client& c, const references& r, const armed_faults& armed,
           uint32_t index) {
    const uint64_t net_faults = armed.net;
    const bool dropped = !c.conn->peer_closed().empty();
    if (dropped && net_faults == 0) {
        f.fail("client " + std::to_string(index) + ": the server closed its connection (" +
               c.conn->peer_closed() + ") with no net fault armed");
    }
    for (const auto& [id, h] : c.requests) {
        const std::string what =
            "client " + std::to_string(index) + " request " + std::to_string(id);
        if (h.terminals() == 0 && dropped && net_faults > 0) continue;
        if (h.terminals() != 1) {
            f.fail(what + ": " + std::to_string(h.terminals()) +
                   " terminal events (invariants 1 and 2)");
            continue;
        }
        const event& t = *h.terminal();
        const std::string ev = t.str("event"), reason = t.str("reason"), code = t.str("code");
        if (c.deletes.count(id) != 0) {
            check_delete(f, t, armed, !c.sent_session, what);
            continue;
        }
        if (ev == "done" && reason == "cancelled") {
            if (c.cancelled.count(id) == 0) f.fail(what + ": cancelled without a cancel");
        } else if (ev == "done") {
            if (h.tokens() != r.want[c.prompt_of.at(id)]) {
                f.fail(what + ": tokens " + show(h.tokens()) + " differ from a fault-free " +
                       "server's " + show(r.want[c.prompt_of.at(id)]) + " (invariant 4/5)");
            }
        } else if (code == "gpu_failed") {
            if (armed.steps == 0) f.fail(what + ": gpu_failed with no fault armed");
        } else if (code == "overloaded") {
            if (!armed.scheduler_refusals)
                f.fail(what + ": overloaded with no mailbox refusal armed");
        } else if (code == "session_busy") {
            if (c.session_requests.count(id) == 0)
                f.fail(what + ": session_busy without a session");
        } else {
            f.fail(what + ": ended " + t.outcome());
        }
    }
}

findings run_plan(const context& ctx, const references& r, const plan& p) {
    findings f;
    server_config cfg;
    cfg.watchdog_ms = 1500;
    // Each armed fault fails at most one step, so at most that many rebuilds come in a row:
    // with recovery_max above it, a device given up for good (degraded) is a violation, not
    // the configured outcome of too many faults back to back (the recovery/* scenario
    // covers that outcome).
    uint32_t device_faults = 0;
    for (const action& a : p.actions) {
        if (a.k != action::kind::fault) continue;
        if (a.fault_kind == "mailbox_refuse" && a.actor == "gpu") device_faults += a.count;
        if (a.fault_kind == "device_lost" || a.fault_kind == "hang") device_faults++;
    }
    cfg.recovery_max = std::min<uint32_t>(recovery_max_limit, device_faults + 2);
    cfg.kv_dir = ctx.work_dir + "/random-kv-" + std::to_string(p.seed);
    // The kv stalls wait 20-500 ms: some restores and unlinks outlast the wait, some do not.
    cfg.restore_wait_ms = 250;
    // The server speculates, its references were computed without: every output is checked
    // to be byte-identical to plain decoding, whatever the drafts. Odd seeds draft by prompt
    // lookup, even ones with a draft model (the served model drafting for itself, on a gpu
    // actor of its own, which draft_fail then fails).
    cfg.speculative = p.seed % 2 == 1 ? "ngram" : "draft";
    if (cfg.speculative == "draft") cfg.draft_model = ctx.model;
    server s(ctx, f);
    if (!s.start(cfg, "random")) return f;
    std::vector<client> clients(random_clients);
    for (auto& c : clients) {
        if (!connect(c, s.port())) f.fail("cannot connect a client");
    }
    armed_faults armed;
    // A send that fails: the server dropped the connection (a net fault). What was sent on it
    // is checked now, and the client goes on with a new connection.
    auto send_or_reconnect = [&](client& c, uint32_t index, const msgpack::sbuffer& fr) {
        if (c.conn->send(fr)) return true;
        drain(c);
        if (c.conn->peer_closed().empty()) c.conn->wait_closed(std::chrono::milliseconds(100));
        if (armed.net == 0) f.fail("client " + std::to_string(index) + ": send failed");
        check(f, c, r, armed, index);
        if (!connect(c, s.port())) f.fail("cannot reconnect a client");
        return false;
    };
    // Warm-up, fault-free: every prompt once (the pools and caches reach their working size),
    // then the memory baseline.
    for (size_t i = 0; i < r.prompts.size(); i++) {
        expect_reference(f, s.generate(r.prompts[i]), r.want[i], "warm-up " + std::to_string(i));
    }
    f.rss_start = s.rss_bytes();
    auto before = s.call("stats");
    for (const action& a : p.actions) {
        if (a.pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(a.pause_ms));
        client& c = clients[a.client];
        switch (a.k) {
            case action::kind::generate: {
                uint64_t id = c.next_id++;
                const auto& prompt = r.prompts[a.prompt];
                auto fr = a.session.empty()
                              ? frame("id", id, "op", "generate", "tokens", prompt, "max_tokens",
                                      max_tokens, "temperature", 0, "stream", a.stream)
                              : frame("id", id, "op", "generate", "tokens", prompt, "max_tokens",
                                      max_tokens, "temperature", 0, "stream", a.stream, "session",
                                      a.session);
                if (!send_or_reconnect(c, a.client, fr)) break;
                c.requests[id].id = id;
                c.prompt_of[id] = a.prompt;
                if (!a.session.empty()) {
                    c.session_requests.insert(id);
                    c.sent_session = true;
                }
                f.requests++;
                break;
            }
            case action::kind::session_delete: {
                uint64_t id = c.next_id++;
                if (!send_or_reconnect(
                        c, a.client,
                        frame("id", id, "op", "session_delete", "session", a.session))) {
                    break;
                }
                c.requests[id].id = id;
                c.deletes.insert(id);
                break;
            }
            case action::kind::cancel: {
                if (c.requests.empty()) break;
                uint64_t target = c.requests.rbegin()->first;
                uint64_t id = c.next_id++;
                if (send_or_reconnect(c, a.client,
                                      frame("id", id, "op", "cancel", "target", target))) {
                    c.cancelled.insert(target);
                }
                break;
            }
            case action::kind::disconnect: {
                // Its requests end unseen: nothing is checked for them but the server's
                // cleanup (idle at the end).
                if (a.stream) {
                    c.conn->reset();
                } else {
                    c.conn->close();
                }
                if (!connect(c, s.port())) f.fail("cannot reconnect a client");
                break;
            }
            case action::kind::fault: {
                if (net_kind(a.fault_kind)) {
                    if (s.arm_net(a.fault_kind, a.phase, a.ms)) armed.net++;
                } else if (a.fault_kind == "kv_stall_read" || a.fault_kind == "kv_stall_unlink") {
                    if (s.arm_kv_stall(a.fault_kind, a.ms) && a.fault_kind == "kv_stall_unlink") {
                        armed.delete_kv_io = true;
                    }
                } else if (a.fault_kind.starts_with("kv_")) {
                    s.arm_kv(a.fault_kind);
                } else if (a.fault_kind.starts_with("draft_")) {
                    s.arm_draft(a.fault_kind, a.count);  // changes no output: nothing to explain
                } else if (a.fault_kind == "step_delay") {
                    s.arm_delay(a.ms, a.phase);
                } else if (a.fault_kind == "mailbox_refuse") {
                    if (s.arm_refuse(a.actor, a.count)) {
                        if (a.actor == "gpu") armed.steps += a.count;
                        if (a.actor == "scheduler") armed.scheduler_refusals = true;
                        if (a.actor == "kv") armed.delete_kv_io = true;
                    }
                } else if (s.arm(a.fault_kind, a.phase, 1)) {
                    armed.steps++;
                }
                break;
            }
        }
    }
    for (uint32_t i = 0; i < clients.size(); i++) {
        drain(clients[i]);
        check(f, clients[i], r, armed, i);
    }
    // Invariant 3: still serving; 4: fault-free output. Faults still armed fire on these: a
    // probe whose connection a net fault drops uses up that fault, so net_armed + 3 probes
    // always leave at least 3 that only gpu faults can touch.
    for (uint64_t probe = 0; probe < armed.net + 3; probe++) {
        if (!s.wait_ready()) break;
        client pc;
        if (!connect(pc, s.port())) {
            f.fail("cannot connect a probe");
            break;
        }
        pc.requests[1].id = 1;
        if (!pc.conn->send(frame("id", 1, "op", "generate", "tokens", r.prompts[1], "max_tokens",
                                 max_tokens, "temperature", 0))) {
            continue;  // dropped at once: try again
        }
        drain(pc);
        const event* t = pc.requests[1].terminal();
        if (t != nullptr && t->str("event") == "done") {
            expect_reference(f, pc.requests[1], r.want[1], "probe after the run");
            break;
        }
        if (t == nullptr && pc.conn->peer_closed().empty()) {
            f.fail("a probe after the run did not end (invariant 2)");
            break;
        }
    }
    auto after = s.call("stats");
    if (before && after) {
        // Invariant 6: every failed step is explained by an armed fault (each fails one step).
        uint64_t failures =
            stat(*after, "scheduler", "failures") - stat(*before, "scheduler", "failures");
        if (failures > armed.steps) {
            f.fail(std::to_string(failures) + " failed steps for " + std::to_string(armed.steps) +
                   " armed faults (invariant 6)");
        }
    }
    s.check_idle();
    // Invariant 8, memory: idle again, the resident set is back near its baseline.
    f.rss_end = s.rss_bytes();
    f.rss_peak = s.peak_rss_bytes();
    const uint64_t rss_growth_max = ctx.rss_growth_max;
    if (rss_growth_max > 0 && f.rss_start > 0 && f.rss_end > f.rss_start + rss_growth_max) {
        f.fail("resident memory grew from " + std::to_string(f.rss_start >> 20) + " MiB to " +
               std::to_string(f.rss_end >> 20) + " MiB over the run (invariant 8: more than " +
               std::to_string(rss_growth_max >> 20) + " MiB)");
    }
    s.stop();
    return f;
}

}  // namespace

std::string action::describe() const {
    std::string c = "client " + std::to_string(client) + ": ";
    switch (k) {
        case kind::generate:
            return c + "generate prompt " + std::to_string(prompt) + (stream ? " stream" : "") +
                   (session.empty() ? "" : " session " + session);
        case kind::cancel:
            return c + "cancel its latest request";
        case kind::session_delete:
            return c + "session_delete " + session;
        case kind::disconnect:
            return c + (stream ? "disconnect (RST)" : "disconnect (FIN)");
        case kind::fault:
            return "fault " + fault_kind + (phase.empty() ? "" : " phase " + phase) +
                   (ms == 0 ? "" : " " + std::to_string(ms) + " ms") +
                   (actor.empty() ? "" : " actor " + actor + " x" + std::to_string(count));
    }
    return c;
}

plan make_plan(uint64_t seed, uint32_t requests) {
    plan p;
    p.seed = seed;
    std::mt19937_64 rng(seed);
    auto pick = [&](uint64_t n) { return uint32_t(rng() % n); };
    const char* kinds[] = {"device_lost",    "hang",          "nan_logits", "step_delay",
                           "mailbox_refuse", "kv_enospc",     "kv_eio",     "kv_flip_read",
                           "kv_fingerprint", "net_fin",       "net_rst",    "net_stop_reading",
                           "draft_fail",     "draft_garbage", "draft_eos",  "kv_stall_read",
                           "kv_stall_unlink"};
    const char* actors[] = {"scheduler", "net", "gpu", "kv"};
    const char* phases[] = {"", "prefill", "decode", "verify"};
    const char* request_phases[] = {"queued", "prefill", "decode"};
    uint32_t generates = 0;
    while (generates < requests) {
        action a;
        a.client = pick(random_clients);
        a.pause_ms = pick(20);
        uint32_t r = pick(100);
        if (r < 70) {
            a.k = action::kind::generate;
            a.prompt = pick(6);
            a.stream = pick(2) == 0;
            if (pick(5) == 0) a.session = "s" + std::to_string(a.client);
            generates++;
        } else if (r < 75) {
            a.k = action::kind::session_delete;
            a.session = "s" + std::to_string(a.client);
        } else if (r < 82) {
            a.k = action::kind::cancel;
        } else if (r < 88) {
            a.k = action::kind::disconnect;
            a.stream = pick(2) == 0;  // RST or FIN
        } else {
            a.k = action::kind::fault;
            a.fault_kind = kinds[pick(std::size(kinds))];
            if (net_kind(a.fault_kind)) {
                a.phase = request_phases[pick(3)];
                if (a.fault_kind == "net_stop_reading") a.ms = 20 + pick(480);
            } else if (a.fault_kind == "mailbox_refuse") {
                a.actor = actors[pick(4)];
                a.count = 1 + pick(8);
            } else if (a.fault_kind == "kv_stall_read" || a.fault_kind == "kv_stall_unlink") {
                a.ms = 20 + pick(480);  // around the run's restore_wait_ms: both outcomes
            } else if (a.fault_kind.starts_with("draft_")) {
                a.count = 1 + pick(4);  // drafting rounds
            } else if (!a.fault_kind.starts_with("kv_")) {
                a.phase = phases[pick(4)];
                if (a.fault_kind == "step_delay") {
                    a.ms = 10 + pick(290);
                    if (a.phase.empty()) a.phase = "decode";
                }
            }
        }
        p.actions.push_back(std::move(a));
    }
    return p;
}

random_result run_random(const context& ctx, uint64_t seed, uint32_t requests) {
    random_result out;
    const auto t0 = clock::now();
    const references r = compute_references(ctx, out.found);
    if (!out.found.violations.empty()) return out;
    plan p = make_plan(seed, requests);
    for (const auto& a : p.actions) {
        if (a.k == action::kind::fault) out.found.faults[a.fault_kind]++;
    }
    findings f = run_plan(ctx, r, p);
    out.found.requests = f.requests;
    out.found.violations = f.violations;
    out.found.rss_start = f.rss_start;
    out.found.rss_end = f.rss_end;
    out.found.rss_peak = f.rss_peak;
    if (!f.violations.empty()) {
        // What failed is printed before the (slow) shrinking starts.
        std::printf("seed %llu: %zu violation(s); shrinking the plan (%zu actions)\n",
                    static_cast<unsigned long long>(seed), f.violations.size(), p.actions.size());
        for (const auto& v : f.violations) std::printf("    violation: %s\n", v.c_str());
        std::fflush(stdout);
        // Shrink: drop faults one at a time, then whole clients, keeping each drop after which
        // the plan still fails; bounded in reruns and in time.
        plan best = p;
        uint32_t runs = 0;
        const auto shrink_end = clock::now() + shrink_time_max;
        auto may_run = [&] { return runs < shrink_runs_max && clock::now() < shrink_end; };
        auto still_fails = [&](const plan& candidate) {
            runs++;
            return !run_plan(ctx, r, candidate).violations.empty();
        };
        for (size_t i = 0; i < best.actions.size() && may_run();) {
            if (best.actions[i].k != action::kind::fault) {
                i++;
                continue;
            }
            plan c = best;
            c.actions.erase(c.actions.begin() + long(i));
            if (still_fails(c)) {
                best = std::move(c);
            } else {
                i++;
            }
        }
        for (uint32_t client = 0; client < random_clients && may_run(); client++) {
            plan c = best;
            std::erase_if(c.actions, [&](const action& a) {
                return a.k != action::kind::fault && a.client == client;
            });
            if (c.actions.size() < best.actions.size() && still_fails(c)) best = std::move(c);
        }
        out.minimal = std::move(best);
    }
    out.seconds = std::chrono::duration<double>(clock::now() - t0).count();
    return out;
}

}  // namespace ordo::fault
