// sampling_test.cpp: the per-request sampler (scheduler/sampling.hpp).
//
// Checks, on crafted logits: greedy picks the argmax with ties to the lowest id; a seed fixes
// the token sequence (same seed same tokens, other seed other tokens, interleaving two
// samplers changes nothing); top_k = 1 and a tiny top_p are greedy; min_p and top_k keep
// exactly the tokens they should on a 32000-token vocabulary (compared with a brute-force
// full sort); repeat penalty changes the choice (positive and negative logits, window);
// presence and frequency penalties subtract exactly once per id / once per occurrence in the
// window, after the repeat penalty, and negative values favour repeats;
// reported log-probabilities are the raw log-softmax, sorted, and sum to 1 over the whole
// vocabulary; frequencies follow the softmax (chi-square over 40000 seeded draws, at two
// temperatures); bad parameters and bad logits are errors naming the problem; an allowed-token
// mask (a grammar's) restricts greedy and every filter to the allowed tokens, draws only them
// with the model's relative frequencies among them, and a mask of the wrong size or allowing
// nothing is an error; greedy checked token by token picks what greedy over the mask picks.
#include "scheduler/sampling.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <vector>

#include "tests/scheduler/sampling_support.hpp"

namespace {

using namespace ordo::sched;
using ordo::sched::testing::make;
using ordo::sched::testing::random_logits;

int32_t draw(sampler& s, const std::vector<float>& logits, std::span<const int32_t> recent = {}) {
    auto r = s.sample(logits, recent);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.err().message);
    return r.ok() ? r->token : -1;
}

std::vector<double> softmax(const std::vector<float>& l, double temperature) {
    const double m = *std::max_element(l.begin(), l.end());
    std::vector<double> p(l.size());
    double sum = 0.0;
    for (size_t i = 0; i < l.size(); i++) sum += p[i] = std::exp((l[i] - m) / temperature);
    for (auto& x : p) x /= sum;
    return p;
}

TEST(sampling, greedy_picks_argmax_and_lowest_id_on_ties) {
    sampling_params p;
    p.temperature = 0.0f;
    sampler s = make(p);
    EXPECT_EQ(draw(s, {0.1f, 3.0f, -2.0f, 2.9f}), 1);
    EXPECT_EQ(draw(s, {1.0f, 5.0f, 5.0f, 5.0f}), 1);
    EXPECT_EQ(draw(s, {-7.0f, -7.0f}), 0);
}

TEST(sampling, same_seed_same_tokens_other_seed_other_tokens) {
    const auto logits = random_logits(1000, 7, 2.0f);
    sampling_params p;
    p.seed = 1234;
    sampler a = make(p), b = make(p);
    p.seed = 1235;
    sampler c = make(p);
    std::vector<int32_t> ta, tb, tc;
    for (int i = 0; i < 64; i++) {
        ta.push_back(draw(a, logits));
        tb.push_back(draw(b, logits));
        tc.push_back(draw(c, logits));
    }
    EXPECT_EQ(ta, tb);
    EXPECT_NE(ta, tc);
    EXPECT_GT(std::set<int32_t>(ta.begin(), ta.end()).size(), 8u) << "should not be greedy";
}

TEST(sampling, interleaved_samplers_do_not_influence_each_other) {
    const auto l1 = random_logits(500, 1, 3.0f), l2 = random_logits(500, 2, 3.0f);
    sampling_params p;
    p.seed = 99;
    p.top_k = 40;
    sampler alone = make(p);
    std::vector<int32_t> expected;
    for (int i = 0; i < 32; i++) expected.push_back(draw(alone, l1));
    sampler mine = make(p), other = make(p);
    std::vector<int32_t> got;
    for (int i = 0; i < 32; i++) {
        got.push_back(draw(mine, l1));
        for (int k = 0; k < i % 3; k++) draw(other, l2);  // a busy batch neighbour
    }
    EXPECT_EQ(got, expected);
}

