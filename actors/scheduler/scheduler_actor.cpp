// scheduler_actor.cpp: see scheduler_actor.hpp. Everything here runs on the scheduler's loop.
#include "actors/scheduler/scheduler_actor.hpp"

#include <spdlog/spdlog.h>

#include <unistd.h>

#include <cassert>
#include <cstdio>

namespace ordo::sched {
namespace {

// After the gpu actor refuses a step (its queue full, a logits slot busy), the next plan is made
// this much later rather than at once (which would spin) or never (which would stall).
constexpr uint64_t pump_retry_ms = 10;

// Events to the net actor: its mailbox is normally drained in microseconds, so a message that
// waits this long means the net actor is stuck; the client is then cut off, not left waiting.
constexpr actors::delivery_limits net_delivery_limits{
    .pending_max = 1u << 16, .retry_ms = 2, .deadline_ms = 30'000};
// Requests to the kv actor: its mailbox drains quickly; one refused this long gets the answer a
// failure would have (scheduler_actor::kv_gave_up), so no request waits on it forever.
constexpr actors::delivery_limits kv_delivery_limits{
    .pending_max = 4096, .retry_ms = 2, .deadline_ms = 10'000};
// A device reset request to the gpu actor.
constexpr actors::delivery_limits gpu_delivery_limits{
    .pending_max = 16, .retry_ms = 10, .deadline_ms = 30'000};

// The process's resident set in bytes, from /proc/self/statm (its second field, in pages); 0
// where that file is not there.
uint64_t resident_bytes() {
    std::FILE* f = std::fopen("/proc/self/statm", "r");
    if (f == nullptr) return 0;
    unsigned long long size = 0, resident = 0;
    const int n = std::fscanf(f, "%llu %llu", &size, &resident);
    std::fclose(f);
    return n == 2 ? resident * uint64_t(sysconf(_SC_PAGESIZE)) : 0;
}

}  // namespace

scheduler_actor::scheduler_actor(scheduler_core core, gpu::logits_exchange* logits, options o)
    : actor("scheduler", o.mailbox_capacity),
      _core(std::move(core)),
      _logits(logits),
      _opt(std::move(o)) {}

void scheduler_actor::on_start() {
    for (uv_timer_t* t : {&_backstop, &_pump_timer, &_drain_timer}) {
        uv_timer_init(loop(), t);
        t->data = this;
    }
    must(_to_net.init(loop(), _net_out, net_delivery_limits,
                 [this](const net_delivery::message& m, const error& why) { net_gave_up(m, why); }),
         "delivery init");
    must(_gpu_control.init(
        loop(), _gpu_control_out, gpu_delivery_limits,
        [this](const gpu_delivery::message& m, const error& why) { gpu_gave_up(m, why); }),
         "delivery init");
    must(_to_kv.init(loop(), _kv_out, kv_delivery_limits,
                     [this](const kv_delivery::message& m, const error& why) { kv_gave_up(m, why); }),
         "delivery init");
    std::vector<outgoing_event> none;
    after(none);  // publish the initial health ("loading")
}

void scheduler_actor::on_stop() {
    std::vector<outgoing_event> out;
    _core.shutdown(out);
    send_events(out);
    _to_net.close();
    _gpu_control.close();
    _to_kv.close();
    for (uv_timer_t* t : {&_backstop, &_pump_timer, &_drain_timer}) {
        uv_close(reinterpret_cast<uv_handle_t*>(t), nullptr);
    }
}

// ---- inputs --------------------------------------------------------------------------------

// Each op: the core decides, after() carries out what it decided.
#define ORDO_SCHEDULER_OP(type, handler)          \
    void scheduler_actor::on(const type& m) {     \
        std::vector<outgoing_event> out;          \
        _core.handler(m, out);                    \
        after(out);                               \
    }
ORDO_SCHEDULER_OP(generate, on_generate)
ORDO_SCHEDULER_OP(cancel, on_cancel)
ORDO_SCHEDULER_OP(tokenize, on_tokenize)
ORDO_SCHEDULER_OP(detokenize, on_detokenize)
ORDO_SCHEDULER_OP(model_info_query, on_model)
ORDO_SCHEDULER_OP(client_gone, on_client_gone)
ORDO_SCHEDULER_OP(session_delete, on_session_delete)
ORDO_SCHEDULER_OP(kv::kv_lookup_done, on_kv_lookup_done)
ORDO_SCHEDULER_OP(kv::kv_restore_done, on_kv_restore_done)
ORDO_SCHEDULER_OP(kv::kv_session_deleted, on_kv_session_deleted)
#undef ORDO_SCHEDULER_OP

void scheduler_actor::on(const stats_query& m) {
    std::vector<outgoing_event> out;
    _core.on_stats(m, out);
    for (auto& e : out) {
        auto* d = std::get_if<net::stats_done>(&e);
        if (d == nullptr) continue;
        if (_opt.kv_report) d->stats.kv_disk = _opt.kv_report();
        d->stats.logits_slots_held = _logits != nullptr ? _logits->held() : 0;
        d->stats.rss_bytes = resident_bytes();
    }
    after(out);
}

void scheduler_actor::on(const kv::kv_save_done& m) {
    _core.on_kv_save_done(m);
    std::vector<outgoing_event> none;
    after(none);  // unpinned blocks may let a waiting request run
}

void scheduler_actor::on(const kv::kv_evicted& m) {
    _core.on_kv_evicted(m);
}

void scheduler_actor::on(const kv::kv_status& m) {
    if (m.persisting) {
        log().info("kv persistence is on again");
    } else {
        log().warn("{}", m.reason);
    }
    _core.on_kv_status(m);
    std::vector<outgoing_event> none;
    after(none);  // health changes
}

void scheduler_actor::on(const gpu::device_ready& m) {
    log().info("device ready: {} (epoch {}, {} kv blocks of {} tokens)", m.device, m.epoch,
               m.kv_blocks, m.kv_block_tokens);
    std::vector<outgoing_event> out;
    _core.on_device_ready(m, out);
    if (auto h = _core.health(); h.first == "degraded") log().error("not serving: {}", h.second);
    after(out);
}

void scheduler_actor::on(const gpu::device_unavailable& m) {
    log().error("device unavailable: {}", m.message);
    std::vector<outgoing_event> out;
    _core.on_device_unavailable(m, out);
    after(out);
}

// `fault`: arms a fault through the real path: the gpu kinds in the gpu actor's fault plan,
// the kv kinds ("kv_*") in the kv actor's, mailbox_refuse on the named actor's mailbox.
void scheduler_actor::on(const fault& m) {
    std::vector<outgoing_event> out;
    const bool kv_kind = m.spec.kind.starts_with("kv_");
    if (!_opt.faults_enabled) {
        out.push_back(error_event(m.conn, m.id, net::errc::fault_disabled,
                                  "fault injection is off ([fault] enabled = false)"));
    } else if (kv_kind && !_kv_out.bound()) {
        out.push_back(
            error_event(m.conn, m.id, net::errc::bad_request, "kv faults need [kv] enabled"));
    } else if (kv_kind) {
        // Ordered after every kv request sent before it: "the next save" is the next one the
        // kv actor receives.
        _to_kv.send(kv::kv_fault{m.spec.kind, m.spec.count});
        log().warn("fault armed by conn {} id {}: {} x{}", m.conn, m.id, m.spec.kind, m.spec.count);
        out.push_back(net::fault_done{m.conn, m.id, m.spec.kind});
    } else if (m.spec.kind == "mailbox_refuse") {
        arm_mailbox_refusal(m, out);
    } else if (m.spec.kind.starts_with("net_")) {
        if (auto st = _core.arm_net_fault(m.spec); !st.ok()) {
            out.push_back(error_event(m.conn, m.id, net::errc::bad_request, st.err().message));
        } else {
            std::string detail = fmt::format(
                "the connections of the next {} request(s) to reach {} {}", m.spec.count,
                m.spec.phase,
                m.spec.kind == "net_fin"   ? "are closed (FIN)"
                : m.spec.kind == "net_rst" ? "are reset (RST)"
                                           : fmt::format("are not read for {} ms", m.spec.delay_ms));
            log().warn("fault armed by conn {} id {}: {}: {}", m.conn, m.id, m.spec.kind, detail);
            out.push_back(net::fault_done{m.conn, m.id, m.spec.kind, detail});
        }
    } else if (auto st = _to_gpu.tell(m.spec); !st.ok()) {
        out.push_back(error_event(m.conn, m.id, net::errc::overloaded,
                                  "the gpu actor refused the fault: " + st.err().message));
    } else {
        std::string detail;
        if (m.spec.kind == "step_delay") {
            detail = fmt::format("{} {} step(s) after {} wait {} ms each before they run",
                                 m.spec.count, m.spec.phase.empty() ? "matching" : m.spec.phase,
                                 m.spec.after_steps, m.spec.delay_ms);
        }
        log().warn("fault armed by conn {} id {}: {} {}", m.conn, m.id, m.spec.kind, detail);
        out.push_back(net::fault_done{m.conn, m.id, m.spec.kind, detail});
    }
    after(out);
}

// mailbox_refuse: the named actor's mailbox refuses its next spec.count pushes with
// mailbox_full. Armed synchronously (actor_core::refuse_next) before fault_done is sent, so a
// request the client sends after reading fault_done meets the refusals. An armed net mailbox
// also refuses that fault_done first: the net delivery retries it like any other event.
void scheduler_actor::arm_mailbox_refusal(const fault& m, std::vector<outgoing_event>& out) {
    actors::actor_core* target = m.actor == "scheduler" ? this
                                 : m.actor == "net"     ? _net_actor
                                 : m.actor == "gpu"     ? _gpu_actor
                                 : m.actor == "kv"      ? _kv_actor
                                                        : nullptr;
    if (target == nullptr) {
        out.push_back(error_event(m.conn, m.id, net::errc::bad_request,
                                  "actor \"" + m.actor + "\" is not running here" +
                                      (m.actor == "kv" ? " ([kv] enabled = false)" : "")));
        return;
    }
    target->refuse_next(m.spec.count);
    std::string detail = fmt::format("the {} actor's mailbox refuses its next {} push(es)",
                                     m.actor, m.spec.count);
    log().warn("fault armed by conn {} id {}: mailbox_refuse: {}", m.conn, m.id, detail);
    out.push_back(net::fault_done{m.conn, m.id, m.spec.kind, detail});
}

void scheduler_actor::on(const drain& m) {
    if (_draining) return;
    _draining = true;
    _core.begin_drain();
    log().info("draining: {} live requests, up to {} ms", _core.live_requests(), m.grace_ms);
    uv_timer_start(&_drain_timer, &scheduler_actor::drain_cb, m.grace_ms, 0);
    check_drained();
}

void scheduler_actor::drain_cb(uv_timer_t* t) {
    auto& self = *static_cast<scheduler_actor*>(t->data);
    self.log().warn("drain grace over: ending {} requests with shutting_down",
                    self._core.live_requests());
    std::vector<outgoing_event> out;
    self._core.shutdown(out);
    self.after(out);
}

void scheduler_actor::check_drained() {
    if (!_draining || _drained || _core.live_requests() != 0) return;
    _drained = true;
    uv_timer_stop(&_drain_timer);
    log().info("drained");
    if (_opt.on_drained) _opt.on_drained();
}

void scheduler_actor::on(const gpu::step_done& m) {
    uv_timer_stop(&_backstop);
    std::vector<outgoing_event> out;
    _core.on_step_done(
        m, [&](uint32_t r) { return _logits->read_row(m.slot, r); }, out);
    if (m.slot != gpu::logits_exchange::no_slot) _logits->release(m.slot);
    after(out);
}

void scheduler_actor::on_failure(const gpu::step_done& m, const error& why) {
    if (m.slot != gpu::logits_exchange::no_slot && _logits->is_held(m.slot)) {
        _logits->release(m.slot);
    }
    std::vector<outgoing_event> out;
    _core.on_step_failed({m.step_id, "internal", why.message, "applying the step", false}, out);
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

// ---- outputs -------------------------------------------------------------------------------

void scheduler_actor::send_events(std::vector<outgoing_event>& out) {
    for (auto& e : out) std::visit([&](auto& m) { _to_net.send(std::move(m)); }, e);
}

void scheduler_actor::send_kv_requests() {
    // A give-up may answer synchronously and so queue more requests: loop until none is left.
    for (auto reqs = _core.take_kv_requests(); !reqs.empty(); reqs = _core.take_kv_requests()) {
        for (auto& r : reqs) std::visit([&](auto& m) { _to_kv.send(std::move(m)); }, r);
    }
}

// A kv request that could not be delivered gets the answer a failure would have had.
void scheduler_actor::kv_gave_up(const kv_delivery::message& m, const error& why) {
    if (!(why.code == "actor_stopped" && stopping())) {
        log().error("kv request undeliverable: {}", why.message);
    }
    std::vector<outgoing_event> out;
    std::visit(
        [&](const auto& r) {
            using T = std::decay_t<decltype(r)>;
            if constexpr (std::is_same_v<T, kv::kv_lookup>) {
                _core.on_kv_lookup_done({r.seq, 0, ""}, out);
            } else if constexpr (std::is_same_v<T, kv::kv_restore>) {
                _core.on_kv_restore_done({r.seq, false, why.code, why.message, 0}, out);
            } else if constexpr (std::is_same_v<T, kv::kv_save>) {
                _core.on_kv_save_done({r.save_id, false, why.code});
            } else if constexpr (std::is_same_v<T, kv::kv_session_delete>) {
                _core.on_kv_session_deleted({r.conn, r.id, false, why.message}, out);
            }
        },
        m);
    // A give-up may run inside send(), within after(): then that after() delivers them.
    _deferred.insert(_deferred.end(), std::make_move_iterator(out.begin()),
                     std::make_move_iterator(out.end()));
    if (!_in_after) {
        std::vector<outgoing_event> none;
        after(none);
    }
}

void scheduler_actor::after(std::vector<outgoing_event>& out) {
    _in_after = true;
    send_events(out);
    send_kv_requests();
    while (!_deferred.empty()) {
        std::vector<outgoing_event> deferred = std::exchange(_deferred, {});
        send_events(deferred);
        send_kv_requests();
    }
    _in_after = false;
    while (!_lost_conns.empty()) {
        uint64_t conn = *_lost_conns.begin();
        _lost_conns.erase(_lost_conns.begin());
        std::vector<outgoing_event> none;
        _core.on_client_gone({conn, "events undeliverable"}, none);  // sends nothing
        _to_net.send(net::drop_connection{conn, "its events could not be delivered"});
    }
    auto health = _core.health();
    if (health != _health) {
        _health = health;
        _to_net.send(net::set_health{health.first, health.second});
    }
    send_net_faults();
    pump();
    send_kv_requests();  // planning asks the kv actor for disk lookups
    send_net_faults();   // a planned step may bring a request to a faulted phase
    check_drained();
}

// Net fault points that fired, after the events made before them (one ordered delivery).
void scheduler_actor::send_net_faults() {
    for (auto& f : _core.take_net_faults()) {
        log().warn("fault fired: {} on connection {}", f.kind, f.conn);
        _to_net.send(std::move(f));
    }
}

void scheduler_actor::net_gave_up(const net_delivery::message& m, const error& why) {
    _events_undelivered++;
    if (why.code == "actor_stopped" || why.code == "not_connected") return;  // no clients left
    std::visit(
        [&](const auto& e) {
            if constexpr (requires { e.conn + e.id; }) {
                log().error("event for conn {} id {} undeliverable: {}", e.conn, e.id,
                            why.message);
                _lost_conns.insert(e.conn);
            } else {
                log().error("{} undeliverable: {}", e.msg_name, why.message);
            }
        },
        m);
}

void scheduler_actor::gpu_gave_up(const gpu_delivery::message&, const error& why) {
    if (why.code == "actor_stopped" && stopping()) return;
    // Nobody can rebuild the device: say so rather than stay `loading`.
    log().error("device reset undeliverable: {}", why.message);
    std::vector<outgoing_event> out;
    _core.on_device_unavailable({"the gpu actor does not answer: " + why.message}, out);
    after(out);
}

void scheduler_actor::pump() {
    if (stopping() || _core.step_in_flight()) return;
    auto s = _core.next_step();
    if (!s) return;
    if (auto st = _to_gpu.tell(*s); !st.ok()) {
        // The gpu actor refused the step: that is a failed step like any other, and the next
        // plan is made shortly (its sequences are isolated or have failed now).
        std::vector<outgoing_event> out;
        _core.on_step_failed({s->step_id, "gpu_busy", st.err().message, "not submitted", false},
                             out);
        send_events(out);
        if (!uv_is_active(reinterpret_cast<uv_handle_t*>(&_pump_timer))) {
            uv_timer_start(&_pump_timer, &scheduler_actor::pump_cb, pump_retry_ms, 0);
        }
        return;
    }
    uv_timer_start(&_backstop, &scheduler_actor::backstop_cb, _opt.step_backstop_ms, 0);
}

void scheduler_actor::pump_cb(uv_timer_t* t) {
    auto& self = *static_cast<scheduler_actor*>(t->data);
    std::vector<outgoing_event> none;
    self.after(none);
}

void scheduler_actor::backstop_cb(uv_timer_t* t) {
    auto& self = *static_cast<scheduler_actor*>(t->data);
    uint64_t id = self._core.in_flight_step_id();
    if (id == 0) return;
    self.log().error("step {} unanswered after {} ms: asking the gpu actor to rebuild the device",
                     id, self._opt.step_backstop_ms);
    std::vector<outgoing_event> out;
    // device_lost: the scheduler waits for the device_ready the rebuild will send.
    self._core.on_step_failed(
        {id, "gpu_unanswered", "no answer from the gpu actor", "step", true}, out);
    self._gpu_control.send(gpu::reset_device{"step " + std::to_string(id) + " unanswered"});
    self.after(out);
}

}  // namespace ordo::sched
