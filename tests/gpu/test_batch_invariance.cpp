// test_batch_invariance.cpp: batch invariance (determinism) of the step path on the real device.
// A token's result must be BIT-IDENTICAL whatever the other tokens in its step, how many there
// are and where the token sits among them (docs/protocol.md "generate": same prompt, parameters
// and seed give the same tokens alone or batched; gpu/PERF.md "Batch invariance").
//
// Checks, all with memcmp-exact comparisons (no tolerance):
// (c) kernel level: encode_mul_mat of one activation row alone vs the same row at some position
//     inside batches of 2..40 rows (random other rows), for weights of every type the kernels
//     run (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K; K = 160, or 512 for the K
//     types' whole super-blocks) split in several chunks, with and without the fused
//     accumulate, for every mat_path the device runs
//     (automatic, vec, rows, tiled, split: the tiled kernel's groups over the grid's z, then
//     mul_mat_fold; texel), and all of them agree bit for bit (mat_order.glsl's
//     one grouped order), so the mat-vec/tiled crossover and the family never matter. The
//     texel path's batches cover every mul_mat_tx variant: tx1 (1 row), tx4 (2..8, one tile of
//     8 tokens) and txm (9..40: one to three 16-token tiles, the target in any tile slot).
// (a) runner: a sequence prefilled then decoded alone gives the same logits after every step as
//     when each of its steps also carries 1, 3, 8 or 15 other sequences (prefill chunks of
//     different lengths and decodes, starting at different steps), with the target at a
//     different place in the batch and in different KV blocks; generated 64-wide GQA model in
//     F32, F16 and Q8_0, and its 256-wide sibling in Q4_K (K-type rows), F16 KV pool.
// (b) runner: a 23-token prompt prefilled in one step, in chunks of 7 and token by token gives
//     the same final logits and the same KV bytes (read_kv_blocks).
// (a) and (b) run again on the GPUs' decode path (runner_options::mat_vec_kernels: mul_mat_vec
//     with the fused norm and SwiGLU for up to 8 tokens, the tiled kernel's group split past
//     them), and that path gives a sequence the same logits as this device's default one
//     (mul_mat_rows, separate norm and SwiGLU).
// (d) the tiled kernel's tiles (4 or 8 rows by 4 or 8 tokens per lane) and the group split
//     give the default tile's bits, and mul_mat_vec's shapes the tiled kernel's; a runner whose
//     weights run the one-token shapes it measured at warm-up gives the tuning's shape's bits,
//     and so does one whose tiled steps run the layouts it measured (stream::
//     set_mat_tiled_layouts: each layout at each token count gives the tuning's bits).
// On the storage family a prompt run that fills a flash tile (8 tokens of the 2:1 GQA model)
// takes attention_flash and decode tokens attention.comp, so (a), (b) on the GPUs' path and
// the split-attention prefill compare the two attention kernels too (gpu/vk/kernels.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>

#include "gpu/vk/weights.hpp"
#include "gpu_fixture.hpp"
#include "model/quant.hpp"
#include "test_runner_support.hpp"

