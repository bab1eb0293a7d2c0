// test_decode_fusion.cpp: the decode fusions of issue 28 on the real device (lavapipe here).
// encode_norm_mul_mat and encode_norm_glu run, on the mul_mat_vec path (a GPU's decode), one
// dispatch each: mul_mat_vec_norm (the input's RMSNorm staged into the mat-vec) and
// mul_mat_vec_glu (the same, over the fused gate|up matrix, with SwiGLU at the store). Checked:
// * BIT-IDENTICAL to the unfused kernels they replace (rms_norm, then the tiled mat-mul, then
//   swiglu: what prefill runs), for every weight type at 1, 3 and 8 tokens (each token count
//   its own pipeline variant), so a token's logits do not depend on whether its step was a
//   decode or a prefill (batch invariance, gpu/vk/shaders/norm_order.glsl);
// * at several mul_mat_vec shapes (lanes, rows per team, lanes per group), and with rows of
//   different magnitudes per token (the norm scale is per token);
// * close to the CPU reference (model::rmsnorm, the dequantized rows, model::swiglu);
// * the fallbacks: a gate|up matrix split in several chunks, and a norm over fewer elements than
//   the weight's (padded) rows, take the unfused path with the same results, and a GLU weight
//   whose rows are not 2 x n_ff is refused;
// * tuning_for fits the widest (GLU) variant into every shared-memory size from Vulkan's
//   minimum (16 KiB) up, for subgroups of 8 to 64 lanes;
// * a weight's own one-token shape (weight_tensor::vec_shape, measured by the runner at
//   warm-up) gives the same bits in every shape the device holds, and bad shapes are refused.
// * encode_norm_qkv_rope_kv on that path is one mul_mat_vec_rope32/16 dispatch (the norm, the
//   q|k|v mat-vec, RoPE and the KV store) that leaves the same bits in the q|k|v rows and in
//   both pools' K and V as the unfused kernels (rms_norm, the tiled mat-mul, rope_kv: what
//   prefill runs) and as mul_mat_vec_norm then rope_kv (its fallback where a workgroup covers
//   an odd number of rows), for every weight type at 1, 3 and 8 tokens, with GQA, a partial
//   rotation, a skipped slot and an out-of-pool one; close to the CPU reference
//   (model::rmsnorm, the rows, model::rope); a weight that is not q|k|v rows is refused.
#include <cstring>
#include <map>

#include "gpu/vk/kv_pool.hpp"
#include "gpu/vk/weights.hpp"
#include "gpu_fixture.hpp"
#include "model/cpu_ops.hpp"
#include "model/fp16.hpp"
#include "model/llama.hpp"
#include "model/quant.hpp"

