// weights.cpp: see weights.hpp.
#include "gpu/vk/weights.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "gpu/vk/vk_util.hpp"
#include "gpu/vk/weight_layout.hpp"

namespace ordo::gpu {

namespace {

// Every arena allocation starts on this boundary: it covers minStorageBufferOffsetAlignment on
// every device we know (<= 256) and 16-byte vector loads.
constexpr std::uint64_t allocation_alignment = 256;

}  // namespace

bool kernels_run(model::ggml_type type) {
    return layout_known(type);
}

std::string kernel_type_names() {
    std::string out;
    for (const auto& t : model::k_ggml_types) {
        if (!kernels_run(t.type)) continue;
        out += (out.empty() ? "" : ", ") + std::string(t.name);
    }
    return out;
}

arena::arena(device& dev, std::uint64_t page_bytes) : _device(dev), _page_bytes(page_bytes) {
    ORDO_GPU_CHECK(page_bytes > 0 && page_bytes <= dev.info().max_storage_buffer_range,
                   "arena page must fit one storage binding");
}

result<buffer_view> arena::allocate(std::uint64_t bytes) {
    if (bytes == 0 || bytes > _page_bytes) {
        return gpu_error(gpu_failure::bad_shape, "allocation of " + std::to_string(bytes) +
                                                     " B does not fit a " +
                                                     std::to_string(_page_bytes) + " B page");
    }
    std::uint64_t start =
        (_used + allocation_alignment - 1) / allocation_alignment * allocation_alignment;
    if (_pages.empty() || start + bytes > _page_bytes) {
        auto b = _device.create_buffer(_page_bytes, memory_use::device);
        if (!b) return b.err();
        _pages.push_back(std::make_unique<buffer>(std::move(*b)));
        start = 0;
    }
    _used = start + bytes;
    return buffer_view{_pages.back().get(), start, bytes};
}

std::uint64_t arena::bytes_reserved() const {
    return _pages.size() * _page_bytes;
}

result<weight_tensor> upload_weight(device& dev, arena& mem, model::ggml_type type,
                                    std::uint32_t n_in, std::uint32_t n_out,
                                    std::span<const std::uint8_t> data) {
    if (!kernels_run(type)) {
        return gpu_error(gpu_failure::unsupported_type,
                         "weight type " + std::string(model::type_name(type)) + " has no kernel (" +
                             kernel_type_names() + ")");
    }
    const std::uint32_t multiple = row_multiple(type);
    if (n_in == 0 || n_out == 0 || n_in % multiple != 0) {
        return gpu_error(gpu_failure::bad_shape, "weight " + std::to_string(n_in) + "x" +
                                                     std::to_string(n_out) +
                                                     ": n_in must be a "
                                                     "nonzero multiple of " +
                                                     std::to_string(multiple));
    }
    const std::uint64_t row_bytes = *model::bytes_for(type, n_in);
    if (data.size() != row_bytes * n_out) {
        return gpu_error(gpu_failure::bad_shape, "weight data is " + std::to_string(data.size()) +
                                                     " B, expected " +
                                                     std::to_string(row_bytes * n_out));
    }
    // Rows per chunk: as many as fit a page (with the aux region's padding).
    std::uint32_t rows_max = 0;
    for (std::uint32_t step = 1u << 30; step > 0; step >>= 1) {
        std::uint32_t r = std::min(n_out, rows_max + step);
        if (r > rows_max && packed_bytes(type, n_in, r) <= mem.page_bytes()) rows_max = r;
    }
    if (rows_max == 0) {
        return gpu_error(gpu_failure::bad_shape, "one row of " + std::to_string(n_in) +
                                                     " elements does not fit a storage binding");
    }
    weight_tensor t{type, n_in, n_out, {}};
    std::vector<std::uint8_t> staging;
    for (std::uint32_t row = 0; row < n_out; row += rows_max) {
        std::uint32_t rows = std::min(rows_max, n_out - row);
        std::uint64_t bytes = packed_bytes(type, n_in, rows);
        auto view = mem.allocate(bytes);
        if (!view) return view.err();
        staging.assign(bytes, 0);
        repack_rows(type, n_in, rows, data.data() + row * row_bytes, staging.data());
        status s = dev.write(*view->buf, view->offset, staging.data(), bytes);
        if (!s) return s.err();
        auto aux_offset = static_cast<std::uint32_t>(aux_offset_bytes(type, n_in, rows) / 4);
        t.chunks.push_back({*view, row, rows, aux_offset});
    }
    return t;
}

}  // namespace ordo::gpu
