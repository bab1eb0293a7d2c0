// norm_order.glsl: the operations of RMSNorm, so that a normed row is bit-identical whichever
// kernel normed it: rms_norm.comp (a dispatch of its own: prefill, the texel-less paths) or
// mul_mat_vec.comp's fused input norm (decode on GPUs: mul_mat_vec_norm_*, mul_mat_vec_glu_*).
//
// The sum of squares of a row of n elements has one shape, fixed by n alone:
// ORDO_NORM_PARTS = 64 partial sums, partial j starting at 0 and taking x[j]^2, x[j + 64]^2, ...
// in order through norm_sq_add; then the fixed pairwise tree partial[j] = norm_fold(partial[j],
// partial[j + s]) for s = 32, 16, ..., 1 (every lane count runs the same tree; a workgroup of
// fewer lanes takes several partials each). inv = norm_inv(partial[0], n, eps), and the
// output element is norm_apply(x, inv, w) = (x * inv) * w. `precise` (SPIR-V NoContraction)
// keeps the compiler from fusing x * x into the add or reordering, so two kernels compiled
// apart compute the same operations (mat_order.glsl says the same for the mat-muls).
float norm_sq_add(float sum, float v) {
    precise float sq = v * v;
    precise float s = sum + sq;
    return s;
}

float norm_fold(float a, float b) {
    precise float s = a + b;
    return s;
}

float norm_inv(float total, uint n, float eps) {
    precise float mean = total / float(n);
    precise float a = mean + eps;
    return inversesqrt(a);
}

vec4 norm_apply(vec4 x, float inv, vec4 w) {
    precise vec4 xi = x * inv;
    precise vec4 o = xi * w;
    return o;
}

float norm_apply1(float x, float inv, float w) {
    precise float xi = x * inv;
    precise float o = xi * w;
    return o;
}

// SwiGLU's output element (swiglu.comp, swiglu_tx.comp, mul_mat_vec_glu_*): silu(g) * u.
float silu_mul(float g, float u) {
    precise float e = 1.0 + exp(-g);
    precise float s = g / e;
    precise float o = s * u;
    return o;
}
