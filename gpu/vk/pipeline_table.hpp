// pipeline_table.hpp: the one list of compute pipelines. Each row: name (= the SPIR-V symbol
// generated from gpu/CMakeLists.txt's ordo_shader() list), storage-buffer binding count, and
// push-constant struct from gpu/vk/shaders/abi.h. gpu/vk/pipelines.cpp expands it into the
// pipeline_id enum, the creation loop and the choke-point checks.
#pragma once

// One row per weight type for a weight-typed kernel, in abi.h's ORDO_WTYPE_* order (the encoders
// pick a type's pipeline as the kernel's f32 id + ORDO_WTYPE_*).
#define ORDO_WEIGHT_TYPES(X, kernel, bindings, push) \
    X(kernel##_f32, bindings, push)                  \
    X(kernel##_f16, bindings, push)                  \
    X(kernel##_q8_0, bindings, push)                 \
    X(kernel##_q4_0, bindings, push)                 \
    X(kernel##_bf16, bindings, push)                 \
    X(kernel##_q4_1, bindings, push)                 \
    X(kernel##_q5_0, bindings, push)                 \
    X(kernel##_q5_1, bindings, push)                 \
    X(kernel##_q2_k, bindings, push)                 \
    X(kernel##_q3_k, bindings, push)                 \
    X(kernel##_q4_k, bindings, push)                 \
    X(kernel##_q5_k, bindings, push)                 \
    X(kernel##_q6_k, bindings, push)

#define ORDO_GPU_PIPELINES(X)                                       \
    ORDO_WEIGHT_TYPES(X, get_rows, 3, get_rows_push)                \
    ORDO_WEIGHT_TYPES(X, mul_mat_vec, 3, mul_mat_push)              \
    ORDO_WEIGHT_TYPES(X, mul_mat, 3, mul_mat_push)                  \
    ORDO_WEIGHT_TYPES(X, mul_mat_rows, 3, mul_mat_push)             \
    ORDO_WEIGHT_TYPES(X, mul_mat_tx1, 3, mul_mat_tx_push)           \
    ORDO_WEIGHT_TYPES(X, mul_mat_tx1t4, 3, mul_mat_tx_push)         \
    ORDO_WEIGHT_TYPES(X, mul_mat_tx1t2, 3, mul_mat_tx_push)         \
    ORDO_WEIGHT_TYPES(X, mul_mat_tx4, 3, mul_mat_tx_push)           \
    ORDO_WEIGHT_TYPES(X, mul_mat_txm, 3, mul_mat_tx_push)           \
    X(rms_norm, 3, rms_norm_push)                    \
    X(rms_norm_tx, 3, rms_norm_push)                 \
    X(rope, 3, rope_push)                            \
    X(swiglu, 3, swiglu_push)                        \
    X(swiglu_tx, 3, swiglu_push)                     \
    X(add, 3, add_push)                              \
    X(kv_write_f32, 4, kv_write_push)                \
    X(kv_write_f16, 4, kv_write_push)                \
    X(rope_kv_tx_f32, 6, rope_kv_push)               \
    X(rope_kv_tx_f16, 6, rope_kv_push)               \
    X(attention_f32, 6, attention_push)              \
    X(attention_f16, 6, attention_push)              \
    X(attention_tx64_f32, 6, attention_tx_push)     \
    X(attention_tx64_f16, 6, attention_tx_push)     \
    X(attention_tx128_f32, 6, attention_tx_push)    \
    X(attention_tx128_f16, 6, attention_tx_push)    \
    X(attention_txg64_f32, 6, attention_tx_push)    \
    X(attention_txg64_f16, 6, attention_tx_push)    \
    X(attention_txg128_f32, 6, attention_tx_push)   \
    X(attention_txg128_f16, 6, attention_tx_push)   \
    X(spin, 1, spin_push)                            \
    X(spin_until, 1, spin_push)
