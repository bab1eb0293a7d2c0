// device.cpp: see device.hpp. Instance + device creation, feature probing, memory.
#include "gpu/vk/device.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "gpu/vk/vk_util.hpp"

namespace ordo::gpu {

namespace {

// Upper bound on physical devices considered (vkEnumeratePhysicalDevices count).
constexpr std::uint32_t physical_devices_max = 16;
// Staging copies move at most this many bytes per submission.
constexpr std::uint64_t staging_bytes_max = 64ull << 20;
// A one-shot transfer that has not finished after this long means the device is wedged.
constexpr std::uint64_t transfer_timeout_ns = 30'000'000'000ull;

// Buffers are told apart by a serial no other buffer of the process ever had, where a VkBuffer
// handle may be reused once its buffer is destroyed (stream's replayed segments key on it).
std::uint64_t next_buffer_serial() {
    static std::atomic<std::uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
}

device_kind kind_of(VkPhysicalDeviceType t) {
    switch (t) {
        case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
            return device_kind::discrete;
        case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
            return device_kind::integrated;
        case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
            return device_kind::virtual_gpu;
        case VK_PHYSICAL_DEVICE_TYPE_CPU:
            return device_kind::cpu;
        default:
            return device_kind::other;
    }
}

std::string version_string(std::uint32_t v) {
    return std::to_string(VK_API_VERSION_MAJOR(v)) + "." + std::to_string(VK_API_VERSION_MINOR(v)) +
           "." + std::to_string(VK_API_VERSION_PATCH(v));
}

VkResult create_instance_raw(VkInstance* out);

// The Vulkan loader unloads a driver's library when the last instance that loaded it is
// destroyed. NVIDIA's driver leaves thread-exit destructors in the threads that called it (the
// libuv pool's workers, which build runners and wait on fences, live until the process ends),
// and once its library is unloaded those threads crash as they exit (seen on an H100: SIGSEGV
// in a pool worker after "stopped cleanly"). So the first instance ordo creates is followed by
// one more that is never destroyed: every driver it loaded stays loaded until the process ends,
// across device rebuilds too. (A static pointer keeps it reachable: no leak report.)
void pin_drivers() {
    static VkInstance pinned = VK_NULL_HANDLE;
    static const VkResult r = create_instance_raw(&pinned);
    (void)r;
}

VkResult create_instance_raw(VkInstance* out) {
    VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
    app.pApplicationName = "ordo";
    app.apiVersion = VK_API_VERSION_1_2;
    VkInstanceCreateInfo ci{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
    ci.pApplicationInfo = &app;
    return vkCreateInstance(&ci, nullptr, out);
}

result<VkInstance> create_instance() {
    VkInstance instance = VK_NULL_HANDLE;
    VkResult r = create_instance_raw(&instance);
    if (r != VK_SUCCESS) {
        return vk_error(r, "vkCreateInstance (is a Vulkan ICD installed?)");
    }
    pin_drivers();
    return instance;
}

result<std::vector<VkPhysicalDevice>> enumerate(VkInstance instance) {
    std::uint32_t count = 0;
    VkResult r = vkEnumeratePhysicalDevices(instance, &count, nullptr);
    if (r != VK_SUCCESS) {
        return vk_error(r, "vkEnumeratePhysicalDevices");
    }
    count = std::min(count, physical_devices_max);
    std::vector<VkPhysicalDevice> devices(count);
    r = vkEnumeratePhysicalDevices(instance, &count, devices.data());
    if (r != VK_SUCCESS && r != VK_INCOMPLETE) {
        return vk_error(r, "vkEnumeratePhysicalDevices");
    }
    devices.resize(count);
    return devices;
}

std::vector<device_candidate> candidates(const std::vector<VkPhysicalDevice>& devices) {
    std::vector<device_candidate> out;
    for (VkPhysicalDevice pd : devices) {
        VkPhysicalDeviceProperties p{};
        vkGetPhysicalDeviceProperties(pd, &p);
        VkPhysicalDeviceMemoryProperties m{};
        vkGetPhysicalDeviceMemoryProperties(pd, &m);
        std::uint64_t local = 0;
        for (std::uint32_t i = 0; i < m.memoryHeapCount; ++i) {
            if ((m.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) != 0) {
                local = std::max<std::uint64_t>(local, m.memoryHeaps[i].size);
            }
        }
        out.push_back({p.deviceName, kind_of(p.deviceType), local});
    }
    return out;
}

bool has_extension(VkPhysicalDevice pd, const char* name) {
    std::uint32_t count = 0;
    vkEnumerateDeviceExtensionProperties(pd, nullptr, &count, nullptr);
    std::vector<VkExtensionProperties> ext(count);
    vkEnumerateDeviceExtensionProperties(pd, nullptr, &count, ext.data());
    for (const auto& e : ext) {
        if (std::strcmp(e.extensionName, name) == 0) {
            return true;
        }
    }
    return false;
}

const char* component_name(VkComponentTypeNV t) {
    switch (t) {
        case VK_COMPONENT_TYPE_FLOAT16_NV:
            return "f16";
        case VK_COMPONENT_TYPE_FLOAT32_NV:
            return "f32";
        case VK_COMPONENT_TYPE_SINT8_NV:
            return "s8";
        case VK_COMPONENT_TYPE_SINT32_NV:
            return "s32";
        case VK_COMPONENT_TYPE_UINT8_NV:
            return "u8";
        case VK_COMPONENT_TYPE_UINT32_NV:
            return "u32";
        default:
            return "other";
    }
}

// The subgroup-scope shapes VK_NV_cooperative_matrix lists, as "MxNxK A>C"; empty without it.
std::vector<std::string> cooperative_matrix_shapes(VkInstance instance, VkPhysicalDevice pd) {
    std::vector<std::string> out;
    if (!has_extension(pd, VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME)) return out;
    auto get = reinterpret_cast<PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV>(
        vkGetInstanceProcAddr(instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV"));
    if (get == nullptr) return out;
    std::uint32_t count = 0;
    if (get(pd, &count, nullptr) != VK_SUCCESS) return out;
    std::vector<VkCooperativeMatrixPropertiesNV> props(
        count, VkCooperativeMatrixPropertiesNV{VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV});
    if (get(pd, &count, props.data()) != VK_SUCCESS) return out;
    for (const auto& p : props) {
        if (p.scope != VK_SCOPE_SUBGROUP_NV) continue;
        out.push_back(std::to_string(p.MSize) + "x" + std::to_string(p.NSize) + "x" +
                      std::to_string(p.KSize) + " " + component_name(p.AType) + ">" +
                      component_name(p.CType));
    }
    return out;
}

}  // namespace

std::string describe(const device_info& info) {
    std::string s = "device " + std::to_string(info.index) + ": " + info.name + " (" +
                    std::string(device_kind_name(info.kind)) + "), driver " + info.driver_name +
                    " " + info.driver_info + ", Vulkan " + info.api_version;
    s += "; limits: storage range " + std::to_string(info.max_storage_buffer_range) +
         " B, shared " + std::to_string(info.max_shared_memory_bytes) + " B, subgroup " +
         std::to_string(info.subgroup_size) + ", workgroup invocations " +
         std::to_string(info.max_workgroup_invocations) + ", workgroup count x " +
         std::to_string(info.max_workgroup_count[0]);
    for (std::size_t i = 0; i < info.heaps.size(); ++i) {
        s += ", heap" + std::to_string(i) + " " + std::to_string(info.heaps[i].size_bytes >> 20) +
             " MiB" + (info.heaps[i].device_local ? " device-local" : "");
    }
    s += std::string("; features: 16bit-storage ") + (info.storage_buffer_16bit ? "on" : "off") +
         ", float16 " + (info.shader_float16 ? "on" : "off") + ", 8bit-storage " +
         (info.storage_buffer_8bit ? "on" : "off") + ", int8 " + (info.shader_int8 ? "on" : "off") +
         ", subgroup-arithmetic " + (info.subgroup_arithmetic ? "on" : "off") +
         ", subgroup-ballot " + (info.subgroup_ballot ? "on" : "off") + ", subgroup-shuffle " +
         (info.subgroup_shuffle ? "on" : "off") + ", timestamps " +
         (info.timestamps ? "on" : "off");
    s += std::string(", cooperative-matrix-khr ") +
         (info.cooperative_matrix_khr_listed ? "listed" : "absent") + ", cooperative-matrix-nv";
    if (info.cooperative_matrix_nv.empty()) s += " absent";
    for (const auto& shape : info.cooperative_matrix_nv) s += " " + shape;
    s += std::string(", cooperative-matrix kernels ") + (info.cooperative_matrix ? "on" : "off");
    s += ", host-import " + (info.external_memory_host
                                 ? std::to_string(info.min_imported_host_pointer_alignment) + " B"
                                 : std::string("absent"));
    return s;
}

// ---- buffer ---------------------------------------------------------------------------------

buffer::buffer(buffer&& other) noexcept {
    *this = std::move(other);
}

buffer& buffer::operator=(buffer&& other) noexcept {
    if (this != &other) {
        reset();
        _device = other._device;
        _buffer = other._buffer;
        _memory = other._memory;
        _texel_view = other._texel_view;
        _texel_count = other._texel_count;
        _mapped = other._mapped;
        _size = other._size;
        _imported = other._imported;
        _serial = other._serial;
        other._device = VK_NULL_HANDLE;
        other._buffer = VK_NULL_HANDLE;
        other._memory = VK_NULL_HANDLE;
        other._texel_view = VK_NULL_HANDLE;
        other._texel_count = 0;
        other._mapped = nullptr;
        other._size = 0;
    }
    return *this;
}

buffer::~buffer() {
    reset();
}

void buffer::reset() {
    if (_device == VK_NULL_HANDLE) {
        return;
    }
    if (_mapped != nullptr && !_imported) {
        vkUnmapMemory(_device, _memory);
    }
    if (_texel_view != VK_NULL_HANDLE) {
        vkDestroyBufferView(_device, _texel_view, nullptr);
    }
    vkDestroyBuffer(_device, _buffer, nullptr);
    vkFreeMemory(_device, _memory, nullptr);
    _device = VK_NULL_HANDLE;
    _buffer = VK_NULL_HANDLE;
    _memory = VK_NULL_HANDLE;
    _texel_view = VK_NULL_HANDLE;
    _texel_count = 0;
    _mapped = nullptr;
    _size = 0;
    _imported = false;
}

// ---- device ---------------------------------------------------------------------------------

result<std::vector<device_candidate>> device::list_devices() {
    auto instance = create_instance();
    if (!instance) {
        return instance.err();
    }
    auto devices = enumerate(*instance);
    std::vector<device_candidate> out;
    if (devices) {
        out = candidates(*devices);
    }
    vkDestroyInstance(*instance, nullptr);
    if (!devices) {
        return devices.err();
    }
    return out;
}

result<std::unique_ptr<device>> device::create(const device_options& options) {
    std::unique_ptr<device> d(new device());
    status s = d->init(options);
    if (!s) {
        return s.err();
    }
    logger()->info("{}", describe(d->info()));
    return d;
}

status device::init(const device_options& options) {
    auto instance = create_instance();
    if (!instance) {
        return instance.err();
    }
    _instance = *instance;
    status s = pick_physical(options);
    if (!s) {
        return s;
    }
    return create_logical();
}

status device::pick_physical(const device_options& options) {
    auto devices = enumerate(_instance);
    if (!devices) {
        return devices.err();
    }
    auto chosen = select_device(candidates(*devices), options.selector);
    if (!chosen) {
        return chosen.err();
    }
    _physical = (*devices)[*chosen];
    _info.index = static_cast<std::uint32_t>(*chosen);

    VkPhysicalDeviceSubgroupProperties subgroup{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    // Chained only where the extension is listed (valid usage).
    VkPhysicalDeviceExternalMemoryHostPropertiesEXT host_import{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT};
    if (has_extension(_physical, VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME)) {
        subgroup.pNext = &host_import;
    }
    VkPhysicalDeviceDriverProperties driver{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
    driver.pNext = &subgroup;
    VkPhysicalDeviceProperties2 props{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
    props.pNext = &driver;
    vkGetPhysicalDeviceProperties2(_physical, &props);
    const VkPhysicalDeviceLimits& lim = props.properties.limits;
    if (props.properties.apiVersion < VK_API_VERSION_1_2) {
        return gpu_error(gpu_failure::unsupported,
                         std::string(props.properties.deviceName) + " supports only Vulkan " +
                             version_string(props.properties.apiVersion) + "; ordo needs 1.2");
    }
    if (!has_extension(_physical, VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME)) {
        return gpu_error(gpu_failure::unsupported, std::string(props.properties.deviceName) +
                                                       " lacks VK_KHR_push_descriptor");
    }
    _info.name = props.properties.deviceName;
    _info.kind = kind_of(props.properties.deviceType);
    _info.vendor_id = props.properties.vendorID;
    _info.device_id = props.properties.deviceID;
    _info.driver_name = driver.driverName;
    _info.driver_info = driver.driverInfo;
    _info.driver_version = props.properties.driverVersion;
    std::copy(std::begin(props.properties.pipelineCacheUUID),
              std::end(props.properties.pipelineCacheUUID), _info.pipeline_cache_uuid.begin());
    _info.loop_iterations_max = driver.driverID == VK_DRIVER_ID_MESA_LLVMPIPE ? 65535 : 0;
    _info.api_version = version_string(props.properties.apiVersion);
    _info.max_storage_buffer_range = lim.maxStorageBufferRange;
    _info.min_storage_buffer_offset_alignment = lim.minStorageBufferOffsetAlignment;
    _info.max_texel_buffer_elements = lim.maxTexelBufferElements;
    _info.min_texel_buffer_offset_alignment = lim.minTexelBufferOffsetAlignment;
    _info.max_shared_memory_bytes = lim.maxComputeSharedMemorySize;
    _info.subgroup_size = subgroup.subgroupSize;
    _info.subgroup_arithmetic =
        (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) != 0 &&
        (subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) != 0;
    _info.subgroup_ballot = (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_BALLOT_BIT) != 0 &&
                            (subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) != 0;
    _info.subgroup_shuffle =
        (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_SHUFFLE_BIT) != 0 &&
        (subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) != 0;
    for (int i = 0; i < 3; ++i) {
        _info.max_workgroup_size[i] = lim.maxComputeWorkGroupSize[i];
        _info.max_workgroup_count[i] = lim.maxComputeWorkGroupCount[i];
    }
    _info.max_workgroup_invocations = lim.maxComputeWorkGroupInvocations;
    _info.cooperative_matrix_khr_listed = has_extension(_physical, "VK_KHR_cooperative_matrix");
    _info.external_memory_host =
        has_extension(_physical, VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME) &&
        host_import.minImportedHostPointerAlignment > 0;
    _info.min_imported_host_pointer_alignment =
        _info.external_memory_host ? host_import.minImportedHostPointerAlignment : 0;
    _info.cooperative_matrix_nv = cooperative_matrix_shapes(_instance, _physical);
    _info.max_push_constants_bytes = lim.maxPushConstantsSize;
    _info.timestamp_period_ns = lim.timestampPeriod;
    VkPhysicalDeviceMemoryProperties memory{};
    vkGetPhysicalDeviceMemoryProperties(_physical, &memory);
    static_assert(memory_facts::device_local == VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT &&
                  memory_facts::host_visible == VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT &&
                  memory_facts::host_coherent == VK_MEMORY_PROPERTY_HOST_COHERENT_BIT &&
                  memory_facts::host_cached == VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
    for (std::uint32_t i = 0; i < memory.memoryTypeCount; ++i) {
        _memory_facts.types.push_back(
            {memory.memoryTypes[i].propertyFlags, memory.memoryTypes[i].heapIndex});
    }
    for (std::uint32_t i = 0; i < memory.memoryHeapCount; ++i) {
        _memory_facts.heaps.push_back(
            {memory.memoryHeaps[i].size,
             (memory.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) != 0});
    }
    _info.heaps = _memory_facts.heaps;
    return {};
}

status device::create_logical() {
    std::uint32_t count = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(_physical, &count, nullptr);
    std::vector<VkQueueFamilyProperties> families(count);
    vkGetPhysicalDeviceQueueFamilyProperties(_physical, &count, families.data());
    bool found = false;
    for (std::uint32_t i = 0; i < count && !found; ++i) {
        if (families[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
            _queue_family = i;
            found = true;
            _info.timestamps = families[i].timestampValidBits > 0;
        }
    }
    if (!found) {
        return gpu_error(gpu_failure::unsupported, _info.name + " has no compute queue");
    }
    VkPhysicalDeviceProperties base{};
    vkGetPhysicalDeviceProperties(_physical, &base);
    _info.timestamps = _info.timestamps && base.limits.timestampComputeAndGraphics;

    // Probe, then enable exactly the optional features the device has.
    VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    VkPhysicalDeviceVulkan11Features f11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
    f11.pNext = &f12;
    // Chained only where the extension is listed (valid usage).
    const bool coop_listed = has_extension(_physical, VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME);
    VkPhysicalDeviceCooperativeMatrixFeaturesNV fcm{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
    if (coop_listed) f12.pNext = &fcm;
    VkPhysicalDeviceFeatures2 have{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
    have.pNext = &f11;
    vkGetPhysicalDeviceFeatures2(_physical, &have);
    VkPhysicalDeviceCooperativeMatrixPropertiesNV pcm{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_PROPERTIES_NV};
    if (coop_listed) {
        VkPhysicalDeviceProperties2 p2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
        p2.pNext = &pcm;
        vkGetPhysicalDeviceProperties2(_physical, &p2);
    }
    // mul_mat_cm.comp's needs: 16x16x16 f16 x f16 -> f32 fragments at subgroup scope in compute
    // shaders, f16 arithmetic, the Vulkan memory model (glslang's cooperative-matrix loads use
    // it) and 32-lane subgroups (its workgroup is 4 of them).
    const bool shape =
        std::find(_info.cooperative_matrix_nv.begin(), _info.cooperative_matrix_nv.end(),
                  mat_coop_shape_needed) != _info.cooperative_matrix_nv.end();
    const bool coop = coop_listed && fcm.cooperativeMatrix && shape && f12.shaderFloat16 &&
                      f12.vulkanMemoryModel && _info.subgroup_size == 32 &&
                      (pcm.cooperativeMatrixSupportedStages & VK_SHADER_STAGE_COMPUTE_BIT) != 0;
    VkPhysicalDeviceVulkan12Features e12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    VkPhysicalDeviceVulkan11Features e11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
    e11.pNext = &e12;
    VkPhysicalDeviceFeatures2 enable{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
    enable.pNext = &e11;
    VkPhysicalDeviceCooperativeMatrixFeaturesNV ecm{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
    if (coop) {
        ecm.cooperativeMatrix = VK_TRUE;
        e12.pNext = &ecm;
        e12.vulkanMemoryModel = VK_TRUE;
    }
    _info.cooperative_matrix = coop;
    e11.storageBuffer16BitAccess = f11.storageBuffer16BitAccess;
    e12.shaderFloat16 = f12.shaderFloat16;
    e12.storageBuffer8BitAccess = f12.storageBuffer8BitAccess;
    e12.shaderInt8 = f12.shaderInt8;
    _info.storage_buffer_16bit = f11.storageBuffer16BitAccess;
    _info.shader_float16 = f12.shaderFloat16;
    _info.storage_buffer_8bit = f12.storageBuffer8BitAccess;
    _info.shader_int8 = f12.shaderInt8;

    float priority = 1.0f;
    VkDeviceQueueCreateInfo qci{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
    qci.queueFamilyIndex = _queue_family;
    qci.queueCount = 1;
    qci.pQueuePriorities = &priority;
    std::vector<const char*> extensions = {VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME};
    if (_info.external_memory_host)
        extensions.push_back(VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME);
    if (coop) extensions.push_back(VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME);
    VkDeviceCreateInfo dci{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
    dci.pNext = &enable;
    dci.queueCreateInfoCount = 1;
    dci.pQueueCreateInfos = &qci;
    dci.enabledExtensionCount = static_cast<std::uint32_t>(extensions.size());
    dci.ppEnabledExtensionNames = extensions.data();
    VkResult r = vkCreateDevice(_physical, &dci, nullptr, &_device);
    if (r != VK_SUCCESS) {
        return vk_error(r, "vkCreateDevice " + _info.name);
    }
    vkGetDeviceQueue(_device, _queue_family, 0, &_queue);
    _push_descriptor = reinterpret_cast<PFN_vkCmdPushDescriptorSetKHR>(
        vkGetDeviceProcAddr(_device, "vkCmdPushDescriptorSetKHR"));
    if (_push_descriptor == nullptr) {
        return gpu_error(gpu_failure::unsupported, "vkCmdPushDescriptorSetKHR not found");
    }
    VkCommandPoolCreateInfo pci{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    pci.queueFamilyIndex = _queue_family;
    r = vkCreateCommandPool(_device, &pci, nullptr, &_transfer_pool);
    if (r != VK_SUCCESS) {
        return vk_error(r, "vkCreateCommandPool");
    }
    return {};
}

device::~device() {
    if (_device != VK_NULL_HANDLE) {
        vkDeviceWaitIdle(_device);
        if (_transfer_pool != VK_NULL_HANDLE) {
            vkDestroyCommandPool(_device, _transfer_pool, nullptr);
        }
        vkDestroyDevice(_device, nullptr);
    }
    if (_instance != VK_NULL_HANDLE) {
        vkDestroyInstance(_instance, nullptr);
    }
}

status device::make_buffer(buffer& b, std::uint64_t size, const void* next) {
    VkBufferCreateInfo bci{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    bci.pNext = next;
    bci.size = size;
    // Uniform-texel usage: R32G32B32A32_UINT uniform texel buffers are mandatory in Vulkan, and
    // they are the only vectorised load path of lavapipe (gpu/PERF.md).
    bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                VK_BUFFER_USAGE_TRANSFER_DST_BIT | VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT;
    bci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    b._device = _device;
    b._size = size;
    VkResult r = vkCreateBuffer(_device, &bci, nullptr, &b._buffer);
    b._serial = next_buffer_serial();
    if (r != VK_SUCCESS) {
        b._device = VK_NULL_HANDLE;
        return vk_error(r, "vkCreateBuffer " + std::to_string(size) + " B");
    }
    return {};
}

void device::add_texel_view(buffer& b) {
    std::uint64_t texels = std::min<std::uint64_t>(b._size / 16, _info.max_texel_buffer_elements);
    if (texels == 0) return;
    VkBufferViewCreateInfo vi{VK_STRUCTURE_TYPE_BUFFER_VIEW_CREATE_INFO};
    vi.buffer = b._buffer;
    vi.format = VK_FORMAT_R32G32B32A32_UINT;
    vi.offset = 0;
    vi.range = texels * 16;
    // A failure only costs speed: the kernels fall back to their storage-buffer path.
    if (vkCreateBufferView(_device, &vi, nullptr, &b._texel_view) == VK_SUCCESS) {
        b._texel_count = texels;
    } else {
        b._texel_view = VK_NULL_HANDLE;
    }
}

result<buffer> device::create_buffer(std::uint64_t size, memory_use use) {
    if (size == 0) {
        return gpu_error(gpu_failure::bad_request, "create_buffer: size 0");
    }
    buffer b;
    ORDO_TRY(make_buffer(b, size, nullptr));
    VkMemoryRequirements req{};
    vkGetBufferMemoryRequirements(_device, b._buffer, &req);
    // Device-local and host-visible where that is the device's whole memory (lavapipe, resizable
    // BAR) lets uploads skip staging; never a discrete GPU's small host-visible window.
    const int type =
        choose_memory_type(_memory_facts, req.memoryTypeBits, use == memory_use::device);
    if (type < 0) {
        return gpu_error(gpu_failure::device_error,
                         "no memory type for a buffer of " + std::to_string(size) + " B");
    }
    VkMemoryAllocateInfo mai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
    mai.allocationSize = req.size;
    mai.memoryTypeIndex = static_cast<std::uint32_t>(type);
    VkResult r = vkAllocateMemory(_device, &mai, nullptr, &b._memory);
    if (r != VK_SUCCESS) {
        return vk_error(r, "vkAllocateMemory " + std::to_string(size) + " B");
    }
    r = vkBindBufferMemory(_device, b._buffer, b._memory, 0);
    if (r != VK_SUCCESS) {
        return vk_error(r, "vkBindBufferMemory");
    }
    if (_memory_facts.mappable(type)) {
        r = vkMapMemory(_device, b._memory, 0, VK_WHOLE_SIZE, 0, &b._mapped);
        if (r != VK_SUCCESS) {
            return vk_error(r, "vkMapMemory");
        }
    }
    add_texel_view(b);
    return b;
}

result<buffer> device::import_host(void* host, std::uint64_t size) {
    const std::uint64_t align = _info.min_imported_host_pointer_alignment;
    if (!_info.external_memory_host || align == 0) {
        return gpu_error(
            gpu_failure::unsupported,
            _info.name + " cannot import host memory (no VK_EXT_external_memory_host)");
    }
    if (host == nullptr || size == 0 || reinterpret_cast<std::uintptr_t>(host) % align != 0 ||
        size % align != 0) {
        return gpu_error(gpu_failure::unsupported, "host memory to import must start and end on " +
                                                       std::to_string(align) + " B boundaries (" +
                                                       std::to_string(size) + " B given)");
    }
    constexpr auto handle = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT;
    auto host_props = reinterpret_cast<PFN_vkGetMemoryHostPointerPropertiesEXT>(
        vkGetDeviceProcAddr(_device, "vkGetMemoryHostPointerPropertiesEXT"));
    if (host_props == nullptr) {
        return gpu_error(gpu_failure::unsupported, "vkGetMemoryHostPointerPropertiesEXT not found");
    }
    VkMemoryHostPointerPropertiesEXT props{VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT};
    VkResult r = host_props(_device, handle, host, &props);
    if (r != VK_SUCCESS) return vk_error(r, "vkGetMemoryHostPointerPropertiesEXT");
    VkExternalMemoryBufferCreateInfo external{VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO};
    external.handleTypes = handle;
    buffer b;
    ORDO_TRY(make_buffer(b, size, &external));
    VkMemoryRequirements req{};
    vkGetBufferMemoryRequirements(_device, b._buffer, &req);
    // Coherent, so the host reads the kernels' writes once the fence has signalled: the host
    // buffers' choice (cached where it can be), which must be a mapped type here.
    const int type =
        choose_memory_type(_memory_facts, req.memoryTypeBits & props.memoryTypeBits, false);
    if (!_memory_facts.mappable(type) || req.size > size) {
        return gpu_error(gpu_failure::unsupported,
                         "no host-coherent memory type can import " + std::to_string(size) + " B");
    }
    VkImportMemoryHostPointerInfoEXT import{VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT};
    import.handleType = handle;
    import.pHostPointer = host;
    VkMemoryAllocateInfo mai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
    mai.pNext = &import;
    mai.allocationSize = size;
    mai.memoryTypeIndex = static_cast<std::uint32_t>(type);
    r = vkAllocateMemory(_device, &mai, nullptr, &b._memory);
    if (r != VK_SUCCESS) return vk_error(r, "vkAllocateMemory (host import)");
    r = vkBindBufferMemory(_device, b._buffer, b._memory, 0);
    if (r != VK_SUCCESS) return vk_error(r, "vkBindBufferMemory (host import)");
    b._mapped = host;
    b._imported = true;
    add_texel_view(b);
    return b;
}

template <typename Record>
status device::submit_once(Record&& record, const char* what) {
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    ai.commandPool = _transfer_pool;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    VkCommandBuffer cb = VK_NULL_HANDLE;
    VkResult r = vkAllocateCommandBuffers(_device, &ai, &cb);
    if (r != VK_SUCCESS) {
        return vk_error(r, std::string("vkAllocateCommandBuffers (") + what + ")");
    }
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    vkBeginCommandBuffer(cb, &bi);
    record(cb);
    vkEndCommandBuffer(cb);
    VkFenceCreateInfo fci{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    VkFence fence = VK_NULL_HANDLE;
    r = vkCreateFence(_device, &fci, nullptr, &fence);
    if (r == VK_SUCCESS) {
        VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
        si.commandBufferCount = 1;
        si.pCommandBuffers = &cb;
        r = vkQueueSubmit(_queue, 1, &si, fence);
        if (r == VK_SUCCESS) {
            r = vkWaitForFences(_device, 1, &fence, VK_TRUE, transfer_timeout_ns);
        }
        vkDestroyFence(_device, fence, nullptr);
    }
    vkFreeCommandBuffers(_device, _transfer_pool, 1, &cb);
    return r == VK_SUCCESS ? status{} : status{vk_error(r, what)};
}

status device::staged_copy(const buffer& host, const buffer& dev, std::uint64_t dev_offset,
                           std::uint64_t size, bool to_device) {
    return submit_once(
        [&](VkCommandBuffer cb) {
            VkBufferCopy region{to_device ? 0 : dev_offset, to_device ? dev_offset : 0, size};
            vkCmdCopyBuffer(cb, to_device ? host.handle() : dev.handle(),
                            to_device ? dev.handle() : host.handle(), 1, &region);
        },
        "staged copy");
}

status device::write(const buffer& dst, std::uint64_t offset, const void* src, std::uint64_t size) {
    if (offset > dst.size() || size > dst.size() - offset) {
        return gpu_error(gpu_failure::bad_request, "write past the end of a buffer");
    }
    if (dst.mapped() != nullptr) {
        std::memcpy(static_cast<char*>(dst.mapped()) + offset, src, size);
        return {};
    }
    auto staging = create_buffer(std::min(size, staging_bytes_max), memory_use::host_readback);
    if (!staging) {
        return staging.err();
    }
    for (std::uint64_t done = 0; done < size; done += staging_bytes_max) {
        std::uint64_t n = std::min(staging_bytes_max, size - done);
        std::memcpy(staging->mapped(), static_cast<const char*>(src) + done, n);
        status s = staged_copy(*staging, dst, offset + done, n, true);
        if (!s) return s;
    }
    return {};
}

status device::read(const buffer& src, std::uint64_t offset, void* dst, std::uint64_t size) {
    if (offset > src.size() || size > src.size() - offset) {
        return gpu_error(gpu_failure::bad_request, "read past the end of a buffer");
    }
    if (src.mapped() != nullptr) {
        std::memcpy(dst, static_cast<const char*>(src.mapped()) + offset, size);
        return {};
    }
    auto staging = create_buffer(std::min(size, staging_bytes_max), memory_use::host_readback);
    if (!staging) {
        return staging.err();
    }
    for (std::uint64_t done = 0; done < size; done += staging_bytes_max) {
        std::uint64_t n = std::min(staging_bytes_max, size - done);
        status s = staged_copy(*staging, src, offset + done, n, false);
        if (!s) return s;
        std::memcpy(static_cast<char*>(dst) + done, staging->mapped(), n);
    }
    return {};
}

status device::fill_zero(const buffer& dst) {
    // vkCmdFillBuffer writes whole 4-byte words: a tail of 1-3 bytes is written from the host.
    const std::uint64_t words = dst.size() / 4 * 4;
    if (words != 0) {
        ORDO_TRY(submit_once(
            [&](VkCommandBuffer cb) { vkCmdFillBuffer(cb, dst.handle(), 0, words, 0u); },
            "zero fill"));
    }
    if (words == dst.size()) return {};
    const std::array<char, 4> zeros{};
    return write(dst, words, zeros.data(), dst.size() - words);
}

status device::wait_idle() {
    VkResult r = vkDeviceWaitIdle(_device);
    return r == VK_SUCCESS ? status{} : status{vk_error(r, "vkDeviceWaitIdle")};
}

}  // namespace ordo::gpu
