// rms_norm.comp: RMSNorm with weight, one workgroup per row, in norm_order.glsl's order (64
// partial sums, a fixed tree), which mul_mat_vec's fused norm repeats bit for bit. Call site:
// gpu/vk/kernels.cpp encode_rms_norm() (attention and FFN input norms where the next mat-mul is
// not a fused mul_mat_vec, the final norm before the logits head).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "abi.h"
layout(constant_id = 0) const uint WG = 64;
layout(local_size_x_id = 0) in;
layout(push_constant) uniform push_block { rms_norm_push p; };
layout(std430, binding = ORDO_B_NORM_X) readonly buffer x_buf { float x[]; };
layout(std430, binding = ORDO_B_NORM_W) readonly buffer w_buf { float w[]; };
layout(std430, binding = ORDO_B_NORM_OUT) writeonly buffer out_buf { float dst[]; };
#include "norm_order.glsl"

const uint NP = ORDO_NORM_PARTS;
shared float partial[NP];

void main() {
    uint lane = gl_LocalInvocationID.x;
    uint xo = p.x_offset + gl_WorkGroupID.y * p.x_stride;
    uint oo = p.out_offset + gl_WorkGroupID.y * p.out_stride;
    for (uint j = lane; j < NP; j += WG) {
        float sum = 0.0;
        for (uint i = j; i < p.n; i += NP) {
            sum = norm_sq_add(sum, x[xo + i]);
        }
        partial[j] = sum;
    }
    barrier();
    for (uint s = NP / 2u; s > 0u; s >>= 1) {
        for (uint j = lane; j < s; j += WG) {
            partial[j] = norm_fold(partial[j], partial[j + s]);
        }
        barrier();
    }
    float inv = norm_inv(partial[0], p.n, p.eps);
    for (uint i = lane; i < p.n; i += WG) {
        dst[oo + i] = norm_apply1(x[xo + i], inv, w[i]);
    }
}
