// test_synth.cpp: checks the synthetic model generator (model/synth.hpp) and `ordo-model mk`.
//
// How: runs the real `ordo-model mk` binary (ORDO_MODEL_TOOL) for every weight type and reads
// the result back with gguf_file / read_llama_hparams, asserting geometry, every tensor's type
// and shape, and the tied variant; checks that the same seed writes identical bytes and another
// seed different ones; that bad arguments exit non-zero with a message naming the problem; that
// the byte vocab is well formed and round-trips text through the llama tokenizer; and that the
// reference forward pass on the Q8_0 and Q4_0 models of a seed agrees with the F32 model of the
// same seed (same random values, quantized) within the tolerances stated in the test.
//
// RoPE options: llama3_rope_factors reproduces the rope_freqs.weight values llama.cpp's
// convert_hf_to_gguf.py wrote into ../shared's llama3-tiny (listed in its README, and the file's
// own tensor, bit for bit, where ../shared is present); `mk --rope-base --rope-llama3
// --rope-linear` writes a model whose RoPE table is base^(-2j / n_rot) / factor_j / scale; the
// reference's logits of a model with rope_freqs differ from those of the same model (same seed,
// same weights) without it, by far more than float rounding, at later positions and not at
// position 0 (where every rotation is the identity), and likewise with linear scaling.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <span>
#include <string>

#include "model/gguf.hpp"
#include "model/llama.hpp"
#include "model/reference.hpp"
#include "model/synth.hpp"
#include "model/tokenizer.hpp"
#include "tests/support/shared_models.hpp"

using namespace ordo::model;
namespace fs = std::filesystem;

