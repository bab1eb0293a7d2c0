// scheduler_decode_steps_test.cpp: steps of several decode iterations (core_options::decode_steps,
// gpu::step::decode_steps), the harness running each iteration on the CPU reference and handing
// each row's draw (gpu::step_draws: greedy's, or a copy of the request's sampler's) to the next
// iteration as the gpu actor does (gpu_actor::run_decode_steps), the rows at gpu::decode_row.
//
// Checks: greedy requests, alone and batched with different max_tokens, give the reference
// generator's tokens and the same streamed events as one iteration a step, in fewer steps
// (decode_iterations_ahead counts the iterations run ahead); no iteration runs past max_tokens
// (a request of 6 tokens runs steps of 1, 4 and 1 iterations); sampled requests (no penalty)
// run ahead too, the gpu actor's copy of each sampler drawing between iterations, with the
// output and events of one iteration a step, rows summarized or not (a draw the summary alone
// cannot settle ends its step early); where the earlier iterations keep only their summaries, a
// step of rows_max sequences runs several (device_ready::decode_rows_max); a request with a penalty
// runs one iteration a step, with its one-iteration output; a request queued while every
// sequence is busy lets the running ones run ahead and starts at the same iteration (nothing runs
// ahead while a queued request has a free sequence), and a request that arrives during such a
// step, with a sequence free for it, ends the step early (gpu::end_decode_steps); end of generation
// and a stop string inside such a step end the request at that token, with every block freed,
// and an end of generation ends the step there while a request is queued (gpu::step::end_tokens:
// the queued one starts at the same iteration as with one iteration a step); a cancel that arrives
// during one is applied at its first iteration and ends the step early; a failed one is retried
// with the same output; a device whose draw is not the sampler's ends that request with error
// internal and leaves the other's output alone. Invariants are checked after every message (the
// harness).

#include "tests/scheduler/scheduler_harness.hpp"

using namespace ordo;
using namespace ordo::sched;
using namespace ordo::sched::core_test;

namespace {

core_options with_decode_steps(uint32_t k) {
    core_options o;
    o.decode_steps = k;
    return o;
}

std::vector<std::string> streamed_texts(const harness& h, uint64_t id) {
    std::vector<std::string> texts;
    for (const auto& e : h.events_of(1, id)) {
        if (e.str("event") == "token") texts.push_back(e.str("text"));
    }
    return texts;
}

// Request `id` ended done in `many` with the tokens, text and streamed texts it had in `one`.
void expect_same_output(const harness& one, const harness& many, uint64_t id) {
    SCOPED_TRACE("request " + std::to_string(id));
    const event* a = one.terminal(1, id);
    const event* b = many.terminal(1, id);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->str("event"), "done") << b->str("message");
    EXPECT_EQ(b->tokens(), a->tokens());
    EXPECT_EQ(b->str("text"), a->str("text"));
    EXPECT_EQ(streamed_texts(many, id), streamed_texts(one, id));
}

// A greedy generate with stop strings (the harness's generate has none).
void generate_with_stop(harness& h, uint64_t id, const std::string& prompt, uint32_t max_tokens,
                        const std::string& stop) {
    msgpack::sbuffer b;
    msgpack::packer<msgpack::sbuffer> pk(b);
    pk.pack_map(7);
    pk.pack("id"), pk.pack(id), pk.pack("op"), pk.pack("generate");
    pk.pack("prompt"), pk.pack(prompt), pk.pack("max_tokens"), pk.pack(max_tokens);
    pk.pack("temperature"), pk.pack(0), pk.pack("stream"), pk.pack(true);
    pk.pack("stop"), pk.pack(std::vector<std::string>{stop});
    h.request(1, id, "generate", std::move(b));
}

