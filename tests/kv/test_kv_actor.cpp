// test_kv_actor.cpp: the kv actor (kv/kv_actor.hpp) on its real loop and a real temporary
// directory, driven through its messages (kv/kv_msgs.hpp) with probe actors
// (tests/support/actor_probe.hpp) in place of the scheduler and the gpu actor. The test plays
// the gpu: it answers each kv_copy_out / kv_copy_in by copying between a fake block pool and the
// real kv_staging slot, or answers kv_copy_failed. Sequences are asserted on the trace of
// deliveries, in the order they really happened.
//
// Checks: (1) a save copies its blocks out one copy job at a time (copy_blocks_max blocks per
// job), answers kv_save_done{copied} after the last one and writes the file; a lookup of the
// same prompt then leases it (kv_lookup_done names it and its blocks), and a restore into other
// pool blocks copies the saved bytes back bit-identical (kv_restore_done{ok}); (2) a copy the
// gpu fails answers the save with that gpu_failure (kv_save_done{!copied}), writes nothing and
// sends no further copy of that save, the same save then succeeds; a failed copy-in answers the
// restore with its failure and leaves the file offered (the file is not at fault); (3) the
// startup scan indexes a valid file, quarantines a corrupt one (moved to <dir>/quarantine) and
// leaves a file that is not ordo's alone; (4) a file whose block fails its checksum at restore
// is quarantined (kv_evicted{quarantined}, then kv_restore_done{kv_block_checksum}), no copy-in
// is sent, and no later lookup offers it; every loop closes cleanly (join ok); (5) a shared
// directory ([kv] shared, two kv actors on one directory as two replicas): a session one saves
// is looked up and restored bit-identical by the other, and its newer version too; a file the
// other removed or replaced is forgotten (kv_evicted{gone}), never quarantined; a session's save
// is written though the index says the file holds it (another replica replaced it); session_delete
// removes a file the replica never indexed; two replicas saving one session at once leave one
// valid file and no .tmp; the shared scan leaves a young .tmp and another model's file alone and
// deletes a stale .tmp, and a running server's sweep deletes one planted after its scan. Every
// wait is on a condition, bounded (probe waits and `eventually`); no fixed sleep decides
// anything.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kv/kv_actor.hpp"
// GCC's -Wmaybe-uninitialized misreads the move of a variant of two messages that share one
// layout (kv_copy_out, kv_copy_in) in probe::next_any: a false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "tests/support/actor_probe.hpp"
#pragma GCC diagnostic pop

namespace {

using namespace ordo;
using namespace ordo::kv;
using ordo::test::probe;
using ordo::test::trace_script;
namespace fs = std::filesystem;

// What the kv actor sends the scheduler, and the gpu actor (kv_actor's two outboxes).
using sched_probe =
    probe<kv_lookup_done, kv_restore_done, kv_save_done, kv_evicted, kv_status, kv_session_deleted>;
using gpu_probe = probe<gpu::kv_copy_out, gpu::kv_copy_in>;
using copy_job = gpu_probe::any;

const model::fingerprint test_fp{0x0123456789abcdefull, 0x0011223344556677ull};
constexpr uint32_t block_tokens = 4;
// Two blocks per copy job: a three-block save or restore takes two jobs.
constexpr uint32_t copy_blocks_max = 2;
constexpr uint64_t bytes_budget = uint64_t{1} << 20;
constexpr std::uint64_t test_seed = 0x6b76'6163'746f'72;  // "kvactor"

kv_file_geometry geometry() {
    return kv_file_geometry{.n_layer = 2,
                            .n_head_kv = 2,
                            .head_dim = 8,
                            .block_tokens = block_tokens,
                            .dtype = kv_file_dtype::f16};
}

// Bounded poll: true once `done` holds, false when `limit` passed first.
bool eventually(const std::function<bool()>& done,
                std::chrono::milliseconds limit = test::probe_wait) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (!done()) {
        if (std::chrono::steady_clock::now() >= end) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
}

std::vector<int32_t> prompt(uint32_t n_blocks, int32_t first = 1) {
    std::vector<int32_t> t(size_t{n_blocks} * block_tokens);
    for (size_t i = 0; i < t.size(); i++) t[i] = first + int32_t(i);
    return t;
}

size_t files_in(const fs::path& dir) {
    size_t n = 0;
    for (const auto& e : fs::directory_iterator(dir)) n += e.is_regular_file() ? 1 : 0;
    return n;
}

std::string make_temp_dir() {
    std::string tmpl = (fs::temp_directory_path() / "ordo-kv-actor-XXXXXX").string();
    EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
    return tmpl;
}

// One kv actor between two probes, on a fresh temporary directory, all traced into one sink.
// The constructor returns once the startup scan is done (saves before it are refused).
struct rig {
    // `before_start`: what the directory holds before the actor's scan sees it.
    explicit rig(const std::function<void(const std::string& dir)>& before_start = {})
        : rig(make_temp_dir(), false, before_start) {
        owns_dir = true;
    }
    // On `dir` (not removed at the end), [kv] shared as given.
    rig(std::string on_dir, bool shared,
        const std::function<void(const std::string& dir)>& before_start = {},
        uint64_t sweep_ms = shared_sweep_ms_default)
        : staging(1, uint64_t{copy_blocks_max} * geometry().block_bytes()) {
        dir = std::move(on_dir);
        if (before_start) before_start(dir);
        kv_actor_options o;
        o.dir = dir;
        o.shared = shared;
        o.sweep_ms = sweep_ms;
        o.bytes_budget = bytes_budget;
        o.expect = {test_fp, geometry()};
        o.copy_blocks_max = copy_blocks_max;
        kv.emplace(o, staging);
        kv->connect(sched, gpu);
        for (actors::actor_core* a :
             std::initializer_list<actors::actor_core*>{&sched, &gpu, &*kv}) {
            a->set_trace(&trace);
            EXPECT_TRUE(a->start().ok());
        }
        EXPECT_TRUE(eventually([this] { return kv->scan_done(); })) << "the scan never ended";
    }
    ~rig() {
        stop();
        std::error_code ec;
        if (owns_dir) fs::remove_all(dir, ec);
    }

