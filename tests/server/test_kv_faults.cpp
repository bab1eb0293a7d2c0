// test_kv_faults.cpp: kv faults through the `fault` op ([fault] enabled; docs/protocol.md "fault"),
// end to end: the real ordo-server binary over TCP on an ephemeral port, the real stories260K
// model (../shared; the tests skip visibly without it), the gpu actor on the real Vulkan device
// (lavapipe in CI), KV directories made with mkdtemp under /tmp and removed after. Temperature 0
// everywhere, so "correct output" means token for token what a server without persisted KV
// computes. Every server ends idle: no active or queued sequence, no used KV block, no pin.
//
// Checks, each through the path a real fault takes:
// - kv_enospc / kv_eio: the next save fails half-way through its .tmp: persistence off, the
//   health reason and kv_disk.errors name kv_no_space / kv_io_error, no .tmp or .kv is left,
//   serving goes on with correct output; a server without --kv-dir refuses kv kinds with
//   bad_request.
// - kv_torn_exit: the server exits with status 86 mid-save, leaving half a .tmp; the restart's
//   scan deletes it, nothing is loaded or quarantined, the output is the from-scratch one.
// - kv_flip_read: the next restore reads a flipped bit: restore_failures 1, quarantined 1
//   (kv_block_checksum), output identical to the from-scratch one; the recompute's new file
//   is then restored.
// - kv_fingerprint: the next save is written as another model's file (its pair check fails,
//   kv_fingerprint); the restart's scan quarantines it as kv_fingerprint; nothing restores.
// - kv_stall_unlink: a session_delete whose unlink the disk holds 30 times kv.restore_wait_ms
//   is answered kv_io naming the key (scheduler.session_delete_timeouts 1) while a generate
//   is served with correct output; the held unlink still removes the session's file, its late
//   answer is dropped (session_delete_late_answers 1, no second event for the request), the
//   next delete answers deleted false, and a restart finds no session. A SIGTERM while such
//   a delete waits: the drain waits for it, its client gets kv_io before the server exits 0.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <string>
#include <thread>

#include "tests/server/kv_persistence_support.hpp"

