// kv_blocks_test.cpp: the paged KV block manager and prefix cache (scheduler/kv_blocks.hpp).
//
// Checks, with tiny pools (4-token blocks) and check_invariants() after every operation:
// allocation and free; a prefix hit on a shared prefix (never the whole prompt; a fully cached
// prompt recomputes its last block privately); refcounts with two sharers; LRU eviction order
// (least recently used first, a chain's leaf before its root, a lookup refreshes recency);
// exhaustion is an all-or-nothing error and pick_victim names a sequence whose release helps;
// invalidate_sequence removes only the cache entries of the failed step and reports other
// holders; invalidate_all; collision safety with injected degenerate hashes (one constant, one
// that ignores the parent); bad arguments are errors. kv_blocks_sim_test.cpp runs a seeded
// random simulation.
#include "scheduler/kv_blocks.hpp"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace {

using namespace ordo::sched;

#define EXPECT_INVARIANTS(kv)                       \
    do {                                            \
        auto st_ = (kv).check_invariants();         \
        ASSERT_TRUE(st_.ok()) << st_.err().message; \
    } while (0)

constexpr uint32_t B = 4;

kv_blocks make(uint32_t n_blocks, kv_hash_fn hash = kv_chain_hash) {
    auto kv = kv_blocks::create({n_blocks, B, true}, hash);
    EXPECT_TRUE(kv.ok());
    return std::move(*kv);
}

std::vector<int32_t> seq_tokens(int32_t first, size_t n) {
    std::vector<int32_t> t(n);
    std::iota(t.begin(), t.end(), first);
    return t;
}

// Admits `id` with `prompt`: lookup, reserve the whole prompt, commit it. Returns cached tokens.
uint32_t prefill(kv_blocks& kv, seq_id id, const std::vector<int32_t>& prompt) {
    EXPECT_TRUE(kv.add_sequence(id).ok());
    auto cached = kv.lookup_prefix(id, prompt);
    EXPECT_TRUE(cached.ok());
    EXPECT_TRUE(kv.reserve(id, static_cast<uint32_t>(prompt.size())).ok());
    EXPECT_TRUE(kv.commit_full_blocks(id, prompt).ok());
    return cached.ok() ? *cached : 0;
}

TEST(kv_blocks, allocation_and_free) {
    auto kv = make(8);
    ASSERT_TRUE(kv.add_sequence(1).ok());
    EXPECT_FALSE(kv.add_sequence(1).ok());
    ASSERT_TRUE(kv.reserve(1, 10).ok());
    EXPECT_INVARIANTS(kv);
    EXPECT_EQ(kv.block_table(1).size(), 3u);
    EXPECT_EQ(kv.stats().blocks_used, 3u);
    EXPECT_EQ(kv.stats().blocks_free, 5u);
    ASSERT_TRUE(kv.reserve(1, 12).ok());  // still 3 blocks
    EXPECT_EQ(kv.block_table(1).size(), 3u);
    ASSERT_TRUE(kv.commit_full_blocks(1, seq_tokens(0, 10)).ok());
    EXPECT_INVARIANTS(kv);
    EXPECT_EQ(kv.committed_tokens(1), 10u);
    ASSERT_TRUE(kv.free_sequence(1).ok());
    EXPECT_INVARIANTS(kv);
    const auto st = kv.stats();
    EXPECT_EQ(st.blocks_used, 0u);
    EXPECT_EQ(st.blocks_cached, 2u);  // the two full blocks stay as cache entries
    EXPECT_EQ(st.blocks_free, 6u);
    EXPECT_EQ(kv.blocks_available(), 8u);
    EXPECT_FALSE(kv.free_sequence(1).ok());
}

