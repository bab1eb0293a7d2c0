// attention.comp: causal attention over the paged KV cache, decode and prefill alike. Call
// site: gpu/vk/kernels.cpp encode_attention(). One workgroup per (head, query token); the token
// attends to positions 0..pos of its sequence, found through the sequence's block table, so a
// batch of sequences of different lengths (decode) and a chunk of new tokens over a history
// (chunked prefill) are the same dispatch. Keys are scored WG at a time (one per lane) with an
// online softmax; each lane accumulates head dims lane, lane + WG, ... of the output.
//
// Long contexts are cut into splits of p.split_keys keys (attention_split.glsl). With
// p.split_grid = 0 the workgroup walks a token's splits in turn and merges them itself; with 1
// (flash decoding: few tokens over long contexts, which would leave most of a GPU idle) the grid
// has one workgroup per (head, token, split), each writes its split's (m, l, acc) to the
// partials binding, and attention_merge.comp merges them in the same order: the same bits.
// The split's arithmetic is attention_order.glsl's, shared with attention_flash.comp (prefill:
// a tile of queries per workgroup), so that kernel gives the same bits too.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "abi.h"
layout(constant_id = 0) const uint WG = 32;
layout(local_size_x_id = 0) in;
layout(push_constant) uniform push_block { attention_push p; };
layout(std430, binding = ORDO_B_ATTN_Q) readonly buffer q_buf { float q[]; };
layout(std430, binding = ORDO_B_ATTN_TOKENS) readonly buffer tokens_buf { int tokens[]; };
layout(std430, binding = ORDO_B_ATTN_TABLES) readonly buffer tables_buf { int tables[]; };
layout(std430, binding = ORDO_B_ATTN_OUT) writeonly buffer out_buf { float dst[]; };
// The split grid's partials: per (token, head, split) head_dim accumulators, then m and l.
layout(std430, binding = ORDO_B_ATTN_PARTIALS) writeonly buffer partials_buf { float part[]; };
#include "attention_split.glsl"
#include "attention_order.glsl"
#define KV_BINDING_K ORDO_B_ATTN_K
#define KV_BINDING_V ORDO_B_ATTN_V
#include "kv_pool.glsl"

// The scheduling of a lane's loads, never the sums' order (the same bits at any value): K pairs
// of its key loaded before their score steps (constant 15), keys whose V values it loads before
// their adds (constant 16). A decode token's few keys are a chain of dependent loads otherwise:
// pipeline_tuning::attention_k_pairs and attention_v_group.
layout(constant_id = 15) const uint KP = 4;
layout(constant_id = 16) const uint VG = 8;

shared float qs[ORDO_ATTN_HEAD_DIM_MAX];
shared float scores[WG];
shared uint key_base[WG];

