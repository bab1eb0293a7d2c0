// swiglu.comp: out = silu(gate) * up, the Llama FFN activation. Call site: gpu/vk/kernels.cpp
// encode_swiglu() between the fused gate|up mat-mul and the down projection, where the
// mat-mul is not a mul_mat_vec_glu (which applies the same silu_mul, norm_order.glsl).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "abi.h"
layout(local_size_x_id = 0) in;
layout(push_constant) uniform push_block { swiglu_push p; };
layout(std430, binding = ORDO_B_SWIGLU_GATE) readonly buffer g_buf { float g[]; };
layout(std430, binding = ORDO_B_SWIGLU_UP) readonly buffer u_buf { float u[]; };
layout(std430, binding = ORDO_B_SWIGLU_OUT) writeonly buffer out_buf { float dst[]; };
#include "norm_order.glsl"

void main() {
    uint r = gl_WorkGroupID.y;
    uint step = gl_WorkGroupSize.x * gl_NumWorkGroups.x;
    for (uint i = gl_GlobalInvocationID.x; i < p.n; i += step) {
        float gv = g[p.gate_offset + r * p.gate_stride + i];
        float uv = u[p.up_offset + r * p.up_stride + i];
        dst[p.out_offset + r * p.out_stride + i] = silu_mul(gv, uv);
    }
}
