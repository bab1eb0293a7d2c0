// ordo-bench-sampling: what one sampled token costs the scheduler's thread, per parameter set,
// over a 128256-entry vocabulary (Llama 3's). The logits are a seeded, peaked synthetic
// distribution (a few strong candidates over a normal background), the shape a trained model's
// next-token logits have; the numbers are per row, so a 64-sequence step costs 64 of them.
// Each parameter set runs twice: over the whole row (`full`), and given the row's summary as a
// GPU step delivers it (`summary`: summarize() here, once, outside the timing; the kernel's cost
// is the GPU's), which reads only what the summary cannot settle.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "scheduler/sampling.hpp"

namespace {

constexpr uint32_t n_vocab = 128256;

std::vector<float> peaked_logits(uint32_t seed) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> background(0.0f, 2.0f);
    std::vector<float> logits(n_vocab);
    for (float& l : logits) l = background(gen);
    std::uniform_int_distribution<uint32_t> pick(0, n_vocab - 1);
    for (int i = 0; i < 8; i++) logits[pick(gen)] = 14.0f - static_cast<float>(i);
    return logits;
}

void run(benchmark::State& state, ordo::sched::sampling_params p, bool with_summary) {
    const std::vector<float> logits = peaked_logits(7);
    const auto summary = ordo::sched::summarize(logits, p.temperature);
    std::vector<int32_t> recent(256);
    for (size_t i = 0; i < recent.size(); i++) recent[i] = static_cast<int32_t>(i * 97 % n_vocab);
    auto s = ordo::sched::sampler::create(p);
    if (!s) {
        state.SkipWithError("sampler refused the parameters");
        return;
    }
    for (auto _ : state) {
        auto out = s->sample(logits, recent, {}, with_summary ? &summary : nullptr);
        benchmark::DoNotOptimize(out);
    }
    state.counters["settled"] =
        benchmark::Counter(double(s->summary_draws()), benchmark::Counter::kAvgIterations);
}

ordo::sched::sampling_params params(float temperature, int32_t top_k, float top_p,
                                    uint32_t logprobs = 0, float repeat_penalty = 1.0f) {
    ordo::sched::sampling_params p;
    p.temperature = temperature;
    p.top_k = top_k;
    p.top_p = top_p;
    p.logprobs = logprobs;
    p.repeat_penalty = repeat_penalty;
    return p;
}

}  // namespace

BENCHMARK_CAPTURE(run, greedy_full, params(0.0f, 0, 1.0f), false);
BENCHMARK_CAPTURE(run, greedy_summary, params(0.0f, 0, 1.0f), true);
BENCHMARK_CAPTURE(run, temperature_1_top_k_40_full, params(1.0f, 40, 1.0f), false);
BENCHMARK_CAPTURE(run, temperature_1_top_k_40_summary, params(1.0f, 40, 1.0f), true);
BENCHMARK_CAPTURE(run, temperature_0_7_full, params(0.7f, 0, 1.0f), false);
BENCHMARK_CAPTURE(run, temperature_0_7_summary, params(0.7f, 0, 1.0f), true);
BENCHMARK_CAPTURE(run, top_p_0_9_full, params(0.8f, 0, 0.9f), false);
BENCHMARK_CAPTURE(run, top_p_0_9_summary, params(0.8f, 0, 0.9f), true);
BENCHMARK_CAPTURE(run, llama_cpp_defaults_full, params(0.8f, 40, 0.95f, 0, 1.1f), false);
BENCHMARK_CAPTURE(run, llama_cpp_defaults_summary, params(0.8f, 40, 0.95f, 0, 1.1f), true);
BENCHMARK_CAPTURE(run, greedy_logprobs_5_full, params(0.0f, 0, 1.0f, 5), false);
BENCHMARK_CAPTURE(run, greedy_logprobs_5_summary, params(0.0f, 0, 1.0f, 5), true);

BENCHMARK_MAIN();
