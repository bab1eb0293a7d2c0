// weights.hpp: device-resident weight tensors. A tensor may be larger than one storage binding
// (lavapipe: 128 MiB), so it is a list of row chunks, each a view of whole rows that a kernel
// binds by itself (one dispatch per chunk). Block types are repacked at upload into the device
// layouts of gpu/vk/shaders/weight_units.glsl (gpu/vk/weight_layout.hpp), whose 16-byte texels
// the kernels fetch whole.
// Memory comes from an arena of device buffers allocated once at model load; nothing here is
// called on the step path. Used by the gpu actor's weight upload, tests/gpu, bench/gpu_kernels.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "actors/runtime/result.hpp"
#include "gpu/vk/device.hpp"
#include "gpu/vk/mat_vec_shape.hpp"
#include "gpu/vk/weight_layout.hpp"
#include "model/ggml_types.hpp"

namespace ordo::gpu {

// Bump allocator over device buffers of `page_bytes` each (<= maxStorageBufferRange), so
// every allocation is one bindable range. Allocations are aligned for descriptor offsets.
class arena {
public:
    arena(device& dev, std::uint64_t page_bytes);
    result<buffer_view> allocate(std::uint64_t bytes);
    std::uint64_t page_bytes() const { return _page_bytes; }
    std::uint64_t bytes_reserved() const;  // device memory held by the pages

private:
    device& _device;
    std::uint64_t _page_bytes;
    std::vector<std::unique_ptr<buffer>> _pages;
    std::uint64_t _used = 0;  // bytes used in the last page
};

struct weight_chunk {
    buffer_view view;
    std::uint32_t row_begin = 0;  // first tensor row in this chunk
    std::uint32_t row_count = 0;
    std::uint32_t scale_offset = 0;  // word offset of the aux region (32-element block types)
};

struct weight_tensor {
    model::ggml_type type = model::ggml_type::f32;
    std::uint32_t n_in = 0;   // ne0, elements per row
    std::uint32_t n_out = 0;  // ne1, rows
    std::vector<weight_chunk> chunks;
    // The mul_mat_vec shape its one-token steps run: the tuning's unless the runner measured
    // another faster on this weight at warm-up (runner::choose_mat_vec_shapes). Same bits.
    mat_vec_shape vec_shape;
};

// The weight types the Vulkan kernels run (weight_layout.hpp: layout_known): every type the CPU
// reference computes with (model::is_supported). A model with another type is refused before
// any upload (gpu/runner: check_weight_types).
bool kernels_run(model::ggml_type type);

// "f32, f16, q4_0, ...": the types kernels_run accepts, for messages.
std::string kernel_type_names();

// Uploads a GGUF-layout tensor (n_out rows of n_in elements, `data` = n_out row_bytes) into
// chunks of at most arena.page_bytes(). Errors: gpu_unsupported_type (not kernels_run),
// gpu_bad_shape (n_in not a multiple of row_multiple(type): 8 for F32/F16/BF16, 32 for the
// 32-element block types, 256 for the K types; a wrong byte count; a row larger than a page),
// and allocation/copy failures.
result<weight_tensor> upload_weight(device& dev, arena& mem, model::ggml_type type,
                                    std::uint32_t n_in, std::uint32_t n_out,
                                    std::span<const std::uint8_t> data);

}  // namespace ordo::gpu
