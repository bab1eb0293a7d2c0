// rope.glsl: the rotation of RoPE pair j at a position, from the model's frequency table, for
// rope_kv.comp, rope_kv_tx.comp and mul_mat_vec.comp's ROPE store (the includer defines
// ROPE_FREQ_BINDING). The table's layout and
// why the angle is split this way are in abi.h (ORDO_ROPE_SPLIT_BITS): no pow() per lane (a
// software routine on llvmpipe), and sin/cos only ever see [-pi, pi].
// `precise` (SPIR-V NoContraction) on every product and sum: a compiler may not fuse them into
// fma differently in different kernels, so the three kernels that rotate (rope_kv.comp,
// rope_kv_tx.comp and mul_mat_vec.comp's ROPE store) give the same bits (batch invariance:
// decode's fused store and prefill's rope_kv run the same tokens).
layout(std430, binding = ROPE_FREQ_BINDING) readonly buffer rope_freq_buf { vec4 rope_turns[]; };

// (cos, sin) of pos * freq[j]; pos < 2^24 (k_llama_n_ctx_max), j < n_rot / 2.
vec2 rope_cos_sin(uint pos, uint j) {
    vec4 f = rope_turns[j];  // turns per position: f.x + f.y + f.z (f.x, f.y: 12 bits each)
    const uint low_mask = (1u << ORDO_ROPE_SPLIT_BITS) - 1u;
    float pos_hi = float(pos & ~low_mask);  // 12 significant bits
    float pos_lo = float(pos & low_mask);
    // The four 12 x 12-bit products are exact, so are their fractions; each sum stays below 2
    // turns, where a float's rounding is 1.2e-7 turns.
    precise float hx = pos_hi * f.x, lx = pos_lo * f.x, hy = pos_hi * f.y;
    precise float ly = pos_lo * f.y, pz = float(pos) * f.z;  // both below half a turn
    precise float t = fract(hx) + fract(lx);
    t = fract(t) + fract(hy);
    t = fract(t) + ly + pz;
    precise float a = (t - round(t)) * 6.28318530717958647692;  // [-pi, pi]
    return vec2(cos(a), sin(a));
}

// Pair x turned by the angle whose (cos, sin) is cs: the one expression every rope kernel uses.
vec2 rope_rotate(vec2 x, vec2 cs) {
    precise float a = x.x * cs.x, b = x.y * cs.y, c = x.x * cs.y, d = x.y * cs.x;
    precise vec2 r = vec2(a - b, c + d);
    return r;
}
