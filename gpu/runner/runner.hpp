// runner.hpp: the Llama forward pass on the Vulkan layer. Owns one device, its pipelines, the
// weights uploaded from a GGUF file, the paged KV pool and every activation buffer, all created
// once in create(): nothing on the step path allocates device memory. No actor, no threads of
// its own: the gpu actor (gpu/actor/gpu_actor.hpp) drives it from one worker thread at a time, and
// tests, ordo-model generate and ordo-bench drive it directly.
//
// A step (gpu_msgs.hpp) is a batch of sequences of different lengths and phases (prefill
// chunks and decodes mixed), run as one token batch:
//
//   x = embed(ids)                                     // (T, n_embd) residual stream
//   for each layer l:
//       xn = rmsnorm(x) * attn_norm[l]
//       qkv = [wq xn | wk xn | wv xn]                  // (T, n_embd + 2 kv_dim)
//       rope(q heads and k heads of qkv, positions)
//       kv_write(k, v -> each token's slot in its sequence's blocks)
//       att = paged causal attention(q, pool, block tables)
//       x += wo att
//       xn = rmsnorm(x) * ffn_norm[l]
//       hid = silu(w_gate xn) * (w_up xn)
//       x += w_down hid
//   logits[rows] = w_out (rmsnorm(x[rows]) * output_norm)   // only the rows that ask
//   hidden[i] = sum over its tokens t of rmsnorm(x[t]) * output_norm  // embeddings: the sum
//               (all of a sequence's tokens), the last or the first, added up on the host
//
// The layers are recorded as command-buffer segments of at most flush_every_layers layers
// (label "decode#812 seqs=4 layers 8-15"); each is submitted and waited on with watchdog_ms.
// A failure returns the stream's error (gpu_timeout, gpu_device_lost, ...) and last_segment()
// names the segment. After gpu_timeout the segment may still run: drain() waits for it before
// the runner is destroyed or reused.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "actors/runtime/result.hpp"
#include "gpu/gpu_msgs.hpp"
#include "gpu/runner/step_plan.hpp"
#include "gpu/vk/device.hpp"
#include "gpu/vk/kernels.hpp"
#include "gpu/vk/kv_pool.hpp"
#include "gpu/vk/pipeline_cache.hpp"
#include "gpu/vk/pipelines.hpp"
#include "gpu/vk/stream.hpp"
#include "gpu/vk/weights.hpp"
#include "model/gguf.hpp"
#include "model/llama.hpp"

