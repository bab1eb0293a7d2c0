// scheduler_actor.cpp: see scheduler_actor.hpp. Everything here runs on the scheduler's loop.
#include "actors/scheduler/scheduler_actor.hpp"

#include <spdlog/spdlog.h>

#include "actors/scheduler/request_fields.hpp"
#include "actors/scheduler/scheduler_events.hpp"
#include "net/protocol.hpp"

namespace ordo::sched {
namespace {

// How often events refused by a full net mailbox are offered again.
constexpr uint64_t undelivered_retry_ms = 2;
// Bounds of the `fault` op's numbers.
constexpr uint64_t fault_layer_max = 4096;
constexpr uint64_t fault_steps_max = 1000000;

// `fault` {kind: device_lost|hang|nan_logits, phase?: prefill|decode|mixed, layer?, after_steps?,
// count?} → gpu::inject_fault. Errors: bad_request naming the key.
result<gpu::inject_fault> parse_fault(const msgpack::object& frame) {
    using namespace fields;
    auto params = param_map::open(frame, {"kind", "phase", "layer", "after_steps", "count"});
    if (!params.ok()) return params.err();
    gpu::inject_fault f;
    const msgpack::object* kind = params->get("kind");
    if (kind == nullptr) return make_error("bad_request", "kind: missing");
    auto k = read_string("kind", *kind, 32);
    if (!k.ok()) return k.err();
    if (*k != "device_lost" && *k != "hang" && *k != "nan_logits") {
        return make_error("bad_request", "kind: must be device_lost, hang or nan_logits");
    }
    f.kind = *k;
    if (const auto* p = params->get("phase")) {
        auto ph = read_string("phase", *p, 16);
        if (!ph.ok()) return ph.err();
        if (*ph != "prefill" && *ph != "decode" && *ph != "mixed") {
            return make_error("bad_request", "phase: must be prefill, decode or mixed");
        }
        f.phase = *ph;
    }
    if (const auto* l = params->get("layer")) {
        auto v = read_uint("layer", *l, 0, fault_layer_max);
        if (!v.ok()) return v.err();
        f.layer = int32_t(*v);
    }
    if (const auto* a = params->get("after_steps")) {
        auto v = read_uint("after_steps", *a, 0, fault_steps_max);
        if (!v.ok()) return v.err();
        f.after_steps = uint32_t(*v);
    }
    if (const auto* c = params->get("count")) {
        auto v = read_uint("count", *c, 1, fault_steps_max);
        if (!v.ok()) return v.err();
        f.count = uint32_t(*v);
    }
    return f;
}

}  // namespace

scheduler_actor::scheduler_actor(scheduler_core core, gpu::logits_exchange* logits, options o)
    : actor("scheduler", o.mailbox_capacity), _core(std::move(core)), _logits(logits), _opt(o) {}

void scheduler_actor::connect(net_outbox to_net, gpu_outbox to_gpu) {
    _to_net = std::move(to_net);
    _to_gpu = std::move(to_gpu);
}

void scheduler_actor::on_start() {
    uv_timer_init(loop(), &_backstop);
    uv_timer_init(loop(), &_retry);
    _backstop.data = _retry.data = this;
    std::vector<outgoing_event> none;
    after(none);  // publish the initial health ("loading")
}

void scheduler_actor::on_stop() {
    std::vector<outgoing_event> out;
    _core.shutdown(out);
    for (auto& e : out) deliver(std::move(e));
    if (!_undelivered.empty()) {
        log().warn("{} events undeliverable at stop (net mailbox full)", _undelivered.size());
    }
    uv_close(reinterpret_cast<uv_handle_t*>(&_backstop), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&_retry), nullptr);
}

// ---- inputs --------------------------------------------------------------------------------

void scheduler_actor::on(const client_request& m) {
    std::vector<outgoing_event> out;
    if (m.op == "fault") {
        op_fault(m, out);
    } else {
        _core.on_request(m, out);
    }
    after(out);
}

void scheduler_actor::on(const client_gone& m) {
    std::vector<outgoing_event> out;
    _core.on_client_gone(m, out);
    after(out);
}

void scheduler_actor::on(const gpu::step_done& m) {
    uv_timer_stop(&_backstop);
    std::vector<outgoing_event> out;
    _core.on_step_done(
        m, [&](uint32_t r) { return _logits->read_row(m.slot, r); }, out);
    _logits->release(m.slot);
    after(out);
}

