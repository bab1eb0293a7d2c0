// mul_mat_vec.comp: the decode mat-vec (and the skinny mat-mat of up to ORDO_MMV_COLS
// sequences) of GPUs, for every weight type (weight_units.glsl), dequantized in registers. Call
// site: gpu/vk/kernels.cpp encode_mul_mat() for few tokens on a GPU. Specialized per device
// (lanes WG, rows per team RT, unroll: pipelines.cpp tuning_for) and per token count (COLS).
//
// A workgroup of WG lanes is WG / 8 teams of 8 adjacent lanes; each team owns RT weight rows
// (rows row0 + r * TEAMS + team) and lane g of a team runs mat_order.glsl's group g of every
// row it owns: units g, g + 8, ... in order. The workgroup walks K in steps of 8 x UNROLL
// units: each lane loads its UNROLL weight units of the step per row (a team's loads are 8
// consecutive units: whole cache lines, 128 bytes for F16), the workgroup stages the step's
// activations of every token in shared memory with whole-line loads, and each weight unit
// feeds all COLS tokens from there. The 8 group sums of each output meet in shared memory and
// fold in group order (no subgroup operation needed, so every device runs it). Same order as
// every other mat-mul kernel: a token's outputs are bit-identical to the tiled kernel's and to
// the texel kernels'. (Measured on an H100, gpu/PERF.md: reading x straight from the storage
// buffer, the block types' lanes touched 8 lines per load and Q4_K decoded at 80 GB/s.)
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "abi.h"
layout(constant_id = 0) const uint WG = 128;  // lanes: a multiple of 8 (pipelines.cpp)
layout(constant_id = 1) const uint RT = 1;    // weight rows per team
layout(constant_id = 2) const uint COLS = ORDO_MMV_COLS;  // tokens per pass (pipelines::for_cols)
layout(constant_id = 3) const uint UNROLL = 2;  // units loaded before summing
// Lanes per group: with H > 1, H lanes share a group's units of a step (helper h takes step
// slots s with s % H == h; UNROLL is a multiple of H) and compute their parts' products
// (mat_part), and the group's owner (h = 0) adds them in order (mat_add): the same operations
// as mat_acc, so the same bits, on H times the lanes per row (pipelines.cpp: 1 unless
// pipeline_tuning::mat_vec_split asks, and only for up to mat_vec_split_cols tokens).
layout(constant_id = 4) const uint H = 1;
layout(local_size_x_id = 0) in;
layout(push_constant) uniform push_block { mul_mat_push p; };
#include "weights.glsl"
#include "mat_order.glsl"
layout(std430, binding = ORDO_B_MM_X) readonly buffer x_buf { vec4 x4[]; };
layout(std430, binding = ORDO_B_MM_Y) buffer y_buf { float y[]; };

const uint G = ORDO_MAT_GROUPS;
const uint TEAMS = WG / (G * H);
const uint UNIT4 = UNIT / 4u;  // vec4s of x per unit
const uint STEP = G * UNROLL;  // units per step: every lane of a team takes UNROLL of them
// x of one step's units in shared memory, UNIT4 vec4s per unit padded by one where a unit is
// wider than one vec4, so lane g's reads (unit g of the step) fall in distinct banks.
const uint USTRIDE = UNIT4 == 1u ? 1u : UNIT4 + 1u;
shared vec4 xs[COLS * STEP * USTRIDE];
shared float partial[RT * COLS * WG];
// H > 1: each helper's products, [team][r][g][s][j][c] (1 element when H == 1).
const uint DSH = H == 1u ? 1u : TEAMS * RT * G * UNROLL * PARTS * COLS;
shared float dsh[DSH];

