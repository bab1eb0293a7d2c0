// kv_blocks_sim_test.cpp: a seeded random simulation of the scheduler's use of kv_blocks.
//
// A small scheduler model admits requests whose prompts share prefixes (so the cache hits),
// runs prefill chunks and decode steps, preempts on exhaustion (pick_victim), fails steps before
// and after their commit (invalidate_sequence, plus every sequence it reports), finishes
// requests and occasionally loses the device (invalidate_all). After every operation it asserts
// check_invariants(). A shadow record of what each block holds (the token prefix its KV was
// computed from) checks that every block a lookup shares holds exactly the new prompt's prefix:
// the cache never hands out wrong KV. The seed is in the test name; a failure replays from it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "scheduler/kv_blocks.hpp"
#include "scheduler/prng.hpp"

namespace {

using namespace ordo::sched;

constexpr uint32_t block_tokens = 4;
constexpr uint32_t pool_blocks = 24;
constexpr int operations = 4000;

struct live_seq {
    seq_id id;
    std::vector<int32_t> tokens;  // prompt, then generated
    uint32_t computed = 0;        // tokens whose KV is committed
};

class simulator {
public:
    simulator(uint64_t seed, kv_hash_fn hash)
        : _rng(seed),
          _kv(std::move(*kv_blocks::create({pool_blocks, block_tokens, true}, hash))),
          _content(pool_blocks) {
        // Each family: its own first block, then 12 tokens common to all families, so that the
        // same block contents occur after different prefixes.
        std::vector<int32_t> common;
        for (int i = 0; i < 12; i++) common.push_back(static_cast<int32_t>(_rng.next() % 6));
        for (auto& family : _families) {
            for (uint32_t i = 0; i < block_tokens; i++) {
                family.push_back(static_cast<int32_t>(_rng.next() % 6));
            }
            family.insert(family.end(), common.begin(), common.end());
        }
    }

    void run() {
        for (int op = 0; op < operations; op++) {
            const uint64_t r = _rng.next() % 100;
            if (r < 25) {
                admit();
            } else if (r < 90) {
                step();
            } else if (r < 99) {
                finish();
            } else {
                lose_device();
            }
            auto st = _kv.check_invariants();
            ASSERT_TRUE(st.ok()) << "after operation " << op << ": " << st.err().message;
            if (::testing::Test::HasFatalFailure()) return;
        }
        const auto st = _kv.stats();
        std::printf(
            "hits %llu misses %llu evictions %llu collisions %llu invalidated %llu "
            "preemptions %d\n",
            (unsigned long long)st.hits, (unsigned long long)st.misses,
            (unsigned long long)st.evictions, (unsigned long long)st.collisions,
            (unsigned long long)st.invalidated, _preemptions);
        while (!_live.empty()) drop(0);
        ASSERT_TRUE(_kv.check_invariants().ok());
        EXPECT_EQ(_kv.stats().blocks_used, 0u);
        EXPECT_GT(_kv.stats().hits, 50u) << "the simulation should exercise the cache";
        EXPECT_GT(_kv.stats().evictions, 10u);
        EXPECT_GT(_preemptions, 5);
    }

private:
    void admit() {
        live_seq s{_next_id++, {}, 0};
        const auto& family = _families[_rng.next() % _families.size()];
        const size_t shared = _rng.next() % (family.size() + 1);
        s.tokens.assign(family.begin(), family.begin() + shared);
        const size_t tail = 1 + _rng.next() % 6;
        for (size_t i = 0; i < tail; i++) s.tokens.push_back(static_cast<int32_t>(_rng.next() % 6));
        ASSERT_TRUE(_kv.add_sequence(s.id).ok());
        auto cached = _kv.lookup_prefix(s.id, s.tokens);
        ASSERT_TRUE(cached.ok());
        ASSERT_EQ(*cached % block_tokens, 0u);
        ASSERT_LT(*cached, s.tokens.size());
        const auto table = _kv.block_table(s.id);
        ASSERT_EQ(table.size(), *cached / block_tokens);
        for (size_t i = 0; i < table.size(); i++) {
            const std::vector<int32_t> prefix(s.tokens.begin(),
                                              s.tokens.begin() + (i + 1) * block_tokens);
            ASSERT_EQ(_content[table[i]], prefix) << "shared block " << table[i] << " holds KV "
                                                  << "of another prefix";
        }
        s.computed = *cached;
        _live.push_back(std::move(s));
    }

