// test_mul_mat_coop.cpp: the cooperative-matrix mat-mul (mul_mat_cm.comp), which the tiled
// steps run under gpu.batch_invariant = false, against the CPU reference (model::matvec on
// model/quant's dequantized weights) for every weight type, at row and token counts that are
// not multiples of its tiles (partial tiles in both directions), K that ends inside a K step
// (F32/F16/BF16: K 296 = 9 steps and a quarter), weights in many row chunks, accumulate on and
// off, both tiles (narrow: up to 16 tokens; wide) and the largest (128 x 128: 16 fragments a
// subgroup), and its K split over 8 workgroups with mul_mat_fold adding the partials (a stream
// with split scratch) and unsplit.
//
// On a device with cooperative matrices (NVIDIA) it runs mul_mat_cm itself; elsewhere (lavapipe,
// CI) that test skips saying so, and mul_mat_cme (the same kernel with its three matrix
// operations written out in plain GLSL) runs the staging, indexing, split and stores here.
//
// Tolerance: the kernel rounds weights and activations to f16 (relative error 2^-11 each) and
// sums 16-element products in an order the driver chooses, so a product errs by up to 2^-10
// of |w x| and an output by about that much of the sum of |w x| over K: allowed 1e-3 x that sum
// + 1e-5 (measured on the emulation: 1.9e-4). Wrong staging, a lost K step or a misplaced
// fragment errs by whole products (about 1/K of the sum each), far past it.
//
// Also: the tuning refuses tiles that do not fit the device's shared memory (naming the
// bytes) and mul_mat_cm on a device without cooperative matrices; on a device that caps a
// shader's loop iterations (llvmpipe ends them silently past 65535), the emulation refuses a K
// whose loops would pass the cap instead of returning a partial sum.
#include <cmath>
#include <string>
#include <vector>

#include "gpu/vk/shaders/abi.h"
#include "gpu/vk/weights.hpp"
#include "gpu_fixture.hpp"
#include "model/cpu_ops.hpp"
#include "model/llama.hpp"
#include "model/quant.hpp"