void main() {
    uint lane = gl_LocalInvocationID.x;
    uint g = lane % G;
    uint h = (lane / G) % H;
    uint team = lane / (G * H);
    uint row0 = gl_WorkGroupID.x * TEAMS * RT;
    uint units = p.k / UNIT;
    uint xstep = p.x_stride / 4u;
    for (uint c0 = 0; c0 < p.n_cols; c0 += COLS) {
        uint n = min(COLS, p.n_cols - c0);
        uint xbase = (p.x_offset + c0 * p.x_stride) / 4u;
        float acc[RT * COLS];
        [[unroll]] for (uint i = 0; i < RT * COLS; ++i) {
            acc[i] = 0.0;
        }
        for (uint step0 = 0; step0 < units; step0 += STEP) {  // uniform: barriers inside
            // This lane's weight units of the step first (their loads fly during the staging):
            // slots h, h + H, ... of its group (all UNROLL slots when H == 1).
            const uint MINE = UNROLL / H;
            unit_raw w[RT * MINE];
            [[unroll]] for (uint r = 0; r < RT; ++r) {
                // Clamped: a row past the chunk computes a copy that the store discards.
                uint ui0 = min(row0 + r * TEAMS + team, p.n_rows - 1u) * units;
                [[unroll]] for (uint m = 0; m < MINE; ++m) {
                    uint s = m * H + h;
                    uint u = min(step0 + s * G + g, units - 1u);  // clamped; never summed past K
                    w[r * MINE + m] = load_raw(ui0 + u);
                }
            }
            // Stage the step's x (every token) with whole-line loads: the lanes of a team read
            // units 32 elements apart for the block types, which direct loads would scatter.
            for (uint i = lane; i < COLS * STEP * UNIT4; i += WG) {
                uint c = i / (STEP * UNIT4);
                uint us = (i / UNIT4) % STEP;
                uint q = i % UNIT4;
                if (c < n && step0 + us < units) {
                    xs[(c * STEP + us) * USTRIDE + q] =
                        x4[xbase + c * xstep + (step0 + us) * UNIT4 + q];
                }
            }
            barrier();
            if (H == 1u) {
                [[unroll]] for (uint r = 0; r < RT; ++r) {
                    [[unroll]] for (uint s = 0; s < UNROLL; ++s) {
                        if (step0 + s * G + g < units) {
                            [[unroll]] for (uint j = 0; j < PARTS; ++j) {
                                vec4 wv = part(w[r * UNROLL + s], j);
                                [[unroll]] for (uint c = 0; c < COLS; ++c) {
                                    if (c < n) {
                                        acc[r * COLS + c] = mat_acc(
                                            acc[r * COLS + c], wv,
                                            xs[(c * STEP + s * G + g) * USTRIDE + j]);
                                    }
                                }
                            }
                        }
                    }
                }
            } else {
                // Products of this helper's slots, then the owner's adds in slot, part order.
                [[unroll]] for (uint r = 0; r < RT; ++r) {
                    [[unroll]] for (uint m = 0; m < MINE; ++m) {
                        uint s = m * H + h;
                        [[unroll]] for (uint j = 0; j < PARTS; ++j) {
                            vec4 wv = part(w[r * MINE + m], j);
                            [[unroll]] for (uint c = 0; c < COLS; ++c) {
                                uint d = ((((team * RT + r) * G + g) * UNROLL + s) * PARTS + j) *
                                             COLS + c;
                                dsh[d] = mat_part(wv, xs[(c * STEP + s * G + g) * USTRIDE + j]);
                            }
                        }
                    }
                }
                barrier();
                if (h == 0u) {
                    [[unroll]] for (uint r = 0; r < RT; ++r) {
                        for (uint s = 0; s < UNROLL; ++s) {
                            if (step0 + s * G + g < units) {
                                [[unroll]] for (uint j = 0; j < PARTS; ++j) {
                                    [[unroll]] for (uint c = 0; c < COLS; ++c) {
                                        if (c < n) {
                                            uint d = ((((team * RT + r) * G + g) * UNROLL + s) *
                                                          PARTS + j) * COLS + c;
                                            acc[r * COLS + c] = mat_add(acc[r * COLS + c], dsh[d]);
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            barrier();
        }
        // The owners' group sums (h == 0: lanes team * G * H + g).
        if (h == 0u) {
            [[unroll]] for (uint i = 0; i < RT * COLS; ++i) {
                partial[i * WG + team * G + g] = acc[i];
            }
        }
        barrier();
        for (uint i = lane; i < TEAMS * RT * COLS; i += WG) {
            uint t = i % TEAMS;
            uint rc = i / TEAMS;  // r * COLS + c
            uint row = row0 + (rc / COLS) * TEAMS + t;
            uint c = rc % COLS;
            if (c < n && row < p.n_rows) {
                uint b = rc * WG + t * G;
                float total = partial[b];
                [[unroll]] for (uint l = 1; l < G; ++l) {
                    total = mat_fold(total, partial[b + l]);
                }
                uint o = p.y_offset + (c0 + c) * p.y_stride + p.row_begin + row;
                y[o] = p.accumulate != 0u ? y[o] + total : total;
            }
        }
        barrier();
    }
}
