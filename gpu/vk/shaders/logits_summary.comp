// logits_summary.comp: the first of a logits row's two summary dispatches (abi.h
// logits_summary_push has the layout and the order): the summary of one chunk of a row, one
// workgroup per (chunk, row): its largest logit, its softmax normalisers below that maximum at
// temperature 1 and at the row's own temperature, and its ORDO_SUMMARY_TOP best candidates
// (ids counted from the row's start), written to the chunk's scratch row for
// logits_summary_merge.comp. The candidates are found exactly, in two stages. First a histogram
// of the logits by distance below the maximum (VALUE_BINS bins of 1/BINS_PER_NAT nat, counted in
// the normalisers' pass; entries further below are not counted) finds the bin b holding the
// TOP-th largest: every entry of a nearer bin is a candidate, and only bin b's entries are
// ranked further, so the shared-memory atomics of the next stage touch a few entries, not the
// chunk (logits share their top key bits: counting them all by key serialised most of the
// chunk onto a few bins). Then a radix select on bin b's order-preserving bit keys (8-bit
// passes, most significant first, stopping early once a digit's entries are exactly the ones
// still needed) finds the threshold key. A chunk whose TOP-th largest is further than the
// histogram reaches runs the radix select on every entry. The keys above the threshold are
// collected, the ties at it taken lowest id first (each lane owns a contiguous range of ids, so
// a prefix count over lanes ranks the ties in id order), and the TOP candidates are ranked
// against each other. Call site: gpu/vk/kernels.cpp encode_logits_summary() (the runner, after
// the logits head).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "abi.h"
#include "logits_summary.glsl"
layout(constant_id = 0) const uint WG = ORDO_SUMMARY_WG;  // must be ORDO_SUMMARY_WG (the order)
layout(local_size_x_id = 0) in;
layout(push_constant) uniform push_block { logits_summary_push p; };
layout(std430, binding = ORDO_B_SUMMARY_LOGITS) readonly buffer logits_buf { float logits[]; };
layout(std430, binding = ORDO_B_SUMMARY_TEMPS) readonly buffer temps_buf { float temps[]; };
layout(std430, binding = ORDO_B_SUMMARY_OUT) writeonly buffer out_buf { uint summary[]; };

const uint NW = ORDO_SUMMARY_WG;
const uint TOP = ORDO_SUMMARY_TOP;
const uint BINS = 256u;  // one radix digit of 8 bits; NW lanes clear them
// The first stage's histogram: VALUE_BINS bins of 1/BINS_PER_NAT nat below the maximum (16
// nats in all: a trained model's TOP-th candidate is nearly always nearer than that).
const uint VALUE_BINS = BINS;
const float BINS_PER_NAT = 16.0;
const uint FAR = VALUE_BINS;  // the bin of the entries the histogram does not reach

shared float red[NW];
shared uint red_bad[NW];  // an inf or NaN seen (ORDO_SUMMARY_NONFINITE), OR-ed over the lanes
shared float red_t[NW];
shared uint hist[BINS];
shared uint tie_rank[NW];
shared uint s_prefix;
shared uint s_mask;
shared uint s_need;
shared uint s_above;
shared uint s_bin;   // the value bin holding the TOP-th largest; FAR: the radix runs on all
shared bool s_done;  // the radix select's digit held exactly the keys still needed
shared uint cand_id[TOP];
shared uint cand_key[TOP];

// Which first-stage bin v falls in, `top` being the row's maximum: monotone (a larger logit is
// never in a further bin) and one expression everywhere, so each pass bins an entry the same
// way. NaN and entries VALUE_BINS / BINS_PER_NAT nats or more below are FAR.
uint value_bin(float v, float top) {
    precise float d = (top - v) * BINS_PER_NAT;
    return d < float(VALUE_BINS) ? uint(d) : FAR;
}

