// test_gpu_actor.cpp: the gpu actor on real libuv loops, the real device (lavapipe) and a
// generated model, driven through its mailbox by a reply_collector actor
// (gpu/client/gpu_client.hpp).
//
// Checks: (1) steps through the actor give bit-identical logits to the runner called directly;
// (2) an injected device loss gives step_failed{gpu_device_lost, device_lost} naming the
// segment of the chosen layer, then device_ready{epoch 1}, then steps work again; (3) a hang
// gives step_failed{gpu_timeout} within a bound, then recovery; (4) NaN logits give gpu_nan
// with no rebuild; (5) the loop answers while a step is running (the step is held inside the
// worker by a test hook until the gpu_busy refusal of a later step has arrived); (6) the queue
// bound refuses with gpu_busy and queued steps run in order; (7) recovery_max 0 turns a device loss
// into device_unavailable and later steps into gpu_unavailable; (8) stopping while a step runs
// still gives that step its one reply, and every loop closes cleanly (join ok); (9) KV copies
// through kv_staging: a prefill's blocks copied out equal the runner's own bytes, copied into
// other blocks and over clobbered originals they read back bit-identical and the next decode
// gives the same logits; a copy naming a slot not held is refused with gpu_bad_request;
// (10) a copy-out queued behind a held step runs after it (its bytes are the step's KV);
// (11) a device loss in a step fails the copy queued behind it with gpu_device_lost, and a
// later copy naming the old epoch is refused with gpu_stale_epoch; (12) a planned inject_fault
// (plan_step set, the config's fault plan) sent just before its step fires on that very step,
// and one the full armed faults refuse is answered fault_refused{plan_step} while an op's
// refused fault (plan_step 0) is not answered; (13) with every thread of libuv's process-wide
// pool held (where the kv actor's file jobs run: four saves on a hung disk), the device still
// builds and steps still run, on the actor's own job thread; (14) a step of several decode
// iterations gives, with and without row summaries, the rows and draws of steps of one fed their
// greedy tokens, one that cannot run so is refused gpu_bad_step, a step_delay delays each of its
// iterations and a nan fault fails it whole; (15) sampled sequences in such a step run the
// tokens a copy of their sampler draws from each row, or from its summary alone with row
// summaries (where that cannot settle a draw the step ends there, and no earlier), and a draw no
// sampler can make is refused gpu_bad_step; (16) end_decode_steps ends such a step after the
// iteration that runs, and so does a draw of one of its end_tokens; (17) with row summaries, a step
// of as many sequences as a slot has rows runs several iterations, the earlier ones' summaries in
// the slot's summary rows (device_ready::decode_rows_max), and without them it is refused.
#include <gtest/gtest.h>
#include <uv.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpu/client/gpu_client.hpp"
#include "gpu_fixture.hpp"
#include "scheduler/sampling.hpp"
#include "test_runner_support.hpp"

namespace ordo::gpu::testing {
namespace {

constexpr std::uint64_t reply_ms = 60'000;  // generous for a loaded 2-core machine

gpu_actor_options actor_options(std::uint32_t flush = 1) {
    gpu_actor_options o;
    o.model_path = synth_model(model::ggml_type::f16);
    o.runner = test_options(true, flush);
    o.recovery_max = 3;
    return o;
}

step decode_step(std::uint64_t id, std::int32_t token = 5) {
    return make_step(id, step_phase::decode, {make_seq(1, {token}, 0, {0})});
}

std::unique_ptr<gpu_session> start(gpu_actor_options o) {
    auto s = gpu_session::start(std::move(o), reply_ms);
    EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.err().message);
    return s.ok() ? std::move(*s) : nullptr;
}

TEST(GpuActor, StepsGiveTheRunnersLogits) {
    ORDO_REQUIRE_GPU();
    auto o = actor_options(2);
    auto tokens = test_tokens(11, 300, 4);
    step pre = make_step(1, step_phase::prefill, {make_seq(1, tokens, 0, {2, 3})});
    step dec = make_step(2, step_phase::decode, {make_seq(1, {7}, 11, {2, 3})});
    auto file = open_model(o.model_path);
    ASSERT_TRUE(file);
    auto r = runner::create(*file, o.runner);
    ASSERT_TRUE(r.ok());
    std::vector<float> want_pre(300), want_dec(300);
    ASSERT_TRUE((*r)->run_step(pre, want_pre.data()).ok());
    ASSERT_TRUE((*r)->run_step(dec, want_dec.data()).ok());

    auto s = start(o);
    ASSERT_TRUE(s);
    EXPECT_EQ(s->ready().epoch, 0u);
    EXPECT_EQ(s->ready().kv_blocks, 64u);
    std::vector<float> got;
    auto d = s->run(pre, got, reply_ms);
    ASSERT_TRUE(d.ok()) << d.err().message;
    EXPECT_EQ(d->rows, std::vector<std::uint64_t>{1});
    EXPECT_EQ(got, want_pre);
    d = s->run(dec, got, reply_ms);
    ASSERT_TRUE(d.ok()) << d.err().message;
    EXPECT_EQ(got, want_dec);
    ASSERT_TRUE(s->stop().ok());
}

// Arms `kind`, runs one step, expects the failure, a rebuild and a working step after it.
void fault_then_recovery(fault_kind kind, const std::string& code, const std::string& segment) {
    auto s = start(actor_options(1));
    ASSERT_TRUE(s);
    inject_fault f;
    f.kind = kind;
    f.phase = step_phase::prefill;
    f.layer = 1;
    ASSERT_TRUE(s->actor().tell(f).ok());
    // A decode step does not match the prefill-only fault.
    std::vector<float> logits;
    ASSERT_TRUE(s->run(decode_step(1), logits, reply_ms).ok());
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(
        s->actor().tell(make_step(2, step_phase::prefill, {make_seq(1, {5, 6}, 0, {0})})).ok());
    auto reply = s->replies().next(reply_ms);
    ASSERT_TRUE(reply);
    auto* failed = std::get_if<step_failed>(&*reply);
    ASSERT_TRUE(failed) << "got " << reply_name(*reply);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
    EXPECT_EQ(failed->step_id, 2u);
    EXPECT_EQ(enum_name(failed->code), code);
    EXPECT_TRUE(failed->device_lost);
    EXPECT_EQ(failed->segment, segment);
    EXPECT_NE(failed->message.find(segment), std::string::npos) << failed->message;
    auto ready = s->replies().next_as<device_ready>(reply_ms);
    ASSERT_TRUE(ready);
    EXPECT_EQ(ready->epoch, 1u);
    auto d = s->run(decode_step(3), logits, reply_ms);
    ASSERT_TRUE(d.ok()) << d.err().message;
    ASSERT_TRUE(s->stop().ok());
}

TEST(GpuActor, DeviceLossFailsTheStepThenRebuilds) {
    ORDO_REQUIRE_GPU();
    fault_then_recovery(fault_kind::device_lost, "gpu_device_lost", "prefill#2 seqs=1 layers 1-1");
}

TEST(GpuActor, HangTimesOutThenRebuilds) {
    ORDO_REQUIRE_GPU();
    fault_then_recovery(fault_kind::hang, "gpu_timeout", "prefill#2 seqs=1 layers 1-1");
}

TEST(GpuActor, NanLogitsAreReportedWithoutRebuild) {
    ORDO_REQUIRE_GPU();
    auto s = start(actor_options());
    ASSERT_TRUE(s);
    inject_fault f;
    f.kind = fault_kind::nan_logits;
    ASSERT_TRUE(s->actor().tell(f).ok());
    std::vector<float> logits;
    auto bad = s->run(decode_step(1), logits, reply_ms);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.err().code, "gpu_nan");
    auto d = s->run(decode_step(2), logits, reply_ms);
    ASSERT_TRUE(d.ok()) << d.err().message;
    EXPECT_TRUE(std::isfinite(logits[0]));
    ASSERT_TRUE(s->stop().ok());
}

