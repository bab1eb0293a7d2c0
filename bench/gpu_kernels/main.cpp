// main.cpp (ordo-bench-kernels): measures the ordo_gpu kernels on the chosen Vulkan device and
// prints one JSON line per measurement: mat-vec (decode) GB/s of weight bytes read, mat-mat
// (prefill) GFLOP/s, for each weight type at the shapes of the small and medium models,
// plus paged attention. Times come from GPU timestamp queries (the per-dispatch time, not the
// submission overhead) and, separately, the wall time of submit + fence wait per segment.
// Usage: ordo-bench-kernels [--device SELECTOR] [--reps N] [--tx-wg LANES] [--no-texel | --texel]
//                           [--rows] [--steps] [--prefill] [--dispatch-cost] [--types LIST]
//                           [--prefill-1b] [--attention auto|classic|flash] (and below)
//   --types f16,q4_k,...: the weight types of the default suite (default f32,f16,q8_0,q4_0); a
//   shape whose rows are not whole blocks of a type (288 for the K types) is skipped for it.
//   --type-compare: only the medium ffn shapes (768x2048, 2048x768) at 1, 4 and 128 tokens
//   (tx1, tx1t4, txm on lavapipe) for each of --types: the per-type comparison of gpu/PERF.md.
//   --prefill measures only the prefill mat-muls of one layer of the small and medium models.
//   --dispatch-cost measures the fixed wall cost of one small dispatch (with/without timestamps).
//   --tx-wg overrides the mul_mat_tx tx4/txm workgroup size, --no-texel measures the storage-buffer
//   kernels that automatic picks without texel views (the "before" numbers of gpu/PERF.md),
//   --texel picks the texel kernels on a GPU too (where automatic would not), --rows the
//   row-per-lane mul_mat_rows for up to 8 tokens in the storage family (the lavapipe choice;
//   a GPU picks it for one token only),
//   --steps measures only the F16 medium-model shapes at decode-step token counts 1..32 and
//   prefill 128/512 (the multi-sequence decode cost of issue 5, gpu/PERF.md).
//   --decode measures the mat-muls of one decode step of the Llama-3.2-1B shape (fused q|k|v,
//   o, fused gate|up, down: 16 copies each, one per layer, so the weights stream from device
//   memory rather than L2; the 128256-row head) at 1, 2, 4 and 8 tokens for each of --types
//   (default f16,q4_k), with a "step" line per type and token count: the whole step's mat-muls
//   and their GB/s (issue 28), then decode attention of the 1B shape at contexts 512 and 4096
//   with and without flash decoding ("split"). With --fused, q|k|v and gate|up run as the runner's
//   decode runs them on a GPU: mul_mat_vec_norm (the attention norm folded in) and mul_mat_vec_glu
//   (the FFN norm and SwiGLU folded in), so their lines include the fused work.
//   --crossover times the same step's mat-muls (unfused, 16 copies of each layer shape, or
//   --copies N) on mul_mat_vec and on the tiled mul_mat at 2 to 64 tokens for each of --types
//   (default f16,q4_k): one line per type and token count with both times, then the
//   "crossover_tokens" line: the most tokens up to which mul_mat_vec is at least as fast at
//   every count measured (issue 29: batched decode picks the kernel by a measured crossover;
//   today it is the constant mat_vec_tokens_max = 8). Both kernels sum in one order, so the
//   choice never changes a bit.
//   --prefill-1b times the layer's attention (32 heads over 8 KV heads) for 128- and 512-token
//   prompts on attention.comp and attention_flash and for a 64-sequence decode step at context
//   512 on attention.comp and automatic's choice (attention.comp too, unless
//   --attention-token-tiles turns on pipeline_tuning::attention_token_tiles: attention_flash, a
//   tile per token's query heads), then the tiled mul_mat over one 1B layer's
//   mat-muls at 16..512 tokens per type (TFLOP/s); --mm-rl N / --mm-tl N set its outputs per
//   lane (rows, tokens: 4 or 8); --mm-swizzle 0|1, --mm-k-step 32|64, --mm-tokens-first 0|1
//   --mm-row-stage 0|1 and --mm-narrow 0|1 its layout (pipeline_tuning::mat_tiled_swizzle,
//   _k_step, _tokens_first, _row_staging, _narrow). --attention auto|classic|flash: the path of the
//   other attention lines (after --no-texel, which sets classic).
//   --coop 0|1|emulated runs the tiled steps on cooperative matrices (pipeline_tuning::
//   mat_coop: mul_mat_cm, gpu.batch_invariant = false's kernel; emulated: mul_mat_cme, its
//   plain-GLSL stand-in, on any device); --coop-wide R,M,N / --coop-narrow R,M,N its tiles
//   (subgroup rows, fragment rows and tokens per subgroup: mat_coop_shape) and --coop-split-wg N
//   its split threshold. Its tiled lines say "coop" and the tile that ran.
//   --mm-split-wg N sets the tiled kernel's group split threshold (pipeline_tuning::
//   mat_tiled_split_wg; 0: never split), for the A/B of the crossover and prefill lines.
//   --decode-attention times only decode attention of one 1B layer (32 heads over 8 KV heads)
//   as the runner runs it, one sequence at contexts 16..4096 and 64 at 64 and 512;
//   --attn-k-pairs N / --attn-v-group N set attention.comp's load groups (pipeline_tuning::
//   attention_k_pairs, attention_v_group: K pairs and V keys a lane loads before using them;
//   no bit depends on them), on every attention line.
//   --mmv-wg LANES / --mmv-rows N / --mmv-unroll N / --mmv-block-unroll N override
//   mul_mat_vec's workgroup lanes (a multiple of 8), rows per team and units loaded per lane
//   before summing (F32/F16/BF16; the block types); --mmv-split N /
//   --mmv-split-cols N its lanes per group (helpers) and the token counts that use them.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "gpu/vk/kernels.hpp"
#include "gpu/vk/kv_pool.hpp"
#include "gpu/vk/weights.hpp"
#include "model/quant.hpp"

using namespace ordo;
using namespace ordo::gpu;

