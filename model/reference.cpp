// reference.cpp: the Llama forward pass written as the math reads (llama2.c style), plus the
// sampler and the generation loop. Shapes of every buffer are in reference.hpp.
#include "model/reference.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>

#include "actors/runtime/splitmix64.hpp"
#include "model/cpu_ops.hpp"

namespace ordo::model {

namespace {

// Decodes a norm weight (one row of n_embd) into dst.
void decode_norm(const matrix_view& v, float* dst) {
    get_row(dst, v, 0);
}

}  // namespace

result<reference_model> reference_model::create(const gguf_file& file, uint32_t n_ctx) {
    auto w = map_llama_weights(file);
    if (!w) return w.err();
    const llama_hparams& hp = w->hp;
    if (n_ctx == 0) n_ctx = std::min(hp.n_ctx, k_reference_ctx_default_max);
    if (n_ctx > hp.n_ctx) {
        return make_error("reference_bad_ctx", "requested context " + std::to_string(n_ctx) +
                                                   " exceeds the model's " +
                                                   std::to_string(hp.n_ctx));
    }
    reference_model m;
    m._w = std::move(*w);
    m._n_ctx = n_ctx;
    const size_t n_embd = hp.n_embd;
    const size_t n_layer = hp.n_layer;
    m._attn_norm.resize(n_layer * n_embd);
    m._ffn_norm.resize(n_layer * n_embd);
    m._output_norm.resize(n_embd);
    for (size_t il = 0; il < n_layer; ++il) {
        decode_norm(m._w.layers[il].attn_norm, m._attn_norm.data() + il * n_embd);
        decode_norm(m._w.layers[il].ffn_norm, m._ffn_norm.data() + il * n_embd);
    }
    decode_norm(m._w.output_norm, m._output_norm.data());
    m._x.resize(n_embd);
    m._xb.resize(n_embd);
    m._xb2.resize(n_embd);
    m._q.resize(n_embd);
    m._hb.resize(hp.n_ff);
    m._hb2.resize(hp.n_ff);
    m._att.resize(n_ctx);
    m._logits.resize(hp.n_vocab);
    m._k_cache.resize(n_layer * n_ctx * hp.kv_dim());
    m._v_cache.resize(n_layer * n_ctx * hp.kv_dim());
    return m;
}

// x += Wo · attention(RoPE(Wq·xn), KV history + RoPE(Wk·xn), Wv·xn), xn = rmsnorm(x).
void reference_model::attention_block(uint32_t il, uint32_t pos) {
    const llama_hparams& hp = _w.hp;
    const llama_layer& l = _w.layers[il];
    const size_t kv_dim = hp.kv_dim();
    rmsnorm(_xb.data(), _x.data(), _attn_norm.data() + il * hp.n_embd, hp.n_embd, hp.rms_eps);

    // q, k, v for this position; k and v go straight into the cache row for pos.
    float* k_layer = _k_cache.data() + il * _n_ctx * kv_dim;
    float* v_layer = _v_cache.data() + il * _n_ctx * kv_dim;
    float* k = k_layer + pos * kv_dim;
    float* v = v_layer + pos * kv_dim;
    matvec(_q.data(), l.attn_q, _xb.data());
    matvec(k, l.attn_k, _xb.data());
    matvec(v, l.attn_v, _xb.data());

    // Rotary position embedding on queries and keys.
    rope(_q.data(), hp.n_head, hp.head_dim(), _w.rope_freq, pos);
    rope(k, hp.n_head_kv, hp.head_dim(), _w.rope_freq, pos);

    // Grouped-query attention over positions 0..pos, then the output projection.
    const attention_shape shape{hp.n_head, hp.n_head_kv, hp.head_dim()};
    attention(_xb.data(), _q.data(), k_layer, v_layer, pos + 1, shape, _att.data());
    matvec(_xb2.data(), l.attn_output, _xb.data());

    // Residual connection.
    add_inplace(_x.data(), _xb2.data(), hp.n_embd);
}

// x += W2 · (silu(W1·xn) * (W3·xn)), xn = rmsnorm(x).
void reference_model::ffn_block(uint32_t il) {
    const llama_hparams& hp = _w.hp;
    const llama_layer& l = _w.layers[il];
    rmsnorm(_xb.data(), _x.data(), _ffn_norm.data() + il * hp.n_embd, hp.n_embd, hp.rms_eps);
    matvec(_hb.data(), l.ffn_gate, _xb.data());
    matvec(_hb2.data(), l.ffn_up, _xb.data());
    swiglu(_hb.data(), _hb.data(), _hb2.data(), hp.n_ff);
    matvec(_xb.data(), l.ffn_down, _hb.data());
    add_inplace(_x.data(), _xb.data(), hp.n_embd);
}

result<std::span<const float>> reference_model::forward(uint32_t token, uint32_t pos) {
    const llama_hparams& hp = _w.hp;
    if (token >= hp.n_vocab) {
        return make_error("reference_bad_token", "token " + std::to_string(token) +
                                                     " is outside the vocab of " +
                                                     std::to_string(hp.n_vocab));
    }
    if (pos >= _n_ctx || pos > _n_past) {
        return make_error("reference_bad_pos", "position " + std::to_string(pos) +
                                                   " is invalid: " + std::to_string(_n_past) +
                                                   " positions cached, context " +
                                                   std::to_string(_n_ctx));
    }
    _n_past = pos;  // a rewind drops the history after pos

    // Token embedding.
    get_row(_x.data(), _w.token_embd, token);

    // The transformer blocks.
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        attention_block(il, pos);
        ffn_block(il);
    }

