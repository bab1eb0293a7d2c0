// mul_mat.comp: prefill mat-mat for every weight type. Call site: gpu/vk/kernels.cpp
// encode_mul_mat() when the token count is large. A workgroup of 128 lanes computes a tile of
// 16 RL weight rows x 8 TL tokens (64 x 32 by default); each K step stages one 32-element slice
// of the weight tile (dequantized once, shared by all tokens) and of the activation tile in
// shared memory, and each lane accumulates an RL x TL block of outputs from it, four k at a time in
// mat_order.glsl's grouped order (so its outputs equal every other mat-mul kernel's bit for
// bit). The group split (p.split, for grids too small to fill a GPU: batched decode): workgroup
// z runs group z alone and stores its sums; mul_mat_fold.comp folds the 8 in order, the same
// operations as the loop below, so the same bits.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "abi.h"
// 128 lanes: 16 row groups x 8 token groups; lane (tr, tc) owns rows tr * RL .. + RL - 1 and
// tokens tc * TL .. + TL - 1 of the tile (RL, TL: multiples of 4, pipeline_tuning's
// mat_tiled_rows_per_lane and mat_tiled_tokens_per_lane), so the tile is 16 RL x 8 TL.
layout(local_size_x = 128) in;
layout(constant_id = 5) const uint RL = 4;
layout(constant_id = 6) const uint TL = 4;
layout(push_constant) uniform push_block { mul_mat_push p; };
#include "weights.glsl"
#include "mat_order.glsl"
layout(std430, binding = ORDO_B_MM_X) readonly buffer x_buf { vec4 x4[]; };
layout(std430, binding = ORDO_B_MM_Y) buffer y_buf { float y[]; };

const uint TM = 16u * RL;
const uint TN = 8u * TL;
const uint RL4 = RL / 4u;
const uint TL4 = TL / 4u;
const uint TK = 32u;
shared vec4 ws[TK * TM / 4u];  // [kk][row / 4]
shared vec4 xs[TK * TN / 4u];  // [kk][token / 4]

const uint G = ORDO_MAT_GROUPS;
const uint SLOTS = TK / UNIT;  // units of one group per K step
const uint UNIT4 = UNIT / 4u;

void main() {
    uint lane = gl_LocalInvocationID.x;
    uint row0 = gl_WorkGroupID.x * TM;
    uint tok0 = gl_WorkGroupID.y * TN;
    uint tr = lane / 8u;  // rows tr * RL ..
    uint tc = lane % 8u;  // tokens tc * TL ..
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
            // Stage weights: TM rows x 8 parts of 4 elements; element (kk, row).
            for (uint s = lane; s < TM * 8u; s += 128u) {
                uint r = s / 8u;
                uint q = s % 8u;  // part of the step: slot q / PARTS, part q % PARTS of its unit
                vec4 v = vec4(0.0);
                if (row0 + r < p.n_rows && i0 + q / PARTS < ng) {
                    uint u = g + G * (i0 + q / PARTS);
                    v = part(load_raw((row0 + r) * units + u), q % PARTS);
                }
                for (uint e = 0; e < 4u; ++e) {
                    ws[(q * 4u + e) * (TM / 4u) + r / 4u][r % 4u] = v[e];
                }
            }
            // Stage activations: TN tokens x 8 parts.
            for (uint s = lane; s < TN * 8u; s += 128u) {
                uint t = s / 8u;
                uint q = s % 8u;
                vec4 v = vec4(0.0);
                if (tok0 + t < p.n_cols && i0 + q / PARTS < ng) {
                    uint u = g + G * (i0 + q / PARTS);
                    v = x4[(p.x_offset + (tok0 + t) * p.x_stride) / 4u + u * UNIT4 + q % PARTS];
                }
                for (uint e = 0; e < 4u; ++e) {
                    xs[(q * 4u + e) * (TN / 4u) + t / 4u][t % 4u] = v[e];
                }
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
                        a[e * RL4 + v] = ws[(kk + e) * (TM / 4u) + tr * RL4 + v];
                    }
                    for (uint v = 0; v < TL4; ++v) {
                        b[e * TL4 + v] = xs[(kk + e) * (TN / 4u) + tc * TL4 + v];
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