TEST(sampling, top_k_one_and_tiny_top_p_are_greedy) {
    const auto logits = random_logits(32000, 3, 4.0f);
    const int32_t argmax =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    sampling_params k1;
    k1.top_k = 1;
    k1.temperature = 1.5f;
    sampling_params tiny_p;
    tiny_p.top_p = 1e-6f;
    tiny_p.temperature = 1.5f;
    for (uint64_t seed = 0; seed < 20; seed++) {
        k1.seed = tiny_p.seed = seed;
        sampler a = make(k1), b = make(tiny_p);
        EXPECT_EQ(draw(a, logits), argmax);
        EXPECT_EQ(draw(b, logits), argmax);
    }
}

// The set each filter must keep, by brute force (full sort), on a 32000 vocabulary.
TEST(sampling, filters_keep_exactly_the_expected_tokens) {
    const auto logits = random_logits(32000, 11, 6.0f);
    std::vector<int32_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    const auto prob = softmax(logits, 1.0);
    // top_p = 0.5 over the whole vocabulary: the shortest prefix reaching 0.5.
    std::set<int32_t> nucleus;
    double cum = 0.0;
    for (int32_t t : order) {
        nucleus.insert(t);
        if ((cum += prob[t]) >= 0.5) break;
    }
    ASSERT_GT(nucleus.size(), 3u);
    ASSERT_LT(nucleus.size(), 5000u);
    std::set<int32_t> min_p_kept;
    for (int32_t t : order) {
        if (prob[t] >= 0.05 * prob[order[0]]) min_p_kept.insert(t);
    }
    const std::set<int32_t> top7(order.begin(), order.begin() + 7);

    struct filter_case {
        sampling_params p;
        const std::set<int32_t>& kept;
    };
    sampling_params tp, mp, tk;
    tp.top_p = 0.5f;
    mp.min_p = 0.05f;
    tk.top_k = 7;
    for (const filter_case& fc :
         {filter_case{tp, nucleus}, filter_case{mp, min_p_kept}, filter_case{tk, top7}}) {
        sampler s = make(fc.p);
        std::set<int32_t> seen;
        for (int i = 0; i < 600; i++) {
            const int32_t t = draw(s, logits);
            ASSERT_TRUE(fc.kept.count(t)) << "token " << t << " should have been filtered";
            seen.insert(t);
        }
        EXPECT_GE(seen.size(), std::min<size_t>(fc.kept.size(), 3)) << "filter too strict";
    }
}

TEST(sampling, min_p_drops_unlikely_tokens) {
    // p ~ exp(l): token 2 has 1/e^3 = 0.05 of token 0's probability, token 1 has 0.37.
    const std::vector<float> logits = {0.0f, -1.0f, -3.0f};
    sampling_params p;
    p.min_p = 0.1f;
    sampler s = make(p);
    std::map<int32_t, int> counts;
    for (int i = 0; i < 2000; i++) counts[draw(s, logits)]++;
    EXPECT_EQ(counts.count(2), 0u);
    EXPECT_GT(counts[0], counts[1]);
    EXPECT_GT(counts[1], 0);
}

TEST(sampling, repeat_penalty_changes_the_choice) {
    sampling_params p;
    p.temperature = 0.0f;
    p.repeat_penalty = 1.3f;
    p.repeat_last_n = 2;
    sampler s = make(p);
    const std::vector<int32_t> recent0 = {0};
    // Positive logits are divided: 2.0 / 1.3 = 1.54 < 1.8.
    EXPECT_EQ(draw(s, {2.0f, 1.8f, 0.0f}), 0);
    EXPECT_EQ(draw(s, {2.0f, 1.8f, 0.0f}, recent0), 1);
    // Negative logits are multiplied: -1.0 * 1.3 = -1.3 < -1.2.
    EXPECT_EQ(draw(s, {-1.0f, -1.2f, -5.0f}, recent0), 1);
    // Token 0 outside the last 2 tokens is not penalised; a repeat counts once.
    const std::vector<int32_t> old0 = {0, 2, 2};
    EXPECT_EQ(draw(s, {2.0f, 1.8f, 0.0f}, old0), 0);
    p.repeat_penalty = 1.0f;
    sampler off = make(p);
    EXPECT_EQ(draw(off, {2.0f, 1.8f, 0.0f}, recent0), 0);
}

