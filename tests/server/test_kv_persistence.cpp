// test_kv_persistence.cpp: KV persistence (kv/, ARCHITECTURE.md F7) end to end: the real
// ordo-server binary over TCP on an ephemeral port, the real stories260K model (../shared; the
// tests skip visibly without it), the gpu actor on the real Vulkan device (lavapipe in CI), KV
// directories made with mkdtemp under /tmp and removed after. Temperature 0 everywhere, so
// "correct output" means token for token what a server computes without any persisted KV.
//
// Checks, one test each:
// 1. prefix_survives_restart: a prompt of 45 tokens (2 full blocks of gpu.kv_block_tokens = 16)
//    saved by server A (SIGTERM flushes it) is restored by server B on the same directory:
//    same tokens and text, usage.cached_tokens = 32, kv_disk.restores = 1; a server without
//    --kv-dir gives the same tokens.
// 2. session_across_restart_busy_and_delete: turn 1 with session "s1"; after a restart turn 2
//    (turn 1's tokens + its reply + new tokens) restores blocks past turn 1's prompt and gives
//    what a server without KV gives; a second live request on the session, and session_delete
//    while it runs, get error session_busy; session_delete answers deleted true, then false;
//    after delete and a restart kv_disk.sessions = 0 and turn 2 restores nothing.
// 3. corrupt_and_foreign_files_are_never_loaded: from real files (this model, another model of
//    the same shape made with `ordo-model mk`, gpu.kv_block_tokens = 32, gpu.kv_dtype = f32)
//    it makes header bit flips, a token-id flip, truncations at every region boundary, an empty
//    and an oversized file, format version 2 with a correct header checksum, payload flips (a
//    checksum-table entry, a first and a last block), a directory x.kv and a symlink y.kv; the
//    startup scan quarantines each refused file under its error code, ignores and leaves alone
//    the directory and the symlink, keeps the payload-corrupt ones (only the blocks' checksums
//    catch them), which the first restore quarantines while the request recomputes; outputs
//    equal the from-scratch ones and restores come only from the valid file, which stays
//    reachable after a longer corrupt file sharing its blocks is quarantined.
// 4. kill_9_during_saves: N rounds (ORDO_KV_SOAK_ITERS, default 4; the seed is printed and
//    ORDO_KV_SOAK_SEED replays one): concurrent generates with distinct prompts (one of them a
//    session), SIGKILL at a random instant around their saves, restart: no *.tmp survives the
//    scan, every .kv left passes `ordo-model kv-inspect FILE --verify` or was quarantined, and
//    the requests answer what a server without KV answers.
// 5. kv_disk_faults.enospc_then_read_only (root and a tmpfs mount needed, else skipped with a
//    message): a 32 KiB tmpfs takes one save, the next fails with ENOSPC: persistence turns off,
//    health stays ok with a reason, kv_disk.errors counts kv_no_space, serving and restores go on
//    with correct output; then the same tmpfs remounted read-only: the server starts with
//    persistence off (reason, read-only) and still restores from the valid file.
// 6. gpu_fault_right_after_a_restore: with [fault] enabled, a nan_logits fault on the first
//    prefill after a restore and a device_lost one on another: both requests finish with the
//    from-scratch tokens after one recompute, each entry is quarantined (kv_step_failed,
//    disk_invalidations), every failure counter is exactly one per fault, and the next
//    identical request restores from the file the recompute saved, never the quarantined one.
// 7. Idle after everything: every test ends every server's life by checking that stats show no
//    active or queued sequence, no used KV block and kv.pins = 0 (no pin outlives its save or
//    restore), after restores, busy sessions, cancels, corrupt files and gpu faults.
//
// The kv faults armed through the `fault` op are in test_kv_faults.cpp; what both files share is in
// kv_persistence_support.hpp.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/server/kv_persistence_support.hpp"
#include "tests/support/server_process.hpp"
#include "tests/support/shared_models.hpp"

