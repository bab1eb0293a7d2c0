// mul_mat_rows.comp: mat-vec and mat-mat for CPU-backed Vulkan devices (lavapipe), for
// every weight type. Call site: gpu/vk/kernels.cpp encode_mul_mat() when the device is a
// CPU (or mat_path::rows is asked for). One lane owns one weight row and walks it in 8-element
// units against up to COLS tokens at once: the activation loads are the same address for every
// lane (one scalar load on a SIMD CPU), there is no shared memory and no barrier, which is what
// llvmpipe executes fastest. GPUs use mul_mat.comp instead. Sums in mat_order.glsl's sequential
// order, so its outputs equal mul_mat's bit for bit (batch invariance).
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "abi.h"
layout(local_size_x_id = 0) in;
layout(push_constant) uniform push_block { mul_mat_push p; };
#include "weights.glsl"
#include "mat_order.glsl"
layout(std430, binding = ORDO_B_MM_X) readonly buffer x_buf { vec4 x4[]; };
layout(std430, binding = ORDO_B_MM_Y) buffer y_buf { float y[]; };

const uint COLS = ORDO_ROWS_COLS;

void main() {
    uint row = gl_GlobalInvocationID.x;
    if (row >= p.n_rows) {
        return;
    }
    uint units = p.k / 8u;
    for (uint c0 = 0; c0 < p.n_cols; c0 += COLS) {
        uint n = min(COLS, p.n_cols - c0);
        float acc[COLS];
        [[unroll]] for (uint c = 0; c < COLS; ++c) {
            acc[c] = 0.0;
        }
        uint xbase = (p.x_offset + c0 * p.x_stride) / 4u;
        uint xstep = p.x_stride / 4u;
        for (uint u = 0; u < units; ++u) {
            vec4 lo, hi;
            load_unit(row, u, p.k, lo, hi);
            [[unroll]] for (uint c = 0; c < COLS; ++c) {
                if (c < n) {
                    uint xv = xbase + c * xstep + u * 2u;
                    acc[c] = mat_acc(mat_acc(acc[c], lo, x4[xv]), hi, x4[xv + 1u]);
                }
            }
        }
        [[unroll]] for (uint c = 0; c < COLS; ++c) {
            if (c < n) {
                uint o = p.y_offset + (c0 + c) * p.y_stride + p.row_begin + row;
                y[o] = p.accumulate != 0u ? y[o] + acc[c] : acc[c];
            }
        }
    }
}
