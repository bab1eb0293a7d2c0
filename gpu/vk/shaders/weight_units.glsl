// weight_units.glsl: every weight type's device layout and its dequantization from raw 16-byte
// words ("texels"), shared by both mat-mul kernel families and get_rows: mul_mat_tx.comp fetches
// the texels through a uniform texel buffer, weights.glsl (get_rows, mul_mat_vec, mul_mat,
// mul_mat_rows) loads them from a storage buffer, and both decode them with load_raw() and
// part() below, so a type's dequantization is this one function in every kernel. Every product
// in it is exact in float (model/quant.hpp says why), so the values equal the CPU reference's
// (model/quant.cpp) bit for bit, whatever a compiler fuses.
//
// The includer defines, before including this file, WTYPE (abi.h ORDO_WTYPE_*) and:
//   uvec4 w_fetch(uint t)  texel t of the bound weight chunk, counted from the chunk's start
//   uint w_aux_texel()     the texel where the chunk's aux region starts (32-element block types)
//
// The unit: UNIT elements of one row, PARTS parts of 4 (F32 4 elements, F16 and BF16 8, every
// block type 32: a legacy block, a K-type sub-block (Q4_K, Q5_K) or pair of 16-element
// sub-blocks (Q2_K, Q3_K, Q6_K), 8 units to a super-block). It is the unit of mat_order.glsl's
// grouped order. `ui` below is a unit's index in the chunk (row * units per row + unit in row).
//
// Chunk layouts (gpu/vk/weight_layout.cpp repacks GGUF rows into them at upload). Quant bits
// of a 32-element unit live in "planes" built so that part j (elements 4j .. 4j+3, element
// 4j + c in byte lane c) is one shift and one mask of one word:
//   nibble plane (16 B): byte i % 16 holds element i's 4 bits at bit 4 * (i / 16) (GGUF's Q4_0
//                        qs): part j is word j % 4 shifted by 4 * (j / 4).
//   2-bit plane (8 B):   element 4j + c's 2 bits at bit 8c + 2 * (j / 2) of word j % 2.
//   1-bit plane (4 B):   element 4j + c's bit at bit 8c + j.
//   F32:  rows x k floats, row-major (k % 8 == 0).      F16 / BF16: rows x k halves, the same.
//   Q8_0: rows x k int8 quants (32 per unit, two texels), then at the aux region the f16
//         scales, two per word (unit ui: word ui / 2, half ui % 2). x = q * d.
//   Q4_0: one nibble-plane texel per unit, then aux: f16 scales as Q8_0. x = (q - 8) * d.
//   Q4_1: nibble texels, then aux: one word per unit, d | m << 16 (halves). x = q * d + m.
//   Q5_0: nibble texels (low 4 bits), then aux: two words per unit, the 1-bit plane (bit 4)
//         and d (low half). x = (q - 16) * d. 24 B per block (GGUF: 22; one fetch less).
//   Q5_1: as Q5_0 with d | m << 16 in the second word. x = q * d + m.
//   Q4_K: per super-block 9 texels: GGUF's first 16 bytes (d, dmin, the 12 packed 6-bit
//         scales and mins), then units 0..7's nibble planes. x = (d * sc) * q - dmin * mn.
//   Q5_K: per super-block 11 texels: the same header, the 1-bit planes of units 0..3 and 4..7
//         (one word each), then the nibble planes. As Q4_K with q += 16 * bit.
//   Q6_K: per super-block 14 texels: two headers (units 0..3, 4..7: each unit's two int8
//         sub-block scales as bytes 2u, 2u + 1 of words x, y, counting u within the four; d in
//         word z), the 2-bit planes (bits 4, 5) of units 0..7 (two units per texel), then the
//         nibble planes (bits 0..3). x = (d * sc) * (q - 32), sc per 16 elements. 224 B per
//         super-block (GGUF: 210): three fetches per unit, as a separate d would take four.
//   Q3_K: per super-block 7 texels: GGUF's 12 scale bytes and d (word w, low half), the 1-bit
//         planes (bit 2) of units 0..3 and 4..7, then the 2-bit planes (bits 0, 1) of units
//         0..7, two per texel. x = (d * (v - 32)) * (q - 4), v a 6-bit scale per 16 elements.
//   Q2_K: per group of 4 super-blocks 21 texels: the 4 super-blocks' 16 scale bytes (sub-block
//         scale | min << 4), one texel holding their d | dmin << 16, then their 2-bit planes,
//         two units per texel. x = (d * sc) * q - dmin * mn, sc and mn per 16 elements. A chunk
//         is padded to whole groups.
// K-type rows are whole super-blocks (k % 256 == 0), so a super-block never spans two rows.

