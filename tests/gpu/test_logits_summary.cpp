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
// entry: a few peaks over a far bulk, a few over a floor of ties). Rows are cut into chunks, each
// summarised by its own workgroup and merged (logits_summary_merge.comp): row lengths of one
// chunk, two, and the most chunks with chunks longer than ORDO_SUMMARY_CHUNK, rows whose best
// candidates all sit in one chunk, and ties straddling a chunk's edge; the scratch starts
// dirty. The count, candidates (ids and logit bits) and maximum must be exact; the normalisers
// (float sums on the device, double on the host) within 1e-5 relative. Through read_summary,
// the words are what the scheduler accepts. A row holding an inf or a NaN among its first
// n_sample entries (anywhere: first, in a middle chunk, last) is flagged in its count word
// (ORDO_SUMMARY_NONFINITE), and read_summary refuses it; clean rows beside it and infs past
// n_sample are not.
#include <cmath>
#include <cstring>
#include <limits>

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

// The summary words of `rows` (their first n_sample entries each, at `offset` and `stride`;
// `pad` fills the rest of each row, which the kernel must never read).
std::vector<std::uint32_t> summary_words(const std::vector<row_case>& rows, std::uint32_t n_sample,
                                         std::uint32_t stride, std::uint32_t offset,
                                         float pad = 7.0f) {
    const auto n_rows = static_cast<std::uint32_t>(rows.size());
    std::vector<float> packed(offset + std::size_t(n_rows) * stride, pad);
    std::vector<float> temps;
    for (std::uint32_t r = 0; r < n_rows; ++r) {
        EXPECT_GE(rows[r].logits.size(), n_sample);
        std::copy(rows[r].logits.begin(), rows[r].logits.begin() + n_sample,
                  packed.begin() + offset + std::size_t(r) * stride);
        temps.push_back(rows[r].temperature);
    }
    buffer lb = make_buffer(packed), tb = make_buffer(temps);
    buffer sb =
        make_buffer(std::vector<std::uint32_t>(std::size_t(n_rows) * abi::ORDO_SUMMARY_WORDS));
    // Dirty scratch: every word the merge reads must have been written by this dispatch.
    buffer cb = make_buffer(
        std::vector<std::uint32_t>(logits_summary_scratch_words(n_sample, n_rows), 0x3F800001u));
    EXPECT_TRUE(env().str->begin("summary").ok());
    EXPECT_TRUE(encode_logits_summary(*env().str, {whole(lb), offset, stride}, whole(tb), whole(cb),
                                      whole(sb), n_sample, n_rows)
                    .ok());
    run_segment("summary");
    return read_buffer<std::uint32_t>(sb, std::size_t(n_rows) * abi::ORDO_SUMMARY_WORDS);
}

