// scheduler_core_test.cpp: the scheduler's decisions, driven message by message, with every step
// executed by the CPU reference forward pass (model/reference.hpp) on a generated model — real
// logits, no stand-ins.
//
// Checks: a batch of concurrent requests with different prompts and seeds each produce exactly
// what they produce alone (and greedy output equals the reference generator's); every request
// gets exactly one terminal event; cancel while a request's step is in flight applies the
// step's outcome first and then ends it `cancelled` (F2); a disconnect ends requests silently
// and frees every block; a failing batch is bisected so a poison request ends with
// error{gpu_failed} while the others complete with fault-free output (F4); device loss makes
// every sequence recompute from token 0 with identical output (F1); KV exhaustion preempts and
// recomputes without corruption; a shared prompt prefix is served from the prefix cache with
// identical output; context_exceeded and overloaded are immediate; a sampled token of the
// vocab's end-of-generation set other than eos (an eot id) ends a request. Invariants are checked
// after every message. (KV persistence: scheduler_kv_test.cpp; the harness:
// scheduler_harness.hpp.)
//
// Speculative decoding (scheduler_speculate.cpp), prompt lookup drafting from prompts that repeat
// themselves and from the random model's repetitive output: every request's tokens equal plain
// decoding's at temperatures 0 and 0.8 (several seeds), alone and batched, with verifications
// that accepted drafts and ones that rejected them; the KV of rejected drafts is never
// committed (invariants, the pool emulation, and the outputs); a request's `speculative: false`
// opts out; drafts keep to max_tokens, the context and the step's token budget; draft faults:
// draft_fail falls back (counted drafter_error), draft_garbage and draft_eos change no output;
// fallback_rounds verifications without an accepted draft fall back (counted no_acceptance);
// arming a draft fault with speculation off is refused. With a draft model (the core's side of
// the draft actor, answered by an oracle that knows the plain outputs): a round comes before
// the step that verifies it, each sequence's tokens are sent once, the output is plain
// decoding's with right and wrong drafts; a failed or unanswered round falls back
// (drafter_error) and its late answer is ignored; a draft model not ready, past its context or
// that forgot a sequence costs only drafts.
//
// Embeddings (scheduler_embed.cpp), the harness returning each sequence's hidden row as the
// reference's final hidden states: for mean, last and cls pooling an input chunked across
// steps, alone and batched with generation (whose outputs stay those of running alone), equals
// model::embed (1e-5); a failed step and a device loss recompute it from token 0 with the same
// vector (the accumulator is not counted twice); a shared prefix is never taken from the
// cache; cancel ends it done{reason cancelled}; an empty or too long input is refused.

#include "tests/scheduler/scheduler_harness.hpp"

using namespace ordo;
using namespace ordo::sched;
using namespace ordo::sched::core_test;
using ordo::gpu::gpu_failure;

namespace {

// End of generation is the vocab's whole EOG set, not only eos: the model's vocabulary with a
// greedily sampled id named as its end-of-turn token (tokenizer.ggml.eot_token_id) ends the
// same request right there, with reason stop and that token last.
TEST(scheduler_core, stops_on_an_end_of_generation_token_other_than_eos) {
    harness plain;
    plain.generate(1, 1, prompts[0], 8);
    plain.run();
    const std::vector<int32_t> free_run = plain.terminal(1, 1)->tokens();
    ASSERT_EQ(free_run.size(), 8u);
    const size_t k = first_new_token(free_run, 2);
    ASSERT_LT(k, free_run.size());
    const int32_t stop = free_run[k];
    ASSERT_NE(stop, shared_model().tok->vocab().eos());
    model::tokenizer eot_tok = tokenizer_with_eot(stop);
    ASSERT_TRUE(eot_tok.vocab().is_eog(stop));

    harness h({}, 256, 8, 0, &eot_tok);
    h.generate(1, 1, prompts[0], 8);
    h.run();
    const auto* t = h.terminal(1, 1);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->str("event"), "done");
    EXPECT_EQ(t->str("reason"), "stop");
    EXPECT_EQ(t->tokens(), std::vector<int32_t>(free_run.begin(), free_run.begin() + long(k) + 1));
}

TEST(scheduler_core, greedy_matches_reference_generator) {
    harness h;
    h.generate(1, 1, prompts[0], 20);
    h.run();
    const event* t = h.terminal(1, 1);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->str("event"), "done");
    EXPECT_EQ(t->tokens(), reference_greedy(prompts[0], 20));
    // Streamed texts concatenate to done.text.
    std::string streamed;
    for (const auto& e : h.events_of(1, 1)) {
        if (e.str("event") == "token") streamed += e.str("text");
    }
    EXPECT_EQ(streamed, t->str("text"));
    h.expect_idle();
}

