// sampling_summary_test.cpp: the sampler's summary path (scheduler/sampling.hpp, top): a draw
// given a row's summary (summarize(): the host's twin of the GPU kernel, which
// gpu_test_logits_summary checks against it) reads only the candidates and what the summary
// cannot settle.
//
// Checks: greedy with a summary is greedy over the row, with and without penalties, including
// penalty windows that push every candidate below the 64th logit (the whole-row path then) and
// negative presence penalties that lift a token from the tail above them; top_k, min_p and top_p
// (and their combinations, with penalties) draw only the tokens the documented filters keep
// (compared with a brute-force sort of the penalised row) and with the softmax's frequencies
// among them; plain temperature sampling follows the whole row's tempered softmax, the tail past
// the candidates included (chi-square over seeded draws); reported log-probabilities equal the
// whole-row ones; the summary settles the common cases (summary_draws counts them), and a mask,
// a summary for another temperature, or a filter that reaches past the candidates take the
// whole-row path, whose tokens are then exactly those of a sampler given no summary; a seed
// fixes the tokens; read_summary refuses words that are not a summary; sample_summarized (a
// summary alone, for requests without penalties) draws and reports exactly what sample() does
// with the row, or nothing where that draw reads the row; resume continues another's draws.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <vector>

#include "scheduler/sampling.hpp"
#include "tests/scheduler/sampling_support.hpp"

namespace {

using namespace ordo::sched;
using ordo::sched::testing::make;
using ordo::sched::testing::random_logits;

sampled draw(sampler& s, const std::vector<float>& logits, std::span<const int32_t> recent,
             const logits_summary* summary) {
    auto r = s.sample(logits, recent, {}, summary);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.err().message);
    return r.ok() ? *r : sampled{};
}

// The penalised row, as sampling.hpp's pipeline step 1 defines it.
std::vector<float> penalised(const std::vector<float>& logits, const sampling_params& p,
                             std::span<const int32_t> recent) {
    std::vector<float> w = logits;
    const size_t n = std::min<size_t>(recent.size(), p.repeat_last_n);
    std::vector<int32_t> window(recent.end() - n, recent.end());
    std::sort(window.begin(), window.end());
    for (size_t i = 0; i < window.size();) {
        const int32_t t = window[i];
        size_t count = 0;
        while (i < window.size() && window[i] == t) i++, count++;
        float& l = w[t];
        if (p.repeat_penalty != 1.0f) l = l > 0.0f ? l / p.repeat_penalty : l * p.repeat_penalty;
        l -= static_cast<float>(count) * p.frequency_penalty + p.presence_penalty;
    }
    return w;
}

// The tokens top_k, top_p and min_p keep of the penalised row (brute force: a full sort).
std::set<int32_t> kept_set(const std::vector<float>& w, const sampling_params& p) {
    std::vector<int32_t> ids(w.size());
    std::iota(ids.begin(), ids.end(), 0);
    std::sort(ids.begin(), ids.end(),
              [&](int32_t a, int32_t b) { return w[a] > w[b] || (w[a] == w[b] && a < b); });
    size_t n = p.top_k > 0 ? std::min<size_t>(p.top_k, ids.size()) : ids.size();
    const double top = w[ids[0]];
    double mass = 0.0;
    for (size_t i = 0; i < n; i++) mass += std::exp(w[ids[i]] - top);
    if (p.min_p > 0.0f) {
        size_t kept = 0;
        while (kept < n && w[ids[kept]] >= top + std::log(p.min_p)) kept++;
        n = kept;
    }
    if (p.top_p < 1.0f) {
        double cumulative = 0.0;
        for (size_t i = 0; i < n; i++) {
            cumulative += std::exp(w[ids[i]] - top);
            if (cumulative >= p.top_p * mass) {
                n = i + 1;
                break;
            }
        }
    }
    return {ids.begin(), ids.begin() + n};
}

std::vector<int32_t> window_of(std::initializer_list<int32_t> ids) {
    return ids;
}

