// test_runner_startup.cpp: a device build that a busy machine cannot fail (issue 26), on the
// real device (lavapipe here) and generated models.
//
// Checks:
// (1) the pipeline cache file format (no device): a file round-trips for its identity; every
//     other device, driver, build, format, magic, size or checksum is refused with a reason
//     naming it, and so is a file cut short at any length;
// (2) a runner with gpu.pipeline_cache_dir writes a cache file valid for its device and build;
//     the next runner loads it ("loaded N B"); a damaged file is ignored with its reason, the
//     runner still builds, and the file is replaced by a valid one;
// (3) warm-up is judged by warmup_ms_max, not the watchdog: with a 1 ms watchdog (far less than
//     a warm-up step takes on lavapipe) the runner builds, and the watchdog still applies to
//     the steps after it (a 32-token prefill then times out: gpu_timeout);
// (4) the gpu actor retries a first build that fails on a device fault (every warm-up past a
//     1 ms warmup_ms_max: gpu_timeout) recovery_max more times, telling its progress
//     (device_progress: stage, step, attempt of attempts), then device_unavailable; a build
//     that fails on the config (gpu_bad_config: a KV pool too large) is not retried;
// (5) a kernel family the driver cannot build never leaves a degraded server (issue 28; the
//     H100's driver fails mul_mat_tx1t4_q4_k at K 8192): with the texel family asked for and
//     every mul_mat_tx pipeline's creation failing (fault_pipeline_create, the driver's own
//     error path), the runner builds on the storage family: its logits equal a storage
//     runner's bit for bit and a texel runner's within rounding; a storage pipeline that
//     cannot be built refuses the build with gpu_unsupported naming it, and the gpu actor
//     does not retry it; a storage runner whose attention_flash cannot be built serves its
//     prompts on attention.comp with the same bits (a runner that builds it runs it); under
//     gpu.batch_invariant = false, a cooperative-matrix kernel that cannot be built, or that
//     the build's check against the invariant kernel finds wrong (fault_mat_coop_wrong), leaves
//     the invariant kernels serving (the same bits as batch_invariant = true);
// (6) layers per segment (no device): a configured gpu.flush_every_layers is kept or refused
//     when its segments pass the dispatch bound; the device's choice (0) shrinks until they
//     fit, and is refused only when one layer does not; a lavapipe runner left to choose
//     takes 4; a shorter first segment (runner_options::first_segment_layers, an A/B knob
//     for GPUs) splits a 5-layer step 1 + 2 + 2, clamps to the segment length, and gives the
//     same logits bit for bit as one segment and as uniform segments.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "gpu/client/gpu_client.hpp"
#include "gpu/vk/pipeline_cache.hpp"
#include "gpu_fixture.hpp"
#include "test_runner_support.hpp"

