// attention_flash.comp: causal attention, a tile of p.tile_rows (at most ORDO_ATTN_FLASH_ROWS)
// query rows per workgroup. Call site: gpu/vk/kernels.cpp encode_attention() (the storage
// family's path for runs of several tokens of one sequence, prefill chunks, with full tiles;
// and, where pipeline_tuning::attention_token_tiles asks, for many decode tokens under
// grouped-query attention, a tile per token holding its G heads). Rows are the (token, query head) pairs of one KV head, token-major: row i of KV head
// g's grid is token i / G, head g * G + i % G (G = n_head / n_head_kv), so grouped-query heads
// share their keys' loads too.
//
// Each key tile (WG keys) is loaded once for every row: lane j scores key j against all rows
// (queries in shared memory), the rows' weights are computed once (not once per lane), and lane
// d accumulates head dim d of every row from one load of V. A row's arithmetic is
// attention.comp's, operation for operation (attention_order.glsl, attention_split.glsl: the
// same tiles of WG keys from each split's first key, the same splits, the same merges), so a
// query's output has the same bits as with attention.comp (batch invariance: a decode step runs
// that kernel, a prefill this one).
//
// Rows of different sequences (a tile across two prefill chunks, or decode tokens) take passes:
// each pass walks one sequence's keys for its rows only. The host sends runs of one sequence
// here and scattered tokens to attention.comp, so a tile mixes sequences only at a run's edge.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "abi.h"
layout(constant_id = 0) const uint WG = 32;
layout(local_size_x_id = 0) in;
// head_dim (pipelines::for_k): the loops over it and the accumulators are sized at build.
layout(constant_id = 2) const uint HD = 64;
layout(push_constant) uniform push_block { attention_push p; };
layout(std430, binding = ORDO_B_ATTN_Q) readonly buffer q_buf { float q[]; };
layout(std430, binding = ORDO_B_ATTN_TOKENS) readonly buffer tokens_buf { int tokens[]; };
layout(std430, binding = ORDO_B_ATTN_TABLES) readonly buffer tables_buf { int tables[]; };
layout(std430, binding = ORDO_B_ATTN_OUT) writeonly buffer out_buf { float dst[]; };
#include "attention_split.glsl"
#include "attention_order.glsl"
#define KV_BINDING_K ORDO_B_ATTN_K
#define KV_BINDING_V ORDO_B_ATTN_V
#include "kv_pool.glsl"

const uint R = ORDO_ATTN_FLASH_ROWS;
const uint R4 = R / 4u;
const uint HD2 = HD / 2u;
const uint ACC = (HD + WG - 1u) / WG;  // head dims per lane: lane, lane + WG, ...
const float NEG_INF = -1.0 / 0.0;

shared vec2 qs[R * HD2];  // row r's scaled query, in pairs, at r * HD2
shared vec4 sc[WG * R4];  // key j's scores, then weights, of rows 4i..4i+3 at j * R4 + i
shared uint kb[WG];       // key j's element in the pool (0 for a skipped key)