namespace ordo::gpu::testing {
namespace {

using model::ggml_type;

// ---------------------------------------------------------------------------------------------
// (c) encode_mul_mat, one row alone vs inside batches.

// K: 5 blocks of the 32-element types (not a tile multiple, 5 units: tx1's 8 lanes get 0 or 1);
// 2 super-blocks (16 units) of the K types.
constexpr std::uint32_t mm_k_blocks = 160, mm_k_super_blocks = 512;
// Not a multiple of any workgroup or tile; more than one 128-row tx4/txm workgroup (8 lanes x
// 16 rows), so a row's lane tile and workgroup differ between chunks and batch sizes.
constexpr std::uint32_t mm_rows = 147;
constexpr std::uint32_t mm_batch_max = 40;
constexpr std::uint32_t mm_stride = mm_k_super_blocks + 4;  // x stride (a multiple of 4)
constexpr std::uint32_t mm_y_stride = mm_rows + 5;

std::uint32_t mm_k(ggml_type type) {
    return row_multiple(type) > mm_k_blocks ? mm_k_super_blocks : mm_k_blocks;
}

bool same_bits(const float* a, const float* b, std::size_t n) {
    return std::memcmp(a, b, n * sizeof(float)) == 0;
}

const char* path_name(mat_path p) {
    switch (p) {
        case mat_path::automatic:
            return "automatic";
        case mat_path::vec:
            return "vec";
        case mat_path::tiled:
            return "tiled";
        case mat_path::split:
            return "split";
        case mat_path::rows:
            return "rows";
        case mat_path::texel:
            return "texel";
    }
    return "?";
}

struct mm_weight {
    arena mem;
    weight_tensor w;
};

// `rows` random rows of K `k` quantized to `type` (seed + the type's number), uploaded into mem.
result<weight_tensor> random_weight(arena& mem, ggml_type type, std::uint32_t k, std::uint32_t rows,
                                    std::uint32_t seed) {
    std::size_t rb = model::row_bytes(type, k);
    std::vector<std::uint8_t> bytes(rb * rows);
    auto f = random_floats(std::size_t(k) * rows, seed + static_cast<std::uint32_t>(type));
    for (std::size_t r = 0; r < rows; ++r) {
        auto q = model::quantize_row(type, f.data() + r * k, bytes.data() + r * rb, k);
        if (!q) return q.err();
    }
    return upload_weight(*env().dev, mem, type, k, rows, bytes);
}

// A random weight, uploaded through pages small enough to split it into several chunks.
std::unique_ptr<mm_weight> make_mm_weight(ggml_type type) {
    const std::uint32_t k = mm_k(type);
    // Pages that split every type into several chunks (the K types' rows are 3x longer).
    auto m = std::make_unique<mm_weight>(mm_weight{arena(*env().dev, k > 256 ? 16384 : 4096), {}});
    auto w = random_weight(m->mem, type, k, mm_rows, 31);
    EXPECT_TRUE(w.ok()) << (w.ok() ? "" : w.err().message);
    if (!w) return nullptr;
    EXPECT_GT(w->chunks.size(), 1u);
    m->w = std::move(*w);
    return m;
}

// Batch n (1..40) occupies rows [base(n), base(n) + n) of x and y; its target row sits at
// place(n) and holds the target activations, the other rows random ones.
std::uint32_t batch_base(std::uint32_t n) {
    return n * (n - 1) / 2;
}
std::uint32_t batch_place(std::uint32_t n) {
    return (n * 7 + 3) % n;
}
constexpr std::uint32_t mm_total_rows = mm_batch_max * (mm_batch_max + 1) / 2;

// y of every batch for one path, or empty when the device cannot run the path.
std::vector<float> run_batches(const weight_tensor& w, mat_path path, bool accumulate,
                               const buffer& xb) {
    auto yb = make_buffer(std::vector<float>(std::size_t(mm_total_rows) * mm_y_stride, 0.5f));
    EXPECT_TRUE(env().str->begin("batch_invariance").ok());
    for (std::uint32_t n = 1; n <= mm_batch_max; ++n) {
        std::uint32_t b = batch_base(n);
        status st = encode_mul_mat(*env().str, w, {whole(xb), b * mm_stride, mm_stride},
                                   {whole(yb), b * mm_y_stride, mm_y_stride}, n, accumulate, path);
        if (!st) {
            EXPECT_EQ(n, 1u) << path_name(path) << " refused batch " << n << " after 1 worked";
            EXPECT_TRUE(env().str->run(test_watchdog_ms).ok());
            return {};
        }
    }
    run_segment("batch_invariance");
    return read_buffer<float>(yb, std::size_t(mm_total_rows) * mm_y_stride);
}

// The target row of batch n in ys.
const float* target_of(const std::vector<float>& ys, std::uint32_t n) {
    return ys.data() + std::size_t(batch_base(n) + batch_place(n)) * mm_y_stride;
}

void check_type(ggml_type type, bool accumulate) {
    SCOPED_TRACE(std::string(model::type_name(type)) + (accumulate ? " accumulate" : ""));
    auto m = make_mm_weight(type);
    ASSERT_TRUE(m);
    auto target = random_floats(mm_k(type), 5);
    auto x = random_floats(std::size_t(mm_total_rows) * mm_stride, 77);
    for (std::uint32_t n = 1; n <= mm_batch_max; ++n) {
        std::size_t at = std::size_t(batch_base(n) + batch_place(n)) * mm_stride;
        std::copy(target.begin(), target.end(), x.begin() + at);
    }
    buffer xb = make_buffer(x);
    const mat_path paths[] = {mat_path::automatic, mat_path::vec,   mat_path::rows,
                              mat_path::tiled,     mat_path::split, mat_path::texel};
    // The group split's partial sums: 8 per output of the widest batch (one chunk at most).
    buffer scratch = make_buffer(
        std::vector<float>(std::size_t(abi::ORDO_MAT_GROUPS) * mm_batch_max * mm_rows, 0.0f));
    env().str->set_mat_split_scratch(whole(scratch));
    std::map<mat_path, std::vector<float>> alone_of;  // each path's target row, alone
    std::uint32_t ran = 0;
    for (mat_path p : paths) {
        auto ys = run_batches(m->w, p, accumulate, xb);
        if (ys.empty()) continue;
        ++ran;
        const float* alone = target_of(ys, 1);
        for (std::uint32_t n = 2; n <= mm_batch_max; ++n) {
            EXPECT_TRUE(same_bits(alone, target_of(ys, n), mm_rows))
                << path_name(p) << ": the row alone differs from the row in a batch of " << n;
        }
        alone_of[p].assign(alone, alone + mm_rows);
    }
    env().str->set_mat_split_scratch({});
    EXPECT_GE(ran, 5u) << "automatic, vec, rows, tiled and split run on every device";
    ASSERT_TRUE(alone_of.count(mat_path::automatic));
    // One order (mat_order.glsl's grouped order) for every kernel: each path's row equals the
    // automatic path's, whichever kernel automatic picked on this device.
    for (const auto& [p, alone] : alone_of) {
        EXPECT_TRUE(same_bits(alone_of[mat_path::automatic].data(), alone.data(), mm_rows))
            << path_name(p) << " does not sum in mat_order.glsl's order";
    }
}

TEST(GpuBatchInvariance, MulMatRowAloneEqualsRowInBatchesEveryTypeAndPath) {
    ORDO_REQUIRE_GPU();
    for (ggml_type t :
         {ggml_type::f32, ggml_type::f16, ggml_type::bf16, ggml_type::q8_0, ggml_type::q4_0,
          ggml_type::q4_1, ggml_type::q5_0, ggml_type::q5_1, ggml_type::q2_k, ggml_type::q3_k,
          ggml_type::q4_k, ggml_type::q5_k, ggml_type::q6_k}) {
        check_type(t, false);
        check_type(t, true);
    }
}

// mul_mat_vec's shape (lanes per workgroup, rows per team, lanes per group) is a per-device choice
// (pipelines.cpp tuning_for): every shape must give the bits the tiled kernel gives, at every
// token count it serves (the K types at 2048 so a lane walks many unrolled unit steps, with
// a tail step half past K).
TEST(GpuBatchInvariance, MulMatVecEveryShapeSumsLikeTiled) {
    ORDO_REQUIRE_GPU();
    const std::uint32_t rows = 75;
    for (ggml_type type : {ggml_type::f16, ggml_type::q4_k, ggml_type::q2_k}) {
        const std::uint32_t k = row_multiple(type) > 32 ? 2304 : 2080;  // 9 super-blocks; 65 blocks
        SCOPED_TRACE(std::string(model::type_name(type)) + " k=" + std::to_string(k));
        arena mem(*env().dev, 1u << 22);
        auto w = random_weight(mem, type, k, rows, 17);
        ASSERT_TRUE(w.ok()) << w.err().message;
        const std::uint32_t tokens = mat_vec_tokens_max;
        buffer xb = make_buffer(random_floats(std::size_t(k) * tokens, 3));
        auto run = [&](stream& str, mat_path path, std::uint32_t n) {
            buffer yb = make_buffer(std::vector<float>(std::size_t(rows) * n, 0.0f));
            EXPECT_TRUE(str.begin("mmv_shapes").ok());
            status st =
                encode_mul_mat(str, *w, {whole(xb), 0, k}, {whole(yb), 0, rows}, n, false, path);
            EXPECT_TRUE(st.ok()) << st.err().message;
            EXPECT_TRUE(str.run(test_watchdog_ms).ok());
            return read_buffer<float>(yb, std::size_t(rows) * n);
        };
        std::map<std::uint32_t, std::vector<float>> tiled;
        for (std::uint32_t n : {1u, 3u, tokens}) tiled[n] = run(*env().str, mat_path::tiled, n);
        // Lanes, rows per team, lanes per group (helpers) and the token counts they serve,
        // unroll (both: F16's and the block types'); a shape whose 1-token variant the
        // device's shared memory lacks is left out, and one whose 8-token variant it lacks
        // runs the widest that fits in passes (lavapipe's 32 KiB: 1..6 tokens at unroll 4).
        struct vec_shape {
            std::uint32_t wg, rows_per_team, split, split_cols, unroll;
        };
        for (vec_shape vs :
             {vec_shape{8, 1, 1, 2, 2}, vec_shape{32, 3, 1, 2, 2}, vec_shape{64, 2, 1, 2, 2},
              vec_shape{16, 1, 2, 8, 2}, vec_shape{32, 2, 2, 2, 2}, vec_shape{64, 1, 4, 3, 4},
              vec_shape{64, 1, 8, 1, 8}, vec_shape{32, 1, 1, 2, 4}}) {
            pipeline_tuning tuning = tuning_for(env().dev->info());
            tuning.mat_vec_wg = vs.wg;
            tuning.mat_vec_rows = vs.rows_per_team;
            tuning.mat_vec_split = vs.split;
            tuning.mat_vec_split_cols = vs.split_cols;
            tuning.mat_vec_unroll = vs.unroll;
            tuning.mat_vec_block_unroll = vs.unroll;
            if (vs.wg > env().dev->info().max_workgroup_invocations ||
                mat_vec_shared_bytes(tuning, 1) > env().dev->info().max_shared_memory_bytes) {
                continue;
            }
            SCOPED_TRACE("mat_vec_wg " + std::to_string(vs.wg) + " rows per team " +
                         std::to_string(vs.rows_per_team) + " lanes per group " +
                         std::to_string(vs.split) + " up to " + std::to_string(vs.split_cols) +
                         " tokens, unroll " + std::to_string(vs.unroll));
            auto pipes = pipelines::create(*env().dev, tuning);
            ASSERT_TRUE(pipes.ok()) << pipes.err().message;
            auto str = stream::create(*env().dev, **pipes, {8, false});
            ASSERT_TRUE(str.ok()) << str.err().message;
            for (std::uint32_t n : {1u, 3u, tokens}) {
                auto vec = run(**str, mat_path::vec, n);
                EXPECT_TRUE(same_bits(vec.data(), tiled[n].data(), vec.size()))
                    << n << " tokens: mul_mat_vec and the tiled kernel differ";
            }
        }
    }
}

// The tiled kernel's tile (outputs per lane: 4 or 8 rows by 4 or 8 tokens; narrow tiles of 4
// token groups for the steps they pad less), its layout (swizzled shared tiles or not, a K step
// of 32 or 64, token tiles first or rows first, staging by parts or by rows) and its group split
// are per-device choices too: every variant, split or not, must give the bits of
// the default at token counts and rows that are not multiples of any tile (partial tiles,
// several workgroups in both directions; K 512 ends a K-64 step inside a group's last unit
// for F16), F16 and the K type Q4_K.
TEST(GpuBatchInvariance, MulMatTiledEveryTileSumsLikeDefault) {
    ORDO_REQUIRE_GPU();
    const std::uint32_t rows = 147, k = 512;
    for (ggml_type type : {ggml_type::f16, ggml_type::q4_k}) {
        SCOPED_TRACE(std::string(model::type_name(type)));
        arena mem(*env().dev, 1u << 22);
        auto w = random_weight(mem, type, k, rows, 23);
        ASSERT_TRUE(w.ok()) << w.err().message;
        const std::uint32_t tokens_max = 70;
        buffer xb = make_buffer(random_floats(std::size_t(k) * tokens_max, 4));
        buffer scratch = make_buffer(
            std::vector<float>(std::size_t(abi::ORDO_MAT_GROUPS) * tokens_max * rows, 0.0f));
        auto run = [&](stream& str, mat_path path, std::uint32_t n) {
            buffer yb = make_buffer(std::vector<float>(std::size_t(rows) * n, 0.25f));
            str.set_mat_split_scratch(whole(scratch));
            EXPECT_TRUE(str.begin("tiles").ok());
            status st =
                encode_mul_mat(str, *w, {whole(xb), 0, k}, {whole(yb), 0, rows}, n, true, path);
            EXPECT_TRUE(st.ok()) << st.err().message;
            EXPECT_TRUE(str.run(test_watchdog_ms).ok());
            str.set_mat_split_scratch({});
            return read_buffer<float>(yb, std::size_t(rows) * n);
        };
        // With narrow tiles (16 tokens at 4 a lane): 9, 33 and 70 run them, 60 the wide one.
        const std::uint32_t counts[] = {9, 33, 60, 70};
        std::map<std::uint32_t, std::vector<float>> want;
        for (std::uint32_t n : counts) want[n] = run(*env().str, mat_path::tiled, n);
        struct variant {
            std::uint32_t rl, tl;
            bool swizzle;
            std::uint32_t k_step;
            bool tokens_first, row_staging, narrow;
        };
        const variant variants[] = {
            {8, 4, true, 32, true, false, false},  {4, 8, true, 32, true, false, false},
            {8, 8, true, 32, true, false, false},  {4, 4, true, 32, true, false, false},
            {4, 4, false, 32, true, false, false}, {4, 4, true, 32, false, false, false},
            {4, 4, true, 64, true, false, false},  {4, 4, false, 64, false, false, false},
            {4, 8, true, 64, true, false, false},  {8, 4, false, 32, false, false, false},
            {4, 4, false, 32, false, true, false}, {4, 4, true, 32, true, true, false},
            {8, 4, true, 32, false, true, false},  {4, 8, false, 64, true, true, false},
            {8, 8, true, 32, true, true, false},   {4, 4, true, 32, true, false, true},
            {4, 4, false, 32, false, false, true}, {4, 8, true, 32, true, true, true},
            {4, 8, true, 32, true, false, true},   {4, 4, true, 32, false, true, true}};
        for (const variant& v : variants) {
            SCOPED_TRACE("rows per lane " + std::to_string(v.rl) + ", tokens per lane " +
                         std::to_string(v.tl) + ", swizzle " + std::to_string(v.swizzle) +
                         ", K step " + std::to_string(v.k_step) + ", tokens first " +
                         std::to_string(v.tokens_first) + ", row staging " +
                         std::to_string(v.row_staging) + ", narrow " + std::to_string(v.narrow));
            pipeline_tuning tuning = tuning_for(env().dev->info());
            tuning.mat_tiled_rows_per_lane = v.rl;
            tuning.mat_tiled_tokens_per_lane = v.tl;
            tuning.mat_tiled_swizzle = v.swizzle;
            tuning.mat_tiled_k_step = v.k_step;
            tuning.mat_tiled_tokens_first = v.tokens_first;
            tuning.mat_tiled_row_staging = v.row_staging;
            tuning.mat_tiled_narrow = v.narrow;
            auto pipes = pipelines::create(*env().dev, tuning);
            ASSERT_TRUE(pipes.ok()) << pipes.err().message;
            auto str = stream::create(*env().dev, **pipes, {8, false});
            ASSERT_TRUE(str.ok()) << str.err().message;
            for (std::uint32_t n : counts) {
                for (mat_path path : {mat_path::tiled, mat_path::split}) {
                    auto got = run(**str, path, n);
                    EXPECT_TRUE(same_bits(got.data(), want[n].data(), got.size()))
                        << n << " tokens, " << path_name(path) << ": differs from the default tile";
                }
            }
        }
    }
}

// The layouts a stream runs by token count (stream::set_mat_tiled_layouts: what the runner
// measured at warm-up): each layout mat_tiled_layout_candidates gives this device, set for every
// count, gives the tuning's bits at 9, 33 and 70 tokens, tiled and split (F16, Q4_K); a table
// runs each count in its entry's layout (a layout the device cannot run, from 33 tokens, fails
// a 40-token step by name and not a 16-token one).
TEST(GpuBatchInvariance, MulMatTiledStreamLayoutsSumLikeTheTuningsAndApplyByTokenCount) {
    ORDO_REQUIRE_GPU();
    const std::uint32_t rows = 147, k = 512, tokens_max = 70;
    pipeline_tuning tuning = tuning_for(env().dev->info());
    auto pipes = pipelines::create(*env().dev, tuning);
    ASSERT_TRUE(pipes.ok()) << pipes.err().message;
    auto str = stream::create(*env().dev, **pipes, {8, false});
    ASSERT_TRUE(str.ok()) << str.err().message;
    const auto layouts =
        mat_tiled_layout_candidates(tuning, env().dev->info().max_shared_memory_bytes);
    ASSERT_GE(layouts.size(), 4u) << "the tuning's, the swizzle, token tiles and rows turned";
    EXPECT_EQ(layouts.front(), mat_tiled_layout_of(tuning));
    for (ggml_type type : {ggml_type::f16, ggml_type::q4_k}) {
        SCOPED_TRACE(std::string(model::type_name(type)));
        arena mem(*env().dev, 1u << 22);
        auto w = random_weight(mem, type, k, rows, 29);
        ASSERT_TRUE(w.ok()) << w.err().message;
        buffer xb = make_buffer(random_floats(std::size_t(k) * tokens_max, 5));
        buffer scratch = make_buffer(
            std::vector<float>(std::size_t(abi::ORDO_MAT_GROUPS) * tokens_max * rows, 0.0f));
        (*str)->set_mat_split_scratch(whole(scratch));
        auto run = [&](mat_path path, std::uint32_t n) -> std::optional<std::vector<float>> {
            buffer yb = make_buffer(std::vector<float>(std::size_t(rows) * n, 0.5f));
            EXPECT_TRUE((*str)->begin("layouts").ok());
            status st =
                encode_mul_mat(**str, *w, {whole(xb), 0, k}, {whole(yb), 0, rows}, n, true, path);
            if (!st) {
                (*str)->discard();
                return std::nullopt;
            }
            EXPECT_TRUE((*str)->run(test_watchdog_ms).ok());
            return read_buffer<float>(yb, std::size_t(rows) * n);
        };
        std::map<std::uint32_t, std::vector<float>> want;
        (*str)->set_mat_tiled_layouts({});
        for (std::uint32_t n : {9u, 33u, 70u}) want[n] = *run(mat_path::tiled, n);
        for (const mat_tiled_layout& l : layouts) {
            SCOPED_TRACE("layout " + l.name());
            ASSERT_TRUE(prepare_mul_mat_tiled_layout(**pipes, *w, l).ok());
            (*str)->set_mat_tiled_layouts({{0, l}});
            for (std::uint32_t n : {9u, 33u, 70u}) {
                for (mat_path path : {mat_path::tiled, mat_path::split}) {
                    auto got = run(path, n);
                    ASSERT_TRUE(got) << n << " tokens";
                    EXPECT_TRUE(same_bits(got->data(), want[n].data(), got->size()))
                        << n << " tokens, " << path_name(path);
                }
            }
        }
        mat_tiled_layout bad = layouts.front();
        bad.k_step = 48;
        (*str)->set_mat_tiled_layouts({{0, layouts.front()}, {33, bad}});
        EXPECT_TRUE(run(mat_path::tiled, 16));
        EXPECT_FALSE(run(mat_path::tiled, 40)) << "the 33-token entry's layout ran elsewhere";
        auto refused =
            (*pipes)->for_token_groups(pipeline_id::mul_mat_f16, mat_tiled_groups_wide, &bad);
        ASSERT_FALSE(refused.ok());
        EXPECT_NE(refused.err().message.find("tiled mul_mat layout k48"), std::string::npos)
            << refused.err().message;
        (*str)->set_mat_split_scratch({});
    }
}

// A tiled layout the device cannot hold is refused when the pipelines are made, naming it: a K
// step other than 32 or 64, and tiles past the device's shared memory (8 x 8 outputs a lane at
// a K step of 64 take 48 KiB, a narrow tile of 8 rows a lane 34 KiB: lavapipe's 32 KiB refuses
// both, a GPU's 48 KiB takes them).
TEST(GpuBatchInvariance, MulMatTiledLayoutTheDeviceCannotHoldIsRefused) {
    ORDO_REQUIRE_GPU();
    pipeline_tuning odd = tuning_for(env().dev->info());
    odd.mat_tiled_k_step = 48;
    auto refused = pipelines::create(*env().dev, odd);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.err().message.find("K step must be 32 or 64"), std::string::npos)
        << refused.err().message;
    pipeline_tuning big = tuning_for(env().dev->info());
    big.mat_tiled_rows_per_lane = 8;
    big.mat_tiled_tokens_per_lane = 8;
    big.mat_tiled_k_step = 64;
    big.mat_tiled_narrow = false;  // the wide tile alone (the narrow one would take 72 KiB)
    ASSERT_EQ(mat_tiled_shared_bytes(big), 48u * 1024);
    auto made = pipelines::create(*env().dev, big);
    const bool fits = mat_tiled_shared_bytes(big) <= env().dev->info().max_shared_memory_bytes;
    EXPECT_EQ(made.ok(), fits) << (made.ok() ? "made" : made.err().message);
    if (!fits) {
        EXPECT_NE(made.err().message.find("49152 bytes"), std::string::npos) << made.err().message;
    }
    // The narrow tile counts too: 8 rows a lane over 32 row groups is 256 rows, 34816 bytes at a
    // K step of 32 (the wide tile's 20480 fit everywhere).
    pipeline_tuning narrow = tuning_for(env().dev->info());
    narrow.mat_tiled_rows_per_lane = 8;
    narrow.mat_tiled_narrow = true;
    ASSERT_EQ(mat_tiled_shared_bytes(narrow), 34816u);
    auto made_narrow = pipelines::create(*env().dev, narrow);
    EXPECT_EQ(made_narrow.ok(), 34816u <= env().dev->info().max_shared_memory_bytes)
        << (made_narrow.ok() ? "made" : made_narrow.err().message);
}

// ---------------------------------------------------------------------------------------------
// Runner helpers: a generated model and a runner large enough for 16 sequences per step.

constexpr std::uint32_t n_vocab = 300;  // synth_model's vocabulary
constexpr std::uint32_t block_tokens = 8;

runner_options wide_options() {
    runner_options o = test_options(true, 1);
    o.kv_blocks = 160;
    o.max_batch_tokens = 160;
    o.rows_max = 16;
    o.seqs_max = 16;
    return o;
}

struct runner_env {
    std::unique_ptr<model::gguf_file> file;
    std::unique_ptr<runner> run;
};

// Which kernels a runner runs: the device's default family, or the storage family with the
// device's few-token kernel (mul_mat_rows on a CPU device), or the storage family with the GPUs'
// (mul_mat_vec and the decode fusions: gpu.kernels = "storage" on a GPU).
enum class kernels { device_default, storage, gpu_decode };
// A GPU's pipeline_tuning::mat_tiled_split_wg (tuning_for): the small test models' grids all
// split under it.
constexpr std::uint32_t gpu_split_wg = 16384;

runner_options kernel_options(kernels k) {
    runner_options o = wide_options();
    if (k != kernels::device_default) o.texel_kernels = false;
    if (k == kernels::gpu_decode) {
        o.mat_vec_kernels = true;
        o.mat_tiled_split_wg = gpu_split_wg;        // the tiled steps run the group split
        o.mat_vec_tokens_max = mat_vec_tokens_max;  // not measured: the kernels per step are known
    }
    return o;
}

runner_env open_runner(ggml_type type, kernels k = kernels::device_default) {
    runner_env e;
    e.file = open_model(synth_model(type));
    if (!e.file) return e;
    runner_options o = kernel_options(k);
    auto r = runner::create(*e.file, o);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.err().message);
    if (r) e.run = std::move(*r);
    return e;
}

