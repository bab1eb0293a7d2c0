// test_quant.cpp: checks model/fp16.hpp and model/quant.hpp.
//
// How: F16 conversion against hand-derived bit patterns (normals, rounding ties to even,
// subnormals, overflow to inf, NaN) and an exhaustive round trip of all 65536 halves; Q8_0 and
// Q4_0 rows of seeded random data quantized and decoded, each element within the bound stated
// in quant.hpp; the Q4_0 nibble order against a block built by hand; dot_row equal to the dot
// product of the dequantized row; bad types and lengths rejected with their error codes.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "model/fp16.hpp"
#include "model/quant.hpp"

using namespace ordo::model;

namespace {

std::vector<float> random_row(size_t n, uint32_t seed, float scale) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    return v;
}

}  // namespace

TEST(Fp16, ExactNormalsAndSpecials) {
    EXPECT_EQ(f32_to_f16(0.0f), 0x0000);
    EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
    EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
    EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
    EXPECT_EQ(f32_to_f16(0.5f), 0x3800);
    EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);  // largest finite half
    EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7c00);
    EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::infinity()), 0xfc00);
    const uint16_t nan = f32_to_f16(std::numeric_limits<float>::quiet_NaN());
    EXPECT_EQ(nan & 0x7c00, 0x7c00);
    EXPECT_NE(nan & 0x03ff, 0);  // still NaN, not inf
    // A signalling NaN whose payload lives only in the low bits must not become inf.
    const uint16_t snan = f32_to_f16(std::bit_cast<float>(0x7f800001u));
    EXPECT_NE(snan & 0x03ff, 0);
    EXPECT_TRUE(std::isnan(f16_to_f32(snan)));
}

TEST(Fp16, RoundsToNearestEven) {
    // 1 + 2^-11 is exactly halfway between 1 and 1 + 2^-10: ties go to the even mantissa (1).
    EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
    // 1 + 3*2^-11 is halfway between mantissa 1 and 2: goes to 2.
    EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
    // Just above the tie rounds up.
    EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3c01);
    // 65519 rounds down to 65504; 65520 (the tie) goes to inf (the even neighbour).
    EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
    EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
    EXPECT_EQ(f32_to_f16(1e10f), 0x7c00);
}

TEST(Fp16, Subnormals) {
    const float tiny = std::ldexp(1.0f, -24);  // smallest half subnormal
    EXPECT_EQ(f32_to_f16(tiny), 0x0001);
    EXPECT_EQ(f16_to_f32(0x0001), tiny);
    EXPECT_EQ(f32_to_f16(-tiny), 0x8001);
    EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);      // tie -> even (zero)
    EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);      // above the tie
    EXPECT_EQ(f32_to_f16(3 * std::ldexp(1.0f, -25)), 0x0002);  // tie 1|2 -> 2
    EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -14)), 0x0400);      // smallest normal
    EXPECT_EQ(f32_to_f16(std::ldexp(1023.0f, -24)), 0x03ff);   // largest subnormal
    EXPECT_EQ(f32_to_f16(std::ldexp(1023.5f, -24)), 0x0400);   // tie carries to normal
    EXPECT_EQ(f32_to_f16(1e-30f), 0x0000);
    EXPECT_EQ(f16_to_f32(0x03ff), std::ldexp(1023.0f, -24));
}

TEST(Fp16, EveryHalfRoundTrips) {
    for (uint32_t h = 0; h < 0x10000; ++h) {
        const float f = f16_to_f32(static_cast<f16_bits>(h));
        if (std::isnan(f)) {
            EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f)))) << std::hex << h;
            continue;
        }
        EXPECT_EQ(f32_to_f16(f), h) << std::hex << h;
    }
}

TEST(Quant, F32AndF16Rows) {
    const auto x = random_row(64, 1, 1.0f);
    std::vector<uint8_t> buf(row_bytes(ggml_type::f32, 64));
    ASSERT_EQ(buf.size(), 256u);
    ASSERT_TRUE(quantize_row(ggml_type::f32, x.data(), buf.data(), 64).ok());
    std::vector<float> y(64);
    ASSERT_TRUE(dequantize_row(ggml_type::f32, buf.data(), y.data(), 64).ok());
    EXPECT_EQ(x, y);

    buf.assign(row_bytes(ggml_type::f16, 64), 0);
    ASSERT_EQ(buf.size(), 128u);
    ASSERT_TRUE(quantize_row(ggml_type::f16, x.data(), buf.data(), 64).ok());
    ASSERT_TRUE(dequantize_row(ggml_type::f16, buf.data(), y.data(), 64).ok());
    for (size_t i = 0; i < 64; ++i) {
        EXPECT_EQ(y[i], f16_to_f32(f32_to_f16(x[i])));
        EXPECT_LE(std::fabs(y[i] - x[i]), std::fabs(x[i]) * std::ldexp(1.0f, -11) + 1e-7f);
    }
}

