// cpu_ops.cpp: reference operator implementations; each one is the formula in cpu_ops.hpp
// written out as a loop, so a reader can check it against the math line by line.
#include "model/cpu_ops.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>

#include "model/quant.hpp"

namespace ordo::model {

void rmsnorm(float* out, const float* x, const float* weight, size_t n, float eps) {
    assert(n > 0);
    float ss = 0.0f;
    for (size_t i = 0; i < n; ++i) ss += x[i] * x[i];
    const float scale = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
    for (size_t i = 0; i < n; ++i) out[i] = x[i] * scale * weight[i];
}

void matvec(float* out, const matrix_view& w, const float* x) {
    const size_t stride = row_bytes(w.type, w.n_in);
    assert(stride > 0 && "matvec on an unsupported type or a partial block");
    assert(w.data.size() >= stride * w.n_out);
    for (size_t r = 0; r < w.n_out; ++r) {
        out[r] = dot_row(w.type, w.data.data() + r * stride, x, w.n_in);
    }
}

void get_row(float* out, const matrix_view& w, size_t row) {
    const size_t stride = row_bytes(w.type, w.n_in);
    assert(stride > 0 && row < w.n_out);
    assert(w.data.size() >= stride * w.n_out);
    const status st = dequantize_row(w.type, w.data.data() + row * stride, out, w.n_in);
    assert(st.ok());
    (void)st;
}

void rope(float* vec, size_t n_heads, size_t head_dim, std::span<const double> freq, size_t pos) {
    assert(2 * freq.size() <= head_dim);
    for (size_t h = 0; h < n_heads; ++h) {
        float* v = vec + h * head_dim;
        for (size_t j = 0; j < freq.size(); ++j) {
            // Angle in double so the reference itself adds no error at large positions.
            const double theta = static_cast<double>(pos) * freq[j];
            const float c = static_cast<float>(std::cos(theta));
            const float s = static_cast<float>(std::sin(theta));
            const float x0 = v[2 * j];
            const float x1 = v[2 * j + 1];
            v[2 * j] = x0 * c - x1 * s;
            v[2 * j + 1] = x0 * s + x1 * c;
        }
    }
}

void softmax(float* x, size_t n) {
    assert(n > 0);
    const float max = *std::max_element(x, x + n);  // subtracting the max keeps exp finite
    float sum = 0.0f;
    for (size_t i = 0; i < n; ++i) {
        x[i] = std::exp(x[i] - max);
        sum += x[i];
    }
    for (size_t i = 0; i < n; ++i) x[i] /= sum;
}

float silu(float x) {
    return x / (1.0f + std::exp(-x));
}

void swiglu(float* out, const float* gate, const float* up, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = silu(gate[i]) * up[i];
}

void add_inplace(float* out, const float* x, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] += x[i];
}

void attention(float* out, const float* q, const float* k_cache, const float* v_cache, size_t n_kv,
               const attention_shape& shape, float* scratch) {
    assert(shape.n_head_kv > 0 && shape.n_head % shape.n_head_kv == 0);
    assert(n_kv > 0);
    const size_t group = shape.n_head / shape.n_head_kv;  // query heads per kv head
    const size_t kv_dim = shape.n_head_kv * shape.head_dim;
    const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
    for (size_t h = 0; h < shape.n_head; ++h) {
        const float* qh = q + h * shape.head_dim;
        const size_t kv_off = (h / group) * shape.head_dim;
        // scores over the history: q . k_t / sqrt(head_dim)
        for (size_t t = 0; t < n_kv; ++t) {
            const float* kt = k_cache + t * kv_dim + kv_off;
            float dot = 0.0f;
            for (size_t i = 0; i < shape.head_dim; ++i) dot += qh[i] * kt[i];
            scratch[t] = dot * scale;
        }
        softmax(scratch, n_kv);
        // weighted sum of values
        float* oh = out + h * shape.head_dim;
        std::fill(oh, oh + shape.head_dim, 0.0f);
        for (size_t t = 0; t < n_kv; ++t) {
            const float* vt = v_cache + t * kv_dim + kv_off;
            for (size_t i = 0; i < shape.head_dim; ++i) oh[i] += scratch[t] * vt[i];
        }
    }
}

}  // namespace ordo::model