    void stop() {
        if (stopped) return;
        stopped = true;
        for (actors::actor_core* a :
             std::initializer_list<actors::actor_core*>{&*kv, &sched, &gpu}) {
            a->request_stop();
            EXPECT_TRUE(a->join().ok()) << a->name() << " leaked a handle";
        }
    }

    uint64_t block_bytes() const { return geometry().block_bytes(); }

    // Fills pool blocks with seeded random bytes.
    void fill(const std::vector<uint32_t>& blocks) {
        for (uint32_t b : blocks) {
            auto& bytes = pool[b];
            bytes.resize(block_bytes());
            for (auto& x : bytes) x = static_cast<uint8_t>(rng());
        }
    }

    void save(uint64_t save_id, const std::vector<int32_t>& tokens,
              const std::vector<uint32_t>& blocks, uint64_t epoch = 0,
              std::optional<std::string> session = std::nullopt) {
        kv_save m;
        m.save_id = save_id;
        m.kind = session ? kv_file_kind::session : kv_file_kind::prefix;
        m.session = std::move(session);
        m.tokens = tokens;
        m.blocks = blocks;
        m.epoch = epoch;
        ASSERT_TRUE(kv->tell(m, "scheduler").ok());
    }

    std::optional<kv_lookup_done> lookup(uint64_t seq, const std::vector<int32_t>& tokens,
                                         std::optional<std::string> session = std::nullopt) {
        EXPECT_TRUE(kv->tell(kv_lookup{seq, tokens, std::move(session)}, "scheduler").ok());
        return sched.next<kv_lookup_done>();
    }

    // Saves `tokens` of session `session` from pool blocks `blocks` (filled afresh), answering
    // every copy job, and waits until the file is written (`saves` reached `saves_after`).
    void save_session(uint64_t save_id, const std::string& session,
                      const std::vector<int32_t>& tokens, const std::vector<uint32_t>& blocks,
                      uint64_t saves_after) {
        fill(blocks);
        save(save_id, tokens, blocks, 0, session);
        for (size_t done = 0; done < blocks.size(); done += copy_blocks_max) answer_copy();
        auto saved = sched.next<kv_save_done>();
        ASSERT_TRUE(saved && saved->copied);
        ASSERT_TRUE(eventually([&] { return kv->report().saves == saves_after; }));
    }

    // Restores what `seq` leased into `blocks`, answering every copy job.
    std::optional<kv_restore_done> restore(uint64_t seq, const std::vector<uint32_t>& blocks) {
        EXPECT_TRUE(kv->tell(kv_restore{seq, 0, blocks, 0}, "scheduler").ok());
        for (size_t done = 0; done < blocks.size(); done += copy_blocks_max) answer_copy();
        return sched.next<kv_restore_done>();
    }

