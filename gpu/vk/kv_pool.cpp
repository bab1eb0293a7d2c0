// kv_pool.cpp: see kv_pool.hpp.
#include "gpu/vk/kv_pool.hpp"

#include <string>

#include "gpu/vk/vk_util.hpp"

namespace ordo::gpu {

result<std::unique_ptr<kv_pool>> kv_pool::create(device& dev, const kv_geometry& g) {
    if (g.n_layer == 0 || g.n_head_kv == 0 || g.head_dim == 0 || g.block_tokens == 0 ||
        g.n_blocks == 0 || g.head_dim % 2 != 0) {
        return gpu_error(gpu_failure::bad_shape,
                         "kv pool: every size must be nonzero and head_dim "
                         "even");
    }
    std::uint64_t elems = std::uint64_t(g.n_blocks) * g.n_head_kv * g.block_tokens * g.head_dim;
    std::uint64_t bytes = elems * (g.f16 ? 2 : 4);
    if (bytes > dev.info().max_storage_buffer_range || elems >= (1ull << 32)) {
        return gpu_error(gpu_failure::bad_shape,
                         "kv pool layer of " + std::to_string(bytes) +
                             " B exceeds the device's storage binding range of " +
                             std::to_string(dev.info().max_storage_buffer_range) +
                             " B; use fewer blocks");
    }
    std::unique_ptr<kv_pool> pool(new kv_pool(dev, g));
    pool->_layer_bytes = bytes;
    for (std::uint32_t l = 0; l < g.n_layer; ++l) {
        for (auto* list : {&pool->_k, &pool->_v}) {
            auto b = dev.create_buffer(bytes, memory_use::device);
            if (!b) return b.err();
            list->push_back(std::move(*b));
        }
    }
    status s = pool->clear();
    if (!s) return s.err();
    return pool;
}

buffer_view kv_pool::k(std::uint32_t layer) const {
    ORDO_GPU_CHECK(layer < _g.n_layer, "kv layer out of range");
    return whole(_k[layer]);
}

buffer_view kv_pool::v(std::uint32_t layer) const {
    ORDO_GPU_CHECK(layer < _g.n_layer, "kv layer out of range");
    return whole(_v[layer]);
}

status kv_pool::clear() {
    for (auto* list : {&_k, &_v}) {
        for (const buffer& b : *list) {
            status s = _device.fill_zero(b);
            if (!s) return s;
        }
    }
    return {};
}

}  // namespace ordo::gpu
