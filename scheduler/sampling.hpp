// sampling.hpp: turning one sequence's logits into the next token (pure, actor-free).
//
// Owned by the scheduler actor: every generate request gets its own `sampler`, which holds the
// request's seeded generator and a reusable scratch buffer. There is no global state, so a
// request's tokens depend only on its logits, parameters, seed and call sequence — never on
// which other requests share its batch (docs/protocol.md "Sampling is deterministic").
//
// The pipeline of one `sample` call (docs/protocol.md, generate):
//   1. penalties over the last `repeat_last_n` tokens given (prompt and output), llama.cpp's
//      semantics: for each distinct id t there, occurring c times, first the repeat penalty (a
//      positive logit is divided by it, a negative one multiplied, so t always becomes less
//      likely), then OpenAI's additive ones: logit -= c x frequency_penalty + presence_penalty;
//   2. temperature 0: greedy argmax of the penalised logits, ties to the lowest id; done;
//   3. otherwise top_k, then top_p (nucleus, on the softmax of the penalised logits over the
//      top_k set), then min_p (relative to the most likely token), then temperature, then one
//      draw from the seeded generator over the surviving tokens.
// With an `allowed` mask (a grammar's, issue 31) the tokens it refuses are gone before step 2:
// greedy takes the best allowed token, and top_k, top_p and min_p see only allowed tokens, so
// the draw is from the model's distribution restricted to the grammar, renormalised. Masking
// comes after the logits, so the constraint changes neither them nor batch invariance.
// The filters are applied before temperature, as docs/protocol.md specifies (and llama.cpp's
// default chain does): temperature then only reshapes the kept tokens' probabilities.
//
// The summary (a GPU step's, gpu/vk/shaders/logits_summary.comp; summarize() on the CPU): a row's
// largest logit, its softmax normaliser at temperature 1 and at the request's temperature, and
// its summary_top best tokens. With one, a draw reads the vocabulary only where the summary
// does not settle it, so a 128k-vocabulary row costs microseconds instead of a millisecond:
//   - every token outside the summary comes after the candidates in (logit descending, id
//     ascending) order, so the candidates not in the penalty window and the window's tokens
//     (looked up in the row) above tau, the last candidate's logit, are the head of the
//     penalised row's order, known exactly;
//   - greedy is the first of that head when it is not empty;
//   - top_k within the known tokens, and min_p or top_p cut above tau, keep a set of known
//     tokens, drawn from in (logit descending, id ascending) order; top_p's mass without top_k
//     is the summary's normaliser with the window's terms exchanged for their penalised ones;
//   - plain temperature sampling walks the known tokens in that order, then (when the draw
//     falls past them: the tail's share of the mass) the rest of the row in id order, against
//     the summary's tempered normaliser (which the step computed for this temperature).
// Anything else (a mask, a known set that cannot decide, a window holding nearly all the mass)
// takes the whole-vocabulary path below. Which path runs, and so the token, depends only on the
// row, the parameters and the generator: sampling stays deterministic and batch invariant. The
// two paths walk their candidates in different orders, so one seed's tokens differ between a
// row given with a summary and without one: the server always has one (every logits row of a
// step does).
//
// Reported log-probabilities (the documented choice, per docs/protocol.md): `logprob` and
// `top_logprobs` are the log-softmax of the RAW logits, before penalty, filters and
// temperature (with a summary: its normaliser and candidates). That is "the probability under the
// model": it does not depend on sampling parameters, it is defined for temperature 0, and a client
// can compare it across requests.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <msgpack.hpp>
#include <optional>
#include <span>
#include <vector>

#include "actors/runtime/result.hpp"
#include "gpu/vk/shaders/abi.h"
#include "scheduler/prng.hpp"

