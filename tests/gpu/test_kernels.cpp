// test_kernels.cpp: the kernels (get_rows, mul_mat_vec, tiled mul_mat, mul_mat_rows, the
// texel-fetch mul_mat_tx variants tx1/tx4/txm and their two row tiles, the automatic choice,
// rms_norm, rope_kv (both paths, checked against model::rope and the pool layout), swiglu,
// add, and both attention kernels at the head dims of the attention_tx variants) run on the real
// Vulkan device and compared with the CPU reference (model/cpu_ops.hpp, model/quant.hpp) on
// seeded random data, for every weight type the kernels run (F32, F16, BF16, Q8_0, Q4_0, Q4_1,
// Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K; weights quantized by model/quant's quantizers and
// repacked at upload into gpu/vk/shaders/weight_units.glsl's layouts), odd row and token counts
// (not multiples of any workgroup or tile), and weights split into many row chunks (a tiny arena
// page) to exercise the multi-binding path in every type. The K types need rows of whole
// 256-element super-blocks: their cases use K rounded up to a multiple of 256 (k_for), the same
// row and token counts.
//
// Attention: both kernels (attention.comp and the texel-fetch attention_tx.comp, forced through
// attention_path) at head dims 64 and 96/128 (the two attention_tx variants), F16 and F32 pools,
// GQA, a history crossing blocks of a reversed (non-contiguous) block table, a chunk of prefill
// tokens and a decode token of a second sequence in one dispatch, against model::attention fed
// the values the pool holds (f16-rounded for an F16 pool): 2e-5 + 1e-4 |ref|.
//
// Tolerances: the GPU dequantizes to exactly the values the reference does (same f16 decode,
// same exact q * d products: get_rows is compared bit for bit), so only summation order
// differs: |gpu - ref| <= 1e-4 + 1e-4 |ref| for dot products of length <= 512 over values in
// [-1, 1]; elementwise kernels 1e-6 relative; rope 2e-5 + 1e-4 |ref| (GPU sin/cos differ from
// libm in the last bits).
//
// RoPE at long positions (8191, 65535, 131071, 2^24 - 1) with Llama 3.1 frequency factors and
// linear scaling: both rope_kv kernels (q in place, k in the pool) and model::rope against a
// rotation computed here in long double from the formula (base^(-2j / n_rot) / factor_j /
// scale), within 5e-6 + 5e-6 |ref|
// (measured: model::rope 1 float ulp, the kernels below 1e-6). A float angle (pos * freq in
// float, as the kernels computed it before the table split it) errs by up to 1e-2 rad at 131071
// and fails this by three orders of magnitude.
#include "gpu/vk/kv_pool.hpp"
#include "gpu/vk/shaders/abi.h"
#include "gpu/vk/weights.hpp"
#include "gpu_fixture.hpp"
#include "model/cpu_ops.hpp"
#include "model/fp16.hpp"
#include "model/llama.hpp"
#include "model/quant.hpp"

