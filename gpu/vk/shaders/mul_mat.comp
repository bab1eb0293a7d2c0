// mul_mat.comp: prefill mat-mat for every weight type. Call site: gpu/vk/kernels.cpp
// encode_mul_mat() when the token count is large. A workgroup of 128 lanes computes a tile of
// 128 / TG * RL weight rows x TG * TL tokens (TG = 8: 64 x 32 by default; TG = 4, the narrow
// tile, 128 x 16 for steps a 16-token tile pads less, e.g. 16 decoding sequences); each K step
// stages one TK-element slice (32 or 64) of the weight tile (dequantized once, shared by all tokens) and of the activation
// tile in shared memory, and each lane accumulates an RL x TL block of outputs from it, four k
// at a time in mat_order.glsl's grouped order (so its outputs equal every other mat-mul
// kernel's bit for bit). The group split (p.split, for grids too small to fill a GPU: batched
// decode): workgroup z runs group z alone and stores its sums; mul_mat_fold.comp folds the 8 in
// order, the same operations as the loop below, so the same bits.
//
// Where the values go changes no bit, only the speed (pipeline_tuning's mat_tiled_* knobs):
// * SWZ: the shared tiles are [k][4 rows] vec4 rows, and the 32 lanes of a subgroup stage 4
//   rows (or tokens) x 8 parts, i.e. 8 values of one bank each; row k's vec4 index is XORed
//   with (k / 4) % 8, so those 8 land in 8 distinct banks (a GPU's shared memory serves one
//   address per bank per cycle: without it every staging store is an 8-way conflict). The
//   compute loop's reads at one k are permuted within aligned groups of 8 vec4, as contiguous
//   as before.
// * TK: 64 halves the K steps (and barriers) for twice the shared memory.
// * ROW_STAGE: how the lanes share a K step's staging (stage_by_parts, stage_by_rows): by rows
//   a unit is dequantized once or twice instead of by 8 lanes, and stores never conflict.
// * TOK_FIRST: consecutive workgroups take the token tiles of one row tile (the grid's x and y
//   read as one index, tokens fastest), so a prompt's token tiles reuse that weight tile from
//   the GPU's L2 cache instead of each pass over the token tiles streaming all weights again.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "abi.h"
// 128 lanes: 128 / TG row groups x TG token groups; lane (tr, tc) owns rows tr * RL .. + RL - 1
// and tokens tc * TL .. + TL - 1 of the tile (RL, TL: multiples of 4, pipeline_tuning's
// mat_tiled_rows_per_lane and mat_tiled_tokens_per_lane; TG 8 or 4, constant 11).
layout(local_size_x = 128) in;
layout(constant_id = 5) const uint RL = 4;
layout(constant_id = 6) const uint TL = 4;
layout(constant_id = 7) const uint SWZ = 1;
layout(constant_id = 8) const uint TK = 32;  // 32 or 64
layout(constant_id = 9) const uint TOK_FIRST = 1;
layout(constant_id = 10) const uint ROW_STAGE = 0;
layout(constant_id = 11) const uint TG = 8;  // token groups: 8 or 4
layout(push_constant) uniform push_block { mul_mat_push p; };
#include "weights.glsl"
#include "mat_order.glsl"
layout(std430, binding = ORDO_B_MM_X) readonly buffer x_buf { vec4 x4[]; };
layout(std430, binding = ORDO_B_MM_Y) buffer y_buf { float y[]; };

const uint TM = 128u / TG * RL;
const uint TN = TG * TL;
const uint RL4 = RL / 4u;
const uint TL4 = TL / 4u;
const uint QN = TK / 4u;  // 4-element parts per row (or token) of one K step
shared vec4 ws[TK * TM / 4u];  // [kk][row / 4], swizzled: ws_at
shared vec4 xs[TK * TN / 4u];  // [kk][token / 4], swizzled: xs_at

