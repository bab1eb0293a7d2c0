// test_attention.cpp: the paged KV cache kernels (kv_write, attention) on the real device
// against model::attention (model/cpu_ops.hpp). Covers GQA (6 query heads over 2 kv heads),
// sequences whose history crosses block boundaries through shuffled, non-contiguous block
// tables, a batch of sequences of unequal lengths decoded in one dispatch, chunked causal
// prefill equal to token-by-token decode (bit-identical, and equal to the reference), F16 and
// F32 pool storage, that a token with an invalid sequence index reads nothing, and that the
// grouped prefill variant (several query tokens per workgroup) gives every query the bits it
// gets alone, also when a group mixes sequences or holds an invalid token.
//
// Flash decoding (attention.comp's key splits, attention_split.glsl): for contexts of 1 to 300
// positions cut into splits of one workgroup of keys, the split grid plus attention_merge gives
// the bits of one workgroup walking the splits itself, a context of one split the bits of the
// unsplit kernel, a prefill chunk (too many tokens for the grid) the bits of its tokens decoded
// one by one through the grid, and every output matches the reference; too few partials slots
// are refused.
//
// Flash attention for prefill (attention_flash.comp: a tile of 16 (token, head) rows per
// workgroup sharing each key's loads): forced on every token of mixed batches (prefill runs,
// decode tokens, alternating sequences, invalid tokens; GQA 3:1, so tiles cut tokens' heads
// apart), F16 and F32 pools, one split and many, it gives attention.comp's bits for every query
// and matches the reference; the storage family's automatic path sends runs that fill a tile
// to it and the rest to attention.comp (two dispatches here), and more decode tokens than the
// split grid serves to attention.comp, or with pipeline_tuning::attention_token_tiles to it as
// a tile per token's query heads, with the same bits; on a device
// that caps loop iterations, the forced path refuses a context past the cap and the automatic
// one falls back to attention.comp.
//
// attention.comp's load groups (how many K pairs and V values a lane loads before using them)
// give the default's bits at every grouping, and groupings it cannot take are refused.
//
// Buffers live in a std::deque so references stay valid as more are added.
//
// Tolerances: the reference is fed the same K/V values the pool holds (rounded to f16 for an
// F16 pool), so only exp/summation order differ: 2e-5 + 1e-4 |ref|.
#include <algorithm>
#include <cstring>
#include <deque>
#include <numeric>

#include "gpu/vk/kv_pool.hpp"
#include "gpu_fixture.hpp"
#include "model/cpu_ops.hpp"
#include "model/fp16.hpp"

namespace ordo::gpu::testing {
namespace {

constexpr std::uint32_t n_head = 6, n_head_kv = 2, head_dim = 32, block_tokens = 4;
constexpr std::uint32_t n_blocks = 24, max_blocks = 6, layer = 1;
constexpr std::uint32_t kv_dim = n_head_kv * head_dim, q_dim = n_head * head_dim;

// model::attention's output for the query q at position pos of a history (position-major rows
// of kv_dim, as stored).
std::vector<float> reference_attention(const std::vector<float>& k, const std::vector<float>& v,
                                       std::uint32_t pos, const float* q) {
    std::vector<float> out(q_dim), scratch(pos + 1);
    model::attention(out.data(), q, k.data(), v.data(), pos + 1, {n_head, n_head_kv, head_dim},
                     scratch.data());
    return out;
}

struct sequence {
    std::vector<std::int32_t> blocks;  // block table
    std::vector<float> k, v;           // history, position-major rows of kv_dim (as stored)
};

struct attention_fixture {
    bool f16;
    std::unique_ptr<kv_pool> pool;
    std::vector<sequence> seqs;
    buffer tables;

    explicit attention_fixture(bool half, const std::vector<std::uint32_t>& lengths) : f16(half) {
        auto p = kv_pool::create(*env().dev, {2, n_head_kv, head_dim, block_tokens, n_blocks, f16});
        EXPECT_TRUE(p.ok());
        pool = std::move(*p);
        std::vector<std::int32_t> free(n_blocks);
        std::iota(free.begin(), free.end(), 0);
        std::shuffle(free.begin(), free.end(), std::mt19937(42));
        std::vector<std::int32_t> table_data;
        for (std::size_t s = 0; s < lengths.size(); ++s) {
            sequence q;
            for (std::uint32_t b = 0; b < max_blocks; ++b)
                q.blocks.push_back(free.back()), free.pop_back();
            q.k = random_floats(std::size_t(lengths[s]) * kv_dim, 100 + s);
            q.v = random_floats(std::size_t(lengths[s]) * kv_dim, 200 + s);
            if (f16) {
                for (auto* a : {&q.k, &q.v}) {
                    for (float& x : *a) x = model::f16_to_f32(model::f32_to_f16(x));
                }
            }
            table_data.insert(table_data.end(), q.blocks.begin(), q.blocks.end());
            seqs.push_back(std::move(q));
        }
        tables = make_buffer(table_data);
    }