void check_rows(const std::vector<row_case>& rows, std::uint32_t n_sample, std::uint32_t stride,
                std::uint32_t offset) {
    const auto n_rows = static_cast<std::uint32_t>(rows.size());
    auto words = summary_words(rows, n_sample, stride, offset);
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
    for (std::uint32_t n :
         {1u, 5u, 63u, 64u, 65u, 257u, 1000u, 4096u, 4097u, 32000u, 128256u, 200000u}) {
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

TEST(LogitsSummary, ChunksFollowTheRowLengthAlone) {
    auto is = [](std::uint32_t n, std::uint32_t chunks, std::uint32_t len) {
        const logits_summary_chunking c = summary_chunking(n);
        EXPECT_EQ(c.n_chunks, chunks) << n;
        EXPECT_EQ(c.chunk_len, len) << n;
        EXPECT_LT(std::uint64_t(c.n_chunks - 1) * c.chunk_len, n) << n << ": an empty chunk";
    };
    is(1, 1, 1);
    is(4096, 1, 4096);
    is(4097, 2, 2049);
    is(32000, 8, 4000);
    is(128256, 32, 4008);
    is(200000, 32, 6250);
    is(4096 * 31 + 1, 32, 3969);
}

// The merge's cases: where the row's best candidates sit among its chunks (32 of 4008 at Llama
// 3's vocabulary; 8 of 4000 at 32000).
TEST(LogitsSummary, TheMergeFindsTheBestWhereverTheChunksHoldThem) {
    ORDO_REQUIRE_GPU();
    std::uint32_t seed = 300;
    for (std::uint32_t n : {32000u, 128256u}) {
        SCOPED_TRACE("n " + std::to_string(n));
        const std::uint32_t len = summary_chunking(n).chunk_len;
        std::vector<row_case> rows;
        // The best 100 all in chunk 3, the rest of the row far below.
        auto one = random_floats(n, seed++, 1.0f);
        for (std::uint32_t i = 0; i < 100; ++i) one[3 * len + i * 7] = 20.0f + 0.01f * float(i);
        rows.push_back({one, 1.0f});
        // 100 ties across the edge between chunks 1 and 2: the 64 lowest ids are taken, 50 from
        // chunk 1 and 14 from chunk 2.
        auto edge = random_floats(n, seed++, 1.0f);
        for (std::uint32_t i = 0; i < 100; ++i) edge[2 * len - 50 + i] = 9.0f;
        rows.push_back({edge, 0.6f});
        // Every chunk holds exactly two of the best 64 (and the last chunk the rest): each
        // chunk's list reaches past the row's best.
        auto spread = random_floats(n, seed++, 1.0f);
        const std::uint32_t chunks = summary_chunking(n).n_chunks;
        for (std::uint32_t i = 0; i < 64; ++i) {
            const std::uint32_t c = std::min(i / 2, chunks - 1);
            spread[c * len + 17 + i] = 30.0f - 0.25f * float(i);
        }
        rows.push_back({spread, 2.0f});
        // The maximum alone in the last chunk, the next 63 in the first: the normalisers add
        // chunks scaled by their distance to a maximum they do not hold.
        auto split = random_floats(n, seed++, 4.0f);
        split[n - 1] = 25.0f;
        for (std::uint32_t i = 0; i < 63; ++i) split[i * 3] = 15.0f - 0.1f * float(i);
        rows.push_back({split, 0.9f});
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

TEST(LogitsSummary, FlagsEveryRowHoldingAnInfOrANaN) {
    ORDO_REQUIRE_GPU();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    // One chunk and 32 chunks; the bad entry first, in a middle chunk, last; a clean row
    // between the bad ones; the rows' pads hold inf, which the kernel must not look at.
    for (std::uint32_t n : {100u, 128256u}) {
        std::vector<row_case> rows;
        std::vector<bool> bad;
        std::uint32_t seed = 70;
        for (float v : {nan, inf, -inf}) {
            for (std::uint32_t at : {0u, n / 2 + 3, n - 1}) {
                rows.push_back({random_floats(n, seed++, 4.0f), 1.0f});
                rows.back().logits[at] = v;
                bad.push_back(true);
                rows.push_back({random_floats(n, seed++, 4.0f), 0.8f});
                bad.push_back(false);
            }
        }
        auto words = summary_words(rows, n, n + 5, 0, inf);
        for (std::size_t r = 0; r < rows.size(); ++r) {
            SCOPED_TRACE("row " + std::to_string(r) + " of " + std::to_string(n));
            auto row = std::span<const std::uint32_t>(words).subspan(r * abi::ORDO_SUMMARY_WORDS,
                                                                     abi::ORDO_SUMMARY_WORDS);
            EXPECT_EQ((row[3] & abi::ORDO_SUMMARY_NONFINITE) != 0, bad[r]);
            EXPECT_EQ(row[3] & ~abi::ORDO_SUMMARY_NONFINITE, std::min(n, abi::ORDO_SUMMARY_TOP));
            auto read = sched::read_summary(row, n, rows[r].temperature);
            EXPECT_EQ(read.ok(), !bad[r]);
            if (!read.ok()) {
                EXPECT_NE(read.err().message.find("inf or a NaN"), std::string::npos)
                    << read.err().message;
            }
        }
    }
}

TEST(LogitsSummary, BadShapesAreErrors) {
    ORDO_REQUIRE_GPU();
    buffer lb = make_buffer(std::vector<float>(100)), tb = make_buffer(std::vector<float>(2));
    buffer sb = make_buffer(std::vector<std::uint32_t>(2 * abi::ORDO_SUMMARY_WORDS));
    buffer cb = make_buffer(std::vector<std::uint32_t>(2 * abi::ORDO_SUMMARY_WORDS));
    buffer small = make_buffer(std::vector<std::uint32_t>(abi::ORDO_SUMMARY_WORDS));
    auto encode = [&](std::uint32_t n, std::uint32_t rows, const buffer& scratch) {
        return encode_logits_summary(*env().str, {whole(lb), 0, 50}, whole(tb), whole(scratch),
                                     whole(sb), n, rows)
            .ok();
    };
    ASSERT_TRUE(env().str->begin("bad").ok());
    EXPECT_FALSE(encode(0, 2, cb));
    EXPECT_FALSE(encode(60, 2, cb));
    EXPECT_FALSE(encode(50, 3, cb));
    EXPECT_FALSE(encode(50, 2, small));  // the chunk summaries of two rows do not fit
    EXPECT_TRUE(encode(50, 2, cb));
    run_segment("bad");
}

}  // namespace
}  // namespace ordo::gpu::testing
