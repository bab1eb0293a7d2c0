// weight_layout.hpp: the device layout of every weight type the Vulkan kernels run, as pure
// functions over bytes: how many bytes a chunk of rows takes, where its aux region starts, and
// the repacking of GGUF rows into it. The layouts themselves (and why each is shaped the way it
// is) are written out in gpu/vk/shaders/weight_units.glsl, whose load_raw() reads what
// repack_rows() writes. Used by gpu/vk/weights.cpp at upload; no device, no state.
#pragma once

#include <cstdint>

#include "model/ggml_types.hpp"

namespace ordo::gpu {

// Whether the kernels run `type`: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K.
bool layout_known(model::ggml_type type);

// What a row length must be a multiple of: 8 (F32/F16/BF16: the kernels' 8-element loads), 32
// (the 32-element block types), 256 (the K types' super-blocks). 0 for an unknown type.
std::uint32_t row_multiple(model::ggml_type type);

// Device bytes of `rows` rows of n_in elements in the type's layout (a multiple of 16), and the
// byte offset of the aux region (scales) inside them: the quant region's size for the
// 32-element block types, 0 for the types without one. n_in must be a multiple of
// row_multiple(type).
std::uint64_t packed_bytes(model::ggml_type type, std::uint32_t n_in, std::uint32_t rows);
std::uint64_t aux_offset_bytes(model::ggml_type type, std::uint32_t n_in, std::uint32_t rows);

// Writes `rows` GGUF rows (n_in elements each) at `src` into `dst`, packed_bytes(type, n_in,
// rows) bytes that the caller has zeroed (padding stays zero).
void repack_rows(model::ggml_type type, std::uint32_t n_in, std::uint32_t rows,
                 const std::uint8_t* src, std::uint8_t* dst);

}  // namespace ordo::gpu
