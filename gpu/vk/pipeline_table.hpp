// pipeline_table.hpp: the one list of compute pipelines. Each row: name (= the SPIR-V symbol
// generated from gpu/vk/CMakeLists.txt's ordo_shader() list), storage-buffer binding count,
// push-constant struct from gpu/vk/shaders/abi.h, and the pipeline's properties as columns:
//   wg     its workgroup-size class (pipeline_tuning's field for it: pipelines.cpp wg_of)
//   texel  bit i set: binding i is a uniform texel buffer (the buffer's R32G32B32A32_UINT view)
//   needs  a device feature it cannot run without (none: every Vulkan 1.2 device)
//   made   when it is built: at create(), or on request per weight type (find), per K (for_k),
//          per row tile (for_tile) or per token count (for_cols)
// gpu/vk/pipelines.cpp expands it into the pipeline_id enum, the creation loop and the
// choke-point checks; no property is derived from a pipeline's name.
#pragma once

#include "gpu/vk/shaders/weight_types.h"

// One row per weight type for a weight-typed kernel, in weight_types.h's order (the encoders
// pick a type's pipeline as the kernel's f32 id + ORDO_WTYPE_*).
#define ORDO_WEIGHT_TYPE_ROW(NAME, name, X, kernel, ...) X(kernel##_##name, __VA_ARGS__)
#define ORDO_WEIGHT_TYPES(X, kernel, ...) \
    ORDO_WEIGHT_TYPE_LIST(ORDO_WEIGHT_TYPE_ROW, X, kernel, __VA_ARGS__)

#define ORDO_GPU_PIPELINES(X)                                                                  \
    /* name, bindings, push, wg, texel, needs, made */                                         \
    ORDO_WEIGHT_TYPES(X, get_rows, 3, get_rows_push, elementwise, 0, none, type)               \
    ORDO_WEIGHT_TYPES(X, mul_mat_vec, 3, mul_mat_push, mat_vec, 0, none, cols)                 \
    ORDO_WEIGHT_TYPES(X, mul_mat_vec_norm, 4, mul_mat_push, mat_vec, 0, none, cols)            \
    ORDO_WEIGHT_TYPES(X, mul_mat_vec_glu, 4, mul_mat_push, mat_vec, 0, none, cols)             \
    ORDO_WEIGHT_TYPES(X, mul_mat_vec_rope32, 8, mul_mat_rope_push, mat_vec, 0, none, cols)     \
    ORDO_WEIGHT_TYPES(X, mul_mat_vec_rope16, 8, mul_mat_rope_push, mat_vec, 0, none, cols)     \
    ORDO_WEIGHT_TYPES(X, mul_mat, 3, mul_mat_push, mat_tiled, 0, none, type)                   \
    ORDO_WEIGHT_TYPES(X, mul_mat_cm, 3, mul_mat_push, mat_coop, 0, cooperative_matrix, type)   \
    ORDO_WEIGHT_TYPES(X, mul_mat_cme, 3, mul_mat_push, mat_coop, 0, float16, type)             \
    ORDO_WEIGHT_TYPES(X, mul_mat_rows, 3, mul_mat_push, mat_rows, 0, none, type)               \
    ORDO_WEIGHT_TYPES(X, mul_mat_tx1, 3, mul_mat_tx_push, mat_tx1, 0b11, subgroup_ballot, k)   \
    ORDO_WEIGHT_TYPES(X, mul_mat_tx1t4, 3, mul_mat_tx_push, mat_tx1, 0b11, subgroup_ballot, k) \
    ORDO_WEIGHT_TYPES(X, mul_mat_tx1t2, 3, mul_mat_tx_push, mat_tx1, 0b11, subgroup_ballot, k) \
    ORDO_WEIGHT_TYPES(X, mul_mat_tx4, 3, mul_mat_tx_push, mat_tx_tile, 0b11, none, tile)       \
    ORDO_WEIGHT_TYPES(X, mul_mat_txm, 3, mul_mat_tx_push, mat_tx_tile, 0b11, none, tile)       \
    X(rms_norm, 3, rms_norm_push, norm, 0, none, create)                                       \
    X(rms_norm_tx, 3, rms_norm_push, subgroup, 0b11, subgroup_arithmetic, create)              \
    X(swiglu, 3, swiglu_push, elementwise, 0, none, create)                                    \
    X(swiglu_tx, 3, swiglu_push, elementwise, 0b11, none, create)                              \
    X(add, 3, add_push, elementwise, 0, none, create)                                          \
    X(mul_mat_fold, 2, mat_fold_push, elementwise, 0, none, create)                            \
    X(kv_write_f32, 4, kv_write_push, elementwise, 0, none, create)                            \
    X(kv_write_f16, 4, kv_write_push, elementwise, 0, none, create)                            \
    X(rope_kv_f32, 5, rope_kv_push, elementwise, 0, none, create)                              \
    X(rope_kv_f16, 5, rope_kv_push, elementwise, 0, none, create)                              \
    X(rope_kv_tx_f32, 6, rope_kv_push, subgroup, 0b1, none, create)                            \
    X(rope_kv_tx_f16, 6, rope_kv_push, subgroup, 0b1, none, create)                            \
    X(attention_f32, 7, attention_push, attention, 0, none, create)                            \
    X(attention_f16, 7, attention_push, attention, 0, none, create)                            \
    X(attention_merge, 2, attention_merge_push, attention, 0, none, create)                    \
    X(attention_flash_f32, 6, attention_push, attention, 0, none, k)                           \
    X(attention_flash_f16, 6, attention_push, attention, 0, none, k)                           \
    X(attention_tx64_f32, 6, attention_tx_push, subgroup, 0b10111, subgroup_arithmetic, k)     \
    X(attention_tx64_f16, 6, attention_tx_push, subgroup, 0b10111, subgroup_arithmetic, k)     \
    X(attention_tx128_f32, 6, attention_tx_push, subgroup, 0b10111, subgroup_arithmetic, k)    \
    X(attention_tx128_f16, 6, attention_tx_push, subgroup, 0b10111, subgroup_arithmetic, k)    \
    X(attention_txg64_f32, 6, attention_tx_push, subgroup, 0b10111, subgroup_arithmetic, k)    \
    X(attention_txg64_f16, 6, attention_tx_push, subgroup, 0b10111, subgroup_arithmetic, k)    \
    X(attention_txg128_f32, 6, attention_tx_push, subgroup, 0b10111, subgroup_arithmetic, k)   \
    X(attention_txg128_f16, 6, attention_tx_push, subgroup, 0b10111, subgroup_arithmetic, k)   \
    X(logits_summary, 3, logits_summary_push, summary, 0, none, create)                        \
    X(logits_summary_merge, 3, logits_summary_push, summary, 0, none, create)                  \
    X(spin, 1, spin_push, single, 0, none, create)                                             \
    X(spin_until, 1, spin_push, single, 0, none, create)
