// mul_mat_vec.comp: decode mat-vec (and the skinny mat-mat of a few sequences) for every weight
// type (weight_units.glsl), dequantized here. Call site: gpu/vk/kernels.cpp encode_mul_mat()
// when the token count is small. Each workgroup owns ROWS weight rows; its lanes stride over
// the row in 8-element units (adjacent lanes read adjacent memory), accumulate ORDO_MMV_COLS
// tokens per pass over the weights, and reduce through shared memory once per pass.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "abi.h"
layout(constant_id = 0) const uint WG = 32;
layout(constant_id = 1) const uint ROWS = 2;
layout(local_size_x_id = 0) in;
layout(push_constant) uniform push_block { mul_mat_push p; };
#include "weights.glsl"
layout(std430, binding = ORDO_B_MM_X) readonly buffer x_buf { vec4 x4[]; };
layout(std430, binding = ORDO_B_MM_Y) buffer y_buf { float y[]; };

const uint COLS = ORDO_MMV_COLS;
shared float partial[ROWS * COLS * WG];

void main() {
    uint lane = gl_LocalInvocationID.x;
    uint row0 = gl_WorkGroupID.x * ROWS;
    uint units = p.k / 8u;
    for (uint c0 = 0; c0 < p.n_cols; c0 += COLS) {
        float acc[ROWS * COLS];
        for (uint i = 0; i < ROWS * COLS; ++i) {
            acc[i] = 0.0;
        }
        for (uint u = lane; u < units; u += WG) {
            vec4 wlo[ROWS], whi[ROWS];
            for (uint r = 0; r < ROWS; ++r) {
                uint row = min(row0 + r, p.n_rows - 1u);  // clamped; discarded at the store
                load_unit(row, u, p.k, wlo[r], whi[r]);
            }
            for (uint c = 0; c < COLS; ++c) {
                if (c0 + c < p.n_cols) {
                    uint xv = (p.x_offset + (c0 + c) * p.x_stride) / 4u + u * 2u;
                    vec4 xlo = x4[xv];
                    vec4 xhi = x4[xv + 1u];
                    for (uint r = 0; r < ROWS; ++r) {
                        acc[r * COLS + c] += dot(wlo[r], xlo) + dot(whi[r], xhi);
                    }
                }
            }
        }
        for (uint i = 0; i < ROWS * COLS; ++i) {
            partial[i * WG + lane] = acc[i];
        }
        barrier();
        if (lane < ROWS * COLS) {
            uint r = lane / COLS;
            uint c = lane % COLS;
            float sum = 0.0;
            for (uint j = 0; j < WG; ++j) {
                sum += partial[lane * WG + j];
            }
            if (row0 + r < p.n_rows && c0 + c < p.n_cols) {
                uint o = p.y_offset + (c0 + c) * p.y_stride + p.row_begin + row0 + r;
                y[o] = p.accumulate != 0u ? y[o] + sum : sum;
            }
        }
        barrier();
    }
}
