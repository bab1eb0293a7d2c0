// scheduler_actor.hpp: the scheduler actor. Owns the scheduler_core (every request and sequence)
// and is the only sender of gpu steps.
//
// Runs on its own libuv loop. Messages are applied strictly in arrival order: typed ops and
// disconnects from the front doors, step outcomes and device events from the gpu actor. After
// each one it hands the resulting events to its delivery to their front door (ordered, bounded,
// never silently lost: an event that cannot be delivered within the bound closes that client's
// connection) and, when no step is in flight, sends the next one. A step the gpu actor refuses
// fails like any other and the next one is planned after pump_retry_ms. A backstop timer bounds
// how long a step may go unanswered (the gpu actor's own watchdog normally answers first); the
// step then fails as gpu_unanswered and the gpu actor is asked to rebuild the device, so the
// server is `loading` only while a rebuild is really under way. A handler that throws ends its
// request with error{internal}.
//
// Faults: the `fault` op and the config's fault plan ([fault] plan, seeded_fault_plan.hpp) arm
// faults through one function, arm_fault, the only place a fault kind maps to its action. Before
// each step is sent, the plan is consulted with the step's id; a gpu fault it draws is told to the
// gpu actor ahead of the step (one mailbox, in order: the gpu actor arms it before it takes the
// step, so it fires on that very step).
#pragma once

#include <uv.h>

#include <array>
#include <atomic>
#include <functional>
#include <optional>
#include <set>

#include "actors/runtime/actor.hpp"
#include "actors/runtime/delivery.hpp"
#include "actors/runtime/log.hpp"
#include "actors/runtime/outbox.hpp"
#include "door/door_msgs.hpp"
#include "gpu/gpu_msgs.hpp"
#include "gpu/logits/logits_exchange.hpp"
#include "scheduler/scheduler_core.hpp"
#include "scheduler/scheduler_msgs.hpp"
#include "scheduler/seeded_fault_plan.hpp"

