// model_load.hpp: what the bootstrap learns from the model file before any actor starts —
// tokenizer, hyperparameters, fingerprint — and the check that every tensor the forward pass
// reads is there, computable and of the right shape (model::map_llama_weights, the same check the
// gpu runner runs when it uploads), of a type the Vulkan kernels run (gpu::check_weight_types).
// A model that fails here can never run: main exits 2 on it, as on a bad config, instead of
// starting a server whose device build must fail.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "actors/config/config.hpp"
#include "actors/runtime/result.hpp"
#include "model/gguf.hpp"
#include "model/llama.hpp"
#include "model/tokenizer.hpp"
#include "net/chat.hpp"
#include "scheduler/scheduler_core.hpp"

namespace ordo {

struct loaded_model {
    std::string path;
    bool generated = false;
    model::llama_hparams hp;
    std::optional<model::tokenizer> tokenizer;
    sched::model_info info;
    uint32_t n_ctx = 0;  // the context the server allows
    // The chat template (model.chat_template_path, else the GGUF's tokenizer.chat_template).
    std::shared_ptr<const net::chat_setup> chat;
};

// Resolves model.path (empty: the generated default at model.generated_path), reads it and
// checks its tensors and model.context_tokens against it. Every error message names the file's
// path exactly once. Errors: model_missing (no generated default), gguf_* (unreadable or
// malformed file), llama_* (hyperparameters or tensors), gpu_unsupported_type (a weight type
// the kernels do not run: none the loader accepts today), the vocab's (tokenizer_missing,
// tokenizer_bad_vocab: a vocab ordo cannot tokenize loads, see tokenizer::support()),
// config_invalid (model.context_tokens above the model's context; model.chat_template_path
// unreadable, or a template there that does not parse). A template in the GGUF that does not
// parse is not an error: the model serves, and `chat` answers template_error.
result<loaded_model> load_model(const config::config& cfg);

// speculative.draft_model (mode = "draft"): read and checked as load_model checks the served
// model, at its own trained context, and its vocabulary compared with the served model's
// piece by piece (a draft proposes token ids: the same id must mean the same token). Errors:
// load_model's, and config_invalid naming speculative.draft_model when the vocabularies differ.
result<loaded_model> load_draft_model(const config::config& cfg, const loaded_model& served);

}  // namespace ordo
