// model_load.hpp: what the bootstrap learns from the model file before any actor starts —
// tokenizer, hyperparameters, fingerprint — so a bad or missing file is a clear start-up error
// (exit 1), not a failure inside an actor.
#pragma once

#include <optional>
#include <string>

#include "actors/config/config.hpp"
#include "actors/runtime/result.hpp"
#include "actors/scheduler/scheduler_core.hpp"
#include "model/gguf.hpp"
#include "model/llama.hpp"
#include "model/tokenizer.hpp"

namespace ordo {

struct loaded_model {
    std::string path;
    bool generated = false;
    model::llama_hparams hp;
    std::optional<model::tokenizer> tokenizer;
    sched::model_info info;
    uint32_t n_ctx = 0;  // the context the server allows
};

// Resolves model.path (empty: the generated default at model.generated_path) and reads it.
result<loaded_model> load_model(const config::config& cfg);

}  // namespace ordo
