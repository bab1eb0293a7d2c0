// harness.cpp: see harness.hpp.
#include "tools/fault/harness.hpp"

#include <signal.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <thread>

namespace ordo::fault {

using clock = std::chrono::steady_clock;
using test::frame;

int history::terminals() const {
    int n = 0;
    for (const auto& e : events) n += e.terminal() ? 1 : 0;
    return n;
}

const event* history::terminal() const {
    for (const auto& e : events) {
        if (e.terminal()) return &e;
    }
    return nullptr;
}

std::vector<int32_t> history::tokens() const {
    if (const event* t = terminal(); t != nullptr && t->str("event") == "done") {
        return t->ints("tokens");
    }
    std::vector<int32_t> streamed;
    for (const auto& e : events) {
        if (e.str("event") == "token") streamed.push_back(int32_t(e.u("token")));
    }
    return streamed;
}

uint64_t stat(const event& stats, const std::string& group, const std::string& key) {
    const msgpack::object& top = stats.o();
    if (group.empty()) return test::uint_field(top, key);
    const msgpack::object* g = test::field(top, group);
    return g == nullptr ? 0 : test::uint_field(*g, key);
}

server::~server() {
    if (running()) kill9();
}

bool server::start(const server_config& cfg, const std::string& name) {
    _cfg = cfg;
    _refusals_armed = false;
    const std::string path = _ctx.work_dir + "/" + name + ".toml";
    {
        std::ofstream t(path);
        t << "[fault]\nenabled = true\nseed = " << _ctx.seed << "\n"
          << "[scheduler]\nretry_max = " << cfg.retry_max << "\nbatch_failure_policy = \""
          << cfg.batch_failure_policy << "\"\n"
          << "[gpu]\nwatchdog_ms = " << cfg.watchdog_ms << "\nrecovery_max = " << cfg.recovery_max
          << "\n";
        if (!cfg.kv_dir.empty()) t << "[kv]\nenabled = true\ndir = \"" << cfg.kv_dir << "\"\n";
        if (!cfg.kv_dir.empty() && cfg.restore_wait_ms != 0) {
            t << "restore_wait_ms = " << cfg.restore_wait_ms << "\n";
        }
        t << "[speculative]\nmode = \"" << cfg.speculative << "\"\n";
        if (!cfg.draft_model.empty()) t << "draft_model = \"" << cfg.draft_model << "\"\n";
    }
    std::vector<std::string> args{"--config", path, "--model", _ctx.model, "--log-level", "warn"};
    if (!_proc.start(_ctx.server_bin, args)) {
        _f->fail("server did not start: " + _proc.output());
        return false;
    }
    return connect() && wait_ready() && (cfg.draft_model.empty() || wait_draft_ready());
}

bool server::wait_draft_ready() {
    const auto end = clock::now() + ready_deadline;
    std::string why = "no answer";
    while (clock::now() < end) {
        auto m = call("model");
        if (!m) break;
        const test::draft_state d = test::draft_state_of(m->o());
        if (d.ready) return true;
        if (!d.reason.empty()) why = d.reason;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    _f->fail("the draft model did not become ready within " +
             std::to_string(ready_deadline.count()) + " s: " + why);
    return false;
}

bool server::connect() {
    _conn = std::make_unique<test::tcp_client>();
    _pending.clear();
    if (!_conn->connect(_proc.port())) {
        _f->fail("cannot connect to the server");
        return false;
    }
    return true;
}

void server::stop() {
    _conn.reset();
    if (running()) {
        int rc = _proc.stop();
        if (rc != 0) _f->fail("server exited " + std::to_string(rc) + " on SIGTERM");
    }
}

void server::kill9() {
    _conn.reset();
    if (_proc.pid() > 0) {
        ::kill(_proc.pid(), SIGKILL);
        _proc.wait_exit();
    }
}

uint64_t server::send_generate(const std::vector<int32_t>& prompt, const std::string& session,
                               bool speculative) {
    uint64_t id = _next_id++;
    _f->requests++;
    bool ok = !session.empty()
                  ? _conn->send(frame("id", id, "op", "generate", "tokens", prompt, "max_tokens",
                                      max_tokens, "temperature", 0, "stream", true, "session",
                                      session, "speculative", speculative))
                  : _conn->send(frame("id", id, "op", "generate", "tokens", prompt, "max_tokens",
                                      max_tokens, "temperature", 0, "stream", true, "speculative",
                                      speculative));
    if (!ok) _f->fail("request " + std::to_string(id) + ": send failed");
    return id;
}

uint64_t server::send_cancel(uint64_t target) {
    uint64_t id = _next_id++;
    if (!_conn->send(frame("id", id, "op", "cancel", "target", target))) {
        _f->fail("cancel: send failed");
    }
    return id;
}

uint64_t server::send_session_delete(const std::string& session) {
    uint64_t id = _next_id++;
    if (!_conn->send(frame("id", id, "op", "session_delete", "session", session))) {
        _f->fail("session_delete: send failed");
    }
    return id;
}

bool server::arm(const std::string& kind, const std::string& phase, uint32_t count,
                 uint32_t after_steps) {
    uint64_t id = _next_id++;
    return phase.empty() ? armed(kind, count, id,
                                 frame("id", id, "op", "fault", "kind", kind, "count", count,
                                       "after_steps", after_steps))
                         : armed(kind, count, id,
                                 frame("id", id, "op", "fault", "kind", kind, "phase", phase,
                                       "count", count, "after_steps", after_steps));
}

bool server::arm_draft(const std::string& kind, uint32_t count) {
    uint64_t id = _next_id++;
    return armed(kind, count, id, frame("id", id, "op", "fault", "kind", kind, "count", count));
}

bool server::arm_kv(const std::string& kind) {
    uint64_t id = _next_id++;
    return armed(kind, 1, id, frame("id", id, "op", "fault", "kind", kind));
}

bool server::arm_kv_stall(const std::string& kind, uint32_t ms) {
    uint64_t id = _next_id++;
    return armed(kind, 1, id, frame("id", id, "op", "fault", "kind", kind, "ms", ms));
}

bool server::arm_delay(uint32_t ms, const std::string& phase) {
    uint64_t id = _next_id++;
    return armed("step_delay", 1, id,
                 frame("id", id, "op", "fault", "kind", "step_delay", "ms", ms, "phase", phase));
}

bool server::arm_refuse(const std::string& actor, uint32_t count) {
    uint64_t id = _next_id++;
    _refusals_armed = true;
    return armed(
        "mailbox_refuse", count, id,
        frame("id", id, "op", "fault", "kind", "mailbox_refuse", "actor", actor, "count", count));
}

bool server::arm_net(const std::string& kind, const std::string& phase, uint32_t ms) {
    uint64_t id = _next_id++;
    return ms == 0
               ? armed(kind, 1, id, frame("id", id, "op", "fault", "kind", kind, "phase", phase))
               : armed(kind, 1, id,
                       frame("id", id, "op", "fault", "kind", kind, "phase", phase, "ms", ms));
}

bool server::armed(const std::string& kind, uint32_t count, uint64_t id,
                   const msgpack::sbuffer& request) {
    if (!_conn->send(request)) {
        _f->fail("fault " + kind + ": send failed");
        return false;
    }
    auto h = collect({id});
    const event* t = h[id].terminal();
    const bool bounded = t != nullptr && t->str("event") == "error" &&
                         ((kind.starts_with("net_") &&
                           t->str("message").find("armed at most") != std::string::npos) ||
                          (kind.starts_with("draft_") &&
                           t->str("message").find("armed already") != std::string::npos));
    if (bounded) {
        // The server's bound on net or draft faults armed at once (more arm than fire when
        // requests end before their phase, or when a loaded machine drafts fewer rounds than
        // the plan arms faults): the defined refusal, not a violation.
        _f->faults["refused:" + kind]++;
        return false;
    }
    if (t != nullptr && t->str("code") == "overloaded" && _refusals_armed) {
        // A mailbox refusal armed earlier refused this fault on its way (the scheduler's, or
        // the gpu actor's for a gpu kind): its defined outcome.
        _f->faults["refused:" + kind]++;
        return false;
    }
    if (t == nullptr || t->str("event") != "done") {
        _f->fail("fault " + kind + " refused: " + (t ? t->outcome() : "no answer"));
        return false;
    }
    _f->faults[kind] += count;
    return true;
}

std::map<uint64_t, history> server::collect(const std::vector<uint64_t>& ids) {
    std::map<uint64_t, history> out;
    auto done = [&] {
        for (uint64_t id : ids) {
            auto it = _pending.find(id);
            if (it == _pending.end() || it->second.terminals() == 0) return false;
        }
        return true;
    };
    const auto end = clock::now() + request_deadline;
    while (!done() && clock::now() < end) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - clock::now());
        auto e = test::next(*_conn, left);
        if (!e) break;
        uint64_t id = e->u("id");
        auto& h = _pending[id];
        h.id = id;
        h.events.push_back(std::move(*e));
    }
    // Terminal events that arrive right behind (a duplicate would come in the same burst).
    while (auto e = test::next(*_conn, std::chrono::milliseconds(20))) {
        auto& h = _pending[e->u("id")];
        h.id = e->u("id");
        h.events.push_back(std::move(*e));
    }
    for (uint64_t id : ids) {
        history h = _pending[id];
        h.id = id;
        if (h.terminals() == 0) {
            _f->fail("request " + std::to_string(id) + " did not end within " +
                     std::to_string(request_deadline.count()) + " ms (invariant 2)");
        } else if (h.terminals() > 1) {
            _f->fail("request " + std::to_string(id) + " had " + std::to_string(h.terminals()) +
                     " terminal events (invariant 1)");
        }
        if (_ctx.verbose) {
            const event* t = h.terminal();
            std::fprintf(stderr, "  request %llu: %zu events, %s\n",
                         static_cast<unsigned long long>(id), h.events.size(),
                         t ? t->outcome().c_str() : "no terminal event");
        }
        _pending.erase(id);
        out[id] = std::move(h);
    }
    return out;
}