void scheduler_actor::on(const gpu::step_failed& m) {
    uv_timer_stop(&_backstop);
    log().warn("step {} failed: {} in {}: {}{}", m.step_id, m.code, m.segment, m.message,
               m.device_lost ? " (device lost)" : "");
    std::vector<outgoing_event> out;
    _core.on_step_failed(m, out);
    after(out);
}

void scheduler_actor::on(const gpu::device_ready& m) {
    log().info("device ready: {} (epoch {}, {} kv blocks of {} tokens)", m.device, m.epoch,
               m.kv_blocks, m.kv_block_tokens);
    std::vector<outgoing_event> out;
    _core.on_device_ready(m, out);
    after(out);
}

void scheduler_actor::on(const gpu::device_unavailable& m) {
    log().error("device unavailable: {}", m.message);
    std::vector<outgoing_event> out;
    _core.on_device_unavailable(m, out);
    after(out);
}

void scheduler_actor::on(const gpu::gpu_stats&) {}

// `fault` {kind, phase?, layer?, after_steps?, count?}: arms a gpu fault through the real path.
void scheduler_actor::op_fault(const client_request& m, std::vector<outgoing_event>& out) {
    if (!_opt.faults_enabled) {
        out.push_back(error_event(m.conn, m.id, "fault_disabled",
                                  "fault injection is off ([fault] enabled = false)"));
        return;
    }
    auto oh = msgpack::unpack(m.frame.data(), m.frame.size());
    auto parsed = parse_fault(oh.get());
    if (!parsed.ok()) {
        out.push_back(error_event(m.conn, m.id, parsed.err().code, parsed.err().message));
        return;
    }
    if (auto st = _to_gpu.tell(*parsed); !st.ok()) {
        out.push_back(error_event(m.conn, m.id, "internal", st.err().message));
        return;
    }
    out.push_back({m.conn, m.id, true,
                   net::event_writer(m.id, "done").field("armed", parsed->kind).finish()});
}

// ---- outputs -------------------------------------------------------------------------------

void scheduler_actor::after(std::vector<outgoing_event>& out) {
    for (auto& e : out) deliver(std::move(e));
    auto health = _core.health();
    // Remembered only once delivered, so a refused update is sent again next time.
    if (health != _health && _to_net.tell(net::set_health{health.first, health.second}).ok()) {
        _health = health;
    }
    pump();
}

void scheduler_actor::deliver(outgoing_event e) {
    net::deliver_event m{e.conn, e.id, e.terminal, std::vector<char>(e.frame.begin(), e.frame.end())};
    if (_undelivered.empty() && _to_net.tell(m).ok()) return;
    _undelivered.push_back(std::move(m));
    if (!stopping() && !uv_is_active(reinterpret_cast<uv_handle_t*>(&_retry))) {
        uv_timer_start(&_retry, &scheduler_actor::retry_cb, undelivered_retry_ms,
                       undelivered_retry_ms);
    }
}

void scheduler_actor::retry_cb(uv_timer_t* t) {
    auto& self = *static_cast<scheduler_actor*>(t->data);
    while (!self._undelivered.empty()) {
        auto st = self._to_net.tell(self._undelivered.front());
        if (!st.ok() && st.err().code == "mailbox_full") break;  // try again on the next tick
        if (!st.ok()) {
            // The net actor has stopped: its connections, and so these clients, are gone.
            self.log().warn("dropping {} events: {}", self._undelivered.size(), st.err().message);
            self._undelivered.clear();
            break;
        }
        self._undelivered.pop_front();
    }
    if (self._undelivered.empty()) uv_timer_stop(t);
}

void scheduler_actor::pump() {
    if (stopping() || _core.step_in_flight()) return;
    auto s = _core.next_step();
    if (!s) return;
    if (auto st = _to_gpu.tell(*s); !st.ok()) {
        // The gpu actor refused the step: that is a failed step like any other.
        std::vector<outgoing_event> out;
        _core.on_step_failed({s->step_id, "gpu_busy", st.err().message, "not submitted", false},
                             out);
        for (auto& e : out) deliver(std::move(e));
        return;
    }
    uv_timer_start(&_backstop, &scheduler_actor::backstop_cb, _opt.step_backstop_ms, 0);
}

void scheduler_actor::backstop_cb(uv_timer_t* t) {
    auto& self = *static_cast<scheduler_actor*>(t->data);
    uint64_t id = self._core.in_flight_step_id();
    if (id == 0) return;
    self.log().error("step {} unanswered after {} ms", id, self._opt.step_backstop_ms);
    std::vector<outgoing_event> out;
    self._core.on_step_failed({id, "gpu_timeout", "no answer from the gpu actor", "step", true},
                              out);
    self.after(out);
}

}  // namespace ordo::sched
