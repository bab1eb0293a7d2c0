// actor.hpp: the actor runtime every ordo actor is built on.
//
// An actor owns one libuv loop, runs it on its own thread, and owns all of its state: nothing
// else touches that state, so handlers need no locks. Actors talk only through messages: plain
// structs serialized with msgpack (MSGPACK_DEFINE_MAP), each with a `msg_name`. An actor lists
// the messages it accepts as template arguments; that list is its message table
// (`message = std::variant<...>`), and delivery dispatches each alternative to an
// `on(const T&)` overload of the derived class with std::visit, so a message without a handler
// does not compile.
//
// Handler failures: a handler (or the decoding before it) that throws std::exception does not
// take the actor down; the failure is logged and counted (handler_errors()). A handler failure
// must still end the request it concerned, so an actor may declare, per message type,
//     void on_failure(const T& msg, const ordo::error& why);   // public, like on()
// and it is called with the message whose handler threw (why.code == "handler_failed"), e.g. to
// answer that request with an internal error. It is optional per type (detected with a
// requires-expression): a type without one is only counted. A message that fails to decode is
// counted as "bad_message" and not passed to on_failure: a partly decoded message could name
// the wrong request.
//
// Lifecycle (libuv verbs): start() spawns the thread and runs on_start() on it; request_stop()
// may be called from any thread (or from a signal-watching actor). The loop then stops in this
// order, so that after stop a message gets a refusal, never silence:
//   1. stopping() becomes true and the mailbox closes: every later tell() is refused
//      synchronously to its sender with `actor_stopped`;
//   2. everything queued before that is delivered to its handler as usual (handlers may check
//      stopping() to start no new work, e.g. no retry timers);
//   3. on_stop() runs: the actor ends what is still in flight and closes its own handles there.
//      No handler runs after on_stop();
//   4. the wakeup handle closes and the loop runs dry.
// join() waits for the thread and reports whether uv_loop_close returned 0, i.e. no handle
// leaked. An actor object can be started again after join().
#pragma once

#include <uv.h>

#include <array>
#include <atomic>
#include <concepts>
#include <deque>
#include <memory>
#include <msgpack.hpp>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <variant>

#include "actors/runtime/mailbox.hpp"
#include "actors/runtime/result.hpp"
#include "actors/runtime/trace.hpp"
#include "actors/runtime/type_list.hpp"

namespace spdlog {
class logger;
}

namespace ordo::actors {

// A message with no fields: MSGPACK_DEFINE_MAP() needs at least one, so this encodes `{}`.
#define ORDO_EMPTY_MESSAGE()                                       \
    template <typename Packer>                                     \
    void msgpack_pack(Packer& pk) const {                          \
        pk.pack_map(0);                                            \
    }                                                              \
    void msgpack_unpack(const msgpack::object&) {}                 \
    template <typename MSGPACK_OBJECT>                             \
    void msgpack_object(MSGPACK_OBJECT* o, msgpack::zone&) const { \
        o->type = msgpack::type::MAP;                              \
        o->via.map.size = 0;                                       \
        o->via.map.ptr = nullptr;                                  \
    }

template <typename T>
concept message_type = requires {
    { T::msg_name } -> std::convertible_to<std::string_view>;
};

// Whether actor A declares on_failure for message T (see "Handler failures" above).
template <typename A, typename T>
concept answers_failure = requires(A& a, const T& msg, const ordo::error& why) {
    a.on_failure(msg, why);
};

// Names the calling thread "ordo-<what>" (Linux keeps 15 characters), so top -H, perf and a
// debugger tell threads apart: every actor's loop thread carries its actor's name, and a libuv
// pool thread the name of the last job it ran for an actor ("ordo-gpu-job", "ordo-kv-job"; pool
// threads start with the name of the thread that made the pool). Best effort.
void name_this_thread(std::string_view what);

// The untyped half: thread, loop, mailbox, stop protocol, tracing.
class actor_core {
public:
    actor_core(std::string name, size_t mailbox_capacity);
    virtual ~actor_core();
    actor_core(const actor_core&) = delete;
    actor_core& operator=(const actor_core&) = delete;

    // Spawns the loop thread; returns once on_start() has run there.
    status start();
    // Thread-safe and idempotent; the loop winds down asynchronously.
    void request_stop();
    // Waits for the loop thread. Returns an error if uv_loop_close reported a leaked handle.
    status join();

    const std::string& name() const { return _name; }
    bool running() const { return _running.load(); }
    void set_trace(trace_sink* sink) { _trace.store(sink); }
    size_t mailbox_size() const { return _mailbox.size(); }
    size_t mailbox_capacity() const { return _mailbox.capacity(); }
    uint64_t handler_errors() const { return _handler_errors.load(); }
    uint64_t mailbox_rejected_full() const { return _mailbox.rejected_full(); }

    // Fault point, thread-safe: the next `n` tells to this actor are refused with mailbox_full
    // exactly as a full mailbox refuses them (mailbox.hpp). Only the `fault` op arms it (the
    // scheduler, for mailbox_refuse). A direct call, not a message: a message would itself go
    // through the mailbox it arms, so it could be refused (by a full or an already-refusing
    // mailbox), would count as one of the pushes, and would arm only when the target's loop got
    // to it, letting pushes slip through in between; the call arms at once, before the
    // scheduler answers fault_done, and touches nothing but the mailbox's atomic counter.
    void refuse_next(uint32_t n) { _mailbox.refuse_next(n); }

protected:
    // Loop-thread hooks for derived actors.
    virtual void on_start() {}
    virtual void on_stop() {}
    virtual void deliver(const envelope& e) = 0;

