// test_logits_summary.cpp: the logits_summary kernel (gpu/vk/shaders/logits_summary.comp) on the
// real Vulkan device against the host's summarize() (scheduler/sampling.cpp), which the sampler's
// summary path is tested with: for row lengths below, at and above the 64 candidates and not
// multiples of the 256-lane workgroup, up to a Llama 3 vocabulary (128256), rows full of ties
// (equal logits, +0.0 and -0.0, whole rows of one value: the lower ids first), and rows read at
// an offset and stride with a shorter sample_vocab than the row, several rows in one dispatch
// with their own temperatures; and rows shaped to take each path of the kernel's select (its
// first stage's histogram by distance below the maximum, then a radix select on the keys of the
// bin holding the 64th): a trained model's shape (a few entries far above the bulk), a bin
// holding exactly the entries still needed (no radix pass), ties straddling the 64th inside
// one bin, and rows whose 64th is beyond the histogram's 16 nats (the radix select on every
// entry: a few peaks over a far bulk, a few over a floor of ties). The count, candidates (ids and
// logit bits) and maximum must be exact; the normalisers (float sums on the device, double on the
// host) within 1e-5 relative. Through read_summary, the words are what the scheduler accepts.
#include <cmath>
#include <cstring>

#include "gpu/vk/shaders/abi.h"
#include "gpu_fixture.hpp"
#include "scheduler/sampling.hpp"