namespace {

using namespace ordo::test;
using namespace ordo::test::kv_persistence;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

// =================================================================================================
// 1. A prefix survives a restart.
// =================================================================================================

TEST(kv_persistence, prefix_survives_restart) {
    REQUIRE_STORIES();
    temp_dir tmp;
    const std::string dir = tmp.sub("kv");

    server a;
    ASSERT_TRUE(a.start(tmp.path(), {stories, dir, ""}));
    const tokens_t prompt = prompt_of(a, story_texts[0]);
    const gen_result first = a.generate(prompt);
    ASSERT_TRUE(first.finished()) << first.outcome();
    EXPECT_EQ(first.cached, 0u);
    EXPECT_EQ(first.prompt_tokens, prompt_len);
    a.expect_idle();
    EXPECT_EQ(a.stop(), 0);  // SIGTERM: the kv actor writes the save before the exit
    auto saved = files_in(dir, ".kv");
    ASSERT_EQ(saved.size(), 1u) << "one automatic prefix file";
    EXPECT_TRUE(saved[0].starts_with("p-")) << saved[0];
    EXPECT_EQ(kv_inspect_verify(dir + "/" + saved[0]), 0);

    server b;
    ASSERT_TRUE(b.start(tmp.path(), {stories, dir, ""}));
    auto before = b.stats();
    EXPECT_EQ(before.disk("files"), 1u);
    EXPECT_EQ(before.disk("quarantined"), 0u);
    const gen_result again = b.generate(prompt);
    expect_same_output(again, first, "after the restart");
    EXPECT_EQ(again.cached, 2u * block_tokens) << "both full blocks restored from disk";
    auto after = b.stats();
    EXPECT_EQ(after.disk("restores"), 1u);
    EXPECT_EQ(after.disk("restore_failures"), 0u);
    EXPECT_EQ(after.sched("disk_restores"), 1u);
    EXPECT_EQ(after.sched("disk_restored_tokens"), 2u * block_tokens);
    b.expect_idle();
    EXPECT_EQ(b.stop(), 0);

    server fresh;  // no --kv-dir: everything computed
    ASSERT_TRUE(fresh.start(tmp.path(), {stories, "", ""}));
    const gen_result computed = fresh.generate(prompt);
    EXPECT_EQ(computed.cached, 0u);
    expect_same_output(computed, first, "a server without KV persistence");
    fresh.expect_idle();
}

// =================================================================================================
// 2. A multi-turn session across a restart; session_busy; session_delete.
// =================================================================================================

TEST(kv_persistence, session_across_restart_busy_and_delete) {
    REQUIRE_STORIES();
    temp_dir tmp;
    const std::string dir = tmp.sub("kv");
    constexpr uint32_t reply_tokens = 40;  // turn 1's reply spans blocks past its prompt

    // Turn 1 on server A: the session file holds the prompt and the reply's computed blocks.
    server a;
    ASSERT_TRUE(a.start(tmp.path(), {stories, dir, ""}));
    const tokens_t turn1 = prompt_of(a, story_texts[1]);
    const gen_result r1 = a.generate_n(turn1, reply_tokens, "session", "s1");
    ASSERT_TRUE(r1.finished()) << r1.outcome();
    EXPECT_EQ(r1.cached, 0u);
    ASSERT_GE(r1.tokens.size(), 20u) << "the reply ended too early to span another block";
    tokens_t turn2 = turn1;
    turn2.insert(turn2.end(), r1.tokens.begin(), r1.tokens.end());
    for (int32_t t : a.tokenize(" Then they went home and had a nap.", false)) turn2.push_back(t);
    ASSERT_TRUE(a.wait_saves_settled(1));
    auto sa = a.stats();
    EXPECT_EQ(sa.disk("saves"), 1u);
    EXPECT_EQ(sa.disk("sessions"), 1u);
    EXPECT_EQ(sa.disk("files"), 1u) << "a session request saves no automatic prefix";
    a.expect_idle();
    EXPECT_EQ(a.stop(), 0);
    ASSERT_EQ(files_in(dir, ".kv").size(), 1u);
    EXPECT_TRUE(files_in(dir, ".kv")[0].starts_with("s-"));

    // The reference: turn 2 computed by a server without KV persistence.
    server fresh;
    ASSERT_TRUE(fresh.start(tmp.path(), {stories, "", ""}));
    const gen_result want2 = fresh.generate(turn2);
    ASSERT_TRUE(want2.finished()) << want2.outcome();
    EXPECT_EQ(want2.cached, 0u);
    fresh.expect_idle();
    EXPECT_EQ(fresh.stop(), 0);

    // Turn 2 on server B after the restart: restored past turn 1's prompt.
    server b;
    ASSERT_TRUE(b.start(tmp.path(), {stories, dir, ""}));
    EXPECT_EQ(b.stats().disk("sessions"), 1u);
    const gen_result r2 = b.generate(turn2, "session", "s1");
    expect_same_output(r2, want2, "turn 2 after the restart");
    const uint64_t turn1_blocks = (turn1.size() - 1) / block_tokens * block_tokens;
    EXPECT_GT(r2.cached, turn1_blocks) << "the session's reply blocks were not restored";
    EXPECT_EQ(r2.cached % block_tokens, 0u);
    EXPECT_LT(r2.cached, turn2.size());
    EXPECT_EQ(b.stats().disk("restores"), 1u);
    ASSERT_TRUE(b.wait_saves_settled(1));  // turn 2 replaces the session's file

    // A live request holds the session: a second one and a delete get session_busy.
    const uint64_t busy_id = b.take_id();
    ASSERT_TRUE(b.conn().send(frame("id", busy_id, "op", "generate", "tokens", turn2, "max_tokens",
                                    1000, "temperature", 0, "stream", true, "session", "s1")));
    bool streaming = false;
    while (auto e = next(b.conn())) {
        ASSERT_EQ(e->u("id"), busy_id);
        ASSERT_FALSE(e->terminal()) << "the long request ended before the busy checks";
        if (e->str("event") == "token") {
            streaming = true;
            break;
        }
    }
    ASSERT_TRUE(streaming);
    const gen_result second = b.generate(turn1, "session", "s1");
    EXPECT_EQ(second.event, "error");
    EXPECT_EQ(second.code, "session_busy") << second.outcome();
    auto del_busy = b.op("session_delete", "session", "s1");
    ASSERT_TRUE(del_busy.has_value());
    EXPECT_EQ(del_busy->str("event"), "error");
    EXPECT_EQ(del_busy->str("code"), "session_busy");
    ASSERT_TRUE(b.conn().send(frame("id", b.take_id(), "op", "cancel", "target", busy_id)));
    std::optional<event> busy_end = b.wait_terminal(busy_id);
    ASSERT_TRUE(busy_end.has_value());
    EXPECT_EQ(busy_end->str("reason"), "cancelled") << "a cancelled request saves nothing";
    EXPECT_EQ(b.stats().sched("session_busy"), 2u);

    // Delete: true, then false; the index forgets the session.
    auto del1 = b.op("session_delete", "session", "s1");
    ASSERT_TRUE(del1.has_value());
    EXPECT_EQ(del1->str("event"), "done");
    const auto* deleted1 = field(del1->o(), "deleted");
    EXPECT_TRUE(deleted1 && deleted1->type == msgpack::type::BOOLEAN && deleted1->via.boolean);
    auto del2 = b.op("session_delete", "session", "s1");
    ASSERT_TRUE(del2.has_value());
    EXPECT_EQ(del2->str("event"), "done");
    const auto* deleted2 = field(del2->o(), "deleted");
    EXPECT_TRUE(deleted2 && deleted2->type == msgpack::type::BOOLEAN && !deleted2->via.boolean);
    EXPECT_EQ(b.stats().disk("sessions"), 0u);
    b.expect_idle();
    EXPECT_EQ(b.stop(), 0);
    EXPECT_TRUE(files_in(dir, ".kv").empty()) << "the session file was removed";

    // After the delete and a restart nothing is restored (no automatic prefix was saved).
    server c;
    ASSERT_TRUE(c.start(tmp.path(), {stories, dir, ""}));
    auto sc = c.stats();
    EXPECT_EQ(sc.disk("sessions"), 0u);
    EXPECT_EQ(sc.disk("files"), 0u);
    const gen_result r3 = c.generate(turn2, "session", "s1");
    expect_same_output(r3, want2, "turn 2 after the delete");
    EXPECT_EQ(r3.cached, 0u);
    EXPECT_EQ(c.stats().disk("restores"), 0u);
    c.expect_idle();
}

// =================================================================================================
// 3. Corrupt and foreign files are never loaded.
// =================================================================================================

// Runs a server with `cfg` on an empty kv dir, generates `prompt`, stops it (flush) and returns
// the one .kv file it wrote.
std::string produce_file(const temp_dir& tmp, const std::string& name, const server_config& cfg,
                         const tokens_t& prompt) {
    server s;
    if (!s.start(tmp.path(), cfg)) return {};
    gen_result r = s.generate(prompt);
    EXPECT_TRUE(r.finished()) << name << ": " << r.outcome();
    EXPECT_TRUE(s.wait_saves_settled(1));
    EXPECT_EQ(s.stats().disk("saves"), 1u) << name;
    s.expect_idle();
    EXPECT_EQ(s.stop(), 0);
    auto files = files_in(cfg.kv_dir, ".kv");
    EXPECT_EQ(files.size(), 1u) << name;
    return files.empty() ? std::string() : cfg.kv_dir + "/" + files[0];
}

TEST(kv_persistence, corrupt_and_foreign_files_are_never_loaded) {
    REQUIRE_STORIES();
    temp_dir tmp;
    const unsigned seed = std::random_device{}();
    std::printf("kv_persistence corrupt files: seed %u\n", seed);
    std::mt19937 rng(seed);
    const std::string good_dir = tmp.sub("good");
    const std::string no_cache = "[scheduler]\nprefix_cache = false\n";

    // Valid files of this model, and from-scratch outputs. P, Q1, Q2: distinct prompts; R1
    // shares P's 2 blocks and goes on for 2 more, so its file W shadows P's file V in the index.
    server f;
    ASSERT_TRUE(f.start(tmp.path(), {stories, good_dir, no_cache}));
    const tokens_t p = prompt_of(f, story_texts[0]);
    const tokens_t q1 = prompt_of(f, story_texts[2]);
    const tokens_t q2 = prompt_of(f, story_texts[3]);
    tokens_t r1(p.begin(), p.begin() + 2 * block_tokens);
    tokens_t tail = f.tokenize(story_texts[4], false);
    ASSERT_GE(tail.size(), 37u);
    r1.insert(r1.end(), tail.begin(), tail.begin() + 37);  // 69 ids: 4 full blocks and 5
    // A session request saves no automatic prefix: R1 computed from scratch before V exists.
    const gen_result want_r1 = f.generate(r1, "session", "ref");
    const gen_result want_p = f.generate(p);
    const gen_result want_q1 = f.generate(q1);
    const gen_result want_q2 = f.generate(q2);
    for (const auto* w : {&want_r1, &want_p, &want_q1, &want_q2}) {
        ASSERT_TRUE(w->finished()) << w->outcome();
        EXPECT_EQ(w->cached, 0u);
    }
    ASSERT_TRUE(f.wait_saves_settled(4));
    const gen_result r1_from_v = f.generate(r1);  // restores V's 2 blocks, then saves W
    expect_same_output(r1_from_v, want_r1, "R1 restored from P's file");
    EXPECT_EQ(r1_from_v.cached, 2u * block_tokens);
    ASSERT_TRUE(f.wait_saves_settled(5));
    EXPECT_EQ(f.stats().disk("saves"), 5u);
    f.expect_idle();
    EXPECT_EQ(f.stop(), 0);
    const std::string v_path = file_for(good_dir, p, 2);
    const std::string w_path = file_for(good_dir, r1, 4);
    const std::string q1_path = file_for(good_dir, q1, 2);
    const std::string q2_path = file_for(good_dir, q2, 2);
    ASSERT_FALSE(v_path.empty() || w_path.empty() || q1_path.empty() || q2_path.empty());

    // Files this model must refuse, written by real servers: another model of the same shape
    // (only the fingerprint differs), another block size, another dtype.
    const std::string other_model = tmp.sub("other.gguf");
    std::string mk = "'" + std::string(ORDO_MODEL_BIN) + "' mk --out " + other_model +
                     " --n-embd 64 --n-layer 5 --n-head 8 --n-head-kv 4 --n-ff 172 --vocab-from " +
                     stories + " --type f32 --seed 7 --ctx 512 > /dev/null";
    ASSERT_EQ(std::system(mk.c_str()), 0);
    const std::string other_file =
        produce_file(tmp, "other model", {other_model, tmp.sub("other"), ""}, p);
    const std::string bt32_file = produce_file(
        tmp, "kv_block_tokens 32", {stories, tmp.sub("bt32"), "[gpu]\nkv_block_tokens = 32\n"}, p);
    const std::string f32_file = produce_file(
        tmp, "kv_dtype f32", {stories, tmp.sub("f32"), "[gpu]\nkv_dtype = \"f32\"\n"}, p);
    ASSERT_FALSE(other_file.empty() || bt32_file.empty() || f32_file.empty());

    // The directory the next server scans: V and the payload-corrupt ones under their own
    // names, every other variant under a fresh valid name, with the code the scan must give it.
    const std::string dir = tmp.sub("scan");
    fs::create_directories(dir);
    const std::string v = read_bytes(v_path);
    const file_layout vl = layout_of(v);
    ASSERT_EQ(vl.n_blocks, 2u);
    ASSERT_EQ(vl.size, v.size());
    std::map<std::string, std::string> refused;  // stem -> expected code ("" = any header code)
    auto plant = [&](const std::string& bytes, const std::string& code) {
        std::string stem = random_prefix_name(rng);
        write_bytes(dir + "/" + stem + ".kv", bytes);
        refused[stem] = code;
    };
    for (int i = 0; i < 4; i++) {  // header: magic, version or checksum refuses it
        std::string b = v;
        flip_bit(b, rng() % header_bytes, rng);
        plant(b, "");
    }
    {
        std::string b = v;
        flip_bit(b, header_bytes + rng() % (4 * vl.n_tokens), rng);
        plant(b, "kv_tokens_checksum");
    }
    for (uint64_t cut : {uint64_t{0}, uint64_t{64}, uint64_t{header_bytes}, vl.table, vl.payload,
                         vl.payload + vl.block_bytes + 123, vl.size - 1}) {
        plant(v.substr(0, cut), "kv_truncated");
    }
    plant(v + "x", "kv_oversize");
    {
        std::string b = v;  // a newer format whose header checksum is right
        put_le(b, version_offset, 4, 2);
        put_le(b, header_checksum_offset, 8, XXH3_64bits(b.data(), header_checksum_offset));
        plant(b, "kv_version");
    }
    plant(read_bytes(other_file), "kv_fingerprint");
    plant(read_bytes(bt32_file), "kv_block_tokens");
    plant(read_bytes(f32_file), "kv_dtype");
    const std::string v_name = fs::path(v_path).filename();
    const std::string w_name = fs::path(w_path).filename();
    const std::string q1_name = fs::path(q1_path).filename();
    const std::string q2_name = fs::path(q2_path).filename();
    write_bytes(dir + "/" + v_name, v);
    set_mtime(dir + "/" + v_name, 100s);  // older than W: W's keys win the shared blocks
    std::string w = read_bytes(w_path);
    const file_layout wl = layout_of(w);
    flip_bit(w, wl.payload + 3 * wl.block_bytes + rng() % wl.block_bytes, rng);  // last block
    write_bytes(dir + "/" + w_name, w);
    set_mtime(dir + "/" + w_name, 10s);
    std::string qa = read_bytes(q1_path);
    flip_bit(qa, layout_of(qa).table + rng() % 8, rng);  // block 0's checksum-table entry
    write_bytes(dir + "/" + q1_name, qa);
    std::string qb = read_bytes(q2_path);
    flip_bit(qb, layout_of(qb).payload + rng() % layout_of(qb).block_bytes, rng);  // block 0
    write_bytes(dir + "/" + q2_name, qb);
    // Never followed, never moved: a directory, a symlink (to a valid file), a foreign name.
    fs::create_directories(dir + "/x.kv");
    write_bytes(dir + "/x.kv/inside", "keep");
    fs::create_symlink(v_path, dir + "/y.kv");
    write_bytes(dir + "/notes.txt", "not ours");
    const std::string leftover = random_prefix_name(rng) + ".tmp";  // a crashed write
    write_bytes(dir + "/" + leftover, v.substr(0, 1000));

    // The scan: every refused file in quarantine/ under its code; the rest left alone.
    server s;
    ASSERT_TRUE(s.start(tmp.path(), {stories, dir, no_cache}));
    auto scanned = s.stats();
    EXPECT_EQ(scanned.disk("quarantined"), refused.size());
    EXPECT_EQ(scanned.disk("ignored"), 3u) << "x.kv, y.kv and notes.txt";
    EXPECT_EQ(scanned.disk("files"), 4u) << "V, W, Q1, Q2: their payload is checked on restore";
    EXPECT_EQ(scanned.disk_error("kv_truncated"), 7u);
    EXPECT_EQ(scanned.disk_error("kv_oversize"), 1u);
    EXPECT_EQ(scanned.disk_error("kv_tokens_checksum"), 1u);
    EXPECT_EQ(scanned.disk_error("kv_fingerprint"), 1u);
    EXPECT_EQ(scanned.disk_error("kv_block_tokens"), 1u);
    EXPECT_EQ(scanned.disk_error("kv_dtype"), 1u);
    EXPECT_EQ(scanned.disk_error("kv_bad_magic") + scanned.disk_error("kv_version") +
                  scanned.disk_error("kv_header_checksum") + scanned.disk_error("kv_bad_header"),
              5u)
        << "4 header flips and the newer version";
    EXPECT_GE(scanned.disk_error("kv_version"), 1u);
    const auto quarantined = files_in(dir + "/quarantine", ".kv");
    EXPECT_EQ(quarantined.size(), refused.size());
    for (const auto& [stem, code] : refused) {
        EXPECT_FALSE(fs::exists(dir + "/" + stem + ".kv")) << stem << " (" << code << ") stayed";
        auto q = std::find_if(quarantined.begin(), quarantined.end(),
                              [&](const std::string& n) { return n.starts_with(stem + "."); });
        ASSERT_NE(q, quarantined.end()) << stem << " is not in quarantine/";
        if (!code.empty()) {
            EXPECT_NE(q->find("." + code + "."), std::string::npos) << *q;
        }
    }
    EXPECT_TRUE(fs::is_directory(fs::symlink_status(dir + "/x.kv")));
    EXPECT_EQ(read_bytes(dir + "/x.kv/inside"), "keep");
    EXPECT_TRUE(fs::is_symlink(dir + "/y.kv"));
    EXPECT_EQ(fs::read_symlink(dir + "/y.kv"), v_path);
    EXPECT_EQ(read_bytes(v_path), v) << "the symlink's target was touched";
    EXPECT_EQ(read_bytes(dir + "/notes.txt"), "not ours");
    EXPECT_FALSE(fs::exists(dir + "/" + leftover)) << "the scan deletes .tmp leftovers";

    // R1 finds W (its 4 blocks): the restore verifies every block, refuses the last, quarantines
    // W; with kv.restore_retry_max = 1 the request looks again and restores V's 2 blocks (which
    // W shadowed), then computes the rest. Cancelled, it saves nothing that could hide what
    // follows.
    const uint64_t r1_id = s.take_id();
    ASSERT_TRUE(s.conn().send(frame("id", r1_id, "op", "generate", "tokens", r1, "max_tokens", 1000,
                                    "temperature", 0, "stream", true)));
    auto first_event = next(s.conn());
    ASSERT_TRUE(first_event.has_value());
    EXPECT_EQ(first_event->str("event"), "token");
    ASSERT_TRUE(s.conn().send(frame("id", s.take_id(), "op", "cancel", "target", r1_id)));
    auto r1_end = s.wait_terminal(r1_id);
    ASSERT_TRUE(r1_end.has_value());
    EXPECT_EQ(r1_end->str("reason"), "cancelled");
    auto after_w = s.stats();
    EXPECT_EQ(after_w.disk("restores"), 1u) << "the retry restores V";
    EXPECT_EQ(after_w.sched("disk_lookups"), 2u);
    EXPECT_EQ(after_w.disk("restore_failures"), 1u);
    EXPECT_EQ(after_w.disk_error("kv_block_checksum"), 1u);
    EXPECT_EQ(after_w.disk("files"), 3u);

    // P: V, which W shadowed, is still found and restored.
    const gen_result got_p = s.generate(p);
    expect_same_output(got_p, want_p, "P from V");
    EXPECT_EQ(got_p.cached, 2u * block_tokens) << "V is valid and on disk but was not restored";
    // Q1, Q2: a bad checksum-table entry and a bad block 0, caught by the restore.
    const gen_result got_q1 = s.generate(q1);
    expect_same_output(got_q1, want_q1, "Q1 (bad table entry)");
    EXPECT_EQ(got_q1.cached, 0u);
    const gen_result got_q2 = s.generate(q2);
    expect_same_output(got_q2, want_q2, "Q2 (bad block 0)");
    EXPECT_EQ(got_q2.cached, 0u);
    // R1 again, in full: V's 2 blocks restored, the rest computed.
    const gen_result got_r1 = s.generate(r1);
    expect_same_output(got_r1, want_r1, "R1 after W's quarantine");
    EXPECT_EQ(got_r1.cached, 2u * block_tokens);
    auto end = s.stats();
    EXPECT_EQ(end.disk("restores"), 3u) << "only V restores (R1's retry, P, R1 again)";
    EXPECT_EQ(end.disk("restore_failures"), 3u);
    EXPECT_EQ(end.disk_error("kv_block_checksum"), 3u);
    EXPECT_EQ(end.disk("quarantined"), refused.size() + 3);
    EXPECT_EQ(end.sched("disk_restore_failures"), 3u);
    const auto q_after = files_in(dir + "/quarantine", ".kv");
    EXPECT_EQ(q_after.size(), refused.size() + 3);
    for (const auto& name : {w_name, q1_name, q2_name}) {
        std::string stem = name.substr(0, name.size() - 3);
        EXPECT_TRUE(std::any_of(
            q_after.begin(), q_after.end(),
            [&](const std::string& n) { return n.starts_with(stem + ".kv_block_checksum."); }))
            << name << " is not quarantined as kv_block_checksum";
    }
    EXPECT_EQ(read_bytes(dir + "/" + v_name), v);
    s.expect_idle();
}

// =================================================================================================
// 4. kill -9 while saves are being written.
// =================================================================================================

uint64_t env_u64(const char* name, uint64_t fallback) {
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}

TEST(kv_persistence, kill_9_during_saves) {
    REQUIRE_STORIES();
    constexpr size_t per_round = 4;  // concurrent generates per round; the first is a session
    const uint64_t rounds = env_u64("ORDO_KV_SOAK_ITERS", 4);
    const auto seed = static_cast<unsigned>(env_u64("ORDO_KV_SOAK_SEED", std::random_device{}()));
    std::printf("kv_persistence kill -9: %llu rounds, seed %u (ORDO_KV_SOAK_SEED replays it)\n",
                static_cast<unsigned long long>(rounds), seed);
    std::mt19937 rng(seed);
    temp_dir tmp;
    const std::string dir = tmp.sub("kv");

    // Every round's prompts, and what a server without KV persistence answers to each.
    std::vector<std::vector<tokens_t>> prompts(rounds + 1);
    std::vector<std::vector<gen_result>> want(rounds + 1);
    {
        server ref;
        ASSERT_TRUE(ref.start(tmp.path(), {stories, "", ""}));
        for (uint64_t r = 0; r < rounds; r++) {
            for (size_t i = 0; i < per_round; i++) {
                size_t len = 40 + rng() % 48;
                if (len % block_tokens == 0) len++;
                prompts[r].push_back(random_prompt(ref, rng, len));
            }
            // A round at a time: server.max_inflight_per_connection bounds one connection.
            want[r] = ref.generate_all(prompts[r]);
            for (const auto& w : want[r]) ASSERT_TRUE(w.finished()) << w.outcome();
        }
        ref.expect_idle();
    }

    uint64_t restored_total = 0;
    for (uint64_t round = 0; round <= rounds; round++) {
        SCOPED_TRACE("round " + std::to_string(round) + ", seed " + std::to_string(seed));
        // A leftover of a crashed write, planted so every scan has one to delete.
        const std::string planted = dir + "/" + random_prefix_name(rng) + ".tmp";
        if (round > 0) write_bytes(planted, "torn");
        std::set<std::string> before;
        if (fs::exists(dir)) {
            for (const auto& n : files_in(dir, ".kv")) before.insert(n);
        }
        const size_t quarantined_before =
            fs::exists(dir + "/quarantine") ? files_in(dir + "/quarantine", ".kv").size() : 0;

        server s;
        ASSERT_TRUE(s.start(tmp.path(), {stories, dir, ""}));
        // The scan: no .tmp survives; every .kv left verifies, every other one is quarantined.
        EXPECT_TRUE(files_in(dir, ".tmp").empty()) << "a .tmp survived the scan";
        auto scanned = s.stats();
        const auto after = files_in(dir, ".kv");
        for (const auto& n : after) {
            EXPECT_EQ(kv_inspect_verify(dir + "/" + n), 0) << n << " is left but does not verify";
        }
        const size_t newly_quarantined =
            files_in(dir + "/quarantine", ".kv").size() - quarantined_before;
        EXPECT_EQ(scanned.disk("quarantined"), newly_quarantined);
        EXPECT_EQ(before.size(), after.size() + newly_quarantined)
            << "a .kv vanished without being quarantined";
        EXPECT_EQ(scanned.disk("files"), after.size());

        // The previous round's prompts answer what a server without KV answers.
        if (round > 0) {
            auto got = s.generate_all(prompts[round - 1]);
            for (size_t i = 0; i < got.size(); i++) {
                expect_same_output(
                    got[i], want[round - 1][i],
                    "round " + std::to_string(round - 1) + " prompt " + std::to_string(i));
                if (got[i].cached != UINT64_MAX) restored_total += got[i].cached;
            }
            EXPECT_EQ(s.stats().disk("restore_failures"), 0u);
        }
        if (round == rounds) {
            s.expect_idle();
            break;
        }

        // This round's prompts at once, the first as a session; SIGKILL after a random number
        // of them ended (their saves start then) and a random few milliseconds more.
        const uint64_t first = s.send_all(prompts[round], "soak" + std::to_string(round));
        const size_t ends_before_kill = rng() % (per_round + 1);
        // Up to 2 ms (a save's copy and write) or up to 20 ms (the other requests' ends).
        const auto delay = std::chrono::microseconds(rng() % (rng() % 2 ? 2000 : 20000));
        size_t ended = 0;
        while (ended < ends_before_kill) {
            auto e = next(s.conn());
            ASSERT_TRUE(e.has_value()) << "no event before the kill";
            if (e->terminal() && e->u("id") >= first) ended++;
        }
        std::this_thread::sleep_for(delay);
        EXPECT_EQ(s.kill9(), 128 + SIGKILL);
        std::printf("round %llu: SIGKILL after %zu of %zu ended + %lld us: %zu .kv, %zu .tmp\n",
                    static_cast<unsigned long long>(round), ends_before_kill, per_round,
                    static_cast<long long>(delay.count()), files_in(dir, ".kv").size(),
                    files_in(dir, ".tmp").size());
    }
    std::printf("kv_persistence kill -9: %llu tokens restored over the rounds\n",
                static_cast<unsigned long long>(restored_total));
}

// =================================================================================================
// 5. Disk faults: ENOSPC and a read-only file system (tmpfs mounts; root only).
// =================================================================================================

class kv_disk_faults : public ::testing::Test {
protected:
    // Mounts a tmpfs of `size` on a fresh directory; false (with the reason) when not allowed.
    bool mount_tmpfs(const std::string& size, std::string& why) {
        if (::geteuid() != 0) {
            why = "not running as root";
            return false;
        }
        _mnt = _tmp.sub("mnt");
        fs::create_directories(_mnt);
        std::string opts = "size=" + size + ",mode=0755";
        if (::mount("ordo-kv-test", _mnt.c_str(), "tmpfs", 0, opts.c_str()) != 0) {
            why = std::string("mount -t tmpfs: ") + std::strerror(errno);
            return false;
        }
        _mounted = true;
        return true;
    }
    bool remount_read_only() {
        return ::mount("ordo-kv-test", _mnt.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, nullptr) == 0;
    }
    void TearDown() override {
        if (_mounted && ::umount(_mnt.c_str()) != 0) {
            EXPECT_EQ(::umount2(_mnt.c_str(), MNT_DETACH), 0) << std::strerror(errno);
        }
        _mounted = false;
    }