namespace ordo::sched {

// Limits of the sampling parameters; the protocol documents the same ranges.
inline constexpr float temperature_max = 100.0f;     // beyond it sampling is uniform noise anyway
inline constexpr float repeat_penalty_max = 10.0f;   // larger values only destroy the logits
inline constexpr float additive_penalty_max = 2.0f;  // presence/frequency: OpenAI's [-2, 2]
inline constexpr uint32_t logprobs_max = 20;         // top-n alternatives reported per token
inline constexpr uint32_t repeat_last_n_max = 4096;  // bounds the per-call penalty work
// A params default only: the scheduler draws a fresh seed for a request that gives none.
inline constexpr uint64_t seed_default = 0;
// A vocabulary larger than this is refused: token ids are int32 and the scratch is per sampler.
inline constexpr uint32_t vocab_size_max = 1u << 22;

struct sampling_params {
    float temperature = 1.0f;        // 0 = greedy argmax; else logits are divided by it
    int32_t top_k = 0;               // 0 = off; else keep the k most likely tokens
    float top_p = 1.0f;              // (0, 1]: keep the smallest set with this much mass
    float min_p = 0.0f;              // [0, 1): drop tokens below min_p x the most likely
    float repeat_penalty = 1.0f;     // (0, 10]; 1 = off
    float presence_penalty = 0.0f;   // [-2, 2]; 0 = off; subtracted once per id present
    float frequency_penalty = 0.0f;  // [-2, 2]; 0 = off; subtracted once per occurrence
    uint32_t repeat_last_n = 64;     // how many of the most recent tokens are penalised
    uint64_t seed = seed_default;    // seeds this request's generator
    uint32_t logprobs = 0;           // 0..20: top alternatives to report per token
    MSGPACK_DEFINE_MAP(temperature, top_k, top_p, min_p, repeat_penalty, presence_penalty,
                       frequency_penalty, repeat_last_n, seed, logprobs);
};

// bad_request naming the offending parameter (by its protocol name) and its allowed range.
status validate(const sampling_params& p);

// Candidates in a summary (abi.h ORDO_SUMMARY_TOP): at least logprobs_max, so the reported
// alternatives are always among them.
inline constexpr uint32_t summary_top = gpu::abi::ORDO_SUMMARY_TOP;
static_assert(summary_top >= logprobs_max);

// A logits row's summary (see the top of this file). The candidates are the row's best
// min(summary_top, vocabulary) tokens, logit descending, the lower id first on ties.
struct logits_summary {
    float max = 0.0f;          // the largest logit
    float mass = 0.0f;         // sum of exp(l - max) over the row
    float mass_t = 0.0f;       // sum of exp((l - max) / temperature); 0: not computed
    float temperature = 0.0f;  // the temperature of mass_t
    uint32_t count = 0;
    std::array<int32_t, summary_top> ids{};
    std::array<float, summary_top> logits{};
};

// The summary of a row computed on the host (tests, benches): the same fields as the GPU's
// kernel, its sums in double.
logits_summary summarize(std::span<const float> logits, float temperature);

// The summary the logits_summary kernel wrote (abi.h ORDO_SUMMARY_WORDS words) of a row of
// n_vocab entries, for the temperature the step gave it. Errors (bad_summary): the kernel's
// flag that the row holds an inf or a NaN, a count other
// than min(summary_top, n_vocab), a candidate id outside the row or out of order, a maximum or
// normaliser that is not finite and positive.
result<logits_summary> read_summary(std::span<const uint32_t> words, uint32_t n_vocab,
                                    float temperature);
// The words read_summary reads back as `s` (the kernel's layout: tests and test doubles).
std::vector<uint32_t> summary_words(const logits_summary& s);

struct token_logprob {
    int32_t token = -1;
    float logprob = 0.0f;  // natural log, of the raw-logit softmax
};

struct sampled {
    int32_t token = -1;
    float logprob = 0.0f;  // of `token`, under the raw-logit softmax
    uint32_t top_count = 0;
    std::array<token_logprob, logprobs_max> top{};  // most likely first; ties to lowest id

    std::span<const token_logprob> top_logprobs() const { return {top.data(), top_count}; }
};

class sampler {
public:
    // The parameters must be valid (validate()); refused otherwise.
    static result<sampler> create(const sampling_params& p);