bool server::wait_first_event(uint64_t id) {
    const auto end = clock::now() + request_deadline;
    while (_pending[id].events.empty() && clock::now() < end) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - clock::now());
        auto e = test::next(*_conn, left);
        if (!e) break;
        auto& h = _pending[e->u("id")];
        h.id = e->u("id");
        h.events.push_back(std::move(*e));
    }
    return !_pending[id].events.empty();
}

history server::generate(const std::vector<int32_t>& prompt, const std::string& session,
                         bool speculative) {
    uint64_t id = send_generate(prompt, session, speculative);
    return collect({id})[id];
}

std::optional<event> server::call(const std::string& op) {
    uint64_t id = _next_id++;
    if (!_conn->send(frame("id", id, "op", op))) return std::nullopt;
    auto h = collect({id});
    const event* t = h[id].terminal();
    if (t == nullptr) return std::nullopt;
    return *t;
}

bool server::wait_ready() {
    const auto end = clock::now() + ready_deadline;
    while (clock::now() < end) {
        auto h = call("health");
        if (!h) break;
        if (h->str("status") == "ok") return true;
        if (h->str("status") == "degraded") {
            _f->fail("health degraded: " + h->str("reason") + " (invariant 3)");
            return false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    _f->fail("health did not return to ok within " + std::to_string(ready_deadline.count()) +
             " s (invariant 3)");
    return false;
}

uint64_t server::rss_bytes() {
    auto s = call("stats");
    return s ? stat(*s, "", "rss_bytes") : 0;
}

uint64_t server::peak_rss_bytes() const {
    std::ifstream in("/proc/" + std::to_string(_proc.pid()) + "/status");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;  // kB
    }
    return 0;
}

void server::check_idle() {
    // The last terminal event may leave the scheduler a moment before the blocks are released.
    const auto end = clock::now() + std::chrono::seconds(10);
    std::string last;
    while (clock::now() < end) {
        auto s = call("stats");
        if (!s) break;
        uint64_t active = stat(*s, "", "active_sequences"),
                 queued = stat(*s, "", "queued_requests"), used = stat(*s, "", "kv_blocks_used"),
                 pins = stat(*s, "kv", "pins"), slots = stat(*s, "", "logits_slots_held");
        if (active + queued + used + pins + slots == 0) return;
        last = "active " + std::to_string(active) + ", queued " + std::to_string(queued) +
               ", kv blocks used " + std::to_string(used) + ", pins " + std::to_string(pins) +
               ", logits slots held " + std::to_string(slots);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    _f->fail("not idle after the scenario (invariant 8): " + last);
}

std::vector<std::vector<int32_t>> make_prompts(uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int32_t> id(3, 400);
    std::vector<std::vector<int32_t>> out;
    for (size_t n : {37u, 5u, 23u, 61u}) {
        std::vector<int32_t> p{1};  // BOS
        for (size_t i = 1; i < n; i++) p.push_back(id(rng));
        out.push_back(std::move(p));
    }
    // Shared prefixes: prompt 4 extends prompt 0, prompt 5 extends prompt 3.
    for (size_t base : {0u, 3u}) {
        std::vector<int32_t> p = out[base];
        for (size_t i = 0; i < 19; i++) p.push_back(id(rng));
        out.push_back(std::move(p));
    }
    return out;
}

references compute_references(const context& ctx, findings& f) {
    references r;
    r.prompts = make_prompts(ctx.seed);
    server s(ctx, f);
    if (!s.start({}, "reference")) return r;
    for (const auto& p : r.prompts) r.want.push_back(s.generate(p).tokens());
    s.stop();
    return r;
}

std::string show(const std::vector<int32_t>& t) {
    std::string s = "[";
    for (size_t i = 0; i < t.size(); i++) s += (i ? "," : "") + std::to_string(t[i]);
    return s + "]";
}

void expect_reference(findings& f, const history& h, const std::vector<int32_t>& want,
                      const std::string& what) {
    const event* t = h.terminal();
    if (t == nullptr) return;  // already a violation (collect)
    if (t->str("event") != "done" || t->str("reason") == "cancelled") {
        f.fail(what + ": ended " + t->outcome() + ", expected done");
        return;
    }
    if (h.tokens() != want) {
        f.fail(what + ": tokens " + show(h.tokens()) + " differ from a fault-free server's " +
               show(want) + " (invariant 4/5)");
    }
}

}  // namespace ordo::fault
