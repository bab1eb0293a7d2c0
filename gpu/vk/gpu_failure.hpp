// gpu_failure.hpp: why a step, a kv copy or a device build failed, the closed set the gpu
// actor and its receivers decide on. Beside the Vulkan layer, the lowest that makes one: the
// Vulkan layer, the runner and the logits exchange return ordo::error, each made by gpu_error
// with a failure's name as its code (vk_error maps a VkResult to one). The gpu actor reads that
// code once (gpu_failure_of), and from there on the failure travels as this enum: in
// step_failed and kv_copy_failed, in the scheduler's counters, in the kv actor's save and
// restore answers. Whether the device is still trusted (device_fault) and whether a build is
// worth another try (build_retryable) are switches over it. The names are the codes clients and
// logs have always read ("gpu_timeout in decode#12 ...": the scheduler's message).
#pragma once

#include <array>
#include <cstdint>
#include <msgpack.hpp>
#include <string>
#include <string_view>
#include <utility>

#include "actors/runtime/enum_names.hpp"
#include "actors/runtime/result.hpp"

namespace ordo::gpu {

enum class gpu_failure : std::uint8_t {
    // A Vulkan call failed otherwise (vk_error's catch-all). A code outside this table (none
    // is made today) maps here too: an error nobody named is not trusted.
    device_error,
    timeout,           // a submission outlived the watchdog
    device_lost,       // VK_ERROR_DEVICE_LOST, or the device is being rebuilt
    out_of_memory,     // VK_ERROR_OUT_OF_DEVICE_MEMORY / OUT_OF_HOST_MEMORY
    nan,               // non-finite logits or hidden states
    unanswered,        // the scheduler's backstop: no answer to the step within its bound
    internal,          // the scheduler's handler of the step's step_done failed
    bad_step,          // the step is malformed (refused before anything ran)
    busy,              // the queue or the logits slots are full
    bad_request,       // a kv copy is malformed (block, slot or size)
    stale_epoch,       // a kv copy names blocks of an earlier device epoch
    unavailable,       // the device could not be built and is not rebuilt
    stopped,           // the gpu actor is stopping
    bad_config,        // the model or the config does not fit the device
    bad_shape,         // a kernel refused its shapes
    unsupported,       // the device lacks what a kernel needs
    unsupported_type,  // a weight type no kernel runs
    device_not_found,  // gpu.device names no device
    cache_io,          // the pipeline cache could not be read or written
    cache_invalid,     // the pipeline cache's file is not one this build wrote
};

// clang-format off
inline constexpr std::array<std::string_view, 20> gpu_failure_names = {
    "vulkan_error",         "gpu_timeout",          "gpu_device_lost", "gpu_out_of_memory",
    "gpu_nan",              "gpu_unanswered",       "internal",        "gpu_bad_step",
    "gpu_busy",             "gpu_bad_request",      "gpu_stale_epoch", "gpu_unavailable",
    "gpu_stopped",          "gpu_bad_config",       "gpu_bad_shape",   "gpu_unsupported",
    "gpu_unsupported_type", "gpu_device_not_found", "gpu_cache_io",    "gpu_cache_invalid"};
// clang-format on
constexpr const auto& names_of(gpu_failure) {
    return gpu_failure_names;
}
static_assert(static_cast<std::size_t>(gpu_failure::cache_invalid) + 1 == gpu_failure_names.size(),
              "gpu_failure_names names every gpu_failure, in order");

// An error of the gpu layers: the failure's name is its code.
inline error gpu_error(gpu_failure f, std::string message) {
    return error{std::string(enum_name(f)), std::move(message)};
}

// The failure an error of the gpu layers names (gpu_error made it); a code outside the table
// (none is made) is a device error.
inline gpu_failure gpu_failure_of(const error& e) {
    return enum_from_name<gpu_failure>(e.code).value_or(gpu_failure::device_error);
}

// Whether the device is still trusted after a step or a copy failed this way: only a step or
// copy refused before it ran leaves it so; after anything else it is rebuilt.
constexpr bool device_fault(gpu_failure f) {
    switch (f) {
        case gpu_failure::bad_step:
        case gpu_failure::busy:
        case gpu_failure::bad_request:
            return false;
        default:
            return true;
    }
}

// Whether a device build that failed this way is worth another try. The model or the config
// not fitting the device, or no such device, fails the same way again; anything else (a
// warm-up past its bound, a lost device, no memory, another Vulkan error) may not.
constexpr bool build_retryable(gpu_failure f) {
    switch (f) {
        case gpu_failure::bad_config:
        case gpu_failure::bad_shape:
        case gpu_failure::unsupported:
        case gpu_failure::unsupported_type:
        case gpu_failure::device_not_found:
            return false;
        default:
            return true;
    }
}

}  // namespace ordo::gpu

MSGPACK_ADD_ENUM(ordo::gpu::gpu_failure);
