// device_select.hpp: the pure policy that turns the `gpu.device` config string into a physical
// device index. Knows nothing about Vulkan handles so tests/gpu can check it on any list.
// Used by gpu/vk/device.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "actors/runtime/result.hpp"

namespace ordo::gpu {

enum class device_kind { discrete, integrated, virtual_gpu, cpu, other };

struct device_candidate {
    std::string name;
    device_kind kind = device_kind::other;
    std::uint64_t device_local_bytes = 0;  // its largest device-local memory heap
};

std::string_view device_kind_name(device_kind k);

// selector: "" or "auto" (any case) = the best kind (discrete, then integrated, then virtual,
// then cpu/other; first of that kind); all digits = index; anything else = case-insensitive
// name substring (first match).
// No match, an index out of range, or no devices -> error "gpu_device_not_found" whose message
// lists every device as "index: name (kind)".
result<std::size_t> select_device(const std::vector<device_candidate>& devices,
                                  std::string_view selector);

}  // namespace ordo::gpu
