// kv_pool.hpp: the paged KV cache on the device, allocated once (size from config) and shared
// by all sequences through block tables. Block b holds `block_tokens` consecutive positions of
// one sequence for every layer and kv head. Storage is layer-major: each layer's K (and V) is
// one buffer, so attention binds one range per layer and the pool as a whole may exceed one
// storage binding. Layout inside a layer: see abi.h (kv_write_push). Owned by the gpu actor;
// tests/gpu and bench/gpu_kernels build their own.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "actors/runtime/result.hpp"
#include "gpu/vk/device.hpp"

namespace ordo::gpu {

struct kv_geometry {
    std::uint32_t n_layer = 0;
    std::uint32_t n_head_kv = 0;
    std::uint32_t head_dim = 0;      // even
    std::uint32_t block_tokens = 0;  // positions per block
    std::uint32_t n_blocks = 0;      // blocks in the pool
    bool f16 = true;                 // storage element: f16 (halves) or f32
};

class kv_pool {
public:
    // Errors: gpu_bad_shape (zero sizes, odd head_dim, a layer larger than one binding).
    static result<std::unique_ptr<kv_pool>> create(device& dev, const kv_geometry& g);

    const kv_geometry& geometry() const { return _g; }
    std::uint64_t layer_bytes() const { return _layer_bytes; }
    std::uint64_t total_bytes() const { return _layer_bytes * 2 * _g.n_layer; }
    buffer_view k(std::uint32_t layer) const;
    buffer_view v(std::uint32_t layer) const;
    // Zeroes every block (device rebuild, tests).
    status clear();

private:
    kv_pool(device& dev, const kv_geometry& g) : _device(dev), _g(g) {}

    device& _device;
    kv_geometry _g;
    std::uint64_t _layer_bytes = 0;
    std::vector<buffer> _k;  // per layer
    std::vector<buffer> _v;
};

}  // namespace ordo::gpu
