// scheduler_actor.hpp: the scheduler actor. Owns the scheduler_core (every request and sequence)
// and is the only sender of gpu steps.
//
// Runs on its own libuv loop. Messages are applied strictly in arrival order: client requests
// and disconnects from the net actor, step outcomes and device events from the gpu actor. After
// each one it writes the resulting events to the net actor and, when no step is in flight,
// sends the next one. A backstop timer bounds how long a step may go unanswered (the gpu
// actor's own watchdog normally answers first); the step then fails like any other.
#pragma once

#include <uv.h>

#include <deque>

#include "actors/runtime/actor.hpp"
#include "actors/runtime/outbox.hpp"
#include "actors/scheduler/scheduler_core.hpp"
#include "actors/scheduler/scheduler_msgs.hpp"
#include "gpu/gpu_msgs.hpp"
#include "gpu/logits_exchange.hpp"
#include "net/net_msgs.hpp"

namespace ordo::sched {

class scheduler_actor final
    : public actors::actor<scheduler_actor, client_request, client_gone, gpu::step_done,
                           gpu::step_failed, gpu::device_ready, gpu::device_unavailable,
                           gpu::gpu_stats> {
public:
    using net_outbox = actors::outbox<net::deliver_event, net::set_health>;
    using gpu_outbox = actors::outbox<gpu::step, gpu::inject_fault>;

    struct options {
        size_t mailbox_capacity = 65536;
        uint64_t step_backstop_ms = 60000;  // a step unanswered this long fails
        bool faults_enabled = false;        // [fault] enabled: the `fault` op is accepted
    };

    scheduler_actor(scheduler_core core, gpu::logits_exchange* logits, options o);

    // Before start().
    void connect(net_outbox to_net, gpu_outbox to_gpu);

    void on(const client_request& m);
    void on(const client_gone& m);
    void on(const gpu::step_done& m);
    void on(const gpu::step_failed& m);
    void on(const gpu::device_ready& m);
    void on(const gpu::device_unavailable& m);
    void on(const gpu::gpu_stats& m);

    // For tests, read after join(): the core's final state.
    const scheduler_core& core() const { return _core; }

protected:
    void on_start() override;
    void on_stop() override;

private:
    static void backstop_cb(uv_timer_t* t);
    static void retry_cb(uv_timer_t* t);

    void after(std::vector<outgoing_event>& out);  // deliver events, update health, pump
    void deliver(outgoing_event e);
    void pump();
    void op_fault(const client_request& m, std::vector<outgoing_event>& out);

    scheduler_core _core;
    gpu::logits_exchange* _logits;
    options _opt;
    net_outbox _to_net;
    gpu_outbox _to_gpu;
    uv_timer_t _backstop{};
    uv_timer_t _retry{};
    // Events the net actor's full mailbox refused, retried in order: an event is never lost.
    std::deque<net::deliver_event> _undelivered;
    std::pair<std::string, std::string> _health;
};

}  // namespace ordo::sched