// The vec4 holding rows (tokens) 4v .. 4v + 3 at k of the step, of n4 vec4s at each k (a power
// of two: the XOR stays inside the row; a narrow tile's 4 token vec4s take 4 of the 8 patterns).
uint swizzled(uint k, uint v, uint n4) {
    return SWZ != 0u ? v ^ ((k >> 2u) & (min(n4, 8u) - 1u)) : v;
}
uint ws_at(uint k, uint v) { return k * (TM / 4u) + swizzled(k, v, TM / 4u); }
uint xs_at(uint k, uint v) { return k * (TN / 4u) + swizzled(k, v, TN / 4u); }

const uint G = ORDO_MAT_GROUPS;
const uint SLOTS = TK / UNIT;  // units of one group per K step
const uint UNIT4 = UNIT / 4u;

// Part q of the step (4 elements at k 4q .. 4q + 3) of weight row r / token t into its tile.
void put_w(uint q, uint r, vec4 v) {
    for (uint e = 0; e < 4u; ++e) {
        ws[ws_at(q * 4u + e, r / 4u)][r % 4u] = v[e];
    }
}
void put_x(uint q, uint t, vec4 v) {
    for (uint e = 0; e < 4u; ++e) {
        xs[xs_at(q * 4u + e, t / 4u)][t % 4u] = v[e];
    }
}
// Part j of unit u of token `tok`'s activations.
vec4 x_part(uint tok, uint u, uint j) {
    return x4[(p.x_offset + tok * p.x_stride) / 4u + u * UNIT4 + j];
}

// Stage one K step: weights (dequantized) and activations, element (kk, row or token); 0 past
// the rows, the tokens or the group's last unit. By parts (the layout before session 27): a
// subgroup's 32 lanes take 4 rows x 8 parts, each lane dequantizing its unit for one part.
void stage_by_parts(uint g, uint i0, uint ng, uint units, uint row0, uint tok0) {
    uint lane = gl_LocalInvocationID.x;
    // Weights: TM rows x QN parts of 4 elements.
    for (uint s = lane; s < TM * QN; s += 128u) {
        uint r = (s / 8u) % TM;
        // part of the step: slot q / PARTS, part q % PARTS of its unit
        uint q = s % 8u + 8u * (s / (8u * TM));
        vec4 v = vec4(0.0);
        if (row0 + r < p.n_rows && i0 + q / PARTS < ng) {
            uint u = g + G * (i0 + q / PARTS);
            v = part(load_raw((row0 + r) * units + u), q % PARTS);
        }
        put_w(q, r, v);
    }
    // Activations: TN tokens x QN parts.
    for (uint s = lane; s < TN * QN; s += 128u) {
        uint t = (s / 8u) % TN;
        uint q = s % 8u + 8u * (s / (8u * TN));
        vec4 v = vec4(0.0);
        if (tok0 + t < p.n_cols && i0 + q / PARTS < ng) {
            v = x_part(tok0 + t, g + G * (i0 + q / PARTS), q % PARTS);
        }
        put_x(q, t, v);
    }
}

// By rows: a lane takes 4 consecutive parts of one row (or token) and a subgroup 32 rows at the
// same parts, so each store of the subgroup fills 32 consecutive floats (no bank conflict, with
// or without SWZ) and a unit is dequantized by one or two lanes instead of 8.
void stage_by_rows(uint g, uint i0, uint ng, uint units, uint row0, uint tok0) {
    uint lane = gl_LocalInvocationID.x;
    for (uint s = lane; s < TM * (QN / 4u); s += 128u) {
        uint r = s % TM;
        uint c = s / TM;  // parts 4c .. 4c + 3 of the step
        bool row_in = row0 + r < p.n_rows;
        unit_raw w;
        uint have = ~0u;  // the slot w holds
        for (uint j = 0; j < 4u; ++j) {
            uint q = 4u * c + j;
            uint slot = q / PARTS;
            vec4 v = vec4(0.0);
            if (row_in && i0 + slot < ng) {
                if (slot != have) {
                    w = load_raw((row0 + r) * units + g + G * (i0 + slot));
                    have = slot;
                }
                v = part(w, q % PARTS);
            }
            put_w(q, r, v);
        }
    }
    for (uint s = lane; s < TN * (QN / 4u); s += 128u) {
        uint t = s % TN;
        uint c = s / TN;
        bool tok_in = tok0 + t < p.n_cols;
        for (uint j = 0; j < 4u; ++j) {
            uint q = 4u * c + j;
            uint slot = q / PARTS;
            vec4 v = vec4(0.0);
            if (tok_in && i0 + slot < ng) {
                v = x_part(tok0 + t, g + G * (i0 + slot), q % PARTS);
            }
            put_x(q, t, v);
        }
    }
}

