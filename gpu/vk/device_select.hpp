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

struct memory_heap_info {
    std::uint64_t size_bytes = 0;
    bool device_local = false;
};

// A device's memory as Vulkan lists it (VkPhysicalDeviceMemoryProperties): types with their
// property flags (Vulkan's bits, below) and heap, and the heaps.
struct memory_facts {
    static constexpr std::uint32_t device_local = 1, host_visible = 2, host_coherent = 4,
                                   host_cached = 8;  // VK_MEMORY_PROPERTY_*_BIT
    struct type {
        std::uint32_t flags = 0;
        std::uint32_t heap = 0;
    };
    std::vector<type> types;
    std::vector<memory_heap_info> heaps;

    // Whether type i is host-visible and coherent: a buffer of it is mapped.
    bool mappable(int i) const {
        const std::uint32_t host = host_visible | host_coherent;
        return i >= 0 && std::size_t(i) < types.size() &&
               (types[std::size_t(i)].flags & host) == host;
    }
};

// The memory type a buffer takes among those `type_bits` allows (bit i: type i), -1 for none.
// Kernel buffers (`for_kernels`: weights, KV, activations): device-local, and also host-visible
// and coherent (uploads then skip staging) only where that type's heap is as large as the
// largest device-local heap: lavapipe, integrated GPUs, a discrete GPU with resizable BAR. A
// discrete GPU without it also lists such a type, on a window of 256 MiB or so of its memory,
// which a model's weights or KV pool would not fit: plain device-local there. Host buffers:
// host-visible and coherent, cached where such a type exists. Else any allowed type.
int choose_memory_type(const memory_facts& m, std::uint32_t type_bits, bool for_kernels);

}  // namespace ordo::gpu