TEST(scheduler_core, batched_requests_equal_running_alone) {
    auto alone = alone_outputs(12);
    core_options o;
    o.max_batch_tokens = 24;  // forces chunked prefill next to decodes
    harness h(o);
    for (size_t i = 0; i < prompts.size(); i++) h.generate(1, i + 1, prompts[i], 12, 0.8, i);
    h.run();
    for (size_t i = 0; i < prompts.size(); i++) {
        const event* t = h.terminal(1, i + 1);
        ASSERT_NE(t, nullptr) << i;
        EXPECT_EQ(t->tokens(), alone[i]) << "prompt " << i;
    }
    h.expect_idle();
}

TEST(scheduler_core, cancel_during_step_applies_outcome_then_cancels) {
    harness h;
    h.generate(1, 1, prompts[3], 50);
    h.generate(1, 2, prompts[0], 5);
    int steps = 0;
    h.run([&](const gpu::step&) {
        if (++steps == 3) h.cancel(1, 9, 1);  // request 1 is inside this step
    });
    const event* t = h.terminal(1, 1);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->str("reason"), "cancelled");
    // The step that was running when the cancel arrived still produced... nothing new for a
    // cancelled request, but its KV was committed: the blocks were published, not leaked.
    const event* c = h.terminal(1, 9);
    ASSERT_NE(c, nullptr);
    EXPECT_TRUE(c->fields.at("cancelled").as<bool>());
    ASSERT_NE(h.terminal(1, 2), nullptr);
    EXPECT_EQ(h.terminal(1, 2)->tokens(), reference_greedy(prompts[0], 5));
    // Cancelling a finished request answers cancelled=false.
    h.cancel(1, 10, 2);
    EXPECT_FALSE(h.terminal(1, 10)->fields.at("cancelled").as<bool>());
    h.expect_idle();
}

// A handler that failed on a request (the actor's on_failure) ends it with error{internal} at
// once. Inside a running step it stays, silent, until the step's outcome is applied, and its id
// is free at once: the client may reuse it and is served normally.
TEST(scheduler_core, an_aborted_request_ends_once_and_frees_its_id) {
    harness h;
    h.generate(1, 1, prompts[1], 20);
    bool aborted = false;
    h.run([&](const gpu::step&) {
        if (aborted) return;
        aborted = true;  // request 1 is inside this step
        std::vector<outgoing_event> out;
        h.core->abort_request(1, 1, "handler threw", out);
        h.apply(out);
        h.generate(1, 1, prompts[0], 5);  // the same id again
    });
    std::vector<event> first = h.events_of(1, 1);
    ASSERT_GE(first.size(), 2u);
    EXPECT_EQ(first[0].str("code"), "internal");
    const event& last = first.back();
    EXPECT_TRUE(last.terminal);
    EXPECT_EQ(last.str("reason"), "length");
    EXPECT_EQ(last.tokens(), reference_greedy(prompts[0], 5));
    int terminals = 0;
    for (const auto& e : first) terminals += e.terminal;
    EXPECT_EQ(terminals, 2) << "one error for the aborted request, one done for its successor";
    EXPECT_EQ(h.core->counters().handler_errors, 1u);
    h.expect_idle();
}

TEST(scheduler_core, disconnect_ends_requests_silently_and_frees_blocks) {
    harness h;
    h.generate(7, 1, prompts[3], 40);
    h.generate(7, 2, prompts[1], 40);
    h.generate(8, 1, prompts[0], 6);
    int steps = 0;
    h.run([&](const gpu::step&) {
        if (++steps == 2) {
            std::vector<outgoing_event> out;
            h.core->on_client_gone({7, "client closed"}, out);
            EXPECT_TRUE(out.empty());
        }
    });
    EXPECT_EQ(h.terminal(7, 1), nullptr);
    EXPECT_EQ(h.terminal(7, 2), nullptr);
    ASSERT_NE(h.terminal(8, 1), nullptr);
    EXPECT_EQ(h.core->counters().disconnects, 2u);
    h.expect_idle();
}

TEST(scheduler_core, poison_request_is_isolated_by_bisection) {
    auto alone = alone_outputs(8);
    harness h;
    for (size_t i = 0; i < 4; i++) h.generate(1, i + 1, prompts[i], 8, 0.8, i);
    uint64_t poison_seq = 3;  // the third request admitted
    h.run({}, [&](const gpu::step& s) -> std::optional<gpu::step_failed> {
        for (const auto& q : s.seqs) {
            if (q.seq_id == poison_seq) {
                return gpu::step_failed{0, gpu_failure::device_lost, "injected",
                                        "decode#1 layers 0-1", false};
            }
        }
        return std::nullopt;
    });
    for (size_t i = 0; i < 4; i++) {
        const event* t = h.terminal(1, i + 1);
        ASSERT_NE(t, nullptr) << i;
        if (i == 2) {
            EXPECT_EQ(t->str("event"), "error");
            EXPECT_EQ(t->str("code"), "gpu_failed");
        } else {
            EXPECT_EQ(t->tokens(), alone[i]) << i;
        }
    }
    h.expect_idle();
}