namespace ordo::gpu::testing {
namespace {

namespace fs = std::filesystem;

pipeline_cache_identity some_identity() {
    pipeline_cache_identity id;
    id.vendor_id = 0x10de;
    id.device_id = 0x2330;
    id.driver_version = 580;
    for (std::size_t i = 0; i < id.cache_uuid.size(); ++i) id.cache_uuid[i] = std::uint8_t(i * 7);
    id.build_id = 0x0123456789abcdefull;
    return id;
}

std::string refusal(std::span<const std::uint8_t> file, const pipeline_cache_identity& id) {
    auto r = decode_pipeline_cache(file, id);
    if (r) return "";
    EXPECT_EQ(r.err().code, "gpu_cache_invalid");
    return r.err().message;
}

TEST(PipelineCacheFile, RoundTripsAndRefusesWhatIsNotItsOwn) {
    const pipeline_cache_identity id = some_identity();
    const std::vector<std::uint8_t> data = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    const std::vector<std::uint8_t> file = encode_pipeline_cache(id, data);
    ASSERT_EQ(file.size(), pipeline_cache_header_bytes + data.size());
    auto back = decode_pipeline_cache(file, id);
    ASSERT_TRUE(back.ok()) << back.err().message;
    EXPECT_EQ(std::vector<std::uint8_t>(back->begin(), back->end()), data);

    auto other = [&](auto change) {
        pipeline_cache_identity o = id;
        change(o);
        return refusal(file, o);
    };
    EXPECT_NE(other([](auto& o) { o.vendor_id++; }).find("another device"), std::string::npos);
    EXPECT_NE(other([](auto& o) { o.device_id++; }).find("another device"), std::string::npos);
    EXPECT_NE(other([](auto& o) { o.driver_version++; }).find("driver"), std::string::npos);
    EXPECT_NE(other([](auto& o) { o.cache_uuid[3] ^= 1; }).find("driver"), std::string::npos);
    EXPECT_NE(other([](auto& o) { o.build_id++; }).find("ordo build"), std::string::npos);

    auto flipped = [&](std::size_t at) {
        std::vector<std::uint8_t> f = file;
        f[at] ^= 0x40;
        return refusal(f, id);
    };
    EXPECT_NE(flipped(0).find("not an ordo pipeline cache"), std::string::npos);
    EXPECT_NE(flipped(8).find("header checksum"), std::string::npos);   // format field
    EXPECT_NE(flipped(48).find("header checksum"), std::string::npos);  // data size field
    EXPECT_NE(flipped(pipeline_cache_header_bytes + 2).find("data checksum"), std::string::npos);
    std::vector<std::uint8_t> longer = file;
    longer.push_back(0);
    EXPECT_NE(refusal(longer, id).find("data"), std::string::npos);
    for (std::size_t n = 0; n < file.size(); ++n) {
        EXPECT_NE(refusal(std::span(file).first(n), id), "") << "cut at " << n << " bytes";
    }
    EXPECT_EQ(pipeline_cache_file_name(id), "pipelines-10de-2330.bin");
}

std::string fresh_dir(const std::string& name) {
    fs::path d = fs::path(temp_dir()) / name;
    fs::remove_all(d);
    return d.string();
}

std::vector<std::uint8_t> read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(RunnerStartup, PipelineCacheIsKeptIgnoredWhenDamagedAndReplaced) {
    ORDO_REQUIRE_GPU();
    auto file = open_model(synth_model(model::ggml_type::f16));
    ASSERT_TRUE(file);
    runner_options o = test_options();
    o.pipeline_cache_dir = fresh_dir("pipeline_cache_test");
    std::string path;
    pipeline_cache_identity id;
    {
        auto r = make_runner(*file, o);
        ASSERT_TRUE(r);
        EXPECT_EQ(r->pipeline_cache_note(), "none yet");
        const device_info& info = r->info();
        id = {info.vendor_id, info.device_id, info.driver_version, info.pipeline_cache_uuid,
              shader_build_id()};
        path = (fs::path(o.pipeline_cache_dir) / pipeline_cache_file_name(id)).string();
    }
    ASSERT_TRUE(fs::exists(path)) << "no cache file written at " << path;
    EXPECT_TRUE(decode_pipeline_cache(read_bytes(path), id).ok());
    {
        auto r = make_runner(*file, o);
        ASSERT_TRUE(r);
        EXPECT_EQ(r->pipeline_cache_note().rfind("loaded ", 0), 0u) << r->pipeline_cache_note();
    }
    // Damaged: the data's last byte flipped (or, for a driver that keeps no data, the size).
    std::vector<std::uint8_t> bytes = read_bytes(path);
    bytes.back() ^= 0xff;
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    ASSERT_FALSE(decode_pipeline_cache(read_bytes(path), id).ok());
    {
        auto r = make_runner(*file, o);
        ASSERT_TRUE(r) << "a damaged cache file must not stop the build";
        EXPECT_EQ(r->pipeline_cache_note().rfind("ignored: ", 0), 0u) << r->pipeline_cache_note();
        std::vector<float> logits(300);
        auto d = r->run_step(make_step(1, step_phase::decode, {make_seq(1, {5}, 0, {0})}),
                             logits.data());
        EXPECT_TRUE(d.ok()) << d.err().message;
    }
    auto replaced = decode_pipeline_cache(read_bytes(path), id);
    EXPECT_TRUE(replaced.ok()) << "the damaged file was not replaced: " << replaced.err().message;
    // Garbage that is not a cache file at all: ignored the same way.
    std::ofstream(path, std::ios::binary | std::ios::trunc) << "not a cache";
    auto r = make_runner(*file, o);
    ASSERT_TRUE(r);
    EXPECT_NE(r->pipeline_cache_note().find("shorter than a header"), std::string::npos)
        << r->pipeline_cache_note();
}

TEST(RunnerStartup, WarmUpIsJudgedByItsOwnBoundNotTheWatchdog) {
    ORDO_REQUIRE_GPU();
    auto file = open_model(synth_model(model::ggml_type::f16, 4, true));
    ASSERT_TRUE(file);
    runner_options o = test_options(false, 4);
    o.watchdog_ms = 1;  // no warm-up step on lavapipe is this quick
    o.warmup_ms_max = 600'000;
    auto r = runner::create(*file, o);
    ASSERT_TRUE(r.ok()) << "warm-up was judged by the 1 ms watchdog: " << r.err().code << ": "
                        << r.err().message;
    // After warm-up the watchdog applies again: a 32-token prefill of 4 layers is over 1 ms.
    std::vector<float> logits(300);
    auto d = (*r)->run_step(
        make_step(1, step_phase::prefill, {make_seq(1, test_tokens(32, 300, 9), 0, {0, 1, 2, 3})}),
        logits.data());
    ASSERT_FALSE(d.ok()) << "a 32-token prefill finished within 1 ms: the check says nothing";
    EXPECT_EQ(d.err().code, "gpu_timeout") << d.err().message;
    EXPECT_TRUE((*r)->drain(120'000).ok());
}

std::vector<float> first_decode_logits(runner& r) {
    std::vector<float> logits(300);
    auto p = r.run_step(
        make_step(1, step_phase::prefill, {make_seq(1, test_tokens(9, 300, 4), 0, {0, 1})}),
        logits.data());
    EXPECT_TRUE(p.ok()) << p.err().message;
    auto d =
        r.run_step(make_step(2, step_phase::decode, {make_seq(1, {7}, 9, {0, 1})}), logits.data());
    EXPECT_TRUE(d.ok()) << d.err().message;
    return logits;
}

TEST(RunnerStartup, ATexelFamilyTheDriverCannotBuildFallsBackToStorage) {
    ORDO_REQUIRE_GPU();
    auto file = open_model(synth_model(model::ggml_type::q8_0));
    ASSERT_TRUE(file);
    auto run_with = [&](bool texel, std::string fault) -> std::vector<float> {
        runner_options o = test_options();
        o.texel_kernels = texel;
        o.fault_pipeline_create = std::move(fault);
        auto r = runner::create(*file, o);
        EXPECT_TRUE(r.ok()) << r.err().code << ": " << r.err().message;
        if (!r) return {};
        EXPECT_EQ((*r)->texel_kernels(), texel && o.fault_pipeline_create.empty());
        return first_decode_logits(**r);
    };
    auto fell_back = run_with(true, "mul_mat_tx");
    auto texel = run_with(true, "");
    auto storage = run_with(false, "");
    ASSERT_EQ(fell_back.size(), 300u);
    ASSERT_EQ(texel.size(), 300u);
    ASSERT_EQ(storage.size(), 300u);
    EXPECT_EQ(std::memcmp(fell_back.data(), storage.data(), 300 * sizeof(float)), 0)
        << "the fallback does not run the storage family";
    // The families share the mat-mul order; their norms and attention kernels may differ in
    // the last bits.
    for (std::size_t i = 0; i < 300; ++i) {
        EXPECT_NEAR(fell_back[i], texel[i], 1e-3f * (1.0f + std::fabs(texel[i]))) << i;
    }
}

TEST(RunnerStartup, AFlashKernelTheDriverCannotBuildLeavesPromptsOnAttentionComp) {
    ORDO_REQUIRE_GPU();
    auto file = open_model(synth_model(model::ggml_type::q8_0));
    ASSERT_TRUE(file);
    // The logits of a 9-token prompt (a flash tile of the 2:1 GQA model) and one decode, and
    // whether the prompt step ran attention_flash.
    auto run_with = [&](std::string fault) -> std::pair<std::vector<float>, bool> {
        runner_options o = test_options();
        o.texel_kernels = false;
        o.timestamps = true;
        o.fault_pipeline_create = std::move(fault);
        auto r = runner::create(*file, o);
        EXPECT_TRUE(r.ok()) << r.err().code << ": " << r.err().message;
        if (!r) return {};
        EXPECT_EQ((*r)->attention_flash(), o.fault_pipeline_create.empty());
        std::vector<float> logits(300);
        auto p = (*r)->run_step(
            make_step(1, step_phase::prefill, {make_seq(1, test_tokens(9, 300, 4), 0, {0, 1})}),
            logits.data());
        EXPECT_TRUE(p.ok()) << p.err().message;
        bool flash = false;
        for (const kernel_time& k : (*r)->last_timings()) {
            flash = flash || k.name.starts_with("attention_flash");
        }
        auto d = (*r)->run_step(make_step(2, step_phase::decode, {make_seq(1, {7}, 9, {0, 1})}),
                                logits.data());
        EXPECT_TRUE(d.ok()) << d.err().message;
        return {logits, flash};
    };
    auto [built, ran_flash] = run_with("");
    auto [refused, ran_flash_anyway] = run_with("attention_flash");
    EXPECT_TRUE(ran_flash) << "the prompt did not run attention_flash: the check says nothing";
    EXPECT_FALSE(ran_flash_anyway);
    ASSERT_EQ(built.size(), 300u);
    ASSERT_EQ(refused.size(), 300u);
    EXPECT_EQ(std::memcmp(built.data(), refused.data(), 300 * sizeof(float)), 0);
}

TEST(RunnerStartup, ACooperativeMatrixKernelTheDriverCannotBuildOrRunLeavesTheInvariantKernels) {
    ORDO_REQUIRE_GPU();
    auto file = open_model(synth_model(model::ggml_type::q8_0));
    ASSERT_TRUE(file);
    // gpu.batch_invariant = false with the emulated kernel (lavapipe's stand-in for a driver's
    // cooperative matrices); `fault` fails its pipelines' creation; `wrong`: the check at build
    // finds its output wrong.
    auto run_with = [&](bool invariant, std::string fault,
                        bool wrong = false) -> std::vector<float> {
        runner_options o = test_options();
        o.texel_kernels = false;
        o.batch_invariant = invariant;
        o.mat_coop_emulated = !invariant;
        o.fault_pipeline_create = std::move(fault);
        o.fault_mat_coop_wrong = wrong;
        auto r = runner::create(*file, o);
        EXPECT_TRUE(r.ok()) << r.err().code << ": " << r.err().message;
        if (!r) return {};
        EXPECT_EQ((*r)->mat_coop(), !invariant && o.fault_pipeline_create.empty() && !wrong);
        std::vector<float> logits(300);
        auto p = (*r)->run_step(
            make_step(1, step_phase::prefill, {make_seq(1, test_tokens(12, 300, 4), 0, {0, 1})}),
            logits.data());
        EXPECT_TRUE(p.ok()) << p.err().message;
        return logits;
    };
    auto invariant = run_with(true, "");
    auto fell_back = run_with(false, "mul_mat_cme");
    auto checked_wrong = run_with(false, "", true);
    auto coop = run_with(false, "");
    ASSERT_EQ(invariant.size(), 300u);
    ASSERT_EQ(fell_back.size(), 300u);
    ASSERT_EQ(checked_wrong.size(), 300u);
    ASSERT_EQ(coop.size(), 300u);
    EXPECT_EQ(std::memcmp(fell_back.data(), invariant.data(), 300 * sizeof(float)), 0)
        << "the fallback does not run the invariant kernels";
    EXPECT_EQ(std::memcmp(checked_wrong.data(), invariant.data(), 300 * sizeof(float)), 0)
        << "a kernel the check found wrong still serves";
    EXPECT_NE(std::memcmp(coop.data(), invariant.data(), 300 * sizeof(float)), 0)
        << "the cooperative-matrix kernel did not run: the check says nothing";
}

TEST(SegmentLayers, AConfiguredLengthIsKeptOrRefusedTheDevicesShrinksToFit) {
    // 10 dispatches besides the layers, 100 a layer, 24 layers, at most 1000 a segment: 9 fit.
    const segment_shape shape{10, 100, 24};
    auto pick = [&](std::uint32_t configured, std::uint32_t device_default,
                    std::uint64_t max = 1000) {
        return choose_segment_layers(shape, configured, device_default, max);
    };
    ASSERT_TRUE(pick(4, 16).ok());
    EXPECT_EQ(*pick(4, 16), 4u);  // configured: the device's default does not matter
    EXPECT_EQ(*pick(0, 4), 4u);   // the device's, fitting
    EXPECT_EQ(*pick(0, 16), 9u);  // the device's, shrunk to the bound
    auto refused = pick(12, 4);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.err().code, "gpu_bad_config");
    EXPECT_NE(refused.err().message.find("flush_every_layers 12 makes segments of 1210"),
              std::string::npos)
        << refused.err().message;
    EXPECT_EQ(*pick(0, 16, 110), 1u);       // one layer exactly fits
    EXPECT_FALSE(pick(0, 16, 109).ok());    // not even one layer
    EXPECT_EQ(*pick(30, 4, 100'000), 30u);  // past n_layer: every layer in one segment
    EXPECT_EQ(shape.dispatches(30), 2410u);
}

TEST(RunnerStartup, ARunnerLeftToChooseTakesTheDevicesSegmentLength) {
    ORDO_REQUIRE_GPU();
    auto file = open_model(synth_model(model::ggml_type::q8_0));
    ASSERT_TRUE(file);
    runner_options o = test_options(false, 0);
    auto r = make_runner(*file, o);
    ASSERT_TRUE(r);
    const bool cpu = r->info().kind == device_kind::cpu;
    EXPECT_EQ(r->flush_every_layers(), cpu ? 4u : 16u);
    EXPECT_EQ(r->first_segment_layers(), r->flush_every_layers()) << "no device shortens it yet";
    o.flush_every_layers = 1;
    auto one = make_runner(*file, o);
    ASSERT_TRUE(one);
    EXPECT_EQ(one->flush_every_layers(), 1u);
}

TEST(RunnerStartup, AShortFirstSegmentSplitsTheStepWithTheSameBits) {
    ORDO_REQUIRE_GPU();
    auto file = open_model(synth_model(model::ggml_type::f16, 5));
    ASSERT_TRUE(file);
    const step s = make_step(1, step_phase::prefill,
                             {make_seq(1, test_tokens(6, 300, 4), 0, blocks_from(0, 6, 8))});
    struct run_case {
        std::uint32_t flush;
        std::optional<std::uint32_t> first;
        std::uint32_t want_first, want_segments;
        const char* last;
    };
    std::vector<float> want;
    for (const run_case& c :
         {run_case{5, std::nullopt, 5, 1, "layers 0-4"}, run_case{2, 1u, 1, 3, "layers 3-4"},
          run_case{2, std::nullopt, 2, 3, "layers 4-4"}, run_case{2, 9u, 2, 3, "layers 4-4"},
          run_case{2, 0u, 2, 3, "layers 4-4"}}) {
        SCOPED_TRACE("flush " + std::to_string(c.flush) + " first " +
                     (c.first ? std::to_string(*c.first) : "unset"));
        runner_options o = test_options(true, c.flush);
        o.first_segment_layers = c.first;
        auto r = make_runner(*file, o);
        ASSERT_TRUE(r);
        EXPECT_EQ(r->first_segment_layers(), c.want_first);
        std::vector<float> logits(300);
        auto res = r->run_step(s, logits.data());
        ASSERT_TRUE(res.ok()) << res.err().message;
        EXPECT_EQ(res->segments, c.want_segments);
        EXPECT_NE(r->last_segment().find(c.last), std::string::npos) << r->last_segment();
        if (want.empty()) {
            want = logits;
        } else {
            EXPECT_EQ(std::memcmp(logits.data(), want.data(), 300 * 4), 0);
        }
    }
}

TEST(RunnerStartup, AStoragePipelineTheDriverCannotBuildRefusesTheBuild) {
    ORDO_REQUIRE_GPU();
    auto file = open_model(synth_model(model::ggml_type::q8_0));
    ASSERT_TRUE(file);
    runner_options o = test_options();
    o.texel_kernels = false;
    o.fault_pipeline_create = "mul_mat_q8_0";
    auto r = runner::create(*file, o);
    ASSERT_FALSE(r.ok()) << "a pipeline that cannot be created was not noticed";
    EXPECT_EQ(r.err().code, "gpu_unsupported") << r.err().message;
    EXPECT_NE(r.err().message.find("pipeline mul_mat_q8_0 create: VK_ERROR_UNKNOWN"),
              std::string::npos)
        << r.err().message;
}

// A gpu actor and the collector of its replies, without gpu_session (which gives up on a
// device_unavailable at start).
struct actor_rig {
    reply_collector collector;
    std::unique_ptr<logits_exchange> exchange;
    std::unique_ptr<gpu_actor> actor;

    explicit actor_rig(gpu_actor_options o) {
        exchange = std::make_unique<logits_exchange>(o.runner.rows_max, 300);
        EXPECT_TRUE(collector.start().ok());
        actor = std::make_unique<gpu_actor>(std::move(o), *exchange, gpu_replies(collector, "gpu"));
        EXPECT_TRUE(actor->start().ok());
    }
    ~actor_rig() {
        actor->request_stop();
        EXPECT_TRUE(actor->join().ok());
        collector.request_stop();
        EXPECT_TRUE(collector.join().ok());
    }
};

constexpr std::uint64_t reply_ms = 300'000;  // four device builds on a loaded 2-core machine

TEST(GpuActorStartup, AFirstBuildThatTimesOutIsRetriedThenUnavailable) {
    ORDO_REQUIRE_GPU();
    gpu_actor_options o;
    o.model_path = synth_model(model::ggml_type::f16, 4, true);
    o.runner = test_options(false, 4);
    o.runner.warmup_ms_max = 1;  // every build's warm-up times out: a device fault, retried
    o.recovery_max = 2;
    actor_rig rig(o);
    auto r = rig.collector.next(reply_ms);
    ASSERT_TRUE(r.has_value()) << "no reply to the build";
    ASSERT_TRUE(std::holds_alternative<device_unavailable>(*r)) << reply_name(*r);
    EXPECT_NE(std::get<device_unavailable>(*r).message.find("gpu_timeout"), std::string::npos)
        << std::get<device_unavailable>(*r).message;
    auto p = rig.collector.last_progress();
    ASSERT_TRUE(p.has_value()) << "no device_progress was sent";
    EXPECT_EQ(p->attempt, 3u) << "a first build and recovery_max (2) retries";
    EXPECT_EQ(p->attempts_max, 3u);
    EXPECT_EQ(p->stage, "warm-up");
    EXPECT_EQ(p->epoch, 0u);
    // device, a layer at a time, the warm-up's first step: per attempt, at least 6 reports.
    EXPECT_GE(rig.collector.progress_count(), 3u * 6u);
    EXPECT_EQ(rig.actor->progress_refused(), 0u);
}

TEST(GpuActorStartup, AFirstBuildThatFailsOnTheConfigIsNotRetried) {
    ORDO_REQUIRE_GPU();
    gpu_actor_options o;
    o.model_path = synth_model(model::ggml_type::f16);
    o.runner = test_options();
    // A pool of more tokens than the scheduler takes: gpu_bad_config, found after the device
    // stage (one device_progress per attempt).
    o.runner.kv_blocks = std::uint32_t(runner_kv_pool_tokens_max / o.runner.kv_block_tokens + 1);
    o.recovery_max = 3;
    actor_rig rig(o);
    auto r = rig.collector.next(reply_ms);
    ASSERT_TRUE(r.has_value());
    ASSERT_TRUE(std::holds_alternative<device_unavailable>(*r)) << reply_name(*r);
    EXPECT_NE(std::get<device_unavailable>(*r).message.find("gpu_bad_config"), std::string::npos)
        << std::get<device_unavailable>(*r).message;
    EXPECT_EQ(rig.collector.progress_count(), 1u) << "the build was tried again";
    auto p = rig.collector.last_progress();
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(p->stage, "device");
    EXPECT_EQ(p->attempt, 1u);
    EXPECT_EQ(p->attempts_max, 4u);
}

TEST(GpuActorStartup, AKernelTheDriverCannotBuildIsNotRetried) {
    ORDO_REQUIRE_GPU();
    gpu_actor_options o;
    o.model_path = synth_model(model::ggml_type::q8_0);
    o.runner = test_options();
    o.runner.texel_kernels = false;
    o.runner.fault_pipeline_create = "mul_mat_q8_0";
    o.recovery_max = 3;
    actor_rig rig(o);
    auto r = rig.collector.next(reply_ms);
    ASSERT_TRUE(r.has_value());
    ASSERT_TRUE(std::holds_alternative<device_unavailable>(*r)) << reply_name(*r);
    const std::string& why = std::get<device_unavailable>(*r).message;
    EXPECT_NE(why.find("gpu_unsupported"), std::string::npos) << why;
    EXPECT_NE(why.find("mul_mat_q8_0"), std::string::npos) << why;
    auto p = rig.collector.last_progress();
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(p->attempt, 1u) << "a build that fails the same way every time was tried again";
}

}  // namespace
}  // namespace ordo::gpu::testing
