// sampling.cpp: see sampling.hpp for the pipeline and the log-probability choice.
#include "scheduler/sampling.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <numeric>
#include <string>

#include "scheduler/sampling_math.hpp"

namespace ordo::sched {
namespace {

// top_p buckets candidates by log-probability below the best, a quarter nat per bucket, over
// 16 nats (a factor 9e6); everything further down shares the last bucket.
constexpr uint32_t top_p_buckets = 64;
constexpr float top_p_buckets_per_nat = 4.0f;
// top_k up to this uses a heap of k values (O(vocab) for a peaked distribution); a larger k
// falls back to nth_element over all ids.
constexpr uint32_t top_k_heap_max = 1024;

// A window whose raw terms hold more than this share of the summary's normaliser leaves too
// little of it after the exchange to trust (float cancellation): the whole-vocabulary path.
constexpr double window_mass_share_max = 0.999;

// The sampler's one order of tokens: logit descending, the lower id first on ties.
bool better_known(float la, int32_t a, float lb, int32_t b) {
    return la > lb || (la == lb && a < b);
}

error bad_summary(const std::string& why) {
    return make_error("bad_summary", "logits summary: " + why);
}

error bad_param(const std::string& key, const std::string& expected, double got) {
    char number[32];
    std::snprintf(number, sizeof number, "%g", got);
    return make_error("bad_request", "\"" + key + "\" must be " + expected + ", got " + number);
}

}  // namespace

status validate(const sampling_params& p) {
    // Written as !(in range) so that NaN, which fails every comparison, is refused too.
    if (!(p.temperature >= 0.0f && p.temperature <= temperature_max)) {
        return bad_param("temperature", "in [0, 100] (0 = greedy)", p.temperature);
    }
    if (p.top_k < 0) return bad_param("top_k", ">= 0 (0 = off)", p.top_k);
    if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return bad_param("top_p", "in (0, 1]", p.top_p);
    if (!(p.min_p >= 0.0f && p.min_p < 1.0f)) return bad_param("min_p", "in [0, 1)", p.min_p);
    if (!(p.repeat_penalty > 0.0f && p.repeat_penalty <= repeat_penalty_max)) {
        return bad_param("repeat_penalty", "in (0, 10] (1 = off)", p.repeat_penalty);
    }
    if (!(p.presence_penalty >= -additive_penalty_max &&
          p.presence_penalty <= additive_penalty_max)) {
        return bad_param("presence_penalty", "in [-2, 2] (0 = off)", p.presence_penalty);
    }
    if (!(p.frequency_penalty >= -additive_penalty_max &&
          p.frequency_penalty <= additive_penalty_max)) {
        return bad_param("frequency_penalty", "in [-2, 2] (0 = off)", p.frequency_penalty);
    }
    if (p.repeat_last_n > repeat_last_n_max) {
        return bad_param("repeat_last_n", "at most " + std::to_string(repeat_last_n_max),
                         p.repeat_last_n);
    }
    if (p.logprobs > logprobs_max) return bad_param("logprobs", "in [0, 20]", p.logprobs);
    return {};
}

logits_summary summarize(std::span<const float> logits, float temperature) {
    logits_summary s;
    const auto n = static_cast<uint32_t>(logits.size());
    if (n == 0) return s;
    s.max = math::max_value(logits);
    double mass = 0.0, mass_t = 0.0;
    for (float l : logits) {
        const double d = static_cast<double>(l) - s.max;
        mass += std::exp(d);
        if (temperature > 0.0f) mass_t += std::exp(d / temperature);
    }
    s.mass = static_cast<float>(mass);
    s.mass_t = temperature > 0.0f ? static_cast<float>(mass_t) : 0.0f;
    s.temperature = temperature;
    s.count = std::min(summary_top, n);
    std::vector<int32_t> ids(n);
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + s.count, ids.end(), [&](int32_t a, int32_t b) {
        return better_known(logits[a], a, logits[b], b);
    });
    for (uint32_t i = 0; i < s.count; i++) {
        s.ids[i] = ids[i];
        s.logits[i] = logits[ids[i]];
    }
    return s;
}