// A streamed generate with sampling parameters (the harness's generate has temperature and
// seed only).
void generate_sampled(harness& h, uint64_t id, const std::string& prompt, uint32_t max_tokens,
                      double temperature, uint64_t seed, int32_t top_k, double top_p,
                      double repeat_penalty) {
    msgpack::sbuffer b;
    msgpack::packer<msgpack::sbuffer> pk(b);
    pk.pack_map(10);
    pk.pack("id"), pk.pack(id), pk.pack("op"), pk.pack("generate");
    pk.pack("prompt"), pk.pack(prompt), pk.pack("max_tokens"), pk.pack(max_tokens);
    pk.pack("temperature"), pk.pack(temperature), pk.pack("seed"), pk.pack(seed);
    pk.pack("top_k"), pk.pack(top_k), pk.pack("top_p"), pk.pack(top_p);
    pk.pack("repeat_penalty"), pk.pack(repeat_penalty), pk.pack("stream"), pk.pack(true);
    h.request(1, id, "generate", std::move(b));
}

TEST(scheduler_decode_steps, greedy_tokens_and_events_equal_one_iteration_a_step) {
    const uint32_t lens[] = {5, 9, 12, 16};
    harness one;
    harness many(with_decode_steps(4));
    for (uint64_t i = 0; i < 4; i++) {
        one.generate(1, i + 1, prompts[i], lens[i]);
        many.generate(1, i + 1, prompts[i], lens[i]);
    }
    uint64_t steps_one = 0, steps_many = 0, ahead = 0;
    one.run([&](const gpu::step& s) {
        steps_one++;
        EXPECT_EQ(s.decode_steps, 1u);
    });
    many.run([&](const gpu::step& s) {
        steps_many++;
        ahead += s.decode_steps - 1;
        EXPECT_LE(s.decode_steps * s.seqs.size(), 16u) << "the rows fit the device's rows_max";
    });
    for (uint64_t i = 0; i < 4; i++) {
        const event* a = one.terminal(1, i + 1);
        const event* b = many.terminal(1, i + 1);
        ASSERT_NE(a, nullptr);
        ASSERT_NE(b, nullptr);
        EXPECT_EQ(b->str("event"), "done");
        EXPECT_EQ(b->tokens(), reference_greedy(prompts[i], lens[i])) << i;
        EXPECT_EQ(b->tokens(), a->tokens()) << i;
        EXPECT_EQ(b->str("text"), a->str("text")) << i;
        EXPECT_EQ(streamed_texts(many, i + 1), streamed_texts(one, i + 1)) << i;
    }
    EXPECT_GT(ahead, 0u);
    EXPECT_EQ(steps_many + ahead, steps_one) << "each iteration run ahead is a step saved";
    EXPECT_EQ(many.core->counters().decode_iterations_ahead, ahead);
    EXPECT_EQ(one.core->counters().decode_iterations_ahead, 0u);
    EXPECT_EQ(many.core->counters().tokens_generated, one.core->counters().tokens_generated);
    many.expect_idle();
}

TEST(scheduler_decode_steps, no_iteration_runs_past_max_tokens) {
    harness h(with_decode_steps(4));
    h.generate(1, 1, prompts[0], 6);
    std::vector<uint32_t> ks;
    h.run([&](const gpu::step& s) { ks.push_back(s.decode_steps); });
    // The prompt's step draws token 1, four iterations tokens 2-5, one more token 6.
    EXPECT_EQ(ks, (std::vector<uint32_t>{1, 4, 1}));
    ASSERT_NE(h.terminal(1, 1), nullptr);
    EXPECT_EQ(h.terminal(1, 1)->tokens(), reference_greedy(prompts[0], 6));
    h.expect_idle();
}