    tell_status enqueue(envelope&& e) { return _mailbox.push(std::move(e)); }
    uv_loop_t* loop() { return &_loop; }
    spdlog::logger& log() { return *_log; }
    bool stopping() const { return _stopping; }
    void count_handler_error() { _handler_errors++; }
    // For set-up steps that fail only on a programming error (bad constant limits): logs what
    // failed and aborts, rather than run an actor missing a part.
    void must(const status& st, std::string_view what);
    // Loop thread: counts one failed delivery or handler and logs it with type and sender.
    void report_failure(const envelope& e, const ordo::error& why);

private:
    static void wakeup_cb(uv_async_t* handle);
    void thread_main();
    void deliver_queued();
    void begin_stop();

    std::string _name;
    mailbox _mailbox;
    std::shared_ptr<spdlog::logger> _log;
    uv_loop_t _loop{};
    uv_async_t _wakeup{};
    std::thread _thread;
    std::deque<envelope> _inbox;  // loop thread only
    std::atomic<trace_sink*> _trace{nullptr};
    std::atomic<bool> _running{false};
    std::atomic<bool> _stop_requested{false};
    std::atomic<uint64_t> _handler_errors{0};
    bool _stopping = false;  // loop thread only
    int _loop_close_rc = 0;
};

// The typed half: Derived handles every message in Msgs with on(const T&).
template <typename Derived, message_type... Msgs>
class actor : public actor_core {
public:
    using message = std::variant<Msgs...>;
    using actor_core::actor_core;

    // Thread-safe. Encodes `msg` and queues it; mailbox_full / actor_stopped are returned to the
    // sender, never hidden.
    template <typename T>
    tell_status tell(const T& msg, std::string_view sender = "external") {
        constexpr size_t index = index_of<T>();
        static_assert(index < sizeof...(Msgs), "this actor does not accept that message type");
        msgpack::sbuffer buf;
        msgpack::pack(buf, msg);
        envelope e;
        e.type_index = static_cast<uint32_t>(index);
        e.type_name = T::msg_name;
        e.sender = std::string(sender);
        e.bytes.assign(buf.data(), buf.data() + buf.size());
        return enqueue(std::move(e));
    }

private:
    template <typename T, size_t I = 0>
    static constexpr size_t index_of() {
        if constexpr (I == sizeof...(Msgs)) {
            return I;
        } else if constexpr (std::is_same_v<std::variant_alternative_t<I, message>, T>) {
            return I;
        } else {
            return index_of<T, I + 1>();
        }
    }

    template <size_t I>
    static void decode_into(message& m, const msgpack::object& o) {
        m.template emplace<I>();
        o.convert(std::get<I>(m));
    }

    void deliver(const envelope& e) override {
        using decoder = void (*)(message&, const msgpack::object&);
        static constexpr auto decoders = []<size_t... I>(std::index_sequence<I...>) {
            return std::array<decoder, sizeof...(I)>{&decode_into<I>...};
        }
        (std::index_sequence_for<Msgs...>{});

        if (e.type_index >= decoders.size()) {
            report_failure(e,
                           make_error("bad_message", "type index " + std::to_string(e.type_index) +
                                                         " is not in the message table"));
            return;
        }
        message m;
        try {
            msgpack::object_handle oh = msgpack::unpack(e.bytes.data(), e.bytes.size());
            decoders[e.type_index](m, oh.get());
        } catch (const std::exception& ex) {
            report_failure(e,
                           make_error("bad_message", std::string("decoding failed: ") + ex.what()));
            return;
        }
        std::visit([this, &e](const auto& msg) { handle(e, msg); }, m);
    }

    // Runs on(msg); if it throws, counts and logs it and lets the actor answer via on_failure.
    template <typename T>
    void handle(const envelope& e, const T& msg) {
        auto& self = static_cast<Derived&>(*this);
        ordo::error why;
        try {
            self.on(msg);
            return;
        } catch (const std::exception& ex) {
            why = make_error("handler_failed",
                             std::string(T::msg_name) + " handler threw: " + ex.what());
        }
        report_failure(e, why);
        if constexpr (answers_failure<Derived, T>) {
            try {
                self.on_failure(msg, why);
            } catch (const std::exception& ex) {
                report_failure(
                    e, make_error("handler_failed", std::string("on_failure for ") + T::msg_name +
                                                        " threw too: " + ex.what()));
            }
        }
    }
};

// actor_for<Derived, type_list<Msgs...>>: actor<Derived, Msgs...>, for a message table written
// once as a list (type_list.hpp) and shared by several actors.
template <typename Derived>
struct actor_fn {
    template <message_type... Msgs>
    using fn = actor<Derived, Msgs...>;
};
template <typename Derived, typename List>
using actor_for = list_apply_t<actor_fn<Derived>, List>;

}  // namespace ordo::actors
