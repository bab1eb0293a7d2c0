// test_reference_cli.cpp: checks `ordo-model generate` end to end (the real binary).
//
// How: runs ORDO_MODEL_TOOL on stories260K with the golden prompt "Once upon a time" and --json,
// and requires the generated ids to equal the golden case's (greedy) and the text to match the
// upstream expected_text continuation; checks that temperature sampling is reproducible from
// its seed and changes with it; that --backend vulkan prints the same as the cpu path (on the
// default device and on --device 0; an unknown --device is an error); and that a missing -n
// and a bad file each exit non-zero with a one-line error. Skips when the shared models folder
// is absent.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "tests/support/scratch_dir.hpp"
#include "tests/support/shared_models.hpp"

namespace {

const std::string k_model = std::string(ORDO_SHARED_MODELS_DIR) + "/stories260K.gguf";

struct run_result {
    int rc = -1;
    std::string out;
    std::string err;
};

run_result run(const std::string& args) {
    const std::string base = (ordo::test::scratch_dir("ordo_gen") / "run").string();
    const std::string cmd = std::string(ORDO_MODEL_TOOL) + " generate " + args + " > " + base +
                            ".out 2> " + base + ".err";
    const int rc = std::system(cmd.c_str());
    run_result r;
    r.rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    std::ifstream o(base + ".out"), e(base + ".err");
    r.out.assign(std::istreambuf_iterator<char>(o), {});
    r.err.assign(std::istreambuf_iterator<char>(e), {});
    std::remove((base + ".out").c_str());
    std::remove((base + ".err").c_str());
    return r;
}

class GenerateCli : public ::testing::Test {
protected:
    void SetUp() override { ORDO_REQUIRE_SHARED(k_model); }
};

}  // namespace

TEST_F(GenerateCli, GreedyMatchesGolden) {
    const run_result r = run(k_model + " --prompt 'Once upon a time' -n 60 --json");
    ASSERT_EQ(r.rc, 0) << r.err;
    // The first and last golden ids of case once_upon_a_time_64_steps, and its text.
    EXPECT_EQ(r.out.rfind("{\"tokens\": [432, 383, 286, 261, 376, 298, 315, 421, 395, 317,", 0), 0u)
        << r.out;
    EXPECT_NE(r.out.find("415, 426, 13, 438, 310]"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\"text\": \", there was a little girl named Lily."), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("but it was too high.\\nLily\"}"), std::string::npos) << r.out;
}

TEST_F(GenerateCli, StreamsPlainText) {
    const run_result r = run(k_model + " --prompt 'Once upon a time' -n 10");
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(r.out, "Once upon a time, there was a little girl named Lily\n");
}

TEST_F(GenerateCli, TemperatureIsSeeded) {
    const std::string args = k_model + " --prompt 'Once' -n 30 --temp 1.0 --json --seed ";
    const run_result a = run(args + "1");
    const run_result b = run(args + "1");
    const run_result c = run(args + "2");
    ASSERT_EQ(a.rc, 0) << a.err;
    EXPECT_EQ(a.out, b.out);
    EXPECT_NE(a.out, c.out);
}

// The Vulkan path (through the gpu actor) prints exactly what the CPU reference prints.
TEST_F(GenerateCli, VulkanBackendMatchesCpu) {
    const std::string args = k_model + " --prompt 'Once upon a time' -n 40 --json";
    const run_result cpu = run(args + " --backend cpu");
    const run_result vk = run(args + " --backend vulkan");
    ASSERT_EQ(cpu.rc, 0) << cpu.err;
    ASSERT_EQ(vk.rc, 0) << vk.err;
    EXPECT_EQ(vk.out, cpu.out);
    run_result bad = run(args + " --backend quantum");
    EXPECT_EQ(bad.rc, 2) << bad.err;
    // --device takes gpu.device's selectors: device index 0 gives the same text too; a name no
    // device has is an error; --device without the vulkan backend is a usage error.
    const run_result first = run(args + " --backend vulkan --device 0");
    ASSERT_EQ(first.rc, 0) << first.err;
    EXPECT_EQ(first.out, cpu.out);
    const run_result none = run(args + " --backend vulkan --device no-such-gpu");
    EXPECT_EQ(none.rc, 1);
    EXPECT_NE(none.err.find("gpu_device_not_found"), std::string::npos) << none.err;
    EXPECT_EQ(run(args + " --device 0").rc, 2);  // --device without --backend vulkan
}

TEST_F(GenerateCli, ErrorsAreOneLine) {
    run_result r = run(k_model + " --prompt hi");
    EXPECT_EQ(r.rc, 2);
    EXPECT_NE(r.err.find("-n N"), std::string::npos) << r.err;
    r = run("/nonexistent.gguf --prompt hi -n 3");
    EXPECT_EQ(r.rc, 1);
    EXPECT_NE(r.err.find("/nonexistent.gguf"), std::string::npos) << r.err;
    r = run(k_model + " --prompt hi -n 5000");  // more than the 2048-position context
    EXPECT_EQ(r.rc, 1);
    EXPECT_NE(r.err.find("reference_ctx_full"), std::string::npos) << r.err;
}
