// test_llama.cpp: checks model/llama.hpp: hyperparameters from metadata with their documented
// defaults, and the tensor mapping's shape and type checks.
//
// How: builds small Llama GGUF files in memory with gguf_writer (every tensor F32 zeros unless
// a case changes it), parses them with gguf_file::from_bytes, and asserts the hparams read, or
// the error code and that the message names the offending key or tensor. Cases: all optional
// keys absent (defaults apply), vocab sized from the token list or token_embd, tied output,
// wrong architecture, wrong key type, indivisible head counts, a tensor with a wrong shape,
// a missing tensor, and an unsupported weight type; then every required tensor in turn missing,
// mis-shaped and of an unsupported type (map_llama_weights is the one check ordo-server runs at
// start, so it must cover all of them), a matrix of the wrong rank, and every type of the GGUF
// type table: loaded when the CPU reference computes with it, refused by name otherwise.
//
// RoPE: the frequency table (llama_weights::rope_freq) folds the base, the rope_freqs.weight
// factors and linear scaling (rope.scaling.type linear + rope.scaling.factor, a factor without a
// type, the older rope.scale_linear key) into base^(-2j / n_rot) / factor_j / scale, checked
// against that formula; yarn and longrope are refused with llama_unsupported_rope naming the
// key and value; contradictory or bad keys (type none with a factor, linear without one, a
// negative factor), a rope_freqs tensor of the wrong size or type, and a factor that is NaN, 0
// or negative are each a load error naming what is wrong.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "model/gguf.hpp"
#include "model/gguf_writer.hpp"
#include "model/llama.hpp"

using namespace ordo::model;

