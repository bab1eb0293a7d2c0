// swiglu_tx.comp: out = silu(gate) * up, 4 elements per lane read by texel fetch (lavapipe;
// swiglu.comp's per-element storage loads are scalar loops there). Call site: gpu/vk/kernels.cpp
// encode_swiglu() when the operands are texel-aligned. Offsets are floats from the buffer start.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "abi.h"
layout(local_size_x_id = 0) in;
layout(push_constant) uniform push_block { swiglu_push p; };
layout(binding = ORDO_B_SWIGLU_GATE) uniform usamplerBuffer g_tex;
layout(binding = ORDO_B_SWIGLU_UP) uniform usamplerBuffer u_tex;
layout(std430, binding = ORDO_B_SWIGLU_OUT) writeonly buffer out_buf { vec4 dst[]; };
#include "norm_order.glsl"

void main() {
    uint r = gl_WorkGroupID.y;
    uint step = gl_WorkGroupSize.x * gl_NumWorkGroups.x;
    uint g4 = (p.gate_offset + r * p.gate_stride) / 4u;
    uint u4 = (p.up_offset + r * p.up_stride) / 4u;
    uint o4 = (p.out_offset + r * p.out_stride) / 4u;
    for (uint i = gl_GlobalInvocationID.x; i < p.n / 4u; i += step) {
        vec4 gv = uintBitsToFloat(texelFetch(g_tex, int(g4 + i)));
        vec4 uv = uintBitsToFloat(texelFetch(u_tex, int(u4 + i)));
        dst[o4 + i] = vec4(silu_mul(gv.x, uv.x), silu_mul(gv.y, uv.y), silu_mul(gv.z, uv.z),
                          silu_mul(gv.w, uv.w));
    }
}