namespace {

class SynthTest : public ::testing::Test {
public:
    void SetUp() override {
        dir = fs::temp_directory_path() /
              ("ordo_test_synth_" + std::to_string(::getpid()) + "_" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::create_directories(dir);
    }
    void TearDown() override { fs::remove_all(dir); }

    // Runs `ordo-model mk ARGS --out dir/name`; returns the exit status and keeps stderr.
    int mk(const std::string& name, const std::string& args) {
        const std::string err = (dir / (name + ".stderr")).string();
        const std::string cmd = std::string(ORDO_MODEL_TOOL) + " mk --out " +
                                (dir / name).string() + " " + args + " > /dev/null 2> " + err;
        const int rc = std::system(cmd.c_str());
        std::ifstream f(err);
        last_stderr.assign(std::istreambuf_iterator<char>(f), {});
        return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    }
    std::string path(const std::string& name) const { return (dir / name).string(); }

    fs::path dir;
    std::string last_stderr;
};

const char* k_small = "--n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 --n-ff 96 --n-vocab 300";

std::string read_all(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace

TEST_F(SynthTest, MkRoundTripsEveryType) {
    for (const auto& tr : k_ggml_types) {
        if (!is_supported(tr.type)) continue;
        const std::string type(tr.name);
        SCOPED_TRACE(type);
        // The K types need rows that are whole 256-element super-blocks.
        const bool k = tr.block_size == 256;
        const uint32_t n_embd = k ? 256 : 64, n_ff = k ? 512 : 96;
        const std::string shape = "--n-embd " + std::to_string(n_embd) +
                                  " --n-layer 2 --n-head 4 --n-head-kv 2 --n-ff " +
                                  std::to_string(n_ff) + " --n-vocab 300";
        const std::string name = "m_" + type + ".gguf";
        ASSERT_EQ(mk(name, shape + " --type " + type + " --seed 5 --ctx 256"), 0) << last_stderr;
        auto f = gguf_file::open(path(name));
        ASSERT_TRUE(f.ok()) << f.err().message;
        auto hp = read_llama_hparams(*f);
        ASSERT_TRUE(hp.ok()) << hp.err().message;
        EXPECT_EQ(hp->n_embd, n_embd);
        EXPECT_EQ(hp->n_layer, 2u);
        EXPECT_EQ(hp->n_head, 4u);
        EXPECT_EQ(hp->n_head_kv, 2u);
        EXPECT_EQ(hp->n_ff, n_ff);
        EXPECT_EQ(hp->n_vocab, 300u);
        EXPECT_EQ(hp->n_ctx, 256u);
        EXPECT_EQ(hp->n_rot, n_embd / 4);
        ASSERT_EQ(f->tensors().size(), 3u + 2u * 9u);
        for (const auto& t : f->tensors()) {
            const bool is_norm = t.name.find("norm") != std::string::npos;
            EXPECT_EQ(t.type, is_norm ? ggml_type::f32 : tr.type) << t.name;
            EXPECT_EQ(t.n_dims, is_norm ? 1u : 2u) << t.name;
        }
        EXPECT_EQ(f->find_tensor("blk.1.attn_v.weight")->ne[1], n_embd / 2);  // kv_dim
        EXPECT_EQ(f->find_tensor("blk.0.ffn_down.weight")->ne[0], n_ff);
        EXPECT_EQ(f->find_tensor("output.weight")->ne[1], 300u);
        auto w = map_llama_weights(*f);
        ASSERT_TRUE(w.ok()) << w.err().message;  // every shape is what the loader expects
        EXPECT_FALSE(w->output_tied);
    }
}

TEST_F(SynthTest, TiedHasNoOutputTensor) {
    ASSERT_EQ(mk("tied.gguf", std::string(k_small) + " --type q8_0 --seed 1 --tied"), 0)
        << last_stderr;
    auto f = gguf_file::open(path("tied.gguf"));
    ASSERT_TRUE(f.ok()) << f.err().message;
    EXPECT_EQ(f->find_tensor("output.weight"), nullptr);
    auto w = map_llama_weights(*f);
    ASSERT_TRUE(w.ok()) << w.err().message;
    EXPECT_TRUE(w->output_tied);
}

TEST_F(SynthTest, SameSeedSameBytesOtherSeedDiffers) {
    const std::string a = std::string(k_small) + " --type q4_0 --seed 9";
    ASSERT_EQ(mk("a.gguf", a), 0) << last_stderr;
    ASSERT_EQ(mk("b.gguf", a), 0) << last_stderr;
    ASSERT_EQ(mk("c.gguf", std::string(k_small) + " --type q4_0 --seed 10"), 0) << last_stderr;
    const std::string ba = read_all(path("a.gguf"));
    EXPECT_FALSE(ba.empty());
    EXPECT_EQ(ba, read_all(path("b.gguf")));
    const std::string bc = read_all(path("c.gguf"));
    EXPECT_EQ(ba.size(), bc.size());
    EXPECT_NE(ba, bc);
}

TEST_F(SynthTest, BadArgumentsAreClearErrors) {
    struct bad_case {
        std::string args;
        int rc;
        std::string mention;
    };
    const bad_case cases[] = {
        {"--n-embd 60 --n-layer 1 --n-head 8 --n-ff 64 --n-vocab 300 --type f32 --seed 1", 1,
         "not divisible by n_head"},
        {"--n-embd 64 --n-layer 1 --n-head 8 --n-head-kv 3 --n-ff 64 --n-vocab 300 --type f32 "
         "--seed 1",
         1, "n_head_kv"},
        {"--n-embd 48 --n-layer 1 --n-head 4 --n-ff 64 --n-vocab 300 --type q4_0 --seed 1", 1,
         "tensor token_embd.weight has rows of 48 elements (n_embd), which is not a multiple "
         "of q4_0's block of 32"},
        {"--n-embd 64 --n-layer 1 --n-head 4 --n-ff 64 --n-vocab 300 --type q6_k --seed 1", 1,
         "tensor token_embd.weight has rows of 64 elements (n_embd), which is not a multiple "
         "of q6_k's block of 256"},
        {"--n-embd 256 --n-layer 1 --n-head 4 --n-ff 320 --n-vocab 300 --type Q4_K --seed 1", 1,
         "tensor blk.0.ffn_down.weight has rows of 320 elements (n_ff), which is not a "
         "multiple of q4_k's block of 256"},
        {"--n-embd 64 --n-layer 1 --n-head 4 --n-ff 64 --n-vocab 300 --type iq2_xxs --seed 1", 2,
         "--type 'iq2_xxs' is not one of f32, f16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, "
         "q4_k, q5_k, q6_k, bf16"},
        {"--n-embd 64 --n-layer 1 --n-head 4 --n-ff 64 --n-vocab 300 --type q9_9 --seed 1", 2,
         "q9_9"},
        {"--n-embd 64 --n-layer 1 --n-head 4 --n-ff 64 --n-vocab 100 --type f32 --seed 1", 1,
         "n_vocab 100"},
        {"--n-embd 64 --n-layer 1 --n-head 4 --n-ff 64 --type f32 --seed 1", 1,
         "--n-vocab and --vocab-from"},
        {"--n-embd 64 --n-layer 1 --n-head 4 --n-ff 64 --n-vocab 300 --seed 1", 2, "--type"},
        {"--n-embd 64 --n-layer 0 --n-head 4 --n-ff 64 --n-vocab 300 --type f32 --seed 1", 1,
         "n_layer 0"},
        {"--n-embd 64 --n-layer 1 --n-head 4 --n-ff 64 --vocab-from /nonexistent.gguf "
         "--type f32 --seed 1",
         1, "/nonexistent.gguf"},
        {"--n-embd 64 --n-layer 1 --n-head 4 --n-ff 64 --n-vocab 300 --type f32 --seed 1 "
         "--rope-linear -2",
         2, "--rope-linear must be a finite number > 0"},
        {"--n-embd 64 --n-layer 1 --n-head 4 --n-ff 64 --n-vocab 300 --type f32 --seed 1 "
         "--rope-llama3 0",
         2, "--rope-llama3 must be a finite number > 0"},
        {"--n-embd 64 --n-layer 1 --n-head 4 --n-ff 64 --n-vocab 300 --type f32 --seed 1 "
         "--rope-base nan",
         2, "--rope-base"},
    };
    for (const auto& c : cases) {
        SCOPED_TRACE(c.args);
        EXPECT_EQ(mk("bad.gguf", c.args), c.rc);
        EXPECT_NE(last_stderr.find(c.mention), std::string::npos) << last_stderr;
        EXPECT_FALSE(fs::exists(path("bad.gguf")));
    }
}

TEST(SynthVocab, ByteVocabIsWellFormed) {
    const synth_vocab v = make_byte_vocab(1000);
    ASSERT_EQ(v.pieces.size(), 1000u);
    ASSERT_EQ(v.scores.size(), 1000u);
    ASSERT_EQ(v.types.size(), 1000u);
    EXPECT_EQ(v.pieces[0], "<unk>");
    EXPECT_EQ(v.pieces[1], "<s>");
    EXPECT_EQ(v.pieces[2], "</s>");
    EXPECT_EQ(v.pieces[3], "<0x00>");
    EXPECT_EQ(v.pieces[3 + 0xAB], "<0xAB>");
    EXPECT_EQ(v.types[0], static_cast<int32_t>(token_type::unknown));
    EXPECT_EQ(v.types[1], static_cast<int32_t>(token_type::control));
    EXPECT_EQ(v.types[3 + 200], static_cast<int32_t>(token_type::byte));
    EXPECT_EQ(v.types[999], static_cast<int32_t>(token_type::normal));
    EXPECT_EQ(std::set<std::string>(v.pieces.begin(), v.pieces.end()).size(), 1000u);
    EXPECT_LT(v.scores[900], v.scores[400]);  // later filler scores lower
}

TEST_F(SynthTest, ByteVocabTokenizesText) {
    ASSERT_EQ(mk("v.gguf",
                 "--n-embd 32 --n-layer 1 --n-head 2 --n-ff 32 --n-vocab 2000 "
                 "--type f32 --seed 3"),
              0)
        << last_stderr;
    auto f = gguf_file::open(path("v.gguf"));
    ASSERT_TRUE(f.ok());
    auto tok = tokenizer::from_gguf(*f);
    ASSERT_TRUE(tok.ok()) << tok.err().message;
    const std::string text = "hello world, caf\xc3\xa9 42!";
    const auto ids = tok->encode(text, true);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids[0], 1);                // BOS
    EXPECT_LT(ids.size(), text.size());  // merges happened: not one token per byte
    auto back = tok->decode(ids);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, text);  // é has no piece: it round-trips through byte tokens
}

// Same seed in F32 and a quantized type: the quantized models are the F32 weights quantized,
// so their logits must track the F32 logits. A random model's logits are nearly tied near the
// top (512 draws of a bell curve), so 4-bit noise flips the exact argmax often; the checks
// therefore combine an error bound with "the F32 choice stays near the top", per type:
//   - max |diff| relative to the F32 logit range, and RMS diff relative to the F32 logits'
//     standard deviation. Per weight, Q4_0's rounding noise is ~16x Q8_0's (step amax/8 vs
//     amax/127), and a random network amplifies weight noise about equally for every type, so
//     the logit error follows each type's weight error (test_quant_types.cpp measures those);
//   - the F32 argmax is in the quantized model's top 5 on at least top5_min of 16 positions,
//     and the exact argmax agrees on at least argmax_min (chance would be 1/512).
// The bounds sit above the values measured with seed 42 (printed), with headroom.
struct track_want {
    const char* type;
    double max_rel, rms_rel;
    uint32_t top5_min, argmax_min;
};

void expect_track_f32(SynthTest& t, const std::string& shape, std::span<const track_want> wants) {
    ASSERT_EQ(t.mk("f32.gguf", shape + " --type f32"), 0) << t.last_stderr;
    for (const auto& w : wants) {
        ASSERT_EQ(t.mk(std::string(w.type) + ".gguf", shape + " --type " + w.type), 0)
            << t.last_stderr;
    }
    constexpr uint32_t n_pos = 16;
    auto run = [&](const std::string& name) {
        std::vector<std::vector<float>> logits;
        auto f = gguf_file::open(t.path(name));
        EXPECT_TRUE(f.ok());
        auto m = reference_model::create(*f, 64);
        EXPECT_TRUE(m.ok()) << m.err().message;
        for (uint32_t pos = 0; pos < n_pos; ++pos) {
            const uint32_t token = (pos * 37 + 1) % 512;  // a fixed, varied token sequence
            auto l = m->forward(token, pos);
            EXPECT_TRUE(l.ok());
            logits.emplace_back(l->begin(), l->end());
        }
        return logits;
    };
    const auto ref = run("f32.gguf");
    double lo = ref[0][0], hi = ref[0][0], sum = 0.0, sum2 = 0.0, count = 0.0;
    for (const auto& row : ref) {
        for (float v : row) {
            lo = std::min<double>(lo, v);
            hi = std::max<double>(hi, v);
            sum += v;
            sum2 += double(v) * v;
            count += 1.0;
        }
    }
    const double range = hi - lo;
    const double stddev = std::sqrt(sum2 / count - (sum / count) * (sum / count));
    ASSERT_GT(range, 1.0);  // the model is not degenerate
    for (const track_want& w : wants) {
        const auto got = run(std::string(w.type) + ".gguf");
        double max_diff = 0.0, err2 = 0.0;
        uint32_t argmax_same = 0, in_top5 = 0;
        for (uint32_t p = 0; p < n_pos; ++p) {
            for (size_t i = 0; i < ref[p].size(); ++i) {
                const double d = got[p][i] - ref[p][i];
                max_diff = std::max(max_diff, std::fabs(d));
                err2 += d * d;
            }
            const size_t a = std::max_element(ref[p].begin(), ref[p].end()) - ref[p].begin();
            const size_t b = std::max_element(got[p].begin(), got[p].end()) - got[p].begin();
            argmax_same += a == b;
            // Rank of the F32 choice among the quantized logits.
            const auto higher =
                std::count_if(got[p].begin(), got[p].end(), [&](float v) { return v > got[p][a]; });
            in_top5 += higher < 5;
        }
        const double rms_rel = std::sqrt(err2 / count) / stddev;
        std::printf(
            "%s: max |diff| %.4f / range %.3f = %.2f%%; rms diff / std %.2f%%; "
            "f32 argmax in top5 %u/%u; argmax agrees %u/%u\n",
            w.type, max_diff, range, 100.0 * max_diff / range, 100.0 * rms_rel, in_top5, n_pos,
            argmax_same, n_pos);
        EXPECT_LE(max_diff / range, w.max_rel) << w.type;
        EXPECT_LE(rms_rel, w.rms_rel) << w.type;
        EXPECT_GE(in_top5, w.top5_min) << w.type;
        EXPECT_GE(argmax_same, w.argmax_min) << w.type;
        EXPECT_GT(max_diff, 0.0) << w.type << " is identical to f32: not quantized?";
    }
}

// Measured (max %, rms %, top5, argmax): q8_0 1.2 2.2 16 15, q4_0 18.5 33 13 8, f16 0.05 0.08
// 16 16, bf16 0.45 0.73 16 16, q4_1 18 32 14 10, q5_0 8.9 15.8 16 9, q5_1 8.4 15.5 16 11.
TEST_F(SynthTest, QuantizedModelsTrackF32) {
    const track_want wants[] = {
        {"q8_0", 0.03, 0.03, 15, 14},  {"q4_0", 0.30, 0.45, 11, 6}, {"f16", 0.002, 0.003, 16, 15},
        {"bf16", 0.01, 0.012, 16, 14}, {"q4_1", 0.27, 0.45, 11, 6}, {"q5_0", 0.14, 0.24, 14, 6},
        {"q5_1", 0.14, 0.24, 14, 7},
    };
    expect_track_f32(*this,
                     "--n-embd 128 --n-layer 2 --n-head 4 --n-head-kv 2 --n-ff 256 --n-vocab 512 "
                     "--seed 42",
                     wants);
}

// The K types need 256-wide rows: a model twice as wide. Measured: q2_k 68 112 2 1, q3_k 32 57
// 10 7, q4_k 19 31 14 7, q5_k 9.9 14.8 16 12, q6_k 4.9 8.1 16 13. Q2_K's four levels leave the
// logits only loosely correlated with F32's (uncorrelated logits of equal spread would give an
// rms diff of 141%), so its bounds only catch a broken encoder, not a slightly worse one.
TEST_F(SynthTest, KQuantModelsTrackF32) {
    const track_want wants[] = {
        {"q2_k", 0.95, 1.3, 0, 0},   {"q3_k", 0.45, 0.75, 7, 3},   {"q4_k", 0.27, 0.42, 11, 4},
        {"q5_k", 0.14, 0.21, 14, 9}, {"q6_k", 0.07, 0.11, 15, 10},
    };
    expect_track_f32(*this,
                     "--n-embd 256 --n-layer 2 --n-head 4 --n-head-kv 2 --n-ff 512 --n-vocab 512 "
                     "--seed 42",
                     wants);
}

// The Llama 3.2 parameters of ../shared's llama3-tiny (factor 32, low 1, high 4, original 8192,
// base 500000, n_rot 128) give the values its README lists and, where the file is present, its
// rope_freqs.weight exactly.
TEST(SynthRope, Llama3FactorsAreConvertHfToGgufs) {
    llama3_rope p;
    p.factor = 32.0f;
    auto f = llama3_rope_factors(128, 500000.0f, p);
    ASSERT_EQ(f.size(), 64u);
    const float middle[] = {1.2349371f, 1.6513293f, 2.2766595f, 3.2922628f, 5.171597f, 9.666731f};
    for (size_t j = 0; j < 64; ++j) {
        float want = j < 29 ? 1.0f : j < 35 ? middle[j - 29] : 32.0f;
        EXPECT_NEAR(f[j], want, 1e-6f * want) << "pair " << j;
    }
    const std::string file = std::string(ORDO_SHARED_MODELS_DIR) + "/quant/llama3-tiny-Q4_K_M.gguf";
    ORDO_REQUIRE_SHARED(file);  // the README's values were checked above either way
    auto g = gguf_file::open(file);
    ASSERT_TRUE(g.ok()) << g.err().message;
    const gguf_tensor_info* t = g->find_tensor("rope_freqs.weight");
    ASSERT_NE(t, nullptr);
    ASSERT_EQ(t->data.size(), 64 * sizeof(float));
    std::vector<float> stored(64);
    std::memcpy(stored.data(), t->data.data(), t->data.size());
    EXPECT_EQ(stored, f);
}

TEST_F(SynthTest, MkWritesRopeFactorsAndLinearScaling) {
    ASSERT_EQ(mk("rope.gguf", std::string(k_small) + " --type f32 --seed 3 --rope-base 500000 "
                                                     "--rope-llama3 8 --rope-linear 2"),
              0)
        << last_stderr;
    auto f = gguf_file::open(path("rope.gguf"));
    ASSERT_TRUE(f.ok()) << f.err().message;
    auto w = map_llama_weights(*f);
    ASSERT_TRUE(w.ok()) << w.err().message;
    EXPECT_TRUE(w->rope_factors);
    EXPECT_EQ(w->hp.rope_freq_base, 500000.0f);
    EXPECT_EQ(w->hp.rope_scale_linear, 2.0f);
    llama3_rope p;
    p.factor = 8.0f;
    const auto factors = llama3_rope_factors(16, 500000.0f, p);
    ASSERT_EQ(w->rope_freq.size(), 8u);
    for (size_t j = 0; j < 8; ++j) {
        const double want = std::pow(500000.0, -2.0 * j / 16) / factors[j] / 2.0;
        EXPECT_NEAR(w->rope_freq[j], want, 1e-15 * want) << "pair " << j;
    }
}

namespace {

// The reference's logits after each of `n` fixed tokens.
std::vector<std::vector<float>> logits_of(const std::string& file, uint32_t n) {
    auto f = gguf_file::open(file);
    EXPECT_TRUE(f.ok()) << (f.ok() ? "" : f.err().message);
    auto m = reference_model::create(*f, n);
    EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.err().message);
    std::vector<std::vector<float>> out;
    if (!m.ok()) return out;
    for (uint32_t pos = 0; pos < n; ++pos) {
        auto l = m->forward(3 + (pos * 37) % 250, pos);
        EXPECT_TRUE(l.ok());
        if (!l.ok()) return out;
        out.emplace_back(l->begin(), l->end());
    }
    return out;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double d = 0.0;
    for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(double(a[i]) - b[i]));
    return d;
}

}  // namespace