    std::int32_t slot(std::size_t s, std::uint32_t pos) const {
        return seqs[s].blocks[pos / block_tokens] * block_tokens + pos % block_tokens;
    }

    // Writes positions [from, to) of sequence s into the pool (one kv_write dispatch).
    void record_write(std::size_t s, std::uint32_t from, std::uint32_t to,
                      std::deque<buffer>& keep) {
        std::vector<float> src;
        std::vector<std::int32_t> slots;
        for (std::uint32_t p = from; p < to; ++p) {
            src.insert(src.end(), seqs[s].k.begin() + p * kv_dim,
                       seqs[s].k.begin() + (p + 1) * kv_dim);
            src.insert(src.end(), seqs[s].v.begin() + p * kv_dim,
                       seqs[s].v.begin() + (p + 1) * kv_dim);
            slots.push_back(slot(s, p));
        }
        keep.push_back(make_buffer(src));
        keep.push_back(make_buffer(slots));
        const buffer& sb = keep[keep.size() - 2];
        status st =
            encode_kv_write(*env().str, *pool, layer, {whole(sb), 0, 2 * kv_dim},
                            {whole(sb), kv_dim, 2 * kv_dim}, {whole(keep.back()), 0}, to - from);
        ASSERT_TRUE(st.ok()) << st.err().message;
    }

    // Writes every sequence's whole history into the pool, as one segment.
    void write_histories(std::deque<buffer>& keep) {
        ASSERT_TRUE(env().str->begin("kv history").ok());
        for (std::size_t s = 0; s < seqs.size(); ++s) {
            record_write(s, 0, static_cast<std::uint32_t>(seqs[s].k.size() / kv_dim), keep);
        }
        run_segment("kv history");
    }

    // Attention output for query tokens {seq, pos} with queries q (q_dim per token).
    std::vector<float> run_attention(const std::vector<std::int32_t>& tokens,
                                     const std::vector<float>& q, std::deque<buffer>& keep,
                                     attention_path path = attention_path::automatic) {
        std::uint32_t n = static_cast<std::uint32_t>(tokens.size() / 2);
        keep.push_back(make_buffer(q));
        const buffer& qb = keep.back();
        keep.push_back(make_buffer(tokens));
        const buffer& tb = keep.back();
        keep.push_back(make_buffer(std::vector<float>(n * q_dim, 9.0f)));
        const buffer& ob = keep.back();
        attention_batch b{{whole(qb), 0, q_dim},
                          {whole(ob), 0, q_dim},
                          {whole(tb), 0},
                          {whole(tables), 0},
                          n,
                          static_cast<std::uint32_t>(seqs.size()),
                          max_blocks,
                          n_head};
        status st = encode_attention(*env().str, *pool, layer, b, path);
        EXPECT_TRUE(st.ok()) << st.err().message;
        run_segment("attention");
        return read_buffer<float>(ob, n * q_dim);
    }

