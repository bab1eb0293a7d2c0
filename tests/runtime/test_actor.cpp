// test_actor.cpp: the actor runtime on real libuv loops and threads.
//
// Checks: (1) several threads each sending thousands of messages to one actor lose none and
// per-sender order is kept; (2) at the mailbox bound a send is refused with mailbox_full and the
// message is not delivered, while everything accepted is; (3) start/stop many times in one
// process closes every loop cleanly (uv_loop_close == 0) including a timer handle the actor
// owns; (4) sends to a stopped actor are refused with actor_stopped; (5) the trace records every
// delivery with sender, receiver, type and bytes that decode back to the message; (6) a handler
// that throws does not take the actor down; (7) stop order: messages queued before the stop
// closes the mailbox are handled before on_stop(), a tell after that (even from a handler in the
// final drain) is refused with actor_stopped, and no handler runs after on_stop(); (8) a
// handler that throws for a type with on_failure gets on_failure(msg, handler_failed) and later
// messages are still handled; a type without on_failure, or an on_failure that throws too, is
// only counted.
#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "actors/runtime/actor.hpp"

namespace {

using ordo::enum_name;
using ordo::actors::actor;
using ordo::actors::delivery_outcome;

struct ping {
    static constexpr const char* msg_name = "ping";
    uint32_t sender = 0;
    uint64_t n = 0;
    MSGPACK_DEFINE_MAP(sender, n);
};

struct hold {
    static constexpr const char* msg_name = "hold";
    ORDO_EMPTY_MESSAGE()
};

struct boom {
    static constexpr const char* msg_name = "boom";
    std::string why;
    MSGPACK_DEFINE_MAP(why);
};

// Records pings; "hold" blocks the loop until released (to fill the mailbox deterministically).
class recorder final : public actor<recorder, ping, hold, boom> {
public:
    recorder(size_t capacity) : actor("recorder", capacity) {}

    void on(const ping& p) {
        std::lock_guard lock(mutex);
        seen[p.sender].push_back(p.n);
        total++;
        cv.notify_all();
    }
    void on(const hold&) {
        std::unique_lock lock(mutex);
        holding = true;
        cv.notify_all();
        cv.wait(lock, [&] { return released; });
    }
    void on(const boom& b) { throw std::runtime_error(b.why); }

    void wait_total(uint64_t n) {
        std::unique_lock lock(mutex);
        cv.wait(lock, [&] { return total >= n; });
    }

    std::mutex mutex;
    std::condition_variable cv;
    std::map<uint32_t, std::vector<uint64_t>> seen;
    uint64_t total = 0;
    bool holding = false;
    bool released = false;

protected:
    void on_start() override {
        uv_timer_init(loop(), &_timer);
        uv_timer_start(
            &_timer, [](uv_timer_t*) {}, 1000000, 0);
    }
    void on_stop() override { uv_close(reinterpret_cast<uv_handle_t*>(&_timer), nullptr); }

private:
    uv_timer_t _timer{};
};

TEST(actor_runtime, many_senders_none_lost_order_kept) {
    constexpr uint32_t senders = 6;
    constexpr uint64_t per_sender = 5000;
    recorder r(senders * per_sender);
    ASSERT_TRUE(r.start().ok());
    std::vector<std::thread> threads;
    for (uint32_t s = 0; s < senders; s++) {
        threads.emplace_back([&r, s] {
            for (uint64_t i = 0; i < per_sender; i++) {
                auto st = r.tell(ping{s, i}, "sender" + std::to_string(s));
                ASSERT_TRUE(st.ok()) << st.err().message;
            }
        });
    }
    for (auto& t : threads) t.join();
    r.wait_total(senders * per_sender);
    r.request_stop();
    ASSERT_TRUE(r.join().ok());
    ASSERT_EQ(r.seen.size(), senders);
    for (auto& [s, ns] : r.seen) {
        ASSERT_EQ(ns.size(), per_sender) << "sender " << s;
        for (uint64_t i = 0; i < per_sender; i++) ASSERT_EQ(ns[i], i) << "sender " << s;
    }
}

TEST(actor_runtime, bounded_mailbox_refuses_with_error) {
    constexpr size_t capacity = 64;
    recorder r(capacity);
    ASSERT_TRUE(r.start().ok());
    ASSERT_TRUE(r.tell(hold{}).ok());
    {
        std::unique_lock lock(r.mutex);
        r.cv.wait(lock, [&] { return r.holding; });
    }
    // The loop is blocked inside on(hold) with an empty queue: exactly `capacity` fit.
    for (uint64_t i = 0; i < capacity; i++) ASSERT_TRUE(r.tell(ping{1, i}).ok()) << i;
    auto refused = r.tell(ping{1, 999});
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.err().outcome, delivery_outcome::mailbox_full);
    {
        std::lock_guard lock(r.mutex);
        r.released = true;
        r.cv.notify_all();
    }
    r.wait_total(capacity);
    r.request_stop();
    ASSERT_TRUE(r.join().ok());
    ASSERT_EQ(r.seen[1].size(), capacity);
    EXPECT_EQ(r.seen[1].back(), capacity - 1);  // the refused 999 never arrived
}

