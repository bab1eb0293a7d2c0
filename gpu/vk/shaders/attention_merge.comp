// attention_merge.comp: the second half of flash decoding. attention.comp's split grid wrote,
// per (token, head, split), the split's accumulators and its (m, l); one workgroup per (head,
// token) merges them in split order through attention_split.glsl, the operations attention.comp
// runs when one workgroup walks the splits itself, so a token's output has the same bits either
// way. Call site: gpu/vk/kernels.cpp encode_attention().
#version 450
#extension GL_GOOGLE_include_directive : require
#include "abi.h"
layout(constant_id = 0) const uint WG = 32;
layout(local_size_x_id = 0) in;
layout(push_constant) uniform push_block { attention_merge_push p; };
layout(std430, binding = ORDO_B_ATTN_MERGE_PARTIALS) readonly buffer partials_buf {
    float part[];
};
layout(std430, binding = ORDO_B_ATTN_MERGE_OUT) writeonly buffer out_buf { float dst[]; };
#include "attention_split.glsl"

void main() {
    uint lane = gl_LocalInvocationID.x;
    uint h = gl_WorkGroupID.x;
    uint t = gl_WorkGroupID.y;
    uint base = (t * p.n_head + h) * p.max_splits * (p.head_dim + 2u);
    split_state st = split_state(-1.0 / 0.0, 0.0);
    float out_acc[ORDO_ATTN_ACC];
    for (uint a = 0; a < ORDO_ATTN_ACC; ++a) {
        out_acc[a] = 0.0;
    }
    for (uint c = 0; c < p.n_splits; ++c) {
        uint po = base + c * (p.head_dim + 2u);
        vec2 f = split_merge(st, part[po + p.head_dim], part[po + p.head_dim + 1u]);
        for (uint a = 0; a < ORDO_ATTN_ACC; ++a) {
            uint d = lane + a * WG;
            if (d < p.head_dim) {
                out_acc[a] = split_apply(out_acc[a], part[po + d], f);
            }
        }
    }
    uint oo = p.out_offset + t * p.out_stride + h * p.head_dim;
    for (uint a = 0; a < ORDO_ATTN_ACC; ++a) {
        uint d = lane + a * WG;
        if (d < p.head_dim) {
            dst[oo + d] = st.l > 0.0 ? out_acc[a] / st.l : 0.0;
        }
    }
}
