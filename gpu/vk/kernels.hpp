// kernels.hpp: one encoder per kernel. Each validates its arguments against the bound ranges
// (a bad shape or offset is an ordo::error, never an out-of-bounds dispatch), fills the
// push-constant struct from gpu/vk/shaders/abi.h, picks the grid, and records through the
// stream::dispatch choke point. Nothing here allocates device memory. Used by the gpu actor's
// step recorder, tests/gpu and bench/gpu_kernels.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "actors/runtime/result.hpp"
#include "gpu/vk/kv_pool.hpp"
#include "gpu/vk/stream.hpp"
#include "gpu/vk/weights.hpp"

namespace ordo::gpu {

// F32 activation rows in a buffer: element (row t, column i) at offset + t * stride + i.
struct rows_view {
    buffer_view view;
    std::uint32_t offset = 0;  // floats
    std::uint32_t stride = 0;  // floats between rows
};

// Int32 array in a buffer (token ids, positions, slots, block tables).
struct ints_view {
    buffer_view view;
    std::uint32_t offset = 0;  // ints
};

// out[i] = row ids[i] of table, dequantized. ids outside [0, n_out) leave their row untouched.
status encode_get_rows(stream& s, const weight_tensor& table, ints_view ids, std::uint32_t n_ids,
                       rows_view out);

// automatic: on devices with tuning.prefer_texel_kernels (CPU devices: lavapipe) the
// texel-fetch mul_mat_tx kernels whenever the weight and x buffers have texel views covering
// the operands (variant by token count: 1, <= mat_vec_tokens_max, more); otherwise, up to
// mat_vec_tokens_max tokens mul_mat_rows where tuning.rows_tokens_max allows it (CPU devices)
// and mul_mat_vec elsewhere (GPUs), then the tiled mul_mat. The others force one kernel
// (tests); `texel` is an error (gpu_bad_shape) when an operand has no usable texel view.
// Batch invariance: every mat-mul kernel sums every output in one order
// (gpu/vk/shaders/mat_order.glsl's grouped order, fixed by K alone), so a token's outputs are
// bit-identical whichever kernel its step's token count or its buffers pick, and no kernel
// depends on the other tokens.
// `split` forces the tiled kernel's group split (mat_order.glsl's 8 groups over the grid's z,
// then mul_mat_fold; automatic takes it for grids under pipeline_tuning::mat_tiled_split_wg):
// it needs the stream's mat_split_scratch (gpu_bad_shape without).
enum class mat_path { automatic, vec, tiled, split, rows, texel };
// Token counts up to this use mul_mat_vec (decode, small batches); above, the tiled mat-mat.
// A stream may carry another crossover (stream::set_mat_vec_tokens_max: the runner measures
// it on GPUs at warm-up), at most mat_vec_tokens_limit (two passes of mul_mat_vec's widest
// variant). Both kernels sum in one order, so the crossover never changes a bit.
constexpr std::uint32_t mat_vec_tokens_max = 8;
constexpr std::uint32_t mat_vec_tokens_limit = 16;

// y[t][r] (+)= sum_k w[r][k] x[t][k] for t < n_tokens, r < w.n_out (accumulate: fused residual).
status encode_mul_mat(stream& s, const weight_tensor& w, rows_view x, rows_view y,
                      std::uint32_t n_tokens, bool accumulate, mat_path path = mat_path::automatic);

// What a decode mat-vec may fold into its dispatch (mul_mat_vec.comp NORM / GLU).
enum class mat_fusion {
    none,
    norm,  // y = W rms_norm(x): encode_norm_mul_mat
    glu,   // out = silu(gate) * up with [gate; up] = W rms_norm(x): encode_norm_glu
    // q|k|v = W rms_norm(x), then rope_kv's rotation and KV store into a pool of f32 or f16
    // (encode_norm_qkv_rope_kv); also norm, which it falls back to
    rope_kv_f32,
    rope_kv_f16,
};

// The RMSNorm a mat-mul's input takes first (a layer's attention or FFN norm).
struct norm_input {
    rows_view x;          // the residual stream
    buffer_view weight;   // n floats
    std::uint32_t n = 0;  // elements normed per token (the model's n_embd)
    float eps = 0.0f;
    rows_view scratch;  // where the unfused path writes rms_norm(x) (n floats per token)
};

// y = W rms_norm(x). Where encode_mul_mat would run mul_mat_vec (a GPU's decode), one
// mul_mat_vec_norm dispatch; elsewhere rms_norm into in.scratch, then encode_mul_mat. The same
// bits either way (gpu/vk/shaders/norm_order.glsl), so a token's result never depends on which
// ran. `path` forces encode_mul_mat's choice (tests).
status encode_norm_mul_mat(stream& s, const weight_tensor& w, const norm_input& in, rows_view y,
                           std::uint32_t n_tokens, mat_path path = mat_path::automatic);

// out = silu(gate) * up, where gate (rows 0..n_ff - 1) and up (rows n_ff..) = W rms_norm(x)
// for the fused gate|up matrix W. Where encode_mul_mat would run mul_mat_vec and W is one
// chunk, one mul_mat_vec_glu dispatch; elsewhere rms_norm into in.scratch, encode_mul_mat into
// `gate_up` (n_ff gate then n_ff up columns per token), encode_swiglu. The same bits either way.
status encode_norm_glu(stream& s, const weight_tensor& w, const norm_input& in, rows_view gate_up,
                       rows_view out, std::uint32_t n_ff, std::uint32_t n_tokens,
                       mat_path path = mat_path::automatic);

// Whether encode_mul_mat can read these operands through texel views (mat_path::texel).
bool texel_path_usable(const weight_tensor& w, const rows_view& x, std::uint32_t n_tokens);

// Whether a one-token texel mat-mul of this type and K runs tx1 (one pipeline per K; needs
// subgroup broadcasts and <= ORDO_TX1_UNITS_MAX units per lane) rather than tx4.
bool tx1_usable(const device_info& info, model::ggml_type type, std::uint32_t k);

// The tx4/txm pipeline (id: a mul_mat_tx4_* or mul_mat_txm_* id) that encode_mul_mat runs on a
// weight chunk of `rows` rows: the ORDO_TX_TILE_ROWS_NARROW row tile where it pads the rows less
// than the default (288 rows: three 96-row workgroups instead of three 128-row ones, a third of
// whose rows would be clamped copies), else the default. Both sum in mat_order.glsl's order.
result<const pipeline*> mul_mat_tx_tile(const pipelines& pipes, pipeline_id id, std::uint32_t rows);

// Builds the pipelines encode_mul_mat's automatic path will need for `w` (pipelines are built on
// first request: pipelines::find): its type's texel kernels, specialized on its K (tx1) and its
// chunks' row tiles (tx4/txm), where the texel kernels are preferred, else its type's storage
// kernels; so that the step path never compiles one.
// `fusion`: also the fused mul_mat_vec variants encode_norm_mul_mat / encode_norm_glu run.
// prepare_mul_mat_coop: only the cooperative-matrix kernel's variants (its tiles) for `w`'s type,
// where the tuning runs it (else nothing), so a caller can tell whether they are what failed.
status prepare_mul_mat_coop(const pipelines& pipes, const weight_tensor& w);
status prepare_mul_mat(const pipelines& pipes, const weight_tensor& w,
                       mat_fusion fusion = mat_fusion::none);
// The one-token mul_mat_vec of `w`'s type in `shape` (pipelines::for_cols), and its fused
// variant where `fusion` asks: what w.vec_shape = shape will run.
status prepare_mul_mat_vec_shape(const pipelines& pipes, const weight_tensor& w, mat_fusion fusion,
                                 mat_vec_shape shape);
// The invariant tiled mul_mat of `w`'s type in `layout` (its wide tile, and its narrow one where
// the tuning runs it): what a stream whose layouts include it will run (set_mat_tiled_layouts).
status prepare_mul_mat_tiled_layout(const pipelines& pipes, const weight_tensor& w,
                                    const mat_tiled_layout& layout);

// The same for encode_get_rows on `table` (the token embedding).
status prepare_get_rows(const pipelines& pipes, const weight_tensor& table);

status encode_rms_norm(stream& s, rows_view x, buffer_view weight, rows_view out, std::uint32_t n,
                       std::uint32_t n_rows, float eps);

// A model's RoPE frequency table on the device, as the rope kernels read it (abi.h,
// ORDO_ROPE_SPLIT_BITS): n_rot / 2 vec4s {hi, mid, lo, 0} of turns per position, from
// rope_turns_table.
struct rope_table {
    buffer_view view;         // at least 8 * n_rot bytes
    std::uint32_t n_rot = 0;  // rotated dims per head (even)
};

// The table's contents for a model's RoPE frequencies (llama_weights::rope_freq, radians per
// position, n_rot / 2 of them): 4 floats per pair, hi + mid + lo = freq / (2 pi) to about 2^-48
// relative, hi and mid with ORDO_ROPE_SPLIT_BITS significant bits each.
std::vector<float> rope_turns_table(std::span<const double> freq);

status encode_swiglu(stream& s, rows_view gate, rows_view up, rows_view out, std::uint32_t n,
                     std::uint32_t n_rows);

status encode_add(stream& s, rows_view a, rows_view b, rows_view out, std::uint32_t n,
                  std::uint32_t n_rows);

// Writes K rows (k: n_head_kv * head_dim floats per token) and V rows into `slots[t]`
// (block * block_tokens + offset; negative = skip) of one pool layer.
status encode_kv_write(stream& s, const kv_pool& pool, std::uint32_t layer, rows_view k,
                       rows_view v, ints_view slots, std::uint32_t n_tokens);

// The attention block's rope and KV store for fused q|k|v rows (qkv: n_head q heads, then
// n_head_kv k heads, then n_head_kv v heads of head_dim floats per token): q and k rotated by
// positions[t] (pair j of the first rope.n_rot dims of each head turns by positions[t] *
// freq[j]), q written back in place, k and v stored into slots[t] of one pool layer (a negative
// slot stores nothing); the k and v rows of qkv are left as they were. One dispatch: rope_kv_tx
// where the texel kernels are preferred and the rows allow it, else rope_kv (a lane per pair);
// both compute the same values. positions and slots must be ints of one binding.
status encode_rope_kv(stream& s, const kv_pool& pool, std::uint32_t layer, rows_view qkv,
                      ints_view positions, ints_view slots, const rope_table& rope,
                      std::uint32_t n_tokens, std::uint32_t n_head);

// The attention block's input: q|k|v = W rms_norm(x) for the fused q|k|v matrix W (rows: n_head
// q heads, then n_head_kv k heads, then n_head_kv v heads), then encode_rope_kv on those rows.
// Where encode_mul_mat would run mul_mat_vec, W is one chunk and a workgroup covers an even
// number of rows (each RoPE pair in one workgroup), one mul_mat_vec_rope32/16 dispatch (the
// pool's storage): the norm, the mat-vec, the rotation and the store; elsewhere
// encode_norm_mul_mat then encode_rope_kv. The same bits in qkv and in the pool either way
// (rope.glsl's expressions are `precise`), so no token's values depend on which ran.
struct rope_kv_input {
    const kv_pool* pool = nullptr;
    std::uint32_t layer = 0;
    ints_view positions, slots;  // ints of one binding
    rope_table rope;
    std::uint32_t n_head = 0;  // q heads
    bool fuse = true;          // false: never the fused kernel (an A/B knob, the same bits)
};
status encode_norm_qkv_rope_kv(stream& s, const weight_tensor& w, const norm_input& in,
                               rows_view qkv, const rope_kv_input& rk, std::uint32_t n_tokens,
                               mat_path path = mat_path::automatic);

// The most positions one sequence may attend over on this device, 0 = no limit: on a device
// that caps the loop iterations of a shader invocation (device_info::loop_iterations_max,
// llvmpipe), the attention kernel automatic would pick for this geometry must stay under it.
// A multiple of the pool's block_tokens. encode_attention refuses steps past it.
std::uint64_t attention_positions_max(const pipelines& pipes, const kv_geometry& g);

// Builds the head_dim-specialized attention_tx pipelines a pool of this geometry will use (at
// load, so the step path never compiles one). A no-op where encode_attention would not pick them.
status prepare_attention(const pipelines& pipes, const kv_geometry& g);
// Whether encode_attention's automatic path may pick attention_flash for a pool of this
// geometry (the storage path: attention_tx not preferred or not possible; head_dim even and
// within the lanes' accumulators; its shared memory within the device's), and building its
// head_dim-specialized pipeline (at load: the runner serves without it when that fails).
bool attention_flash_candidate(const pipelines& pipes, const kv_geometry& g);
status prepare_attention_flash(const pipelines& pipes, const kv_geometry& g);

struct attention_batch {
    rows_view q;       // n_head * head_dim floats per token
    rows_view out;     // n_head * head_dim floats per token
    ints_view tokens;  // per token {sequence index, position}
    ints_view tables;  // n_seqs x max_blocks_per_seq block ids
    std::uint32_t n_tokens = 0;
    std::uint32_t n_seqs = 0;
    std::uint32_t max_blocks_per_seq = 0;
    std::uint32_t n_head = 0;
    // Keys per split of a long context (attention_split.glsl; a multiple of the attention
    // workgroup, the same for every step of a runner: attention_split_keys), 0 = one split. With
    // `partials` bound, a step of at most attention_split_tokens_max tokens whose contexts span
    // several splits runs the split grid (one workgroup per head, token and split) and the merge
    // kernel: flash decoding.
    std::uint32_t split_keys = 0;
    buffer_view partials{};        // attention_partials_floats(...) floats
    std::uint32_t max_splits = 0;  // partials slots per (token, head)
    // The tokens' {sequence index, position} pairs as the host wrote them into `tokens`
    // (optional, 2 * n_tokens ints). With them the storage family sends runs of one sequence
    // long enough to fill a flash tile (prefill chunks) to attention_flash, and many decode
    // tokens under GQA too where pipeline_tuning::attention_token_tiles asks (encode_attention's
    // automatic path; same bits either way); without them, all to attention.comp.
    std::span<const std::int32_t> host_tokens{};
};
// attention_flash: a run of one sequence's tokens goes to it when its rows (tokens x the query
// heads of a KV head) fill at least this many tiles of ORDO_ATTN_FLASH_ROWS.
constexpr std::uint32_t attention_flash_tiles_min = 1;
// The most tokens a split-grid step serves (decode and small batches: with more, the tokens
// alone fill the device).
constexpr std::uint32_t attention_split_tokens_max = 8;
// Splits: at least this many keys each, at most this many per context.
constexpr std::uint32_t attention_split_keys_min = 256;
constexpr std::uint32_t attention_splits_max = 64;
// The split size for contexts of up to `positions` on attention workgroups of `wg` lanes.
std::uint32_t attention_split_keys(std::uint64_t positions, std::uint32_t wg);
// The partials a split grid needs: attention_split_tokens_max tokens x n_head x max_splits
// slots of head_dim + 2 floats.
std::uint64_t attention_partials_floats(std::uint32_t n_head, std::uint32_t head_dim,
                                        std::uint32_t max_splits);
// Causal attention of every token over its sequence's positions 0..pos in the pool.
status encode_attention(stream& s, const kv_pool& pool, std::uint32_t layer,
                        const attention_batch& b);

// automatic: attention_tx (texel fetches, subgroup merge) when the tuning prefers texel kernels
// and the operands allow it (head_dim % 8 == 0 and <= 128, texel views covering q, K, V and the
// tables, subgroup arithmetic, workgroup = subgroup); else attention.comp, with the runs of
// host_tokens that fill a flash tile on attention_flash.comp, and under grouped-query attention
// the other tokens too where there are more than attention_split_tokens_max of them and
// pipeline_tuning::attention_token_tiles asks (a tile per token of its query heads, sharing the
// keys' loads). `texel` forces the first
// (gpu_bad_shape when not possible), `classic` attention.comp alone, `flash` attention_flash
// for the whole batch whatever its tokens (tests, bench; gpu_bad_shape past a loop cap).
enum class attention_path { automatic, classic, texel, flash };
status encode_attention(stream& s, const kv_pool& pool, std::uint32_t layer,
                        const attention_batch& b, attention_path path);

// summary[r] = the sampling summary of logits row r's first n_sample entries (abi.h
// logits_summary_push: the largest logit, the normalisers at temperature 1 and at temps[r], the
// ORDO_SUMMARY_TOP best candidates); summary holds n_rows x ORDO_SUMMARY_WORDS words, temps
// n_rows floats (0: no tempered normaliser), scratch (device memory) at least
// logits_summary_scratch_words(n_sample, n_rows) words: the rows' chunk summaries.
struct logits_summary_chunking {
    std::uint32_t n_chunks;   // workgroups a row is summarised by
    std::uint32_t chunk_len;  // entries each (the last chunk may hold fewer)
};
logits_summary_chunking summary_chunking(std::uint32_t n_sample);
std::uint64_t logits_summary_scratch_words(std::uint32_t n_sample, std::uint32_t n_rows);
status encode_logits_summary(stream& s, rows_view logits, buffer_view temps, buffer_view scratch,
                             buffer_view summary, std::uint32_t n_sample, std::uint32_t n_rows);

// Test-only: one invocation loops `iterations` times over data (a long-running dispatch; on
// llvmpipe at most 65535 iterations, its cap per shader invocation).
// `workgroups` invocations each spin `iterations` (they race on data[0]: test-only).
status encode_spin(stream& s, buffer_view data, std::uint32_t iterations,
                   std::uint32_t workgroups = 1);

// Test-only: `rounds` workgroups (at most maxComputeWorkGroupCount[0]) each poll flag[0] (a
// host-visible buffer of at least 2 uints) until the host makes it nonzero, at most
// ORDO_SPIN_POLLS times each; bit 0 of flag[1] is set when one saw the flag, bit 1 when one
// gave up.
status encode_spin_until(stream& s, buffer_view flag, std::uint32_t rounds);

}  // namespace ordo::gpu
