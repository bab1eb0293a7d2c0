// test_draft_actor.cpp: the draft actor (draft/draft_actor.hpp) between a collector standing in
// for the scheduler and a real gpu actor serving a generated model on the real device
// (lavapipe).
//
// The served model's verification keeps the output right whatever a drafter proposes, so the
// server tests cannot see a draft actor whose KV went wrong: it would only draft worse. These
// check the drafts themselves. (1) Greedy and consistent: the drafts after a prompt continue
// one another (the drafts after prompt + d0 are d1, d2, ...). (2) Rollback: a sequence whose
// drafts were rejected part-way (the round sends the kept drafts and a different token) drafts
// exactly what a fresh sequence with the same tokens drafts, whether the first token that
// differs is the last one sent or an earlier one, alone and in one round with it.
// (3) A full pool takes the blocks of the sequence used longest ago; that sequence is then
// answered with known 0 (no drafts) until it is sent whole, and then drafts as before. (4) A
// lost draft device fails the round in flight with an error, says drafter_state not ready,
// then ready after the rebuild, and the sequences it held are answered with known 0.
#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <mutex>

#include "draft/draft_actor.hpp"
#include "gpu/actor/gpu_actor.hpp"
#include "gpu_fixture.hpp"
#include "test_runner_support.hpp"

namespace ordo::gpu::testing {
namespace {

constexpr std::uint64_t reply_ms = 60'000;  // generous for a loaded 2-core machine
constexpr std::uint32_t n_vocab = 300;      // synth_model's

// Stands in for the scheduler: keeps the replies and the states the draft actor sends, each
// kind in arrival order.
class collector final : public actors::actor<collector, draft::draft_reply, draft::drafter_state> {
public:
    collector() : actor("collector", 1024) {}
    void on(const draft::draft_reply& m) { push(_replies, m); }
    void on(const draft::drafter_state& m) { push(_states, m); }

    std::optional<draft::draft_reply> reply() { return take(_replies); }
    std::optional<draft::drafter_state> state() { return take(_states); }

private:
    template <typename T>
    void push(std::deque<T>& q, const T& m) {
        std::lock_guard lock(_mutex);
        q.push_back(m);
        _cv.notify_all();
    }
    template <typename T>
    std::optional<T> take(std::deque<T>& q) {
        std::unique_lock lock(_mutex);
        if (!_cv.wait_for(lock, std::chrono::milliseconds(reply_ms), [&] { return !q.empty(); })) {
            return std::nullopt;
        }
        T m = std::move(q.front());
        q.pop_front();
        return m;
    }
    std::mutex _mutex;
    std::condition_variable _cv;
    std::deque<draft::draft_reply> _replies;
    std::deque<draft::drafter_state> _states;
};

struct drafting {
    collector to;
    logits_exchange exchange{8, n_vocab};
    std::unique_ptr<draft::draft_actor> drafter;
    std::unique_ptr<gpu_actor> gpu;
    std::uint64_t next_round = 1;

    bool start(std::uint32_t kv_blocks) {
        gpu_actor_options g;
        g.name = "draft-gpu";
        g.model_path = synth_model(model::ggml_type::f16);
        g.runner = test_options(true, 1);
        g.runner.kv_blocks = kv_blocks;
        g.recovery_max = 3;
        draft::draft_actor_options d;
        d.max_batch_tokens = g.runner.max_batch_tokens;
        d.n_vocab = n_vocab;
        d.round_ms_max = reply_ms;
        drafter = std::make_unique<draft::draft_actor>(d, exchange, draft::draft_replies(to, "t"));
        gpu = std::make_unique<gpu_actor>(g, exchange, gpu_replies(*drafter, "draft-gpu"));
        drafter->connect_gpu(*gpu);
        if (!to.start().ok() || !drafter->start().ok() || !gpu->start().ok()) return false;
        auto s = to.state();
        return s && s->ready;
    }
    ~drafting() {
        for (actors::actor_core* a : {static_cast<actors::actor_core*>(gpu.get()),
                                      static_cast<actors::actor_core*>(drafter.get()),
                                      static_cast<actors::actor_core*>(&to)}) {
            if (a == nullptr) continue;
            a->request_stop();
            EXPECT_TRUE(a->join().ok());
        }
    }