TEST(sampling, presence_and_frequency_penalties_subtract_per_id_and_per_occurrence) {
    sampling_params p;
    p.temperature = 0.0f;
    p.repeat_last_n = 4;
    // Token 0 occurs twice in the window, token 1 once; token 2 is fresh.
    const std::vector<int32_t> recent = {0, 1, 0};
    p.presence_penalty = 0.5f;
    sampler presence = make(p);
    // 3.0 - 0.5 = 2.5 < 2.6: once per id, however often it occurs.
    EXPECT_EQ(draw(presence, {3.0f, 0.0f, 2.6f}, recent), 2);
    EXPECT_EQ(draw(presence, {3.0f, 0.0f, 2.4f}, recent), 0);
    p.presence_penalty = 0.0f;
    p.frequency_penalty = 0.5f;
    sampler frequency = make(p);
    // 3.0 - 2 x 0.5 = 2.0: per occurrence.
    EXPECT_EQ(draw(frequency, {3.0f, 0.0f, 2.1f}, recent), 2);
    EXPECT_EQ(draw(frequency, {3.0f, 0.0f, 1.9f}, recent), 0);
    // Both, after the repeat penalty: 3.0 / 1.5 = 2.0, - 2 x 0.25 - 0.25 = 1.25.
    p.repeat_penalty = 1.5f;
    p.frequency_penalty = 0.25f;
    p.presence_penalty = 0.25f;
    sampler all = make(p);
    EXPECT_EQ(draw(all, {3.0f, 0.0f, 1.3f}, recent), 2);
    EXPECT_EQ(draw(all, {3.0f, 0.0f, 1.2f}, recent), 0);
    // Only the window counts: the last token alone (3.0 - 1.0 = 2.0 > 1.5), then all four
    // (3.0 - 2.0 = 1.0 < 1.5).
    p = sampling_params{};
    p.temperature = 0.0f;
    p.repeat_last_n = 1;
    p.frequency_penalty = 1.0f;
    sampler last_one = make(p);
    EXPECT_EQ(draw(last_one, {3.0f, 0.0f, 1.5f}, recent), 0);
    p.repeat_last_n = 4;
    sampler last_four = make(p);
    EXPECT_EQ(draw(last_four, {3.0f, 0.0f, 1.5f}, recent), 2);
    // Negative penalties favour what is already there.
    p.frequency_penalty = -1.0f;
    sampler favour = make(p);
    EXPECT_EQ(draw(favour, {2.0f, 2.5f, 3.5f}, recent), 0);  // 2.0 + 2 = 4.0 > 3.5
}

TEST(sampling, logprobs_are_raw_log_softmax_sorted) {
    const auto logits = random_logits(50, 5, 3.0f);
    const auto prob = softmax(logits, 1.0);
    sampling_params p;
    p.logprobs = 20;
    p.temperature = 0.7f;
    p.repeat_penalty = 1.5f;  // must not change the reported numbers
    p.top_k = 10;
    sampler s = make(p);
    const std::vector<int32_t> recent = {1, 2, 3};
    auto r = s.sample(logits, recent);
    ASSERT_TRUE(r.ok());
    EXPECT_NEAR(r->logprob, std::log(prob[r->token]), 1e-4);
    ASSERT_EQ(r->top_logprobs().size(), 20u);
    std::vector<int32_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return prob[a] > prob[b]; });
    for (size_t i = 0; i < 20; i++) {
        EXPECT_EQ(r->top[i].token, order[i]);
        EXPECT_NEAR(r->top[i].logprob, std::log(prob[order[i]]), 1e-4);
    }
    // Asking for the whole (small) vocabulary: probabilities sum to 1.
    sampling_params all;
    all.logprobs = 20;
    sampler s2 = make(all);
    auto r2 = s2.sample(std::vector<float>{1.0f, 2.0f, 1.0f}, {});
    ASSERT_TRUE(r2.ok());
    ASSERT_EQ(r2->top_count, 3u);
    double sum = 0.0;
    for (const auto& t : r2->top_logprobs()) sum += std::exp(t.logprob);
    EXPECT_NEAR(sum, 1.0, 1e-5);
    EXPECT_EQ(r2->top[0].token, 1);
    EXPECT_EQ(r2->top[1].token, 0);  // tie with token 2: lowest id first
    EXPECT_EQ(r2->top[2].token, 2);
}

