// test_tokenizer_bpe.cpp: checks the byte-level BPE tokenizer ("gpt2" vocabularies), special
// tokens and the end-of-generation set.
//
// How: (1) encodes every llama.cpp test vector of ../shared/models/vocab/ for llama-bpe,
// deepseek-llm, deepseek-coder, gpt-2 and qwen2 (no BOS, special tokens not parsed, as the
// vectors were made) and compares ids exactly, then decodes them back to the input text;
// (2) tokenizes llama3-tiny's golden prompts (llama.cpp's prompt_token_ids, with BOS and
// parse_special as the golden says); (3) checks `<|eot_id|>` is one control token only with
// parse_special, that decoding hides control tokens unless asked, and the Llama 3 EOG set;
// (4) an unknown pre-tokenizer is tokenizer_unsupported naming it; (5) a 1 MB word and a
// pre-tokenizer whose match limit is exhausted still encode and round-trip.
// Tests that need the shared models skip with a message when that folder is absent.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "model/bpe.hpp"
#include "model/gguf.hpp"
#include "model/tokenizer.hpp"
#include "tests/support/shared_models.hpp"
#include "tests/support/vocab_vectors.hpp"

using namespace ordo::model;

namespace {

const std::string k_models = ORDO_SHARED_MODELS_DIR;
std::string vocab_path(const std::string& name) {
    return k_models + "/vocab/ggml-vocab-" + name + ".gguf";
}

const tokenizer& cached_tokenizer(const std::string& path) {
    // Loading a 150k-token vocab with its merges takes a moment: once per file per process.
    static std::map<std::string, std::unique_ptr<tokenizer>> cache;
    auto& slot = cache[path];
    if (!slot) {
        auto f = gguf_file::open(path);
        EXPECT_TRUE(f.ok()) << (f.ok() ? "" : f.err().message);
        auto v = vocab::from_gguf(*f);
        EXPECT_TRUE(v.ok()) << (v.ok() ? "" : v.err().message);
        slot = std::make_unique<tokenizer>(std::move(*v));
    }
    return *slot;
}

class BpeVectors : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(BpeVectors, EncodeMatchesLlamaCppAndRoundTrips) {
    const std::string path = vocab_path(GetParam());
    ORDO_REQUIRE_SHARED(path);
    const tokenizer& tok = cached_tokenizer(path);
    ASSERT_TRUE(tok.support().ok()) << tok.support().err().message;
    auto cases = ordo::test::read_vocab_cases(path);
    ASSERT_EQ(cases.size(), 46u);
    int passed = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
        auto ids = tok.encode(cases[i].text, false);
        EXPECT_EQ(ids, cases[i].ids)
            << GetParam() << " case " << i << ": '" << cases[i].text << "'";
        passed += ids == cases[i].ids;
        auto text = tok.decode(ids);
        ASSERT_TRUE(text.ok());
        EXPECT_EQ(*text, cases[i].text) << GetParam() << " round trip of case " << i;
    }
    std::printf("%s: %d/%zu vectors\n", GetParam().c_str(), passed, cases.size());
}

INSTANTIATE_TEST_SUITE_P(Vocabs, BpeVectors,
                         ::testing::Values("llama-bpe", "deepseek-llm", "deepseek-coder", "gpt-2",
                                           "qwen2"),
                         [](const auto& info) {
                             std::string n = info.param;
                             for (char& c : n) c = c == '-' ? '_' : c;
                             return n;
                         });