namespace ordo::sched {

class scheduler_actor final
    : public actors::actor<
          scheduler_actor, generate, embed, cancel, tokenize, detokenize, model_info_query,
          stats_query, fault, session_delete, client_gone, drain, gpu::step_done, gpu::step_failed,
          gpu::device_ready, gpu::device_unavailable, gpu::fault_refused, gpu::device_progress,
          kv::kv_lookup_done, kv::kv_restore_done, kv::kv_save_done, kv::kv_evicted, kv::kv_status,
          kv::kv_session_deleted, draft::draft_reply, draft::drafter_state> {
public:
    // What the scheduler sends each front door (door/door_msgs.hpp scheduler_events).
    using net_outbox = actors::outbox_for<door::scheduler_events>;
    using gpu_outbox = actors::outbox<gpu::step, gpu::inject_fault, gpu::end_decode_steps>;
    using kv_outbox = actors::outbox<kv::kv_lookup, kv::kv_restore, kv::kv_release, kv::kv_save,
                                     kv::kv_invalidate, kv::kv_session_delete, kv::kv_fault>;
    using draft_outbox =
        actors::outbox<draft::draft_request, draft::draft_forget, gpu::inject_fault>;

    struct options {
        size_t mailbox_capacity = 65536;
        uint64_t step_backstop_ms = 60000;  // a step unanswered this long fails
        // speculative.draft_wait_ms: a drafting round unanswered this long fails (its
        // sequences decode without speculation).
        uint64_t draft_wait_ms = 30000;
        bool faults_enabled = false;      // [fault] enabled: the `fault` op is accepted
        seeded_fault_plan::options plan;  // [fault] plan; no kinds: no plan
        uint32_t plan_delay_ms = 200;     // [fault] plan_delay_ms: a planned step_delay's
        // Called on the scheduler's thread once, when a drain finds no live request.
        std::function<void()> on_drained;
        // The stats op's kv_disk map (the kv actor's report); unset: persistence is off.
        std::function<kv::kv_disk_report()> kv_report;
    };

    scheduler_actor(scheduler_core core, gpu::logits_exchange* logits, options o);

    // Before start(): where events and steps go (any actors that accept those messages). `net`
    // is the msgpack front door (door::door_kind::net); a second one is added with
    // connect_front_door.
    template <typename Net, typename Gpu>
    void connect(Net& net, Gpu& gpu) {
        connect_front_door(door::door_kind::net, net);
        _to_gpu = gpu_outbox(gpu, "scheduler");
        _gpu_control_out = actors::outbox<gpu::reset_device>(gpu, "scheduler");
        _net_actor = &net;
        _gpu_actor = &gpu;
    }
    // Before start(): the front door that receives the events of connections whose conn id
    // names `door` (door/conn_ids.hpp), and set_health.
    template <typename FrontDoor>
    void connect_front_door(door::door_kind door, FrontDoor& a) {
        _front_out[size_t(door)] = net_outbox(a, "scheduler");
    }
    // Before start(), with [kv] enabled: where kv requests go.
    template <typename Kv>
    void connect_kv(Kv& kv) {
        _kv_out = kv_outbox(kv, "scheduler");
        _kv_actor = &kv;
    }

    void on(const generate& m);
    void on(const embed& m);
    void on(const cancel& m);
    void on(const tokenize& m);
    void on(const detokenize& m);
    void on(const model_info_query& m);
    void on(const stats_query& m);
    void on(const fault& m);
    void on(const session_delete& m);
    void on(const client_gone& m);
    void on(const drain& m);
    // Before start(), with a draft model: where drafting rounds go (the draft actor).
    template <typename Drafter>
    void connect_drafter(Drafter& d) {
        _to_drafter = draft_outbox(d, "scheduler");
    }

    void on(const draft::draft_reply& m);
    void on(const draft::drafter_state& m);
    void on(const gpu::step_done& m);
    void on(const gpu::step_failed& m);
    void on(const gpu::device_ready& m);
    void on(const gpu::device_unavailable& m);
    void on(const gpu::device_progress& m);
    void on(const gpu::fault_refused& m);
    void on(const kv::kv_lookup_done& m);
    void on(const kv::kv_restore_done& m);
    void on(const kv::kv_save_done& m);
    void on(const kv::kv_evicted& m);
    void on(const kv::kv_status& m);
    void on(const kv::kv_session_deleted& m);

    // A handler threw (runtime): the request it concerned ends with error{internal}.
    template <typename T>
    requires requires(const T& m) { m.conn + m.id; }
    void on_failure(const T& m, const error& why) {
        std::vector<outgoing_event> out;
        _core.abort_request(m.conn, m.id, why.message, out);
        after(out);
    }
    // A step outcome whose handler threw: the logits slot is released, the step fails.
    void on_failure(const gpu::step_done& m, const error& why);

    // For tests, read after join(): the core's final state, what delivery gave up, the plan.
    const scheduler_core& core() const { return _core; }
    const seeded_fault_plan& plan() const { return _plan; }
    uint64_t events_undelivered() const { return _events_undelivered; }

protected:
    void on_start() override;
    void on_stop() override;

private:
    using net_delivery = actors::delivery_for<door::scheduler_events>;
    using gpu_delivery = actors::delivery<gpu::reset_device>;
    using kv_delivery = actors::delivery<kv::kv_lookup, kv::kv_restore, kv::kv_release, kv::kv_save,
                                         kv::kv_invalidate, kv::kv_session_delete, kv::kv_fault>;

    static void backstop_cb(uv_timer_t* t);
    // Stops the backstop when `step_id` is the step in flight (its answer arrived).
    void stop_backstop_for(uint64_t step_id);
    static void pump_cb(uv_timer_t* t);
    // Plans the next step after pump_retry_ms (a refused step or drafting round).
    void pump_soon();
    static void drain_cb(uv_timer_t* t);
    static void draft_wait_cb(uv_timer_t* t);
    // Requests and session_deletes that waited restore_wait_ms for the kv actor stop waiting
    // (core expire_restores, expire_session_deletes); after() sets the timer to the next such
    // instant.
    static void restore_wait_cb(uv_timer_t* t);
    void arm_restore_timer();
    // The drafting round next_step() started, and the sequences the draft actor may forget.
    void send_draft_messages();

    void send_events(std::vector<outgoing_event>& out);  // to the front doors, in order
    // To the front door `conn` belongs to.
    template <typename T>
    void send_to_conn(uint64_t conn, T m) {
        _to_front[size_t(door::door_kind_of(conn))].send(std::move(m));
    }
    void after(std::vector<outgoing_event>& out);  // deliver events, update health, pump
    // An op the core decides alone: `decide` fills the events, after() carries them out.
    template <typename M>
    void core_decides(void (scheduler_core::*decide)(const M&, std::vector<outgoing_event>&),
                      const M& m) {
        std::vector<outgoing_event> out;
        (_core.*decide)(m, out);
        after(out);
    }
    void pump();
    void check_drained();
    void net_gave_up(const net_delivery::message& m, const actors::refusal& why);
    void gpu_gave_up(const gpu_delivery::message& m, const actors::refusal& why);
    void kv_gave_up(const kv_delivery::message& m, const actors::refusal& why);
    void send_kv_requests();
    void send_net_faults();
    // Asks the gpu actor to end the step in flight early (scheduler_core::take_decode_steps_end).
    void send_decode_steps_end();

    // How arm_fault ended: armed, with what was armed in words (`text`, may be empty), or
    // refused, with the error the `fault` op answers (`code`, and why in `text`).
    struct fault_arming {
        bool armed = false;
        door::errc code = door::errc::internal;
        std::string text;
    };
    // Arms one fault through the real path: the gpu kinds in the gpu actor's armed faults (told
    // now, so ahead of any later step; plan_step: the planned step it is for, 0 for the op), the
    // kv kinds in the kv actor's (after every kv request sent before), the net kinds in the
    // core, mailbox_refuse (spec.count refusals) on the mailbox of spec.actor.
    fault_arming arm_fault(const fault_spec& spec, uint64_t plan_step);
    // The config's plan for the step about to be sent: arms what it draws, logs and counts.
    void arm_planned_fault(uint64_t step_id);
    door::fault_plan_report plan_report() const;

    scheduler_core _core;
    gpu::logits_exchange* _logits;
    options _opt;
    // Per front door (door/conn_ids.hpp): its address and the ordered, bounded
    // delivery of its events. An unbound one gives its events up as not_connected.
    std::array<net_outbox, door::door_kinds> _front_out;
    // The `fault` op's mailbox_refuse targets, set by connect()/connect_kv() (the kv one stays
    // null without [kv]). Used only for actor_core::refuse_next, which is thread-safe; never to
    // reach into the other actor's state.
    actors::actor_core* _net_actor = nullptr;
    actors::actor_core* _gpu_actor = nullptr;
    actors::actor_core* _kv_actor = nullptr;
    gpu_outbox _to_gpu;
    actors::outbox<gpu::reset_device> _gpu_control_out;
    std::array<net_delivery, door::door_kinds> _to_front;
    gpu_delivery _gpu_control;
    kv_outbox _kv_out;
    kv_delivery _to_kv;
    uv_timer_t _backstop{};
    uv_timer_t _pump_timer{};
    uv_timer_t _drain_timer{};
    uv_timer_t _draft_timer{};
    uv_timer_t _restore_timer{};
    draft_outbox _to_drafter;
    bool _draining = false;
    bool _drained = false;
    // The health last sent to the doors; none before the first, so that one is always sent.
    std::optional<std::pair<door::health_status, std::string>> _health;
    // Connections whose events delivery gave up on: their requests are cancelled and the net
    // actor is asked to close them (once each), after the current batch of sends.
    std::set<uint64_t> _lost_conns;
    uint64_t _events_undelivered = 0;
    std::vector<outgoing_event> _deferred;  // answers made by kv_gave_up
    bool _in_after = false;
    seeded_fault_plan _plan;
    bool _plan_spent_logged = false;
};

}  // namespace ordo::sched