namespace ordo::gpu {

// Limits create() holds runner_options to. The config schema's bounds are within them
// (static_asserts in tools/server/server.cpp), so a config that passes its check builds.
// Tokens of one step: a mat-mul grid has a row per token, and Vulkan guarantees 65535
// workgroups per grid dimension on every device.
inline constexpr std::uint32_t runner_max_batch_tokens_max = 65'535;
inline constexpr std::uint32_t runner_seqs_max_max = 4096;
inline constexpr std::uint32_t runner_flush_every_layers_max = 1024;
// Tokens the KV pool holds at most (kv blocks x block tokens): the scheduler's block table
// refuses a bigger pool (sched::kv_pool_tokens_max; server.cpp asserts they agree), so a pool
// sized from kv_memory_bytes stops here instead of building one the scheduler cannot use.
inline constexpr std::uint64_t runner_kv_pool_tokens_max = std::uint64_t{1} << 24;
// KV blocks one copy job (copy_kv_out / copy_kv_in: one submission) moves at most: the host
// staging buffer holds this many blocks, allocated once.
inline constexpr std::uint32_t runner_kv_copy_blocks_max_max = 4096;

// What a runner build (runner::create) is doing, reported as each stage starts and advances:
// the gpu actor turns it into health "loading" with progress.
enum class build_stage : std::uint8_t {
    device,   // the Vulkan device, the pipeline cache and the pipelines
    weights,  // uploading the weights (done / total = layers)
    warm_up,  // the warm-up steps (done / total = steps): first dispatches compile kernels
};
std::string_view build_stage_name(build_stage s);  // "device", "weights", "warm-up"
struct build_progress {
    build_stage stage = build_stage::device;
    std::uint32_t done = 0;
    std::uint32_t total = 0;
};

// What one segment of a step records: `fixed` dispatches besides its layers' and `per_layer`
// for each of at most n_layer layers.
struct segment_shape {
    std::uint64_t fixed = 0;
    std::uint64_t per_layer = 0;
    std::uint32_t n_layer = 0;
    std::uint64_t dispatches(std::uint32_t layers) const {
        return fixed + std::uint64_t(std::min(layers, n_layer)) * per_layer;
    }
};
// Layers per segment: `configured` (gpu.flush_every_layers) when not 0, else the device's
// default shrunk until a segment fits `dispatches_max` (never below 1). gpu_bad_config when the
// length chosen still does not fit.
result<std::uint32_t> choose_segment_layers(const segment_shape& shape, std::uint32_t configured,
                                            std::uint32_t device_default,
                                            std::uint64_t dispatches_max);

// Segments kept for replay by default: a decode step's segments for the 4 logits slots it
// rotates through, at a few sequence counts and context blocks.
inline constexpr std::uint32_t runner_replay_segments_default = 16;
// The cooperative-matrix kernel's check at build (runner::check_mat_coop): its largest
// difference from the invariant kernel over a token's RMS past this leaves the invariant kernels
// serving. Right: about 1e-3 (f16 inputs); a wrong fragment layout: about 1.
inline constexpr double mat_coop_check_err_max = 5e-2;

struct runner_options {
    std::string device;  // gpu.device selector ("" = auto)
    // gpu.flush_every_layers; 0 = the device's (pipeline_tuning::flush_every_layers)
    std::uint32_t flush_every_layers = 0;
    // Layers in a step's first segment (at most flush_every_layers(); 0: as many as the
    // others); unset = the device's (pipeline_tuning::first_segment_layers) where
    // flush_every_layers is 0, else 0: a configured segment length is every segment's. Tests
    // and ordo-bench --first-segment set it.
    std::optional<std::uint32_t> first_segment_layers;
    std::uint64_t watchdog_ms = 10'000;  // gpu.watchdog_ms
    // gpu.warmup_ms_max: how long one warm-up submission may run. The first dispatch of a
    // pipeline compiles it (llvmpipe's JIT, a GPU driver's shader compiler), which is not a hang:
    // warm-up runs under this bound, never under watchdog_ms.
    std::uint64_t warmup_ms_max = 180'000;
    // gpu.pipeline_cache_dir: where the Vulkan pipeline cache is kept between starts
    // (gpu/vk/pipeline_cache.hpp); empty = in memory only.
    std::string pipeline_cache_dir;
    // Called on the building thread as the build advances; may be empty.
    std::function<void(const build_progress&)> on_progress;
    std::uint32_t kv_block_tokens = 16;            // gpu.kv_block_tokens
    std::uint32_t kv_blocks = 0;                   // gpu.kv_blocks; 0: from kv_memory_bytes
    std::uint64_t kv_memory_bytes = 256ull << 20;  // gpu.kv_memory_bytes
    bool kv_f16 = true;                            // gpu.kv_dtype == "f16"
    std::uint32_t max_batch_tokens = 512;          // tokens in one step, at most
    std::uint32_t rows_max = 16;                   // logits rows in one step, at most
    std::uint32_t seqs_max = 64;                   // sequences in one step, at most
    std::uint32_t n_ctx = 0;                       // model.context_tokens; 0: the model's
    bool timestamps = false;                       // per-kernel GPU timings (bench)
    // Segments the stream keeps recorded and replays when a step repeats one (stream.hpp
    // "Replay"; decode steps do): 0 records every segment (ordo-bench --replay off). Never with
    // timestamps.
    std::uint32_t replay_segments = runner_replay_segments_default;
    std::uint32_t kv_copy_blocks_max = 64;  // KV blocks per copy job, at most
    // Weight arena page (one storage binding each; a tensor larger than a page is split into
    // row chunks): 0 = min(the device's storage-buffer range, 256 MiB). Tests lower it to run
    // the chunked paths (a 128k-token embedding in several bindings) on small models.
    std::uint64_t weight_page_bytes = 0;
    // gpu.kernels: true = the texel-fetch family, false = the storage-buffer family; unset =
    // the device's default (tuning_for: texel on CPU devices, storage on GPUs).
    std::optional<bool> texel_kernels;
    // The storage family's few-token mat-mul: unset = the device's default (tuning_for:
    // mul_mat_rows on CPU devices; mul_mat_vec, with the decode fusions, on GPUs); true =
    // mul_mat_vec anywhere (tests run the GPUs' decode path on lavapipe), false = mul_mat_rows.
    std::optional<bool> mat_vec_kernels;
    // The tiled mat-mul's group split threshold (pipeline_tuning::mat_tiled_split_wg): unset =
    // the device's (GPUs split grids under 1024 workgroups, CPU devices never); tests set the
    // GPUs' value to run the split on lavapipe.
    std::optional<std::uint32_t> mat_tiled_split_wg;
    // Whether a decode mat-vec's q|k|v store also runs RoPE and the KV store
    // (encode_norm_qkv_rope_kv: one dispatch a layer fewer); false: mul_mat_vec_norm then
    // rope_kv. The same bits either way (ordo-bench --qkv-rope on|off, an A/B knob).
    bool qkv_rope_fusion = true;
    // attention.comp's load groups (pipeline_tuning::attention_k_pairs, attention_v_group):
    // unset = the device's; the same bits at any value (ordo-bench --attn-k-pairs/-v-group).
    std::optional<std::uint32_t> attention_k_pairs;
    std::optional<std::uint32_t> attention_v_group;
    // gpu.row_summaries: each step's logits rows come with their summaries (step_result::
    // summarized); unset = the device's default (tuning_for: GPUs yes, CPU devices no).
    std::optional<bool> row_summaries;
    // gpu.batch_invariant: false lets the tiled steps run on cooperative matrices (mul_mat_cm:
    // tensor cores, f16 inputs) where the device has them, so a token's logits may depend on
    // what else was in its step; true (the default) keeps mat_order.glsl's one order.
    bool batch_invariant = true;
    // Tests and the bench: with batch_invariant false, the plain-GLSL emulation of mul_mat_cm
    // (mul_mat_cme) on any device.
    bool mat_coop_emulated = false;
    // The storage family runs a prompt's runs of tokens (those that fill a flash tile) on
    // attention_flash, the rest on attention.comp; false: all on attention.comp. The same bits
    // either way (an A/B knob for the bench, ordo-bench --attention-flash).
    bool attention_flash = true;
    // The token counts mul_mat_vec serves before the tiled kernel takes over (1..16): unset =
    // measured at warm-up wherever the storage family runs mul_mat_vec (GPUs: both kernels
    // timed on the model's own FFN matrices at 2..16 tokens), else kernels.hpp's 8.
    std::optional<std::uint32_t> mat_vec_tokens_max;
    // Each weight's one-token mul_mat_vec shape (lanes per group, units a lane: mat_vec_shape):
    // unset = measured at warm-up where the storage family runs mul_mat_vec on a GPU with
    // timestamps (choose_mat_vec_shapes); true = measured wherever mul_mat_vec runs and the
    // device has timestamps (tests on lavapipe); false = the tuning's shape for every weight
    // (ordo-bench --mmv-shapes off). The same bits in every shape.
    std::optional<bool> mat_vec_shapes;
    // The invariant tiled mul_mat's layout by token count (mat_tiled_layout: swizzled tiles, K
    // step, token tiles first, staging by rows): unset = measured at warm-up where the storage
    // family's tiled kernel serves on a GPU with timestamps (choose_mat_tiled_layouts); true =
    // measured wherever it serves and the device has timestamps (tests on lavapipe); false =
    // the tuning's layout at every count (ordo-bench --mm-layouts off). The same bits in each.
    std::optional<bool> mat_tiled_layouts;
    // Under batch_invariant false on a device with cooperative matrices: the token count from
    // which the tiled steps run the large tile (pipeline_tuning::mat_coop_large; 0: never).
    // Unset = measured at warm-up (the wide and the large tile timed on the model's own FFN
    // matrices at 64..512 tokens).
    std::optional<std::uint32_t> mat_coop_large_from;
    // Keys per attention split (flash decoding, kernels.hpp attention_split_keys): 0 = from the
    // context; tests set one workgroup's worth so short contexts span many splits. A multiple
    // of the attention workgroup.
    std::uint32_t attention_split_keys = 0;
    // Fault injection (tests): pipelines whose name starts with this fail creation as a
    // driver's would (pipeline_tuning::fault_create_fails). Empty: none.
    std::string fault_pipeline_create;
    // Fault injection (tests): the cooperative-matrix kernel's check at build finds an output
    // wrong (as on a driver that lays fragments out otherwise): the invariant kernels serve.
    bool fault_mat_coop_wrong = false;
    // Host memory the logits rows may be written into in place (the gpu actor's
    // logits_exchange::logits_region of each slot; each at least rows_max x n_vocab floats):
    // imported at create as device buffers where the device can (device::import_host), so a
    // run_step whose logits_out is a region's start has the logits head write there and copies
    // nothing (step_result::logits_in_place). A region the device cannot import (no extension,
    // misaligned) leaves every step on the copy; the regions must outlive the runner.
    std::vector<std::span<float>> logits_regions;
    // false: logits_regions are not imported, every step copies (the A/B of ordo-bench
    // --logits-in-place off).
    bool logits_in_place = true;
};

// The context (positions per sequence) a runner serves is the smallest of four bounds; the one
// that applied is logged once at creation and announced in device_ready (the `model` op's
// context_bound). On a tie the earlier one in this order is named.
enum class context_bound {
    trained,  // the model's context_length
    config,   // runner_options::n_ctx (model.context_tokens)
    kv_pool,  // the KV pool's tokens: one sequence can never hold more
    device,   // what attention can walk on the device (attention_positions_max: llvmpipe)
};
std::string_view context_bound_name(context_bound b);  // "trained", "config", "kv pool", "device"

struct context_choice {
    std::uint32_t n_ctx = 0;
    context_bound bound = context_bound::trained;
};
// min(trained, configured, pool_tokens, device_max), naming the bound; configured and
// device_max 0 mean "no such bound". Pure: ordo-server's tests and the runner use it.
context_choice choose_context(std::uint32_t trained, std::uint32_t configured,
                              std::uint64_t pool_tokens, std::uint64_t device_max);

// Faults the gpu actor arms through the real failure paths (ARCHITECTURE.md "Faults").
struct step_fault {
    // device_lost, hang or nan_logits (armed_faults::next gives no other); none: no failure.
    std::optional<fault_kind> kind;
    std::int32_t layer = -1;  // the segment holding this layer; -1: the first segment
    // step_delay: the gpu actor's worker sleeps this long before the step begins, and before each
    // further decode iteration of it (as if the device were slow to take each); the runner never
    // sees it, so its watchdog still times only the real submissions. Independent of `kind`: a
    // delayed step may also fail.
    std::uint32_t delay_ms = 0;
};

struct step_result {
    std::vector<std::uint64_t> rows;         // seq id of each logits row written
    std::vector<std::uint64_t> hidden_rows;  // seq id of each hidden row written
    std::uint32_t n_tokens = 0;
    std::uint32_t segments = 0;
    std::uint32_t segments_replayed = 0;  // of them, submitted as a kept recording (replay)
    double gpu_ms = 0.0;                  // submit -> fence, summed over segments
    bool summarized = false;  // the rows' summaries were written (runner::row_summaries)
    // No inf or NaN in the logits rows written: checked on the host as the rows are copied or,
    // in place, by a pass over them; in place with summaries, by the summaries' own flag
    // (abi.h ORDO_SUMMARY_NONFINITE: the kernel saw every entry of the tokenizer's vocabulary).
    bool logits_finite = true;
    // The device wrote the rows straight into logits_out (runner_options::logits_regions).
    bool logits_in_place = false;
};

// GPU time of one pipeline over the last step (timestamps on).
struct kernel_time {
    std::string name;
    double ms = 0.0;
    std::uint32_t dispatches = 0;
};

// ok when the Vulkan kernels run every matrix the forward pass multiplies with (gpu/vk/weights:
// kernels_run); otherwise gpu_unsupported_type naming the first tensor that they do not and its
// type. Every type the loader accepts has kernels today, so this fails only for weights built
// by hand; it stays as the one place that would name a type added to the loader before its
// kernels. Norm vectors are decoded on the host at upload, so any type the loader accepts serves
// for them. Needs no device: ordo-server runs it at start (a model that fails it exits 2) and
// runner::create runs it before creating one.
status check_weight_types(const model::llama_weights& w);

class runner {
public:
    // Maps the model (map_llama_weights), creates the device and everything else, uploads the
    // weights. Errors: the model's and the device's, gpu_bad_config (bad options),
    // gpu_unsupported_type, gpu_bad_shape (a model the kernels cannot run). `file` may be
    // closed after create() returns: the weights live on the device.
    static result<std::unique_ptr<runner>> create(const model::gguf_file& file,
                                                  const runner_options& options);
    ~runner();
    runner(const runner&) = delete;
    runner& operator=(const runner&) = delete;

