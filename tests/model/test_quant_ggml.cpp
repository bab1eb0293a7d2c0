// test_quant_ggml.cpp: checks that ordo's decoding (model/quant.hpp) reads the blocks ggml
// writes as ggml means them.
//
// How, K types (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): ../shared/models/kquant/ holds 16 super-blocks
// per type made by ggml's reference code, twice: `real_<type>.blocks` (ggml's quantization of
// stories260K's first 4096 embedding values) and `random_<type>.blocks` (random bytes with
// finite f16 scales, so every quant bit pattern occurs), each with ggml's
// `dequantize_row_<type>` output in `.dequant.f32`. The test decodes each block file with
// dequantize_row and requires the floats to be identical bit patterns (memcmp, no tolerance),
// reporting the first differing element. It also checks each file's size is exactly 16 blocks
// of the type's block bytes, so a wrong layout size cannot pass by reading fewer bytes; and
// compares the quantization error of ggml's real blocks and of ordo's own encoder on the same
// input.
// How, 32-element types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and F16: there is no ggml decoder output
// for these, so every tensor of llama-quantize's stories260K-<type>.gguf files (quant/) is
// decoded and compared with the F32 original it was made from (../stories260K.gguf): each
// element within the block's own quantization step (half a step for the rounding types), which
// a wrong nibble order, high-bit order or offset would exceed many times over; F16 tensors equal
// the originals rounded to half.
// Skips with a message when ../shared/models is absent.
#include <gtest/gtest.h>

#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "model/gguf.hpp"
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

TEST(QuantGgml, RealBlocksDecodeBitForBit) {
    for (const auto& c : k_cases) {
        SCOPED_TRACE(type_name(c.type));
        check_file(c, "real");
        if (HasFatalFailure() || IsSkipped()) return;
    }
}

TEST(QuantGgml, RandomBlocksDecodeBitForBit) {
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
TEST(QuantGgml, RealBlocksApproximateTheirInput) {
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

// ---- 32-element types, against llama-quantize's files ------------------------------------------

namespace {

// The largest error ggml's reference quantizer allows per element of one block, from the
// block's own bytes: a full step |d| for the types whose largest value sets d (the clamp at the
// top quant can cost a step), half a step for the rounding ones; plus the f16 rounding of d
// (up to 2^-11 relative) times the largest quant, and of the offset m (Q4_1, Q5_1).
float block_tolerance(ggml_type t, const uint8_t* block) {
    uint16_t d_bits, m_bits;
    std::memcpy(&d_bits, block, 2);
    std::memcpy(&m_bits, block + 2, 2);
    const float d = std::fabs(f16_to_f32(d_bits));
    const float m = std::fabs(f16_to_f32(m_bits));
    constexpr float f16_rel = 1.0f / 2048.0f;
    constexpr float slack = 1e-6f;
    switch (t) {
        case ggml_type::q4_0:
            return d * (1.0f + 8 * f16_rel) + slack;
        case ggml_type::q5_0:
            return d * (1.0f + 16 * f16_rel) + slack;
        case ggml_type::q8_0:
            return d * (0.5f + 127 * f16_rel) + slack;
        case ggml_type::q4_1:
            return d * (0.5f + 15 * f16_rel) + m * f16_rel + slack;
        default:  // q5_1
            return d * (0.5f + 31 * f16_rel) + m * f16_rel + slack;
    }
}

}  // namespace

TEST(QuantGgml, LlamaQuantizeBlocksDecodeToTheirF32Originals) {
    const std::string models = std::string(ORDO_SHARED_MODELS_DIR);
    ORDO_REQUIRE_SHARED(models + "/stories260K.gguf");
    auto original = gguf_file::open(models + "/stories260K.gguf");
    ASSERT_TRUE(original.ok()) << original.err().message;
    const ggml_type types[] = {ggml_type::q4_0, ggml_type::q4_1, ggml_type::q5_0, ggml_type::q5_1,
                               ggml_type::q8_0};
    for (ggml_type type : types) {
        std::string upper(type_name(type));
        for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
        const std::string path = models + "/quant/stories260K-" + upper + ".gguf";
        SCOPED_TRACE(path);
        ORDO_REQUIRE_SHARED(path);
        auto f = gguf_file::open(path);
        ASSERT_TRUE(f.ok()) << f.err().message;
        size_t blocks = 0, f16_tensors = 0;
        double err_steps = 0.0;  // sum of |error| / tolerance, for the mean printed
        for (const auto& t : f->tensors()) {
            const gguf_tensor_info* o = original->find_tensor(t.name);
            ASSERT_NE(o, nullptr) << t.name;
            ASSERT_EQ(o->type, ggml_type::f32);
            ASSERT_EQ(o->n_elements, t.n_elements) << t.name;
            std::vector<float> want(o->n_elements), got(t.n_elements);
            std::memcpy(want.data(), o->data.data(), o->n_bytes);
            ASSERT_TRUE(dequantize_row(t.type, t.data.data(), got.data(), got.size()).ok());
            if (t.type == ggml_type::f32) {
                EXPECT_EQ(got, want) << t.name;
                continue;
            }
            if (t.type == ggml_type::f16) {
                ++f16_tensors;
                for (size_t i = 0; i < got.size(); ++i) {
                    ASSERT_EQ(got[i], f16_to_f32(f32_to_f16(want[i]))) << t.name << " " << i;
                }
                continue;
            }
            ASSERT_EQ(t.type, type) << t.name;
            const size_t bs = block_size(type), bb = block_bytes(type);
            for (size_t b = 0; b < t.n_elements / bs; ++b) {
                const float tol = block_tolerance(type, t.data.data() + b * bb);
                for (size_t i = b * bs; i < (b + 1) * bs; ++i) {
                    const float e = std::fabs(got[i] - want[i]);
                    ASSERT_LE(e, tol) << t.name << " block " << b << " element " << i - b * bs
                                      << ": " << want[i] << " decoded as " << got[i];
                    err_steps += e / tol;
                }
                ++blocks;
            }
        }
        EXPECT_EQ(f16_tensors, 5u);  // ffn_down's 172-wide rows fall back to F16
        EXPECT_GT(blocks, 1000u);
        std::printf("%s: %zu blocks, mean |error| %.3f of the tolerance\n",
                    std::string(type_name(type)).c_str(), blocks, err_steps / (blocks * 32.0));
    }
}
