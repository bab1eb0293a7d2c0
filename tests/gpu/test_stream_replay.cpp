// test_stream_replay.cpp: segments replayed from the stream's kept recordings
// (stream_options::replay_segments, stream.hpp "Replay"), on the real device (lavapipe).
//
// Checks: (1) a segment repeated with the same dispatches is recorded once and replayed after,
// and each run's result has the bits of a stream that records every segment, though the buffers'
// contents changed between runs; (2) a segment whose push constants, a binding's range or a
// binding's buffer differ is recorded anew, and so is one on a buffer destroyed and made again
// (its serial differs even where its handle is reused); (3) with two kept recordings a third
// segment is recorded over the least recently used one, never over the one in flight, and with
// one kept recording a segment recorded ahead of it in flight is recorded directly, with the same
// bits; (4) a segment with a transfer (a fill) is recorded directly, not kept, and runs right;
// (5) discarding a segment sealed into a kept recording leaves that recording to replay.
#include <deque>

#include "gpu/vk/weights.hpp"
#include "gpu_fixture.hpp"
#include "model/quant.hpp"

namespace ordo::gpu::testing {
namespace {

constexpr std::uint32_t dim = 64;

// x += W rmsnorm(x) over `tokens` rows of x, for each of `layers`: the dispatches of a segment.
struct toy {
    toy() : mem(*env().dev, 1u << 20) {
        for (std::uint32_t l = 0; l < 3; ++l) {
            auto f = random_floats(dim * dim, 20 + l, 0.2f);
            std::vector<std::uint8_t> bytes(f.size() * 2);
            EXPECT_TRUE(
                model::quantize_row(model::ggml_type::f16, f.data(), bytes.data(), f.size()).ok());
            auto t = upload_weight(*env().dev, mem, model::ggml_type::f16, dim, dim, bytes);
            EXPECT_TRUE(t.ok());
            w.push_back(std::move(*t));
        }
    }
    void record(stream& s, std::uint32_t layer, std::uint32_t tokens, const buffer& x) {
        EXPECT_TRUE(encode_rms_norm(s, {whole(x), 0, dim}, whole(norm_w), {whole(tmp), 0, dim}, dim,
                                    tokens, 1e-5f)
                        .ok());
        EXPECT_TRUE(
            encode_mul_mat(s, w[layer], {whole(tmp), 0, dim}, {whole(x), 0, dim}, tokens, true)
                .ok());
    }
    arena mem;
    std::vector<weight_tensor> w;
    buffer norm_w = make_buffer(random_floats(dim, 3));
    buffer tmp = make_buffer(std::vector<float>(dim * 4));
};

std::unique_ptr<stream> make_stream(std::uint32_t replay) {
    auto s = stream::create(*env().dev, *env().pipes, {64, false, replay});
    EXPECT_TRUE(s.ok()) << s.err().message;
    return s.ok() ? std::move(*s) : nullptr;
}

void run(stream& s, const std::string& label, const std::function<void()>& record) {
    ASSERT_TRUE(s.begin(label).ok());
    record();
    status st = s.run(test_watchdog_ms);
    ASSERT_TRUE(st.ok()) << st.err().message;
}

TEST(StreamReplay, ARepeatedSegmentIsRecordedOnceAndRunsLikeAFreshOne) {
    ORDO_REQUIRE_GPU();
    toy t;
    auto kept = make_stream(4), fresh = make_stream(0);
    ASSERT_TRUE(kept && fresh);
    buffer a = make_buffer(random_floats(dim * 4, 4)), b = make_buffer(random_floats(dim * 4, 4));
    for (int i = 0; i < 5; ++i) {
        run(*kept, "step " + std::to_string(i), [&] { t.record(*kept, 0, 2, a); });
        run(*fresh, "step " + std::to_string(i), [&] { t.record(*fresh, 0, 2, b); });
        // x moved every run: the replay read this run's x, not the first run's.
        ASSERT_EQ(read_buffer<float>(a, dim * 4), read_buffer<float>(b, dim * 4)) << "run " << i;
    }
    EXPECT_EQ(kept->recorded(), 1u);
    EXPECT_EQ(kept->replayed(), 4u);
    EXPECT_EQ(fresh->recorded(), 0u);
    EXPECT_EQ(fresh->replayed(), 0u);
}

TEST(StreamReplay, APushBindingOrBufferThatDiffersIsRecordedAnew) {
    ORDO_REQUIRE_GPU();
    toy t;
    auto s = make_stream(8);
    ASSERT_TRUE(s);
    buffer x = make_buffer(random_floats(dim * 4, 5));
    run(*s, "2 tokens", [&] { t.record(*s, 0, 2, x); });
    run(*s, "3 tokens", [&] { t.record(*s, 0, 3, x); });  // push constants and ranges differ
    run(*s, "layer 1", [&] { t.record(*s, 1, 2, x); });   // another weight binding
    EXPECT_EQ(s->recorded(), 3u);
    EXPECT_EQ(s->replayed(), 0u);
    run(*s, "2 tokens again", [&] { t.record(*s, 0, 2, x); });
    EXPECT_EQ(s->replayed(), 1u);
    // The same sizes on a buffer made again: a new serial, so a new recording, and its result
    // is the fresh stream's.
    std::vector<float> before = read_buffer<float>(x, dim * 4);
    x = buffer{};
    buffer again = make_buffer(before);
    run(*s, "2 tokens, new buffer", [&] { t.record(*s, 0, 2, again); });
    EXPECT_EQ(s->recorded(), 4u);
    EXPECT_EQ(s->replayed(), 1u);
    auto fresh = make_stream(0);
    buffer same = make_buffer(before);
    run(*fresh, "2 tokens", [&] { t.record(*fresh, 0, 2, same); });
    EXPECT_EQ(read_buffer<float>(again, dim * 4), read_buffer<float>(same, dim * 4));
}

TEST(StreamReplay, TheLeastRecentlyUsedIsRecordedOverNeverTheOneInFlight) {
    ORDO_REQUIRE_GPU();
    toy t;
    auto s = make_stream(2);
    ASSERT_TRUE(s);
    buffer x = make_buffer(random_floats(dim * 4, 6));
    run(*s, "A", [&] { t.record(*s, 0, 2, x); });
    run(*s, "B", [&] { t.record(*s, 1, 2, x); });
    run(*s, "A", [&] { t.record(*s, 0, 2, x); });  // replayed: B is now the least recent
    run(*s, "C", [&] { t.record(*s, 2, 2, x); });  // over B
    run(*s, "A", [&] { t.record(*s, 0, 2, x); });  // still kept
    EXPECT_EQ(s->recorded(), 3u);
    EXPECT_EQ(s->replayed(), 2u);
    run(*s, "B", [&] { t.record(*s, 1, 2, x); });  // recorded again, over C
    EXPECT_EQ(s->recorded(), 4u);

    // One kept recording, in flight while the next segment is recorded ahead: that one is
    // recorded directly (neither kept nor replayed), with the bits of a fresh stream.
    auto one = make_stream(1), fresh = make_stream(0);
    ASSERT_TRUE(one && fresh);
    buffer y = make_buffer(random_floats(dim * 4, 7)), z = make_buffer(random_floats(dim * 4, 7));
    for (stream* st : {one.get(), fresh.get()}) {
        const buffer& v = st == one.get() ? y : z;
        ASSERT_TRUE(st->begin("layer 0").ok());
        t.record(*st, 0, 2, v);
        ASSERT_TRUE(st->submit().ok());
        ASSERT_TRUE(st->begin_ahead("layer 1").ok());
        t.record(*st, 1, 2, v);
        ASSERT_TRUE(st->seal().ok());
        ASSERT_TRUE(st->wait(test_watchdog_ms).ok());
        ASSERT_TRUE(st->run(test_watchdog_ms).ok());
    }
    EXPECT_EQ(one->recorded(), 1u);
    EXPECT_EQ(one->replayed(), 0u);
    EXPECT_EQ(read_buffer<float>(y, dim * 4), read_buffer<float>(z, dim * 4));
}

TEST(StreamReplay, ASegmentWithATransferIsRecordedDirectly) {
    ORDO_REQUIRE_GPU();
    toy t;
    auto s = make_stream(4), fresh = make_stream(0);
    ASSERT_TRUE(s && fresh);
    buffer a = make_buffer(random_floats(dim * 4, 8)), b = make_buffer(random_floats(dim * 4, 8));
    for (int i = 0; i < 2; ++i) {
        for (stream* st : {s.get(), fresh.get()}) {
            const buffer& v = st == s.get() ? a : b;
            run(*st, "fill", [&] {
                t.record(*st, 0, 2, v);
                st->fill({&v, 0, dim * 4}, 0x3f800000u);  // row 0 := 1.0
                t.record(*st, 1, 2, v);
            });
        }
        ASSERT_EQ(read_buffer<float>(a, dim * 4), read_buffer<float>(b, dim * 4)) << "run " << i;
    }
    EXPECT_EQ(s->recorded(), 0u);
    EXPECT_EQ(s->replayed(), 0u);
    // Then a plain segment is kept again.
    run(*s, "plain", [&] { t.record(*s, 0, 2, a); });
    EXPECT_EQ(s->recorded(), 1u);
}

TEST(StreamReplay, DiscardingASealedSegmentKeepsItsRecording) {
    ORDO_REQUIRE_GPU();
    toy t;
    auto s = make_stream(4), fresh = make_stream(0);
    ASSERT_TRUE(s && fresh);
    buffer a = make_buffer(random_floats(dim * 4, 9)), b = make_buffer(random_floats(dim * 4, 9));
    ASSERT_TRUE(s->begin("dropped").ok());
    t.record(*s, 0, 2, a);
    ASSERT_TRUE(s->seal().ok());
    s->discard();
    EXPECT_EQ(s->state(), stream_state::idle);
    EXPECT_EQ(read_buffer<float>(a, dim * 4), random_floats(dim * 4, 9)) << "nothing ran";
    run(*s, "kept", [&] { t.record(*s, 0, 2, a); });
    run(*fresh, "fresh", [&] { t.record(*fresh, 0, 2, b); });
    EXPECT_EQ(s->recorded(), 1u);
    EXPECT_EQ(s->replayed(), 1u);
    EXPECT_EQ(read_buffer<float>(a, dim * 4), read_buffer<float>(b, dim * 4));
}

}  // namespace
}  // namespace ordo::gpu::testing