namespace ordo::gpu::testing {
namespace {

using model::ggml_type;

// Every weight type ordo serves.
constexpr ggml_type every_type[] = {
    ggml_type::f32,  ggml_type::f16,  ggml_type::bf16, ggml_type::q8_0, ggml_type::q4_0,
    ggml_type::q4_1, ggml_type::q5_0, ggml_type::q5_1, ggml_type::q2_k, ggml_type::q3_k,
    ggml_type::q4_k, ggml_type::q5_k, ggml_type::q6_k};
constexpr std::uint32_t n_ff = 75;  // output rows: not a multiple of any workgroup
constexpr std::uint32_t tokens_max = 8;
constexpr float eps = 1e-5f;

std::uint32_t k_of(ggml_type type) {
    return row_multiple(type) > 32 ? 512 : 160;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

struct fusion_case {
    ggml_type type;
    std::uint32_t k;
    std::vector<std::uint8_t> bytes;  // 2 n_ff rows: gate then up (GGUF layout)
    std::vector<float> x, norm_w;     // tokens_max rows of k; k
};

fusion_case make_case(ggml_type type) {
    fusion_case c{type, k_of(type), {}, {}, {}};
    std::size_t rb = model::row_bytes(type, c.k);
    c.bytes.resize(rb * 2 * n_ff);
    auto f = random_floats(std::size_t(c.k) * 2 * n_ff, 7 + static_cast<std::uint32_t>(type));
    for (std::size_t r = 0; r < 2 * n_ff; ++r) {
        EXPECT_TRUE(
            model::quantize_row(type, f.data() + r * c.k, c.bytes.data() + r * rb, c.k).ok());
    }
    c.x = random_floats(std::size_t(c.k) * tokens_max, 3);
    // Tokens of different magnitudes: each has its own norm scale.
    for (std::uint32_t t = 0; t < tokens_max; ++t) {
        for (std::uint32_t i = 0; i < c.k; ++i) c.x[t * c.k + i] *= float(1 + 3 * t);
    }
    c.norm_w = random_floats(c.k, 4);
    return c;
}

struct outputs {
    std::vector<float> y;    // n x 2 n_ff: W norm(x)
    std::vector<float> hid;  // n x n_ff: silu(gate) * up
};

// Both fused encoders over the case on `str`, forced to `path` (vec: fused; tiled: unfused).
outputs run_case(stream& str, const fusion_case& c, const weight_tensor& w, std::uint32_t n,
                 mat_path path) {
    const std::uint32_t k = c.k;
    buffer xb = make_buffer(c.x), nb = make_buffer(c.norm_w);
    buffer scratch = make_buffer(std::vector<float>(std::size_t(k) * n, 0.0f));
    buffer gu = make_buffer(std::vector<float>(std::size_t(2) * n_ff * n, 0.0f));
    buffer yb = make_buffer(std::vector<float>(std::size_t(2) * n_ff * n, 0.0f));
    buffer hb = make_buffer(std::vector<float>(std::size_t(n_ff) * n, 0.0f));
    const norm_input in{{whole(xb), 0, k}, whole(nb), k, eps, {whole(scratch), 0, k}};
    EXPECT_TRUE(str.begin("decode_fusion").ok());
    status a = encode_norm_mul_mat(str, w, in, {whole(yb), 0, 2 * n_ff}, n, path);
    status b =
        encode_norm_glu(str, w, in, {whole(gu), 0, 2 * n_ff}, {whole(hb), 0, n_ff}, n_ff, n, path);
    EXPECT_TRUE(a.ok()) << (a.ok() ? "" : a.err().message);
    EXPECT_TRUE(b.ok()) << (b.ok() ? "" : b.err().message);
    status r = str.run(test_watchdog_ms);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.err().message);
    return {read_buffer<float>(yb, std::size_t(2) * n_ff * n),
            read_buffer<float>(hb, std::size_t(n_ff) * n)};
}

// The CPU reference of both outputs for n tokens.
outputs reference(const fusion_case& c, std::uint32_t n) {
    const std::uint32_t k = c.k;
    model::matrix_view mv{c.type, c.bytes, k, 2 * n_ff, "fused gate|up"};
    outputs o{std::vector<float>(std::size_t(2) * n_ff * n), std::vector<float>(n_ff * n)};
    std::vector<float> xn(k);
    for (std::uint32_t t = 0; t < n; ++t) {
        model::rmsnorm(xn.data(), c.x.data() + std::size_t(t) * k, c.norm_w.data(), k, eps);
        float* y = o.y.data() + std::size_t(t) * 2 * n_ff;
        model::matvec(y, mv, xn.data());
        model::swiglu(o.hid.data() + std::size_t(t) * n_ff, y, y + n_ff, n_ff);
    }
    return o;
}

// A stream on `pipes`; `timed`: with timestamps where the device has them (they name the
// dispatched kernels).
std::unique_ptr<stream> stream_with(const pipelines& pipes, bool timed = false) {
    auto s = stream::create(*env().dev, pipes, {64, timed && env().dev->info().timestamps});
    EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.err().message);
    return s ? std::move(*s) : nullptr;
}

// The GPUs' few-token path (mul_mat_vec and its fused variants) on this device, or nullptr.
std::unique_ptr<pipelines> gpu_decode_pipelines() {
    pipeline_tuning tuning = tuning_for(env().dev->info());
    tuning.prefer_texel_kernels = false;
    tuning.rows_tokens_max = 0;
    auto pipes = pipelines::create(*env().dev, tuning);
    EXPECT_TRUE(pipes.ok()) << (pipes.ok() ? "" : pipes.err().message);
    return pipes ? std::move(*pipes) : nullptr;
}

TEST(GpuDecodeFusion, FusedEqualsUnfusedBitForBitEveryType) {
    ORDO_REQUIRE_GPU();
    auto pipes = gpu_decode_pipelines();
    ASSERT_TRUE(pipes);
    auto str = stream_with(*pipes);
    ASSERT_TRUE(str);
    for (ggml_type type : every_type) {
        SCOPED_TRACE(model::type_name(type));
        fusion_case c = make_case(type);
        arena mem(*env().dev, 1u << 22);
        auto w = upload_weight(*env().dev, mem, type, c.k, 2 * n_ff, c.bytes);
        ASSERT_TRUE(w.ok()) << w.err().message;
        ASSERT_EQ(w->chunks.size(), 1u);
        ASSERT_TRUE(prepare_mul_mat(*pipes, *w, mat_fusion::glu).ok());
        ASSERT_TRUE(prepare_mul_mat(*pipes, *w, mat_fusion::norm).ok());
        for (std::uint32_t n : {1u, 3u, tokens_max}) {
            SCOPED_TRACE(std::to_string(n) + " tokens");
            outputs fused = run_case(*str, c, *w, n, mat_path::vec);
            outputs unfused = run_case(*str, c, *w, n, mat_path::tiled);
            EXPECT_TRUE(same_bits(fused.y, unfused.y)) << "mul_mat_vec_norm != rms_norm + tiled";
            EXPECT_TRUE(same_bits(fused.hid, unfused.hid))
                << "mul_mat_vec_glu != rms_norm + tiled + swiglu";
            outputs want = reference(c, n);
            // Dot products of 160-512 normed values (|x| ~ 1) against weights in [-1, 1].
            expect_close(fused.y, want.y, 2e-3f, 1e-3f, "W norm(x) vs reference");
            expect_close(fused.hid, want.hid, 2e-3f, 2e-3f, "swiglu vs reference");
        }
    }
}

// The fused kernels' shape is a per-device choice too: every shape the device holds gives the
// unfused bits (F16 and Q4_K: one plain and one super-block type; 1 and 3 tokens, one pass with
// and without helpers).
TEST(GpuDecodeFusion, EveryMatVecShapeGivesTheUnfusedBits) {
    ORDO_REQUIRE_GPU();
    struct shape {
        std::uint32_t wg, rows_per_team, split, split_cols, unroll;
    };
    for (ggml_type type : {ggml_type::f16, ggml_type::q4_k}) {
        SCOPED_TRACE(model::type_name(type));
        fusion_case c = make_case(type);
        arena mem(*env().dev, 1u << 22);
        auto w = upload_weight(*env().dev, mem, type, c.k, 2 * n_ff, c.bytes);
        ASSERT_TRUE(w.ok()) << w.err().message;
        // The unfused reference runs the storage family's rms_norm (env()'s stream may prefer
        // the texel family's rms_norm_tx, which sums in a subgroup's order).
        pipeline_tuning storage = tuning_for(env().dev->info());
        storage.prefer_texel_kernels = false;
        auto storage_pipes = pipelines::create(*env().dev, storage);
        ASSERT_TRUE(storage_pipes.ok()) << storage_pipes.err().message;
        auto storage_str = stream_with(**storage_pipes);
        ASSERT_TRUE(storage_str);
        std::map<std::uint32_t, outputs> unfused;
        for (std::uint32_t n : {1u, 3u}) {
            unfused[n] = run_case(*storage_str, c, *w, n, mat_path::tiled);
        }
        std::uint32_t ran = 0;
        for (shape sh : {shape{8, 1, 1, 2, 2}, shape{32, 3, 1, 2, 2}, shape{64, 2, 1, 2, 1},
                         shape{32, 1, 1, 2, 4}, shape{16, 1, 2, 8, 2}, shape{32, 2, 2, 2, 2}}) {
            pipeline_tuning tuning = tuning_for(env().dev->info());
            tuning.prefer_texel_kernels = false;
            tuning.rows_tokens_max = 0;
            tuning.mat_vec_wg = sh.wg;
            tuning.mat_vec_rows = sh.rows_per_team;
            tuning.mat_vec_split = sh.split;
            tuning.mat_vec_split_cols = sh.split_cols;
            tuning.mat_vec_unroll = sh.unroll;
            tuning.mat_vec_block_unroll = sh.unroll;
            if (sh.wg > env().dev->info().max_workgroup_invocations ||
                mat_vec_shared_bytes(tuning, 1) > env().dev->info().max_shared_memory_bytes) {
                continue;
            }
            SCOPED_TRACE("mat_vec_wg " + std::to_string(sh.wg) + " rows per team " +
                         std::to_string(sh.rows_per_team) + " lanes per group " +
                         std::to_string(sh.split));
            auto pipes = pipelines::create(*env().dev, tuning);
            ASSERT_TRUE(pipes.ok()) << pipes.err().message;
            auto str = stream_with(**pipes);
            ASSERT_TRUE(str);
            ++ran;
            for (std::uint32_t n : {1u, 3u}) {
                outputs fused = run_case(*str, c, *w, n, mat_path::vec);
                EXPECT_TRUE(same_bits(fused.y, unfused[n].y)) << n << " tokens: norm";
                EXPECT_TRUE(same_bits(fused.hid, unfused[n].hid)) << n << " tokens: glu";
            }
        }
        EXPECT_GE(ran, 4u) << "lavapipe holds all but the widest shapes";
    }
}

// A weight's own one-token shape (weight_tensor::vec_shape, which the runner measures at
// warm-up): every shape mat_vec_shape_candidates gives this device runs the plain, norm and
// GLU mat-vecs with the unfused tiled kernels' bits (F16, Q8_0, Q4_K), and shapes the device
// cannot run, or at more than one token, are refused by name.
TEST(GpuDecodeFusion, EveryPerWeightShapeGivesTheUnfusedBits) {
    ORDO_REQUIRE_GPU();
    auto pipes = gpu_decode_pipelines();
    ASSERT_TRUE(pipes);
    auto str = stream_with(*pipes);
    ASSERT_TRUE(str);
    const std::uint64_t shared = env().dev->info().max_shared_memory_bytes;
    for (ggml_type type : {ggml_type::f16, ggml_type::q8_0, ggml_type::q4_k}) {
        SCOPED_TRACE(model::type_name(type));
        fusion_case c = make_case(type);
        arena mem(*env().dev, 1u << 22);
        auto w = upload_weight(*env().dev, mem, type, c.k, 2 * n_ff, c.bytes);
        ASSERT_TRUE(w.ok()) << w.err().message;
        ASSERT_TRUE(prepare_mul_mat(*pipes, *w, mat_fusion::glu).ok());
        outputs unfused = run_case(*str, c, *w, 1, mat_path::tiled);
        // The plain mat-vec of the first token's x against the tiled kernel's.
        buffer xb = make_buffer(c.x);
        auto plain = [&](mat_path path) {
            buffer yb = make_buffer(std::vector<float>(2 * n_ff, 0.0f));
            EXPECT_TRUE(str->begin("plain").ok());
            status e = encode_mul_mat(*str, *w, {whole(xb), 0, c.k}, {whole(yb), 0, 2 * n_ff}, 1,
                                      false, path);
            EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.err().message);
            status r = str->run(test_watchdog_ms);
            EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.err().message);
            return read_buffer<float>(yb, 2 * n_ff);
        };
        const std::vector<float> plain_tiled = plain(mat_path::tiled);
        const bool block = type != ggml_type::f16;
        auto shapes = mat_vec_shape_candidates(pipes->tuning(), block, shared);
        EXPECT_GE(shapes.size(), 4u) << "lavapipe holds the tuning's and at least three more";
        EXPECT_TRUE(shapes.front().tuned());
        for (mat_vec_shape sh : shapes) {
            SCOPED_TRACE(std::to_string(sh.split) + " lanes a group x " +
                         std::to_string(sh.unroll) + " units");
            w->vec_shape = sh;
            ASSERT_TRUE(prepare_mul_mat_vec_shape(*pipes, *w, mat_fusion::glu, sh).ok());
            ASSERT_TRUE(prepare_mul_mat_vec_shape(*pipes, *w, mat_fusion::norm, sh).ok());
            if (!sh.tuned()) {
                auto pl = pipes->for_cols(pipeline_id::mul_mat_vec_f32, 1, sh);
                ASSERT_TRUE(pl.ok());
                EXPECT_EQ((*pl)->helpers, sh.split);
                EXPECT_EQ((*pl)->tile_rows, sh.unroll);
            }
            outputs fused = run_case(*str, c, *w, 1, mat_path::vec);
            EXPECT_TRUE(same_bits(fused.y, unfused.y)) << "norm";
            EXPECT_TRUE(same_bits(fused.hid, unfused.hid)) << "glu";
            EXPECT_TRUE(same_bits(plain(mat_path::vec), plain_tiled)) << "plain";
        }
        // The encoder runs the weight's shape at one token (and only there): one it cannot
        // build fails the one-token step, not a two-token one.
        w->vec_shape = mat_vec_shape{3, 3};
        buffer yb = make_buffer(std::vector<float>(4 * n_ff, 0.0f));
        ASSERT_TRUE(str->begin("bad shape").ok());
        EXPECT_FALSE(encode_mul_mat(*str, *w, {whole(xb), 0, c.k}, {whole(yb), 0, 2 * n_ff}, 1,
                                    false, mat_path::vec)
                         .ok());
        EXPECT_TRUE(encode_mul_mat(*str, *w, {whole(xb), 0, c.k}, {whole(yb), 0, 2 * n_ff}, 2,
                                   false, mat_path::vec)
                        .ok());
        str->discard();
    }
    // Refused: a split that is not a power of two up to 8, one that does not divide the unroll,
    // more lanes a group than a workgroup holds, and another shape past one token.
    const pipeline_tuning& tu = pipes->tuning();
    for (mat_vec_shape bad :
         {mat_vec_shape{3, 3}, mat_vec_shape{4, 2}, mat_vec_shape{tu.mat_vec_wg / 4, 8}}) {
        auto pl = pipes->for_cols(pipeline_id::mul_mat_vec_f16, 1, bad);
        ASSERT_FALSE(pl.ok()) << bad.split << "x" << bad.unroll;
        EXPECT_NE(pl.err().message.find("mul_mat_vec shape"), std::string::npos)
            << pl.err().message;
    }
    auto two = pipes->for_cols(pipeline_id::mul_mat_vec_f16, 2, mat_vec_shape{2, 2});
    ASSERT_FALSE(two.ok());
    EXPECT_NE(two.err().message.find("2-token variant of another shape"), std::string::npos)
        << two.err().message;
}