#if WTYPE == ORDO_WTYPE_F32
const uint UNIT = 4u;   // elements per unit
const uint PARTS = 1u;  // 4-element parts per unit
#elif WTYPE == ORDO_WTYPE_F16 || WTYPE == ORDO_WTYPE_BF16
const uint UNIT = 8u;
const uint PARTS = 2u;
#elif WTYPE <= ORDO_WTYPE_Q6_K
const uint UNIT = ORDO_QK;
const uint PARTS = 8u;
#else
#error "WTYPE: no such weight type"
#endif

// A unit's raw words, as load_raw gathers them: the quant planes, and the scale (x) and offset
// (y) of parts 0..3 and (z, w) of parts 4..7: x = q * scale + offset, the offset being minus
// the min (Q2_K, Q4_K, Q5_K), the min (Q4_1, Q5_1) or minus the bias times the scale (Q4_0:
// (q - 8) * d = q * d - 8 * d, exactly, as the result is representable).
struct unit_raw {
    uvec4 a;  // F32/F16/BF16: the elements; Q8_0: quants 0..15; Q2_K/Q3_K: a.xy the 2-bit plane;
              // the others: the nibble plane
    uvec4 b;  // Q8_0: quants 16..31; Q5_*, Q3_K: b.x the 1-bit plane; Q6_K: b.xy the 2-bit plane
    vec4 s;
};

float half_at(uvec4 t, uint i) {  // half i (0..7) of a texel
    return unpackHalf2x16(t[i >> 1u])[i & 1u];
}

// The byte lanes of a plane's part j (element 4j + c in the low bits of byte c).
uint nibble_lanes(uvec4 t, uint j) { return (t[j & 3u] >> (4u * (j >> 2u))) & 0x0F0F0F0Fu; }
uint bits2_lanes(uvec2 t, uint j) { return (t[j & 1u] >> (2u * (j >> 1u))) & 0x03030303u; }
uint bit_lanes(uint t, uint j) { return (t >> j) & 0x01010101u; }

// Byte lane c of w (values below 128) as a float, left in place: times 2^(8c). Masking in place
// saves the shift a lane would need (llvmpipe runs each lane's ops as its own vector
// instruction); lane_scale() undoes the 2^(8c) in the unit's scale, exactly (powers of two).
vec4 lanes_in_place(uint w) {
    return vec4(int(w & 0xFFu), int(w & 0xFF00u), int(w & 0xFF0000u), int(w & 0xFF000000u));
}
vec4 lane_scale(float s) { return s * vec4(1.0, 1.0 / 256.0, 1.0 / 65536.0, 1.0 / 16777216.0); }

// x = q * s + o for the 4 quants of byte-lane word w, exactly: q * s is exact (model/quant.hpp),
// and where o is a bias times s (o = -8 d for Q4_0's (q - 8) * d) the sum is exact too.
vec4 dequant(uint w, vec2 so) { return lanes_in_place(w) * lane_scale(so.x) + so.y; }

vec4 i8x4(uint w) {  // four signed bytes
    return vec4(bitfieldExtract(int(w), 0, 8), bitfieldExtract(int(w), 8, 8),
                bitfieldExtract(int(w), 16, 8), bitfieldExtract(int(w), 24, 8));
}