    // Runs one step and writes rows() x n_vocab floats to logits_out (row i = the i-th sequence
    // that wants logits) and hidden rows x n_embd floats to hidden_out (row i = the i-th
    // sequence with a hidden output: step_seq::hidden); either may be null when no sequence
    // asks for it. summary_out (may be null): rows() x ORDO_SUMMARY_WORDS words, each logits
    // row's summary (gpu/vk/shaders/abi.h logits_summary_push). Validation failures
    // (gpu_bad_step) record nothing.
    result<step_result> run_step(const step& s, float* logits_out, float* hidden_out = nullptr,
                                 std::uint32_t* summary_out = nullptr);
    // Arms a fault for the next run_step only.
    void arm_fault(const step_fault& f) { _fault = f; }
    // Waits (at most timeout_ms) for a segment still in flight after a timeout.
    status drain(std::uint64_t timeout_ms);
    // What the pipeline cache did at build: "loaded N B", "none yet", "ignored: ...", "off".
    const std::string& pipeline_cache_note() const { return _pcache->load_note(); }
    // Label of the segment that ran (or failed) last.
    const std::string& last_segment() const { return _last_segment; }
    // Per-pipeline GPU times of the last successful step (empty unless options.timestamps).
    const std::vector<kernel_time>& last_timings() const { return _timings; }
    // The mul_mat_vec / tiled crossover the steps use (runner_options::mat_vec_tokens_max).
    std::uint32_t mat_vec_tokens_max() const { return _stream->mat_vec_tokens_max(); }
    // Where the cooperative-matrix mat-mul's large tile starts (runner_options::
    // mat_coop_large_from; 0: never, and always 0 without mat_coop()).
    std::uint32_t mat_coop_large_from() const { return _stream->mat_coop_large_from(); }
    // What the cooperative-matrix kernel's check at build measured on a matrix of each weight
    // type ("0.q|k|v (q4_k): 16 tokens 1.1e-03/1.1e-03 ..."); empty where it did not run.
    const std::string& mat_coop_check() const { return _mat_coop_check; }
    // What choose_mat_vec_shapes measured, per role and type (ms of one pass over the layers'
    // weights in each shape, lanes x units; '*' the one that serves): "down q4_k: 1x4 0.21*
    // 2x4 0.25 ..."; empty where it did not run.
    const std::string& mat_vec_shapes() const { return _mat_vec_shapes; }
    // What choose_mat_tiled_layouts measured (ms of layer 0's FFN mat-muls in each layout at each
    // token count; '*' the one that serves there): "16: s t k32 0.31* t k32 0.35 ...; 64: ...";
    // empty where it did not run.
    const std::string& mat_tiled_layouts() const { return _mat_tiled_layouts; }