    // Plays the gpu for the next copy job: copies between the pool and the staging slot as the
    // gpu actor's worker does, then answers kv_copy_done; with `failure`, answers
    // kv_copy_failed instead and copies nothing. The job it answered; nullopt if none came.
    std::optional<copy_job> answer_copy(std::optional<gpu::gpu_failure> failure = std::nullopt) {
        auto job = gpu.next_any();
        if (!job) {
            ADD_FAILURE() << "no copy job came";
            return std::nullopt;
        }
        std::visit(
            [&](const auto& m) {
                using T = std::decay_t<decltype(m)>;
                EXPECT_TRUE(staging.is_held(m.staging_slot)) << "a slot the kv actor holds";
                if (failure) {
                    gpu::kv_copy_failed f{m.job_id, *failure, "failed by the test"};
                    EXPECT_TRUE(kv->tell(f, "gpu").ok());
                    return;
                }
                const uint64_t bb = block_bytes();
                const uint64_t n = m.blocks.size() * bb;
                for (size_t i = 0; i < m.blocks.size(); i++) {
                    if constexpr (std::is_same_v<T, gpu::kv_copy_out>) {
                        auto dst = staging.bytes(m.staging_slot, n);
                        std::memcpy(dst.data() + i * bb, pool.at(m.blocks[i]).data(), bb);
                    } else {
                        auto src = staging.read(m.staging_slot, n);
                        pool[m.blocks[i]].assign(src.begin() + i * bb, src.begin() + (i + 1) * bb);
                    }
                }
                EXPECT_TRUE(kv->tell(gpu::kv_copy_done{m.job_id, n}, "gpu").ok());
            },
            *job);
        return job;
    }

    std::string path_of(const std::string& name) const {
        return dir + "/" + name + std::string(kv_file_suffix);
    }

