// gpu_client.hpp: the other end of the gpu actor for programs that are not the scheduler:
// `reply_collector`, an actor that accepts every gpu reply (KV copy replies included) and hands
// them, in arrival order, to a waiting thread; and `gpu_session`, a blocking wrapper (start the
// actor, wait for device_ready, run a step and copy its logits out, stop) used by ordo-model
// generate
// --backend vulkan, ordo-bench and the gpu actor tests.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "actors/runtime/actor.hpp"
#include "gpu/actor/gpu_actor.hpp"
#include "gpu/gpu_msgs.hpp"
#include "gpu/logits/logits_exchange.hpp"

namespace ordo::gpu {

using gpu_reply = std::variant<step_done, step_failed, device_ready, device_unavailable,
                               fault_refused, kv_copy_done, kv_copy_failed>;

// Short name of a reply's type ("step_done"), for test messages.
std::string reply_name(const gpu_reply& r);

class reply_collector final : public actors::actor<reply_collector, step_done, step_failed,
                                                   device_ready, device_unavailable, fault_refused,
                                                   kv_copy_done, kv_copy_failed, device_progress> {
public:
    reply_collector() : actor("gpu_client", 1024) {}

    void on(const step_done& m) { push(m); }
    void on(const step_failed& m) { push(m); }
    void on(const device_ready& m) { push(m); }
    void on(const device_unavailable& m) { push(m); }
    void on(const fault_refused& m) { push(m); }
    void on(const kv_copy_done& m) { push(m); }
    void on(const kv_copy_failed& m) { push(m); }
    // Progress is not a reply: it is kept aside (the last one and a count), so next() still
    // sees only the replies.
    void on(const device_progress& m);
    std::optional<device_progress> last_progress();
    std::uint64_t progress_count();

    // The next reply in arrival order, waiting at most timeout_ms; nullopt on timeout.
    std::optional<gpu_reply> next(std::uint64_t timeout_ms);
    // The next reply if it is a T; nullopt (and the reply is dropped) otherwise or on timeout.
    template <typename T>
    std::optional<T> next_as(std::uint64_t timeout_ms) {
        auto r = next(timeout_ms);
        if (!r || !std::holds_alternative<T>(*r)) return std::nullopt;
        return std::get<T>(std::move(*r));
    }

private:
    void push(gpu_reply r);

    std::mutex _mutex;
    std::condition_variable _cv;
    std::deque<gpu_reply> _replies;
    std::optional<device_progress> _last_progress;
    std::uint64_t _progress_count = 0;
};

// Blocking use of one gpu actor from one thread.
class gpu_session {
public:
    // Reads the model's vocab size, starts the collector and the actor, waits for
    // device_ready (at most ready_timeout_ms). Errors: the model's, device_unavailable's text.
    // With `staging` (it must outlive the session) the actor's KV copies are connected to it
    // and their replies come to replies() too. summary_rows_max: the row summaries each logits
    // slot holds (logits_exchange; 0: one a row).
    static result<std::unique_ptr<gpu_session>> start(gpu_actor_options options,
                                                      std::uint64_t ready_timeout_ms,
                                                      kv_staging* staging = nullptr,
                                                      std::uint32_t summary_rows_max = 0);
    ~gpu_session();

    // Sends the step and waits for its reply (at most timeout_ms); copies the logits rows into
    // `logits` (rows x n_vocab), the hidden rows into `*hidden` when given (hidden rows x
    // n_embd), and releases the slot. A step_failed becomes an error whose code is the reply's
    // and whose message names the segment.
    result<step_done> run(const step& s, std::vector<float>& logits, std::uint64_t timeout_ms,
                          std::vector<float>* hidden = nullptr);
    // The same, reading only each row's greedy token (logits_exchange::greedy_token: from the
    // rows' summaries where the device makes them, else from the rows), as the server's greedy
    // sampler reads a step: what a decode step costs the host.
    result<step_done> run_greedy(const step& s, std::vector<std::int32_t>& tokens,
                                 std::uint64_t timeout_ms);

    const device_ready& ready() const { return _ready; }
    std::uint32_t n_vocab() const { return _exchange->n_vocab(); }
    gpu_actor& actor() { return *_actor; }
    logits_exchange& exchange() { return *_exchange; }
    reply_collector& replies() { return _collector; }
    status stop();  // stops and joins both actors; error if a loop leaked a handle

private:
    gpu_session() = default;
    // Sends the step and waits for its reply: the step_done (its slot held), or the error.
    result<step_done> send_and_wait(const step& s, std::uint64_t timeout_ms);

    reply_collector _collector;
    std::unique_ptr<logits_exchange> _exchange;
    std::unique_ptr<gpu_actor> _actor;
    device_ready _ready;
    bool _stopped = false;
};

}  // namespace ordo::gpu