TEST(scheduler_core, device_loss_recomputes_with_identical_output) {
    auto alone = alone_outputs(10);
    harness h;
    for (size_t i = 0; i < 4; i++) h.generate(1, i + 1, prompts[i], 10, 0.8, i);
    int steps = 0;
    h.run({}, [&](const gpu::step&) -> std::optional<gpu::step_failed> {
        if (++steps == 5 || steps == 9) {
            return gpu::step_failed{0, gpu_failure::timeout, "injected", "decode#5 layers 0-1",
                                    true};
        }
        return std::nullopt;
    });
    for (size_t i = 0; i < 4; i++) {
        const event* t = h.terminal(1, i + 1);
        ASSERT_NE(t, nullptr);
        EXPECT_EQ(t->tokens(), alone[i]) << i;
    }
    EXPECT_EQ(h.core->counters().failures, 2u);
    h.expect_idle();
}

TEST(scheduler_core, kv_exhaustion_preempts_without_corruption) {
    auto alone = alone_outputs(24);
    core_options o;
    o.prefix_cache = false;
    harness h(o, /*kv_blocks=*/16);  // 128 tokens for 8 requests needing up to ~105 each
    for (size_t i = 0; i < prompts.size(); i++) h.generate(1, i + 1, prompts[i], 24, 0.8, i);
    h.run();
    for (size_t i = 0; i < prompts.size(); i++) {
        const event* t = h.terminal(1, i + 1);
        ASSERT_NE(t, nullptr);
        EXPECT_EQ(t->tokens(), alone[i]) << i;
    }
    EXPECT_GT(h.core->counters().preemptions, 0u);
    h.expect_idle();
}

TEST(scheduler_core, shared_prefix_is_served_from_the_cache) {
    std::string base = prompts[3] + " and then some more words to fill blocks";
    harness h;
    h.generate(1, 1, base, 6);
    h.run();
    h.generate(1, 2, base + " again", 6);
    h.run();
    const event* first = h.terminal(1, 1);
    const event* second = h.terminal(1, 2);
    ASSERT_NE(second, nullptr);
    auto usage = second->fields.at("usage").as<std::map<std::string, msgpack::object>>();
    EXPECT_GE(usage.at("cached_tokens").as<uint32_t>(), 8u);
    EXPECT_EQ(second->tokens(), reference_greedy(base + " again", 6));
    EXPECT_EQ(first->tokens(), reference_greedy(base, 6));
    h.expect_idle();
}

// A device that announces a shorter context than the configured one (llvmpipe's loop cap bounds
// attention) gets requests past it refused at once, with its number, and the rest served.
TEST(scheduler_core, the_device_context_bounds_requests) {
    harness h({}, 256, 8, 40);
    h.generate(1, 1, prompts[0], 60);  // fits the configured 256, not the device's 40
    const event* refused = h.terminal(1, 1);
    ASSERT_NE(refused, nullptr);
    EXPECT_EQ(refused->str("code"), "context_exceeded");
    EXPECT_NE(refused->str("message").find("context of 40"), std::string::npos)
        << refused->str("message");
    h.generate(1, 2, prompts[0], 4);
    h.run();
    EXPECT_EQ(h.terminal(1, 2)->str("event"), "done");
    h.expect_idle();
}

TEST(scheduler_core, context_exceeded_and_overloaded_are_immediate) {
    core_options o;
    o.max_queue = 2;
    harness h(o);
    h.generate(1, 1, prompts[0], 1000);
    EXPECT_EQ(h.terminal(1, 1)->str("code"), "context_exceeded");
    h.generate(1, 2, prompts[0], 4);
    h.generate(1, 3, prompts[0], 4);
    h.generate(1, 4, prompts[0], 4);
    EXPECT_EQ(h.terminal(1, 4)->str("code"), "overloaded");
    h.run();
    EXPECT_EQ(h.terminal(1, 2)->str("event"), "done");
    EXPECT_EQ(h.terminal(1, 3)->str("event"), "done");
    h.expect_idle();
}

// ---- speculative decoding ---------------------------------------------------------------------

const std::vector<std::string> repeating_prompts = {
    "the cat sat on the mat and the cat sat on the mat and the cat sat",
    "a b c d e f a b c d e f a b c", "one two three one two three one two",
    "hello world hello world hello world hello"};

