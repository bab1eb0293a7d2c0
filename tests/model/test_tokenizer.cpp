// test_tokenizer.cpp: checks the SentencePiece-style tokenizer and the streaming detokenizer.
//
// How: (1) encodes the 46 llama.cpp test vectors in ../shared/models/llama-spm-vocab/ with the
// real Llama-2 vocab and compares ids exactly (no BOS, as the vectors were made); (2) round-trips
// text through stories260K's vocab; (3) feeds a hand-built vocab's byte tokens one at a time to
// check that a multi-byte character split across tokens is held back and that invalid bytes
// become U+FFFD; (4) encodes a 100 KB prompt and checks it decodes back to the same text.
// Tests that need the shared models skip with a message when that folder is absent.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "model/gguf.hpp"
#include "model/tokenizer.hpp"
#include "tests/support/shared_models.hpp"
#include "tests/support/vocab_vectors.hpp"

using namespace ordo::model;

namespace {

const std::string k_models = ORDO_SHARED_MODELS_DIR;
const std::string k_spm_vocab = k_models + "/llama-spm-vocab/ggml-vocab-llama-spm.gguf";
const std::string k_stories = k_models + "/stories260K.gguf";

tokenizer load_tokenizer(const std::string& path) {
    auto f = gguf_file::open(path);
    EXPECT_TRUE(f.ok()) << (f.ok() ? "" : f.err().message);
    auto t = tokenizer::from_gguf(*f);
    EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.err().message);
    return std::move(*t);
}

#define SKIP_WITHOUT(path) ORDO_REQUIRE_SHARED(path)

// A tiny vocab: control tokens, all 256 byte tokens, and a few pieces.
tokenizer byte_vocab_tokenizer() {
    vocab_spec s;
    s.pieces = {"<unk>", "<s>", "</s>"};
    s.types = {token_type::unknown, token_type::control, token_type::control};
    for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", b);
        s.pieces.push_back(name);
        s.types.push_back(token_type::byte);
    }
    for (const char* p : {"\xE2\x96\x81"
                          "hi",
                          "\xE2\x96\x81", "h", "i", "hi"}) {
        s.pieces.push_back(p);
        s.types.push_back(token_type::normal);
    }
    s.scores.assign(s.pieces.size(), 0.0f);
    s.scores[s.pieces.size() - 5] = 5.0f;  // "▁hi" beats every other merge
    auto v = vocab::from_spec(std::move(s));
    EXPECT_TRUE(v.ok());
    return tokenizer(std::move(*v));
}

token_id byte_id(const tokenizer& t, uint8_t b) {
    return t.vocab().byte_token(b);
}

}  // namespace

TEST(Tokenizer, LlamaSpmVectors) {
    SKIP_WITHOUT(k_spm_vocab);
    tokenizer tok = load_tokenizer(k_spm_vocab);
    auto cases = ordo::test::read_vocab_cases(k_spm_vocab);
    ASSERT_EQ(cases.size(), 46u);
    for (size_t i = 0; i < cases.size(); ++i) {
        EXPECT_EQ(tok.encode(cases[i].text, false), cases[i].ids)
            << "case " << i << ": '" << cases[i].text << "'";
    }
}

TEST(Tokenizer, VocabFlagsFromGguf) {
    SKIP_WITHOUT(k_spm_vocab);
    tokenizer tok = load_tokenizer(k_spm_vocab);
    EXPECT_EQ(tok.vocab().size(), 32000u);
    EXPECT_EQ(tok.vocab().bos(), 1);
    EXPECT_EQ(tok.vocab().eos(), 2);
    EXPECT_EQ(tok.vocab().unk(), 0);
    EXPECT_TRUE(tok.vocab().add_bos());
    EXPECT_FALSE(tok.vocab().add_eos());
    // With specials: BOS first.
    auto ids = tok.encode("Hello world", true);
    ASSERT_EQ(ids, (std::vector<token_id>{1, 15043, 3186}));
}

TEST(Tokenizer, Stories260KRoundTrip) {
    SKIP_WITHOUT(k_stories);
    tokenizer tok = load_tokenizer(k_stories);
    EXPECT_EQ(tok.vocab().size(), 512u);
    EXPECT_EQ(tok.vocab().pad(), k_no_token);  // 0xFFFFFFFF in the file
    EXPECT_TRUE(tok.vocab().add_bos());        // absent key -> llama default
    for (const char* text : {"Once upon a time", "Hello, world! 123", "  two  spaces",
                             "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 \xE6\x97\xA5\xE6\x9C\xAC",
                             "line\nbreak\ttab", "x"}) {
        auto ids = tok.encode(text, true);
        ASSERT_FALSE(ids.empty());
        EXPECT_EQ(ids[0], 1);
        auto back = tok.decode(ids);
        ASSERT_TRUE(back.ok()) << back.err().message;
        EXPECT_EQ(*back, text);
    }
    // The golden prompt from stories260K.golden.json.
    // The JSON spreads ids over lines; compare with all whitespace removed.
    std::string golden;
    for (char c : ordo::test::read_file_bytes(k_models + "/stories260K.golden.json")) {
        if (!std::isspace(static_cast<unsigned char>(c))) golden += c;
    }
    auto ids = tok.encode("Once upon a time", true);
    std::string joined;
    for (size_t i = 0; i < ids.size(); ++i) joined += (i ? "," : "") + std::to_string(ids[i]);
    EXPECT_NE(golden.find("\"prompt_token_ids\":[" + joined + "]"), std::string::npos) << joined;
}