    std::string dir;
    gpu::kv_staging staging;
    std::map<uint32_t, std::vector<uint8_t>> pool;  // the fake device pool: block id -> bytes
    std::mt19937_64 rng{test_seed};
    actors::memory_trace_sink trace;
    sched_probe sched{"scheduler"};
    gpu_probe gpu{"gpu"};
    std::optional<kv_actor> kv;
    bool owns_dir = false;
    bool stopped = false;
};

template <typename T>
std::vector<uint32_t> blocks_of(const std::optional<copy_job>& job) {
    if (!job || !std::holds_alternative<T>(*job)) {
        ADD_FAILURE() << "not a " << T::msg_name;
        return {};
    }
    return std::get<T>(*job).blocks;
}

// Writes a valid file of the test model holding `tokens`, with random blocks.
void write_valid_file(const std::string& dir, const std::vector<int32_t>& tokens) {
    kv_file_meta meta;
    meta.fingerprint = test_fp;
    meta.geometry = geometry();
    const uint64_t n_blocks = tokens.size() / block_tokens;
    std::vector<uint8_t> blocks(n_blocks * geometry().block_bytes());
    std::mt19937_64 rng(test_seed + 1);
    for (auto& x : blocks) x = static_cast<uint8_t>(rng());
    ASSERT_TRUE(write_kv_file(dir, kv_prefix_name(test_fp, tokens), meta, tokens, blocks).ok());
}

TEST(KvActor, SaveThenLookupThenRestoreRoundTrips) {
    rig r;
    r.fill({10, 11, 12});
    const auto tokens = prompt(3);
    r.save(1, tokens, {10, 11, 12}, 3);
    // One copy job at a time, copy_blocks_max blocks each, naming the save's epoch.
    auto first = r.answer_copy();
    ASSERT_TRUE(first);
    EXPECT_EQ(blocks_of<gpu::kv_copy_out>(first), (std::vector<uint32_t>{10, 11}));
    EXPECT_EQ(std::get<gpu::kv_copy_out>(*first).epoch, 3u);
    EXPECT_EQ(blocks_of<gpu::kv_copy_out>(r.answer_copy()), (std::vector<uint32_t>{12}));
    auto saved = r.sched.next<kv_save_done>();
    ASSERT_TRUE(saved);
    EXPECT_EQ(saved->save_id, 1u);
    EXPECT_TRUE(saved->copied);
    EXPECT_EQ(saved->code, kv_failure::none);
    // The file is written after kv_save_done, off the loop.
    ASSERT_TRUE(eventually([&] { return r.kv->report().saves == 1; })) << "no file written";
    const std::string name = kv_prefix_name(test_fp, tokens);
    EXPECT_TRUE(fs::is_regular_file(r.path_of(name)));

    // A longer prompt with the same first blocks finds the file; another prompt does not.
    auto miss = r.lookup(8, prompt(3, 100));
    ASSERT_TRUE(miss);
    EXPECT_EQ(miss->n_blocks, 0u);
    auto longer = tokens;
    longer.push_back(99);
    auto hit = r.lookup(7, longer);
    ASSERT_TRUE(hit);
    EXPECT_EQ(hit->seq, 7u);
    EXPECT_EQ(hit->n_blocks, 3u);
    EXPECT_EQ(hit->name, name);

    ASSERT_TRUE(r.kv->tell(kv_restore{7, 0, {20, 21, 22}, 3}, "scheduler").ok());
    EXPECT_EQ(blocks_of<gpu::kv_copy_in>(r.answer_copy()), (std::vector<uint32_t>{20, 21}));
    EXPECT_EQ(blocks_of<gpu::kv_copy_in>(r.answer_copy()), (std::vector<uint32_t>{22}));
    auto restored = r.sched.next<kv_restore_done>();
    ASSERT_TRUE(restored);
    EXPECT_EQ(restored->seq, 7u);
    EXPECT_TRUE(restored->ok) << restored->message;
    EXPECT_EQ(restored->code, kv_failure::none);
    EXPECT_EQ(r.pool.at(20), r.pool.at(10));
    EXPECT_EQ(r.pool.at(21), r.pool.at(11));
    EXPECT_EQ(r.pool.at(22), r.pool.at(12));
    EXPECT_TRUE(eventually([&] { return r.kv->report().restores == 1; }));
    r.stop();

    // The second copy job is sent only after the first one's reply, and the save is answered
    // only after the last.
    trace_script t(r.trace.snapshot());
    t.expect<kv_save>("scheduler", "kv");
    t.expect<gpu::kv_copy_out>("kv", "gpu");
    t.expect<gpu::kv_copy_done>("gpu", "kv");
    t.expect<gpu::kv_copy_out>("kv", "gpu");
    t.expect<gpu::kv_copy_done>("gpu", "kv");
    t.expect<kv_save_done>("kv", "scheduler");
    t.expect<kv_restore>("scheduler", "kv");
    t.expect<gpu::kv_copy_in>("kv", "gpu");
    t.expect<gpu::kv_copy_done>("gpu", "kv");
    t.expect<gpu::kv_copy_in>("kv", "gpu");
    t.expect<gpu::kv_copy_done>("gpu", "kv");
    t.expect<kv_restore_done>("kv", "scheduler");
}

TEST(KvActor, CopyFailureAnswersWithTheFailure) {
    rig r;
    r.fill({0, 1, 2});
    const auto tokens = prompt(3);
    const std::string name = kv_prefix_name(test_fp, tokens);
    r.save(1, tokens, {0, 1, 2});
    r.answer_copy(gpu::gpu_failure::device_lost);
    auto failed = r.sched.next<kv_save_done>();
    ASSERT_TRUE(failed);
    EXPECT_EQ(failed->save_id, 1u);
    EXPECT_FALSE(failed->copied);
    EXPECT_EQ(failed->code, kv_failure_of(gpu::gpu_failure::device_lost));
    ASSERT_TRUE(eventually([&] { return r.kv->report().save_failures == 1; }));
    EXPECT_EQ(r.kv->report().errors[std::string(enum_name(failed->code))], 1u);
    EXPECT_FALSE(fs::exists(r.path_of(name)));

    // Nothing of the failed save is left: the same save is copied afresh (its first job again,
    // so the failed save's second job was never sent) and written.
    r.save(2, tokens, {0, 1, 2});
    EXPECT_EQ(blocks_of<gpu::kv_copy_out>(r.answer_copy()), (std::vector<uint32_t>{0, 1}));
    EXPECT_EQ(blocks_of<gpu::kv_copy_out>(r.answer_copy()), (std::vector<uint32_t>{2}));
    auto saved = r.sched.next<kv_save_done>();
    ASSERT_TRUE(saved);
    EXPECT_EQ(saved->save_id, 2u);
    EXPECT_TRUE(saved->copied);
    ASSERT_TRUE(eventually([&] { return r.kv->report().saves == 1; }));

    // A failed copy-in fails the restore with the gpu's failure; the file is not at fault and
    // is offered again.
    auto hit = r.lookup(5, tokens);
    ASSERT_TRUE(hit);
    ASSERT_EQ(hit->n_blocks, 3u);
    ASSERT_TRUE(r.kv->tell(kv_restore{5, 0, {7, 8, 9}, 0}, "scheduler").ok());
    r.answer_copy(gpu::gpu_failure::stale_epoch);
    auto restored = r.sched.next<kv_restore_done>();
    ASSERT_TRUE(restored);
    EXPECT_EQ(restored->seq, 5u);
    EXPECT_FALSE(restored->ok);
    EXPECT_EQ(restored->code, kv_failure_of(gpu::gpu_failure::stale_epoch));
    EXPECT_EQ(r.kv->report().quarantined, 0u);
    auto again = r.lookup(6, tokens);
    ASSERT_TRUE(again);
    EXPECT_EQ(again->name, name);
    ASSERT_TRUE(r.kv->tell(kv_release{6}, "scheduler").ok());
}

TEST(KvActor, ScanQuarantinesACorruptFileAndLeavesForeignFilesAlone) {
    const auto good = prompt(2);
    const auto bad = prompt(2, 500);
    const std::string bad_name = kv_prefix_name(test_fp, bad);
    rig r([&](const std::string& dir) {
        write_valid_file(dir, good);
        std::ofstream(dir + "/" + bad_name + std::string(kv_file_suffix)) << "not a kv file";
        std::ofstream(dir + "/notes.txt") << "someone else's";
    });
    auto report = r.kv->report();
    EXPECT_TRUE(report.ready);
    EXPECT_EQ(report.files, 1u);
    EXPECT_EQ(report.quarantined, 1u);
    EXPECT_EQ(report.ignored, 1u);
    // Moved, not deleted: the quarantine holds it under its stem.
    EXPECT_FALSE(fs::exists(r.path_of(bad_name)));
    ASSERT_EQ(files_in(fs::path(r.dir) / "quarantine"), 1u);
    for (const auto& e : fs::directory_iterator(fs::path(r.dir) / "quarantine")) {
        EXPECT_EQ(e.path().filename().string().rfind(bad_name, 0), 0u) << e.path();
    }
    std::string notes;
    std::getline(std::ifstream(r.dir + "/notes.txt"), notes);
    EXPECT_EQ(notes, "someone else's");

    auto miss = r.lookup(1, bad);
    ASSERT_TRUE(miss);
    EXPECT_EQ(miss->n_blocks, 0u);
    auto hit = r.lookup(2, good);
    ASSERT_TRUE(hit);
    EXPECT_EQ(hit->n_blocks, 2u);
    ASSERT_TRUE(r.kv->tell(kv_release{2}, "scheduler").ok());
}

TEST(KvActor, RestoreOfACorruptBlockQuarantinesTheFile) {
    const auto tokens = prompt(2);
    const std::string name = kv_prefix_name(test_fp, tokens);
    rig r([&](const std::string& dir) { write_valid_file(dir, tokens); });
    ASSERT_EQ(r.kv->report().files, 1u);
    // One bit of the second block flips on disk after the scan read the header.
    {
        auto header = read_kv_header(r.path_of(name), kv_expect{test_fp, geometry()});
        ASSERT_TRUE(header.ok());
        std::fstream f(r.path_of(name), std::ios::in | std::ios::out | std::ios::binary);
        const auto at = std::streamoff(header->payload_offset() + r.block_bytes() + 5);
        f.seekg(at);
        char c = 0;
        f.get(c);
        f.seekp(at);
        f.put(char(c ^ 0x10));
    }
    auto hit = r.lookup(3, tokens);
    ASSERT_TRUE(hit);
    ASSERT_EQ(hit->n_blocks, 2u);
    ASSERT_TRUE(r.kv->tell(kv_restore{3, 0, {4, 5}, 0}, "scheduler").ok());
    // The entry leaves the index before the restore is answered.
    auto evicted = r.sched.next_any();
    ASSERT_TRUE(evicted && std::holds_alternative<kv_evicted>(*evicted));
    EXPECT_EQ(std::get<kv_evicted>(*evicted).name, name);
    EXPECT_EQ(std::get<kv_evicted>(*evicted).reason, eviction::quarantined);
    auto restored = r.sched.next_any();
    ASSERT_TRUE(restored && std::holds_alternative<kv_restore_done>(*restored));
    EXPECT_FALSE(std::get<kv_restore_done>(*restored).ok);
    EXPECT_EQ(std::get<kv_restore_done>(*restored).code, kv_failure_of(kv_error::block_checksum));
    EXPECT_TRUE(eventually([&] { return !fs::exists(r.path_of(name)); }));
    EXPECT_TRUE(eventually([&] { return files_in(fs::path(r.dir) / "quarantine") == 1; }));
    auto miss = r.lookup(4, tokens);
    ASSERT_TRUE(miss);
    EXPECT_EQ(miss->n_blocks, 0u);
    EXPECT_EQ(r.kv->report().quarantined, 1u);
    r.stop();
    // The bytes never reached the pool: no copy-in was sent.
    for (const auto& rec : r.trace.snapshot()) EXPECT_NE(rec.type, "kv_copy_in");
}

// ---- (5) a shared directory: two kv actors as two replicas ----------------------------------

// Two replicas' kv actors on one shared directory, removed at the end.
struct shared_pair {
    shared_pair() : dir(make_temp_dir()), a(dir, true), b(dir, true) {}
    ~shared_pair() {
        a.stop();
        b.stop();
        std::error_code ec;
        fs::remove_all(dir, ec);
    }
    std::string dir;
    rig a, b;
};

size_t tmp_files_in(const std::string& dir) {
    size_t n = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
        n += e.path().extension() == kv_tmp_suffix ? 1 : 0;
    }
    return n;
}

