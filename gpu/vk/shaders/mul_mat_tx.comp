// mul_mat_tx.comp: mat-vec and mat-mat for every weight type, reading weights and
// activations through uniform texel buffers. Call site: gpu/vk/kernels.cpp encode_mul_mat() (the
// automatic path on every device whose buffers have texel views; variants tx1/tx4/txm by token
// count). Why texels: lavapipe (Mesa 22.3) turns every storage-buffer load into a branchy
// per-lane scalar loop, while a texel fetch is a branch-free vector gather (gpu/PERF.md has the
// measurements). K is walked one weight "unit" at a time (F32: 4 elements, F16/BF16: 8, every
// block type 32; weight_units.glsl fetches and dequantizes it in registers, 1-3 texels per
// unit). No shared memory, no barrier.
// tx1 (one token): the 8 lanes of a workgroup split K (lane l takes units l, l+8, ...), keep
// their activation units in registers (K is specialization constant 2, so that cache is
// indexed statically: the x gathers happen once per workgroup, not once per row) and sweep
// ORDO_TX1_ROWS rows, one weight gather per unit; the 8 lane sums are added in lane order.
// tx4 / txm (more tokens): each lane owns R rows x T tokens (16-row tiles, abi.h) and walks the
// same 8 unit groups in turn, so every weight texel feeds T tokens and every activation texel
// R rows; the accumulators spill to the stack, which costs less than the texel gathers a
// smaller tile would repeat (gpu/PERF.md "Multi-sequence decode steps").
// Batch invariance: every output is summed in mat_order.glsl's grouped order by all three
// variants, so a token's result does not depend on which variant its step's token count picked.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "abi.h"
#include "mat_order.glsl"
#if TX == 1
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_ballot : require
#extension GL_KHR_shader_subgroup_shuffle : require
const uint R = 1u, T = 1u;
#elif TX == 4
// Rows per lane: specialization constant 3 (pipelines.cpp: 128 rows per workgroup whatever
// its lane count, ORDO_TX4_R / ORDO_TXM_R at 8 lanes).
layout(constant_id = 3) const uint R = ORDO_TX4_R;
const uint T = ORDO_TX4_T;
#else
layout(constant_id = 3) const uint R = ORDO_TXM_R;
const uint T = ORDO_TXM_T;
#endif
layout(local_size_x_id = 0) in;
// K for tx1 (the encoder builds one pipeline per K and checks p.k == K_SPEC); unused by tx4/txm.
layout(constant_id = 2) const uint K_SPEC = 256u;
layout(push_constant) uniform push_block { mul_mat_tx_push p; };
layout(binding = ORDO_B_MM_W) uniform usamplerBuffer w_tex;
layout(binding = ORDO_B_MM_X) uniform usamplerBuffer x_tex;
layout(std430, binding = ORDO_B_MM_Y) buffer y_buf { float y[]; };

vec4 x_part(uint t, uint q) {  // activation texel q (4 floats) of token t
    return uintBitsToFloat(texelFetch(x_tex, int(p.x_texel + t * p.x_stride4 + q)));
}

// Where weight_units.glsl's texels are: the chunk starts at texel p.w_texel of the bound buffer,
// its aux region at p.s_texel.
uvec4 w_fetch(uint t) { return texelFetch(w_tex, int(p.w_texel + t)); }
uint w_aux_texel() { return p.s_texel - p.w_texel; }

#include "weight_units.glsl"

// The raw texels of unit u of row `row` (a row has `units` units).
unit_raw load_raw(uint row, uint u, uint units) { return load_raw(row * units + u); }

const uint G = ORDO_MAT_GROUPS;

#if TX == 1
const uint KU = K_SPEC / UNIT;      // units of K
const uint LU = KU / G;             // units every lane has
const uint TAIL = KU % G;           // lanes below TAIL have one more
const uint LUC = LU + (TAIL != 0u ? 1u : 0u);
// The workgroup is one subgroup of 8 x TEAMS lanes (8 on 256-bit lavapipe, 16 on 512-bit):
// each team of 8 lanes runs the 8 groups of its own rows.
const uint TEAMS = gl_WorkGroupSize.x / G;

// Lane `l` of this lane's team.
float team_lane(float v, uint team, uint l) {
    return TEAMS == 1u ? subgroupBroadcast(v, l) : subgroupShuffle(v, team * G + l);
}

#ifndef TT
#define TT 1  // tokens per tx1 dispatch (the tx1t2 / tx1t4 variants: up to 2 / 4)
#endif