// Llama 3 heads (head_dim 128, base 500000): the factors divide pairs 29..63's frequencies, which
// turn slowly, so their effect grows with the position; 64 positions show it clearly.
TEST_F(SynthTest, RopeFactorsAndLinearScalingChangeTheLogits) {
    const std::string shape =
        "--n-embd 256 --n-layer 2 --n-head 2 --n-head-kv 1 --n-ff 256 "
        "--n-vocab 300 --type f32 --seed 5 --ctx 4096 --rope-base 500000";
    ASSERT_EQ(mk("plain.gguf", shape), 0) << last_stderr;
    ASSERT_EQ(mk("llama3.gguf", shape + " --rope-llama3 32"), 0) << last_stderr;
    ASSERT_EQ(mk("linear.gguf", shape + " --rope-linear 4"), 0) << last_stderr;
    const uint32_t n = 64;
    auto plain = logits_of(path("plain.gguf"), n);
    auto llama3 = logits_of(path("llama3.gguf"), n);
    auto linear = logits_of(path("linear.gguf"), n);
    ASSERT_EQ(plain.size(), n);
    ASSERT_EQ(llama3.size(), n);
    ASSERT_EQ(linear.size(), n);
    // Position 0: no rotation at all, so the same weights give the same logits.
    EXPECT_EQ(plain[0], llama3[0]);
    EXPECT_EQ(plain[0], linear[0]);
    const double d_factors = max_diff(plain[n - 1], llama3[n - 1]);
    const double d_linear = max_diff(plain[n - 1], linear[n - 1]);
    std::printf("max |logit diff| at position %u: rope_freqs %.4g, linear x4 %.4g\n", n - 1,
                d_factors, d_linear);
    EXPECT_GT(d_factors, 1e-3);
    EXPECT_GT(d_linear, 1e-3);
}
