// kv_blocks_check.cpp: kv_blocks::check_invariants, the full consistency check that tests run
// after every operation (and a debug build may run after every step). O(blocks + table
// entries); never called on the hot path of a release build.
#include <algorithm>
#include <string>
#include <vector>

#include "scheduler/kv_blocks.hpp"

namespace ordo::sched {
namespace {

error broken(const std::string& what) {
    return make_error("internal", "kv_blocks: " + what);
}

std::string blk(uint32_t b) {
    return "block " + std::to_string(b);
}

}  // namespace

status kv_blocks::check_invariants() const {
    if (auto s = check_block_states(); !s) return s;
    return check_sequences();
}

status kv_blocks::check_block_states() const {
    const uint32_t n = _config.n_blocks;
    std::vector<uint32_t> occurrences(n, 0);
    std::vector<uint8_t> in_free(n, 0), in_lru(n, 0);
    for (const auto& [id, s] : _seqs) {
        for (block_id b : s.table) {
            if (b >= n) return broken("sequence " + std::to_string(id) + " holds " + blk(b));
            occurrences[b]++;
        }
    }
    for (const auto& [id, blocks] : _pins) {
        for (block_id b : blocks) {
            if (b >= n) return broken("pin " + std::to_string(id) + " holds " + blk(b));
            occurrences[b]++;
        }
    }
    for (block_id b : _free) {
        if (b >= n || in_free[b]) return broken(blk(b) + " is on the free list twice or invalid");
        in_free[b] = 1;
    }
    uint32_t walked = 0, prev = no_block;
    for (uint32_t b = _lru_head; b != no_block; b = _meta[b].lru_next) {
        // The walk is bounded by the pool size, so a cycle is reported, not followed forever.
        if (b >= n || in_lru[b] || walked >= n) return broken("LRU list is corrupt at " + blk(b));
        if (_meta[b].lru_prev != prev) return broken("LRU back link of " + blk(b) + " is wrong");
        in_lru[b] = 1;
        prev = b;
        walked++;
    }
    if (walked != _lru_size || prev != _lru_tail) return broken("LRU size or tail is wrong");
    uint32_t n_cached = 0;
    for (uint32_t b = 0; b < n; b++) {
        const block_meta& m = _meta[b];
        if (m.refs != occurrences[b]) {
            return broken(blk(b) + " has refcount " + std::to_string(m.refs) + " but is in " +
                          std::to_string(occurrences[b]) + " tables and pins");
        }
        const int states = (m.refs > 0) + in_free[b] + in_lru[b];
        if (states != 1) return broken(blk(b) + " is in " + std::to_string(states) + " states");
        if (in_free[b] && m.cached) return broken(blk(b) + " is free but cached");
        if (in_lru[b] && !m.cached) return broken(blk(b) + " is in the LRU but not cached");
        if (m.cached) {
            n_cached++;
            auto it = _index.find(m.key);
            if (it == _index.end() || it->second != b) return broken(blk(b) + " not indexed");
        }
    }
    if (n_cached != _index.size()) return broken("index has entries for uncached blocks");
    return {};
}

status kv_blocks::check_sequences() const {
    const uint32_t B = _config.block_tokens;
    std::unordered_map<block_id, uint32_t> pinned;
    for (const auto& [id, blocks] : _pins) {
        for (block_id b : blocks) pinned[b]++;
    }
    for (const auto& [id, s] : _seqs) {
        const std::string name = "sequence " + std::to_string(id);
        std::vector<block_id> sorted(s.table);
        std::sort(sorted.begin(), sorted.end());
        if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
            return broken(name + " holds a block twice");
        }
        if (s.n_committed > s.table.size() * size_t{B}) {
            return broken(name + " committed more tokens than its blocks hold");
        }
        if (size_t{s.n_hashed} * B > s.n_committed || s.step_first_block > s.n_hashed) {
            return broken(name + " has an inconsistent hashed prefix");
        }
        // Blocks still being written must be private: nobody writes into a shared block
        // (a restore's pin is the writer's own reference).
        for (size_t i = s.n_hashed; i < s.table.size(); i++) {
            const block_meta& m = _meta[s.table[i]];
            auto p = pinned.find(s.table[i]);
            if (m.refs != 1 + (p == pinned.end() ? 0 : p->second) || m.cached) {
                return broken(name + " writes into shared or cached " + blk(s.table[i]));
            }
        }
    }
    return {};
}

}  // namespace ordo::sched
