// attention_tx.comp: causal attention over the paged KV cache (decode and chunked prefill),
// the texel-fetch variant of attention.comp for devices whose subgroup is the whole workgroup.
// Call site: gpu/kernels.cpp encode_attention() when the pipeline tuning prefers texel kernels.
// One workgroup = one subgroup per (head, query token). Each lane takes keys lane, lane + WG,
// ... and keeps its own online softmax (max m, sum l, output row acc in registers); the lanes'
// states are merged once at the end with subgroupMax/subgroupAdd. No shared memory and no
// barrier, and every load in the key loop is a texel fetch: on lavapipe that avoids the
// per-lane scalar loops of storage-buffer and shared-memory loads (gpu/PERF.md).
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "abi.h"
layout(local_size_x_id = 0) in;  // = the subgroup size (checked by the encoder)
layout(push_constant) uniform push_block { attention_tx_push p; };
layout(binding = ORDO_B_ATTN_Q) uniform usamplerBuffer q_tex;
layout(binding = ORDO_B_ATTN_K) uniform usamplerBuffer k_tex;
layout(binding = ORDO_B_ATTN_V) uniform usamplerBuffer v_tex;
layout(std430, binding = ORDO_B_ATTN_TOKENS) readonly buffer tokens_buf { int tokens[]; };
layout(binding = ORDO_B_ATTN_TABLES) uniform usamplerBuffer tables_tex;
layout(std430, binding = ORDO_B_ATTN_OUT) writeonly buffer out_buf { float dst[]; };

const uint D8 = HD_MAX / 8u;  // 8-element groups of a head row held per lane

// Elements [8i, 8i + 8) of the K or V row starting at element `base` (a multiple of 8).
void kv_group(bool is_k, uint base, uint i, out vec4 lo, out vec4 hi) {
#if KV_F16
    uint texel = (is_k ? p.k_texel : p.v_texel) + base / 8u + i;
    uvec4 w = is_k ? texelFetch(k_tex, int(texel)) : texelFetch(v_tex, int(texel));
    lo = vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y));
    hi = vec4(unpackHalf2x16(w.z), unpackHalf2x16(w.w));
#else
    uint texel = (is_k ? p.k_texel : p.v_texel) + base / 4u + 2u * i;
    if (is_k) {
        lo = uintBitsToFloat(texelFetch(k_tex, int(texel)));
        hi = uintBitsToFloat(texelFetch(k_tex, int(texel + 1u)));
    } else {
        lo = uintBitsToFloat(texelFetch(v_tex, int(texel)));
        hi = uintBitsToFloat(texelFetch(v_tex, int(texel + 1u)));
    }
#endif
}

void main() {
    uint lane = gl_LocalInvocationID.x;
    uint h = gl_WorkGroupID.x;
    uint t = gl_WorkGroupID.y;
    int seq_in = tokens[p.tokens_offset + 2u * t];
    int pos_in = tokens[p.tokens_offset + 2u * t + 1u];
    // A bad token (the host validates them too) attends to nothing: output 0.
    bool valid = seq_in >= 0 && uint(seq_in) < p.n_seqs && pos_in >= 0 &&
                 uint(pos_in) < p.max_blocks_per_seq * p.block_tokens;
    uint seq = valid ? uint(seq_in) : 0u;
    uint n_keys = valid ? uint(pos_in) + 1u : 0u;
    uint kvh = h / (p.n_head / p.n_head_kv);
    uint groups = p.head_dim / 8u;
    vec4 q_lo[D8], q_hi[D8], acc_lo[D8], acc_hi[D8];
    uint qt = p.q_texel + t * p.q_stride4 + h * (p.head_dim / 4u);
    [[unroll]] for (uint i = 0; i < D8; ++i) {
        bool in_row = i < groups;
        q_lo[i] = in_row ? uintBitsToFloat(texelFetch(q_tex, int(qt + 2u * i))) * p.scale
                         : vec4(0.0);
        q_hi[i] = in_row ? uintBitsToFloat(texelFetch(q_tex, int(qt + 2u * i + 1u))) * p.scale
                         : vec4(0.0);
        acc_lo[i] = vec4(0.0);
        acc_hi[i] = vec4(0.0);
    }
    float m = -1.0 / 0.0;
    float l = 0.0;
    for (uint key = lane; key < n_keys; key += gl_WorkGroupSize.x) {
        uint ti = seq * p.max_blocks_per_seq + key / p.block_tokens;
        uint block = texelFetch(tables_tex, int(p.tables_texel + ti / 4u))[ti & 3u];
        if (block >= p.n_blocks) {
            continue;  // a bad table entry: the key is skipped, never read
        }
        uint base = ((block * p.n_head_kv + kvh) * p.block_tokens + key % p.block_tokens) *
                    p.head_dim;
        vec4 s4 = vec4(0.0);
        [[unroll]] for (uint i = 0; i < D8; ++i) {
            if (i < groups) {
                vec4 lo, hi;
                kv_group(true, base, i, lo, hi);
                s4 += q_lo[i] * lo + q_hi[i] * hi;
            }
        }
        float s = (s4.x + s4.y) + (s4.z + s4.w);
        float m_new = max(m, s);
        float corr = exp(m - m_new);
        float pj = exp(s - m_new);
        l = l * corr + pj;
        [[unroll]] for (uint i = 0; i < D8; ++i) {
            if (i < groups) {
                vec4 lo, hi;
                kv_group(false, base, i, lo, hi);
                acc_lo[i] = acc_lo[i] * corr + pj * lo;
                acc_hi[i] = acc_hi[i] * corr + pj * hi;
            }
        }
        m = m_new;
    }
    // Merge the lanes' softmax states: rescale each to the common max, then sum.
    float m_all = subgroupMax(m);
    float sc = m > -1.0 / 0.0 ? exp(m - m_all) : 0.0;
    float l_all = subgroupAdd(l * sc);
    float inv = l_all > 0.0 ? 1.0 / l_all : 0.0;
    uint oo = p.out_offset + t * p.out_stride + h * p.head_dim;
    [[unroll]] for (uint i = 0; i < D8; ++i) {
        if (i < groups) {
            vec4 lo = subgroupAdd(acc_lo[i] * sc) * inv;
            vec4 hi = subgroupAdd(acc_hi[i] * sc) * inv;
            if (lane == i % gl_WorkGroupSize.x) {
                uint o = oo + 8u * i;
                dst[o] = lo.x; dst[o + 1u] = lo.y; dst[o + 2u] = lo.z; dst[o + 3u] = lo.w;
                dst[o + 4u] = hi.x; dst[o + 5u] = hi.y; dst[o + 6u] = hi.z; dst[o + 7u] = hi.w;
            }
        }
    }
}
