// test_runner_kv_copy.cpp: timings of moving KV-cache blocks between the device pool and host
// memory through the runner (read_kv_blocks / write_kv_blocks), on the small and medium model
// shapes the benches use (bench/README.md: small 288 wide, 6 layers, 6 heads; medium 768 wide,
// 12 layers, 12 heads; f16 KV, 16-token blocks), on the real device (lavapipe here).
//
// Checks: 64 blocks written into the pool and read back are byte-identical, and prints the
// best of kv_copy_reps timings of each direction. It is a measurement, not a bound: it runs
// only when ORDO_KV_COPY_TIMINGS is set (a medium model takes a while to build on lavapipe).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "gpu_fixture.hpp"
#include "test_runner_support.hpp"

namespace ordo::gpu::testing {
namespace {

constexpr std::uint32_t kv_copy_blocks = 64;
constexpr int kv_copy_reps = 5;

struct shape {
    const char* name;
    std::uint32_t n_embd, n_layer, n_head, n_ff;
};

double best_ms(const std::function<void()>& fn) {
    double best = 1e300;
    for (int i = 0; i < kv_copy_reps; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        fn();
        best = std::min(best, std::chrono::duration<double, std::milli>(
                                  std::chrono::steady_clock::now() - t0)
                                  .count());
    }
    return best;
}

void time_shape(const shape& sh) {
    model::synth_options o;
    o.n_embd = sh.n_embd, o.n_layer = sh.n_layer, o.n_head = sh.n_head, o.n_head_kv = sh.n_head;
    o.n_ff = sh.n_ff, o.n_vocab = 512, o.n_ctx = 2048, o.type = model::ggml_type::f16;
    o.seed = 3;
    std::string path = temp_dir() + "/kv_copy_" + sh.name + ".gguf";
    ASSERT_TRUE(model::write_synth_model(o, path).ok());
    auto f = open_model(path);
    ASSERT_TRUE(f);
    runner_options ro;
    ro.kv_block_tokens = 16;
    ro.kv_blocks = 2 * kv_copy_blocks;
    ro.max_batch_tokens = 64;
    ro.rows_max = 8;
    ro.seqs_max = 8;
    ro.watchdog_ms = 120'000;
    auto r = runner::create(*f, ro);
    ASSERT_TRUE(r.ok()) << r.err().message;
    runner& run = **r;
    std::vector<std::uint32_t> ids;
    for (std::uint32_t b = 0; b < kv_copy_blocks; ++b) ids.push_back(kv_copy_blocks + b);
    std::vector<std::uint8_t> in(kv_copy_blocks * run.kv_block_bytes()), out(in.size());
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<std::uint8_t>(i * 131 + 7);
    double in_ms = best_ms([&] { ASSERT_TRUE(run.write_kv_blocks(ids, in).ok()); });
    double out_ms = best_ms([&] { ASSERT_TRUE(run.read_kv_blocks(ids, out).ok()); });
    EXPECT_EQ(out, in);
    std::printf("kv copy %s: %u blocks x %llu B = %.1f MiB: out %.2f ms, in %.2f ms\n", sh.name,
                kv_copy_blocks, static_cast<unsigned long long>(run.kv_block_bytes()),
                in.size() / 1048576.0, out_ms, in_ms);
}

TEST(RunnerKvCopy, TimingsSmallAndMedium) {
    ORDO_REQUIRE_GPU();
    if (std::getenv("ORDO_KV_COPY_TIMINGS") == nullptr) {
        GTEST_SKIP() << "set ORDO_KV_COPY_TIMINGS=1 to measure";
    }
    time_shape({"small", 288, 6, 6, 768});
    time_shape({"medium", 768, 12, 12, 2048});
}

}  // namespace
}  // namespace ordo::gpu::testing