TEST(sampling_summary, greedy_with_a_summary_is_greedy_over_the_row) {
    for (uint64_t seed = 1; seed <= 40; seed++) {
        const size_t n = seed % 2 ? 300 : 32000;
        auto logits = random_logits(n, seed, 6.0f);
        const auto sum = summarize(logits, 0.0f);
        // The best 64 tokens, then a few from the tail.
        std::vector<int32_t> top_window(sum.ids.begin(), sum.ids.begin() + sum.count);
        std::vector<int32_t> tail_window = {int32_t(n - 1), int32_t(n / 2), 7, 7, 7};
        for (int variant = 0; variant < 4; variant++) {
            sampling_params p;
            p.temperature = 0.0f;
            p.logprobs = 5;
            std::vector<int32_t> recent;
            if (variant == 1) p.repeat_penalty = 1.3f, recent = tail_window;
            if (variant == 2) {
                // Every candidate pushed below the 64th: the summary cannot settle it.
                p.presence_penalty = 2.0f, p.repeat_penalty = 10.0f, p.repeat_last_n = 4096;
                recent = top_window;
            }
            if (variant == 3) p.presence_penalty = -2.0f, recent = tail_window;  // lifts the tail
            sampler with = make(p), without = make(p);
            const auto a = draw(with, logits, recent, &sum);
            const auto b = draw(without, logits, recent, nullptr);
            SCOPED_TRACE("seed " + std::to_string(seed) + " variant " + std::to_string(variant));
            EXPECT_EQ(a.token, b.token);
            EXPECT_NEAR(a.logprob, b.logprob, 1e-5f);
            ASSERT_EQ(a.top_count, b.top_count);
            for (uint32_t i = 0; i < a.top_count; i++) {
                EXPECT_EQ(a.top[i].token, b.top[i].token);
                EXPECT_NEAR(a.top[i].logprob, b.top[i].logprob, 1e-5f);
            }
            EXPECT_EQ(with.summary_draws(), variant == 2 ? 0u : 1u);
        }
    }
}

