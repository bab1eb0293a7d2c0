// tokenizer.hpp: SentencePiece-style ("llama") text <-> token ids over a GGUF vocab, and a
// streaming detokenizer that only ever emits valid UTF-8.
//
// Users: the scheduler (prompt encode, streamed token text), `ordo-model tokenize/detokenize`,
// the reference `generate`. A tokenizer is immutable after construction and may be shared
// between threads; a stream_decoder belongs to one sequence.
//
// Encode (what SentencePiece/llama.cpp do for a llama vocab):
//   1. empty text -> no tokens (no BOS-only special case beyond `add_bos`);
//   2. prepend one space (the dummy prefix) when the vocab says so, turn every ' ' into U+2581;
//   3. split into UTF-8 characters; each becomes a symbol;
//   4. repeatedly merge the adjacent pair whose concatenation is a vocab piece with the highest
//      score (ties: leftmost), using a priority queue over a linked list -> O(n log n);
//   5. each final symbol is its piece id, or else its bytes as `<0xNN>` tokens, or else unk.
// Decode: U+2581 -> ' ', `<0xNN>` -> that byte, control tokens -> nothing, unknown -> " \u2047 ",
// and the first piece's leading space (the dummy prefix) is dropped.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "actors/runtime/result.hpp"
#include "model/vocab.hpp"

namespace ordo::model {

class gguf_file;

class tokenizer {
public:
    // Any vocab; support() says whether text can be encoded and decoded with it.
    explicit tokenizer(model::vocab v);
    // A tokenizer that can encode: vocab::from_gguf's errors (tokenizer_missing,
    // tokenizer_bad_vocab), and support()'s (tokenizer_unsupported). ordo-server, which serves
    // token ids whatever the tokenizer, builds one from the vocab instead.
    static result<tokenizer> from_gguf(const gguf_file& f);

    const model::vocab& vocab() const { return _vocab; }
    // ok for a SentencePiece ("llama") vocab; otherwise tokenizer_unsupported naming the
    // tokenizer, e.g. "gpt2 (pre llama-bpe)": BPE is not implemented yet. Every text function
    // below (encode, decode, token_bytes, stream_decoder) requires it (asserted).
    const status& support() const { return _support; }

    // `add_special`: add BOS (and EOS) as the vocab's add_bos/add_eos flags say.
    std::vector<token_id> encode(std::string_view text, bool add_special) const;
    // Whole-sequence decode (through a stream_decoder, so the result is valid UTF-8).
    // Error: token_out_of_range naming the id.
    result<std::string> decode(std::span<const token_id> ids) const;

    // Raw bytes of one token in context: `at_start` is true when nothing but control tokens
    // came before it (then the dummy-prefix space is stripped). Precondition: valid(id).
    std::string token_bytes(token_id id, bool at_start) const;

private:
    model::vocab _vocab;
    status _support;
};

// Feeds ids one at a time and returns only complete, valid UTF-8. Bytes of a character split
// across tokens are held back until it completes; a byte sequence that can never be valid UTF-8
// comes out as U+FFFD; `flush()` ends the stream (a held-back partial character becomes U+FFFD).
class stream_decoder {
public:
    explicit stream_decoder(const tokenizer& tok) : _tok(&tok) {}

    result<std::string> feed(token_id id);  // error: token_out_of_range
    std::string flush();
    size_t pending_bytes() const { return _pending.size(); }

private:
    const tokenizer* _tok;
    std::string _pending;  // bytes not yet emitted: at most one incomplete character (< 4 bytes)
    bool _at_start = true;
};

// Splits `bytes` into the longest prefix that is valid UTF-8 (with invalid sequences replaced
// by U+FFFD, appended to `out`) and returns how many bytes at the end form an incomplete but so
// far valid character (left for more input). With `final`, nothing is held back.
size_t utf8_sanitize(std::string_view bytes, bool final, std::string& out);

}  // namespace ordo::model