// Sampled requests (no penalty) batched with a greedy one, the rows with and without their
// summaries: the gpu actor's draws between iterations (gpu::step_draws, a copy of each
// request's sampler) give every request the tokens, texts and streamed events of one iteration a
// step, with the same summaries setting (a sampler draws differently with and without them).
// With summaries, a plain-temperature draw the summary alone cannot settle ends its step early.
TEST(scheduler_decode_steps, sampled_tokens_and_events_equal_one_iteration_a_step) {
    struct request {
        uint64_t id;
        uint32_t max_tokens;
        double temperature;
        int32_t top_k;
        double top_p;
    };
    const request requests[] = {
        {1, 14, 0.8, 0, 1.0}, {2, 11, 1.0, 40, 1.0}, {3, 16, 0.0, 0, 1.0}, {4, 13, 1.5, 0, 0.9}};
    for (bool summaries : {false, true}) {
        SCOPED_TRACE(summaries ? "summaries" : "rows");
        harness one;
        harness many(with_decode_steps(4));
        one.summarize_rows = many.summarize_rows = summaries;
        for (const request& q : requests) {
            for (harness* h : {&one, &many}) {
                generate_sampled(*h, q.id, prompts[q.id], q.max_tokens, q.temperature, q.id + 10,
                                 q.top_k, q.top_p, 1.0);
            }
        }
        one.run([&](const gpu::step& s) { EXPECT_EQ(s.decode_steps, 1u); });
        uint64_t ahead = 0, steps_many = 0;
        many.run([&](const gpu::step& s) {
            steps_many++;
            ahead += s.decode_steps - 1;
        });
        for (const request& q : requests) expect_same_output(one, many, q.id);
        const auto& c = many.core->counters();
        EXPECT_GT(c.decode_iterations_ahead, 0u);
        EXPECT_LE(c.decode_iterations_ahead, ahead) << "no more ran than were planned";
        EXPECT_EQ(c.tokens_generated, one.core->counters().tokens_generated);
        if (summaries) {
            // The plain-temperature requests draw past the candidates now and then: those
            // steps end early, and only the iterations that ran are counted.
            EXPECT_GT(c.decode_steps_ended_early, 0u);
            EXPECT_LT(c.decode_iterations_ahead, ahead);
            EXPECT_GT(c.candidate_draws, 0u);
        } else {
            EXPECT_EQ(c.decode_steps_ended_early, 0u) << "a whole row settles every draw";
            EXPECT_EQ(c.decode_iterations_ahead, ahead);
        }
        many.expect_idle();
    }
}

// A penalty draws from the request's history, which a copy of its sampler does not have: such
// a request never runs ahead, alone or beside requests that could, and keeps its output.
TEST(scheduler_decode_steps, a_request_with_a_penalty_runs_one_iteration_a_step) {
    harness h(with_decode_steps(4));
    generate_sampled(h, 1, prompts[1], 12, 0.8, 1, 0, 1.0, 1.3);
    h.generate(1, 2, prompts[2], 12);
    h.run([&](const gpu::step& s) { EXPECT_EQ(s.decode_steps, 1u); });
    harness alone;
    generate_sampled(alone, 1, prompts[1], 12, 0.8, 1, 0, 1.0, 1.3);
    alone.run();
    ASSERT_NE(h.terminal(1, 1), nullptr);
    EXPECT_EQ(h.terminal(1, 1)->tokens(), alone.terminal(1, 1)->tokens());
    EXPECT_EQ(h.terminal(1, 2)->tokens(), reference_greedy(prompts[2], 12));
    EXPECT_EQ(h.core->counters().decode_iterations_ahead, 0u);
    // Once the penalised request has ended, the greedy one runs ahead alone.
    harness g(with_decode_steps(4));
    generate_sampled(g, 1, prompts[1], 3, 0.8, 1, 0, 1.0, 1.3);
    g.generate(1, 2, prompts[2], 14);
    g.run();
    EXPECT_GT(g.core->counters().decode_iterations_ahead, 0u);
    EXPECT_EQ(g.terminal(1, 2)->tokens(), reference_greedy(prompts[2], 14));
}

