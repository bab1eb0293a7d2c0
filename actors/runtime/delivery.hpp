// delivery.hpp: bounded, ordered delivery of the messages one actor must not lose.
//
// Owned by one actor and used only on that actor's loop thread: init() in its on_start(),
// send() from its handlers, close() in its on_stop(). It owns an outbox to one receiver, a FIFO
// of messages the receiver could not take yet, and one retry timer on the owner's loop. It never
// touches the receiver's state: everything goes through the outbox (the receiver's mailbox).
//
// ---- Why ---------------------------------------------------------------------------------------
//
// A tell() can be refused. `(void)` on a send that must arrive turns a refusal into a request
// that never ends; a hand-written retry loop in each actor turns it into an unbounded queue with
// an undefined end. delivery is the one place that answers "what happens to this message":
// either the receiver's mailbox accepts it, or the owner's give_up_fn is called with the message
// and a code. There is no third outcome (no silent drop, no unbounded wait).
//
// ---- Outcomes of send(msg) ---------------------------------------------------------------------
//
//   nothing pending, receiver accepts            -> delivered, at once
//   mailbox_full, or earlier messages pending    -> appended to the pending FIFO (deferred); the
//                                                   retry timer re-offers the FIFO in order every
//                                                   retry_ms until the receiver refuses again
//   receiver stopped / outbox unbound            -> given up at once with the receiver's code
//                                                   ("actor_stopped" / "not_connected"): it will
//                                                   never take the message
//   FIFO already holds pending_max messages      -> the new one is given up, "delivery_overflow"
//   still refused deadline_ms after it was sent  -> given up, "delivery_timeout", in order; the
//                                                   next one is tried at once
//   close() (owner stopping)                     -> one last offer of the FIFO, then every message
//                                                   still pending is given up, "actor_stopped"
//   send() before init() / after close()         -> given up at once ("not_connected" /
//                                                   "actor_stopped"); before the first init()
//                                                   there is no give_up_fn: only counted
//
// Order: messages reach the receiver in the order send() was called; a message is never offered
// while an earlier one is pending. Given-up messages are reported in the same order.
//
// The deadline bounds how long a message waits undelivered: a pending message is offered first,
// and given up only if it is refused again after its deadline. A message the receiver accepts is
// delivered, however late. Deadlines are checked on the retry ticks, so a message is given up
// within deadline_ms + retry_ms of its send() (while the owner's loop is not blocked).
//
// The outcome a message is given up with is a delivery_outcome (delivery_outcome.hpp), carried in
// the refusal give_up_fn receives.
//
// give_up_fn is the owner's defined outcome (release a resource, close a connection, count). It
// is called on the loop thread and MAY BE CALLED SYNCHRONOUSLY FROM send() (and from close()). It
// must not throw (from the retry timer that would cross libuv's C frames). It may call send()
// again, but not to resend the message it is giving up through this same delivery: while closing
// that would be given up again, without end.
//
// Handle lifetime: init() initialises the retry timer, close() uv_close's it; the memory stays
// in use until the loop has run the close callback, so the delivery must live as long as the
// owner's loop runs (a member of the owning actor). init() may be called again after that (an
// actor restarted after join()). Counters accumulate over the object's lifetime.
#pragma once

#include <uv.h>

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <variant>

#include "actors/runtime/delivery_outcome.hpp"
#include "actors/runtime/outbox.hpp"
#include "actors/runtime/result.hpp"