TEST(kv_blocks, prefix_hit_on_a_shared_prefix) {
    auto kv = make(16);
    const auto prompt = seq_tokens(100, 12);
    EXPECT_EQ(prefill(kv, 1, prompt), 0u);
    EXPECT_INVARIANTS(kv);

    auto other = std::vector<int32_t>(prompt.begin(), prompt.begin() + 8);
    for (int32_t t : {7, 7, 7, 7, 7}) other.push_back(t);
    ASSERT_TRUE(kv.add_sequence(2).ok());
    auto cached = kv.lookup_prefix(2, other);
    ASSERT_TRUE(cached.ok());
    EXPECT_EQ(*cached, 8u);
    EXPECT_INVARIANTS(kv);
    ASSERT_EQ(kv.block_table(2).size(), 2u);
    EXPECT_EQ(kv.block_table(2)[0], kv.block_table(1)[0]);
    EXPECT_EQ(kv.block_table(2)[1], kv.block_table(1)[1]);
    EXPECT_EQ(kv.stats().hits, 2u);
    EXPECT_EQ(kv.stats().misses, 3u);  // 2 for sequence 1's empty cache, 1 for block 2 here

    // The same 12-token prompt: 3 full blocks cached, but the last token must be computed, so
    // only 8 tokens come from the cache and block 2 is recomputed into a private block.
    EXPECT_EQ(prefill(kv, 3, prompt), 8u);
    EXPECT_INVARIANTS(kv);
    EXPECT_NE(kv.block_table(3)[2], kv.block_table(1)[2]);
    EXPECT_EQ(kv.stats().collisions, 0u);
    // A one-token prompt and a different first block: nothing cached.
    ASSERT_TRUE(kv.add_sequence(4).ok());
    EXPECT_EQ(*kv.lookup_prefix(4, std::vector<int32_t>{100}), 0u);
    ASSERT_TRUE(kv.add_sequence(5).ok());
    EXPECT_EQ(*kv.lookup_prefix(5, seq_tokens(0, 12)), 0u);
    EXPECT_INVARIANTS(kv);
    // A sequence that already has blocks cannot look up.
    EXPECT_FALSE(kv.lookup_prefix(1, prompt).ok());
}

TEST(kv_blocks, refcounts_with_two_sharers) {
    auto kv = make(16);
    const auto prompt = seq_tokens(0, 9);  // 2 full blocks + 1 token
    prefill(kv, 1, prompt);
    EXPECT_EQ(prefill(kv, 2, prompt), 8u);
    EXPECT_INVARIANTS(kv);
    // Each holds its own third block; the first two are shared.
    EXPECT_EQ(kv.stats().blocks_used, 4u);
    EXPECT_EQ(kv.blocks_reclaimable(1), 1u);
    EXPECT_EQ(kv.blocks_reclaimable(2), 1u);
    ASSERT_TRUE(kv.free_sequence(1).ok());
    EXPECT_INVARIANTS(kv);
    EXPECT_EQ(kv.stats().blocks_used, 3u);  // shared blocks still held by 2
    EXPECT_EQ(kv.stats().blocks_cached, 0u);
    EXPECT_EQ(kv.blocks_reclaimable(2), 3u);
    ASSERT_TRUE(kv.free_sequence(2).ok());
    EXPECT_INVARIANTS(kv);
    EXPECT_EQ(kv.stats().blocks_cached, 2u);
    EXPECT_EQ(kv.stats().blocks_used, 0u);
}

TEST(kv_blocks, lru_evicts_least_recently_used_leaf_first) {
    auto kv = make(4);
    const auto a = seq_tokens(0, 8), b = seq_tokens(50, 8);
    auto a_more = a, b_more = b;
    a_more.push_back(1);
    b_more.push_back(1);
    prefill(kv, 1, a);
    ASSERT_TRUE(kv.free_sequence(1).ok());
    prefill(kv, 2, b);
    ASSERT_TRUE(kv.free_sequence(2).ok());
    EXPECT_INVARIANTS(kv);
    EXPECT_EQ(kv.stats().blocks_cached, 4u);
    EXPECT_EQ(kv.stats().blocks_free, 0u);

    // Looking A up again (and releasing it) makes A the most recently used: LRU order is now
    // B's leaf, B's root, A's leaf, A's root.
    ASSERT_TRUE(kv.add_sequence(3).ok());
    EXPECT_EQ(*kv.lookup_prefix(3, a_more), 8u);
    ASSERT_TRUE(kv.free_sequence(3).ok());
    EXPECT_INVARIANTS(kv);

    ASSERT_TRUE(kv.add_sequence(4).ok());
    ASSERT_TRUE(kv.reserve(4, 1).ok());  // evicts B's leaf
    EXPECT_EQ(kv.stats().evictions, 1u);
    EXPECT_INVARIANTS(kv);
    ASSERT_TRUE(kv.add_sequence(5).ok());
    EXPECT_EQ(*kv.lookup_prefix(5, b_more), 4u);  // B's root is still cached, its leaf is not
    ASSERT_TRUE(kv.free_sequence(5).ok());        // B's root becomes the most recent
    ASSERT_TRUE(kv.reserve(4, 8).ok());           // so A's leaf goes next
    EXPECT_EQ(kv.stats().evictions, 2u);
    EXPECT_INVARIANTS(kv);
    ASSERT_TRUE(kv.add_sequence(6).ok());
    EXPECT_EQ(*kv.lookup_prefix(6, a_more), 4u);
    // A's root is referenced by 6 now: only B's root can still be evicted.
    EXPECT_EQ(kv.blocks_available(), 1u);
    EXPECT_EQ(kv.reserve(4, 16).err().code, "kv_exhausted");
    ASSERT_TRUE(kv.reserve(4, 12).ok());
    EXPECT_EQ(kv.stats().evictions, 3u);
    EXPECT_INVARIANTS(kv);
}

