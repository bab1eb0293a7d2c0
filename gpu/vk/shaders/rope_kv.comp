// rope_kv.comp: the attention block's step between the q|k|v mat-mul and attention on the
// storage family (GPUs), in one dispatch: rotate q and k (RoPE, adjacent-pair "normal" mode),
// write q back in place, store the rotated k and the v into the token's KV pool slot. Call site:
// gpu/vk/kernels.cpp encode_rope_kv() (rope_kv_tx.comp is the texel family's form). Before it,
// this was two dispatches (a rope in place over the q and k heads, then a copy of k and v into
// the pool), each with its barrier, in every layer of every step.
// Grid: x = the token's element pairs (q heads, then k, then v: head h, pair j), strided; y =
// token. A lane owns one pair of one head: consecutive lanes read consecutive pairs of the row
// and store consecutive pairs of a pool slot. The angle is a function of (position, j) alone
// (rope.glsl), the rotation one expression (rope_rotate), so a token's values depend on its own
// row and position only, whatever the batch (batch invariance).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "abi.h"
layout(local_size_x_id = 0) in;
layout(push_constant) uniform push_block { rope_kv_push p; };
layout(std430, binding = ORDO_B_ROPE_KVS_QKV) buffer qkv_buf { float qkv[]; };
layout(std430, binding = ORDO_B_ROPE_KVS_INTS) readonly buffer ints_buf { int ints[]; };
#define KV_BINDING_K ORDO_B_ROPE_KVS_K
#define KV_BINDING_V ORDO_B_ROPE_KVS_V
#include "kv_pool.glsl"
#define ROPE_FREQ_BINDING ORDO_B_ROPE_KVS_FREQ
#include "rope.glsl"

void main() {
    uint t = gl_WorkGroupID.y;
    uint half_dim = p.head_dim / 2u, half_rot = p.n_rot / 2u;
    uint pos = uint(ints[p.pos_offset + t]);
    int slot = ints[p.slots_offset + t];
    // A negative slot skips the token's K/V store (its q is still rotated); an out-of-pool slot
    // is refused here as well as on the host.
    bool store = slot >= 0 && uint(slot) < p.n_blocks * p.block_tokens;
    uint block = store ? uint(slot) / p.block_tokens : 0u;
    uint in_block = store ? uint(slot) % p.block_tokens : 0u;
    uint kv_head0 = p.n_head, v_head0 = p.n_head + p.n_head_kv;
    uint pairs = (store ? v_head0 + p.n_head_kv : p.n_head) * half_dim;
    uint row = p.q_offset + t * p.stride;
    uint step = gl_WorkGroupSize.x * gl_NumWorkGroups.x;
    for (uint i = gl_GlobalInvocationID.x; i < pairs; i += step) {
        uint h = i / half_dim, j = i % half_dim;
        // Pairs from n_rot / 2 on are not rotated, nor in the table; v is never rotated.
        bool turn = j < half_rot && h < v_head0;
        if (h < kv_head0 && !turn) continue;  // a q pair left as it is
        uint o = row + h * p.head_dim + 2u * j;
        vec2 x = vec2(qkv[o], qkv[o + 1u]);
        if (turn) x = rope_rotate(x, rope_cos_sin(pos, j));
        if (h < kv_head0) {
            qkv[o] = x.x;
            qkv[o + 1u] = x.y;
            continue;
        }
        uint kh = h < v_head0 ? h - kv_head0 : h - v_head0;
        uint dst = ((block * p.n_head_kv + kh) * p.block_tokens + in_block) * p.head_dim + 2u * j;
        if (h < v_head0) {
            k_store_pair(dst, x);
        } else {
            v_store_pair(dst, x);
        }
    }
}