// Pearson's chi-square of observed counts against the softmax; with 7 categories (6 degrees of
// freedom) a correct sampler exceeds 30 with probability about 4e-5. The seed is fixed, so the
// test is deterministic; it fails if the draw is biased.
TEST(sampling, frequencies_follow_the_softmax) {
    const std::vector<float> logits = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, 1.5f, -1.0f};
    constexpr int draws = 40000;
    for (float temperature : {1.0f, 0.6f}) {
        sampling_params p;
        p.temperature = temperature;
        p.seed = 2024;
        sampler s = make(p);
        std::vector<int> counts(logits.size(), 0);
        for (int i = 0; i < draws; i++) counts[draw(s, logits)]++;
        const auto prob = softmax(logits, temperature);
        double chi2 = 0.0;
        for (size_t i = 0; i < logits.size(); i++) {
            const double expected = prob[i] * draws;
            chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
        }
        EXPECT_LT(chi2, 30.0) << "temperature " << temperature;
    }
}

TEST(sampling, bad_parameters_name_the_key) {
    static constexpr float nan = std::numeric_limits<float>::quiet_NaN();
    struct bad_case {
        const char* key;
        void (*set)(sampling_params&);
    };
    const bad_case cases[] = {
        {"temperature", [](sampling_params& p) { p.temperature = -0.1f; }},
        {"temperature", [](sampling_params& p) { p.temperature = nan; }},
        {"temperature", [](sampling_params& p) { p.temperature = 101.0f; }},
        {"top_k", [](sampling_params& p) { p.top_k = -1; }},
        {"top_p", [](sampling_params& p) { p.top_p = 0.0f; }},
        {"top_p", [](sampling_params& p) { p.top_p = 1.01f; }},
        {"min_p", [](sampling_params& p) { p.min_p = -0.01f; }},
        {"min_p", [](sampling_params& p) { p.min_p = 1.0f; }},
        {"repeat_penalty", [](sampling_params& p) { p.repeat_penalty = 0.0f; }},
        {"repeat_penalty", [](sampling_params& p) { p.repeat_penalty = nan; }},
        {"presence_penalty", [](sampling_params& p) { p.presence_penalty = 2.01f; }},
        {"presence_penalty", [](sampling_params& p) { p.presence_penalty = nan; }},
        {"frequency_penalty", [](sampling_params& p) { p.frequency_penalty = -2.5f; }},
        {"frequency_penalty", [](sampling_params& p) { p.frequency_penalty = nan; }},
        {"repeat_last_n", [](sampling_params& p) { p.repeat_last_n = repeat_last_n_max + 1; }},
        {"logprobs", [](sampling_params& p) { p.logprobs = 21; }},
    };
    for (const auto& c : cases) {
        sampling_params p;
        c.set(p);
        auto s = validate(p);
        ASSERT_FALSE(s.ok()) << c.key;
        EXPECT_EQ(s.err().code, "bad_request");
        EXPECT_NE(s.err().message.find(std::string("\"") + c.key + "\""), std::string::npos)
            << s.err().message;
        EXPECT_FALSE(sampler::create(p).ok());
    }
    EXPECT_TRUE(validate(sampling_params{}).ok());
}

