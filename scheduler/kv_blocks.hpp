// kv_blocks.hpp: the paged KV block manager and its in-memory prefix cache (pure bookkeeping).
//
// Owned by the scheduler actor, which is the only thread that touches it. It decides which
// block of the gpu actor's KV pool holds which tokens of which sequence; the gpu actor only
// reads the block tables it is sent. No KV data lives here: a block is an id.
//
// ## Blocks
// The pool has n_blocks blocks of block_tokens tokens (ids 0..n_blocks-1). A sequence's block
// table maps its token position p to block table[p / block_tokens]. Every block is in exactly
// one state:
//   free      — on the free list, holds nothing;
//   in use    — in the table of one or more sequences (refs = how many);
//   cached    — refs 0 but its KV is still a valid prefix-cache entry, on the LRU list.
// Allocation takes the free list first, then evicts the least recently used cached block.
//
// ## Prefix cache
// A FULL block whose KV is computed (commit_full_blocks) is published under a chain key:
// key(i) = hash(key(i-1), the block_tokens ids of block i), so one key names the whole prefix
// up to and including that block. The entry also stores its tokens and a serial number of the
// entry before it in the chain; a lookup only hits when the key, the tokens and the parent's
// serial all agree, so a hash collision costs a cache miss, never shared wrong KV (serials are
// never reused, hence an entry can only follow the exact entry it was published after). When
// a block is published under a key held by a different prefix, the newest entry wins.
// Published blocks are immutable: nobody writes into a block that is in the cache or shared.
// A new request's lookup_prefix takes references on the longest cached chain of its prompt,
// but never covers the whole prompt: at least the last prompt token must be computed so the
// step produces logits to sample from. When the prompt is a whole number of cached blocks,
// the last block is therefore recomputed into a new block of the sequence.
// Freed sequences release their blocks last-first, so a chain's leaves are older in the LRU
// than its root and are evicted first (an evicted root would orphan its whole chain).
//
// ## Failures (ARCHITECTURE.md F1)
// Call reserve() before every step a sequence takes part in: it allocates the blocks the step
// writes and marks the step's start. invalidate_sequence() after a failed step drops the
// sequence completely (the scheduler recomputes it from token 0, hitting the cache for what
// was valid before the step), frees every block not committed, and removes from the cache
// every entry the sequence published since that step began (a failure found after commit,
// e.g. NaN logits). Entries published by earlier, successful steps stay. invalidate_all() is
// for device loss: the pool's contents are gone, so is every sequence and cache entry.
//
// ## Exhaustion and preemption (policy hook)
// reserve() is all-or-nothing: when the free list plus the evictable cached blocks cannot
// cover it, it allocates nothing and returns error "kv_exhausted". The scheduler then preempts
// a running sequence (free_sequence, requeue for recompute) and retries. pick_victim() gives
// the default policy: the most recently admitted sequence whose release would return at least
// one block to the pool (vLLM's choice: the oldest requests keep making progress).
//
// A freed or cancelled sequence's blocks must not be released while a step in flight still
// uses them: the scheduler calls free_sequence only once that step's outcome is applied.
//
// ## Pins (KV persistence)
// A pin holds one reference on each block it names, like a sequence that is not running: a
// block being copied out to disk (a save) or copied in from disk (a restore) stays allocated
// until the kv actor answers and the scheduler unpins it, even when the sequence that named it
// is freed or cancelled meanwhile. A block being restored is in its sequence's table past the
// hashed prefix, so it is published only after the first step that uses it succeeds: until
// then no other request can see it (invalidate_sequence drops it like any block of a failed
// step). invalidate_all drops every pin (the pool's contents are gone).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "actors/runtime/result.hpp"

