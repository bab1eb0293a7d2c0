// token_masks.cpp: see token_masks.hpp.
#include "grammar/token_masks.hpp"

#include <algorithm>
#include <optional>

namespace ordo::grammar {

vocab_trie::vocab_trie(std::span<const std::string> pieces) : _n_tokens(pieces.size()) {
    _nodes.emplace_back();
    for (std::size_t t = 0; t < pieces.size(); ++t) {
        if (pieces[t].empty()) continue;
        std::uint32_t at = 0;
        for (char ch : pieces[t]) {
            auto b = static_cast<unsigned char>(ch);
            auto& next = _nodes[at].next;
            auto it = std::lower_bound(next.begin(), next.end(), b,
                                       [](const auto& e, unsigned char v) { return e.first < v; });
            if (it != next.end() && it->first == b) {
                at = it->second;
            } else {
                auto id = static_cast<std::uint32_t>(_nodes.size());
                next.insert(it, {b, id});
                _nodes.emplace_back();  // invalidates `next`; not used again this step
                at = id;
            }
        }
        _nodes[at].ends.push_back(static_cast<std::int32_t>(t));
    }
}

std::int32_t token_masks::intern(const matcher& m) {
    std::string key = m.state_key();
    auto it = _state_ids.find(key);
    if (it != _state_ids.end()) return it->second;
    if (_states.size() >= _states_max) return k_full;
    auto id = static_cast<std::int32_t>(_states.size());
    _states.push_back({m, {}});
    _states.back().next.fill(k_unknown);
    _state_ids.emplace(std::move(key), id);
    return id;
}

result<std::int32_t> token_masks::step(std::int32_t s, unsigned char b) {
    std::int32_t known = _states[static_cast<std::size_t>(s)].next[b];
    if (known != k_unknown) return known;
    const matcher& from = _states[static_cast<std::size_t>(s)].m;
    std::int32_t to = k_dead;
    if (from.allows_byte(b)) {
        matcher next = from;
        char c = static_cast<char>(b);
        auto ok = next.advance_utf8(std::string_view(&c, 1));
        if (!ok) return ok.err();
        if (*ok) to = intern(next);  // may grow _states: `from` is not used past here
    }
    if (to != k_full) _states[static_cast<std::size_t>(s)].next[b] = to;
    return to;
}

template <typename State, typename Step>
status token_masks::walk(State root, Step&& step, std::vector<std::uint8_t>& mask) const {
    mask.assign(_trie->_n_tokens, 0);
    // Depth-first over the trie, one state per level (the prefix's), so a subtree refused at
    // its first byte costs one step. Depth is bounded by the longest piece.
    struct frame {
        std::uint32_t node;
        std::size_t child;
        State state;
    };
    std::vector<frame> path;
    path.push_back({0, 0, std::move(root)});
    while (!path.empty()) {
        frame& f = path.back();
        const vocab_trie::node& n = _trie->_nodes[f.node];
        if (f.child == n.next.size()) {
            path.pop_back();
            continue;
        }
        auto [byte, child] = n.next[f.child++];
        result<std::optional<State>> next = step(f.state, byte);  // (push_back invalidates f)
        if (!next) return next.err();
        if (!*next) continue;
        for (std::int32_t t : _trie->_nodes[child].ends) mask[static_cast<std::size_t>(t)] = 1;
        path.push_back({child, 0, std::move(**next)});
    }
    return {};
}

result<bool> token_masks::compute_automaton(const matcher& m, std::vector<std::uint8_t>& mask) {
    std::int32_t root = intern(m);
    if (root == k_full) return false;
    bool full = false;
    status s = walk(
        root,
        [&](std::int32_t from, unsigned char b) -> result<std::optional<std::int32_t>> {
            auto to = step(from, b);
            if (!to) return to.err();
            if (*to == k_full) {
                full = true;
                return make_error("automaton_full", "");  // ends the walk; not an error
            }
            if (*to == k_dead) return std::optional<std::int32_t>();
            return std::optional<std::int32_t>(*to);
        },
        mask);
    if (full) return false;
    if (!s) return s.err();
    return true;
}

status token_masks::compute_direct(const matcher& m, std::vector<std::uint8_t>& mask) const {
    return walk(
        m,
        [](const matcher& from, unsigned char b) -> result<std::optional<matcher>> {
            if (!from.allows_byte(b)) return std::optional<matcher>();
            matcher next = from;
            char c = static_cast<char>(b);
            auto ok = next.advance_utf8(std::string_view(&c, 1));
            if (!ok) return ok.err();
            if (!*ok) return std::optional<matcher>();
            return std::optional<matcher>(std::move(next));
        },
        mask);
}

result<const std::vector<std::uint8_t>*> token_masks::allowed(const matcher& m) {
    std::string key = m.state_key();
    auto it = _index.find(key);
    if (it != _index.end()) {
        ++_hits;
        _lru.splice(_lru.begin(), _lru, it->second);
        return &_lru.front().second;
    }
    ++_misses;
    std::vector<std::uint8_t> mask;
    auto done = compute_automaton(m, mask);
    if (!done) return done.err();
    if (!*done) {
        // The automaton outgrew its bound: start it afresh next time, walk directly now.
        _states.clear();
        _state_ids.clear();
        ORDO_TRY(compute_direct(m, mask));
    }
    if (_lru.size() >= cache_entries_max) {
        _index.erase(_lru.back().first);
        _lru.pop_back();
    }
    _lru.emplace_front(key, std::move(mask));
    _index[std::move(key)] = _lru.begin();
    return &_lru.front().second;
}

}  // namespace ordo::grammar