// A step of several decode iterations (gpu::step::decode_steps) hands back the earlier
// iterations' rows as summaries alone: sample_summarized must be, bit for bit, what sample()
// draws and reports with the whole row and the summary whenever it draws (for every request
// draws_ahead() admits: no penalty applies), and draw nothing, its generator untouched, exactly
// where that draw needs the row; draws_ahead() must refuse every request whose draw depends on
// its history. A sampler resumed from another's generator state draws what that one would.
TEST(sampling_summary, a_summary_alone_draws_what_sample_draws_with_the_row_or_nothing) {
    struct config {
        float temperature;
        int32_t top_k;
        float top_p, min_p;
        bool settled;  // the summary alone settles every draw
    };
    const config configs[] = {{0.0f, 0, 1.0f, 0.0f, true},   {0.8f, 40, 1.0f, 0.0f, true},
                              {1.3f, 5, 0.5f, 0.0f, true},   {1.0f, 64, 0.9f, 0.1f, true},
                              {1.0f, 0, 1.0f, 0.0f, false},  {0.7f, 0, 1.0f, 0.0f, false},
                              {1.0f, 0, 0.95f, 0.0f, false}, {0.9f, 0, 1.0f, 0.02f, false}};
    uint64_t unsettled = 0, settled_draws = 0;
    for (const config& c : configs) {
        for (uint64_t seed = 1; seed <= 12; seed++) {
            SCOPED_TRACE("temperature " + std::to_string(c.temperature) + " top_k " +
                         std::to_string(c.top_k) + " seed " + std::to_string(seed));
            const size_t n = seed % 2 ? 300 : 32000;
            sampling_params p;
            p.temperature = c.temperature, p.top_k = c.top_k, p.top_p = c.top_p, p.min_p = c.min_p;
            p.seed = seed;
            p.logprobs = seed % 3 == 0 ? 3 : 0;
            p.repeat_penalty = seed % 4 == 0 ? 1.5f : 1.0f;
            p.repeat_last_n = seed % 4 == 0 ? 0 : 64;  // a penalty over no window: none
            sampler a = make(p), b = make(p);
            ASSERT_TRUE(a.draws_ahead());
            for (uint32_t step = 0; step < 6; step++) {
                // Peaked rows (spread 12) put most of the mass on the candidates, flat ones (2)
                // leave much of it in the tail.
                auto logits = random_logits(n, seed * 100 + step, step % 2 ? 12.0f : 2.0f);
                if (step == 2) logits[n - 1] = logits[n / 3] = 60.0f;  // a tie: the lower id wins
                const auto sum = summarize(logits, c.temperature);
                const auto before = a.rng_state();
                const std::optional<sampled> got = a.sample_summarized(sum, uint32_t(n));
                const sampled want = draw(b, logits, {}, &sum);
                if (!got) {
                    EXPECT_FALSE(c.settled);
                    EXPECT_EQ(a.rng_state(), before) << "the generator is untouched";
                    unsettled++;
                    // The row's draw read the tail: a summary-settled draw never does so.
                    a = *sampler::resume(p, b.rng_state());
                    continue;
                }
                settled_draws++;
                EXPECT_EQ(got->token, want.token);
                EXPECT_EQ(std::bit_cast<uint32_t>(got->logprob),
                          std::bit_cast<uint32_t>(want.logprob));
                ASSERT_EQ(got->top_count, want.top_count);
                for (uint32_t i = 0; i < got->top_count; i++) {
                    EXPECT_EQ(got->top[i].token, want.top[i].token);
                    EXPECT_EQ(got->top[i].logprob, want.top[i].logprob);
                }
                EXPECT_EQ(a.rng_state(), b.rng_state());
            }
        }
    }
    EXPECT_GT(unsettled, 0u) << "no draw needed the row: the test cannot see the refusal";
    EXPECT_GT(settled_draws, 300u);
    // A resumed sampler continues another's draws, by row and by summary (draw_ahead).
    sampling_params p;
    p.temperature = 0.9f, p.top_k = 20, p.seed = 77;
    sampler a = make(p);
    auto logits = random_logits(500, 5, 6.0f);
    ASSERT_TRUE(a.sample(logits, {}).ok());
    sampler b = *sampler::resume(p, a.rng_state());
    const auto words = summary_words(summarize(logits, p.temperature));
    for (int i = 0; i < 5; i++) {
        sampler c = *sampler::resume(p, b.rng_state());
        const int32_t by_row = b.draw_ahead(logits, {}, 500);
        const int32_t by_summary = c.draw_ahead({}, words, 500);
        EXPECT_EQ(by_row, a.sample(logits, {})->token);
        EXPECT_GE(by_summary, 0);
        EXPECT_EQ(b.rng_state(), c.rng_state()) << "one draw each";
    }
    const auto refused = [](auto set) {
        sampling_params p;
        p.temperature = 0.0f;
        set(p);
        return !make(p).draws_ahead();
    };
    EXPECT_TRUE(refused([](sampling_params& p) { p.repeat_penalty = 1.1f; }));
    EXPECT_TRUE(refused([](sampling_params& p) { p.presence_penalty = -0.5f; }));
    EXPECT_TRUE(refused([](sampling_params& p) { p.frequency_penalty = 0.5f; }));
    EXPECT_FALSE(refused([](sampling_params& p) { p.temperature = 0.7f; }));
    EXPECT_FALSE(refused([](sampling_params& p) { p.top_k = 5, p.top_p = 0.5f, p.seed = 3; }));
    // resume refuses what it cannot continue.
    sampling_params penalised;
    penalised.repeat_penalty = 1.2f;
    const std::vector<uint64_t> state = {1, 2, 3, 4};
    EXPECT_FALSE(sampler::resume(penalised, state).ok());
    EXPECT_FALSE(sampler::resume(sampling_params{}, std::vector<uint64_t>{1, 2, 3}).ok());
    EXPECT_FALSE(sampler::resume(sampling_params{}, std::vector<uint64_t>(4, 0)).ok());
    sampling_params bad;
    bad.top_p = 0.0f;
    EXPECT_FALSE(sampler::resume(bad, state).ok());
    EXPECT_TRUE(sampler::resume(sampling_params{}, state).ok());
}

