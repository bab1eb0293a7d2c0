// runner_generate.hpp: text generation through the gpu actor, for `ordo-model generate
// --backend vulkan`: the same contract as model::generate (reference.hpp) — feed the prompt,
// sample up to n_predict tokens, stop after a stop token, stream each id to on_token — but
// every forward step is a gpu::step sent to a real gpu actor (gpu_session), one sequence with
// its blocks 0, 1, 2, ... The prompt is sent in prefill chunks of at most max_batch_tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "actors/runtime/result.hpp"
#include "model/reference.hpp"

namespace ordo::gpu {

struct vulkan_generate_options {
    std::string model_path;
    std::string device;                    // gpu.device selector
    bool kv_f16 = false;                   // f32 KV keeps the output closest to the CPU reference
    std::uint32_t flush_every_layers = 0;  // 0: the device's
    std::uint64_t watchdog_ms = 60'000;
};

// Errors: generate_ctx_full (prompt + n_predict past the model's context), the model's,
// device start-up, and any step failure (its code, naming the segment).
result<std::vector<std::uint32_t>> generate_vulkan(
    const vulkan_generate_options& vo, std::span<const std::uint32_t> prompt,
    const model::generate_options& opt, model::sampler& smp,
    const std::function<void(std::uint32_t)>& on_token);

}  // namespace ordo::gpu