namespace ordo::gpu::testing {
namespace {

using model::ggml_type;

struct coop_env {
    std::unique_ptr<pipelines> pipes;
    std::unique_ptr<stream> str;
};

// A stream whose tiled steps run the cooperative-matrix kernel (emulated or not), its large
// tile from `large_from` tokens (0: never).
coop_env make_coop(bool emulated, std::uint32_t large_from = 0) {
    coop_env e;
    pipeline_tuning t = tuning_for(env().dev->info());
    t.prefer_texel_kernels = false;
    t.mat_coop = true;
    t.mat_coop_emulated = emulated;
    auto p = pipelines::create(*env().dev, t);
    EXPECT_TRUE(p.ok()) << p.err().message;
    if (!p) return e;
    e.pipes = std::move(*p);
    auto s = stream::create(*env().dev, *e.pipes, {});
    EXPECT_TRUE(s.ok()) << s.err().message;
    if (s) e.str = std::move(*s);
    if (e.str) e.str->set_mat_coop_large_from(large_from);
    return e;
}

struct coop_case {
    std::uint32_t k, n_out, n_tokens;
    std::uint64_t page_bytes;  // small pages split the weight into row chunks
    bool accumulate;
};

void check_coop(stream& str, ggml_type type, coop_case c, bool split) {
    c.k = k_for(type, c.k);
    SCOPED_TRACE(std::string(model::type_name(type)) + " k=" + std::to_string(c.k) +
                 " rows=" + std::to_string(c.n_out) + " tokens=" + std::to_string(c.n_tokens) +
                 (split ? " split" : "") + (c.accumulate ? " accumulate" : ""));
    std::size_t rb = model::row_bytes(type, c.k);
    std::vector<std::uint8_t> bytes(rb * c.n_out);
    auto f = random_floats(std::size_t(c.k) * c.n_out, c.k * 5 + c.n_out);
    for (std::uint32_t r = 0; r < c.n_out; ++r) {
        ASSERT_TRUE(
            model::quantize_row(type, f.data() + std::size_t(r) * c.k, bytes.data() + r * rb, c.k)
                .ok());
    }
    std::vector<float> deq(std::size_t(c.k) * c.n_out);
    for (std::uint32_t r = 0; r < c.n_out; ++r) {
        ASSERT_TRUE(model::dequantize_row(type, bytes.data() + r * rb,
                                          deq.data() + std::size_t(r) * c.k, c.k)
                        .ok());
    }
    arena mem(*env().dev, c.page_bytes);
    auto w = upload_weight(*env().dev, mem, type, c.k, c.n_out, bytes);
    ASSERT_TRUE(w.ok()) << w.err().message;
    if (c.page_bytes <= 4096) {
        EXPECT_GT(w->chunks.size(), 1u);
    }
    std::uint32_t xs = c.k + 4, ys = c.n_out + 3;
    auto x = random_floats(std::size_t(xs) * c.n_tokens, 31 + c.n_tokens);
    auto y0 = random_floats(std::size_t(ys) * c.n_tokens, 5);
    buffer xb = make_buffer(x), yb = make_buffer(y0);
    buffer scratch = make_buffer(
        std::vector<float>(std::size_t(abi::ORDO_MAT_GROUPS) * c.n_tokens * c.n_out, 0.0f));
    str.set_mat_split_scratch(split ? whole(scratch) : buffer_view{});
    ASSERT_TRUE(str.begin("mul_mat_cm").ok());
    status st = encode_mul_mat(str, *w, {whole(xb), 0, xs}, {whole(yb), 0, ys}, c.n_tokens,
                               c.accumulate, mat_path::tiled);
    ASSERT_TRUE(st.ok()) << st.err().message;
    status ran = str.run(test_watchdog_ms);
    str.set_mat_split_scratch({});
    ASSERT_TRUE(ran.ok()) << ran.err().message;
    auto got = read_buffer<float>(yb, y0.size());
    int reported = 0;
    for (std::uint32_t t = 0; t < c.n_tokens; ++t) {
        for (std::uint32_t r = 0; r < c.n_out; ++r) {
            double sum = 0.0, mag = 0.0;
            for (std::uint32_t i = 0; i < c.k; ++i) {
                double p = double(deq[std::size_t(r) * c.k + i]) * x[std::size_t(t) * xs + i];
                sum += p;
                mag += std::fabs(p);
            }
            double want = c.accumulate ? y0[t * ys + r] + sum : sum;
            double tol = 1e-3 * mag + 1e-5;
            double err = std::fabs(got[t * ys + r] - want);
            if (!(err <= tol) && reported++ < 5) {
                ADD_FAILURE() << "token " << t << " row " << r << ": got " << got[t * ys + r]
                              << " want " << want << " (tolerance " << tol << ")";
            }
        }
        // Past the rows: the stride's padding is untouched.
        for (std::uint32_t r = c.n_out; r < ys; ++r) {
            ASSERT_EQ(got[t * ys + r], y0[t * ys + r]) << "padding written, token " << t;
        }
    }
}

// Token counts: 1, 9 and 16 run the narrow tile (16 tokens), 33, 41 and 70 the wide one
// (64 tokens: partial), rows 37..200 partial row tiles, several workgroups both ways.
void check_every_type(stream& str) {
    for (ggml_type t : all_types) {
        for (bool split : {false, true}) {
            check_coop(str, t, {96, 37, 33, 1u << 20, false}, split);
            check_coop(str, t, {256, 130, 41, 2048, true}, split);
            check_coop(str, t, {64, 200, 9, 1u << 20, false}, split);
            check_coop(str, t, {32, 65, 1, 1u << 20, true}, split);
            check_coop(str, t, {296, 71, 70, 1u << 20, true}, split);
            check_coop(str, t, {512, 48, 16, 1u << 20, false}, split);
        }
    }
    // A long K (64 steps a workgroup unsplit, 8 split): every step lands in the sum.
    for (bool split : {false, true})
        check_coop(str, ggml_type::q4_k, {2048, 40, 70, 1u << 20, true}, split);
}

// The large tile (the device's: 128 x 128, 2 x 2 subgroups of 4 x 4 fragments, 16 accumulators
// a subgroup, on lavapipe and GPUs), which a stream runs from 17 tokens here: partial in rows
// and tokens (200 rows, 70 and 150 tokens), two tiles each way, chunked weights, split and
// unsplit, on a float type, a legacy block type and a K type.
void check_large_tile(stream& str) {
    for (ggml_type t : {ggml_type::f16, ggml_type::q8_0, ggml_type::q4_k}) {
        for (bool split : {false, true}) {
            check_coop(str, t, {256, 200, 150, 4096, true}, split);
            check_coop(str, t, {96, 130, 70, 1u << 20, false}, split);
        }
    }
}

TEST(GpuMulMatCoop, EmulatedKernelMatchesReferenceEveryType) {
    ORDO_REQUIRE_GPU();
    coop_env e = make_coop(true);
    ASSERT_TRUE(e.str);
    check_every_type(*e.str);
}

TEST(GpuMulMatCoop, EmulatedLargestTileMatchesReference) {
    ORDO_REQUIRE_GPU();
    coop_env e = make_coop(true, 17);
    ASSERT_TRUE(e.str);
    EXPECT_EQ(e.pipes->tuning().mat_coop_large.rows(), 128u);
    check_large_tile(*e.str);
}

TEST(GpuMulMatCoop, CooperativeMatrixKernelMatchesReferenceEveryType) {
    ORDO_REQUIRE_GPU();
    if (!env().dev->info().cooperative_matrix) {
        std::fprintf(stderr,
                     "\n*** SKIPPING: %s has no usable cooperative matrices (mul_mat_cm runs on "
                     "NVIDIA GPUs; its emulation ran in EmulatedKernelMatchesReferenceEveryType) "
                     "***\n\n",
                     env().dev->info().name.c_str());
        GTEST_SKIP() << "no cooperative matrices on " << env().dev->info().name;
    }
    coop_env e = make_coop(false);
    ASSERT_TRUE(e.str);
    check_every_type(*e.str);
    coop_env l = make_coop(false, 17);
    ASSERT_TRUE(l.str);
    check_large_tile(*l.str);
}

// The tuning's checks: a tile past the device's shared memory (checked against Vulkan's minimum
// of 16 KiB, which every tile fits on lavapipe's 32), a shape out of range, and the real kernel
// on a device without cooperative matrices are refused, naming why.
TEST(GpuMulMatCoop, TilesTheDeviceCannotHoldAreRefused) {
    ORDO_REQUIRE_GPU();
    device_info small = env().dev->info();
    small.max_shared_memory_bytes = 16384;
    const mat_coop_shape tall{1, 4, 2};  // 64 rows x 128 tokens: 19,456 bytes
    status s = check_mat_coop_tile(tall, small);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.err().message.find("19456 bytes fit the device's 16384"), std::string::npos)
        << s.err().message;
    EXPECT_TRUE(check_mat_coop_tile({2, 2, 2}, small).ok());  // 14,336 bytes