result<logits_summary> read_summary(std::span<const uint32_t> words, uint32_t n_vocab,
                                    float temperature) {
    constexpr uint32_t top = summary_top;
    if (words.size() < gpu::abi::ORDO_SUMMARY_WORDS) {
        return bad_summary(std::to_string(words.size()) + " words, not " +
                           std::to_string(gpu::abi::ORDO_SUMMARY_WORDS));
    }
    logits_summary s;
    s.max = std::bit_cast<float>(words[0]);
    s.mass = std::bit_cast<float>(words[1]);
    s.mass_t = std::bit_cast<float>(words[2]);
    s.temperature = temperature;
    if ((words[3] & gpu::abi::ORDO_SUMMARY_NONFINITE) != 0) {
        return bad_summary("its row holds an inf or a NaN");
    }
    s.count = words[3];
    if (s.count != std::min(top, n_vocab)) {
        return bad_summary(std::to_string(s.count) + " candidates of a row of " +
                           std::to_string(n_vocab));
    }
    for (uint32_t i = 0; i < s.count; i++) {
        s.ids[i] = static_cast<int32_t>(words[4 + i]);
        s.logits[i] = std::bit_cast<float>(words[4 + top + i]);
        if (s.ids[i] < 0 || static_cast<uint32_t>(s.ids[i]) >= n_vocab ||
            !std::isfinite(s.logits[i]) ||
            (i > 0 && !better_known(s.logits[i - 1], s.ids[i - 1], s.logits[i], s.ids[i]))) {
            return bad_summary("candidate " + std::to_string(i) + " (id " +
                               std::to_string(s.ids[i]) + ") is outside the row or out of order");
        }
    }
    // The largest term of each sum is exp(0) = 1.
    if (s.count == 0 || s.max != s.logits[0] || !(std::isfinite(s.mass) && s.mass >= 1.0f) ||
        (temperature > 0.0f && !(std::isfinite(s.mass_t) && s.mass_t >= 1.0f))) {
        return bad_summary("its maximum or normalisers are not those of its candidates");
    }
    return s;
}

std::vector<uint32_t> summary_words(const logits_summary& s) {
    std::vector<uint32_t> w(gpu::abi::ORDO_SUMMARY_WORDS, 0u);
    w[0] = std::bit_cast<uint32_t>(s.max);
    w[1] = std::bit_cast<uint32_t>(s.mass);
    w[2] = std::bit_cast<uint32_t>(s.mass_t);
    w[3] = s.count;
    for (uint32_t i = 0; i < s.count && i < summary_top; i++) {
        w[4 + i] = static_cast<uint32_t>(s.ids[i]);
        w[4 + summary_top + i] = std::bit_cast<uint32_t>(s.logits[i]);
    }
    return w;
}

result<sampler> sampler::create(const sampling_params& p) {
    if (auto s = validate(p); !s) return s.err();
    return sampler(p);
}

status sampler::check_inputs(std::span<const float> logits, std::span<const int32_t> recent) const {
    if (logits.empty() || logits.size() > vocab_size_max) {
        return make_error("bad_logits", "logits must have 1.." + std::to_string(vocab_size_max) +
                                            " entries, got " + std::to_string(logits.size()));
    }
    for (size_t i = 0; i < logits.size(); i++) {
        if (!std::isfinite(logits[i])) {
            return make_error("bad_logits", "logit of token " + std::to_string(i) +
                                                " is not finite: the step that produced it "
                                                "failed");
        }
    }
    return check_recent(recent, logits.size());
}

status sampler::check_recent(std::span<const int32_t> recent, size_t n_vocab) {
    for (int32_t t : recent) {
        if (t < 0 || static_cast<size_t>(t) >= n_vocab) {
            return make_error("bad_token", "recent token " + std::to_string(t) +
                                               " is outside the vocabulary of " +
                                               std::to_string(n_vocab));
        }
    }
    return {};
}