    // KV staging for the kv persistence actor. Byte layout of `dst`/`src`: for each block id in
    // order, for each layer 0..n_layer-1: the block's K bytes, then its V bytes; each is the
    // pool's layer layout for that block ((head, slot, dim) row-major; f16 or f32 elements,
    // kv_pool.hpp), kv_layer_block_bytes() long. Total ids.size() * kv_block_bytes().
    //
    // copy_kv_out / copy_kv_in are one job each: every copy of every block, layer, K and V is
    // recorded into ONE segment (one vkCmdCopyBuffer per layer buffer, a region per block,
    // through the host-visible staging buffer) with one fence, waited on with watchdog_ms; the
    // segment is labelled "kv_out#7 blocks=64" (last_segment()). At most kv_copy_blocks_max()
    // blocks; a copy-in names each block once. Errors: gpu_bad_request (unknown or repeated
    // block, too many blocks, wrong size), gpu_busy (a segment in flight), and the stream's
    // (gpu_timeout, gpu_device_lost, ...) after which the device is not trusted.
    status copy_kv_out(std::span<const std::uint32_t> ids, std::span<std::uint8_t> dst);
    status copy_kv_in(std::span<const std::uint32_t> ids, std::span<const std::uint8_t> src);
    std::uint32_t kv_copy_blocks_max() const { return _options.kv_copy_blocks_max; }
    // Any number of blocks: copy_kv_out / copy_kv_in over runs of kv_copy_blocks_max() (one
    // submission each). A block named twice in one write: the later bytes win.
    status read_kv_blocks(std::span<const std::uint32_t> ids, std::span<std::uint8_t> dst);
    status write_kv_blocks(std::span<const std::uint32_t> ids, std::span<const std::uint8_t> src);
    std::uint64_t kv_layer_block_bytes() const;
    std::uint64_t kv_block_bytes() const { return 2 * _hp.n_layer * kv_layer_block_bytes(); }
    status clear_kv() { return _kv->clear(); }

