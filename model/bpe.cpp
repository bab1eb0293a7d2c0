// bpe.cpp: byte-level BPE: pre-tokenizer stages on PCRE2, the byte-level map and the merge loop
// (see bpe.hpp for the algorithm).
#include "model/bpe.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cassert>
#include <queue>

namespace ordo::model {

namespace {

// ---- pre-tokenizer patterns ---------------------------------------------------------------------
//
// Written from each model's Hugging Face tokenizer.json "pre_tokenizer" (Split patterns, and the
// regex of ByteLevel(use_regex=true) for GPT-2). HF runs them with Oniguruma; in PCRE2 terms they
// need UTF + UCP (\s, \p{L}, \p{N} over all of Unicode) and `$` meaning only the end of the piece
// (DOLLAR_ENDONLY; each stage matches one piece at a time, so lookarounds and `$` see only it).

// GPT-2 (ByteLevel's own regex): contractions, words, numbers, punctuation runs, whitespace.
constexpr const char* k_gpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3: case-insensitive contractions, a word with one leading non-letter, numbers in groups
// of at most three digits, punctuation runs with trailing newlines, newline runs, whitespace.
constexpr const char* k_llama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2: Llama 3's pattern with single digits.
constexpr const char* k_qwen2 = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})"
                                R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// DeepSeek (LLM and Coder): CJK runs (U+4E00-9FA5, U+0800-4E00, U+AC00-D7FF) and single digits
// (HF's Digits(individual_digits=true)).
constexpr const char* k_deepseek_cjk = R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";
constexpr const char* k_digit = R"(\p{N})";
// DeepSeek LLM's letters: an explicit list of Latin, Greek, Cyrillic, Armenian, Georgian, ...
// ranges (not \p{L}: scripts outside it fall through as gaps). Written as escapes because three
// range ends (U+1F7D, U+1FD3, U+1FDB) and U+1FBE, U+2126, U+212A change under NFC and would
// corrupt a literal copy.
constexpr const char* k_deepseek_llm_letters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293})"
    R"(\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A})"
    R"(\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556})"
    R"(\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF})"
    R"(\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D})"
    R"(\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D})"
    R"(\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4})"
    R"(\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4})"
    R"(\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124})"
    R"(\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F})"
    R"(\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})"
    R"(\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F})"
    R"(\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17})"
    R"(\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3})"
    R"(\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF})"
    R"(\x{1E900}-\x{1E943}]+)";
// DeepSeek LLM's punctuation: ASCII, fullwidth forms, curly quotes, CJK space and stops.
constexpr const char* k_deepseek_llm_punct =
    R"(\s?[\x{21}-\x{2F}\x{3A}-\x{7E}\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F})"
    R"(\x{3000}-\x{3002}]+)";

// PCRE2's match limit per regex match (backtracking steps). The patterns above are linear; a
// legitimate match over a 1 MB whitespace run needs a few million steps, so this leaves
// headroom while bounding hostile input to well under a second per match.
constexpr uint32_t k_match_limit = 50'000'000;
// Nested-group depth: these patterns nest at most two groups deep.
constexpr uint32_t k_depth_limit = 10'000;

size_t utf8_len(uint8_t lead) {
    static constexpr uint8_t k_by_high_nibble[16] = {1, 1, 1, 1, 1, 1, 1, 1,
                                                     1, 1, 1, 1, 2, 2, 3, 4};
    return k_by_high_nibble[lead >> 4];
}

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes
// take the code points 256, 257, ... in byte order.
struct byte_table {
    std::array<std::string, 256> utf8;
    std::unordered_map<uint32_t, uint8_t> back;  // code point -> byte

    byte_table() {
        uint32_t next = 256;
        for (int b = 0; b < 256; ++b) {
            bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
            uint32_t cp = printable ? uint32_t(b) : next++;
            back[cp] = uint8_t(b);
            // All code points here are below 0x800: one or two UTF-8 bytes.
            utf8[b] = cp < 0x80 ? std::string(1, char(cp))
                                : std::string{char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
        }
    }
};

const byte_table& bytes_table() {
    static const byte_table t;
    return t;
}

}  // namespace

