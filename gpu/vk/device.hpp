// device.hpp: the Vulkan instance, the chosen physical device and its logical device, plus
// device memory (buffers) and host<->device copies. Owned by the gpu actor (one per actor; a
// device-loss recovery destroys it and creates a new one); tests and benches create their own.
// Not thread-safe: one owner thread records and submits; fence waits may run on another thread
// through gpu::stream (see stream.hpp).
#pragma once

#include <vulkan/vulkan.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "actors/runtime/result.hpp"
#include "gpu/vk/device_select.hpp"

namespace ordo::gpu {

// What the `model`/`stats` ops report about the device; filled once at creation.
struct device_info {
    std::string name;
    device_kind kind = device_kind::other;
    std::uint32_t vendor_id = 0;
    std::uint32_t device_id = 0;
    std::string driver_name;
    std::string driver_info;
    std::uint32_t driver_version =
        0;  // VkPhysicalDeviceProperties::driverVersion (vendor's encoding)
    // The driver's identity of its pipeline-cache format: a cache written under another UUID is
    // not this driver's (gpu/vk/pipeline_cache.hpp).
    std::array<std::uint8_t, 16> pipeline_cache_uuid{};
    std::string api_version;  // "1.3.230"
    std::uint32_t index = 0;  // physical device index chosen
    // limits
    std::uint64_t max_storage_buffer_range = 0;
    std::uint64_t min_storage_buffer_offset_alignment = 0;
    // Uniform texel buffers: the fast load path of lavapipe (see gpu/PERF.md).
    std::uint32_t max_texel_buffer_elements = 0;
    std::uint64_t min_texel_buffer_offset_alignment = 0;
    std::uint32_t max_shared_memory_bytes = 0;
    std::uint32_t subgroup_size = 0;
    std::array<std::uint32_t, 3> max_workgroup_size{};
    std::uint32_t max_workgroup_invocations = 0;
    std::array<std::uint32_t, 3> max_workgroup_count{};
    std::uint32_t max_push_constants_bytes = 0;
    // Loop iterations one shader invocation may run, all its loops together; 0 = no known cap.
    // llvmpipe ends every loop early, silently, after 65535 (LP_MAX_TGSI_LOOP_ITERATIONS):
    // encoders whose loop counts grow with the input check it (encode_attention).
    std::uint32_t loop_iterations_max = 0;
    bool timestamps = false;
    float timestamp_period_ns = 0.0f;
    std::vector<memory_heap_info> heaps;
    // features enabled (only those the device has)
    bool storage_buffer_16bit = false;
    bool shader_float16 = false;
    bool storage_buffer_8bit = false;
    bool shader_int8 = false;
    bool subgroup_arithmetic = false;
    bool subgroup_ballot = false;   // subgroupBroadcast (mul_mat_tx tx1 folds its lanes with it)
    bool subgroup_shuffle = false;  // subgroupShuffle (tx1 with more than one 8-lane team)
    // Cooperative matrices: the shapes VK_NV_cooperative_matrix offers, "MxNxK A>C" with A/B
    // and C/D component types, subgroup scope; and whether the device names
    // VK_KHR_cooperative_matrix (Debian 12's headers and glslang predate it, so ordo cannot
    // build for it).
    std::vector<std::string> cooperative_matrix_nv;
    bool cooperative_matrix_khr_listed = false;
    // VK_NV_cooperative_matrix enabled, with what mul_mat_cm.comp needs (mat_coop_shape_needed
    // among the shapes, f16 arithmetic, the Vulkan memory model, 32-lane subgroups): the
    // tensor-core mat-mul can run (pipeline_tuning::mat_coop, under gpu.batch_invariant = false).
    bool cooperative_matrix = false;
    // VK_EXT_external_memory_host, enabled when listed: host memory the process allocated can
    // back a buffer (device::import_host), so kernels write results where the host reads them
    // without a copy. The imported pointer and size must be multiples of the alignment.
    bool external_memory_host = false;
    std::uint64_t min_imported_host_pointer_alignment = 0;
};

// The cooperative-matrix shape mul_mat_cm.comp multiplies with, as device_info lists shapes.
inline constexpr std::string_view mat_coop_shape_needed = "16x16x16 f16>f32";

// One line per fact, for the start-up log and the stats op.
std::string describe(const device_info& info);

enum class memory_use {
    device,         // storage buffers the kernels read and write (weights, KV, activations)
    host_readback,  // host-visible, cached when possible: results the host reads (logits)
};

// A VkBuffer with its own memory; move-only, freed on destruction.
class buffer {
public:
    buffer() = default;
    buffer(buffer&& other) noexcept;
    buffer& operator=(buffer&& other) noexcept;
    buffer(const buffer&) = delete;
    buffer& operator=(const buffer&) = delete;
    ~buffer();