    const device_info& info() const { return _dev->info(); }
    // Whether the encoders prefer the texel-buffer kernels (CPU devices: gpu/PERF.md).
    bool texel_kernels() const { return _pipes->tuning().prefer_texel_kernels; }
    // Whether steps write their logits rows' summaries (runner_options::row_summaries).
    bool row_summaries() const { return _pipes->tuning().row_summaries; }
    // Whether the tiled steps run on cooperative matrices (runner_options::batch_invariant).
    bool mat_coop() const { return _pipes->tuning().mat_coop; }
    // Layers per segment: runner_options::flush_every_layers, or where that is 0 the device's
    // (pipeline_tuning::flush_every_layers, fewer if its segments would pass the dispatch bound).
    std::uint32_t flush_every_layers() const { return _flush_every; }
    // Layers in a step's first segment (runner_options::first_segment_layers): the GPU starts
    // on them while the host records the next segment.
    std::uint32_t first_segment_layers() const { return _first_segment; }
    // Segments submitted as a kept recording, and segments recorded for keeping, since the
    // runner was built (runner_options::replay_segments; both 0 when it is 0).
    std::uint64_t segments_replayed() const { return _stream->replayed(); }
    std::uint64_t segments_recorded() const { return _stream->recorded(); }
    const model::llama_hparams& hparams() const { return _hp; }
    const runner_options& options() const { return _options; }
    // How many of runner_options::logits_regions the device imported (all or none).
    std::uint32_t logits_regions_imported() const {
        return static_cast<std::uint32_t>(_logits_regions.size());
    }
    // Whether steps may run attention_flash (runner_options::attention_flash, where the storage
    // path serves attention and the pipeline was built).
    bool attention_flash() const { return _attention_flash; }
    const step_limits& limits() const { return _limits; }
    // The bound that set limits().n_ctx (choose_context).
    context_bound n_ctx_bound() const { return _n_ctx_bound; }
    // Device bytes the weights occupy (every matrix's chunks, a tied embedding once, the norm
    // vectors, the RoPE table; the arena's pages around them may hold up to one page more) and
    // the KV pool's (every layer's K and V).
    std::uint64_t weight_bytes() const;
    std::uint64_t kv_bytes() const;

private:
    struct layer_weights {
        // q|k|v and gate|up are each one tensor (rows concatenated: one dispatch, x read once)
        // when their types agree; otherwise qkv/gate_up stay empty and the parts are used.
        weight_tensor qkv, gate_up;
        weight_tensor wq, wk, wv, wo, gate, up, down;
        buffer attn_norm, ffn_norm;  // (n_embd) floats
    };

