// harness.hpp: what ordo-fault runs scenarios with — a real ordo-server process on an ephemeral
// loopback port, a msgpack TCP client that records the history of every request, and the
// invariants (issue 15) checked on those histories and on the server's stats.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/server_process.hpp"

namespace ordo::fault {

using test::event;

// Every wait of the harness is bounded by one of these.
inline constexpr std::chrono::milliseconds request_deadline{90000};  // a request's whole life
inline constexpr std::chrono::seconds ready_deadline{120};           // health ok after (re)start
inline constexpr uint32_t max_tokens = 8;                            // per generate

struct context {
    std::string server_bin;
    std::string model;
    std::string work_dir;  // temporary configs and kv dirs live here
    uint64_t seed = 1;
    // Random mode: how far resident memory may end above its baseline (0: not checked, e.g.
    // for a sanitizer build, whose allocator holds freed memory in quarantine).
    uint64_t rss_growth_max = 64ull << 20;
    bool verbose = false;
};

// The server's configuration for one scenario (a TOML file written to work_dir).
struct server_config {
    uint32_t retry_max = 2;
    std::string batch_failure_policy = "bisect";
    uint32_t watchdog_ms = 2000;
    uint32_t recovery_max = 3;        // gpu.recovery_max
    std::string kv_dir;               // non-empty: [kv] enabled
    uint32_t restore_wait_ms = 0;     // [kv] restore_wait_ms (0: the default)
    std::string speculative = "off";  // [speculative] mode
    std::string draft_model;          // [speculative] draft_model (mode "draft")
};

// What a scenario found wrong: one line each.
struct findings {
    std::vector<std::string> violations;
    std::map<std::string, uint64_t> faults;  // armed, by kind
    uint64_t requests = 0;
    // Random mode: the server's resident memory after warm-up, at the end (idle), and its peak.
    uint64_t rss_start = 0, rss_end = 0, rss_peak = 0;
    void fail(std::string what) { violations.push_back(std::move(what)); }
};

// The history of one request: every event, in arrival order.
struct history {
    uint64_t id = 0;
    std::string label;
    std::vector<event> events;
    int terminals() const;
    const event* terminal() const;
    std::vector<int32_t> tokens() const;  // done.tokens, or the streamed ones
};

class server {
public:
    server(const context& ctx, findings& f) : _ctx(ctx), _f(&f) {}
    // Where violations go from now on (a server that outlives one scenario).
    void rebind(findings& f) { _f = &f; }
    ~server();
    bool start(const server_config& cfg, const std::string& name);
    // SIGTERM (graceful: flushes KV) or SIGKILL.
    void stop();
    void kill9();
    // Waits for the process to exit by itself (bounded); its exit status.
    int wait_exit() {
        int rc = _proc.wait_exit();
        _conn.reset();
        return rc;
    }
    bool running() const { return _proc.pid() > 0; }
    uint16_t port() const { return _proc.port(); }

    // Sends a generate (temperature 0, streaming) and returns its id. speculative false: the
    // request opts out of speculative decoding (its output is the plain decoding's).
    uint64_t send_generate(const std::vector<int32_t>& prompt, const std::string& session = "",
                           bool speculative = true);
    uint64_t send_cancel(uint64_t target);
    uint64_t send_session_delete(const std::string& session);
    // Arms a fault; false (and a violation) when the server refuses it.
    bool arm(const std::string& kind, const std::string& phase = "", uint32_t count = 1,
             uint32_t after_steps = 0);
    bool arm_kv(const std::string& kind);                       // kv_enospc, ...
    bool arm_kv_stall(const std::string& kind, uint32_t ms);    // kv_stall_read / _unlink
    bool arm_draft(const std::string& kind, uint32_t count);    // draft_fail, ... (rounds)
    bool arm_delay(uint32_t ms, const std::string& phase);      // step_delay
    bool arm_refuse(const std::string& actor, uint32_t count);  // mailbox_refuse
    // net_fin, net_rst (ms 0) or net_stop_reading (ms > 0) at a request phase.
    bool arm_net(const std::string& kind, const std::string& phase, uint32_t ms = 0);
    // Reads until every id in `ids` has had its terminal event (or the deadline); records
    // histories. Violations: a second terminal event, a request that never ends.
    std::map<uint64_t, history> collect(const std::vector<uint64_t>& ids);
    // Events read for request `id` since it was collected (or never collected): a request that
    // ended must have none.
    size_t events_after_collect(uint64_t id) const {
        auto it = _pending.find(id);
        return it == _pending.end() ? 0 : it->second.events.size();
    }
    // Reads until request `id` has had at least one event (kept for collect); false at the
    // deadline.
    bool wait_first_event(uint64_t id);
    // One request, start to end.
    history generate(const std::vector<int32_t>& prompt, const std::string& session = "",
                     bool speculative = true);
    std::optional<event> call(const std::string& op);  // health, stats
    // Waits for health ok; false (and a violation) past the deadline, or at once when health
    // says degraded (the device is given up for good: it never returns to ok by itself).
    bool wait_ready();
    // Waits until the model op says the draft model drafts (speculative.draft_ready): its
    // device builds beside the served one's, after health is ok, and a request that starts
    // before it decodes without drafts (so a draft fault armed for it would never fire).
    bool wait_draft_ready();
    // Invariant 8: idle means 0 active, 0 queued, 0 used KV blocks, 0 pins, 0 logits slots held.
    void check_idle();
    std::string output() { return _proc.output(); }
    // The process's resident memory now (stats.rss_bytes) and its peak so far (VmHWM in
    // /proc/PID/status); 0 when unknown.
    uint64_t rss_bytes();
    uint64_t peak_rss_bytes() const;
    const std::string& kv_dir() const { return _cfg.kv_dir; }

private:
    bool connect();
    bool armed(const std::string& kind, uint32_t count, uint64_t id,
               const msgpack::sbuffer& request);
    const context& _ctx;
    findings* _f;
    server_config _cfg;
    test::server_process _proc;
    std::unique_ptr<test::tcp_client> _conn;
    uint64_t _next_id = 1;
    std::map<uint64_t, history> _pending;  // events read for ids nobody collected yet
    bool _refusals_armed = false;          // a mailbox_refuse was armed on this server
};

// Prompts of different lengths (heterogeneous sequences, F4), two of them extending others
// (shared prefixes), as token ids, and what a fault-free server generates for each.
struct references {
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::vector<int32_t>> want;
};
std::vector<std::vector<int32_t>> make_prompts(uint64_t seed);
// Runs a fault-free server once over every prompt.
references compute_references(const context& ctx, findings& f);
std::string show(const std::vector<int32_t>& tokens);
// Invariants 4 and 5: a request that ended `done` returns exactly the fault-free tokens.
void expect_reference(findings& f, const history& h, const std::vector<int32_t>& want,
                      const std::string& what);

// A stats field: map `group` (or top level when empty), key.
uint64_t stat(const event& stats, const std::string& group, const std::string& key);

}  // namespace ordo::fault