// Runs a step; returns the logits row of seq `want_id` (empty on failure).
std::vector<float> step_logits(runner& run, const step& s, std::uint64_t want_id) {
    std::vector<float> logits(std::size_t(16) * n_vocab);
    auto res = run.run_step(s, logits.data());
    EXPECT_TRUE(res.ok()) << (res.ok() ? "" : res.err().message);
    if (!res) return {};
    for (std::size_t i = 0; i < res->rows.size(); ++i) {
        if (res->rows[i] == want_id) {
            return {logits.begin() + i * n_vocab, logits.begin() + (i + 1) * n_vocab};
        }
    }
    ADD_FAILURE() << "no logits row for seq " << want_id;
    return {};
}

// ---------------------------------------------------------------------------------------------
// (a) a sequence alone vs batched with 1, 3, 8, 15 others.

constexpr std::uint32_t target_prompt = 11;
constexpr std::uint32_t target_decodes = 4;
constexpr std::uint32_t other_chunk_max = 7;

// The target's token chunk at step i: the prompt, then one token per decode.
std::vector<std::int32_t> target_chunk(std::uint32_t i, std::uint32_t& pos0) {
    auto all = test_tokens(target_prompt + target_decodes, n_vocab, 3);
    if (i == 0) {
        pos0 = 0;
        return {all.begin(), all.begin() + target_prompt};
    }
    pos0 = target_prompt + i - 1;
    return {all[pos0]};
}