TEST(KvActorShared, ASessionSavedByOneReplicaIsRestoredByAnother) {
    shared_pair p;
    const std::string session = "conv-1";
    const std::string name = *kv_session_name(test_fp, session);
    // b looked first, before a saved: a miss, and b's index has no entry.
    auto before = p.b.lookup(1, prompt(3), session);
    ASSERT_TRUE(before);
    EXPECT_EQ(before->n_blocks, 0u);

    p.a.save_session(1, session, prompt(3), {0, 1, 2}, 1);
    auto turn = prompt(3);
    turn.push_back(77);  // the next turn's prompt: the session's tokens and more
    auto hit = p.b.lookup(2, turn, session);
    ASSERT_TRUE(hit);
    EXPECT_EQ(hit->n_blocks, 3u);
    EXPECT_EQ(hit->name, name);
    EXPECT_EQ(p.b.kv->report().session_reads, 1u);
    auto restored = p.b.restore(2, {10, 11, 12});
    ASSERT_TRUE(restored);
    EXPECT_TRUE(restored->ok) << restored->message;
    for (uint32_t i = 0; i < 3; i++) EXPECT_EQ(p.b.pool.at(10 + i), p.a.pool.at(i)) << i;

    // a saves the session's next turn (4 blocks, new bytes): b sees the newer file at once.
    p.a.save_session(2, session, prompt(4), {3, 4, 5, 6}, 2);
    auto longer = prompt(4);
    longer.push_back(78);
    auto newer = p.b.lookup(3, longer, session);
    ASSERT_TRUE(newer);
    EXPECT_EQ(newer->n_blocks, 4u);
    EXPECT_EQ(p.b.kv->report().session_reads, 2u);
    restored = p.b.restore(3, {20, 21, 22, 23});
    ASSERT_TRUE(restored);
    EXPECT_TRUE(restored->ok) << restored->message;
    for (uint32_t i = 0; i < 4; i++) EXPECT_EQ(p.b.pool.at(20 + i), p.a.pool.at(3 + i)) << i;
    // Unchanged since: the header alone is read, nothing counted again.
    auto same = p.b.lookup(4, longer, session);
    ASSERT_TRUE(same);
    EXPECT_EQ(same->n_blocks, 4u);
    EXPECT_EQ(p.b.kv->report().session_reads, 2u);
    ASSERT_TRUE(p.b.kv->tell(kv_release{4}, "scheduler").ok());
    EXPECT_EQ(tmp_files_in(p.dir), 0u);
}