TEST(GpuDecodeFusion, FallbacksTakeTheUnfusedPathWithTheSameResults) {
    ORDO_REQUIRE_GPU();
    auto pipes = gpu_decode_pipelines();
    ASSERT_TRUE(pipes);
    auto str = stream_with(*pipes);
    ASSERT_TRUE(str);
    fusion_case c = make_case(ggml_type::q8_0);
    arena one(*env().dev, 1u << 22);
    auto whole_w = upload_weight(*env().dev, one, c.type, c.k, 2 * n_ff, c.bytes);
    ASSERT_TRUE(whole_w.ok());
    // Pages of a few rows: the gate|up matrix in several chunks (GLU needs one).
    arena small(*env().dev, 4096);
    auto chunked = upload_weight(*env().dev, small, c.type, c.k, 2 * n_ff, c.bytes);
    ASSERT_TRUE(chunked.ok());
    ASSERT_GT(chunked->chunks.size(), 1u);
    const std::uint32_t n = 3;
    outputs a = run_case(*str, c, *whole_w, n, mat_path::vec);
    outputs b = run_case(*str, c, *chunked, n, mat_path::vec);
    EXPECT_TRUE(same_bits(a.y, b.y));
    EXPECT_TRUE(same_bits(a.hid, b.hid));

    // A norm over fewer elements than the weight's rows (a padded row) is never fused: the
    // unfused rms_norm normalizes over n, the mat-mul reads the zero pad.
    buffer xb = make_buffer(c.x), nb = make_buffer(c.norm_w);
    buffer scratch = make_buffer(std::vector<float>(std::size_t(c.k) * n, 0.0f));
    buffer yb = make_buffer(std::vector<float>(std::size_t(2) * n_ff * n, 0.0f));
    const std::uint32_t short_n = c.k - 32;
    const norm_input in{{whole(xb), 0, c.k}, whole(nb), short_n, eps, {whole(scratch), 0, c.k}};
    ASSERT_TRUE(str->begin("short_norm").ok());
    ASSERT_TRUE(
        encode_norm_mul_mat(*str, *whole_w, in, {whole(yb), 0, 2 * n_ff}, n, mat_path::vec).ok());
    ASSERT_TRUE(str->run(test_watchdog_ms).ok());
    EXPECT_EQ(str->dispatches(), 2u) << "rms_norm then the mat-vec";
    auto xn = read_buffer<float>(scratch, std::size_t(c.k) * n);
    std::vector<float> want(short_n);
    model::rmsnorm(want.data(), c.x.data(), c.norm_w.data(), short_n, eps);
    expect_close(std::vector<float>(xn.begin(), xn.begin() + short_n), want, 1e-6f, 1e-5f,
                 "the unfused norm over n elements");

    // GLU over a matrix that is not n_ff gate + n_ff up rows.
    buffer hb = make_buffer(std::vector<float>(std::size_t(n_ff) * n, 0.0f));
    ASSERT_TRUE(str->begin("bad_glu").ok());
    const norm_input full{{whole(xb), 0, c.k}, whole(nb), c.k, eps, {whole(scratch), 0, c.k}};
    status bad = encode_norm_glu(*str, *whole_w, full, {whole(yb), 0, 2 * n_ff},
                                 {whole(hb), 0, n_ff}, n_ff + 1, n, mat_path::vec);
    EXPECT_FALSE(bad.ok());
    EXPECT_TRUE(str->run(test_watchdog_ms).ok());
}