    explicit runner(const runner_options& options) : _options(options) {}
    status init(const model::gguf_file& file);
    status init_device();
    // The texel family cannot be built on this device (`why`: the pipeline and the driver's
    // error): logs it and serves with the storage family from now on.
    status fall_back_to_storage_kernels(const error& why);
    // KV pool blocks: gpu.kv_blocks, or as many as kv_memory_bytes, one storage binding per
    // layer and runner_kv_pool_tokens_max allow. Error: gpu_bad_config (none, or too many).
    result<std::uint32_t> kv_pool_blocks() const;
    // Picks the context (choose_context) and logs it with the bound that applied.
    void init_context(std::uint32_t blocks);
    status upload_model(const model::llama_weights& w);
    status init_buffers(std::uint32_t blocks);
    status init_stream();
    status init_mat_split();
    status choose_mat_vec_crossover();
    status choose_mat_coop_tile();
    status choose_mat_vec_shapes();
    // The step buffers' rows a layer reads and writes (record_layer; the warm-up's timings).
    struct layer_rows {
        rows_view x, xn, q, k, v, att, gate, up, hid;
    };
    layer_rows step_rows() const;
    status choose_mat_tiled_layouts();
    result<std::unique_ptr<stream>> timing_stream() const;
    status check_mat_coop();
    status fall_back_to_invariant_kernels(std::string_view what, const error& why);
    result<double> time_mat_muls(stream& str, mat_path path, std::uint32_t n_tokens);
    status warm_up();
    void report(build_stage stage, std::uint32_t done, std::uint32_t total) const;
    status ensure_kv_host();  // makes _kv_host on the first copy job
    // Records and runs one copy job; `out`: pool -> _kv_host, else _kv_host -> pool.
    status run_kv_copy(std::span<const std::uint32_t> ids, bool out);
    result<weight_tensor> upload(const model::matrix_view& m, mat_fusion fusion = mat_fusion::none);
    result<weight_tensor> upload_padded(const model::matrix_view& m);
    // The matrices' rows concatenated into one tensor; an empty tensor when their types or
    // n_in differ.
    result<weight_tensor> upload_concat(std::initializer_list<const model::matrix_view*> parts,
                                        mat_fusion fusion);
    result<buffer> upload_norm(const model::matrix_view& m);
    result<buffer> upload_floats(std::span<const float> values);
    // What the fused q|k|v matrix's decode mat-vec folds in: the norm, RoPE and the store into
    // this runner's KV pool (encode_norm_qkv_rope_kv).
    mat_fusion qkv_fusion() const {
        if (!_options.qkv_rope_fusion) return mat_fusion::norm;
        return _options.kv_f16 ? mat_fusion::rope_kv_f16 : mat_fusion::rope_kv_f32;
    }