    temp_dir _tmp;
    std::string _mnt;
    bool _mounted = false;
};

TEST_F(kv_disk_faults, enospc_then_read_only) {
    REQUIRE_STORIES();
    // One 2-block file of stories260K is 20,752 bytes (6 pages): 32 KiB takes one, not two.
    std::string why;
    if (!mount_tmpfs("32k", why)) {
        std::fprintf(stderr, "\n*** SKIPPING disk faults: %s ***\n\n", why.c_str());
        GTEST_SKIP() << "disk faults need a tmpfs mount: " << why;
    }
    const std::string dir = _mnt + "/kv";
    // No memory prefix cache: a repeated prompt is restored from disk, not from memory.
    const server_config cfg{stories, dir, "[scheduler]\nprefix_cache = false\n"};
    gen_result first_p1, first_p2;
    tokens_t p1, p2;
    {
        server s;
        ASSERT_TRUE(s.start(_tmp.path(), cfg));
        EXPECT_TRUE(s.stats().disk_flag("persisting"));
        p1 = prompt_of(s, story_texts[0]);
        p2 = prompt_of(s, story_texts[5]);
        first_p1 = s.generate(p1);
        ASSERT_TRUE(first_p1.finished()) << first_p1.outcome();
        ASSERT_TRUE(s.wait_saves_settled(1));
        EXPECT_EQ(s.stats().disk("saves"), 1u);
        // The second file does not fit: ENOSPC turns persistence off; serving goes on.
        first_p2 = s.generate(p2);
        ASSERT_TRUE(first_p2.finished()) << first_p2.outcome();
        ASSERT_TRUE(s.wait_saves_settled(2));
        auto full = s.stats();
        EXPECT_EQ(full.disk("saves"), 1u);
        EXPECT_EQ(full.disk("save_failures"), 1u);
        EXPECT_GE(full.disk_error("kv_no_space"), 1u);
        EXPECT_FALSE(full.disk_flag("persisting"));
        const std::string reason = full.disk_str("reason");
        EXPECT_NE(reason.find("kv_no_space"), std::string::npos) << reason;
        EXPECT_NE(reason.find("No space left on device"), std::string::npos) << reason;
        event h = s.health();
        EXPECT_EQ(h.str("status"), "ok");
        EXPECT_EQ(h.str("reason"), reason) << "health does not say why persistence is off";
        EXPECT_TRUE(files_in(dir, ".tmp").empty()) << "a failed write left its .tmp";
        // Restores of what is on disk go on; outputs stay right; nothing more is written.
        const gen_result again_p1 = s.generate(p1);
        expect_same_output(again_p1, first_p1, "P1 restored with persistence off");
        EXPECT_EQ(again_p1.cached, 2u * block_tokens);
        const gen_result again_p2 = s.generate(p2);
        expect_same_output(again_p2, first_p2, "P2 with persistence off");
        EXPECT_EQ(again_p2.cached, 0u);
        ASSERT_TRUE(s.wait_saves_settled(4));
        auto end = s.stats();
        EXPECT_EQ(end.disk("restores"), 1u);
        EXPECT_EQ(end.disk("saves"), 1u);
        EXPECT_EQ(end.disk("save_failures"), 1u) << "no write was tried with persistence off";
        EXPECT_GE(end.disk_error("kv_persistence_off"), 1u);
        s.expect_idle();
        EXPECT_EQ(s.stop(), 0);
    }
    ASSERT_EQ(files_in(dir, ".kv").size(), 1u);

    // The same file system read-only: the server starts, persistence is off and says why, and
    // the valid file is still restored.
    ASSERT_TRUE(remount_read_only()) << std::strerror(errno);
    server s;
    ASSERT_TRUE(s.start(_tmp.path(), cfg));
    auto ro = s.stats();
    EXPECT_FALSE(ro.disk_flag("persisting"));
    EXPECT_EQ(ro.disk("files"), 1u);
    const std::string reason = ro.disk_str("reason");
    EXPECT_NE(reason.find("kv_read_only"), std::string::npos) << reason;
    event h = s.health();
    EXPECT_EQ(h.str("status"), "ok");
    EXPECT_EQ(h.str("reason"), reason);
    const gen_result ro_p1 = s.generate(p1);
    expect_same_output(ro_p1, first_p1, "P1 from a read-only directory");
    EXPECT_EQ(ro_p1.cached, 2u * block_tokens);
    const gen_result ro_p2 = s.generate(p2);
    expect_same_output(ro_p2, first_p2, "P2 on a read-only directory");
    ASSERT_TRUE(s.wait_saves_settled(2));
    auto end = s.stats();
    EXPECT_EQ(end.disk("restores"), 1u);
    EXPECT_EQ(end.disk("saves"), 0u);
    EXPECT_EQ(end.disk("save_failures"), 0u);
    s.expect_idle();
    EXPECT_EQ(s.stop(), 0);
}

// =================================================================================================
// 6. A gpu fault on the first step after a restore.
// =================================================================================================

TEST(kv_persistence, gpu_fault_right_after_a_restore) {
    REQUIRE_STORIES();
    temp_dir tmp;
    const std::string dir = tmp.sub("kv");
    // No memory prefix cache: the request after the fault goes to disk again.
    const std::string extra = "[scheduler]\nprefix_cache = false\n[fault]\nenabled = true\n";
    tokens_t p, q;
    gen_result want_p, want_q;
    {
        server a;
        ASSERT_TRUE(a.start(tmp.path(), {stories, dir, extra}));
        p = prompt_of(a, story_texts[0]);
        q = prompt_of(a, story_texts[3]);
        want_p = a.generate(p);
        want_q = a.generate(q);
        ASSERT_TRUE(want_p.finished() && want_q.finished());
        EXPECT_EQ(want_p.cached + want_q.cached, 0u);
        a.expect_idle();
        EXPECT_EQ(a.stop(), 0);
    }
    ASSERT_EQ(files_in(dir, ".kv").size(), 2u);

    server b;
    ASSERT_TRUE(b.start(tmp.path(), {stories, dir, extra}));
    struct fault_case {
        const char* kind;
        const tokens_t* prompt;
        const gen_result* want;
    };
    uint64_t k = 0;  // faults so far
    for (const fault_case& fc :
         {fault_case{"nan_logits", &p, &want_p}, fault_case{"device_lost", &q, &want_q}}) {
        SCOPED_TRACE(fc.kind);
        k++;
        auto armed = b.op("fault", "kind", fc.kind, "phase", "prefill", "count", 1);
        ASSERT_TRUE(armed.has_value());
        ASSERT_EQ(armed->str("event"), "done") << armed->str("message");
        // Restore, the first prefill fails, the entry is quarantined, one recompute.
        const gen_result got = b.generate(*fc.prompt);
        expect_same_output(got, *fc.want, "after the fault");
        ASSERT_TRUE(b.wait_saves_settled(2 * k - 1));  // the recompute saves the prefix again
        auto st = b.stats();
        EXPECT_EQ(st.sched("disk_restores"), 2 * k - 1);
        EXPECT_EQ(st.sched("disk_invalidations"), k);
        EXPECT_EQ(st.sched("failures"), k);
        EXPECT_EQ(st.sched("retries"), k);
        EXPECT_EQ(st.sched("gpu_failed"), 0u);
        EXPECT_EQ(st.disk("quarantined"), k);
        EXPECT_EQ(st.disk_error("kv_step_failed"), k);
        EXPECT_EQ(st.disk("restore_failures"), 0u);
        EXPECT_EQ(st.disk("saves"), k) << "the recomputed prefix is written again";
        const auto quarantined = files_in(dir + "/quarantine", ".kv");
        EXPECT_EQ(quarantined.size(), k);
        for (const auto& name : quarantined) {
            EXPECT_NE(name.find(".kv_step_failed."), std::string::npos) << name;
        }
        // The same request again restores from the file the recompute wrote, never from the
        // quarantined one, and nothing fails.
        const gen_result again = b.generate(*fc.prompt);
        expect_same_output(again, *fc.want, "the request after");
        EXPECT_EQ(again.cached, 2u * block_tokens);
        ASSERT_TRUE(b.wait_saves_settled(2 * k));  // already on disk: skipped
        auto st2 = b.stats();
        EXPECT_EQ(st2.sched("disk_restores"), 2 * k);
        EXPECT_EQ(st2.sched("disk_invalidations"), k);
        EXPECT_EQ(st2.sched("failures"), k);
        EXPECT_EQ(st2.disk("quarantined"), k);
        EXPECT_EQ(st2.disk("restore_failures"), 0u);
        EXPECT_EQ(st2.disk("saves"), k);
    }
    auto end = b.stats();
    EXPECT_EQ(end.gpu("nan_logits"), 1u);
    EXPECT_EQ(end.gpu("device_lost"), 1u);
    b.expect_idle();
}

}  // namespace
