// tokenizer.cpp: SentencePiece-style encode, decode and the streaming UTF-8 decoder (see
// tokenizer.hpp for the algorithm). Pure functions of the vocab; no shared state.
#include "model/tokenizer.hpp"

#include <cassert>
#include <queue>

#include "model/bpe.hpp"
#include "model/gguf.hpp"

namespace ordo::model {

namespace {

constexpr std::string_view k_space_marker = "\xE2\x96\x81";    // U+2581 LOWER ONE EIGHTH BLOCK
constexpr std::string_view k_replacement = "\xEF\xBF\xBD";     // U+FFFD
constexpr std::string_view k_unknown_text = " \xE2\x81\x87 ";  // " ⁇ ", as SentencePiece prints

// Length of the UTF-8 sequence a lead byte announces; stray continuation bytes count as 1 so
// every byte of the input lands in exactly one symbol.
size_t utf8_len(uint8_t lead) {
    static constexpr uint8_t k_by_high_nibble[16] = {1, 1, 1, 1, 1, 1, 1, 1,
                                                     1, 1, 1, 1, 2, 2, 3, 4};
    return k_by_high_nibble[lead >> 4];
}

// One symbol of the merge list: a byte range of the escaped text, linked to its neighbours.
struct symbol {
    int32_t prev;
    int32_t next;
    uint32_t start;
    uint32_t len;  // 0 once merged into its left neighbour
};

// A candidate merge of symbol `left` with its right neighbour. `len` is the merged length when
// queued: if either side changed since, the entry is stale and skipped.
struct bigram {
    float score;
    int32_t left;
    uint32_t len;
};

struct bigram_order {
    // Highest score first; among equal scores the leftmost pair (SentencePiece's order).
    bool operator()(const bigram& a, const bigram& b) const {
        return a.score < b.score || (a.score == b.score && a.left > b.left);
    }
};

class spm_session {
public:
    spm_session(const vocab& v, std::string_view text) : _vocab(v), _text(text) {}

    void run(std::vector<token_id>& out) {
        split_chars();
        for (size_t i = 1; i < _symbols.size(); ++i) try_queue(int32_t(i - 1), int32_t(i));
        // Every successful merge removes one symbol, so there are fewer merges than symbols;
        // stale entries are at most the number pushed (<= 2 per merge + initial pairs).
        while (!_queue.empty()) {
            bigram b = _queue.top();
            _queue.pop();
            symbol& left = _symbols[size_t(b.left)];
            if (left.len == 0 || left.next < 0) continue;
            symbol& right = _symbols[size_t(left.next)];
            if (left.len + right.len != b.len) continue;  // stale: a side has merged since
            left.len += right.len;
            right.len = 0;
            left.next = right.next;
            if (right.next >= 0) _symbols[size_t(right.next)].prev = b.left;
            if (left.prev >= 0) try_queue(left.prev, b.left);
            if (left.next >= 0) try_queue(b.left, left.next);
        }
        emit(out);
    }

private:
    void split_chars() {
        _symbols.reserve(_text.size());
        size_t offs = 0;
        while (offs < _text.size()) {
            size_t len = std::min(_text.size() - offs, utf8_len(uint8_t(_text[offs])));
            int32_t idx = int32_t(_symbols.size());
            _symbols.push_back({idx - 1, idx + 1, uint32_t(offs), uint32_t(len)});
            offs += len;
        }
        if (!_symbols.empty()) _symbols.back().next = -1;
    }

    void try_queue(int32_t left, int32_t right) {
        const symbol& l = _symbols[size_t(left)];
        const symbol& r = _symbols[size_t(right)];
        std::string_view merged = _text.substr(l.start, l.len + r.len);
        token_id id = _vocab.find(merged);
        if (id == k_no_token) return;
        _queue.push({_vocab.score(id), left, uint32_t(merged.size())});
    }