TEST(kv_blocks, exhaustion_is_all_or_nothing_and_names_a_victim) {
    auto kv = make(4);
    ASSERT_TRUE(kv.add_sequence(1).ok());
    ASSERT_TRUE(kv.add_sequence(2).ok());
    ASSERT_TRUE(kv.reserve(1, 12).ok());  // 3 blocks
    ASSERT_TRUE(kv.reserve(2, 4).ok());   // 1 block
    auto full = kv.reserve(2, 12);        // needs 2 more, none available
    ASSERT_FALSE(full.ok());
    EXPECT_EQ(full.err().code, "kv_exhausted");
    EXPECT_EQ(kv.block_table(2).size(), 1u);  // nothing taken
    EXPECT_INVARIANTS(kv);
    auto too_big = kv.reserve(2, 4 * B + 1);
    ASSERT_FALSE(too_big.ok());
    EXPECT_EQ(too_big.err().code, "kv_exhausted");

    const std::vector<seq_id> admission = {1, 2};
    EXPECT_EQ(kv.pick_victim(admission), std::optional<seq_id>(2));  // newest first
    ASSERT_TRUE(kv.free_sequence(2).ok());
    const std::vector<seq_id> only1 = {1, 2};
    EXPECT_EQ(kv.pick_victim(only1), std::optional<seq_id>(1));
    EXPECT_EQ(kv.pick_victim(std::vector<seq_id>{}), std::nullopt);
    ASSERT_TRUE(kv.free_sequence(1).ok());
    ASSERT_TRUE(kv.add_sequence(3).ok());
    EXPECT_TRUE(kv.reserve(3, 16).ok());
    EXPECT_INVARIANTS(kv);
}

TEST(kv_blocks, invalidate_sequence_removes_only_the_failed_step) {
    auto kv = make(16);
    const auto tokens = seq_tokens(10, 24);
    ASSERT_TRUE(kv.add_sequence(1).ok());
    // Step 1: tokens 0..7 (2 blocks), succeeds.
    ASSERT_TRUE(kv.reserve(1, 8).ok());
    ASSERT_TRUE(kv.commit_full_blocks(1, std::span(tokens).first(8)).ok());
    // Step 2: tokens 8..15, committed, then its logits turn out to be NaN.
    ASSERT_TRUE(kv.reserve(1, 16).ok());
    ASSERT_TRUE(kv.commit_full_blocks(1, std::span(tokens).first(16)).ok());
    EXPECT_EQ(kv.stats().blocks_cached + kv.stats().blocks_used, 4u);
    // Another sequence looked up the step-2 blocks in between: it must be reported.
    ASSERT_TRUE(kv.add_sequence(2).ok());
    EXPECT_EQ(*kv.lookup_prefix(2, std::vector<int32_t>(tokens.begin(), tokens.begin() + 17)), 16u);
    ASSERT_TRUE(kv.add_sequence(3).ok());
    EXPECT_EQ(*kv.lookup_prefix(3, std::vector<int32_t>(tokens.begin(), tokens.begin() + 9)), 8u);
    auto affected = kv.invalidate_sequence(1);
    ASSERT_TRUE(affected.ok());
    EXPECT_EQ(*affected, std::vector<seq_id>{2});  // 3 only holds step-1 blocks
    EXPECT_EQ(kv.stats().invalidated, 2u);
    EXPECT_FALSE(kv.has_sequence(1));
    EXPECT_INVARIANTS(kv);
    ASSERT_TRUE(kv.free_sequence(2).ok());
    ASSERT_TRUE(kv.free_sequence(3).ok());
    EXPECT_INVARIANTS(kv);
    // Step 1's blocks are still a valid prefix; step 2's are gone.
    ASSERT_TRUE(kv.add_sequence(4).ok());
    EXPECT_EQ(*kv.lookup_prefix(4, std::vector<int32_t>(tokens.begin(), tokens.begin() + 17)), 8u);
    // A step that fails before its commit (StepFailed) removes no cache entry at all.
    ASSERT_TRUE(kv.reserve(4, 16).ok());
    ASSERT_TRUE(kv.commit_full_blocks(4, std::span(tokens).first(16)).ok());
    ASSERT_TRUE(kv.reserve(4, 24).ok());
    const auto before = kv.stats().invalidated;
    ASSERT_TRUE(kv.invalidate_sequence(4).ok());
    EXPECT_EQ(kv.stats().invalidated, before);
    EXPECT_EQ(kv.stats().blocks_used, 0u);
    EXPECT_INVARIANTS(kv);
    ASSERT_TRUE(kv.add_sequence(5).ok());
    EXPECT_EQ(*kv.lookup_prefix(5, tokens), 16u);
    EXPECT_FALSE(kv.invalidate_sequence(99).ok());
}

