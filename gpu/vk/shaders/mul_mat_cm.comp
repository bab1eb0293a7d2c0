// mul_mat_cm.comp: the tiled mat-mul on cooperative matrices (tensor cores), for every weight
// type. Call site: gpu/vk/kernels.cpp dispatch_storage(), for the steps the tiled mul_mat.comp
// would run, only where gpu.batch_invariant = false and the device has VK_NV_cooperative_matrix
// (pipeline_tuning::mat_coop). It is NOT batch invariant: the device's matrix units sum each
// 16-element product in an order the driver chooses, in f16 x f16 -> f32, and the weights and
// activations are rounded to f16 on the way in (as llama.cpp's cooperative-matrix kernels do).
// Its outputs differ from mat_order.glsl's by rounding (within the f16 inputs' precision), so a
// token's logits depend on which kernel ran it: that is what the switch trades for speed.
//
// A workgroup of 4 subgroups of 32 lanes computes a tile of BM weight rows x BN tokens: the
// subgroups form a WR x (4 / WR) grid, each owning FM x FN fragments of 16 x 16 outputs. Each K
// step (32 elements) stages the weight tile (dequantized once into f16, [row][k]) and the
// activation tile (f16, [token][k]) in shared memory, rows padded to 40 halves (80 bytes: the 8
// rows a matrix load reads in one phase start in 8 distinct 4-bank groups); then each subgroup
// multiplies its fragments twice (k 0..15, 16..31). The outputs leave through a 16 x 16 f32
// shared staging fragment per subgroup, so the stores are bounds-checked and coalesced, and
// accumulate (the fused residual add) reads y once.
//
// Grid: x = row tiles, y = token tiles, read as one index with the token tiles fastest (a
// prompt's token tiles share a weight tile through L2). p.split = 1 (grids too small to fill
// the GPU: batched decode): workgroup z sums the z-th eighth of the K steps alone and stores
// its partials where mul_mat.comp's group split would; mul_mat_fold.comp adds the 8.
//
// CM_EMULATE = 1 (mul_mat_cme_*): the same kernel with the three matrix operations written out
// in plain GLSL (a "subgroup" is lanes 32w .. 32w + 31 of the workgroup; a fragment of A or B
// is where it sits in shared memory; an accumulator's element i * 32 + lane is the lane's i-th
// of 8), so its staging (the same f16 tiles: it needs f16 arithmetic, which lavapipe has),
// indexing, split and stores run and are checked on devices without cooperative matrices
// (lavapipe, CI). Only tests and the bench ask for it.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#if !CM_EMULATE
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#endif
#include "abi.h"
layout(local_size_x = 128) in;
layout(constant_id = 12) const uint WR = 2;  // subgroups along the rows: 1, 2 or 4
layout(constant_id = 13) const uint FM = 2;  // 16-row fragments per subgroup
layout(constant_id = 14) const uint FN = 2;  // 16-token fragments per subgroup: 1, 2 or 4
layout(push_constant) uniform push_block { mul_mat_push p; };
#include "weights.glsl"
layout(std430, binding = ORDO_B_MM_X) readonly buffer x_buf { vec4 x4[]; };
layout(std430, binding = ORDO_B_MM_Y) buffer y_buf { float y[]; };

const uint WC = 4u / WR;
const uint BM = WR * FM * 16u;  // weight rows of the tile
const uint BN = WC * FN * 16u;  // tokens of the tile
const uint BK = 32u;            // k per staging step
const uint SK = BK + 8u;        // halves between staged rows (tokens)
const uint FRAGS_MAX = 16u;  // FM x FN at most: 16 accumulators, 128 floats a lane

shared float16_t wa[BM * SK];  // [row][k]
shared float16_t xb[BN * SK];  // [token][k]
shared float cs[4u * 256u];  // per subgroup one 16 x 16 output fragment, [token][row]

#if CM_EMULATE
// Only the 16 products of an element are unrolled: unrolled, llvmpipe compiles the whole
// emulation for 7-9 s a variant; not at all, a lane's loop iterations at K 2048 pass llvmpipe's
// cap (65535 a shader invocation, after which it ends loops silently: device_info::
// loop_iterations_max; encode_mul_mat checks mat_coop_emulated_iterations against it).
#define UNROLL [[dont_unroll]]
struct cm_acc {
    float v[8];
};
#define CM_ACC cm_acc
#define CM_A uint
#define CM_B uint
uint sg_id() { return gl_LocalInvocationID.x / 32u; }
uint sg_lane() { return gl_LocalInvocationID.x % 32u; }
cm_acc cm_zero() {
    cm_acc a;
    for (uint i = 0; i < 8u; ++i) {
        a.v[i] = 0.0;
    }
    return a;
}
// Element (m, n) of an accumulator (m: row, n: token) is its element n * 16 + m.
cm_acc cm_mad(uint a_at, uint b_at, cm_acc c) {
    [[dont_unroll]] for (uint i = 0; i < 8u; ++i) {
        uint e = i * 32u + sg_lane();
        uint m = e % 16u, n = e / 16u;
        float s = c.v[i];
        [[unroll]] for (uint kk = 0; kk < 16u; ++kk) {
            s = fma(float(wa[a_at + m * SK + kk]), float(xb[b_at + n * SK + kk]), s);
        }
        c.v[i] = s;
    }
    return c;
}
void cm_store(cm_acc c, uint at) {
    for (uint i = 0; i < 8u; ++i) {
        cs[at + i * 32u + sg_lane()] = c.v[i];
    }
}
#else
#define CM_ACC fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#define CM_A fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define CM_B fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define UNROLL [[unroll]]
uint sg_id() { return gl_SubgroupID; }
uint sg_lane() { return gl_SubgroupInvocationID; }
#endif