namespace ordo::actors {

// A receiver's mailbox holds hundreds of messages (net, scheduler); 1024 waiting behind it is
// several full mailboxes, enough for a burst of token events, and still bounded memory.
inline constexpr size_t delivery_pending_max_default = 1024;
// A mailbox drains in one loop iteration of its receiver (uv_async coalesces), so a short period
// is what lets a burst through quickly; an idle delivery runs no timer at all.
inline constexpr uint64_t delivery_retry_ms_default = 2;
// A receiver that has not taken a message for 10 s is stuck, not busy: the owner gets a
// defined outcome instead of a request that never ends.
inline constexpr uint64_t delivery_deadline_ms_default = 10000;

// delivery<...>::limits; at namespace scope so configuration code can name it without the
// message list.
struct delivery_limits {
    size_t pending_max = delivery_pending_max_default;    // messages waiting in the FIFO, at most
    uint64_t retry_ms = delivery_retry_ms_default;        // period of the re-offer timer
    uint64_t deadline_ms = delivery_deadline_ms_default;  // from send() to give-up if refused
};

template <message_type... Msgs>
class delivery {
public:
    using message = std::variant<Msgs...>;
    using limits = delivery_limits;
    using give_up_fn = std::function<void(const message& msg, const refusal& why)>;

    delivery() = default;
    // The retry timer's address is registered with the loop: a delivery never moves.
    delivery(const delivery&) = delete;
    delivery& operator=(const delivery&) = delete;

    // Owner's on_start(): binds the receiver and initialises the retry timer on `loop`.
    // Refuses "delivery_open" if already open (or its close has not completed), and
    // "bad_argument" for a null loop, a zero limit or an empty give_up_fn.
    status init(uv_loop_t* loop, outbox<Msgs...> to, limits lim, give_up_fn give_up) {
        if (_state == state::open || _state == state::closing) {
            return make_error("delivery_open", "delivery::init: already open");
        }
        if (loop == nullptr || !give_up) {
            return make_error("bad_argument", "delivery::init: needs a loop and a give_up_fn");
        }
        if (lim.pending_max == 0 || lim.retry_ms == 0 || lim.deadline_ms == 0) {
            return make_error("bad_argument",
                              "delivery::init: pending_max, retry_ms and deadline_ms must be > 0");
        }
        if (int rc = uv_timer_init(loop, &_retry); rc != 0) {
            return make_error("uv_error",
                              std::string("delivery::init: uv_timer_init: ") + uv_strerror(rc));
        }
        _retry.data = this;
        _loop = loop;
        _to = std::move(to);
        _limits = lim;
        _give_up = std::move(give_up);
        _pending.clear();
        _state = state::open;
        assert(_loop != nullptr && _limits.pending_max > 0);
        return {};
    }

    // Owner's on_stop(): offers the FIFO once more, gives up what is still pending
    // ("actor_stopped"), and closes the retry timer. Later sends are given up at once.
    void close() {
        if (_state != state::open) return;
        // First, so a send() from give_up_fn below is given up rather than queued.
        _state = state::closing;
        offer_pending();
        while (!_pending.empty()) {
            message msg = std::move(_pending.front().msg);
            _pending.pop_front();
            give_up(msg, refusal{delivery_outcome::actor_stopped,
                                 "delivery closed while its owner is stopping; not delivered"});
        }
        // A send() from give_up_fn above was given up at once (closing), never queued.
        assert(_pending.empty());
        uv_close(reinterpret_cast<uv_handle_t*>(&_retry), &delivery::close_cb);
    }

    // Delivers `msg` in order, defers it, or gives it up (see the table above). May call
    // give_up_fn before it returns.
    template <typename T>
    void send(const T& msg) {
        if (_state != state::open) {
            const bool never_opened = _state == state::idle;
            give_up(message(std::in_place_type<T>, msg),
                    refusal{never_opened ? delivery_outcome::not_connected
                                         : delivery_outcome::actor_stopped,
                            std::string(T::msg_name) +
                                (never_opened ? ": delivery not initialised"
                                              : ": delivery closed (owner stopping)")});
            return;
        }
        if (_pending.empty()) {
            tell_status st = _to.tell(msg);
            if (st.ok()) {
                _delivered++;
                return;
            }
            if (st.err().outcome != delivery_outcome::mailbox_full) {
                give_up(message(std::in_place_type<T>, msg), st.err());
                return;
            }
        }
        if (_pending.size() >= _limits.pending_max) {
            give_up(message(std::in_place_type<T>, msg),
                    refusal{delivery_outcome::delivery_overflow,
                            std::string(T::msg_name) + ": " + std::to_string(_limits.pending_max) +
                                " messages already wait for the receiver"});
            return;
        }
        _pending.push_back(pending_message{message(std::in_place_type<T>, msg), uv_now(_loop)});
        assert(_pending.size() <= _limits.pending_max);
        _deferred++;
        if (!uv_is_active(reinterpret_cast<uv_handle_t*>(&_retry))) {
            uv_timer_start(&_retry, &delivery::retry_cb, _limits.retry_ms, _limits.retry_ms);
        }
    }

