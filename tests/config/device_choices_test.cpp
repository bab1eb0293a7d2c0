// device_choices_test.cpp: what the keys whose 0 means "the device's choice" become
// (actors/config/device_choices.hpp), from the device's and the model's facts alone.
//
// Checks: a GPU takes 64 sequences and a CPU device (or no device found) 16, each held to an
// explicit max_batch_tokens below it; a GPU's KV pool is every sequence's whole context where
// half of the device-local memory beside the weights holds it, else that half (shared with a
// draft model's pool in proportion to their blocks), and never under 1 MiB on a device the
// weights fill; a CPU device's pool is every sequence's whole context too, at most 256 MiB of the
// host's memory and at least 1 MiB; keys the config sets (and kv_memory_bytes under
// an explicit kv_blocks) are left alone and not reported; the log text names each key.
#include "actors/config/device_choices.hpp"

#include <gtest/gtest.h>

namespace {

using namespace ordo::config;

constexpr std::uint64_t mib = std::uint64_t{1} << 20;
constexpr std::uint64_t gib = std::uint64_t{1} << 30;

device_facts a_gpu(std::uint64_t device_local) {
    return {true, true, "NVIDIA H200 (discrete)", device_local, ""};
}
device_facts a_cpu_device() {
    return {true, false, "llvmpipe (cpu)", 64 * gib, ""};
}

// A 1B Llama 3 shape: 16 layers x K and V x 8 heads x 64 x 16 tokens in f16 per block.
model_facts llama_1b(std::uint32_t n_ctx) {
    model_facts m;
    m.weights_bytes = 800 * mib;
    m.kv_block_bytes = 16 * 2 * 8 * 64 * 16 * 2;  // 512 KiB: 32 KiB a position
    m.n_ctx = n_ctx;
    return m;
}

TEST(DeviceChoices, AGpuDecodesSixtyFourSequencesACpuDeviceSixteen) {
    config gpu_cfg;
    auto chosen = resolve_device_choices(gpu_cfg, a_gpu(80 * gib), llama_1b(4096));
    EXPECT_EQ(gpu_cfg.scheduler.max_sequences, 64u);
    ASSERT_EQ(chosen.size(), 2u);
    EXPECT_EQ(chosen[0].key, "scheduler.max_sequences");
    EXPECT_EQ(chosen[0].value, 64u);

    config cpu_cfg;
    resolve_device_choices(cpu_cfg, a_cpu_device(), llama_1b(4096));
    EXPECT_EQ(cpu_cfg.scheduler.max_sequences, 16u);
    EXPECT_EQ(cpu_cfg.gpu.kv_memory_bytes, 256 * mib);

    config none;
    device_facts missing;
    missing.why_not_found = "no Vulkan physical devices";
    auto c = resolve_device_choices(none, missing, llama_1b(4096));
    EXPECT_EQ(none.scheduler.max_sequences, 16u);
    EXPECT_EQ(none.gpu.kv_memory_bytes, 256 * mib);
    EXPECT_NE(describe(c).find("no device found (no Vulkan physical devices)"), std::string::npos)
        << describe(c);
}

TEST(DeviceChoices, TheSequencesAreHeldToAnExplicitMaxBatchTokens) {
    config cfg;
    cfg.scheduler.max_batch_tokens = 40;
    auto chosen = resolve_device_choices(cfg, a_gpu(80 * gib), llama_1b(4096));
    EXPECT_EQ(cfg.scheduler.max_sequences, 40u);
    EXPECT_NE(chosen[0].why.find("at most scheduler.max_batch_tokens"), std::string::npos);
    cfg = config{};
    cfg.scheduler.max_batch_tokens = 4;
    resolve_device_choices(cfg, a_cpu_device(), llama_1b(4096));
    EXPECT_EQ(cfg.scheduler.max_sequences, 4u);
}

TEST(DeviceChoices, AGpuPoolHoldsEverySequencesContextWhereItFits) {
    config cfg;
    auto chosen = resolve_device_choices(cfg, a_gpu(80 * gib), llama_1b(4096));
    // 64 sequences x 4096 positions x 32 KiB.
    EXPECT_EQ(cfg.gpu.kv_memory_bytes, 64ull * 4096 * 32 * 1024);
    ASSERT_EQ(chosen.size(), 2u);
    EXPECT_EQ(chosen[1].key, "gpu.kv_memory_bytes");
    EXPECT_EQ(chosen[1].value, cfg.gpu.kv_memory_bytes);
    EXPECT_NE(chosen[1].why.find("which the device holds"), std::string::npos) << chosen[1].why;

    // A context that is not a whole number of blocks is rounded up to one.
    cfg = config{};
    resolve_device_choices(cfg, a_gpu(80 * gib), llama_1b(4097));
    EXPECT_EQ(cfg.gpu.kv_memory_bytes, 64ull * (4096 + 16) * 32 * 1024);

    // A small model's pool is what it needs, not the device's half.
    cfg = config{};
    model_facts tiny;
    tiny.weights_bytes = mib;
    tiny.kv_block_bytes = 2048;
    tiny.n_ctx = 128;
    resolve_device_choices(cfg, a_gpu(80 * gib), tiny);
    EXPECT_EQ(cfg.gpu.kv_memory_bytes, 64ull * 8 * 2048);
}

TEST(DeviceChoices, ACpuDevicePoolHoldsEverySequencesContextUpTo256MiB) {
    // 16 sequences x 4096 positions x 32 KiB = 2 GiB: held to 256 MiB of the host's memory.
    config cfg;
    auto chosen = resolve_device_choices(cfg, a_cpu_device(), llama_1b(4096));
    EXPECT_EQ(cfg.gpu.kv_memory_bytes, kv_memory_bytes_cpu_device);
    ASSERT_EQ(chosen.size(), 2u);
    EXPECT_EQ(chosen[1].why,
              "a CPU device: 16 sequences x 4096 positions need 2048 MiB; its device memory is "
              "the host's: at most 256 MiB");

    // 16 x 256 positions x 32 KiB = 128 MiB: what it needs.
    cfg = config{};
    chosen = resolve_device_choices(cfg, a_cpu_device(), llama_1b(256));
    EXPECT_EQ(cfg.gpu.kv_memory_bytes, 16ull * 256 * 32 * 1024);
    EXPECT_EQ(chosen[1].why, "a CPU device: 16 sequences x 256 positions need 128 MiB");

    // A tiny model's 16 x 8 blocks of 2 KiB (256 KiB) get the least pool, 1 MiB.
    cfg = config{};
    model_facts tiny;
    tiny.weights_bytes = mib;
    tiny.kv_block_bytes = 2048;
    tiny.n_ctx = 128;
    chosen = resolve_device_choices(cfg, a_cpu_device(), tiny);
    EXPECT_EQ(cfg.gpu.kv_memory_bytes, kv_memory_bytes_least);
    EXPECT_EQ(chosen[1].why, "a CPU device: 16 sequences x 128 positions need 256 KiB");
}

TEST(DeviceChoices, ALongContextTakesHalfOfTheMemoryBesideTheWeights) {
    config cfg;
    // 64 x 131072 positions x 32 KiB = 256 GiB: more than an 80 GiB device.
    auto chosen = resolve_device_choices(cfg, a_gpu(80 * gib), llama_1b(131072));
    EXPECT_EQ(cfg.gpu.kv_memory_bytes, (80 * gib - 800 * mib) / 2);
    EXPECT_NE(chosen[1].why.find("; the pool takes half of the"), std::string::npos)
        << chosen[1].why;

    // A draft model's pool comes out of the same half, in proportion to its block: a block a
    // quarter of the served one's leaves the served pool 4/5 of it.
    cfg = config{};
    model_facts m = llama_1b(131072);
    m.draft_kv_block_bytes = m.kv_block_bytes / 4;
    chosen = resolve_device_choices(cfg, a_gpu(80 * gib), m);
    const std::uint64_t half = (80 * gib - 800 * mib) / 2;
    EXPECT_NEAR(double(cfg.gpu.kv_memory_bytes), double(half) * 4 / 5, 1.0);
    EXPECT_NE(chosen[1].why.find("pools (served and draft)"), std::string::npos);

    // A draft block larger than the served one counts as the served one's (its pool is capped
    // at the served pool's bytes): half each.
    cfg = config{};
    m.draft_kv_block_bytes = m.kv_block_bytes * 3;
    resolve_device_choices(cfg, a_gpu(80 * gib), m);
    EXPECT_NEAR(double(cfg.gpu.kv_memory_bytes), double(half) / 2, 1.0);
}

TEST(DeviceChoices, ADeviceTheWeightsFillGetsTheLeastPool) {
    config cfg;
    model_facts m = llama_1b(131072);
    m.weights_bytes = 90 * gib;
    resolve_device_choices(cfg, a_gpu(80 * gib), m);
    EXPECT_EQ(cfg.gpu.kv_memory_bytes, kv_memory_bytes_least);
}

TEST(DeviceChoices, KeysTheConfigSetsAreLeftAloneAndNotReported) {
    config cfg;
    cfg.scheduler.max_sequences = 7;
    cfg.gpu.kv_memory_bytes = 3 * mib;
    EXPECT_TRUE(resolve_device_choices(cfg, a_gpu(80 * gib), llama_1b(4096)).empty());
    EXPECT_EQ(cfg.scheduler.max_sequences, 7u);
    EXPECT_EQ(cfg.gpu.kv_memory_bytes, 3 * mib);

    // With kv_blocks set the pool's bytes are not used: a value, but no choice to report.
    cfg = config{};
    cfg.gpu.kv_blocks = 100;
    auto chosen = resolve_device_choices(cfg, a_gpu(80 * gib), llama_1b(4096));
    ASSERT_EQ(chosen.size(), 1u);
    EXPECT_EQ(chosen[0].key, "scheduler.max_sequences");
    EXPECT_NE(cfg.gpu.kv_memory_bytes, 0u);
}

TEST(DeviceChoices, TheLogLineNamesEveryKeyWithItsValueAndWhy) {
    config cfg;
    const std::string line = describe(resolve_device_choices(cfg, a_gpu(80 * gib), llama_1b(4096)));
    EXPECT_EQ(line,
              "scheduler.max_sequences = 64 (a GPU); gpu.kv_memory_bytes = 8589934592 (a GPU: 64 "
              "sequences x 4096 positions need 8192 MiB, which the device holds)");
}

}  // namespace
