// reference.hpp: the CPU reference forward pass of a Llama model, plus sampling and a
// generation loop.
//
// Owns the definition of "what the model outputs": every gpu kernel and the whole gpu model are
// checked against it. Users: tests, `ordo-model generate`. It exists to be read and trusted,
// not to be fast: one token at a time, single-threaded, float math (model/cpu_ops). All buffers
// are allocated once in create(); forward() allocates nothing.
//
// The weights are views into the gguf_file's mapping: the file must outlive the model.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "actors/runtime/result.hpp"
#include "model/gguf.hpp"
#include "model/llama.hpp"

namespace ordo::model {

// KV history the reference allocates when the caller does not ask for a size: the model's
// n_ctx capped here, because n_layer * n_ctx * kv_dim * 2 floats of a long-context model would
// be gigabytes for a path that only checks short sequences.
inline constexpr uint32_t k_reference_ctx_default_max = 4096;

class reference_model {
public:
    // Maps and validates the weights (map_llama_weights) and allocates the run state for
    // n_ctx positions (0: min(hp.n_ctx, k_reference_ctx_default_max); larger than hp.n_ctx is
    // an error: reference_bad_ctx).
    static result<reference_model> create(const gguf_file& file, uint32_t n_ctx = 0);

    const llama_hparams& hparams() const { return _w.hp; }
    uint32_t n_ctx() const { return _n_ctx; }
    uint32_t n_past() const { return _n_past; }  // positions held in the KV cache

    // Runs `token` at position `pos` and returns the logits for the next token (n_vocab
    // floats, valid until the next call). pos must be <= n_past (pos < n_past rewinds: the
    // history after pos is dropped) and < n_ctx. Errors: reference_bad_token,
    // reference_bad_pos.
    result<std::span<const float>> forward(uint32_t token, uint32_t pos);
    // The final hidden state of the last forward(): the residual stream after the output norm,
    // the vector the classifier multiplies (n_embd floats, valid until the next call).
    std::span<const float> final_hidden() const { return _x; }

    void reset() { _n_past = 0; }

private:
    reference_model() = default;
    void attention_block(uint32_t il, uint32_t pos);
    void ffn_block(uint32_t il);

    llama_weights _w;  // views into the file
    uint32_t _n_ctx = 0;
    uint32_t _n_past = 0;

    // Norm weights decoded to floats once (they may be stored as any supported type).
    std::vector<float> _attn_norm;    // (n_layer, n_embd)
    std::vector<float> _ffn_norm;     // (n_layer, n_embd)
    std::vector<float> _output_norm;  // (n_embd)

    // Run state, reused by every forward().
    std::vector<float> _x;        // (n_embd) residual stream
    std::vector<float> _xb;       // (n_embd) normed input / attention output
    std::vector<float> _xb2;      // (n_embd) projection output
    std::vector<float> _q;        // (n_embd) query, n_head x head_dim
    std::vector<float> _hb;       // (n_ff) gate, then swiglu output
    std::vector<float> _hb2;      // (n_ff) up
    std::vector<float> _att;      // (n_ctx) attention scores of one head
    std::vector<float> _logits;   // (n_vocab)
    std::vector<float> _k_cache;  // (n_layer, n_ctx, kv_dim)
    std::vector<float> _v_cache;  // (n_layer, n_ctx, kv_dim)
};

// Picks the next token from logits. temperature 0 is greedy (argmax, lowest id on ties);
// otherwise softmax(logits / temperature) sampled with a seeded splitmix64 generator, so a
// (seed, logits) sequence gives the same tokens on every machine.
class sampler {
public:
    sampler(float temperature, uint64_t seed) : _temperature(temperature), _state(seed) {}
    uint32_t sample(std::span<const float> logits);

private:
    float next_uniform();  // [0, 1)

    float _temperature;
    uint64_t _state;
    std::vector<float> _probs;  // scratch, sized on first use
};

// The embedding of `tokens` (run from position 0, after reset): their final hidden states
// pooled by `p` (model/pooling.hpp), then L2-normalized; what /v1/embeddings and the `embed`
// op answer, computed the reference way. Accumulates in double. Errors:
// reference_empty_prompt, reference_ctx_full (more tokens than n_ctx), plus forward()'s.
result<std::vector<float>> embed(reference_model& model, std::span<const uint32_t> tokens,
                                 pooling p);

struct generate_options {
    uint32_t n_predict = 0;             // new tokens to produce at most
    std::vector<uint32_t> stop_tokens;  // generation ends after emitting one of these
};

// Feeds `prompt` from position 0 (after reset) and samples up to n_predict tokens, calling
// on_token for each one as it is produced (streaming). Returns the generated ids (stop token
// included when hit). Errors: reference_empty_prompt, reference_ctx_full (prompt + n_predict
// exceeds n_ctx), plus forward()'s.
result<std::vector<uint32_t>> generate(reference_model& model, std::span<const uint32_t> prompt,
                                       const generate_options& opt, sampler& smp,
                                       const std::function<void(uint32_t)>& on_token = {});

}  // namespace ordo::model
