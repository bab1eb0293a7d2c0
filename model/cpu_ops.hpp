// cpu_ops.hpp: the plain C++ reference operators of the Llama forward pass.
//
// Owns the mathematical definition of every op the Vulkan kernels implement: the gpu kernel
// tests run a kernel and the function of the same name here on the same inputs and compare.
// Users: model/reference (the CPU forward pass) and tests/gpu. Written to be read, not to be
// fast: single-threaded, float accumulation, no SIMD. Pure functions; callers pass every buffer
// (nothing here allocates) and shapes are asserted, not checked: the loader (model/llama)
// validates shapes before any op runs.
//
// Conventions (as GGUF/ggml store Llama weights):
//   - A weight matrix has ne0 = n_in (the contiguous dimension) and ne1 = n_out rows; row r is
//     row_bytes(type, n_in) bytes at data + r * row_bytes. matvec computes out = W x.
//   - Vectors of several heads are laid out head-major: head h occupies [h*head_dim, +head_dim).
//   - RoPE rotates adjacent pairs (2j, 2j+1) of the first n_rot dims of each head by angle
//     pos * freq[j]; dims >= n_rot pass through (llama.cpp "normal" mode). freq is the model's
//     table (llama_weights::rope_freq: freq_base^(-2j / n_rot), divided by the Llama 3.1
//     factors and the linear scale).
//   - Grouped-query attention: query head h reads kv head h / (n_head / n_head_kv).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "model/ggml_types.hpp"

namespace ordo::model {

// A 2-D weight tensor as stored: n_out rows of n_in elements of `type`.
struct matrix_view {
    ggml_type type = ggml_type::f32;
    std::span<const uint8_t> data;  // n_out * row_bytes(type, n_in) bytes
    size_t n_in = 0;                // ne0
    size_t n_out = 0;               // ne1
    std::string_view name;          // the tensor's name in the file, for messages ("" by hand)
};

// out[i] = x[i] / sqrt(mean(x^2) + eps) * weight[i], i < n. out may alias x.
void rmsnorm(float* out, const float* x, const float* weight, size_t n, float eps);

// out[r] = dot(row r of w, x) for r < w.n_out; x has w.n_in elements. out must not alias x.
void matvec(float* out, const matrix_view& w, const float* x);

// Decodes row `row` of w (n_in floats) into out: the embedding lookup.
void get_row(float* out, const matrix_view& w, size_t row);

// In place on vec = n_heads x head_dim floats (see the convention above); n_rot = 2 *
// freq.size() <= head_dim. The angle, its cosine and sine are computed in double.
void rope(float* vec, size_t n_heads, size_t head_dim, std::span<const double> freq, size_t pos);

// In place: x = exp(x - max) / sum. n >= 1.
void softmax(float* x, size_t n);

// x * sigmoid(x).
float silu(float x);

// out[i] = silu(gate[i]) * up[i]. out may alias gate or up.
void swiglu(float* out, const float* gate, const float* up, size_t n);

// out[i] += x[i]: the residual connection.
void add_inplace(float* out, const float* x, size_t n);

struct attention_shape {
    size_t n_head = 0;     // query heads
    size_t n_head_kv = 0;  // key/value heads; divides n_head
    size_t head_dim = 0;
};

// One query (n_head x head_dim) against the first n_kv positions of a layer's KV history
// (k_cache and v_cache: n_kv rows of n_head_kv * head_dim, position-major). Scores are scaled by
// 1/sqrt(head_dim) and softmaxed over the n_kv positions (the causal mask is "only the history
// so far"). scratch holds n_kv floats. out (n_head x head_dim) must not alias the inputs.
void attention(float* out, const float* q, const float* k_cache, const float* v_cache, size_t n_kv,
               const attention_shape& shape, float* scratch);

}  // namespace ordo::model