namespace ordo::gpu::testing {
namespace {

struct row_case {
    std::vector<float> logits;
    float temperature;
};

std::vector<float> tied_row(std::uint32_t n, std::uint32_t seed) {
    // Few distinct values, so the 64th candidate's value is shared by many ids on both sides.
    auto r = random_floats(n, seed, 1.0f);
    for (float& v : r) v = std::round(v * 3.0f);
    for (std::uint32_t i = 0; i < n; i += 7) r[i] = (i / 7) % 2 ? 0.0f : -0.0f;
    return r;
}

void check_rows(const std::vector<row_case>& rows, std::uint32_t n_sample, std::uint32_t stride,
                std::uint32_t offset) {
    const auto n_rows = static_cast<std::uint32_t>(rows.size());
    std::vector<float> packed(offset + std::size_t(n_rows) * stride, 7.0f);  // pads: never read
    std::vector<float> temps;
    for (std::uint32_t r = 0; r < n_rows; ++r) {
        ASSERT_GE(rows[r].logits.size(), n_sample);
        std::copy(rows[r].logits.begin(), rows[r].logits.begin() + n_sample,
                  packed.begin() + offset + std::size_t(r) * stride);
        temps.push_back(rows[r].temperature);
    }
    buffer lb = make_buffer(packed), tb = make_buffer(temps);
    buffer sb =
        make_buffer(std::vector<std::uint32_t>(std::size_t(n_rows) * abi::ORDO_SUMMARY_WORDS));
    ASSERT_TRUE(env().str->begin("summary").ok());
    ASSERT_TRUE(encode_logits_summary(*env().str, {whole(lb), offset, stride}, whole(tb), whole(sb),
                                      n_sample, n_rows)
                    .ok());
    run_segment("summary");
    auto words = read_buffer<std::uint32_t>(sb, std::size_t(n_rows) * abi::ORDO_SUMMARY_WORDS);
    for (std::uint32_t r = 0; r < n_rows; ++r) {
        SCOPED_TRACE("row " + std::to_string(r) + " of " + std::to_string(n_sample));
        std::span<const float> row(rows[r].logits.data(), n_sample);
        const auto want = sched::summarize(row, rows[r].temperature);
        auto got = sched::read_summary(
            std::span<const std::uint32_t>(words).subspan(std::size_t(r) * abi::ORDO_SUMMARY_WORDS,
                                                          abi::ORDO_SUMMARY_WORDS),
            n_sample, rows[r].temperature);
        ASSERT_TRUE(got.ok()) << got.err().message;
        ASSERT_EQ(got->count, want.count);
        EXPECT_EQ(std::memcmp(&got->max, &want.max, 4), 0) << got->max << " vs " << want.max;
        for (std::uint32_t i = 0; i < want.count; ++i) {
            ASSERT_EQ(got->ids[i], want.ids[i]) << "candidate " << i;
            ASSERT_EQ(std::memcmp(&got->logits[i], &want.logits[i], 4), 0) << "candidate " << i;
        }
        EXPECT_NEAR(got->mass, want.mass, 1e-5 * want.mass);
        if (rows[r].temperature > 0.0f) {
            EXPECT_NEAR(got->mass_t, want.mass_t, 1e-5 * want.mass_t);
        } else {
            EXPECT_EQ(got->mass_t, 0.0f);
        }
    }
}

TEST(LogitsSummary, MatchesTheHostAtEveryRowLength) {
    ORDO_REQUIRE_GPU();
    std::uint32_t seed = 1;
    for (std::uint32_t n : {1u, 5u, 63u, 64u, 65u, 257u, 1000u, 32000u, 128256u}) {
        std::vector<row_case> rows;
        rows.push_back({random_floats(n, seed++, 8.0f), 1.0f});
        rows.push_back({random_floats(n, seed++, 2.0f), 0.7f});
        rows.push_back({tied_row(n, seed++), 0.0f});
        rows.push_back({std::vector<float>(n, -3.5f), 1.5f});  // one value: ids 0..63
        check_rows(rows, n, n, 0);
    }
}

// Rows shaped for each path of the select (the file's header), at two lengths.
TEST(LogitsSummary, EachPathOfTheSelectMatchesTheHost) {
    ORDO_REQUIRE_GPU();
    std::uint32_t seed = 100;
    for (std::uint32_t n : {3000u, 128256u}) {
        SCOPED_TRACE("n " + std::to_string(n));
        std::vector<row_case> rows;
        // Trained-like: a bulk around 0, twenty spikes 6-12 above it; the 64th is in the bulk's
        // upper tail, a few entries per bin.
        auto trained = random_floats(n, seed++, 3.0f);
        for (std::uint32_t i = 0; i < 20; ++i) trained[(i * 7919u) % n] = 6.0f + 0.3f * float(i);
        rows.push_back({trained, 0.8f});
        // Exactly 64 entries in the nearest bin: taken whole, no radix pass.
        auto exact = random_floats(n, seed++, 3.0f);
        for (std::uint32_t i = 0; i < 64; ++i) exact[(i * 104729u) % n] = 10.0f;
        rows.push_back({exact, 1.0f});
        // 60 at the maximum and 20 a hundredth below it, all in the nearest bin: the radix
        // select ranks them, and 4 of the 20 ties are taken, the lowest ids first.
        auto straddle = random_floats(n, seed++, 3.0f);
        for (std::uint32_t i = 0; i < 80; ++i) {
            straddle[(i * 15485863u) % n] = i < 60 ? 10.0f : 9.99f;
        }
        rows.push_back({straddle, 0.5f});
        // Ten peaks, the bulk 40 nats below: the 64th is beyond the histogram.
        auto peaked = random_floats(n, seed++, 3.0f);
        for (float& v : peaked) v -= 40.0f;
        for (std::uint32_t i = 0; i < 10; ++i) peaked[(i * 31u) % n] = 5.0f - 0.5f * float(i);
        rows.push_back({peaked, 1.0f});
        // 40 entries over a floor 1000 below them: the rest of the 64 are ties at the floor,
        // beyond the histogram, taken in id order.
        std::vector<float> floor(n, -1000.0f);
        for (std::uint32_t i = 0; i < 40; ++i) floor[(i * 97u) % n] = float(i % 9) - 4.0f;
        rows.push_back({floor, 0.0f});
        check_rows(rows, n, n, 0);
    }
}

TEST(LogitsSummary, ReadsItsRowsAtAnOffsetAndStrideUpToSampleVocab) {
    ORDO_REQUIRE_GPU();
    // A padded head: rows of 1100 entries of which the first 1031 are the tokenizer's.
    std::vector<row_case> rows;
    for (std::uint32_t r = 0; r < 5; ++r) rows.push_back({tied_row(1031, 40 + r), 0.25f * r});
    check_rows(rows, 1031, 1100, 37);
}

TEST(LogitsSummary, BadShapesAreErrors) {
    ORDO_REQUIRE_GPU();
    buffer lb = make_buffer(std::vector<float>(100)), tb = make_buffer(std::vector<float>(2));
    buffer sb = make_buffer(std::vector<std::uint32_t>(2 * abi::ORDO_SUMMARY_WORDS));
    ASSERT_TRUE(env().str->begin("bad").ok());
    EXPECT_FALSE(
        encode_logits_summary(*env().str, {whole(lb), 0, 50}, whole(tb), whole(sb), 0, 2).ok());
    EXPECT_FALSE(
        encode_logits_summary(*env().str, {whole(lb), 0, 50}, whole(tb), whole(sb), 60, 2).ok());
    EXPECT_FALSE(
        encode_logits_summary(*env().str, {whole(lb), 0, 50}, whole(tb), whole(sb), 50, 3).ok());
    EXPECT_TRUE(
        encode_logits_summary(*env().str, {whole(lb), 0, 50}, whole(tb), whole(sb), 50, 2).ok());
    run_segment("bad");
}

}  // namespace
}  // namespace ordo::gpu::testing
