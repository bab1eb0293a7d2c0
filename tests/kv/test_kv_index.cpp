// test_kv_index.cpp: the kv actor's in-memory index (kv/kv_index.hpp), with no I/O.
//
// Checks: a prefix file answers every prompt that shares a whole number of its blocks, the
// longest match wins, a prompt diverging inside a block matches only the blocks before it,
// chain keys depend on the whole prefix; a session entry is found only by its name and is
// preferred; puts
// replace by name; covers() says whether a prefix is already held; over_budget() evicts least
// recently used prefixes first, sessions last, never a leased entry; byte and file counts.
//
// Also: the longest match of a prompt comes from the newest automatic entry holding its
// blocks; when that entry leaves the index (quarantined, evicted), an older entry holding the
// same leading blocks is found again, by lookups and by covers() (a defect once: erasing the
// newest dropped the shared keys, so a valid file on disk stopped being restored until a
// restart); sessions are found only by name; over_budget() never names a leased entry and
// names automatic prefixes before sessions.

#include <gtest/gtest.h>

#include <numeric>

#include "kv/kv_index.hpp"

namespace {

using namespace ordo::kv;

constexpr uint32_t B = 4;

kv_entry entry(const std::string& name, std::vector<int32_t> tokens, bool session = false,
               uint64_t bytes = 100) {
    kv_entry e;
    e.name = name;
    e.tokens = std::move(tokens);
    e.header.n_blocks = uint32_t(e.tokens.size() / B);
    e.header.meta.geometry.block_tokens = B;
    e.header.meta.kind = session ? kv_file_kind::session : kv_file_kind::prefix;
    e.header.file_bytes = bytes;
    return e;
}

std::vector<int32_t> iota(size_t n, int32_t first = 0) {
    std::vector<int32_t> v(n);
    std::iota(v.begin(), v.end(), first);
    return v;
}

TEST(kv_index, longest_run_of_whole_blocks) {
    kv_index idx(B);
    idx.put(entry("a", iota(8)));             // 2 blocks
    idx.put(entry("b", iota(16)));            // 4 blocks, same first 2
    auto m = idx.longest(iota(13), nullptr);  // 3 whole blocks asked
    ASSERT_TRUE(m);
    EXPECT_EQ(m->name, "b");
    EXPECT_EQ(m->n_blocks, 3u);
    // A prompt that diverges inside block 1 gets block 0 only.
    auto p = iota(8);
    p[5] = 99;
    m = idx.longest(p, nullptr);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->n_blocks, 1u);
    // Nothing in common, or shorter than a block: no match.
    EXPECT_FALSE(idx.longest(iota(8, 50), nullptr));
    EXPECT_FALSE(idx.longest(iota(3), nullptr));
    EXPECT_EQ(idx.files(), 2u);
    EXPECT_EQ(idx.bytes(), 200u);
}

TEST(kv_index, sessions_by_name_only_and_preferred) {
    kv_index idx(B);
    idx.put(entry("s-x", iota(12), true));
    EXPECT_FALSE(idx.longest(iota(12), nullptr)) << "a session is not an automatic prefix";
    std::string name = "s-x";
    auto m = idx.longest(iota(12), &name);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->name, "s-x");
    EXPECT_EQ(m->n_blocks, 3u);
    // A longer automatic prefix still wins over a shorter session match.
    idx.put(entry("p", iota(16)));
    m = idx.longest(iota(16), &name);
    EXPECT_EQ(m->name, "p");
    EXPECT_EQ(idx.sessions(), 1u);
}

TEST(kv_index, put_replaces_by_name_and_erase_drops_keys) {
    kv_index idx(B);
    idx.put(entry("s", iota(8), true, 100));
    idx.put(entry("s", iota(12), true, 150));
    EXPECT_EQ(idx.files(), 1u);
    EXPECT_EQ(idx.bytes(), 150u);
    idx.put(entry("p", iota(8)));
    EXPECT_TRUE(idx.covers(iota(8)));
    EXPECT_TRUE(idx.covers(iota(4)));
    EXPECT_FALSE(idx.covers(iota(12)));
    EXPECT_TRUE(idx.erase("p"));
    EXPECT_FALSE(idx.erase("p"));
    EXPECT_FALSE(idx.covers(iota(8)));
    EXPECT_FALSE(idx.longest(iota(8), nullptr));
}