namespace ordo::sched {

using block_id = uint32_t;
using seq_id = uint64_t;
using pin_id = uint64_t;

// Limits: the pool size and the block size are config values checked here again so that a
// bad value is an error, never a giant allocation.
inline constexpr uint32_t kv_blocks_max = 1u << 24;
inline constexpr uint32_t kv_block_tokens_max = 4096;
inline constexpr uint64_t kv_pool_tokens_max = 1ull << 24;  // the cache stores every block's ids

// The chain hash of one block: a 64-bit FNV-1a-style walk over the parent key and the token
// ids, finished with a splitmix64 avalanche. Written here so keys are the same everywhere.
uint64_t kv_chain_hash(uint64_t parent_key, std::span<const int32_t> tokens);
using kv_hash_fn = uint64_t (*)(uint64_t parent_key, std::span<const int32_t> tokens);
inline constexpr uint64_t kv_chain_root_key = 0x6f72646f6b763031ull;  // "ordokv01"

struct kv_blocks_config {
    uint32_t n_blocks = 0;      // blocks in the pool
    uint32_t block_tokens = 0;  // tokens per block
    bool prefix_cache = true;   // share full blocks between sequences
};

struct kv_blocks_stats {
    uint32_t blocks_total = 0;
    uint32_t blocks_used = 0;    // in some sequence's table
    uint32_t blocks_free = 0;    // on the free list
    uint32_t blocks_cached = 0;  // unreferenced, in the LRU (allocatable by eviction)
    uint32_t sequences = 0;
    uint32_t pins = 0;         // live pins (saves and restores in flight)
    uint64_t hits = 0;         // full prompt blocks taken from the cache by lookup_prefix
    uint64_t misses = 0;       // full prompt blocks lookup_prefix looked for and did not find
    uint64_t evictions = 0;    // cached blocks reclaimed for allocation
    uint64_t collisions = 0;   // key found but tokens or parent differed (never shared)
                               // (also a stale entry replaced; the newest entry wins)
    uint64_t invalidated = 0;  // cache entries removed by invalidate_sequence
};

class kv_blocks {
public:
    // `hash` is for tests (a degenerate hash forces collisions); production uses the default.
    static result<kv_blocks> create(const kv_blocks_config& config,
                                    kv_hash_fn hash = kv_chain_hash);

    // Registers a new, empty sequence (error "bad_sequence" when the id is live).
    status add_sequence(seq_id seq);
    // Takes references on the longest cached chain of full blocks of `prompt` (never the whole
    // prompt) for an empty sequence; returns the number of tokens covered (a multiple of
    // block_tokens) whose KV need not be computed.
    result<uint32_t> lookup_prefix(seq_id seq, std::span<const int32_t> prompt);
    // Makes the sequence's table cover n_tokens tokens before a step, allocating (and evicting)
    // as needed; all-or-nothing; "kv_exhausted" when the pool cannot. Marks the step's start.
    status reserve(seq_id seq, uint32_t n_tokens);
    // After a successful step: `tokens` are the sequence's tokens whose KV is now computed,
    // from position 0. Publishes every newly full block to the cache.
    status commit_full_blocks(seq_id seq, std::span<const int32_t> tokens);
    // Releases the sequence's blocks (shared ones lose a reference; cached ones go to the LRU).
    status free_sequence(seq_id seq);
    // After a failed step (see the file comment). Returns the other live sequences that hold a
    // block whose cache entry was removed: their KV is suspect too and they must be
    // invalidated as well (empty unless they looked the entry up after the failed commit).
    result<std::vector<seq_id>> invalidate_sequence(seq_id seq);
    // Takes a reference on each of `blocks` (each must be held by a sequence now: "bad_block"
    // otherwise) until unpin(). Returns the pin's id (never 0, never reused).
    result<pin_id> pin(std::span<const block_id> blocks);
    // Drops the pin's references; false for an unknown pin (already unpinned, or dropped by
    // invalidate_all: its blocks belong to a newer pool).
    bool unpin(pin_id pin);
    bool has_pin(pin_id pin) const { return _pins.count(pin) != 0; }

