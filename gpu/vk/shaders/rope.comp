// rope.comp: rotary position embedding, adjacent-pair (GGML "normal") mode, in place. Call site:
// gpu/vk/kernels.cpp encode_rope() on the q (and k) heads of the fused qkv activation.
// Pair j of a head (dims 2j, 2j+1, 2j < n_rot) turns by pos * freq[j], freq being the model's
// table (rope.glsl). A lane owns one (head, pair) of one token: the heads are independent, so
// no lane walks them in turn (a lane per pair walking 40 heads waited on 40 read-after-write
// round trips: 31 us a dispatch on an H200, gpu/PERF.md session 15). The angle is a function of
// (pos, j) alone, so every lane of a pair computes the same cosine and sine.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "abi.h"
layout(local_size_x_id = 0) in;
layout(push_constant) uniform push_block { rope_push p; };
layout(std430, binding = ORDO_B_ROPE_X) buffer x_buf { float x[]; };
layout(std430, binding = ORDO_B_ROPE_POS) readonly buffer pos_buf { int positions[]; };
#define ROPE_FREQ_BINDING ORDO_B_ROPE_FREQ
#include "rope.glsl"

void main() {
    uint t = gl_WorkGroupID.y;
    uint half_rot = p.n_rot / 2u;
    uint pos = uint(positions[p.pos_offset + t]);
    uint step = gl_WorkGroupSize.x * gl_NumWorkGroups.x;
    for (uint i = gl_GlobalInvocationID.x; i < p.n_heads * half_rot; i += step) {
        uint h = i / half_rot, j = i % half_rot;
        vec2 cs = rope_cos_sin(pos, j);
        uint o = p.x_offset + t * p.x_stride + h * p.head_dim + 2u * j;
        float x0 = x[o];
        float x1 = x[o + 1u];
        x[o] = x0 * cs.x - x1 * cs.y;
        x[o + 1u] = x0 * cs.y + x1 * cs.x;
    }
}
