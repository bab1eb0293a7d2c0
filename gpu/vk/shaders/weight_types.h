// weight_types.h: the one list of the weight types the kernels run, in their index order.
// Everything else is generated from it:
// * abi.h's ORDO_WTYPE_<NAME> (the index): C++ constants from this macro; the shaders get them
//   as -D defines that gpu/vk/CMakeLists.txt writes by reading this file;
// * the shader variants per type (get_rows_<name>, mul_mat_*_<name>: gpu/vk/CMakeLists.txt) and
//   their pipeline-table rows (gpu/vk/pipeline_table.hpp ORDO_WEIGHT_TYPES), in this order, so
//   a type's pipeline is its kernel's f32 id + ORDO_WTYPE_<NAME>;
// * the model::ggml_type -> index map (gpu/vk/kernels.cpp).
// The next type is one X(...) line here plus its layout (weight_units.glsl, weight_layout.cpp).
// Keep the entries in this form: CMake reads them with a regular expression.
#ifndef ORDO_GPU_WEIGHT_TYPES_H
#define ORDO_GPU_WEIGHT_TYPES_H
// X(NAME, name, ...): NAME for ORDO_WTYPE_NAME, name for model::ggml_type::name and pipeline
// names; the list's own extra arguments follow (the pipeline table passes its columns).
#define ORDO_WEIGHT_TYPE_LIST(X, ...) \
    X(F32, f32, __VA_ARGS__)     \
    X(F16, f16, __VA_ARGS__)     \
    X(Q8_0, q8_0, __VA_ARGS__)   \
    X(Q4_0, q4_0, __VA_ARGS__)   \
    X(BF16, bf16, __VA_ARGS__)   \
    X(Q4_1, q4_1, __VA_ARGS__)   \
    X(Q5_0, q5_0, __VA_ARGS__)   \
    X(Q5_1, q5_1, __VA_ARGS__)   \
    X(Q2_K, q2_k, __VA_ARGS__)   \
    X(Q3_K, q3_k, __VA_ARGS__)   \
    X(Q4_K, q4_k, __VA_ARGS__)   \
    X(Q5_K, q5_k, __VA_ARGS__)   \
    X(Q6_K, q6_k, __VA_ARGS__)
#endif  // ORDO_GPU_WEIGHT_TYPES_H