    // Samples the next token. `recent_tokens` is the sequence so far (prompt and output, oldest
    // first); only its last `repeat_last_n` entries are used. Errors, which leave the generator
    // untouched: empty or oversized logits, a NaN or infinite logit (code "bad_logits": the
    // step that produced them failed), a recent token outside the vocabulary ("bad_token").
    // `allowed` (empty: every token): allowed[t] != 0 where token t may be drawn; it has one
    // entry per logit and allows at least one (else "bad_mask", generator untouched).
    // `summary` (may be null): the row's summary (read_summary, summarize), which makes the
    // draw read only what it needs of `logits` (see the top of this file); its producer
    // checked the row's logits finite (the gpu actor fails a step with any that is not).
    result<sampled> sample(std::span<const float> logits, std::span<const int32_t> recent_tokens,
                           std::span<const uint8_t> allowed = {},
                           const logits_summary* summary = nullptr);

    // A draw checked token by token instead of over a mask (a grammar: `allows` is one
    // matcher check, a mask a walk of the vocabulary). Nothing when no token was taken: the
    // caller then computes the mask and calls sample.
    //   - Greedy: the best tokens in greedy's order are offered to `allows`, at most `tries` of
    //     them; the first it takes is the token greedy would pick over the mask. Draws nothing
    //     from the generator.
    //   - Otherwise: one draw of the whole pipeline (penalties, top_k, min_p, top_p, over every
    //     token), kept when `allows` takes it. With the caller's draw over the mask after a
    //     refusal, a token t of the allowed set A comes with probability p(t) + (1 - p(A)) *
    //     p(t) / p(A) = p(t) / p(A): exactly the masked distribution when no filter truncates;
    //     with top_k/min_p/top_p, the first draw's filters see the whole vocabulary. An allowed
    //     draw advances the generator as sample() does, so a grammar that allows the model's
    //     own choice leaves the output as without it.
    // `summary` (may be null) gives the reported log-probabilities, as for sample().
    result<std::optional<sampled>> sample_checked(std::span<const float> logits,
                                                  std::span<const int32_t> recent_tokens,
                                                  const std::function<bool(int32_t)>& allows,
                                                  uint32_t tries,
                                                  const logits_summary* summary = nullptr);

    // Whether a copy of this sampler (resume) can make the request's draws from each row alone,
    // without its token history: no penalty applies. A step may then draw them on the gpu
    // actor's worker and run them at once (gpu::step::decode_steps; a grammar's mask is the
    // caller's to rule out).
    bool draws_ahead() const { return !penalties_on(); }
    // The generator's state: what resume() continues from.
    std::array<uint64_t, 4> rng_state() const { return _rng.state(); }
    // A sampler with these parameters whose generator continues from `state` (rng_state()'s four
    // words): a copy that draws what this one would next. Errors (bad_request): parameters
    // validate() refuses or that draw with a penalty (draws_ahead()), a state of another size
    // or all zero.
    static result<sampler> resume(const sampling_params& p, std::span<const uint64_t> state);
    // A draw from a row's summary alone (a row of n_vocab entries, whose logits are gone: a decode
    // iteration the GPU ran ahead): bit for bit what sample() draws and reports given the row
    // and the summary, when the summary settles it; nothing when it does not (the draw would read
    // the row), the generator then untouched. draws_ahead() samplers only (nothing otherwise).
    std::optional<sampled> sample_summarized(const logits_summary& s, uint32_t n_vocab);
    // The token of a draw ahead (gpu::step_draws, between two decode iterations of one step):
    // sample_summarized()'s from `summary` (the words a step wrote; empty: none), else sample()'s
    // from the row's first n_vocab entries without a summary. -1 when neither draws: the summary
    // does not settle it, or the row or the summary is bad.
    int32_t draw_ahead(std::span<const float> row, std::span<const uint32_t> summary,
                       uint32_t n_vocab);

    const sampling_params& params() const { return _params; }
    // Draws a summary settled without the whole-vocabulary path (tests, stats).
    uint64_t summary_draws() const { return _summary_draws; }

private:
    explicit sampler(const sampling_params& p) : _params(p), _rng(p.seed) {}

