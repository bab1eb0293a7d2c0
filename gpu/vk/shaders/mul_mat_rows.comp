// mul_mat_rows.comp: mat-vec and mat-mat for CPU-backed Vulkan devices (lavapipe), for
// every weight type. Call site: gpu/vk/kernels.cpp encode_mul_mat() when the device is a
// CPU in the storage family (or mat_path::rows is asked for). One lane owns one weight row and
// walks mat_order.glsl's 8 groups in turn (units g, g + 8, ... of group g), each against up to
// COLS tokens at once: the activation loads are the same address for every lane (one scalar
// load on a SIMD CPU), there is no shared memory and no barrier, which is what llvmpipe executes
// fastest. GPUs use mul_mat_vec.comp instead. Sums in mat_order.glsl's grouped order, so its
// outputs equal every other mat-mul kernel's bit for bit (batch invariance).
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

const uint G = ORDO_MAT_GROUPS;

void main() {
    uint row = gl_GlobalInvocationID.x;
    if (row >= p.n_rows) {
        return;
    }
    uint units = p.k / UNIT;
    uint ui0 = row * units;
    for (uint c0 = 0; c0 < p.n_cols; c0 += COLS) {
        uint n = min(COLS, p.n_cols - c0);
        float total[COLS];
        uint xbase = (p.x_offset + c0 * p.x_stride) / 4u;
        uint xstep = p.x_stride / 4u;
        for (uint g = 0; g < G; ++g) {
            float acc[COLS];
            [[unroll]] for (uint c = 0; c < COLS; ++c) {
                acc[c] = 0.0;
            }
            for (uint u = g; u < units; u += G) {
                unit_raw w = load_raw(ui0 + u);
                [[unroll]] for (uint j = 0; j < PARTS; ++j) {
                    vec4 wv = part(w, j);
                    [[unroll]] for (uint c = 0; c < COLS; ++c) {
                        if (c < n) {
                            acc[c] = mat_acc(acc[c], wv, x4[xbase + c * xstep + u * (UNIT / 4u) + j]);
                        }
                    }
                }
            }
            [[unroll]] for (uint c = 0; c < COLS; ++c) {
                total[c] = g == 0u ? acc[c] : mat_fold(total[c], acc[c]);
            }
        }
        [[unroll]] for (uint c = 0; c < COLS; ++c) {
            if (c < n) {
                uint o = p.y_offset + (c0 + c) * p.y_stride + p.row_begin + row;
                y[o] = p.accumulate != 0u ? y[o] + total[c] : total[c];
            }
        }
    }
}
