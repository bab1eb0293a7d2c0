// add.comp: out = a + b (residual add where it is not fused into a mat-mul's accumulate).
// Call site: gpu/vk/kernels.cpp encode_add().
#version 450
#extension GL_GOOGLE_include_directive : require
#include "abi.h"
layout(local_size_x_id = 0) in;
layout(push_constant) uniform push_block { add_push p; };
layout(std430, binding = ORDO_B_ADD_A) readonly buffer a_buf { float a[]; };
layout(std430, binding = ORDO_B_ADD_B) readonly buffer b_buf { float b[]; };
layout(std430, binding = ORDO_B_ADD_OUT) writeonly buffer out_buf { float dst[]; };

void main() {
    uint r = gl_WorkGroupID.y;
    uint step = gl_WorkGroupSize.x * gl_NumWorkGroups.x;
    for (uint i = gl_GlobalInvocationID.x; i < p.n; i += step) {
        dst[p.out_offset + r * p.out_stride + i] =
            a[p.a_offset + r * p.a_stride + i] + b[p.b_offset + r * p.b_stride + i];
    }
}