    // runner_forward.cpp
    status record_embedding();
    status record_layer(std::uint32_t l);
    // The output norm of the runs' tokens into `out`'s rows (logits' and hidden rows' input).
    status record_final_norm(std::span<const row_run> runs, const buffer& out);
    // `poison`: the nan_logits fault, NaNs written over the first row after the head.
    status record_logits(bool poison);
    status record_hidden();
    // Imports runner_options::logits_regions (all, or none with a log line saying why).
    void import_logits_regions();
    // The imported region starting at `out`, or null (the step copies from _logits).
    const buffer* logits_region_at(const float* out) const;
    // The logits rows' binding this step writes (_logits_target).
    buffer_view logits_view() const;
    // Whether every summary of the step's rows says its row was finite.
    bool summaries_finite() const;
    void pool_hidden(float* hidden_out);  // _hidden rows -> the step's hidden rows
    // One segment of a step (layers l0..l1): recorded (begin, or begin_ahead while the one
    // before it runs), submitted once that one was waited for, waited on under the watchdog.
    status record_segment(const step& s, std::uint32_t l0, std::uint32_t l1, const step_fault& f);
    status submit_segment(std::uint32_t l0, std::uint32_t l1, const step_fault& f);
    status wait_segment(std::uint32_t l0, std::uint32_t l1, const step_fault& f, step_result& r);
    // Whether the step's armed fault falls in layers l0..l1.
    bool fault_targets(const step_fault& f, std::uint32_t l0, std::uint32_t l1) const;
    void write_inputs();
    void add_timings();

    runner_options _options;
    model::llama_hparams _hp;
    step_limits _limits;
    context_bound _n_ctx_bound = context_bound::trained;
    std::uint32_t _embd_stride = 0;  // n_embd rounded up to 8 floats (mat-mul loads 8 at once)
    std::uint32_t _qkv_stride = 0;   // n_embd + 2 kv_dim, rounded up to 8
    std::uint32_t _ff_stride = 0;    // n_ff, rounded up to 8
    std::uint32_t _gu_stride = 0;    // 2 n_ff, rounded up to 8 (gate | up)
    std::uint32_t _blocks_per_seq_max = 0;