// A step of several iterations keeps the earlier iterations' summaries alone where steps come
// with them, so the rows it may bring back are the device's decode_rows_max, not rows_max: with
// rows summarized and room for four iterations' summaries, a step of as many sequences as
// rows_max runs four iterations; with room for one, it runs one. Either way every request keeps
// the tokens and streamed events of one iteration a step.
TEST(scheduler_decode_steps, summaries_let_a_step_of_rows_max_sequences_run_its_iterations) {
    struct request {
        uint64_t id;
        uint32_t max_tokens;
        double temperature;
        int32_t top_k;
    };
    const request requests[] = {
        {1, 12, 1.0, 40}, {2, 13, 0.0, 0}, {3, 14, 0.7, 40}, {4, 15, 0.0, 0}};
    for (uint32_t decode_rows_max : {4u, 16u}) {
        SCOPED_TRACE("decode_rows_max " + std::to_string(decode_rows_max));
        harness one;
        harness many(with_decode_steps(4));
        one.device_rows(4, 4);
        many.device_rows(4, decode_rows_max);
        one.summarize_rows = many.summarize_rows = true;
        for (const request& q : requests) {
            for (harness* h : {&one, &many}) {
                generate_sampled(*h, q.id, prompts[q.id], q.max_tokens, q.temperature, q.id + 20,
                                 q.top_k, 1.0, 1.0);
            }
        }
        one.run();
        uint32_t k_of_four = 0;  // the most iterations a step of four sequences ran
        many.run([&](const gpu::step& s) {
            EXPECT_LE(s.decode_steps * s.seqs.size(), decode_rows_max);
            if (s.seqs.size() == 4) k_of_four = std::max(k_of_four, s.decode_steps);
        });
        EXPECT_EQ(k_of_four, decode_rows_max / 4);
        for (const request& q : requests) expect_same_output(one, many, q.id);
        EXPECT_EQ(many.core->counters().decode_steps_ended_early, 0u) << "top-k 40 is settled";
        many.expect_idle();
    }
}

// A request queued while every sequence is busy cannot start before one ends, so the running
// ones still run ahead: a step ends where a request reaches its max_tokens, so the queued one
// starts at the same iteration as with one iteration a step (in fewer steps), and every request
// keeps the reference output. A step never runs ahead while a queued request has a free
// sequence.
TEST(scheduler_decode_steps,
     a_request_waiting_for_a_busy_sequence_lets_the_running_ones_run_ahead) {
    const uint32_t max_sequences = 2;
    const uint32_t lens[] = {9, 14, 10};
    uint64_t started_at[2][3] = {};  // [k = 1, 4][request]: the iteration its prompt ran in
    uint64_t steps_before[2] = {};   // the steps before request 3's prompt
    for (uint32_t k : {1u, 4u}) {
        SCOPED_TRACE("decode_steps " + std::to_string(k));
        core_options o = with_decode_steps(k);
        o.max_sequences = max_sequences;
        harness h(o);
        for (uint64_t i = 0; i < 3; i++) h.generate(1, i + 1, prompts[i], lens[i]);
        uint64_t ahead_while_queued = 0, iterations = 0, steps = 0;
        uint64_t* started = started_at[k > 1];
        h.run([&](const gpu::step& s) {
            for (const auto& q : s.seqs) {
                if (q.pos0 == 0 && started[q.seq_id - 1] == 0) {
                    started[q.seq_id - 1] = iterations + 1;
                    if (q.seq_id == 3) steps_before[k > 1] = steps;
                }
            }
            iterations += s.decode_steps;
            steps++;
            if (s.decode_steps > 1) {
                EXPECT_TRUE(h.core->queued_requests() == 0 ||
                            h.core->active_sequences() == max_sequences)
                    << "a step ran ahead while a queued request had a free sequence";
                if (h.core->queued_requests() > 0) ahead_while_queued++;
            }
        });
        if (k > 1) {
            EXPECT_GT(ahead_while_queued, 0u);
        }
        for (uint64_t i = 0; i < 3; i++) {
            ASSERT_NE(h.terminal(1, i + 1), nullptr);
            EXPECT_EQ(h.terminal(1, i + 1)->tokens(), reference_greedy(prompts[i], lens[i])) << i;
        }
        EXPECT_TRUE(h.ends_asked.empty()) << "no sequence was free for the queued request";
        h.expect_idle();
    }
    // Request 3 starts right after request 1's 9 tokens (the prompt's step and 8 decode
    // iterations) either way.
    EXPECT_EQ(started_at[0][2], 10u);
    EXPECT_EQ(started_at[1][2], started_at[0][2]);
    EXPECT_LT(steps_before[1], steps_before[0]);
}

