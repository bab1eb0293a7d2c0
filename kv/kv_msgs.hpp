// kv_msgs.hpp: the messages between the scheduler and the kv actor (ARCHITECTURE.md's
// Save/Load ▸ Saved/Loaded/Evicted/Invalid arrows).
//
// No KV bytes travel here: a message names pool blocks by id, and the kv actor moves their
// bytes between the device pool and its files through gpu::kv_copy_out / kv_copy_in jobs on a
// kv_staging slot (gpu_msgs.hpp). The scheduler owns the pool: it pins the blocks a save or a
// restore names (kv_blocks::pin) until the kv actor's answer, so no step can write a block
// that is being copied out and no sequence can see a block that is being restored.
//
// Every request of the scheduler gets exactly one answer:
//   kv_lookup  -> kv_lookup_done (and, when it names an entry, a lease the scheduler ends with
//                 exactly one kv_restore or kv_release)
//   kv_restore -> kv_restore_done
//   kv_save    -> kv_save_done (as soon as the blocks' bytes are copied out or the save is
//                 refused; the file is written after, off the loop)
//   kv_session_delete -> kv_session_deleted
// kv_release, kv_invalidate and kv_fault have no answer. kv_evicted and kv_status come unasked, in
// order. The kv actor's report (kv_disk_report, the stats op's kv_disk map) is declared here too.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <msgpack.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "actors/runtime/enum_names.hpp"
#include "actors/runtime/fault_kind.hpp"
#include "kv/kv_failure.hpp"
#include "kv/kv_file.hpp"