// One other sequence: its own prompt (3..19 tokens) prefilled in chunks, then decodes; it joins
// at step `start`.
struct other_seq {
    std::uint64_t id;
    std::vector<std::int32_t> tokens;
    std::uint32_t prompt = 0, start = 0, done = 0, chunk = 1;
    std::uint32_t first_block = 0;
};

std::vector<other_seq> make_others(std::uint32_t n) {
    std::vector<other_seq> o(n);
    for (std::uint32_t i = 0; i < n; ++i) {
        o[i].id = 100 + i;
        o[i].prompt = 3 + (i * 5) % 17;
        o[i].tokens = test_tokens(o[i].prompt + target_decodes + 1, n_vocab, 40 + i);
        o[i].start = i % 3;
        o[i].chunk = 1 + (i * 3) % other_chunk_max;
        o[i].first_block = 8 + i * 5;  // 5 blocks = 40 positions each; the target uses 0..1
    }
    return o;
}

// The next chunk of `o` (prefill chunk or one decode token), or nothing once finished.
std::optional<step_seq> next_of(other_seq& o, std::uint32_t step_index) {
    if (step_index < o.start || o.done >= o.tokens.size()) return std::nullopt;
    std::uint32_t n = o.done < o.prompt ? std::min(o.chunk, o.prompt - o.done) : 1;
    std::vector<std::int32_t> t(o.tokens.begin() + o.done, o.tokens.begin() + o.done + n);
    std::uint32_t pos0 = o.done;
    o.done += n;
    bool want = o.done >= o.prompt;  // the last prompt chunk and every decode want logits
    return make_seq(o.id, std::move(t), pos0, blocks_from(o.first_block, o.done, block_tokens),
                    want);
}

