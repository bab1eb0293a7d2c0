// mailbox.hpp: the bounded multi-producer queue in front of every actor.
//
// Any thread may push; only the owning actor's loop thread drains. A push wakes the loop with
// uv_async_send, which coalesces: one wakeup drains the whole queue, so a burst of N messages
// costs one loop iteration, not N. All pushes go through one mutex-protected FIFO, so messages
// from one sender to one receiver are delivered in the order sent.
//
// Bound: at `capacity` queued envelopes a push fails with `mailbox_full` and the sender gets
// that error back synchronously. Nothing blocks and nothing is dropped silently. After close()
// (the actor is stopping) a push fails with `actor_stopped`.
//
// Fault point (the `fault` op's mailbox_refuse, docs/protocol.md): refuse_next(n) makes the next
// n pushes fail with `mailbox_full` through the very return path a full queue takes, so senders'
// bounded retries and refusal outcomes can be driven on a live server. Disarmed (the only state
// outside fault tests) it costs push() one relaxed atomic load.
#pragma once

#include <uv.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "actors/runtime/delivery_outcome.hpp"

namespace ordo::actors {

struct envelope {
    uint32_t type_index = 0;  // index into the receiver's message variant
    const char* type_name = "";
    std::string sender;
    std::vector<char> bytes;  // msgpack encoding of the message
};

class mailbox {
public:
    explicit mailbox(size_t capacity) : _capacity(capacity) {}

    // Binds the wakeup handle; called on the loop thread before the mailbox is opened.
    void open(uv_async_t* wakeup);
    // Thread-safe. Enqueues and wakes the loop, or refuses with mailbox_full / actor_stopped.
    tell_status push(envelope&& e);
    // Thread-safe: wakes the loop without a message (stop requests); no-op when closed.
    void wake();
    // Loop thread only: moves every queued envelope into `out` (appending).
    size_t drain(std::deque<envelope>& out);
    // Loop thread only: refuses every later push; the wakeup handle may then be closed.
    void close();
    // Thread-safe: the next `n` pushes (replacing what is left of an earlier arming; 0 disarms)
    // are refused with mailbox_full as if the queue were full, and counted in rejected_full().
    void refuse_next(uint32_t n) { _refuse_next.store(n, std::memory_order_relaxed); }
    uint32_t refusals_armed() const { return _refuse_next.load(std::memory_order_relaxed); }

    size_t capacity() const { return _capacity; }
    size_t size() const;
    uint64_t rejected_full() const;

private:
    mutable std::mutex _mutex;
    std::deque<envelope> _queue;
    uv_async_t* _wakeup = nullptr;  // null while not open or after close
    size_t _capacity;
    uint64_t _rejected_full = 0;
    bool _closed = false;
    // Pushes still to refuse (refuse_next). Decremented only under _mutex, so n arms exactly n
    // refusals however many threads push.
    std::atomic<uint32_t> _refuse_next{0};
};

}  // namespace ordo::actors
