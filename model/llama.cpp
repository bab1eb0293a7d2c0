// llama.cpp: Llama hyperparameters and tensor mapping (see llama.hpp for the keys and defaults).
// Every check here runs before any computation, so the reference and the gpu upload may assert
// shapes instead of checking them.
#include "model/llama.hpp"

#include <cassert>
#include <cmath>

namespace ordo::model {

namespace {

error bad_hparams(const std::string& what) {
    return make_error("llama_bad_hparams", "bad Llama hyperparameters: " + what);
}

// The arch-prefixed key ("llama.embedding_length").
std::string key(const llama_hparams& hp, const char* suffix) {
    return hp.arch + "." + suffix;
}

// Reads the vocab size: the tokenizer's token list when present, else token_embd's row count.
result<uint32_t> read_n_vocab(const gguf_file& file) {
    if (file.has("tokenizer.ggml.tokens")) {
        auto arr = file.get_array("tokenizer.ggml.tokens");
        if (!arr) return arr.err();
        const size_t n = (*arr)->items.size();
        if (n == 0 || n > k_llama_n_vocab_max) {
            return bad_hparams("tokenizer.ggml.tokens has " + std::to_string(n) + " tokens");
        }
        return static_cast<uint32_t>(n);
    }
    const gguf_tensor_info* embd = file.find_tensor("token_embd.weight");
    if (!embd) {
        return make_error("llama_missing_tensor",
                          "no tokenizer.ggml.tokens and no token_embd.weight to size the vocab");
    }
    if (embd->ne[1] == 0 || embd->ne[1] > k_llama_n_vocab_max) {
        return bad_hparams("token_embd.weight has " + std::to_string(embd->ne[1]) + " rows");
    }
    return static_cast<uint32_t>(embd->ne[1]);
}

}  // namespace

status validate_llama_hparams(const llama_hparams& hp) {
    struct bounded {
        const char* name;
        uint32_t value;
        uint32_t max;
    };
    const bounded dims[] = {
        {"n_embd", hp.n_embd, k_llama_n_embd_max}, {"n_layer", hp.n_layer, k_llama_n_layer_max},
        {"n_head", hp.n_head, k_llama_n_head_max}, {"n_head_kv", hp.n_head_kv, k_llama_n_head_max},
        {"n_ff", hp.n_ff, k_llama_n_ff_max},       {"n_vocab", hp.n_vocab, k_llama_n_vocab_max},
        {"n_ctx", hp.n_ctx, k_llama_n_ctx_max},
    };
    for (const auto& d : dims) {
        if (d.value < 1 || d.value > d.max) {
            return bad_hparams(std::string(d.name) + " " + std::to_string(d.value) +
                               " is outside 1.." + std::to_string(d.max));
        }
    }
    if (hp.n_embd % hp.n_head != 0) {
        return bad_hparams("n_embd " + std::to_string(hp.n_embd) + " is not divisible by n_head " +
                           std::to_string(hp.n_head));
    }
    if (hp.n_head % hp.n_head_kv != 0) {
        return bad_hparams("n_head " + std::to_string(hp.n_head) +
                           " is not divisible by n_head_kv " + std::to_string(hp.n_head_kv));
    }
    if (hp.n_rot == 0 || hp.n_rot % 2 != 0 || hp.n_rot > hp.head_dim()) {
        return bad_hparams("rope dimension count " + std::to_string(hp.n_rot) +
                           " must be even and in 2.." + std::to_string(hp.head_dim()));
    }
    if (!(hp.rms_eps > 0.0f) || !std::isfinite(hp.rms_eps)) {
        return bad_hparams("rms epsilon " + std::to_string(hp.rms_eps));
    }
    if (!(hp.rope_freq_base > 0.0f) || !std::isfinite(hp.rope_freq_base)) {
        return bad_hparams("rope freq base " + std::to_string(hp.rope_freq_base));
    }
    if (!(hp.rope_scale_linear > 0.0f) || !std::isfinite(hp.rope_scale_linear)) {
        return bad_hparams("rope scaling factor " + std::to_string(hp.rope_scale_linear));
    }
    return {};
}

namespace {

// The RoPE scaling keys: rope.scaling.type (none | linear) and the linear factor. As llama.cpp
// reads them: a factor (rope.scaling.factor, or the older rope.scale_linear) without a type is
// linear scaling; 0 means none. Another type (yarn, longrope, ...) changes the rotation in ways
// ordo does not implement: refused, naming the key and its value, rather than run as plain RoPE.
result<float> read_rope_scaling(const gguf_file& file, const llama_hparams& hp) {
    const std::string type_key = key(hp, "rope.scaling.type");
    std::string factor_key = key(hp, "rope.scaling.factor");
    if (!file.has(factor_key)) factor_key = key(hp, "rope.scale_linear");
    auto factor = file.get_f32_or(factor_key, 0.0f);
    if (!factor) return factor.err();
    const bool has_factor = file.has(factor_key) && *factor != 0.0f && *factor != 1.0f;
    auto type = file.get_string_or(type_key, has_factor ? "linear" : "none");
    if (!type) return type.err();
    if (*type != "none" && *type != "linear") {
        return make_error("llama_unsupported_rope",
                          type_key + " = '" + *type +
                              "' is not implemented (ordo runs none and linear RoPE scaling, and "
                              "Llama 3.1 frequency factors from rope_freqs.weight)");
    }
    if (*type == "none") {
        if (has_factor) {
            return bad_hparams(type_key + " is 'none' but " + factor_key + " is " +
                               std::to_string(*factor));
        }
        return 1.0f;
    }
    if (!file.has(factor_key)) {
        return bad_hparams(type_key + " is 'linear' but " + key(hp, "rope.scaling.factor") +
                           " is absent");
    }
    return *factor == 0.0f ? 1.0f : *factor;
}

}  // namespace

result<llama_hparams> read_llama_hparams(const gguf_file& file) {
    llama_hparams hp;
    auto arch = file.get_string("general.architecture");
    if (!arch) return make_error("llama_bad_arch", arch.err().message);
    if (*arch != "llama") {
        return make_error("llama_bad_arch",
                          "general.architecture is '" + *arch + "'; only 'llama' is supported");
    }
    hp.arch = *arch;
    // Required dims.
    auto n_embd = file.get_u32(key(hp, "embedding_length"));
    if (!n_embd) return n_embd.err();
    auto n_layer = file.get_u32(key(hp, "block_count"));
    if (!n_layer) return n_layer.err();
    auto n_head = file.get_u32(key(hp, "attention.head_count"));
    if (!n_head) return n_head.err();
    auto n_ff = file.get_u32(key(hp, "feed_forward_length"));
    if (!n_ff) return n_ff.err();
    hp.n_embd = *n_embd;
    hp.n_layer = *n_layer;
    hp.n_head = *n_head;
    hp.n_ff = *n_ff;
    if (hp.n_head == 0 || hp.n_embd % hp.n_head != 0) {
        return bad_hparams("n_embd " + std::to_string(hp.n_embd) + " is not divisible by n_head " +
                           std::to_string(hp.n_head));
    }
    // Defaults for what older converters leave out.
    auto n_head_kv = file.get_u32_or(key(hp, "attention.head_count_kv"), hp.n_head);
    if (!n_head_kv) return n_head_kv.err();
    auto n_ctx = file.get_u32_or(key(hp, "context_length"), k_llama_default_ctx);
    if (!n_ctx) return n_ctx.err();
    auto n_rot = file.get_u32_or(key(hp, "rope.dimension_count"), hp.n_embd / hp.n_head);
    if (!n_rot) return n_rot.err();
    auto base = file.get_f32_or(key(hp, "rope.freq_base"), k_llama_default_rope_freq_base);
    if (!base) return base.err();
    auto eps =
        file.get_f32_or(key(hp, "attention.layer_norm_rms_epsilon"), k_llama_default_rms_eps);
    if (!eps) return eps.err();
    auto n_vocab = read_n_vocab(file);
    if (!n_vocab) return n_vocab.err();
    auto pooling_type = file.get_u32_or(key(hp, "pooling_type"), 0);
    if (!pooling_type) return pooling_type.err();
    hp.embedding_pooling = pooling_from_gguf(*pooling_type);
    auto scale = read_rope_scaling(file, hp);
    if (!scale) return scale.err();
    hp.rope_scale_linear = *scale;
    hp.n_head_kv = *n_head_kv;
    hp.n_ctx = *n_ctx;
    hp.n_rot = *n_rot;
    hp.rope_freq_base = *base;
    hp.rms_eps = *eps;
    hp.n_vocab = *n_vocab;
    if (auto st = validate_llama_hparams(hp); !st) return st.err();
    return hp;
}

std::string format_shape(const gguf_tensor_info& t) {
    std::string s = "[";
    for (uint32_t d = 0; d < t.n_dims; ++d) {
        if (d) s += ", ";
        s += std::to_string(t.ne[d]);
    }
    return s + "]";
}

namespace {

// The weight types map_tensor accepts (is_supported), for messages: "f32, f16, ... or q6_k".
const std::string& supported_weight_types() {
    static const std::string names = supported_type_names(" or ");
    return names;
}

// Finds `name` and checks it is computable and has exactly the shape {ne0} or {ne0, ne1}. Each
// error names the tensor and what was expected of it (the caller adds the file's path).
result<matrix_view> map_tensor(const gguf_file& file, const std::string& name, uint64_t ne0,
                               uint64_t ne1, bool is_vector) {
    const std::string want = is_vector
                                 ? "[" + std::to_string(ne0) + "]"
                                 : "[" + std::to_string(ne0) + ", " + std::to_string(ne1) + "]";
    const gguf_tensor_info* t = file.find_tensor(name);
    if (!t) {
        return make_error("llama_missing_tensor", "tensor '" + name + "' is missing; expected a " +
                                                      want + " tensor of " +
                                                      supported_weight_types());
    }
    if (!is_supported(t->type)) {
        return make_error("llama_unsupported_type",
                          "tensor '" + name + "' has type " + std::string(type_name(t->type)) +
                              ", which ordo does not run; expected " + supported_weight_types());
    }
    const uint32_t want_dims = is_vector ? 1 : 2;
    const bool shape_ok =
        t->n_dims == want_dims && t->ne[0] == ne0 && (is_vector || t->ne[1] == ne1);
    if (!shape_ok) {
        return make_error("llama_bad_shape", "tensor '" + name + "' has shape " + format_shape(*t) +
                                                 ", expected " + want);
    }
    return matrix_view{t->type, t->data, static_cast<size_t>(ne0), static_cast<size_t>(ne1),
                       t->name};
}

// Maps one block's nine tensors.
result<llama_layer> map_layer(const gguf_file& file, const llama_hparams& hp, uint32_t il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    llama_layer l;
    struct entry {
        matrix_view* dst;
        const char* name;
        uint64_t ne0, ne1;
        bool is_vector;
    };
    const entry entries[] = {
        {&l.attn_norm, "attn_norm", hp.n_embd, 1, true},
        {&l.attn_q, "attn_q", hp.n_embd, hp.n_embd, false},
        {&l.attn_k, "attn_k", hp.n_embd, hp.kv_dim(), false},
        {&l.attn_v, "attn_v", hp.n_embd, hp.kv_dim(), false},
        {&l.attn_output, "attn_output", hp.n_embd, hp.n_embd, false},
        {&l.ffn_norm, "ffn_norm", hp.n_embd, 1, true},
        {&l.ffn_gate, "ffn_gate", hp.n_embd, hp.n_ff, false},
        {&l.ffn_up, "ffn_up", hp.n_embd, hp.n_ff, false},
        {&l.ffn_down, "ffn_down", hp.n_ff, hp.n_embd, false},
    };
    for (const auto& e : entries) {
        auto v = map_tensor(file, p + e.name + ".weight", e.ne0, e.ne1, e.is_vector);
        if (!v) return v.err();
        *e.dst = *v;
    }
    return l;
}

// rope_freqs.weight (Llama 3.1 RoPE scaling): n_rot / 2 f32 factors, each dividing the matching
// pair's frequency; empty when the tensor is absent.
result<std::vector<float>> map_rope_freqs(const gguf_file& file, const llama_hparams& hp) {
    const char* name = "rope_freqs.weight";
    if (file.find_tensor(name) == nullptr) return std::vector<float>{};
    auto v = map_tensor(file, name, hp.n_rot / 2, 1, true);
    if (!v) return v.err();
    if (v->type != ggml_type::f32) {
        return make_error("llama_unsupported_type", "tensor '" + std::string(name) + "' has type " +
                                                        std::string(type_name(v->type)) +
                                                        "; expected f32");
    }
    std::vector<float> factors(hp.n_rot / 2);
    get_row(factors.data(), *v, 0);
    for (size_t j = 0; j < factors.size(); ++j) {
        if (!(factors[j] > 0.0f) || !std::isfinite(factors[j])) {
            return bad_hparams(std::string(name) + "[" + std::to_string(j) +
                               "] = " + std::to_string(factors[j]) +
                               ": every RoPE frequency factor must be finite and > 0");
        }
    }
    return factors;
}

}  // namespace

std::vector<double> rope_frequencies(const llama_hparams& hp, std::span<const float> factors) {
    assert(factors.empty() || factors.size() == hp.n_rot / 2);
    std::vector<double> freq(hp.n_rot / 2);
    for (size_t j = 0; j < freq.size(); ++j) {
        double f = std::pow(static_cast<double>(hp.rope_freq_base),
                            -2.0 * static_cast<double>(j) / static_cast<double>(hp.n_rot));
        if (!factors.empty()) f /= static_cast<double>(factors[j]);
        freq[j] = f / static_cast<double>(hp.rope_scale_linear);
    }
    return freq;
}

result<llama_weights> map_llama_weights(const gguf_file& file) {
    auto hp = read_llama_hparams(file);
    if (!hp) return hp.err();
    llama_weights w;
    w.hp = *hp;
    auto embd = map_tensor(file, "token_embd.weight", w.hp.n_embd, w.hp.n_vocab, false);
    if (!embd) return embd.err();
    w.token_embd = *embd;
    auto norm = map_tensor(file, "output_norm.weight", w.hp.n_embd, 1, true);
    if (!norm) return norm.err();
    w.output_norm = *norm;
    if (file.find_tensor("output.weight")) {
        auto out = map_tensor(file, "output.weight", w.hp.n_embd, w.hp.n_vocab, false);
        if (!out) return out.err();
        w.output = *out;
    } else {
        w.output = w.token_embd;  // tied classifier (llama2.c-style models)
        w.output_tied = true;
    }
    auto freqs = map_rope_freqs(file, w.hp);
    if (!freqs) return freqs.err();
    w.rope_factors = !freqs->empty();
    w.rope_freq = rope_frequencies(w.hp, *freqs);
    w.layers.reserve(w.hp.n_layer);
    for (uint32_t il = 0; il < w.hp.n_layer; ++il) {
        auto layer = map_layer(file, w.hp, il);
        if (!layer) return layer.err();
        w.layers.push_back(*layer);
    }
    return w;
}

}  // namespace ordo::model
