// logits_summary.glsl: what logits_summary.comp and logits_summary_merge.comp share: the
// candidates' order key and the sums' exact addition.

// Larger float -> larger key; -0.0 is +0.0's key, so keys are equal exactly when the floats
// compare equal (NaN aside), as the host's order (logit descending, id ascending) has them.
uint key_of(float v) {
    uint b = floatBitsToUint(v);
    if (b == 0x80000000u) b = 0u;
    return (b & 0x80000000u) != 0u ? ~b : (b | 0x80000000u);
}

float add_exact(float a, float b) {
    precise float s = a + b;
    return s;
}
