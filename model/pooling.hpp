// pooling.hpp: how an embedding pools the final hidden states of its input's tokens (after the
// output norm, before the classifier) into one vector. Header-only and dependency-free: the
// config names it (model.embedding_pooling), the GGUF reader maps the file's key to it, the
// scheduler pools by it and the CPU reference computes the expected embedding with it.
#pragma once

#include <cstdint>
#include <optional>

namespace ordo::model {

enum class pooling : std::uint8_t {
    mean,  // the average over every token of the input
    last,  // the last token's: what decoder-only embedding models are trained for
    cls,   // the first token's (a BERT-style CLS token; for a causal model it sees only itself)
};

// GGUF's `{arch}.pooling_type` as llama.cpp writes it (enum llama_pooling_type): 1 mean, 2 cls,
// 3 last. 0 (none) and 4 (rank, a reranker's head) name no pooling ordo does: nullopt, and the
// configured default applies.
constexpr std::optional<pooling> pooling_from_gguf(std::uint32_t v) {
    switch (v) {
        case 1:
            return pooling::mean;
        case 2:
            return pooling::cls;
        case 3:
            return pooling::last;
        default:
            return std::nullopt;
    }
}

}  // namespace ordo::model