namespace {

constexpr std::uint64_t watchdog_ms = 600'000;
constexpr std::uint32_t reps_max = 1000;

struct bench_env {
    std::unique_ptr<device> dev;
    std::unique_ptr<pipelines> pipes;
    std::unique_ptr<stream> str;
    buffer split_scratch;  // the tiled mat-mul's group split (str's mat_split_scratch)
    // With --coop: the invariant kernels (the device's tuning without mat_coop), whose outputs
    // the cooperative-matrix lines are checked against.
    std::unique_ptr<pipelines> ref_pipes;
    std::unique_ptr<stream> ref_str;
    std::uint32_t reps = 5;
    attention_path attention = attention_path::automatic;
};

buffer filled(bench_env& e, std::size_t n_floats, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> v(n_floats);
    for (float& x : v) x = u(rng);
    auto b = e.dev->create_buffer(n_floats * 4, memory_use::device);
    if (!b || !e.dev->write(*b, 0, v.data(), v.size() * 4)) {
        std::fprintf(stderr, "buffer allocation failed\n");
        std::exit(1);
    }
    return std::move(*b);
}

// A random weight's GGUF bytes (rows quantized from uniform [-1, 1) floats).
std::vector<std::uint8_t> weight_bytes(model::ggml_type type, std::uint32_t n_in,
                                       std::uint32_t n_out) {
    std::mt19937 rng(n_in + n_out);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::size_t rb = model::row_bytes(type, n_in);
    std::vector<std::uint8_t> bytes(rb * n_out);
    std::vector<float> row(n_in);
    for (std::uint32_t r = 0; r < n_out; ++r) {
        for (float& x : row) x = u(rng);
        (void)model::quantize_row(type, row.data(), bytes.data() + r * rb, n_in);
    }
    return bytes;
}

weight_tensor upload(bench_env& e, arena& mem, model::ggml_type type, std::uint32_t n_in,
                     std::uint32_t n_out, const std::vector<std::uint8_t>& bytes) {
    auto w = upload_weight(*e.dev, mem, type, n_in, n_out, bytes);
    if (!w) {
        std::fprintf(stderr, "upload failed: %s\n", w.err().message.c_str());
        std::exit(1);
    }
    return std::move(*w);
}

weight_tensor make_weight(bench_env& e, arena& mem, model::ggml_type type, std::uint32_t n_in,
                          std::uint32_t n_out) {
    return upload(e, mem, type, n_in, n_out, weight_bytes(type, n_in, n_out));
}

// Runs `record` reps times, each as one timed segment; returns the best GPU time (ms) of the
// dispatches recorded and the best wall time of the segment.
template <typename F>
std::pair<double, double> time_best(bench_env& e, const char* label, F&& record) {
    double gpu_best = 1e30, wall_best = 1e30;
    for (std::uint32_t r = 0; r < e.reps; ++r) {
        if (!e.str->begin(label)) std::exit(1);
        record();
        auto t0 = std::chrono::steady_clock::now();
        status s = e.str->run(watchdog_ms);
        auto t1 = std::chrono::steady_clock::now();
        if (!s) {
            std::fprintf(stderr, "%s: %s\n", label, s.err().message.c_str());
            std::exit(1);
        }
        double gpu = 0.0;
        for (const auto& t : e.str->timings()) gpu += t.ms;
        gpu_best = std::min(gpu_best, gpu);
        wall_best = std::min(wall_best, std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    return {gpu_best, wall_best};
}

// Times `w` at n_tokens and prints its line; returns the best GPU ms.
double time_mul_mat(bench_env& e, const weight_tensor& w, std::uint32_t n_tokens,
                    const char* shape) {
    const std::uint32_t n_in = w.n_in, n_out = w.n_out;
    buffer x = filled(e, std::size_t(n_in) * n_tokens, 1);
    buffer y = filled(e, std::size_t(n_out) * n_tokens, 2);
    std::string kernel;
    auto [gpu_ms, wall_ms] = time_best(e, "mul_mat", [&] {
        status s =
            encode_mul_mat(*e.str, w, {whole(x), 0, n_in}, {whole(y), 0, n_out}, n_tokens, false);
        if (!s) std::exit(1);
    });
    if (!e.str->timings().empty()) kernel = pipeline_name(e.str->timings()[0].id);
    double bytes = static_cast<double>(packed_bytes(w.type, n_in, n_out));
    double flops = 2.0 * n_in * n_out * n_tokens;
    std::printf(
        "{\"kernel\":\"%s\",\"type\":\"%s\",\"shape\":\"%s\",\"n_in\":%u,\"n_out\":%u,"
        "\"tokens\":%u,\"gpu_ms\":%.4f,\"wall_ms\":%.4f,\"weight_GBps\":%.2f,"
        "\"GFLOPs\":%.2f}\n",
        kernel.c_str(), std::string(model::type_name(w.type)).c_str(), shape, n_in, n_out, n_tokens,
        gpu_ms, wall_ms, bytes / gpu_ms * 1e-6, flops / gpu_ms * 1e-6);
    std::fflush(stdout);
    return gpu_ms;
}

arena weight_arena(bench_env& e, model::ggml_type type, std::uint32_t n_in, std::uint32_t n_out) {
    return arena(*e.dev, std::min<std::uint64_t>(e.dev->info().max_storage_buffer_range,
                                                 packed_bytes(type, n_in, n_out) + 4096));
}

// `count` copies of one layer shape's weights, each in its own arena, so that a segment running
// all of them streams the weights from device memory instead of a cache.
struct weight_copies {
    std::deque<arena> mems;
    std::vector<weight_tensor> ws;
};
weight_copies upload_copies(bench_env& e, model::ggml_type type, std::uint32_t n_in,
                            std::uint32_t n_out, std::uint32_t count) {
    weight_copies out;
    const auto host = weight_bytes(type, n_in, n_out);
    for (std::uint32_t c = 0; c < count; ++c) {
        out.mems.push_back(weight_arena(e, type, n_in, n_out));
        out.ws.push_back(upload(e, out.mems.back(), type, n_in, n_out, host));
    }
    return out;
}

void bench_mul_mat(bench_env& e, model::ggml_type type, std::uint32_t n_in, std::uint32_t n_out,
                   std::uint32_t n_tokens, const char* shape) {
    if (n_in % row_multiple(type) != 0) return;  // not whole blocks of this type
    arena mem = weight_arena(e, type, n_in, n_out);
    weight_tensor w = make_weight(e, mem, type, n_in, n_out);
    time_mul_mat(e, w, n_tokens, shape);
}

void bench_attention(bench_env& e, std::uint32_t n_head, std::uint32_t head_dim, std::uint32_t ctx,
                     std::uint32_t n_seqs, std::uint32_t tokens_per_seq, bool split = false,
                     std::uint32_t n_head_kv = 0);

// One decode step's mat-muls of the Llama-3.2-1B shape (2048 wide, 16 layers, 8 KV heads of
// 64, ffn 8192, vocab 128256), fused as the runner fuses them. Each layer shape is uploaded 16
// times (one copy per layer) and timed as one segment of 16 dispatches, so the weights stream
// from device memory as in a real step instead of staying in a 50 MB L2 cache.
void bench_decode(bench_env& e, const std::vector<model::ggml_type>& types, bool fused) {
    struct shape {
        std::uint32_t n_in, n_out, copies;
        const char* name;
        mat_fusion f;
    };
    const shape shapes[] = {{2048, 3072, 16, "1b qkv x16", mat_fusion::norm},
                            {2048, 2048, 16, "1b o x16", mat_fusion::none},
                            {2048, 16384, 16, "1b gate_up x16", mat_fusion::glu},
                            {8192, 2048, 16, "1b down x16", mat_fusion::none},
                            {2048, 128256, 1, "1b output", mat_fusion::none}};
    constexpr std::uint32_t token_counts[] = {1, 2, 4, 8};
    for (model::ggml_type t : types) {
        double ms[4] = {}, bytes = 0.0;
        for (const shape& s : shapes) {
            const weight_copies copies = upload_copies(e, t, s.n_in, s.n_out, s.copies);
            const std::vector<weight_tensor>& ws = copies.ws;
            for (std::size_t i = 0; i < 4; ++i) {
                const std::uint32_t n = token_counts[i];
                buffer x = filled(e, std::size_t(s.n_in) * n, 1);
                buffer y = filled(e, std::size_t(s.n_out) * n, 2);
                buffer nw = filled(e, s.n_in, 3), xn = filled(e, std::size_t(s.n_in) * n, 4);
                buffer hid = filled(e, std::size_t(s.n_out / 2) * n, 5);
                const norm_input in{
                    {whole(x), 0, s.n_in}, whole(nw), s.n_in, 1e-5f, {whole(xn), 0, s.n_in}};
                const mat_fusion f = fused ? s.f : mat_fusion::none;
                auto [gpu_ms, wall_ms] = time_best(e, "mul_mat", [&] {
                    for (const weight_tensor& w : ws) {
                        rows_view yv{whole(y), 0, s.n_out};
                        status st;
                        if (f == mat_fusion::norm) {
                            st = encode_norm_mul_mat(*e.str, w, in, yv, n);
                        } else if (f == mat_fusion::glu) {
                            st = encode_norm_glu(*e.str, w, in, yv, {whole(hid), 0, s.n_out / 2},
                                                 s.n_out / 2, n);
                        } else {
                            st = encode_mul_mat(*e.str, w, {whole(x), 0, s.n_in}, yv, n, false);
                        }
                        if (!st) std::exit(1);
                    }
                });
                std::string kernel = e.str->timings().empty()
                                         ? "?"
                                         : std::string(pipeline_name(e.str->timings()[0].id));
                double b = static_cast<double>(packed_bytes(t, s.n_in, s.n_out)) * s.copies;
                std::printf(
                    "{\"kernel\":\"%s\",\"type\":\"%s\",\"shape\":\"%s\",\"tokens\":%u,"
                    "\"gpu_ms\":%.4f,\"wall_ms\":%.4f,\"weight_GBps\":%.2f}\n",
                    kernel.c_str(), std::string(model::type_name(t)).c_str(), s.name, n, gpu_ms,
                    wall_ms, b / gpu_ms * 1e-6);
                ms[i] += gpu_ms;
            }
            bytes += static_cast<double>(packed_bytes(t, s.n_in, s.n_out)) * s.copies;
        }
        for (std::size_t i = 0; i < 4; ++i) {
            std::printf(
                "{\"step\":\"1b decode mat-muls\",\"type\":\"%s\",\"tokens\":%u,"
                "\"gpu_ms\":%.4f,\"weight_GBps\":%.2f}\n",
                std::string(model::type_name(t)).c_str(), token_counts[i], ms[i],
                bytes / ms[i] * 1e-6);
        }
        std::fflush(stdout);
    }
    // Decode attention of the 1B shape (32 heads of 64; the bench's pool has as many KV heads)
    // at long contexts, one workgroup per head and token against flash decoding.
    for (std::uint32_t ctx : {512u, 4096u}) {
        for (bool split : {false, true}) bench_attention(e, 32, 64, ctx, 1, 1, split);
    }
}

// Decode attention of one 1B layer (32 query heads over 8 KV heads of 64) as the runner runs it
// (flash decoding's splits from the context): one sequence at the short contexts a served
// stream decodes at and the long ones, and 64 sequences at 64 and 512 (--decode-attention).
void bench_decode_attention(bench_env& e) {
    for (std::uint32_t ctx : {16u, 64u, 128u, 512u, 4096u}) {
        bench_attention(e, 32, 64, ctx, 1, 1, true, 8);
    }
    for (std::uint32_t ctx : {64u, 512u}) bench_attention(e, 32, 64, ctx, 64, 1, true, 8);
}

// mul_mat_vec against the tiled mul_mat over one decode step's mat-muls of the 1B shape
// (unfused) at 8..64 tokens, per type; prints both and the crossover (--crossover).
void bench_crossover(bench_env& e, const std::vector<model::ggml_type>& types,
                     std::uint32_t copies) {
    struct shape {
        std::uint32_t n_in, n_out, copies;
        const char* name;
    };
    const shape shapes[] = {{2048, 3072, copies, "1b qkv"},
                            {2048, 2048, copies, "1b o"},
                            {2048, 16384, copies, "1b gate_up"},
                            {8192, 2048, copies, "1b down"},
                            {2048, 128256, 1, "1b output"}};
    constexpr std::uint32_t token_counts[] = {2, 4, 8, 12, 16, 24, 32, 48, 64};
    constexpr std::size_t n_counts = std::size(token_counts);
    for (model::ggml_type t : types) {
        double vec_ms[n_counts] = {}, tiled_ms[n_counts] = {};
        for (const shape& s : shapes) {
            const weight_copies copies = upload_copies(e, t, s.n_in, s.n_out, s.copies);
            const std::vector<weight_tensor>& ws = copies.ws;
            for (std::size_t i = 0; i < n_counts; ++i) {
                const std::uint32_t n = token_counts[i];
                buffer x = filled(e, std::size_t(s.n_in) * n, 1);
                buffer y = filled(e, std::size_t(s.n_out) * n, 2);
                for (mat_path path : {mat_path::vec, mat_path::tiled}) {
                    auto [gpu_ms, wall_ms] = time_best(e, "mul_mat", [&] {
                        for (const weight_tensor& w : ws) {
                            status st = encode_mul_mat(*e.str, w, {whole(x), 0, s.n_in},
                                                       {whole(y), 0, s.n_out}, n, false, path);
                            if (!st) {
                                std::fprintf(stderr, "%s\n", st.err().message.c_str());
                                std::exit(1);
                            }
                        }
                    });
                    (path == mat_path::vec ? vec_ms : tiled_ms)[i] += gpu_ms;
                    (void)wall_ms;
                }
            }
        }
        std::uint32_t crossover = 0;
        for (std::size_t i = 0; i < n_counts && vec_ms[i] <= tiled_ms[i]; ++i) {
            crossover = token_counts[i];
        }
        for (std::size_t i = 0; i < n_counts; ++i) {
            std::printf(
                "{\"crossover\":\"1b decode mat-muls\",\"type\":\"%s\",\"tokens\":%u,"
                "\"vec_ms\":%.4f,\"tiled_ms\":%.4f}\n",
                std::string(model::type_name(t)).c_str(), token_counts[i], vec_ms[i], tiled_ms[i]);
        }
        std::printf("{\"crossover_tokens\":%u,\"type\":\"%s\",\"copies\":%u}\n", crossover,
                    std::string(model::type_name(t)).c_str(), copies);
        std::fflush(stdout);
    }
}

// The tiled mul_mat (as automatic runs it past mat_vec_tokens_max: the group split where the
// tuning asks) over one layer of the 1B shape (q|k|v, o, gate|up, down; one copy each) at 16,
// 64, 128 and 512 tokens, per type: ms and TFLOP/s of the layer (--prefill-1b), for the tile
// A/B (--mm-rl, --mm-tl, --mm-split-wg).
// The cooperative-matrix kernel's error on one mat-mul whose outputs (n tokens of `rows`) it
// left in y: the invariant kernel (e.ref_str) recomputes them; the largest difference over the
// RMS of the token's invariant outputs.
double coop_error(bench_env& e, const weight_tensor& w, const buffer& x, const buffer& y,
                  std::uint32_t rows, std::uint32_t n) {
    buffer ref = filled(e, std::size_t(rows) * n, 3);
    if (!e.ref_str->begin("reference") ||
        !encode_mul_mat(*e.ref_str, w, {whole(x), 0, w.n_in}, {whole(ref), 0, rows}, n, false,
                        mat_path::tiled) ||
        !e.ref_str->run(600'000)) {
        std::fprintf(stderr, "the invariant kernel's reference run failed\n");
        std::exit(1);
    }
    std::vector<float> got(std::size_t(rows) * n), want(got.size());
    if (!e.dev->read(y, 0, got.data(), got.size() * 4) ||
        !e.dev->read(ref, 0, want.data(), want.size() * 4)) {
        std::fprintf(stderr, "reading the outputs back failed\n");
        std::exit(1);
    }
    double worst = 0;
    for (std::uint32_t t = 0; t < n; ++t) {
        double sq = 0, diff = 0;
        for (std::uint32_t r = 0; r < rows; ++r) {
            double v = want[std::size_t(t) * rows + r];
            sq += v * v;
            diff = std::max(diff, std::fabs(got[std::size_t(t) * rows + r] - v));
        }
        double rms = std::sqrt(sq / rows);
        worst = std::max(worst, rms > 0 ? diff / rms : diff);
    }
    return worst;
}

void bench_tiled_1b(bench_env& e, const std::vector<model::ggml_type>& types) {
    struct shape {
        std::uint32_t n_in, n_out;
    };
    const shape shapes[] = {{2048, 3072}, {2048, 2048}, {2048, 16384}, {8192, 2048}};
    const pipeline_tuning& tu = e.pipes->tuning();
    // The layer's attention (32 query heads over 8 KV heads of 64) for a 128- and a 512-token
    // prompt, on attention.comp and on attention_flash, then a decode step of 64 sequences at
    // context 512 on attention.comp and as automatic runs it (with --attention-token-tiles,
    // attention_flash with a tile per token's 4 query heads). The same bits every way.
    const attention_path asked = e.attention;
    for (std::uint32_t n : {128u, 512u}) {
        for (attention_path path : {attention_path::classic, attention_path::flash}) {
            e.attention = path;
            bench_attention(e, 32, 64, n, 1, n, true, 8);
        }
    }
    for (attention_path path : {attention_path::classic, attention_path::automatic}) {
        e.attention = path;
        bench_attention(e, 32, 64, 512, 64, 1, true, 8);
    }
    e.attention = asked;
    for (model::ggml_type t : types) {
        for (std::uint32_t n : {16u, 64u, 128u, 512u}) {
            double ms = 0, flop = 0, err = 0;
            for (const shape& s : shapes) {
                const weight_copies copies = upload_copies(e, t, s.n_in, s.n_out, 1);
                buffer x = filled(e, std::size_t(s.n_in) * n, 1);
                buffer y = filled(e, std::size_t(s.n_out) * n, 2);
                auto [gpu_ms, wall_ms] = time_best(e, "mul_mat", [&] {
                    status st = encode_mul_mat(*e.str, copies.ws[0], {whole(x), 0, s.n_in},
                                               {whole(y), 0, s.n_out}, n, false, mat_path::tiled);
                    if (!st) {
                        std::fprintf(stderr, "%s\n", st.err().message.c_str());
                        std::exit(1);
                    }
                });
                (void)wall_ms;
                ms += gpu_ms;
                flop += 2.0 * s.n_in * s.n_out * n;
                if (e.ref_str) err = std::max(err, coop_error(e, copies.ws[0], x, y, s.n_out, n));
            }
            const mat_coop_shape& c = mat_coop_tile(tu, mat_coop_groups_for(tu, n));
            // coop_err: the largest |coop - invariant| of any output over the RMS of its token's
            // invariant outputs (f16 inputs: about 1e-3; a wrong tile: about 1).
            std::printf(
                "{\"tiled\":\"1b layer\",\"type\":\"%s\",\"tokens\":%u,\"rl\":%u,\"tl\":%u,"
                "\"swizzle\":%u,\"k_step\":%u,\"tokens_first\":%u,\"row_stage\":%u,"
                "\"token_groups\":%u,\"coop\":\"%s\",\"coop_tile\":\"%ux%ux%u\","
                "\"coop_err\":%.2e,\"split_wg\":%u,\"gpu_ms\":%.4f,\"tflops\":%.2f}\n",
                std::string(model::type_name(t)).c_str(), n, tu.mat_tiled_rows_per_lane,
                tu.mat_tiled_tokens_per_lane, tu.mat_tiled_swizzle ? 1u : 0u, tu.mat_tiled_k_step,
                tu.mat_tiled_tokens_first ? 1u : 0u, tu.mat_tiled_row_staging ? 1u : 0u,
                mat_tiled_groups_for(tu, n),
                !tu.mat_coop           ? "off"
                : tu.mat_coop_emulated ? "emulated"
                                       : "on",
                c.sg_rows, c.frag_rows, c.frag_tokens, err,
                tu.mat_coop ? tu.mat_coop_split_wg : tu.mat_tiled_split_wg, ms, flop / ms * 1e-9);
            std::fflush(stdout);
        }
    }
}

// split: flash decoding (attention_batch::split_keys from the context, the partials bound), as
// the runner runs it; otherwise one workgroup per (head, token). The path is --attention's
// (automatic gets the host's copy of the tokens, as the runner gives it). n_head_kv 0: n_head.
void bench_attention(bench_env& e, std::uint32_t n_head, std::uint32_t head_dim, std::uint32_t ctx,
                     std::uint32_t n_seqs, std::uint32_t tokens_per_seq, bool split,
                     std::uint32_t n_head_kv) {
    const std::uint32_t block_tokens = 16;
    std::uint32_t blocks_per_seq = (ctx + block_tokens - 1) / block_tokens;
    if (n_head_kv == 0) n_head_kv = n_head;
    auto pool = kv_pool::create(
        *e.dev, {1, n_head_kv, head_dim, block_tokens, blocks_per_seq * n_seqs, true});
    if (!pool) std::exit(1);
    std::vector<std::int32_t> tables, tokens;
    for (std::uint32_t s = 0; s < n_seqs; ++s) {
        for (std::uint32_t b = 0; b < blocks_per_seq; ++b) tables.push_back(s * blocks_per_seq + b);
        for (std::uint32_t t = 0; t < tokens_per_seq; ++t) {
            tokens.push_back(static_cast<std::int32_t>(s));
            tokens.push_back(static_cast<std::int32_t>(ctx - tokens_per_seq + t));
        }
    }
    auto ints = [&](const std::vector<std::int32_t>& v) {
        auto b = e.dev->create_buffer(v.size() * 4, memory_use::device);
        if (!b || !e.dev->write(*b, 0, v.data(), v.size() * 4)) std::exit(1);
        return std::move(*b);
    };
    buffer tb = ints(tables), kb = ints(tokens);
    std::uint32_t n_tok = n_seqs * tokens_per_seq, width = n_head * head_dim;
    buffer q = filled(e, std::size_t(n_tok) * width, 3),
           out = filled(e, std::size_t(n_tok) * width, 4);
    const std::uint32_t wg = e.pipes->get(pipeline_id::attention_f16).workgroup_size;
    const std::uint32_t keys =
        attention_split_keys(std::uint64_t(blocks_per_seq) * block_tokens, wg);
    const std::uint32_t max_splits = (blocks_per_seq * block_tokens + keys - 1) / keys;
    buffer partials = filled(e, attention_partials_floats(n_head, head_dim, max_splits), 5);
    auto [gpu_ms, wall_ms] = time_best(e, "attention", [&] {
        attention_batch b{{whole(q), 0, width},
                          {whole(out), 0, width},
                          {whole(kb), 0},
                          {whole(tb), 0},
                          n_tok,
                          n_seqs,
                          blocks_per_seq,
                          n_head};
        if (split) {
            b.split_keys = keys;
            b.partials = whole(partials);
            b.max_splits = max_splits;
        }
        if (e.attention == attention_path::automatic) b.host_tokens = tokens;
        status st = encode_attention(*e.str, **pool, 0, b, e.attention);
        if (!st) {
            std::fprintf(stderr, "%s\n", st.err().message.c_str());
            std::exit(1);
        }
    });
    std::string kernel =
        e.str->timings().empty() ? "?" : std::string(pipeline_name(e.str->timings()[0].id));
    const pipeline_tuning& tu = e.pipes->tuning();
    std::printf(
        "{\"kernel\":\"%s\",\"heads\":%u,\"kv_heads\":%u,\"head_dim\":%u,\"ctx\":%u,"
        "\"seqs\":%u,\"tokens\":%u,\"split\":%s,\"k_pairs\":%u,\"v_group\":%u,"
        "\"gpu_ms\":%.4f,\"wall_ms\":%.4f}\n",
        kernel.c_str(), n_head, n_head_kv, head_dim, ctx, n_seqs, n_tok, split ? "true" : "false",
        tu.attention_k_pairs, tu.attention_v_group, gpu_ms, wall_ms);
    std::fflush(stdout);
}

// Decode steps of 1..32 tokens (one per sequence) and prefill on the medium F16 model's shapes,
// then the small F32 model's.
void bench_steps(bench_env& e) {
    using model::ggml_type;
    for (std::uint32_t n : {1u, 2u, 4u, 8u, 9u, 12u, 16u, 24u, 32u, 128u, 512u}) {
        bench_mul_mat(e, ggml_type::f16, 768, 2048, n, "medium ffn_up");
        bench_mul_mat(e, ggml_type::f16, 2048, 768, n, "medium ffn_down");
    }
    for (std::uint32_t n : {1u, 4u, 8u, 16u}) {
        bench_mul_mat(e, ggml_type::f16, 768, 768, n, "medium attn_q");
        bench_mul_mat(e, ggml_type::f16, 768, 32000, n, "medium output");
    }
    // The small F32 model: 288-row outputs give few workgroups per token group.
    for (std::uint32_t n : {1u, 4u, 8u, 16u, 128u}) {
        bench_mul_mat(e, ggml_type::f32, 288, 288, n, "small attn_q");
        bench_mul_mat(e, ggml_type::f32, 768, 288, n, "small ffn_down");
    }
}

// The prefill mat-muls of one layer (fused q|k|v, o, fused gate|up, down) and its attention, of
// the small F32 and the medium F16 model at 128 and 512 tokens (~85-95% of a prefill step).
void bench_prefill(bench_env& e) {
    using model::ggml_type;
    struct shape {
        ggml_type type;
        std::uint32_t n_in, n_out;
        const char* name;
    };
    const shape shapes[] = {
        {ggml_type::f32, 288, 864, "small qkv"},       {ggml_type::f32, 288, 288, "small o"},
        {ggml_type::f32, 288, 1536, "small gate_up"},  {ggml_type::f32, 768, 288, "small down"},
        {ggml_type::f16, 768, 2304, "medium qkv"},     {ggml_type::f16, 768, 768, "medium o"},
        {ggml_type::f16, 768, 4096, "medium gate_up"}, {ggml_type::f16, 2048, 768, "medium down"},
    };
    for (std::uint32_t n : {128u, 512u}) {
        for (const shape& s : shapes) bench_mul_mat(e, s.type, s.n_in, s.n_out, n, s.name);
        bench_attention(e, 6, 48, n, 1, n);   // small: 6 heads of 48
        bench_attention(e, 12, 64, n, 1, n);  // medium: 12 heads of 64
    }
}

// The fixed cost of one dispatch: a segment of n tiny `add` dispatches (768 floats, one
// workgroup each), with and without a barrier after each, on streams with and without
// timestamps; prints wall ms per dispatch (what a decode step pays per kernel beyond its work).
void bench_dispatch_cost(bench_env& e) {
    constexpr std::uint32_t n = 200, width = 768;
    buffer a = filled(e, width, 1), b = filled(e, width, 2), c = filled(e, width, 3);
    rows_view av{whole(a), 0, width}, bv{whole(b), 0, width}, cv{whole(c), 0, width};
    for (bool timestamps : {false, true}) {
        auto st = stream::create(*e.dev, *e.pipes, {n + 8, timestamps});
        if (!st) std::exit(1);
        double best = 1e30;
        for (std::uint32_t r = 0; r < e.reps; ++r) {
            if (!(*st)->begin("dispatch_cost")) std::exit(1);
            for (std::uint32_t i = 0; i < n; ++i) {
                if (!encode_add(**st, av, bv, cv, width, 1)) std::exit(1);
            }
            auto t0 = std::chrono::steady_clock::now();
            if (!(*st)->run(watchdog_ms)) std::exit(1);
            best = std::min(best, std::chrono::duration<double, std::milli>(
                                      std::chrono::steady_clock::now() - t0)
                                      .count());
        }
        std::printf(
            "{\"kernel\":\"add\",\"dispatches\":%u,\"timestamps\":%s,"
            "\"wall_ms_per_dispatch\":%.4f}\n",
            n, timestamps ? "true" : "false", best / n);
    }
}

}  // namespace

int main(int argc, char** argv) {
    std::string selector;
    bench_env e;
    std::uint32_t tx_wg = 0;
    bool texel = true;
    bool force_texel = false;  // --texel: the texel kernels on a GPU too (default: CPU devices)
    bool token_tiles = false;  // --attention-token-tiles
    bool force_rows = false;   // --rows: mul_mat_rows for few tokens (storage family) on a GPU too
    bool steps_only = false;
    bool dispatch_cost = false;
    bool prefill_only = false;
    bool type_compare = false;
    bool decode_only = false, fused = false, crossover = false, decode_attention = false;
    std::uint32_t attn_k_pairs = 0, attn_v_group = 0;  // 0: the device's tuning
    std::uint32_t copies = 16;
    bool types_given = false;
    std::uint32_t mmv_wg = 0, mmv_rows = 0, mmv_unroll = 0, mmv_block_unroll = 0, mmv_split = 0,
                  mmv_split_cols = 0;
    std::int64_t mm_split_wg = -1;
    std::uint32_t mm_rl = 0, mm_tl = 0;
    // -1: the device's tuning
    int mm_swizzle = -1, mm_tokens_first = -1, mm_row_stage = -1, mm_narrow = -1;
    std::uint32_t mm_k_step = 0;
    bool prefill_1b = false;
    int coop = -1;  // --coop: 0, 1, 2 (emulated); -1 the device's tuning (off)
    std::int64_t coop_split_wg = -1;
    mat_coop_shape coop_wide{}, coop_narrow{};
    bool coop_wide_given = false, coop_narrow_given = false;
    // "R,M,N" -> a tile, or false.
    auto parse_shape = [](const char* text, mat_coop_shape& out) {
        unsigned r = 0, m = 0, n = 0;
        if (std::sscanf(text, "%u,%u,%u", &r, &m, &n) != 3) return false;
        out = {r, m, n};
        return true;
    };
    using model::ggml_type;
    std::vector<ggml_type> types = {ggml_type::f32, ggml_type::f16, ggml_type::q8_0,
                                    ggml_type::q4_0};
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
            selector = argv[++i];
        } else if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            e.reps = std::clamp<std::uint32_t>(std::stoul(argv[++i]), 1, reps_max);
        } else if (std::strcmp(argv[i], "--tx-wg") == 0 && i + 1 < argc) {
            tx_wg = std::clamp<std::uint32_t>(std::stoul(argv[++i]), 1, 1024);
        } else if (std::strcmp(argv[i], "--dispatch-cost") == 0) {
            dispatch_cost = true;
        } else if (std::strcmp(argv[i], "--prefill") == 0) {
            prefill_only = true;
        } else if (std::strcmp(argv[i], "--decode") == 0) {
            decode_only = true;
        } else if (std::strcmp(argv[i], "--decode-attention") == 0) {
            decode_attention = true;
        } else if (std::strcmp(argv[i], "--attn-k-pairs") == 0 && i + 1 < argc) {
            attn_k_pairs = std::clamp<std::uint32_t>(std::stoul(argv[++i]), 1, 1024);
        } else if (std::strcmp(argv[i], "--attn-v-group") == 0 && i + 1 < argc) {
            attn_v_group = std::clamp<std::uint32_t>(std::stoul(argv[++i]), 1, 1024);
        } else if (std::strcmp(argv[i], "--fused") == 0) {
            fused = true;
        } else if (std::strcmp(argv[i], "--crossover") == 0) {
            crossover = true;
        } else if (std::strcmp(argv[i], "--copies") == 0 && i + 1 < argc) {
            copies = std::clamp<std::uint32_t>(std::stoul(argv[++i]), 1, 64);
        } else if (std::strcmp(argv[i], "--mmv-wg") == 0 && i + 1 < argc) {
            mmv_wg = std::clamp<std::uint32_t>(std::stoul(argv[++i]), 8, 1024);
        } else if (std::strcmp(argv[i], "--mmv-unroll") == 0 && i + 1 < argc) {
            mmv_unroll = std::clamp<std::uint32_t>(std::stoul(argv[++i]), 1, 8);
        } else if (std::strcmp(argv[i], "--mmv-block-unroll") == 0 && i + 1 < argc) {
            mmv_block_unroll = std::clamp<std::uint32_t>(std::stoul(argv[++i]), 1, 8);
        } else if (std::strcmp(argv[i], "--mmv-split") == 0 && i + 1 < argc) {
            mmv_split = std::clamp<std::uint32_t>(std::stoul(argv[++i]), 1, 8);
        } else if (std::strcmp(argv[i], "--mm-rl") == 0 && i + 1 < argc) {
            mm_rl = static_cast<std::uint32_t>(std::stoul(argv[++i]));
        } else if (std::strcmp(argv[i], "--mm-tl") == 0 && i + 1 < argc) {
            mm_tl = static_cast<std::uint32_t>(std::stoul(argv[++i]));
        } else if (std::strcmp(argv[i], "--mm-swizzle") == 0 && i + 1 < argc) {
            mm_swizzle = std::stoi(argv[++i]) != 0 ? 1 : 0;
        } else if (std::strcmp(argv[i], "--mm-k-step") == 0 && i + 1 < argc) {
            mm_k_step = static_cast<std::uint32_t>(std::stoul(argv[++i]));
        } else if (std::strcmp(argv[i], "--mm-tokens-first") == 0 && i + 1 < argc) {
            mm_tokens_first = std::stoi(argv[++i]) != 0 ? 1 : 0;
        } else if (std::strcmp(argv[i], "--mm-row-stage") == 0 && i + 1 < argc) {
            mm_row_stage = std::stoi(argv[++i]) != 0 ? 1 : 0;
        } else if (std::strcmp(argv[i], "--mm-narrow") == 0 && i + 1 < argc) {
            mm_narrow = std::stoi(argv[++i]) != 0 ? 1 : 0;
        } else if (std::strcmp(argv[i], "--prefill-1b") == 0) {
            prefill_1b = true;
        } else if (std::strcmp(argv[i], "--coop") == 0 && i + 1 < argc) {
            std::string v = argv[++i];
            coop = v == "emulated" ? 2 : std::stoi(v) != 0 ? 1 : 0;
        } else if (std::strcmp(argv[i], "--coop-wide") == 0 && i + 1 < argc) {
            coop_wide_given = parse_shape(argv[++i], coop_wide);
            if (!coop_wide_given) {
                std::fprintf(stderr, "--coop-wide: R,M,N (e.g. 2,2,2)\n");
                return 2;
            }
        } else if (std::strcmp(argv[i], "--coop-narrow") == 0 && i + 1 < argc) {
            coop_narrow_given = parse_shape(argv[++i], coop_narrow);
            if (!coop_narrow_given) {
                std::fprintf(stderr, "--coop-narrow: R,M,N (e.g. 4,1,1)\n");
                return 2;
            }
        } else if (std::strcmp(argv[i], "--coop-split-wg") == 0 && i + 1 < argc) {
            coop_split_wg = std::clamp<std::int64_t>(std::stol(argv[++i]), 0, 1 << 20);
        } else if (std::strcmp(argv[i], "--attention-token-tiles") == 0) {
            token_tiles = true;
        } else if (std::strcmp(argv[i], "--mm-split-wg") == 0 && i + 1 < argc) {
            mm_split_wg = std::clamp<std::int64_t>(std::stol(argv[++i]), 0, 1 << 20);
        } else if (std::strcmp(argv[i], "--mmv-split-cols") == 0 && i + 1 < argc) {
            mmv_split_cols = std::clamp<std::uint32_t>(std::stoul(argv[++i]), 1, 8);
        } else if (std::strcmp(argv[i], "--mmv-rows") == 0 && i + 1 < argc) {
            mmv_rows = std::clamp<std::uint32_t>(std::stoul(argv[++i]), 1, 16);
        } else if (std::strcmp(argv[i], "--steps") == 0) {
            steps_only = true;
        } else if (std::strcmp(argv[i], "--no-texel") == 0) {
            texel = false;
            e.attention = attention_path::classic;
        } else if (std::strcmp(argv[i], "--attention") == 0 && i + 1 < argc) {
            std::string a = argv[++i];
            if (a != "auto" && a != "classic" && a != "flash") {
                std::fprintf(stderr, "--attention: '%s' is not auto, classic or flash\n",
                             a.c_str());
                return 2;
            }
            e.attention = a == "flash"     ? attention_path::flash
                          : a == "classic" ? attention_path::classic
                                           : attention_path::automatic;
        } else if (std::strcmp(argv[i], "--texel") == 0) {
            force_texel = true;
        } else if (std::strcmp(argv[i], "--rows") == 0) {
            force_rows = true;
        } else if (std::strcmp(argv[i], "--type-compare") == 0) {
            type_compare = true;
        } else if (std::strcmp(argv[i], "--types") == 0 && i + 1 < argc) {
            types.clear();
            types_given = true;
            std::string list = argv[++i];
            for (std::size_t at = 0; at <= list.size();) {
                std::size_t comma = std::min(list.find(',', at), list.size());
                auto t = model::type_from_name(list.substr(at, comma - at));
                if (!t || !kernels_run(*t)) {
                    std::fprintf(stderr, "--types: no kernel for '%s' (%s)\n",
                                 list.substr(at, comma - at).c_str(), kernel_type_names().c_str());
                    return 2;
                }
                types.push_back(*t);
                at = comma + 1;
            }
        } else {
            std::fprintf(stderr,
                         "usage: ordo-bench-kernels [--device SELECTOR] [--reps N] "
                         "[--tx-wg LANES] [--no-texel | --texel] [--rows] [--steps] "
                         "[--prefill] [--dispatch-cost] [--types LIST] "
                         "[--type-compare] [--decode [--fused]] [--crossover [--copies N]] "
                         "[--mmv-wg LANES] "
                         "[--mmv-rows N] [--mmv-unroll N] [--mmv-block-unroll N] [--mmv-split N] "
                         "[--mmv-split-cols N] [--prefill-1b] [--attention auto|classic|flash] "
                         "[--attention-token-tiles] [--coop 0|1|emulated] [--coop-wide R,M,N] "
                         "[--coop-narrow R,M,N] [--coop-split-wg N]\n");
            return 2;
        }
    }
    auto d = device::create({selector});
    if (!d) {
        std::fprintf(stderr, "%s: %s\n", d.err().code.c_str(), d.err().message.c_str());
        return 1;
    }
    e.dev = std::move(*d);
    pipeline_tuning tuning = tuning_for(e.dev->info());
    if (tx_wg != 0) tuning.mat_tx_tile_wg = tx_wg;
    if (!texel) tuning.prefer_texel_kernels = false;
    if (force_texel) tuning.prefer_texel_kernels = true;
    if (force_rows) tuning.rows_tokens_max = mat_vec_tokens_max;
    if (mmv_wg != 0) tuning.mat_vec_wg = mmv_wg;
    if (mmv_rows != 0) tuning.mat_vec_rows = mmv_rows;
    if (mmv_unroll != 0) tuning.mat_vec_unroll = mmv_unroll;
    if (mmv_block_unroll != 0) tuning.mat_vec_block_unroll = mmv_block_unroll;
    if (mmv_split != 0) tuning.mat_vec_split = mmv_split;
    if (mmv_split_cols != 0) tuning.mat_vec_split_cols = mmv_split_cols;
    if (mm_split_wg >= 0) tuning.mat_tiled_split_wg = static_cast<std::uint32_t>(mm_split_wg);
    if (mm_rl != 0) tuning.mat_tiled_rows_per_lane = mm_rl;
    if (mm_tl != 0) tuning.mat_tiled_tokens_per_lane = mm_tl;
    if (mm_swizzle >= 0) tuning.mat_tiled_swizzle = mm_swizzle != 0;
    if (mm_k_step != 0) tuning.mat_tiled_k_step = mm_k_step;
    if (mm_tokens_first >= 0) tuning.mat_tiled_tokens_first = mm_tokens_first != 0;
    if (mm_row_stage >= 0) tuning.mat_tiled_row_staging = mm_row_stage != 0;
    if (mm_narrow >= 0) tuning.mat_tiled_narrow = mm_narrow != 0;
    if (token_tiles) tuning.attention_token_tiles = true;
    if (attn_k_pairs != 0) tuning.attention_k_pairs = attn_k_pairs;
    if (attn_v_group != 0) tuning.attention_v_group = attn_v_group;
    if (coop >= 0) {
        tuning.mat_coop = coop != 0;
        tuning.mat_coop_emulated = coop == 2;
    }
    if (coop_wide_given) tuning.mat_coop_wide = coop_wide;
    if (coop_narrow_given) tuning.mat_coop_narrow = coop_narrow;
    if (coop_split_wg >= 0) tuning.mat_coop_split_wg = static_cast<std::uint32_t>(coop_split_wg);
    auto t_pipes = std::chrono::steady_clock::now();
    auto p = pipelines::create(*e.dev, tuning);
    if (!p) {
        std::fprintf(stderr, "pipelines: %s\n", p.err().message.c_str());
        return 1;
    }
    // The start-up cost every runner and test pays (the weight-typed pipelines come later, per
    // type, on first use).
    std::printf("{\"pipelines_create_ms\":%.1f}\n", std::chrono::duration<double, std::milli>(
                                                        std::chrono::steady_clock::now() - t_pipes)
                                                        .count());
    e.pipes = std::move(*p);
    auto s = stream::create(*e.dev, *e.pipes, {64, true});
    if (!s) {
        std::fprintf(stderr, "%s\n", s.err().message.c_str());
        return 1;
    }
    e.str = std::move(*s);
    // The tiled kernel's group split, as a runner sizes it (the 1B head at 64 tokens).
    std::uint64_t split_floats = std::min<std::uint64_t>(
        mat_split_scratch_floats(tuning, 128256, 64), e.dev->info().max_storage_buffer_range / 4);
    if (split_floats != 0) {
        auto b = e.dev->create_buffer(split_floats * 4, memory_use::device);
        if (!b) {
            std::fprintf(stderr, "split scratch: %s\n", b.err().message.c_str());
            return 1;
        }
        e.split_scratch = std::move(*b);
        e.str->set_mat_split_scratch(whole(e.split_scratch));
    }
    std::printf("{\"device\":\"%s\"}\n", e.dev->info().name.c_str());
    if (tuning.mat_coop) {
        pipeline_tuning ref = tuning;
        ref.mat_coop = false;
        auto rp = pipelines::create(*e.dev, ref);
        if (!rp) {
            std::fprintf(stderr, "the invariant kernels: %s\n", rp.err().message.c_str());
            return 1;
        }
        auto rs = stream::create(*e.dev, **rp, {64, true});
        if (!rs) {
            std::fprintf(stderr, "the invariant kernels' stream: %s\n", rs.err().message.c_str());
            return 1;
        }
        e.ref_pipes = std::move(*rp);
        e.ref_str = std::move(*rs);
    }
    if (prefill_1b) {
        bench_tiled_1b(
            e, types_given ? types : std::vector<ggml_type>{ggml_type::f16, ggml_type::q4_k});
        return 0;
    }
    if (crossover) {
        bench_crossover(
            e, types_given ? types : std::vector<ggml_type>{ggml_type::f16, ggml_type::q4_k},
            copies);
        return 0;
    }
    if (decode_attention) {
        bench_decode_attention(e);
        return 0;
    }
    if (decode_only) {
        bench_decode(e,
                     types_given ? types : std::vector<ggml_type>{ggml_type::f16, ggml_type::q4_k},
                     fused);
        return 0;
    }
    if (steps_only) {
        bench_steps(e);
        return 0;
    }
    if (prefill_only) {
        bench_prefill(e);
        return 0;
    }
    if (dispatch_cost) {
        bench_dispatch_cost(e);
        return 0;
    }
    if (type_compare) {
        for (std::uint32_t n : {1u, 4u, 128u}) {
            for (ggml_type t : types) {
                bench_mul_mat(e, t, 768, 2048, n, "medium ffn_up");
                bench_mul_mat(e, t, 2048, 768, n, "medium ffn_down");
            }
        }
        return 0;
    }
    for (ggml_type t : types) {
        bench_mul_mat(e, t, 768, 2048, 1, "medium ffn_up");
        bench_mul_mat(e, t, 288, 32000, 1, "small output");
        bench_mul_mat(e, t, 2048, 768, 1, "medium ffn_down");
        bench_mul_mat(e, t, 768, 32000, 1, "medium output");
        bench_mul_mat(e, t, 768, 2048, 4, "medium ffn_up x4");
        bench_mul_mat(e, t, 768, 2048, 16, "medium ffn_up x16");
        bench_mul_mat(e, t, 768, 32000, 16, "medium output x16");
        bench_mul_mat(e, t, 768, 2048, 128, "medium ffn_up pp128");
        bench_mul_mat(e, t, 288, 768, 512, "small ffn_up pp512");
    }
    bench_attention(e, 12, 64, 512, 1, 1);
    bench_attention(e, 12, 64, 512, 8, 1);
    bench_attention(e, 12, 64, 128, 1, 128);
    bench_attention(e, 12, 64, 512, 1, 512);
    bench_attention(e, 6, 48, 128, 1, 128);
    return 0;
}
