// get_rows.comp: embedding lookup (token ids -> F32 rows) for tables of every weight type; also
// gathers activation rows for the logits head. Call site: gpu/vk/kernels.cpp encode_get_rows().
// Grid: x = 8-element units of a row (strided), y = id. A table larger than one binding is
// split into row chunks; each dispatch binds one chunk and skips ids outside it.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "abi.h"
layout(local_size_x_id = 0) in;
layout(push_constant) uniform push_block { get_rows_push p; };
#include "weights.glsl"
layout(std430, binding = ORDO_B_GET_ROWS_IDS) readonly buffer ids_buf { int ids[]; };
layout(std430, binding = ORDO_B_GET_ROWS_OUT) writeonly buffer out_buf { float dst[]; };

void main() {
    uint i = gl_WorkGroupID.y;
    int id = ids[p.ids_offset + i];
    if (id < int(p.row_begin) || id >= int(p.row_begin + p.row_count)) {
        return;
    }
    uint row = uint(id) - p.row_begin;
    uint units = p.n_cols / 8u;
    uint step = gl_WorkGroupSize.x * gl_NumWorkGroups.x;
    for (uint u = gl_GlobalInvocationID.x; u < units; u += step) {
        vec4 lo, hi;
        load_unit(row, u, p.n_cols, lo, hi);
        uint o = p.out_offset + i * p.out_stride + u * 8u;
        for (uint c = 0; c < 4u; ++c) {
            dst[o + c] = lo[c];
            dst[o + 4u + c] = hi[c];
        }
    }
}