// The 4-element part at k (a multiple of 4) of weight row r of the chunk: 0 past K.
vec4 w_part(uint r, uint k) {
    if (k >= p.k) {
        return vec4(0.0);
    }
    uint units = p.k / UNIT;
    return part(load_raw(r * units + k / UNIT), (k % UNIT) / 4u);
}

// Stage K step k0: BM rows x 8 parts of weights, BN tokens x 8 parts of activations, 0 past
// the rows, the tokens and K.
void stage(uint row0, uint tok0, uint k0) {
    uint lane = gl_LocalInvocationID.x;
    for (uint s = lane; s < BM * 8u; s += 128u) {
        uint r = s / 8u, q = s % 8u;
        vec4 v = row0 + r < p.n_rows ? w_part(row0 + r, k0 + 4u * q) : vec4(0.0);
        for (uint e = 0; e < 4u; ++e) {
            wa[r * SK + 4u * q + e] = float16_t(v[e]);
        }
    }
    for (uint s = lane; s < BN * 8u; s += 128u) {
        uint t = s / 8u, q = s % 8u;
        uint k = k0 + 4u * q;
        vec4 v = vec4(0.0);
        if (tok0 + t < p.n_cols && k < p.k) {
            v = x4[(p.x_offset + (tok0 + t) * p.x_stride + k) / 4u];
        }
        for (uint e = 0; e < 4u; ++e) {
            xb[t * SK + 4u * q + e] = float16_t(v[e]);
        }
    }
}

void main() {
    uint wx = gl_WorkGroupID.x, wy = gl_WorkGroupID.y;
    uint linear = wx + wy * gl_NumWorkGroups.x;
    wx = linear / gl_NumWorkGroups.y;
    wy = linear % gl_NumWorkGroups.y;
    uint row0 = wx * BM;
    uint tok0 = wy * BN;
    uint sg = sg_id();
    uint sr = sg / WC;  // the subgroup's place in the tile: rows sr * FM * 16 ..
    uint sc = sg % WC;  // tokens sc * FN * 16 ..

    // K steps this workgroup sums: all, or the z-th eighth under the split.
    uint steps = (p.k + BK - 1u) / BK;
    uint s0 = 0u, s1 = steps;
    if (p.split != 0u) {
        s0 = gl_WorkGroupID.z * steps / ORDO_MAT_GROUPS;
        s1 = (gl_WorkGroupID.z + 1u) * steps / ORDO_MAT_GROUPS;
    }

    // The fragment loops are unrolled (their bounds are specialization constants), so every
    // accumulator is a register, never an indexed array.
    CM_ACC acc[FRAGS_MAX];
    UNROLL for (uint f = 0; f < FM * FN; ++f) {
#if CM_EMULATE
        acc[f] = cm_zero();
#else
        acc[f] = CM_ACC(0.0);
#endif
    }
    for (uint st = s0; st < s1; ++st) {
        stage(row0, tok0, st * BK);
        barrier();
        UNROLL for (uint kk = 0; kk < BK; kk += 16u) {
            UNROLL for (uint i = 0; i < FM; ++i) {
                uint a_at = ((sr * FM + i) * 16u) * SK + kk;
#if !CM_EMULATE
                CM_A a;
                coopMatLoadNV(a, wa, a_at, SK, false);
#endif
                UNROLL for (uint j = 0; j < FN; ++j) {
                    uint b_at = ((sc * FN + j) * 16u) * SK + kk;
#if CM_EMULATE
                    acc[i * FN + j] = cm_mad(a_at, b_at, acc[i * FN + j]);
#else
                    CM_B b;
                    coopMatLoadNV(b, xb, b_at, SK, true);
                    acc[i * FN + j] = coopMatMulAddNV(a, b, acc[i * FN + j]);
#endif
                }
            }
        }
        barrier();
    }

    // Out through the subgroup's staging fragment: element (m, n) at cs[sg * 256 + n * 16 + m].
    UNROLL for (uint i = 0; i < FM; ++i) {
        UNROLL for (uint j = 0; j < FN; ++j) {
#if CM_EMULATE
            cm_store(acc[i * FN + j], sg * 256u);
#else
            coopMatStoreNV(acc[i * FN + j], cs, sg * 256u, 16u, true);
#endif
            barrier();
            uint r0 = row0 + (sr * FM + i) * 16u;
            uint t0 = tok0 + (sc * FN + j) * 16u;
            for (uint e = sg_lane(); e < 256u; e += 32u) {
                uint r = r0 + e % 16u, t = t0 + e / 16u;
                if (r >= p.n_rows || t >= p.n_cols) {
                    continue;
                }
                float v = cs[sg * 256u + e];
                if (p.split != 0u) {
                    y[p.y_offset + (gl_WorkGroupID.z * p.n_cols + t) * p.y_stride + r] = v;
                } else {
                    uint o = p.y_offset + t * p.y_stride + p.row_begin + r;
                    y[o] = p.accumulate != 0u ? y[o] + v : v;
                }
            }
            barrier();
        }
    }
}
