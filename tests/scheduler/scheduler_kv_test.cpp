// scheduler_kv_test.cpp: the scheduler's side of KV persistence, driven message by message
// with every step run by the CPU reference (scheduler_harness.hpp).
//
// KV persistence (scheduler_kv.cpp), against `disk`, an in-memory stand-in for the kv actor
// that answers its messages and moves block CONTENTS between the emulated pool and its entries
// (so a wrong block id or position shows as wrong output): a prefix saved by one request is
// restored by the next with output equal to a recompute and cached_tokens counting it; a
// failed restore recomputes with identical output and restores nothing later; a step failing
// right after a restore quarantines that entry (kv_invalidate) and the request recomputes; a
// request cancelled while its restore is in flight frees everything once the restore answers;
// a request whose lookup or restore outlasts restore_wait_ms recomputes with identical output,
// and a restore that lands afterwards (with other ids than the entry's) touches nothing it uses;
// sessions: session_busy for a second live request, session_delete refused while busy; a
// session_delete the disk does not answer gets kv_io after restore_wait_ms (its late answer is
// dropped, even when the request id was reused), at most session_deletes_waiting_max wait at
// once (more are overloaded), and a drain waits for them and a shutdown answers them.

#include "tests/scheduler/scheduler_harness.hpp"

using namespace ordo;
using namespace ordo::sched;
using namespace ordo::sched::core_test;
using ordo::gpu::gpu_failure;

namespace {

const std::string long_prompt =
    "hello world, this is a longer prompt that spans several blocks of eight tokens and more";

core_options kv_options() {
    core_options o;
    o.kv_disk = true;
    return o;
}

// A disk holding what one scheduler saved after running long_prompt for max_tokens.
disk saved_disk(uint32_t max_tokens) {
    disk d;
    harness a(kv_options());
    a.kv = &d;
    a.generate(1, 1, long_prompt, max_tokens);
    a.run();
    EXPECT_NE(a.terminal(1, 1), nullptr);
    a.expect_idle();
    EXPECT_EQ(a.core->kv_stats().pins, 0u);
    return d;
}

uint32_t cached_tokens(const event& e) {
    return e.fields.at("usage")
        .as<std::map<std::string, msgpack::object>>()
        .at("cached_tokens")
        .as<uint32_t>();
}

TEST(scheduler_kv, a_saved_prefix_is_restored_with_identical_output) {
    auto want = reference_greedy(long_prompt, 12);
    disk d;
    {
        harness a(kv_options());
        a.kv = &d;
        a.generate(1, 1, long_prompt, 12);
        a.run();
        ASSERT_NE(a.terminal(1, 1), nullptr);
        EXPECT_EQ(a.terminal(1, 1)->tokens(), want);
        a.expect_idle();
        EXPECT_EQ(a.core->kv_stats().pins, 0u);
    }
    ASSERT_EQ(d.saves, 1);
    // A new scheduler (a restart: empty pool and memory cache) restores from "disk".
    harness b(kv_options());
    b.kv = &d;
    b.generate(1, 1, long_prompt, 12);
    b.run();
    const event* t = b.terminal(1, 1);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->tokens(), want);
    EXPECT_EQ(d.restores, 1);
    const uint32_t n_prompt = uint32_t(shared_model().tok->encode(long_prompt, true).size());
    EXPECT_EQ(cached_tokens(*t), (n_prompt - 1) / 8 * 8);
    EXPECT_EQ(b.core->counters().disk_restored_tokens, (n_prompt - 1) / 8 * 8);
    b.expect_idle();
    EXPECT_EQ(b.core->kv_stats().pins, 0u);
}