core_options speculating(uint32_t draft_tokens_max = 8) {
    core_options o;
    o.speculative.mode = config::speculative_mode::ngram;
    o.speculative.draft_tokens_max = draft_tokens_max;
    o.speculative.ngram = {1, 3};
    return o;
}

// Each prompt of `all` alone with (temperature, seed): the plain outputs.
std::vector<std::vector<int32_t>> outputs_of(const std::vector<std::string>& all, uint32_t n,
                                             double temperature, uint64_t seed,
                                             core_options o = {}) {
    std::vector<std::vector<int32_t>> r;
    for (size_t i = 0; i < all.size(); i++) {
        harness h(o);
        h.generate(1, 1, all[i], n, temperature, seed + i);
        h.run();
        EXPECT_NE(h.terminal(1, 1), nullptr);
        r.push_back(h.terminal(1, 1) ? h.terminal(1, 1)->tokens() : std::vector<int32_t>{});
        h.expect_idle();
    }
    return r;
}

std::vector<std::string> speculation_prompts() {
    std::vector<std::string> all = repeating_prompts;
    all.insert(all.end(), prompts.begin(), prompts.end());
    return all;
}

TEST(scheduler_speculate, outputs_equal_plain_decoding_alone_and_batched) {
    const auto all = speculation_prompts();
    uint64_t rounds = 0, drafted = 0, accepted = 0;
    for (double temperature : {0.0, 0.8}) {
        for (uint64_t seed : {11u, 12u}) {
            const auto plain = outputs_of(all, 24, temperature, seed);
            const auto spec = outputs_of(all, 24, temperature, seed, speculating());
            for (size_t i = 0; i < all.size(); i++) {
                EXPECT_EQ(spec[i], plain[i]) << "alone, prompt " << i << " t " << temperature;
            }
            // Batched, under a small token budget (drafts compete with prefill chunks).
            core_options o = speculating();
            o.max_batch_tokens = 32;
            harness h(o);
            for (size_t i = 0; i < all.size(); i++) {
                h.generate(1, i + 1, all[i], 24, temperature, seed + i);
            }
            h.run([&](const gpu::step& s) {
                uint32_t tokens = 0;
                for (const auto& q : s.seqs) {
                    tokens += uint32_t(q.tokens.size());
                    EXPECT_LE(q.logits_rows, 1u + o.speculative.draft_tokens_max);
                }
                EXPECT_LE(tokens, o.max_batch_tokens);
            });
            for (size_t i = 0; i < all.size(); i++) {
                const event* t = h.terminal(1, i + 1);
                ASSERT_NE(t, nullptr) << i;
                EXPECT_EQ(t->tokens(), plain[i]) << "batched, prompt " << i << " t " << temperature;
            }
            h.expect_idle();
            const auto& k = h.core->counters();
            rounds += k.spec_rounds, drafted += k.spec_drafted, accepted += k.spec_accepted;
        }
    }
    // Both outcomes of a verification were exercised.
    EXPECT_GT(rounds, 0u);
    EXPECT_GT(accepted, 0u);
    EXPECT_LT(accepted, drafted);
}

TEST(scheduler_speculate, drafts_keep_to_max_tokens_context_and_opt_out) {
    // max_tokens 3: a verification never asks for more rows than tokens left to generate.
    harness h(speculating());
    h.generate(1, 1, repeating_prompts[1], 3);
    h.run([&](const gpu::step& s) {
        for (const auto& q : s.seqs) EXPECT_LE(q.logits_rows, 3u);
    });
    ASSERT_NE(h.terminal(1, 1), nullptr);
    EXPECT_EQ(h.terminal(1, 1)->tokens(), outputs_of({repeating_prompts[1]}, 3, 0, 0)[0]);
    // A context of 48 tokens, which the request fills: no step reaches past it.
    core_options o = speculating();
    o.n_ctx = 48;
    harness c(o);
    const auto n_prompt = uint32_t(shared_model().tok->encode(repeating_prompts[1], true).size());
    ASSERT_LT(n_prompt, 40u);
    c.generate(1, 1, repeating_prompts[1], 48 - n_prompt);
    c.run([&](const gpu::step& s) {
        for (const auto& q : s.seqs) EXPECT_LE(q.pos0 + q.tokens.size(), 48u);
    });
    ASSERT_NE(c.terminal(1, 1), nullptr);
    EXPECT_EQ(c.terminal(1, 1)->str("reason"), "length");
    // speculative: false: no step carries drafts for it.
    harness off(speculating());
    msgpack::sbuffer b;
    msgpack::packer<msgpack::sbuffer> pk(b);
    pk.pack_map(6);
    pk.pack("id"), pk.pack(1), pk.pack("op"), pk.pack("generate");
    pk.pack("prompt"), pk.pack(repeating_prompts[1]), pk.pack("max_tokens"), pk.pack(12);
    pk.pack("temperature"), pk.pack(0), pk.pack("speculative"), pk.pack(false);
    off.request(1, 1, "generate", std::move(b));
    off.run([&](const gpu::step& s) {
        for (const auto& q : s.seqs) EXPECT_LE(q.logits_rows, 1u);
    });
    ASSERT_NE(off.terminal(1, 1), nullptr);
    EXPECT_EQ(off.terminal(1, 1)->tokens(), outputs_of({repeating_prompts[1]}, 12, 0, 0)[0]);
    EXPECT_EQ(off.core->counters().spec_rounds, 0u);
}

