// attention_split.glsl: how attention.comp's key splits combine, shared by attention.comp (which
// merges a token's splits in turn when one workgroup walks them all) and attention_merge.comp
// (which merges the partials the split grid wrote), so a token's output has the same bits
// either way (batch invariance: a decode step may run the split grid, a prefill the single
// workgroup).
//
// A token's keys 0..pos are cut into splits of p.split_keys keys (a multiple of the workgroup,
// fixed per runner: encode_attention's attention_batch::split_keys); split c is attended to
// with the online softmax over its tiles, giving (m_c, l_c, acc_c): the running max, the sum of
// exp(s - m_c), and the sum of exp(s - m_c) v per head dim. The state starts at (-inf, 0, 0)
// and takes the splits in order through split_merge; the output is acc / l (0 when l is 0). A
// context of one split is its state unchanged: the same bits as before splits existed.
struct split_state {
    float m;
    float l;
};

// Merges split (m_c, l_c) into (m, l) and returns the factors the accumulators take:
// acc = acc * f.x + acc_c * f.y. A split whose keys were all masked (m_c = -inf) changes
// nothing; the first real one is taken as it is.
vec2 split_merge(inout split_state st, float m_c, float l_c) {
    const float neg_inf = -1.0 / 0.0;
    if (m_c == neg_inf) return vec2(1.0, 0.0);
    if (st.m == neg_inf) {
        st.m = m_c;
        st.l = l_c;
        return vec2(0.0, 1.0);
    }
    precise float m_new = max(st.m, m_c);
    precise float a = exp(st.m - m_new);
    precise float b = exp(m_c - m_new);
    precise float la = st.l * a;
    precise float lb = l_c * b;
    precise float l_new = la + lb;
    st.m = m_new;
    st.l = l_new;
    return vec2(a, b);
}

// acc * f.x + acc_c * f.y with the factors of split_merge (the take-as-is cases exact).
float split_apply(float acc, float acc_c, vec2 f) {
    if (f.y == 0.0) return acc;
    if (f.x == 0.0) return acc_c;
    precise float x = acc * f.x;
    precise float y = acc_c * f.y;
    precise float s = x + y;
    return s;
}