void main() {
    uint lane = gl_LocalInvocationID.x;
    uint kvh = gl_WorkGroupID.x;
    uint group = p.n_head / p.n_head_kv;
    uint rows_total = p.n_tokens * group;
    uint tile_rows = min(p.tile_rows, R);
    uint row0 = gl_WorkGroupID.y * tile_rows;
    // Each row's sequence and key count; a bad token (the host validates them too) or a row
    // past the last attends to nothing (output 0, or not stored).
    uint seq_of[R];
    uint nk[R];
    uint pending = 0u;
    [[unroll]] for (uint r = 0; r < R; ++r) {
        uint i = row0 + r;
        uint t = min(i, rows_total - 1u) / group;
        int seq_in = tokens[p.tokens_offset + 2u * t];
        int pos_in = tokens[p.tokens_offset + 2u * t + 1u];
        bool valid = r < tile_rows && i < rows_total && seq_in >= 0 &&
                     uint(seq_in) < p.n_seqs && pos_in >= 0 &&
                     uint(pos_in) < p.max_blocks_per_seq * p.block_tokens;
        seq_of[r] = valid ? uint(seq_in) : 0u;
        nk[r] = valid ? uint(pos_in) + 1u : 0u;
        pending |= nk[r] > 0u ? 1u << r : 0u;
    }
    for (uint e = lane; e < R * HD2; e += WG) {
        uint i = row0 + e / HD2;
        vec2 qv = vec2(0.0);
        if (e / HD2 < tile_rows && i < rows_total) {
            uint h = kvh * group + i % group;
            uint qo = p.q_offset + (i / group) * p.q_stride + h * p.head_dim + 2u * (e % HD2);
            qv = vec2(attn_scale(q[qo], p.scale), attn_scale(q[qo + 1u], p.scale));
        }
        qs[e] = qv;
    }
    barrier();

    split_state st[R];
    float out_acc[R][ACC];
    float m[R], l[R], acc[R][ACC];
    [[unroll]] for (uint r = 0; r < R; ++r) {
        st[r] = split_state(NEG_INF, 0.0);
        [[unroll]] for (uint a = 0; a < ACC; ++a) {
            out_acc[r][a] = 0.0;
        }
    }
    while (pending != 0u) {  // uniform: one pass per sequence among the rows
        uint seq = 0u;
        bool found = false;
        [[unroll]] for (uint r = 0; r < R; ++r) {
            if (!found && ((pending >> r) & 1u) != 0u) seq = seq_of[r];
            found = found || ((pending >> r) & 1u) != 0u;
        }
        uint mine = 0u;
        uint keys = 0u;
        [[unroll]] for (uint r = 0; r < R; ++r) {
            if (((pending >> r) & 1u) != 0u && seq_of[r] == seq) {
                mine |= 1u << r;
                keys = max(keys, nk[r]);
            }
        }
        pending &= ~mine;
        uint n_splits = (keys + p.split_keys - 1u) / p.split_keys;
        for (uint c = 0; c < n_splits; ++c) {
            [[unroll]] for (uint r = 0; r < R; ++r) {
                m[r] = NEG_INF;
                l[r] = 0.0;
                [[unroll]] for (uint a = 0; a < ACC; ++a) {
                    acc[r][a] = 0.0;
                }
            }
            uint s0 = c * p.split_keys;
            uint s_end = min(keys, s0 + p.split_keys);
            for (uint k0 = s0; k0 < s_end; k0 += WG) {
                // Row r's keys in this tile: nt[r] (0 past its own split end or position).
                uint nt[R];
                [[unroll]] for (uint r = 0; r < R; ++r) {
                    uint e = ((mine >> r) & 1u) != 0u ? min(nk[r], s0 + p.split_keys) : 0u;
                    nt[r] = e > k0 ? min(WG, e - k0) : 0u;
                }
                uint nt_max = min(WG, s_end - k0);
                uint key = k0 + lane;
                float s[R];
                [[unroll]] for (uint r = 0; r < R; ++r) {
                    s[r] = NEG_INF;
                }
                uint base = 0u;
                if (key < s_end) {
                    uint block = uint(tables[seq * p.max_blocks_per_seq + key / p.block_tokens]);
                    if (block < p.n_blocks) {
                        base = ((block * p.n_head_kv + kvh) * p.block_tokens +
                                key % p.block_tokens) *
                               p.head_dim;
                        [[unroll]] for (uint r = 0; r < R; ++r) {
                            s[r] = 0.0;
                        }
                        for (uint d2 = 0; d2 < HD2; ++d2) {
                            vec2 kv = k_pair(base + 2u * d2);
                            [[unroll]] for (uint r = 0; r < R; ++r) {
                                if (((mine >> r) & 1u) != 0u) {  // uniform: this pass's rows
                                    s[r] = attn_score_step(s[r], qs[r * HD2 + d2], kv);
                                }
                            }
                        }
                    }
                }
                [[unroll]] for (uint i = 0; i < R4; ++i) {
                    sc[lane * R4 + i] = vec4(s[4u * i], s[4u * i + 1u], s[4u * i + 2u],
                                             s[4u * i + 3u]);
                }
                kb[lane] = base;
                barrier();
                // Every lane: each row's new maximum over its keys of the tile, in key order.
                float mn[R];
                [[unroll]] for (uint r = 0; r < R; ++r) {
                    mn[r] = m[r];
                }
                for (uint j = 0; j < nt_max; ++j) {
                    [[unroll]] for (uint i = 0; i < R4; ++i) {
                        vec4 v = sc[j * R4 + i];
                        [[unroll]] for (uint c4 = 0; c4 < 4u; ++c4) {
                            uint r = 4u * i + c4;
                            if (j < nt[r]) mn[r] = max(mn[r], v[c4]);
                        }
                    }
                }
                [[unroll]] for (uint r = 0; r < R; ++r) {
                    if (nt[r] > 0u && mn[r] > NEG_INF) {
                        float corr = attn_exp(m[r], mn[r]);
                        l[r] = attn_scale(l[r], corr);
                        [[unroll]] for (uint a = 0; a < ACC; ++a) {
                            acc[r][a] = attn_scale(acc[r][a], corr);
                        }
                    }
                }
                barrier();  // every lane has read the scores
                // Lane j turns key j's scores into the rows' weights, once for the workgroup.
                if (lane < nt_max) {
                    [[unroll]] for (uint i = 0; i < R4; ++i) {
                        vec4 v = sc[lane * R4 + i];
                        vec4 w = vec4(0.0);
                        [[unroll]] for (uint c4 = 0; c4 < 4u; ++c4) {
                            uint r = 4u * i + c4;
                            if (lane < nt[r] && mn[r] > NEG_INF) w[c4] = attn_exp(v[c4], mn[r]);
                        }
                        sc[lane * R4 + i] = w;
                    }
                }
                barrier();
                // Lane d: head dims d, d + WG, ... of every row, one V load per key for all.
                for (uint j = 0; j < nt_max; ++j) {
                    uint vb = kb[j];
                    float vv[ACC];
                    [[unroll]] for (uint a = 0; a < ACC; ++a) {
                        uint d = lane + a * WG;
                        vv[a] = d < HD ? v_at(vb + d) : 0.0;
                    }
                    [[unroll]] for (uint i = 0; i < R4; ++i) {
                        vec4 w = sc[j * R4 + i];
                        [[unroll]] for (uint c4 = 0; c4 < 4u; ++c4) {
                            uint r = 4u * i + c4;
                            if (j < nt[r] && mn[r] > NEG_INF) {
                                l[r] = attn_sum(l[r], w[c4]);
                                [[unroll]] for (uint a = 0; a < ACC; ++a) {
                                    acc[r][a] = attn_acc(acc[r][a], w[c4], vv[a]);
                                }
                            }
                        }
                    }
                }
                [[unroll]] for (uint r = 0; r < R; ++r) {
                    if (nt[r] > 0u && mn[r] > NEG_INF) m[r] = mn[r];
                }
                barrier();  // before the next tile rewrites the scores and key bases
            }
            // The split's state into each of its rows (those with keys in it), in split order.
            [[unroll]] for (uint r = 0; r < R; ++r) {
                if (((mine >> r) & 1u) != 0u && s0 < nk[r]) {
                    vec2 f = split_merge(st[r], m[r], l[r]);
                    [[unroll]] for (uint a = 0; a < ACC; ++a) {
                        out_acc[r][a] = split_apply(out_acc[r][a], acc[r][a], f);
                    }
                }
            }
        }
    }
    [[unroll]] for (uint r = 0; r < R; ++r) {
        uint i = row0 + r;
        if (r < tile_rows && i < rows_total) {
            uint h = kvh * group + i % group;
            uint oo = p.out_offset + (i / group) * p.out_stride + h * p.head_dim;
            [[unroll]] for (uint a = 0; a < ACC; ++a) {
                uint d = lane + a * WG;
                if (d < HD) dst[oo + d] = st[r].l > 0.0 ? out_acc[r][a] / st[r].l : 0.0;
            }
        }
    }
}