TEST(scheduler_kv, a_failed_restore_recomputes_once) {
    auto want = reference_greedy(long_prompt, 12);
    disk d = saved_disk(12);
    d.fail_restores = true;
    d.lookups = 0;
    core_options o = kv_options();
    o.restore_retry_max = 0;
    harness b(o);
    b.kv = &d;
    b.generate(1, 1, long_prompt, 12);
    b.run();
    ASSERT_NE(b.terminal(1, 1), nullptr);
    EXPECT_EQ(b.terminal(1, 1)->tokens(), want);
    EXPECT_EQ(cached_tokens(*b.terminal(1, 1)), 0u);
    EXPECT_EQ(b.core->counters().disk_restore_failures, 1u);
    EXPECT_EQ(d.lookups, 1);  // no second attempt with restore_retry_max = 0
    b.expect_idle();
    EXPECT_EQ(b.core->kv_stats().pins, 0u);

    // restore_retry_max = 2: two more lookups, each restore fails, then a recompute.
    o.restore_retry_max = 2;
    d.lookups = 0;
    harness c(o);
    c.kv = &d;
    c.generate(1, 1, long_prompt, 12);
    c.run();
    ASSERT_NE(c.terminal(1, 1), nullptr);
    EXPECT_EQ(c.terminal(1, 1)->tokens(), want);
    EXPECT_EQ(d.lookups, 3);
    EXPECT_EQ(c.core->counters().disk_restore_failures, 3u);
    c.expect_idle();
    EXPECT_EQ(c.core->kv_stats().pins, 0u);
}

TEST(scheduler_kv, a_step_failing_right_after_a_restore_quarantines_the_entry) {
    auto want = reference_greedy(long_prompt, 12);
    disk d = saved_disk(12);
    harness b(kv_options());
    b.kv = &d;
    b.generate(1, 1, long_prompt, 12);
    bool failed = false;
    b.run({}, [&](const gpu::step&) -> std::optional<gpu::step_failed> {
        if (failed) return std::nullopt;
        failed = true;  // the first step after the restore
        return gpu::step_failed{0, gpu_failure::nan, "injected", "prefill#1 layers 0-1", false};
    });
    ASSERT_NE(b.terminal(1, 1), nullptr);
    EXPECT_EQ(b.terminal(1, 1)->tokens(), want);
    EXPECT_EQ(d.invalidated, 1);
    EXPECT_EQ(b.core->counters().disk_invalidations, 1u);
    // The quarantined entry is never offered again.
    b.generate(1, 2, long_prompt, 12);
    b.run();
    ASSERT_NE(b.terminal(1, 2), nullptr);
    EXPECT_EQ(b.terminal(1, 2)->tokens(), want);
    EXPECT_EQ(d.restores, 1);
    b.expect_idle();
    EXPECT_EQ(b.core->kv_stats().pins, 0u);
}

TEST(scheduler_kv, a_request_cancelled_during_its_restore_frees_everything) {
    disk d = saved_disk(4);
    harness b(kv_options());
    b.kv = &d;
    d.hold_restores = true;
    b.generate(1, 1, long_prompt, 4);
    b.run();  // plans the lookup; the restore is held
    ASSERT_EQ(d.held.size(), 1u);
    EXPECT_EQ(b.core->kv_stats().pins, 1u);
    b.cancel(1, 2, 1);
    ASSERT_NE(b.terminal(1, 1), nullptr);
    EXPECT_EQ(b.terminal(1, 1)->str("reason"), "cancelled");
    // The pinned blocks stay allocated until the restore answers, then everything is free.
    EXPECT_GT(b.core->kv_stats().blocks_used, 0u);
    d.hold_restores = false;
    b.release_held_restores();
    b.run();
    b.expect_idle();
    EXPECT_EQ(b.core->kv_stats().pins, 0u);
}

