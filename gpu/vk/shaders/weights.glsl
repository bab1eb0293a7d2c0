// weights.glsl: the weight-chunk binding and the dequantizing loader of the storage-buffer
// kernels (get_rows.comp, mul_mat_vec.comp, mul_mat.comp, mul_mat_rows.comp). WTYPE picks the
// type (abi.h ORDO_WTYPE_*). The chunk layouts and each type's dequantization are
// weight_units.glsl's, which mul_mat_tx.comp shares: this file only says where a texel is.
// The includer's push block has scale_offset: the word offset of the chunk's aux region.
layout(std430, binding = ORDO_B_MM_W) readonly buffer weight_words4 { uvec4 w4[]; };

uvec4 w_fetch(uint t) { return w4[t]; }
uint w_aux_texel() { return p.scale_offset >> 2u; }

#include "weight_units.glsl"

// Elements [8u, 8u + 8) of row `row` (of `k` elements) of the bound chunk: two parts of one
// unit (F32: two units).
void load_unit(uint row, uint u, uint k, out vec4 lo, out vec4 hi) {
    uint e = row * k + u * 8u;  // flat element index
#if WTYPE == ORDO_WTYPE_F32
    lo = part(load_raw(e >> 2u), 0u);
    hi = part(load_raw((e >> 2u) + 1u), 0u);
#else
    unit_raw w = load_raw(e / UNIT);
    uint j = (e % UNIT) >> 2u;
    lo = part(w, j);
    hi = part(w, j + 1u);
#endif
}
