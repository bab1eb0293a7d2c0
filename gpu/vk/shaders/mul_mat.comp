// mul_mat.comp: prefill mat-mat for every weight type. Call site: gpu/vk/kernels.cpp
// encode_mul_mat() when the token count is large. A workgroup of 128 lanes computes a tile of
// ORDO_MM_TM weight rows x ORDO_MM_TN tokens; each K step stages one 32-element slice of the
// weight tile (dequantized once, shared by all tokens) and of the activation tile in shared
// memory, and each lane accumulates a 4 x 4 block of outputs from it, four k at a time in
// mat_order.glsl's sequential order (so its outputs equal mul_mat_rows' bit for bit).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "abi.h"
// The tile mapping below assumes exactly 128 lanes (16 row groups x 8 token groups).
layout(local_size_x = 128) in;
layout(push_constant) uniform push_block { mul_mat_push p; };
#include "weights.glsl"
#include "mat_order.glsl"
layout(std430, binding = ORDO_B_MM_X) readonly buffer x_buf { vec4 x4[]; };
layout(std430, binding = ORDO_B_MM_Y) buffer y_buf { float y[]; };

const uint TM = ORDO_MM_TM;
const uint TN = ORDO_MM_TN;
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
    uint tr = lane / 8u;   // rows tr*4 .. +3
    uint tc = lane % 8u;   // tokens tc*4 .. +3
    uint units = p.k / UNIT;
    vec4 total[4];
    for (uint g = 0; g < G; ++g) {
        uint ng = units > g ? (units - g + G - 1u) / G : 0u;  // units of group g
        vec4 acc[4];
        for (uint i = 0; i < 4u; ++i) {
            acc[i] = vec4(0.0);
        }
        for (uint i0 = 0; i0 < ng; i0 += SLOTS) {
            // Stage weights: 64 rows x 8 parts of 4 elements, four per lane; element (kk, row).
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
            // Stage activations: 32 tokens x 8 parts.
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
                vec4 a[4], b[4];  // a[e]: rows tr*4.. at k kk+e; b[e]: tokens tc*4.. at k kk+e
                for (uint e = 0; e < 4u; ++e) {
                    a[e] = ws[(kk + e) * (TM / 4u) + tr];
                    b[e] = xs[(kk + e) * (TN / 4u) + tc];
                }
                for (uint i = 0; i < 4u; ++i) {
                    vec4 w = vec4(a[0][i], a[1][i], a[2][i], a[3][i]);
                    for (uint j = 0; j < 4u; ++j) {
                        acc[i][j] = mat_acc(acc[i][j], w, vec4(b[0][j], b[1][j], b[2][j], b[3][j]));
                    }
                }
            }
            barrier();
        }
        for (uint i = 0; i < 4u; ++i) {
            for (uint j = 0; j < 4u; ++j) {
                total[i][j] = g == 0u ? acc[i][j] : mat_fold(total[i][j], acc[i][j]);
            }
        }
    }
    for (uint i = 0; i < 4u; ++i) {
        uint r = row0 + tr * 4u + i;
        if (r >= p.n_rows) {
            continue;
        }
        for (uint j = 0; j < 4u; ++j) {
            uint t = tok0 + tc * 4u + j;
            if (t < p.n_cols) {
                uint o = p.y_offset + t * p.y_stride + p.row_begin + r;
                y[o] = p.accumulate != 0u ? y[o] + total[i][j] : total[i][j];
            }
        }
    }
}