TEST(GpuActor, PlannedFaultsFireOnTheirStepOrAreAnsweredWhenRefused) {
    ORDO_REQUIRE_GPU();
    auto s = start(actor_options());
    ASSERT_TRUE(s);
    // Sent right before its step, as the scheduler's plan does: the mailbox is in order, so
    // the fault is armed before the step is taken.
    inject_fault planned;
    planned.kind = fault_kind::nan_logits;
    planned.plan_step = 1;
    ASSERT_TRUE(s->actor().tell(planned).ok());
    std::vector<float> logits;
    auto bad = s->run(decode_step(1), logits, reply_ms);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.err().code, "gpu_nan");
    // Fill the armed faults with faults that wait for a prefill step (decode steps pass them).
    inject_fault waiting;
    waiting.kind = fault_kind::hang;
    waiting.phase = step_phase::prefill;
    for (std::size_t i = 0; i < armed_faults::armed_max; ++i) {
        ASSERT_TRUE(s->actor().tell(waiting).ok());
    }
    ASSERT_TRUE(s->actor().tell(waiting).ok());  // the op's ninth: refused, no reply
    planned.plan_step = 2;
    ASSERT_TRUE(s->actor().tell(planned).ok());
    ASSERT_TRUE(s->actor().tell(decode_step(2)).ok());
    auto refused = s->replies().next_as<fault_refused>(reply_ms);
    ASSERT_TRUE(refused) << "a planned fault the full plan refuses is answered";
    EXPECT_EQ(refused->plan_step, 2u);
    EXPECT_EQ(refused->kind, fault_kind::nan_logits);
    EXPECT_NE(refused->message.find("already armed"), std::string::npos) << refused->message;
    // The step runs without it.
    auto done = s->replies().next_as<step_done>(reply_ms);
    ASSERT_TRUE(done) << "step 2 runs without the refused fault";
    EXPECT_EQ(done->step_id, 2u);
    if (done->slot != logits_exchange::no_slot) s->exchange().release(done->slot);
    ASSERT_TRUE(s->stop().ok());
}

// The same 11-token prompt (seeded by `seed`) prefilled in two sequences, 1 on blocks 2-4 and 2
// on blocks 5-7 (steps 1 and 2): the first's greedy token, the one both decode from at 11.
std::optional<std::int32_t> prefill_twins(gpu_session& s, std::uint32_t seed) {
    const std::uint32_t n_vocab = s.n_vocab();
    const auto tokens = test_tokens(11, n_vocab, seed);
    std::vector<float> logits;
    auto a = s.run(make_step(1, step_phase::prefill, {make_seq(1, tokens, 0, {2, 3, 4})}), logits,
                   reply_ms);
    EXPECT_TRUE(a.ok()) << (a.ok() ? "" : a.err().message);
    if (!a) return std::nullopt;
    const auto first = std::int32_t(argmax(logits.data(), n_vocab));
    auto b = s.run(make_step(2, step_phase::prefill, {make_seq(2, tokens, 0, {5, 6, 7})}), logits,
                   reply_ms);
    EXPECT_TRUE(b.ok()) << (b.ok() ? "" : b.err().message);
    if (!b) return std::nullopt;
    return first;
}

// Step `id`: sequence 1 (prefill_twins' blocks 2-4) decoding `iterations` iterations from
// `token` at position 11.
step twin_decode_steps(std::uint64_t id, std::int32_t token, std::uint32_t iterations) {
    step m = make_step(id, step_phase::decode, {make_seq(1, {token}, 11, {2, 3, 4})});
    m.decode_steps = iterations;
    return m;
}

// What a step of several decode iterations handed back: step_done, and each iteration's rows
// (logits where the slot has them, summaries where the step summarized), read from the slot.
struct decode_steps_result {
    step_done done;
    std::vector<std::vector<float>> logits;             // [iteration]: empty where not in the slot
    std::vector<std::vector<std::uint32_t>> summaries;  // [iteration]: empty without summaries
};