TEST(scheduler_speculate, draft_faults_and_fallbacks_change_no_output) {
    const std::vector<std::string> one = {repeating_prompts[0]};
    const auto plain = outputs_of(one, 20, 0.8, 5)[0];
    auto run_with = [&](fault_kind kind, uint32_t rounds, core_options o) {
        harness h(o);
        fault_spec f;
        f.kind = kind;
        f.count = rounds;
        EXPECT_TRUE(h.core->arm_draft_fault(f).ok());
        h.generate(1, 1, one[0], 20, 0.8, 5);
        h.run();
        EXPECT_NE(h.terminal(1, 1), nullptr);
        if (h.terminal(1, 1) != nullptr) {
            EXPECT_EQ(h.terminal(1, 1)->tokens(), plain);
        }
        h.expect_idle();
        return h.core->counters();
    };
    auto k = run_with(fault_kind::draft_fail, 1, speculating());
    EXPECT_EQ(k.spec_fallbacks[size_t(spec_fallback::drafter_error)], 1u);
    EXPECT_EQ(k.spec_rounds, 0u);  // it failed at its first drafting: no verification after
    k = run_with(fault_kind::draft_garbage, 3, speculating());
    EXPECT_GE(k.spec_rounds, 3u);
    EXPECT_LT(k.spec_accepted, k.spec_drafted);
    k = run_with(fault_kind::draft_eos, 2, speculating());
    EXPECT_GE(k.spec_rounds, 2u);
    // Garbage every round and fallback_rounds 2: two verifications without an accepted draft
    // end speculation for the request.
    core_options o = speculating();
    o.speculative.fallback_rounds = 2;
    k = run_with(fault_kind::draft_garbage, 100, o);
    EXPECT_EQ(k.spec_fallbacks[size_t(spec_fallback::no_acceptance)], 1u);
    // With speculation off a draft fault is refused.
    harness h;
    fault_spec f;
    f.kind = fault_kind::draft_fail;
    EXPECT_FALSE(h.core->arm_draft_fault(f).ok());
}

// ---- speculation with a draft model (the core's side of the draft actor) ----

core_options drafting(uint32_t draft_tokens_max = 6) {
    core_options o = speculating(draft_tokens_max);
    o.speculative.mode = config::speculative_mode::draft;
    return o;
}

// A draft actor for the core's tests: it keeps each sequence's tokens as the rounds tell them
// (checking the `known` protocol: the tokens it was told are the sequence's own), and drafts
// from `answers` (each prompt's tokens followed by its plain output): an oracle, all of whose
// drafts the target keeps, unless `wrong_every` > 0 (every wrong_every-th draft is wrong).
struct oracle_drafter {
    std::vector<std::vector<int32_t>> answers;
    uint32_t wrong_every = 0;
    std::map<uint64_t, std::vector<int32_t>> told;
    uint64_t drafts = 0;

    draft::draft_reply operator()(const draft::draft_request& q) {
        draft::draft_reply r;
        r.round = q.round;
        for (const draft::draft_seq& s : q.seqs) {
            std::vector<int32_t>& t = told[s.seq_id];
            EXPECT_LE(s.known, t.size()) << "told less than the core believes";
            t.resize(std::min<size_t>(s.known, t.size()));
            t.insert(t.end(), s.tokens.begin(), s.tokens.end());
            draft::drafted d{s.seq_id, uint32_t(t.size()), {}};
            for (const auto& a : answers) {
                if (a.size() <= t.size() || !std::equal(t.begin(), t.end(), a.begin())) continue;
                for (size_t i = t.size(); i < a.size() && d.tokens.size() < s.max; i++) {
                    const bool wrong = wrong_every != 0 && ++drafts % wrong_every == 0;
                    d.tokens.push_back(wrong ? (a[i] + 1) % 500 : a[i]);
                }
                break;
            }
            r.seqs.push_back(std::move(d));
        }
        return r;
    }
};