// A request that arrives while a step of several iterations runs, with a sequence free for it,
// has the scheduler ask the device to end that step after the iteration running
// (gpu::end_decode_steps, once): it then waits one iteration, not the step's eight, and both
// requests keep the reference output. Without a free sequence there is nothing to gain: no end
// is asked.
TEST(scheduler_decode_steps, a_request_that_can_be_admitted_ends_a_step_early) {
    for (uint32_t max_sequences : {4u, 1u}) {
        SCOPED_TRACE("max_sequences " + std::to_string(max_sequences));
        core_options o = with_decode_steps(8);
        o.max_sequences = max_sequences;
        harness h(o);
        h.generate(1, 1, prompts[0], 40);
        uint64_t arrived_during = 0, next_after = 0;
        std::vector<uint32_t> second_step_seqs;
        h.run([&](const gpu::step& s) {
            if (arrived_during != 0 && next_after == 0) {
                next_after = s.step_id;
                for (const auto& q : s.seqs) second_step_seqs.push_back(uint32_t(q.tokens.size()));
            }
            if (s.decode_steps > 1 && arrived_during == 0) {
                arrived_during = s.step_id;
                h.generate(1, 2, prompts[3], 10);
            }
        });
        ASSERT_NE(arrived_during, 0u);
        const auto& c = h.core->counters();
        if (max_sequences > 1) {
            EXPECT_EQ(h.ends_asked, std::vector<uint64_t>{arrived_during});
            EXPECT_EQ(c.decode_steps_ends_asked, 1u);
            EXPECT_GE(c.decode_steps_ended_early, 1u);
            // The next step takes the new request's prompt beside the running sequence.
            EXPECT_EQ(second_step_seqs.size(), 2u);
        } else {
            EXPECT_TRUE(h.ends_asked.empty()) << "no sequence is free: ending the step gains none";
            EXPECT_EQ(c.decode_steps_ends_asked, 0u);
        }
        EXPECT_EQ(h.terminal(1, 1)->tokens(), reference_greedy(prompts[0], 40));
        EXPECT_EQ(h.terminal(1, 2)->tokens(), reference_greedy(prompts[3], 10));
        h.expect_idle();
    }
}

// prompts[0]'s greedy free run of 8 tokens and a tokenizer whose end of turn is its token `at`,
// one a step of four iterations after the prompt's draws before its last (tokens 2-4 of 5);
// no tokenizer when the free run has no such token.
struct early_end {
    std::vector<int32_t> free_run;
    size_t at = 0;
    std::optional<model::tokenizer> tok;
};
early_end early_end_of_generation() {
    early_end e;
    e.free_run = reference_greedy(prompts[0], 8);
    EXPECT_EQ(e.free_run.size(), 8u);
    e.at = first_new_token(e.free_run, 1);
    EXPECT_LE(e.at, 3u) << "the free run has no new token early enough";
    if (e.free_run.size() == 8 && e.at <= 3) e.tok.emplace(tokenizer_with_eot(e.free_run[e.at]));
    return e;
}

