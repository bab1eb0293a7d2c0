// vk_util.cpp: see vk_util.hpp.
#include "gpu/vk/vk_util.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace ordo::gpu {

std::shared_ptr<spdlog::logger> logger() {
    static std::once_flag once;
    static std::shared_ptr<spdlog::logger> log;
    std::call_once(once, [] {
        log = spdlog::get("gpu");
        if (!log) {
            log = spdlog::stderr_color_mt("gpu");
        }
    });
    return log;
}

std::string_view vk_result_name(VkResult r) {
    switch (r) {
        case VK_SUCCESS:
            return "VK_SUCCESS";
        case VK_NOT_READY:
            return "VK_NOT_READY";
        case VK_TIMEOUT:
            return "VK_TIMEOUT";
        case VK_INCOMPLETE:
            return "VK_INCOMPLETE";
        case VK_ERROR_OUT_OF_HOST_MEMORY:
            return "VK_ERROR_OUT_OF_HOST_MEMORY";
        case VK_ERROR_OUT_OF_DEVICE_MEMORY:
            return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
        case VK_ERROR_INITIALIZATION_FAILED:
            return "VK_ERROR_INITIALIZATION_FAILED";
        case VK_ERROR_DEVICE_LOST:
            return "VK_ERROR_DEVICE_LOST";
        case VK_ERROR_MEMORY_MAP_FAILED:
            return "VK_ERROR_MEMORY_MAP_FAILED";
        case VK_ERROR_LAYER_NOT_PRESENT:
            return "VK_ERROR_LAYER_NOT_PRESENT";
        case VK_ERROR_EXTENSION_NOT_PRESENT:
            return "VK_ERROR_EXTENSION_NOT_PRESENT";
        case VK_ERROR_FEATURE_NOT_PRESENT:
            return "VK_ERROR_FEATURE_NOT_PRESENT";
        case VK_ERROR_INCOMPATIBLE_DRIVER:
            return "VK_ERROR_INCOMPATIBLE_DRIVER";
        case VK_ERROR_TOO_MANY_OBJECTS:
            return "VK_ERROR_TOO_MANY_OBJECTS";
        case VK_ERROR_OUT_OF_POOL_MEMORY:
            return "VK_ERROR_OUT_OF_POOL_MEMORY";
        default:
            return "VK_ERROR_UNKNOWN";
    }
}

error vk_error(VkResult r, std::string_view what) {
    const gpu_failure f = r == VK_ERROR_DEVICE_LOST ? gpu_failure::device_lost
                          : r == VK_TIMEOUT         ? gpu_failure::timeout
                          : (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY)
                              ? gpu_failure::out_of_memory
                              : gpu_failure::device_error;
    return gpu_error(f, std::string(what) + ": " + std::string(vk_result_name(r)) + " (" +
                            std::to_string(static_cast<int>(r)) + ")");
}

void check_failed(const char* expr, const char* file, int line, std::string_view why) {
    std::fprintf(stderr, "ordo gpu invariant failed: %s (%s) at %s:%d\n", expr,
                 std::string(why).c_str(), file, line);
    std::fflush(stderr);
    std::abort();
}

}  // namespace ordo::gpu