status sampler::prepare(std::span<const float> logits, std::span<const int32_t> recent_tokens) {
    if (auto s = check_inputs(logits, recent_tokens); !s) return s;
    const size_t n_vocab = logits.size();
    if (_work.size() != n_vocab) {
        // First call (or a new vocabulary): the only allocations this sampler makes.
        _work.resize(n_vocab);
        _exp.resize(n_vocab);
        _weights.resize(n_vocab);
        _candidates.resize(n_vocab);
        _spill.resize(n_vocab);
        _recent.reserve(_params.repeat_last_n);
        _heap.reserve(std::min<uint32_t>(_params.top_k, top_k_heap_max));
    }
    // The raw distribution first: it gives the reported log-probabilities.
    _max_raw = math::max_value(logits);
    math::exp_shifted(logits, _max_raw, 1.0f, _exp);
    _raw_mass = math::sum(_exp);
    _log_z = _max_raw + std::log(_raw_mass);
    std::copy(logits.begin(), logits.end(), _work.begin());
    _penalised = apply_penalty(recent_tokens);
    _masked = false;
    return {};
}

sampled sampler::report(std::span<const float> logits, int32_t token,
                        const logits_summary* summary) const {
    assert(token >= 0 && static_cast<size_t>(token) < logits.size());
    sampled out;
    out.token = token;
    if (summary == nullptr) {
        out.logprob = static_cast<float>(logits[token] - _log_z);
        fill_top_logprobs(logits, _log_z, out);
        return out;
    }
    return report_summarized(token, logits[token], *summary);
}

sampled sampler::report_summarized(int32_t token, float logit,
                                   const logits_summary& summary) const {
    sampled out;
    out.token = token;
    const double log_z = static_cast<double>(summary.max) + std::log(double{summary.mass});
    out.logprob = static_cast<float>(logit - log_z);
    out.top_count = std::min(_params.logprobs, summary.count);
    for (uint32_t i = 0; i < out.top_count; i++) {
        out.top[i] = {summary.ids[i], static_cast<float>(summary.logits[i] - log_z)};
    }
    return out;
}

bool sampler::penalties_on() const {
    const bool repeat = _params.repeat_penalty != 1.0f;
    const bool additive = _params.presence_penalty != 0.0f || _params.frequency_penalty != 0.0f;
    return (repeat || additive) && _params.repeat_last_n != 0;
}

result<sampler> sampler::resume(const sampling_params& p, std::span<const uint64_t> state) {
    if (auto s = validate(p); !s) return s.err();
    sampler s(p);
    if (!s.draws_ahead()) {
        return make_error("bad_request",
                          "a sampler with a penalty draws from its history: it "
                          "cannot be resumed from its generator alone");
    }
    if (state.size() != 4 ||
        std::all_of(state.begin(), state.end(), [](uint64_t w) { return w == 0; })) {
        return make_error("bad_request", "a generator state is 4 words, not all zero (got " +
                                             std::to_string(state.size()) + ")");
    }
    s._rng = xoshiro256ss::from_state({state[0], state[1], state[2], state[3]});
    return s;
}

std::optional<sampled> sampler::sample_summarized(const logits_summary& s, uint32_t n_vocab) {
    if (!draws_ahead() || n_vocab == 0 || n_vocab > vocab_size_max) return std::nullopt;
    const auto before = _rng.state();
    const int32_t t = fast_pick({}, n_vocab, s, {});
    if (t < 0) {
        _rng = xoshiro256ss::from_state(before);
        return std::nullopt;
    }
    // Without a penalty the known tokens are the candidates: the token is one of them.
    for (uint32_t i = 0; i < s.count; i++) {
        if (s.ids[i] == t) {
            _summary_draws++;
            return report_summarized(t, s.logits[i], s);
        }
    }
    _rng = xoshiro256ss::from_state(before);
    return std::nullopt;
}