    std::vector<float> reference(std::size_t s, std::uint32_t pos, const float* q) const {
        return reference_attention(seqs[s].k, seqs[s].v, pos, q);
    }
};

void decode_batch(bool f16) {
    SCOPED_TRACE(f16 ? "f16 pool" : "f32 pool");
    // Unequal lengths: 1 (first block only), 4 (exactly one block), 9 and 23 (cross blocks).
    std::vector<std::uint32_t> lengths = {9, 1, 23, 4};
    attention_fixture fx(f16, lengths);
    std::deque<buffer> keep;
    fx.write_histories(keep);
    std::vector<std::int32_t> tokens;
    for (std::size_t s = 0; s < lengths.size(); ++s) {
        tokens.push_back(static_cast<std::int32_t>(s));
        tokens.push_back(static_cast<std::int32_t>(lengths[s] - 1));
    }
    auto q = random_floats(lengths.size() * q_dim, 77);
    ASSERT_TRUE(env().str->begin("decode").ok());
    auto got = fx.run_attention(tokens, q, keep);
    for (std::size_t s = 0; s < lengths.size(); ++s) {
        SCOPED_TRACE("sequence " + std::to_string(s));
        auto want = fx.reference(s, lengths[s] - 1, q.data() + s * q_dim);
        expect_close({got.begin() + s * q_dim, got.begin() + (s + 1) * q_dim}, want, 2e-5f, 1e-4f,
                     "decode attention");
    }
}

TEST(GpuAttention, DecodeBatchUnequalLengthsGqaF16) {
    ORDO_REQUIRE_GPU();
    decode_batch(true);
}

TEST(GpuAttention, DecodeBatchUnequalLengthsGqaF32) {
    ORDO_REQUIRE_GPU();
    decode_batch(false);
}

TEST(GpuAttention, ChunkedPrefillEqualsTokenByTokenDecode) {
    ORDO_REQUIRE_GPU();
    const std::uint32_t len = 14;
    auto q = random_floats(len * q_dim, 31);
    // Chunked: positions [0, 5) then [5, 14), each chunk written then attended causally.
    attention_fixture a(true, {len});
    std::deque<buffer> keep;
    std::vector<float> chunked;
    for (auto [from, to] : {std::pair<std::uint32_t, std::uint32_t>{0, 5}, {5, len}}) {
        ASSERT_TRUE(env().str->begin("prefill chunk").ok());
        a.record_write(0, from, to, keep);
        std::vector<std::int32_t> tokens;
        for (std::uint32_t p = from; p < to; ++p) tokens.insert(tokens.end(), {0, std::int32_t(p)});
        auto out =
            a.run_attention(tokens, {q.begin() + from * q_dim, q.begin() + to * q_dim}, keep);
        chunked.insert(chunked.end(), out.begin(), out.end());
    }
    // Token by token on a fresh pool.
    attention_fixture b(true, {len});
    std::vector<float> stepwise;
    for (std::uint32_t p = 0; p < len; ++p) {
        ASSERT_TRUE(env().str->begin("decode step").ok());
        b.record_write(0, p, p + 1, keep);
        auto out = b.run_attention({0, std::int32_t(p)},
                                   {q.begin() + p * q_dim, q.begin() + (p + 1) * q_dim}, keep);
        stepwise.insert(stepwise.end(), out.begin(), out.end());
    }
    EXPECT_EQ(chunked, stepwise) << "chunked prefill must equal token-by-token decode exactly";
    for (std::uint32_t p = 0; p < len; ++p) {
        auto want = a.reference(0, p, q.data() + p * q_dim);
        expect_close({chunked.begin() + p * q_dim, chunked.begin() + (p + 1) * q_dim}, want, 2e-5f,
                     1e-4f, "prefill position " + std::to_string(p));
    }
}

TEST(GpuAttention, GroupedQueriesMixingSequencesEqualQueriesAlone) {
    ORDO_REQUIRE_GPU();
    // 2 sequences, 12 query tokens (>= 4 per sequence: the grouped variant on texel devices):
    // runs of one sequence, then alternating sequences (every group mixed), and an invalid
    // token in the middle of a group.
    attention_fixture fx(true, {11, 7});
    std::deque<buffer> keep;
    ASSERT_TRUE(env().str->begin("kv").ok());
    fx.record_write(0, 0, 11, keep);
    fx.record_write(1, 0, 7, keep);
    run_segment("kv");
    std::vector<std::int32_t> tokens = {0, 3, 0, 4, 0, 5, 0, 6, 1, 2, 0, 7,
                                        1, 3, 0, 8, 1, 4, 5, 0, 1, 6, 0, 10};
    const std::uint32_t n = static_cast<std::uint32_t>(tokens.size() / 2);
    auto q = random_floats(n * q_dim, 13);
    ASSERT_TRUE(env().str->begin("grouped").ok());
    auto together = fx.run_attention(tokens, q, keep);
    for (std::uint32_t t = 0; t < n; ++t) {
        SCOPED_TRACE("token " + std::to_string(t));
        ASSERT_TRUE(env().str->begin("alone").ok());
        auto alone = fx.run_attention({tokens[2 * t], tokens[2 * t + 1]},
                                      {q.begin() + t * q_dim, q.begin() + (t + 1) * q_dim}, keep);
        EXPECT_TRUE(std::equal(alone.begin(), alone.end(), together.begin() + t * q_dim))
            << "a query's output depends on its group";
        if (tokens[2 * t] == 5) {
            EXPECT_TRUE(std::all_of(alone.begin(), alone.end(), [](float x) { return x == 0.0f; }));
            continue;
        }
        auto want = fx.reference(std::size_t(tokens[2 * t]), std::uint32_t(tokens[2 * t + 1]),
                                 q.data() + t * q_dim);
        expect_close(alone, want, 2e-5f, 1e-4f, "grouped attention");
    }
}

TEST(GpuAttention, InvalidTokenReadsNothing) {
    ORDO_REQUIRE_GPU();
    attention_fixture fx(true, {5});
    std::deque<buffer> keep;
    ASSERT_TRUE(env().str->begin("kv").ok());
    fx.record_write(0, 0, 5, keep);
    run_segment("kv");
    auto q = random_floats(3 * q_dim, 5);
    ASSERT_TRUE(env().str->begin("bad tokens").ok());
    // Sequence 7 does not exist; position 999 is past the table; sequence 0 pos 4 is valid.
    auto got = fx.run_attention({7, 0, 0, 999, 0, 4}, q, keep);
    for (std::uint32_t i = 0; i < 2 * q_dim; ++i) ASSERT_EQ(got[i], 0.0f) << i;
    auto want = fx.reference(0, 4, q.data() + 2 * q_dim);
    expect_close({got.begin() + 2 * q_dim, got.end()}, want, 2e-5f, 1e-4f, "valid token");
}

// ---------------------------------------------------------------------------------------------
// Flash decoding: the split grid against one workgroup per token.

constexpr std::uint32_t split_blocks = 80;  // 320 positions per sequence, 4 sequences

struct split_env {
    std::unique_ptr<kv_pool> pool;
    std::deque<buffer> keep;
    std::vector<std::vector<float>> k, v;  // per sequence, as stored (f16-rounded)
    buffer tables;
    std::uint32_t wg = 0;

