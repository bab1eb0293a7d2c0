// weights.glsl: the weight-chunk binding and the dequantizing loader shared by get_rows.comp,
// mul_mat_vec.comp and mul_mat.comp. WTYPE picks the element type (abi.h ORDO_WTYPE_*).
//
// Chunk layouts (written by gpu/vk/weights.cpp, which repacks GGUF blocks at upload):
//   F32:  rows x k floats, row-major (k % 8 == 0).
//   F16:  rows x k halves, row-major (k % 8 == 0).
//   Q8_0: rows x k int8 quants (block order, 32 per block), then at word scale_offset the
//         rows x k/32 f16 scales, two per word. Splitting quants from scales keeps every
//         quant load 4-byte aligned (GGUF's 34-byte blocks are not).
//   Q4_0: rows x k/2 bytes (16 per block: low nibbles = elements 0..15, high = 16..31), then the
//         f16 scales as for Q8_0. Value = (q - 8) * d.
// The loader's unit is 8 consecutive elements (two vec4) of one row: all types alike.
layout(std430, binding = ORDO_B_MM_W) readonly buffer weight_words { uint w1[]; };
layout(std430, binding = ORDO_B_MM_W) readonly buffer weight_words2 { uvec2 w2[]; };
layout(std430, binding = ORDO_B_MM_W) readonly buffer weight_words4 { uvec4 w4[]; };

float w_scale(uint block) {
    return unpackHalf2x16(w1[p.scale_offset + (block >> 1)])[block & 1u];
}

vec4 i8x4(uint word) {
    return vec4(bitfieldExtract(int(word), 0, 8), bitfieldExtract(int(word), 8, 8),
                bitfieldExtract(int(word), 16, 8), bitfieldExtract(int(word), 24, 8));
}

vec4 u4x4(uint word) {  // four nibbles at bit 0, 8, 16, 24
    return vec4(word & 15u, (word >> 8) & 15u, (word >> 16) & 15u, (word >> 24) & 15u);
}

// Elements [8u, 8u + 8) of row `row` (of `k` elements) of the bound chunk.
void load_unit(uint row, uint u, uint k, out vec4 lo, out vec4 hi) {
    uint e = row * k + u * 8u;  // flat element index
#if WTYPE == 0
    lo = uintBitsToFloat(w4[e >> 2]);
    hi = uintBitsToFloat(w4[(e >> 2) + 1u]);
#elif WTYPE == 1
    uvec4 h = w4[e >> 3];
    lo = vec4(unpackHalf2x16(h.x), unpackHalf2x16(h.y));
    hi = vec4(unpackHalf2x16(h.z), unpackHalf2x16(h.w));
#elif WTYPE == 2
    uvec2 q = w2[e >> 3];
    float d = w_scale(e >> 5);
    lo = i8x4(q.x) * d;
    hi = i8x4(q.y) * d;
#elif WTYPE == 3
    uint block = e >> 5;
    uint j = (e >> 3) & 3u;              // which 8-element unit of the block
    uvec2 q = w2[block * 2u + (j & 1u)];  // bytes (j&1)*8 .. +7 of the block's 16
    uint shift = (j >> 1) * 4u;           // units 2, 3 are the high nibbles
    float d = w_scale(block);
    lo = (u4x4(q.x >> shift) - 8.0) * d;
    hi = (u4x4(q.y >> shift) - 8.0) * d;
#else
#error "WTYPE must be 0..3"
#endif
}
