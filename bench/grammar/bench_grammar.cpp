// bench_grammar.cpp: `ordo-bench-grammar [VOCAB.gguf ...]` measures what grammar-constrained
// sampling adds per generated token: the allowed-token mask of the grammar's state (a trie walk
// over the vocabulary, grammar/token_masks.hpp), cold (every state computed) and through the
// per-request cache, while a JSON document is fed token by token as the model would generate
// it (its tokenization under the vocabulary). One JSON line per vocabulary: tokens, trie
// nodes, mask ms per token (mean, max) cold and cached, the cache's hit rate; and the check the
// sampler tries first (the next token alone against the grammar, sampler::sample_checked),
// which is all a step costs while the model's own draw follows the grammar. Default
// vocabularies: Llama 2's 32000-token SentencePiece and Llama 3's 128256-token BPE from
// ../shared/models. Not a test: it prints numbers. (The grammar allows leading whitespace: a
// SentencePiece vocabulary's first token of the document carries the dummy-prefix space.)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "grammar/gbnf.hpp"
#include "grammar/json.hpp"
#include "grammar/token_masks.hpp"
#include "model/gguf.hpp"
#include "model/tokenizer.hpp"

using namespace ordo;

namespace {

const char* document =
    R"({"name": "Ada Lovelace", "born": 1815, "fields": ["mathematics", "computing"],)"
    R"( "notes": "First to publish an algorithm for a machine.", "ratio": 0.5, "alive": false})";

double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int run(const std::string& path) {
    auto f = model::gguf_file::open(path);
    if (!f) {
        std::fprintf(stderr, "%s: %s\n", path.c_str(), f.err().message.c_str());
        return 1;
    }
    auto tok = model::tokenizer::from_gguf(*f);
    if (!tok) {
        std::fprintf(stderr, "%s: %s\n", path.c_str(), tok.err().message.c_str());
        return 1;
    }
    const std::size_t n = tok->vocab().size();
    std::vector<std::string> pieces(n);
    for (std::size_t i = 0; i < n; ++i) {
        pieces[i] = tok->token_bytes(static_cast<model::token_id>(i), false);
    }
    auto g = grammar::parse_gbnf(grammar::json_object_gbnf);
    if (!g) {
        std::fprintf(stderr, "grammar: %s\n", g.err().message.c_str());
        return 1;
    }
    auto t0 = std::chrono::steady_clock::now();
    grammar::vocab_trie trie(pieces);
    double trie_ms = ms_since(t0);
    std::vector<model::token_id> ids = tok->encode(document, false);
    struct stats {
        double sum = 0, max = 0;
        std::size_t n = 0;
    };
    stats cold, cached, check;
    grammar::token_masks cache(trie);
    grammar::matcher m(*g);
    bool first = true;
    for (model::token_id id : ids) {
        grammar::token_masks fresh(trie);  // cold: nothing cached
        auto c0 = std::chrono::steady_clock::now();
        auto a = fresh.allowed(m);
        double c_ms = ms_since(c0);
        auto w0 = std::chrono::steady_clock::now();
        auto b = cache.allowed(m);
        double w_ms = ms_since(w0);
        if (!a || !b) {
            std::fprintf(stderr, "mask: %s\n", (!a ? a.err() : b.err()).message.c_str());
            return 1;
        }
        if ((**b)[static_cast<std::size_t>(id)] == 0) {
            std::fprintf(stderr, "the document's token %d is not allowed by its own grammar\n", id);
            return 1;
        }
        // The sampler's first try: the drawn token checked alone (a matcher copy advanced by
        // its bytes), the mask only when the grammar refuses it.
        auto k0 = std::chrono::steady_clock::now();
        grammar::matcher probe = m;
        auto taken = probe.advance_utf8(tok->token_bytes(id, first));
        double k_ms = ms_since(k0);
        if (!taken || !*taken) {
            std::fprintf(stderr, "the check refused the document's token %d\n", id);
            return 1;
        }
        check.sum += k_ms, check.max = std::max(check.max, k_ms), ++check.n;
        cold.sum += c_ms, cold.max = std::max(cold.max, c_ms), ++cold.n;
        cached.sum += w_ms, cached.max = std::max(cached.max, w_ms), ++cached.n;
        auto ok = m.advance_utf8(tok->token_bytes(id, first));
        first = false;
        if (!ok || !*ok) {
            std::fprintf(stderr, "the matcher refused token %d\n", id);
            return 1;
        }
    }
    std::printf(
        "{\"vocab\":\"%s\",\"tokens\":%zu,\"trie_nodes\":%zu,\"trie_ms\":%.1f,"
        "\"doc_tokens\":%zu,\"cold_ms_mean\":%.3f,\"cold_ms_max\":%.3f,"
        "\"cached_ms_mean\":%.3f,\"cached_ms_max\":%.3f,\"hit_rate\":%.2f,"
        "\"check_ms_mean\":%.4f,\"check_ms_max\":%.4f,\"accepting\":%s}\n",
        path.substr(path.rfind('/') + 1).c_str(), n, trie.n_nodes(), trie_ms, ids.size(),
        cold.sum / double(cold.n), cold.max, cached.sum / double(cached.n), cached.max,
        double(cache.hits()) / double(cache.hits() + cache.misses()), check.sum / double(check.n),
        check.max, m.accepting() ? "true" : "false");
    std::fflush(stdout);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<std::string> paths;
    for (int i = 1; i < argc; ++i) paths.emplace_back(argv[i]);
    if (paths.empty()) {
        paths = {std::string(ORDO_SHARED_MODELS_DIR) + "/llama-spm-vocab/ggml-vocab-llama-spm.gguf",
                 std::string(ORDO_SHARED_MODELS_DIR) + "/vocab/ggml-vocab-llama-bpe.gguf"};
    }
    int rc = 0;
    for (const std::string& p : paths) rc |= run(p);
    return rc;
}