// Q4_K/Q5_K header: sub-block j's (d * scale, -dmin * min) from GGUF's packed 6-bit pairs
// (model/ggml_types.hpp k_scale_min_k4): bytes 0..3 (word y) hold the scales of 0..3, bytes
// 4..7 (z) their mins, bytes 8..11 (w) the low 4 bits of 4..7's, whose top 2 bits sit in the
// top bits of bytes 0..7.
vec2 k4_scale_min(uvec4 h, uint j) {
    uint b = 8u * (j & 3u);
    uint lo = (h.y >> b) & 255u, mid = (h.z >> b) & 255u, hi = (h.w >> b) & 255u;
    uint sc = j < 4u ? lo & 63u : (hi & 15u) | ((lo >> 6u) << 4u);
    uint mn = j < 4u ? mid & 63u : (hi >> 4u) | ((mid >> 6u) << 4u);
    vec2 dm = unpackHalf2x16(h.x);
    return vec2(dm.x * float(sc), -(dm.y * float(mn)));
}

// Q3_K: the 6-bit scale v (biased by 32) of 16-element sub-block 2j + t from GGUF's 12 bytes
// (words x, y, z): its low 4 bits are the low (2j + t < 8) or high nibble of byte (2j + t) % 8,
// its top 2 bits bits 2 * (j / 2) of byte 8 + (2j + t) % 4.
float k3_scale(uvec4 h, uint j, uint t) {
    uint lo = (h[(j & 3u) >> 1u] >> (16u * (j & 1u) + 8u * t + 4u * (j >> 2u))) & 15u;
    uint hi = (h.z >> (8u * (2u * (j & 1u) + t) + 2u * (j >> 1u))) & 3u;
    return float(int(lo | (hi << 4u)) - 32);
}

unit_raw load_raw(uint ui) {
    unit_raw w;
    w.b = uvec4(0u);
    w.s = vec4(1.0, 0.0, 1.0, 0.0);
#if WTYPE == ORDO_WTYPE_F32 || WTYPE == ORDO_WTYPE_F16 || WTYPE == ORDO_WTYPE_BF16
    w.a = w_fetch(ui);
#elif WTYPE == ORDO_WTYPE_Q8_0
    w.a = w_fetch(2u * ui);
    w.b = w_fetch(2u * ui + 1u);
    w.s.xz = vec2(half_at(w_fetch(w_aux_texel() + (ui >> 3u)), ui & 7u));
#elif WTYPE == ORDO_WTYPE_Q4_0
    w.a = w_fetch(ui);
    float d = half_at(w_fetch(w_aux_texel() + (ui >> 3u)), ui & 7u);
    w.s = vec4(d, -8.0 * d, d, -8.0 * d);
#elif WTYPE == ORDO_WTYPE_Q4_1
    w.a = w_fetch(ui);
    w.s = unpackHalf2x16(w_fetch(w_aux_texel() + (ui >> 2u))[ui & 3u]).xyxy;
#elif WTYPE == ORDO_WTYPE_Q5_0 || WTYPE == ORDO_WTYPE_Q5_1
    w.a = w_fetch(ui);
    uvec4 aux = w_fetch(w_aux_texel() + (ui >> 1u));
    uvec2 hd = (ui & 1u) != 0u ? aux.zw : aux.xy;
    w.b.x = hd.x;
#if WTYPE == ORDO_WTYPE_Q5_0
    float d = unpackHalf2x16(hd.y).x;
    w.s = vec4(d, -16.0 * d, d, -16.0 * d);
#else
    w.s = unpackHalf2x16(hd.y).xyxy;
#endif
#elif WTYPE == ORDO_WTYPE_Q4_K || WTYPE == ORDO_WTYPE_Q5_K
    uint sb = ui >> 3u, j = ui & 7u;
#if WTYPE == ORDO_WTYPE_Q4_K
    uint base = sb * 9u;
    w.a = w_fetch(base + 1u + j);
#else
    uint base = sb * 11u;
    w.b.x = w_fetch(base + 1u + (j >> 2u))[j & 3u];
    w.a = w_fetch(base + 3u + j);
#endif
    w.s = k4_scale_min(w_fetch(base), j).xyxy;
#elif WTYPE == ORDO_WTYPE_Q6_K
    uint sb = ui >> 3u, j = ui & 7u, base = sb * 14u;
    uvec4 h = w_fetch(base + (j >> 2u));
    uvec4 hb = w_fetch(base + 2u + (j >> 1u));
    w.b.xy = (j & 1u) != 0u ? hb.zw : hb.xy;
    w.a = w_fetch(base + 6u + j);
    uint sc = h[(j & 3u) >> 1u] >> (16u * (j & 1u));  // bytes: scale of elements 0..15, 16..31
    float d = unpackHalf2x16(h.z).x;
    w.s.x = d * float(bitfieldExtract(int(sc), 0, 8));
    w.s.z = d * float(bitfieldExtract(int(sc), 8, 8));
    w.s.yw = -32.0 * w.s.xz;
#elif WTYPE == ORDO_WTYPE_Q3_K
    uint sb = ui >> 3u, j = ui & 7u, base = sb * 7u;
    uvec4 h = w_fetch(base);
    w.b.x = w_fetch(base + 1u + (j >> 2u))[j & 3u];
    uvec4 lo = w_fetch(base + 3u + (j >> 1u));
    w.a.xy = (j & 1u) != 0u ? lo.zw : lo.xy;
    float d = unpackHalf2x16(h.w).x;
    w.s.xz = vec2(d * k3_scale(h, j, 0u), d * k3_scale(h, j, 1u));
    w.s.yw = -4.0 * w.s.xz;
#elif WTYPE == ORDO_WTYPE_Q2_K
    uint sb = ui >> 3u, j = ui & 7u, base = (sb >> 2u) * 21u;
    uint sc = w_fetch(base + (sb & 3u))[j >> 1u] >> (16u * (j & 1u));  // two scale|min bytes
    vec2 dm = unpackHalf2x16(w_fetch(base + 4u)[sb & 3u]);
    uvec4 q = w_fetch(base + 5u + 4u * (sb & 3u) + (j >> 1u));
    w.a.xy = (j & 1u) != 0u ? q.zw : q.xy;
    w.s = vec4(dm.x * float(sc & 15u), -(dm.y * float((sc >> 4u) & 15u)),
               dm.x * float((sc >> 8u) & 15u), -(dm.y * float((sc >> 12u) & 15u)));
#endif
    return w;
}