// The attention block's fused input (encode_norm_qkv_rope_kv): 4 q heads over 2 KV heads of
// 16 dims, 12 of them rotated; token 2 skips its store, token 5's slot is past the pool.
struct qkv_case {
    static constexpr std::uint32_t n_head = 4, n_kv = 2, hd = 16, n_rot = 12, bt = 4, blocks = 9;
    static constexpr std::uint32_t rows = (n_head + 2 * n_kv) * hd;
    static constexpr std::uint32_t stride = rows + 8;  // q|k|v rows with a gap between tokens
    ggml_type type;
    std::uint32_t k;
    std::vector<std::uint8_t> bytes;
    std::vector<float> x, norm_w;
    std::vector<double> freq;
    std::vector<std::int32_t> ints;  // positions at 0, slots at 8
};

qkv_case make_qkv_case(ggml_type type) {
    qkv_case c{type, k_of(type), {}, {}, {}, {}, std::vector<std::int32_t>(16, 0)};
    std::size_t rb = model::row_bytes(type, c.k);
    c.bytes.resize(rb * qkv_case::rows);
    auto f =
        random_floats(std::size_t(c.k) * qkv_case::rows, 17 + static_cast<std::uint32_t>(type));
    for (std::size_t r = 0; r < qkv_case::rows; ++r) {
        EXPECT_TRUE(
            model::quantize_row(type, f.data() + r * c.k, c.bytes.data() + r * rb, c.k).ok());
    }
    c.x = random_floats(std::size_t(c.k) * tokens_max, 5);
    c.norm_w = random_floats(c.k, 6);
    model::llama_hparams hp;
    hp.n_rot = qkv_case::n_rot;
    hp.rope_freq_base = 10000.0f;
    c.freq = model::rope_frequencies(hp, {});
    const std::int32_t pos[tokens_max] = {5, 0, 17, 300, 9, 4, 70000, 3};
    const std::int32_t slots[tokens_max] = {23, 0, -1, 13, 6, 36, 35, 9};  // 36: past the pool
    for (std::uint32_t t = 0; t < tokens_max; ++t) {
        c.ints[t] = pos[t];
        c.ints[8 + t] = slots[t];
    }
    return c;
}

