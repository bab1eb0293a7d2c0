// logits_summary_merge.comp: the second of a logits row's two summary dispatches (abi.h
// logits_summary_push has the layout and the order): a row's summary from its chunks'
// summaries (logits_summary.comp), one workgroup per row. The maximum is the chunks' largest;
// each normaliser is the chunks' sums added in chunk order, each scaled by exp((chunk max - m)
// / T) (a chunk holding the maximum adds its sum as it is). The row's best TOP candidates are
// among its chunks' (a chunk's list holds every entry of the chunk that beats any of its
// members, or TOP of them): every chunk candidate finds its place in the row as its place in its
// own chunk plus, for each other chunk, how many of that chunk's sorted candidates beat it (a
// binary search: they are a prefix), stopping once that reaches TOP; the candidates placed under
// the row's count are written there. The row's inf/NaN flag is any chunk's. Exact: a candidate
// of the row's best TOP is beaten only by candidates of the best TOP, which their chunks list.
// Call site: gpu/vk/kernels.cpp encode_logits_summary().
#version 450
#extension GL_GOOGLE_include_directive : require
#include "abi.h"
#include "logits_summary.glsl"
layout(constant_id = 0) const uint WG = ORDO_SUMMARY_WG;
layout(local_size_x_id = 0) in;
layout(push_constant) uniform push_block { logits_summary_push p; };
layout(std430, binding = ORDO_B_SUMMARY_LOGITS) readonly buffer chunks_buf { uint chunks[]; };
layout(std430, binding = ORDO_B_SUMMARY_TEMPS) readonly buffer temps_buf { float temps[]; };
layout(std430, binding = ORDO_B_SUMMARY_OUT) writeonly buffer out_buf { uint summary[]; };

const uint TOP = ORDO_SUMMARY_TOP;
const uint WORDS = ORDO_SUMMARY_WORDS;
shared uint s_key[ORDO_SUMMARY_CHUNKS_MAX * TOP];
shared uint s_id[ORDO_SUMMARY_CHUNKS_MAX * TOP];
shared uint s_count[ORDO_SUMMARY_CHUNKS_MAX];

// e beats x: a larger logit, or an equal one at a lower id (the summary's order).
bool beats(uint e_key, uint e_id, uint key, uint id) {
    return e_key > key || (e_key == key && e_id < id);
}

void main() {
    const uint lane = gl_LocalInvocationID.x;
    const uint row = gl_WorkGroupID.x;
    const uint nc = p.n_chunks;
    const uint in0 = row * nc * WORDS;
    const uint o = row * WORDS;
    const uint count = min(TOP, p.n_sample);

    for (uint j = lane; j < nc * TOP; j += WG) {
        const uint c = j / TOP, k = j % TOP, at = in0 + c * WORDS;
        if (k == 0u) s_count[c] = chunks[at + 3u] & ~ORDO_SUMMARY_NONFINITE;
        s_id[j] = chunks[at + 4u + k];
        s_key[j] = key_of(uintBitsToFloat(chunks[at + 4u + TOP + k]));
    }
    barrier();

    for (uint j = lane; j < nc * TOP; j += WG) {
        const uint c = j / TOP, k = j % TOP;
        if (k >= s_count[c]) continue;
        const uint key = s_key[j], id = s_id[j];
        uint place = k;
        for (uint c2 = 0u; c2 < nc && place < count; c2++) {
            if (c2 == c) continue;
            uint lo = 0u, hi = s_count[c2];
            while (lo < hi) {
                const uint mid = (lo + hi) / 2u;
                if (beats(s_key[c2 * TOP + mid], s_id[c2 * TOP + mid], key, id)) {
                    lo = mid + 1u;
                } else {
                    hi = mid;
                }
            }
            place += lo;
        }
        if (place < count) {
            summary[o + 4u + place] = id;
            summary[o + 4u + TOP + place] = chunks[in0 + c * WORDS + 4u + TOP + k];
        }
    }
    if (lane >= count && lane < TOP) {
        summary[o + 4u + lane] = 0xFFFFFFFFu;
        summary[o + 4u + TOP + lane] = 0u;
    }

    if (lane == 0u) {
        uint nonfinite = 0u;  // any chunk's flag
        for (uint c = 0u; c < nc; c++) nonfinite |= chunks[in0 + c * WORDS + 3u];
        nonfinite &= ORDO_SUMMARY_NONFINITE;
        float top = uintBitsToFloat(chunks[in0]);
        for (uint c = 1u; c < nc; c++) top = max(top, uintBitsToFloat(chunks[in0 + c * WORDS]));
        const float t = temps[row];
        const float inv_t = t > 0.0 ? 1.0 / t : 0.0;
        float sum = 0.0, sum_t = 0.0;
        for (uint c = 0u; c < nc; c++) {
            const uint at = in0 + c * WORDS;
            const float m = uintBitsToFloat(chunks[at]);
            const float s = uintBitsToFloat(chunks[at + 1u]);
            const float st = uintBitsToFloat(chunks[at + 2u]);
            if (m == top) {
                sum = add_exact(sum, s);
                sum_t = add_exact(sum_t, st);
            } else {
                precise float d = m - top;
                precise float dt = d * inv_t;
                precise float scaled = s * exp(d);
                precise float scaled_t = st * exp(dt);
                sum = add_exact(sum, scaled);
                sum_t = add_exact(sum_t, scaled_t);
            }
        }
        summary[o] = floatBitsToUint(top);
        summary[o + 1u] = floatBitsToUint(sum);
        summary[o + 2u] = t > 0.0 ? floatBitsToUint(sum_t) : 0u;
        summary[o + 3u] = count | nonfinite;
    }
}