std::optional<decode_steps_result> run_decode_steps(gpu_session& s, const step& m) {
    EXPECT_TRUE(s.actor().tell(m).ok());
    auto reply = s.replies().next(reply_ms);
    EXPECT_TRUE(reply);
    if (!reply) return std::nullopt;
    auto* done = std::get_if<step_done>(&*reply);
    EXPECT_TRUE(done) << "got " << reply_name(*reply);
    if (!done) return std::nullopt;
    decode_steps_result r{*done, {}, {}};
    const std::uint32_t k = done->decode_steps;  // the iterations that ran
    EXPECT_LE(k, m.decode_steps);
    for (std::uint32_t i = 0; i < k; i++) {
        const std::uint32_t at = decode_row(i, k, 1, 0);
        const bool logits = i + 1 == k || !done->summarized;
        auto row = s.exchange().read_row(done->slot, at);
        r.logits.emplace_back(logits ? std::vector<float>(row.begin(), row.end())
                                     : std::vector<float>());
        auto sum = s.exchange().read_summary(done->slot, at);
        r.summaries.emplace_back(done->summarized
                                     ? std::vector<std::uint32_t>(sum.begin(), sum.end())
                                     : std::vector<std::uint32_t>());
    }
    s.exchange().release(done->slot);
    return r;
}

// Sequence 2's decode step of one token (blocks 5-7, its rows' summaries at `temperature`), which
// must equal iteration i of `got`: the same logits row where that step kept it, the same summary
// where it summarized. The row and summary words, copied before the slot goes back.
struct one_step_rows {
    std::vector<float> row;
    std::vector<std::uint32_t> summary;  // empty where the step did not summarize
};
std::optional<one_step_rows> step_of_one_as(gpu_session& s, std::uint64_t id, std::int32_t token,
                                            std::uint32_t pos, float temperature,
                                            const decode_steps_result& got, std::uint32_t i) {
    step one = make_step(id, step_phase::decode, {make_seq(2, {token}, pos, {5, 6, 7})});
    one.seqs[0].temperature = temperature;
    EXPECT_TRUE(s.actor().tell(one).ok());
    auto done = s.replies().next_as<step_done>(reply_ms);
    EXPECT_TRUE(done);
    if (!done) return std::nullopt;
    auto row = s.exchange().read_row(done->slot, 0);
    auto sum = s.exchange().read_summary(done->slot, 0);
    one_step_rows r{{row.begin(), row.end()}, {}};
    if (done->summarized) r.summary.assign(sum.begin(), sum.end());
    s.exchange().release(done->slot);
    if (!got.logits[i].empty()) {
        EXPECT_EQ(got.logits[i], r.row);
    }
    if (got.done.summarized) {
        EXPECT_EQ(got.summaries[i], r.summary);
    }
    return r;
}

// A step of decode_steps (gpu::step::decode_steps) on the real device, with and without the
// rows' summaries: each iteration's rows are bit for bit those of a step of one running the
// greedy draw of the one before at the next position (a second sequence's, on other blocks),
// its draws are those greedy tokens, the rows are where decode_row says; a step that cannot run
// as several iterations is refused gpu_bad_step; a step_delay delays each iteration (a lower
// bound on the step's time, never an upper one); a nan fault fails the whole step gpu_nan.
TEST(GpuActor, DecodeStepsRunTheGreedyDrawsAsStepsOfOneWould) {
    ORDO_REQUIRE_GPU();
    for (bool summaries : {false, true}) {
        SCOPED_TRACE(summaries ? "summaries" : "no summaries");
        auto o = actor_options(2);
        o.runner.row_summaries = summaries;
        auto s = start(o);
        ASSERT_TRUE(s);
        const std::uint32_t n_vocab = s->n_vocab();
        std::vector<float> logits;
        // The same prompt in two sequences: 1 on blocks 2-4, 2 on blocks 5-7.
        const auto twins = prefill_twins(*s, 4);
        ASSERT_TRUE(twins);
        const std::int32_t first = *twins;
        // Sequence 1: four iterations from its first draw at position 11.
        step many = twin_decode_steps(3, first, 4);
        auto got = run_decode_steps(*s, many);
        ASSERT_TRUE(got);
        EXPECT_EQ(got->done.decode_steps, 4u);
        EXPECT_EQ(got->done.rows, std::vector<std::uint64_t>{1});
        EXPECT_EQ(got->done.summarized, summaries);
        ASSERT_EQ(got->done.draws.size(), 3u);
        // Sequence 2: the same four as steps of one, each feeding its greedy token to the next.
        std::int32_t t = first;
        for (std::uint32_t i = 0; i < 4; i++) {
            SCOPED_TRACE("iteration " + std::to_string(i));
            auto one = step_of_one_as(*s, 10 + i, t, 11 + i, 0.0f, *got, i);
            ASSERT_TRUE(one);
            EXPECT_EQ(got->logits[i].empty(), summaries && i < 3);
            t = logits_exchange::greedy_of(one->row, one->summary, n_vocab);
            EXPECT_EQ(t, std::int32_t(argmax(one->row.data(), n_vocab)));
            if (i < 3) {
                EXPECT_EQ(got->done.draws[i], t);
            }
        }
        // Refused: a prefill chunk, too many iterations, more rows than a slot holds.
        step chunk = make_step(20, step_phase::decode, {make_seq(3, {1, 2}, 0, {8})});
        chunk.decode_steps = 2;
        step too_many = make_step(21, step_phase::decode, {make_seq(3, {1}, 0, {8, 9, 10})});
        too_many.decode_steps = decode_steps_max + 1;
        step wide = make_step(
            22, step_phase::decode,
            {make_seq(3, {1}, 0, {8}), make_seq(4, {1}, 0, {9}), make_seq(5, {1}, 0, {10})});
        wide.decode_steps = 3;  // 9 rows; a slot holds 8
        for (const step* bad : {&chunk, &too_many, &wide}) {
            auto r = s->run(*bad, logits, reply_ms);
            ASSERT_FALSE(r.ok()) << bad->step_id;
            EXPECT_EQ(r.err().code, "gpu_bad_step") << bad->step_id;
        }
        // A step_delay (a slow device) delays every iteration, as it would each step of one.
        inject_fault slow;
        slow.kind = fault_kind::step_delay;
        slow.phase = step_phase::decode;
        slow.delay_ms = 150;
        ASSERT_TRUE(s->actor().tell(slow).ok());
        step delayed = twin_decode_steps(24, first, 3);
        const auto t0 = std::chrono::steady_clock::now();
        ASSERT_TRUE(run_decode_steps(*s, delayed));
        EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(3 * 150));
        // A nan fault on the step fails it whole.
        inject_fault nan;
        nan.kind = fault_kind::nan_logits;
        nan.phase = step_phase::decode;
        ASSERT_TRUE(s->actor().tell(nan).ok());
        step faulted = twin_decode_steps(23, first, 3);
        auto f = s->run(faulted, logits, reply_ms);
        ASSERT_FALSE(f.ok());
        EXPECT_EQ(f.err().code, "gpu_nan");
        ASSERT_TRUE(s->stop().ok());
    }
}