TEST(sampling, bad_logits_are_errors_and_leave_the_generator_untouched) {
    sampling_params p;
    p.seed = 5;
    sampler s = make(p), fresh = make(p);
    const auto good = random_logits(100, 9, 2.0f);
    auto with_nan = good;
    with_nan[42] = std::numeric_limits<float>::quiet_NaN();
    auto with_inf = good;
    with_inf[3] = std::numeric_limits<float>::infinity();
    for (const auto& bad : {with_nan, with_inf}) {
        auto r = s.sample(bad, {});
        ASSERT_FALSE(r.ok());
        EXPECT_EQ(r.err().code, "bad_logits");
    }
    EXPECT_FALSE(s.sample(std::vector<float>{}, {}).ok());
    const std::vector<int32_t> out_of_vocab = {100};
    auto r = s.sample(good, out_of_vocab);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.err().code, "bad_token");
    for (int i = 0; i < 10; i++) EXPECT_EQ(draw(s, good), draw(fresh, good));
}

TEST(sampling, a_mask_restricts_every_path_to_the_allowed_tokens) {
    std::vector<float> logits(1000);
    for (size_t i = 0; i < logits.size(); i++) logits[i] = float(i % 97) * 0.05f;
    std::vector<uint8_t> allowed(logits.size(), 0);
    const std::set<int32_t> ok = {3, 10, 500, 999};
    for (int32_t t : ok) allowed[size_t(t)] = 1;
    // Greedy: the best allowed token (999 % 97 = 29 beats 500 % 97 = 15, 10 and 3).
    sampler g = make({.temperature = 0.0f});
    auto r = g.sample(logits, {}, allowed);
    ASSERT_TRUE(r.ok()) << r.err().message;
    EXPECT_EQ(r->token, 999);
    // Every filter, with top_k larger than the allowed set: only allowed tokens, in the
    // model's proportions among them (exp(l) ratios), over many seeded draws.
    for (sampling_params p :
         {sampling_params{.top_k = 40, .seed = 7}, sampling_params{.top_p = 0.999f, .seed = 8},
          sampling_params{.min_p = 0.001f, .seed = 9}, sampling_params{.seed = 10}}) {
        sampler s = make(p);
        std::map<int32_t, int> seen;
        const int n = 20000;
        for (int i = 0; i < n; i++) {
            auto d = s.sample(logits, {}, allowed);
            ASSERT_TRUE(d.ok()) << d.err().message;
            ASSERT_TRUE(ok.count(d->token)) << "drew refused token " << d->token;
            seen[d->token]++;
        }
        double z = 0;
        for (int32_t t : ok) z += std::exp(double(logits[size_t(t)]));
        for (int32_t t : ok) {
            const double want = std::exp(double(logits[size_t(t)])) / z;
            EXPECT_NEAR(double(seen[t]) / n, want, 0.02) << "token " << t;
        }
    }
    // The raw log-probability is still the model's (unmasked) one.
    sampler l = make({.temperature = 0.0f, .logprobs = 1});
    auto lp = l.sample(logits, {}, allowed);
    ASSERT_TRUE(lp.ok());
    EXPECT_EQ(lp->top_count, 1u);
    EXPECT_NE(lp->top[0].token, 999) << "top_logprobs are of the raw logits, not the mask";
}

TEST(sampling, a_bad_mask_is_an_error) {
    std::vector<float> logits(10, 0.0f);
    sampler s = make({.seed = 1});
    std::vector<uint8_t> short_mask(9, 1), none(10, 0);
    auto a = s.sample(logits, {}, short_mask);
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.err().code, "bad_mask");
    auto b = s.sample(logits, {}, none);
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.err().code, "bad_mask");
}

// The mask of the ids `allows` takes.
template <typename Allows>
std::vector<uint8_t> mask_of(size_t n, Allows allows) {
    std::vector<uint8_t> mask(n);
    for (size_t i = 0; i < n; i++) mask[i] = allows(int32_t(i)) ? 1 : 0;
    return mask;
}