// The target's logits after each of its steps, alone (n_others 0) or batched.
std::vector<std::vector<float>> run_target(runner& run, std::uint32_t n_others,
                                           std::uint32_t target_first_block) {
    EXPECT_TRUE(run.clear_kv().ok());
    auto others = make_others(n_others);
    std::vector<std::vector<float>> out;
    for (std::uint32_t i = 0; i <= target_decodes; ++i) {
        std::uint32_t pos0 = 0;
        auto chunk = target_chunk(i, pos0);
        auto n_pos = pos0 + static_cast<std::uint32_t>(chunk.size());
        std::vector<step_seq> seqs;
        for (other_seq& o : others) {
            if (auto q = next_of(o, i)) seqs.push_back(std::move(*q));
        }
        // The target moves through the batch: first, middle, last.
        std::size_t place = seqs.empty() ? 0 : (i * 5 + n_others) % (seqs.size() + 1);
        seqs.insert(seqs.begin() + static_cast<std::ptrdiff_t>(place),
                    make_seq(1, chunk, pos0, blocks_from(target_first_block, n_pos, block_tokens)));
        out.push_back(step_logits(
            run,
            make_step(i + 1, n_others ? step_phase::mixed : step_phase::prefill, std::move(seqs)),
            1));
    }
    return out;
}

// The target alone on runners `a` and `b`: the same logits after every step, bit for bit.
void expect_same_target_steps(runner& a, runner& b) {
    auto la = run_target(a, 0, 0);
    auto lb = run_target(b, 0, 0);
    ASSERT_EQ(la.size(), lb.size());
    for (std::size_t i = 0; i < la.size(); ++i) {
        ASSERT_EQ(la[i].size(), n_vocab);
        ASSERT_EQ(lb[i].size(), n_vocab);
        EXPECT_TRUE(same_bits(la[i].data(), lb[i].data(), n_vocab))
            << "step " << i << ": max |diff| " << max_abs_diff(la[i].data(), lb[i]);
    }
}