TEST(kv_index, lru_evicts_prefixes_first_sessions_last_never_leased) {
    kv_index idx(B);
    idx.put(entry("s1", iota(4, 100), true));
    idx.put(entry("p1", iota(4, 200)));
    idx.put(entry("p2", iota(4, 300)));
    idx.put(entry("p3", iota(4, 400)));
    ASSERT_TRUE(idx.longest(iota(4, 200), nullptr));  // p1 used: now the newest prefix
    idx.lease("p2");
    // 400 bytes, budget 150: p3 (oldest unleased prefix), p1, then the session; p2 is leased.
    auto v = idx.over_budget(150);
    EXPECT_EQ(v, (std::vector<std::string>{"p3", "p1", "s1"}));
    v = idx.over_budget(300);
    EXPECT_EQ(v, (std::vector<std::string>{"p3"}));
    idx.unlease("p2");
    v = idx.over_budget(300);
    EXPECT_EQ(v, (std::vector<std::string>{"p2"}));
    EXPECT_TRUE(idx.over_budget(400).empty());
}

TEST(kv_index, chain_keys_depend_on_the_whole_prefix) {
    const auto a = iota(4), b = iota(4, 4);
    const uint64_t ka = kv_chain_key(kv_chain_key_root, a);
    EXPECT_NE(kv_chain_key(ka, b), kv_chain_key(kv_chain_key_root, b));
    EXPECT_EQ(kv_chain_key(ka, b), kv_chain_key(kv_chain_key(kv_chain_key_root, a), b));
}

// ---- keys shared by several entries ----

// An entry of `n_blocks` blocks whose ids are first, first + 1, ...
kv_entry entry_n(const std::string& name, uint32_t n_blocks, int32_t first = 1,
                 kv_file_kind kind = kv_file_kind::prefix) {
    return entry(name, iota(size_t(n_blocks) * B, first), kind == kv_file_kind::session,
                 1000 * n_blocks);
}

TEST(kv_index, newest_entry_answers_and_an_older_one_answers_after_it_leaves) {
    kv_index index(B);
    index.put(entry_n("short", 2));  // blocks 0-1
    index.put(entry_n("long", 4));   // blocks 0-3: shares blocks 0-1 with "short"

    auto m = index.longest(iota(2 * B + 1, 1), nullptr);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->name, "long");
    EXPECT_EQ(m->n_blocks, 2u);

    ASSERT_TRUE(index.erase("long"));  // e.g. quarantined after a failed restore
    m = index.longest(iota(2 * B + 1, 1), nullptr);
    ASSERT_TRUE(m.has_value()) << "the older entry holding blocks 0-1 is no longer found";
    EXPECT_EQ(m->name, "short");
    EXPECT_EQ(m->n_blocks, 2u);
    EXPECT_TRUE(index.covers(iota(2 * B, 1)));
    EXPECT_FALSE(index.covers(iota(4 * B, 1)));
    EXPECT_FALSE(index.longest(iota(4 * B + 1, 1), nullptr)->n_blocks > 2);

    ASSERT_TRUE(index.erase("short"));
    EXPECT_FALSE(index.longest(iota(2 * B + 1, 1), nullptr).has_value());
    EXPECT_FALSE(index.covers(iota(2 * B, 1)));
    EXPECT_EQ(index.files(), 0u);
    EXPECT_EQ(index.bytes(), 0u);
}

TEST(kv_index, replacing_an_entry_keeps_the_others_keys) {
    kv_index index(B);
    index.put(entry_n("a", 2));
    index.put(entry_n("b", 3));
    index.put(entry_n("a", 2));  // written again: newest now
    EXPECT_EQ(index.longest(iota(2 * B + 1, 1), nullptr)->name, "a");
    EXPECT_EQ(index.longest(iota(3 * B + 1, 1), nullptr)->name, "b");
    ASSERT_TRUE(index.erase("a"));
    EXPECT_EQ(index.longest(iota(2 * B + 1, 1), nullptr)->name, "b");
    EXPECT_EQ(index.files(), 1u);
}

TEST(kv_index, sessions_by_name_only_and_budget_order) {
    kv_index index(B);
    index.put(entry_n("s-x", 3, 1, kv_file_kind::session));
    index.put(entry_n("p-old", 2, 100));
    index.put(entry_n("p-new", 2, 200));
    EXPECT_FALSE(index.longest(iota(3 * B + 1, 1), nullptr).has_value())
        << "a session is found by name, never by its tokens";
    const std::string session = "s-x";
    auto m = index.longest(iota(3 * B + 1, 1), &session);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->n_blocks, 3u);
    EXPECT_EQ(index.sessions(), 1u);

    index.lease("p-old");
    // 7000 bytes in all: a budget of 3000 needs 4000 out; p-old is leased, so p-new, then s-x.
    auto victims = index.over_budget(3000);
    EXPECT_EQ(victims, (std::vector<std::string>{"p-new", "s-x"}));
    index.unlease("p-old");
    EXPECT_EQ(index.over_budget(5000), (std::vector<std::string>{"p-old"}));
}

}  // namespace
