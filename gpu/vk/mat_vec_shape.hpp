// mat_vec_shape.hpp: one mul_mat_vec variant's shape, chosen per weight. The runner measures
// the shapes on the model's own weights at warm-up (runner::choose_mat_vec_shapes) and each
// weight_tensor carries the one its one-token steps run; pipelines::for_cols builds it.
// Every shape sums in mat_order.glsl's order (helpers compute products, each group's owner adds
// them in order), so the choice changes speed, never a bit.
#pragma once

#include <cstdint>

namespace ordo::gpu {

struct mat_vec_shape {
    // Lanes per mat_order.glsl group (mul_mat_vec.comp H: 1, 2, 4 or 8) and units each lane
    // loads before summing (UNROLL: 1, 2, 4 or 8, a multiple of split). 0: the tuning's
    // (pipeline_tuning::mat_vec_split, mat_vec_unroll / mat_vec_block_unroll).
    std::uint32_t split = 0;
    std::uint32_t unroll = 0;

    bool tuned() const { return split == 0 && unroll == 0; }
    // One number per shape (the pipelines' variant key).
    std::uint32_t key() const { return split << 8 | unroll; }
    friend bool operator==(const mat_vec_shape&, const mat_vec_shape&) = default;
};

}  // namespace ordo::gpu