// prompt tokens (with BOS, as the core encodes them) then `output`.
std::vector<int32_t> prompt_then(const std::string& prompt, const std::vector<int32_t>& output) {
    std::vector<int32_t> all = shared_model().tok->encode(prompt, true);
    all.insert(all.end(), output.begin(), output.end());
    return all;
}

// With a draft model the core asks for a round before the step that verifies it, sends each
// sequence's tokens once (the `known` protocol), keeps an oracle's drafts and rejects wrong
// ones at any temperature with the plain output, and lets every sequence it named be forgotten.
TEST(scheduler_speculate, draft_model_rounds_come_before_the_step_and_change_no_output) {
    const auto all = speculation_prompts();
    for (double temperature : {0.0, 0.8}) {
        const auto plain = outputs_of(all, 24, temperature, 21);
        for (uint32_t wrong_every : {0u, 3u}) {
            oracle_drafter d;
            d.wrong_every = wrong_every;
            for (size_t i = 0; i < all.size(); i++)
                d.answers.push_back(prompt_then(all[i], plain[i]));
            core_options o = drafting();
            o.max_batch_tokens = 32;
            harness h(o);
            h.core->on_drafter_state({true, "test"});
            h.drafter = std::ref(d);
            for (size_t i = 0; i < all.size(); i++)
                h.generate(1, i + 1, all[i], 24, temperature, 21 + i);
            h.run([&](const gpu::step& s) {
                // A drafting round is answered before the step that verifies it is planned.
                EXPECT_EQ(h.core->draft_round_in_flight(), 0u);
                for (const auto& q : s.seqs)
                    EXPECT_LE(q.logits_rows, 1u + o.speculative.draft_tokens_max);
            });
            for (size_t i = 0; i < all.size(); i++) {
                const event* t = h.terminal(1, i + 1);
                ASSERT_NE(t, nullptr) << i;
                EXPECT_EQ(t->tokens(), plain[i]) << "prompt " << i << " t " << temperature;
            }
            h.expect_idle();
            const auto& k = h.core->counters();
            EXPECT_GT(h.draft_rounds, 0u);
            EXPECT_EQ(k.spec_draft_rounds, h.draft_rounds);
            EXPECT_EQ(k.spec_draft_rounds_failed, 0u);
            EXPECT_GT(k.spec_accepted, 0u);
            if (wrong_every == 0) {
                EXPECT_EQ(k.spec_accepted, k.spec_drafted) << "an oracle's drafts are all kept";
            } else {
                EXPECT_LT(k.spec_accepted, k.spec_drafted);
            }
            // Every sequence a round named is forgotten by the end.
            std::set<uint64_t> forgotten(h.draft_forgets.begin(), h.draft_forgets.end());
            for (const auto& [seq, told] : d.told) EXPECT_EQ(forgotten.count(seq), 1u) << seq;
        }
    }
}

// A round that failed (its error) or went unanswered (the actor's bound) sends its sequences
// back to plain decoding, counted as drafter_error; a late answer is ignored.
TEST(scheduler_speculate, a_failed_or_unanswered_round_falls_back_and_changes_no_output) {
    const std::vector<std::string> two = {repeating_prompts[0], repeating_prompts[2]};
    const auto plain = outputs_of(two, 16, 0.8, 3);
    oracle_drafter oracle;
    for (size_t i = 0; i < two.size(); i++) oracle.answers.push_back(prompt_then(two[i], plain[i]));
    // The draft model's step failed: the round's error sends both back to plain decoding.
    {
        harness h(drafting());
        h.core->on_drafter_state({true, "test"});
        int rounds = 0;
        h.drafter = [&](const draft::draft_request& q) {
            if (++rounds == 2)
                return draft::draft_reply{q.round, {}, "draft step failed: gpu_device_lost"};
            return oracle(q);
        };
        for (size_t i = 0; i < two.size(); i++) h.generate(1, i + 1, two[i], 16, 0.8, 3 + i);
        h.run();
        for (size_t i = 0; i < two.size(); i++) {
            ASSERT_NE(h.terminal(1, i + 1), nullptr);
            EXPECT_EQ(h.terminal(1, i + 1)->tokens(), plain[i]) << i;
        }
        EXPECT_EQ(rounds, 2) << "no round after both fell back";
        EXPECT_EQ(h.core->counters().spec_fallbacks[size_t(spec_fallback::drafter_error)], 2u);
        auto notes = h.core->take_notes();
        EXPECT_TRUE(std::any_of(notes.begin(), notes.end(), [](const std::string& n) {
            return n.find("gpu_device_lost") != std::string::npos;
        }));
        h.expect_idle();
    }
    // A round unanswered past the actor's bound fails; its late answer changes nothing.
    {
        harness h(drafting());
        h.core->on_drafter_state({true, "test"});
        h.generate(1, 1, two[0], 16, 0.8, 3);
        h.run();  // prefill ran; the first round is left unanswered
        const uint64_t round = h.core->draft_round_in_flight();
        ASSERT_NE(round, 0u);
        EXPECT_FALSE(h.core->next_step().has_value()) << "no step while a round is out";
        h.core->draft_round_failed(round, "no drafts within speculative.draft_wait_ms = 100 ms");
        EXPECT_EQ(h.core->draft_round_in_flight(), 0u);
        draft::draft_request late_q{round, {{0, 0, {}, 4}}};
        h.core->on_draft_reply(oracle(late_q));  // stale: ignored
        h.drafter = std::ref(oracle);
        h.run();
        ASSERT_NE(h.terminal(1, 1), nullptr);
        EXPECT_EQ(h.terminal(1, 1)->tokens(), plain[0]);
        EXPECT_EQ(h.core->counters().spec_fallbacks[size_t(spec_fallback::drafter_error)], 1u);
        EXPECT_EQ(h.core->counters().spec_rounds, 0u);
        EXPECT_EQ(h.core->counters().spec_draft_rounds_failed, 1u);
        h.expect_idle();
    }
}

