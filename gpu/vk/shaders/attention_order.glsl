// attention_order.glsl: the arithmetic of one split's online softmax, shared by attention.comp
// (a workgroup per query) and attention_flash.comp (a workgroup per tile of queries), so a
// query's output has the same bits whichever kernel ran it (batch invariance). `precise`
// (SPIR-V NoContraction) and explicit fma() fix each operation, so no compiler may fuse or
// reorder them differently in the two kernels.
//
// Within a split, a query's keys come in tiles of the attention workgroup's size, starting at
// the split's first key. For each tile, in key order:
//   score s_j = sum over pairs d = 0, 2, ... of attn_score_step (q pre-scaled by 1/sqrt(hd));
//   m' = max(m, s_j over the tile); when m' > -inf: c = exp(m - m'), l = l * c, acc = acc * c,
//   then for each key j in order: p = exp(s_j - m'), l = l + p, acc = fma(p, v_j, acc).
float attn_score_step(float s, vec2 q, vec2 k) {
    precise float d = fma(q.y, k.y, q.x * k.x);
    precise float r = s + d;
    return r;
}

float attn_exp(float s, float m) {
    precise float x = s - m;
    precise float e = exp(x);
    return e;
}

float attn_scale(float x, float c) {
    precise float r = x * c;
    return r;
}

float attn_sum(float l, float p) {
    precise float r = l + p;
    return r;
}

float attn_acc(float acc, float p, float v) {
    precise float r = fma(p, v, acc);
    return r;
}