TEST(scheduler_decode_steps, end_of_generation_inside_a_step_ends_there) {
    const early_end end = early_end_of_generation();
    ASSERT_TRUE(end.tok);
    const std::vector<int32_t>& free_run = end.free_run;
    const size_t k = end.at;
    harness h(with_decode_steps(4), 256, 8, 0, &*end.tok);
    h.generate(1, 1, prompts[0], 8);
    std::vector<uint32_t> ks;
    h.run([&](const gpu::step& s) { ks.push_back(s.decode_steps); });
    EXPECT_EQ(ks, (std::vector<uint32_t>{1, 4}));
    const auto* t = h.terminal(1, 1);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->str("reason"), "stop");
    EXPECT_EQ(t->tokens(), std::vector<int32_t>(free_run.begin(), free_run.begin() + long(k) + 1));
    h.expect_idle();
}

// A request queued behind the only sequence, whose request draws its end of generation inside
// a step of several iterations: the step ends at that iteration (gpu::step::end_tokens, sent only
// while a request is queued), so the queued request starts at the same iteration as with one
// iteration a step, and both outputs are those of one iteration a step.
TEST(scheduler_decode_steps, an_end_of_generation_ends_the_step_for_a_queued_request) {
    const early_end end = early_end_of_generation();
    ASSERT_TRUE(end.tok);
    const std::vector<int32_t>& free_run = end.free_run;
    const size_t e = end.at;
    uint64_t started[2] = {};  // [k = 1, 4]: the iteration request 2's prompt ran in
    std::vector<int32_t> outputs[2][2];
    for (uint32_t k : {1u, 4u}) {
        SCOPED_TRACE("decode_steps " + std::to_string(k));
        core_options o = with_decode_steps(k);
        o.max_sequences = 1;
        harness h(o, 256, 8, 0, &*end.tok);
        h.generate(1, 1, prompts[0], 8);
        h.generate(1, 2, prompts[3], 6);
        uint64_t steps = 0;
        h.run([&](const gpu::step& s) {
            const auto& c = h.core->counters();
            for (const auto& q : s.seqs) {
                if (q.seq_id == 2 && q.pos0 == 0 && started[k > 1] == 0) {
                    started[k > 1] = steps + c.decode_iterations_ahead + 1;
                }
            }
            steps++;
            if (s.decode_steps > 1) {
                EXPECT_EQ(s.end_tokens.empty(), h.core->queued_requests() == 0)
                    << "end tokens go with a step exactly while a request is queued";
            }
        });
        for (uint64_t id : {1u, 2u}) {
            ASSERT_NE(h.terminal(1, id), nullptr);
            outputs[k > 1][id - 1] = h.terminal(1, id)->tokens();
        }
        EXPECT_EQ(h.terminal(1, 1)->str("reason"), "stop");
        EXPECT_EQ(outputs[k > 1][0],
                  std::vector<int32_t>(free_run.begin(), free_run.begin() + long(e) + 1));
        if (k > 1) {
            EXPECT_GE(h.core->counters().decode_steps_ended_early, 1u);
        }
        h.expect_idle();
    }
    EXPECT_EQ(started[0], e + 2) << "request 1's e + 1 tokens ran first";
    EXPECT_EQ(started[1], started[0]);
    EXPECT_EQ(outputs[1][1], outputs[0][1]);
}

TEST(scheduler_decode_steps, a_stop_string_inside_a_step_ends_there) {
    // The stop string: the text of the free run's fourth token (drawn by a step's iteration).
    harness free;
    free.generate(1, 1, prompts[3], 12);
    free.run();
    const std::vector<std::string> texts = streamed_texts(free, 1);
    ASSERT_GE(texts.size(), 4u);
    std::string stop = texts[3];
    ASSERT_FALSE(stop.empty());
    harness one, many(with_decode_steps(4));
    generate_with_stop(one, 1, prompts[3], 12, stop);
    generate_with_stop(many, 1, prompts[3], 12, stop);
    one.run();
    uint64_t ahead = 0;
    many.run([&](const gpu::step& s) { ahead += s.decode_steps - 1; });
    EXPECT_GT(ahead, 0u);
    const event* a = one.terminal(1, 1);
    const event* b = many.terminal(1, 1);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(a->str("reason"), "stop");
    EXPECT_EQ(b->str("reason"), "stop");
    EXPECT_LT(b->tokens().size(), 12u);
    EXPECT_EQ(b->tokens(), a->tokens());
    EXPECT_EQ(b->str("text"), a->str("text"));
    EXPECT_EQ(streamed_texts(many, 1), streamed_texts(one, 1));
    many.expect_idle();
}

