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
//
// Fused variants (decode's dispatches that ran back to back, issue 28):
// * NORM (mul_mat_vec_norm_*): x is the residual stream and the kernel applies the RMSNorm the
//   mat-mul's input needs on the way into shared memory: every workgroup sums its tokens'
//   squares in norm_order.glsl's shape (64 partials, the fixed tree) and stages
//   norm_apply(x, inv, norm_w), the operations rms_norm.comp runs, so the same bits as
//   rms_norm then mul_mat_vec, one dispatch and one barrier fewer.
// * GLU (mul_mat_vec_glu_*, with NORM): the weight is the fused gate|up matrix; a team owns RT
//   gate rows and their up rows (glu_up_row further on) and the store writes
//   silu_mul(gate, up) (swiglu.comp's operations): the FFN's norm, gate|up and SwiGLU in one.
// * ROPE (mul_mat_vec_rope32_* / rope16_*, with NORM; KV_F16: the pool's storage): the weight is
//   the fused q|k|v matrix and the store is rope_kv.comp's, so the attention block's norm, q|k|v
//   mat-vec, RoPE and KV store are one dispatch: the workgroup's sums meet in shared memory
//   (ys), and a lane per adjacent row pair (a workgroup covers an even number of rows, the
//   host checks) rotates q and k pairs with rope.glsl's expressions, writes y as the unfused
//   path leaves it (q rotated, k and v as the mat-mul gave them) and stores the rotated k and
//   the v into the token's pool slot. Same values as mul_mat_vec_norm then rope_kv.
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
#ifndef NORM
#define NORM 0
#endif
#ifndef GLU
#define GLU 0
#endif
#ifndef ROPE
#define ROPE 0
#endif
layout(local_size_x_id = 0) in;
#if ROPE
layout(push_constant) uniform push_block {
    mul_mat_push p;
    rope_kv_push rp;
};
#else
layout(push_constant) uniform push_block { mul_mat_push p; };
#endif
#include "weights.glsl"
#include "mat_order.glsl"
layout(std430, binding = ORDO_B_MM_X) readonly buffer x_buf { vec4 x4[]; };
layout(std430, binding = ORDO_B_MM_Y) buffer y_buf { float y[]; };
#if NORM || GLU
#include "norm_order.glsl"
#endif
#if NORM
layout(std430, binding = ORDO_B_MM_NORM_W) readonly buffer nw_buf { vec4 nw4[]; };
const uint NP = ORDO_NORM_PARTS;
shared float nsum[COLS * NP];  // each token's partial sums of squares
shared float ninv[COLS];       // each token's 1 / rms
#endif
#if ROPE
layout(std430, binding = ORDO_B_MM_ROPE_INTS) readonly buffer ints_buf { int ints[]; };
#define KV_BINDING_K ORDO_B_MM_ROPE_K
#define KV_BINDING_V ORDO_B_MM_ROPE_V
#include "kv_pool.glsl"
#define ROPE_FREQ_BINDING ORDO_B_MM_ROPE_FREQ
#include "rope.glsl"
#endif

const uint G = ORDO_MAT_GROUPS;
const uint RR = GLU != 0 ? 2u * RT : RT;  // weight rows a team sums: RT (gate rows, then up rows)
const uint TEAMS = WG / (G * H);
const uint UNIT4 = UNIT / 4u;  // vec4s of x per unit
const uint STEP = G * UNROLL;  // units per step: every lane of a team takes UNROLL of them
// x of one step's units in shared memory, UNIT4 vec4s per unit padded by one where a unit is
// wider than one vec4, so lane g's reads (unit g of the step) fall in distinct banks.
const uint USTRIDE = UNIT4 == 1u ? 1u : UNIT4 + 1u;
shared vec4 xs[COLS * STEP * USTRIDE];
shared float partial[RR * COLS * WG];
// H > 1: each helper's products, [team][r][g][s][j][c] (1 element when H == 1).
const uint DSH = H == 1u ? 1u : TEAMS * RR * G * UNROLL * PARTS * COLS;
shared float dsh[DSH];
#if ROPE
const uint WROWS = TEAMS * RT;  // rows a workgroup covers: even (the host checks)
shared float ys[COLS * WROWS];  // the workgroup's outputs, [token][row - row0]
#endif

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
        float acc[RR * COLS];
        [[unroll]] for (uint i = 0; i < RR * COLS; ++i) {
            acc[i] = 0.0;
        }
#if NORM
        // Each token's 1 / rms, in norm_order.glsl's shape: partial j of token c sums x[j],
        // x[j + NP], ... squared; the tree folds the NP partials pairwise.
        for (uint i = lane; i < n * NP; i += WG) {
            uint xo = xbase * 4u + (i / NP) * p.x_stride;
            float sum = 0.0;
            for (uint e = i % NP; e < p.k; e += NP) {
                sum = norm_sq_add(sum, x4[(xo + e) / 4u][(xo + e) % 4u]);
            }
            nsum[i] = sum;
        }
        barrier();
        for (uint s = NP / 2u; s > 0u; s >>= 1) {
            for (uint i = lane; i < n * s; i += WG) {
                uint j = (i / s) * NP + i % s;
                nsum[j] = norm_fold(nsum[j], nsum[j + s]);
            }
            barrier();
        }
        if (lane < n) ninv[lane] = norm_inv(nsum[lane * NP], p.k, p.norm_eps);
        barrier();