// Dequantized elements [4j, 4j + 4) of the unit (j < PARTS).
vec4 part(unit_raw w, uint j) {
    vec2 so = j < 4u ? w.s.xy : w.s.zw;  // this half's scale and offset
#if WTYPE == ORDO_WTYPE_F32
    return uintBitsToFloat(w.a);
#elif WTYPE == ORDO_WTYPE_F16
    return j == 0u ? vec4(unpackHalf2x16(w.a.x), unpackHalf2x16(w.a.y))
                   : vec4(unpackHalf2x16(w.a.z), unpackHalf2x16(w.a.w));
#elif WTYPE == ORDO_WTYPE_BF16
    uvec2 h = j == 0u ? w.a.xy : w.a.zw;  // BF16 is the top half of an f32
    return uintBitsToFloat(uvec4(h.x << 16u, h.x & 0xFFFF0000u, h.y << 16u, h.y & 0xFFFF0000u));
#elif WTYPE == ORDO_WTYPE_Q8_0
    return i8x4(j < 4u ? w.a[j] : w.b[j - 4u]) * so.x;
#elif WTYPE == ORDO_WTYPE_Q4_0 || WTYPE == ORDO_WTYPE_Q4_1 || WTYPE == ORDO_WTYPE_Q4_K
    return dequant(nibble_lanes(w.a, j), so);
#elif WTYPE == ORDO_WTYPE_Q5_0 || WTYPE == ORDO_WTYPE_Q5_1 || WTYPE == ORDO_WTYPE_Q5_K
    return dequant(nibble_lanes(w.a, j) | (bit_lanes(w.b.x, j) << 4u), so);
#elif WTYPE == ORDO_WTYPE_Q6_K
    return dequant(nibble_lanes(w.a, j) | (bits2_lanes(w.b.xy, j) << 4u), so);
#elif WTYPE == ORDO_WTYPE_Q3_K
    return dequant(bits2_lanes(w.a.xy, j) | (bit_lanes(w.b.x, j) << 2u), so);
#elif WTYPE == ORDO_WTYPE_Q2_K
    return dequant(bits2_lanes(w.a.xy, j), so);
#endif
}