namespace ordo::kv {

// ---- the kv actor's report ---------------------------------------------------------------

// The stats op's `kv_disk` map: KV persistence as the kv actor reports it (kv_actor::report, a
// snapshot any thread may take; docs/protocol.md). Not a message: it travels inside the
// front doors' stats_done (door/door_msgs.hpp).
struct kv_disk_report {
    bool enabled = false;     // [kv] enabled
    bool ready = false;       // the startup scan is done (before it, lookups find nothing)
    bool persisting = false;  // saves are written (false after a disk fault, until a probe)
    std::string reason;       // why not persisting
    uint64_t files = 0, sessions = 0, bytes = 0, bytes_budget = 0;
    uint64_t saves = 0;                      // files written
    uint64_t saves_skipped = 0;              // already on disk, too large, persistence off, busy
    uint64_t save_failures = 0;              // copy or write failed
    uint64_t restores = 0;                   // restores that verified and copied in
    uint64_t restore_failures = 0;           // restores that did not
    uint64_t quarantined = 0;                // files moved to <dir>/quarantine
    uint64_t evictions = 0;                  // files removed for the byte budget
    uint64_t ignored = 0;                    // directory entries that are not ordo's files
    uint64_t probes = 0;                     // write probes after a disk fault
    double save_ms = 0, restore_ms = 0;      // summed
    std::map<std::string, uint64_t> errors;  // by code
    bool shared = false;                     // [kv] shared: other servers write the directory
    uint64_t session_reads = 0;  // shared: session files (re)read because another server wrote them
    uint64_t gone = 0;           // entries dropped: their file was removed or replaced by another
    MSGPACK_DEFINE_MAP(enabled, ready, persisting, reason, files, sessions, bytes, bytes_budget,
                       saves, saves_skipped, save_failures, restores, restore_failures, quarantined,
                       evictions, ignored, probes, save_ms, restore_ms, errors, shared,
                       session_reads, gone);
};

// ---- scheduler → kv ----------------------------------------------------------------------

// Which persisted prefix covers the longest run of full blocks of `tokens` (the prompt, cut to
// full blocks, never including its last token)? With `session`, that session's file is tried
// first, then the automatic prefixes. Reply: kv_lookup_done.
struct kv_lookup {
    static constexpr const char* msg_name = "kv_lookup";
    uint64_t seq = 0;
    std::vector<int32_t> tokens;
    std::optional<std::string> session;
    MSGPACK_DEFINE_MAP(seq, tokens, session);
};

// Copy blocks [first_block, first_block + blocks.size()) of the entry leased to `seq` into the
// pool blocks `blocks` (pinned by the scheduler), after verifying their checksums. `epoch` is
// the device epoch the block ids belong to (a copy for an older epoch is refused by the gpu).
// Ends the lease. Reply: kv_restore_done.
struct kv_restore {
    static constexpr const char* msg_name = "kv_restore";
    uint64_t seq = 0;
    uint32_t first_block = 0;
    std::vector<uint32_t> blocks;
    uint64_t epoch = 0;
    MSGPACK_DEFINE_MAP(seq, first_block, blocks, epoch);
};

// The scheduler will not restore what kv_lookup_done offered `seq` (the request ended, or no
// KV could be reserved): ends the lease. No reply.
struct kv_release {
    static constexpr const char* msg_name = "kv_release";
    uint64_t seq = 0;
    MSGPACK_DEFINE_MAP(seq);
};

// Persist `tokens` (a whole number of blocks, from position 0) whose KV is in the pool blocks
// `blocks` (one per block of tokens, pinned by the scheduler until kv_save_done). kind prefix:
// an automatic prefix, named by its tokens; session: the named session's file, replacing the
// previous one. Reply: kv_save_done.
struct kv_save {
    static constexpr const char* msg_name = "kv_save";
    uint64_t save_id = 0;
    kv_file_kind kind = kv_file_kind::prefix;
    std::optional<std::string> session;
    std::vector<int32_t> tokens;
    std::vector<uint32_t> blocks;
    uint64_t epoch = 0;
    MSGPACK_DEFINE_MAP(save_id, kind, session, tokens, blocks, epoch);
};

// A step failed right after a restore from `name`: the entry is quarantined so that no request
// restores it again (ARCHITECTURE.md F7: a bad cache must not fail every prefill). No reply.
struct kv_invalidate {
    static constexpr const char* msg_name = "kv_invalidate";
    std::string name;
    std::string reason;
    MSGPACK_DEFINE_MAP(name, reason);
};

// The `session_delete` op, after the scheduler found the session not busy. Reply:
// kv_session_deleted.
struct kv_session_delete {
    static constexpr const char* msg_name = "kv_session_delete";
    uint64_t conn = 0, id = 0;
    std::string session;
    // The scheduler's name for this delete, echoed in the answer: a client may reuse its request
    // id once it was told (kv_io after kv.restore_wait_ms), so (conn, id) may name a later one.
    uint64_t ticket = 0;
    MSGPACK_DEFINE_MAP(conn, id, session, ticket);
};

// The `fault` op with a kv kind (docs/protocol.md "fault"), after the scheduler checked that
// [fault] is enabled: the next `count` saves (kv_enospc, kv_eio, kv_torn_exit, kv_fingerprint)
// or restores (kv_flip_read) fail that way, through the real write / read path, or the next
// `count` restores' reads (kv_stall_read) or session files' removals (kv_stall_unlink) first
// wait `ms` on the thread that does them (a slow or hung disk). `kind` is one of the kv kinds
// (is_kv_fault). No reply.
struct kv_fault {
    static constexpr const char* msg_name = "kv_fault";
    fault_kind kind = fault_kind::kv_enospc;
    uint32_t count = 1;
    uint32_t ms = 0;  // a stall's wait
    MSGPACK_DEFINE_MAP(kind, count, ms);
};

// ---- kv → scheduler ----------------------------------------------------------------------

// n_blocks == 0: nothing on disk helps. Otherwise the entry `name` holds the first n_blocks
// blocks of the tokens asked for and is leased to `seq` (not evicted, not deleted) until the
// scheduler's kv_restore or kv_release.
struct kv_lookup_done {
    static constexpr const char* msg_name = "kv_lookup_done";
    uint64_t seq = 0;
    uint32_t n_blocks = 0;
    std::string name;
    MSGPACK_DEFINE_MAP(seq, n_blocks, name);
};

// ok: the blocks hold the entry's verified KV (code none). Otherwise nothing may be read from
// them; code (kv_failure.hpp): no_lease (no entry leased to seq), a kv_error such as
// block_checksum, truncated, changed or io (the file failed verification: it is quarantined),
// a gpu_failure (the copy failed; the device may be rebuilding), stopping.
struct kv_restore_done {
    static constexpr const char* msg_name = "kv_restore_done";
    uint64_t seq = 0;
    bool ok = false;
    kv_failure code = kv_failure::none;
    std::string message;
    double ms = 0;  // read + verify + copy
    MSGPACK_DEFINE_MAP(seq, ok, code, message, ms);
};

// The blocks of save `save_id` may be unpinned. copied: their bytes were copied out and the
// file is being written (code none); otherwise `code` says why not (persistence_off, exists,
// too_large, busy, a gpu_failure, stopping).
struct kv_save_done {
    static constexpr const char* msg_name = "kv_save_done";
    uint64_t save_id = 0;
    bool copied = false;
    kv_failure code = kv_failure::none;
    MSGPACK_DEFINE_MAP(save_id, copied, code);
};

// Why an entry left the index: the byte budget (LRU), a failed verification or step, the
// session_delete op, or its file was removed or replaced by another writer ([kv] shared: another
// server; or an operator) — a file that is not bad, left on disk as it is.
enum class eviction : uint8_t { budget, quarantined, deleted, gone };
inline constexpr std::array<std::string_view, 4> eviction_names = {"budget", "quarantined",
                                                                   "deleted", "gone"};
constexpr const auto& names_of(eviction) {
    return eviction_names;
}

// An entry left the index. Ordered after every kv_lookup_done that named it; a lease in flight
// is never evicted.
struct kv_evicted {
    static constexpr const char* msg_name = "kv_evicted";
    std::string name;
    eviction reason = eviction::budget;
    MSGPACK_DEFINE_MAP(name, reason);
};

// Whether persistence is on. When off, `reason` says why (e.g. "kv dir /x: write: No space
// left on device (ENOSPC)"); the scheduler reports it as a health reason while status stays ok.
struct kv_status {
    static constexpr const char* msg_name = "kv_status";
    bool persisting = true;
    std::string reason;
    MSGPACK_DEFINE_MAP(persisting, reason);
};

struct kv_session_deleted {
    static constexpr const char* msg_name = "kv_session_deleted";
    uint64_t conn = 0, id = 0;
    bool deleted = false;
    std::string error;    // non-empty: the file could not be removed (kv_io ...)
    uint64_t ticket = 0;  // the kv_session_delete's
    MSGPACK_DEFINE_MAP(conn, id, deleted, error, ticket);
};

}  // namespace ordo::kv

MSGPACK_ADD_ENUM(ordo::kv::kv_file_kind);
MSGPACK_ADD_ENUM(ordo::kv::eviction);
