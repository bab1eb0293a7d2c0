// device_choices.cpp: see device_choices.hpp.
#include "actors/config/device_choices.hpp"

#include <algorithm>

namespace ordo::config {
namespace {

constexpr std::uint64_t kv_memory_bytes_most = std::uint64_t{1} << 40;  // the schema's bound

// "8192 MiB"; under 1 MiB "256 KiB".
std::string mib(std::uint64_t bytes) {
    return bytes >= (std::uint64_t{1} << 20) ? std::to_string(bytes >> 20) + " MiB"
                                             : std::to_string(bytes >> 10) + " KiB";
}

std::string device_words(const device_facts& d) {
    if (!d.found) return "no device found (" + d.why_not_found + "): a CPU device's";
    return d.gpu ? "a GPU" : "a CPU device";
}

// The bytes of every sequence's whole context (max_sequences x the context's blocks), at most
// the schema's bound.
std::uint64_t whole_contexts_bytes(const config& cfg, const model_facts& m) {
    const std::uint64_t block_tokens = std::max<std::uint32_t>(cfg.gpu.kv_block_tokens, 1);
    const std::uint64_t blocks_per_seq = (std::uint64_t{m.n_ctx} + block_tokens - 1) / block_tokens;
    // At most 1024 sequences x 2^20 positions x a block's bytes: no overflow before the cap.
    return std::min(std::uint64_t{cfg.scheduler.max_sequences} * blocks_per_seq * m.kv_block_bytes,
                    kv_memory_bytes_most);
}

std::string whole_contexts_words(const config& cfg, const model_facts& m, std::uint64_t need) {
    return std::to_string(cfg.scheduler.max_sequences) + " sequences x " + std::to_string(m.n_ctx) +
           " positions need " + mib(need);
}

// The served pool's bytes on a GPU: every sequence's whole context where the device has room,
// else the pool's share of the device-local memory left beside the weights.
device_choice kv_on_gpu(const config& cfg, const device_facts& d, const model_facts& m) {
    const std::uint64_t need = whole_contexts_bytes(cfg, m);
    const std::uint64_t free =
        d.device_local_bytes > m.weights_bytes ? d.device_local_bytes - m.weights_bytes : 0;
    // A draft model's pool is the served one's scaled by their blocks' sizes, never larger
    // (tools/server/server.cpp, draft_gpu_options_from): both come out of the share.
    const std::uint64_t served = std::max<std::uint64_t>(m.kv_block_bytes, 1);
    const std::uint64_t draft = std::min(m.draft_kv_block_bytes, served);
    const std::uint64_t share = static_cast<std::uint64_t>(
        static_cast<long double>(free / kv_share_of_free_device_memory_den) * served /
        (served + draft));
    const std::uint64_t value =
        std::clamp(std::min(need, share), kv_memory_bytes_least, kv_memory_bytes_most);
    std::string why = device_words(d) + ": " + whole_contexts_words(cfg, m, need);
    if (need <= share) {
        why += ", which the device holds";
    } else {
        why +=
            std::string(draft != 0 ? "; the pools (served and draft) take" : "; the pool takes") +
            " half of the " + mib(free) + " of device memory beside the weights";
    }
    return {"gpu.kv_memory_bytes", value, why};
}

// On a CPU device (or none found): every sequence's whole context, at most
// kv_memory_bytes_cpu_device of the host's memory. A small model's pool is then a few MiB
// instead of 256, which the pool's clearing at start would otherwise touch page by page.
device_choice kv_on_cpu(const config& cfg, const device_facts& d, const model_facts& m) {
    const std::uint64_t need = whole_contexts_bytes(cfg, m);
    const std::uint64_t value =
        std::max(std::min(need, kv_memory_bytes_cpu_device), kv_memory_bytes_least);
    std::string why = device_words(d) + ": " + whole_contexts_words(cfg, m, need);
    why += need <= kv_memory_bytes_cpu_device
               ? ""
               : "; its device memory is the host's: at most " + mib(kv_memory_bytes_cpu_device);
    return {"gpu.kv_memory_bytes", value, why};
}

}  // namespace

std::vector<device_choice> resolve_device_choices(config& cfg, const device_facts& device,
                                                  const model_facts& model) {
    std::vector<device_choice> out;
    const bool gpu = device.found && device.gpu;
    if (cfg.scheduler.max_sequences == 0) {
        const std::uint32_t want = gpu ? max_sequences_gpu_device : max_sequences_cpu_device;
        cfg.scheduler.max_sequences = std::min(want, cfg.scheduler.max_batch_tokens);
        std::string why = device_words(device);
        if (cfg.scheduler.max_sequences < want) {
            why += "; at most scheduler.max_batch_tokens";
        }
        out.push_back({"scheduler.max_sequences", cfg.scheduler.max_sequences, why});
    }
    if (cfg.gpu.kv_memory_bytes == 0) {
        if (cfg.gpu.kv_blocks != 0) {
            cfg.gpu.kv_memory_bytes = kv_memory_bytes_cpu_device;  // unused: kv_blocks sizes it
        } else if (gpu) {
            device_choice c = kv_on_gpu(cfg, device, model);
            cfg.gpu.kv_memory_bytes = c.value;
            out.push_back(std::move(c));
        } else {
            device_choice c = kv_on_cpu(cfg, device, model);
            cfg.gpu.kv_memory_bytes = c.value;
            out.push_back(std::move(c));
        }
    }
    return out;
}

std::string describe(const std::vector<device_choice>& choices) {
    std::string s;
    for (const device_choice& c : choices) {
        if (!s.empty()) s += "; ";
        s += c.key + " = " + std::to_string(c.value) + " (" + c.why + ")";
    }
    return s;
}

}  // namespace ordo::config