// restore_wait_ms during the restore: the request lets go of the blocks the restore is copying
// into and recomputes; the late restore then writes OTHER ids into them (a naive give-up that
// kept them in the request's table would read those and decode differently).
TEST(scheduler_kv, a_restore_that_outlasts_restore_wait_ms_is_recomputed) {
    auto want = reference_greedy(long_prompt, 12);
    disk d = saved_disk(12);
    d.hold_restores = true;
    d.lookups = 0;
    core_options o = kv_options();
    o.restore_wait_ms = 100;
    harness b(o);
    b.kv = &d;
    EXPECT_FALSE(b.core->restore_deadline());
    b.generate(1, 1, long_prompt, 12);
    b.run();  // the lookup is answered, the restore held: nothing else to do
    ASSERT_EQ(d.held.size(), 1u);
    EXPECT_EQ(b.core->kv_stats().pins, 1u);
    auto due = b.core->restore_deadline();
    ASSERT_TRUE(due);
    b.core->expire_restores(*due - std::chrono::milliseconds(1));
    EXPECT_EQ(b.core->counters().disk_restore_timeouts, 0u);
    EXPECT_TRUE(b.core->restore_deadline());
    b.core->expire_restores(*due);
    EXPECT_EQ(b.core->counters().disk_restore_timeouts, 1u);
    EXPECT_FALSE(b.core->restore_deadline());
    ASSERT_TRUE(b.core->check_invariants().ok()) << b.core->check_invariants().err().message;
    int steps = 0;
    d.restore_other_ids = true;
    b.run([&](const gpu::step&) {
        if (++steps == 2) b.release_held_restores();  // lands while the recompute runs
    });
    ASSERT_GE(steps, 2);
    const event* t = b.terminal(1, 1);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->tokens(), want);
    EXPECT_EQ(d.restores, 1);                         // the kv side finished it...
    EXPECT_EQ(b.core->counters().disk_restores, 0u);  // ...and the request did not use it
    EXPECT_EQ(b.core->counters().disk_restore_failures, 0u);
    EXPECT_EQ(d.lookups, 1);  // no second disk attempt after a timeout
    b.expect_idle();
    EXPECT_EQ(b.core->kv_stats().pins, 0u);
}

// restore_wait_ms during the lookup: the request runs from the memory cache at once, and the
// late answer only releases the entry's lease.
TEST(scheduler_kv, a_lookup_that_outlasts_restore_wait_ms_is_recomputed) {
    auto want = reference_greedy(long_prompt, 12);
    disk d = saved_disk(12);
    core_options o = kv_options();
    o.restore_wait_ms = 100;
    harness b(o);
    b.kv = &d;
    b.generate(1, 1, long_prompt, 12);
    // Plan without answering the kv actor: the request waits for its lookup.
    EXPECT_FALSE(b.core->next_step());
    auto lookups = b.core->take_kv_requests();
    ASSERT_EQ(lookups.size(), 1u);
    ASSERT_TRUE(std::holds_alternative<kv::kv_lookup>(lookups[0]));
    auto due = b.core->restore_deadline();
    ASSERT_TRUE(due);
    b.core->expire_restores(*due);
    EXPECT_EQ(b.core->counters().disk_restore_timeouts, 1u);
    std::vector<outgoing_event> out;
    // The late answer offers the entry; the request has moved on and releases it.
    b.core->on_kv_lookup_done({std::get<kv::kv_lookup>(lookups[0]).seq, 3, "e0"}, out);
    auto release = b.core->take_kv_requests();
    ASSERT_EQ(release.size(), 1u);
    EXPECT_TRUE(std::holds_alternative<kv::kv_release>(release[0]));
    b.apply(out);
    b.run();
    ASSERT_NE(b.terminal(1, 1), nullptr);
    EXPECT_EQ(b.terminal(1, 1)->tokens(), want);
    EXPECT_EQ(b.core->counters().disk_restores, 0u);
    EXPECT_EQ(d.restores, 0);
    b.expect_idle();
    EXPECT_EQ(b.core->kv_stats().pins, 0u);
}