    // One step of a random live sequence: a prefill chunk, or one decode token.
    void step() {
        if (_live.empty()) return;
        const size_t idx = _rng.next() % _live.size();
        live_seq& s = _live[idx];
        if (s.computed == s.tokens.size())
            s.tokens.push_back(static_cast<int32_t>(_rng.next() % 6));
        const uint32_t left = static_cast<uint32_t>(s.tokens.size()) - s.computed;
        const uint32_t n = std::min<uint32_t>(left, 1 + _rng.next() % 7);
        auto reserved = _kv.reserve(s.id, s.computed + n);
        if (!reserved.ok()) {
            ASSERT_EQ(reserved.err().code, "kv_exhausted");
            preempt();
            return;
        }
        const uint64_t fate = _rng.next() % 20;
        if (fate == 0) return fail(idx);  // StepFailed: nothing committed
        write_blocks(s, s.computed + n);
        ASSERT_TRUE(_kv.commit_full_blocks(s.id, std::span(s.tokens).first(s.computed + n)).ok());
        s.computed += n;
        if (fate == 1) fail(idx);  // found after commit (NaN logits)
    }

    // The shadow of the GPU writing KV for positions [computed, end) of s.
    void write_blocks(const live_seq& s, uint32_t end) {
        const auto table = _kv.block_table(s.id);
        for (uint32_t b = s.computed / block_tokens; b * block_tokens < end; b++) {
            const uint32_t upto = std::min(end, (b + 1) * block_tokens);
            _content[table[b]].assign(s.tokens.begin(), s.tokens.begin() + upto);
        }
    }

    void fail(size_t idx) {
        auto affected = _kv.invalidate_sequence(_live[idx].id);
        ASSERT_TRUE(affected.ok());
        _live.erase(_live.begin() + idx);
        for (seq_id other : *affected) {
            auto it = std::find_if(_live.begin(), _live.end(),
                                   [&](const live_seq& s) { return s.id == other; });
            ASSERT_NE(it, _live.end());
            ASSERT_TRUE(_kv.invalidate_sequence(other).ok());
            _live.erase(it);
        }
    }

    void preempt() {
        std::vector<seq_id> order;
        for (const auto& s : _live) order.push_back(s.id);
        const auto victim = _kv.pick_victim(order);
        if (!victim) return;
        auto it = std::find_if(_live.begin(), _live.end(),
                               [&](const live_seq& s) { return s.id == *victim; });
        ASSERT_NE(it, _live.end());
        _preemptions++;
        drop(static_cast<size_t>(it - _live.begin()));
    }

    void finish() {
        if (!_live.empty()) drop(_rng.next() % _live.size());
    }

    void drop(size_t idx) {
        ASSERT_TRUE(_kv.free_sequence(_live[idx].id).ok());
        _live.erase(_live.begin() + idx);
    }

    void lose_device() {
        const auto dropped = _kv.invalidate_all();
        ASSERT_EQ(dropped.size(), _live.size());
        _live.clear();
        for (auto& c : _content) c.clear();
    }

    xoshiro256ss _rng;
    kv_blocks _kv;
    std::vector<std::vector<int32_t>> _content;  // (pool_blocks) prefix each block's KV is of
    std::vector<std::vector<int32_t>> _families = std::vector<std::vector<int32_t>>(4);
    std::vector<live_seq> _live;  // admission order
    seq_id _next_id = 1;
    int _preemptions = 0;
};

// Hashes for the collision runs. tokens_only ignores the parent, so a block's key does not
// name its prefix; tiny has three values, so almost every lookup meets a colliding entry.
uint64_t tokens_only_hash(uint64_t, std::span<const int32_t> t) {
    return kv_chain_hash(0, t);
}
uint64_t tiny_hash(uint64_t parent, std::span<const int32_t> t) {
    return (parent + static_cast<uint64_t>(t[0])) % 3;
}

TEST(kv_blocks_sim, seed_1) {
    simulator(1, kv_chain_hash).run();
}
TEST(kv_blocks_sim, seed_2) {
    simulator(2, kv_chain_hash).run();
}
TEST(kv_blocks_sim, seed_3_tokens_only_hash) {
    simulator(3, tokens_only_hash).run();
}
TEST(kv_blocks_sim, seed_4_tiny_hash) {
    simulator(4, tiny_hash).run();
}

}  // namespace