namespace {

// The geometry of the model a case builds, plus the knobs cases turn.
struct tiny_model {
    uint32_t n_embd = 16, n_layer = 2, n_head = 4, n_head_kv = 2, n_ff = 24, n_vocab = 40;
    bool write_optional_keys = true;  // head_count_kv, context, rope dims/base, eps
    bool write_tokens = true;
    bool write_output = true;
    std::string arch = "llama";
    // Per-tensor overrides: shape and type.
    std::map<std::string, std::vector<uint64_t>> shape_override;
    std::map<std::string, ggml_type> type_override;
    std::vector<std::string> skip;
    // RoPE: dims rotated (with the optional keys), extra metadata (full key names), and the
    // rope_freqs.weight factors (F32 [size], or F16 with rope_freqs_f16) when not empty.
    uint32_t n_rot = 2;
    std::map<std::string, std::string> strings;
    std::map<std::string, float> floats;
    std::vector<float> rope_freqs;
    bool rope_freqs_f16 = false;
};

// One tensor of the model: its name and shape (ne[0] first; a norm is a vector).
struct tensor_shape {
    std::string name;
    std::vector<uint64_t> ne;
};

// Every tensor `m` writes, with the shape the forward pass needs: each is required except
// output.weight (absent: the classifier is tied to token_embd).
std::vector<tensor_shape> tensors_of(const tiny_model& m) {
    const uint32_t kv_heads = m.write_optional_keys ? m.n_head_kv : m.n_head;
    const uint64_t kv_dim = uint64_t{kv_heads} * (m.n_embd / m.n_head);
    std::vector<tensor_shape> all = {{"token_embd.weight", {m.n_embd, m.n_vocab}},
                                     {"output_norm.weight", {m.n_embd}}};
    if (m.write_output) all.push_back({"output.weight", {m.n_embd, m.n_vocab}});
    for (uint32_t il = 0; il < m.n_layer; ++il) {
        const std::string b = "blk." + std::to_string(il) + ".";
        all.push_back({b + "attn_norm.weight", {m.n_embd}});
        all.push_back({b + "attn_q.weight", {m.n_embd, m.n_embd}});
        all.push_back({b + "attn_k.weight", {m.n_embd, kv_dim}});
        all.push_back({b + "attn_v.weight", {m.n_embd, kv_dim}});
        all.push_back({b + "attn_output.weight", {m.n_embd, m.n_embd}});
        all.push_back({b + "ffn_norm.weight", {m.n_embd}});
        all.push_back({b + "ffn_gate.weight", {m.n_embd, m.n_ff}});
        all.push_back({b + "ffn_up.weight", {m.n_embd, m.n_ff}});
        all.push_back({b + "ffn_down.weight", {m.n_ff, m.n_embd}});
    }
    return all;
}

// "[16, 24]": a shape as the messages print it.
std::string shape_text(const std::vector<uint64_t>& ne) {
    std::string s = "[";
    for (size_t d = 0; d < ne.size(); ++d) s += (d ? ", " : "") + std::to_string(ne[d]);
    return s + "]";
}

void add(gguf_writer& w, const tiny_model& m, const std::string& name, std::vector<uint64_t> ne) {
    for (const auto& s : m.skip) {
        if (s == name) return;
    }
    if (auto it = m.shape_override.find(name); it != m.shape_override.end()) ne = it->second;
    ggml_type t = ggml_type::f32;
    if (auto it = m.type_override.find(name); it != m.type_override.end()) t = it->second;
    uint64_t n = 1;
    for (uint64_t d : ne) n *= d;
    std::vector<uint8_t> bytes(*bytes_for(t, n), 0);
    ASSERT_TRUE(w.add_tensor(name, t, ne, bytes).ok()) << name;
}

gguf_file build(const tiny_model& m) {
    gguf_writer w;
    w.set_string("general.architecture", m.arch);
    const std::string a = m.arch + ".";
    w.set_u32(a + "embedding_length", m.n_embd);
    w.set_u32(a + "block_count", m.n_layer);
    w.set_u32(a + "attention.head_count", m.n_head);
    w.set_u32(a + "feed_forward_length", m.n_ff);
    if (m.write_optional_keys) {
        w.set_u32(a + "attention.head_count_kv", m.n_head_kv);
        w.set_u32(a + "context_length", 128);
        w.set_u32(a + "rope.dimension_count", m.n_rot);
        w.set_f32(a + "rope.freq_base", 500000.0f);
        w.set_f32(a + "attention.layer_norm_rms_epsilon", 1e-6f);
    }
    if (m.write_tokens) {
        std::vector<std::string> tokens;
        for (uint32_t i = 0; i < m.n_vocab; ++i) tokens.push_back("t" + std::to_string(i));
        w.set_string("tokenizer.ggml.model", "llama");
        w.set_string_array("tokenizer.ggml.tokens", tokens);
    }
    for (const auto& [k, v] : m.strings) w.set_string(k, v);
    for (const auto& [k, v] : m.floats) w.set_f32(k, v);
    if (!m.rope_freqs.empty()) {
        std::vector<uint8_t> bytes(m.rope_freqs.size() * sizeof(float));
        std::memcpy(bytes.data(), m.rope_freqs.data(), bytes.size());
        ggml_type t = m.rope_freqs_f16 ? ggml_type::f16 : ggml_type::f32;
        if (m.rope_freqs_f16) bytes.resize(bytes.size() / 2);  // the values do not matter
        const std::vector<uint64_t> ne = {m.rope_freqs.size()};
        EXPECT_TRUE(w.add_tensor("rope_freqs.weight", t, ne, bytes).ok());
    }
    for (const auto& t : tensors_of(m)) add(w, m, t.name, t.ne);
    auto f = gguf_file::from_bytes(w.to_bytes());
    EXPECT_TRUE(f.ok()) << f.err().message;
    return std::move(*f);
}

void expect_error(const tiny_model& m, const std::string& code, const std::string& mention) {
    gguf_file f = build(m);
    auto w = map_llama_weights(f);
    ASSERT_FALSE(w.ok()) << "expected " << code;
    EXPECT_EQ(w.err().code, code) << w.err().message;
    EXPECT_NE(w.err().message.find(mention), std::string::npos)
        << "message '" << w.err().message << "' does not mention '" << mention << "'";
}

}  // namespace

TEST(LlamaHparams, ReadsEveryKey) {
    gguf_file f = build(tiny_model{});
    auto hp = read_llama_hparams(f);
    ASSERT_TRUE(hp.ok()) << hp.err().message;
    EXPECT_EQ(hp->n_embd, 16u);
    EXPECT_EQ(hp->n_layer, 2u);
    EXPECT_EQ(hp->n_head, 4u);
    EXPECT_EQ(hp->n_head_kv, 2u);
    EXPECT_EQ(hp->n_ff, 24u);
    EXPECT_EQ(hp->n_ctx, 128u);
    EXPECT_EQ(hp->n_vocab, 40u);
    EXPECT_EQ(hp->n_rot, 2u);
    EXPECT_EQ(hp->head_dim(), 4u);
    EXPECT_EQ(hp->kv_dim(), 8u);
    EXPECT_EQ(hp->rope_freq_base, 500000.0f);
    EXPECT_EQ(hp->rms_eps, 1e-6f);
}