// A step of several decode iterations whose sequences sample (step_seq::draw: a copy of each
// request's sampler): each iteration's rows are those of steps of one fed the tokens the
// request's sampler draws from what the scheduler keeps (the row, or the summary alone with
// row summaries), the draws are those tokens, and the step ends at the first iteration whose
// draw its summary alone does not settle (never earlier, never later). A draw no sampler can
// make is refused gpu_bad_step.
TEST(GpuActor, DecodeStepsRunTheSampledDrawsTheSamplerWould) {
    ORDO_REQUIRE_GPU();
    struct filters {
        float temperature;
        std::int32_t top_k;
    };
    for (bool summaries : {false, true}) {
        auto o = actor_options(2);
        o.runner.row_summaries = summaries;
        auto s = start(o);
        ASSERT_TRUE(s);
        const std::uint32_t n_vocab = s->n_vocab();
        std::vector<float> logits;
        const auto twins = prefill_twins(*s, 5);
        ASSERT_TRUE(twins);
        const std::int32_t first = *twins;
        std::uint64_t id = 100;
        // top_k 40 is always settled by a summary's 64 candidates; temperature 8 spreads the
        // mass over the whole vocabulary, so a summary alone leaves most draws in the tail.
        for (filters f : {filters{1.0f, 40}, filters{8.0f, 0}}) {
            SCOPED_TRACE(std::string(summaries ? "summaries" : "rows") + ", temperature " +
                         std::to_string(f.temperature));
            sched::sampling_params p;
            p.temperature = f.temperature;
            p.top_k = f.top_k;
            p.seed = 7;
            auto want = sched::sampler::create(p);
            ASSERT_TRUE(want.ok());
            const auto state = want->rng_state();
            step many = twin_decode_steps(id++, first, 5);
            many.seqs[0].temperature = f.temperature;
            many.seqs[0].draw = {f.temperature, f.top_k, 1.0f, 0.0f, {state.begin(), state.end()}};
            auto got = run_decode_steps(*s, many);
            ASSERT_TRUE(got);
            const std::uint32_t ran = got->done.decode_steps;
            ASSERT_GE(ran, 1u);
            ASSERT_EQ(got->done.draws.size(), ran - 1);
            if (!summaries || f.top_k > 0) {
                EXPECT_EQ(ran, 5u) << "every draw is settled";
            }
            // Sequence 2: the same as steps of one, fed the request's own draws.
            std::int32_t t = first;
            for (std::uint32_t i = 0; i < ran; i++) {
                SCOPED_TRACE("iteration " + std::to_string(i));
                auto one = step_of_one_as(*s, id++, t, 11 + i, f.temperature, *got, i);
                ASSERT_TRUE(one);
                const std::span<const float> row = one->row;
                const std::span<const std::uint32_t> words = one->summary;
                if (i + 1 < ran) {
                    std::int32_t drawn = -1;
                    if (summaries) {
                        auto sum = sched::read_summary(words, n_vocab, f.temperature);
                        ASSERT_TRUE(sum.ok());
                        auto d = want->sample_summarized(*sum, n_vocab);
                        ASSERT_TRUE(d) << "the step ran past a draw its summary did not settle";
                        drawn = d->token;
                    } else {
                        auto d = want->sample(row.first(n_vocab), {});
                        ASSERT_TRUE(d.ok());
                        drawn = d->token;
                    }
                    EXPECT_EQ(got->done.draws[i], drawn);
                    t = drawn;
                } else if (ran < 5) {
                    auto sum = sched::read_summary(words, n_vocab, f.temperature);
                    ASSERT_TRUE(sum.ok());
                    EXPECT_FALSE(want->sample_summarized(*sum, n_vocab))
                        << "the step ended at a draw its summary settles";
                }
            }
            if (summaries && f.top_k == 0) {
                EXPECT_LT(ran, 5u) << "no draw fell past the candidates: the test sees no end";
            }
        }
        // A draw no sampler can make: a generator state of three words.
        step bad = twin_decode_steps(id++, first, 2);
        bad.seqs[0].draw = {1.0f, 0, 1.0f, 0.0f, {1, 2, 3}};
        auto r = s->run(bad, logits, reply_ms);
        ASSERT_FALSE(r.ok());
        EXPECT_EQ(r.err().code, "gpu_bad_step");
        EXPECT_NE(r.err().message.find("sequence 1's draw"), std::string::npos) << r.err().message;
        ASSERT_TRUE(s->stop().ok());
    }
}

