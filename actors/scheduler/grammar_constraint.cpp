// grammar_constraint.cpp: see grammar_constraint.hpp.
#include "actors/scheduler/grammar_constraint.hpp"

#include <algorithm>
#include <utility>

namespace ordo::sched {

grammar_vocab::grammar_vocab(std::vector<std::string> token_pieces, std::vector<int32_t> eog_ids)
    : trie(token_pieces), eog(std::move(eog_ids)), pieces(std::move(token_pieces)) {}

grammar_constraint::grammar_constraint(std::unique_ptr<grammar::gbnf> g,
                                       const grammar_vocab& vocab)
    : _g(std::move(g)), _vocab(&vocab), _m(*_g), _masks(vocab.trie) {}

result<grammar_constraint> grammar_constraint::create(std::string_view source,
                                                      const grammar_vocab& vocab) {
    auto g = grammar::parse_gbnf(source);
    if (!g) return g.err();
    return grammar_constraint(std::make_unique<grammar::gbnf>(std::move(*g)), vocab);
}

result<std::span<const uint8_t>> grammar_constraint::allowed() {
    const std::size_t n = _vocab->trie.n_tokens();
    auto m = _masks.allowed(_m);
    if (!m) return m.err();
    _mask = **m;
    const bool end = _m.accepting();
    for (int32_t t : _vocab->eog) {
        if (t >= 0 && static_cast<std::size_t>(t) < n) _mask[static_cast<std::size_t>(t)] = end;
    }
    if (std::none_of(_mask.begin(), _mask.end(), [](uint8_t a) { return a != 0; })) {
        return make_error("grammar_dead_end",
                          "the grammar wants more text here, but no token of the model's "
                          "vocabulary continues it (and the text so far is not a whole "
                          "sentence of the grammar)");
    }
    return std::span<const uint8_t>(_mask);
}

bool grammar_constraint::allows(int32_t token) const {
    if (token < 0 || static_cast<std::size_t>(token) >= _vocab->pieces.size()) return false;
    if (std::find(_vocab->eog.begin(), _vocab->eog.end(), token) != _vocab->eog.end()) {
        return _m.accepting();
    }
    const std::string& piece = _vocab->pieces[static_cast<std::size_t>(token)];
    if (piece.empty()) return false;
    grammar::matcher copy = _m;
    auto ok = copy.advance_utf8(piece);
    return ok.ok() && *ok;
}

status grammar_constraint::accept(int32_t token) {
    if (std::find(_vocab->eog.begin(), _vocab->eog.end(), token) != _vocab->eog.end()) return {};
    const bool known = token >= 0 && static_cast<std::size_t>(token) < _vocab->pieces.size();
    const std::string_view piece =
        known ? std::string_view(_vocab->pieces[static_cast<std::size_t>(token)]) : std::string_view();
    auto ok = piece.empty() ? result<bool>(false) : _m.advance_utf8(piece);
    if (!ok) return ok.err();
    if (!*ok) {
        return make_error("internal", "token " + std::to_string(token) +
                                          " was sampled but the grammar refuses it");
    }
    return {};
}

}  // namespace ordo::sched
