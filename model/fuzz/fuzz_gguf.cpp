// fuzz_gguf.cpp: libFuzzer entry point for the GGUF reader.
//
// Parses arbitrary bytes with gguf_file::from_bytes; when they parse, walks everything a loader
// would touch (every metadata value through the typed getters and the formatter, every tensor's
// byte span end to end, the first row of every tensor of a type ordo decodes through
// model/quant's decoders, whatever bytes its blocks hold) and builds the vocab/tokenizer from
// it, encoding and decoding a short text. ASan/UBSan turn any out-of-bounds read or overflow into a
// crash. Assertions check that accepted files keep the reader's promises (spans inside the file,
// alignment respected).
#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "model/gguf.hpp"
#include "model/quant.hpp"
#include "model/tokenizer.hpp"

using namespace ordo::model;

namespace {

// Elements of a row the walk decodes at most: enough for several K super-blocks.
constexpr uint64_t k_row_elements_max = 4096;

void check_invariant(bool ok) {
    if (!ok) std::abort();  // a promise broken: report as a crash with the input saved
}

void walk(const gguf_file& f) {
    const uint8_t* begin = f.bytes().data();
    const uint8_t* end = begin + f.bytes().size();
    check_invariant(f.alignment() != 0 && (f.alignment() & (f.alignment() - 1)) == 0);
    for (const auto& kv : f.metadata()) {
        (void)format_value(kv.value, 4);
        (void)f.get_u32(kv.key);
        (void)f.get_i64(kv.key);
        (void)f.get_f32(kv.key);
        (void)f.get_string_array(kv.key);
        (void)f.get_i32_array(kv.key);
        (void)f.get_f32_array(kv.key);
    }
    uint64_t sum = 0;
    for (const auto& t : f.tensors()) {
        check_invariant(t.data.data() >= begin && t.data.data() + t.data.size() <= end);
        check_invariant(t.offset % f.alignment() == 0);
        check_invariant(t.n_dims >= 1 && t.n_dims <= k_gguf_max_dims);
        if (!t.data.empty()) sum += t.data.front() + t.data.back();
    }
    (void)sum;
    // Decode the first row (capped) of every tensor ordo computes with: NaN/Inf scales and any
    // quant bits must decode without a crash or an out-of-bounds read.
    std::vector<float> row;
    for (const auto& t : f.tensors()) {
        if (!is_supported(t.type)) continue;
        const size_t n = static_cast<size_t>(std::min<uint64_t>(t.ne[0], k_row_elements_max));
        const size_t whole = n - n % block_size(t.type);
        if (whole == 0) continue;
        row.resize(whole);
        check_invariant(row_bytes(t.type, whole) <= t.data.size());
        check_invariant(dequantize_row(t.type, t.data.data(), row.data(), whole).ok());
    }
    (void)f.require_supported_types();
    auto tok = tokenizer::from_gguf(f);
    if (!tok) return;
    auto ids = tok->encode("Hello w\xC3\xB6rld  \xF0\x9F\x98\x80!", true);
    auto text = tok->decode(ids);
    check_invariant(text.ok());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    auto f = gguf_file::from_bytes(std::span<const uint8_t>(data, size));
    if (f) walk(*f);
    return 0;
}
