// llama.hpp: what a GGUF file means as a Llama-family model: hyperparameters read from metadata
// (with documented defaults) and the mapping of every weight tensor, shape-checked.
//
// Owns the interpretation of `{arch}.*` metadata keys and the `blk.N.*` tensor names. Users: the
// CPU reference (model/reference), the fingerprint, the gpu actor's weight upload, the
// `ordo-model` tool. Pure: the returned views point into the gguf_file's mapping, which must
// outlive them. Nothing is copied.
//
// Keys read ({arch} = general.architecture, which must be "llama"):
//   {arch}.embedding_length                 n_embd      required
//   {arch}.block_count                      n_layer     required
//   {arch}.attention.head_count             n_head      required
//   {arch}.feed_forward_length              n_ff        required
//   {arch}.attention.head_count_kv          n_head_kv   default n_head (no GQA)
//   {arch}.context_length                   n_ctx       default 2048 (k_llama_default_ctx)
//   {arch}.rope.dimension_count             n_rot       default head_dim (rotate whole heads)
//   {arch}.rope.freq_base                   rope base   default 10000
//   {arch}.rope.scaling.type                none | linear (others: llama_unsupported_rope);
//                                           default linear when a factor key is present
//   {arch}.rope.scaling.factor              linear scale (positions divided by it); older
//                                           files: {arch}.rope.scale_linear; default 1
//   {arch}.attention.layer_norm_rms_epsilon rms eps     default 1e-5
//   {arch}.pooling_type                     pooling     of embeddings: 1 mean, 2 cls, 3 last;
//                                           absent or another value: unset (config default)
//   tokenizer.ggml.tokens (array length)    n_vocab     else token_embd's ne1
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "actors/runtime/result.hpp"
#include "model/cpu_ops.hpp"
#include "model/gguf.hpp"
#include "model/pooling.hpp"

namespace ordo::model {

inline constexpr uint32_t k_llama_default_ctx = 2048;
inline constexpr float k_llama_default_rope_freq_base = 10000.0f;
inline constexpr float k_llama_default_rms_eps = 1e-5f;
// Sanity limits: far above any real Llama, low enough that a crafted header cannot make a
// loader allocate absurd buffers (a KV cache is n_layer * n_ctx * kv_dim floats).
inline constexpr uint32_t k_llama_n_embd_max = 65536;
inline constexpr uint32_t k_llama_n_layer_max = 1024;
inline constexpr uint32_t k_llama_n_head_max = 1024;
inline constexpr uint32_t k_llama_n_ff_max = 1u << 20;
inline constexpr uint32_t k_llama_n_vocab_max = 1u << 22;
inline constexpr uint32_t k_llama_n_ctx_max = 1u << 24;

struct llama_hparams {
    std::string arch;        // general.architecture ("llama")
    uint32_t n_embd = 0;     // model width (dim)
    uint32_t n_layer = 0;    // transformer blocks
    uint32_t n_head = 0;     // query heads
    uint32_t n_head_kv = 0;  // key/value heads (n_head % n_head_kv == 0)
    uint32_t n_ff = 0;       // SwiGLU hidden width
    uint32_t n_ctx = 0;      // trained context length (positions)
    uint32_t n_vocab = 0;    // tokens
    uint32_t n_rot = 0;      // rotated dims per head (even, <= head_dim)
    float rope_freq_base = k_llama_default_rope_freq_base;
    float rope_scale_linear = 1.0f;  // rope.scaling.factor of linear scaling; 1: none
    float rms_eps = k_llama_default_rms_eps;
    // How the file says embeddings pool (model/pooling.hpp); unset: model.embedding_pooling.
    std::optional<pooling> embedding_pooling;

    uint32_t head_dim() const { return n_embd / n_head; }
    uint32_t kv_dim() const { return n_head_kv * head_dim(); }  // width of one K or V row
};

// Reads and validates the hyperparameters. Errors: llama_bad_arch (architecture absent or not
// llama), gguf_key_missing / gguf_key_wrong_type (from the reader), llama_bad_hparams (a zero or
// absurd value, n_embd not divisible by n_head, n_head not divisible by n_head_kv, odd or too
// large n_rot, non-positive eps, freq base or scaling factor, a scaling factor with type none),
// llama_unsupported_rope (rope.scaling.type other than none or linear: yarn, longrope, ...,
// naming the key and its value).
result<llama_hparams> read_llama_hparams(const gguf_file& file);

// Checks the cross-field invariants of hparams built by hand (the synthetic generator uses it
// before writing). Same error code: llama_bad_hparams.
status validate_llama_hparams(const llama_hparams& hp);

struct llama_layer {
    matrix_view attn_norm;    // (n_embd) as one row; decoded to floats by users
    matrix_view attn_q;       // (n_embd -> n_embd)
    matrix_view attn_k;       // (n_embd -> kv_dim)
    matrix_view attn_v;       // (n_embd -> kv_dim)
    matrix_view attn_output;  // (n_embd -> n_embd)
    matrix_view ffn_norm;     // (n_embd)
    matrix_view ffn_gate;     // (n_embd -> n_ff)
    matrix_view ffn_up;       // (n_embd -> n_ff)
    matrix_view ffn_down;     // (n_ff -> n_embd)
};

struct llama_weights {
    llama_hparams hp;
    // RoPE: pair j (dims 2j, 2j+1) of a head turns by pos * rope_freq[j] radians. One table per
    // model, made at load in double precision (rope_frequencies) with the freq base, the
    // rope_freqs.weight factors and linear scaling folded in; the CPU reference and the gpu
    // runner both rotate from it, so no kernel recomputes base^(-2j / n_rot).
    std::vector<double> rope_freq;    // (n_rot / 2)
    bool rope_factors = false;        // rope_freqs.weight present (Llama 3.1 RoPE scaling)
    matrix_view token_embd;           // (n_vocab rows of n_embd)
    matrix_view output_norm;          // (n_embd)
    matrix_view output;               // (n_embd -> n_vocab); token_embd's bytes when tied
    bool output_tied = false;         // output.weight absent: the classifier reuses token_embd
    std::vector<llama_layer> layers;  // (n_layer)
};

// Reads hparams, then finds every tensor the forward pass reads ("token_embd.weight",
// "blk.N.attn_q.weight", ...), checks its dims and shape against the hparams and that its type
// is computable, and builds the RoPE table. This is the one check of a model's tensors:
// ordo-server's loader runs it at start (a model that fails it never starts the server: exit 2),
// the gpu runner's upload and the CPU reference run it again to get their views, so what passes
// at start also builds later. Cheap: the only tensor bytes read are rope_freqs.weight's n_rot / 2
// floats. Errors (each names the tensor and what was expected, not the file's path: the caller
// knows it): llama_missing_tensor (with the expected shape and types), llama_bad_shape (expected
// and actual shape), llama_unsupported_type (its type, the accepted ones; rope_freqs.weight must
// be f32), llama_bad_hparams (a rope_freqs factor that is not finite and > 0), plus
// read_llama_hparams' errors.
result<llama_weights> map_llama_weights(const gguf_file& file);

// The RoPE table (llama_weights::rope_freq): for pair j < n_rot / 2,
//   base^(-2j / n_rot) / factors[j] / rope_scale_linear
// in double precision. factors: empty (all 1) or n_rot / 2 values, each finite and > 0
// (checked by the caller).
std::vector<double> rope_frequencies(const llama_hparams& hp, std::span<const float> factors);

// "[64, 512]": a tensor shape for messages.
std::string format_shape(const gguf_tensor_info& t);

}  // namespace ordo::model
