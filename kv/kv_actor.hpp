// kv_actor.hpp: the kv actor — persisted KV prefixes and sessions (ARCHITECTURE.md "kv", F7).
//
// Owns the kv directory, its in-memory index (kv_index), the byte budget and LRU eviction, on
// its own libuv loop. File I/O never runs on the loop: scans, reads, writes, renames and
// unlinks are libuv work requests on the thread pool, whose completions come back to the loop.
// KV bytes never travel in messages: the actor copies pool blocks out to (and in from) one
// kv_staging slot with gpu::kv_copy_out / kv_copy_in jobs, kv_copy_blocks_max blocks per job,
// one job in flight at a time, and keeps a save's or a restore's bytes in its own buffer.
//
// ## What it answers (kv_msgs.hpp has the messages)
// - kv_lookup: the longest run of full blocks on disk (session first, then automatic
//   prefixes), leased to the sequence until its kv_restore / kv_release. Before the startup
//   scan is done every lookup misses: serving never waits for the scan.
// - kv_restore: reads the blocks, VERIFIES EVERY BLOCK'S CHECKSUM, then copies them in. A file
//   that fails verification is quarantined (and announced with kv_evicted{quarantined}); the
//   scheduler recomputes.
// - kv_save: copies the blocks out (then kv_save_done: the scheduler unpins them), then writes
//   the file atomically (kv_file.hpp), adds it to the index and evicts down to the budget
//   (kv_evicted{budget} per file). A prefix already covered by a file is not written again.
// - kv_invalidate: quarantines an entry a failed step was restored from.
// - kv_session_delete: removes the session's file.
// - kv_fault: arms faults for the next saves or restores (kv_armed_faults), applied inside the
//   real write and read (kv_write_stop, kv_read_fault), so what follows is the real fault path;
//   kv_stall_read holds the read's pool thread first, as a hung disk's read would, and
//   kv_stall_unlink a session_delete's unlink.
//
// ## Startup scan
// Creates the directory (and `quarantine/`), then checks every entry: names it did not write,
// symlinks, directories and other non-regular files are ignored (never followed, never
// touched); `.tmp` leftovers of a crash are deleted; every `.kv` header is validated against
// the loaded model (fingerprint, geometry, dtype, block size, version, checksums, size) and its
// token ids verified. A file that fails is moved to quarantine (bounded: quarantine_files_max
// files and quarantine_bytes_max bytes, oldest deleted first), counted by code and logged.
//
// ## Shared directory ([kv] shared; docs/deploy.md)
// Replicas of one model may share one directory (a shared volume), so that a session saved by
// one replica is restored by another after failover. Every write goes through the writer's own
// `<stem>.<writer>.tmp`, then one atomic rename: two replicas saving the same session never
// touch each other's file in the making, and the last complete file renamed wins. What changes
// when shared:
// - a session lookup reads the session file's header first (off the loop), and its token ids
//   when the header is not the one indexed: a file another replica wrote, replaced or removed
//   is seen at once (counted in session_reads); an automatic prefix another replica wrote is
//   found after the next startup scan;
// - a restore whose file was replaced meanwhile (kv_changed) forgets the entry without
//   quarantining a good file (kv_evicted{gone}); one whose file was removed does so in every
//   mode;
// - a save whose file another writer replaced right after the rename is not indexed, and a
//   session's save is written even when the index says its file holds these tokens (another
//   writer may have replaced it since);
// - the startup scan deletes another writer's `.tmp` only past shared_tmp_stale_seconds, and
//   leaves files of another model or KV layout alone instead of quarantining them; a sweep
//   every sweep_ms deletes such stale `.tmp` files while the server runs;
// - session_delete removes the file even when this replica never indexed it;
// - the byte budget bounds the files this replica knows (its scan, its saves, the sessions it
//   read): the directory holds at most replicas x bytes_budget.
//
// ## Disk faults degrade, never stop serving
// A write that fails with a disk fault (kv_disk_fault: ENOSPC, EDQUOT, EROFS, EACCES, EPERM,
// EIO) turns persistence off: kv_status{persisting: false, reason} to the scheduler (a health
// reason; status stays ok), counted; lookups and restores of existing files go on. A write
// probe every probe_ms (at most probes_max times) turns it back on when the disk accepts a
// write again. A directory that cannot be created or written at start is the same fault.
//
// ## Stop
// flush() (from the bootstrap, before request_stop) refuses new saves and waits, at most
// flush_ms_max, for the saves in flight to be written; a save whose blocks were not copied out
// by then is dropped whole. Writes already running complete while the loop runs dry (each is a
// bounded, atomic write: never torn).
#pragma once

#include <uv.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "actors/runtime/actor.hpp"
#include "actors/runtime/delivery.hpp"
#include "actors/runtime/outbox.hpp"
#include "gpu/gpu_msgs.hpp"
#include "gpu/logits/kv_staging.hpp"
#include "kv/kv_file.hpp"
#include "kv/kv_index.hpp"
#include "kv/kv_msgs.hpp"

