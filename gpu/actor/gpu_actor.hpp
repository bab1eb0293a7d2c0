// gpu_actor.hpp: the gpu actor. Owns the runner (device, pipelines, weights, KV pool) and runs
// the scheduler's steps on it, one at a time, OFF its loop: each step (and each device build)
// runs on the actor's own job thread (actors/runtime/job_thread.hpp: not libuv's process-wide
// pool, where the kv actor's file jobs could hold every thread), so the loop keeps answering
// stats, releases, fault injections and shutdown while a fence is waited on. Further steps queue in
// arrival order (at most queue_max; one more is refused with gpu_busy).
//
// Replies (gpu_msgs.hpp) go to the scheduler through one delivery (ordered, bounded: a reply
// refused by a full mailbox is offered again, and one that cannot be delivered within the bound
// is given up with its logits slot released, so no slot leaks): device_ready after start-up;
// exactly one step_done or step_failed per step. A step's logits rows (and hidden rows, for
// embeddings) are written into a logits_exchange slot acquired before the step runs (none free:
// gpu_busy); rows are checked for NaN/Inf (gpu_nan). On gpu_timeout, gpu_device_lost or any other
// device error the step fails with device_lost = true, every queued step fails the same way (their
// KV is gone), the runner is torn down (after waiting out a still-running segment, bounded by
// drain_ms) and rebuilt, then device_ready{epoch + 1}. reset_device (the scheduler's backstop)
// starts the same rebuild. More than recovery_max rebuilds without a successful step in between:
// device_unavailable, and every later step fails with gpu_unavailable. After stop, steps are
// refused by the runtime (actor_stopped) and queued ones fail with gpu_stopped.
//
// The first build is retried the same way: one that fails on a device fault (a warm-up that
// outlived gpu.warmup_ms_max, a lost device, no memory) is tried again, up to recovery_max more
// times, before device_unavailable; one that fails on the model or the config (gpu_bad_config,
// gpu_unsupported*, ...) would fail the same way again and is not. While any build runs, the
// worker tells the scheduler how far it is (device_progress, straight to its mailbox: progress
// is not owed, so it skips the delivery; it always precedes that build's device_ready, which is
// sent only after the worker returns).
//
// KV copies (kv_copy_out / kv_copy_in, gpu_msgs.hpp) are jobs on the same FIFO as steps, under
// the same queue bound and failure rules: a device fault while copying rebuilds the device, and
// every queued step and copy then fails with gpu_device_lost. Their bytes move through the
// kv_staging slot the message names; their replies (kv_copy_done / kv_copy_failed) go through a
// second delivery to the receiver bound by connect_kv (the kv actor), optional and unbound by
// default, so the scheduler's reply table is unchanged. Each delivery keeps its own order; a
// step's reply and a later copy's reply reach different receivers, and the FIFO is what orders
// the work itself.
//
// Thread rule: the runner and the model file are touched only by the work callback while a
// job runs (_worker.busy()), and by the loop thread only while none does.
#pragma once

#include <uv.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>

#include "actors/runtime/actor.hpp"
#include "actors/runtime/delivery.hpp"
#include "actors/runtime/job_thread.hpp"
#include "actors/runtime/outbox.hpp"
#include "gpu/gpu_msgs.hpp"
#include "gpu/logits/kv_staging.hpp"
#include "gpu/logits/logits_exchange.hpp"
#include "gpu/runner/armed_faults.hpp"
#include "gpu/runner/runner.hpp"

