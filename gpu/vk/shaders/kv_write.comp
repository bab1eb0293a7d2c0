// kv_write.comp: writes the new tokens' K and V rows (from the fused qkv activation, after
// RoPE) into their slots of one layer of the paged KV pool. Call site: gpu/vk/kernels.cpp
// encode_kv_write(). Grid: x = element pairs of all kv heads (strided), y = token.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "abi.h"
layout(local_size_x_id = 0) in;
layout(push_constant) uniform push_block { kv_write_push p; };
layout(std430, binding = ORDO_B_KVW_SRC) readonly buffer src_buf { float src[]; };
layout(std430, binding = ORDO_B_KVW_SLOTS) readonly buffer slots_buf { int slots[]; };
#define KV_BINDING_K ORDO_B_KVW_K
#define KV_BINDING_V ORDO_B_KVW_V
#include "kv_pool.glsl"

void main() {
    uint t = gl_WorkGroupID.y;
    int slot = slots[p.slots_offset + t];
    // A negative slot skips the token; an out-of-pool slot is refused here as well as on the host.
    if (slot < 0 || uint(slot) >= p.n_blocks * p.block_tokens) {
        return;
    }
    uint block = uint(slot) / p.block_tokens;
    uint in_block = uint(slot) % p.block_tokens;
    uint half_dim = p.head_dim / 2u;
    uint pairs = p.n_head_kv * half_dim;
    uint step = gl_WorkGroupSize.x * gl_NumWorkGroups.x;
    for (uint i = gl_GlobalInvocationID.x; i < pairs; i += step) {
        uint h = i / half_dim;
        uint d = (i % half_dim) * 2u;
        uint dst = ((block * p.n_head_kv + h) * p.block_tokens + in_block) * p.head_dim + d;
        uint s = t * p.src_stride + h * p.head_dim + d;
        k_store_pair(dst, vec2(src[p.k_offset + s], src[p.k_offset + s + 1u]));
        v_store_pair(dst, vec2(src[p.v_offset + s], src[p.v_offset + s + 1u]));
    }
}