#endif
        for (uint step0 = 0; step0 < units; step0 += STEP) {  // uniform: barriers inside
            // This lane's weight units of the step first (their loads fly during the staging):
            // slots h, h + H, ... of its group (all UNROLL slots when H == 1).
            const uint MINE = UNROLL / H;
            unit_raw w[RR * MINE];
            [[unroll]] for (uint r = 0; r < RR; ++r) {
                // Clamped: a row past the chunk computes a copy that the store discards. GLU:
                // rows RT.. are the up rows of rows 0..RT - 1.
                uint row = min(row0 + (r % RT) * TEAMS + team, p.n_rows - 1u);
                uint ui0 = (row + (r >= RT ? p.glu_up_row : 0u)) * units;
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
#if NORM
                    xs[(c * STEP + us) * USTRIDE + q] =
                        norm_apply(x4[xbase + c * xstep + (step0 + us) * UNIT4 + q], ninv[c],
                                   nw4[(step0 + us) * UNIT4 + q]);
#else
                    xs[(c * STEP + us) * USTRIDE + q] =
                        x4[xbase + c * xstep + (step0 + us) * UNIT4 + q];
#endif
                }
            }
            barrier();
            if (H == 1u) {
                [[unroll]] for (uint r = 0; r < RR; ++r) {
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
                [[unroll]] for (uint r = 0; r < RR; ++r) {
                    [[unroll]] for (uint m = 0; m < MINE; ++m) {
                        uint s = m * H + h;
                        [[unroll]] for (uint j = 0; j < PARTS; ++j) {
                            vec4 wv = part(w[r * MINE + m], j);
                            [[unroll]] for (uint c = 0; c < COLS; ++c) {
                                uint d = ((((team * RR + r) * G + g) * UNROLL + s) * PARTS + j) *
                                             COLS + c;
                                dsh[d] = mat_part(wv, xs[(c * STEP + s * G + g) * USTRIDE + j]);
                            }
                        }
                    }
                }
                barrier();
                if (h == 0u) {
                    [[unroll]] for (uint r = 0; r < RR; ++r) {
                        for (uint s = 0; s < UNROLL; ++s) {
                            if (step0 + s * G + g < units) {
                                [[unroll]] for (uint j = 0; j < PARTS; ++j) {
                                    [[unroll]] for (uint c = 0; c < COLS; ++c) {
                                        if (c < n) {
                                            uint d = ((((team * RR + r) * G + g) * UNROLL + s) *
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
            [[unroll]] for (uint i = 0; i < RR * COLS; ++i) {
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
#if GLU
                uint bu = b + RT * COLS * WG;  // the up row's groups: r + RT
                float up = partial[bu];
                [[unroll]] for (uint l = 1; l < G; ++l) {
                    up = mat_fold(up, partial[bu + l]);
                }
                total = silu_mul(total, up);
#endif
#if ROPE
                ys[c * WROWS + row - row0] = total;
#else
                uint o = p.y_offset + (c0 + c) * p.y_stride + p.row_begin + row;
                y[o] = p.accumulate != 0u ? y[o] + total : total;
#endif
            }
        }
        barrier();
#if ROPE
        // rope_kv.comp's store, a lane per (token, row pair): rows are q heads, then k, then v.
        const uint half_rot = rp.n_rot / 2u;
        const uint kv_head0 = rp.n_head, v_head0 = rp.n_head + rp.n_head_kv;
        for (uint i = lane; i < n * (WROWS / 2u); i += WG) {
            uint c = i / (WROWS / 2u);
            uint lr = 2u * (i % (WROWS / 2u));
            if (row0 + lr >= p.n_rows) continue;
            uint r = p.row_begin + row0 + lr;  // even: its pair is r + 1
            uint h = r / rp.head_dim, j = (r % rp.head_dim) / 2u;
            uint t = c0 + c;
            vec2 x = vec2(ys[c * WROWS + lr], ys[c * WROWS + lr + 1u]);
            uint o = p.y_offset + t * p.y_stride + r;
            bool turn = j < half_rot && h < v_head0;
            vec2 xr = turn ? rope_rotate(x, rope_cos_sin(uint(ints[rp.pos_offset + t]), j)) : x;
            vec2 ky = h < kv_head0 ? xr : x;  // y keeps k and v as the mat-mul gave them
            y[o] = ky.x;
            y[o + 1u] = ky.y;
            int slot = ints[rp.slots_offset + t];
            if (h < kv_head0 || slot < 0 || uint(slot) >= rp.n_blocks * rp.block_tokens) continue;
            uint block = uint(slot) / rp.block_tokens, in_block = uint(slot) % rp.block_tokens;
            uint kh = h < v_head0 ? h - kv_head0 : h - v_head0;
            uint dst =
                ((block * rp.n_head_kv + kh) * rp.block_tokens + in_block) * rp.head_dim + 2u * j;
            if (h < v_head0) {
                k_store_pair(dst, xr);
            } else {
                v_store_pair(dst, x);
            }
        }
        barrier();
#endif
    }
}