TEST(sampling_summary, filters_draw_only_what_they_keep_at_the_softmax_frequencies) {
    struct config {
        int32_t top_k;
        float top_p, min_p, temperature, repeat, presence;
        bool settled;  // the summary settles every draw
    };
    const config configs[] = {
        {40, 1.0f, 0.0f, 1.0f, 1.0f, 0.0f, true},  {5, 1.0f, 0.0f, 0.5f, 1.0f, 0.0f, true},
        {64, 0.9f, 0.0f, 1.3f, 1.0f, 0.0f, true},  {0, 0.5f, 0.0f, 1.0f, 1.0f, 0.0f, true},
        {0, 1.0f, 0.3f, 0.8f, 1.0f, 0.0f, true},   {40, 0.95f, 0.05f, 0.8f, 1.1f, 0.0f, true},
        {0, 0.7f, 0.0f, 1.0f, 1.2f, -1.0f, true},  {100, 1.0f, 0.0f, 1.0f, 1.0f, 0.0f, false},
        {0, 0.99f, 0.0f, 1.0f, 1.0f, 0.0f, false},  // the nucleus reaches past the candidates
    };
    // A peaked head over a long flat tail: 32000 tokens.
    auto logits = random_logits(32000, 99, 2.0f);
    for (int i = 0; i < 12; i++) logits[(i * 2654435761u) % 32000] = 14.0f - 0.4f * i;
    const std::vector<int32_t> recent = {17, 17, int32_t((3 * 2654435761u) % 32000), 31000};
    for (const config& c : configs) {
        sampling_params p;
        p.top_k = c.top_k, p.top_p = c.top_p, p.min_p = c.min_p, p.temperature = c.temperature;
        p.repeat_penalty = c.repeat, p.presence_penalty = c.presence, p.seed = 5;
        const auto sum = summarize(logits, c.temperature);
        const auto w = penalised(logits, p, recent);
        const auto kept = kept_set(w, p);
        sampler s = make(p);
        constexpr int draws = 4000;
        std::map<int32_t, int> counts;
        for (int i = 0; i < draws; i++) {
            const int32_t t = draw(s, logits, recent, &sum).token;
            ASSERT_TRUE(kept.count(t)) << "token " << t << " not kept, top_k " << c.top_k;
            counts[t]++;
        }
        EXPECT_EQ(s.summary_draws(), c.settled ? uint64_t(draws) : 0u) << "top_k " << c.top_k;
        if (kept.size() > 60) continue;  // too many outcomes for a chi-square of 4000 draws
        double top = -1e30, mass = 0.0, chi2 = 0.0;
        for (int32_t t : kept) top = std::max<double>(top, w[t]);
        for (int32_t t : kept) mass += std::exp((w[t] - top) / c.temperature);
        for (int32_t t : kept) {
            const double expected = std::exp((w[t] - top) / c.temperature) / mass * draws;
            if (expected < 5.0) continue;
            chi2 += (counts[t] - expected) * (counts[t] - expected) / expected;
        }
        EXPECT_LT(chi2, 3.0 * double(kept.size()) + 30.0) << "top_k " << c.top_k;
    }
}

TEST(sampling_summary, plain_temperature_follows_the_whole_row_tail_included) {
    // 600 tokens of similar logits: most of the mass is past the 64 candidates.
    auto logits = random_logits(600, 3, 1.5f);
    constexpr int draws = 60000, buckets = 20;
    for (float temperature : {1.0f, 0.7f}) {
        for (bool penalties : {false, true}) {
            sampling_params p;
            p.temperature = temperature;
            p.seed = 11;
            std::vector<int32_t> recent;
            if (penalties) p.presence_penalty = -1.5f, recent = window_of({500, 501, 502, 3, 3});
            const auto sum = summarize(logits, temperature);
            const auto w = penalised(logits, p, recent);
            sampler s = make(p);
            std::vector<int> counts(buckets, 0);
            for (int i = 0; i < draws; i++) counts[draw(s, logits, recent, &sum).token % buckets]++;
            EXPECT_EQ(s.summary_draws(), uint64_t(draws));
            const double top = *std::max_element(w.begin(), w.end());
            std::vector<double> prob(buckets, 0.0);
            double mass = 0.0;
            for (size_t t = 0; t < w.size(); t++) {
                const double e = std::exp((w[t] - top) / temperature);
                prob[t % buckets] += e;
                mass += e;
            }
            double chi2 = 0.0;
            for (int b = 0; b < buckets; b++) {
                const double expected = prob[b] / mass * draws;
                chi2 += (counts[b] - expected) * (counts[b] - expected) / expected;
            }
            EXPECT_LT(chi2, 50.0) << "temperature " << temperature << " penalties " << penalties;
        }
    }
}

