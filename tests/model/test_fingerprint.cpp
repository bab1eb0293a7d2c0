// test_fingerprint.cpp: checks model/fingerprint.hpp.
//
// How: writes a small synthetic model (write_synth_model), fingerprints two independent loads
// of it (equal), then changes exactly one thing at a time and requires a different fingerprint:
// one byte of one weight (patched in a copy of the file bytes), a dimension (n_ff), the seed, a
// hyperparameter that exists only in metadata (rope freq base). Metadata outside the documented
// coverage (general.name) must not change it. Also checks the hex form round trip, that the
// digest sees trailing zero bytes and single-bit flips anywhere in a buffer, and stability of
// stories260K across two loads when the shared models are present.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <vector>

#include "model/fingerprint.hpp"
#include "model/gguf.hpp"
#include "model/gguf_writer.hpp"
#include "model/synth.hpp"
#include "tests/support/shared_models.hpp"

using namespace ordo::model;
namespace fs = std::filesystem;

namespace {

synth_options small_options() {
    synth_options o;
    o.n_embd = 64;
    o.n_layer = 2;
    o.n_head = 4;
    o.n_head_kv = 2;
    o.n_ff = 96;
    o.n_vocab = 300;
    o.type = ggml_type::q8_0;
    o.seed = 11;
    return o;
}

class FingerprintTest : public ::testing::Test {
protected:
    void SetUp() override {
        dir = fs::temp_directory_path() /
              ("ordo_test_fp_" + std::to_string(::getpid()) + "_" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::create_directories(dir);
    }
    void TearDown() override { fs::remove_all(dir); }

    fingerprint of(const synth_options& o, const std::string& name) {
        const std::string p = (dir / name).string();
        const auto st = write_synth_model(o, p);
        EXPECT_TRUE(st.ok()) << st.err().message;
        auto f = gguf_file::open(p);
        EXPECT_TRUE(f.ok());
        auto fp = model_fingerprint(*f);
        EXPECT_TRUE(fp.ok()) << fp.err().message;
        return *fp;
    }
    std::vector<uint8_t> bytes_of(const std::string& name) {
        std::ifstream f(dir / name, std::ios::binary);
        return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
    }

    fs::path dir;
};

}  // namespace

TEST_F(FingerprintTest, StableAcrossLoads) {
    const fingerprint a = of(small_options(), "a.gguf");
    auto f = gguf_file::open((dir / "a.gguf").string());
    ASSERT_TRUE(f.ok());
    auto b = model_fingerprint(*f);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(a, *b);
    EXPECT_EQ(a.hex().size(), 32u);
    // A second file written from the same options is the same model.
    EXPECT_EQ(a, of(small_options(), "again.gguf"));
}

TEST_F(FingerprintTest, OneWeightByteChangesIt) {
    const fingerprint a = of(small_options(), "a.gguf");
    std::vector<uint8_t> bytes = bytes_of("a.gguf");
    auto f = gguf_file::from_bytes(bytes);
    ASSERT_TRUE(f.ok());
    const gguf_tensor_info* t = f->find_tensor("blk.1.ffn_up.weight");
    ASSERT_NE(t, nullptr);
    const size_t at = static_cast<size_t>(f->data_offset() + t->offset + t->n_bytes / 2);
    bytes[at] ^= 0x01;
    auto g = gguf_file::from_bytes(bytes);
    ASSERT_TRUE(g.ok());
    auto b = model_fingerprint(*g);
    ASSERT_TRUE(b.ok());
    EXPECT_NE(a, *b);
    bytes[at] ^= 0x01;  // and back: equal again
    auto h = gguf_file::from_bytes(bytes);
    ASSERT_TRUE(h.ok());
    EXPECT_EQ(a, *model_fingerprint(*h));
}

TEST_F(FingerprintTest, DimsSeedAndHparamsChangeIt) {
    const fingerprint base = of(small_options(), "base.gguf");
    synth_options o = small_options();
    o.n_ff = 128;
    EXPECT_NE(base, of(o, "ff.gguf"));
    o = small_options();
    o.seed = 12;
    EXPECT_NE(base, of(o, "seed.gguf"));
    o = small_options();
    o.type = ggml_type::q4_0;
    EXPECT_NE(base, of(o, "type.gguf"));

    auto f = gguf_file::open((dir / "base.gguf").string());
    ASSERT_TRUE(f.ok());
    auto hp = read_llama_hparams(*f);
    ASSERT_TRUE(hp.ok());
    EXPECT_EQ(base, model_fingerprint(*f, *hp));
    llama_hparams other = *hp;
    other.rope_freq_base = 500000.0f;
    EXPECT_NE(base, model_fingerprint(*f, other));
}

TEST(Fingerprint, UncoveredMetadataDoesNotChangeIt) {
    // Two tiny files equal except for general.name.
    auto build = [](const std::string& name) {
        gguf_writer w;
        w.set_string("general.architecture", "llama");
        w.set_string("general.name", name);
        w.set_u32("llama.embedding_length", 8);
        w.set_u32("llama.block_count", 1);
        w.set_u32("llama.attention.head_count", 2);
        w.set_u32("llama.feed_forward_length", 8);
        const std::vector<uint64_t> ne{8, 4};
        std::vector<uint8_t> data(8 * 4 * 4, 7);
        EXPECT_TRUE(w.add_tensor("token_embd.weight", ggml_type::f32, ne, data).ok());
        auto f = gguf_file::from_bytes(w.to_bytes());
        EXPECT_TRUE(f.ok());
        auto fp = model_fingerprint(*f);
        EXPECT_TRUE(fp.ok()) << fp.err().message;
        return *fp;
    };
    EXPECT_EQ(build("one"), build("another name"));
}

TEST(Fingerprint, HexRoundTrip) {
    fingerprint f{0x0123456789abcdefull, 0xfedcba9876543210ull};
    EXPECT_EQ(f.hex(), "0123456789abcdeffedcba9876543210");
    auto back = fingerprint::from_hex(f.hex());
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, f);
    EXPECT_FALSE(fingerprint::from_hex("0123").ok());
    auto bad = fingerprint::from_hex("0123456789abcdeffedcba987654321g");
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.err().code, "fingerprint_bad_hex");
}