TEST(LlamaHparams, DefaultsWhenOptionalKeysAbsent) {
    tiny_model m;
    m.write_optional_keys = false;
    gguf_file f = build(m);
    auto hp = read_llama_hparams(f);
    ASSERT_TRUE(hp.ok()) << hp.err().message;
    EXPECT_EQ(hp->n_head_kv, hp->n_head);       // no GQA
    EXPECT_EQ(hp->n_ctx, k_llama_default_ctx);  // 2048
    EXPECT_EQ(hp->n_rot, hp->head_dim());       // rotate whole heads
    EXPECT_EQ(hp->rope_freq_base, 10000.0f);
    EXPECT_EQ(hp->rms_eps, 1e-5f);
    EXPECT_TRUE(map_llama_weights(f).ok());  // tensors sized for n_head_kv = n_head
}

TEST(LlamaHparams, VocabFromTokenEmbdWithoutTokenizer) {
    tiny_model m;
    m.write_tokens = false;
    m.n_vocab = 33;
    gguf_file f = build(m);
    auto hp = read_llama_hparams(f);
    ASSERT_TRUE(hp.ok()) << hp.err().message;
    EXPECT_EQ(hp->n_vocab, 33u);
}

TEST(LlamaHparams, BadArchAndWrongKeyType) {
    tiny_model m;
    m.arch = "gpt2";
    gguf_file f = build(m);
    auto hp = read_llama_hparams(f);
    ASSERT_FALSE(hp.ok());
    EXPECT_EQ(hp.err().code, "llama_bad_arch");
    EXPECT_NE(hp.err().message.find("gpt2"), std::string::npos);

    gguf_writer w;
    w.set_string("general.architecture", "llama");
    w.set_string("llama.embedding_length", "sixty-four");
    auto g = gguf_file::from_bytes(w.to_bytes());
    ASSERT_TRUE(g.ok());
    hp = read_llama_hparams(*g);
    ASSERT_FALSE(hp.ok());
    EXPECT_EQ(hp.err().code, "gguf_key_wrong_type");
    EXPECT_NE(hp.err().message.find("llama.embedding_length"), std::string::npos);
}

TEST(LlamaHparams, IndivisibleHeadsRejected) {
    tiny_model m;
    m.n_head = 3;  // 16 % 3 != 0
    expect_error(m, "llama_bad_hparams", "n_head");
    tiny_model k;
    k.n_head_kv = 3;  // 4 % 3 != 0
    expect_error(k, "llama_bad_hparams", "n_head_kv");
}

TEST(LlamaWeights, MapsEveryTensorAndTiesOutput) {
    gguf_file f = build(tiny_model{});
    auto w = map_llama_weights(f);
    ASSERT_TRUE(w.ok()) << w.err().message;
    ASSERT_EQ(w->layers.size(), 2u);
    EXPECT_FALSE(w->output_tied);
    EXPECT_EQ(w->layers[1].attn_k.n_in, 16u);
    EXPECT_EQ(w->layers[1].attn_k.n_out, 8u);
    EXPECT_EQ(w->layers[1].ffn_down.n_in, 24u);
    EXPECT_EQ(w->layers[1].ffn_down.n_out, 16u);
    EXPECT_EQ(w->layers[0].attn_k.data.data(), f.find_tensor("blk.0.attn_k.weight")->data.data());

    tiny_model tied;
    tied.write_output = false;
    gguf_file g = build(tied);
    auto wt = map_llama_weights(g);
    ASSERT_TRUE(wt.ok()) << wt.err().message;
    EXPECT_TRUE(wt->output_tied);
    EXPECT_EQ(wt->output.data.data(), wt->token_embd.data.data());
    EXPECT_EQ(wt->output.n_out, 40u);
}

