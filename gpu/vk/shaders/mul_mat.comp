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

void main() {
    uint lane = gl_LocalInvocationID.x;
    uint row0 = gl_WorkGroupID.x * TM;
    uint tok0 = gl_WorkGroupID.y * TN;
    uint tr = lane / 8u;   // rows tr*4 .. +3
    uint tc = lane % 8u;   // tokens tc*4 .. +3
    uint units = p.k / 8u;
    vec4 acc[4];
    for (uint i = 0; i < 4u; ++i) {
        acc[i] = vec4(0.0);
    }
    for (uint k0 = 0; k0 < units; k0 += TK / 8u) {
        // Stage weights: 64 rows x 4 units = 256 units, two per lane; element (kk, row).
        for (uint s = lane; s < TM * 4u; s += 128u) {
            uint r = s / 4u;
            uint uu = s % 4u;
            vec4 lo = vec4(0.0), hi = vec4(0.0);
            if (row0 + r < p.n_rows && k0 + uu < units) {
                load_unit(row0 + r, k0 + uu, p.k, lo, hi);
            }
            float v[8] = float[8](lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);
            for (uint e = 0; e < 8u; ++e) {
                uint kk = uu * 8u + e;
                ws[kk * (TM / 4u) + r / 4u][r % 4u] = v[e];
            }
        }
        // Stage activations: 32 tokens x 4 units.
        for (uint s = lane; s < TN * 4u; s += 128u) {
            uint t = s / 4u;
            uint uu = s % 4u;
            vec4 lo = vec4(0.0), hi = vec4(0.0);
            if (tok0 + t < p.n_cols && k0 + uu < units) {
                uint xv = (p.x_offset + (tok0 + t) * p.x_stride) / 4u + (k0 + uu) * 2u;
                lo = x4[xv];
                hi = x4[xv + 1u];
            }
            float v[8] = float[8](lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);
            for (uint e = 0; e < 8u; ++e) {
                uint kk = uu * 8u + e;
                xs[kk * (TN / 4u) + t / 4u][t % 4u] = v[e];
            }
        }
        barrier();
        for (uint kk = 0; kk < TK; kk += 4u) {
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
        uint r = row0 + tr * 4u + i;
        if (r >= p.n_rows) {
            continue;
        }
        for (uint j = 0; j < 4u; ++j) {
            uint t = tok0 + tc * 4u + j;
            if (t < p.n_cols) {
                uint o = p.y_offset + t * p.y_stride + p.row_begin + r;
                y[o] = p.accumulate != 0u ? y[o] + acc[i][j] : acc[i][j];
            }
        }
    }
}