TEST(scheduler_decode_steps, a_cancel_during_a_step_is_applied_at_its_first_iteration) {
    harness h(with_decode_steps(4));
    h.generate(1, 1, prompts[0], 40);
    size_t tokens_before = 0;
    bool cancelled = false;
    h.run([&](const gpu::step& s) {
        if (s.decode_steps > 1 && !cancelled) {
            cancelled = true;
            tokens_before = streamed_texts(h, 1).size();
            h.cancel(1, 9, 1);
        }
    });
    ASSERT_TRUE(cancelled);
    EXPECT_EQ(h.ends_asked.size(), 1u) << "the cancel ends the step early";
    const event* t = h.terminal(1, 1);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->str("reason"), "cancelled");
    EXPECT_EQ(streamed_texts(h, 1).size(), tokens_before) << "no token of the cancelled step";
    const std::vector<int32_t> want = reference_greedy(prompts[0], 40);
    EXPECT_EQ(t->tokens(), std::vector<int32_t>(want.begin(), want.begin() + long(tokens_before)));
    h.expect_idle();
}

TEST(scheduler_decode_steps, a_failed_step_of_several_iterations_is_retried) {
    harness h(with_decode_steps(4));
    h.generate(1, 1, prompts[0], 14);
    h.generate(1, 2, prompts[2], 14);
    int failed = 0;
    h.run({}, [&](const gpu::step& s) -> std::optional<gpu::step_failed> {
        if (s.decode_steps > 1 && failed == 0) {
            failed++;
            return gpu::step_failed{0, gpu::gpu_failure::device_error, "injected", "decode", false};
        }
        return std::nullopt;
    });
    EXPECT_EQ(failed, 1);
    EXPECT_EQ(h.terminal(1, 1)->tokens(), reference_greedy(prompts[0], 14));
    EXPECT_EQ(h.terminal(1, 2)->tokens(), reference_greedy(prompts[2], 14));
    h.expect_idle();
}

TEST(scheduler_decode_steps, a_draw_the_sampler_disagrees_with_ends_that_request_alone) {
    harness h(with_decode_steps(4));
    h.generate(1, 1, prompts[0], 12);
    h.generate(1, 2, prompts[3], 12);
    const auto n_vocab = int32_t(shared_model().tok->vocab().size());
    uint64_t target = 0;
    h.tamper_draw = [&](uint64_t seq, uint32_t iteration, int32_t t) {
        return seq == target && iteration == 1 ? (t + 1) % n_vocab : t;
    };
    h.run([&](const gpu::step& s) {
        if (s.decode_steps > 1 && target == 0) target = s.seqs[0].seq_id;
    });
    ASSERT_NE(target, 0u);
    int internal = 0, right = 0;
    for (uint64_t id : {1, 2}) {
        const event* t = h.terminal(1, id);
        ASSERT_NE(t, nullptr);
        if (t->str("event") == "error") {
            internal++;
            EXPECT_EQ(t->str("code"), "internal");
            EXPECT_NE(t->str("message").find("decode iteration 2 ran token"), std::string::npos)
                << t->str("message");
        } else {
            right++;
            EXPECT_EQ(t->tokens(), reference_greedy(prompts[id == 1 ? 0 : 3], 12));
        }
    }
    EXPECT_EQ(internal, 1);
    EXPECT_EQ(right, 1);
    h.expect_idle();
}

}  // namespace
