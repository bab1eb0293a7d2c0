// test_delivery.cpp: delivery<Msgs...> between real actors on real libuv loops.
//
// Checks, with a receiver whose mailbox holds 2 messages and which the test can block inside a
// handler (so "full" is deterministic): (1) a burst arrives complete and in order once the
// receiver drains; (2) a receiver that never drains gets the first 2, the rest are given up in
// order with delivery_timeout, not before deadline_ms; (3) a stopped receiver or an unbound
// outbox gives up at once, inside send(); (4) a receiver stopping while messages are pending:
// each message is either delivered (a prefix, in order) or given up with actor_stopped (the
// rest, in order); (5) at pending_max the new message is given up with delivery_overflow and the
// ones before it still arrive; (6) close() in on_stop gives up what is pending with
// actor_stopped, the owner's loop closes with no leaked handle, and the owner can start again;
// (7) init() refuses bad arguments and a second init, on a bare loop that closes cleanly;
// (8) the mailbox_refuse fault point (actor_core::refuse_next(n)): exactly n tells are refused
// with mailbox_full, counted as full-mailbox refusals, then tells are accepted again; a delivery
// retries through the refusals and delivers everything in order; refusals outlasting the
// deadline take the give-up path (delivery_timeout, in order) and a later send still arrives.
// Every actor test ends by asserting join() is ok (uv_loop_close == 0). Time appears only as
// generous "eventually" bounds and one lower bound (a give-up is never early).
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "actors/runtime/actor.hpp"
#include "actors/runtime/delivery.hpp"
#include "actors/runtime/outbox.hpp"

namespace {

using namespace std::chrono_literals;
using ordo::enum_name;
using ordo::actors::actor;
using ordo::actors::delivery;
using ordo::actors::delivery_outcome;
using ordo::actors::outbox;
using ordo::actors::refusal;

// An "eventually" bound: long enough for any loaded machine, short enough to fail a hung test.
constexpr auto eventually = 30s;

struct item {
    static constexpr const char* msg_name = "item";
    uint64_t n = 0;
    MSGPACK_DEFINE_MAP(n);
};

struct hold {
    static constexpr const char* msg_name = "hold";
    ORDO_EMPTY_MESSAGE()
};

// Sender side: asks the owner to send items [first, first + count) through its delivery.
struct burst {
    static constexpr const char* msg_name = "burst";
    uint64_t first = 0;
    uint64_t count = 0;
    MSGPACK_DEFINE_MAP(first, count);
};

// The receiver: records items in arrival order; "hold" blocks its loop until released.
class receiver final : public actor<receiver, item, hold> {
public:
    receiver() : actor("receiver", 2) {}

    void on(const item& m) {
        std::lock_guard lock(mutex);
        got.push_back(m.n);
        cv.notify_all();
    }
    void on(const hold&) {
        std::unique_lock lock(mutex);
        holding = true;
        cv.notify_all();
        cv.wait(lock, [&] { return released; });
        holding = false;
    }

    // Blocks the loop inside on(hold): from then on the mailbox fills and nothing drains.
    void block() {
        {
            std::lock_guard lock(mutex);
            released = false;
        }
        ASSERT_TRUE(tell(hold{}).ok());
        std::unique_lock lock(mutex);
        cv.wait(lock, [&] { return holding; });
    }
    void release() {
        std::lock_guard lock(mutex);
        released = true;
        cv.notify_all();
    }
    bool wait_got(size_t n) {
        std::unique_lock lock(mutex);
        return cv.wait_for(lock, eventually, [&] { return got.size() >= n; });
    }
    std::vector<uint64_t> snapshot() {
        std::lock_guard lock(mutex);
        return got;
    }

    std::mutex mutex;
    std::condition_variable cv;
    std::vector<uint64_t> got;
    bool holding = false;
    bool released = false;
};

struct given_up_item {
    uint64_t n = 0;
    std::string code;
    bool operator==(const given_up_item&) const = default;
};

// The owner: a delivery<item> to one receiver, initialised in on_start, closed in on_stop.
// Its give_up_fn records (item, code); counters are read after join() (loop thread only).
class sender final : public actor<sender, burst> {
public:
    sender(outbox<item> to, delivery<item>::limits lim)
        : actor("sender", 16), _to(std::move(to)), _limits(lim) {}

    void on(const burst& b) {
        for (uint64_t i = 0; i < b.count; i++) _delivery.send(item{b.first + i});
        std::lock_guard lock(mutex);
        bursts_done++;
        cv.notify_all();
    }

