// kv_index.cpp: see kv_index.hpp.
#include "kv/kv_index.hpp"

#include <xxhash.h>

#include <algorithm>

namespace ordo::kv {

uint64_t kv_chain_key(uint64_t parent, std::span<const int32_t> block_tokens) {
    // The parent key seeds the hash of the block's ids: the chain without a copy.
    return XXH3_64bits_withSeed(block_tokens.data(), block_tokens.size_bytes(), parent);
}

std::vector<uint64_t> kv_index::keys_of(std::span<const int32_t> tokens) const {
    std::vector<uint64_t> keys;
    uint64_t key = kv_chain_key_root;
    for (size_t i = 0; (i + 1) * _block_tokens <= tokens.size(); i++) {
        key = kv_chain_key(key, tokens.subspan(i * _block_tokens, _block_tokens));
        keys.push_back(key);
    }
    return keys;
}

uint32_t kv_index::common_blocks(const kv_entry& e, std::span<const int32_t> tokens) const {
    const size_t n = std::min(e.tokens.size(), tokens.size());
    auto diff = std::mismatch(e.tokens.begin(), e.tokens.begin() + ptrdiff_t(n), tokens.begin());
    return static_cast<uint32_t>((diff.first - e.tokens.begin()) / _block_tokens);
}

void kv_index::put(kv_entry e) {
    // A lease names the entry, not one version of its file: a replaced entry keeps its leases
    // (the restore that holds one verifies the header it reads anyway).
    if (const kv_entry* old = find(e.name)) e.leases = old->leases;
    erase(e.name);
    e.last_use = ++_clock;
    _bytes += e.header.file_bytes;
    if (!e.is_session()) {
        for (uint64_t key : keys_of(e.tokens)) _by_key[key].push_back(e.name);
    }
    std::string name = e.name;
    _entries.emplace(std::move(name), std::move(e));
}

bool kv_index::erase(const std::string& name) {
    auto it = _entries.find(name);
    if (it == _entries.end()) return false;
    if (!it->second.is_session()) {
        for (uint64_t key : keys_of(it->second.tokens)) {
            auto k = _by_key.find(key);
            if (k == _by_key.end()) continue;
            std::erase(k->second, name);
            if (k->second.empty()) _by_key.erase(k);
        }
    }
    _bytes -= it->second.header.file_bytes;
    _entries.erase(it);
    return true;
}

const kv_entry* kv_index::find(const std::string& name) const {
    auto it = _entries.find(name);
    return it == _entries.end() ? nullptr : &it->second;
}

kv_entry* kv_index::find_mut(const std::string& name) {
    auto it = _entries.find(name);
    return it == _entries.end() ? nullptr : &it->second;
}

std::optional<kv_match> kv_index::longest(std::span<const int32_t> tokens,
                                          const std::string* session_name) {
    std::optional<kv_match> best;
    if (session_name != nullptr) {
        if (kv_entry* e = find_mut(*session_name); e != nullptr) {
            uint32_t n = common_blocks(*e, tokens);
            if (n > 0) best = kv_match{e->name, n};
        }
    }
    std::vector<uint64_t> keys = keys_of(tokens);
    for (size_t i = keys.size(); i > 0 && (!best || i > best->n_blocks); i--) {
        auto k = _by_key.find(keys[i - 1]);
        if (k == _by_key.end()) continue;
        const kv_entry* e = find(k->second.back());
        if (e != nullptr && common_blocks(*e, tokens) >= i) {
            best = kv_match{e->name, static_cast<uint32_t>(i)};
            break;
        }
    }
    if (best) find_mut(best->name)->last_use = ++_clock;
    return best;
}

bool kv_index::covers(std::span<const int32_t> tokens) const {
    std::vector<uint64_t> keys = keys_of(tokens);
    if (keys.empty() || keys.size() * _block_tokens != tokens.size()) return false;
    auto k = _by_key.find(keys.back());
    if (k == _by_key.end()) return false;
    const kv_entry* e = find(k->second.back());
    return e != nullptr && common_blocks(*e, tokens) >= keys.size();
}

void kv_index::lease(const std::string& name) {
    if (kv_entry* e = find_mut(name)) e->leases++;
}

void kv_index::unlease(const std::string& name) {
    if (kv_entry* e = find_mut(name); e != nullptr && e->leases > 0) e->leases--;
}

std::vector<std::string> kv_index::over_budget(uint64_t budget, uint64_t incoming) const {
    std::vector<const kv_entry*> order;
    for (const auto& [name, e] : _entries) {
        if (e.leases == 0) order.push_back(&e);
    }
    std::sort(order.begin(), order.end(), [](const kv_entry* a, const kv_entry* b) {
        if (a->is_session() != b->is_session()) return !a->is_session();
        return a->last_use < b->last_use;
    });
    std::vector<std::string> victims;
    uint64_t total = _bytes + incoming;
    for (const kv_entry* e : order) {
        if (total <= budget) break;
        victims.push_back(e->name);
        total -= e->header.file_bytes;
    }
    return victims;
}

size_t kv_index::sessions() const {
    return size_t(std::count_if(_entries.begin(), _entries.end(),
                                [](const auto& kv) { return kv.second.is_session(); }));
}

}  // namespace ordo::kv
