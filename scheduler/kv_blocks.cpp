// kv_blocks.cpp: block allocation, the prefix cache and failure invalidation (see
// kv_blocks.hpp for the model). Consistency checks live in kv_blocks_check.cpp.
#include "scheduler/kv_blocks.hpp"

#include <algorithm>
#include <cassert>

#include "scheduler/prng.hpp"

namespace ordo::sched {
namespace {

error no_sequence(seq_id seq) {
    return make_error("bad_sequence", "no live sequence " + std::to_string(seq));
}

}  // namespace

uint64_t kv_chain_hash(uint64_t parent_key, std::span<const int32_t> tokens) {
    constexpr uint64_t fnv_offset = 0xcbf29ce484222325ull;
    constexpr uint64_t fnv_prime = 0x100000001b3ull;
    // FNV-1a over 32-bit words (the parent key as two words, then each id), then a splitmix64
    // avalanche so that keys differing in one token differ in about half their bits.
    uint64_t h = fnv_offset;
    h = (h ^ (parent_key & 0xFFFFFFFFu)) * fnv_prime;
    h = (h ^ (parent_key >> 32)) * fnv_prime;
    for (int32_t t : tokens) h = (h ^ static_cast<uint32_t>(t)) * fnv_prime;
    return splitmix64_next(h);
}

result<kv_blocks> kv_blocks::create(const kv_blocks_config& config, kv_hash_fn hash) {
    if (config.n_blocks == 0 || config.n_blocks > kv_blocks_max) {
        return make_error("bad_config", "kv blocks must be 1.." + std::to_string(kv_blocks_max) +
                                            ", got " + std::to_string(config.n_blocks));
    }
    if (config.block_tokens == 0 || config.block_tokens > kv_block_tokens_max) {
        return make_error("bad_config", "kv block_tokens must be 1.." +
                                            std::to_string(kv_block_tokens_max) + ", got " +
                                            std::to_string(config.block_tokens));
    }
    if (uint64_t{config.n_blocks} * config.block_tokens > kv_pool_tokens_max) {
        return make_error("bad_config", "kv pool of " + std::to_string(config.n_blocks) + " x " +
                                            std::to_string(config.block_tokens) +
                                            " tokens exceeds " +
                                            std::to_string(kv_pool_tokens_max) + " tokens");
    }
    if (hash == nullptr) return make_error("bad_config", "kv hash function is null");
    return kv_blocks(config, hash);
}

kv_blocks::kv_blocks(const kv_blocks_config& config, kv_hash_fn hash)
    : _config(config),
      _hash(hash),
      _meta(config.n_blocks),
      _tokens(size_t{config.n_blocks} * config.block_tokens) {
    _free.reserve(config.n_blocks);
    // Pushed in reverse so that the stack hands out 0, 1, 2, ... (readable tables in logs).
    for (uint32_t b = config.n_blocks; b > 0; b--) _free.push_back(b - 1);
}

kv_blocks::sequence* kv_blocks::find(seq_id seq) {
    auto it = _seqs.find(seq);
    return it == _seqs.end() ? nullptr : &it->second;
}

const kv_blocks::sequence* kv_blocks::find(seq_id seq) const {
    auto it = _seqs.find(seq);
    return it == _seqs.end() ? nullptr : &it->second;
}

status kv_blocks::add_sequence(seq_id seq) {
    if (find(seq) != nullptr) {
        return make_error("bad_sequence", "sequence " + std::to_string(seq) + " is already live");
    }
    _seqs.emplace(seq, sequence{});
    return {};
}

std::span<const int32_t> kv_blocks::stored_tokens(block_id b) const {
    return {_tokens.data() + size_t{b} * _config.block_tokens, _config.block_tokens};
}

bool kv_blocks::entry_matches(block_id b, uint64_t parent_serial,
                              std::span<const int32_t> tokens) const {
    const block_meta& m = _meta[b];
    if (!m.cached || m.parent_serial != parent_serial) return false;
    const auto stored = stored_tokens(b);
    return std::equal(stored.begin(), stored.end(), tokens.begin(), tokens.end());
}

result<uint32_t> kv_blocks::lookup_prefix(seq_id seq, std::span<const int32_t> prompt) {
    sequence* s = find(seq);
    if (s == nullptr) return no_sequence(seq);
    if (!s->table.empty() || s->n_committed != 0) {
        return make_error("bad_sequence", "lookup_prefix needs an empty sequence, " +
                                              std::to_string(seq) + " has blocks");
    }
    if (!_config.prefix_cache || prompt.empty()) return uint32_t{0};
    const uint32_t B = _config.block_tokens;
    // The last prompt token is always computed (its logits are sampled), so only blocks that
    // end before it can come from the cache.
    const size_t n_full = (prompt.size() - 1) / B;
    uint64_t key = kv_chain_root_key;
    for (size_t i = 0; i < n_full; i++) {
        const auto tokens = prompt.subspan(i * B, B);
        const uint64_t next_key = _hash(key, tokens);
        auto it = _index.find(next_key);
        const bool found = it != _index.end();
        if (!found || !entry_matches(it->second, s->chain_serial, tokens)) {
            if (found) _counters.collisions++;
            _counters.misses += n_full - i;
            break;
        }
        const block_id b = it->second;
        take_ref(b);
        s->table.push_back(b);
        s->chain_serial = _meta[b].serial;
        key = next_key;
        _counters.hits++;
    }
    s->n_hashed = static_cast<uint32_t>(s->table.size());
    s->n_committed = s->n_hashed * B;
    s->chain_key = key;
    s->step_first_block = s->n_hashed;
    return s->n_committed;
}

status kv_blocks::reserve(seq_id seq, uint32_t n_tokens) {
    sequence* s = find(seq);
    if (s == nullptr) return no_sequence(seq);
    const uint64_t need = (uint64_t{n_tokens} + _config.block_tokens - 1) / _config.block_tokens;
    if (need > _config.n_blocks) {
        return make_error("kv_exhausted", std::to_string(n_tokens) + " tokens need " +
                                              std::to_string(need) + " blocks, the pool has " +
                                              std::to_string(_config.n_blocks));
    }
    const uint32_t have = static_cast<uint32_t>(s->table.size());
    const uint32_t extra = need > have ? static_cast<uint32_t>(need) - have : 0;
    if (extra > blocks_available()) {
        return make_error("kv_exhausted", "sequence " + std::to_string(seq) + " needs " +
                                              std::to_string(extra) + " more blocks, " +
                                              std::to_string(blocks_available()) + " available");
    }
    for (uint32_t i = 0; i < extra; i++) {
        const block_id b = allocate_one();
        _meta[b].refs = 1;
        s->table.push_back(b);
    }
    s->step_first_block = s->n_hashed;
    return {};
}

block_id kv_blocks::allocate_one() {
    if (!_free.empty()) {
        const block_id b = _free.back();
        _free.pop_back();
        return b;
    }
    const block_id b = _lru_head;  // the least recently used cached block
    assert(b != no_block && "reserve checked blocks_available");
    lru_remove(b);
    uncache(b);
    _counters.evictions++;
    return b;
}

status kv_blocks::commit_full_blocks(seq_id seq, std::span<const int32_t> tokens) {
    sequence* s = find(seq);
    if (s == nullptr) return no_sequence(seq);
    const uint32_t B = _config.block_tokens;
    if (tokens.size() < s->n_committed || tokens.size() > s->table.size() * size_t{B}) {
        return make_error("bad_commit", "sequence " + std::to_string(seq) + " commits " +
                                            std::to_string(tokens.size()) + " tokens; it has " +
                                            std::to_string(s->n_committed) + " committed and " +
                                            std::to_string(s->table.size() * B) + " reserved");
    }
    s->n_committed = static_cast<uint32_t>(tokens.size());
    const uint32_t full = s->n_committed / B;
    for (uint32_t i = s->n_hashed; i < full; i++) {
        const auto block_tokens = tokens.subspan(size_t{i} * B, B);
        const uint64_t key = _hash(s->chain_key, block_tokens);
        s->chain_key = key;
        if (_config.prefix_cache) publish_block(*s, s->table[i], block_tokens);
    }
    s->n_hashed = std::max(s->n_hashed, full);
    return {};
}

// Publishes the sequence's newly full block `b` under s.chain_key (already advanced to it).
void kv_blocks::publish_block(sequence& s, block_id b, std::span<const int32_t> tokens) {
    block_meta& m = _meta[b];
    assert(m.refs == 1 && !m.cached && "a block past the hashed prefix is private");
    auto it = _index.find(s.chain_key);
    if (it != _index.end()) {
        const block_id old = it->second;
        if (entry_matches(old, s.chain_serial, tokens)) {
            // The same prefix is already cached (e.g. the recomputed last block of a fully
            // cached prompt): ours stays private; the chain continues from the cached entry.
            s.chain_serial = _meta[old].serial;
            return;
        }
        // Another prefix under the same key: a hash collision, or a stale entry whose parent
        // was evicted and published again under a new serial. The newest entry wins; the old
        // block leaves the index (its holders keep using it; unheld, it is freed).
        _counters.collisions++;
        uncache(old);
        if (_meta[old].refs == 0) {
            lru_remove(old);
            _free.push_back(old);
        }
    }
    m.cached = true;
    m.key = s.chain_key;
    m.serial = _next_serial++;
    m.parent_serial = s.chain_serial;
    std::copy(tokens.begin(), tokens.end(), _tokens.begin() + size_t{b} * _config.block_tokens);
    _index.emplace(s.chain_key, b);
    s.chain_serial = m.serial;
}

status kv_blocks::free_sequence(seq_id seq) {
    auto it = _seqs.find(seq);
    if (it == _seqs.end()) return no_sequence(seq);
    const auto& table = it->second.table;
    // Last block first: a chain's leaves become older in the LRU than its root.
    for (auto b = table.rbegin(); b != table.rend(); ++b) drop_ref(*b);
    _seqs.erase(it);
    return {};
}

result<std::vector<seq_id>> kv_blocks::invalidate_sequence(seq_id seq) {
    sequence* s = find(seq);
    if (s == nullptr) return no_sequence(seq);
    std::vector<block_id> removed;
    for (uint32_t i = s->step_first_block; i < s->n_hashed; i++) {
        const block_id b = s->table[i];
        if (!_meta[b].cached) continue;  // private, or a duplicate of another's entry
        uncache(b);
        removed.push_back(b);
        _counters.invalidated++;
    }
    std::vector<seq_id> affected;
    for (const auto& [other, o] : _seqs) {
        if (other == seq || removed.empty()) continue;
        for (block_id b : o.table) {
            if (std::find(removed.begin(), removed.end(), b) != removed.end()) {
                affected.push_back(other);
                break;
            }
        }
    }
    std::sort(affected.begin(), affected.end());
    const status freed = free_sequence(seq);
    assert(freed.ok());
    return affected;
}

std::vector<seq_id> kv_blocks::invalidate_all() {
    std::vector<seq_id> dropped;
    dropped.reserve(_seqs.size());
    for (const auto& [id, s] : _seqs) dropped.push_back(id);
    std::sort(dropped.begin(), dropped.end());
    _seqs.clear();
    _pins.clear();
    _index.clear();
    std::fill(_meta.begin(), _meta.end(), block_meta{});
    _lru_head = _lru_tail = no_block;
    _lru_size = 0;
    _free.clear();
    for (uint32_t b = _config.n_blocks; b > 0; b--) _free.push_back(b - 1);
    return dropped;
}

result<pin_id> kv_blocks::pin(std::span<const block_id> blocks) {
    for (block_id b : blocks) {
        if (b >= _config.n_blocks || _meta[b].refs == 0) {
            return make_error("bad_block",
                              "pin: block " + std::to_string(b) + " is not held by any sequence");
        }
    }
    for (block_id b : blocks) take_ref(b);
    pin_id id = _next_pin++;
    _pins.emplace(id, std::vector<block_id>(blocks.begin(), blocks.end()));
    return id;
}

bool kv_blocks::unpin(pin_id pin) {
    auto it = _pins.find(pin);
    if (it == _pins.end()) return false;
    for (auto b = it->second.rbegin(); b != it->second.rend(); ++b) drop_ref(*b);
    _pins.erase(it);
    return true;
}

void kv_blocks::take_ref(block_id b) {
    block_meta& m = _meta[b];
    if (m.refs == 0) {
        assert(m.cached && "only cached blocks gain references from the cache");
        lru_remove(b);
    }
    m.refs++;
}

void kv_blocks::drop_ref(block_id b) {
    block_meta& m = _meta[b];
    assert(m.refs > 0 && "refcount would go negative");
    if (--m.refs > 0) return;
    if (m.cached) {
        lru_push_back(b);
    } else {
        _free.push_back(b);
    }
}

void kv_blocks::uncache(block_id b) {
    block_meta& m = _meta[b];
    assert(m.cached);
    auto it = _index.find(m.key);
    assert(it != _index.end() && it->second == b);
    _index.erase(it);
    m.cached = false;
    m.key = m.serial = m.parent_serial = 0;
}

void kv_blocks::lru_push_back(block_id b) {
    block_meta& m = _meta[b];
    m.lru_prev = _lru_tail;
    m.lru_next = no_block;
    if (_lru_tail != no_block) {
        _meta[_lru_tail].lru_next = b;
    } else {
        _lru_head = b;
    }
    _lru_tail = b;
    _lru_size++;
}

void kv_blocks::lru_remove(block_id b) {
    block_meta& m = _meta[b];
    if (m.lru_prev != no_block) {
        _meta[m.lru_prev].lru_next = m.lru_next;
    } else {
        _lru_head = m.lru_next;
    }
    if (m.lru_next != no_block) {
        _meta[m.lru_next].lru_prev = m.lru_prev;
    } else {
        _lru_tail = m.lru_prev;
    }
    m.lru_prev = m.lru_next = no_block;
    assert(_lru_size > 0);
    _lru_size--;
}

std::span<const block_id> kv_blocks::block_table(seq_id seq) const {
    const sequence* s = find(seq);
    return s == nullptr ? std::span<const block_id>{} : std::span<const block_id>(s->table);
}

uint32_t kv_blocks::committed_tokens(seq_id seq) const {
    const sequence* s = find(seq);
    return s == nullptr ? 0 : s->n_committed;
}

uint32_t kv_blocks::blocks_reclaimable(seq_id seq) const {
    const sequence* s = find(seq);
    if (s == nullptr) return 0;
    uint32_t n = 0;
    for (block_id b : s->table) n += _meta[b].refs == 1 ? 1 : 0;
    return n;
}

std::optional<seq_id> kv_blocks::pick_victim(std::span<const seq_id> admission_order) const {
    for (auto it = admission_order.rbegin(); it != admission_order.rend(); ++it) {
        if (blocks_reclaimable(*it) > 0) return *it;
    }
    return std::nullopt;
}

uint32_t kv_blocks::blocks_available() const {
    return static_cast<uint32_t>(_free.size()) + _lru_size;
}

kv_blocks_stats kv_blocks::stats() const {
    kv_blocks_stats st = _counters;
    st.blocks_total = _config.n_blocks;
    st.blocks_free = static_cast<uint32_t>(_free.size());
    st.blocks_cached = _lru_size;
    st.pins = static_cast<uint32_t>(_pins.size());
    st.blocks_used = _config.n_blocks - st.blocks_free - st.blocks_cached;
    st.sequences = static_cast<uint32_t>(_seqs.size());
    return st;
}

}  // namespace ordo::sched