TEST(Fingerprint, DigestSeesEveryBitAndLength) {
    std::vector<uint8_t> buf(1000, 0);
    std::set<std::pair<uint64_t, uint64_t>> seen;
    const fingerprint zero = hash_bytes(buf);
    seen.insert({zero.hi, zero.lo});
    // Flip one bit at a spread of positions, including the stripe tail and the last byte.
    for (size_t pos : {0u, 7u, 8u, 31u, 32u, 500u, 991u, 992u, 995u, 999u}) {
        buf[pos] ^= 0x80;
        const fingerprint f = hash_bytes(buf);
        EXPECT_TRUE(seen.insert({f.hi, f.lo}).second) << "collision at byte " << pos;
        buf[pos] ^= 0x80;
    }
    // Zero-padding of the tail must not make lengths collide.
    for (size_t n : {0u, 1u, 2u, 9u, 33u}) {
        const fingerprint f = hash_bytes(std::span(buf.data(), n));
        EXPECT_TRUE(seen.insert({f.hi, f.lo}).second) << "collision at length " << n;
    }
    EXPECT_EQ(hash_bytes(buf), zero);  // deterministic
}

TEST(Fingerprint, Stories260KStableAcrossLoads) {
    const std::string p = std::string(ORDO_SHARED_MODELS_DIR) + "/stories260K.gguf";
    ORDO_REQUIRE_SHARED(p);
    auto a = gguf_file::open(p);
    auto b = gguf_file::open(p);
    ASSERT_TRUE(a.ok() && b.ok());
    auto fa = model_fingerprint(*a);
    auto fb = model_fingerprint(*b);
    ASSERT_TRUE(fa.ok() && fb.ok());
    EXPECT_EQ(*fa, *fb);
}