int32_t sampler::draw_ahead(std::span<const float> row, std::span<const uint32_t> summary,
                            uint32_t n_vocab) {
    if (!summary.empty()) {
        auto s = read_summary(summary, n_vocab, _params.temperature);
        if (!s) return -1;
        auto d = sample_summarized(*s, n_vocab);
        return d ? d->token : -1;
    }
    auto d = sample(row.first(std::min<size_t>(row.size(), n_vocab)), {});
    return d.ok() ? d->token : -1;
}

result<sampled> sampler::sample(std::span<const float> logits,
                                std::span<const int32_t> recent_tokens,
                                std::span<const uint8_t> allowed, const logits_summary* summary) {
    if (summary != nullptr && allowed.empty() && !logits.empty() &&
        logits.size() <= vocab_size_max) {
        if (auto s = check_recent(recent_tokens, logits.size()); !s) return s.err();
        const int32_t t =
            fast_pick(logits, static_cast<uint32_t>(logits.size()), *summary, recent_tokens);
        if (t >= 0) {
            _summary_draws++;
            return report(logits, t, summary);
        }
    }
    if (!allowed.empty() &&
        (allowed.size() != logits.size() ||
         std::none_of(allowed.begin(), allowed.end(), [](uint8_t a) { return a != 0; }))) {
        return make_error("bad_mask", "the allowed-token mask must have one entry per logit (" +
                                          std::to_string(logits.size()) + ") and allow a token");
    }
    if (auto s = prepare(logits, recent_tokens); !s) return s.err();
    // A refused token's logit becomes -inf: greedy never picks it and drop_masked() takes it
    // out of the candidates (its weight would otherwise be exp's floor, not 0).
    _masked = !allowed.empty();
    if (_masked) {
        for (size_t i = 0; i < logits.size(); i++) {
            if (allowed[i] == 0) _work[i] = -std::numeric_limits<float>::infinity();
        }
        _penalised = true;
    }
    if (_params.temperature == 0.0f) return report(logits, pick_greedy(), summary);
    return report(logits, draw(), summary);
}

result<std::optional<sampled>> sampler::sample_checked(std::span<const float> logits,
                                                       std::span<const int32_t> recent_tokens,
                                                       const std::function<bool(int32_t)>& allows,
                                                       uint32_t tries,
                                                       const logits_summary* summary) {
    if (auto s = prepare(logits, recent_tokens); !s) return s.err();
    if (_params.temperature != 0.0f) {
        const int32_t t = draw();
        if (allows(t)) return std::optional<sampled>(report(logits, t, summary));
        return std::optional<sampled>();
    }
    // The best tokens in greedy's order (logit descending, the lowest id on ties): the first one
    // allowed is greedy's pick over the mask.
    for (uint32_t i = 0; i < tries; i++) {
        const int32_t t = pick_greedy();
        if (_work[t] == -std::numeric_limits<float>::infinity()) break;  // all offered
        if (allows(t)) return std::optional<sampled>(report(logits, t, summary));
        _work[t] = -std::numeric_limits<float>::infinity();
    }
    return std::optional<sampled>();
}

int32_t sampler::draw() {
    float max_work = _max_raw;
    double mass = _raw_mass;
    if (_penalised) {  // _exp must follow the penalised logits
        max_work = math::max_value(_work);
        math::exp_shifted(_work, max_work, 1.0f, _exp);
        mass = math::sum(_exp);
    }
    return pick_random(max_work, mass);
}

// Returns whether any logit changed.
bool sampler::apply_penalty(std::span<const int32_t> recent) {
    if (!window_penalties(_work, recent)) return false;
    for (const known_token& w : _window) _work[w.id] = w.logit;
    return true;
}