TEST(TokenizerBpe, Llama3TinyGoldenPrompts) {
    const std::string golden = k_models + "/quant/llama3-tiny.golden.json";
    const std::string model = k_models + "/quant/llama3-tiny-Q4_K_M.gguf";
    ORDO_REQUIRE_SHARED(golden);
    ORDO_REQUIRE_SHARED(model);
    auto f = gguf_file::open(model);
    ASSERT_TRUE(f.ok());
    auto tok = tokenizer::from_gguf(*f);
    ASSERT_TRUE(tok.ok()) << tok.err().message;
    auto j = nlohmann::json::parse(ordo::test::read_file_bytes(golden));
    size_t checked = 0;
    for (const auto& m : j["models"]) {
        for (const auto& c : m["cases"]) {
            std::string prompt = c["prompt"];
            auto want = c["prompt_token_ids"].get<std::vector<token_id>>();
            auto got =
                tok->encode(prompt, c["add_special"].get<bool>(), c["parse_special"].get<bool>());
            EXPECT_EQ(got, want) << "prompt '" << prompt << "'";
            ++checked;
        }
    }
    EXPECT_GE(checked, 3u);
}

TEST(TokenizerBpe, SpecialTokensParsedOnlyWhenAsked) {
    const std::string path = vocab_path("llama-bpe");
    ORDO_REQUIRE_SHARED(path);
    const tokenizer& tok = cached_tokenizer(path);
    const vocab& v = tok.vocab();
    token_id eot = v.find("<|eot_id|>");
    ASSERT_EQ(eot, 128009);
    ASSERT_EQ(v.type(eot), token_type::control);

    auto parsed = tok.encode("hi<|eot_id|>there", false, true);
    ASSERT_EQ(parsed.size(), 3u);
    EXPECT_EQ(parsed[1], eot);
    auto plain = tok.encode("hi<|eot_id|>there", false, false);
    EXPECT_GT(plain.size(), 3u);
    EXPECT_EQ(std::count(plain.begin(), plain.end(), eot), 0);
    // Longest match: "<|eot_id|><|eom_id|>" is two specials, and a prefix alone is text.
    token_id header = v.find("<|start_header_id|>");
    ASSERT_NE(header, k_no_token);
    EXPECT_EQ(tok.encode("<|eot_id|><|start_header_id|>", false, true),
              (std::vector<token_id>{eot, header}));
    EXPECT_EQ(tok.encode("<|eot_id", false, true), tok.encode("<|eot_id", false, false));

    // BOS: llama-bpe adds it by default.
    EXPECT_TRUE(v.add_bos());
    EXPECT_EQ(tok.encode("hi", true).front(), v.bos());

    // Decode hides control tokens unless asked; both ways the text around them is kept.
    EXPECT_EQ(*tok.decode(parsed), "hithere");
    EXPECT_EQ(*tok.decode(parsed, true), "hi<|eot_id|>there");
    EXPECT_EQ(*tok.decode(plain), "hi<|eot_id|>there");
}

TEST(TokenizerBpe, EndOfGenerationSet) {
    // llama3-tiny carries the Llama 3.2 vocabulary (with <|eom_id|>, which 3.0's lacks).
    const std::string path = k_models + "/quant/llama3-tiny-Q4_K_M.gguf";
    ORDO_REQUIRE_SHARED(path);
    const vocab& v = cached_tokenizer(path).vocab();
    std::vector<token_id> want;
    for (const char* text : {"<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"}) {
        token_id id = v.find(text);
        ASSERT_NE(id, k_no_token) << text;
        want.push_back(id);
    }
    if (v.eos() != k_no_token && std::count(want.begin(), want.end(), v.eos()) == 0) {
        want.push_back(v.eos());
    }
    std::sort(want.begin(), want.end());
    EXPECT_EQ(v.eog(), want);
    EXPECT_TRUE(v.is_eog(v.find("<|eot_id|>")));
    EXPECT_FALSE(v.is_eog(v.bos()));
    EXPECT_FALSE(v.is_eog(v.find("<|start_header_id|>")));
    EXPECT_FALSE(v.is_eog(v.find("hello")));
}