// v's bin as the second stage sees it, `bin` being the one it ranks: FAR for every entry when
// the select runs on all of them (bin FAR), so an entry is in scope exactly when this is bin.
uint stage_bin(float v, float top, uint bin) {
    return bin == FAR ? FAR : value_bin(v, top);
}

void main() {
    const uint lane = gl_LocalInvocationID.x;
    const uint row = gl_WorkGroupID.y;
    const uint lo = gl_WorkGroupID.x * p.chunk_len;  // the chunk's first id in its row
    const uint n = min(p.n_sample, lo + p.chunk_len) - lo;
    const uint base = p.logits_offset + row * p.logits_stride + lo;
    const uint o = (row * p.n_chunks + gl_WorkGroupID.x) * ORDO_SUMMARY_WORDS;

    // The largest logit (exact: max does not depend on the order), and whether any entry is an
    // inf or a NaN (an exponent of all ones).
    float m = uintBitsToFloat(0xFF800000u);  // -inf
    uint bad = 0u;
    for (uint i = lane; i < n; i += NW) {
        const float v = logits[base + i];
        m = max(m, v);
        bad |= (floatBitsToUint(v) & 0x7F800000u) == 0x7F800000u ? ORDO_SUMMARY_NONFINITE : 0u;
    }
    red[lane] = m;
    red_bad[lane] = bad;
    hist[lane] = 0u;  // NW == BINS lanes
    barrier();
    for (uint s = NW / 2u; s > 0u; s >>= 1) {
        if (lane < s) {
            red[lane] = max(red[lane], red[lane + s]);
            red_bad[lane] |= red_bad[lane + s];
        }
        barrier();
    }
    const float top = red[0];
    const uint nonfinite = red_bad[0];
    barrier();  // every lane has read red[0] before the sums reuse it

    // The normalisers, in the order fixed by n alone (abi.h), and the first stage's histogram
    // (hist was cleared before the maximum's barriers).
    const float t = temps[row];
    const float inv_t = t > 0.0 ? 1.0 / t : 0.0;
    const bool select = n > TOP;
    float sum = 0.0, sum_t = 0.0;
    for (uint i = lane; i < n; i += NW) {
        const float v = logits[base + i];
        precise float d = v - top;
        precise float dt = d * inv_t;
        sum = add_exact(sum, exp(d));
        sum_t = add_exact(sum_t, exp(dt));
        const uint vb = value_bin(v, top);
        if (select && vb != FAR) atomicAdd(hist[vb], 1u);
    }
    red[lane] = sum;
    red_t[lane] = sum_t;
    barrier();
    if (lane == 0u) {
        s_prefix = 0u;
        s_mask = 0u;
        s_need = min(TOP, n);
        s_above = 0u;
        s_done = false;
        s_bin = FAR;
        if (select) {
            // The nearest bin where the count from the maximum reaches TOP, if any; s_need
            // becomes how many of its entries are still to take.
            uint above = 0u;
            for (uint b = 0u; b < VALUE_BINS; b++) {
                const uint h = hist[b];
                if (above + h >= TOP) {
                    s_bin = b;
                    s_need = TOP - above;
                    s_done = h == s_need;  // the whole bin is taken: nothing to rank
                    break;
                }
                above += h;
            }
        }
    }
    barrier();
    for (uint s = NW / 2u; s > 0u; s >>= 1) {
        if (lane < s) {
            red[lane] = add_exact(red[lane], red[lane + s]);
            red_t[lane] = add_exact(red_t[lane], red_t[lane + s]);
        }
        barrier();
    }

    // The second stage: the threshold key among the entries in scope (bin s_bin's, or every
    // entry when s_bin is FAR), 8 bits a pass, most significant first. s_need counts the keys
    // still to take among those in scope matching the prefix so far. A pass whose digit holds
    // exactly s_need keys ends the select (s_done: every key in scope with at least the prefix
    // is taken); otherwise after the last pass s_need is how many of the keys equal to the
    // threshold are taken.
    const uint count = min(TOP, n);
    const uint bin = s_bin;
    for (uint pass = 0u; pass < 4u && select && !s_done; pass++) {
        const uint shift = 24u - 8u * pass;
        hist[lane] = 0u;
        barrier();
        const uint prefix = s_prefix, mask = s_mask;
        for (uint i = lane; i < n; i += NW) {
            const float v = logits[base + i];
            if (stage_bin(v, top, bin) != bin) continue;
            const uint k = key_of(v);
            if ((k & mask) == prefix) atomicAdd(hist[(k >> shift) & 255u], 1u);
        }
        barrier();
        if (lane == 0u) {
            // The digit where the count from the top reaches s_need (the keys matching the
            // prefix are at least s_need, so the walk stops at the latest at digit 0).
            const uint need = s_need;
            uint above = 0u, digit = 0u, held = 0u;
            for (uint b = BINS; b > 0u; b--) {
                const uint h = hist[b - 1u];
                if (above + h >= need) {
                    digit = b - 1u;
                    held = h;
                    break;
                }
                above += h;
            }
            s_need = need - above;
            s_done = held == s_need;
            s_prefix = prefix | (digit << shift);
            s_mask = mask | (255u << shift);
        }
        barrier();
    }
    const bool done = s_done;
    const uint prefix = s_prefix, mask = s_mask;
    const uint ties = !select ? count : (done ? 0u : s_need);
    const uint first_tie = count - ties;

    // Collect: the taken keys above the threshold in any order (ranked below), the ties at it
    // in id order (every entry is a tie when the row has at most TOP).
    const uint chunk = (n + NW - 1u) / NW;
    const uint i0 = min(n, lane * chunk), i1 = min(n, i0 + chunk);
    uint my_ties = 0u;
    for (uint i = i0; i < i1; i++) {
        const float v = logits[base + i];
        const uint k = key_of(v);
        const uint vb = stage_bin(v, top, bin);
        const bool scoped = vb == bin;
        if (!select || (scoped && !done && k == prefix)) {
            my_ties++;
        } else if (vb < bin || (scoped && (done ? (k & mask) >= prefix : k > prefix))) {
            const uint slot = atomicAdd(s_above, 1u);
            if (slot < TOP) {
                cand_id[slot] = i;
                cand_key[slot] = k;
            }
        }
    }
    tie_rank[lane] = my_ties;
    barrier();
    if (lane == 0u) {
        uint run = 0u;
        for (uint j = 0u; j < NW; j++) {
            const uint c = tie_rank[j];
            tie_rank[j] = run;
            run += c;
        }
    }
    barrier();
    uint rank = tie_rank[lane];
    for (uint i = i0; i < i1 && rank < ties; i++) {
        const float v = logits[base + i];
        const uint k = key_of(v);
        if (!select || (stage_bin(v, top, bin) == bin && k == prefix)) {
            cand_id[first_tie + rank] = i;
            cand_key[first_tie + rank] = k;
            rank++;
        }
    }
    barrier();

    // Rank the candidates: logit descending, the lower id first.
    if (lane < count) {
        const uint k = cand_key[lane], id = cand_id[lane];
        uint place = 0u;
        for (uint j = 0u; j < count; j++) {
            const uint kj = cand_key[j];
            place += (kj > k || (kj == k && cand_id[j] < id)) ? 1u : 0u;
        }
        summary[o + 4u + place] = lo + id;
        summary[o + 4u + TOP + place] = floatBitsToUint(logits[base + id]);
    } else if (lane < TOP) {
        summary[o + 4u + lane] = 0xFFFFFFFFu;
        summary[o + 4u + TOP + lane] = 0u;
    }
    if (lane == 0u) {
        summary[o] = floatBitsToUint(top);
        summary[o + 1u] = floatBitsToUint(red[0]);
        summary[o + 2u] = t > 0.0 ? floatBitsToUint(red_t[0]) : 0u;
        summary[o + 3u] = count | nonfinite;
    }
}