void check_alone_vs_batched(ggml_type type, kernels k = kernels::device_default) {
    SCOPED_TRACE(std::string(model::type_name(type)) + (k == kernels::gpu_decode ? " gpu" : ""));
    runner_env e = open_runner(type, k);
    ASSERT_TRUE(e.run);
    auto alone = run_target(*e.run, 0, 0);
    ASSERT_EQ(alone.size(), target_decodes + 1);
    for (std::uint32_t n : {1u, 3u, 8u, 15u}) {
        auto batched = run_target(*e.run, n, 90 + n);  // other blocks than alone's and theirs
        ASSERT_EQ(batched.size(), alone.size());
        for (std::size_t i = 0; i < alone.size(); ++i) {
            ASSERT_EQ(alone[i].size(), n_vocab);
            ASSERT_EQ(batched[i].size(), n_vocab);
            EXPECT_TRUE(same_bits(alone[i].data(), batched[i].data(), n_vocab))
                << "step " << i << " with " << n << " other sequences: max |diff| "
                << max_abs_diff(alone[i].data(), batched[i]);
        }
    }
}

TEST(GpuBatchInvariance, RunnerSequenceAloneEqualsBatchedF32) {
    ORDO_REQUIRE_GPU();
    check_alone_vs_batched(ggml_type::f32);
}

TEST(GpuBatchInvariance, RunnerSequenceAloneEqualsBatchedF16) {
    ORDO_REQUIRE_GPU();
    check_alone_vs_batched(ggml_type::f16);
}

TEST(GpuBatchInvariance, RunnerSequenceAloneEqualsBatchedQ8_0) {
    ORDO_REQUIRE_GPU();
    check_alone_vs_batched(ggml_type::q8_0);
}

TEST(GpuBatchInvariance, RunnerSequenceAloneEqualsBatchedQ4_K) {
    ORDO_REQUIRE_GPU();
    check_alone_vs_batched(ggml_type::q4_k);
}

// The GPUs' decode path (mul_mat_vec with the fused norm and SwiGLU for 1..8 tokens, the tiled
// kernel above) run on this device: decodes alone and in batches of 2..8 tokens take the fused
// kernels, batches past 8 tokens the unfused ones.
TEST(GpuBatchInvariance, RunnerSequenceAloneEqualsBatchedGpuDecodePathF16) {
    ORDO_REQUIRE_GPU();
    check_alone_vs_batched(ggml_type::f16, kernels::gpu_decode);
}

TEST(GpuBatchInvariance, RunnerSequenceAloneEqualsBatchedGpuDecodePathQ4_K) {
    ORDO_REQUIRE_GPU();
    check_alone_vs_batched(ggml_type::q4_k, kernels::gpu_decode);
}

// What the GPUs' decode path runs, read from the runner's per-kernel timings: a 1-token step
// runs each layer's norm + q|k|v + RoPE + KV store as one mul_mat_vec_rope (32 or 16: the
// pool's storage) and its norm + gate|up + SwiGLU as one mul_mat_vec_glu (rms_norm only for the
// final norm, no swiglu, no rope_kv); an 11-token step the unfused kernels, the tiled mat-muls
// as the group split (a mul_mat_fold after each).
TEST(GpuBatchInvariance, RunnerGpuDecodePathRunsTheFusedKernels) {
    ORDO_REQUIRE_GPU();
    auto file = open_model(synth_model(ggml_type::f32));
    ASSERT_TRUE(file);
    runner_options o = kernel_options(kernels::gpu_decode);
    o.timestamps = true;
    auto r = runner::create(*file, o);
    ASSERT_TRUE(r.ok()) << r.err().message;
    runner& run = **r;
    auto dispatches = [&](std::string_view name) {
        std::uint32_t n = 0;
        for (const kernel_time& k : run.last_timings()) {
            if (k.name == name) n += k.dispatches;
        }
        return n;
    };
    const std::uint32_t layers = run.hparams().n_layer;
    auto tokens = test_tokens(12, n_vocab, 9);
    std::vector<std::int32_t> prompt(tokens.begin(), tokens.begin() + 11);
    step_logits(run,
                make_step(1, step_phase::prefill,
                          {make_seq(1, prompt, 0, blocks_from(0, 11, block_tokens))}),
                1);
    auto rope_fused = [&] {
        return dispatches("mul_mat_vec_rope32_f32") + dispatches("mul_mat_vec_rope16_f32");
    };
    auto rope_kv = [&] { return dispatches("rope_kv_f32") + dispatches("rope_kv_f16"); };
    EXPECT_EQ(dispatches("mul_mat_vec_norm_f32"), 0u);
    EXPECT_EQ(rope_fused(), 0u);
    EXPECT_EQ(rope_kv(), layers);
    EXPECT_GE(dispatches("mul_mat_fold"), 4 * layers) << "the tiled steps run the group split";
    EXPECT_EQ(dispatches("swiglu"), layers);
    EXPECT_EQ(dispatches("rms_norm"), 2 * layers + 1);
    EXPECT_EQ(dispatches("attention_flash_f16") + dispatches("attention_flash_f32"), layers)
        << "an 11-token prompt fills a flash tile (2 query heads per KV head)";
    step_logits(run,
                make_step(2, step_phase::decode,
                          {make_seq(1, {tokens[11]}, 11, blocks_from(0, 12, block_tokens))}),
                1);
    EXPECT_EQ(dispatches("mul_mat_vec_norm_f32"), 0u);
    EXPECT_EQ(rope_fused(), layers);
    EXPECT_EQ(rope_kv(), 0u);
    EXPECT_EQ(dispatches("mul_mat_vec_glu_f32"), layers);
    EXPECT_EQ(dispatches("swiglu"), 0u);
    EXPECT_EQ(dispatches("rms_norm"), 1u) << "the final norm only";
    EXPECT_EQ(dispatches("attention_flash_f16") + dispatches("attention_flash_f32"), 0u);
}

