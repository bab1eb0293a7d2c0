// abi.h: the one declaration of every push-constant struct, binding index and shared constant
// used by the compute shaders (gpu/vk/shaders/*.comp include it as GLSL) and by their encoders
// (gpu/vk/kernels.cpp includes it as C++). Members are 32-bit scalars only, so GLSL's std430
// push-constant layout and the C++ layout are identical; gpu/vk/pipelines.cpp static_asserts sizes.
//
// Conventions: element offsets and strides are in elements of the binding (floats for
// activations), so sub-views never need descriptor-offset alignment. Specialization constant 0
// is always the workgroup size (chosen per device in gpu/vk/pipelines.cpp).
#ifndef ORDO_GPU_ABI_H
#define ORDO_GPU_ABI_H

#ifdef __cplusplus
#include <cstdint>
namespace ordo::gpu::abi {
using uint = std::uint32_t;
#define ORDO_ABI_CONST constexpr uint
#else
#define ORDO_ABI_CONST const uint
#endif

// Weight element types (WTYPE define of the get_rows / mul_mat_* variants): ORDO_WTYPE_<NAME>
// is the type's index in gpu/vk/shaders/weight_types.h, the one list. The shaders get them as
// -D defines from gpu/vk/CMakeLists.txt (so they can select code with #if on them); C++ gets
// these constants. Device layouts: gpu/vk/shaders/weight_units.glsl.
#ifdef __cplusplus
#include "weight_types.h"
enum wtype_index : uint {
#define ORDO_WTYPE_INDEX(NAME, name, ...) ORDO_WTYPE_##NAME,
    ORDO_WEIGHT_TYPE_LIST(ORDO_WTYPE_INDEX)
#undef ORDO_WTYPE_INDEX
    ORDO_WTYPE_COUNT
};
#endif
// Elements per quant block (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1), and the unit of every block type
// in the kernels (a K-type super-block is ORDO_QK_K / ORDO_QK units).
ORDO_ABI_CONST ORDO_QK = 32;
ORDO_ABI_CONST ORDO_QK_K = 256;  // elements per K-type super-block (Q2_K .. Q6_K)

// mul_mat_vec: the most columns (tokens) accumulated together per pass over the weights (every
// token count it serves: kernels.hpp mat_vec_tokens_max); each count has its own variant.
ORDO_ABI_CONST ORDO_MMV_COLS = 8;
// mul_mat_rows: tokens accumulated together per pass over a weight row.
ORDO_ABI_CONST ORDO_ROWS_COLS = 8;
// mul_mat_tx (texel-fetch mat-mul, the lavapipe fast path). Summation order (mat_order.glsl):
// K's units (F32 4 elements, F16/BF16 8, every block type 32: a legacy block, a K-type sub-block
// pair or sub-block) are dealt to ORDO_MAT_GROUPS
// groups round-robin (unit u -> group u % 8); each group is summed on its own, then the group
// sums are added in group order. Variants by token count: tx1 (1 token: decode) gives each of
// 8 lanes one group and keeps that lane's activations in registers for all the workgroup's
// ORDO_TX1_ROWS rows: one weight-texel gather per unit, no activation gather (K is a
// specialization constant so the activation cache is indexed statically; K above
// ORDO_TX1_UNITS_MAX units per lane falls back to tx4). tx4 (2..8 tokens; the name predates
// T = 8) and txm (more: many sequences, prefill): each lane owns R rows x T tokens and walks
// the groups in turn; per lane and K unit a tile costs R weight + T x PARTS activation texel
// gathers for 8 R T multiply-adds (F16), and on llvmpipe the gathers, not the (spilled)
// accumulators, set the price (gpu/PERF.md).
ORDO_ABI_CONST ORDO_MAT_GROUPS = 8;
// tx1 workgroup = one subgroup of 8 x teams lanes; each team of 8 runs the 8 groups.
ORDO_ABI_CONST ORDO_TX1_ROWS = 32;  // weight rows per tx1 workgroup
ORDO_ABI_CONST ORDO_TX1_UNITS_MAX = 128;  // activation units a tx1 lane keeps in registers
// Tokens the split-K variants serve (tx1: 1, tx1t2: 2, tx1t4: 3..4; each token's units are
// cached); more go to tx4/txm.
ORDO_ABI_CONST ORDO_TX1_TOKENS_MAX = 4;
// tx4/txm rows per lane at 8 lanes (more lanes: fewer rows, 128 rows per workgroup).
ORDO_ABI_CONST ORDO_TX_TILE_ROWS = 128;
// The narrower workgroup row tile (12 rows per lane at 8 lanes), picked for a weight chunk when
// it pads the chunk's rows less: 288 and 864-row outputs (the small model) fill 96-row tiles
// exactly but leave 96 / 32 rows of 128-row tiles computing clamped copies (gpu/PERF.md).
ORDO_ABI_CONST ORDO_TX_TILE_ROWS_NARROW = 96;
ORDO_ABI_CONST ORDO_TX4_R = 16, ORDO_TX4_T = 8;
ORDO_ABI_CONST ORDO_TXM_R = 16, ORDO_TXM_T = 16;
// attention: per-lane accumulator slots; head_dim <= workgroup size * this.
ORDO_ABI_CONST ORDO_ATTN_ACC = 4;
ORDO_ABI_CONST ORDO_ATTN_HEAD_DIM_MAX = 256;
// attention_flash: query rows (token, head pairs of one KV head) per workgroup; a multiple of 4,
// at most 32 (the shader keeps a bit mask of them).
ORDO_ABI_CONST ORDO_ATTN_FLASH_ROWS = 16;
// rms_norm's sum of squares (norm_order.glsl): this many partial sums, partial j taking the
// elements j, j + 64, ... in order, folded by a fixed pairwise tree, whatever the workgroup
// size, so rms_norm.comp and mul_mat_vec's fused norm give the same bits.
ORDO_ABI_CONST ORDO_NORM_PARTS = 64;

// Binding indices, per kernel.
ORDO_ABI_CONST ORDO_B_GET_ROWS_TABLE = 0, ORDO_B_GET_ROWS_IDS = 1, ORDO_B_GET_ROWS_OUT = 2;
ORDO_ABI_CONST ORDO_B_MM_W = 0, ORDO_B_MM_X = 1, ORDO_B_MM_Y = 2;
// mul_mat_vec_norm / _glu: the RMSNorm weight of the fused input norm.
ORDO_ABI_CONST ORDO_B_MM_NORM_W = 3;
// mul_mat_vec_rope32 / rope16 (NORM and the q|k|v store of rope_kv): positions and slots (one
// ints binding), the layer's K and V pool views, the RoPE table.
ORDO_ABI_CONST ORDO_B_MM_ROPE_INTS = 4, ORDO_B_MM_ROPE_K = 5, ORDO_B_MM_ROPE_V = 6,
               ORDO_B_MM_ROPE_FREQ = 7;
ORDO_ABI_CONST ORDO_B_NORM_X = 0, ORDO_B_NORM_W = 1, ORDO_B_NORM_OUT = 2;
ORDO_ABI_CONST ORDO_B_SWIGLU_GATE = 0, ORDO_B_SWIGLU_UP = 1, ORDO_B_SWIGLU_OUT = 2;
ORDO_ABI_CONST ORDO_B_ADD_A = 0, ORDO_B_ADD_B = 1, ORDO_B_ADD_OUT = 2;
ORDO_ABI_CONST ORDO_B_FOLD_PARTIALS = 0, ORDO_B_FOLD_Y = 1;
ORDO_ABI_CONST ORDO_B_ROPE_KVS_QKV = 0, ORDO_B_ROPE_KVS_INTS = 1, ORDO_B_ROPE_KVS_K = 2,
               ORDO_B_ROPE_KVS_V = 3, ORDO_B_ROPE_KVS_FREQ = 4;
ORDO_ABI_CONST ORDO_B_ROPE_KV_SRC = 0, ORDO_B_ROPE_KV_Q = 1, ORDO_B_ROPE_KV_INTS = 2,
               ORDO_B_ROPE_KV_K = 3, ORDO_B_ROPE_KV_V = 4, ORDO_B_ROPE_KV_FREQ = 5;
ORDO_ABI_CONST ORDO_B_KVW_SRC = 0, ORDO_B_KVW_SLOTS = 1, ORDO_B_KVW_K = 2, ORDO_B_KVW_V = 3;
ORDO_ABI_CONST ORDO_B_ATTN_Q = 0, ORDO_B_ATTN_K = 1, ORDO_B_ATTN_V = 2, ORDO_B_ATTN_TOKENS = 3,
               ORDO_B_ATTN_TABLES = 4, ORDO_B_ATTN_OUT = 5, ORDO_B_ATTN_PARTIALS = 6;
ORDO_ABI_CONST ORDO_B_ATTN_MERGE_PARTIALS = 0, ORDO_B_ATTN_MERGE_OUT = 1;
ORDO_ABI_CONST ORDO_B_SPIN_DATA = 0;
ORDO_ABI_CONST ORDO_B_SUMMARY_LOGITS = 0, ORDO_B_SUMMARY_TEMPS = 1, ORDO_B_SUMMARY_OUT = 2;

// get_rows_*.comp: out[i] = dequant(table[ids[i]]) for the ids that fall in this chunk.
struct get_rows_push {
    uint n_cols;        // elements per table row (ne0)
    uint n_ids;         // rows to gather
    uint row_begin;     // first table row held by the bound chunk
    uint row_count;     // table rows in the bound chunk
    uint scale_offset;  // word offset of the aux region of a 32-element block-type chunk (else 0)
    uint ids_offset;    // first id (elements)
    uint out_offset;    // floats
    uint out_stride;    // floats between output rows
};

// mul_mat_vec_*.comp and mul_mat_*.comp: y[t][row_begin + r] (+)= sum_k W[r][k] * x[t][k].
struct mul_mat_push {
    uint k;             // input dim (ne0), elements per weight row
    uint n_rows;        // weight rows in the bound chunk
    uint n_cols;        // tokens (columns of x and y)
    uint row_begin;     // output index of the chunk's first row
    uint scale_offset;  // word offset of the aux region of a 32-element block-type chunk (else 0)
    uint x_offset;      // floats; multiple of 4
    uint x_stride;      // floats between tokens; multiple of 4
    uint y_offset;      // floats
    uint y_stride;      // floats between tokens
    uint accumulate;    // 1: y += W x (fused residual add), 0: y = W x
    // mul_mat_vec_norm / _glu only (0 elsewhere): x is the residual stream, normed on the way
    // in (rms_norm.comp's operations: x * inv * norm_w, inv from norm_eps).
    float norm_eps;
    // mul_mat_vec_glu only: the chunk's first up row (the gate rows are 0..n_rows - 1); y gets
    // silu(gate) * up (swiglu.comp's operations) instead of the gate rows.
    uint glu_up_row;
    // mul_mat (tiled) only: 1 = the group split. Workgroup z sums mat_order.glsl's group z
    // alone and stores it at y_offset + (z * n_cols + t) * y_stride + r (y is the partials
    // scratch; row_begin and accumulate are not used); mul_mat_fold then folds the groups.
    uint split;
};

// mul_mat_fold.comp: y[t][row_begin + r] (+)= the fold of the group split's partials, in
// mat_order.glsl's order: total = group 0, then total = mat_fold(total, group g), g = 1..7.
struct mat_fold_push {
    uint n_rows;
    uint n_cols;
    uint p_offset;  // floats: group g, token t, row r at p_offset + (g * n_cols + t) * p_stride + r
    uint p_stride;
    uint y_offset;
    uint y_stride;
    uint row_begin;
    uint accumulate;
};

// mul_mat_tx.comp: as mul_mat_push, but weights and activations are read through R32G32B32A32_UINT
// uniform texel buffers over whole buffers (16-byte texels), so positions are texel indices.
struct mul_mat_tx_push {
    uint k;             // input dim (ne0), elements per weight row
    uint n_rows;        // weight rows in the bound chunk
    uint n_cols;        // tokens (columns of x and y)
    uint row_begin;     // output index of the chunk's first row
    uint w_texel;       // texel of the chunk's first weight row in its buffer
    uint s_texel;       // texel of the chunk's aux region (32-element block types), else 0
    uint x_texel;       // texel of token 0's first element
    uint x_stride4;     // texels between tokens
    uint y_offset;      // floats
    uint y_stride;      // floats between tokens
    uint accumulate;    // 1: y += W x (fused residual add), 0: y = W x
};

// rms_norm.comp: out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w.
struct rms_norm_push {
    uint n;             // elements per row
    uint n_rows;
    uint x_offset;
    uint x_stride;
    uint out_offset;
    uint out_stride;
    float eps;
};

// The RoPE frequency table both rope kernels read (binding ORDO_B_ROPE_KVS_FREQ /
// ORDO_B_ROPE_KV_FREQ; built by gpu/vk/kernels.cpp rope_turns_table from the model's table): for
// pair j < n_rot / 2, a vec4 {hi, mid, lo, 0} whose sum is pair j's frequency in turns
// (revolutions) per position, hi and mid holding ORDO_ROPE_SPLIT_BITS significant bits each. A
// position (< 2^24) splits the same way into pos_hi + pos_lo (pos_lo < 2^12), so pos_hi * hi,
// pos_lo * hi, pos_hi * mid and pos_lo * mid are exact in float and only their fractions matter,
// and pos * lo is below half a turn: the angle is reduced to [-pi, pi] within a few 1e-6 rad at
// any position (gpu/vk/shaders/rope.glsl). A float pos * freq would err by up to 0.01 rad at
// 131072 and leave sin/cos arguments far outside the range Vulkan bounds their precision on.
ORDO_ABI_CONST ORDO_ROPE_SPLIT_BITS = 12;

// swiglu.comp: out = silu(gate) * up.
struct swiglu_push {
    uint n;
    uint n_rows;
    uint gate_offset;
    uint gate_stride;
    uint up_offset;
    uint up_stride;
    uint out_offset;
    uint out_stride;
};

// add.comp: out = a + b.
struct add_push {
    uint n;
    uint n_rows;
    uint a_offset;
    uint a_stride;
    uint b_offset;
    uint b_stride;
    uint out_offset;
    uint out_stride;
};

// KV pool layer view geometry: element (block, head, slot, d) of one layer lives at
// ((block * n_head_kv + head) * block_tokens + slot) * head_dim + d.
// kv_write_*.comp: copies the new tokens' K and V rows into their slots (slot = block *
// block_tokens + offset, one per token; slot < 0 skips the token).
struct kv_write_push {
    uint n_tokens;
    uint n_head_kv;
    uint head_dim;
    uint block_tokens;
    uint n_blocks;      // blocks in the pool (slots are bounds-checked against it)
    uint src_stride;    // floats between tokens in the source
    uint k_offset;      // floats, first K element of token 0 in the source
    uint v_offset;      // floats, first V element of token 0 in the source
    uint slots_offset;  // elements
};

// rope_kv.comp (storage) and rope_kv_tx.comp (texel): RoPE (adjacent pairs (x[2i], x[2i+1]) of
// the first n_rot dims of each head) on q and k of fused q|k|v rows, q written back in place, k
// and v stored into the pool slots, in one dispatch.
struct rope_kv_push {
    uint n_tokens;
    uint n_head;        // q heads
    uint n_head_kv;
    uint head_dim;      // even (rope_kv_tx: a multiple of 4)
    uint n_rot;         // even, <= head_dim
    uint src_texel;     // texel of token 0's q in the source buffer's texel view (rope_kv_tx)
    uint q_offset;      // floats: token 0's q in the q|k|v binding (rope_kv_tx: a multiple of 4)
    uint stride;        // floats between tokens (rope_kv_tx: a multiple of 4)
    uint pos_offset;    // ints: token 0's position in the ints binding
    uint slots_offset;  // ints: token 0's slot (block * block_tokens + offset; < 0: no store)
    uint block_tokens;
    uint n_blocks;      // blocks in the pool (slots are bounds-checked against it)
};

// mul_mat_vec_rope32_* / rope16_*: the q|k|v mat-vec with its input norm (mm: norm_eps, no
// accumulate, the one chunk of the fused matrix) and rope_kv's store (rope: its n_tokens,
// q_offset, stride and src_texel unused; y is the q|k|v rows). 100 bytes, under Vulkan's
// guaranteed 128 of push constants.
struct mul_mat_rope_push {
    mul_mat_push mm;
    rope_kv_push rope;
};

// attention_*.comp: for each query token and head, causal softmax attention over the token's
// sequence positions 0..pos, read from the paged pool through the sequence's block table.
// tokens buffer: per token two ints {sequence index, position}; tables: n_seqs x
// max_blocks_per_seq block ids.
struct attention_push {
    uint n_tokens;
    uint n_head;
    uint n_head_kv;
    uint head_dim;
    uint block_tokens;
    uint n_blocks;
    uint max_blocks_per_seq;
    uint n_seqs;        // rows of the tables binding; a token naming another sequence is skipped
    uint q_offset;
    uint q_stride;
    uint out_offset;
    uint out_stride;
    uint tokens_offset; // ints
    float scale;        // 1 / sqrt(head_dim)
    uint split_keys;    // keys per split (a multiple of the workgroup; attention_split.glsl)
    uint split_grid;    // 1: one workgroup per (head, token, split) writing partials
    uint max_splits;    // partials slots per (token, head)
    uint tile_rows;     // attention_flash: rows per workgroup (1..ORDO_ATTN_FLASH_ROWS)
};

// attention_merge.comp: out[t][h] = the merge of the split grid's partials (attention_split.glsl).
struct attention_merge_push {
    uint n_tokens;
    uint n_head;
    uint head_dim;
    uint max_splits;    // partials slots per (token, head)
    uint n_splits;      // slots the split grid wrote (splits of the step's longest context)
    uint out_offset;
    uint out_stride;
};

// attention_tx.comp: attention_push's job, reading q, K, V and the block tables through
// R32G32B32A32_UINT texel views of whole buffers (positions are texel indices).
struct attention_tx_push {
    uint n_tokens;
    uint n_head;
    uint n_head_kv;
    uint head_dim;      // multiple of 8, <= the variant's ORDO_ATTN_TX_HD_*
    uint block_tokens;
    uint n_blocks;
    uint max_blocks_per_seq;
    uint n_seqs;
    uint q_texel;       // texel of token 0's head 0
    uint q_stride4;     // texels between tokens
    uint k_texel;       // texel of the layer's K element 0
    uint v_texel;
    uint tables_texel;  // texel of the tables' element 0
    uint tokens_offset; // ints (storage binding)
    uint out_offset;
    uint out_stride;
    float scale;        // 1 / sqrt(head_dim)
};
// attention_tx variants: head dims up to these (registers hold q and the output row).
ORDO_ABI_CONST ORDO_ATTN_TX_HD_SMALL = 64;
ORDO_ABI_CONST ORDO_ATTN_TX_HD_LARGE = 128;
// attention_txg variants: query tokens per workgroup (the shader's TQ), sharing K/V fetches
// when they belong to one sequence; picked when a step averages this many tokens per sequence.
ORDO_ABI_CONST ORDO_ATTN_TX_GROUP = 4;

// logits_summary.comp: what sampling needs of a logits row, so the host reads kilobytes, not the
// vocabulary (scheduler/sampling.hpp, the summary's fast path), over each row's first n_sample
// entries; the output row, in 32-bit words: [0] the largest logit m, [1] sum of exp(l - m),
// [2] sum of exp((l - m) / T) for the row's temperature T = temps[row] (0 when T <= 0), [3] the
// candidate count c = min(n_sample, ORDO_SUMMARY_TOP), with ORDO_SUMMARY_NONFINITE set when an
// entry of the row's first n_sample is an inf or a NaN (the rest of the summary is then
// meaningless: the step failed, and the runner reports it without reading the row), then the
// c best ids (logit descending,
// the lower id first on ties) at [4, 4 + TOP) and their logits at [4 + TOP, 4 + 2 TOP).
// Two dispatches, so a row is read by many workgroups, not one (a 128k-entry row on one
// workgroup was 0.67 ms of a 2.5 ms decode step on an H200): logits_summary gives each of a
// row's n_chunks chunks of chunk_len entries (the last shorter) a workgroup of ORDO_SUMMARY_WG
// lanes, which writes the chunk's summary in the same words (its own maximum, its sums below
// that maximum, its exact best candidates, ids counted from the row's start) to a scratch row
// (row * n_chunks + chunk); logits_summary_merge then makes the row's summary from its chunks'.
// The sums have one shape, fixed by n_sample alone (the chunking is a function of it,
// kernels.hpp summary_chunking): in a chunk lane j adds entries j, j + WG, ... in order, then a fixed
// pairwise tree over the lanes; the merge adds the chunks' sums in chunk order, each scaled by
// exp(chunk max - m) (exactly 1 for a chunk holding m). So a row's summary depends on its
// logits alone, never on the batch around it.
ORDO_ABI_CONST ORDO_SUMMARY_WG = 256;
ORDO_ABI_CONST ORDO_SUMMARY_TOP = 64;
ORDO_ABI_CONST ORDO_SUMMARY_WORDS = 4 + 2 * ORDO_SUMMARY_TOP;
ORDO_ABI_CONST ORDO_SUMMARY_NONFINITE = 0x80000000u;  // in word [3]
// A row of n entries takes min(ORDO_SUMMARY_CHUNKS_MAX, ceil(n / ORDO_SUMMARY_CHUNK)) chunks of
// ceil(n / chunks) entries (Llama 3's 128256: 32 of 4008; 32000: 8 of 4000). The merge keeps
// every chunk's candidates in shared memory: CHUNKS_MAX x TOP x 8 B = 16 KiB.
ORDO_ABI_CONST ORDO_SUMMARY_CHUNK = 4096;
ORDO_ABI_CONST ORDO_SUMMARY_CHUNKS_MAX = 32;
struct logits_summary_push {
    uint n_sample;       // entries of each row summarised (the tokenizer's vocabulary)
    uint n_rows;
    uint logits_offset;  // floats: row r at logits_offset + r * logits_stride
    uint logits_stride;
    uint n_chunks;       // workgroups per row (logits_summary), chunk summaries per row (merge)
    uint chunk_len;      // entries per chunk: chunk c holds [c * chunk_len, min(n, (c + 1) * chunk_len))
};

// spin.comp and spin_until.comp (tests only): a deliberately long dispatch to exercise the fence
// watchdog (spin_until: iterations = polls of a host-written flag per workgroup).
// spin_until.comp: polls per invocation, under llvmpipe's cap of 65535 loop iterations per
// shader invocation (a loop past it ends early, silently).
ORDO_ABI_CONST ORDO_SPIN_POLLS = 60000;
// spin_until's polls per workgroup on drivers without that cap (a GPU: the workgroups run at
// once and leave when they see the flag; a flag never seen ends them after these many reads).
ORDO_ABI_CONST ORDO_SPIN_POLLS_UNCAPPED = 1u << 22;
struct spin_push {
    uint iterations;
    uint n;
};

#ifdef __cplusplus
}  // namespace ordo::gpu::abi
#endif
#endif  // ORDO_GPU_ABI_H
