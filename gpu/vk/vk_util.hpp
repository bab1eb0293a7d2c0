// vk_util.hpp: small helpers shared by the ordo_gpu sources: VkResult -> ordo::error mapping,
// the always-on invariant check (asserts must survive RelWithDebInfo's NDEBUG), and the "gpu"
// logger. Used only inside gpu/.
#pragma once

#include <spdlog/logger.h>
#include <vulkan/vulkan.h>

#include <memory>
#include <string>
#include <string_view>

#include "actors/runtime/result.hpp"
#include "gpu/vk/gpu_failure.hpp"

namespace ordo::gpu {

// The "gpu" spdlog logger (created on first use, stderr colour sink).
std::shared_ptr<spdlog::logger> logger();

// Name of a VkResult ("VK_ERROR_DEVICE_LOST").
std::string_view vk_result_name(VkResult r);

// Maps a failed Vulkan call to an ordo::error (gpu_error): a lost device, a timeout and no
// memory keep their own failures; everything else is device_error ("vulkan_error"). `what`
// names the call and its context.
error vk_error(VkResult r, std::string_view what);

// Programmer-error check that stays on in release builds: logs and aborts. Used only for
// invariants the caller controls (binding counts, push sizes), never for bad input or device
// faults, which are returned as ordo::error.
[[noreturn]] void check_failed(const char* expr, const char* file, int line, std::string_view why);

}  // namespace ordo::gpu

#define ORDO_GPU_CHECK(expr, why)                                                 \
    do {                                                                          \
        if (!(expr)) ::ordo::gpu::check_failed(#expr, __FILE__, __LINE__, (why)); \
    } while (0)
