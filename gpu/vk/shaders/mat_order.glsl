// mat_order.glsl: the accumulation order of the mat-mul kernels, so that one output y[t][r] is
// bit-identical whichever kernel variant computed it, whatever the number of tokens in the
// dispatch and the token's place in it (batch invariance, gpu/PERF.md "Batch invariance").
//
// One order for every mat-mul kernel (since issue 28; before it the storage kernels summed K
// sequentially, which left a decode mat-vec one lane per row): the grouped order. K's units
// (weight_units.glsl: F32 4 elements, F16 and BF16 8, every block type 32: a Q8_0/Q4_0/Q4_1/
// Q5_0/Q5_1 block, a Q4_K/Q5_K sub-block, a pair of 16-element Q2_K/Q3_K/Q6_K sub-blocks, so a
// 256-element K-type super-block is 8 units) are dealt round-robin to ORDO_MAT_GROUPS = 8
// groups (unit u -> group u % 8). Group g's sum starts at 0 and takes its units in increasing
// order, each unit's 4-element parts in order, through mat_acc; then total = group 0, and
// total = mat_fold(total, group g) for g = 1..7. The shape depends on K alone, so any kernel
// may serve any token count and encode_mul_mat picks freely by token count and device:
// * mul_mat_vec.comp (storage, GPUs, 1..8 tokens): a team of 8 adjacent lanes per weight row,
//   lane g running group g, so a team's loads of one unit step are 8 consecutive texels (a
//   128-byte line for F16); the teams' group sums fold through shared memory.
// * mul_mat.comp (storage, more tokens): a workgroup tile walks the groups in turn, K-stepping
//   through one group's units, and folds each group's tile into the running total.
// * mul_mat_rows.comp (storage, CPU devices): one lane per row walks the groups in turn.
// * mul_mat_tx.comp (texel; tx1, tx1t2, tx1t4, tx4, txm): tx1 runs one group per lane and
//   folds through subgroup broadcasts; tx4/txm walk the groups in turn per lane.
// A unit past the end of K is never accumulated (not even as 0 * 0, which would turn a -0.0 sum
// into +0.0), so padding never changes a bit.
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

// mat_acc in two halves for kernels whose lanes share a group's work (mul_mat_vec's helpers):
// mat_add(acc, mat_part(w, x)) is mat_acc(acc, w, x), operation for operation, as the product
// does not depend on the accumulator (a float stored and read back is the same float).
float mat_part(vec4 w, vec4 x) {
    precise float d = fma(w.w, x.w, fma(w.z, x.z, fma(w.y, x.y, w.x * x.x)));
    return d;
}

float mat_add(float acc, float d) {
    precise float s = acc + d;
    return s;
}

float mat_fold(float total, float group_sum) {
    precise float s = total + group_sum;
    return s;
}
