// test_kv_index.cpp: the kv actor's in-memory index (kv/kv_index.hpp), pure bookkeeping.
//
// Checks: the longest match of a prompt comes from the newest automatic entry holding its
// blocks; when that entry leaves the index (quarantined, evicted), an older entry holding the
// same leading blocks is found again, by lookups and by covers() (a defect once: erasing the
// newest dropped the shared keys, so a valid file on disk stopped being restored until a
// restart); sessions are found only by name; over_budget() never names a leased entry and
// names automatic prefixes before sessions.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "kv/kv_index.hpp"

namespace {

using namespace ordo::kv;

constexpr uint32_t block_tokens = 4;

// An entry of `n_blocks` blocks whose ids are first, first + 1, ...
kv_entry entry(const std::string& name, uint32_t n_blocks, int32_t first = 1,
               kv_file_kind kind = kv_file_kind::prefix) {
    kv_entry e;
    e.name = name;
    e.header.meta.kind = kind;
    e.header.meta.geometry.block_tokens = block_tokens;
    e.header.n_blocks = n_blocks;
    e.header.file_bytes = 1000 * n_blocks;
    e.tokens.resize(size_t(n_blocks) * block_tokens);
    std::iota(e.tokens.begin(), e.tokens.end(), first);
    return e;
}

std::vector<int32_t> ids(size_t n, int32_t first = 1) {
    std::vector<int32_t> t(n);
    std::iota(t.begin(), t.end(), first);
    return t;
}

TEST(kv_index, newest_entry_answers_and_an_older_one_answers_after_it_leaves) {
    kv_index index(block_tokens);
    index.put(entry("short", 2));  // blocks 0-1
    index.put(entry("long", 4));   // blocks 0-3: shares blocks 0-1 with "short"

    auto m = index.longest(ids(2 * block_tokens + 1), nullptr);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->name, "long");
    EXPECT_EQ(m->n_blocks, 2u);

    ASSERT_TRUE(index.erase("long"));  // e.g. quarantined after a failed restore
    m = index.longest(ids(2 * block_tokens + 1), nullptr);
    ASSERT_TRUE(m.has_value()) << "the older entry holding blocks 0-1 is no longer found";
    EXPECT_EQ(m->name, "short");
    EXPECT_EQ(m->n_blocks, 2u);
    EXPECT_TRUE(index.covers(ids(2 * block_tokens)));
    EXPECT_FALSE(index.covers(ids(4 * block_tokens)));
    EXPECT_FALSE(index.longest(ids(4 * block_tokens + 1), nullptr)->n_blocks > 2);

    ASSERT_TRUE(index.erase("short"));
    EXPECT_FALSE(index.longest(ids(2 * block_tokens + 1), nullptr).has_value());
    EXPECT_FALSE(index.covers(ids(2 * block_tokens)));
    EXPECT_EQ(index.files(), 0u);
    EXPECT_EQ(index.bytes(), 0u);
}

TEST(kv_index, replacing_an_entry_keeps_the_others_keys) {
    kv_index index(block_tokens);
    index.put(entry("a", 2));
    index.put(entry("b", 3));
    index.put(entry("a", 2));  // written again: newest now
    EXPECT_EQ(index.longest(ids(2 * block_tokens + 1), nullptr)->name, "a");
    EXPECT_EQ(index.longest(ids(3 * block_tokens + 1), nullptr)->name, "b");
    ASSERT_TRUE(index.erase("a"));
    EXPECT_EQ(index.longest(ids(2 * block_tokens + 1), nullptr)->name, "b");
    EXPECT_EQ(index.files(), 1u);
}

TEST(kv_index, sessions_by_name_only_and_budget_order) {
    kv_index index(block_tokens);
    index.put(entry("s-x", 3, 1, kv_file_kind::session));
    index.put(entry("p-old", 2, 100));
    index.put(entry("p-new", 2, 200));
    EXPECT_FALSE(index.longest(ids(3 * block_tokens + 1), nullptr).has_value())
        << "a session is found by name, never by its tokens";
    const std::string session = "s-x";
    auto m = index.longest(ids(3 * block_tokens + 1), &session);
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