TEST(Quant, Q8_0ErrorBound) {
    constexpr size_t n = 32 * 64;
    const auto x = random_row(n, 2, 0.5f);
    std::vector<uint8_t> buf(row_bytes(ggml_type::q8_0, n));
    ASSERT_EQ(buf.size(), n / 32 * 34);
    ASSERT_TRUE(quantize_row(ggml_type::q8_0, x.data(), buf.data(), n).ok());
    std::vector<float> y(n);
    ASSERT_TRUE(dequantize_row(ggml_type::q8_0, buf.data(), y.data(), n).ok());
    for (size_t b = 0; b < n / 32; ++b) {
        float amax = 0.0f;
        for (size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
        // d/2 for the integer rounding plus the f16 rounding of d times |q| <= 127.
        const float bound = amax / 127.0f * 0.5f + amax * std::ldexp(1.0f, -11) + 1e-7f;
        for (size_t i = 0; i < 32; ++i) {
            EXPECT_LE(std::fabs(x[b * 32 + i] - y[b * 32 + i]), bound) << b << ":" << i;
        }
    }
}

TEST(Quant, Q4_0ErrorBound) {
    constexpr size_t n = 32 * 64;
    const auto x = random_row(n, 3, 0.5f);
    std::vector<uint8_t> buf(row_bytes(ggml_type::q4_0, n));
    ASSERT_EQ(buf.size(), n / 32 * 18);
    ASSERT_TRUE(quantize_row(ggml_type::q4_0, x.data(), buf.data(), n).ok());
    std::vector<float> y(n);
    ASSERT_TRUE(dequantize_row(ggml_type::q4_0, buf.data(), y.data(), n).ok());
    double err_sum = 0.0;
    for (size_t b = 0; b < n / 32; ++b) {
        float amax = 0.0f;
        for (size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
        const float bound = amax / 8.0f * (1.0f + std::ldexp(1.0f, -10)) + 1e-7f;
        for (size_t i = 0; i < 32; ++i) {
            const float e = std::fabs(x[b * 32 + i] - y[b * 32 + i]);
            EXPECT_LE(e, bound) << b << ":" << i;
            err_sum += e / amax;
        }
    }
    // On average rounding costs about a quarter step (1/32 of amax); a wrong nibble order or
    // offset would be far worse than 1/16.
    EXPECT_LT(err_sum / n, 1.0 / 16.0);
}

TEST(Quant, Q4_0NibbleOrderMatchesHandBuiltBlock) {
    // d = 0.5 (0x3800); qs[j] low nibble = element j, high nibble = element j + 16.
    block_q4_0 blk{};
    blk.d = 0x3800;
    for (int j = 0; j < 16; ++j) {
        const int lo = j;       // element j      -> (j - 8) * 0.5
        const int hi = 15 - j;  // element j + 16 -> (7 - j) * 0.5
        blk.qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
    uint8_t raw[18];
    std::memcpy(raw, &blk, sizeof raw);
    EXPECT_EQ(raw[0], 0x00);  // f16 0x3800 little-endian
    EXPECT_EQ(raw[1], 0x38);
    EXPECT_EQ(raw[2], 0xf0);  // element 0 = nibble 0, element 16 = nibble 15
    float y[32];
    ASSERT_TRUE(dequantize_row(ggml_type::q4_0, raw, y, 32).ok());
    for (int j = 0; j < 16; ++j) {
        EXPECT_EQ(y[j], (j - 8) * 0.5f) << j;
        EXPECT_EQ(y[j + 16], (7 - j) * 0.5f) << j;
    }
    // Quantizing those exact values reproduces the block: the max-magnitude element is -4
    // (element 0), so d = -4 / -8 = 0.5 and every value is an exact step.
    uint8_t again[18];
    ASSERT_TRUE(quantize_row(ggml_type::q4_0, y, again, 32).ok());
    EXPECT_EQ(std::memcmp(raw, again, sizeof raw), 0);
}

TEST(Quant, Q8_0HandBuiltBlock) {
    uint8_t raw[34] = {};
    raw[0] = 0x00;
    raw[1] = 0x40;  // d = 2.0
    for (int i = 0; i < 32; ++i) raw[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(i - 16));
    float y[32];
    ASSERT_TRUE(dequantize_row(ggml_type::q8_0, raw, y, 32).ok());
    for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], (i - 16) * 2.0f) << i;
}

TEST(Quant, ZeroBlockDecodesToZero) {
    const std::vector<float> x(32, 0.0f);
    for (auto t : {ggml_type::q8_0, ggml_type::q4_0}) {
        std::vector<uint8_t> buf(row_bytes(t, 32));
        ASSERT_TRUE(quantize_row(t, x.data(), buf.data(), 32).ok());
        std::vector<float> y(32, 1.0f);
        ASSERT_TRUE(dequantize_row(t, buf.data(), y.data(), 32).ok());
        for (float v : y) EXPECT_EQ(v, 0.0f);
    }
}

TEST(Quant, DotRowMatchesDequantizedDot) {
    constexpr size_t n = 256;
    const auto w = random_row(n, 4, 0.1f);
    const auto x = random_row(n, 5, 1.0f);
    for (auto t : {ggml_type::f32, ggml_type::f16, ggml_type::q8_0, ggml_type::q4_0}) {
        std::vector<uint8_t> buf(row_bytes(t, n));
        ASSERT_TRUE(quantize_row(t, w.data(), buf.data(), n).ok());
        std::vector<float> wd(n);
        ASSERT_TRUE(dequantize_row(t, buf.data(), wd.data(), n).ok());
        double want = 0.0;
        for (size_t i = 0; i < n; ++i) want += static_cast<double>(wd[i]) * x[i];
        EXPECT_NEAR(dot_row(t, buf.data(), x.data(), n), want, 1e-4) << type_name(t);
    }
}

TEST(Quant, RejectsBadTypeAndLength) {
    float x[64] = {};
    uint8_t buf[512];
    auto st = quantize_row(ggml_type::iq4_xs, x, buf, 256);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.err().code, "quant_unsupported_type");
    EXPECT_NE(st.err().message.find("iq4_xs"), std::string::npos);
    st = dequantize_row(ggml_type::q8_0, buf, x, 33);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.err().code, "quant_bad_length");
    EXPECT_EQ(row_bytes(ggml_type::q4_0, 31), 0u);
    EXPECT_EQ(row_bytes(ggml_type::iq4_xs, 256), 0u);
}