TEST(LlamaWeights, WrongShapeNamesTensor) {
    tiny_model m;
    m.shape_override["blk.1.attn_k.weight"] = {16, 16};  // kv_dim is 8
    expect_error(m, "llama_bad_shape", "blk.1.attn_k.weight");
    tiny_model n;
    n.shape_override["output_norm.weight"] = {16, 2};  // a norm is a vector
    expect_error(n, "llama_bad_shape", "output_norm.weight");
    tiny_model e;
    e.shape_override["token_embd.weight"] = {16, 39};  // vocab is 40
    expect_error(e, "llama_bad_shape", "[16, 39]");
}

TEST(LlamaWeights, MissingTensorNamed) {
    tiny_model m;
    m.skip = {"blk.1.ffn_up.weight"};
    expect_error(m, "llama_missing_tensor", "blk.1.ffn_up.weight");
}

TEST(LlamaWeights, UnsupportedTypeNamesTensorAndType) {
    tiny_model m;
    m.type_override["blk.0.attn_q.weight"] = ggml_type::f64;
    expect_error(m, "llama_unsupported_type", "blk.0.attn_q.weight");
    expect_error(m, "llama_unsupported_type", "f64");
}

// Every type GGUF can name that ordo does not run (IQ*, TQ*, Q8_1, Q8_K, MXFP4, the integer
// types, F64) is refused by the loader naming the tensor and the type, on a 256-wide model so
// every block size fits; and every type ordo does run loads (its bytes all zero).
TEST(LlamaWeights, EveryTypeIsLoadedOrRefusedByName) {
    size_t refused = 0;
    for (const auto& tr : k_ggml_types) {
        SCOPED_TRACE(tr.name);
        tiny_model m;
        m.n_embd = 256;
        m.n_ff = 256;
        m.type_override["blk.1.ffn_down.weight"] = tr.type;
        m.type_override["token_embd.weight"] = is_supported(tr.type) ? tr.type : ggml_type::f32;
        if (is_supported(tr.type)) {
            gguf_file f = build(m);
            auto w = map_llama_weights(f);
            ASSERT_TRUE(w.ok()) << w.err().message;
            EXPECT_EQ(w->layers[1].ffn_down.type, tr.type);
            EXPECT_EQ(w->layers[1].ffn_down.name, "blk.1.ffn_down.weight");
            EXPECT_EQ(w->token_embd.type, tr.type);
            continue;
        }
        expect_error(m, "llama_unsupported_type",
                     "tensor 'blk.1.ffn_down.weight' has type " + std::string(tr.name) +
                         ", which ordo does not run");
        ++refused;
    }
    EXPECT_EQ(refused, k_ggml_types.size() - 13);  // 13 supported types
}

// The validation covers every tensor the forward pass reads, not a sample: each one dropped,
// mis-shaped or of an uncomputable type in turn is refused, and the message names it and says
// what was expected (the server prints this line and exits 2; tests/server/test_start.cpp).
TEST(LlamaWeights, EveryRequiredTensorIsChecked) {
    const tiny_model base;
    const auto all = tensors_of(base);
    ASSERT_EQ(all.size(), 3u + 9u * base.n_layer);
    for (const auto& t : all) {
        SCOPED_TRACE(t.name);
        if (t.name != "output.weight") {  // absent output.weight means a tied classifier
            tiny_model missing;
            missing.skip = {t.name};
            expect_error(missing, "llama_missing_tensor",
                         "tensor '" + t.name + "' is missing; expected a " + shape_text(t.ne) +
                             " tensor of " + supported_type_names(" or "));
        }
        tiny_model shaped;
        std::vector<uint64_t> wrong = t.ne;
        wrong.back() += 1;
        shaped.shape_override[t.name] = wrong;
        expect_error(shaped, "llama_bad_shape",
                     "tensor '" + t.name + "' has shape " + shape_text(wrong) + ", expected " +
                         shape_text(t.ne));
        tiny_model typed;
        typed.type_override[t.name] = ggml_type::i32;
        expect_error(typed, "llama_unsupported_type",
                     "tensor '" + t.name + "' has type i32, which ordo does not run; expected " +
                         supported_type_names(" or "));
    }
}

// A matrix given as a vector (and a vector given as a matrix) is a shape error, not a crash.
TEST(LlamaWeights, WrongRankIsAShapeError) {
    tiny_model m;
    m.shape_override["blk.0.ffn_down.weight"] = {24 * 16};
    expect_error(m, "llama_bad_shape", "tensor 'blk.0.ffn_down.weight' has shape [384]");
    tiny_model n;
    n.shape_override["blk.1.attn_norm.weight"] = {16, 1};
    expect_error(n, "llama_bad_shape", "tensor 'blk.1.attn_norm.weight' has shape [16, 1]");
}

