// rms_norm_tx.comp: RMSNorm with weight for devices that prefer texel fetches (lavapipe): one
// workgroup = one subgroup per row, x and the weight read 4 floats per texel fetch, the sum of
// squares reduced with subgroupAdd: no shared memory, no barrier (rms_norm.comp's 64-lane tree
// costs six barriers, each a full coroutine switch of every SIMD group on llvmpipe). Call site:
// gpu/vk/kernels.cpp encode_rms_norm() when the operands are texel-aligned; a row's result never
// depends on the other rows (batch invariance). Offsets are floats from the buffer start.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "abi.h"
layout(local_size_x_id = 0) in;
layout(push_constant) uniform push_block { rms_norm_push p; };
layout(binding = ORDO_B_NORM_X) uniform usamplerBuffer x_tex;
layout(binding = ORDO_B_NORM_W) uniform usamplerBuffer w_tex;
layout(std430, binding = ORDO_B_NORM_OUT) writeonly buffer out_buf { vec4 dst[]; };

void main() {
    uint lane = gl_SubgroupInvocationID;
    uint lanes = gl_SubgroupSize;
    uint x4 = (p.x_offset + gl_WorkGroupID.y * p.x_stride) / 4u;
    uint o4 = (p.out_offset + gl_WorkGroupID.y * p.out_stride) / 4u;
    uint n4 = p.n / 4u;
    vec4 sum = vec4(0.0);
    for (uint i = lane; i < n4; i += lanes) {
        vec4 v = uintBitsToFloat(texelFetch(x_tex, int(x4 + i)));
        sum += v * v;
    }
    float total = subgroupAdd((sum.x + sum.y) + (sum.z + sum.w));
    float inv = inversesqrt(total / float(p.n) + p.eps);
    for (uint i = lane; i < n4; i += lanes) {
        vec4 v = uintBitsToFloat(texelFetch(x_tex, int(x4 + i)));
        vec4 w = uintBitsToFloat(texelFetch(w_tex, int(i)));
        dst[o4 + i] = v * inv * w;
    }
}
