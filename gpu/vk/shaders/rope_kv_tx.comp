// rope_kv_tx.comp: the attention block's step between the q|k|v mat-mul and attention, in one
// dispatch: rotate q and k (RoPE), write q back in place, and store the rotated k and v into the
// token's KV pool slot. Call site: gpu/vk/kernels.cpp encode_rope_kv() (the texel path;
// rope_kv.comp is the storage family's). One workgroup (one subgroup) per token; lane c takes
// texel c (elements 4c..4c+3, rotation pairs 2c and 2c+1) of every head, computes its two
// angles once and walks the q heads, the k heads and the v heads. Reads go through the qkv
// buffer's texel view (a branch-free gather on lavapipe, where storage-buffer loads are per-lane
// loops: gpu/PERF.md). Every token's result depends on its own row and position only, whatever
// the batch (batch invariance).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "abi.h"
layout(local_size_x_id = 0) in;
layout(push_constant) uniform push_block { rope_kv_push p; };
layout(binding = ORDO_B_ROPE_KV_SRC) uniform usamplerBuffer src_tex;
layout(std430, binding = ORDO_B_ROPE_KV_Q) buffer q_buf { vec4 q4[]; };
layout(std430, binding = ORDO_B_ROPE_KV_INTS) readonly buffer ints_buf { int ints[]; };
#define KV_BINDING_K ORDO_B_ROPE_KV_K
#define KV_BINDING_V ORDO_B_ROPE_KV_V
#include "kv_pool.glsl"
#define ROPE_FREQ_BINDING ORDO_B_ROPE_KV_FREQ
#include "rope.glsl"

void main() {
    uint t = gl_WorkGroupID.y;
    uint texels = p.head_dim / 4u;  // per head
    uint pos = uint(ints[p.pos_offset + t]);
    int slot = ints[p.slots_offset + t];
    // A negative slot skips the token's K/V store; an out-of-pool slot is refused here as well
    // as on the host.
    bool store = slot >= 0 && uint(slot) < p.n_blocks * p.block_tokens;
    uint block = store ? uint(slot) / p.block_tokens : 0u;
    uint in_block = store ? uint(slot) % p.block_tokens : 0u;
    uint src = p.src_texel + t * (p.stride / 4u);
    uint q = (p.q_offset + t * p.stride) / 4u;
    for (uint c = gl_LocalInvocationID.x; c < texels; c += gl_WorkGroupSize.x) {
        uint j0 = 2u * c, j1 = 2u * c + 1u;
        // Pairs from n_rot / 2 on are not rotated, nor in the table.
        bool r0 = 2u * j0 < p.n_rot, r1 = 2u * j1 < p.n_rot;
        vec2 a0 = r0 ? rope_cos_sin(pos, j0) : vec2(1.0, 0.0);
        vec2 a1 = r1 ? rope_cos_sin(pos, j1) : vec2(1.0, 0.0);
        for (uint h = 0; h < p.n_head; ++h) {
            vec4 e = uintBitsToFloat(texelFetch(src_tex, int(src + h * texels + c)));
            if (r0) e.xy = rope_rotate(e.xy, a0);
            if (r1) e.zw = rope_rotate(e.zw, a1);
            q4[q + h * texels + c] = e;
        }
        if (!store) continue;
        uint k_src = src + p.n_head * texels;
        uint v_src = k_src + p.n_head_kv * texels;
        for (uint h = 0; h < p.n_head_kv; ++h) {
            uint dst = ((block * p.n_head_kv + h) * p.block_tokens + in_block) * p.head_dim + 4u * c;
            vec4 k = uintBitsToFloat(texelFetch(src_tex, int(k_src + h * texels + c)));
            if (r0) k.xy = rope_rotate(k.xy, a0);
            if (r1) k.zw = rope_rotate(k.zw, a1);
            k_store_pair(dst, k.xy);
            k_store_pair(dst + 2u, k.zw);
            vec4 v = uintBitsToFloat(texelFetch(src_tex, int(v_src + h * texels + c)));
            v_store_pair(dst, v.xy);
            v_store_pair(dst + 2u, v.zw);
        }
    }
}