// A step of as many sequences as a slot has rows runs several iterations where the earlier ones
// keep their summaries alone, given an exchange with room for them (device_ready::
// decode_rows_max): each iteration's summaries, the last one's rows and the draws are those of
// steps of one of the same eight sequences (on other blocks) fed their greedy tokens. Without
// row summaries the device says rows_max and refuses such a step gpu_bad_step.
TEST(GpuActor, DecodeStepsOfAFullSlotKeepTheEarlierIterationsSummaries) {
    ORDO_REQUIRE_GPU();
    constexpr std::uint32_t k = 4;
    for (bool summaries : {true, false}) {
        SCOPED_TRACE(summaries ? "summaries" : "no summaries");
        auto o = actor_options(2);
        o.runner.row_summaries = summaries;
        const std::uint32_t rows = o.runner.rows_max;
        auto started = gpu_session::start(o, reply_ms, nullptr, rows * k);
        ASSERT_TRUE(started.ok()) << (started.ok() ? "" : started.err().message);
        gpu_session& s = **started;
        EXPECT_EQ(s.ready().decode_rows_max, summaries ? rows * k : rows);
        const std::uint32_t n_vocab = s.n_vocab();
        // `rows` sequences from `first_seq` at position `pos`, one block each from `first_block`.
        auto seqs = [&](std::uint64_t first_seq, std::uint32_t first_block,
                        const std::vector<std::int32_t>& tokens, std::uint32_t pos) {
            std::vector<step_seq> q;
            for (std::uint32_t j = 0; j < rows; j++) {
                q.push_back(make_seq(first_seq + j, {tokens[j]}, pos, {first_block + j}));
            }
            return q;
        };
        const auto start_tokens = test_tokens(rows, n_vocab, 3);
        step many = make_step(1, step_phase::decode, seqs(1, 2, start_tokens, 0));
        many.decode_steps = k;
        if (!summaries) {
            std::vector<float> logits;
            auto r = s.run(many, logits, reply_ms);
            ASSERT_FALSE(r.ok());
            EXPECT_EQ(r.err().code, "gpu_bad_step");
            EXPECT_NE(r.err().message.find("rows of a slot's iterations"), std::string::npos)
                << r.err().message;
            ASSERT_TRUE(s.stop().ok());
            continue;
        }
        ASSERT_TRUE(s.actor().tell(many).ok());
        auto done = s.replies().next_as<step_done>(reply_ms);
        ASSERT_TRUE(done);
        ASSERT_EQ(done->decode_steps, k);
        ASSERT_TRUE(done->summarized);
        ASSERT_EQ(done->draws.size(), std::size_t(k - 1) * rows);
        std::vector<std::vector<std::uint32_t>> got_summaries;  // [i x rows + j]
        std::vector<std::vector<float>> got_rows;               // the last iteration's, [j]
        for (std::uint32_t i = 0; i < k; i++) {
            for (std::uint32_t j = 0; j < rows; j++) {
                const std::uint32_t at = decode_row(i, k, rows, j);
                auto sum = s.exchange().read_summary(done->slot, at);
                got_summaries.emplace_back(sum.begin(), sum.end());
                if (i + 1 == k) {
                    auto row = s.exchange().read_row(done->slot, at);
                    got_rows.emplace_back(row.begin(), row.end());
                }
            }
        }
        s.exchange().release(done->slot);
        std::vector<std::int32_t> t = start_tokens;
        for (std::uint32_t i = 0; i < k; i++) {
            SCOPED_TRACE("iteration " + std::to_string(i));
            ASSERT_TRUE(
                s.actor().tell(make_step(10 + i, step_phase::decode, seqs(11, 20, t, i))).ok());
            auto one = s.replies().next_as<step_done>(reply_ms);
            ASSERT_TRUE(one);
            for (std::uint32_t j = 0; j < rows; j++) {
                auto sum = s.exchange().read_summary(one->slot, j);
                EXPECT_EQ(got_summaries[i * rows + j],
                          std::vector<std::uint32_t>(sum.begin(), sum.end()))
                    << "row " << j;
                if (i + 1 == k) {
                    auto row = s.exchange().read_row(one->slot, j);
                    EXPECT_EQ(got_rows[j], std::vector<float>(row.begin(), row.end()))
                        << "row " << j;
                }
                t[j] = s.exchange().greedy_token(one->slot, j, true, n_vocab);
                if (i + 1 < k) {
                    EXPECT_EQ(done->draws[i * rows + j], t[j]) << "row " << j;
                }
            }
            s.exchange().release(one->slot);
        }
        ASSERT_TRUE(s.stop().ok());
    }
}

// A step of several decode iterations ends after the first iteration whose draw is one of its
// end_tokens (the scheduler's end-of-generation ids while a request is queued): its rows and
// draws are the uncut step's up to there. More end_tokens than end_tokens_max are refused
// gpu_bad_step.
TEST(GpuActor, DecodeStepsEndAtAnEndToken) {
    ORDO_REQUIRE_GPU();
    auto s = start(actor_options(2));
    ASSERT_TRUE(s);
    const auto twins = prefill_twins(*s, 6);
    ASSERT_TRUE(twins);
    step uncut = twin_decode_steps(3, *twins, 4);
    auto full = run_decode_steps(*s, uncut);
    ASSERT_TRUE(full);
    ASSERT_EQ(full->done.decode_steps, 4u);
    const std::vector<std::int32_t>& drawn = full->done.draws;
    ASSERT_EQ(drawn.size(), 3u);
    // The same step again (the same positions, written again) ending at iteration 1's draw, or
    // at its first iteration drawing it; an end token no row draws changes nothing.
    step cut = uncut;
    cut.step_id = 4;
    cut.end_tokens = {std::int32_t(s->n_vocab() + 5), drawn[1]};
    const auto first = std::size_t(std::find(drawn.begin(), drawn.end(), drawn[1]) - drawn.begin());
    auto got = run_decode_steps(*s, cut);
    ASSERT_TRUE(got);
    EXPECT_EQ(got->done.decode_steps, first + 1);
    EXPECT_EQ(got->done.draws,
              std::vector<std::int32_t>(drawn.begin(), drawn.begin() + long(first)));
    for (std::size_t i = 0; i <= first && i < got->logits.size(); i++) {
        EXPECT_EQ(got->logits[i], full->logits[i]) << "iteration " << i;
    }
    step many = uncut;
    many.step_id = 5;
    many.end_tokens.assign(end_tokens_max + 1, 0);
    std::vector<float> logits;
    auto r = s->run(many, logits, reply_ms);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.err().code, "gpu_bad_step");
    EXPECT_NE(r.err().message.find("end_tokens"), std::string::npos) << r.err().message;
    ASSERT_TRUE(s->stop().ok());
}

// Holds steps inside the worker until released.
struct gate {
    std::mutex m;
    std::condition_variable cv;
    int entered = 0;
    bool open = false;
    void enter() {
        std::unique_lock l(m);
        entered++;
        cv.notify_all();
        cv.wait_for(l, std::chrono::seconds(60), [&] { return open; });
    }
    bool wait_entered(int n) {
        std::unique_lock l(m);
        return cv.wait_for(l, std::chrono::seconds(60), [&] { return entered >= n; });
    }
    void release() {
        std::lock_guard l(m);
        open = true;
        cv.notify_all();
    }
};