// Sequences decode plainly, without a fallback, while the draft model is not ready, past its
// context, or after it forgot them (they are sent whole again).
TEST(scheduler_speculate, a_draft_model_not_ready_or_forgetful_only_costs_drafts) {
    const std::vector<std::string> one = {repeating_prompts[1]};
    const auto plain = outputs_of(one, 20, 0.8, 8);
    oracle_drafter oracle;
    oracle.answers.push_back(prompt_then(one[0], plain[0]));
    // Not ready (its device still building, or being rebuilt): no rounds, plain steps.
    harness h(drafting());
    h.drafter = std::ref(oracle);
    h.generate(1, 1, one[0], 20, 0.8, 8);
    int steps = 0;
    h.run([&](const gpu::step&) {
        // Ready from the fourth step on; after the eighth its device is lost (everything the
        // draft actor held is gone) and rebuilt: rounds start again from token 0.
        if (++steps == 4) h.core->on_drafter_state({true, "test"});
        if (steps == 8) {
            h.core->on_drafter_state({false, "device lost"});
            oracle.told.clear();
        }
        if (steps == 9) h.core->on_drafter_state({true, "test"});
    });
    ASSERT_NE(h.terminal(1, 1), nullptr);
    EXPECT_EQ(h.terminal(1, 1)->tokens(), plain[0]);
    EXPECT_GT(h.draft_rounds, 1u);
    EXPECT_EQ(h.core->counters().spec_fallbacks[size_t(spec_fallback::drafter_error)], 0u);
    h.expect_idle();
    // Past the draft model's context (drafter_state.n_ctx) no round is asked for.
    harness short_draft(drafting());
    short_draft.core->on_drafter_state({true, "test", 8});
    short_draft.drafter = std::ref(oracle);
    short_draft.generate(1, 1, one[0], 20, 0.8, 8);
    short_draft.run();
    ASSERT_NE(short_draft.terminal(1, 1), nullptr);
    EXPECT_EQ(short_draft.terminal(1, 1)->tokens(), plain[0]);
    EXPECT_EQ(short_draft.draft_rounds, 0u);
    short_draft.expect_idle();
    // An answer that says the draft actor holds none of the sequence (known 0): the next round
    // sends it whole.
    harness f(drafting());
    f.core->on_drafter_state({true, "test"});
    oracle_drafter o2;
    o2.answers = oracle.answers;
    int calls = 0;
    f.drafter = [&](const draft::draft_request& q) {
        if (++calls == 3) {
            o2.told.clear();
            EXPECT_GT(q.seqs.at(0).known, 0u);
            return draft::draft_reply{q.round, {{q.seqs.at(0).seq_id, 0, {}}}, ""};
        }
        if (calls == 4) {
            EXPECT_EQ(q.seqs.at(0).known, 0u) << "sent whole after it was lost";
        }
        return o2(q);
    };
    f.generate(1, 1, one[0], 20, 0.8, 8);
    f.run();
    ASSERT_NE(f.terminal(1, 1), nullptr);
    EXPECT_EQ(f.terminal(1, 1)->tokens(), plain[0]);
    EXPECT_GE(calls, 4);
    f.expect_idle();
}

}  // namespace

// ---- embeddings ------------------------------------------------------------------------------