TEST(KvActorShared, AFileAnotherReplicaRemovedOrReplacedIsForgottenNotQuarantined) {
    shared_pair p;
    const std::string session = "conv-2";
    const std::string name = *kv_session_name(test_fp, session);
    p.a.save_session(1, session, prompt(3), {0, 1, 2}, 1);
    auto hit = p.b.lookup(1, prompt(3), session);
    ASSERT_TRUE(hit);
    ASSERT_EQ(hit->n_blocks, 3u);
    ASSERT_TRUE(p.b.kv->tell(kv_release{1}, "scheduler").ok());

    // a replaces the file while b holds a lease on the old one: b's restore finds the header
    // changed, forgets the entry, and quarantines nothing.
    auto leased = p.b.lookup(2, prompt(3), session);
    ASSERT_TRUE(leased);
    ASSERT_EQ(leased->n_blocks, 3u);
    p.a.save_session(2, session, prompt(2, 900), {3, 4}, 2);
    ASSERT_TRUE(p.b.kv->tell(kv_restore{2, 0, {10, 11, 12}, 0}, "scheduler").ok());
    auto gone = p.b.sched.next_any();
    ASSERT_TRUE(gone && std::holds_alternative<kv_evicted>(*gone));
    EXPECT_EQ(std::get<kv_evicted>(*gone).name, name);
    EXPECT_EQ(std::get<kv_evicted>(*gone).reason, eviction::gone);
    auto failed = p.b.sched.next<kv_restore_done>();
    ASSERT_TRUE(failed);
    EXPECT_FALSE(failed->ok);
    EXPECT_EQ(failed->code, kv_failure_of(kv_error::changed));
    EXPECT_EQ(p.b.kv->report().quarantined, 0u);
    EXPECT_EQ(files_in(fs::path(p.dir) / "quarantine"), 0u);
    EXPECT_TRUE(fs::exists(p.b.path_of(name))) << "a good file was moved";
    // The next lookup reads the newer file: it shares no block with the old prompt.
    auto miss = p.b.lookup(3, prompt(3), session);
    ASSERT_TRUE(miss);
    EXPECT_EQ(miss->n_blocks, 0u);
    auto other = p.b.lookup(4, prompt(2, 900), session);
    ASSERT_TRUE(other);
    EXPECT_EQ(other->n_blocks, 2u);
    ASSERT_TRUE(p.b.kv->tell(kv_release{4}, "scheduler").ok());

    // a deletes the session; b, which indexed it, forgets it at its next lookup.
    ASSERT_TRUE(p.a.kv->tell(kv_session_delete{1, 1, session}, "scheduler").ok());
    auto deleted = p.a.sched.next<kv_session_deleted>();
    ASSERT_TRUE(deleted);
    EXPECT_TRUE(deleted->deleted) << deleted->error;
    auto after = p.b.lookup(5, prompt(2, 900), session);
    ASSERT_TRUE(after);
    EXPECT_EQ(after->n_blocks, 0u);
    EXPECT_EQ(p.b.kv->report().files, 0u);
    EXPECT_EQ(p.b.kv->report().quarantined, 0u);
}