    std::vector<float> reference(std::size_t s, std::uint32_t pos, const float* q) const {
        return reference_attention(k[s], v[s], pos, q);
    }
};

// Four sequences of `lengths` positions written to an F16 pool (blocks in order per sequence).
split_env make_split_env(const std::vector<std::uint32_t>& lengths) {
    split_env e;
    auto p =
        kv_pool::create(*env().dev, {2, n_head_kv, head_dim, block_tokens, split_blocks * 4, true});
    EXPECT_TRUE(p.ok());
    e.pool = std::move(*p);
    e.wg = env().pipes->get(pipeline_id::attention_f16).workgroup_size;
    std::vector<std::int32_t> table;
    EXPECT_TRUE(env().str->begin("split history").ok());
    for (std::size_t s = 0; s < lengths.size(); ++s) {
        for (std::uint32_t b = 0; b < split_blocks; ++b) {
            table.push_back(static_cast<std::int32_t>(s * split_blocks + b));
        }
        auto k = random_floats(std::size_t(lengths[s]) * kv_dim, 300 + s);
        auto v = random_floats(std::size_t(lengths[s]) * kv_dim, 400 + s);
        for (auto* a : {&k, &v}) {
            for (float& x : *a) x = model::f16_to_f32(model::f32_to_f16(x));
        }
        std::vector<float> src;
        std::vector<std::int32_t> slots;
        for (std::uint32_t pos = 0; pos < lengths[s]; ++pos) {
            src.insert(src.end(), k.begin() + pos * kv_dim, k.begin() + (pos + 1) * kv_dim);
            src.insert(src.end(), v.begin() + pos * kv_dim, v.begin() + (pos + 1) * kv_dim);
            slots.push_back(static_cast<std::int32_t>((s * split_blocks) * block_tokens + pos));
        }
        const buffer& sb = e.keep.emplace_back(make_buffer(src));
        const buffer& slb = e.keep.emplace_back(make_buffer(slots));
        EXPECT_TRUE(encode_kv_write(*env().str, *e.pool, layer, {whole(sb), 0, 2 * kv_dim},
                                    {whole(sb), kv_dim, 2 * kv_dim}, {whole(slb), 0}, lengths[s])
                        .ok());
        e.k.push_back(std::move(k));
        e.v.push_back(std::move(v));
    }
    run_segment("split history");
    e.tables = make_buffer(table);
    return e;
}

// Attention for tokens {seq, pos} through `path` on stream `str`; split_keys 0: unsplit;
// partials: bound (the grid, where the path runs it); the automatic path is given the host's
// copy of the tokens. `dispatches` receives the stream's dispatch count.
std::vector<float> run_path(split_env& e, stream& str, const std::vector<std::int32_t>& tokens,
                            const std::vector<float>& q, std::uint32_t split_keys,
                            attention_path path, bool partials = false,
                            std::uint32_t* dispatches = nullptr) {
    const auto n = static_cast<std::uint32_t>(tokens.size() / 2);
    const buffer& qb = e.keep.emplace_back(make_buffer(q));
    const buffer& tb = e.keep.emplace_back(make_buffer(tokens));
    const buffer& ob = e.keep.emplace_back(make_buffer(std::vector<float>(n * q_dim, 9.0f)));
    const std::uint32_t max_splits =
        (split_blocks * block_tokens + std::max(split_keys, 1u) - 1) / std::max(split_keys, 1u);
    const buffer& pb = e.keep.emplace_back(make_buffer(std::vector<float>(
        attention_partials_floats(n_head, head_dim, std::max(max_splits, 1u)), 7.0f)));
    attention_batch b{{whole(qb), 0, q_dim},
                      {whole(ob), 0, q_dim},
                      {whole(tb), 0},
                      {whole(e.tables), 0},
                      n,
                      4,
                      split_blocks,
                      n_head};
    b.split_keys = split_keys;
    if (partials) {
        b.partials = whole(pb);
        b.max_splits = max_splits;
    }
    if (path == attention_path::automatic) b.host_tokens = tokens;
    EXPECT_TRUE(str.begin("attention").ok());
    status st = encode_attention(str, *e.pool, layer, b, path);
    EXPECT_TRUE(st.ok()) << st.err().message;
    if (dispatches != nullptr) *dispatches = str.dispatches();
    st = str.run(test_watchdog_ms);
    EXPECT_TRUE(st.ok()) << st.err().message;
    return read_buffer<float>(ob, n * q_dim);
}

// attention.comp on the default stream, checking the split grid ran where it should.
std::vector<float> run_split(split_env& e, const std::vector<std::int32_t>& tokens,
                             const std::vector<float>& q, std::uint32_t split_keys, bool partials) {
    std::uint32_t dispatches = 0;
    auto out = run_path(e, *env().str, tokens, q, split_keys, attention_path::classic, partials,
                        &dispatches);
    const bool grid =
        partials && split_keys != 0 && tokens.size() / 2 <= attention_split_tokens_max;
    EXPECT_EQ(dispatches, grid ? 2u : 1u) << "the split grid is attention then attention_merge";
    return out;
}

bool same_bits(const float* a, const float* b, std::size_t n) {
    return std::memcmp(a, b, n * sizeof(float)) == 0;
}

TEST(GpuAttention, SplitGridEqualsOneWorkgroupWalkingTheSplits) {
    ORDO_REQUIRE_GPU();
    // Lengths around the split edges: 1, one split exactly, one key past it, 300 (several
    // splits). The smallest split is the device's attention workgroup (8 on lavapipe, 64 on
    // NVIDIA): many splits on short histories.
    const std::uint32_t keys = env().pipes->get(pipeline_id::attention_f16).workgroup_size;
    ASSERT_LE(2 * keys, 300u) << "the history holds too few splits of this device's workgroup";
    const std::vector<std::uint32_t> lengths = {1, keys, keys + 1, 300};
    split_env e = make_split_env(lengths);
    std::vector<std::int32_t> tokens;
    for (std::size_t s = 0; s < lengths.size(); ++s) {
        tokens.push_back(static_cast<std::int32_t>(s));
        tokens.push_back(static_cast<std::int32_t>(lengths[s] - 1));
    }
    auto q = random_floats(lengths.size() * q_dim, 91);
    auto grid = run_split(e, tokens, q, keys, true);
    auto walk = run_split(e, tokens, q, keys, false);
    auto unsplit = run_split(e, tokens, q, 0, true);
    for (std::size_t s = 0; s < lengths.size(); ++s) {
        SCOPED_TRACE("context " + std::to_string(lengths[s]));
        const float* g = grid.data() + s * q_dim;
        EXPECT_TRUE(same_bits(g, walk.data() + s * q_dim, q_dim))
            << "the split grid and one workgroup walking the splits differ";
        if (lengths[s] <= keys) {
            EXPECT_TRUE(same_bits(g, unsplit.data() + s * q_dim, q_dim))
                << "a context of one split changed bits";
        }
        expect_close({g, g + q_dim}, e.reference(s, lengths[s] - 1, q.data() + s * q_dim), 2e-5f,
                     1e-4f, "split attention vs reference");
    }
}

TEST(GpuAttention, PrefillChunkEqualsItsTokensThroughTheSplitGrid) {
    ORDO_REQUIRE_GPU();
    split_env e = make_split_env({150, 1, 1, 1});
    const std::uint32_t keys = e.wg;
    // A chunk of 12 queries (more than the grid serves: one workgroup per token walks the
    // splits) at positions 120..131, then each alone (the grid).
    std::vector<std::int32_t> chunk;
    for (std::int32_t pos = 120; pos < 132; ++pos) chunk.insert(chunk.end(), {0, pos});
    ASSERT_GT(chunk.size() / 2, attention_split_tokens_max);
    auto q = random_floats(12 * q_dim, 5);
    auto whole_chunk = run_split(e, chunk, q, keys, true);
    for (std::uint32_t i = 0; i < 12; ++i) {
        std::vector<float> qi(q.begin() + i * q_dim, q.begin() + (i + 1) * q_dim);
        auto alone = run_split(e, {0, chunk[2 * i + 1]}, qi, keys, true);
        EXPECT_TRUE(same_bits(alone.data(), whole_chunk.data() + i * q_dim, q_dim))
            << "position " << chunk[2 * i + 1];
    }
}

TEST(GpuAttention, SplitGridRefusesTooFewPartialsSlots) {
    ORDO_REQUIRE_GPU();
    split_env e = make_split_env({150, 1, 1, 1});
    const buffer& qb = e.keep.emplace_back(make_buffer(random_floats(q_dim, 1)));
    const buffer& tb = e.keep.emplace_back(make_buffer(std::vector<std::int32_t>{0, 149}));
    const buffer& ob = e.keep.emplace_back(make_buffer(std::vector<float>(q_dim)));
    const buffer& pb = e.keep.emplace_back(
        make_buffer(std::vector<float>(attention_partials_floats(n_head, head_dim, 2))));
    attention_batch b{{whole(qb), 0, q_dim},
                      {whole(ob), 0, q_dim},
                      {whole(tb), 0},
                      {whole(e.tables), 0},
                      1,
                      4,
                      split_blocks,
                      n_head};
    b.split_keys = e.wg;
    b.partials = whole(pb);
    b.max_splits = 2;  // the table spans 320 positions: more than 2 splits
    ASSERT_TRUE(env().str->begin("refused").ok());
    status st = encode_attention(*env().str, *e.pool, layer, b, attention_path::classic);
    EXPECT_FALSE(st.ok());
    b.max_splits = 40;  // more slots than the buffer holds
    EXPECT_FALSE(encode_attention(*env().str, *e.pool, layer, b, attention_path::classic).ok());
    b.split_keys = e.wg + 1;  // not a multiple of the workgroup
    EXPECT_FALSE(encode_attention(*env().str, *e.pool, layer, b, attention_path::classic).ok());
    EXPECT_EQ(env().str->dispatches(), 0u);
    ASSERT_TRUE(env().str->run(test_watchdog_ms).ok());
}

// ---------------------------------------------------------------------------------------------
// Flash attention (attention_flash.comp) against attention.comp.

// Every query of `tokens` through attention_flash and attention.comp: the same bits; each valid
// one close to the reference, each invalid one 0.
template <typename Ref>
void expect_flash_equals_classic(const std::vector<float>& flash, const std::vector<float>& classic,
                                 const std::vector<std::int32_t>& tokens, std::uint32_t n_seqs,
                                 const std::vector<float>& q, Ref reference) {
    const std::size_t n = tokens.size() / 2;
    ASSERT_EQ(flash.size(), n * q_dim);
    ASSERT_EQ(classic.size(), n * q_dim);
    for (std::size_t t = 0; t < n; ++t) {
        SCOPED_TRACE("token " + std::to_string(t) + " {" + std::to_string(tokens[2 * t]) + ", " +
                     std::to_string(tokens[2 * t + 1]) + "}");
        const float* f = flash.data() + t * q_dim;
        EXPECT_TRUE(same_bits(f, classic.data() + t * q_dim, q_dim))
            << "attention_flash and attention.comp differ";
        if (tokens[2 * t] < 0 || std::uint32_t(tokens[2 * t]) >= n_seqs) {
            EXPECT_TRUE(std::all_of(f, f + q_dim, [](float x) { return x == 0.0f; }));
            continue;
        }
        auto want = reference(std::size_t(tokens[2 * t]), std::uint32_t(tokens[2 * t + 1]),
                              q.data() + t * q_dim);
        expect_close({f, f + q_dim}, want, 2e-5f, 1e-4f, "flash attention vs reference");
    }
}

// Pipelines of the storage family and a stream on them (null str on failure).
struct storage_stream {
    std::unique_ptr<pipelines> pipes;
    std::unique_ptr<stream> str;
};

// k_pairs, v_group: attention.comp's load groups (0: the tuning's).
storage_stream make_storage_stream(bool token_tiles = false, std::uint32_t k_pairs = 0,
                                   std::uint32_t v_group = 0) {
    storage_stream out;  // timestamped: timings() names each dispatch's kernel
    pipeline_tuning tuning = tuning_for(env().dev->info());
    tuning.prefer_texel_kernels = false;
    tuning.attention_token_tiles = token_tiles;
    if (k_pairs != 0) tuning.attention_k_pairs = k_pairs;
    if (v_group != 0) tuning.attention_v_group = v_group;
    auto pipes = pipelines::create(*env().dev, tuning);
    EXPECT_TRUE(pipes.ok()) << pipes.err().message;
    if (!pipes) return out;
    out.pipes = std::move(*pipes);
    stream_options so;
    so.timestamps = true;
    auto str = stream::create(*env().dev, *out.pipes, so);
    EXPECT_TRUE(str.ok()) << str.err().message;
    if (str) out.str = std::move(*str);
    return out;
}

TEST(GpuAttention, FlashEqualsOneWorkgroupPerQueryF16AndF32) {
    ORDO_REQUIRE_GPU();
    for (bool f16 : {true, false}) {
        SCOPED_TRACE(f16 ? "f16 pool" : "f32 pool");
        const std::vector<std::uint32_t> lengths = {23, 9, 17};
        attention_fixture fx(f16, lengths);
        std::deque<buffer> keep;
        fx.write_histories(keep);
        // Sequence 0's whole prompt (causal), a decode token, sequence 2's run of 12, an
        // invalid token, alternating single tokens.
        std::vector<std::int32_t> tokens;
        for (std::int32_t p = 0; p < 23; ++p) tokens.insert(tokens.end(), {0, p});
        tokens.insert(tokens.end(), {1, 8});
        for (std::int32_t p = 5; p < 17; ++p) tokens.insert(tokens.end(), {2, p});
        tokens.insert(tokens.end(), {6, 0, 1, 3, 2, 0, 1, 0, 0, 22});
        const auto n = static_cast<std::uint32_t>(tokens.size() / 2);
        auto q = random_floats(n * q_dim, 61);
        ASSERT_TRUE(env().str->begin("flash").ok());
        auto flash = fx.run_attention(tokens, q, keep, attention_path::flash);
        ASSERT_TRUE(env().str->begin("classic").ok());
        auto classic = fx.run_attention(tokens, q, keep, attention_path::classic);
        expect_flash_equals_classic(flash, classic, tokens, 3, q,
                                    [&](std::size_t s, std::uint32_t pos, const float* qq) {
                                        return fx.reference(s, pos, qq);
                                    });
    }
}

TEST(GpuAttention, FlashEqualsOneWorkgroupPerQueryAcrossSplits) {
    ORDO_REQUIRE_GPU();
    const std::vector<std::uint32_t> lengths = {150, 37, 300, 5};
    split_env e = make_split_env(lengths);
    // Two prefill runs (50 tokens each, ending at their history's end), decode tokens and short
    // runs of the other two sequences, an invalid token among them.
    std::vector<std::int32_t> tokens;
    for (std::int32_t p = 100; p < 150; ++p) tokens.insert(tokens.end(), {0, p});
    for (std::int32_t p = 250; p < 300; ++p) tokens.insert(tokens.end(), {2, p});
    tokens.insert(tokens.end(), {1, 36, 3, 0, 3, 1, 1, 20, 9, 4, 3, 4, 1, 0});
    const auto n = static_cast<std::uint32_t>(tokens.size() / 2);
    auto q = random_floats(n * q_dim, 17);
    auto reference = [&](std::size_t s, std::uint32_t pos, const float* qq) {
        return e.reference(s, pos, qq);
    };
    // Storage-family pipelines, where the automatic path chooses between the two kernels; a
    // second set with decode tokens on attention_flash's token tiles.
    storage_stream st = make_storage_stream();
    storage_stream tiles = make_storage_stream(true);
    ASSERT_TRUE(st.str && tiles.str);
    ASSERT_TRUE(prepare_attention(*st.pipes, e.pool->geometry()).ok());
    ASSERT_TRUE(prepare_attention(*tiles.pipes, e.pool->geometry()).ok());
    // The kernels a storage stream's last segment ran, in order.
    auto kernels = [](const storage_stream& on) {
        std::vector<pipeline_id> ids;
        for (const dispatch_timing& t : on.str->timings()) ids.push_back(t.id);
        return ids;
    };
    // Decode tokens only, more than the split grid serves: attention.comp by default, else one
    // tile per token's 3 query heads.
    std::vector<std::int32_t> decode;
    for (std::int32_t i = 0; i < 12; ++i) {
        decode.insert(decode.end(), {i % 4, std::int32_t(lengths[std::size_t(i % 4)]) - 1 - i / 4});
    }
    decode.insert(decode.end(), {7, 1});
    ASSERT_GT(decode.size() / 2, attention_split_tokens_max);
    auto dq = random_floats(decode.size() / 2 * q_dim, 23);
    for (std::uint32_t split_keys : {0u, e.wg}) {
        SCOPED_TRACE("split_keys " + std::to_string(split_keys));
        auto classic = run_path(e, *st.str, tokens, q, split_keys, attention_path::classic);
        auto flash = run_path(e, *st.str, tokens, q, split_keys, attention_path::flash);
        expect_flash_equals_classic(flash, classic, tokens, 4, q, reference);
        auto automatic = run_path(e, *st.str, tokens, q, split_keys, attention_path::automatic);
        EXPECT_EQ(kernels(st), (std::vector<pipeline_id>{pipeline_id::attention_flash_f16,
                                                         pipeline_id::attention_f16}))
            << "the two runs on attention_flash, the rest on attention.comp";
        EXPECT_TRUE(same_bits(automatic.data(), classic.data(), classic.size()));

        auto decode_classic = run_path(e, *st.str, decode, dq, split_keys, attention_path::classic);
        auto decode_auto = run_path(e, *st.str, decode, dq, split_keys, attention_path::automatic);
        EXPECT_EQ(kernels(st), std::vector<pipeline_id>{pipeline_id::attention_f16});
        EXPECT_TRUE(same_bits(decode_auto.data(), decode_classic.data(), decode_classic.size()));
        auto decode_tiles =
            run_path(e, *tiles.str, decode, dq, split_keys, attention_path::automatic);
        EXPECT_EQ(kernels(tiles), std::vector<pipeline_id>{pipeline_id::attention_flash_f16});
        expect_flash_equals_classic(decode_tiles, decode_classic, decode, 4, dq, reference);
    }
}

// attention.comp's load groups (pipeline_tuning::attention_k_pairs, attention_v_group) schedule
// loads only: each grouping gives the default's bits for decode tokens and a prefill run, over
// contexts that end mid-tile and mid-group, with K pair groups that end past head_dim (12 and
// 32 pairs of a 32-wide head), unsplit and through the split grid. Groupings the kernel cannot
// take are refused when the pipelines are made.
TEST(GpuAttention, LoadGroupsGiveTheSameBits) {
    ORDO_REQUIRE_GPU();
    const std::vector<std::uint32_t> lengths = {150, 37, 300, 5};
    split_env e = make_split_env(lengths);
    std::vector<std::int32_t> tokens;
    for (std::int32_t p = 120; p < 150; ++p) tokens.insert(tokens.end(), {0, p});
    tokens.insert(tokens.end(), {1, 36, 2, 299, 3, 4, 2, 70, 1, 0, 9, 3});
    auto q = random_floats(tokens.size() / 2 * q_dim, 29);
    storage_stream base = make_storage_stream();
    ASSERT_TRUE(base.str);
    const pipeline_tuning& tu = base.pipes->tuning();
    const std::uint32_t wg = tu.attention_wg;
    std::vector<std::pair<std::uint32_t, std::uint32_t>> groups = {
        {1, 1},
        {12, std::min(wg, attention_v_group_max)},
        {16, wg / 2},
        {attention_k_pairs_max, 2}};
    for (std::uint32_t split_keys : {0u, e.wg}) {
        auto want = run_path(e, *base.str, tokens, q, split_keys, attention_path::classic);
        for (auto [kp, vg] : groups) {
            SCOPED_TRACE("split_keys " + std::to_string(split_keys) + ", k pairs " +
                         std::to_string(kp) + ", v group " + std::to_string(vg));
            storage_stream other = make_storage_stream(false, kp, vg);
            ASSERT_TRUE(other.str);
            auto got = run_path(e, *other.str, tokens, q, split_keys, attention_path::classic);
            ASSERT_EQ(got.size(), want.size());
            EXPECT_TRUE(same_bits(got.data(), want.data(), want.size()));
        }
    }
    for (auto [kp, vg] : std::vector<std::pair<std::uint32_t, std::uint32_t>>{
             {0, 8}, {attention_k_pairs_max + 1, 8}, {4, 0}, {4, 3}, {4, 2 * wg}}) {
        pipeline_tuning bad = tu;
        bad.attention_k_pairs = kp;
        bad.attention_v_group = vg;
        auto p = pipelines::create(*env().dev, bad);
        ASSERT_FALSE(p.ok()) << kp << " " << vg;
        EXPECT_NE(p.err().message.find("attention_v_group"), std::string::npos);
    }
}

TEST(GpuAttention, FlashPastTheLoopCapIsRefusedOrFallsBack) {
    ORDO_REQUIRE_GPU();
    const std::uint32_t cap = env().dev->info().loop_iterations_max;
    if (cap == 0) GTEST_SKIP() << "this device does not cap loop iterations";
    // 16 sequences over tables of 512 key tiles each: past the cap for attention_flash (16
    // passes a tile when forced, 2 on the automatic path), within it for attention.comp.
    const std::uint32_t wg = env().pipes->get(pipeline_id::attention_f16).workgroup_size;
    const std::uint32_t seqs = 16, blocks = 512 * wg / block_tokens;
    auto p = kv_pool::create(*env().dev, {2, n_head_kv, head_dim, block_tokens, 4, true});
    ASSERT_TRUE(p.ok()) << p.err().message;
    buffer tables = make_buffer(std::vector<std::int32_t>(std::size_t(seqs) * blocks, 0));
    std::vector<std::int32_t> tokens;
    for (std::int32_t s = 0; s < std::int32_t(seqs); ++s) {
        for (std::int32_t i = 0; i < 8; ++i) tokens.insert(tokens.end(), {s, i});
    }
    const auto n = static_cast<std::uint32_t>(tokens.size() / 2);
    buffer qb = make_buffer(random_floats(n * q_dim, 3)), tb = make_buffer(tokens);
    buffer ob = make_buffer(std::vector<float>(n * q_dim));
    attention_batch b{{whole(qb), 0, q_dim},
                      {whole(ob), 0, q_dim},
                      {whole(tb), 0},
                      {whole(tables), 0},
                      n,
                      seqs,
                      blocks,
                      n_head};
    b.host_tokens = tokens;
    ASSERT_TRUE(env().str->begin("loop cap").ok());
    status st = encode_attention(*env().str, **p, layer, b, attention_path::flash);
    EXPECT_FALSE(st.ok());
    if (!st.ok()) {
        EXPECT_NE(st.err().message.find("flash path"), std::string::npos);
    }
    EXPECT_EQ(env().str->dispatches(), 0u);
    // The automatic path on storage pipelines (runs of 8 tokens fill a tile of 3:1 GQA rows):
    // attention.comp, one dispatch.
    storage_stream storage = make_storage_stream();
    ASSERT_TRUE(storage.str);
    ASSERT_TRUE(storage.str->begin("fallback").ok());
    st = encode_attention(*storage.str, **p, layer, b, attention_path::automatic);
    EXPECT_TRUE(st.ok()) << st.err().message;
    EXPECT_EQ(storage.str->dispatches(), 1u);
    ASSERT_TRUE(storage.str->run(test_watchdog_ms).ok());
    ASSERT_TRUE(env().str->run(test_watchdog_ms).ok());
}

}  // namespace
}  // namespace ordo::gpu::testing
