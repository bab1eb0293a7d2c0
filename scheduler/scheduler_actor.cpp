// scheduler_actor.cpp: see scheduler_actor.hpp. Everything here runs on the scheduler's loop.
#include "scheduler/scheduler_actor.hpp"

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
// A planned mailbox_refuse refuses this many messages at most: enough to make a sender take
// its retry path, far too few to reach a delivery's give-up deadline (10 s at one re-offer per
// 2 ms), so a plan exercises retries without cutting clients off.
constexpr uint32_t plan_refusals_max = 16;

}  // namespace

scheduler_actor::scheduler_actor(scheduler_core core, gpu::logits_exchange* logits, options o)
    : actor("scheduler", o.mailbox_capacity),
      _core(std::move(core)),
      _logits(logits),
      _opt(std::move(o)),
      _plan(_opt.plan) {}

void scheduler_actor::on_start() {
    for (uv_timer_t* t :
         {&_backstop, &_pump_timer, &_drain_timer, &_draft_timer, &_restore_timer}) {
        uv_timer_init(loop(), t);
        t->data = this;
    }
    for (size_t d = 0; d < door::door_kinds; d++) {
        must(_to_front[d].init(loop(), _front_out[d], net_delivery_limits,
                               [this](const net_delivery::message& m, const actors::refusal& why) {
                                   net_gave_up(m, why);
                               }),
             "delivery init");
    }
    must(_gpu_control.init(loop(), _gpu_control_out, gpu_delivery_limits,
                           [this](const gpu_delivery::message& m, const actors::refusal& why) {
                               gpu_gave_up(m, why);
                           }),
         "delivery init");
    must(_to_kv.init(loop(), _kv_out, kv_delivery_limits,
                     [this](const kv_delivery::message& m, const actors::refusal& why) {
                         kv_gave_up(m, why);
                     }),
         "delivery init");
    std::vector<outgoing_event> none;
    after(none);  // publish the initial health ("loading")
}

void scheduler_actor::on_stop() {
    std::vector<outgoing_event> out;
    _core.shutdown(out);
    send_events(out);
    for (auto& d : _to_front) d.close();
    _gpu_control.close();
    _to_kv.close();
    for (uv_timer_t* t :
         {&_backstop, &_pump_timer, &_drain_timer, &_draft_timer, &_restore_timer}) {
        uv_close(reinterpret_cast<uv_handle_t*>(t), nullptr);
    }
}

// ---- inputs --------------------------------------------------------------------------------

// Each op: the core decides (core_decides), after() carries out what it decided.
void scheduler_actor::on(const generate& m) {
    core_decides(&scheduler_core::on_generate, m);
}
void scheduler_actor::on(const embed& m) {
    core_decides(&scheduler_core::on_embed, m);
}
void scheduler_actor::on(const cancel& m) {
    core_decides(&scheduler_core::on_cancel, m);
}
void scheduler_actor::on(const tokenize& m) {
    core_decides(&scheduler_core::on_tokenize, m);
}
void scheduler_actor::on(const detokenize& m) {
    core_decides(&scheduler_core::on_detokenize, m);
}
void scheduler_actor::on(const model_info_query& m) {
    core_decides(&scheduler_core::on_model, m);
}
void scheduler_actor::on(const client_gone& m) {
    core_decides(&scheduler_core::on_client_gone, m);
}
void scheduler_actor::on(const session_delete& m) {
    core_decides(&scheduler_core::on_session_delete, m);
}
void scheduler_actor::on(const kv::kv_lookup_done& m) {
    core_decides(&scheduler_core::on_kv_lookup_done, m);
}
void scheduler_actor::on(const kv::kv_restore_done& m) {
    core_decides(&scheduler_core::on_kv_restore_done, m);
}
void scheduler_actor::on(const kv::kv_session_deleted& m) {
    core_decides(&scheduler_core::on_kv_session_deleted, m);
}