TEST(KvActorShared, ASessionSaveIsWrittenEvenWhenTheIndexSaysTheFileHoldsIt) {
    shared_pair p;
    const std::string session = "conv-5";
    const std::string name = *kv_session_name(test_fp, session);
    const auto mine = prompt(2), theirs = prompt(2, 700);
    p.b.save_session(1, session, mine, {0, 1}, 1);
    // a replaces it with another branch of the conversation; b's index still says `mine`.
    p.a.save_session(1, session, theirs, {0, 1}, 1);
    // b saves `mine` again (a regenerated turn): written, not skipped as already on disk.
    p.b.save_session(2, session, mine, {2, 3}, 2);
    auto h = read_kv_header(p.b.path_of(name), kv_expect{test_fp, geometry()});
    ASSERT_TRUE(h.ok()) << h.err().message;
    auto t = read_kv_tokens(p.b.path_of(name), *h);
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(*t, mine);
}

TEST(KvActorShared, SessionDeleteRemovesAFileThisReplicaNeverIndexed) {
    shared_pair p;
    const std::string session = "conv-3";
    const std::string name = *kv_session_name(test_fp, session);
    p.a.save_session(1, session, prompt(2), {0, 1}, 1);
    ASSERT_TRUE(p.b.kv->tell(kv_session_delete{1, 1, session}, "scheduler").ok());
    auto deleted = p.b.sched.next<kv_session_deleted>();
    ASSERT_TRUE(deleted);
    EXPECT_TRUE(deleted->deleted) << deleted->error;
    EXPECT_FALSE(fs::exists(p.b.path_of(name)));
    // Nothing left to delete: answered, not deleted.
    ASSERT_TRUE(p.b.kv->tell(kv_session_delete{1, 2, session}, "scheduler").ok());
    auto again = p.b.sched.next<kv_session_deleted>();
    ASSERT_TRUE(again);
    EXPECT_FALSE(again->deleted);
    EXPECT_TRUE(again->error.empty());
}

TEST(KvActorShared, TwoReplicasSavingOneSessionAtOnceLeaveOneValidFile) {
    shared_pair p;
    const std::string session = "conv-4";
    const std::string name = *kv_session_name(test_fp, session);
    for (int round = 0; round < 8; round++) {
        const auto ta = prompt(3, 1000 * (round + 1));
        const auto tb = prompt(2, 1000 * (round + 1) + 500);
        p.a.fill({0, 1, 2});
        p.b.fill({0, 1});
        // Both copy out, then both write at once.
        p.a.save(10 + round, ta, {0, 1, 2}, 0, session);
        p.b.save(10 + round, tb, {0, 1}, 0, session);
        p.a.answer_copy();
        p.a.answer_copy();
        p.b.answer_copy();
        auto da = p.a.sched.next<kv_save_done>();
        auto db = p.b.sched.next<kv_save_done>();
        ASSERT_TRUE(da && da->copied && db && db->copied);
        ASSERT_TRUE(eventually([&] {
            return p.a.kv->report().saves == uint64_t(round + 1) &&
                   p.b.kv->report().saves == uint64_t(round + 1);
        }));
        // One complete file: either writer's, whole.
        auto h = read_kv_header(p.a.path_of(name), kv_expect{test_fp, geometry()});
        ASSERT_TRUE(h.ok()) << h.err().message;
        auto t = read_kv_tokens(p.a.path_of(name), *h);
        ASSERT_TRUE(t.ok()) << t.err().message;
        EXPECT_TRUE(*t == ta || *t == tb);
        std::vector<uint8_t> bytes(h->n_blocks * geometry().block_bytes());
        ASSERT_TRUE(read_kv_blocks(p.a.path_of(name), *h, 0, h->n_blocks, bytes).ok());
        EXPECT_EQ(tmp_files_in(p.dir), 0u);
        // Each replica's next lookup finds the file that won, never the other's tokens.
        auto la = p.a.lookup(100 + round, *t, session);
        ASSERT_TRUE(la);
        EXPECT_EQ(la->n_blocks, h->n_blocks);
        ASSERT_TRUE(p.a.kv->tell(kv_release{uint64_t(100 + round)}, "scheduler").ok());
        auto lb = p.b.lookup(100 + round, *t, session);
        ASSERT_TRUE(lb);
        EXPECT_EQ(lb->n_blocks, h->n_blocks);
        ASSERT_TRUE(p.b.kv->tell(kv_release{uint64_t(100 + round)}, "scheduler").ok());
    }
    EXPECT_EQ(p.a.kv->report().quarantined + p.b.kv->report().quarantined, 0u);
}