// The lowest id holding the largest penalised logit.
int32_t sampler::pick_greedy() const {
    const float best = math::max_value(_work);
    const auto it = std::find(_work.begin(), _work.end(), best);
    assert(it != _work.end());
    return static_cast<int32_t>(it - _work.begin());
}

// `max_work` is the largest penalised logit; _exp holds exp(work - max_work), summing to
// `mass`. The filters run top_k, min_p, top_p: each keeps a prefix of the same order (logit
// descending, id ascending) and min_p's test (p_i >= min_p * p_max) does not depend on
// renormalisation, so the kept set is the one of the documented order top_k, top_p, min_p,
// provided top_p measures mass over the top_k set (it does: `mass` is taken before min_p).
int32_t sampler::pick_random(float max_work, double mass) {
    const uint32_t n_vocab = static_cast<uint32_t>(_work.size());
    uint32_t n = drop_masked(keep_top_k(n_vocab));
    if (n < n_vocab) {
        mass = 0.0;
        for (uint32_t i = 0; i < n; i++) mass += _exp[_candidates[i]];
    }
    n = keep_min_p(n, max_work);
    n = keep_top_p(n, max_work, mass);
    assert(n >= 1);

    // Temperature, then one draw. The candidates are in a canonical order (by id, or by
    // logit then id), so the walk below is the same on every standard library.
    const float inv_t = 1.0f / _params.temperature;
    for (uint32_t i = 0; i < n; i++) {
        const int32_t c = _candidates[i];
        _weights[i] =
            inv_t == 1.0f ? _exp[c] : math::exp_nonpositive((_work[c] - max_work) * inv_t);
    }
    const double total = math::sum(std::span<const float>(_weights.data(), n));
    assert(total >= 1.0);  // the most likely token survives every filter with weight 1
    const double target = _rng.next_unit() * total;
    double cumulative = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        cumulative += _weights[i];
        if (target < cumulative) return _candidates[i];
    }
    return _candidates[n - 1];  // rounding left target at the very top: the last candidate
}

// Keeps the k best tokens (logit descending, ties to the lower id: a strict total order, so
// the kept set does not depend on the library) in _candidates, ordered by id.
uint32_t sampler::keep_top_k(uint32_t n_vocab) {
    const uint32_t k = static_cast<uint32_t>(_params.top_k);
    if (k == 0 || k >= n_vocab || k > top_k_heap_max) {
        std::iota(_candidates.begin(), _candidates.end(), 0);
        if (k == 0 || k >= n_vocab) return n_vocab;
        const auto better = [this](int32_t a, int32_t b) {
            return better_known(_work[a], a, _work[b], b);
        };
        std::nth_element(_candidates.begin(), _candidates.begin() + k, _candidates.end(), better);
        std::sort(_candidates.begin(), _candidates.begin() + k);
        return k;
    }
    // Small k: a min-heap of the k largest values finds the k-th largest, `threshold`; then
    // one pass takes every id above it and the lowest ids equal to it.
    _heap.clear();
    for (float v : _work) {
        if (_heap.size() < k) {
            _heap.push_back(v);
            std::push_heap(_heap.begin(), _heap.end(), std::greater<>());
        } else if (v > _heap.front()) {
            std::pop_heap(_heap.begin(), _heap.end(), std::greater<>());
            _heap.back() = v;
            std::push_heap(_heap.begin(), _heap.end(), std::greater<>());
        }
    }
    const float threshold = _heap.front();
    uint32_t above = 0;
    for (float v : _work) above += v > threshold ? 1 : 0;
    uint32_t equal_left = k - above, n = 0;
    for (uint32_t i = 0; i < n_vocab; i++) {
        const float v = _work[i];
        if (v > threshold || (v == threshold && equal_left > 0)) {
            if (v == threshold) equal_left--;
            _candidates[n++] = static_cast<int32_t>(i);
        }
    }
    assert(n == k);
    return k;
}