namespace {

using namespace ordo::test;
using namespace ordo::test::kv_persistence;
using namespace std::chrono_literals;

// =================================================================================================
// 8. kv faults through the `fault` op.
// =================================================================================================

// [fault] enabled; no memory prefix cache, so a repeated prompt goes to disk.
const std::string kv_fault_extra = "[scheduler]\nprefix_cache = false\n[fault]\nenabled = true\n";
// docs/protocol.md "fault": the exit status of kv_torn_exit (kv::kv_torn_exit_code).
constexpr int kv_torn_exit_status = 86;

// Arms a kv fault on `s` and expects fault_done{armed: kind}.
void arm_kv_fault(server& s, const std::string& kind) {
    auto armed = s.op("fault", "kind", kind, "count", 1);
    ASSERT_TRUE(armed.has_value()) << kind;
    ASSERT_EQ(armed->str("event"), "done") << kind << ": " << armed->str("message");
    EXPECT_EQ(armed->str("armed"), kind);
}

// What a server without KV persistence answers for `prompt`.
gen_result from_scratch(const std::string& cfg_dir, const std::string& text, tokens_t& prompt) {
    server s;
    if (!s.start(cfg_dir, {stories, "", ""})) return {};
    prompt = prompt_of(s, text);
    gen_result g = s.generate(prompt);
    EXPECT_TRUE(g.finished()) << g.outcome();
    EXPECT_EQ(s.stop(), 0);
    return g;
}

// kv_enospc and kv_eio: the save fails as the disk would and persistence turns off.
void expect_disk_fault_path(const std::string& kind, const std::string& code,
                            const std::string& strerror_text) {
    temp_dir tmp;
    const std::string dir = tmp.sub("kv");
    tokens_t p, q;
    const gen_result want_p = from_scratch(tmp.path(), story_texts[0], p);
    server s;
    ASSERT_TRUE(s.start(tmp.path(), {stories, dir, kv_fault_extra}));
    q = prompt_of(s, story_texts[1]);
    arm_kv_fault(s, kind);
    expect_same_output(s.generate(p), want_p, "the request whose save fails");
    ASSERT_TRUE(s.wait_saves_settled(1));
    auto st = s.stats();
    EXPECT_EQ(st.disk("saves"), 0u);
    EXPECT_EQ(st.disk("save_failures"), 1u);
    EXPECT_EQ(st.disk_error(code), 1u);
    EXPECT_FALSE(st.disk_flag("persisting"));
    const std::string reason = st.disk_str("reason");
    EXPECT_NE(reason.find(code), std::string::npos) << reason;
    EXPECT_NE(reason.find(strerror_text), std::string::npos) << reason;
    event h = s.health();
    EXPECT_EQ(h.str("status"), "ok");
    EXPECT_EQ(h.str("reason"), reason) << "health does not say why persistence is off";
    EXPECT_TRUE(files_in(dir, ".tmp").empty()) << "the failed write left its .tmp";
    EXPECT_TRUE(files_in(dir, ".kv").empty());
    // Serving goes on; nothing more is written while persistence is off.
    expect_same_output(s.generate(p), want_p, "the same request with persistence off");
    const gen_result got_q = s.generate(q);
    EXPECT_TRUE(got_q.finished()) << got_q.outcome();
    ASSERT_TRUE(s.wait_saves_settled(3));
    EXPECT_EQ(s.stats().disk("save_failures"), 1u);
    s.expect_idle();
    EXPECT_EQ(s.stop(), 0);
}

TEST(kv_faults, enospc_turns_persistence_off) {
    REQUIRE_STORIES();
    expect_disk_fault_path("kv_enospc", "kv_no_space", "No space left on device");
    // Without --kv-dir there is no kv actor to arm.
    temp_dir tmp;
    server s;
    ASSERT_TRUE(s.start(tmp.path(), {stories, "", kv_fault_extra}));
    auto refused = s.op("fault", "kind", "kv_enospc");
    ASSERT_TRUE(refused.has_value());
    EXPECT_EQ(refused->str("event"), "error");
    EXPECT_EQ(refused->str("code"), "bad_request");
    EXPECT_NE(refused->str("message").find("[kv] enabled"), std::string::npos);
    EXPECT_EQ(s.stop(), 0);
}

TEST(kv_faults, eio_turns_persistence_off) {
    REQUIRE_STORIES();
    expect_disk_fault_path("kv_eio", "kv_io_error", "Input/output error");
}

TEST(kv_faults, torn_exit_leaves_nothing_loadable) {
    REQUIRE_STORIES();
    temp_dir tmp;
    const std::string dir = tmp.sub("kv");
    tokens_t p;
    const gen_result want_p = from_scratch(tmp.path(), story_texts[2], p);
    {
        server a;
        ASSERT_TRUE(a.start(tmp.path(), {stories, dir, kv_fault_extra}));
        arm_kv_fault(a, "kv_torn_exit");
        // The process may die before or after the request's done event: not waited for.
        a.send_all({p});
        EXPECT_EQ(a.wait_exit(), kv_torn_exit_status);
    }
    EXPECT_EQ(files_in(dir, ".tmp").size(), 1u) << "the crash did not leave half a .tmp";
    EXPECT_TRUE(files_in(dir, ".kv").empty());

    server b;
    ASSERT_TRUE(b.start(tmp.path(), {stories, dir, kv_fault_extra}));
    EXPECT_TRUE(files_in(dir, ".tmp").empty()) << "the scan did not delete the torn .tmp";
    auto scanned = b.stats();
    EXPECT_EQ(scanned.disk("files"), 0u);
    EXPECT_EQ(scanned.disk("quarantined"), 0u);
    const gen_result got = b.generate(p);
    expect_same_output(got, want_p, "after the torn save");
    EXPECT_EQ(got.cached, 0u);
    ASSERT_TRUE(b.wait_saves_settled(1));
    EXPECT_EQ(b.stats().disk("saves"), 1u);
    b.expect_idle();
    EXPECT_EQ(b.stop(), 0);
}

TEST(kv_faults, flip_read_quarantines_and_recomputes) {
    REQUIRE_STORIES();
    temp_dir tmp;
    const std::string dir = tmp.sub("kv");
    tokens_t p;
    const gen_result want_p = from_scratch(tmp.path(), story_texts[3], p);
    {
        server a;
        ASSERT_TRUE(a.start(tmp.path(), {stories, dir, kv_fault_extra}));
        expect_same_output(a.generate(p), want_p, "the first run");
        ASSERT_TRUE(a.wait_saves_settled(1));
        EXPECT_EQ(a.stop(), 0);
    }
    ASSERT_EQ(files_in(dir, ".kv").size(), 1u);
    server b;
    ASSERT_TRUE(b.start(tmp.path(), {stories, dir, kv_fault_extra}));
    arm_kv_fault(b, "kv_flip_read");
    const gen_result got = b.generate(p);
    expect_same_output(got, want_p, "the request whose restore read a flipped bit");
    EXPECT_EQ(got.cached, 0u);
    ASSERT_TRUE(b.wait_saves_settled(1));  // the recompute writes the prefix again
    auto st = b.stats();
    EXPECT_EQ(st.disk("restores"), 0u);
    EXPECT_EQ(st.disk("restore_failures"), 1u);
    EXPECT_EQ(st.disk("quarantined"), 1u);
    EXPECT_EQ(st.disk_error("kv_block_checksum"), 1u);
    EXPECT_TRUE(st.disk_flag("persisting"));
    const auto quarantined = files_in(dir + "/quarantine", ".kv");
    ASSERT_EQ(quarantined.size(), 1u);
    EXPECT_NE(quarantined[0].find(".kv_block_checksum."), std::string::npos) << quarantined[0];
    // The fault was spent: the file the recompute wrote restores.
    const gen_result again = b.generate(p);
    expect_same_output(again, want_p, "the request after");
    EXPECT_EQ(again.cached, 2u * block_tokens);
    EXPECT_EQ(b.stats().disk("restores"), 1u);
    b.expect_idle();
    EXPECT_EQ(b.stop(), 0);
}

// Starts `s`, saves session "s1" (one turn) and arms kv_stall_unlink for `stall_ms`: the next
// session_delete's unlink is held.
void start_with_a_held_unlink(server& s, const temp_dir& tmp, const std::string& dir,
                              const std::string& extra, uint32_t stall_ms) {
    ASSERT_TRUE(s.start(tmp.path(), {stories, dir, extra}));
    const gen_result turn = s.generate(prompt_of(s, story_texts[2]), "session", "s1");
    ASSERT_TRUE(turn.finished()) << turn.outcome();
    ASSERT_TRUE(s.wait_saves_settled(1));
    ASSERT_EQ(s.stats().disk("sessions"), 1u);
    auto armed = s.op("fault", "kind", "kv_stall_unlink", "ms", stall_ms);
    ASSERT_TRUE(armed.has_value());
    ASSERT_EQ(armed->str("event"), "done") << armed->str("message");
    EXPECT_NE(armed->str("detail").find("unlink"), std::string::npos) << armed->str("detail");
}

// A session_delete the disk does not answer within kv.restore_wait_ms.
TEST(kv_faults, stalled_unlink_is_answered_kv_io_after_restore_wait_ms) {
    REQUIRE_STORIES();
    temp_dir tmp;
    const std::string dir = tmp.sub("kv");
    tokens_t q;
    const gen_result want_q = from_scratch(tmp.path(), story_texts[3], q);
    constexpr uint32_t wait_ms = 100;    // kv.restore_wait_ms's least
    constexpr uint32_t stall_ms = 3000;  // 30 times the wait: the wait always ends first
    const std::string extra =
        kv_fault_extra + "[kv]\nrestore_wait_ms = " + std::to_string(wait_ms) + "\n";
    const auto session_files = [&] {
        auto all = files_in(dir, ".kv");
        std::erase_if(all, [](const std::string& f) { return !f.starts_with("s-"); });
        return all;
    };
    server s;
    ASSERT_NO_FATAL_FAILURE(start_with_a_held_unlink(s, tmp, dir, extra, stall_ms));
    ASSERT_EQ(session_files().size(), 1u);
    const uint64_t del_id = s.take_id();
    ASSERT_TRUE(s.conn().send(frame("id", del_id, "op", "session_delete", "session", "s1")));
    std::optional<event> told = s.wait_terminal(del_id);
    ASSERT_TRUE(told.has_value());
    EXPECT_EQ(told->str("event"), "error");
    EXPECT_EQ(told->str("code"), "kv_io");
    EXPECT_NE(told->str("message").find("kv.restore_wait_ms = 100 ms"), std::string::npos)
        << told->str("message");
    EXPECT_EQ(s.stats().sched("session_delete_timeouts"), 1u);
    // Serving goes on while the disk holds the unlink.
    expect_same_output(s.generate(q), want_q, "a request while the unlink is held");

    // The held unlink ends: the file is removed, and its answer is dropped.
    ASSERT_TRUE(s.wait_for("the held unlink", [&] { return session_files().empty(); }));
    ASSERT_TRUE(s.wait_for("the late answer dropped",
                           [&] { return s.stats().sched("session_delete_late_answers") == 1; }));
    EXPECT_FALSE(s.holds_terminal(del_id)) << "a second event for the told session_delete";
    auto again = s.op("session_delete", "session", "s1");
    ASSERT_TRUE(again.has_value());
    ASSERT_EQ(again->str("event"), "done") << again->str("message");
    const auto* deleted = field(again->o(), "deleted");
    EXPECT_TRUE(deleted && deleted->type == msgpack::type::BOOLEAN && !deleted->via.boolean);
    auto st = s.stats();
    EXPECT_EQ(st.disk("sessions"), 0u);
    EXPECT_EQ(st.sched("session_delete_timeouts"), 1u);
    EXPECT_EQ(st.sched("session_delete_late_answers"), 1u);
    s.expect_idle();
    EXPECT_EQ(s.stop(), 0);
    server b;
    ASSERT_TRUE(b.start(tmp.path(), {stories, dir, extra}));
    EXPECT_EQ(b.stats().disk("sessions"), 0u);
    EXPECT_TRUE(session_files().empty());
    EXPECT_EQ(b.stop(), 0);
}

// A SIGTERM while a session_delete waits for a held unlink: the drain waits for the delete (it
// is owed a terminal event), which gets kv_io after kv.restore_wait_ms; then the server exits 0.
TEST(kv_faults, a_drain_answers_the_session_delete_that_waits_for_the_disk) {
    REQUIRE_STORIES();
    temp_dir tmp;
    const std::string dir = tmp.sub("kv");
    const std::string extra = kv_fault_extra + "[kv]\nrestore_wait_ms = 100\n";
    server s;
    ASSERT_NO_FATAL_FAILURE(start_with_a_held_unlink(s, tmp, dir, extra, 3000));
    const uint64_t del_id = s.take_id();
    ASSERT_TRUE(s.conn().send(frame("id", del_id, "op", "session_delete", "session", "s1")));
    // The stats answer comes after the scheduler took the delete (one connection, in order):
    // the delete waits for the disk when the drain begins.
    s.stats();
    ASSERT_FALSE(s.holds_terminal(del_id)) << "the delete was answered before the unlink ended";
    s.terminate();
    std::optional<event> told = s.wait_terminal(del_id);
    ASSERT_TRUE(told.has_value()) << "no terminal event for the waiting session_delete";
    EXPECT_EQ(told->str("event"), "error");
    EXPECT_EQ(told->str("code"), "kv_io") << told->str("message");
    EXPECT_EQ(s.wait_exit(), 0);
}

TEST(kv_faults, fingerprint_is_quarantined_after_restart) {
    REQUIRE_STORIES();
    temp_dir tmp;
    const std::string dir = tmp.sub("kv");
    tokens_t p;
    const gen_result want_p = from_scratch(tmp.path(), story_texts[4], p);
    {
        server a;
        ASSERT_TRUE(a.start(tmp.path(), {stories, dir, kv_fault_extra}));
        arm_kv_fault(a, "kv_fingerprint");
        expect_same_output(a.generate(p), want_p, "the request whose file says another model");
        ASSERT_TRUE(a.wait_saves_settled(1));
        auto st = a.stats();
        EXPECT_EQ(st.disk("saves"), 0u);
        EXPECT_EQ(st.disk("save_failures"), 1u);
        EXPECT_EQ(st.disk_error("kv_fingerprint"), 1u);
        EXPECT_TRUE(st.disk_flag("persisting")) << "a foreign file is no disk fault";
        EXPECT_EQ(st.disk("files"), 0u);
        a.expect_idle();
        EXPECT_EQ(a.stop(), 0);
    }
    ASSERT_EQ(files_in(dir, ".kv").size(), 1u);
    server b;
    ASSERT_TRUE(b.start(tmp.path(), {stories, dir, kv_fault_extra}));
    auto scanned = b.stats();
    EXPECT_EQ(scanned.disk("files"), 0u);
    EXPECT_EQ(scanned.disk("quarantined"), 1u);
    EXPECT_EQ(scanned.disk_error("kv_fingerprint"), 1u);
    EXPECT_TRUE(files_in(dir, ".kv").empty());
    const auto quarantined = files_in(dir + "/quarantine", ".kv");
    ASSERT_EQ(quarantined.size(), 1u);
    EXPECT_NE(quarantined[0].find(".kv_fingerprint."), std::string::npos) << quarantined[0];
    const gen_result got = b.generate(p);
    expect_same_output(got, want_p, "after the restart");
    EXPECT_EQ(got.cached, 0u);
    b.expect_idle();
    EXPECT_EQ(b.stop(), 0);
}

}  // namespace
