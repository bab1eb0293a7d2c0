// vocab.hpp: a model's token vocabulary as stored in GGUF metadata (`tokenizer.ggml.*`).
//
// Owns the pieces, scores, token types, special ids and the piece -> id index. Built once per
// model, immutable afterwards, safe to share between threads. Users: the tokenizer
// (model/tokenizer.hpp), the scheduler's stop conditions (eos), `ordo-model info/tokenize`.
//
// Special ids that a file marks invalid (0xFFFFFFFF, as llama.cpp writes for "none") or that
// point outside the vocab become k_no_token rather than an error, because real files carry them
// (stories260K's separator and padding ids).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "actors/runtime/result.hpp"

namespace ordo::model {

class gguf_file;

using token_id = int32_t;
inline constexpr token_id k_no_token = -1;

// `tokenizer.ggml.token_type` values (llama.cpp's llama_token_type).
enum class token_type : int32_t {
    undefined = 0,
    normal = 1,
    unknown = 2,
    control = 3,
    user_defined = 4,
    unused = 5,
    byte = 6,
};

// Ingredients of a vocab, for building one without a GGUF file (tests, benchmarks).
struct vocab_spec {
    std::string model = "llama";      // tokenizer.ggml.model
    std::string pre;                  // tokenizer.ggml.pre (BPE pre-tokenizer; "" absent)
    std::vector<std::string> pieces;  // tokenizer.ggml.tokens
    std::vector<float> scores;        // empty: all 0
    std::vector<token_type> types;    // empty: all normal
    std::vector<std::string> merges;  // tokenizer.ggml.merges ("left right", by rank; BPE)
    token_id bos = 1, eos = 2, unk = 0, pad = k_no_token;
    token_id eot = k_no_token, eom = k_no_token;  // end of turn / end of message (Llama 3)
    bool add_bos = true, add_eos = false;
    bool add_space_prefix = true;  // SentencePiece dummy prefix
};

class vocab {
public:
    // Any tokenizer model loads (ids, specials and pieces mean the same whatever turns text into
    // them); whether ordo can tokenize it is the tokenizer's support(). Errors:
    // tokenizer_missing (no tokenizer.ggml.model / tokens), tokenizer_bad_vocab (wrong types,
    // scores/types length differing from tokens, empty vocab).
    static result<vocab> from_gguf(const gguf_file& f);
    static result<vocab> from_spec(vocab_spec spec);

    const std::string& model() const { return _model; }
    const std::string& pre() const { return _pre; }
    // "gpt2 (pre llama-bpe)", or the model alone when there is no pre-tokenizer: for messages.
    std::string describe() const;
    size_t size() const { return _pieces.size(); }
    bool valid(token_id id) const { return id >= 0 && static_cast<size_t>(id) < _pieces.size(); }
    // Precondition for the three below: valid(id).
    const std::string& piece(token_id id) const;
    float score(token_id id) const;
    token_type type(token_id id) const;

    token_id bos() const { return _bos; }
    token_id eos() const { return _eos; }
    token_id unk() const { return _unk; }
    token_id pad() const { return _pad; }
    token_id eot() const { return _eot; }
    token_id eom() const { return _eom; }
    // End of generation: eos, eot, eom and every control token whose text is one of the usual
    // end-of-turn markers (<|eot_id|>, <|eom_id|>, <|end_of_text|>, <|im_end|>, <|endoftext|>,
    // <｜end▁of▁sentence｜>, ...). Sorted, no duplicates.
    const std::vector<token_id>& eog() const { return _eog; }
    bool is_eog(token_id id) const;
    // Control and user-defined tokens, longest piece first (the special-token scan's order).
    const std::vector<token_id>& specials() const { return _specials; }
    const std::vector<std::string>& merges() const { return _merges; }
    bool add_bos() const { return _add_bos; }
    bool add_eos() const { return _add_eos; }
    bool add_space_prefix() const { return _add_space_prefix; }

    // Id of an exact piece (first one when a vocab repeats a piece), or k_no_token.
    token_id find(std::string_view piece) const;
    // Id of the `<0xNN>` byte-fallback token for `b`, or k_no_token when the vocab has none.
    token_id byte_token(uint8_t b) const { return _byte_ids[b]; }
    // The byte a `<0xNN>` token stands for; nullopt for other tokens.
    std::optional<uint8_t> token_byte(token_id id) const;

private:
    struct piece_hash {
        using is_transparent = void;
        size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
    };

    void index_specials();  // fills _eog and _specials (from_spec)

    std::string _model;
    std::string _pre;
    std::vector<std::string> _pieces;
    std::vector<float> _scores;
    std::vector<token_type> _types;
    std::unordered_map<std::string, token_id, piece_hash, std::equal_to<>> _index;
    std::vector<std::string> _merges;
    std::vector<token_id> _eog;
    std::vector<token_id> _specials;
    std::array<token_id, 256> _byte_ids{};
    token_id _bos = k_no_token, _eos = k_no_token, _unk = k_no_token, _pad = k_no_token;
    token_id _eot = k_no_token, _eom = k_no_token;
    bool _add_bos = true, _add_eos = false, _add_space_prefix = true;
};

}  // namespace ordo::model
