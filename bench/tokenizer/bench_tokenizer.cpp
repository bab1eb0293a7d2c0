// bench_tokenizer.cpp: measures tokenizer encode and decode on long prompts (10 KB .. 1 MB) to
// show the cost grows like n log n, not n^2, for both kinds of tokenizer.
//
// Uses ../shared/models: llama-spm-vocab's 32000-token Llama-2 SentencePiece vocab (`spm`) and
// vocab/ggml-vocab-llama-bpe.gguf, Llama 3's 128256-token byte-level BPE (`bpe`); a benchmark
// whose file is absent reports it as an error. Reports bytes/s and tokens/s per input size.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <filesystem>
#include <memory>

#include "model/gguf.hpp"
#include "model/tokenizer.hpp"

using namespace ordo::model;

namespace {

enum class kind { spm, bpe };

const char* vocab_path(kind k) {
    static const std::string spm =
        std::string(ORDO_SHARED_MODELS_DIR) + "/llama-spm-vocab/ggml-vocab-llama-spm.gguf";
    static const std::string bpe =
        std::string(ORDO_SHARED_MODELS_DIR) + "/vocab/ggml-vocab-llama-bpe.gguf";
    return (k == kind::spm ? spm : bpe).c_str();
}

// Loaded once per kind (the benchmarks run on one thread).
const tokenizer* shared_tokenizer(kind k) {
    static std::unique_ptr<tokenizer> toks[2];
    auto& slot = toks[int(k)];
    if (!slot) {
        auto f = gguf_file::open(vocab_path(k));
        if (!f) return nullptr;
        auto t = tokenizer::from_gguf(*f);
        if (t) slot = std::make_unique<tokenizer>(std::move(*t));
    }
    return slot.get();
}

const tokenizer* tokenizer_or_skip(benchmark::State& state, kind k) {
    const tokenizer* tok = shared_tokenizer(k);
    if (!tok) state.SkipWithError((std::string(vocab_path(k)) + " not found").c_str());
    return tok;
}

// Mixed text: English prose, multi-byte text, digits, code and whitespace runs, repeated to the
// requested size.
std::string prompt(size_t bytes) {
    const std::string chunk =
        "Once upon a time, there was a little girl named Lily. She liked to play outside in "
        "the sun with her dog Max. \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E caf\xC3\xA9 "
        "\xF0\x9F\x98\x80 1234567890.\n"
        "    for (int i = 0; i < n; ++i) { sum += x[i] * 2; }  // don't panic!\n\n";
    std::string s;
    while (s.size() < bytes) s += chunk;
    s.resize(bytes);
    return s;
}

void bm_encode(benchmark::State& state, kind k, bool same_char) {
    const tokenizer* tok = tokenizer_or_skip(state, k);
    if (!tok) return;
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

void bm_decode(benchmark::State& state, kind k) {
    const tokenizer* tok = tokenizer_or_skip(state, k);
    if (!tok) return;
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

#define ORDO_SIZES RangeMultiplier(10)->Range(10'000, 1'000'000)->Unit(benchmark::kMillisecond)
BENCHMARK_CAPTURE(bm_encode, spm_mixed, kind::spm, false)->ORDO_SIZES;
BENCHMARK_CAPTURE(bm_encode, bpe_mixed, kind::bpe, false)->ORDO_SIZES;
BENCHMARK_CAPTURE(bm_encode, spm_one_char, kind::spm, true)->ORDO_SIZES;
BENCHMARK_CAPTURE(bm_encode, bpe_one_char, kind::bpe, true)->ORDO_SIZES;
BENCHMARK_CAPTURE(bm_decode, spm, kind::spm)->ORDO_SIZES;
BENCHMARK_CAPTURE(bm_decode, bpe, kind::bpe)->ORDO_SIZES;

BENCHMARK_MAIN();
