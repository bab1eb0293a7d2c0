// mat_order.glsl: the accumulation order of the mat-mul kernels, so that one output y[t][r] is
// bit-identical whichever kernel variant computed it, whatever the number of tokens in the
// dispatch and the token's place in it (batch invariance, gpu/PERF.md "Batch invariance").
//
// Two kernel families, each with one order; encode_mul_mat's automatic path picks one family
// per weight for good (texel kernels where the runner's buffers have texel views, else the
// others), so a weight's outputs never mix them:
// * mul_mat_tx.comp (tx1, tx4, txm): the grouped order. K's units (weight_units.glsl: F32 4
//   elements, F16 and BF16 8, every block type 32: a Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 block, a
//   Q4_K/Q5_K sub-block, a pair of 16-element Q2_K/Q3_K/Q6_K sub-blocks, so a 256-element
//   K-type super-block is 8 units and tx1's 8 lanes split K evenly for every n_embd that is a
//   multiple of 256) are dealt round-robin to ORDO_MAT_GROUPS = 8 groups (unit u ->
//   group u % 8). Group g's sum starts at 0 and takes its units in increasing order, each
//   unit's 4-element parts in order, through mat_acc; then total = group 0, and
//   total = mat_fold(total, group g) for g = 1..7. tx1 runs one group per lane and folds
//   through subgroup broadcasts; tx4/txm loop over the groups per lane.
// * mul_mat_rows.comp and mul_mat.comp: the sequential order, acc = 0 then mat_acc over K's
//   4-element parts in increasing order (every type alike: no unit enters it). (mul_mat_vec.comp splits K over lanes its own way and
//   is never picked automatically.)
//
// mat_acc: acc = acc + fma(w3, x3, fma(w2, x2, fma(w1, x1, w0 * x0))). `precise` (SPIR-V
// NoContraction) forbids the compiler from fusing, splitting or reordering these operations
// differently in different kernels; GLSL defines a precise fma() as one operation computed the
// same way everywhere, so the result is fixed by construction. The acc chain is one add per
// part: the four products of the next part do not wait for it.
float mat_acc(float acc, vec4 w, vec4 x) {
    precise float d = fma(w.w, x.w, fma(w.z, x.z, fma(w.y, x.y, w.x * x.x)));
    precise float s = acc + d;
    return s;
}

float mat_fold(float total, float group_sum) {
    precise float s = total + group_sum;
    return s;
}