TEST(TokenizerBpe, BosDefaultsPerPreTokenizer) {
    for (const char* name : {"gpt-2", "qwen2", "deepseek-llm", "deepseek-coder"}) {
        const std::string path = vocab_path(name);
        ORDO_REQUIRE_SHARED(path);
        auto f = gguf_file::open(path);
        ASSERT_TRUE(f.ok());
        if (f->has("tokenizer.ggml.add_bos_token")) continue;  // the file decides
        bool deepseek = std::string(name).starts_with("deepseek");
        EXPECT_EQ(cached_tokenizer(path).vocab().add_bos(), deepseek) << name;
    }
}

namespace {

// A byte-level vocab of the 256 byte characters and a few merges, with pre-tokenizer `pre`.
vocab tiny_bpe_vocab(const std::string& pre) {
    vocab_spec s;
    s.model = "gpt2";
    s.pre = pre;
    for (int b = 0; b < 256; ++b) s.pieces.emplace_back(byte_to_piece_char(uint8_t(b)));
    for (const char* p : {"ab", "abc",
                          "\xC4\xA0"
                          "a"})
        s.pieces.emplace_back(p);  // "Ġa": " a"
    s.merges = {"a b", "ab c", "\xC4\xA0 a"};
    s.bos = s.eos = s.unk = k_no_token;
    auto v = vocab::from_spec(std::move(s));
    EXPECT_TRUE(v.ok());
    return std::move(*v);
}

}  // namespace

TEST(TokenizerBpe, UnknownPreTokenizerIsUnsupportedNamingIt) {
    tokenizer tok(tiny_bpe_vocab("no-such-pre"));
    ASSERT_FALSE(tok.support().ok());
    EXPECT_EQ(tok.support().err().code, "tokenizer_unsupported");
    EXPECT_NE(tok.support().err().message.find("no-such-pre"), std::string::npos);
    EXPECT_TRUE(tokenizer(tiny_bpe_vocab("gpt-2")).support().ok());
}

TEST(TokenizerBpe, MergesByRank) {
    tokenizer tok(tiny_bpe_vocab("gpt-2"));
    const vocab& v = tok.vocab();
    EXPECT_EQ(tok.encode("abc", false), (std::vector<token_id>{v.find("abc")}));
    EXPECT_EQ(tok.encode("abd", false), (std::vector<token_id>{v.find("ab"), v.find("d")}));
    // " ab" is one word (gpt-2 pre-tokenizer); "a b" (rank 0) merges before "Ġ a" (rank 2)
    // although "Ġ a" is further left, and then "Ġ" + "ab" has no merge.
    token_id space = v.find("\xC4\xA0");
    EXPECT_EQ(tok.encode("x ab", false), (std::vector<token_id>{v.find("x"), space, v.find("ab")}));
    EXPECT_EQ(tok.encode("x a", false), (std::vector<token_id>{v.find("x"), v.find("\xC4\xA0"
                                                                                   "a")}));
}

TEST(TokenizerBpe, OneMegabyteWordEncodesAndRoundTrips) {
    tokenizer tok(tiny_bpe_vocab("llama-bpe"));
    std::string text;
    while (text.size() < (1u << 20)) text += "abcabd";
    auto ids = tok.encode(text, false);
    EXPECT_EQ(ids.size(), text.size() / 6 * 3);  // "abc" + "ab" + "d" per 6 bytes
    EXPECT_EQ(*tok.decode(ids), text);
}

TEST(TokenizerBpe, MatchLimitEndsPreTokenizationGracefully) {
    vocab v = tiny_bpe_vocab("llama-bpe");
    auto limited = bpe_model::build(v, 1);  // every match exceeds a limit of one step
    ASSERT_TRUE(limited.ok());
    std::string text = "hello   world\n\n  ab c";
    auto words = (*limited)->pre_tokenize(text);
    std::string joined;
    for (auto w : words) joined += w;
    EXPECT_EQ(joined, text);
    EXPECT_EQ(words.size(), text.size());  // one word per character after the limit hit
    auto normal = bpe_model::build(v);
    ASSERT_TRUE(normal.ok());
    EXPECT_LT((*normal)->pre_tokenize(text).size(), text.size());
}