// Holds every thread of libuv's process-wide pool (UV_THREADPOOL_SIZE, 4 by default) with work
// requests that wait until release(), as file jobs stuck on a hung disk would.
class pool_holder {
public:
    pool_holder() {
        const char* env = std::getenv("UV_THREADPOOL_SIZE");
        _threads = env != nullptr && std::atoi(env) > 0 ? std::atoi(env) : 4;
        uv_loop_init(&_loop);
        _works.resize(std::size_t(_threads) + 1);  // one more than the pool runs at once
        for (uv_work_t& w : _works) {
            w.data = this;
            uv_queue_work(
                &_loop, &w,
                [](uv_work_t* r) {
                    auto* self = static_cast<pool_holder*>(r->data);
                    std::unique_lock lock(self->_mutex);
                    self->_entered++;
                    self->_changed.notify_all();
                    self->_changed.wait(lock, [self] { return self->_released; });
                },
                [](uv_work_t*, int) {});
        }
        _runner = std::thread([this] { uv_run(&_loop, UV_RUN_DEFAULT); });
    }
    ~pool_holder() {
        release();
        _runner.join();
        uv_loop_close(&_loop);
    }
    // Waits (at most timeout_ms) until the pool's every thread runs one of the requests.
    bool hold(std::uint64_t timeout_ms) {
        std::unique_lock lock(_mutex);
        return _changed.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                                 [this] { return _entered >= _threads; });
    }
    int entered() {
        std::lock_guard lock(_mutex);
        return _entered;
    }
    int threads() const { return _threads; }
    void release() {
        std::lock_guard lock(_mutex);
        _released = true;
        _changed.notify_all();
    }

private:
    int _threads = 4;
    uv_loop_t _loop{};
    std::vector<uv_work_t> _works;
    std::thread _runner;
    std::mutex _mutex;
    std::condition_variable _changed;
    int _entered = 0;
    bool _released = false;
};

// The gpu actor's jobs never wait for libuv's pool: with all of it held, the device builds and
// two decode steps run, and the pool is still held after (nothing of the gpu's ran on it). Before
// the actor had its own job thread, the build waited behind the held pool: this test failed after
// reply_ms (and the session's start, giving up, then waited for that build to end).
TEST(GpuActor, StepsRunWhileLibuvsThreadPoolIsHeld) {
    ORDO_REQUIRE_GPU();
    pool_holder held;
    ASSERT_TRUE(held.hold(reply_ms)) << held.entered() << " of " << held.threads();
    auto starting = std::async(std::launch::async, [] { return start(actor_options(1)); });
    if (starting.wait_for(std::chrono::milliseconds(reply_ms)) != std::future_status::ready) {
        held.release();  // the build waits behind the pool: let it end, so the test ends
        FAIL() << "the device build waited for libuv's thread pool";
    }
    auto s = starting.get();
    ASSERT_TRUE(s);
    std::vector<float> logits;
    auto d = s->run(decode_step(1), logits, reply_ms);
    ASSERT_TRUE(d.ok()) << d.err().message;
    d = s->run(decode_step(2, 7), logits, reply_ms);
    ASSERT_TRUE(d.ok()) << d.err().message;
    EXPECT_EQ(held.entered(), held.threads());  // the extra request still waits for a thread
    held.release();
    ASSERT_TRUE(s->stop().ok());
}

TEST(GpuActor, LoopAnswersWhileAStepRunsAndTheQueueIsBounded) {
    ORDO_REQUIRE_GPU();
    auto g = std::make_shared<gate>();
    auto o = actor_options();
    o.queue_max = 2;
    o.on_step_begin = [g](const step&) { g->enter(); };
    auto s = start(o);
    ASSERT_TRUE(s);
    ASSERT_TRUE(s->actor().tell(decode_step(1)).ok());
    ASSERT_TRUE(g->wait_entered(1));
    // Step 1 is inside the worker: the loop must still answer (the refusal below is its
    // answer, sent while step 1 is held).
    for (std::uint64_t id = 2; id <= 4; ++id) {
        ASSERT_TRUE(s->actor().tell(decode_step(id)).ok());
    }
    auto busy = s->replies().next_as<step_failed>(reply_ms);
    ASSERT_TRUE(busy);
    EXPECT_EQ(busy->step_id, 4u);
    EXPECT_EQ(busy->code, gpu_failure::busy);
    g->release();
    for (std::uint64_t id = 1; id <= 3; ++id) {
        auto d = s->replies().next_as<step_done>(reply_ms);
        ASSERT_TRUE(d) << "step " << id;
        EXPECT_EQ(d->step_id, id);
        s->exchange().release(d->slot);
    }
    ASSERT_TRUE(s->stop().ok());
}

