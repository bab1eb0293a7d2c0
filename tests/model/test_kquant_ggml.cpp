// test_kquant_ggml.cpp: checks that ordo's decoding of the K types (Q2_K, Q3_K, Q4_K, Q5_K,
// Q6_K; model/quant.hpp) equals ggml's own dequantization bit for bit.
//
// How: for every type, ../shared/models/kquant/ holds 16 super-blocks made by ggml's reference
// code, twice: `real_<type>.blocks` (ggml's quantization of stories260K's first 4096 embedding
// values) and `random_<type>.blocks` (random bytes with finite f16 scales, so every quant bit
// pattern occurs), each with ggml's `dequantize_row_<type>` output in `.dequant.f32`. The test
// decodes each block file with dequantize_row and requires the floats to be identical bit
// patterns (memcmp, no tolerance), reporting the first differing element. It also checks each
// file's size is exactly 16 blocks of the type's block bytes, so a wrong layout size cannot
// pass by reading fewer bytes; and compares the quantization error of ggml's real blocks and of
// ordo's own encoder on the same input. Skips with a message when ../shared/models is absent.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "model/quant.hpp"
#include "tests/support/shared_models.hpp"

using namespace ordo::model;

namespace {

const std::string k_dir = std::string(ORDO_SHARED_MODELS_DIR) + "/kquant";
constexpr size_t k_blocks = 16;

std::vector<uint8_t> read_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

struct kquant_case {
    ggml_type type;
    const char* file_name;  // as ggml spells it: "q4_K"
};

const kquant_case k_cases[] = {
    {ggml_type::q2_k, "q2_K"}, {ggml_type::q3_k, "q3_K"}, {ggml_type::q4_k, "q4_K"},
    {ggml_type::q5_k, "q5_K"}, {ggml_type::q6_k, "q6_K"},
};

// Decodes `<kind>_<type>.blocks` and compares it with `.dequant.f32`, bit for bit.
void check_file(const kquant_case& c, const std::string& kind) {
    const std::string stem = k_dir + "/" + kind + "_" + c.file_name;
    ORDO_REQUIRE_SHARED(stem + ".blocks");
    const std::vector<uint8_t> blocks = read_bytes(stem + ".blocks");
    const std::vector<uint8_t> want_bytes = read_bytes(stem + ".dequant.f32");
    const size_t n = k_blocks * block_size(c.type);
    ASSERT_EQ(blocks.size(), k_blocks * block_bytes(c.type)) << stem;
    ASSERT_EQ(want_bytes.size(), n * sizeof(float)) << stem;
    ASSERT_EQ(row_bytes(c.type, n), blocks.size());

    std::vector<float> got(n);
    ASSERT_TRUE(dequantize_row(c.type, blocks.data(), got.data(), n).ok());
    std::vector<float> want(n);
    std::memcpy(want.data(), want_bytes.data(), want_bytes.size());
    for (size_t i = 0; i < n; ++i) {
        const auto g = std::bit_cast<uint32_t>(got[i]);
        const auto w = std::bit_cast<uint32_t>(want[i]);
        ASSERT_EQ(g, w) << stem << ": element " << i << " (block " << i / 256 << ", index "
                        << i % 256 << "): ordo " << got[i] << ", ggml " << want[i];
    }
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want_bytes.size()), 0);
}

}  // namespace

TEST(KquantGgml, RealBlocksDecodeBitForBit) {
    for (const auto& c : k_cases) {
        SCOPED_TRACE(type_name(c.type));
        check_file(c, "real");
        if (HasFatalFailure() || IsSkipped()) return;
    }
}

TEST(KquantGgml, RandomBlocksDecodeBitForBit) {
    for (const auto& c : k_cases) {
        SCOPED_TRACE(type_name(c.type));
        check_file(c, "random");
        if (HasFatalFailure() || IsSkipped()) return;
    }
}

// The real blocks are a quantization of a known input: each decoded row is near it (a sanity
// check on the files and the pairing of blocks with types: decoding Q4_K blocks as Q5_K, or a
// wrong sub-block order, gives errors as large as the signal). ggml's quantization error on this
// input, as a fraction of its rms, is 0.36 (Q2_K), 0.15, 0.081, 0.038, 0.017 (Q6_K); the bounds
// leave about a quarter of headroom. ordo's own encoders (simpler: no search for the best
// scales) measure 0.378, 0.156, 0.093, 0.042, 0.019 on the same input and must stay within
// 1.25x of ggml's.
TEST(KquantGgml, RealBlocksApproximateTheirInput) {
    const std::string in_path = k_dir + "/input_stories260K_token_embd_first4096.f32";
    ORDO_REQUIRE_SHARED(in_path);
    const std::vector<uint8_t> in_bytes = read_bytes(in_path);
    ASSERT_EQ(in_bytes.size(), 4096 * sizeof(float));
    std::vector<float> x(4096);
    std::memcpy(x.data(), in_bytes.data(), in_bytes.size());
    double rms_x = 0.0;
    for (float v : x) rms_x += double(v) * v;
    rms_x = std::sqrt(rms_x / 4096);
    const double bound[] = {0.45, 0.19, 0.10, 0.048, 0.022};  // per k_cases entry
    for (size_t k = 0; k < std::size(k_cases); ++k) {
        const auto& c = k_cases[k];
        const std::vector<uint8_t> blocks =
            read_bytes(k_dir + "/real_" + std::string(c.file_name) + ".blocks");
        ASSERT_EQ(blocks.size(), k_blocks * block_bytes(c.type));
        std::vector<float> y(4096);
        ASSERT_TRUE(dequantize_row(c.type, blocks.data(), y.data(), 4096).ok());
        double rms_e = 0.0;
        for (size_t i = 0; i < 4096; ++i) rms_e += double(x[i] - y[i]) * (x[i] - y[i]);
        rms_e = std::sqrt(rms_e / 4096);
        EXPECT_LT(rms_e, bound[k] * rms_x) << type_name(c.type);
        // ordo's own encoder on the same input, for comparison.
        std::vector<uint8_t> ours(blocks.size());
        ASSERT_TRUE(quantize_row(c.type, x.data(), ours.data(), 4096).ok());
        std::vector<float> z(4096);
        ASSERT_TRUE(dequantize_row(c.type, ours.data(), z.data(), 4096).ok());
        double rms_o = 0.0;
        for (size_t i = 0; i < 4096; ++i) rms_o += double(x[i] - z[i]) * (x[i] - z[i]);
        rms_o = std::sqrt(rms_o / 4096);
        std::printf("%s: rms error / rms: ggml %.4f, ordo %.4f\n",
                    std::string(type_name(c.type)).c_str(), rms_e / rms_x, rms_o / rms_x);
        EXPECT_LT(rms_o, 1.25 * rms_e) << type_name(c.type);
    }
}