    // Device loss: every block becomes free, every cache entry, sequence and pin is dropped.
    // Returns the ids of the sequences that were live (sorted), to be recomputed.
    std::vector<seq_id> invalidate_all();

    // The sequence's block table (empty for an unknown id).
    std::span<const block_id> block_table(seq_id seq) const;
    uint32_t committed_tokens(seq_id seq) const;
    bool has_sequence(seq_id seq) const { return _seqs.count(seq) != 0; }
    // Blocks the pool would regain if the sequence were freed (those only it references).
    uint32_t blocks_reclaimable(seq_id seq) const;
    // Default preemption policy: among `admission_order` (oldest first), the newest sequence
    // with blocks_reclaimable > 0; nullopt when none would help.
    std::optional<seq_id> pick_victim(std::span<const seq_id> admission_order) const;
    // Blocks an allocation can get right now: free plus evictable cached blocks.
    uint32_t blocks_available() const;

    kv_blocks_stats stats() const;
    const kv_blocks_config& config() const { return _config; }

    // Full consistency check for tests and debug builds: every block in exactly one state,
    // refcounts equal table occurrences, LRU and index agree. Error "internal" naming the
    // first violated invariant.
    status check_invariants() const;

private:
    static constexpr uint32_t no_block = 0xFFFFFFFFu;

    struct block_meta {
        uint32_t refs = 0;             // sequences whose table holds this block
        bool cached = false;           // has the index entry `key`
        uint64_t key = 0;              // chain key, when cached
        uint64_t serial = 0;           // this entry's serial, when cached (never reused)
        uint64_t parent_serial = 0;    // serial of the previous entry in the chain (0 = root)
        uint32_t lru_prev = no_block;  // LRU links, when cached and refs == 0
        uint32_t lru_next = no_block;
    };

    struct sequence {
        std::vector<block_id> table;
        uint32_t n_committed = 0;                // tokens whose KV is computed
        uint32_t n_hashed = 0;                   // leading blocks whose chain key is known
        uint64_t chain_key = kv_chain_root_key;  // key of block n_hashed - 1
        uint64_t chain_serial = 0;      // serial of the entry holding block n_hashed - 1 (0: none)
        uint32_t step_first_block = 0;  // n_hashed when the current step began (reserve)
    };

    explicit kv_blocks(const kv_blocks_config& config, kv_hash_fn hash);

    sequence* find(seq_id seq);
    const sequence* find(seq_id seq) const;
    block_id allocate_one();
    void take_ref(block_id b);
    void drop_ref(block_id b);
    void lru_push_back(block_id b);
    void lru_remove(block_id b);
    void uncache(block_id b);
    void publish_block(sequence& s, block_id b, std::span<const int32_t> tokens);
    bool entry_matches(block_id b, uint64_t parent_serial, std::span<const int32_t> tokens) const;
    std::span<const int32_t> stored_tokens(block_id b) const;
    status check_block_states() const;
    status check_sequences() const;

    kv_blocks_config _config;
    kv_hash_fn _hash;
    std::vector<block_meta> _meta;  // (n_blocks)
    std::vector<int32_t> _tokens;   // (n_blocks, block_tokens) ids of cached blocks
    std::vector<block_id> _free;    // free list, used as a stack
    uint32_t _lru_head = no_block;  // least recently used cached block
    uint32_t _lru_tail = no_block;  // most recently used
    uint32_t _lru_size = 0;
    std::unordered_map<uint64_t, block_id> _index;  // chain key -> cached block
    std::unordered_map<seq_id, sequence> _seqs;
    std::unordered_map<pin_id, std::vector<block_id>> _pins;
    uint64_t _next_serial = 1;
    pin_id _next_pin = 1;
    kv_blocks_stats _counters;  // hits, misses, evictions, collisions, invalidated
};

}  // namespace ordo::sched