// The reference's embedding of `prompt` (tokenized with BOS, as the scheduler does).
std::vector<float> reference_embedding(const std::string& prompt, model::pooling p) {
    auto& m = shared_model();
    auto r = model::reference_model::create(*m.file, 256);
    EXPECT_TRUE(r.ok());
    std::vector<int32_t> ids = m.tok->encode(prompt, true);
    std::vector<uint32_t> u(ids.begin(), ids.end());
    auto e = model::embed(*r, u, p);
    EXPECT_TRUE(e.ok());
    return e.ok() ? *e : std::vector<float>{};
}

void expect_embedding(const event* t, const std::vector<float>& want, const std::string& what) {
    ASSERT_NE(t, nullptr) << what;
    ASSERT_EQ(t->str("event"), "done") << what << ": " << t->str("message");
    auto got = t->fields.at("embedding").as<std::vector<float>>();
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < want.size(); i++) EXPECT_NEAR(got[i], want[i], 1e-5) << what << " " << i;
}

TEST(scheduler_embed, every_pooling_chunked_and_batched_equals_the_reference) {
    auto alone = alone_outputs(8);
    for (model::pooling p : {model::pooling::mean, model::pooling::last, model::pooling::cls}) {
        core_options o;
        o.pooling = p;
        o.max_batch_tokens = 16;  // prompts[3] (~20 tokens) takes two chunks
        harness h(o);
        h.generate(1, 1, prompts[0], 8, 0.8, 0);
        h.embed(1, 2, prompts[3]);
        h.generate(1, 3, prompts[2], 8, 0.8, 2);
        h.embed(1, 4, prompts[1]);
        h.run();
        const std::string what = "pooling " + std::string(config::to_string(p));
        expect_embedding(h.terminal(1, 2), reference_embedding(prompts[3], p), what);
        expect_embedding(h.terminal(1, 4), reference_embedding(prompts[1], p), what);
        EXPECT_EQ(h.terminal(1, 2)->str("pooling"), config::to_string(p));
        EXPECT_EQ(h.terminal(1, 2)->fields.at("prompt_tokens").as<uint32_t>(),
                  shared_model().tok->encode(prompts[3], true).size());
        EXPECT_EQ(h.terminal(1, 1)->tokens(), alone[0]) << what;
        EXPECT_EQ(h.terminal(1, 3)->tokens(), alone[2]) << what;
        EXPECT_EQ(h.core->counters().embeddings, 2u);
        h.expect_idle();
    }
}

TEST(scheduler_embed, failed_steps_recompute_without_counting_twice) {
    const auto want = reference_embedding(prompts[3], model::pooling::mean);
    core_options o;
    o.max_batch_tokens = 8;  // three chunks
    harness h(o);
    h.embed(1, 1, prompts[3]);
    h.embed(1, 2, prompts[7]);
    int steps = 0;
    h.run({}, [&](const gpu::step&) -> std::optional<gpu::step_failed> {
        ++steps;
        if (steps == 2)
            return gpu::step_failed{0, gpu_failure::nan, "injected", "prefill#2", false};
        if (steps == 5) {
            return gpu::step_failed{0, gpu_failure::timeout, "injected", "prefill#5", true};
        }
        return std::nullopt;
    });
    expect_embedding(h.terminal(1, 1), want, "after failures");
    expect_embedding(h.terminal(1, 2), reference_embedding(prompts[7], model::pooling::mean),
                     "the other input");
    EXPECT_EQ(h.core->counters().failures, 2u);
    h.expect_idle();
}

TEST(scheduler_embed, a_cached_prefix_is_not_taken_and_ids_work_too) {
    harness h;
    h.generate(1, 1, prompts[3], 4);  // publishes the prompt's full blocks
    h.run();
    h.embed(1, 2, prompts[3]);
    h.run();
    expect_embedding(h.terminal(1, 2), reference_embedding(prompts[3], model::pooling::mean),
                     "after a cached prompt");
    std::vector<int32_t> ids = shared_model().tok->encode(prompts[0], true);
    h.embed(1, 3, "", ids);
    h.run();
    expect_embedding(h.terminal(1, 3), reference_embedding(prompts[0], model::pooling::mean),
                     "token ids");
    h.expect_idle();
}

TEST(scheduler_embed, cancel_and_refusals) {
    harness h;
    h.embed(1, 1, prompts[3]);
    h.cancel(1, 2, 1);
    const event* t = h.terminal(1, 1);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->str("event"), "done");
    EXPECT_EQ(t->str("reason"), "cancelled");
    EXPECT_EQ(t->fields.count("embedding"), 0u);
    h.embed(1, 3, "", {});  // an empty token array: the validator refuses it
    EXPECT_EQ(h.terminal(1, 3)->str("event"), "error");
    h.embed(1, 4, "", std::vector<int32_t>(300, 5));  // past the context of 256
    EXPECT_EQ(h.terminal(1, 4)->str("code"), "context_exceeded");
    h.run();
    h.expect_idle();
}
