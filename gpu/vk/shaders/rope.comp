// rope.comp: rotary position embedding, adjacent-pair (GGML "normal") mode, in place. Call site:
// gpu/vk/kernels.cpp encode_rope() on the q (and k) heads of the fused qkv activation.
// Pair j of a head (dims 2j, 2j+1, 2j < n_rot) turns by pos * freq[j], freq being the model's
// table (rope.glsl). A lane owns pair index j of one token and turns it in every head: the angle,
// cosine and sine are computed once per (token, j), not once per head.
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
    for (uint j = gl_GlobalInvocationID.x; j < half_rot; j += step) {
        vec2 cs = rope_cos_sin(pos, j);
        for (uint h = 0; h < p.n_heads; ++h) {
            uint o = p.x_offset + t * p.x_stride + h * p.head_dim + 2u * j;
            float x0 = x[o];
            float x1 = x[o + 1u];
            x[o] = x0 * cs.x - x1 * cs.y;
            x[o + 1u] = x0 * cs.y + x1 * cs.x;
        }
    }
}