// Drops the candidates a mask refused (top_k keeps them when fewer than k are allowed),
// keeping the survivors' order. The best allowed token survives.
uint32_t sampler::drop_masked(uint32_t n) {
    if (!_masked) return n;
    uint32_t kept = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (_work[_candidates[i]] != -std::numeric_limits<float>::infinity()) {
            _candidates[kept++] = _candidates[i];
        }
    }
    return kept;
}

// Drops candidates less likely than min_p x the most likely (p_i / p_max = exp(l_i - l_max),
// compared in logit space, exactly), keeping the survivors' order. The most likely survives.
uint32_t sampler::keep_min_p(uint32_t n, float max_work) {
    if (_params.min_p <= 0.0f) return n;
    const double threshold = static_cast<double>(max_work) + std::log(_params.min_p);
    uint32_t kept = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (static_cast<double>(_work[_candidates[i]]) >= threshold) {
            _candidates[kept++] = _candidates[i];
        }
    }
    return kept;
}

// Keeps the shortest prefix, in (logit descending, id ascending) order, whose mass reaches
// top_p x `mass`, without sorting the vocabulary: one pass buckets the candidates by how far
// below the best logit they are and sums each bucket's mass; the buckets above the one where
// the running mass crosses the target are kept whole, and only the crossing bucket is sorted
// to find where inside it the prefix ends. The kept ids end up ordered by id, then the
// crossing bucket's in logit order: a canonical order, as the draw needs.
uint32_t sampler::keep_top_p(uint32_t n, float max_work, double mass) {
    if (_params.top_p >= 1.0f) return n;
    const double target = static_cast<double>(_params.top_p) * mass;
    const auto bucket_of = [&](int32_t id) {
        const float below = (max_work - _work[id]) * top_p_buckets_per_nat;
        return static_cast<uint32_t>(std::min(below, float{top_p_buckets - 1}));
    };
    std::array<double, top_p_buckets> bucket_mass{};
    for (uint32_t i = 0; i < n; i++) bucket_mass[bucket_of(_candidates[i])] += _exp[_candidates[i]];
    double cumulative = 0.0;
    uint32_t crossing = 0;
    while (cumulative + bucket_mass[crossing] < target) {
        cumulative += bucket_mass[crossing];
        if (++crossing == top_p_buckets) return n;  // min_p already left less than the target
    }
    uint32_t kept = 0, n_crossing = 0;
    for (uint32_t i = 0; i < n; i++) {
        const int32_t id = _candidates[i];
        const uint32_t b = bucket_of(id);
        if (b < crossing) _candidates[kept++] = id;  // kept <= i: compaction in place
        if (b == crossing) _spill[n_crossing++] = id;
    }
    const auto better = [this](int32_t a, int32_t b) {
        return better_known(_work[a], a, _work[b], b);
    };
    std::sort(_spill.begin(), _spill.begin() + n_crossing, better);
    for (uint32_t j = 0; j < n_crossing; j++) {
        _candidates[kept++] = _spill[j];
        cumulative += _exp[_spill[j]];
        if (cumulative >= target) break;
    }
    return kept;
}

// ---- the summary's path (top of sampling.hpp) --------------------------------------------

bool sampler::window_penalties(std::span<const float> logits, std::span<const int32_t> recent) {
    _window.clear();
    if (!penalties_on() || recent.empty()) return false;
    const bool repeat = _params.repeat_penalty != 1.0f;
    const size_t n = std::min<size_t>(recent.size(), _params.repeat_last_n);
    _recent.assign(recent.end() - n, recent.end());
    std::sort(_recent.begin(), _recent.end());
    // One pass over each run of equal ids: the repeat penalty once per distinct id (llama.cpp's
    // semantics), the additive ones by the run's length.
    for (size_t i = 0; i < _recent.size();) {
        const int32_t t = _recent[i];
        size_t count = 0;
        while (i < _recent.size() && _recent[i] == t) i++, count++;
        float l = logits[t];
        if (repeat) l = l > 0.0f ? l / _params.repeat_penalty : l * _params.repeat_penalty;
        l -= static_cast<float>(count) * _params.frequency_penalty + _params.presence_penalty;
        _window.push_back({l, t});
    }
    return true;
}