    void emit(std::vector<token_id>& out) const {
        for (int32_t i = _symbols.empty() ? -1 : 0; i >= 0; i = _symbols[size_t(i)].next) {
            const symbol& s = _symbols[size_t(i)];
            std::string_view piece = _text.substr(s.start, s.len);
            token_id id = _vocab.find(piece);
            if (id != k_no_token) {
                out.push_back(id);
                continue;
            }
            // Byte fallback: one `<0xNN>` token per byte; unk if the vocab lacks byte tokens.
            for (unsigned char b : piece) {
                token_id bid = _vocab.byte_token(b);
                if (bid == k_no_token) bid = _vocab.unk();
                if (bid != k_no_token) out.push_back(bid);
            }
        }
    }

    const vocab& _vocab;
    std::string_view _text;
    std::vector<symbol> _symbols;
    std::priority_queue<bigram, std::vector<bigram>, bigram_order> _queue;
};

}  // namespace

tokenizer::tokenizer(model::vocab v) : _vocab(std::move(v)) {
    if (_vocab.model() == "gpt2") {
        auto bpe = bpe_model::build(_vocab);
        if (bpe) {
            _bpe = std::move(*bpe);
        } else {
            _support = make_error(bpe.err().code, "tokenizer " + _vocab.describe() + ": " +
                                                      bpe.err().message +
                                                      "; send token ids instead of text");
        }
    } else if (_vocab.model() != "llama") {
        _support = make_error("tokenizer_unsupported",
                              "tokenizer " + _vocab.describe() +
                                  " is not supported (ordo tokenizes SentencePiece 'llama' and "
                                  "byte-level BPE 'gpt2' vocabularies); send token ids instead "
                                  "of text");
    }
    for (token_id id : _vocab.specials()) {
        _specials_by_byte[uint8_t(_vocab.piece(id)[0])].push_back(id);
    }
}

result<tokenizer> tokenizer::from_gguf(const gguf_file& f) {
    auto v = vocab::from_gguf(f);
    if (!v) return v.err();
    tokenizer t(std::move(*v));
    if (!t.support()) return t.support().err();
    return t;
}

token_id tokenizer::special_at(std::string_view text, bool parse_special) const {
    for (token_id id : _specials_by_byte[uint8_t(text[0])]) {
        if (!parse_special && _vocab.type(id) != token_type::user_defined) continue;
        if (text.starts_with(_vocab.piece(id))) return id;  // longest first
    }
    return k_no_token;
}

std::vector<token_id> tokenizer::encode(std::string_view text, bool add_special,
                                        bool parse_special) const {
    assert(_support.ok() && "encode on a vocab ordo cannot tokenize");
    std::vector<token_id> out;
    if (add_special && _vocab.add_bos() && _vocab.bos() != k_no_token) out.push_back(_vocab.bos());
    // Split out special tokens; `first` is true for text at the start or after a special token
    // (SentencePiece prefixes such a fragment with its dummy space, as llama.cpp does).
    size_t start = 0;
    bool first = true;
    for (size_t i = 0; i < text.size(); ++i) {
        token_id id = special_at(text.substr(i), parse_special);
        if (id == k_no_token) continue;
        encode_text(text.substr(start, i - start), first, out);
        out.push_back(id);
        first = true;
        i += _vocab.piece(id).size() - 1;
        start = i + 1;
    }
    encode_text(text.substr(start), first, out);
    if (add_special && _vocab.add_eos() && _vocab.eos() != k_no_token) out.push_back(_vocab.eos());
    return out;
}

void tokenizer::encode_text(std::string_view text, bool first, std::vector<token_id>& out) const {
    if (text.empty()) return;
    if (_bpe) return _bpe->encode(_vocab, text, out);
    std::string escaped;
    escaped.reserve(text.size() * 3 + 3);
    if (_vocab.add_space_prefix() && first) escaped += k_space_marker;
    for (char c : text) {
        if (c == ' ') {
            escaped += k_space_marker;
        } else {
            escaped += c;
        }
    }
    // Symbol offsets are 32-bit; a 4 GiB prompt is far beyond any context window.
    assert(escaped.size() < UINT32_MAX);
    spm_session(_vocab, escaped).run(out);
}

std::string tokenizer::token_bytes(token_id id, bool at_start, bool special) const {
    assert(_support.ok() && "decode on a vocab ordo cannot tokenize");
    assert(_vocab.valid(id));
    const std::string& piece = _vocab.piece(id);
    switch (_vocab.type(id)) {
        case token_type::control:
            return special ? piece : std::string();
        case token_type::user_defined:
            if (_bpe) return piece;  // SentencePiece spells it like a normal piece
            break;
        case token_type::unknown:
            return _bpe ? piece : std::string(k_unknown_text);
        default:
            break;
    }
    if (auto b = _vocab.token_byte(id)) return std::string(1, char(*b));
    if (_bpe) return _bpe->piece_bytes(piece);
    std::string out;
    out.reserve(piece.size());
    for (size_t i = 0; i < piece.size();) {
        if (piece.compare(i, k_space_marker.size(), k_space_marker) == 0) {
            out += ' ';
            i += k_space_marker.size();
        } else {
            out += piece[i++];
        }
    }
    if (at_start && _vocab.add_space_prefix() && !out.empty() && out[0] == ' ') out.erase(0, 1);
    return out;
}

result<std::string> tokenizer::decode(std::span<const token_id> ids, bool special) const {
    stream_decoder dec(*this, special);
    std::string out;
    for (token_id id : ids) {
        auto piece = dec.feed(id);
        if (!piece) return piece.err();
        out += *piece;
    }
    out += dec.flush();
    return out;
}

// ---- streaming --------------------------------------------------------------------------------

result<std::string> stream_decoder::feed(token_id id) {
    const vocab& v = _tok->vocab();
    if (!v.valid(id)) {
        return make_error("token_out_of_range", "token id " + std::to_string(id) +
                                                    " is outside the vocab (size " +
                                                    std::to_string(v.size()) + ")");
    }
    _pending += _tok->token_bytes(id, _at_start, _special);
    if (v.type(id) != token_type::control) _at_start = false;
    std::string out;
    size_t held = utf8_sanitize(_pending, false, out);
    _pending.erase(0, _pending.size() - held);
    assert(_pending.size() < 4);
    return out;
}

std::string stream_decoder::flush() {
    std::string out;
    utf8_sanitize(_pending, true, out);
    _pending.clear();
    return out;
}

size_t utf8_sanitize(std::string_view bytes, bool final, std::string& out) {
    const size_t n = bytes.size();
    size_t i = 0;
    while (i < n) {
        const uint8_t b = uint8_t(bytes[i]);
        if (b < 0x80) {
            out += char(b);
            ++i;
            continue;
        }
        // Well-formed sequences per Unicode Table 3-7: the second byte's range depends on the
        // lead (this excludes overlongs, surrogates and code points above U+10FFFF).
        size_t len = 0;
        uint8_t lo = 0x80, hi = 0xBF;
        if (b >= 0xC2 && b <= 0xDF)
            len = 2;
        else if (b == 0xE0) {
            len = 3;
            lo = 0xA0;
        } else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF)
            len = 3;
        else if (b == 0xED) {
            len = 3;
            hi = 0x9F;
        } else if (b == 0xF0) {
            len = 4;
            lo = 0x90;
        } else if (b >= 0xF1 && b <= 0xF3)
            len = 4;
        else if (b == 0xF4) {
            len = 4;
            hi = 0x8F;
        }
        if (len == 0) {  // a byte that can never start a character
            out += k_replacement;
            ++i;
            continue;
        }
        size_t j = 1;
        bool bad = false;
        for (; j < len; ++j) {
            if (i + j >= n) {
                if (!final) return n - i;  // incomplete so far: wait for more bytes
                out += k_replacement;
                return 0;
            }
            const uint8_t c = uint8_t(bytes[i + j]);
            if (c < (j == 1 ? lo : 0x80) || c > (j == 1 ? hi : 0xBF)) {
                bad = true;
                break;
            }
        }
        if (bad) {
            out += k_replacement;  // the maximal valid prefix becomes one U+FFFD
            i += j;
            continue;
        }
        out.append(bytes.substr(i, len));
        i += len;
    }
    return 0;
}

}  // namespace ordo::model