    bool wait_bursts(uint64_t n) {
        std::unique_lock lock(mutex);
        return cv.wait_for(lock, eventually, [&] { return bursts_done >= n; });
    }
    bool wait_given_up(size_t n) {
        std::unique_lock lock(mutex);
        return cv.wait_for(lock, eventually, [&] { return given_up.size() >= n; });
    }

    const delivery<item>& d() const { return _delivery; }

    std::mutex mutex;
    std::condition_variable cv;
    std::vector<given_up_item> given_up;
    uint64_t bursts_done = 0;
    ordo::status init_status;

protected:
    void on_start() override {
        init_status = _delivery.init(
            loop(), _to, _limits, [this](const delivery<item>::message& m, const refusal& why) {
                std::lock_guard lock(mutex);
                given_up.push_back({std::get<item>(m).n, std::string(enum_name(why.outcome))});
                cv.notify_all();
            });
    }
    void on_stop() override { _delivery.close(); }

private:
    outbox<item> _to;
    delivery<item>::limits _limits;
    delivery<item> _delivery;
};

std::vector<uint64_t> range(uint64_t first, uint64_t count) {
    std::vector<uint64_t> v;
    for (uint64_t i = 0; i < count; i++) v.push_back(first + i);
    return v;
}

void stop(ordo::actors::actor_core& a) {
    a.request_stop();
    auto st = a.join();
    ASSERT_TRUE(st.ok()) << st.err().message;
}

TEST(delivery, burst_into_small_mailbox_arrives_complete_in_order) {
    receiver r;
    ASSERT_TRUE(r.start().ok());
    sender s(outbox<item>(r, "sender"), {.pending_max = 128, .retry_ms = 1, .deadline_ms = 60000});
    ASSERT_TRUE(s.start().ok());
    ASSERT_TRUE(s.init_status.ok()) << s.init_status.err().message;

    r.block();
    ASSERT_TRUE(s.tell(burst{0, 100}).ok());
    ASSERT_TRUE(s.wait_bursts(1));
    r.release();
    ASSERT_TRUE(r.wait_got(100));

    stop(s);
    stop(r);
    EXPECT_EQ(r.got, range(0, 100));
    EXPECT_TRUE(s.given_up.empty());
    // The mailbox took 0 and 1; 2 was refused (full), so 2..99 waited in the FIFO.
    EXPECT_EQ(s.d().delivered(), 100u);
    EXPECT_EQ(s.d().deferred(), 98u);
    EXPECT_EQ(s.d().given_up(), 0u);
    EXPECT_EQ(s.d().pending(), 0u);
}

TEST(delivery, receiver_that_never_drains_gives_up_in_order_after_deadline) {
    constexpr uint64_t deadline_ms = 100;
    receiver r;
    ASSERT_TRUE(r.start().ok());
    sender s(outbox<item>(r, "sender"),
             {.pending_max = 16, .retry_ms = 5, .deadline_ms = deadline_ms});
    ASSERT_TRUE(s.start().ok());

    r.block();
    auto sent_at = std::chrono::steady_clock::now();
    ASSERT_TRUE(s.tell(burst{0, 5}).ok());
    ASSERT_TRUE(s.wait_given_up(3));
    auto waited = std::chrono::steady_clock::now() - sent_at;
    // Never early: the loop clock has 1 ms steps, hence the small allowance.
    EXPECT_GE(waited, std::chrono::milliseconds(deadline_ms - 5));

    r.release();
    ASSERT_TRUE(r.wait_got(2));
    stop(s);
    stop(r);
    EXPECT_EQ(r.got, range(0, 2));
    const std::vector<given_up_item> expected{
        {2, "delivery_timeout"}, {3, "delivery_timeout"}, {4, "delivery_timeout"}};
    EXPECT_EQ(s.given_up, expected);
    EXPECT_EQ(s.d().delivered(), 2u);
    EXPECT_EQ(s.d().deferred(), 3u);
    EXPECT_EQ(s.d().given_up(), 3u);
}

TEST(delivery, stopped_or_unbound_receiver_gives_up_at_once) {
    receiver r;
    ASSERT_TRUE(r.start().ok());
    stop(r);
    sender s(outbox<item>(r, "sender"), {});
    ASSERT_TRUE(s.start().ok());
    ASSERT_TRUE(s.tell(burst{0, 3}).ok());
    ASSERT_TRUE(s.wait_bursts(1));
    {
        // Given up inside send(): all three are recorded by the time the burst handler ends.
        std::lock_guard lock(s.mutex);
        const std::vector<given_up_item> expected{
            {0, "actor_stopped"}, {1, "actor_stopped"}, {2, "actor_stopped"}};
        EXPECT_EQ(s.given_up, expected);
    }
    stop(s);
    EXPECT_EQ(s.d().deferred(), 0u);
    EXPECT_EQ(s.d().given_up(), 3u);

    sender unbound(outbox<item>{}, {});
    ASSERT_TRUE(unbound.start().ok());
    ASSERT_TRUE(unbound.tell(burst{7, 1}).ok());
    ASSERT_TRUE(unbound.wait_bursts(1));
    stop(unbound);
    const std::vector<given_up_item> expected{{7, "not_connected"}};
    EXPECT_EQ(unbound.given_up, expected);
}

TEST(delivery, receiver_stopping_with_pending_each_message_delivered_or_given_up) {
    receiver r;
    ASSERT_TRUE(r.start().ok());
    sender s(outbox<item>(r, "sender"), {.pending_max = 64, .retry_ms = 1, .deadline_ms = 60000});
    ASSERT_TRUE(s.start().ok());

    r.block();
    ASSERT_TRUE(s.tell(burst{0, 20}).ok());
    ASSERT_TRUE(s.wait_bursts(1));
    // The receiver stops while 18 wait; retries race its mailbox closing, so how many get in
    // varies, but every item has exactly one outcome.
    r.request_stop();
    r.release();
    ASSERT_TRUE(r.join().ok());
    ASSERT_TRUE(s.wait_given_up(20 - r.got.size()));
    stop(s);

    ASSERT_GE(r.got.size(), 2u);
    EXPECT_EQ(r.got, range(0, r.got.size()));
    std::vector<given_up_item> expected;
    for (uint64_t n = r.got.size(); n < 20; n++) expected.push_back({n, "actor_stopped"});
    EXPECT_EQ(s.given_up, expected);
    EXPECT_EQ(s.d().delivered() + s.d().given_up(), 20u);
}

TEST(delivery, overflow_at_pending_max_gives_up_the_new_message) {
    receiver r;
    ASSERT_TRUE(r.start().ok());
    sender s(outbox<item>(r, "sender"), {.pending_max = 3, .retry_ms = 1, .deadline_ms = 60000});
    ASSERT_TRUE(s.start().ok());

    r.block();
    ASSERT_TRUE(s.tell(burst{0, 8}).ok());
    ASSERT_TRUE(s.wait_bursts(1));
    {
        // 0,1 in the mailbox; 2,3,4 pending; 5,6,7 found the FIFO full, inside send().
        std::lock_guard lock(s.mutex);
        const std::vector<given_up_item> expected{
            {5, "delivery_overflow"}, {6, "delivery_overflow"}, {7, "delivery_overflow"}};
        EXPECT_EQ(s.given_up, expected);
    }
    r.release();
    ASSERT_TRUE(r.wait_got(5));
    stop(s);
    stop(r);
    EXPECT_EQ(r.got, range(0, 5));
    EXPECT_EQ(s.d().delivered(), 5u);
    EXPECT_EQ(s.d().deferred(), 3u);
    EXPECT_EQ(s.d().given_up(), 3u);
}

TEST(delivery, close_gives_up_pending_and_leaks_no_handle) {
    receiver r;
    ASSERT_TRUE(r.start().ok());
    sender s(outbox<item>(r, "sender"), {.pending_max = 16, .retry_ms = 1, .deadline_ms = 60000});
    ASSERT_TRUE(s.start().ok());

    r.block();
    ASSERT_TRUE(s.tell(burst{0, 5}).ok());
    ASSERT_TRUE(s.wait_bursts(1));
    // The receiver is still blocked: close()'s last offer is refused, 2..4 are given up.
    stop(s);
    const std::vector<given_up_item> expected{
        {2, "actor_stopped"}, {3, "actor_stopped"}, {4, "actor_stopped"}};
    EXPECT_EQ(s.given_up, expected);
    EXPECT_EQ(s.d().pending(), 0u);
    EXPECT_FALSE(s.d().is_open());

    r.release();
    ASSERT_TRUE(r.wait_got(2));
    // The closed delivery initialises again when its owner restarts.
    ASSERT_TRUE(s.start().ok());
    ASSERT_TRUE(s.init_status.ok()) << s.init_status.err().message;
    ASSERT_TRUE(s.tell(burst{100, 1}).ok());
    ASSERT_TRUE(r.wait_got(3));
    stop(s);
    stop(r);
    EXPECT_EQ(r.got, (std::vector<uint64_t>{0, 1, 100}));
    EXPECT_EQ(s.d().given_up(), 3u);
}

TEST(delivery, init_refuses_bad_arguments_and_closes_on_a_bare_loop) {
    uv_loop_t loop;
    ASSERT_EQ(uv_loop_init(&loop), 0);
    std::vector<given_up_item> given_up;
    auto record = [&](const delivery<item>::message& m, const refusal& why) {
        given_up.push_back({std::get<item>(m).n, std::string(enum_name(why.outcome))});
    };
    delivery<item> d;
    d.send(item{1});  // before init: no receiver and no give_up_fn yet, only counted
    EXPECT_EQ(d.given_up(), 1u);

    auto zero = d.init(&loop, outbox<item>{}, {.pending_max = 0}, record);
    ASSERT_FALSE(zero.ok());
    EXPECT_EQ(zero.err().code, "bad_argument");
    auto no_fn = d.init(&loop, outbox<item>{}, {}, nullptr);
    ASSERT_FALSE(no_fn.ok());
    EXPECT_EQ(no_fn.err().code, "bad_argument");
    ASSERT_TRUE(d.init(&loop, outbox<item>{}, {}, record).ok());
    auto again = d.init(&loop, outbox<item>{}, {}, record);
    ASSERT_FALSE(again.ok());
    EXPECT_EQ(again.err().code, "delivery_open");

    d.send(item{2});
    d.close();
    d.send(item{3});
    const std::vector<given_up_item> expected{{2, "not_connected"}, {3, "actor_stopped"}};
    EXPECT_EQ(given_up, expected);
    ASSERT_EQ(uv_run(&loop, UV_RUN_DEFAULT), 0);
    EXPECT_EQ(uv_loop_close(&loop), 0);
}

}  // namespace