TEST(scheduler_kv, sessions_are_exclusive_and_deletable) {
    disk d;
    harness h(kv_options());
    h.kv = &d;
    h.generate(1, 1, long_prompt, 6, 0, 0, "chat-1");
    h.generate(1, 2, "another prompt", 6, 0, 0, "chat-1");
    ASSERT_NE(h.terminal(1, 2), nullptr);
    EXPECT_EQ(h.terminal(1, 2)->str("code"), "session_busy");
    h.session_delete(1, 3, "chat-1");
    ASSERT_NE(h.terminal(1, 3), nullptr);
    EXPECT_EQ(h.terminal(1, 3)->str("code"), "session_busy");
    h.run();
    ASSERT_NE(h.terminal(1, 1), nullptr);
    ASSERT_EQ(d.sessions.size(), 1u);
    // Turn 2 on the same session (prompt + reply + more) restores the session's blocks in a
    // new scheduler.
    std::string turn2 = long_prompt + h.terminal(1, 1)->str("text") + " and then";
    auto want = reference_greedy(turn2, 6);
    harness b(kv_options());
    b.kv = &d;
    b.generate(1, 1, turn2, 6, 0, 0, "chat-1");
    b.run();
    ASSERT_NE(b.terminal(1, 1), nullptr);
    EXPECT_EQ(b.terminal(1, 1)->tokens(), want);
    EXPECT_GT(cached_tokens(*b.terminal(1, 1)), 0u);
    b.session_delete(1, 2, "chat-1");
    ASSERT_NE(b.terminal(1, 2), nullptr);
    EXPECT_TRUE(b.terminal(1, 2)->fields.at("deleted").as<bool>());
    b.session_delete(1, 3, "chat-1");
    EXPECT_FALSE(b.terminal(1, 3)->fields.at("deleted").as<bool>());
    b.expect_idle();
}

// A hung unlink: the client hears kv_io after restore_wait_ms (not 1 ms before), the late
// answer is dropped (no second answer, and not taken for a later delete that reuses the request
// id; session_delete_late_answers counts it), and the requests behind it are served.
TEST(scheduler_kv, a_session_delete_the_disk_never_answers_ends_after_restore_wait_ms) {
    disk d;
    d.hold_deletes = true;
    core_options o = kv_options();
    o.restore_wait_ms = 100;
    harness b(o);
    b.kv = &d;
    EXPECT_FALSE(b.core->session_delete_deadline());
    b.session_delete(1, 2, "chat-1");
    ASSERT_EQ(d.held_deletes.size(), 1u);
    EXPECT_EQ(b.terminal(1, 2), nullptr);
    auto due = b.core->session_delete_deadline();
    ASSERT_TRUE(due);
    std::vector<outgoing_event> out;
    b.core->expire_session_deletes(*due - std::chrono::milliseconds(1), out);
    EXPECT_TRUE(out.empty());
    b.core->expire_session_deletes(*due, out);
    b.apply(out);
    ASSERT_NE(b.terminal(1, 2), nullptr);
    EXPECT_EQ(b.terminal(1, 2)->str("code"), "kv_io");
    EXPECT_NE(b.terminal(1, 2)->str("message").find("restore_wait_ms"), std::string::npos);
    EXPECT_EQ(b.core->counters().session_delete_timeouts, 1u);
    EXPECT_FALSE(b.core->session_delete_deadline());
    // The client, told, reuses the id for another delete; then the late answer to the first
    // arrives: nothing reaches the client, and the second still waits for its own answer.
    b.events.clear();
    b.session_delete(1, 2, "chat-1");
    ASSERT_EQ(d.held_deletes.size(), 2u);
    EXPECT_NE(d.held_deletes[0].ticket, d.held_deletes[1].ticket);
    out.clear();
    b.core->on_kv_session_deleted({1, 2, true, "", d.held_deletes[0].ticket}, out);
    EXPECT_TRUE(out.empty());
    EXPECT_TRUE(b.events.empty());
    EXPECT_EQ(b.core->counters().session_delete_late_answers, 1u);
    EXPECT_TRUE(b.core->session_delete_deadline()) << "the second delete stopped waiting";
    b.core->on_kv_session_deleted({1, 2, false, "", d.held_deletes[1].ticket}, out);
    b.apply(out);
    ASSERT_NE(b.terminal(1, 2), nullptr);
    EXPECT_FALSE(b.terminal(1, 2)->fields.at("deleted").as<bool>());
    EXPECT_EQ(b.core->counters().session_delete_late_answers, 1u);
    EXPECT_EQ(b.core->counters().session_delete_timeouts, 1u);
    // Serving goes on; an answered delete leaves nothing waiting.
    d.hold_deletes = false;
    b.session_delete(1, 3, "chat-2");
    ASSERT_NE(b.terminal(1, 3), nullptr);
    EXPECT_FALSE(b.terminal(1, 3)->fields.at("deleted").as<bool>());
    EXPECT_FALSE(b.core->session_delete_deadline());
    b.generate(1, 4, "after the delete", 4);
    b.run();
    ASSERT_NE(b.terminal(1, 4), nullptr);
    b.expect_idle();
}