void main() {
    uint lane = gl_SubgroupInvocationID % G;  // the workgroup is one subgroup (encoder checks)
    uint team = gl_SubgroupInvocationID / G;
    // This lane's activation units of every token: statically indexed registers.
    vec4 xs[TT][LUC * PARTS];
    [[unroll]] for (uint t = 0; t < TT; ++t) {
        uint tok = min(t, p.n_cols - 1u);  // clamped copies past the last token: never stored
        [[unroll]] for (uint i = 0; i < LUC; ++i) {
            // The tail unit of lanes >= TAIL reads a clamped texel and is never used.
            uint u = min(lane + G * i, KU - 1u);
            [[unroll]] for (uint j = 0; j < PARTS; ++j) {
                xs[t][i * PARTS + j] = x_part(tok, u * PARTS + j);
            }
        }
    }
    uint row0 = gl_WorkGroupID.x * ORDO_TX1_ROWS;
    for (uint rr = team; rr < ORDO_TX1_ROWS; rr += TEAMS) {
        uint row = min(row0 + rr, p.n_rows - 1u);
        float acc[TT];
        [[unroll]] for (uint t = 0; t < TT; ++t) acc[t] = 0.0;
        [[unroll]] for (uint i = 0; i < LU; ++i) {
            unit_raw w = load_raw(row, lane + G * i, KU);
            [[unroll]] for (uint j = 0; j < PARTS; ++j) {
                vec4 wv = part(w, j);
                [[unroll]] for (uint t = 0; t < TT; ++t) {
                    acc[t] = mat_acc(acc[t], wv, xs[t][i * PARTS + j]);
                }
            }
        }
        if (TAIL != 0u && lane < TAIL) {
            unit_raw w = load_raw(row, lane + G * LU, KU);
            [[unroll]] for (uint j = 0; j < PARTS; ++j) {
                vec4 wv = part(w, j);
                [[unroll]] for (uint t = 0; t < TT; ++t) {
                    acc[t] = mat_acc(acc[t], wv, xs[t][LU * PARTS + j]);
                }
            }
        }
        [[unroll]] for (uint t = 0; t < TT; ++t) {
            float total = team_lane(acc[t], team, 0u);
            [[unroll]] for (uint l = 1; l < G; ++l) total = mat_fold(total, team_lane(acc[t], team, l));
            if (lane == (rr / TEAMS + t) % G && row0 + rr < p.n_rows && t < p.n_cols) {
                uint o = p.y_offset + t * p.y_stride + p.row_begin + row0 + rr;
                y[o] = p.accumulate != 0u ? y[o] + total : total;
            }
        }
    }
}
#else
void main() {
    uint row0 = gl_GlobalInvocationID.x * R;
    uint tok0 = gl_WorkGroupID.y * T;
    uint units = p.k / UNIT;
    uint rows[R];
    uint toks[T];
    // Clamped to valid rows and tokens (reads stay in range); discarded at the store.
    [[unroll]] for (uint r = 0; r < R; ++r) rows[r] = min(row0 + r, p.n_rows - 1u);
    [[unroll]] for (uint t = 0; t < T; ++t) toks[t] = min(tok0 + t, p.n_cols - 1u);
    float total[R][T];
    for (uint g = 0; g < G; ++g) {
        float acc[R][T];
        [[unroll]] for (uint r = 0; r < R; ++r) {
            [[unroll]] for (uint t = 0; t < T; ++t) acc[r][t] = 0.0;
        }
        for (uint u = g; u < units; u += G) {
            unit_raw w[R];
            [[unroll]] for (uint r = 0; r < R; ++r) w[r] = load_raw(rows[r], u, units);
            [[unroll]] for (uint j = 0; j < PARTS; ++j) {
                vec4 wv[R];
                [[unroll]] for (uint r = 0; r < R; ++r) wv[r] = part(w[r], j);
                [[unroll]] for (uint t = 0; t < T; ++t) {
                    vec4 xv = x_part(toks[t], u * PARTS + j);
                    [[unroll]] for (uint r = 0; r < R; ++r) {
                        acc[r][t] = mat_acc(acc[r][t], wv[r], xv);
                    }
                }
            }
        }
        [[unroll]] for (uint r = 0; r < R; ++r) {
            [[unroll]] for (uint t = 0; t < T; ++t) {
                total[r][t] = g == 0u ? acc[r][t] : mat_fold(total[r][t], acc[r][t]);
            }
        }
    }
    [[unroll]] for (uint r = 0; r < R; ++r) {
        [[unroll]] for (uint t = 0; t < T; ++t) {
            if (row0 + r < p.n_rows && tok0 + t < p.n_cols) {
                uint o = p.y_offset + (tok0 + t) * p.y_stride + p.row_begin + row0 + r;
                float v = total[r][t];
                y[o] = p.accumulate != 0u ? y[o] + v : v;
            }
        }
    }
}
#endif