struct qkv_outputs {
    std::vector<float> qkv;                     // n tokens x stride
    std::vector<std::uint32_t> pool_k, pool_v;  // layer 1's words (f16 pairs or floats)
    std::vector<std::string> kernels;           // the dispatches, by name (with timestamps)
};

qkv_outputs run_qkv(stream& str, const qkv_case& c, const weight_tensor& w, std::uint32_t n,
                    mat_path path, bool f16) {
    const std::uint32_t k = c.k;
    buffer xb = make_buffer(c.x), nb = make_buffer(c.norm_w), ib = make_buffer(c.ints);
    buffer rope = make_buffer(rope_turns_table(c.freq));
    buffer scratch = make_buffer(std::vector<float>(std::size_t(k) * n, 0.0f));
    buffer yb = make_buffer(std::vector<float>(std::size_t(qkv_case::stride) * n, -7.0f));
    auto pool = kv_pool::create(
        *env().dev, {2, qkv_case::n_kv, qkv_case::hd, qkv_case::bt, qkv_case::blocks, f16});
    EXPECT_TRUE(pool.ok()) << (pool.ok() ? "" : pool.err().message);
    if (!pool) return {};
    EXPECT_TRUE((*pool)->clear().ok());
    const norm_input in{{whole(xb), 0, k}, whole(nb), k, eps, {whole(scratch), 0, k}};
    const rope_kv_input rk{
        pool->get(),     1, {whole(ib), 0}, {whole(ib), 8}, {whole(rope), qkv_case::n_rot},
        qkv_case::n_head};
    EXPECT_TRUE(str.begin("qkv_rope_kv").ok());
    status a = encode_norm_qkv_rope_kv(str, w, in, {whole(yb), 0, qkv_case::stride}, rk, n, path);
    EXPECT_TRUE(a.ok()) << (a.ok() ? "" : a.err().message);
    status r = str.run(test_watchdog_ms);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.err().message);
    qkv_outputs o;
    o.qkv = read_buffer<float>(yb, std::size_t(qkv_case::stride) * n);
    auto words = [&](buffer_view v) {
        std::vector<std::uint32_t> out(v.range / 4);
        EXPECT_TRUE(env().dev->read(*v.buf, v.offset, out.data(), out.size() * 4).ok());
        return out;
    };
    o.pool_k = words((*pool)->k(1));
    o.pool_v = words((*pool)->v(1));
    for (const auto& t : str.timings()) o.kernels.emplace_back(pipeline_name(t.id));
    return o;
}

