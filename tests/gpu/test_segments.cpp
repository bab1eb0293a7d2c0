// test_segments.cpp: bounded, labelled submissions. A toy 4-"layer" pipeline
// (x += W_l rmsnorm(x) per layer) recorded as segments of 1, 2 and all 4 layers gives
// bit-identical results; the fence watchdog turns a too-long segment (a test-only spin
// dispatch with a 1 ms timeout, through the same wait path) into a gpu_timeout error naming the
// segment, after which the stream recovers; an injected device loss becomes gpu_device_lost
// naming the segment; a segment cannot begin while another is in flight; timestamps give one
// timing per dispatch. Recording ahead (begin_ahead while a segment runs, as the runner records
// its next layers): the same bits as recording in turn; submit refuses while the previous
// segment is in flight and keeps the recording; discard() drops a segment recorded ahead
// (nothing of it runs) and the stream is usable again; each segment's timestamps are its own.

#include "toy_layers.hpp"

namespace ordo::gpu::testing {
namespace {

constexpr std::uint32_t n_layer = 4, dim = toy_layers::dim;

// ahead: each next segment is recorded while the one before it runs (begin_ahead), submitted
// once that one was waited for.
std::vector<float> run_toy(std::uint32_t flush_every, bool ahead = false) {
    toy_layers toy(n_layer, 10);
    const buffer x = make_buffer(random_floats(dim * 2, 4));
    stream& str = *env().str;
    for (std::uint32_t l0 = 0; l0 < n_layer; l0 += flush_every) {
        std::uint32_t l1 = std::min(n_layer, l0 + flush_every);
        std::string label = "toy layers " + std::to_string(l0) + "-" + std::to_string(l1 - 1);
        bool in_flight = str.state() == stream_state::in_flight;
        EXPECT_TRUE((in_flight ? str.begin_ahead(label) : str.begin(label)).ok());
        for (std::uint32_t l = l0; l < l1; ++l) toy.record(str, l, 2, x);
        if (in_flight) {
            status early = str.submit();
            EXPECT_FALSE(early.ok()) << "submitted while the previous segment was in flight";
            EXPECT_TRUE(str.recording());
            status s = str.wait(test_watchdog_ms);
            EXPECT_TRUE(s.ok()) << s.err().message;
        }
        if (ahead && l1 < n_layer) {
            EXPECT_TRUE(str.submit().ok());  // the next segment records while this one runs
        } else {
            status s = str.run(test_watchdog_ms);
            EXPECT_TRUE(s.ok()) << s.err().message;
        }
    }
    EXPECT_EQ(str.state(), stream_state::idle);
    return read_buffer<float>(x, dim * 2);
}

TEST(GpuSegments, SplittingEveryOneTwoAllLayersIsIdentical) {
    ORDO_REQUIRE_GPU();
    auto all = run_toy(n_layer);
    auto one = run_toy(1);
    auto two = run_toy(2);
    EXPECT_EQ(one, all);
    EXPECT_EQ(two, all);
    EXPECT_EQ(run_toy(1, true), all) << "recording ahead changed the result";
    EXPECT_EQ(run_toy(2, true), all) << "recording ahead changed the result";
    auto start = random_floats(dim * 2, 4);
    EXPECT_NE(all, start) << "the toy pipeline must change x";
}

TEST(GpuSegments, WatchdogTimeoutNamesTheSegmentAndRecovers) {
    ORDO_REQUIRE_GPU();
    // The segment polls a host-visible flag that this test sets only after the 1 ms watchdog
    // has fired, so the wait times out whatever the machine's load (a fixed-length spin could
    // finish while this thread was descheduled). Its 8192 workgroups run ~1-2 s on lavapipe
    // (a thread descheduled that long between submit and wait would still break the test).
    // Device-local memory the host can map where there is such (lavapipe, a GPU's resizable
    // BAR): an NVIDIA H100's atomics on host-cached system memory never saw the host's write,
    // while device memory is where the GPU's own atomics look.
    auto flag_buf = env().dev->create_buffer(16, memory_use::device);
    ASSERT_TRUE(flag_buf.ok()) << flag_buf.err().message;
    if (flag_buf->mapped() == nullptr) {
        flag_buf = env().dev->create_buffer(16, memory_use::host_readback);
        ASSERT_TRUE(flag_buf.ok()) << flag_buf.err().message;
    }
    auto* flag = static_cast<volatile std::uint32_t*>(flag_buf->mapped());
    ASSERT_NE(flag, nullptr);
    flag[0] = 0;
    flag[1] = 0;
    ASSERT_TRUE(env().str->begin("decode#812 seqs=4 layers 8-15").ok());
    std::uint32_t rounds = std::min<std::uint32_t>(8192, env().dev->info().max_workgroup_count[0]);
    ASSERT_TRUE(encode_spin_until(*env().str, whole(*flag_buf), rounds).ok());
    ASSERT_TRUE(env().str->submit().ok());
    status s = env().str->wait(1);
    ASSERT_FALSE(s.ok()) << "the polling segment ended on its own: flag[1] = " << flag[1];
    EXPECT_EQ(s.err().code, "gpu_timeout");
    EXPECT_NE(s.err().message.find("decode#812 seqs=4 layers 8-15"), std::string::npos)
        << s.err().message;
    // Still in flight: a new segment is refused until it has finished.
    status busy = env().str->begin("next");
    ASSERT_FALSE(busy.ok());
    EXPECT_EQ(busy.err().code, "gpu_busy");
    flag[0] = 1;  // let it finish
    status done = env().str->wait(test_watchdog_ms);
    ASSERT_TRUE(done.ok()) << done.err().message;
    EXPECT_EQ(flag[1] & 1u, 1u) << "the segment was still running when the flag was set";
    ASSERT_TRUE(env().str->begin("after timeout").ok());
    buffer data = make_buffer(random_floats(16, 8));
    ASSERT_TRUE(encode_spin(*env().str, whole(data), 10).ok());
    run_segment("after timeout");
}

TEST(GpuSegments, InjectedDeviceLossNamesTheSegment) {
    ORDO_REQUIRE_GPU();
    buffer data = make_buffer(random_floats(16, 9));
    ASSERT_TRUE(env().str->begin("prefill#3 seqs=1 layers 0-5").ok());
    ASSERT_TRUE(encode_spin(*env().str, whole(data), 10).ok());
    env().str->inject_wait_result(VK_ERROR_DEVICE_LOST);
    status s = env().str->run(test_watchdog_ms);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.err().code, "gpu_device_lost");
    EXPECT_NE(s.err().message.find("prefill#3 seqs=1 layers 0-5"), std::string::npos);
    EXPECT_EQ(env().str->state(), stream_state::idle);
}

TEST(GpuSegments, TimestampsGiveOneTimingPerDispatch) {
    ORDO_REQUIRE_GPU();
    if (!env().dev->info().timestamps) GTEST_SKIP() << "device has no compute timestamps";
    auto timed = stream::create(*env().dev, *env().pipes, {64, true});
    ASSERT_TRUE(timed.ok()) << timed.err().message;
    buffer data = make_buffer(random_floats(64, 1));
    ASSERT_TRUE((*timed)->begin("timed").ok());
    ASSERT_TRUE(encode_spin(**timed, whole(data), 100000).ok());
    ASSERT_TRUE(encode_spin(**timed, whole(data), 10).ok());
    ASSERT_TRUE((*timed)->run(test_watchdog_ms).ok());
    const auto& t = (*timed)->timings();
    ASSERT_EQ(t.size(), 2u);
    EXPECT_EQ(t[0].id, pipeline_id::spin);
    EXPECT_GT(t[0].ms, 0.0);
    EXPECT_GE(t[1].ms, 0.0);
}

TEST(GpuSegments, DiscardDropsTheSegmentRecordedAhead) {
    ORDO_REQUIRE_GPU();
    stream& str = *env().str;
    const std::vector<float> start = random_floats(dim, 8);
    buffer a = make_buffer(start), b = make_buffer(start), out = make_buffer(start);
    ASSERT_TRUE(str.begin("first").ok());
    ASSERT_TRUE(
        encode_add(str, {whole(a), 0, dim}, {whole(b), 0, dim}, {whole(a), 0, dim}, dim, 1).ok());
    ASSERT_TRUE(str.submit().ok());
    ASSERT_TRUE(str.begin_ahead("ahead").ok());
    EXPECT_FALSE(str.begin_ahead("twice").ok()) << "one segment records at a time";
    ASSERT_TRUE(
        encode_add(str, {whole(a), 0, dim}, {whole(b), 0, dim}, {whole(out), 0, dim}, dim, 1).ok());
    EXPECT_EQ(str.state(), stream_state::in_flight);
    EXPECT_EQ(str.label(), "first");
    ASSERT_TRUE(str.wait(test_watchdog_ms).ok());
    EXPECT_EQ(str.state(), stream_state::recording);
    str.discard();
    EXPECT_EQ(str.state(), stream_state::idle);
    EXPECT_FALSE(str.submit().ok()) << "nothing left to submit";
    // The first segment ran (a = 2 start); the discarded one never wrote `out`.
    auto got_a = read_buffer<float>(a, dim);
    for (std::uint32_t i = 0; i < dim; ++i) EXPECT_EQ(got_a[i], start[i] + start[i]);
    EXPECT_EQ(read_buffer<float>(out, dim), start);
    ASSERT_TRUE(str.begin("after").ok());
    ASSERT_TRUE(
        encode_add(str, {whole(a), 0, dim}, {whole(b), 0, dim}, {whole(out), 0, dim}, dim, 1).ok());
    run_segment("after");
    auto got = read_buffer<float>(out, dim);
    for (std::uint32_t i = 0; i < dim; ++i) EXPECT_EQ(got[i], got_a[i] + start[i]);
}

TEST(GpuSegments, TimestampsOfSegmentsRecordedAheadAreTheirOwn) {
    ORDO_REQUIRE_GPU();
    if (!env().dev->info().timestamps) GTEST_SKIP() << "device has no compute timestamps";
    auto s = stream::create(*env().dev, *env().pipes, {16, true});
    ASSERT_TRUE(s.ok()) << s.err().message;
    stream& str = **s;
    buffer a = make_buffer(random_floats(dim, 1)), b = make_buffer(random_floats(dim, 2));
    auto add = [&] {
        EXPECT_TRUE(
            encode_add(str, {whole(a), 0, dim}, {whole(b), 0, dim}, {whole(a), 0, dim}, dim, 1)
                .ok());
    };
    ASSERT_TRUE(str.begin("three").ok());
    add();
    add();
    add();
    ASSERT_TRUE(str.submit().ok());
    ASSERT_TRUE(str.begin_ahead("one").ok());
    add();
    ASSERT_TRUE(str.wait(test_watchdog_ms).ok());
    EXPECT_EQ(str.timings().size(), 3u);
    ASSERT_TRUE(str.submit().ok());
    ASSERT_TRUE(str.wait(test_watchdog_ms).ok());
    EXPECT_EQ(str.timings().size(), 1u);
    for (const dispatch_timing& t : str.timings()) EXPECT_EQ(t.id, pipeline_id::add);
}

}  // namespace
}  // namespace ordo::gpu::testing