TEST(sampling, greedy_checked_token_by_token_equals_greedy_over_the_mask) {
    std::vector<float> logits(5000);
    for (size_t i = 0; i < logits.size(); i++) logits[i] = float((i * 7919) % 1013) * 0.01f;
    const std::vector<int32_t> recent = {1, 2, 3, 4000};
    for (int modulo : {1, 3, 40, 700}) {
        SCOPED_TRACE("allowed: ids divisible by " + std::to_string(modulo));
        auto allows = [&](int32_t t) { return t % modulo == 0; };
        const std::vector<uint8_t> mask = mask_of(logits.size(), allows);
        sampling_params p;
        p.temperature = 0.0f;
        p.repeat_penalty = 1.3f;
        p.logprobs = 2;
        sampler full = make(p), checked = make(p);
        auto want = full.sample(logits, recent, mask);
        ASSERT_TRUE(want.ok());
        auto got = checked.sample_checked(logits, recent, allows, 5000);
        ASSERT_TRUE(got.ok());
        ASSERT_TRUE(got->has_value());
        EXPECT_EQ((*got)->token, want->token);
        EXPECT_EQ((*got)->logprob, want->logprob);
        EXPECT_EQ((*got)->top_count, want->top_count);
        // Too few checks for a sparse mask: nothing, and the caller falls back to the mask.
        auto few = checked.sample_checked(logits, recent, allows, 2);
        ASSERT_TRUE(few.ok());
        if (modulo == 700) {
            EXPECT_FALSE(few->has_value());
        }
    }
}

// At a temperature, one draw checked, then the mask when refused: the masked distribution
// (without truncating filters, exactly: p(t) + (1 - p(A)) p(t) / p(A) = p(t) / p(A)), and with
// every token allowed the same tokens as sample() for the same seed (one draw each).
TEST(sampling, checked_draw_then_mask_is_the_masked_distribution) {
    const std::vector<float> logits = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, 1.5f};
    auto allows = [](int32_t t) { return t != 0 && t != 5; };  // the two likeliest refused
    const std::vector<uint8_t> mask = mask_of(logits.size(), allows);
    const sampling_params p{
        .temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 42};
    sampler s = make(p);
    std::vector<double> count(logits.size(), 0);
    const int draws = 40000;
    int masked = 0;
    for (int i = 0; i < draws; i++) {
        auto c = s.sample_checked(logits, {}, allows, 0);
        ASSERT_TRUE(c.ok());
        int32_t t;
        if (c->has_value()) {
            t = (*c)->token;
        } else {
            auto d = s.sample(logits, {}, mask);
            ASSERT_TRUE(d.ok());
            t = d->token;
            masked++;
        }
        ASSERT_TRUE(allows(t)) << t;
        count[size_t(t)]++;
    }
    double z = 0;
    for (size_t t = 0; t < logits.size(); t++) z += allows(int32_t(t)) ? std::exp(logits[t]) : 0;
    for (size_t t = 0; t < logits.size(); t++) {
        if (!allows(int32_t(t))) continue;
        const double want = std::exp(logits[t]) / z;
        // 40000 draws: a binomial's standard deviation is under 0.0025; 4 of them.
        EXPECT_NEAR(count[t] / draws, want, 0.01) << "token " << t;
    }
    EXPECT_GT(masked, draws / 4) << "the refused tokens hold most of the mass: masks were needed";
    EXPECT_LT(masked, draws) << "allowed first draws were kept";

    sampler plain = make(p), checked = make(p);
    for (int i = 0; i < 200; i++) {
        auto a = plain.sample(logits, {});
        auto b = checked.sample_checked(
            logits, {}, [](int32_t) { return true; }, 0);
        ASSERT_TRUE(a.ok() && b.ok() && b->has_value());
        EXPECT_EQ(a->token, (*b)->token) << "draw " << i;
        EXPECT_EQ(a->logprob, (*b)->logprob);
    }
}

}  // namespace