// The CPU reference: q rotated and k, v as computed in the q|k|v rows (k unrotated there), and
// layer 1's pool as floats (rotated k, v) where the slot is in the pool.
struct qkv_reference {
    std::vector<float> qkv, pool_k, pool_v;
};

qkv_reference reference_qkv(const qkv_case& c, std::uint32_t n) {
    constexpr std::uint32_t hd = qkv_case::hd, n_kv = qkv_case::n_kv, n_head = qkv_case::n_head;
    const std::size_t pool_elems = std::size_t(qkv_case::blocks) * n_kv * qkv_case::bt * hd;
    qkv_reference o{std::vector<float>(std::size_t(qkv_case::stride) * n, -7.0f),
                    std::vector<float>(pool_elems, 0.0f), std::vector<float>(pool_elems, 0.0f)};
    model::matrix_view mv{c.type, c.bytes, c.k, qkv_case::rows, "q|k|v"};
    std::vector<float> xn(c.k), row(qkv_case::rows);
    for (std::uint32_t t = 0; t < n; ++t) {
        model::rmsnorm(xn.data(), c.x.data() + std::size_t(t) * c.k, c.norm_w.data(), c.k, eps);
        model::matvec(row.data(), mv, xn.data());
        float* y = o.qkv.data() + std::size_t(t) * qkv_case::stride;
        std::copy(row.begin(), row.end(), y);
        std::vector<float> rotated = row;
        model::rope(rotated.data(), n_head + n_kv, hd, c.freq, std::size_t(c.ints[t]));
        std::copy(rotated.begin(), rotated.begin() + n_head * hd, y);
        const std::int32_t slot = c.ints[8 + t];
        if (slot < 0 || slot >= std::int32_t(qkv_case::blocks * qkv_case::bt)) continue;
        const std::uint32_t block = slot / qkv_case::bt, in_block = slot % qkv_case::bt;
        for (std::uint32_t h = 0; h < n_kv; ++h) {
            for (std::uint32_t d = 0; d < hd; ++d) {
                std::size_t e =
                    ((std::size_t(block) * n_kv + h) * qkv_case::bt + in_block) * hd + d;
                o.pool_k[e] = rotated[(n_head + h) * hd + d];
                o.pool_v[e] = row[(n_head + n_kv + h) * hd + d];
            }
        }
    }
    return o;
}

