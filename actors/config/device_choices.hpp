// device_choices.hpp: the configuration keys whose 0 means "the device's choice", and what each
// becomes once the device the server runs on is known. tools/server/server.cpp probes the
// device (gpu::device::list_devices, the selector of gpu.device) and resolves them before any
// actor is built, so every actor sees plain values and the cross rules hold for them.
//
// A GPU and a CPU device (Mesa's lavapipe) want different sizes: on a GPU a step of 64
// sequences costs little more than one of 16 (an H200 decoded the 1B Q4_K file at 2,260 tok/s
// with 64 sequences against 1,312 with 16, gpu/PERF.md session 24), and its memory holds the KV
// of long contexts; on lavapipe a step costs in proportion to its tokens and the "device
// memory" is the host's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "actors/config/config.hpp"

namespace ordo::config {

// scheduler.max_sequences = 0.
inline constexpr std::uint32_t max_sequences_cpu_device = 16;
inline constexpr std::uint32_t max_sequences_gpu_device = 64;
// gpu.kv_memory_bytes = 0 on a CPU device (or where no device was found): every sequence's whole
// context, at most this.
inline constexpr std::uint64_t kv_memory_bytes_cpu_device = std::uint64_t{256} << 20;
// On a GPU the KV pools (the served model's and a draft model's) take at most this share of
// what the device-local heap holds beside the weights: the rest is left to activations, the
// mat-mul split's scratch, the logits buffers and whatever else shares the device.
inline constexpr std::uint64_t kv_share_of_free_device_memory_den = 2;  // one half
// Never less than this, however full the device (the schema's least value).
inline constexpr std::uint64_t kv_memory_bytes_least = std::uint64_t{1} << 20;

// What the probe found.
struct device_facts {
    bool found = false;  // false: no device matched gpu.device (or no Vulkan): the CPU choices
    bool gpu = false;    // a discrete, integrated or virtual GPU; false: a CPU device
    std::string name;    // the server's log line says it
    std::uint64_t device_local_bytes = 0;  // its largest device-local heap
    std::string why_not_found;             // when !found: the probe's error
};

// What the served model needs, from its file and hyperparameters (no device needed).
struct model_facts {
    std::uint64_t weights_bytes = 0;   // the model files' sizes: served and draft
    std::uint64_t kv_block_bytes = 0;  // one KV block of the served model (gpu.kv_block_tokens)
    std::uint64_t draft_kv_block_bytes = 0;  // the draft model's (0: none)
    std::uint32_t n_ctx = 0;  // positions one sequence may reach (model.context_tokens or trained)
};

// One key the device chose: shown in the start-up log line.
struct device_choice {
    std::string key;  // "scheduler.max_sequences"
    std::uint64_t value = 0;
    std::string why;
};

// Replaces every 0 that means "the device's choice" in cfg (scheduler.max_sequences,
// gpu.kv_memory_bytes) by the device's value and returns what it chose, in key order. Keys the
// config set are left alone, and a choice never breaks a cross rule with them (max_sequences is
// at most max_batch_tokens).
std::vector<device_choice> resolve_device_choices(config& cfg, const device_facts& device,
                                                  const model_facts& model);

// "scheduler.max_sequences = 64 (...), gpu.kv_memory_bytes = ... (...)" for the log.
std::string describe(const std::vector<device_choice>& choices);

}  // namespace ordo::config