    VkBuffer handle() const { return _buffer; }
    std::uint64_t size() const { return _size; }
    void* mapped() const { return _mapped; }  // null when not host-visible
    // R32G32B32A32_UINT texel view of the whole buffer (16-byte texels; the tail of a size not
    // a multiple of 16 is outside it). Null when the buffer is smaller than one texel or larger
    // than maxTexelBufferElements texels: kernels that read through it then take their
    // storage-buffer path. The fast mat-mul kernels read weights and activations this way.
    VkBufferView texel_view() const { return _texel_view; }
    std::uint64_t texel_count() const { return _texel_count; }
    // Unique in the process for this buffer's life and after (a handle may be reused).
    std::uint64_t serial() const { return _serial; }

private:
    friend class device;
    void reset();

    VkDevice _device = VK_NULL_HANDLE;
    VkBuffer _buffer = VK_NULL_HANDLE;
    VkDeviceMemory _memory = VK_NULL_HANDLE;
    VkBufferView _texel_view = VK_NULL_HANDLE;
    std::uint64_t _texel_count = 0;
    void* _mapped = nullptr;
    std::uint64_t _size = 0;
    bool _imported = false;  // _mapped is the caller's memory (import_host): never unmapped
    std::uint64_t _serial = 0;
};

// A byte range of a buffer, as bound to one descriptor.
struct buffer_view {
    const buffer* buf = nullptr;
    std::uint64_t offset = 0;
    std::uint64_t range = 0;
};

inline buffer_view whole(const buffer& b) {
    return buffer_view{&b, 0, b.size()};
}

struct device_options {
    std::string selector;  // the gpu.device config value
};

class device {
public:
    static result<std::unique_ptr<device>> create(const device_options& options);
    ~device();
    device(const device&) = delete;
    device& operator=(const device&) = delete;

    const device_info& info() const { return _info; }
    VkDevice handle() const { return _device; }
    VkQueue queue() const { return _queue; }
    std::uint32_t queue_family() const { return _queue_family; }
    PFN_vkCmdPushDescriptorSetKHR push_descriptor_fn() const { return _push_descriptor; }

    result<buffer> create_buffer(std::uint64_t size, memory_use use);
    // A buffer over `size` bytes of the caller's host memory at `host` (VK_EXT_external_memory_
    // host), host-visible and coherent, its mapped() being `host`; the memory must outlive the
    // buffer. Errors (unsupported): no such extension, a pointer or size that is not a multiple
    // of min_imported_host_pointer_alignment, no host-coherent memory type for it.
    result<buffer> import_host(void* host, std::uint64_t size);
    // Copies host bytes into a buffer (mapped memcpy, or through a staging buffer).
    status write(const buffer& dst, std::uint64_t offset, const void* src, std::uint64_t size);
    status read(const buffer& src, std::uint64_t offset, void* dst, std::uint64_t size);
    // Zeroes a whole buffer on the device (vkCmdFillBuffer, one submission): on a GPU a pool of
    // tens of GiB clears at the device's bandwidth instead of through staging copies or a mapped
    // window over the bus.
    status fill_zero(const buffer& dst);
    status wait_idle();

    // Every physical device (index order: name, kind, largest device-local heap), without
    // creating one: the server's probe for the device's choices (actors/config/device_choices).
    static result<std::vector<device_candidate>> list_devices();

private:
    device() = default;
    status init(const device_options& options);
    status pick_physical(const device_options& options);
    status create_logical();
    status staged_copy(const buffer& host, const buffer& dev, std::uint64_t dev_offset,
                       std::uint64_t size, bool to_device);
    // Records `record` into a one-time command buffer of the transfer pool, submits it and waits
    // for it (transfer_timeout_ns). `what` names it in an error.
    template <typename Record>
    status submit_once(Record&& record, const char* what);
    // The VkBuffer of create_buffer and import_host (`next`: its create info's pNext chain).
    status make_buffer(buffer& b, std::uint64_t size, const void* next);
    // b's texel view, when its size allows one (a failure only costs speed).
    void add_texel_view(buffer& b);

    device_info _info;
    VkInstance _instance = VK_NULL_HANDLE;
    VkPhysicalDevice _physical = VK_NULL_HANDLE;
    VkDevice _device = VK_NULL_HANDLE;
    VkQueue _queue = VK_NULL_HANDLE;
    std::uint32_t _queue_family = 0;
    VkCommandPool _transfer_pool = VK_NULL_HANDLE;
    memory_facts _memory_facts;  // Vulkan's memory types and heaps, for choose_memory_type
    PFN_vkCmdPushDescriptorSetKHR _push_descriptor = nullptr;
};

}  // namespace ordo::gpu
