// grammar_constraint.cpp: see grammar_constraint.hpp.
#include "scheduler/grammar_constraint.hpp"

#include <algorithm>
#include <cassert>
#include <utility>

namespace ordo::sched {

grammar_vocab::grammar_vocab(std::vector<std::string> token_pieces, std::vector<int32_t> eog_ids)
    : trie(token_pieces), eog(std::move(eog_ids)), pieces(std::move(token_pieces)) {}

grammar_constraint::grammar_constraint(std::unique_ptr<grammar::gbnf> g, const grammar_vocab& vocab,
                                       std::vector<std::string> triggers)
    : _g(std::move(g)), _vocab(&vocab), _m(*_g), _masks(vocab.trie), _active(triggers.empty()) {
    for (std::string& t : triggers) {
        assert(!t.empty() && t != "^");
        if (t[0] == '^') {
            _at_start.push_back(t.substr(1));
        } else {
            _anywhere.push_back(std::move(t));
        }
    }
}

result<grammar_constraint> grammar_constraint::create(std::string_view source,
                                                      const grammar_vocab& vocab,
                                                      std::vector<std::string> triggers) {
    auto g = grammar::parse_gbnf(source);
    if (!g) return g.err();
    return grammar_constraint(std::make_unique<grammar::gbnf>(std::move(*g)), vocab,
                              std::move(triggers));
}

void grammar_constraint::watch(std::string_view piece) {
    // Takes the text from `at` of `text` as the grammar's beginning, if the grammar has it.
    auto begin = [&](std::string_view text) {
        grammar::matcher m = _m;
        auto ok = m.advance_utf8(text);
        if (!ok.ok() || !*ok) return false;
        _m = std::move(m);
        _active = true;
        return true;
    };
    if (!_at_start.empty()) {
        // The output's first non-whitespace bytes, as long as a start trigger may match them.
        for (char c : piece) {
            if (_start.empty() && (c == ' ' || c == '\t' || c == '\n' || c == '\r')) continue;
            _start += c;
        }
        bool open = false;
        for (const std::string& t : _at_start) {
            if (_start.size() >= t.size() && _start.compare(0, t.size(), t) == 0) {
                if (begin(_start)) return;
            } else if (t.compare(0, _start.size(), _start) == 0) {
                open = true;
            }
        }
        if (!open) _at_start.clear(), _start.clear();
    }
    if (_anywhere.empty()) return;
    const std::string text = _recent + std::string(piece);
    // Each place a trigger appears, in order, until the grammar takes the text from one.
    size_t from = 0;
    while (true) {
        size_t first = std::string::npos;
        for (const std::string& t : _anywhere) first = std::min(first, text.find(t, from));
        if (first == std::string::npos) break;
        if (begin(std::string_view(text).substr(first))) return;
        from = first + 1;
    }
    size_t keep = 0;
    for (const std::string& t : _anywhere) keep = std::max(keep, t.size() - 1);
    _recent = text.substr(std::max(from, text.size() - std::min(text.size(), keep)));
}

result<std::span<const uint8_t>> grammar_constraint::allowed() {
    const std::size_t n = _vocab->trie.n_tokens();
    if (!_active) {
        _mask.assign(n, 1);  // a lazy grammar before its trigger allows everything
        return std::span<const uint8_t>(_mask);
    }
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
    if (!_active) return true;
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
        known ? std::string_view(_vocab->pieces[static_cast<std::size_t>(token)])
              : std::string_view();
    if (!_active) {
        watch(piece);
        return {};
    }
    auto ok = piece.empty() ? result<bool>(false) : _m.advance_utf8(piece);
    if (!ok) return ok.err();
    if (!*ok) {
        return make_error("internal", "token " + std::to_string(token) +
                                          " was sampled but the grammar refuses it");
    }
    return {};
}

}  // namespace ordo::sched