// The mul_mat_vec / tiled crossover: measured at warm-up when the options leave it open (a
// count from 1 to 16), and whatever it is, a sequence's logits are the same: a runner that
// serves 11-token steps with the fused mul_mat_vec kernels (crossover 16) and one that runs
// them on the tiled kernel (crossover 8) agree bit for bit.
TEST(GpuBatchInvariance, RunnerMatVecCrossoverIsMeasuredAndNeverChangesABit) {
    ORDO_REQUIRE_GPU();
    auto file = open_model(synth_model(ggml_type::f16));
    ASSERT_TRUE(file);
    runner_options measured = kernel_options(kernels::gpu_decode);
    measured.mat_vec_tokens_max.reset();
    auto m = runner::create(*file, measured);
    ASSERT_TRUE(m.ok()) << m.err().message;
    EXPECT_GE((*m)->mat_vec_tokens_max(), 1u);
    EXPECT_LE((*m)->mat_vec_tokens_max(), mat_vec_tokens_limit);
    auto tokens = test_tokens(11, n_vocab, 13);
    auto logits_with = [&](std::uint32_t crossover, std::uint32_t fused_dispatches) {
        runner_options o = kernel_options(kernels::gpu_decode);
        o.mat_vec_tokens_max = crossover;
        o.timestamps = true;
        auto r = runner::create(*file, o);
        EXPECT_TRUE(r.ok()) << r.err().message;
        if (!r) return std::vector<float>{};
        EXPECT_EQ((*r)->mat_vec_tokens_max(), crossover);
        auto out =
            step_logits(**r,
                        make_step(1, step_phase::prefill,
                                  {make_seq(1, tokens, 0, blocks_from(0, 11, block_tokens))}),
                        1);
        std::uint32_t fused = 0;
        for (const kernel_time& k : (*r)->last_timings()) {
            if (k.name == "mul_mat_vec_rope32_f16" || k.name == "mul_mat_vec_rope16_f16") {
                fused += k.dispatches;
            }
        }
        EXPECT_EQ(fused, fused_dispatches) << "crossover " << crossover;
        return out;
    };
    const std::uint32_t layers = (*m)->hparams().n_layer;
    auto tiled = logits_with(mat_vec_tokens_max, 0);
    auto vec = logits_with(mat_vec_tokens_limit, layers);
    ASSERT_EQ(tiled.size(), std::size_t(n_vocab));
    ASSERT_EQ(vec.size(), std::size_t(n_vocab));
    EXPECT_TRUE(same_bits(tiled.data(), vec.data(), n_vocab))
        << "max |diff| " << max_abs_diff(tiled.data(), vec);
}

// Each weight's one-token mul_mat_vec shape (lanes a group x units a lane): measured at warm-up
// when asked (GPUs: by default), every role of the model timed in every shape the device holds
// and one of them chosen ('*'), and whatever was chosen, a sequence's logits after every step
// are those of a runner that keeps the tuning's shape for every weight (the shapes sum in one
// order; GpuDecodeFusion.EveryPerWeightShapeGivesTheUnfusedBits runs each shape itself).
TEST(GpuBatchInvariance, RunnerMatVecShapesAreMeasuredAndNeverChangeABit) {
    ORDO_REQUIRE_GPU();
    for (ggml_type type : {ggml_type::f16, ggml_type::q4_k}) {
        const std::string name(model::type_name(type));
        SCOPED_TRACE(name);
        auto file = open_model(synth_model(type));
        ASSERT_TRUE(file);
        runner_options o = kernel_options(kernels::gpu_decode);
        o.mat_vec_shapes = true;
        auto measured = runner::create(*file, o);
        ASSERT_TRUE(measured.ok()) << measured.err().message;
        const std::string& note = (*measured)->mat_vec_shapes();
        std::size_t roles = 0;
        for (const char* role : {"q|k|v", "o", "gate|up", "down", "output"}) {
            EXPECT_NE(note.find(std::string(role) + " " + name + ":"), std::string::npos)
                << role << " not timed: " << note;
            ++roles;
        }
        EXPECT_EQ(std::count(note.begin(), note.end(), '*'), std::ptrdiff_t(roles)) << note;
        EXPECT_EQ(std::count(note.begin(), note.end(), ';'), std::ptrdiff_t(roles - 1)) << note;
        EXPECT_NE(note.find(" 2x"), std::string::npos) << "no shape with helpers timed: " << note;
        o.mat_vec_shapes = false;
        auto fixed = runner::create(*file, o);
        ASSERT_TRUE(fixed.ok()) << fixed.err().message;
        EXPECT_TRUE((*fixed)->mat_vec_shapes().empty());
        expect_same_target_steps(**measured, **fixed);
    }
}

// The invariant tiled kernel's layout by token count: measured at warm-up when asked (GPUs: by
// default) at 16 and 64 tokens (past the crossover of 8, within max_batch_tokens 160), one
// layout chosen at each ('*'), and whatever was chosen, prompts of 20 and 70 tokens (one in
// each range) give the bits of a runner that keeps the tuning's layout.
TEST(GpuBatchInvariance, RunnerMatTiledLayoutsAreMeasuredAndNeverChangeABit) {
    ORDO_REQUIRE_GPU();
    auto file = open_model(synth_model(ggml_type::q8_0));
    ASSERT_TRUE(file);
    runner_options o = kernel_options(kernels::gpu_decode);
    o.mat_tiled_layouts = true;
    auto measured = runner::create(*file, o);
    ASSERT_TRUE(measured.ok()) << measured.err().message;
    const std::string& note = (*measured)->mat_tiled_layouts();
    EXPECT_EQ(note.rfind("16:", 0), 0u) << note;
    EXPECT_NE(note.find("; 64:"), std::string::npos) << note;
    EXPECT_EQ(note.find("512:"), std::string::npos) << "past max_batch_tokens: " << note;
    EXPECT_EQ(std::count(note.begin(), note.end(), '*'), 2) << note;
    o.mat_tiled_layouts = false;
    auto fixed = runner::create(*file, o);
    ASSERT_TRUE(fixed.ok()) << fixed.err().message;
    EXPECT_TRUE((*fixed)->mat_tiled_layouts().empty());
    for (std::uint32_t n : {20u, 70u}) {
        auto tokens = test_tokens(n, n_vocab, 17);
        auto logits = [&](runner& r) {
            EXPECT_TRUE(r.clear_kv().ok());
            return step_logits(r,
                               make_step(1, step_phase::prefill,
                                         {make_seq(1, tokens, 0, blocks_from(0, n, block_tokens))}),
                               1);
        };
        auto a = logits(**measured);
        auto b = logits(**fixed);
        ASSERT_EQ(a.size(), std::size_t(n_vocab));
        ASSERT_EQ(b.size(), std::size_t(n_vocab));
        EXPECT_TRUE(same_bits(a.data(), b.data(), n_vocab))
            << n << " tokens: max |diff| " << max_abs_diff(a.data(), b);
    }
}

// The storage family's few-token kernel on this device (mul_mat_rows and separate norm and
// SwiGLU dispatches on a CPU device) and the GPUs' fused mul_mat_vec give a sequence the same
// logits at every step.
TEST(GpuBatchInvariance, RunnerGpuDecodePathEqualsDefaultPath) {
    ORDO_REQUIRE_GPU();
    for (ggml_type type : {ggml_type::f32, ggml_type::q8_0}) {
        SCOPED_TRACE(model::type_name(type));
        runner_env plain = open_runner(type, kernels::storage);
        runner_env fused = open_runner(type, kernels::gpu_decode);
        ASSERT_TRUE(plain.run && fused.run);
        expect_same_target_steps(*plain.run, *fused.run);
    }
}

