// kv_index.hpp: the kv actor's in-memory index of the files in its directory (pure
// bookkeeping: no I/O, no actor). Single-threaded: only the kv actor's loop touches it.
//
// An entry is one validated `<name>.kv` file: its header, its token ids and its size. Lookups:
//   - an automatic prefix entry is found by the chain key of any of its full blocks:
//     key(i) = XXH3-64(token ids of block i, seed = key(i-1)), so one key names the whole prefix up
//     to and including block i, and a file of 8 blocks also answers a prompt sharing only its
//     first 3. A key hit is confirmed by comparing the token ids (a hash collision is a miss,
//     never a wrong restore). Several entries may hold the same key (a 2-block prefix and a
//     4-block one that extends it): the newest answers, and the others answer again when it
//     leaves the index;
//   - a session entry only by its name (kv_session_name): sessions are kept apart from the
//     automatic prefixes.
// LRU: every lookup hit and every put touches the entry. over_budget() names the victims that
// bring the total under a budget: least recently used automatic prefixes first, sessions last,
// never an entry that is leased (a restore is about to read it).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/kv_file.hpp"

namespace ordo::kv {

uint64_t kv_chain_key(uint64_t parent, std::span<const int32_t> block_tokens);
inline constexpr uint64_t kv_chain_key_root = 0x6b76636861696e31ull;  // "kvchain1"

struct kv_entry {
    std::string name;  // file stem
    kv_file_header header;
    std::vector<int32_t> tokens;  // header.n_tokens() ids
    uint64_t last_use = 0;        // LRU clock
    uint32_t leases = 0;
    bool is_session() const { return header.meta.kind == kv_file_kind::session; }
};

struct kv_match {
    std::string name;
    uint32_t n_blocks = 0;
};

class kv_index {
public:
    explicit kv_index(uint32_t block_tokens) : _block_tokens(block_tokens) {}

    // Adds the entry, replacing one of the same name (its keys are dropped first, its leases
    // kept).
    void put(kv_entry e);
    // Removes the entry; false when unknown.
    bool erase(const std::string& name);
    const kv_entry* find(const std::string& name) const;
    // The longest run of full blocks of `tokens` held by the session entry `session_name`
    // (when given and present) or by any automatic prefix. Touches the entry it returns.
    std::optional<kv_match> longest(std::span<const int32_t> tokens,
                                    const std::string* session_name);
    // Whether an entry already holds exactly these tokens as (a prefix of) its own.
    bool covers(std::span<const int32_t> tokens) const;
    void lease(const std::string& name);
    void unlease(const std::string& name);
    // Victims (oldest first) whose removal brings bytes() + incoming to <= budget; may be
    // fewer when the rest is leased.
    std::vector<std::string> over_budget(uint64_t budget, uint64_t incoming = 0) const;

    uint64_t bytes() const { return _bytes; }
    size_t files() const { return _entries.size(); }
    size_t sessions() const;

private:
    kv_entry* find_mut(const std::string& name);
    std::vector<uint64_t> keys_of(std::span<const int32_t> tokens) const;
    uint32_t common_blocks(const kv_entry& e, std::span<const int32_t> tokens) const;

    uint32_t _block_tokens;
    uint64_t _clock = 0;
    uint64_t _bytes = 0;
    std::unordered_map<std::string, kv_entry> _entries;
    // chain key of block i -> every automatic entry holding blocks 0..i, oldest put first;
    // lookups take the newest. All of them are kept, not only the newest: when the newest
    // leaves (evicted, quarantined), an older entry holding the same blocks must still be found.
    std::unordered_map<uint64_t, std::vector<std::string>> _by_key;
};

}  // namespace ordo::kv