TEST(kv_blocks, invalidate_all_drops_everything) {
    auto kv = make(8);
    prefill(kv, 7, seq_tokens(0, 9));
    prefill(kv, 3, seq_tokens(0, 9));
    ASSERT_TRUE(kv.free_sequence(7).ok());
    EXPECT_EQ(kv.invalidate_all(), std::vector<seq_id>{3});
    EXPECT_INVARIANTS(kv);
    const auto st = kv.stats();
    EXPECT_EQ(st.blocks_free, 8u);
    EXPECT_EQ(st.blocks_cached, 0u);
    EXPECT_EQ(st.sequences, 0u);
    ASSERT_TRUE(kv.add_sequence(3).ok());
    EXPECT_EQ(*kv.lookup_prefix(3, seq_tokens(0, 9)), 0u);
    EXPECT_INVARIANTS(kv);
}

uint64_t constant_hash(uint64_t, std::span<const int32_t>) {
    return 42;
}
uint64_t first_token_hash(uint64_t, std::span<const int32_t> t) {
    return uint64_t(t[0]);
}

TEST(kv_blocks, a_hash_collision_never_shares_wrong_kv) {
    // Every block has key 42: entries replace each other, lookups compare tokens.
    auto kv = make(16, constant_hash);
    const auto p1 = seq_tokens(0, 5), p2 = seq_tokens(50, 5);
    EXPECT_EQ(prefill(kv, 1, p1), 0u);
    EXPECT_EQ(prefill(kv, 2, p2), 0u);     // key 42 holds p1's block: tokens differ, a miss
    EXPECT_EQ(kv.stats().collisions, 2u);  // that lookup, then p2's block replacing p1's
    EXPECT_INVARIANTS(kv);
    EXPECT_EQ(prefill(kv, 3, p1), 0u);
    EXPECT_EQ(prefill(kv, 4, p2), 0u);  // p1 was published again by 3
    EXPECT_EQ(prefill(kv, 5, p2), 4u);  // and p2 by 4: the entry is right, it is shared
    EXPECT_EQ(kv.block_table(5)[0], kv.block_table(4)[0]);
    EXPECT_INVARIANTS(kv);

    // A hash that ignores the parent: [5,6,7,8] after [1..4] is not [5,6,7,8] after [9..12].
    auto weak = make(16, first_token_hash);
    const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 0};
    const std::vector<int32_t> b = {9, 10, 11, 12, 5, 6, 7, 8, 0};
    EXPECT_EQ(prefill(weak, 1, a), 0u);
    EXPECT_EQ(prefill(weak, 2, b), 0u);
    EXPECT_EQ(weak.stats().collisions, 1u);  // b's block 1 replaced a's under key 5
    EXPECT_EQ(prefill(weak, 3, b), 8u);
    EXPECT_EQ(weak.block_table(3)[1], weak.block_table(2)[1]);
    EXPECT_EQ(prefill(weak, 4, a), 4u);  // a's block 0 hits; key 5 now names b's block 1
    EXPECT_EQ(weak.block_table(4)[0], weak.block_table(1)[0]);
    EXPECT_NE(weak.block_table(4)[1], weak.block_table(2)[1]);
    EXPECT_INVARIANTS(weak);
}

