// bench_tokenizer.cpp: measures tokenizer encode and decode on long prompts (10 KB .. 1 MB) to
// show the cost grows like n log n, not n^2.
//
// Uses ../shared/models/llama-spm-vocab's 32000-token Llama-2 vocab (the realistic case); when
// that file is absent it says so and exits. Reports bytes/s and tokens/s per input size.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <filesystem>
#include <memory>

#include "model/gguf.hpp"
#include "model/tokenizer.hpp"

using namespace ordo::model;

namespace {

const std::string k_vocab_path =
    std::string(ORDO_SHARED_MODELS_DIR) + "/llama-spm-vocab/ggml-vocab-llama-spm.gguf";

const tokenizer* shared_tokenizer() {
    static std::unique_ptr<tokenizer> tok = [] {
        std::unique_ptr<tokenizer> out;
        auto f = gguf_file::open(k_vocab_path);
        if (!f) return out;
        auto t = tokenizer::from_gguf(*f);
        if (t) out = std::make_unique<tokenizer>(std::move(*t));
        return out;
    }();
    return tok.get();
}

// English prose with some multi-byte text and digits, repeated to the requested size.
std::string prompt(size_t bytes) {
    const std::string chunk =
        "Once upon a time, there was a little girl named Lily. She liked to play outside in "
        "the sun with her dog Max. \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E caf\xC3\xA9 "
        "\xF0\x9F\x98\x80 1234567890.\n";
    std::string s;
    while (s.size() < bytes) s += chunk;
    s.resize(bytes);
    return s;
}

void bm_encode(benchmark::State& state, bool same_char) {
    const tokenizer* tok = shared_tokenizer();
    if (!tok) {
        state.SkipWithError("llama-spm vocab not found under ../shared/models");
        return;
    }
    const size_t n = size_t(state.range(0));
    std::string text = same_char ? std::string(n, 'a') : prompt(n);
    size_t tokens = 0;
    for (auto _ : state) {
        auto ids = tok->encode(text, true);
        tokens = ids.size();
        benchmark::DoNotOptimize(ids.data());
    }
    state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(n));
    state.counters["tokens"] = double(tokens);
    state.counters["tokens_per_s"] =
        benchmark::Counter(double(tokens), benchmark::Counter::kIsIterationInvariantRate);
}

void bm_decode(benchmark::State& state) {
    const tokenizer* tok = shared_tokenizer();
    if (!tok) {
        state.SkipWithError("llama-spm vocab not found under ../shared/models");
        return;
    }
    auto ids = tok->encode(prompt(size_t(state.range(0))), true);
    for (auto _ : state) {
        auto text = tok->decode(ids);
        benchmark::DoNotOptimize(text.ok());
    }
    state.SetBytesProcessed(int64_t(state.iterations()) * state.range(0));
    state.counters["tokens_per_s"] =
        benchmark::Counter(double(ids.size()), benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK_CAPTURE(bm_encode, prose, false)->RangeMultiplier(10)->Range(10'000, 1'000'000)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bm_encode, one_char, true)->RangeMultiplier(10)->Range(10'000, 1'000'000)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(bm_decode)->RangeMultiplier(10)->Range(10'000, 1'000'000)
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