std::vector<float> pool_floats(const std::vector<std::uint32_t>& words, bool f16) {
    if (!f16) {
        std::vector<float> f(words.size());
        std::memcpy(f.data(), words.data(), words.size() * 4);
        return f;
    }
    std::vector<float> f;
    for (std::uint32_t w : words) {
        f.push_back(model::f16_to_f32(static_cast<std::uint16_t>(w & 0xffffu)));
        f.push_back(model::f16_to_f32(static_cast<std::uint16_t>(w >> 16)));
    }
    return f;
}

TEST(GpuDecodeFusion, QkvRopeKvFusedEqualsUnfusedBitForBitEveryTypeBothPools) {
    ORDO_REQUIRE_GPU();
    auto pipes = gpu_decode_pipelines();
    ASSERT_TRUE(pipes);
    auto str = stream_with(*pipes, true);
    ASSERT_TRUE(str);
    // The fallback's shape: a workgroup of one 8-lane team and one row per team (odd rows).
    pipeline_tuning odd = (*pipes).tuning();
    odd.mat_vec_wg = 8;
    odd.mat_vec_rows = 1;
    odd.mat_vec_split = 1;
    auto odd_pipes = pipelines::create(*env().dev, odd);
    ASSERT_TRUE(odd_pipes.ok()) << odd_pipes.err().message;
    auto odd_str = stream_with(**odd_pipes, true);
    ASSERT_TRUE(odd_str);
    // Every type, the two pools in turn (each type's pipelines compile in seconds on lavapipe).
    bool f16 = false;
    for (ggml_type type : every_type) {
        SCOPED_TRACE(model::type_name(type));
        qkv_case c = make_qkv_case(type);
        arena mem(*env().dev, 1u << 22);
        auto w = upload_weight(*env().dev, mem, type, c.k, qkv_case::rows, c.bytes);
        ASSERT_TRUE(w.ok()) << w.err().message;
        f16 = !f16;
        {
            SCOPED_TRACE(f16 ? "f16 pool" : "f32 pool");
            const std::string fused_name =
                std::string(f16 ? "mul_mat_vec_rope16_" : "mul_mat_vec_rope32_") +
                std::string(model::type_name(type));
            for (std::uint32_t n : {1u, 3u, tokens_max}) {
                SCOPED_TRACE(std::to_string(n) + " tokens");
                qkv_outputs fused = run_qkv(*str, c, *w, n, mat_path::vec, f16);
                qkv_outputs unfused = run_qkv(*str, c, *w, n, mat_path::tiled, f16);
                qkv_outputs fallback = run_qkv(*odd_str, c, *w, n, mat_path::vec, f16);
                EXPECT_TRUE(same_bits(fused.qkv, unfused.qkv)) << "q|k|v rows";
                EXPECT_EQ(fused.pool_k, unfused.pool_k) << "pool K";
                EXPECT_EQ(fused.pool_v, unfused.pool_v) << "pool V";
                EXPECT_TRUE(same_bits(fused.qkv, fallback.qkv)) << "q|k|v rows, fallback";
                EXPECT_EQ(fused.pool_k, fallback.pool_k) << "pool K, fallback";
                EXPECT_EQ(fused.pool_v, fallback.pool_v) << "pool V, fallback";
                if (env().dev->info().timestamps) {
                    EXPECT_EQ(fused.kernels, std::vector<std::string>{fused_name});
                    ASSERT_EQ(fallback.kernels.size(), 2u);
                    EXPECT_EQ(fallback.kernels[1], f16 ? "rope_kv_f16" : "rope_kv_f32");
                }
                qkv_reference want = reference_qkv(c, n);
                expect_close(fused.qkv, want.qkv, 2e-3f, 1e-3f, "q|k|v vs reference");
                // An F16 pool rounds to half: 2^-11 relative on top.
                const float rel = f16 ? 2e-3f : 1e-3f;
                expect_close(pool_floats(fused.pool_k, f16), want.pool_k, 2e-3f, rel, "pool K");
                expect_close(pool_floats(fused.pool_v, f16), want.pool_v, 2e-3f, rel, "pool V");
            }
        }
    }
}