// The table folds base, per-pair factors and linear scaling (header).
TEST(LlamaRope, TableFoldsBaseFactorsAndLinearScale) {
    tiny_model m;
    m.n_rot = 4;
    m.rope_freqs = {1.0f, 8.0f};
    m.strings["llama.rope.scaling.type"] = "linear";
    m.floats["llama.rope.scaling.factor"] = 4.0f;
    gguf_file f = build(m);
    auto w = map_llama_weights(f);
    ASSERT_TRUE(w.ok()) << w.err().message;
    EXPECT_TRUE(w->rope_factors);
    EXPECT_EQ(w->hp.rope_scale_linear, 4.0f);
    ASSERT_EQ(w->rope_freq.size(), 2u);
    EXPECT_DOUBLE_EQ(w->rope_freq[0], 1.0 / 4.0);
    EXPECT_DOUBLE_EQ(w->rope_freq[1], std::pow(500000.0, -0.5) / 8.0 / 4.0);

    tiny_model plain;  // no factors, no scaling: base^(-2j / n_rot) alone
    plain.n_rot = 4;
    gguf_file g = build(plain);
    auto p = map_llama_weights(g);
    ASSERT_TRUE(p.ok()) << p.err().message;
    EXPECT_FALSE(p->rope_factors);
    EXPECT_EQ(p->hp.rope_scale_linear, 1.0f);
    EXPECT_DOUBLE_EQ(p->rope_freq[1], std::pow(500000.0, -0.5));
}

// As llama.cpp reads them: a factor without a type is linear scaling, under either key name.
TEST(LlamaRope, LinearFactorWithoutTypeAndOlderKey) {
    for (const char* key : {"llama.rope.scaling.factor", "llama.rope.scale_linear"}) {
        tiny_model m;
        m.floats[key] = 2.0f;
        gguf_file f = build(m);
        auto hp = read_llama_hparams(f);
        ASSERT_TRUE(hp.ok()) << key << ": " << hp.err().message;
        EXPECT_EQ(hp->rope_scale_linear, 2.0f) << key;
    }
}

TEST(LlamaRope, UnsupportedScalingNamesKeyAndValue) {
    for (const char* type : {"yarn", "longrope"}) {
        tiny_model m;
        m.strings["llama.rope.scaling.type"] = type;
        m.floats["llama.rope.scaling.factor"] = 4.0f;
        expect_error(m, "llama_unsupported_rope",
                     "llama.rope.scaling.type = '" + std::string(type) + "'");
    }
}

TEST(LlamaRope, BadScalingKeysAreErrors) {
    tiny_model none;  // type none contradicts a factor
    none.strings["llama.rope.scaling.type"] = "none";
    none.floats["llama.rope.scaling.factor"] = 2.0f;
    expect_error(none, "llama_bad_hparams", "llama.rope.scaling.factor");
    tiny_model bare;  // linear needs its factor
    bare.strings["llama.rope.scaling.type"] = "linear";
    expect_error(bare, "llama_bad_hparams", "llama.rope.scaling.factor is absent");
    tiny_model negative;
    negative.strings["llama.rope.scaling.type"] = "linear";
    negative.floats["llama.rope.scaling.factor"] = -2.0f;
    expect_error(negative, "llama_bad_hparams", "rope scaling factor");
}

TEST(LlamaRope, BadRopeFreqsTensorIsAnError) {
    tiny_model size;  // n_rot 2: one factor expected
    size.rope_freqs = {1.0f, 2.0f};
    expect_error(size, "llama_bad_shape", "rope_freqs.weight");
    tiny_model half;
    half.rope_freqs = {1.0f, 1.0f};  // the right shape for n_rot 4, but f16
    half.n_rot = 4;
    half.rope_freqs_f16 = true;
    expect_error(half, "llama_unsupported_type", "rope_freqs.weight");
    for (float bad : {std::nanf(""), 0.0f, -1.0f, INFINITY}) {
        tiny_model m;
        m.n_rot = 4;
        m.rope_freqs = {1.0f, bad};
        expect_error(m, "llama_bad_hparams", "rope_freqs.weight[1]");
    }
}