double sampler::penalised_mass(std::span<const float> logits, const logits_summary& s, double base,
                               float inv_t, float top) const {
    double raw = 0.0, penalised = 0.0;
    for (const known_token& w : _window) {
        raw += std::exp((static_cast<double>(logits[w.id]) - s.max) * inv_t);
        penalised += std::exp((static_cast<double>(w.logit) - s.max) * inv_t);
    }
    if (raw > window_mass_share_max * base) return 0.0;
    const double mass = (base - raw + penalised) * std::exp((double{s.max} - top) * inv_t);
    return std::isfinite(mass) && mass > 0.0 ? mass : 0.0;
}

int32_t sampler::walk_known_then_tail(std::span<const float> logits, float top, float inv_t,
                                      double total) {
    const double target = _rng.next_unit() * total;
    double cumulative = 0.0;
    for (const known_token& k : _known) {
        cumulative += math::exp_nonpositive((k.logit - top) * inv_t);
        if (target < cumulative) return k.id;
    }
    // The draw fell in the tail: the tokens the summary does not name, in id order (their
    // logits are unpenalised: the window's are all known). Without the row it is not settled.
    if (logits.empty()) return -1;
    const auto n_vocab = static_cast<uint32_t>(logits.size());
    if (_marks.size() != n_vocab) _marks.assign(n_vocab, 0);
    for (const known_token& k : _known) _marks[k.id] = 1;
    int32_t last = _known.back().id;
    for (uint32_t i = 0; i < n_vocab; i++) {
        if (_marks[i] != 0) continue;
        last = static_cast<int32_t>(i);
        cumulative += math::exp_nonpositive((logits[i] - top) * inv_t);
        if (target < cumulative) break;
    }
    for (const known_token& k : _known) _marks[k.id] = 0;
    return last;  // rounding left target at the very top: the last token
}