result<bpe_pre_spec> bpe_pre_for(std::string_view pre) {
    // Aliases are the names llama.cpp's converter writes for tokenizers with the same pattern.
    if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3" || pre == "dbrx" ||
        pre == "smaug-bpe") {
        return bpe_pre_spec{{k_llama3}, true, true};
    }
    if (pre == "gpt-2" || pre == "phi-2" || pre == "smollm")
        return bpe_pre_spec{{k_gpt2}, false, false};
    if (pre == "qwen2" || pre == "deepseek-r1-qwen") return bpe_pre_spec{{k_qwen2}, false, false};
    if (pre == "deepseek-llm") {
        return bpe_pre_spec{{R"([\r\n])", k_deepseek_llm_letters, k_deepseek_llm_punct, R"(\s+$)",
                             k_deepseek_cjk, k_digit},
                            false,
                            true};
    }
    if (pre == "deepseek-coder") {
        return bpe_pre_spec{
            {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", k_deepseek_cjk, k_digit}, false, true};
    }
    return make_error("tokenizer_unsupported",
                      "BPE pre-tokenizer '" + std::string(pre) +
                          "' is not supported (ordo knows llama-bpe, deepseek-llm, "
                          "deepseek-coder, gpt-2, qwen2 and their aliases)");
}

std::string_view byte_to_piece_char(uint8_t b) {
    return bytes_table().utf8[b];
}

// ---- compiled patterns --------------------------------------------------------------------------

struct bpe_model::compiled {
    std::vector<pcre2_code*> stages;
    pcre2_match_context* mctx = nullptr;

    ~compiled() {
        for (pcre2_code* c : stages) pcre2_code_free(c);
        pcre2_match_context_free(mctx);
    }

    // Cuts `piece` into matches of `re` and the gaps between them, appending both to `out`.
    void split(const pcre2_code* re, pcre2_match_data* md, std::string_view piece,
               std::vector<std::string_view>& out) const {
        auto subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
        size_t pos = 0, gap = 0;
        while (pos < piece.size()) {
            int rc = pcre2_match(re, subject, piece.size(), pos, 0, md, mctx);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) {
                // Match or depth limit (or an internal error): the rest of the piece becomes one
                // word per character, which is bounded and still round-trips.
                if (gap < pos) out.push_back(piece.substr(gap, pos - gap));
                for (size_t i = pos; i < piece.size();) {
                    size_t n = std::min(piece.size() - i, utf8_len(uint8_t(piece[i])));
                    out.push_back(piece.substr(i, n));
                    i += n;
                }
                return;
            }
            const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
            size_t s = ov[0], e = ov[1];
            if (e == s) {  // an empty match cuts nothing: step over one character
                pos = s + std::min(piece.size() - s, utf8_len(uint8_t(piece[s])));
                continue;
            }
            if (gap < s) out.push_back(piece.substr(gap, s - gap));
            out.push_back(piece.substr(s, e - s));
            pos = gap = e;
        }
        if (gap < piece.size()) out.push_back(piece.substr(gap));
    }
};

bpe_model::~bpe_model() = default;

result<std::shared_ptr<const bpe_model>> bpe_model::build(const vocab& v, uint32_t match_limit) {
    auto spec = bpe_pre_for(v.pre());
    if (!spec) return spec.err();
    std::shared_ptr<bpe_model> m(new bpe_model());
    m->_ignore_merges = spec->ignore_merges;
    m->_re = std::make_unique<compiled>();
    m->_re->mctx = pcre2_match_context_create(nullptr);
    pcre2_set_match_limit(m->_re->mctx, match_limit ? match_limit : k_match_limit);
    pcre2_set_depth_limit(m->_re->mctx, k_depth_limit);
    for (const std::string& p : spec->patterns) {
        int err = 0;
        PCRE2_SIZE off = 0;
        // MATCH_INVALID_UTF: client text may be invalid UTF-8; such bytes match nothing and
        // fall into gaps, which byte-level BPE encodes like any other bytes.
        pcre2_code* re =
            pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(),
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY,
                          &err, &off, nullptr);
        if (re == nullptr) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            return make_error("tokenizer_bad_vocab", "pre-tokenizer pattern for '" + v.pre() +
                                                         "' at offset " + std::to_string(off) +
                                                         ": " + reinterpret_cast<char*>(msg));
        }
        pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);  // no JIT on this CPU: the interpreter runs
        m->_re->stages.push_back(re);
    }
    for (int b = 0; b < 256; ++b) m->_byte_ids[size_t(b)] = v.find(byte_to_piece_char(uint8_t(b)));
    const auto& merges = v.merges();
    m->_merges.reserve(merges.size());
    for (size_t rank = 0; rank < merges.size(); ++rank) {
        const std::string& line = merges[rank];
        size_t sp = line.find(' ', 1);  // a piece is never empty; the first space separates
        token_id left = sp == std::string::npos ? k_no_token : v.find(line.substr(0, sp));
        token_id right = left == k_no_token ? k_no_token : v.find(line.substr(sp + 1));
        token_id merged =
            right == k_no_token ? k_no_token : v.find(line.substr(0, sp) + line.substr(sp + 1));
        if (merged == k_no_token) {
            return make_error("tokenizer_bad_vocab", "merge " + std::to_string(rank) + " '" + line +
                                                         "' names pieces the vocab lacks");
        }
        uint64_t key = uint64_t(uint32_t(left)) << 32 | uint32_t(right);
        m->_merges.emplace(key, merge{int32_t(rank), merged});  // first (lowest) rank wins
    }
    return std::shared_ptr<const bpe_model>(std::move(m));
}