TEST(kv_blocks, bad_arguments_are_errors) {
    EXPECT_FALSE(kv_blocks::create({0, 4, true}).ok());
    EXPECT_FALSE(kv_blocks::create({4, 0, true}).ok());
    EXPECT_FALSE(kv_blocks::create({kv_blocks_max + 1, 4, true}).ok());
    EXPECT_FALSE(kv_blocks::create({kv_blocks_max, kv_block_tokens_max, true}).ok());
    EXPECT_FALSE(kv_blocks::create({4, 4, true}, nullptr).ok());
    auto kv = make(4);
    EXPECT_EQ(kv.reserve(9, 4).err().code, "bad_sequence");
    EXPECT_FALSE(kv.lookup_prefix(9, seq_tokens(0, 5)).ok());
    ASSERT_TRUE(kv.add_sequence(1).ok());
    ASSERT_TRUE(kv.reserve(1, 4).ok());
    EXPECT_EQ(kv.commit_full_blocks(1, seq_tokens(0, 5)).err().code, "bad_commit");
    ASSERT_TRUE(kv.commit_full_blocks(1, seq_tokens(0, 3)).ok());
    EXPECT_EQ(kv.commit_full_blocks(1, seq_tokens(0, 2)).err().code, "bad_commit");
    EXPECT_TRUE(kv.block_table(77).empty());
    EXPECT_INVARIANTS(kv);
    // The prefix cache switched off: nothing is published or found.
    auto off = kv_blocks::create({8, 4, false});
    ASSERT_TRUE(off.ok());
    prefill(*off, 1, seq_tokens(0, 9));
    ASSERT_TRUE(off->free_sequence(1).ok());
    EXPECT_EQ(off->stats().blocks_cached, 0u);
    EXPECT_EQ(prefill(*off, 2, seq_tokens(0, 9)), 0u);
    EXPECT_INVARIANTS(*off);
}

}  // namespace

// Pins (KV persistence): a pinned block outlives its sequence, is not allocatable while pinned,
// returns to the cache (published) or the free list when unpinned; invalidate_all drops pins;
// only blocks some sequence holds can be pinned; blocks being restored (past the hashed prefix,
// pinned) keep the private-writer invariant.
TEST(kv_blocks, pins_hold_blocks_until_unpinned) {
    auto kv = make(4);
    EXPECT_FALSE(kv.pin(std::vector<block_id>{0}).ok()) << "block 0 is held by nobody";
    prefill(kv, 1, seq_tokens(0, 8));  // 2 full blocks, published
    auto table = std::vector<block_id>(kv.block_table(1).begin(), kv.block_table(1).end());
    auto pin = kv.pin(table);
    ASSERT_TRUE(pin.ok());
    EXPECT_INVARIANTS(kv);
    ASSERT_TRUE(kv.free_sequence(1).ok());
    EXPECT_INVARIANTS(kv);
    EXPECT_EQ(kv.stats().pins, 1u);
    EXPECT_EQ(kv.stats().blocks_used, 2u);  // held by the pin, not allocatable
    EXPECT_EQ(kv.blocks_available(), 2u);
    ASSERT_TRUE(kv.add_sequence(2).ok());
    EXPECT_FALSE(kv.reserve(2, 16).ok()) << "pinned blocks must not be evicted";
    EXPECT_TRUE(kv.unpin(*pin));
    EXPECT_FALSE(kv.unpin(*pin));
    EXPECT_INVARIANTS(kv);
    EXPECT_EQ(kv.stats().blocks_cached, 2u);  // back to the prefix cache
    EXPECT_TRUE(kv.reserve(2, 16).ok());
    EXPECT_INVARIANTS(kv);
}

TEST(kv_blocks, a_restore_pin_past_the_hashed_prefix_and_device_loss) {
    auto kv = make(8);
    ASSERT_TRUE(kv.add_sequence(1).ok());
    ASSERT_TRUE(kv.reserve(1, 8).ok());  // blocks a restore will write
    auto table = std::vector<block_id>(kv.block_table(1).begin(), kv.block_table(1).end());
    auto pin = kv.pin(table);
    ASSERT_TRUE(pin.ok());
    EXPECT_INVARIANTS(kv);  // refs 2 on a block being written: its writer's pin
    ASSERT_TRUE(kv.free_sequence(1).ok());
    EXPECT_INVARIANTS(kv);
    kv.invalidate_all();
    EXPECT_FALSE(kv.has_pin(*pin));
    EXPECT_FALSE(kv.unpin(*pin));
    EXPECT_EQ(kv.stats().blocks_free, 8u);
    EXPECT_INVARIANTS(kv);
}
