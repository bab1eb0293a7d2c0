// mul_mat_fold.comp: the second half of the tiled mat-mul's group split (mul_mat.comp p.split):
// y[t][row_begin + r] (+)= group 0's sum folded with groups 1..7 in order (mat_order.glsl's
// mat_fold), the operations the unsplit kernel runs, so a token's outputs do not depend on
// whether its mat-mul was split. Call site: gpu/vk/kernels.cpp encode_mul_mat().
#version 450
#extension GL_GOOGLE_include_directive : require
#include "abi.h"
layout(local_size_x_id = 0) in;
layout(push_constant) uniform push_block { mat_fold_push p; };
#include "mat_order.glsl"
layout(std430, binding = ORDO_B_FOLD_PARTIALS) readonly buffer p_buf { float part[]; };
layout(std430, binding = ORDO_B_FOLD_Y) buffer y_buf { float y[]; };

void main() {
    uint t = gl_WorkGroupID.y;
    uint step = gl_WorkGroupSize.x * gl_NumWorkGroups.x;
    uint group = p.n_cols * p.p_stride;
    for (uint r = gl_GlobalInvocationID.x; r < p.n_rows; r += step) {
        uint b = p.p_offset + t * p.p_stride + r;
        float total = part[b];
        for (uint g = 1u; g < ORDO_MAT_GROUPS; ++g) {
            total = mat_fold(total, part[b + g * group]);
        }
        uint o = p.y_offset + t * p.y_stride + p.row_begin + r;
        y[o] = p.accumulate != 0u ? y[o] + total : total;
    }
}