namespace ordo::gpu {

using gpu_replies = actors::outbox<step_done, step_failed, device_ready, device_unavailable,
                                   fault_refused, device_progress>;
using kv_copy_replies = actors::outbox<kv_copy_done, kv_copy_failed>;

struct gpu_actor_options {
    std::string name = "gpu";  // the actor's (its log lines'): "draft-gpu" for a draft model
    std::string model_path;
    runner_options runner;
    std::uint32_t recovery_max = 3;   // gpu.recovery_max
    std::uint32_t queue_max = 16;     // steps and KV copies waiting behind the running job
    std::uint64_t drain_ms = 60'000;  // after a timeout: wait this long for the segment to end
    std::size_t mailbox_capacity = 1024;
    // Observation hook for tests: called on the worker thread as a step starts running.
    std::function<void(const step&)> on_step_begin;
};

class gpu_actor final : public actors::actor<gpu_actor, step, inject_fault, reset_device,
                                             kv_copy_out, kv_copy_in, end_decode_steps> {
public:
    // `exchange` must outlive the actor; its n_vocab must equal the model's and its rows_max
    // must be at least options.runner.rows_max (checked at build: device_unavailable if not).
    gpu_actor(gpu_actor_options options, logits_exchange& exchange, gpu_replies replies);
    ~gpu_actor() override;

    // Binds the KV copy path: the staging the copies name slots of (must outlive the actor) and
    // the receiver of their replies. Before start() only; unbound, every copy fails with
    // gpu_bad_request (and its reply, with no receiver, is given up and counted).
    void connect_kv(kv_staging& staging, kv_copy_replies replies);

    void on(const step& m);
    void on(const kv_copy_out& m);
    void on(const kv_copy_in& m);
    void on(const inject_fault& m);
    void on(const reset_device& m);
    void on(const end_decode_steps& m);

    // Replies given up by the delivery (for tests, after join()).
    std::uint64_t replies_undelivered() const { return _replies_undelivered; }
    std::uint64_t progress_refused() const { return _progress_refused.load(); }
    // end_decode_steps messages taken (tests: the loop has seen one before a held step goes on).
    std::uint64_t decode_steps_ends() const { return _decode_steps_ends.load(); }

protected:
    void on_start() override;
    void on_stop() override;

private:
    enum class state { starting, ready, recovering, unavailable };
    enum class job_kind { build, rebuild, step, kv_copy };
    using kv_copy = std::variant<kv_copy_out, kv_copy_in>;
    using queued = std::variant<step, kv_copy>;
    // One job on the job thread: inputs set by the loop, outputs by the worker.
    struct job {
        job_kind kind = job_kind::build;
        step msg;
        kv_copy copy;  // job_kind::kv_copy
        std::uint64_t copy_bytes = 0;
        std::uint32_t slot = logits_exchange::no_slot;
        step_fault fault;
        std::optional<error> err;
        step_result res;
        double run_ms = 0;             // run_step's wall time (step_done::run_ms)
        std::vector<int32_t> draws;    // a step of decode_steps > 1: step_done::draws
        std::uint32_t iterations = 1;  // and the iterations it ran (step_done::decode_steps)
        bool nan = false;
        std::string segment;
        std::unique_ptr<runner> built;
        // Builds: the epoch the device will have and which try this is (device_progress).
        std::uint64_t epoch = 0;
        std::uint32_t attempt = 1, attempts_max = 1;
    };

    void start_job(job_kind kind);
    void job_done();  // loop thread, after the worker's run_job
    void run_job();   // worker thread
    void run_step_job();
    // A step of decode_steps > 1: its iterations back to back, each running the one before's
    // draws (step_draws; worker thread).
    void run_decode_steps();
    // device_ready::decode_rows_max for the runner built (the worker's, or the loop's once ready).
    std::uint32_t decode_rows_max() const;
    void run_kv_copy_job();
    void finish_build();
    void finish_step();
    void finish_kv_copy();
    bool start_kv_copy(kv_copy c);  // false: refused (replied)
    void enqueue(queued q);
    void pump();
    void begin_recovery();
    using reply_delivery = actors::delivery<step_done, step_failed, device_ready,
                                            device_unavailable, fault_refused, device_progress>;
    // Worker thread: the runner's build_progress as a device_progress to the scheduler.
    void report_progress(const build_progress& p);
    void reply_gave_up(const reply_delivery::message& m, const actors::refusal& why);
    void fail(const step& m, gpu_failure code, const std::string& message,
              const std::string& segment, bool device_lost);
    void fail_job(const queued& q, gpu_failure code, const std::string& message, bool device_lost);
    void fail_queued(gpu_failure code, const std::string& message, bool device_lost);
    using kv_delivery = actors::delivery<kv_copy_done, kv_copy_failed>;
    void fail_copy(const kv_copy& c, gpu_failure code, const std::string& message);

    gpu_actor_options _options;
    logits_exchange& _exchange;
    gpu_replies _reply_out;
    reply_delivery _replies;
    std::uint64_t _replies_undelivered = 0;
    kv_staging* _kv_staging = nullptr;  // connect_kv
    kv_copy_replies _kv_out;
    kv_delivery _kv_replies;
    bool _reset_requested = false;  // reset_device while a step ran: rebuild after it

    // Loop thread.
    state _state = state::starting;
    std::deque<queued> _queue;
    armed_faults _faults;
    std::uint64_t _epoch = 0;
    std::uint32_t _rebuilds_in_row = 0;
    std::string _device_name;
    std::uint64_t _steps = 0, _failures = 0, _recoveries = 0, _tokens = 0;
    // device_progress the receiver's mailbox refused (worker thread; read by tests).
    std::atomic<std::uint64_t> _progress_refused{0};
    // The step end_decode_steps last named (loop thread writes, the worker reads between a
    // step's decode iterations: step ids only grow, so an older one never matches), and how many
    // such messages came.
    std::atomic<std::uint64_t> _end_decode_steps_of{0};
    std::atomic<std::uint64_t> _decode_steps_ends{0};
    double _busy_ms = 0.0;

    // Worker while _worker.busy(), loop thread otherwise.
    std::unique_ptr<model::gguf_file> _file;
    std::unique_ptr<runner> _runner;
    job _job;
    actors::job_thread _worker;
};

}  // namespace ordo::gpu