TEST(GpuDecodeFusion, QkvRopeKvRefusesAWeightThatIsNotQkvRows) {
    ORDO_REQUIRE_GPU();
    auto pipes = gpu_decode_pipelines();
    ASSERT_TRUE(pipes);
    auto str = stream_with(*pipes);
    ASSERT_TRUE(str);
    qkv_case c = make_qkv_case(ggml_type::f16);
    arena mem(*env().dev, 1u << 22);
    // One row short of the heads' rows.
    std::vector<std::uint8_t> bytes(c.bytes.begin(), c.bytes.end() - model::row_bytes(c.type, c.k));
    auto w = upload_weight(*env().dev, mem, c.type, c.k, qkv_case::rows - 1, bytes);
    ASSERT_TRUE(w.ok()) << w.err().message;
    buffer xb = make_buffer(c.x), nb = make_buffer(c.norm_w), ib = make_buffer(c.ints);
    buffer rope = make_buffer(rope_turns_table(c.freq));
    buffer yb = make_buffer(std::vector<float>(std::size_t(qkv_case::stride) * 2, 0.0f));
    auto pool = kv_pool::create(*env().dev,
                                {2, qkv_case::n_kv, qkv_case::hd, qkv_case::bt, qkv_case::blocks});
    ASSERT_TRUE(pool.ok()) << pool.err().message;
    const norm_input in{{whole(xb), 0, c.k}, whole(nb), c.k, eps, {whole(yb), 0, c.k}};
    const rope_kv_input rk{
        pool->get(),     1, {whole(ib), 0}, {whole(ib), 8}, {whole(rope), qkv_case::n_rot},
        qkv_case::n_head};
    ASSERT_TRUE(str->begin("bad_qkv").ok());
    for (mat_path path : {mat_path::vec, mat_path::tiled}) {
        status st =
            encode_norm_qkv_rope_kv(*str, *w, in, {whole(yb), 0, qkv_case::stride}, rk, 1, path);
        ASSERT_FALSE(st.ok());
        EXPECT_NE(st.err().message.find("q|k|v"), std::string::npos) << st.err().message;
    }
    rope_kv_input no_pool = rk;
    no_pool.pool = nullptr;
    EXPECT_FALSE(
        encode_norm_qkv_rope_kv(*str, *w, in, {whole(yb), 0, qkv_case::stride}, no_pool, 1).ok());
    EXPECT_EQ(str->dispatches(), 0u);
    EXPECT_TRUE(str->run(test_watchdog_ms).ok());
}

TEST(GpuDecodeFusion, TuningFitsTheGluVariantInEveryDevicesSharedMemory) {
    // Pure arithmetic over device limits: no device needed.
    for (std::uint32_t shared : {16384u, 32768u, 49152u, 65536u}) {
        for (std::uint32_t sg : {8u, 16u, 32u, 64u}) {
            device_info info;
            info.kind = device_kind::discrete;
            info.subgroup_size = sg;
            info.max_workgroup_invocations = 1024;
            info.max_shared_memory_bytes = shared;
            pipeline_tuning t = tuning_for(info);
            SCOPED_TRACE(std::to_string(shared) + " B, subgroup " + std::to_string(sg));
            EXPECT_LE(mat_vec_shared_bytes(t), shared);
            EXPECT_EQ(t.mat_vec_wg % abi::ORDO_MAT_GROUPS, 0u);
            EXPECT_GE(t.mat_vec_wg, abi::ORDO_MAT_GROUPS);
        }
    }
}

TEST(GpuDecodeFusion, TokensPastTheSharedMemoryRunTheWidestVariantThatFits) {
    // Pure arithmetic over device limits, and the pipeline a 32 KiB device gets: unroll 4 at 8
    // tokens needs 36 KiB of x staging for a block type, so such a step runs a narrower variant
    // in passes instead of being refused.
    pipeline_tuning t;
    t.mat_vec_wg = 32;
    t.mat_vec_rows = 1;
    t.mat_vec_unroll = 4;
    t.mat_vec_block_unroll = 4;
    const std::uint32_t fit = mat_vec_cols_max(t, 32768);
    EXPECT_GE(fit, 1u);
    EXPECT_LT(fit, abi::ORDO_MMV_COLS);
    EXPECT_LE(mat_vec_shared_bytes(t, fit), 32768u);
    EXPECT_GT(mat_vec_shared_bytes(t, fit + 1), 32768u);
    EXPECT_EQ(mat_vec_cols_max(t, 1024), 0u);
    // An NVIDIA GPU's defaults (48 KiB): the block types' unroll 4 at every token count.
    device_info nvidia;
    nvidia.kind = device_kind::discrete;
    nvidia.subgroup_size = 32;
    nvidia.max_workgroup_invocations = 1024;
    nvidia.max_shared_memory_bytes = 49152;
    pipeline_tuning d = tuning_for(nvidia);
    EXPECT_EQ(d.mat_vec_block_unroll, 4u);
    EXPECT_EQ(d.mat_vec_unroll, 2u);
    EXPECT_EQ(mat_vec_cols_max(d, 49152), abi::ORDO_MMV_COLS);
}

}  // namespace
}  // namespace ordo::gpu::testing
