// vocab.cpp: building a vocab from GGUF metadata or from parts (see vocab.hpp).
#include "model/vocab.hpp"

#include <algorithm>
#include <cassert>
#include <cstdio>

#include "model/bpe.hpp"
#include "model/gguf.hpp"

namespace ordo::model {

namespace {

// A u32 special id from metadata: absent -> fallback; 0xFFFFFFFF or out of range -> none.
result<token_id> special_id(const gguf_file& f, const char* key, token_id fallback,
                            size_t n_vocab) {
    if (!f.has(key)) return fallback;
    auto v = f.get_i64(key);
    if (!v) return make_error("tokenizer_bad_vocab", v.err().message);
    if (*v < 0 || static_cast<uint64_t>(*v) >= n_vocab) return k_no_token;
    return static_cast<token_id>(*v);
}

}  // namespace

result<vocab> vocab::from_gguf(const gguf_file& f) {
    if (!f.has("tokenizer.ggml.model")) {
        return make_error("tokenizer_missing",
                          "the model has no tokenizer "
                          "(metadata key tokenizer.ggml.model is absent)");
    }
    vocab_spec spec;
    auto model = f.get_string("tokenizer.ggml.model");
    if (!model) return make_error("tokenizer_bad_vocab", model.err().message);
    spec.model = *model;
    auto pre = f.get_string_or("tokenizer.ggml.pre", "");
    if (!pre) return make_error("tokenizer_bad_vocab", pre.err().message);
    spec.pre = *pre;
    if (!f.has("tokenizer.ggml.tokens")) {
        return make_error("tokenizer_missing", "metadata key tokenizer.ggml.tokens is absent");
    }
    auto pieces = f.get_string_array("tokenizer.ggml.tokens");
    if (!pieces) return make_error("tokenizer_bad_vocab", pieces.err().message);
    spec.pieces = std::move(*pieces);
    if (f.has("tokenizer.ggml.scores")) {
        auto scores = f.get_f32_array("tokenizer.ggml.scores");
        if (!scores) return make_error("tokenizer_bad_vocab", scores.err().message);
        spec.scores = std::move(*scores);
    }
    if (f.has("tokenizer.ggml.merges")) {
        auto merges = f.get_string_array("tokenizer.ggml.merges");
        if (!merges) return make_error("tokenizer_bad_vocab", merges.err().message);
        spec.merges = std::move(*merges);
    }
    if (f.has("tokenizer.ggml.token_type")) {
        auto types = f.get_i32_array("tokenizer.ggml.token_type");
        if (!types) return make_error("tokenizer_bad_vocab", types.err().message);
        for (int32_t t : *types) {
            // Unknown type values are treated as normal pieces rather than rejected.
            spec.types.push_back(t >= 0 && t <= 6 ? static_cast<token_type>(t)
                                                  : token_type::normal);
        }
    }
    const size_t n = spec.pieces.size();
    struct special {
        const char* key;
        token_id* out;
        token_id fallback;
    };
    // llama.cpp's defaults for a SentencePiece vocab when the keys are absent.
    const special specials[] = {
        {"tokenizer.ggml.bos_token_id", &spec.bos, 1},
        {"tokenizer.ggml.eos_token_id", &spec.eos, 2},
        {"tokenizer.ggml.unknown_token_id", &spec.unk, 0},
        {"tokenizer.ggml.padding_token_id", &spec.pad, k_no_token},
        {"tokenizer.ggml.eot_token_id", &spec.eot, k_no_token},
        {"tokenizer.ggml.eom_token_id", &spec.eom, k_no_token},
    };
    for (const auto& s : specials) {
        auto id = special_id(f, s.key, s.fallback, n);
        if (!id) return id.err();
        *s.out = *id < 0 || static_cast<size_t>(*id) >= n ? k_no_token : *id;
    }
    if (spec.model == "gpt2") {
        spec.add_space_prefix = false;
        // An unknown pre-tokenizer keeps the SentencePiece default; the tokenizer refuses it.
        if (auto pre_spec = bpe_pre_for(spec.pre)) spec.add_bos = pre_spec->add_bos;
    }
    struct flag {
        const char* key;
        bool* out;
    };
    const flag flags[] = {
        {"tokenizer.ggml.add_bos_token", &spec.add_bos},
        {"tokenizer.ggml.add_eos_token", &spec.add_eos},
        {"tokenizer.ggml.add_space_prefix", &spec.add_space_prefix},
    };
    for (const auto& fl : flags) {
        auto b = f.get_bool_or(fl.key, *fl.out);
        if (!b) return make_error("tokenizer_bad_vocab", b.err().message);
        *fl.out = *b;
    }
    return from_spec(std::move(spec));
}

result<vocab> vocab::from_spec(vocab_spec spec) {
    const size_t n = spec.pieces.size();
    if (n == 0 || n > static_cast<size_t>(INT32_MAX)) {
        return make_error("tokenizer_bad_vocab", "vocab has " + std::to_string(n) + " tokens");
    }
    if (!spec.scores.empty() && spec.scores.size() != n) {
        return make_error(
            "tokenizer_bad_vocab",
            std::to_string(spec.scores.size()) + " scores for " + std::to_string(n) + " tokens");
    }
    if (!spec.types.empty() && spec.types.size() != n) {
        return make_error("tokenizer_bad_vocab", std::to_string(spec.types.size()) +
                                                     " token types for " + std::to_string(n) +
                                                     " tokens");
    }
    vocab v;
    v._model = std::move(spec.model);
    v._pre = std::move(spec.pre);
    v._pieces = std::move(spec.pieces);
    v._scores = spec.scores.empty() ? std::vector<float>(n, 0.0f) : std::move(spec.scores);
    v._types =
        spec.types.empty() ? std::vector<token_type>(n, token_type::normal) : std::move(spec.types);
    auto checked = [n](token_id id) { return id >= 0 && size_t(id) < n ? id : k_no_token; };
    v._bos = checked(spec.bos);
    v._eos = checked(spec.eos);
    v._unk = checked(spec.unk);
    v._pad = checked(spec.pad);
    v._eot = checked(spec.eot);
    v._eom = checked(spec.eom);
    v._merges = std::move(spec.merges);
    v._add_bos = spec.add_bos;
    v._add_eos = spec.add_eos;
    v._add_space_prefix = spec.add_space_prefix;
    v._index.reserve(n);
    for (size_t i = 0; i < n; ++i) v._index.emplace(v._pieces[i], static_cast<token_id>(i));
    for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", b);
        v._byte_ids[b] = v.find(name);
    }
    v.index_specials();
    return v;
}