TEST(actor_runtime, repeated_start_stop_closes_every_loop) {
    recorder r(16);
    for (int round = 0; round < 50; round++) {
        ASSERT_TRUE(r.start().ok());
        ASSERT_TRUE(r.tell(ping{0, uint64_t(round)}).ok());
        r.request_stop();
        auto st = r.join();
        ASSERT_TRUE(st.ok()) << st.err().message;
        EXPECT_FALSE(r.running());
    }
    // Messages sent before each stop request were delivered, not dropped.
    EXPECT_EQ(r.total, 50u);
    auto late = r.tell(ping{0, 1});
    ASSERT_FALSE(late.ok());
    EXPECT_EQ(late.err().outcome, delivery_outcome::actor_stopped);
}

TEST(actor_runtime, trace_records_every_delivery) {
    ordo::actors::memory_trace_sink sink;
    recorder r(128);
    r.set_trace(&sink);
    ASSERT_TRUE(r.start().ok());
    for (uint64_t i = 0; i < 10; i++) ASSERT_TRUE(r.tell(ping{7, i}, "tester").ok());
    r.wait_total(10);
    r.request_stop();
    ASSERT_TRUE(r.join().ok());
    auto records = sink.snapshot();
    ASSERT_EQ(records.size(), 10u);
    for (size_t i = 0; i < records.size(); i++) {
        EXPECT_EQ(records[i].sender, "tester");
        EXPECT_EQ(records[i].receiver, "recorder");
        EXPECT_EQ(records[i].type, "ping");
        if (i > 0) {
            EXPECT_GT(records[i].seq, records[i - 1].seq);
        }
        auto oh = msgpack::unpack(records[i].bytes.data(), records[i].bytes.size());
        ping p;
        oh.get().convert(p);
        EXPECT_EQ(p.sender, 7u);
        EXPECT_EQ(p.n, i);
    }
}

TEST(actor_runtime, throwing_handler_does_not_kill_actor) {
    recorder r(16);
    ASSERT_TRUE(r.start().ok());
    ASSERT_TRUE(r.tell(boom{"deliberate"}).ok());
    ASSERT_TRUE(r.tell(ping{3, 0}).ok());
    r.wait_total(1);
    EXPECT_EQ(r.handler_errors(), 1u);
    r.request_stop();
    ASSERT_TRUE(r.join().ok());
}

}  // namespace

namespace {

// An actor that "forgets" to close its timer in on_stop: join() must report the leak.
struct tick {
    static constexpr const char* msg_name = "tick";
    ORDO_EMPTY_MESSAGE()
};

class leaky final : public ordo::actors::actor<leaky, tick> {
public:
    leaky() : actor("leaky", 4) {}
    void on(const tick&) {}

protected:
    void on_start() override { uv_timer_init(loop(), &_timer); }

private:
    uv_timer_t _timer{};
};

TEST(actor_runtime, leaked_handle_is_reported_by_join) {
    leaky l;
    ASSERT_TRUE(l.start().ok());
    l.request_stop();
    auto st = l.join();
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.err().code, "loop_leak");
}

}  // namespace

#include "actors/runtime/outbox.hpp"

namespace {

// An outbox built from the recorder forwards to its mailbox with the outbox's sender name;
// an unbound one refuses.
TEST(actor_runtime, outbox_forwards_typed_messages) {
    ordo::actors::memory_trace_sink sink;
    recorder r(16);
    r.set_trace(&sink);
    ASSERT_TRUE(r.start().ok());
    ordo::actors::outbox<ping> to_recorder(r, "gpu");
    ASSERT_TRUE(to_recorder.tell(ping{9, 1}).ok());
    r.wait_total(1);
    r.request_stop();
    ASSERT_TRUE(r.join().ok());
    auto records = sink.snapshot();
    ASSERT_EQ(records.size(), 1u);
    EXPECT_EQ(records[0].sender, "gpu");
    ordo::actors::outbox<ping> unbound;
    auto st = unbound.tell(ping{});
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.err().outcome, delivery_outcome::not_connected);
}

}  // namespace

namespace {

struct relay {
    static constexpr const char* msg_name = "relay";
    uint64_t n = 0;
    MSGPACK_DEFINE_MAP(n);
};

// Records every handler call and on_stop() in one ordered log. "hold" blocks the loop (so the
// test can queue messages behind it), "relay" tells the actor itself a ping and records the
// code its own mailbox answered with.
class stop_probe final : public actor<stop_probe, ping, hold, relay> {
public:
    stop_probe() : actor("stop_probe", 16) {}