TEST(Tokenizer, EmptyAndSpecials) {
    tokenizer tok = byte_vocab_tokenizer();
    EXPECT_TRUE(tok.encode("", false).empty());
    EXPECT_EQ(tok.encode("", true), (std::vector<token_id>{1}));
    const token_id hi = tok.vocab().find("\xE2\x96\x81hi");
    EXPECT_EQ(tok.encode("hi", false), (std::vector<token_id>{hi}));
    // A character not in the vocab falls back to its bytes.
    EXPECT_EQ(tok.encode("hi\xC3\xA9", false),
              (std::vector<token_id>{hi, byte_id(tok, 0xC3), byte_id(tok, 0xA9)}));
    auto text = tok.decode(std::vector<token_id>{1, hi, byte_id(tok, 0xC3), byte_id(tok, 0xA9), 2});
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(*text, "hi\xC3\xA9");  // leading dummy space stripped, controls are silent
    auto bad = tok.decode(std::vector<token_id>{hi, 100000});
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.err().code, "token_out_of_range");
    auto neg = tok.decode(std::vector<token_id>{-1});
    ASSERT_FALSE(neg.ok());
}

TEST(Tokenizer, StreamHoldsBackSplitCharacter) {
    tokenizer tok = byte_vocab_tokenizer();
    stream_decoder dec(tok);
    // U+1F600 (F0 9F 98 80) arrives one byte token at a time.
    const uint8_t emoji[] = {0xF0, 0x9F, 0x98, 0x80};
    for (int i = 0; i < 3; ++i) {
        auto out = dec.feed(byte_id(tok, emoji[i]));
        ASSERT_TRUE(out.ok());
        EXPECT_EQ(*out, "") << "byte " << i << " must be held back";
        EXPECT_EQ(dec.pending_bytes(), size_t(i + 1));
    }
    auto last = dec.feed(byte_id(tok, emoji[3]));
    ASSERT_TRUE(last.ok());
    EXPECT_EQ(*last, "\xF0\x9F\x98\x80");
    EXPECT_EQ(dec.flush(), "");
}

TEST(Tokenizer, StreamReplacesInvalidBytes) {
    tokenizer tok = byte_vocab_tokenizer();
    stream_decoder dec(tok);
    std::string all;
    // A stray continuation byte, an overlong lead, a lead followed by ASCII, a truncated tail.
    for (uint8_t b : {0x80, 0xC0, 0x41, 0xE2, 0x42, 0xE2, 0x82}) {
        auto out = dec.feed(byte_id(tok, b));
        ASSERT_TRUE(out.ok());
        all += *out;
    }
    all += dec.flush();
    EXPECT_EQ(all,
              "\xEF\xBF\xBD\xEF\xBF\xBD"
              "A"
              "\xEF\xBF\xBD"
              "B"
              "\xEF\xBF\xBD");
    // Surrogate (ED A0 80) is never valid UTF-8.
    std::string out;
    EXPECT_EQ(utf8_sanitize("\xED\xA0\x80", true, out), 0u);
    EXPECT_EQ(out, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(Tokenizer, LongInputCompletes) {
    SKIP_WITHOUT(k_spm_vocab);
    tokenizer tok = load_tokenizer(k_spm_vocab);
    std::string text;
    const std::string chunk =
        "The quick brown fox jumps over the lazy dog. \xE6\x97\xA5\xE6\x9C\xAC "
        "caf\xC3\xA9 1234567890!\n";
    while (text.size() < 100 * 1024) text += chunk;
    auto ids = tok.encode(text, false);
    EXPECT_GT(ids.size(), text.size() / 8);
    auto back = tok.decode(ids);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, text);
    // A run of one repeated character is the worst case for naive merging.
    std::string same(100 * 1024, 'a');
    auto ids2 = tok.encode(same, false);
    auto back2 = tok.decode(ids2);
    ASSERT_TRUE(back2.ok());
    EXPECT_EQ(*back2, same);
}

// A gpt2 (BPE) vocab loads (its ids are served) but its tokenizer says it cannot encode,
// naming the tokenizer and its pre-tokenizer; from_gguf refuses it for the tools that need text.
TEST(Tokenizer, MissingOrUnsupportedTokenizer) {
    vocab_spec s;
    s.model = "gpt2";
    s.pre = "falcon";  // a BPE pre-tokenizer ordo does not know
    s.pieces = {"a", "b"};
    auto v = vocab::from_spec(s);
    ASSERT_TRUE(v.ok()) << v.err().message;
    EXPECT_EQ(v->describe(), "gpt2 (pre falcon)");
    tokenizer t(std::move(*v));
    ASSERT_FALSE(t.support().ok());
    EXPECT_EQ(t.support().err().code, "tokenizer_unsupported");
    EXPECT_NE(t.support().err().message.find("gpt2 (pre falcon)"), std::string::npos)
        << t.support().err().message;
    s.model = "bert";  // not a tokenizer model ordo knows at all
    tokenizer bert(*vocab::from_spec(s));
    ASSERT_FALSE(bert.support().ok());
    EXPECT_EQ(bert.support().err().code, "tokenizer_unsupported");
    EXPECT_TRUE(byte_vocab_tokenizer().support().ok());
    vocab_spec empty;
    auto e = vocab::from_spec(empty);
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.err().code, "tokenizer_bad_vocab");
}
