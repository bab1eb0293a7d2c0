// test_runner_logits_in_place.cpp: the logits rows written by the device straight into the
// logits exchange (runner_options::logits_regions, imported through VK_EXT_external_memory_host,
// which lavapipe has), on the real device with a generated model (64 wide, 2 layers, vocab 300).
//
// Checks: (1) device::import_host: a region on the device's alignment becomes a buffer whose
// mapped() is the caller's memory, and a fill recorded on the device is read there after the
// fence; a pointer or size off the alignment is refused (gpu_unsupported) naming it; (2) a
// runner given the exchange's four regions imports them all, and a step whose logits_out is a
// slot's first row writes its rows there (step_result::logits_in_place) with the same bits as
// the same step copied out into a plain vector, with row summaries on and off, and the step
// after it writes another slot; (3) a region off the alignment leaves the runner importing none
// (every step copies, the same bits), and runner_options::logits_in_place = false imports none;
// (4) the nan_logits fault (NaNs written by the device over the first row) is seen in place:
// without summaries by the host's pass over the rows, with them by the summaries' own flag
// (ORDO_SUMMARY_NONFINITE) without reading the rows; either way logits_finite is false, and the
// next step is finite again.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "gpu/logits/logits_exchange.hpp"
#include "gpu/vk/shaders/abi.h"
#include "gpu_fixture.hpp"
#include "test_runner_support.hpp"

namespace ordo::gpu::testing {
namespace {

constexpr std::uint32_t n_vocab = 300;

struct aligned_floats {
    explicit aligned_floats(std::size_t bytes)
        : p(static_cast<float*>(std::aligned_alloc(logits_exchange::region_align, bytes))),
          n(bytes / 4) {}
    ~aligned_floats() { std::free(p); }
    aligned_floats(const aligned_floats&) = delete;
    aligned_floats& operator=(const aligned_floats&) = delete;
    float* p;
    std::size_t n;
};

TEST(DeviceImport, HostMemoryBecomesABufferTheDeviceWrites) {
    ORDO_REQUIRE_GPU();
    const device_info& info = env().dev->info();
    if (!info.external_memory_host) GTEST_SKIP() << info.name << " cannot import host memory";
    const std::uint64_t align = info.min_imported_host_pointer_alignment;
    ASSERT_GT(align, 0u);
    ASSERT_EQ(logits_exchange::region_align % align, 0u) << "the exchange's regions must import";
    aligned_floats host(logits_exchange::region_align);
    std::fill(host.p, host.p + host.n, 1.0f);
    auto b = env().dev->import_host(host.p, logits_exchange::region_align);
    ASSERT_TRUE(b.ok()) << b.err().message;
    EXPECT_EQ(b->mapped(), host.p);
    EXPECT_EQ(b->size(), logits_exchange::region_align);
    ASSERT_TRUE(env().str->begin("import").ok());
    env().str->fill({&*b, 64, 128}, 0x40490fdbu);  // pi, over floats 16..47
    run_segment("import");
    EXPECT_EQ(host.p[15], 1.0f);
    EXPECT_EQ(host.p[16], 3.14159274f);
    EXPECT_EQ(host.p[47], 3.14159274f);
    EXPECT_EQ(host.p[48], 1.0f);

    auto off = env().dev->import_host(host.p + 1, align);
    ASSERT_FALSE(off.ok());
    EXPECT_EQ(off.err().code, "gpu_unsupported");
    EXPECT_NE(off.err().message.find(std::to_string(align) + " B boundaries"), std::string::npos)
        << off.err().message;
    auto short_size = env().dev->import_host(host.p, align / 2);
    ASSERT_FALSE(short_size.ok());
    EXPECT_EQ(short_size.err().code, "gpu_unsupported");
}

class LogitsInPlace : public ::testing::Test {
protected:
    void SetUp() override {
        ORDO_REQUIRE_GPU();
        if (!env().dev->info().external_memory_host) {
            GTEST_SKIP() << env().dev->info().name << " cannot import host memory";
        }
        file = open_model(synth_model(model::ggml_type::f16));
        ASSERT_TRUE(file);
    }

    runner_options options(bool summaries) {
        runner_options o = test_options(true, 1);
        o.row_summaries = summaries;
        for (std::uint32_t s = 0; s < logits_exchange::slots_max; ++s) {
            o.logits_regions.push_back(exchange.logits_region(s));
        }
        return o;
    }

    // Three sequences, one asking for two rows: four logits rows.
    step three_seqs(std::uint64_t id) {
        step s = make_step(id, step_phase::prefill,
                           {make_seq(1, test_tokens(5, n_vocab, 1), 0, blocks_from(0, 5, 8)),
                            make_seq(2, test_tokens(9, n_vocab, 2), 0, blocks_from(1, 9, 8)),
                            make_seq(3, test_tokens(3, n_vocab, 3), 0, blocks_from(3, 3, 8))});
        s.seqs[2].logits_rows = 2;
        s.seqs[1].temperature = 0.9f;
        return s;
    }

