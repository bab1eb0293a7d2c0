// bpe.hpp: GPT-2 style byte-level BPE ("gpt2" vocabularies: Llama 3, DeepSeek, Qwen2, GPT-2).
//
// Users: model/tokenizer.cpp only. A bpe_model is built once per vocabulary, is immutable
// afterwards and may be shared between threads (each encode call makes its own PCRE2 match
// data).
//
// Encode, as Hugging Face `tokenizers` does for these models:
//   1. pre-tokenize: the text is cut into words by the vocabulary's pre-tokenizer, a sequence of
//      regex "Split (Isolated)" stages: each stage cuts every piece so far into its matches and
//      the gaps between them (both kept). The patterns are those of each model's tokenizer.json
//      ("pre_tokenizer"), run with PCRE2 (UTF, Unicode properties, JIT), compiled once here;
//   2. byte-level: every byte of a word becomes one printable code point (GPT-2's
//      bytes_to_unicode table), so every word is spelled in vocabulary characters;
//   3. merge: the word's characters are symbols in a linked list; a priority queue holds adjacent
//      pairs that `tokenizer.ggml.merges` ranks; the lowest rank (leftmost on ties) merges first,
//      and only the new neighbours are queued -> O(n log n) per word, nothing cached.
//   With `ignore_merges` (Llama 3), a word that is itself a vocabulary piece is one token.
// Decode: each code point of a piece maps back to its byte (the inverse table).
//
// Hostile input: every regex match runs under PCRE2 match and depth limits. A match that hits
// them ends the pre-tokenization of that piece gracefully: the rest of it becomes one word per
// character (still a faithful, round-trippable tokenization, only not the model's usual one).
#pragma once

#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "actors/runtime/result.hpp"
#include "model/vocab.hpp"

namespace ordo::model {

// The pre-tokenizer a `tokenizer.ggml.pre` value names, or tokenizer_unsupported naming it.
struct bpe_pre_spec {
    std::vector<std::string> patterns;  // Split(Isolated) stages, in order (PCRE2 syntax)
    bool ignore_merges = false;         // a whole word that is a piece is one token (Llama 3)
    bool add_bos = false;               // llama.cpp's default when add_bos_token is absent
};
result<bpe_pre_spec> bpe_pre_for(std::string_view pre);

// GPT-2's bytes_to_unicode: the code point (as UTF-8) standing for byte `b` inside pieces.
std::string_view byte_to_piece_char(uint8_t b);

class bpe_model {
public:
    // Errors: tokenizer_unsupported (unknown pre), tokenizer_bad_vocab (a merge naming pieces
    // the vocabulary lacks, a pattern PCRE2 refuses). `match_limit` bounds each regex match
    // (PCRE2's match limit; the depth limit is derived from it); tests lower it.
    static result<std::shared_ptr<const bpe_model>> build(const vocab& v, uint32_t match_limit = 0);
    ~bpe_model();
    bpe_model(const bpe_model&) = delete;
    bpe_model& operator=(const bpe_model&) = delete;

    // Appends the ids of `text` (no special tokens are recognised here). `v` is the vocabulary
    // this model was built from.
    void encode(const vocab& v, std::string_view text, std::vector<token_id>& out) const;
    // The raw bytes a normal piece spells (inverse byte-level map); code points outside the
    // table pass through as their UTF-8.
    std::string piece_bytes(std::string_view piece) const;

    // Words of `text` after pre-tokenization (for tests).
    std::vector<std::string_view> pre_tokenize(std::string_view text) const;

private:
    struct compiled;
    struct merge {
        int32_t rank;
        token_id result;
    };
    bpe_model() = default;
    void encode_word(const vocab& v, std::string_view word, std::vector<token_id>& out) const;

    std::unique_ptr<compiled> _re;
    bool _ignore_merges = false;
    std::unordered_map<uint64_t, merge> _merges;  // (left id << 32 | right id) -> rank, result
    std::array<token_id, 256> _byte_ids{};        // the piece id of each byte's code point
};

}  // namespace ordo::model
