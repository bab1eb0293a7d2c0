// tokenizer.hpp: text <-> token ids over a GGUF vocab, SentencePiece-style ("llama") or
// byte-level BPE ("gpt2", model/bpe.hpp), with special tokens, and a streaming detokenizer that
// only ever emits valid UTF-8.
//
// Users: the scheduler (prompt encode, streamed token text), `ordo-model tokenize/detokenize`,
// the reference `generate`. A tokenizer is immutable after construction and may be shared
// between threads; a stream_decoder belongs to one sequence.
//
// Special tokens (both kinds of vocab), as llama.cpp's parse_special does: before anything else
// the text is scanned left to right for the pieces of user-defined tokens and, with
// `parse_special`, of control tokens (longest match at each position); each found becomes its
// one token and the text between them is encoded as below. Without `parse_special`, text such
// as "<|eot_id|>" is ordinary text. (User-defined tokens always match: HF tokenizers treats
// them as added tokens of the text, and llama.cpp's vectors expect it.)
//
// BPE encode: model/bpe.hpp.
// SentencePiece encode (what SentencePiece/llama.cpp do for a llama vocab), per text fragment:
//   1. empty text -> no tokens (no BOS-only special case beyond `add_bos`);
//   2. prepend one space (to the first fragment and to one after a special token) (the dummy
//   prefix) when the vocab says so, turn every ' ' into U+2581;
//   3. split into UTF-8 characters; each becomes a symbol;
//   4. repeatedly merge the adjacent pair whose concatenation is a vocab piece with the highest
//      score (ties: leftmost), using a priority queue over a linked list -> O(n log n);
//   5. each final symbol is its piece id, or else its bytes as `<0xNN>` tokens, or else unk.
// Decode: control tokens -> nothing (their text with `special`), user-defined -> their text.
// SentencePiece: U+2581 -> ' ', `<0xNN>` -> that byte, unknown -> " \u2047 ", and the first
// piece's leading space (the dummy prefix) is dropped. BPE: each character back to its byte.
#pragma once

#include <array>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "actors/runtime/result.hpp"
#include "model/vocab.hpp"

namespace ordo::model {

class gguf_file;
class bpe_model;

class tokenizer {
public:
    // Any vocab; support() says whether text can be encoded and decoded with it.
    explicit tokenizer(model::vocab v);
    // A tokenizer that can encode: vocab::from_gguf's errors (tokenizer_missing,
    // tokenizer_bad_vocab), and support()'s (tokenizer_unsupported). ordo-server, which serves
    // token ids whatever the tokenizer, builds one from the vocab instead.
    static result<tokenizer> from_gguf(const gguf_file& f);

    const model::vocab& vocab() const { return _vocab; }
    // ok for a SentencePiece ("llama") vocab and a "gpt2" one whose pre-tokenizer ordo knows;
    // otherwise tokenizer_unsupported naming it, e.g. "gpt2 (pre falcon)". Every text function
    // below (encode, decode, token_bytes, stream_decoder) requires it (asserted).
    const status& support() const { return _support; }

    // `add_special`: add BOS (and EOS) as the vocab's add_bos/add_eos flags say.
    // `parse_special`: control-token text becomes that token (see the top of this file).
    std::vector<token_id> encode(std::string_view text, bool add_special,
                                 bool parse_special = false) const;
    // Whole-sequence decode (through a stream_decoder, so the result is valid UTF-8).
    // `special`: control tokens show their text. Error: token_out_of_range naming the id.
    result<std::string> decode(std::span<const token_id> ids, bool special = false) const;

    // Raw bytes of one token in context: `at_start` is true when nothing but control tokens
    // came before it (then the SentencePiece dummy-prefix space is stripped); `special`: a
    // control token is its text rather than nothing. Precondition: valid(id).
    std::string token_bytes(token_id id, bool at_start, bool special = false) const;

private:
    void encode_text(std::string_view text, bool first, std::vector<token_id>& out) const;
    // The special token whose piece starts `text` (longest), or k_no_token.
    token_id special_at(std::string_view text, bool parse_special) const;

    model::vocab _vocab;
    status _support;
    std::shared_ptr<const bpe_model> _bpe;  // a supported "gpt2" vocab only
    // vocab().specials() by the first byte of their piece, longest first.
    std::array<std::vector<token_id>, 256> _specials_by_byte;
};

// Feeds ids one at a time and returns only complete, valid UTF-8. Bytes of a character split
// across tokens are held back until it completes; a byte sequence that can never be valid UTF-8
// comes out as U+FFFD; `flush()` ends the stream (a held-back partial character becomes U+FFFD).
class stream_decoder {
public:
    // `special`: control tokens come out as their text.
    explicit stream_decoder(const tokenizer& tok, bool special = false)
        : _tok(&tok), _special(special) {}

    result<std::string> feed(token_id id);  // error: token_out_of_range
    std::string flush();
    size_t pending_bytes() const { return _pending.size(); }

private:
    const tokenizer* _tok;
    std::string _pending;  // bytes not yet emitted: at most one incomplete character (< 4 bytes)
    bool _special;
    bool _at_start = true;
};

// Splits `bytes` into the longest prefix that is valid UTF-8 (with invalid sequences replaced
// by U+FFFD, appended to `out`) and returns how many bytes at the end form an incomplete but so
// far valid character (left for more input). With `final`, nothing is held back.
size_t utf8_sanitize(std::string_view bytes, bool final, std::string& out);

}  // namespace ordo::model
