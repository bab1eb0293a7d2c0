// device_select.cpp: see device_select.hpp.
#include "gpu/vk/device_select.hpp"

#include <algorithm>
#include <cctype>

#include "gpu/vk/gpu_failure.hpp"

namespace ordo::gpu {

namespace {

// Longest selector accepted as an index; anything longer is treated as a name.
constexpr std::size_t index_digits_max = 6;

int kind_rank(device_kind k) {
    switch (k) {
        case device_kind::discrete:
            return 0;
        case device_kind::integrated:
            return 1;
        case device_kind::virtual_gpu:
            return 2;
        case device_kind::cpu:
            return 3;
        case device_kind::other:
            return 4;
    }
    return 5;
}

std::string lower(std::string_view s) {
    std::string out(s);
    std::transform(out.begin(), out.end(), out.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return out;
}

std::string list_devices(const std::vector<device_candidate>& devices) {
    if (devices.empty()) {
        return "no Vulkan devices found";
    }
    std::string s = "available devices:";
    for (std::size_t i = 0; i < devices.size(); ++i) {
        s += " [" + std::to_string(i) + ": " + devices[i].name + " (" +
             std::string(device_kind_name(devices[i].kind)) + ")]";
    }
    return s;
}

}  // namespace

std::string_view device_kind_name(device_kind k) {
    switch (k) {
        case device_kind::discrete:
            return "discrete";
        case device_kind::integrated:
            return "integrated";
        case device_kind::virtual_gpu:
            return "virtual";
        case device_kind::cpu:
            return "cpu";
        case device_kind::other:
            return "other";
    }
    return "other";
}

result<std::size_t> select_device(const std::vector<device_candidate>& devices,
                                  std::string_view selector) {
    if (devices.empty()) {
        return gpu_error(gpu_failure::device_not_found, "no Vulkan physical devices");
    }
    if (selector.empty() || lower(selector) == "auto") {
        std::size_t best = 0;
        for (std::size_t i = 1; i < devices.size(); ++i) {
            if (kind_rank(devices[i].kind) < kind_rank(devices[best].kind)) {
                best = i;
            }
        }
        return best;
    }
    bool digits = selector.size() <= index_digits_max &&
                  std::all_of(selector.begin(), selector.end(),
                              [](unsigned char c) { return std::isdigit(c) != 0; });
    if (digits) {
        std::size_t index = std::stoul(std::string(selector));
        if (index >= devices.size()) {
            return gpu_error(gpu_failure::device_not_found,
                             "gpu.device index " + std::string(selector) + " out of range; " +
                                 list_devices(devices));
        }
        return index;
    }
    std::string needle = lower(selector);
    for (std::size_t i = 0; i < devices.size(); ++i) {
        if (lower(devices[i].name).find(needle) != std::string::npos) {
            return i;
        }
    }
    return gpu_error(
        gpu_failure::device_not_found,
        "no device name contains \"" + std::string(selector) + "\"; " + list_devices(devices));
}

int choose_memory_type(const memory_facts& m, std::uint32_t type_bits, bool for_kernels) {
    auto find = [&](std::uint32_t want, std::uint64_t heap_least) {
        for (std::size_t i = 0; i < m.types.size() && i < 32; ++i) {
            const memory_facts::type& t = m.types[i];
            if ((type_bits & (1u << i)) != 0 && (t.flags & want) == want &&
                t.heap < m.heaps.size() && m.heaps[t.heap].size_bytes >= heap_least) {
                return static_cast<int>(i);
            }
        }
        return -1;
    };
    const std::uint32_t host = memory_facts::host_visible | memory_facts::host_coherent;
    int type = -1;
    if (for_kernels) {
        std::uint64_t largest = 0;
        for (const memory_heap_info& h : m.heaps) {
            if (h.device_local) largest = std::max(largest, h.size_bytes);
        }
        type = find(memory_facts::device_local | host, largest);
        if (type < 0) type = find(memory_facts::device_local, 0);
    } else {
        type = find(host | memory_facts::host_cached, 0);
        if (type < 0) type = find(host, 0);
    }
    return type >= 0 ? type : find(0, 0);
}

}  // namespace ordo::gpu