namespace ordo::gpu::testing {
namespace {

using model::ggml_type;

struct host_weight {
    std::vector<std::uint8_t> bytes;  // GGUF layout
    model::matrix_view view() const { return {type, bytes, n_in, n_out, "test weight"}; }
    ggml_type type;
    std::size_t n_in, n_out;
};

host_weight make_weight(ggml_type type, std::size_t n_in, std::size_t n_out, std::uint32_t seed) {
    host_weight w{{}, type, n_in, n_out};
    std::size_t rb = model::row_bytes(type, n_in);
    w.bytes.resize(rb * n_out);
    auto f = random_floats(n_in * n_out, seed);
    for (std::size_t r = 0; r < n_out; ++r) {
        EXPECT_TRUE(
            model::quantize_row(type, f.data() + r * n_in, w.bytes.data() + r * rb, n_in).ok());
    }
    return w;
}

struct mm_case {
    std::uint32_t k, n_out, n_tokens;
    mat_path path;
    std::uint64_t page_bytes;  // arena page: small pages force several chunks
};

void check_mul_mat(ggml_type type, mm_case c, bool accumulate) {
    c.k = k_for(type, c.k);
    SCOPED_TRACE(std::string(model::type_name(type)) + " k=" + std::to_string(c.k) +
                 " rows=" + std::to_string(c.n_out) + " tokens=" + std::to_string(c.n_tokens) +
                 (c.path == mat_path::vec     ? " vec"
                  : c.path == mat_path::rows  ? " rows"
                  : c.path == mat_path::texel ? " texel"
                                              : " tiled"));
    host_weight hw = make_weight(type, c.k, c.n_out, c.k * 7 + c.n_out);
    arena mem(*env().dev, c.page_bytes);
    auto w = upload_weight(*env().dev, mem, type, c.k, c.n_out, hw.bytes);
    ASSERT_TRUE(w.ok()) << w.err().message;
    if (c.page_bytes < 4096) {
        EXPECT_GT(w->chunks.size(), 1u) << "small page must split the tensor";
    }
    // x rows padded to a stride of k + 4 (a multiple of 4), y rows to n_out + 3.
    std::uint32_t xs = c.k + 4, ys = c.n_out + 3;
    auto x = random_floats(std::size_t(xs) * c.n_tokens, 99 + c.n_tokens);
    auto y0 = random_floats(std::size_t(ys) * c.n_tokens, 7);
    buffer xb = make_buffer(x), yb = make_buffer(y0);
    ASSERT_TRUE(env().str->begin("mul_mat").ok());
    status st = encode_mul_mat(*env().str, *w, {whole(xb), 0, xs}, {whole(yb), 0, ys}, c.n_tokens,
                               accumulate, c.path);
    ASSERT_TRUE(st.ok()) << st.err().message;
    run_segment("mul_mat");
    auto got = read_buffer<float>(yb, y0.size());
    std::vector<float> want = y0;
    std::vector<float> row(c.n_out);
    for (std::uint32_t t = 0; t < c.n_tokens; ++t) {
        model::matvec(row.data(), hw.view(), x.data() + t * xs);
        for (std::uint32_t r = 0; r < c.n_out; ++r) {
            want[t * ys + r] = accumulate ? y0[t * ys + r] + row[r] : row[r];
        }
    }
    expect_close(got, want, 1e-4f, 1e-4f, "mul_mat");
}

TEST(GpuKernels, MulMatVecAllTypesOddSizes) {
    ORDO_REQUIRE_GPU();
    for (ggml_type t : all_types) {
        check_mul_mat(t, {96, 37, 1, mat_path::vec, 1u << 20}, false);
        check_mul_mat(t, {256, 131, 5, mat_path::vec, 1u << 20}, true);
        check_mul_mat(t, {160, 67, 8, mat_path::vec, 2048}, false);
        // Many unit steps per lane with a tail past K (F16: 129 units, 16 per lane and one);
        // 2 and 7 tokens; 11 tokens take two passes over the weights.
        check_mul_mat(t, {1032, 45, 2, mat_path::vec, 1u << 20}, true);
        check_mul_mat(t, {768, 19, 7, mat_path::vec, 4096}, false);
        check_mul_mat(t, {288, 23, 11, mat_path::vec, 1u << 20}, false);
    }
}

TEST(GpuKernels, MulMatTiledAllTypesOddSizes) {
    ORDO_REQUIRE_GPU();
    for (ggml_type t : all_types) {
        check_mul_mat(t, {96, 37, 33, mat_path::tiled, 1u << 20}, false);
        check_mul_mat(t, {256, 130, 41, mat_path::tiled, 2048}, true);
        check_mul_mat(t, {64, 200, 9, mat_path::tiled, 1u << 20}, false);
        check_mul_mat(t, {32, 65, 1, mat_path::tiled, 1u << 20}, false);
    }
}

TEST(GpuKernels, MulMatRowsAllTypesOddSizes) {
    ORDO_REQUIRE_GPU();
    for (ggml_type t : all_types) {
        check_mul_mat(t, {96, 37, 1, mat_path::rows, 1u << 20}, false);
        check_mul_mat(t, {256, 131, 5, mat_path::rows, 2048}, true);
        check_mul_mat(t, {160, 67, 19, mat_path::rows, 1u << 20}, false);
    }
}

// The texel-fetch kernels: token counts 1 (tx1), 2..8 (tx4) and more (txm, with partial
// tiles), odd row counts, many chunks, accumulate on and off. tx4/txm lanes own 16 rows x 8/16
// tokens: 2 and 17 tokens leave most of a token tile clamped, 16 and 32 fill it exactly, and
// 300 / 259 rows span several 128-row workgroups with a partial last lane tile.
TEST(GpuKernels, MulMatTexelAllTypesOddSizes) {
    ORDO_REQUIRE_GPU();
    for (ggml_type t : all_types) {
        check_mul_mat(t, {96, 37, 1, mat_path::texel, 1u << 20}, false);
        check_mul_mat(t, {256, 131, 1, mat_path::texel, 2048}, true);
        check_mul_mat(t, {160, 67, 5, mat_path::texel, 1u << 20}, true);
        check_mul_mat(t, {288, 70, 8, mat_path::texel, 4096}, false);
        check_mul_mat(t, {96, 37, 33, mat_path::texel, 1u << 20}, false);
        check_mul_mat(t, {256, 130, 41, mat_path::texel, 2048}, true);
        check_mul_mat(t, {32, 65, 9, mat_path::texel, 1u << 20}, false);
        check_mul_mat(t, {64, 300, 2, mat_path::texel, 1u << 20}, false);
        check_mul_mat(t, {96, 259, 16, mat_path::texel, 4096}, true);
        check_mul_mat(t, {64, 300, 17, mat_path::texel, 1u << 20}, false);
        check_mul_mat(t, {32, 133, 32, mat_path::texel, 2048}, true);
    }
}

// tx4/txm pick their workgroup row tile per weight chunk (mul_mat_tx_tile): 288 rows take the
// narrow 96-row tile, 384 rows the default 128-row one. The same 288 rows give bit-identical
// outputs through either (the first 288 rows of a 384-row weight), at tx4 and txm token counts:
// the tile choice never changes a result. For one type of each layout shape (4- and 8-element
// units, two quant texels, an aux region, a K-type header, two half-unit scales): the tile
// logic does not depend on the type, and each pair of tiles is two more of llvmpipe's slowest
// compiles (~20 s per type with a cold shader cache).
TEST(GpuKernels, MulMatTexelRowTilesAgreeBitForBit) {
    ORDO_REQUIRE_GPU();
    constexpr std::uint32_t narrow_rows = 288, wide_rows = 384;
    const pipelines& pipes = *env().pipes;
    auto tile_of = [&](std::uint32_t rows) {
        auto pl = mul_mat_tx_tile(pipes, pipeline_id::mul_mat_txm_f32, rows);
        EXPECT_TRUE(pl.ok());
        return pl.ok() ? (*pl)->workgroup_rows() : 0u;
    };
    EXPECT_LT(tile_of(narrow_rows), tile_of(wide_rows));
    EXPECT_EQ(narrow_rows % tile_of(narrow_rows), 0u);
    EXPECT_FALSE(pipes.for_tile(pipeline_id::mul_mat_txm_f32, 64).ok());
    EXPECT_FALSE(pipes.for_tile(pipeline_id::mul_mat_tx1_f32, abi::ORDO_TX_TILE_ROWS).ok());
    for (ggml_type type : {ggml_type::f32, ggml_type::f16, ggml_type::q8_0, ggml_type::q4_0,
                           ggml_type::q5_1, ggml_type::q4_k, ggml_type::q6_k}) {
        const std::uint32_t k = k_for(type, 96);
        host_weight wide = make_weight(type, k, wide_rows, 5);
        std::vector<std::uint8_t> narrow_bytes(
            wide.bytes.begin(),
            wide.bytes.begin() + std::ptrdiff_t(model::row_bytes(type, k) * narrow_rows));
        arena mem(*env().dev, 1u << 20);
        auto wn = upload_weight(*env().dev, mem, type, k, narrow_rows, narrow_bytes);
        auto ww = upload_weight(*env().dev, mem, type, k, wide_rows, wide.bytes);
        ASSERT_TRUE(wn.ok() && ww.ok());
        for (std::uint32_t n : {5u, 8u, 17u, 40u}) {
            SCOPED_TRACE(std::string(model::type_name(type)) + " tokens=" + std::to_string(n));
            auto x = random_floats(std::size_t(k) * n, 31 + n);
            buffer xb = make_buffer(x);
            buffer yn = make_buffer(std::vector<float>(std::size_t(narrow_rows) * n));
            buffer yw = make_buffer(std::vector<float>(std::size_t(wide_rows) * n));
            ASSERT_TRUE(env().str->begin("row tiles").ok());
            ASSERT_TRUE(encode_mul_mat(*env().str, *wn, {whole(xb), 0, k},
                                       {whole(yn), 0, narrow_rows}, n, false, mat_path::texel)
                            .ok());
            ASSERT_TRUE(encode_mul_mat(*env().str, *ww, {whole(xb), 0, k},
                                       {whole(yw), 0, wide_rows}, n, false, mat_path::texel)
                            .ok());
            run_segment("row tiles");
            auto got_n = read_buffer<float>(yn, std::size_t(narrow_rows) * n);
            auto got_w = read_buffer<float>(yw, std::size_t(wide_rows) * n);
            for (std::uint32_t t = 0; t < n; ++t) {
                ASSERT_EQ(std::memcmp(&got_n[std::size_t(t) * narrow_rows],
                                      &got_w[std::size_t(t) * wide_rows], narrow_rows * 4),
                          0)
                    << "token " << t;
            }
        }
    }
}

// Weight-typed pipelines (pipelines::create leaves them out) are built on their first request
// and kept: find gives a built pipeline, the same one twice; a K-specialized id is refused (it
// needs its K: for_k); the other pipelines are create()'s.
TEST(GpuKernels, WeightTypedPipelinesAreBuiltOnRequest) {
    ORDO_REQUIRE_GPU();
    const pipelines& pipes = *env().pipes;
    for (pipeline_id id :
         {pipeline_id::mul_mat_q4_k, pipeline_id::get_rows_q6_k, pipeline_id::mul_mat_tx4_bf16}) {
        SCOPED_TRACE(std::string(pipeline_name(id)));
        EXPECT_TRUE(pipelines::built_on_request(id));
        auto a = pipes.find(id);
        ASSERT_TRUE(a.ok()) << a.err().message;
        EXPECT_NE((*a)->handle, VK_NULL_HANDLE);
        auto b = pipes.find(id);
        ASSERT_TRUE(b.ok());
        EXPECT_EQ(*a, *b);
    }
    EXPECT_FALSE(pipes.find(pipeline_id::mul_mat_tx1_q4_k).ok());
    EXPECT_FALSE(pipelines::built_on_request(pipeline_id::rms_norm_tx));
    EXPECT_NE(pipes.get(pipeline_id::rms_norm).handle, VK_NULL_HANDLE);
}

// mat_path::automatic on this device gives the reference result too (whichever kernel it picks).
TEST(GpuKernels, MulMatAutomaticAllTypes) {
    ORDO_REQUIRE_GPU();
    for (ggml_type t : all_types) {
        check_mul_mat(t, {288, 45, 1, mat_path::automatic, 1u << 20}, false);
        check_mul_mat(t, {64, 45, 4, mat_path::automatic, 1u << 20}, true);
        check_mul_mat(t, {64, 45, 20, mat_path::automatic, 1u << 20}, false);
    }
}

void check_attention(std::uint32_t head_dim, bool f16, attention_path path) {
    SCOPED_TRACE("head_dim " + std::to_string(head_dim) + (f16 ? " f16" : " f32") +
                 (path == attention_path::texel ? " texel" : " classic"));
    const std::uint32_t n_head = 4, n_head_kv = 2, block_tokens = 8, n_blocks = 16;
    const std::uint32_t max_blocks = 8, kv_dim = n_head_kv * head_dim, q_dim = n_head * head_dim;
    const std::uint32_t lengths[2] = {37, 5};
    auto pool = kv_pool::create(*env().dev, {1, n_head_kv, head_dim, block_tokens, n_blocks, f16});
    ASSERT_TRUE(pool.ok()) << pool.err().message;
    // Sequence s owns blocks 15 - s, 13 - s, ... (reversed, interleaved with the other's).
    std::vector<std::int32_t> tables(2 * max_blocks);
    for (std::uint32_t s = 0; s < 2; ++s) {
        for (std::uint32_t b = 0; b < max_blocks; ++b) tables[s * max_blocks + b] = 15 - s - 2 * b;
    }
    std::vector<float> k[2], v[2];
    std::vector<float> src;  // rows of (k, v) per written position
    std::vector<std::int32_t> slots;
    for (std::uint32_t s = 0; s < 2; ++s) {
        k[s] = random_floats(std::size_t(lengths[s]) * kv_dim, 300 + s);
        v[s] = random_floats(std::size_t(lengths[s]) * kv_dim, 400 + s);
        for (auto* a : {&k[s], &v[s]}) {
            if (f16) {
                for (float& x : *a) x = model::f16_to_f32(model::f32_to_f16(x));
            }
        }
        for (std::uint32_t p = 0; p < lengths[s]; ++p) {
            src.insert(src.end(), k[s].begin() + p * kv_dim, k[s].begin() + (p + 1) * kv_dim);
            src.insert(src.end(), v[s].begin() + p * kv_dim, v[s].begin() + (p + 1) * kv_dim);
            slots.push_back(tables[s * max_blocks + p / block_tokens] * block_tokens +
                            p % block_tokens);
        }
    }
    // Queries: positions 30..36 of sequence 0 (a prefill chunk) and position 4 of sequence 1.
    std::vector<std::int32_t> tokens;
    for (std::int32_t p = 30; p < 37; ++p) tokens.insert(tokens.end(), {0, p});
    tokens.insert(tokens.end(), {1, 4});
    std::uint32_t n = static_cast<std::uint32_t>(tokens.size() / 2);
    auto q = random_floats(std::size_t(n) * q_dim, 500);
    buffer sb = make_buffer(src), slb = make_buffer(slots), tb = make_buffer(tables);
    buffer kb = make_buffer(tokens), qb = make_buffer(q);
    buffer ob = make_buffer(std::vector<float>(std::size_t(n) * q_dim, 9.0f));
    ASSERT_TRUE(env().str->begin("attention").ok());
    ASSERT_TRUE(encode_kv_write(*env().str, **pool, 0, {whole(sb), 0, 2 * kv_dim},
                                {whole(sb), kv_dim, 2 * kv_dim}, {whole(slb), 0},
                                static_cast<std::uint32_t>(slots.size()))
                    .ok());
    attention_batch b{{whole(qb), 0, q_dim},
                      {whole(ob), 0, q_dim},
                      {whole(kb), 0},
                      {whole(tb), 0},
                      n,
                      2,
                      max_blocks,
                      n_head};
    status st = encode_attention(*env().str, **pool, 0, b, path);
    ASSERT_TRUE(st.ok()) << st.err().message;
    run_segment("attention");
    auto got = read_buffer<float>(ob, std::size_t(n) * q_dim);
    std::vector<float> want(std::size_t(n) * q_dim), scratch(64);
    for (std::uint32_t i = 0; i < n; ++i) {
        std::uint32_t s = static_cast<std::uint32_t>(tokens[2 * i]);
        std::uint32_t pos = static_cast<std::uint32_t>(tokens[2 * i + 1]);
        model::attention(want.data() + i * q_dim, q.data() + i * q_dim, k[s].data(), v[s].data(),
                         pos + 1, {n_head, n_head_kv, head_dim}, scratch.data());
    }
    expect_close(got, want, 2e-5f, 1e-4f, "attention");
}

TEST(GpuKernels, AttentionTexelAndClassicAgreeWithReference) {
    ORDO_REQUIRE_GPU();
    const device_info& info = env().dev->info();
    bool texel =
        info.subgroup_arithmetic && env().pipes->tuning().attention_tx_wg == info.subgroup_size;
    for (bool f16 : {true, false}) {
        for (std::uint32_t hd : {64u, 96u, 128u}) {
            check_attention(hd, f16, attention_path::classic);
            if (texel) check_attention(hd, f16, attention_path::texel);
        }
    }
}

TEST(GpuKernels, AttentionTexelRefusesHeadDimItCannotHold) {
    ORDO_REQUIRE_GPU();
    auto pool = kv_pool::create(*env().dev, {1, 1, 36, 4, 4, true});  // 36: not a multiple of 8
    ASSERT_TRUE(pool.ok());
    buffer q = make_buffer(std::vector<float>(36));
    buffer t = make_buffer(std::vector<std::int32_t>{0, 0});
    buffer tab = make_buffer(std::vector<std::int32_t>{0});
    ASSERT_TRUE(env().str->begin("attention refused").ok());
    std::uint32_t before = env().str->dispatches();
    attention_batch b{
        {whole(q), 0, 36}, {whole(q), 0, 36}, {whole(t), 0}, {whole(tab), 0}, 1, 1, 1, 1};
    status st = encode_attention(*env().str, **pool, 0, b, attention_path::texel);
    EXPECT_FALSE(st.ok());
    EXPECT_EQ(env().str->dispatches(), before);
    run_segment("attention refused (empty)");
}

TEST(GpuKernels, GetRowsAllTypesChunked) {
    ORDO_REQUIRE_GPU();
    for (ggml_type t : all_types) {
        SCOPED_TRACE(std::string(model::type_name(t)));
        const std::uint32_t n_in = k_for(t, 96), n_out = 53;
        host_weight hw = make_weight(t, n_in, n_out, 5);
        arena mem(*env().dev, 1024);  // several chunks: ids hit different bindings
        auto w = upload_weight(*env().dev, mem, t, n_in, n_out, hw.bytes);
        ASSERT_TRUE(w.ok()) << w.err().message;
        EXPECT_GT(w->chunks.size(), 2u);
        std::vector<std::int32_t> ids = {0, 52, 17, 17, 30, 1, 44};
        buffer ib = make_buffer(ids);
        buffer ob = make_buffer(std::vector<float>(ids.size() * n_in, -5.0f));
        ASSERT_TRUE(env().str->begin("get_rows").ok());
        ASSERT_TRUE(encode_get_rows(*env().str, *w, {whole(ib), 0},
                                    static_cast<std::uint32_t>(ids.size()), {whole(ob), 0, n_in})
                        .ok());
        run_segment("get_rows");
        auto got = read_buffer<float>(ob, ids.size() * n_in);
        std::vector<float> want(ids.size() * n_in);
        for (std::size_t i = 0; i < ids.size(); ++i) {
            model::get_row(want.data() + i * n_in, hw.view(), ids[i]);
        }
        expect_close(got, want, 0.0f, 0.0f, "get_rows (exact)");
    }
}

TEST(GpuKernels, RmsNorm) {
    ORDO_REQUIRE_GPU();
    const std::uint32_t n = 291, rows = 5;
    auto x = random_floats(n * rows, 1, 3.0f);
    auto w = random_floats(n, 2);
    buffer xb = make_buffer(x), wb = make_buffer(w), ob = make_buffer(std::vector<float>(n * rows));
    ASSERT_TRUE(env().str->begin("rms_norm").ok());
    ASSERT_TRUE(
        encode_rms_norm(*env().str, {whole(xb), 0, n}, whole(wb), {whole(ob), 0, n}, n, rows, 1e-5f)
            .ok());
    run_segment("rms_norm");
    std::vector<float> want(n * rows);
    for (std::uint32_t r = 0; r < rows; ++r) {
        model::rmsnorm(want.data() + r * n, x.data() + r * n, w.data(), n, 1e-5f);
    }
    expect_close(read_buffer<float>(ob, n * rows), want, 1e-6f, 1e-5f, "rms_norm");
}

// A model's RoPE table (llama_weights::rope_freq) and its device copy.
struct test_rope {
    std::vector<double> freq;
    buffer table;
    rope_table view() const { return {whole(table), std::uint32_t(2 * freq.size())}; }
};

test_rope make_rope(std::uint32_t n_rot, float base, std::span<const float> factors = {},
                    float scale = 1.0f) {
    model::llama_hparams hp;
    hp.n_rot = n_rot;
    hp.rope_freq_base = base;
    hp.rope_scale_linear = scale;
    test_rope r;
    r.freq = model::rope_frequencies(hp, factors);
    r.table = make_buffer(rope_turns_table(r.freq));
    return r;
}

// Long positions, Llama 3.1 factors and linear scaling: see the header. head_dim 128, n_rot 128,
// base 500000 (Llama 3), factors from 1 to 32 across the pairs, linear scale 2; q and k heads
// (GQA 2:1) through both rope paths, and model::rope, against the long-double rotation.
TEST(GpuKernels, RopeLongPositionsWithFactorsAndLinearScaling) {
    ORDO_REQUIRE_GPU();
    const std::uint32_t n_head = 2, n_kv = 1, hd = 128, n_rot = 128, bt = 4, n_blocks = 2;
    const std::uint32_t width = (n_head + 2 * n_kv) * hd, stride = width;
    const std::vector<std::int32_t> pos = {8191, 65535, 131071, (1 << 24) - 1};
    const auto tokens = static_cast<std::uint32_t>(pos.size());
    const float base = 500000.0f, scale = 2.0f;
    std::vector<float> factors(n_rot / 2);
    for (std::size_t j = 0; j < factors.size(); ++j) factors[j] = 1.0f + 31.0f * j / 63.0f;
    test_rope rope = make_rope(n_rot, base, factors, scale);
    auto x = random_floats(std::size_t(stride) * tokens, 77);

    // The oracle: every rotated head of token t, from the formula, in long double.
    std::vector<float> want = x;
    for (std::uint32_t t = 0; t < tokens; ++t) {
        for (std::uint32_t h = 0; h < n_head + n_kv; ++h) {
            float* v = want.data() + std::size_t(t) * stride + h * hd;
            for (std::uint32_t j = 0; j < n_rot / 2; ++j) {
                long double f = std::pow(static_cast<long double>(base), -2.0L * j / n_rot) /
                                factors[j] / scale;
                long double a = static_cast<long double>(pos[t]) * f;
                long double c = std::cos(a), sn = std::sin(a), x0 = v[2 * j], x1 = v[2 * j + 1];
                v[2 * j] = static_cast<float>(x0 * c - x1 * sn);
                v[2 * j + 1] = static_cast<float>(x0 * sn + x1 * c);
            }
        }
    }
    auto q_and_k = [&](const std::vector<float>& rows) {
        std::vector<float> out;
        for (std::uint32_t t = 0; t < tokens; ++t) {
            auto row = rows.begin() + std::size_t(t) * stride;
            out.insert(out.end(), row, row + (n_head + n_kv) * hd);
        }
        return out;
    };

    // model::rope from the table.
    std::vector<float> cpu = x;
    for (std::uint32_t t = 0; t < tokens; ++t) {
        model::rope(cpu.data() + std::size_t(t) * stride, n_head + n_kv, hd, rope.freq, pos[t]);
    }
    expect_close(q_and_k(cpu), q_and_k(want), 5e-6f, 5e-6f, "model::rope");

    // encode_rope_kv, both paths: q in place, k into the pool (an F32 pool: the values as
    // computed), token t in slot t.
    const std::uint32_t width_q = n_head * hd, width_k = n_kv * hd;
    for (bool texel : {true, false}) {
        SCOPED_TRACE(texel ? "rope_kv texel" : "rope_kv storage");
        pipeline_tuning tuning = tuning_for(env().dev->info());
        tuning.prefer_texel_kernels = texel;
        auto pipes = pipelines::create(*env().dev, tuning);
        ASSERT_TRUE(pipes.ok()) << pipes.err().message;
        auto str = stream::create(*env().dev, **pipes, {64, false});
        ASSERT_TRUE(str.ok()) << str.err().message;
        auto pool = kv_pool::create(*env().dev, {1, n_kv, hd, bt, n_blocks, false});
        ASSERT_TRUE(pool.ok()) << pool.err().message;
        std::vector<std::int32_t> ints(2 * tokens);
        std::copy(pos.begin(), pos.end(), ints.begin());
        for (std::uint32_t t = 0; t < tokens; ++t) ints[tokens + t] = static_cast<std::int32_t>(t);
        buffer qb = make_buffer(x), ib = make_buffer(ints);
        ASSERT_TRUE((*str)->begin("rope_kv long").ok());
        status st = encode_rope_kv(**str, **pool, 0, {whole(qb), 0, stride}, {whole(ib), 0},
                                   {whole(ib), tokens}, rope.view(), tokens, n_head);
        ASSERT_TRUE(st.ok()) << st.err().message;
        st = (*str)->run(test_watchdog_ms);
        ASSERT_TRUE(st.ok()) << st.err().message;
        auto got = read_buffer<float>(qb, x.size());
        std::vector<float> pool_k(std::size_t(n_blocks) * bt * width_k);
        ASSERT_TRUE(
            env()
                .dev
                ->read(*(*pool)->k(0).buf, (*pool)->k(0).offset, pool_k.data(), pool_k.size() * 4)
                .ok());
        std::vector<float> got_qk, want_qk;
        for (std::uint32_t t = 0; t < tokens; ++t) {
            auto row = [&](const std::vector<float>& v) {
                return v.begin() + std::size_t(t) * stride;
            };
            got_qk.insert(got_qk.end(), row(got), row(got) + width_q);
            // block t / bt, slot t % bt, one kv head: the slot's row is element t * hd on.
            got_qk.insert(got_qk.end(), pool_k.begin() + std::size_t(t) * hd,
                          pool_k.begin() + std::size_t(t) * hd + width_k);
            want_qk.insert(want_qk.end(), row(want), row(want) + width_q + width_k);
        }
        expect_close(got_qk, want_qk, 5e-6f, 5e-6f, "q and pool k");
    }
}

// rope_kv: q and k rotated, q written back, k and v stored into the token's pool slot, through
// both paths (rope_kv_tx, and rope_kv where texel kernels are not preferred), each one dispatch.
void check_rope_kv(stream& str, bool f16, bool texel) {
    SCOPED_TRACE(std::string(f16 ? "f16 pool" : "f32 pool") + (texel ? " texel" : " storage"));
    // GQA (6 q heads, 2 kv heads); n_rot % 4 == 2 rotates half of one texel; token 2 skips
    // its store (slot -1); slots in several blocks, out of order.
    const std::uint32_t n_head = 6, n_kv = 2, hd = 48, n_rot = 30, bt = 4, n_blocks = 7;
    const std::uint32_t tokens = 5, width = (n_head + 2 * n_kv) * hd, stride = width + 4;
    const std::vector<std::int32_t> pos = {0, 1, 17, 300, 9}, slots = {23, 0, -1, 13, 6};
    std::vector<std::int32_t> ints(16, 0);
    std::copy(pos.begin(), pos.end(), ints.begin());
    std::copy(slots.begin(), slots.end(), ints.begin() + 8);
    auto x = random_floats(std::size_t(stride) * tokens + 8, 41);
    buffer xb = make_buffer(x), ib = make_buffer(ints);
    auto pool = kv_pool::create(*env().dev, {2, n_kv, hd, bt, n_blocks, f16});
    ASSERT_TRUE(pool.ok()) << pool.err().message;
    ASSERT_TRUE((*pool)->clear().ok());
    ASSERT_TRUE(str.begin("rope_kv").ok());
    test_rope rope = make_rope(n_rot, 10000.0f);
    status st = encode_rope_kv(str, **pool, 1, {whole(xb), 4, stride}, {whole(ib), 0},
                               {whole(ib), 8}, rope.view(), tokens, n_head);
    ASSERT_TRUE(st.ok()) << st.err().message;
    st = str.run(test_watchdog_ms);
    ASSERT_TRUE(st.ok()) << st.err().message;
    if (env().dev->info().timestamps) {  // one dispatch either way
        ASSERT_EQ(str.timings().size(), 1u);
        EXPECT_EQ(pipeline_name(str.timings()[0].id),
                  std::string(texel ? "rope_kv_tx_" : "rope_kv_") + (f16 ? "f16" : "f32"));
    }

    auto got = read_buffer<float>(xb, x.size());
    std::vector<float> want_q, got_q;
    const std::size_t pool_elems = std::size_t(n_blocks) * n_kv * bt * hd;
    std::vector<float> want_k(pool_elems, 0.0f), want_v(pool_elems, 0.0f);
    for (std::uint32_t t = 0; t < tokens; ++t) {
        std::vector<float> row(x.begin() + 4 + t * stride, x.begin() + 4 + t * stride + width);
        model::rope(row.data(), n_head + n_kv, hd, rope.freq, pos[t]);  // q and k heads
        want_q.insert(want_q.end(), row.begin(), row.begin() + n_head * hd);
        got_q.insert(got_q.end(), got.begin() + 4 + t * stride,
                     got.begin() + 4 + t * stride + n_head * hd);
        if (slots[t] < 0) continue;
        std::uint32_t block = slots[t] / bt, in_block = slots[t] % bt;
        for (std::uint32_t h = 0; h < n_kv; ++h) {
            for (std::uint32_t d = 0; d < hd; ++d) {
                std::size_t o = ((std::size_t(block) * n_kv + h) * bt + in_block) * hd + d;
                want_k[o] = row[(n_head + h) * hd + d];
                want_v[o] = row[(n_head + n_kv + h) * hd + d];
            }
        }
    }
    expect_close(got_q, want_q, 2e-5f, 1e-4f, "q");
    auto read_pool = [&](buffer_view v) {
        std::vector<float> out(pool_elems);
        if (f16) {
            std::vector<std::uint16_t> h(pool_elems);
            EXPECT_TRUE(env().dev->read(*v.buf, v.offset, h.data(), h.size() * 2).ok());
            for (std::size_t i = 0; i < h.size(); ++i) out[i] = model::f16_to_f32(h[i]);
        } else {
            EXPECT_TRUE(env().dev->read(*v.buf, v.offset, out.data(), out.size() * 4).ok());
        }
        return out;
    };
    // An F16 pool holds the values rounded to half: within half an f16 ulp (2^-11 relative).
    float tol = f16 ? 5e-4f : 1e-4f;
    expect_close(read_pool((*pool)->k(1)), want_k, 2e-5f, tol, "pool K");
    expect_close(read_pool((*pool)->v(1)), want_v, 2e-5f, tol, "pool V");
}

TEST(GpuKernels, RopeKvBothPathsBothPools) {
    ORDO_REQUIRE_GPU();
    for (bool texel : {true, false}) {
        pipeline_tuning tuning = tuning_for(env().dev->info());
        tuning.prefer_texel_kernels = texel;
        auto pipes = pipelines::create(*env().dev, tuning);
        ASSERT_TRUE(pipes.ok()) << pipes.err().message;
        // Timestamps (where the device has them) name the dispatched kernels.
        auto str = stream::create(*env().dev, **pipes, {64, env().dev->info().timestamps});
        ASSERT_TRUE(str.ok()) << str.err().message;
        for (bool f16 : {true, false}) check_rope_kv(**str, f16, texel);
    }
}

TEST(GpuKernels, SwigluAndAdd) {
    ORDO_REQUIRE_GPU();
    const std::uint32_t n = 777, rows = 3;
    auto g = random_floats(n * rows, 4, 4.0f), u = random_floats(n * rows, 5, 2.0f);
    buffer gb = make_buffer(g), ub = make_buffer(u), ob = make_buffer(std::vector<float>(n * rows));
    ASSERT_TRUE(env().str->begin("swiglu+add").ok());
    ASSERT_TRUE(
        encode_swiglu(*env().str, {whole(gb), 0, n}, {whole(ub), 0, n}, {whole(ob), 0, n}, n, rows)
            .ok());
    ASSERT_TRUE(
        encode_add(*env().str, {whole(ob), 0, n}, {whole(ub), 0, n}, {whole(gb), 0, n}, n, rows)
            .ok());
    run_segment("swiglu+add");
    std::vector<float> act(n * rows), sum(n * rows);
    model::swiglu(act.data(), g.data(), u.data(), n * rows);
    sum = act;
    model::add_inplace(sum.data(), u.data(), n * rows);
    expect_close(read_buffer<float>(ob, n * rows), act, 1e-6f, 1e-5f, "swiglu");
    expect_close(read_buffer<float>(gb, n * rows), sum, 1e-6f, 1e-5f, "add");
}

TEST(GpuKernels, BadShapesAreErrorsNotDispatches) {
    ORDO_REQUIRE_GPU();
    std::vector<std::uint8_t> bytes(100 * 4 * 10);
    arena mem(*env().dev, 1u << 16);
    auto odd = upload_weight(*env().dev, mem, ggml_type::f32, 100, 10, bytes);
    ASSERT_FALSE(odd.ok());
    EXPECT_EQ(odd.err().code, "gpu_bad_shape");
    auto wrong = upload_weight(*env().dev, mem, ggml_type::q8_0, 64, 10, bytes);
    ASSERT_FALSE(wrong.ok());
    auto unsupported = upload_weight(*env().dev, mem, ggml_type::iq2_xxs, 256, 1, bytes);
    ASSERT_FALSE(unsupported.ok());
    EXPECT_EQ(unsupported.err().code, "gpu_unsupported_type");
    // Rows that are not whole blocks (K types: super-blocks of 256; the others: 32 or 8).
    for (auto [type, n_in] : {std::pair{ggml_type::q4_k, 128u},
                              {ggml_type::q6_k, 288u},
                              {ggml_type::q2_k, 32u},
                              {ggml_type::q5_0, 48u},
                              {ggml_type::bf16, 12u}}) {
        auto r = upload_weight(*env().dev, mem, type, n_in, 2, bytes);
        ASSERT_FALSE(r.ok()) << model::type_name(type);
        EXPECT_EQ(r.err().code, "gpu_bad_shape") << model::type_name(type);
        EXPECT_NE(r.err().message.find("multiple of " + std::to_string(row_multiple(type))),
                  std::string::npos)
            << r.err().message;
    }

    host_weight hw = make_weight(ggml_type::f32, 64, 16, 1);
    auto w = upload_weight(*env().dev, mem, ggml_type::f32, 64, 16, hw.bytes);
    ASSERT_TRUE(w.ok());
    buffer small = make_buffer(std::vector<float>(64));
    ASSERT_TRUE(env().str->begin("bad").ok());
    std::uint32_t before = env().str->dispatches();
    // y needs 2 x 16 floats but the binding holds 64 floats only for x of 2 tokens: too small.
    status s =
        encode_mul_mat(*env().str, *w, {whole(small), 0, 64}, {whole(small), 0, 16}, 2, false);
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(env().str->dispatches(), before);
    // rope_kv (one q head, one kv head of 16): n_rot 9 (odd), then a table shorter than n_rot /
    // 2 pairs, then rows past their binding (2 tokens of 48 floats at stride 64).
    auto pool = kv_pool::create(*env().dev, {1, 1, 16, 4, 1, false});
    ASSERT_TRUE(pool.ok()) << pool.err().message;
    auto rope_kv = [&](rope_table table, std::uint32_t tokens) {
        return encode_rope_kv(*env().str, **pool, 0, {whole(small), 0, 64}, {whole(small), 0},
                              {whole(small), 0}, table, tokens, 1);
    };
    EXPECT_FALSE(rope_kv({whole(small), 9}, 1).ok());
    EXPECT_FALSE(rope_kv({{&small, 0, 8 * 8 - 4}, 8}, 1).ok());
    EXPECT_TRUE(rope_kv({whole(small), 8}, 1).ok());  // the shape that fits: one dispatch
    EXPECT_FALSE(rope_kv({whole(small), 8}, 2).ok());
    EXPECT_EQ(env().str->dispatches(), before + 1);
    run_segment("bad (one rope_kv)");
}

// A device that ends long loops early (llvmpipe: 65535 iterations per invocation) gets a clear
// refusal for attention over more positions than its loops can walk, on both kernels, instead
// of an output computed over a silent prefix; a sequence within the bound is accepted, and
// attention_positions_max (the context the runner clamps to) is exactly the automatic path's
// bound.
TEST(GpuKernels, AttentionBeyondTheDeviceLoopCapIsRefused) {
    ORDO_REQUIRE_GPU();
    const std::uint32_t cap = env().dev->info().loop_iterations_max;
    if (cap == 0) GTEST_SKIP() << "this device has no known loop-iteration cap";
    const std::uint32_t block_tokens = 16, heads = 2, hd = 64;
    auto pool = kv_pool::create(*env().dev, {1, heads, hd, block_tokens, 4, true});
    ASSERT_TRUE(pool.ok()) << pool.err().message;
    // Far past either kernel's bound (attention_tx walks positions / subgroup keys per lane).
    const std::uint32_t long_blocks = 4u * cap / block_tokens * 8u;
    buffer tables = make_buffer(std::vector<std::int32_t>(long_blocks, 0));
    buffer tokens = make_buffer(std::vector<std::int32_t>{0, 5});
    buffer q = make_buffer(std::vector<float>(heads * hd)),
           out = make_buffer(std::vector<float>(heads * hd));
    for (attention_path path : {attention_path::automatic, attention_path::classic}) {
        for (std::uint32_t blocks : {long_blocks, 8u}) {
            ASSERT_TRUE(env().str->begin("attention cap").ok());
            std::uint32_t before = env().str->dispatches();
            attention_batch b{{whole(q), 0, heads * hd},
                              {whole(out), 0, heads * hd},
                              {whole(tokens), 0},
                              {whole(tables), 0},
                              1,
                              1,
                              blocks,
                              heads};
            status s = encode_attention(*env().str, **pool, 0, b, path);
            if (blocks == long_blocks) {
                ASSERT_FALSE(s.ok());
                EXPECT_NE(s.err().message.find("loop iterations"), std::string::npos)
                    << s.err().message;
                EXPECT_EQ(env().str->dispatches(), before);
            } else {
                EXPECT_TRUE(s.ok()) << s.err().message;
            }
            run_segment("attention cap");
        }
    }
    const std::uint64_t most = attention_positions_max(*env().pipes, (*pool)->geometry());
    ASSERT_GT(most, 0u);
    EXPECT_EQ(most % block_tokens, 0u);
    ASSERT_LT(most / block_tokens + 1, long_blocks);
    for (std::uint64_t blocks : {most / block_tokens, most / block_tokens + 1}) {
        ASSERT_TRUE(env().str->begin("attention bound").ok());
        attention_batch b{{whole(q), 0, heads * hd},
                          {whole(out), 0, heads * hd},
                          {whole(tokens), 0},
                          {whole(tables), 0},
                          1,
                          1,
                          static_cast<std::uint32_t>(blocks),
                          heads};
        status s = encode_attention(*env().str, **pool, 0, b);
        EXPECT_EQ(s.ok(), blocks * block_tokens <= most) << blocks << " blocks";
        run_segment("attention bound");
    }
}

}  // namespace
}  // namespace ordo::gpu::testing