    void on(const ping& p) { record("ping " + std::to_string(p.n)); }
    void on(const hold&) {
        record("hold");
        std::unique_lock lock(mutex);
        holding = true;
        cv.notify_all();
        cv.wait(lock, [&] { return released; });
    }
    void on(const relay& r) {
        auto st = tell(ping{0, r.n}, "stop_probe");
        const std::string_view outcome = st.ok() ? "ok" : enum_name(st.err().outcome);
        record("relay " + std::to_string(r.n) + " " + std::string(outcome));
    }

    void wait_holding() {
        std::unique_lock lock(mutex);
        cv.wait(lock, [&] { return holding; });
    }
    void release() {
        std::lock_guard lock(mutex);
        released = true;
        cv.notify_all();
    }
    void wait_stopped() {
        std::unique_lock lock(mutex);
        cv.wait(lock, [&] { return stopped; });
    }

    std::mutex mutex;
    std::condition_variable cv;
    std::vector<std::string> events;
    uint64_t handled_after_stop = 0;
    bool holding = false;
    bool released = false;
    bool stopped = false;

protected:
    void on_stop() override {
        std::lock_guard lock(mutex);
        events.push_back("on_stop");
        stopped = true;
        cv.notify_all();
    }

private:
    void record(std::string what) {
        std::lock_guard lock(mutex);
        if (stopped) handled_after_stop++;
        events.push_back(std::move(what));
    }
};

TEST(actor_runtime, stop_delivers_queued_then_on_stop_then_refuses) {
    stop_probe a;
    ASSERT_TRUE(a.start().ok());
    ASSERT_TRUE(a.tell(hold{}).ok());
    a.wait_holding();
    // The loop is blocked in on(hold): these wait in the mailbox while the stop is requested.
    ASSERT_TRUE(a.tell(ping{0, 1}).ok());
    ASSERT_TRUE(a.tell(relay{2}).ok());
    a.request_stop();
    // Requested but not begun (the loop is still blocked): the mailbox still accepts.
    ASSERT_TRUE(a.tell(ping{0, 3}).ok());
    a.release();
    a.wait_stopped();
    auto late = a.tell(ping{0, 4});
    ASSERT_FALSE(late.ok());
    EXPECT_EQ(late.err().outcome, delivery_outcome::actor_stopped);
    ASSERT_TRUE(a.join().ok());
    // relay ran in the final drain, after the mailbox closed: its own tell was refused, so
    // "ping 2" never appears. Everything accepted was handled before on_stop, nothing after.
    const std::vector<std::string> expected{"hold", "ping 1", "relay 2 actor_stopped", "ping 3",
                                            "on_stop"};
    EXPECT_EQ(a.events, expected);
    EXPECT_EQ(a.handled_after_stop, 0u);
}

}  // namespace

namespace {

struct fuse {
    static constexpr const char* msg_name = "fuse";
    std::string why;
    MSGPACK_DEFINE_MAP(why);
};

// boom and fuse both throw; only boom has on_failure, which itself throws for "rethrow".
class answering final : public actor<answering, ping, boom, fuse> {
public:
    answering() : actor("answering", 16) {}

    void on(const ping&) {
        std::lock_guard lock(mutex);
        pings++;
        cv.notify_all();
    }
    void on(const boom& b) { throw std::runtime_error(b.why); }
    void on(const fuse& f) { throw std::runtime_error(f.why); }

    void on_failure(const boom& b, const ordo::error& why) {
        {
            std::lock_guard lock(mutex);
            failures.push_back(b.why + " " + why.code);
            messages.push_back(why.message);
        }
        if (b.why == "rethrow") throw std::runtime_error("on_failure failed too");
    }

    std::mutex mutex;
    std::condition_variable cv;
    std::vector<std::string> failures;
    std::vector<std::string> messages;
    uint64_t pings = 0;
};

static_assert(ordo::actors::answers_failure<answering, boom>);
static_assert(!ordo::actors::answers_failure<answering, fuse>);
static_assert(!ordo::actors::answers_failure<recorder, boom>);

TEST(actor_runtime, handler_failure_calls_on_failure_and_actor_goes_on) {
    answering a;
    ASSERT_TRUE(a.start().ok());
    ASSERT_TRUE(a.tell(boom{"first"}).ok());
    ASSERT_TRUE(a.tell(fuse{"no answer"}).ok());
    ASSERT_TRUE(a.tell(boom{"rethrow"}).ok());
    ASSERT_TRUE(a.tell(ping{0, 1}).ok());
    {
        std::unique_lock lock(a.mutex);
        a.cv.wait(lock, [&] { return a.pings == 1; });
    }
    a.request_stop();
    ASSERT_TRUE(a.join().ok());
    const std::vector<std::string> expected{"first handler_failed", "rethrow handler_failed"};
    EXPECT_EQ(a.failures, expected);
    ASSERT_EQ(a.messages.size(), 2u);
    EXPECT_EQ(a.messages[0], "boom handler threw: first");
    // boom, fuse, boom and its on_failure: four failures counted, none took the actor down.
    EXPECT_EQ(a.handler_errors(), 4u);
    EXPECT_EQ(a.pings, 1u);
}

}  // namespace