    status check_inputs(std::span<const float> logits, std::span<const int32_t> recent) const;
    // "bad_token" for a recent token outside a vocabulary of n_vocab.
    static status check_recent(std::span<const int32_t> recent, size_t n_vocab);
    // The inputs checked, the raw distribution's normaliser, _work the penalised logits.
    status prepare(std::span<const float> logits, std::span<const int32_t> recent);
    // `token` with its raw log-probability and the top alternatives (from the summary when
    // there is one: its normaliser and candidates).
    sampled report(std::span<const float> logits, int32_t token,
                   const logits_summary* summary) const;
    // report()'s answer with a summary, `logit` the token's.
    sampled report_summarized(int32_t token, float logit, const logits_summary& summary) const;
    // The summary's draw (top of this file) for a row of n_vocab entries; -1 when it cannot
    // settle it (nothing drawn then, except where `logits` is empty: the summary alone, whose
    // draw past the candidates would read the row; the generator has then drawn).
    int32_t fast_pick(std::span<const float> logits, uint32_t n_vocab, const logits_summary& s,
                      std::span<const int32_t> recent);
    // Whether a penalty applies (to a non-empty window).
    bool penalties_on() const;
    // The penalty window's distinct ids with their penalised logits into _window (sorted by
    // id); false when no penalty applies.
    bool window_penalties(std::span<const float> logits, std::span<const int32_t> recent);
    // The summary's normaliser at 1 / inv_t (base: mass or mass_t) with the window's terms
    // penalised, relative to `top`; 0 when it cannot be trusted (the window held nearly all).
    double penalised_mass(std::span<const float> logits, const logits_summary& s, double base,
                          float inv_t, float top) const;
    // Plain temperature: the known tokens in order, then the tail in id order (-1 when the
    // draw falls there and `logits` is empty).
    int32_t walk_known_then_tail(std::span<const float> logits, float top, float inv_t,
                                 double total);
    bool apply_penalty(std::span<const int32_t> recent);
    int32_t pick_greedy() const;
    int32_t pick_random(float max_work, double mass);
    // A random draw over the penalised (and masked) logits: the filters, then the generator.
    int32_t draw();
    uint32_t keep_top_k(uint32_t n_vocab);
    uint32_t drop_masked(uint32_t n);
    uint32_t keep_min_p(uint32_t n, float max_work);
    uint32_t keep_top_p(uint32_t n, float max_work, double mass);
    void fill_top_logprobs(std::span<const float> logits, double log_z, sampled& out) const;

    sampling_params _params;
    xoshiro256ss _rng;
    bool _masked = false;     // this call's _work has refused tokens at -inf
    bool _penalised = false;  // this call's _work differs from the logits
    float _max_raw = 0.0f;    // this call's raw logits: the largest, the mass of
    double _raw_mass = 0.0;   // exp(logit - _max_raw) (in _exp until penalties change it),
    double _log_z = 0.0;      // and the log normaliser
    // Scratch reused across calls (sized once per vocabulary size): no allocation per token.
    std::vector<float> _work;          // (vocab) penalised logits
    std::vector<float> _exp;           // (vocab) exp(logit - max logit), raw then penalised
    std::vector<float> _weights;       // (vocab) tempered weights of the kept candidates
    std::vector<int32_t> _candidates;  // (vocab) ids still in the running; a prefix is live
    std::vector<int32_t> _spill;       // (vocab) top_p's crossing bucket
    std::vector<int32_t> _recent;      // (repeat_last_n) the penalty window, sorted
    std::vector<float> _heap;          // (top_k) the top_k largest logits, a min-heap
    // The summary's path: the penalty window's distinct ids and penalised logits, the known
    // tokens (logit descending, id ascending) and a mark per token for the tail's walk.
    struct known_token {
        float logit;
        int32_t id;
    };
    std::vector<known_token> _window;
    std::vector<known_token> _known;
    std::vector<uint8_t> _marks;  // (vocab, on the first tail walk) 1: a known token
    uint64_t _summary_draws = 0;
};

}  // namespace ordo::sched