void main() {
    uint lane = gl_LocalInvocationID.x;
    uint h = gl_WorkGroupID.x;
    uint t = gl_WorkGroupID.y;
    int seq_in = tokens[p.tokens_offset + 2u * t];
    int pos_in = tokens[p.tokens_offset + 2u * t + 1u];
    // The host validates tokens and tables; bad values still never read outside a binding:
    // such a token attends to nothing (output 0).
    bool valid = seq_in >= 0 && uint(seq_in) < p.n_seqs && pos_in >= 0 &&
                 uint(pos_in) < p.max_blocks_per_seq * p.block_tokens;
    uint seq = valid ? uint(seq_in) : 0u;
    uint n_keys = valid ? uint(pos_in) + 1u : 0u;
    uint kvh = h / (p.n_head / p.n_head_kv);
    uint qo = p.q_offset + t * p.q_stride + h * p.head_dim;
    for (uint d = lane; d < p.head_dim; d += WG) {
        qs[d] = attn_scale(q[qo + d], p.scale);
    }
    barrier();
    // Splits: all of the token's in turn, or (the split grid) split z alone.
    uint n_splits = (n_keys + p.split_keys - 1u) / p.split_keys;
    uint c0 = p.split_grid != 0u ? gl_WorkGroupID.z : 0u;
    uint c1 = p.split_grid != 0u ? min(c0 + 1u, n_splits) : n_splits;
    split_state st = split_state(-1.0 / 0.0, 0.0);
    float out_acc[ORDO_ATTN_ACC];
    for (uint a = 0; a < ORDO_ATTN_ACC; ++a) {
        out_acc[a] = 0.0;
    }
    // One split's online-softmax state; a grid workgroup past the token's keys keeps it
    // empty (m = -inf: the merge skips it).
    float m = -1.0 / 0.0;
    float l = 0.0;
    float acc[ORDO_ATTN_ACC];
    for (uint a = 0; a < ORDO_ATTN_ACC; ++a) {
        acc[a] = 0.0;
    }
    for (uint c = c0; c < c1; ++c) {  // uniform: barriers inside
        m = -1.0 / 0.0;
        l = 0.0;
        for (uint a = 0; a < ORDO_ATTN_ACC; ++a) {
            acc[a] = 0.0;
        }
        uint split_end = min(n_keys, (c + 1u) * p.split_keys);
        for (uint k0 = c * p.split_keys; k0 < split_end; k0 += WG) {
            uint key = k0 + lane;
            float s = -1.0 / 0.0;
            uint base = 0;
            if (key < split_end) {
                uint block = uint(tables[seq * p.max_blocks_per_seq + key / p.block_tokens]);
                if (block < p.n_blocks) {
                    base = ((block * p.n_head_kv + kvh) * p.block_tokens + key % p.block_tokens)
                           * p.head_dim;
                    s = 0.0;
                    // KP pairs' loads issued before their steps (in flight together; the steps
                    // keep their order). Constant trip counts: the pairs stay in registers.
                    for (uint d = 0u; d < p.head_dim; d += 2u * KP) {
                        // Past head_dim a pair is never used; its load stays in the row (a
                        // select may evaluate both sides).
                        vec2 kk[KP];
                        [[unroll]] for (uint u = 0u; u < KP; ++u) {
                            kk[u] = k_pair(base + min(d + 2u * u, p.head_dim - 2u));
                        }
                        [[unroll]] for (uint u = 0u; u < KP; ++u) {
                            const uint e = d + 2u * u;
                            if (e < p.head_dim) {
                                s = attn_score_step(s, vec2(qs[e], qs[e + 1u]), kk[u]);
                            }
                        }
                    }
                }
            }
            scores[lane] = s;
            key_base[lane] = base;
            barrier();
            uint n_tile = min(WG, split_end - k0);
            float m_new = m;
            for (uint j = 0; j < n_tile; ++j) {
                m_new = max(m_new, scores[j]);
            }
            if (m_new > -1.0 / 0.0) {
                float corr = attn_exp(m, m_new);
                l = attn_scale(l, corr);
                for (uint a = 0; a < ORDO_ATTN_ACC; ++a) {
                    acc[a] = attn_scale(acc[a], corr);
                }
                // Keys VG at a time: their weights, then each accumulator's V loads issued
                // together before its adds. Each sum still takes its keys in order.
                for (uint j0 = 0; j0 < n_tile; j0 += VG) {
                    const uint nj = min(VG, n_tile - j0);
                    // Past the tile's keys an index repeats its last key (never used).
                    float pj[VG];
                    [[unroll]] for (uint u = 0; u < VG; ++u) {
                        pj[u] = u < nj ? attn_exp(scores[j0 + min(u, nj - 1u)], m_new) : 0.0;
                    }
                    // Constant trip counts (unrolled, the arrays stay in registers).
                    [[unroll]] for (uint u = 0; u < VG; ++u) {
                        if (u < nj) l = attn_sum(l, pj[u]);
                    }
                    for (uint a = 0; a < ORDO_ATTN_ACC; ++a) {
                        uint d = lane + a * WG;
                        if (d < p.head_dim) {
                            float vv[VG];
                            [[unroll]] for (uint u = 0; u < VG; ++u) {
                                vv[u] = v_at(key_base[j0 + min(u, nj - 1u)] + d);
                            }
                            [[unroll]] for (uint u = 0; u < VG; ++u) {
                                if (u < nj) acc[a] = attn_acc(acc[a], pj[u], vv[u]);
                            }
                        }
                    }
                }
                m = m_new;
            }
            barrier();
        }
        vec2 f = split_merge(st, m, l);
        for (uint a = 0; a < ORDO_ATTN_ACC; ++a) {
            out_acc[a] = split_apply(out_acc[a], acc[a], f);
        }
    }
    if (p.split_grid != 0u) {
        // This split's state, raw.
        uint po = ((t * p.n_head + h) * p.max_splits + c0) * (p.head_dim + 2u);
        for (uint a = 0; a < ORDO_ATTN_ACC; ++a) {
            uint d = lane + a * WG;
            if (d < p.head_dim) {
                part[po + d] = acc[a];
            }
        }
        if (lane == 0u) {
            part[po + p.head_dim] = m;
            part[po + p.head_dim + 1u] = l;
        }
        return;
    }
    uint oo = p.out_offset + t * p.out_stride + h * p.head_dim;
    for (uint a = 0; a < ORDO_ATTN_ACC; ++a) {
        uint d = lane + a * WG;
        if (d < p.head_dim) {
            dst[oo + d] = st.l > 0.0 ? out_acc[a] / st.l : 0.0;
        }
    }
}