    std::unique_ptr<model::gguf_file> file;
    logits_exchange exchange{8, n_vocab};
};

TEST_F(LogitsInPlace, RowsAreWrittenIntoTheSlotWithTheCopysBits) {
    for (bool summaries : {false, true}) {
        SCOPED_TRACE(summaries ? "with summaries" : "without summaries");
        auto run = make_runner(*file, options(summaries));
        ASSERT_NE(run, nullptr);
        EXPECT_EQ(run->logits_regions_imported(), logits_exchange::slots_max);
        std::vector<float> copied(8 * n_vocab, -1.0f);
        auto a = run->run_step(three_seqs(1), copied.data());
        ASSERT_TRUE(a.ok()) << a.err().message;
        EXPECT_FALSE(a->logits_in_place) << "a plain vector is not a region";
        ASSERT_TRUE(run->clear_kv().ok());

        auto slot = exchange.acquire();
        ASSERT_TRUE(slot.ok());
        std::vector<std::uint32_t> words(8 * abi::ORDO_SUMMARY_WORDS);
        auto b = run->run_step(three_seqs(2), exchange.row(*slot, 0), nullptr, words.data());
        ASSERT_TRUE(b.ok()) << b.err().message;
        EXPECT_TRUE(b->logits_in_place);
        EXPECT_TRUE(b->logits_finite);
        EXPECT_EQ(b->summarized, summaries);
        ASSERT_EQ(b->rows.size(), 4u);
        for (std::uint32_t r = 0; r < 4; ++r) {
            auto row = exchange.read_row(*slot, r);
            EXPECT_EQ(std::memcmp(row.data(), copied.data() + r * n_vocab, n_vocab * 4), 0)
                << "row " << r;
        }
        if (summaries) {
            EXPECT_EQ(words[3] & abi::ORDO_SUMMARY_NONFINITE, 0u);
            EXPECT_EQ(words[3], abi::ORDO_SUMMARY_TOP);
        }
        // The next step into another slot: the first slot's rows stay as they were.
        auto other = exchange.acquire();
        ASSERT_TRUE(other.ok());
        auto c = run->run_step(make_step(3, step_phase::decode, {make_seq(1, {7}, 5, {0})}),
                               exchange.row(*other, 0));
        ASSERT_TRUE(c.ok()) << c.err().message;
        EXPECT_TRUE(c->logits_in_place);
        EXPECT_EQ(std::memcmp(exchange.read_row(*slot, 0).data(), copied.data(), n_vocab * 4), 0);
        EXPECT_NE(std::memcmp(exchange.read_row(*other, 0).data(), copied.data(), n_vocab * 4), 0);
        exchange.release(*slot);
        exchange.release(*other);
    }
}

TEST_F(LogitsInPlace, ARegionOffTheAlignmentOrTheSwitchLeavesEveryStepCopying) {
    std::vector<float> want(8 * n_vocab);
    {
        auto run = make_runner(*file, test_options(true, 1));
        ASSERT_NE(run, nullptr);
        EXPECT_EQ(run->logits_regions_imported(), 0u) << "no regions given";
        ASSERT_TRUE(run->run_step(three_seqs(1), want.data()).ok());
    }
    aligned_floats host(2 * logits_exchange::region_align);
    runner_options skewed = options(false);
    skewed.logits_regions.push_back({host.p + 1, 8 * n_vocab});  // 4 bytes past the alignment
    runner_options off = options(false);
    off.logits_in_place = false;
    for (const runner_options* o : {&skewed, &off}) {
        auto run = make_runner(*file, *o);
        ASSERT_NE(run, nullptr);
        EXPECT_EQ(run->logits_regions_imported(), 0u);
        auto slot = exchange.acquire();
        ASSERT_TRUE(slot.ok());
        auto r = run->run_step(three_seqs(2), exchange.row(*slot, 0));
        ASSERT_TRUE(r.ok()) << r.err().message;
        EXPECT_FALSE(r->logits_in_place);
        EXPECT_EQ(std::memcmp(exchange.row(*slot, 0), want.data(), 4 * n_vocab * 4), 0);
        exchange.release(*slot);
    }
}

TEST_F(LogitsInPlace, TheNanLogitsFaultIsSeenInPlace) {
    for (bool summaries : {false, true}) {
        SCOPED_TRACE(summaries ? "with summaries (their flag)" : "without (the host's pass)");
        auto run = make_runner(*file, options(summaries));
        ASSERT_NE(run, nullptr);
        auto slot = exchange.acquire();
        ASSERT_TRUE(slot.ok());
        std::vector<std::uint32_t> words(8 * abi::ORDO_SUMMARY_WORDS);
        run->arm_fault({fault_kind::nan_logits, -1});
        auto bad = run->run_step(make_step(1, step_phase::decode, {make_seq(1, {5}, 0, {0})}),
                                 exchange.row(*slot, 0), nullptr, words.data());
        ASSERT_TRUE(bad.ok()) << bad.err().message;
        EXPECT_TRUE(bad->logits_in_place);
        EXPECT_FALSE(bad->logits_finite);
        EXPECT_TRUE(std::isnan(exchange.read_row(*slot, 0)[0]));
        EXPECT_TRUE(std::isnan(exchange.read_row(*slot, 0)[n_vocab - 1]));
        if (summaries) {
            EXPECT_NE(words[3] & abi::ORDO_SUMMARY_NONFINITE, 0u);
        }
        auto good = run->run_step(make_step(2, step_phase::decode, {make_seq(1, {5}, 0, {0})}),
                                  exchange.row(*slot, 0), nullptr, words.data());
        ASSERT_TRUE(good.ok()) << good.err().message;
        EXPECT_TRUE(good->logits_finite) << "a fault is armed for one step only";
        EXPECT_FALSE(std::isnan(exchange.read_row(*slot, 0)[0]));
        exchange.release(*slot);
    }
}

}  // namespace
}  // namespace ordo::gpu::testing