    // Declaration order is destruction order in reverse: the device goes last.
    std::unique_ptr<device> _dev;
    std::unique_ptr<pipeline_cache> _pcache;
    std::unique_ptr<pipelines> _pipes;
    std::unique_ptr<stream> _stream;
    // Layers per segment (flush_every_layers(); set by init_stream).
    std::string _mat_coop_check;
    std::string _mat_vec_shapes;
    std::string _mat_tiled_layouts;
    std::uint32_t _flush_every = 0;
    std::uint32_t _first_segment = 0;  // first_segment_layers(), at most _flush_every
    std::unique_ptr<arena> _arena;
    std::unique_ptr<kv_pool> _kv;
    weight_tensor _token_embd;  // (n_vocab rows of n_embd)
    weight_tensor _output;      // (n_embd -> n_vocab); _token_embd's chunks when tied
    bool _output_tied = false;
    buffer _output_norm;  // (n_embd)
    buffer _rope_freq;    // (n_rot / 2, 4) turns per position (rope_turns_table)
    std::vector<layer_weights> _layers;

    // Activations, sized for max_batch_tokens T (rows_max R for the logits rows).
    buffer _x;       // (T, embd_stride) residual stream
    buffer _xn;      // (T, embd_stride) normed input of a block
    buffer _qkv;     // (T, qkv_stride) q | k | v
    buffer _att;     // (T, embd_stride) attention output
    buffer _gu;      // (T, gu_stride) gate | up (up at column n_ff)
    buffer _hid;     // (T, ff_stride) silu(gate) * up; pad columns stay 0
    buffer _final;   // (R, embd_stride) final-normed rows that want logits
    buffer _ints;    // host-visible (5T) ids | positions | slots | attention {seq, pos}
    buffer _tables;  // host-visible (seqs_max, blocks_per_seq_max) block tables
    buffer _logits;  // host-visible (R, n_vocab)
    // runner_options::logits_regions as buffers (empty: not imported), and where this step's
    // head writes (one of them, or _logits).
    std::vector<buffer> _logits_regions;
    const buffer* _logits_target = &_logits;
    buffer _summary;         // host-visible (R, ORDO_SUMMARY_WORDS) the logits rows' summaries
    buffer _summary_chunks;  // (R x chunks, ORDO_SUMMARY_WORDS) their chunks' (the first pass's)
    buffer _temperatures;    // host-visible (R) each logits row's temperature (its summary's)
    // host-visible (T, embd_stride) final-normed rows of the tokens whose hidden states a step
    // returns (embeddings: every token of an input when it is mean-pooled, so up to T rows),
    // pooled on the host into the hidden rows. As large as one activation buffer.
    buffer _hidden;
    std::vector<double> _hidden_sum;  // (n_embd) pool_hidden's accumulator
    buffer _spin;                     // scratch of the hang fault's spin dispatch
    buffer _kv_host;  // host-visible (kv_copy_blocks_max, n_layer, K|V) KV blocks of a copy job
    std::vector<VkBufferCopy> _kv_regions;  // (kv_copy_blocks_max) one layer buffer's regions
    std::vector<std::uint8_t> _kv_seen;     // (n_blocks) copy-in duplicate check
    std::uint64_t _kv_copies = 0;           // copy jobs run (segment labels)

    step_plan _plan;
    step_fault _fault;
    // How long wait_segment waits for a submission: watchdog_ms, or warmup_ms_max while
    // warm_up() runs.
    std::uint64_t _segment_wait_ms = 0;
    // Flash decoding (encode_attention's split grid): keys per split, splits per context, and
    // the partials buffer (attention_partials_floats).
    std::uint32_t _attn_split_keys = 0;
    bool _attention_flash = false;  // steps hand encode_attention their tokens (init_buffers)
    std::uint32_t _attn_max_splits = 0;
    buffer _attn_partials;
    // The tiled mat-mul's group split partial sums (mat_split_scratch_floats; empty where the
    // device's tuning never splits).
    buffer _mat_split;
    std::string _last_segment;
    std::chrono::steady_clock::time_point _segment_submitted;  // the segment in flight's submit
    std::vector<kernel_time> _timings;
};

}  // namespace ordo::gpu
