// weights.cpp: see weights.hpp.
#include "gpu/vk/weights.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "gpu/vk/vk_util.hpp"

namespace ordo::gpu {

namespace {

constexpr std::uint32_t qk = 32;              // elements per quant block
constexpr std::uint32_t q8_block_bytes = 34;  // GGUF Q8_0 block: f16 d + 32 int8
constexpr std::uint32_t q4_block_bytes = 18;  // GGUF Q4_0 block: f16 d + 16 nibble bytes
// Every arena allocation starts on this boundary: it covers minStorageBufferOffsetAlignment on
// every device we know (<= 256) and 16-byte vector loads.
constexpr std::uint64_t allocation_alignment = 256;

bool quantized(model::ggml_type t) {
    return t == model::ggml_type::q8_0 || t == model::ggml_type::q4_0;
}

std::uint64_t gguf_row_bytes(model::ggml_type type, std::uint32_t n_in) {
    switch (type) {
    case model::ggml_type::f32: return 4ull * n_in;
    case model::ggml_type::f16: return 2ull * n_in;
    case model::ggml_type::q8_0: return std::uint64_t(n_in / qk) * q8_block_bytes;
    case model::ggml_type::q4_0: return std::uint64_t(n_in / qk) * q4_block_bytes;
    default: return 0;
    }
}

std::uint64_t quant_bytes(model::ggml_type type, std::uint32_t n_in, std::uint32_t rows) {
    return type == model::ggml_type::q8_0 ? std::uint64_t(rows) * n_in
                                          : std::uint64_t(rows) * n_in / 2;
}

// Repacks `rows` GGUF rows at `src` into dst (packed_bytes long): quants, then f16 scales.
void repack(model::ggml_type type, std::uint32_t n_in, std::uint32_t rows,
            const std::uint8_t* src, std::uint8_t* dst) {
    if (!quantized(type)) {
        std::memcpy(dst, src, gguf_row_bytes(type, n_in) * rows);
        return;
    }
    std::uint64_t blocks = std::uint64_t(rows) * (n_in / qk);
    std::uint32_t in_bytes = type == model::ggml_type::q8_0 ? q8_block_bytes : q4_block_bytes;
    std::uint32_t q_bytes = in_bytes - 2;
    std::uint8_t* scales = dst + quant_bytes(type, n_in, rows);
    for (std::uint64_t b = 0; b < blocks; ++b) {
        const std::uint8_t* blk = src + b * in_bytes;
        std::memcpy(scales + 2 * b, blk, 2);
        std::memcpy(dst + b * q_bytes, blk + 2, q_bytes);
    }
}

}  // namespace

bool kernels_run(model::ggml_type type) { return gguf_row_bytes(type, qk) != 0; }

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
        return make_error("gpu_bad_shape", "allocation of " + std::to_string(bytes) +
                                               " B does not fit a " +
                                               std::to_string(_page_bytes) + " B page");
    }
    std::uint64_t start = (_used + allocation_alignment - 1) / allocation_alignment *
                          allocation_alignment;
    if (_pages.empty() || start + bytes > _page_bytes) {
        auto b = _device.create_buffer(_page_bytes, memory_use::device);
        if (!b) return b.err();
        _pages.push_back(std::make_unique<buffer>(std::move(*b)));
        start = 0;
    }
    _used = start + bytes;
    return buffer_view{_pages.back().get(), start, bytes};
}

std::uint64_t arena::bytes_reserved() const { return _pages.size() * _page_bytes; }

std::uint64_t packed_bytes(model::ggml_type type, std::uint32_t n_in, std::uint32_t rows) {
    if (!quantized(type)) {
        return gguf_row_bytes(type, n_in) * rows;
    }
    std::uint64_t blocks = std::uint64_t(rows) * (n_in / qk);
    return quant_bytes(type, n_in, rows) + (blocks + 1) / 2 * 4;  // scales padded to a word
}

result<weight_tensor> upload_weight(device& dev, arena& mem, model::ggml_type type,
                                    std::uint32_t n_in, std::uint32_t n_out,
                                    std::span<const std::uint8_t> data) {
    if (!kernels_run(type)) {
        return make_error("gpu_unsupported_type",
                          "weight type " + std::string(model::type_name(type)) +
                              " has no kernel (" + kernel_type_names() + ")");
    }
    std::uint32_t multiple = quantized(type) ? qk : 8;
    if (n_in == 0 || n_out == 0 || n_in % multiple != 0) {
        return make_error("gpu_bad_shape", "weight " + std::to_string(n_in) + "x" +
                                               std::to_string(n_out) + ": n_in must be a "
                                               "nonzero multiple of " + std::to_string(multiple));
    }
    std::uint64_t row_bytes = gguf_row_bytes(type, n_in);
    if (data.size() != row_bytes * n_out) {
        return make_error("gpu_bad_shape", "weight data is " + std::to_string(data.size()) +
                                               " B, expected " +
                                               std::to_string(row_bytes * n_out));
    }
    // Rows per chunk: as many as fit a page (with the scale padding word).
    std::uint32_t rows_max = 0;
    for (std::uint32_t step = 1u << 30; step > 0; step >>= 1) {
        std::uint32_t r = std::min(n_out, rows_max + step);
        if (r > rows_max && packed_bytes(type, n_in, r) <= mem.page_bytes()) rows_max = r;
    }
    if (rows_max == 0) {
        return make_error("gpu_bad_shape", "one row of " + std::to_string(n_in) +
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
        repack(type, n_in, rows, data.data() + row * row_bytes, staging.data());
        status s = dev.write(*view->buf, view->offset, staging.data(), bytes);
        if (!s) return s.err();
        std::uint32_t scale_offset =
            quantized(type) ? static_cast<std::uint32_t>(quant_bytes(type, n_in, rows) / 4) : 0;
        t.chunks.push_back({*view, row, rows, scale_offset});
    }
    return t;
}

}  // namespace ordo::gpu