void scheduler_actor::on(const stats_query& m) {
    std::vector<outgoing_event> out;
    _core.on_stats(m, out);
    for (auto& e : out) {
        auto* d = std::get_if<door::stats_done>(&e);
        if (d == nullptr) continue;
        if (_opt.kv_report) d->stats.kv_disk = _opt.kv_report();
        d->stats.logits_slots_held = _logits != nullptr ? _logits->held() : 0;
        d->stats.rss_bytes = resident_bytes();
        d->stats.log_lines_dropped = ordo::log_lines_dropped();
        d->stats.fault_plan = plan_report();
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
    if (auto h = _core.health(); h.first == door::health_status::degraded) {
        log().error("not serving: {}", h.second);
    }
    after(out);
}

void scheduler_actor::on(const gpu::device_unavailable& m) {
    log().error("device unavailable: {}", m.message);
    std::vector<outgoing_event> out;
    _core.on_device_unavailable(m, out);
    after(out);
}

void scheduler_actor::on(const gpu::device_progress& m) {
    _core.on_device_progress(m);
    std::vector<outgoing_event> none;
    after(none);  // health's reason changes
}

// `fault`: arms the fault the op names (arm_fault) and answers what was armed.
void scheduler_actor::on(const fault& m) {
    std::vector<outgoing_event> out;
    if (!_opt.faults_enabled) {
        out.push_back(error_event(m.conn, m.id, door::errc::fault_disabled,
                                  "fault injection is off ([fault] enabled = false)"));
    } else if (fault_arming a = arm_fault(m.spec, 0); !a.armed) {
        out.push_back(error_event(m.conn, m.id, a.code, std::move(a.text)));
    } else {
        log().warn("fault armed by conn {} id {}: {} x{}{}{}", m.conn, m.id, enum_name(m.spec.kind),
                   m.spec.count, a.text.empty() ? "" : ": ", a.text);
        out.push_back(door::fault_done{m.conn, m.id, m.spec.kind, std::move(a.text)});
    }
    after(out);
}

// The one mapping of a fault kind to its action (the `fault` op and the plan both come here).
// mailbox_refuse is armed synchronously (actor_core::refuse_next), before the op's fault_done
// is sent, so a request the client sends after reading fault_done meets the refusals; an armed
// net mailbox also refuses that fault_done first, and the net delivery retries it like any
// other event. A kv fault is ordered after every kv request sent before it: "the next save" is
// the next one the kv actor receives.
scheduler_actor::fault_arming scheduler_actor::arm_fault(const fault_spec& spec,
                                                         uint64_t plan_step) {
    using fk = fault_kind;
    const fk kind = spec.kind;
    switch (kind) {
        case fk::device_lost:
        case fk::hang:
        case fk::nan_logits:
        case fk::step_delay: {
            const gpu::inject_fault f{kind,       spec.gpu_phase, spec.layer, spec.after_steps,
                                      spec.count, spec.delay_ms,  plan_step};
            if (auto st = _to_gpu.tell(f); !st.ok()) {
                return {false, door::errc::overloaded,
                        "the gpu actor refused the fault: " + st.err().message};
            }
            if (kind != fk::step_delay) return {true, {}, ""};
            return {
                true,
                {},
                fmt::format("{} {} step(s) after {} wait {} ms each before they run", spec.count,
                            spec.gpu_phase ? enum_name(*spec.gpu_phase) : "matching",
                            spec.after_steps, spec.delay_ms)};
        }
        case fk::mailbox_refuse: {
            using fa = fault_actor;
            actors::actor_core* target = spec.actor == fa::scheduler ? this
                                         : spec.actor == fa::net     ? _net_actor
                                         : spec.actor == fa::gpu     ? _gpu_actor
                                         : spec.actor == fa::kv      ? _kv_actor
                                                                     : nullptr;
            const std::string_view actor = enum_name(spec.actor);
            if (target == nullptr) {
                return {false, door::errc::bad_request,
                        fmt::format("actor \"{}\" is not running here{}", actor,
                                    spec.actor == fa::kv ? " ([kv] enabled = false)" : "")};
            }
            target->refuse_next(spec.count);
            return {true,
                    {},
                    fmt::format("the {} actor's mailbox refuses its next {} push(es)", actor,
                                spec.count)};
        }
        case fk::kv_enospc:
        case fk::kv_eio:
        case fk::kv_torn_exit:
        case fk::kv_flip_read:
        case fk::kv_stall_read:
        case fk::kv_stall_unlink:
        case fk::kv_fingerprint:
            if (!_kv_out.bound()) {
                return {false, door::errc::bad_request, "kv faults need [kv] enabled"};
            }
            _to_kv.send(kv::kv_fault{kind, spec.count, spec.delay_ms});
            if (!is_kv_stall_fault(kind)) return {true, {}, ""};
            return {
                true,
                {},
                fmt::format("the next {} {} wait {} ms before they {}", spec.count,
                            kind == fk::kv_stall_read ? "restore(s)" : "session file removal(s)",
                            spec.delay_ms, kind == fk::kv_stall_read ? "read" : "unlink")};
        case fk::draft_fail:
            if (_to_drafter.bound()) {
                // A draft model's step fails through its device's real failure path: the draft
                // gpu actor loses the device on its next step(s) and rebuilds it.
                const gpu::inject_fault f{fk::device_lost, std::nullopt, -1, 0, spec.count, 0, 0};
                if (auto st = _to_drafter.tell(f); !st.ok()) {
                    return {false, door::errc::overloaded,
                            "the draft actor refused the fault: " + st.err().message};
                }
                return {
                    true,
                    {},
                    fmt::format("the draft model's next {} step(s) lose its device", spec.count)};
            }
            [[fallthrough]];
        case fk::draft_garbage:
        case fk::draft_eos:
            // Armed in the core; fired at the next drafting round of a speculating sequence.
            if (auto st = _core.arm_draft_fault(spec); !st.ok()) {
                return {false, door::errc::bad_request, st.err().message};
            }
            return {true,
                    {},
                    fmt::format("the next {} drafting round(s) {}", spec.count,
                                kind == fk::draft_fail      ? "fail"
                                : kind == fk::draft_garbage ? "propose random tokens"
                                                            : "propose end of generation first")};
        case fk::net_fin:
        case fk::net_rst:
        case fk::net_stop_reading: {
            // Armed in the core; fired when a request reaches spec.net_phase
            // (send_net_faults).
            if (auto st = _core.arm_net_fault(spec); !st.ok()) {
                return {false, door::errc::bad_request, st.err().message};
            }
            return {true,
                    {},
                    fmt::format("the connections of the next {} request(s) to reach {} {}",
                                spec.count, enum_name(spec.net_phase),
                                kind == fk::net_fin ? "are closed (FIN)"
                                : kind == fk::net_rst
                                    ? "are reset (RST)"
                                    : fmt::format("are not read for {} ms", spec.delay_ms))};
        }
    }
    return {false, door::errc::internal, "fault kind out of range"};
}

// ---- the config's fault plan ---------------------------------------------------------------
//
// Each step about to be sent draws from the plan with its step id (seeded_fault_plan.hpp: a
// function of seed and step id only). A drawn fault is armed the way the `fault` op arms one, with
// the plainest parameters: count 1, any phase, after 0 steps, so a gpu kind fires on this very step
// (told before the step: the gpu actor's mailbox keeps the order). If the step itself is then
// refused, the gpu fault stays armed and fires on the next step instead. A kv kind applies to the
// kv actor's next save or restore, whenever that comes. mailbox_refuse picks one of the running
// actors and 1..plan_refusals_max refusals from the draw's pick word. A fault whose target refuses
// it (the gpu mailbox now, the gpu actor's armed faults, full, later, by fault_refused) does not
// count as fired.

void scheduler_actor::arm_planned_fault(uint64_t step_id) {
    if (!_plan.active()) return;
    auto d = _plan.next(step_id);
    if (!d) {
        if (_plan.spent() && !_plan_spent_logged) {
            _plan_spent_logged = true;
            log().warn("fault plan: spent after {} faults (plan_faults_max, seed {})",
                       _plan.fired(), _plan.opts().seed);
        }
        return;
    }
    fault_spec spec;
    spec.kind = d->kind;
    if (d->kind == fault_kind::step_delay || is_kv_stall_fault(d->kind)) {
        spec.delay_ms = _opt.plan_delay_ms;
    }
    if (is_net_fault(d->kind)) {
        // A request phase from the draw; the pause of net_stop_reading is plan_delay_ms.
        spec.net_phase = request_phase(d->pick % enum_count<request_phase>);
        if (d->kind == fault_kind::net_stop_reading) spec.delay_ms = _opt.plan_delay_ms;
    }
    if (d->kind == fault_kind::mailbox_refuse) {
        std::vector<fault_actor> running{fault_actor::scheduler};
        if (_net_actor != nullptr) running.push_back(fault_actor::net);
        if (_gpu_actor != nullptr) running.push_back(fault_actor::gpu);
        if (_kv_actor != nullptr) running.push_back(fault_actor::kv);
        spec.actor = running[d->pick % running.size()];
        spec.count = 1 + uint32_t((d->pick / running.size()) % plan_refusals_max);
    }
    fault_arming a = arm_fault(spec, step_id);
    const std::string_view kind = enum_name(d->kind);
    if (!a.armed) {
        _plan.not_fired(d->kind);
        log().warn("fault plan: step {}: {} not armed (seed {}): {}", step_id, kind,
                   _plan.opts().seed, a.text);
        return;
    }
    log().warn("fault plan: step {}: {}{}{} (seed {}, fault {} of at most {})", step_id, kind,
               a.text.empty() ? "" : ": ", a.text, _plan.opts().seed, _plan.fired(),
               _plan.opts().faults_max);
}

void scheduler_actor::on(const gpu::fault_refused& m) {
    // Only a fault the plan counted is taken back (the gpu actor answers planned ones only).
    if (enum_valid(m.kind) && _plan.fired(m.kind) != 0) _plan.not_fired(m.kind);
    log().warn("fault plan: step {}: {} refused by the gpu actor, not fired: {}", m.plan_step,
               enum_name(m.kind), m.message);
}

door::fault_plan_report scheduler_actor::plan_report() const {
    door::fault_plan_report r;
    if (!_plan.active()) return r;
    r.active = true;
    r.seed = _plan.opts().seed;
    r.fired = _plan.fired();
    r.refused = _plan.refused();
    r.spent = _plan.spent();
    for (std::size_t i = 0; i < enum_count<fault_kind>; ++i) {
        const auto kind = static_cast<fault_kind>(i);
        if (_plan.fired(kind) != 0) r.by_kind[std::string(enum_name(kind))] = _plan.fired(kind);
    }
    return r;
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
    // The gpu actor holds a step's logits slot until this handler releases it; a reply it gave
    // up released its slot and never arrives here.
    assert(m.slot == gpu::logits_exchange::no_slot ||
           (_logits != nullptr && _logits->is_held(m.slot)));
    stop_backstop_for(m.step_id);
    std::vector<outgoing_event> out;
    _core.on_step_done(
        m, [&](uint32_t r) { return _logits->read_row(m.slot, r); },
        [&](uint32_t r) { return _logits->read_hidden_row(m.slot, r); }, out,
        m.summarized ? scheduler_core::summary_reader(
                           [&](uint32_t r) { return _logits->read_summary(m.slot, r); })
                     : scheduler_core::summary_reader());
    if (m.slot != gpu::logits_exchange::no_slot) _logits->release(m.slot);
    after(out);
}

void scheduler_actor::on_failure(const gpu::step_done& m, const error& why) {
    if (m.slot != gpu::logits_exchange::no_slot && _logits->is_held(m.slot)) {
        _logits->release(m.slot);
    }
    std::vector<outgoing_event> out;
    _core.on_step_failed(
        {m.step_id, gpu::gpu_failure::internal, why.message, "applying the step", false}, out);
    after(out);
}

// The backstop times the step in flight: a late answer to an earlier step (given up after its
// backstop fired) must not disarm it for the step that runs now.
void scheduler_actor::stop_backstop_for(uint64_t step_id) {
    if (_core.step_in_flight() && _core.in_flight_step_id() == step_id) {
        uv_timer_stop(&_backstop);
    }
}

void scheduler_actor::on(const gpu::step_failed& m) {
    stop_backstop_for(m.step_id);
    log().warn("step {} failed: {} in {}: {}{}", m.step_id, enum_name(m.code), m.segment, m.message,
               m.device_lost ? " (device lost)" : "");
    std::vector<outgoing_event> out;
    _core.on_step_failed(m, out);
    after(out);
}

// ---- outputs -------------------------------------------------------------------------------

void scheduler_actor::send_events(std::vector<outgoing_event>& out) {
    for (auto& e : out) std::visit([&](auto& m) { send_to_conn(m.conn, std::move(m)); }, e);
}

void scheduler_actor::send_kv_requests() {
    // A give-up may answer synchronously and so queue more requests: loop until none is left.
    for (auto reqs = _core.take_kv_requests(); !reqs.empty(); reqs = _core.take_kv_requests()) {
        for (auto& r : reqs) std::visit([&](auto& m) { _to_kv.send(std::move(m)); }, r);
    }
}

// A kv request that could not be delivered gets the answer a failure would have had.
void scheduler_actor::kv_gave_up(const kv_delivery::message& m, const actors::refusal& why) {
    if (!(why.outcome == actors::delivery_outcome::actor_stopped && stopping())) {
        log().error("kv request undeliverable: {}", why.message);
    }
    std::vector<outgoing_event> out;
    std::visit(
        [&](const auto& r) {
            using T = std::decay_t<decltype(r)>;
            if constexpr (std::is_same_v<T, kv::kv_lookup>) {
                _core.on_kv_lookup_done({r.seq, 0, ""}, out);
            } else if constexpr (std::is_same_v<T, kv::kv_restore>) {
                _core.on_kv_restore_done(
                    {r.seq, false, kv::kv_failure_of(why.outcome), why.message, 0}, out);
            } else if constexpr (std::is_same_v<T, kv::kv_save>) {
                _core.on_kv_save_done({r.save_id, false, kv::kv_failure_of(why.outcome)});
            } else if constexpr (std::is_same_v<T, kv::kv_session_delete>) {
                _core.on_kv_session_deleted({r.conn, r.id, false, why.message, r.ticket}, out);
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
    {
        // Cleared on every way out, a throw included (a handler's error is caught by the actor
        // layer): a flag left set would keep kv_gave_up's answers deferred for good.
        struct in_after_scope {
            bool& flag;
            explicit in_after_scope(bool& f) : flag(f) { flag = true; }
            ~in_after_scope() { flag = false; }
        } scope(_in_after);
        send_events(out);
        send_kv_requests();
        while (!_deferred.empty()) {
            std::vector<outgoing_event> deferred = std::exchange(_deferred, {});
            send_events(deferred);
            send_kv_requests();
        }
    }
    while (!_lost_conns.empty()) {
        uint64_t conn = *_lost_conns.begin();
        _lost_conns.erase(_lost_conns.begin());
        std::vector<outgoing_event> none;
        _core.on_client_gone({conn, "events undeliverable"}, none);  // sends nothing
        send_to_conn(conn, door::drop_connection{conn, "its events could not be delivered"});
    }
    auto health = _core.health();
    if (health != _health) {
        _health = health;
        for (size_t d = 0; d < door::door_kinds; d++) {
            if (_front_out[d].bound()) {
                _to_front[d].send(door::set_health{health.first, health.second});
            }
        }
    }
    send_net_faults();
    send_decode_steps_end();
    pump();
    send_kv_requests();  // planning asks the kv actor for disk lookups
    send_net_faults();   // a planned step may bring a request to a faulted phase
    arm_restore_timer();
    check_drained();
}

// A step of several decode iterations that would keep a request waiting ends after the
// iteration running. Best effort: refused, the step runs its iterations and the request waits
// for them, as it would have without the message.
void scheduler_actor::send_decode_steps_end() {
    if (auto id = _core.take_decode_steps_end()) {
        if (auto st = _to_gpu.tell(gpu::end_decode_steps{*id}); !st.ok()) {
            log().warn("end_decode_steps for step {} not delivered: {}", *id, st.err().message);
        }
    }
}

void scheduler_actor::arm_restore_timer() {
    if (stopping()) return;
    auto due = _core.restore_deadline();
    if (auto d = _core.session_delete_deadline(); d && (!due || *d < *due)) due = d;
    if (!due) {
        uv_timer_stop(&_restore_timer);
        return;
    }
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(*due - scheduler_core::clock::now());
    uv_timer_start(&_restore_timer, &scheduler_actor::restore_wait_cb,
                   uint64_t(std::max<int64_t>(0, left.count())), 0);
}

void scheduler_actor::restore_wait_cb(uv_timer_t* t) {
    auto& self = *static_cast<scheduler_actor*>(t->data);
    const auto now = scheduler_core::clock::now();
    self._core.expire_restores(now);
    std::vector<outgoing_event> out;  // the late session_deletes' errors
    self._core.expire_session_deletes(now, out);
    self.after(out);  // delivers them, logs the notes, plans the recomputes, re-arms
}

// Net fault points that fired, after the events made before them (one ordered delivery).
// The core's notes (fallbacks, draft faults fired) are logged here too: both are taken after
// every input and every planned step.
void scheduler_actor::send_net_faults() {
    for (const std::string& note : _core.take_notes()) log().info("{}", note);
    for (auto& f : _core.take_net_faults()) {
        log().warn("fault fired: {} on connection {}", enum_name(f.kind), f.conn);
        send_to_conn(f.conn, std::move(f));
    }
}

void scheduler_actor::net_gave_up(const net_delivery::message& m, const actors::refusal& why) {
    _events_undelivered++;
    if (why.outcome == actors::delivery_outcome::actor_stopped ||
        why.outcome == actors::delivery_outcome::not_connected) {
        return;  // no clients left
    }
    std::visit(
        [&](const auto& e) {
            if constexpr (requires { e.conn + e.id; }) {
                log().error("event for conn {} id {} undeliverable: {}", e.conn, e.id, why.message);
                _lost_conns.insert(e.conn);
            } else {
                log().error("{} undeliverable: {}", e.msg_name, why.message);
            }
        },
        m);
}

void scheduler_actor::gpu_gave_up(const gpu_delivery::message&, const actors::refusal& why) {
    if (why.outcome == actors::delivery_outcome::actor_stopped && stopping()) return;
    // Nobody can rebuild the device: say so rather than stay `loading`.
    log().error("device reset undeliverable: {}", why.message);
    std::vector<outgoing_event> out;
    _core.on_device_unavailable({"the gpu actor does not answer: " + why.message}, out);
    after(out);
}

void scheduler_actor::pump() {
    if (stopping() || _core.step_in_flight()) return;
    auto s = _core.next_step();
    send_draft_messages();
    if (!s) return;
    // The step sent is the one the core waits for; 0 names no step (backstop_cb).
    assert(s->step_id != 0 && _core.in_flight_step_id() == s->step_id);
    arm_planned_fault(s->step_id);  // before the step: a gpu fault fires on this very step
    if (auto st = _to_gpu.tell(*s); !st.ok()) {
        // The gpu actor refused the step: that is a failed step like any other, and the next
        // plan is made shortly (its sequences are isolated or have failed now).
        std::vector<outgoing_event> out;
        _core.on_step_failed(
            {s->step_id, gpu::gpu_failure::busy, st.err().message, "not submitted", false}, out);
        assert(!_core.step_in_flight());  // so the pump timer plans the next step
        send_events(out);
        pump_soon();
        return;
    }
    uv_timer_start(&_backstop, &scheduler_actor::backstop_cb, _opt.step_backstop_ms, 0);
}

void scheduler_actor::send_draft_messages() {
    if (auto forgets = _core.take_draft_forgets(); !forgets.empty()) {
        // Lost, it costs only draft KV, which the draft actor takes back when it needs it.
        if (auto st = _to_drafter.tell(draft::draft_forget{std::move(forgets)}); !st.ok()) {
            log().warn("draft_forget not delivered: {}", st.err().message);
        }
    }
    auto round = _core.take_draft_request();
    if (!round) return;
    if (auto st = _to_drafter.tell(*round); !st.ok()) {
        // Its sequences decode without speculation; the next plan is made now.
        _core.draft_round_failed(round->round,
                                 "the draft actor refused the round: " + st.err().message);
        pump_soon();
        return;
    }
    uv_timer_start(&_draft_timer, &scheduler_actor::draft_wait_cb, _opt.draft_wait_ms, 0);
}

void scheduler_actor::draft_wait_cb(uv_timer_t* t) {
    auto& self = *static_cast<scheduler_actor*>(t->data);
    const uint64_t round = self._core.draft_round_in_flight();
    if (round == 0) return;
    self.log().warn("drafting round {} unanswered after {} ms", round, self._opt.draft_wait_ms);
    self._core.draft_round_failed(round, "no drafts within speculative.draft_wait_ms = " +
                                             std::to_string(self._opt.draft_wait_ms) + " ms");
    std::vector<outgoing_event> none;
    self.after(none);
}

void scheduler_actor::on(const draft::draft_reply& m) {
    if (m.round == _core.draft_round_in_flight()) uv_timer_stop(&_draft_timer);
    _core.on_draft_reply(m);
    std::vector<outgoing_event> none;
    after(none);
}

void scheduler_actor::on(const draft::drafter_state& m) {
    _core.on_drafter_state(m);
    std::vector<outgoing_event> none;
    after(none);
}

void scheduler_actor::pump_soon() {
    if (!uv_is_active(reinterpret_cast<uv_handle_t*>(&_pump_timer))) {
        uv_timer_start(&_pump_timer, &scheduler_actor::pump_cb, pump_retry_ms, 0);
    }
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
        {id, gpu::gpu_failure::unanswered, "no answer from the gpu actor", "step", true}, out);
    assert(!self._core.step_in_flight());  // its late answer, if any, is stale now
    self._gpu_control.send(gpu::reset_device{"step " + std::to_string(id) + " unanswered"});
    self.after(out);
}

}  // namespace ordo::sched
