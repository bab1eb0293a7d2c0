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
// is sent, and no later lookup offers it; every loop closes cleanly (join ok). Every wait is on
// a condition, bounded (probe waits and `eventually`); no fixed sleep decides anything.
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

// One kv actor between two probes, on a fresh temporary directory, all traced into one sink.
// The constructor returns once the startup scan is done (saves before it are refused).
struct rig {
    // `before_start`: what the directory holds before the actor's scan sees it.
    explicit rig(const std::function<void(const std::string& dir)>& before_start = {})
        : staging(1, uint64_t{copy_blocks_max} * geometry().block_bytes()) {
        std::string tmpl = (fs::temp_directory_path() / "ordo-kv-actor-XXXXXX").string();
        EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
        dir = tmpl;
        if (before_start) before_start(dir);
        kv_actor_options o;
        o.dir = dir;
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
        fs::remove_all(dir, ec);
    }

    void stop() {
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
              const std::vector<uint32_t>& blocks, uint64_t epoch = 0) {
        kv_save m;
        m.save_id = save_id;
        m.kind = kv_file_kind::prefix;
        m.tokens = tokens;
        m.blocks = blocks;
        m.epoch = epoch;
        ASSERT_TRUE(kv->tell(m, "scheduler").ok());
    }

    std::optional<kv_lookup_done> lookup(uint64_t seq, const std::vector<int32_t>& tokens) {
        EXPECT_TRUE(kv->tell(kv_lookup{seq, tokens, std::nullopt}, "scheduler").ok());
        return sched.next<kv_lookup_done>();
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

}  // namespace