void main() {
    uint lane = gl_LocalInvocationID.x;
    uint wx = gl_WorkGroupID.x, wy = gl_WorkGroupID.y;
    if (TOK_FIRST != 0u) {
        uint linear = wx + wy * gl_NumWorkGroups.x;
        wx = linear / gl_NumWorkGroups.y;
        wy = linear % gl_NumWorkGroups.y;
    }
    uint row0 = wx * TM;
    uint tok0 = wy * TN;
    uint tr = lane / TG;  // rows tr * RL ..
    uint tc = lane % TG;  // tokens tc * TL ..
    uint units = p.k / UNIT;
    float total[RL * TL];
    uint g0 = p.split != 0u ? gl_WorkGroupID.z : 0u;
    uint g1 = p.split != 0u ? g0 + 1u : G;
    for (uint g = g0; g < g1; ++g) {
        uint ng = units > g ? (units - g + G - 1u) / G : 0u;  // units of group g
        float acc[RL * TL];
        for (uint i = 0; i < RL * TL; ++i) {
            acc[i] = 0.0;
        }
        for (uint i0 = 0; i0 < ng; i0 += SLOTS) {
            if (ROW_STAGE != 0u) {
                stage_by_rows(g, i0, ng, units, row0, tok0);
            } else {
                stage_by_parts(g, i0, ng, units, row0, tok0);
            }
            barrier();
            for (uint kk = 0; kk < TK; kk += 4u) {
                if (i0 + (kk / 4u) / PARTS >= ng) {
                    break;  // past the group's last unit (uniform): never summed
                }
                // a[e * RL4 + v]: rows tr * RL + 4 v .. at k kk + e; b likewise for tokens.
                vec4 a[4u * RL4], b[4u * TL4];
                for (uint e = 0; e < 4u; ++e) {
                    for (uint v = 0; v < RL4; ++v) {
                        a[e * RL4 + v] = ws[ws_at(kk + e, tr * RL4 + v)];
                    }
                    for (uint v = 0; v < TL4; ++v) {
                        b[e * TL4 + v] = xs[xs_at(kk + e, tc * TL4 + v)];
                    }
                }
                for (uint i = 0; i < RL; ++i) {
                    uint ai = i / 4u;
                    uint ac = i % 4u;
                    vec4 w = vec4(a[ai][ac], a[RL4 + ai][ac], a[2u * RL4 + ai][ac],
                                  a[3u * RL4 + ai][ac]);
                    for (uint j = 0; j < TL; ++j) {
                        uint bj = j / 4u;
                        uint bc = j % 4u;
                        vec4 xv = vec4(b[bj][bc], b[TL4 + bj][bc], b[2u * TL4 + bj][bc],
                                       b[3u * TL4 + bj][bc]);
                        acc[i * TL + j] = mat_acc(acc[i * TL + j], w, xv);
                    }
                }
            }
            barrier();
        }
        for (uint i = 0; i < RL * TL; ++i) {
            total[i] = g == g0 ? acc[i] : mat_fold(total[i], acc[i]);
        }
    }
    for (uint i = 0; i < RL; ++i) {
        uint r = row0 + tr * RL + i;
        if (r >= p.n_rows) {
            continue;
        }
        for (uint j = 0; j < TL; ++j) {
            uint t = tok0 + tc * TL + j;
            if (t < p.n_cols && p.split != 0u) {
                y[p.y_offset + (g0 * p.n_cols + t) * p.y_stride + r] = total[i * TL + j];
            } else if (t < p.n_cols) {
                uint o = p.y_offset + t * p.y_stride + p.row_begin + r;
                y[o] = p.accumulate != 0u ? y[o] + total[i * TL + j] : total[i * TL + j];
            }
        }
    }
}