// end_decode_steps (the scheduler: a request waits for the step) ends a step of several decode
// iterations after the iteration that runs: sent while the step is held before its first, the
// step runs one, its rows where a step of one puts them, no draws. An end naming an earlier
// step leaves a later one whole.
TEST(GpuActor, EndDecodeStepsEndsTheStepAfterTheIterationRunning) {
    ORDO_REQUIRE_GPU();
    auto g = std::make_shared<gate>();
    auto o = actor_options(2);
    o.on_step_begin = [g](const step& m) {
        if (m.step_id == 3) g->enter();
    };
    auto s = start(o);
    ASSERT_TRUE(s);
    std::vector<float> logits;
    const auto twins = prefill_twins(*s, 6);
    ASSERT_TRUE(twins);
    const std::int32_t first = *twins;
    step held = twin_decode_steps(3, first, 4);
    ASSERT_TRUE(s->actor().tell(held).ok());
    ASSERT_TRUE(g->wait_entered(1));
    ASSERT_TRUE(s->actor().tell(end_decode_steps{3}).ok());
    // The loop takes it while the worker holds the step (no reply to wait on: poll the count).
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(reply_ms);
    while (s->actor().decode_steps_ends() < 1 && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_EQ(s->actor().decode_steps_ends(), 1u);
    g->release();
    auto done = s->replies().next_as<step_done>(reply_ms);
    ASSERT_TRUE(done);
    EXPECT_EQ(done->step_id, 3u);
    EXPECT_EQ(done->decode_steps, 1u);
    EXPECT_TRUE(done->draws.empty());
    auto row = s->exchange().read_row(done->slot, 0);
    const std::vector<float> ran(row.begin(), row.end());
    s->exchange().release(done->slot);
    // The same token as a step of one on sequence 2: the same row.
    ASSERT_TRUE(s->run(make_step(4, step_phase::decode, {make_seq(2, {first}, 11, {5, 6, 7})}),
                       logits, reply_ms)
                    .ok());
    EXPECT_EQ(ran, logits);
    // An end for step 3 does not touch step 5.
    step whole = twin_decode_steps(5, first, 3);
    ASSERT_TRUE(s->actor().tell(whole).ok());
    auto d5 = s->replies().next_as<step_done>(reply_ms);
    ASSERT_TRUE(d5);
    EXPECT_EQ(d5->decode_steps, 3u);
    EXPECT_EQ(d5->draws.size(), 2u);
    s->exchange().release(d5->slot);
    ASSERT_TRUE(s->stop().ok());
}

TEST(GpuActor, RecoveryMaxZeroMakesTheDeviceUnavailable) {
    ORDO_REQUIRE_GPU();
    auto o = actor_options();
    o.recovery_max = 0;
    auto s = start(o);
    ASSERT_TRUE(s);
    inject_fault f;
    f.kind = fault_kind::device_lost;
    ASSERT_TRUE(s->actor().tell(f).ok());
    std::vector<float> logits;
    auto lost = s->run(decode_step(1), logits, reply_ms);
    ASSERT_FALSE(lost.ok());
    EXPECT_EQ(lost.err().code, "gpu_device_lost");
    auto u = s->replies().next_as<device_unavailable>(reply_ms);
    ASSERT_TRUE(u);
    auto after = s->run(decode_step(2), logits, reply_ms);
    ASSERT_FALSE(after.ok());
    EXPECT_EQ(after.err().code, "gpu_unavailable");
    ASSERT_TRUE(s->stop().ok());
}

// reset_device (the scheduler's backstop) rebuilds through the real recovery path: the device
// comes back as device_ready{epoch 1} and steps run again; on an unavailable device it answers
// device_unavailable rather than silence.
TEST(GpuActor, ResetDeviceRebuildsAndAnnouncesTheNewEpoch) {
    ORDO_REQUIRE_GPU();
    auto s = start(actor_options());
    ASSERT_TRUE(s);
    ASSERT_TRUE(s->actor().tell(reset_device{"test"}).ok());
    auto ready = s->replies().next_as<device_ready>(reply_ms);
    ASSERT_TRUE(ready) << "no device_ready after reset_device";
    EXPECT_EQ(ready->epoch, 1u);
    std::vector<float> logits;
    auto d = s->run(decode_step(1), logits, reply_ms);
    ASSERT_TRUE(d.ok()) << d.err().message;
    ASSERT_TRUE(s->stop().ok());

    auto o = actor_options();
    o.recovery_max = 0;
    auto u = start(o);
    ASSERT_TRUE(u);
    ASSERT_TRUE(u->actor().tell(reset_device{"test"}).ok());
    auto gone = u->replies().next_as<device_unavailable>(reply_ms);
    ASSERT_TRUE(gone) << "reset with recovery_max 0 must end in device_unavailable";
    ASSERT_TRUE(u->actor().tell(reset_device{"again"}).ok());
    EXPECT_TRUE(u->replies().next_as<device_unavailable>(reply_ms));
    ASSERT_TRUE(u->stop().ok());
}

TEST(GpuActor, StopWhileAStepRunsRepliesAndClosesCleanly) {
    ORDO_REQUIRE_GPU();
    auto g = std::make_shared<gate>();
    auto o = actor_options();
    o.on_step_begin = [g](const step&) { g->enter(); };
    auto s = start(o);
    ASSERT_TRUE(s);
    ASSERT_TRUE(s->actor().tell(decode_step(1)).ok());
    ASSERT_TRUE(g->wait_entered(1));
    s->actor().request_stop();
    std::thread opener([g] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        g->release();
    });
    status joined = s->actor().join();
    opener.join();
    EXPECT_TRUE(joined.ok()) << joined.err().message;
    auto d = s->replies().next_as<step_done>(reply_ms);
    ASSERT_TRUE(d) << "the running step lost its reply";
    EXPECT_EQ(d->step_id, 1u);
    ASSERT_TRUE(s->stop().ok());
}

// ---- KV copies -------------------------------------------------------------------------

constexpr std::uint32_t kv_slots = 2;
constexpr std::uint64_t kv_slot_bytes = 8 * 2048;  // 8 blocks of the synthetic f16 model

struct kv_fixture {
    kv_staging staging{kv_slots, kv_slot_bytes};
    std::unique_ptr<gpu_session> s;
    std::uint64_t block_bytes = 0;

    explicit kv_fixture(gpu_actor_options o) {
        auto r = gpu_session::start(std::move(o), reply_ms, &staging);
        EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.err().message);
        if (r.ok()) s = std::move(*r);
        block_bytes = 2 * 2 * (2 * 8 * 16 * 2);  // K,V x layers x (heads, tokens, dim, f16)
    }
    // Sends a copy and waits for its reply; on done, the slot's bytes (copy-out).
    template <typename Msg>
    result<std::vector<std::uint8_t>> copy(const Msg& m) {
        if (auto t = s->actor().tell(m); !t) return t.err().as_error();
        auto r = s->replies().next(reply_ms);
        if (!r) return make_error("timeout", "no reply");
        if (auto* f = std::get_if<kv_copy_failed>(&*r)) {
            return make_error(std::string(enum_name(f->code)), f->message);
        }
        auto* d = std::get_if<kv_copy_done>(&*r);
        if (d == nullptr || d->job_id != m.job_id) return make_error("protocol", reply_name(*r));
        auto b = staging.read(m.staging_slot, d->bytes);
        return std::vector<std::uint8_t>(b.begin(), b.end());
    }
};