    const device_info& info = env().dev->info();
    pipeline_tuning t = tuning_for(info);
    t.mat_coop = true;
    t.mat_coop_emulated = true;
    t.mat_coop_wide = {2, 4, 4};  // 128 x 128: 24,576 bytes
    EXPECT_EQ(pipelines::create(*env().dev, t).ok(),
              t.mat_coop_wide.shared_bytes() <= info.max_shared_memory_bytes);
    t.mat_coop_wide = {3, 2, 2};
    auto p = pipelines::create(*env().dev, t);
    ASSERT_FALSE(p.ok());
    EXPECT_NE(p.err().message.find("cooperative-matrix tile 3 x 2 x 2"), std::string::npos)
        << p.err().message;
    t.mat_coop_wide = {2, 8, 1};
    EXPECT_FALSE(pipelines::create(*env().dev, t).ok());
    t.mat_coop_wide = {2, 2, 2};
    t.mat_coop_emulated = false;
    p = pipelines::create(*env().dev, t);
    EXPECT_EQ(p.ok(), info.cooperative_matrix);
    if (!p) {
        EXPECT_NE(p.err().message.find("no usable VK_NV_cooperative_matrix"), std::string::npos)
            << p.err().message;
    }
}

TEST(GpuMulMatCoop, EmulationRefusesAKPastTheDevicesLoopCap) {
    ORDO_REQUIRE_GPU();
    const device_info& info = env().dev->info();
    coop_env e = make_coop(true);
    ASSERT_TRUE(e.str);
    const mat_coop_shape& wide = e.pipes->tuning().mat_coop_wide;
    // The smallest K (whole super-blocks) past the cap, or 64Ki where there is none.
    std::uint32_t k = 256;
    while (info.loop_iterations_max != 0 &&
           wide.emulated_loop_iterations(k) <= info.loop_iterations_max) {
        k += 256;
    }
    if (info.loop_iterations_max == 0) k = 65536;
    SCOPED_TRACE("K " + std::to_string(k));
    std::size_t rb = model::row_bytes(ggml_type::q4_k, k);
    std::vector<float> f = random_floats(std::size_t(k) * 2, 3);
    std::vector<std::uint8_t> bytes(rb * 2);
    for (int r = 0; r < 2; ++r) {
        ASSERT_TRUE(model::quantize_row(ggml_type::q4_k, f.data() + std::size_t(r) * k,
                                        bytes.data() + r * rb, k)
                        .ok());
    }
    arena mem(*env().dev, 1u << 22);
    auto w = upload_weight(*env().dev, mem, ggml_type::q4_k, k, 2, bytes);
    ASSERT_TRUE(w.ok()) << w.err().message;
    buffer xb = make_buffer(random_floats(std::size_t(k) * 20, 4));
    buffer yb = make_buffer(std::vector<float>(2 * 20, 0.0f));
    ASSERT_TRUE(e.str->begin("cap").ok());
    status st = encode_mul_mat(*e.str, *w, {whole(xb), 0, k}, {whole(yb), 0, 2}, 20, false,
                               mat_path::tiled);
    EXPECT_EQ(st.ok(), info.loop_iterations_max == 0);
    if (!st) {
        EXPECT_NE(st.err().message.find("loop iterations"), std::string::npos) << st.err().message;
    }
    EXPECT_TRUE(e.str->run(test_watchdog_ms).ok());
}

}  // namespace
}  // namespace ordo::gpu::testing
