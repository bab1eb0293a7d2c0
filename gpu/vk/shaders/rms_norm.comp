// rms_norm.comp: RMSNorm with weight, one workgroup per row. Call site: gpu/vk/kernels.cpp
// encode_rms_norm() (attention and FFN input norms, the final norm before the logits head).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "abi.h"
layout(constant_id = 0) const uint WG = 64;
layout(local_size_x_id = 0) in;
layout(push_constant) uniform push_block { rms_norm_push p; };
layout(std430, binding = ORDO_B_NORM_X) readonly buffer x_buf { float x[]; };
layout(std430, binding = ORDO_B_NORM_W) readonly buffer w_buf { float w[]; };
layout(std430, binding = ORDO_B_NORM_OUT) writeonly buffer out_buf { float dst[]; };

shared float partial[WG];

void main() {
    uint lane = gl_LocalInvocationID.x;
    uint xo = p.x_offset + gl_WorkGroupID.y * p.x_stride;
    uint oo = p.out_offset + gl_WorkGroupID.y * p.out_stride;
    float sum = 0.0;
    for (uint i = lane; i < p.n; i += WG) {
        sum += x[xo + i] * x[xo + i];
    }
    partial[lane] = sum;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (lane < s) {
            partial[lane] += partial[lane + s];
        }
        barrier();
    }
    float inv = inversesqrt(partial[0] / float(p.n) + p.eps);
    for (uint i = lane; i < p.n; i += WG) {
        dst[oo + i] = x[xo + i] * inv * w[i];
    }
}