// ---------------------------------------------------------------------------------------------
// (b) prefill chunking: one step, chunks of 7, token by token.

constexpr std::uint32_t chunk_prompt = 23;
const std::vector<std::uint32_t> chunk_table = {5, 2, 9};  // 24 positions, not contiguous

struct prefill_out {
    std::vector<float> logits;
    std::vector<std::uint8_t> kv;
};

prefill_out prefill_in_chunks(runner& run, std::uint32_t chunk) {
    EXPECT_TRUE(run.clear_kv().ok());
    auto tokens = test_tokens(chunk_prompt, n_vocab, 11);
    prefill_out out;
    std::uint64_t id = 1;
    for (std::uint32_t done = 0; done < chunk_prompt; done += chunk) {
        std::uint32_t n = std::min(chunk, chunk_prompt - done);
        bool last = done + n == chunk_prompt;
        std::vector<std::int32_t> t(tokens.begin() + done, tokens.begin() + done + n);
        step s = make_step(id++, step_phase::prefill, {make_seq(7, t, done, chunk_table, last)});
        if (last) {
            out.logits = step_logits(run, s, 7);
        } else {
            std::vector<float> none(std::size_t(16) * n_vocab);
            auto res = run.run_step(s, none.data());
            EXPECT_TRUE(res.ok()) << (res.ok() ? "" : res.err().message);
        }
    }
    out.kv.resize(chunk_table.size() * run.kv_block_bytes());
    EXPECT_TRUE(run.read_kv_blocks(chunk_table, out.kv).ok());
    return out;
}

void check_chunking(ggml_type type, kernels k = kernels::device_default) {
    SCOPED_TRACE(std::string(model::type_name(type)) + (k == kernels::gpu_decode ? " gpu" : ""));
    runner_env e = open_runner(type, k);
    ASSERT_TRUE(e.run);
    prefill_out whole_prompt = prefill_in_chunks(*e.run, chunk_prompt);
    ASSERT_EQ(whole_prompt.logits.size(), n_vocab);
    EXPECT_NE(whole_prompt.kv, std::vector<std::uint8_t>(whole_prompt.kv.size(), 0));
    for (std::uint32_t chunk : {7u, 1u}) {
        prefill_out c = prefill_in_chunks(*e.run, chunk);
        ASSERT_EQ(c.logits.size(), n_vocab) << "chunk " << chunk;
        EXPECT_TRUE(same_bits(whole_prompt.logits.data(), c.logits.data(), n_vocab))
            << "chunks of " << chunk << ": final logits differ, max |diff| "
            << max_abs_diff(whole_prompt.logits.data(), c.logits);
        EXPECT_TRUE(whole_prompt.kv == c.kv) << "chunks of " << chunk << ": KV bytes differ";
    }
}

TEST(GpuBatchInvariance, PrefillChunkingGivesSameLogitsAndKvF32) {
    ORDO_REQUIRE_GPU();
    check_chunking(ggml_type::f32);
}

TEST(GpuBatchInvariance, PrefillChunkingGivesSameLogitsAndKvQ8_0) {
    ORDO_REQUIRE_GPU();
    check_chunking(ggml_type::q8_0);
}

// Flash decoding at the runner: with splits of one attention workgroup of keys, a 100-token
// prompt prefilled in one step (one workgroup per token walks the splits) and the same prompt
// prefilled to 90 then decoded token by token (each decode runs the split grid and the merge)
// give the same final logits and KV bytes; so does the F16 model on the GPUs' decode path.
TEST(GpuBatchInvariance, SplitAttentionPrefillEqualsTokenByTokenDecode) {
    ORDO_REQUIRE_GPU();
    for (kernels k : {kernels::storage, kernels::gpu_decode}) {
        ggml_type type = k == kernels::storage ? ggml_type::f32 : ggml_type::f16;
        SCOPED_TRACE(model::type_name(type));
        auto file = open_model(synth_model(type));
        ASSERT_TRUE(file);
        runner_options o = kernel_options(k);
        o.attention_split_keys = tuning_for(env().dev->info()).attention_wg;
        auto r = runner::create(*file, o);
        ASSERT_TRUE(r.ok()) << r.err().message;
        runner& run = **r;
        const std::uint32_t prompt = 100, prefix = 90;
        auto tokens = test_tokens(prompt, n_vocab, 21);
        auto table = blocks_from(3, prompt, block_tokens);
        auto final_logits = [&](std::uint32_t first_chunk) {
            EXPECT_TRUE(run.clear_kv().ok());
            std::vector<float> logits;
            std::uint64_t id = 1;
            for (std::uint32_t done = 0; done < prompt;) {
                std::uint32_t n = done == 0 ? first_chunk : 1;
                std::vector<std::int32_t> t(tokens.begin() + done, tokens.begin() + done + n);
                bool last = done + n == prompt;
                step st = make_step(id++, n > 1 ? step_phase::prefill : step_phase::decode,
                                    {make_seq(5, t, done, table, last)});
                if (last) {
                    logits = step_logits(run, st, 5);
                } else {
                    std::vector<float> none(std::size_t(16) * n_vocab);
                    EXPECT_TRUE(run.run_step(st, none.data()).ok());
                }
                done += n;
            }
            std::vector<std::uint8_t> kv(table.size() * run.kv_block_bytes());
            EXPECT_TRUE(run.read_kv_blocks(table, kv).ok());
            return std::make_pair(logits, kv);
        };
        auto whole_prompt = final_logits(prompt);
        auto decoded = final_logits(prefix);
        ASSERT_EQ(whole_prompt.first.size(), n_vocab);
        ASSERT_EQ(decoded.first.size(), n_vocab);
        EXPECT_TRUE(same_bits(whole_prompt.first.data(), decoded.first.data(), n_vocab))
            << "max |diff| " << max_abs_diff(whole_prompt.first.data(), decoded.first);
        EXPECT_TRUE(whole_prompt.second == decoded.second) << "KV bytes differ";
    }
}

// Chunks of 7 and token by token on the GPUs' decode path run the fused mul_mat_vec_rope
// (norm, q|k|v, RoPE and the KV store) and mul_mat_vec_glu; the whole prompt runs rms_norm, the
// tiled kernel, rope_kv and swiglu: the same logits and the same KV.
TEST(GpuBatchInvariance, PrefillChunkingGivesSameLogitsAndKvGpuDecodePathQ8_0) {
    ORDO_REQUIRE_GPU();
    check_chunking(ggml_type::q8_0, kernels::gpu_decode);
}

}  // namespace
}  // namespace ordo::gpu::testing