int32_t sampler::fast_pick(std::span<const float> logits, uint32_t n_vocab, const logits_summary& s,
                           std::span<const int32_t> recent) {
    if (s.count == 0 || s.count != std::min(summary_top, n_vocab)) return -1;
    const bool complete = s.count == n_vocab;  // no token outside the summary
    const float tau = complete ? -std::numeric_limits<float>::infinity() : s.logits[s.count - 1];

    // The known tokens: the candidates outside the penalty window, and the window's tokens with
    // their penalised logits; logit descending, id ascending.
    const bool penalised = window_penalties(logits, recent);
    _known.clear();
    for (uint32_t i = 0; i < s.count; i++) {
        if (penalised && std::binary_search(_recent.begin(), _recent.end(), s.ids[i])) continue;
        _known.push_back({s.logits[i], s.ids[i]});
    }
    if (penalised) {
        _known.insert(_known.end(), _window.begin(), _window.end());
        std::sort(_known.begin(), _known.end(), [](const known_token& a, const known_token& b) {
            return better_known(a.logit, a.id, b.logit, b.id);
        });
    }
    // The known tokens before every other token, in their final order: the candidates come
    // before every token outside the summary (whose logits are at most tau, and whose ids are
    // above the tied candidates' when equal to it: the kernel takes the lowest ids of a tie),
    // and so does a window token above tau; the first window token at or below tau ends it.
    uint32_t certain = static_cast<uint32_t>(_known.size());
    if (!complete && penalised) {
        for (uint32_t i = 0; i < certain; i++) {
            if (!(_known[i].logit > tau) &&
                std::binary_search(_recent.begin(), _recent.end(), _known[i].id)) {
                certain = i;
                break;
            }
        }
    }
    if (certain == 0) return -1;
    const float top = _known[0].logit;
    if (_params.temperature == 0.0f) return _known[0].id;

    const float inv_t = 1.0f / _params.temperature;
    const uint32_t k = static_cast<uint32_t>(_params.top_k);
    const bool top_k = k > 0 && k < n_vocab;
    if (!top_k && _params.min_p <= 0.0f && _params.top_p >= 1.0f) {
        // Plain temperature: every token is a candidate, against the tempered normaliser.
        double base = s.mass;
        if (inv_t != 1.0f) {
            if (s.temperature != _params.temperature || !(s.mass_t >= 1.0f)) return -1;
            base = s.mass_t;
        }
        const double total = penalised ? penalised_mass(logits, s, base, inv_t, top)
                                       : base * std::exp((double{s.max} - top) * inv_t);
        if (!(total > 0.0)) return -1;
        return walk_known_then_tail(logits, top, inv_t, total);
    }

    // The filters keep a prefix of the known order; it must end among the certain tokens.
    // `closed`: no token past the prefix can be kept (top_k, or a cut above tau).
    uint32_t n = top_k ? k : certain;
    if (n > certain) return -1;
    bool closed = top_k || complete;
    double mass = 0.0;  // top_p's, before min_p: over top_k's set, else the whole row
    if (_params.top_p < 1.0f) {
        if (closed) {
            for (uint32_t i = 0; i < n; i++) mass += math::exp_nonpositive(_known[i].logit - top);
        } else {
            mass = penalised ? penalised_mass(logits, s, s.mass, 1.0f, top)
                             : s.mass * std::exp(double{s.max} - top);
            if (!(mass > 0.0)) return -1;
        }
    }
    if (_params.min_p > 0.0f) {
        const double threshold = static_cast<double>(top) + std::log(_params.min_p);
        uint32_t kept = 0;
        while (kept < n && static_cast<double>(_known[kept].logit) >= threshold) kept++;
        // A certain token below the threshold, or tau itself below it, leaves every later one out.
        if (kept < n || static_cast<double>(tau) < threshold) closed = true;
        n = kept;
    }
    if (_params.top_p < 1.0f) {
        const double target = static_cast<double>(_params.top_p) * mass;
        double cumulative = 0.0;
        for (uint32_t i = 0; i < n; i++) {
            cumulative += math::exp_nonpositive(_known[i].logit - top);
            if (cumulative >= target) {
                n = i + 1;
                closed = true;
                break;
            }
        }
    }
    if (!closed) return -1;
    assert(n >= 1);  // the most likely token survives every filter
    double total = 0.0;
    for (uint32_t i = 0; i < n; i++)
        total += math::exp_nonpositive((_known[i].logit - top) * inv_t);
    const double target = _rng.next_unit() * total;
    double cumulative = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        cumulative += math::exp_nonpositive((_known[i].logit - top) * inv_t);
        if (target < cumulative) return _known[i].id;
    }
    return _known[n - 1].id;
}

// The top `logprobs` alternatives under the raw-logit softmax (log normaliser `log_z`).
void sampler::fill_top_logprobs(std::span<const float> logits, double log_z, sampled& out) const {
    // Bounded insertion into the sorted top list: O(vocab) for a peaked distribution.
    const uint32_t n_top = std::min<uint32_t>(_params.logprobs, logits.size());
    out.top_count = 0;
    for (size_t i = 0; i < logits.size() && n_top > 0; i++) {
        const float l = logits[i];
        if (out.top_count == n_top && !(l > logits[out.top[n_top - 1].token])) continue;
        uint32_t pos = std::min(out.top_count, n_top - 1);
        while (pos > 0 && l > logits[out.top[pos - 1].token]) {
            out.top[pos] = out.top[pos - 1];
            pos--;
        }
        out.top[pos].token = static_cast<int32_t>(i);
        if (out.top_count < n_top) out.top_count++;
    }
    for (uint32_t i = 0; i < out.top_count; i++) {
        out.top[i].logprob = static_cast<float>(logits[out.top[i].token] - log_z);
    }
}

}  // namespace ordo::sched
