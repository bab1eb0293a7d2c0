// synth.hpp: the synthetic Llama model generator behind `ordo-model mk`.
//
// Owns the recipe for deterministic random models of any shape and weight type. Users:
// `ordo-model mk`, tests that need a model of a given geometry or type, benchmarks. Writes a
// GGUF v3 file whose header is encoded by model/gguf_writer; tensor data is generated and
// written one row at a time (never the whole model in memory), so a 110M-parameter model is
// written in seconds.
//
// Weights: every value of tensor T depends only on (seed, T's name, element index), never on the
// weight type, so the models of one seed in every type (F32, F16, BF16, Q8_0, Q4_K, ...) are the
// same model quantized differently (by model/quant's quantizers). Matrices are normal-ish
// (Irwin-Hall sum of four uniforms) with std 1/sqrt(n_in), so a matvec keeps activations near unit
// scale through any depth; norm weights are exactly 1. Norms are always F32; every other tensor
// (embedding and output included) has the chosen type.
//
// Vocab: copied from another GGUF (every `tokenizer.*` key), or the plain byte vocab: `<unk>`,
// `<s>`, `</s>`, the 256 byte tokens `<0x00>`..`<0xFF>`, then filler pieces ("▁", printable
// ASCII, then letter strings a..z, aa.. each alone and with a leading "▁") up to n_vocab, scored
// so shorter pieces come first and typed like a SentencePiece vocab (unknown, control, byte,
// normal), so the llama tokenizer encodes any text with it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "actors/runtime/result.hpp"
#include "model/ggml_types.hpp"

namespace ordo::model {

inline constexpr uint32_t k_synth_byte_vocab_min = 3 + 256;  // specials + byte tokens

struct synth_options {
    uint32_t n_embd = 0;
    uint32_t n_layer = 0;
    uint32_t n_head = 0;
    uint32_t n_head_kv = 0;  // 0: same as n_head
    uint32_t n_ff = 0;
    uint32_t n_vocab = 0;  // byte vocab size; 0 when vocab_from is set
    uint32_t n_ctx = 2048;
    ggml_type type = ggml_type::f32;
    uint64_t seed = 0;
    bool tied = false;       // no output.weight: the classifier reuses token_embd
    std::string vocab_from;  // GGUF to copy tokenizer.* from; empty: byte vocab
    // RoPE: llama.rope.freq_base; rope_llama3_factor > 0 writes rope_freqs.weight made by
    // llama3_rope_factors with that factor (Llama 3.1: 8, 3.2: 32); rope_linear > 0 writes
    // rope.scaling.type = linear and rope.scaling.factor = rope_linear.
    float rope_freq_base = 10000.0f;
    float rope_llama3_factor = 0.0f;
    float rope_linear = 0.0f;
};

// Llama 3.1 RoPE scaling ("rope_type": "llama3" in a Hugging Face config).
struct llama3_rope {
    float factor = 8.0f;
    float low_freq_factor = 1.0f;
    float high_freq_factor = 4.0f;
    uint32_t original_context = 8192;
};

// The rope_freqs.weight factors llama.cpp's convert_hf_to_gguf.py writes for it (n_rot / 2
// values, computed in float32 as it does): 1 for wavelengths below original_context /
// high_freq_factor, `factor` above original_context / low_freq_factor, a smooth blend between.
std::vector<float> llama3_rope_factors(uint32_t n_rot, float freq_base, const llama3_rope& p);

// Checks the options before anything is written. Errors (code synth_bad_options): a zero or
// absurd dim, n_embd not divisible by n_head, n_head not divisible by n_head_kv, a type the
// CPU reference does not compute with (is_supported), n_embd or n_ff not a multiple of the
// type's block size (32, or 256 for the K types; the message names a tensor whose rows are not),
// n_vocab below k_synth_byte_vocab_min for the byte vocab, both or neither of n_vocab and
// vocab_from, a RoPE base or factor that is not finite and > 0.
status validate_synth_options(const synth_options& opt);

// The plain byte vocab's pieces, scores and token types (exposed for tests).
struct synth_vocab {
    std::vector<std::string> pieces;
    std::vector<float> scores;
    std::vector<int32_t> types;  // tokenizer.ggml.token_type values
};
synth_vocab make_byte_vocab(uint32_t n_vocab);

// Deterministic weight values of tensor `name`: elements [first, first + n) (row-major over the
// whole tensor), std `scale`. Counter-based (splitmix64 of the element index), so any slice can be
// produced on its own and the result never depends on how the tensor is sliced.
void synth_values(uint64_t seed, const std::string& name, float scale, uint64_t first, float* out,
                  size_t n);

// Validates, then writes the model to `path` atomically (temporary file, fsync, rename).
// Errors: synth_bad_options, the vocab GGUF's open/parse errors, synth_io.
status write_synth_model(const synth_options& opt, const std::string& path);

}  // namespace ordo::model
