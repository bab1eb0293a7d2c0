// gpu_fixture.hpp: shared set-up for tests/gpu: one real Vulkan device + pipelines + stream per
// test binary, helpers to move float/int arrays to and from device buffers, seeded random data
// and closeness checks. When no Vulkan device can be created at all the tests GTEST_SKIP with
// a loud message naming the error (here lavapipe exists, so they run); with ORDO_GPU_REQUIRED=1
// in the environment (.ci/run sets it) a missing device fails them instead, so a broken driver
// install cannot pass as a run of skips.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string_view>
#include <vector>

#include "gpu/vk/device.hpp"
#include "gpu/vk/kernels.hpp"
#include "gpu/vk/pipelines.hpp"
#include "gpu/vk/stream.hpp"
#include "gpu/vk/weight_layout.hpp"
#include "model/ggml_types.hpp"

namespace ordo::gpu::testing {

// Every weight type the kernels run (gpu/vk/shaders/weight_types.h).
inline constexpr model::ggml_type all_types[] = {
    model::ggml_type::f32,  model::ggml_type::f16,  model::ggml_type::bf16, model::ggml_type::q8_0,
    model::ggml_type::q4_0, model::ggml_type::q4_1, model::ggml_type::q5_0, model::ggml_type::q5_1,
    model::ggml_type::q2_k, model::ggml_type::q3_k, model::ggml_type::q4_k, model::ggml_type::q5_k,
    model::ggml_type::q6_k};

// A row length valid for `type` near k: k itself, rounded up to whole super-blocks for K types.
inline std::uint32_t k_for(model::ggml_type type, std::uint32_t k) {
    std::uint32_t m = row_multiple(type);
    return (k + m - 1) / m * m;
}

// Long enough for any kernel test on a loaded 2-core machine; a real hang still ends the test.
constexpr std::uint64_t test_watchdog_ms = 120'000;

struct gpu_env {
    std::unique_ptr<device> dev;
    std::unique_ptr<pipelines> pipes;
    std::unique_ptr<stream> str;
    std::string error;
};

inline gpu_env& env() {
    static gpu_env e = [] {
        gpu_env g;
        auto d = device::create({""});
        if (!d) {
            g.error = d.err().code + ": " + d.err().message;
            return g;
        }
        g.dev = std::move(*d);
        auto p = pipelines::create(*g.dev, tuning_for(g.dev->info()));
        if (!p) {
            g.error = p.err().message;
            return g;
        }
        g.pipes = std::move(*p);
        auto s = stream::create(*g.dev, *g.pipes, {});
        if (!s) {
            g.error = s.err().message;
            return g;
        }
        g.str = std::move(*s);
        return g;
    }();
    return e;
}

#define ORDO_REQUIRE_GPU()                                                                \
    do {                                                                                  \
        if (!::ordo::gpu::testing::env().dev) {                                           \
            if (const char* need_ = std::getenv("ORDO_GPU_REQUIRED");                     \
                need_ && std::string_view(need_) == "1") {                                \
                GTEST_FAIL() << "ORDO_GPU_REQUIRED=1 but no Vulkan device: "              \
                             << ::ordo::gpu::testing::env().error;                        \
            }                                                                             \
            std::fprintf(stderr, "\n*** SKIPPING GPU TEST: no Vulkan device: %s ***\n\n", \
                         ::ordo::gpu::testing::env().error.c_str());                      \
            GTEST_SKIP() << "no Vulkan device: " << ::ordo::gpu::testing::env().error;    \
        }                                                                                 \
    } while (0)

template <typename T>
inline buffer make_buffer(const std::vector<T>& data, std::size_t min_elems = 0) {
    std::size_t n = std::max(data.size(), min_elems);
    auto b = env().dev->create_buffer(std::max<std::size_t>(n, 1) * sizeof(T), memory_use::device);
    EXPECT_TRUE(b.ok());
    std::vector<T> padded(data);
    padded.resize(std::max<std::size_t>(n, 1));
    EXPECT_TRUE(env().dev->write(*b, 0, padded.data(), padded.size() * sizeof(T)).ok());
    return std::move(*b);
}

template <typename T>
inline std::vector<T> read_buffer(const buffer& b, std::size_t n) {
    std::vector<T> out(n);
    EXPECT_TRUE(env().dev->read(b, 0, out.data(), n * sizeof(T)).ok());
    return out;
}

inline std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-scale, scale);
    std::vector<float> v(n);
    for (float& x : v) x = u(rng);
    return v;
}

// Runs what the caller recorded after begin() as one segment and expects success.
inline void run_segment(const char* label) {
    status s = env().str->run(test_watchdog_ms);
    ASSERT_TRUE(s.ok()) << label << ": " << s.err().message;
}

// |a - b| <= atol + rtol * |b| elementwise; reports the first few mismatches.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, float atol,
                         float rtol, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    int reported = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        float tol = atol + rtol * std::fabs(want[i]);
        if (!(std::fabs(got[i] - want[i]) <= tol)) {
            ADD_FAILURE() << what << ": index " << i << " got " << got[i] << " want " << want[i];
            if (++reported >= 5) return;
        }
    }
}

}  // namespace ordo::gpu::testing
