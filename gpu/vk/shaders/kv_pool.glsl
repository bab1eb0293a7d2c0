// kv_pool.glsl: one layer's K and V views of the paged KV pool, for kv_write.comp and
// attention.comp. KV_F16 = 1 stores halves packed two per word (head_dim is even); else floats.
// Element (block, head, slot, d) sits at ((block * n_head_kv + head) * block_tokens + slot)
// * head_dim + d, see abi.h.
#if KV_F16
layout(std430, binding = KV_BINDING_K) buffer k_buf { uint kw[]; };
layout(std430, binding = KV_BINDING_V) buffer v_buf { uint vw[]; };
float k_at(uint e) { return unpackHalf2x16(kw[e >> 1])[e & 1u]; }
float v_at(uint e) { return unpackHalf2x16(vw[e >> 1])[e & 1u]; }
vec2 k_pair(uint e) { return unpackHalf2x16(kw[e >> 1]); }  // e even
void k_store_pair(uint e, vec2 v) { kw[e >> 1] = packHalf2x16(v); }
void v_store_pair(uint e, vec2 v) { vw[e >> 1] = packHalf2x16(v); }
#else
layout(std430, binding = KV_BINDING_K) buffer k_buf { float kf[]; };
layout(std430, binding = KV_BINDING_V) buffer v_buf { float vf[]; };
float k_at(uint e) { return kf[e]; }
float v_at(uint e) { return vf[e]; }
vec2 k_pair(uint e) { return vec2(kf[e], kf[e + 1u]); }
void k_store_pair(uint e, vec2 v) { kf[e] = v.x; kf[e + 1u] = v.y; }
void v_store_pair(uint e, vec2 v) { vf[e] = v.x; vf[e + 1u] = v.y; }
#endif