    uint64_t delivered() const { return _delivered; }  // accepted by the receiver's mailbox
    uint64_t deferred() const { return _deferred; }    // had to wait in the FIFO first
    uint64_t given_up() const { return _given_up; }    // handed to give_up_fn
    size_t pending() const { return _pending.size(); }
    bool is_open() const { return _state == state::open; }

private:
    // idle: never initialised. closing: uv_close called, its callback not yet run.
    // closed: the timer's memory is free again; init() may run again.
    enum class state { idle, open, closing, closed };

    struct pending_message {
        message msg;
        uint64_t sent_ms = 0;  // uv_now() at send(): the deadline counts from here
    };

    // The timer runs only while open: close() stops it (uv_close) before it could fire again.
    static void retry_cb(uv_timer_t* handle) {
        auto* self = static_cast<delivery*>(handle->data);
        assert(self->_state == state::open);
        self->offer_pending();
    }

    static void close_cb(uv_handle_t* handle) {
        auto* self = static_cast<delivery*>(handle->data);
        assert(self->_state == state::closing && self->_pending.empty());
        self->_state = state::closed;
    }

    // Offers the FIFO front to back until the receiver refuses one that is still within its
    // deadline. Re-reads the FIFO on every step: give_up_fn may send() (append) meanwhile.
    void offer_pending() {
        assert(_state == state::open || _state == state::closing);
        const uint64_t now_ms = uv_now(_loop);
        while (!_pending.empty()) {
            tell_status st =
                std::visit([this](const auto& m) { return _to.tell(m); }, _pending.front().msg);
            if (st.ok()) {
                _pending.pop_front();
                _delivered++;
                continue;
            }
            const bool full = st.err().outcome == delivery_outcome::mailbox_full;
            const uint64_t waited_ms = now_ms - _pending.front().sent_ms;
            if (full && waited_ms < _limits.deadline_ms) break;  // again on the next tick
            message msg = std::move(_pending.front().msg);
            _pending.pop_front();
            if (full) {
                give_up(msg, refusal{delivery_outcome::delivery_timeout,
                                     "receiver refused it for " + std::to_string(waited_ms) +
                                         " ms (deadline " + std::to_string(_limits.deadline_ms) +
                                         " ms)"});
            } else {
                give_up(msg, st.err());
            }
        }
        if (_pending.empty() && _state == state::open) uv_timer_stop(&_retry);
    }

    void give_up(const message& msg, const refusal& why) {
        _given_up++;
        // Empty only for a send() before the first init(), an owner bug the counter still shows.
        if (_give_up) _give_up(msg, why);
    }

    uv_loop_t* _loop = nullptr;
    uv_timer_t _retry{};  // runs only while _pending is non-empty
    outbox<Msgs...> _to;
    limits _limits;
    give_up_fn _give_up;
    std::deque<pending_message> _pending;  // front: the oldest, offered first
    state _state = state::idle;
    uint64_t _delivered = 0;
    uint64_t _deferred = 0;
    uint64_t _given_up = 0;
};

// delivery_for<type_list<Msgs...>>: delivery<Msgs...> (type_list.hpp).
struct delivery_fn {
    template <message_type... Msgs>
    using fn = delivery<Msgs...>;
};
template <typename List>
using delivery_for = list_apply_t<delivery_fn, List>;

}  // namespace ordo::actors