std::vector<std::string_view> bpe_model::pre_tokenize(std::string_view text) const {
    std::vector<std::string_view> pieces{text}, next;
    if (text.empty()) return {};
    pcre2_match_data* md = pcre2_match_data_create(4, nullptr);
    for (const pcre2_code* re : _re->stages) {
        next.clear();
        next.reserve(pieces.size() * 2);
        for (std::string_view p : pieces) _re->split(re, md, p, next);
        pieces.swap(next);
    }
    pcre2_match_data_free(md);
    return pieces;
}

void bpe_model::encode(const vocab& v, std::string_view text, std::vector<token_id>& out) const {
    for (std::string_view word : pre_tokenize(text)) encode_word(v, word, out);
}

// ---- merging ------------------------------------------------------------------------------------

namespace {

struct symbol {
    int32_t prev;
    int32_t next;
    token_id id;  // k_no_token once merged into its left neighbour
};

// A queued merge of symbol `left` with its right neighbour; stale when either side's id changed.
struct candidate {
    int32_t rank;
    int32_t left;
    token_id left_id, right_id, result;
};

struct candidate_order {
    // Lowest rank first; among equal ranks (the same pair twice) the leftmost.
    bool operator()(const candidate& a, const candidate& b) const {
        return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
    }
};

}  // namespace

void bpe_model::encode_word(const vocab& v, std::string_view word,
                            std::vector<token_id>& out) const {
    // Spell the word in byte-level characters.
    std::string spelled;
    spelled.reserve(word.size() * 2);
    for (char c : word) spelled += byte_to_piece_char(uint8_t(c));
    if (_ignore_merges) {
        if (token_id id = v.find(spelled); id != k_no_token) {
            out.push_back(id);
            return;
        }
    }
    std::vector<symbol> syms;
    syms.reserve(word.size());
    for (char c : word) {
        int32_t i = int32_t(syms.size());
        token_id id = _byte_ids[uint8_t(c)];
        if (id == k_no_token) id = v.unk();  // a vocab without this byte's character
        syms.push_back({i - 1, i + 1, id});
    }
    if (syms.empty()) return;
    syms.back().next = -1;
    std::priority_queue<candidate, std::vector<candidate>, candidate_order> queue;
    auto try_queue = [&](int32_t left) {
        int32_t right = syms[size_t(left)].next;
        if (right < 0) return;
        token_id a = syms[size_t(left)].id, b = syms[size_t(right)].id;
        if (a == k_no_token || b == k_no_token) return;
        auto it = _merges.find(uint64_t(uint32_t(a)) << 32 | uint32_t(b));
        if (it == _merges.end()) return;
        queue.push({it->second.rank, left, a, b, it->second.result});
    };
    for (int32_t i = 0; i + 1 < int32_t(syms.size()); ++i) try_queue(i);
    // Each merge removes one symbol and queues at most two pairs, so the loop runs at most
    // (initial pairs + 2 * symbols) times.
    while (!queue.empty()) {
        candidate c = queue.top();
        queue.pop();
        symbol& l = syms[size_t(c.left)];
        if (l.id != c.left_id || l.next < 0) continue;
        symbol& r = syms[size_t(l.next)];
        if (r.id != c.right_id) continue;  // stale: a side has merged since
        l.id = c.result;
        r.id = k_no_token;
        l.next = r.next;
        if (r.next >= 0) syms[size_t(r.next)].prev = c.left;
        if (l.prev >= 0) try_queue(l.prev);
        try_queue(c.left);
    }
    for (int32_t i = 0; i >= 0; i = syms[size_t(i)].next) {
        if (syms[size_t(i)].id != k_no_token) out.push_back(syms[size_t(i)].id);
    }
}

std::string bpe_model::piece_bytes(std::string_view piece) const {
    const auto& back = bytes_table().back;
    std::string out;
    out.reserve(piece.size());
    for (size_t i = 0; i < piece.size();) {
        size_t n = std::min(piece.size() - i, utf8_len(uint8_t(piece[i])));
        uint32_t cp = 0;
        if (n == 1) {
            cp = uint8_t(piece[i]);
        } else if (n == 2) {
            cp = (uint32_t(uint8_t(piece[i])) & 0x1F) << 6 | (uint8_t(piece[i + 1]) & 0x3F);
        }
        auto it = n <= 2 ? back.find(cp) : back.end();
        if (it != back.end()) {
            out += char(it->second);
        } else {
            out.append(piece.substr(i, n));
        }
        i += n;
    }
    return out;
}

}  // namespace ordo::model
