// attention_tx.comp: causal attention over the paged KV cache (decode and chunked prefill),
// the texel-fetch variant of attention.comp for devices whose subgroup is the whole workgroup.
// Call site: gpu/vk/kernels.cpp encode_attention() when the pipeline tuning prefers texel kernels.
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

// head_dim: specialization constant 2 (the encoder builds one pipeline per head_dim, up to the
// variant's HD_MAX), so a lane holds exactly the head row's 8-element groups and no guarded,
// masked-off work runs (llvmpipe executes a masked-off body anyway).
layout(constant_id = 2) const uint HD_SPEC = HD_MAX;
const uint D8 = HD_SPEC / 8u;  // 8-element groups of a head row held per lane

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

#ifndef TQ
#define TQ 1
#endif
// TQ query tokens per workgroup (the prefill variant attention_txg*: TQ = ORDO_ATTN_TX_GROUP).
// Where the group's tokens share a sequence (a prefill chunk) each lane fetches a key's K and V
// texels once for all of them; a query skips the keys past its own position. A group that
// mixes sequences (decode rows of a mixed step) runs its queries one at a time. Either way a
// query's lanes see the same keys in the same order and do the same operations as with
// TQ = 1, so its output is bit-identical whichever variant and group it ran in (batch
// invariance; tests/gpu/test_batch_invariance.cpp compares prefill whole, chunked and token
// by token).

void main() {
    uint lane = gl_LocalInvocationID.x;
    uint h = gl_WorkGroupID.x;
    uint t0 = gl_WorkGroupID.y * TQ;
    uint kvh = h / (p.n_head / p.n_head_kv);
    uint seqs[TQ];
    uint n_keys[TQ];
    [[unroll]] for (uint qi = 0; qi < TQ; ++qi) {
        uint t = min(t0 + qi, p.n_tokens - 1u);
        int seq_in = tokens[p.tokens_offset + 2u * t];
        int pos_in = tokens[p.tokens_offset + 2u * t + 1u];
        // A bad token (the host validates them too) attends to nothing: output 0. So do the
        // clamped copies past the last token (never stored).
        bool valid = t0 + qi < p.n_tokens && seq_in >= 0 && uint(seq_in) < p.n_seqs &&
                     pos_in >= 0 && uint(pos_in) < p.max_blocks_per_seq * p.block_tokens;
        seqs[qi] = valid ? uint(seq_in) : 0u;
        n_keys[qi] = valid ? uint(pos_in) + 1u : 0u;
    }
    // The sequence of the group's first valid token; tokens without keys do not count.
    uint ref_seq = 0u;
    bool found = false;
    [[unroll]] for (uint qi = 0; qi < TQ; ++qi) {
        if (!found && n_keys[qi] > 0u) ref_seq = seqs[qi];
        found = found || n_keys[qi] > 0u;
    }
    bool same_seq = true;
    [[unroll]] for (uint qi = 0; qi < TQ; ++qi) {
        same_seq = same_seq && (n_keys[qi] == 0u || seqs[qi] == ref_seq);
    }
    vec4 q_lo[TQ][D8], q_hi[TQ][D8], acc_lo[TQ][D8], acc_hi[TQ][D8];
    float m[TQ], l[TQ];
    [[unroll]] for (uint qi = 0; qi < TQ; ++qi) {
        uint qt = p.q_texel + min(t0 + qi, p.n_tokens - 1u) * p.q_stride4 + h * (p.head_dim / 4u);
        [[unroll]] for (uint i = 0; i < D8; ++i) {
            q_lo[qi][i] = uintBitsToFloat(texelFetch(q_tex, int(qt + 2u * i))) * p.scale;
            q_hi[qi][i] = uintBitsToFloat(texelFetch(q_tex, int(qt + 2u * i + 1u))) * p.scale;
            acc_lo[qi][i] = vec4(0.0);
            acc_hi[qi][i] = vec4(0.0);
        }
        m[qi] = -1.0 / 0.0;
        l[qi] = 0.0;
    }
    // Passes: one over the shared sequence, or one per query when the group mixes sequences.
    uint passes = same_seq ? 1u : TQ;
    for (uint pass = 0; pass < passes; ++pass) {
        uint seq = ref_seq;
        uint keys_max = 0u;
        [[unroll]] for (uint qi = 0; qi < TQ; ++qi) {
            bool mine = same_seq || qi == pass;
            if (!same_seq && qi == pass) seq = seqs[qi];
            keys_max = mine ? max(keys_max, n_keys[qi]) : keys_max;
        }
        for (uint key = lane; key < keys_max; key += gl_WorkGroupSize.x) {
            uint ti = seq * p.max_blocks_per_seq + key / p.block_tokens;
            uint block = texelFetch(tables_tex, int(p.tables_texel + ti / 4u))[ti & 3u];
            if (block >= p.n_blocks) {
                continue;  // a bad table entry: the key is skipped, never read
            }
            uint base = ((block * p.n_head_kv + kvh) * p.block_tokens + key % p.block_tokens) *
                        p.head_dim;
            vec4 k_lo[D8], k_hi[D8], v_lo[D8], v_hi[D8];
            [[unroll]] for (uint i = 0; i < D8; ++i) {
                kv_group(true, base, i, k_lo[i], k_hi[i]);
                kv_group(false, base, i, v_lo[i], v_hi[i]);
            }
            [[unroll]] for (uint qi = 0; qi < TQ; ++qi) {
                if ((same_seq || qi == pass) && key < n_keys[qi]) {
                    vec4 s4 = vec4(0.0);
                    [[unroll]] for (uint i = 0; i < D8; ++i) {
                        s4 += q_lo[qi][i] * k_lo[i] + q_hi[qi][i] * k_hi[i];
                    }
                    float s = (s4.x + s4.y) + (s4.z + s4.w);
                    float m_new = max(m[qi], s);
                    float corr = exp(m[qi] - m_new);
                    float pj = exp(s - m_new);
                    l[qi] = l[qi] * corr + pj;
                    [[unroll]] for (uint i = 0; i < D8; ++i) {
                        acc_lo[qi][i] = acc_lo[qi][i] * corr + pj * v_lo[i];
                        acc_hi[qi][i] = acc_hi[qi][i] * corr + pj * v_hi[i];
                    }
                    m[qi] = m_new;
                }
            }
        }
    }
    // Merge the lanes' softmax states: rescale each to the common max, then sum.
    [[unroll]] for (uint qi = 0; qi < TQ; ++qi) {
        float m_all = subgroupMax(m[qi]);
        float sc = m[qi] > -1.0 / 0.0 ? exp(m[qi] - m_all) : 0.0;
        float l_all = subgroupAdd(l[qi] * sc);
        float inv = l_all > 0.0 ? 1.0 / l_all : 0.0;
        uint oo = p.out_offset + (t0 + qi) * p.out_stride + h * p.head_dim;
        [[unroll]] for (uint i = 0; i < D8; ++i) {
            vec4 lo = subgroupAdd(acc_lo[qi][i] * sc) * inv;
            vec4 hi = subgroupAdd(acc_hi[qi][i] * sc) * inv;
            if (lane == i % gl_WorkGroupSize.x && t0 + qi < p.n_tokens) {
                uint o = oo + 8u * i;
                dst[o] = lo.x; dst[o + 1u] = lo.y; dst[o + 2u] = lo.z; dst[o + 3u] = lo.w;
                dst[o + 4u] = hi.x; dst[o + 5u] = hi.y; dst[o + 6u] = hi.z; dst[o + 7u] = hi.w;
            }
        }
    }
}