namespace ordo::kv {

// Bounds with no config key (docs/protocol.md "[kv]").
inline constexpr uint32_t quarantine_files_max = 64;
inline constexpr uint64_t quarantine_bytes_max = uint64_t{1} << 30;
inline constexpr uint64_t probe_ms_default = 30000;
inline constexpr uint32_t probes_max_default = 20;
// Saves whose bytes are held in memory (copied out, not yet written) at most; more are refused
// (kv_busy) rather than queued without bound.
inline constexpr uint32_t saves_pending_max = 4;
// Directory entries the startup scan looks at, at most (the rest are left alone, logged).
inline constexpr uint32_t scan_entries_max = 100000;
// [kv] shared: the startup scan deletes another writer's `.tmp` only when it was last written
// this long ago (its writer died mid-save); a younger one may be a save in the making. One file
// is written in well under a minute (kv_file_bytes_max is 64 GiB, but a save is at most one
// sequence's KV); an hour leaves a wide margin for a slow shared filesystem.
inline constexpr int64_t shared_tmp_stale_seconds = 3600;
// [kv] shared: how often a running server sweeps the directory for such stale `.tmp` files, so
// that a replica that died mid-save does not leave them until some replica restarts.
inline constexpr uint64_t shared_sweep_ms_default = 600000;
// A finished save's or restore's byte buffer is kept for the next job when it is at most this
// big. A fresh buffer of tens of MB costs more in page faults than reading its file: glibc maps
// allocations above 32 MiB afresh and unmaps them on free, and on a 2-core VM faulting in the
// 75 MB of a 2048-token restore of the medium model took 42 ms, reading and verifying it 13 ms
// (bench/README.md, ordo-bench-kv-restore). At most this much host memory stays held when idle.
inline constexpr uint64_t spare_buffer_bytes_max = uint64_t{128} << 20;

// The exit status of a process that an armed kv_torn_exit fault ended in the middle of a save
// (docs/protocol.md "fault"): distinct from every status the server exits with on its own.
inline constexpr int kv_torn_exit_code = 86;

// Armed kv faults (the `fault` op's kv kinds): how many of the next saves / restores fail each
// way. Loop thread only. Every save or restore asks armed() first, so a disarmed plan costs one
// branch.
inline constexpr uint32_t kv_fault_count_max = 1000000;  // armed of one kind, at most
// A kv_stall_read's or kv_stall_unlink's wait, at most (the `fault` op and the plan bound it to
// fault_delay_ms_max).
inline constexpr uint32_t kv_stall_ms_max = 10000;

struct kv_armed_faults {
    uint32_t enospc = 0;         // save: half the .tmp, then write fails with ENOSPC
    uint32_t eio = 0;            // save: half the .tmp, then write fails with EIO
    uint32_t torn_exit = 0;      // save: half the .tmp, then _exit(kv_torn_exit_code)
    uint32_t fingerprint = 0;    // save: the file says another model wrote it
    uint32_t flip_read = 0;      // restore: one bit of the blocks read flipped before verification
    uint32_t stall_read = 0;     // restore: the read first waits stall_read_ms on its thread
    uint32_t stall_read_ms = 0;  // (the latest arming's)
    uint32_t stall_unlink = 0;   // session_delete: the unlink first waits stall_unlink_ms
    uint32_t stall_unlink_ms = 0;  // (the latest arming's)
    bool armed() const {
        return (enospc | eio | torn_exit | fingerprint | flip_read | stall_read | stall_unlink) !=
               0;
    }
};

struct kv_actor_options {
    std::string dir;
    // [kv] shared: other servers (replicas of the same model) read and write `dir` too ("Shared
    // directory" above).
    bool shared = false;
    // This writer's tag in its `.tmp` and probe file names (kv_writer_tag); empty: one is drawn.
    std::string writer;
    uint64_t bytes_budget = 0;
    kv_expect expect;               // the loaded model's fingerprint and KV geometry
    uint32_t copy_blocks_max = 64;  // blocks per gpu copy job (runner kv_copy_blocks_max)
    uint64_t flush_ms_max = 5000;
    uint64_t probe_ms = probe_ms_default;
    uint32_t probes_max = probes_max_default;
    uint64_t sweep_ms = shared_sweep_ms_default;  // shared: stale .tmp sweep period
    size_t mailbox_capacity = 4096;
};

// kv actor → bootstrap: blocking flush (see "Stop").
struct kv_flush {
    static constexpr const char* msg_name = "kv_flush";
    ORDO_EMPTY_MESSAGE()
};

class kv_actor final : public actors::actor<kv_actor, kv_lookup, kv_restore, kv_release, kv_save,
                                            kv_invalidate, kv_session_delete, kv_fault,
                                            gpu::kv_copy_done, gpu::kv_copy_failed, kv_flush> {
public:
    using sched_outbox = actors::outbox<kv_lookup_done, kv_restore_done, kv_save_done, kv_evicted,
                                        kv_status, kv_session_deleted>;
    using gpu_outbox = actors::outbox<gpu::kv_copy_out, gpu::kv_copy_in>;

    // `staging` must outlive the actor and be connected to the gpu actor (connect_kv); its
    // slots must hold copy_blocks_max blocks.
    kv_actor(kv_actor_options options, gpu::kv_staging& staging);
    ~kv_actor() override;

    // Before start(): where answers and copy jobs go.
    template <typename Sched, typename Gpu>
    void connect(Sched& scheduler, Gpu& gpu) {
        _sched_out = sched_outbox(scheduler, "kv");
        _gpu_out = gpu_outbox(gpu, "kv");
    }

    void on(const kv_lookup& m);
    void on(const kv_restore& m);
    void on(const kv_release& m);
    void on(const kv_save& m);
    void on(const kv_invalidate& m);
    void on(const kv_session_delete& m);
    void on(const kv_fault& m);
    void on(const gpu::kv_copy_done& m);
    void on(const gpu::kv_copy_failed& m);
    void on(const kv_flush& m);

    // Any thread: a snapshot of the stats op's kv_disk map.
    kv_disk_report report() const;
    // Any thread: refuses new saves, then waits until no save is in flight or `timeout_ms`
    // passed. True when everything was written.
    bool flush(uint64_t timeout_ms);
    // Any thread: whether the startup scan is done (tests).
    bool scan_done() const;

protected:
    void on_start() override;
    void on_stop() override;

private:
    using clock = std::chrono::steady_clock;
    struct job;
    struct work;
    struct save_fault {
        kv_write_stop stop = kv_write_stop::none;
        bool torn_exit = false;    // stop is mid_tmp; the process then exits
        bool fingerprint = false;  // the file is written with another model's fingerprint
    };

    // copies
    void queue_copies(job& j);
    void start_next_copy();
    void copy_finished(bool ok, kv_failure code, const std::string& message);
    std::vector<uint8_t> take_buffer(uint64_t bytes);  // at least `bytes` long; _spare if it fits
    void end_job(uint64_t id);                         // erases it, keeping its buffer as _spare
    void save_copied(job& j, bool ok, kv_failure code);
    void restore_finished(job& j, bool ok, kv_failure code, const std::string& message);
    // thread pool
    void offload(std::function<void()> run, std::function<void()> done);
    void write_save(uint64_t job_id);
    save_fault take_save_fault();  // the armed fault the next save applies (decremented)
    void read_restore(uint64_t job_id);
    // lookups
    void answer_lookup(const kv_lookup& m, const std::optional<std::string>& session_name);
    void refresh_session(const kv_lookup& m, const std::string& name);
    // index and disk state
    void apply_scan(struct scan_result& r);
    void forget(const std::string& name);  // drops an entry whose file is gone (kv_evicted{gone})
    void evict_to_budget();
    void remove_file(const std::string& name, eviction reason);
    void quarantine(const std::string& name, kv_failure code);
    void disk_fault(kv_error code, const std::string& message);
    void schedule_probe();
    static void probe_cb(uv_timer_t* t);
    static void sweep_cb(uv_timer_t* t);
    void count_error(kv_failure code);
    void publish();  // copies the counters into the report snapshot
    void maybe_flushed();
    std::string path_of(const std::string& name) const;
    std::string probe_path() const;  // this writer's write probe file

    kv_actor_options _opt;
    gpu::kv_staging& _staging;
    uint64_t _block_bytes = 0;
    sched_outbox _sched_out;
    gpu_outbox _gpu_out;
    actors::delivery<kv_lookup_done, kv_restore_done, kv_save_done, kv_evicted, kv_status,
                     kv_session_deleted>
        _to_sched;
    actors::delivery<gpu::kv_copy_out, gpu::kv_copy_in> _to_gpu;

    kv_index _index;
    bool _scan_done = false;
    bool _persisting = true;
    bool _flushing = false;
    std::string _off_reason;
    uint32_t _probes = 0;
    uv_timer_t _probe_timer{};
    bool _probe_running = false;
    uv_timer_t _sweep_timer{};  // shared: the stale .tmp sweep
    bool _sweep_running = false;
    kv_armed_faults _faults;

    std::map<uint64_t, std::unique_ptr<job>> _jobs;  // saves and restores in flight, by id
    uint64_t _next_job = 1;
    std::unordered_map<uint64_t, std::string> _leases;  // seq -> entry name
    std::deque<std::pair<uint64_t, uint32_t>> _copies;  // (job, first block index) to copy
    uint64_t _copy_job = 0;                             // job whose copy is in flight (0: none)
    uint32_t _copy_first = 0, _copy_count = 0;
    uint64_t _gpu_job_id = 0;       // kv_copy_*.job_id in flight
    std::optional<uint32_t> _slot;  // the staging slot this actor holds
    uint32_t _works = 0;            // thread-pool requests in flight
    std::vector<uint8_t> _spare;    // a finished job's buffer (spare_buffer_bytes_max), or empty

    kv_disk_report _counters;   // loop thread
    mutable std::mutex _mutex;  // guards _snapshot, _idle
    kv_disk_report _snapshot;
    bool _idle = true;  // no save in flight
    bool _scan_done_shared = false;
    std::condition_variable _idle_cv;
};

}  // namespace ordo::kv
