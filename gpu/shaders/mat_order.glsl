// mat_order.glsl: the one accumulation order of every mat-mul kernel (mul_mat_tx.comp,
// mul_mat_rows.comp, mul_mat.comp), so that one output y[t][r] is bit-identical whichever
// kernel or variant computed it, whatever the number of tokens in the dispatch and the token's
// place in it (batch invariance, gpu/PERF.md "Batch invariance"). Used by those three shaders;
// mul_mat_vec.comp splits K over lanes and has its own order (mat_path::vec is never picked
// automatically).
//
// The order, per output: acc = 0; for each 4-element part of K in increasing order,
//   acc = acc + fma(w3, x3, fma(w2, x2, fma(w1, x1, w0 * x0)))
// `precise` (SPIR-V NoContraction) forbids the compiler from fusing, splitting or reordering
// these operations differently in different kernels; GLSL defines a precise fma() as one
// operation computed the same way everywhere, so the result is fixed by construction. The acc
// chain is one add per part: the four products of the next part do not wait for it.
float mat_acc(float acc, vec4 w, vec4 x) {
    precise float d = fma(w.w, x.w, fma(w.z, x.z, fma(w.y, x.y, w.x * x.x)));
    precise float s = acc + d;
    return s;
}