    // One round; its reply (a test failure when another message comes first).
    draft::draft_reply round(std::vector<draft::draft_seq> seqs) {
        draft::draft_request q{next_round++, std::move(seqs)};
        EXPECT_TRUE(drafter->tell(q).ok());
        auto r = to.reply().value_or(draft::draft_reply{0, {}, "no reply"});
        EXPECT_EQ(r.round, q.round);
        return r;
    }
    // One sequence's drafts from a round of one.
    draft::drafted one(std::uint64_t seq, std::uint32_t known, std::vector<std::int32_t> tokens,
                       std::uint32_t max) {
        auto r = round({{seq, known, std::move(tokens), max}});
        EXPECT_TRUE(r.error.empty()) << r.error;
        EXPECT_EQ(r.seqs.size(), 1u);
        return r.seqs.empty() ? draft::drafted{} : r.seqs[0];
    }
};

std::vector<std::int32_t> concat(std::vector<std::int32_t> a, const std::vector<std::int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

TEST(DraftActor, RolledBackSequencesDraftWhatFreshOnesDraft) {
    ORDO_REQUIRE_GPU();
    drafting d;
    ASSERT_TRUE(d.start(64));
    const std::vector<std::int32_t> prompt = test_tokens(20, n_vocab, 3);
    const draft::drafted d1 = d.one(1, 0, prompt, 6);
    EXPECT_EQ(d1.known, prompt.size());
    ASSERT_EQ(d1.tokens.size(), 6u);
    // Greedy: the drafts after prompt + d0 continue the first round's.
    const draft::drafted chain = d.one(2, 0, concat(prompt, {d1.tokens[0]}), 5);
    EXPECT_EQ(chain.tokens, std::vector<std::int32_t>(d1.tokens.begin() + 1, d1.tokens.end()));
    // Two drafts kept, the third rejected (the served model drew x there): sequence 1 sends
    // only what it had not sent, and its KV rolls back over the rejected drafts.
    const std::int32_t x = (d1.tokens[2] + 1) % std::int32_t(n_vocab);
    const std::vector<std::int32_t> kept = {d1.tokens[0], d1.tokens[1], x};
    const draft::drafted d2 = d.one(1, std::uint32_t(prompt.size()), kept, 6);
    EXPECT_EQ(d2.known, prompt.size() + 3);
    ASSERT_EQ(d2.tokens.size(), 6u);
    const draft::drafted fresh = d.one(3, 0, concat(prompt, kept), 6);
    EXPECT_EQ(fresh.tokens, d2.tokens);
    // A rejection before the last token sent (its drafts were not used at once, and plain
    // decoding went on past them): the KV rolls back to where they part, not to the end.
    EXPECT_EQ(d.one(4, 0, prompt, 6).tokens, d1.tokens);
    const std::int32_t z = (d1.tokens[1] + 3) % std::int32_t(n_vocab);
    const std::vector<std::int32_t> parted = {d1.tokens[0], z, d1.tokens[3]};
    const draft::drafted d4 = d.one(4, std::uint32_t(prompt.size()), parted, 6);
    EXPECT_EQ(d4.tokens, d.one(5, 0, concat(prompt, parted), 6).tokens);
    // Both in one round, one more token each: the same drafts.
    const std::uint32_t known = std::uint32_t(prompt.size() + 3);
    const std::int32_t y = (d2.tokens[1] + 7) % std::int32_t(n_vocab);
    auto r = d.round({{1, known, {d2.tokens[0], y}, 6}, {3, known, {d2.tokens[0], y}, 6}});
    ASSERT_TRUE(r.error.empty()) << r.error;
    ASSERT_EQ(r.seqs.size(), 2u);
    EXPECT_EQ(r.seqs[0].tokens.size(), 6u);
    EXPECT_EQ(r.seqs[0].tokens, r.seqs[1].tokens);
    EXPECT_EQ(r.seqs[0].known, known + 2);
    EXPECT_EQ(d.drafter->rounds_failed(), 0u);
}

TEST(DraftActor, EvictedOrLostSequencesAreAnsweredKnownZero) {
    ORDO_REQUIRE_GPU();
    drafting d;
    ASSERT_TRUE(d.start(8));  // 64 positions: two 30-token sequences do not fit together
    const std::vector<std::int32_t> a = test_tokens(30, n_vocab, 5);
    const std::vector<std::int32_t> b = test_tokens(30, n_vocab, 6);
    const draft::drafted da = d.one(1, 0, a, 6);
    ASSERT_EQ(da.tokens.size(), 6u);
    const draft::drafted db = d.one(2, 0, b, 6);  // takes sequence 1's blocks
    ASSERT_EQ(db.tokens.size(), 6u);
    // Sequence 1 was forgotten: the round cannot extend it.
    const draft::drafted gone = d.one(1, 30, {da.tokens[0]}, 6);
    EXPECT_EQ(gone.known, 0u);
    EXPECT_TRUE(gone.tokens.empty());
    // Sent whole, it drafts as before.
    EXPECT_EQ(d.one(1, 0, a, 6).tokens, da.tokens);
    // The draft device is lost on its next step: the round fails, the device is rebuilt.
    inject_fault f;
    f.kind = fault_kind::device_lost;
    ASSERT_TRUE(d.drafter->tell(f).ok());
    auto failed = d.round({{1, 30, {da.tokens[0]}, 6}});
    EXPECT_NE(failed.error.find("gpu_device_lost"), std::string::npos) << failed.error;
    auto down = d.to.state();
    ASSERT_TRUE(down);
    EXPECT_FALSE(down->ready);
    auto up = d.to.state();
    ASSERT_TRUE(up);
    EXPECT_TRUE(up->ready);
    // What it held went with the device.
    const draft::drafted lost = d.one(1, 30, {da.tokens[0]}, 6);
    EXPECT_EQ(lost.known, 0u);
    EXPECT_EQ(d.one(1, 0, a, 6).tokens, da.tokens);
}

}  // namespace
}  // namespace ordo::gpu::testing