TEST(GpuActor, KvCopiesRoundTripBitIdentical) {
    ORDO_REQUIRE_GPU();
    auto o = actor_options(2);
    auto tokens = test_tokens(11, 300, 4);
    const std::vector<std::uint32_t> table = {40, 41}, other = {50, 51};
    step pre = make_step(1, step_phase::prefill, {make_seq(1, tokens, 0, table)});
    // The runner's own bytes of the same prefill.
    auto file = open_model(o.model_path);
    ASSERT_TRUE(file);
    auto r = runner::create(*file, o.runner);
    ASSERT_TRUE(r.ok());
    std::vector<float> scratch(300);
    ASSERT_TRUE((*r)->run_step(pre, scratch.data()).ok());
    std::vector<std::uint8_t> want_kv(table.size() * (*r)->kv_block_bytes());
    ASSERT_TRUE((*r)->read_kv_blocks(table, want_kv).ok());

    kv_fixture k(o);
    ASSERT_TRUE(k.s);
    ASSERT_EQ(k.block_bytes, (*r)->kv_block_bytes());
    std::vector<float> logits, want_dec;
    ASSERT_TRUE(k.s->run(pre, logits, reply_ms).ok());
    auto slot = k.staging.acquire();
    ASSERT_TRUE(slot.ok());
    auto out = k.copy(kv_copy_out{7, table, *slot});
    ASSERT_TRUE(out.ok()) << out.err().message;
    EXPECT_EQ(*out, want_kv);
    ASSERT_TRUE(k.s->run(make_step(2, step_phase::decode, {make_seq(1, {7}, 11, table)}), want_dec,
                         reply_ms)
                    .ok());
    // Into other blocks: the decode over them gives the same logits.
    ASSERT_TRUE(k.copy(kv_copy_in{8, other, *slot}).ok());
    ASSERT_TRUE(
        k.s->run(make_step(3, step_phase::decode, {make_seq(1, {7}, 11, other)}), logits, reply_ms)
            .ok());
    EXPECT_EQ(logits, want_dec);
    // Clobber the originals, restore them, decode again.
    auto bytes = k.staging.bytes(*slot, want_kv.size());
    std::fill(bytes.begin(), bytes.end(), 0xAB);
    ASSERT_TRUE(k.copy(kv_copy_in{9, table, *slot}).ok());
    std::copy(want_kv.begin(), want_kv.end(), bytes.begin());
    ASSERT_TRUE(k.copy(kv_copy_in{10, table, *slot}).ok());
    auto back = k.copy(kv_copy_out{11, table, *slot});
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, want_kv);
    ASSERT_TRUE(
        k.s->run(make_step(4, step_phase::decode, {make_seq(1, {7}, 11, table)}), logits, reply_ms)
            .ok());
    EXPECT_EQ(logits, want_dec);
    // A slot the sender does not hold is refused, the device untouched.
    k.staging.release(*slot);
    auto refused = k.copy(kv_copy_out{12, table, *slot});
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.err().code, "gpu_bad_request");
    ASSERT_TRUE(k.s->stop().ok());
}

TEST(GpuActor, KvCopyOutQueuedBehindAStepRunsAfterIt) {
    ORDO_REQUIRE_GPU();
    auto g = std::make_shared<gate>();
    auto o = actor_options();
    o.on_step_begin = [g](const step&) { g->enter(); };
    kv_fixture k(o);
    ASSERT_TRUE(k.s);
    const std::vector<std::uint32_t> table = {40, 41};
    auto slot = k.staging.acquire();
    ASSERT_TRUE(slot.ok());
    ASSERT_TRUE(k.s->actor()
                    .tell(make_step(1, step_phase::prefill,
                                    {make_seq(1, test_tokens(11, 300, 4), 0, table, false)}))
                    .ok());
    ASSERT_TRUE(g->wait_entered(1));
    ASSERT_TRUE(k.s->actor().tell(kv_copy_out{5, table, *slot}).ok());
    g->release();
    auto d = k.s->replies().next_as<step_done>(reply_ms);
    ASSERT_TRUE(d);
    auto c = k.s->replies().next_as<kv_copy_done>(reply_ms);
    ASSERT_TRUE(c);
    EXPECT_EQ(c->job_id, 5u);
    EXPECT_EQ(c->bytes, table.size() * k.block_bytes);
    // Blocks 40, 41 were never written before the prefill: non-zero bytes are the step's KV.
    auto b = k.staging.read(*slot, c->bytes);
    EXPECT_NE(std::vector<std::uint8_t>(b.begin(), b.end()),
              std::vector<std::uint8_t>(b.size(), 0));
    k.staging.release(*slot);
    ASSERT_TRUE(k.s->stop().ok());
}

TEST(GpuActor, DeviceLossFailsAQueuedKvCopy) {
    ORDO_REQUIRE_GPU();
    auto g = std::make_shared<gate>();
    auto o = actor_options();
    o.on_step_begin = [g](const step&) { g->enter(); };
    kv_fixture k(o);
    ASSERT_TRUE(k.s);
    inject_fault f;
    f.kind = fault_kind::device_lost;
    ASSERT_TRUE(k.s->actor().tell(f).ok());
    auto slot = k.staging.acquire();
    ASSERT_TRUE(slot.ok());
    ASSERT_TRUE(k.s->actor().tell(decode_step(1)).ok());
    ASSERT_TRUE(g->wait_entered(1));
    ASSERT_TRUE(k.s->actor().tell(kv_copy_out{6, {0}, *slot}).ok());
    g->release();
    auto lost = k.s->replies().next_as<step_failed>(reply_ms);
    ASSERT_TRUE(lost);
    EXPECT_TRUE(lost->device_lost);
    auto c = k.s->replies().next_as<kv_copy_failed>(reply_ms);
    ASSERT_TRUE(c);
    EXPECT_EQ(c->job_id, 6u);
    EXPECT_EQ(c->code, gpu_failure::device_lost);
    auto ready = k.s->replies().next_as<device_ready>(reply_ms);
    ASSERT_TRUE(ready);
    EXPECT_EQ(ready->epoch, 1u);
    // A copy that names epoch-0 block ids reaches a rebuilt pool: refused, nothing copied.
    auto stale = k.copy(kv_copy_out{7, {0}, *slot, 0});
    ASSERT_FALSE(stale.ok());
    EXPECT_EQ(stale.err().code, "gpu_stale_epoch");
    EXPECT_TRUE(k.copy(kv_copy_out{8, {0}, *slot, 1}).ok());
    k.staging.release(*slot);
    ASSERT_TRUE(k.s->stop().ok());
}

}  // namespace
}  // namespace ordo::gpu::testing