    // Final norm and classifier.
    rmsnorm(_x.data(), _x.data(), _output_norm.data(), hp.n_embd, hp.rms_eps);
    matvec(_logits.data(), _w.output, _x.data());
    _n_past = pos + 1;
    return std::span<const float>(_logits);
}

result<std::vector<float>> embed(reference_model& model, std::span<const uint32_t> tokens,
                                 pooling p) {
    if (tokens.empty()) return make_error("reference_empty_prompt", "no tokens to embed");
    if (tokens.size() > model.n_ctx()) {
        return make_error("reference_ctx_full", std::to_string(tokens.size()) +
                                                    " tokens exceed the context of " +
                                                    std::to_string(model.n_ctx()));
    }
    const uint32_t n_embd = model.hparams().n_embd;
    model.reset();
    std::vector<double> pooled(n_embd, 0.0);
    for (uint32_t pos = 0; pos < tokens.size(); ++pos) {
        auto r = model.forward(tokens[pos], pos);
        if (!r) return r.err();
        const bool take = p == pooling::mean || (p == pooling::cls && pos == 0) ||
                          (p == pooling::last && pos + 1 == tokens.size());
        if (!take) continue;
        std::span<const float> h = model.final_hidden();
        for (uint32_t i = 0; i < n_embd; ++i) pooled[i] += h[i];
    }
    // The mean's division is folded into the normalization: a scale does not change the
    // direction.
    double norm = 0.0;
    for (double v : pooled) norm += v * v;
    norm = std::sqrt(norm);
    std::vector<float> out(n_embd, 0.0f);
    if (norm > 0.0) {
        for (uint32_t i = 0; i < n_embd; ++i) out[i] = static_cast<float>(pooled[i] / norm);
    }
    return out;
}

// ---- sampling ------------------------------------------------------------------------------

float sampler::next_uniform() {
    // splitmix64: a fixed, portable generator (std:: distributions differ across libraries).
    uint64_t z = splitmix64_next(_state);
    return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // top 24 bits -> [0, 1)
}

uint32_t sampler::sample(std::span<const float> logits) {
    assert(!logits.empty());
    if (_temperature <= 0.0f) {
        return static_cast<uint32_t>(std::max_element(logits.begin(), logits.end()) -
                                     logits.begin());
    }
    _probs.assign(logits.begin(), logits.end());
    for (float& p : _probs) p /= _temperature;
    softmax(_probs.data(), _probs.size());
    const float r = next_uniform();
    float cdf = 0.0f;
    for (size_t i = 0; i < _probs.size(); ++i) {
        cdf += _probs[i];
        if (r < cdf) return static_cast<uint32_t>(i);
    }
    return static_cast<uint32_t>(_probs.size() - 1);  // r landed in the rounding gap at the top
}

// ---- generation ----------------------------------------------------------------------------

result<std::vector<uint32_t>> generate(reference_model& model, std::span<const uint32_t> prompt,
                                       const generate_options& opt, sampler& smp,
                                       const std::function<void(uint32_t)>& on_token) {
    if (prompt.empty()) {
        return make_error("reference_empty_prompt", "generation needs at least one prompt token");
    }
    // The last generated token is never fed back, so prompt + n_predict - 1 positions are used.
    const uint64_t positions = prompt.size() + uint64_t{opt.n_predict} - 1;
    if (positions > model.n_ctx()) {
        return make_error("reference_ctx_full",
                          std::to_string(prompt.size()) + " prompt tokens + " +
                              std::to_string(opt.n_predict) + " new tokens exceed the context of " +
                              std::to_string(model.n_ctx()));
    }
    model.reset();
    std::span<const float> logits;
    for (uint32_t pos = 0; pos < prompt.size(); ++pos) {
        auto r = model.forward(prompt[pos], pos);
        if (!r) return r.err();
        logits = *r;
    }
    std::vector<uint32_t> out;
    out.reserve(opt.n_predict);
    for (uint32_t i = 0; i < opt.n_predict; ++i) {
        const uint32_t next = smp.sample(logits);
        out.push_back(next);
        if (on_token) on_token(next);
        const bool stop = std::find(opt.stop_tokens.begin(), opt.stop_tokens.end(), next) !=
                          opt.stop_tokens.end();
        if (stop || i + 1 == opt.n_predict) break;
        auto r = model.forward(next, static_cast<uint32_t>(prompt.size() + i));
        if (!r) return r.err();
        logits = *r;
    }
    return out;
}

}  // namespace ordo::model