TEST(sampling_summary, unsettled_draws_are_the_whole_row_paths_and_a_seed_fixes_the_tokens) {
    auto logits = random_logits(2000, 8, 1.0f);
    sampling_params p;
    p.temperature = 0.9f;
    p.seed = 77;
    // A summary for another temperature: the whole-row path, token for token a sampler's
    // without a summary.
    const auto other = summarize(logits, 0.5f);
    sampler a = make(p), b = make(p);
    for (int i = 0; i < 200; i++) {
        EXPECT_EQ(draw(a, logits, {}, &other).token, draw(b, logits, {}, nullptr).token);
    }
    EXPECT_EQ(a.summary_draws(), 0u);
    // A mask: the same.
    std::vector<uint8_t> allowed(logits.size(), 0);
    for (size_t i = 0; i < allowed.size(); i += 3) allowed[i] = 1;
    const auto right = summarize(logits, 0.9f);
    for (int i = 0; i < 50; i++) {
        auto x = a.sample(logits, {}, allowed, &right);
        auto y = b.sample(logits, {}, allowed, nullptr);
        ASSERT_TRUE(x.ok() && y.ok());
        EXPECT_EQ(x->token, y->token);
        EXPECT_EQ(x->token % 3, 0);
    }
    EXPECT_EQ(a.summary_draws(), 0u);
    // Settled draws: the same seed gives the same tokens.
    sampler c = make(p), d = make(p);
    for (int i = 0; i < 200; i++) {
        EXPECT_EQ(draw(c, logits, {}, &right).token, draw(d, logits, {}, &right).token);
    }
    EXPECT_EQ(c.summary_draws(), 200u);
}

TEST(sampling_summary, read_summary_refuses_what_is_not_a_summary) {
    const auto logits = random_logits(100, 4, 3.0f);
    const auto s = summarize(logits, 0.8f);
    std::vector<uint32_t> words = summary_words(s);
    auto good = read_summary(words, 100, 0.8f);
    ASSERT_TRUE(good.ok()) << good.err().message;
    EXPECT_EQ(good->ids, s.ids);
    auto refused = [&](std::vector<uint32_t> w, uint32_t n_vocab = 100, float t = 0.8f) {
        auto r = read_summary(w, n_vocab, t);
        return !r.ok() && r.err().code == "bad_summary";
    };
    EXPECT_TRUE(refused(words, 50));  // count is not min(64, n_vocab)
    EXPECT_TRUE(refused({words.begin(), words.end() - 1}));
    auto w = words;
    w[4 + 3] = 100;  // an id outside the row
    EXPECT_TRUE(refused(w));
    w = words;
    std::swap(w[4 + 1], w[4 + 2]), std::swap(w[4 + summary_top + 1], w[4 + summary_top + 2]);
    EXPECT_TRUE(refused(w));  // out of order
    w = words;
    w[1] = std::bit_cast<uint32_t>(0.5f);  // a normaliser below its largest term
    EXPECT_TRUE(refused(w));
    w = words;
    w[2] = std::bit_cast<uint32_t>(std::numeric_limits<float>::quiet_NaN());
    EXPECT_TRUE(refused(w));
    EXPECT_FALSE(refused(w, 100, 0.0f));  // no tempered normaliser asked for
    w = words;
    w[0] = std::bit_cast<uint32_t>(s.max + 1.0f);  // a maximum that is not the best candidate's
    EXPECT_TRUE(refused(w));
}

}  // namespace