namespace {

TEST(mailbox_refuse, refuses_exactly_n_then_accepts) {
    receiver r;
    ASSERT_TRUE(r.start().ok());
    r.refuse_next(3);
    for (uint64_t i = 0; i < 3; i++) {
        auto st = r.tell(item{i});
        ASSERT_FALSE(st.ok()) << i;
        EXPECT_EQ(st.err().outcome, delivery_outcome::mailbox_full);  // not a new outcome
    }
    ASSERT_TRUE(r.tell(item{3}).ok());
    ASSERT_TRUE(r.wait_got(1));
    EXPECT_EQ(r.mailbox_rejected_full(), 3u);
    // Re-arming replaces what is left; 0 disarms.
    r.refuse_next(5);
    r.refuse_next(0);
    ASSERT_TRUE(r.tell(item{4}).ok());
    ASSERT_TRUE(r.wait_got(2));
    stop(r);
    EXPECT_EQ(r.got, (std::vector<uint64_t>{3, 4}));
}

TEST(mailbox_refuse, delivery_retries_through_refusals_in_order) {
    receiver r;
    ASSERT_TRUE(r.start().ok());
    sender s(outbox<item>(r, "sender"), {.pending_max = 128, .retry_ms = 1, .deadline_ms = 60000});
    ASSERT_TRUE(s.start().ok());

    r.refuse_next(5);
    ASSERT_TRUE(s.tell(burst{0, 20}).ok());
    ASSERT_TRUE(r.wait_got(20));

    stop(s);
    stop(r);
    EXPECT_EQ(r.got, range(0, 20));
    EXPECT_TRUE(s.given_up.empty());
    // The 5 armed refusals, then maybe real ones: the receiver's mailbox holds only 2.
    EXPECT_GE(r.mailbox_rejected_full(), 5u);
    // 0 was refused at once, so all 20 waited in the FIFO (nothing overtakes a pending one).
    EXPECT_EQ(s.d().deferred(), 20u);
    EXPECT_EQ(s.d().delivered(), 20u);
}

TEST(mailbox_refuse, refusals_beyond_the_deadline_take_the_give_up_path) {
    constexpr uint64_t deadline_ms = 50;
    receiver r;
    ASSERT_TRUE(r.start().ok());
    sender s(outbox<item>(r, "sender"),
             {.pending_max = 16, .retry_ms = 5, .deadline_ms = deadline_ms});
    ASSERT_TRUE(s.start().ok());

    r.refuse_next(1000000);  // far more refusals than retry ticks within the deadline
    ASSERT_TRUE(s.tell(burst{0, 3}).ok());
    ASSERT_TRUE(s.wait_given_up(3));
    r.refuse_next(0);
    ASSERT_TRUE(s.tell(burst{3, 1}).ok());
    ASSERT_TRUE(r.wait_got(1));

    stop(s);
    stop(r);
    const std::vector<given_up_item> expected{
        {0, "delivery_timeout"}, {1, "delivery_timeout"}, {2, "delivery_timeout"}};
    EXPECT_EQ(s.given_up, expected);
    EXPECT_EQ(r.got, range(3, 1));
}

}  // namespace
