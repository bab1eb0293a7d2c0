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
#include <functional>

#include "toy_layers.hpp"

namespace ordo::gpu::testing {
namespace {

constexpr std::uint32_t dim = toy_layers::dim;

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

// A stream keeping `replay` recordings and one recording every segment, each with its own x
// (the same start), on the same toy layers.
struct kept_and_fresh {
    kept_and_fresh(std::uint32_t replay, std::uint32_t seed)
        : t(3, 20),
          kept(make_stream(replay)),
          fresh(make_stream(0)),
          a(make_buffer(random_floats(dim * 4, seed))),
          b(make_buffer(random_floats(dim * 4, seed))) {}
    const buffer& x_of(const stream* s) const { return s == kept.get() ? a : b; }
    bool same_x() const { return read_buffer<float>(a, dim * 4) == read_buffer<float>(b, dim * 4); }
    toy_layers t;
    std::unique_ptr<stream> kept, fresh;
    buffer a, b;
};

TEST(StreamReplay, ARepeatedSegmentIsRecordedOnceAndRunsLikeAFreshOne) {
    ORDO_REQUIRE_GPU();
    kept_and_fresh p(4, 4);
    ASSERT_TRUE(p.kept && p.fresh);
    for (int i = 0; i < 5; ++i) {
        for (stream* s : {p.kept.get(), p.fresh.get()}) {
            run(*s, "step " + std::to_string(i), [&] { p.t.record(*s, 0, 2, p.x_of(s)); });
        }
        // x moved every run: the replay read this run's x, not the first run's.
        ASSERT_TRUE(p.same_x()) << "run " << i;
    }
    EXPECT_EQ(p.kept->recorded(), 1u);
    EXPECT_EQ(p.kept->replayed(), 4u);
    EXPECT_EQ(p.fresh->recorded(), 0u);
    EXPECT_EQ(p.fresh->replayed(), 0u);
}

TEST(StreamReplay, APushBindingOrBufferThatDiffersIsRecordedAnew) {
    ORDO_REQUIRE_GPU();
    toy_layers t(3, 20);
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
    toy_layers t(3, 20);
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
    kept_and_fresh p(1, 7);
    ASSERT_TRUE(p.kept && p.fresh);
    for (stream* st : {p.kept.get(), p.fresh.get()}) {
        ASSERT_TRUE(st->begin("layer 0").ok());
        p.t.record(*st, 0, 2, p.x_of(st));
        ASSERT_TRUE(st->submit().ok());
        ASSERT_TRUE(st->begin_ahead("layer 1").ok());
        p.t.record(*st, 1, 2, p.x_of(st));
        ASSERT_TRUE(st->seal().ok());
        ASSERT_TRUE(st->wait(test_watchdog_ms).ok());
        ASSERT_TRUE(st->run(test_watchdog_ms).ok());
    }
    EXPECT_EQ(p.kept->recorded(), 1u);
    EXPECT_EQ(p.kept->replayed(), 0u);
    EXPECT_TRUE(p.same_x());
}

TEST(StreamReplay, ASegmentWithATransferIsRecordedDirectly) {
    ORDO_REQUIRE_GPU();
    kept_and_fresh p(4, 8);
    ASSERT_TRUE(p.kept && p.fresh);
    for (int i = 0; i < 2; ++i) {
        for (stream* st : {p.kept.get(), p.fresh.get()}) {
            const buffer& v = p.x_of(st);
            run(*st, "fill", [&] {
                p.t.record(*st, 0, 2, v);
                st->fill({&v, 0, dim * 4}, 0x3f800000u);  // row 0 := 1.0
                p.t.record(*st, 1, 2, v);
            });
        }
        ASSERT_TRUE(p.same_x()) << "run " << i;
    }
    EXPECT_EQ(p.kept->recorded(), 0u);
    EXPECT_EQ(p.kept->replayed(), 0u);
    // Then a plain segment is kept again.
    run(*p.kept, "plain", [&] { p.t.record(*p.kept, 0, 2, p.a); });
    EXPECT_EQ(p.kept->recorded(), 1u);
}

TEST(StreamReplay, DiscardingASealedSegmentKeepsItsRecording) {
    ORDO_REQUIRE_GPU();
    kept_and_fresh p(4, 9);
    ASSERT_TRUE(p.kept && p.fresh);
    stream& s = *p.kept;
    ASSERT_TRUE(s.begin("dropped").ok());
    p.t.record(s, 0, 2, p.a);
    ASSERT_TRUE(s.seal().ok());
    s.discard();
    EXPECT_EQ(s.state(), stream_state::idle);
    EXPECT_EQ(read_buffer<float>(p.a, dim * 4), random_floats(dim * 4, 9)) << "nothing ran";
    for (stream* st : {p.kept.get(), p.fresh.get()}) {
        run(*st, "run", [&] { p.t.record(*st, 0, 2, p.x_of(st)); });
    }
    EXPECT_EQ(s.recorded(), 1u);
    EXPECT_EQ(s.replayed(), 1u);
    EXPECT_TRUE(p.same_x());
}

}  // namespace
}  // namespace ordo::gpu::testing