TEST(scheduler_kv, session_deletes_waiting_for_the_disk_are_bounded) {
    disk d;
    d.hold_deletes = true;
    harness b(kv_options());
    b.kv = &d;
    const uint64_t n = session_deletes_waiting_max;
    for (uint64_t id = 1; id <= n; ++id) b.session_delete(1, id, "s" + std::to_string(id));
    EXPECT_EQ(d.held_deletes.size(), n);
    b.session_delete(1, n + 1, "one-more");
    ASSERT_NE(b.terminal(1, n + 1), nullptr);
    EXPECT_EQ(b.terminal(1, n + 1)->str("code"), "overloaded");
    EXPECT_EQ(b.core->counters().overloaded, 1u) << "stats' overloaded counts it";
    EXPECT_EQ(d.held_deletes.size(), n);
    // Answers free the places.
    std::vector<outgoing_event> out;
    b.core->on_kv_session_deleted({1, 1, false, "", d.held_deletes.front().ticket}, out);
    b.apply(out);
    ASSERT_NE(b.terminal(1, 1), nullptr);
    d.hold_deletes = false;
    b.session_delete(1, n + 2, "now-there-is-room");
    ASSERT_NE(b.terminal(1, n + 2), nullptr);
    EXPECT_FALSE(b.terminal(1, n + 2)->fields.at("deleted").as<bool>());
}

// A drain waits for the session_deletes that wait for the disk (each is owed a terminal event),
// refuses new ones like new generates, and the shutdown answers what is still waiting: no
// delete ends without its event.
TEST(scheduler_kv, session_deletes_are_answered_through_a_drain_and_a_shutdown) {
    disk d;
    d.hold_deletes = true;
    harness b(kv_options());
    b.kv = &d;
    b.session_delete(1, 1, "chat-1");
    b.session_delete(1, 2, "chat-2");
    ASSERT_EQ(d.held_deletes.size(), 2u);
    EXPECT_EQ(b.core->live_requests(), 2u) << "a drain would end before their answers";
    b.core->begin_drain();
    b.session_delete(1, 3, "chat-3");
    ASSERT_NE(b.terminal(1, 3), nullptr);
    EXPECT_EQ(b.terminal(1, 3)->str("code"), "shutting_down");
    EXPECT_EQ(d.held_deletes.size(), 2u);
    // One answer comes within the drain.
    std::vector<outgoing_event> out;
    b.core->on_kv_session_deleted({1, 1, true, "", d.held_deletes[0].ticket}, out);
    b.apply(out);
    ASSERT_NE(b.terminal(1, 1), nullptr);
    EXPECT_TRUE(b.terminal(1, 1)->fields.at("deleted").as<bool>());
    EXPECT_EQ(b.core->live_requests(), 1u);
    // The other does not: the shutdown answers it.
    out.clear();
    b.core->shutdown(out);
    b.apply(out);
    ASSERT_NE(b.terminal(1, 2), nullptr);
    EXPECT_EQ(b.terminal(1, 2)->str("code"), "shutting_down");
    EXPECT_NE(b.terminal(1, 2)->str("message").find("may or may not be removed"),
              std::string::npos);
    EXPECT_EQ(b.core->live_requests(), 0u);
    EXPECT_FALSE(b.core->session_delete_deadline());
}

}  // namespace