TEST(KvActorShared, TheScanLeavesOtherWritersAndOtherModelsAlone) {
    const auto mine = prompt(2);
    const auto theirs = prompt(2, 300);
    const model::fingerprint other_fp{1, 2};
    const std::string young = kv_prefix_name(test_fp, prompt(1, 50)) + ".0123abcd.tmp";
    const std::string stale = kv_prefix_name(test_fp, prompt(1, 60)) + ".89abcdef.tmp";
    const std::string other_name = kv_prefix_name(other_fp, theirs);
    auto populate = [&](const std::string& dir) {
        write_valid_file(dir, mine);
        kv_file_meta meta{.fingerprint = other_fp, .geometry = geometry()};
        std::vector<uint8_t> blocks(2 * geometry().block_bytes(), 7);
        ASSERT_TRUE(write_kv_file(dir, other_name, meta, theirs, blocks).ok());
        std::ofstream(dir + "/" + young) << "a save in the making";
        std::ofstream(dir + "/" + stale) << "a writer that died";
        const auto old =
            fs::file_time_type::clock::now() - std::chrono::seconds(shared_tmp_stale_seconds + 60);
        fs::last_write_time(dir + "/" + stale, old);
    };
    const std::string dir = make_temp_dir();
    {
        rig r(dir, true, populate);
        EXPECT_EQ(r.kv->report().files, 1u);
        EXPECT_EQ(r.kv->report().quarantined, 0u);
        EXPECT_TRUE(fs::exists(dir + "/" + young)) << "another writer's save was deleted";
        EXPECT_FALSE(fs::exists(dir + "/" + stale)) << "a dead writer's .tmp was kept";
        EXPECT_TRUE(fs::exists(r.path_of(other_name))) << "another model's file was moved";
        // Its probe file is its own and gone after the probe.
        for (const auto& e : fs::directory_iterator(dir)) {
            EXPECT_NE(e.path().filename().string().rfind(".ordo-probe", 0), 0u) << e.path();
        }
    }
    // Not shared: the same directory is this server's alone, and both are leftovers.
    {
        rig r(dir, false);
        EXPECT_FALSE(fs::exists(dir + "/" + young));
        EXPECT_FALSE(fs::exists(r.path_of(other_name)));
        EXPECT_EQ(r.kv->report().quarantined, 1u);
    }
    std::error_code ec;
    fs::remove_all(dir, ec);
}

TEST(KvActorShared, ARunningServerSweepsAwayADeadWritersTmp) {
    const std::string dir = make_temp_dir();
    const std::string stale = dir + "/" + kv_prefix_name(test_fp, prompt(1, 60)) + ".89ab.tmp";
    const std::string young = dir + "/" + kv_prefix_name(test_fp, prompt(1, 50)) + ".0123.tmp";
    {
        // A save in the making, there before the actor starts: every sweep pass sees it.
        rig r(
            dir, true, [&](const std::string&) { std::ofstream(young) << "a save in the making"; },
            20);  // a sweep every 20 ms
        // Planted after the startup scan: a writer that died mid-save an hour ago.
        std::ofstream(stale) << "a writer that died";
        fs::last_write_time(stale, fs::file_time_type::clock::now() -
                                       std::chrono::seconds(shared_tmp_stale_seconds + 60));
        EXPECT_TRUE(eventually([&] { return !fs::exists(stale); }))
            << "the stale .tmp was never swept";
        EXPECT_TRUE(fs::exists(young)) << "a save in the making was swept";
    }
    std::error_code ec;
    fs::remove_all(dir, ec);
}

}  // namespace