void vocab::index_specials() {
    // The end-of-turn texts llama.cpp also treats as end of generation when they are control
    // tokens, whatever ids the metadata names.
    static constexpr std::string_view k_eog_texts[] = {
        "<|eot_id|>",
        "<|eom_id|>",
        "<|end_of_text|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<|end|>",
        "<end_of_turn>",
        "<EOT>",
        "<\xEF\xBD\x9C"
        "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",  // <｜end▁of▁sentence｜>
    };
    for (token_id id : {_eos, _eot, _eom}) {
        if (id != k_no_token) _eog.push_back(id);
    }
    for (std::string_view text : k_eog_texts) {
        token_id id = find(text);
        if (id != k_no_token && type(id) == token_type::control) _eog.push_back(id);
    }
    std::sort(_eog.begin(), _eog.end());
    _eog.erase(std::unique(_eog.begin(), _eog.end()), _eog.end());
    for (size_t i = 0; i < _pieces.size(); ++i) {
        token_type t = _types[i];
        if ((t == token_type::control || t == token_type::user_defined) && !_pieces[i].empty()) {
            _specials.push_back(token_id(i));
        }
    }
    // Longest first, then by id, so the scan prefers the longest match deterministically.
    std::stable_sort(_specials.begin(), _specials.end(), [this](token_id a, token_id b) {
        return _pieces[size_t(a)].size() > _pieces[size_t(b)].size();
    });
}

bool vocab::is_eog(token_id id) const {
    return std::binary_search(_eog.begin(), _eog.end(), id);
}

std::string vocab::describe() const {
    return _pre.empty() ? _model : _model + " (pre " + _pre + ")";
}

const std::string& vocab::piece(token_id id) const {
    assert(valid(id));
    return _pieces[static_cast<size_t>(id)];
}

float vocab::score(token_id id) const {
    assert(valid(id));
    return _scores[static_cast<size_t>(id)];
}

token_type vocab::type(token_id id) const {
    assert(valid(id));
    return _types[static_cast<size_t>(id)];
}

token_id vocab::find(std::string_view piece) const {
    auto it = _index.find(piece);
    return it == _index.end() ? k_no_token : it->second;
}

std::optional<uint8_t> vocab::token_byte(token_id id) const {
    if (!valid(id)) return std::nullopt;
    const std::string& p = piece(id);
    // Exactly "<0xNN>" with upper- or lower-case hex digits.
    if (p.size() != 6 || p[0] != '<' || p[1] != '0' || p[2] != 'x' || p[5] != '>') {
        return std::nullopt;
    }
    auto hex = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        return -1;
    };
    int hi = hex(p[3]), lo = hex(p[4]);
    if (hi < 0 || lo < 0) return std::nullopt;
    return static_cast<uint8_t>(hi * 16 + lo);
}

}  // namespace ordo::model
