// pipeline_table.hpp: the one list of compute pipelines. Each row: name (= the SPIR-V symbol
// generated from gpu/CMakeLists.txt's ordo_shader() list), storage-buffer binding count, and
// push-constant struct from gpu/vk/shaders/abi.h. gpu/vk/pipelines.cpp expands it into the
// pipeline_id enum, the creation loop and the choke-point checks.
#pragma once

#define ORDO_GPU_PIPELINES(X)                        \
    X(get_rows_f32, 3, get_rows_push)                \
    X(get_rows_f16, 3, get_rows_push)                \
    X(get_rows_q8_0, 3, get_rows_push)               \
    X(get_rows_q4_0, 3, get_rows_push)               \
    X(mul_mat_vec_f32, 3, mul_mat_push)              \
    X(mul_mat_vec_f16, 3, mul_mat_push)              \
    X(mul_mat_vec_q8_0, 3, mul_mat_push)             \
    X(mul_mat_vec_q4_0, 3, mul_mat_push)             \
    X(mul_mat_f32, 3, mul_mat_push)                  \
    X(mul_mat_f16, 3, mul_mat_push)                  \
    X(mul_mat_q8_0, 3, mul_mat_push)                 \
    X(mul_mat_q4_0, 3, mul_mat_push)                 \
    X(mul_mat_rows_f32, 3, mul_mat_push)             \
    X(mul_mat_rows_f16, 3, mul_mat_push)             \
    X(mul_mat_rows_q8_0, 3, mul_mat_push)            \
    X(mul_mat_rows_q4_0, 3, mul_mat_push)            \
    X(mul_mat_tx1_f32, 3, mul_mat_tx_push)          \
    X(mul_mat_tx1_f16, 3, mul_mat_tx_push)          \
    X(mul_mat_tx1_q8_0, 3, mul_mat_tx_push)         \
    X(mul_mat_tx1_q4_0, 3, mul_mat_tx_push)         \
    X(mul_mat_tx1t4_f32, 3, mul_mat_tx_push)        \
    X(mul_mat_tx1t4_f16, 3, mul_mat_tx_push)        \
    X(mul_mat_tx1t4_q8_0, 3, mul_mat_tx_push)       \
    X(mul_mat_tx1t4_q4_0, 3, mul_mat_tx_push)       \
    X(mul_mat_tx1t2_f32, 3, mul_mat_tx_push)        \
    X(mul_mat_tx1t2_f16, 3, mul_mat_tx_push)        \
    X(mul_mat_tx1t2_q8_0, 3, mul_mat_tx_push)       \
    X(mul_mat_tx1t2_q4_0, 3, mul_mat_tx_push)       \
    X(mul_mat_tx4_f32, 3, mul_mat_tx_push)          \
    X(mul_mat_tx4_f16, 3, mul_mat_tx_push)          \
    X(mul_mat_tx4_q8_0, 3, mul_mat_tx_push)         \
    X(mul_mat_tx4_q4_0, 3, mul_mat_tx_push)         \
    X(mul_mat_txm_f32, 3, mul_mat_tx_push)          \
    X(mul_mat_txm_f16, 3, mul_mat_tx_push)          \
    X(mul_mat_txm_q8_0, 3, mul_mat_tx_push)         \
    X(mul_mat_txm_q4_0, 3, mul_mat_tx_push)         \
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
