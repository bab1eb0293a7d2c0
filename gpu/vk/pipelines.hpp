// pipelines.hpp: creates the compute pipelines of gpu/vk/pipeline_table.hpp once per device, with
// per-device specialization constants (workgroup sizes from the device's limits and subgroup
// size): the weight-independent ones at create(), the weight-typed and specialized ones on
// first request. Owned next to gpu::device by the gpu actor; read by gpu::stream::dispatch.
#pragma once

#include <vulkan/vulkan.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "actors/runtime/result.hpp"
#include "gpu/vk/device.hpp"
#include "gpu/vk/mat_vec_shape.hpp"
#include "gpu/vk/pipeline_table.hpp"
#include "gpu/vk/shaders/abi.h"

namespace ordo::gpu {

enum class pipeline_id : std::uint32_t {
#define ORDO_X(name, ...) name,
    ORDO_GPU_PIPELINES(ORDO_X)
#undef ORDO_X
        count
};
constexpr std::size_t pipeline_count = static_cast<std::size_t>(pipeline_id::count);

// The pipeline table's property columns (pipeline_table.hpp).
// Workgroup-size class: which pipeline_tuning field sets specialization constant 0.
enum class wg_class {
    elementwise,  // elementwise_wg
    norm,         // norm_wg
    mat_vec,      // mat_vec_wg
    mat_rows,     // mat_rows_wg
    mat_tiled,    // 128: fixed by mul_mat.comp's tile mapping
    mat_coop,     // 128: mul_mat_cm.comp's 4 subgroups of 32
    mat_tx1,      // mat_tx1_wg
    mat_tx_tile,  // mat_tx_tile_wg
    attention,    // attention_wg
    subgroup,     // attention_tx_wg: one subgroup
    single,       // 1
    summary,      // ORDO_SUMMARY_WG: fixed by logits_summary.comp's order
};
// A device feature a pipeline cannot run without.
enum class pipeline_need {
    none,
    subgroup_arithmetic,
    subgroup_ballot,
    cooperative_matrix,
    float16,  // f16 arithmetic (shaderFloat16)
};
// When a pipeline is built: by pipelines::create, or on request (find per weight type, for_k
// per K, for_tile per row tile, for_cols per token count).
enum class made_when { create, type, k, tile, cols };

struct pipeline_props {
    wg_class wg;
    std::uint32_t texel_bindings;
    pipeline_need needs;
    made_when made;
};
const pipeline_props& props_of(pipeline_id id);

std::string_view pipeline_name(pipeline_id id);

struct pipeline {
    VkPipeline handle = VK_NULL_HANDLE;
    VkPipelineLayout layout = VK_NULL_HANDLE;
    VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
    std::uint32_t bindings = 0;
    std::uint32_t push_bytes = 0;
    std::uint32_t workgroup_size = 0;      // specialization constant 0 (lanes per workgroup)
    std::uint32_t rows_per_workgroup = 1;  // specialization constant 1 where used (mul_mat_vec:
                                           // rows per 8-lane team)
    std::uint32_t k = 0;                   // specialization constant 2 (K) where used, else 0
                                           // (mul_mat_vec: tokens per pass)
    std::uint32_t tile_rows = 0;           // constant 3: mul_mat_tx tx4/txm rows per lane
                                           // (mul_mat_vec: its unroll)
    // Bit i set: binding i is a uniform texel buffer (the buffer's R32G32B32A32_UINT
    // texel_view()), not a storage buffer. Its shader addresses texels from the buffer start.
    std::uint32_t texel_bindings = 0;

    std::uint32_t helpers = 1;       // constant 4: mul_mat_vec lanes per group
    std::uint32_t token_groups = 8;  // constant 11: the tiled mul_mat's token groups (8 or 4)
                                     // (mul_mat_cm: 8 its wide tile, 4 its narrow one)

    // tx4/txm: weight rows one workgroup covers.
    std::uint32_t workgroup_rows() const { return workgroup_size * tile_rows; }
};

// mul_mat_vec: weight rows one workgroup covers (its 8-lane teams times rows per team).
inline std::uint32_t mat_vec_workgroup_rows(const pipeline& pl) {
    return pl.workgroup_size / (abi::ORDO_MAT_GROUPS * pl.helpers) * pl.rows_per_workgroup;
}

// tx4/txm rows per lane (specialization constant 3) of a `lanes`-wide workgroup asked to cover
// about `wg_rows` weight rows: the one formula pipelines::build and the tile choice share.
inline std::uint32_t tx_rows_per_lane(std::uint32_t lanes, std::uint32_t wg_rows) {
    return wg_rows / lanes > 1 ? wg_rows / lanes : 1;
}

// The cooperative-matrix mat-mul's workgroup tile (mul_mat_cm.comp, specialization constants
// 12-14): its 4 subgroups in `sg_rows` rows of subgroups (1, 2 or 4), each owning `frag_rows` x
// `frag_tokens` fragments of 16 x 16 outputs (1, 2 or 4 each: up to 4 x 4, 64 x 64 outputs a
// subgroup, as llama.cpp's largest cooperative-matrix tile).
struct mat_coop_shape {
    std::uint32_t sg_rows = 2;
    std::uint32_t frag_rows = 2;
    std::uint32_t frag_tokens = 2;
    std::uint32_t rows() const { return sg_rows * frag_rows * 16; }
    std::uint32_t tokens() const { return (sg_rows == 0 ? 0 : 4 / sg_rows) * frag_tokens * 16; }
    // Its shared memory (the emulation's too): the staged weight and activation tiles (40
    // halves a row) and 4 output fragments of 16 x 16 floats.
    std::uint64_t shared_bytes() const { return 2 * 40 * (rows() + tokens()) + 4 * 256 * 4; }
    // The loop iterations one lane of its emulation (mul_mat_cme) runs over K elements, unsplit:
    // each K step's staging (4 stores a part), fragment loops and 8 accumulator elements a
    // product, then the zeroing and the stores. llvmpipe ends a shader's loops silently past
    // device_info::loop_iterations_max; encode_mul_mat refuses a K past it.
    std::uint64_t emulated_loop_iterations(std::uint32_t k) const {
        const std::uint64_t frags = frag_rows * frag_tokens, steps = (k + 31) / 32;
        const std::uint64_t stage = ((rows() * 8 + 127) / 128 + (tokens() * 8 + 127) / 128) * 5;
        const std::uint64_t step = 1 + stage + 2 + 2 * frag_rows + 2 * frags + 2 * frags * 8;
        return steps * step + frags * 18 + frag_rows + 2;
    }
    bool valid() const {
        auto one_two_four = [](std::uint32_t v) { return v == 1 || v == 2 || v == 4; };
        return one_two_four(sg_rows) && one_two_four(frag_rows) && one_two_four(frag_tokens);
    }
};
// Whether `device` can run `tile`: a valid shape whose shared memory fits (pipelines::create
// refuses a tuning any of whose tiles fails, with this message).
status check_mat_coop_tile(const mat_coop_shape& tile, const device_info& device);

// Workgroup sizes picked per device. Defaults come from tuning_for(); tests and the bench may
// override them to check that results do not depend on the choice.
struct pipeline_tuning {
    // Layers per command-buffer segment when gpu.flush_every_layers is 0 (the device's choice).
    // A segment boundary costs a fence wait and a submission with the GPU idle between them:
    // H200 (gpu/PERF.md, session 24), the 1B Q4_K file in one 16-layer segment against four:
    // 2.41 vs 2.54 ms a decode step at one sequence, 24.8 vs 40.7 at 64 (sessions 20 and 23
    // found the same at one sequence). A CPU device (lavapipe) keeps 4: its segments run for
    // seconds, and the watchdog bounds each.
    std::uint32_t flush_every_layers = 0;
    // Layers in a step's first segment where the segments are the device's choice (0: as many
    // as the others). Nothing runs on the GPU until the first segment is recorded and
    // submitted, and the next is recorded while it runs: a short first segment starts the GPU
    // early and hides the recording of the rest (lavapipe, 12 layers of the 110M model in one
    // segment: 0.43 ms of recording before anything ran), at the price of one more boundary
    // (a fence wait and a submission). Session 24's H200 A/B (16-layer segments 0.13 ms a step
    // faster than 4-layer ones) leaves the balance open: 0 everywhere until a GPU run of
    // ordo-bench --first-segment measures it (gpu/PERF.md session 25).
    std::uint32_t first_segment_layers = 0;
    // Whether attention's automatic path sends a step's decode tokens (beyond what the split
    // grid serves, with grouped-query heads) to attention_flash, a tile per token's query heads
    // sharing its KV rows, instead of attention.comp. Off: on an H200 (gpu/PERF.md, session
    // 24) the token tiles were slower for 64 sequences at 16-80 keys (0.54 vs 0.37 ms a 1B
    // step) and at 512 (0.43 vs 0.33 ms a layer); long contexts are unmeasured. Same bits
    // either way.
    bool attention_token_tiles = false;
    std::uint32_t elementwise_wg = 0;  // get_rows, rope, swiglu, add, kv_write
    std::uint32_t norm_wg = 0;         // rms_norm (power of two)
    std::uint32_t mat_vec_wg = 0;      // mul_mat_vec lanes (a multiple of 8: its teams)
    std::uint32_t mat_vec_rows = 0;    // mul_mat_vec weight rows per 8-lane team
    std::uint32_t mat_vec_unroll = 0;  // mul_mat_vec units each lane loads before summing
    // ... for the 32-element units of the block types (Q8_0 .. Q6_K); mat_vec_unroll is for
    // F32, F16 and BF16 (4- and 8-element units). H200, session 15: Q4_K's q|k|v mat-vec 0.61
    // -> 0.14 ms at 4 instead of 2, while F16's was no faster (gpu/PERF.md).
    std::uint32_t mat_vec_block_unroll = 0;
    // mul_mat_vec lanes per group (1, 2, 4 or 8; a divisor of both unrolls) for up to
    // mat_vec_split_cols tokens: helpers compute products, the group's owner adds them in
    // order (mul_mat_vec.comp H). Default 1: unmeasured on a GPU (gpu/PERF.md, session 13).
    std::uint32_t mat_vec_split = 1;
    std::uint32_t mat_vec_split_cols = 2;
    std::uint32_t attention_wg = 0;  // attention lanes (head_dim <= wg * ORDO_ATTN_ACC)
    // attention.comp's load scheduling (no bit depends on it): K pairs a lane loads before
    // scoring them, and keys whose V values it loads before adding them (a divisor of
    // attention_wg). A decode token's 16-80 keys took ~30 us a layer on an H200 (session 24),
    // unmoved by groups of 4 and 8: ordo-bench-kernels --decode-attention --attn-k-pairs /
    // --attn-v-group measure larger ones (gpu/PERF.md session 32). Not measured on a GPU yet.
    std::uint32_t attention_k_pairs = 4;
    std::uint32_t attention_v_group = 8;
    std::uint32_t mat_rows_wg = 0;  // mul_mat_rows lanes (= weight rows per workgroup)
    // The tiled mul_mat splits mat_order.glsl's 8 groups over its grid's z (8 times the
    // workgroups, each walking an eighth of K, then mul_mat_fold) when its grid has fewer
    // workgroups than this and the stream has the scratch (0: never). A GPU's batched decode
    // grid (16-64 tokens: one token tile, 32-256 row tiles of the 1B shape) leaves most of its
    // multiprocessors idle and each workgroup walking K alone (gpu/PERF.md, session 20).
    std::uint32_t mat_tiled_split_wg = 0;
    // The tiled mul_mat's outputs per lane: rows x tokens (4 or 8 each; specialization
    // constants 5 and 6), a wide tile of 16 x rows weight rows by 8 x tokens tokens per
    // workgroup (a narrow one: 32 x rows by 4 x tokens, mat_tiled_narrow).
    std::uint32_t mat_tiled_rows_per_lane = 4;
    std::uint32_t mat_tiled_tokens_per_lane = 4;
    // How the tiled mul_mat lays out its shared tiles and grid (constants 7-10; no bit depends
    // on them, mul_mat.comp): XOR-swizzled tiles, so a subgroup's staging stores by parts hit
    // 32 distinct banks instead of 8-way conflicts; K elements staged per step (32 or 64: half
    // the barriers for twice the shared memory); consecutive workgroups on the token tiles of
    // one row tile (a prompt's token tiles share that weight tile through L2); staging by rows
    // (a lane dequantizes 4 parts of one row's unit, a subgroup stores 32 rows' floats at one
    // k) instead of by parts (8 lanes dequantize one unit for a part each). tuning_for says
    // which each device gets. Not measured on a GPU yet: ordo-bench-kernels --prefill-1b
    // --mm-swizzle / --mm-k-step / --mm-tokens-first / --mm-row-stage / --mm-narrow are the A/B
    // (gpu/PERF.md, session 27).
    bool mat_tiled_swizzle = false;
    std::uint32_t mat_tiled_k_step = 32;
    bool mat_tiled_tokens_first = false;
    bool mat_tiled_row_staging = false;
    // Steps whose token count a narrow tile (4 token groups: 32 x rows_per_lane rows by 4 x
    // tokens_per_lane tokens) pads less than the wide one (8 groups) run it: 16 decoding
    // sequences fill a 16-token tile where half a 32-token tile's lanes multiplied zeros. The
    // same bits either way (constant 11). tuning_for: wherever the device's shared memory
    // holds the narrow tile.
    bool mat_tiled_narrow = false;
    // The tiled steps on cooperative matrices (mul_mat_cm.comp: tensor cores, f16 inputs, an
    // order the driver chooses): only under gpu.batch_invariant = false (runner_options::
    // batch_invariant), on a device with device_info::cooperative_matrix. Off everywhere by
    // default: a token's logits then depend on which kernel ran it.
    bool mat_coop = false;
    // Tests and the bench: mat_coop runs mul_mat_cme (the same kernel with its matrix
    // operations written out in plain GLSL), so its staging and stores run on any device.
    bool mat_coop_emulated = false;
    // Its tiles: the wide one, the narrow one for steps of at most its tokens (16 decoding
    // sequences), and the large one (llama.cpp's largest: 64 x 64 outputs a subgroup, four
    // times the products per staged element of the wide tile) for steps of at least the token
    // count the runner measures at warm-up where it beats the wide one (stream::
    // set_mat_coop_large_from; never unless set). Not measured on a GPU yet (ordo-bench-kernels
    // --coop-wide, --coop-narrow). tuning_for: the large tile is the wide one on a device whose
    // shared memory cannot hold it.
    mat_coop_shape mat_coop_wide{2, 2, 2};
    mat_coop_shape mat_coop_narrow{4, 1, 1};
    mat_coop_shape mat_coop_large{2, 4, 4};
    // mul_mat_cm splits its K steps over 8 workgroups (mul_mat_fold adds their partials) for
    // grids of fewer workgroups than this: batched decode's small matrices (16 tokens x 2048
    // rows is 32 workgroups), not a prompt's (whose partials would cost more than they free).
    std::uint32_t mat_coop_split_wg = 512;
    // mat_path::automatic picks mul_mat_rows up to this many tokens (0: never, mul_mat_vec
    // instead); above it the tiled mul_mat. At most mat_vec_tokens_max.
    std::uint32_t rows_tokens_max = 0;
    // mul_mat_tx tx4/txm lanes: each owns 128 / lanes rows (16 at 8 lanes), so a small group
    // keeps enough workgroups for every thread on 768-row outputs (gpu/PERF.md).
    std::uint32_t mat_tx_tile_wg = 0;
    std::uint32_t mat_tx1_wg = 0;  // tx1 lanes: the subgroup (8-lane teams, mul_mat_tx.comp)
    // mat_path::automatic picks the texel-fetch mul_mat_tx kernels (when the operands' buffers
    // have texel views); measured 5-17x faster than the others on lavapipe (gpu/PERF.md).
    bool prefer_texel_kernels = false;
    // attention_tx lanes: must equal the subgroup size (its lanes merge through subgroup ops).
    std::uint32_t attention_tx_wg = 0;
    // Each logits row's summary (logits_summary.comp) after the head. On a GPU it replaces the
    // host's pass over a 128k-entry row (0.3-1.5 ms a row, gpu/PERF.md session 21); on a CPU
    // device it runs on the host's own cores and costs more than that pass (lavapipe, session
    // 22: 2.2 ms a 32000-entry row against 0.1-0.25 ms), so CPU devices go without it.
    bool row_summaries = true;
    // Fault injection (tests): the creation of every pipeline whose name starts with this
    // fails as a driver's would (VK_ERROR_UNKNOWN; the NVIDIA H100's driver fails
    // mul_mat_tx1t4_q4_k at K 8192 that way). Empty: none.
    std::string fault_create_fails;
};

pipeline_tuning tuning_for(const device_info& info);

// How the invariant tiled mul_mat lays out its shared tiles and grid (pipeline_tuning::
// mat_tiled_swizzle, _k_step, _tokens_first and _row_staging: constants 7-10). No bit depends
// on it, and which is fastest depends on the device and the step's token count, so the runner
// times them at warm-up (runner::choose_mat_tiled_layouts) and the stream runs each step in the
// one measured for its token count (stream::set_mat_tiled_layouts).
struct mat_tiled_layout {
    bool swizzle = false;
    std::uint32_t k_step = 32;
    bool tokens_first = false;
    bool row_staging = false;

    // One nonzero number per layout (the pipelines' variant key).
    std::uint32_t key() const {
        return 1u << 31 | k_step << 3 | (row_staging ? 4u : 0u) | (tokens_first ? 2u : 0u) |
               (swizzle ? 1u : 0u);
    }
    // "s t r k32": swizzled tiles, token tiles first, staging by rows (each only when on), K step.
    std::string name() const;
    friend bool operator==(const mat_tiled_layout&, const mat_tiled_layout&) = default;
};
mat_tiled_layout mat_tiled_layout_of(const pipeline_tuning& t);
pipeline_tuning with_mat_tiled_layout(const pipeline_tuning& t, const mat_tiled_layout& l);
// Whether the tiled mul_mat runs in layout `l` under `t` on a device with `shared` bytes of
// shared memory (a K step of 32 or 64, its tiles within `shared`). Error (gpu_bad_config)
// naming it and its bytes.
status check_mat_tiled_layout(const pipeline_tuning& t, const mat_tiled_layout& l,
                              std::uint64_t shared);
// The layouts the runner times at warm-up: the tuning's first, then each of its knobs turned,
// staging by rows (K 32 and 64), those check_mat_tiled_layout passes, none twice.
std::vector<mat_tiled_layout> mat_tiled_layout_candidates(const pipeline_tuning& t,
                                                          std::uint64_t shared);

// The shared memory mul_mat_vec's widest variant for up to `cols` tokens per pass takes under
// `t` (pipelines::create refuses a tuning whose 1-token variant would not fit the device).
std::uint64_t mat_vec_shared_bytes(const pipeline_tuning& t,
                                   std::uint32_t cols = abi::ORDO_MMV_COLS);
// The most tokens per pass whose mul_mat_vec variants fit `shared` bytes under `t` (0: none).
// A step of more tokens runs that variant in passes (mul_mat_vec.comp's c0 loop): the same
// bits, each pass reading the weights again.
std::uint32_t mat_vec_cols_max(const pipeline_tuning& t, std::uint64_t shared);
// mul_mat_vec's lanes per group at `cols` tokens under `t`.
std::uint32_t mat_vec_helpers(const pipeline_tuning& t, std::uint32_t cols);
// `t` with mul_mat_vec's one-token shape `s` (its zero fields: t's own): the tuning that
// shape's variant is built under (pipelines::for_cols).
pipeline_tuning with_mat_vec_shape(const pipeline_tuning& t, mat_vec_shape s);
// Whether mul_mat_vec runs in shape `s` at one token under `t` on a device with `shared` bytes
// of shared memory: split 1, 2, 4 or 8 dividing an unroll of at most 8, the workgroup a
// multiple of 8 x split lanes, its staging within `shared`. Error (gpu_bad_config) naming it.
status check_mat_vec_shape(const pipeline_tuning& t, mat_vec_shape s, std::uint64_t shared);
// The shapes the runner times for a weight at warm-up (runner::choose_mat_vec_shapes): the
// tuning's own first (mat_vec_shape{}), then those of mat_vec_shapes_tried that differ from it
// and pass check_mat_vec_shape. `block_units`: the weight is a 32-element block type (whose
// unroll is mat_vec_block_unroll), else F32, F16 or BF16.
// "HxU": the lanes a group and units a lane of mul_mat_vec's one-token variant in shape `s`
// under `t` (its zero fields t's), for a 32-element block type (`block_units`) or not.
std::string mat_vec_shape_name(const pipeline_tuning& t, mat_vec_shape s, bool block_units);
std::vector<mat_vec_shape> mat_vec_shape_candidates(const pipeline_tuning& t, bool block_units,
                                                    std::uint64_t shared);
// (split, unroll) pairs timed at warm-up: 2-8 units of a group loaded a step (a row's loads in
// flight grow with the unroll, whatever the split), spread over 1-8 lanes (on an H200 the 2048-row
// F16 matrices read 0.5-0.8 TB/s on 8 lanes a row, and 20-30% faster on 32: gpu/PERF.md sessions 13
// and 15; the best shape depends on the matrix, the type and the card).
inline constexpr mat_vec_shape mat_vec_shapes_tried[] = {{1, 2}, {2, 2}, {1, 4}, {2, 4}, {4, 4},
                                                         {1, 8}, {2, 8}, {4, 8}, {8, 8}};

// attention.comp's load groups at most (pipeline_tuning::attention_k_pairs, attention_v_group):
// each is an array of registers per lane.
inline constexpr std::uint32_t attention_k_pairs_max = 32;
inline constexpr std::uint32_t attention_v_group_max = 64;

// The tiled mul_mat's token groups: the wide tile's and the narrow one's (mul_mat.comp TG).
inline constexpr std::uint32_t mat_tiled_groups_wide = 8;
inline constexpr std::uint32_t mat_tiled_groups_narrow = 4;

// The tiled mul_mat's workgroup tile under `t` with `groups` token groups: weight rows, tokens
// (the product does not depend on the groups).
inline std::uint32_t mat_tiled_rows(const pipeline_tuning& t,
                                    std::uint32_t groups = mat_tiled_groups_wide) {
    return 128 / groups * t.mat_tiled_rows_per_lane;
}
inline std::uint32_t mat_tiled_tokens(const pipeline_tuning& t,
                                      std::uint32_t groups = mat_tiled_groups_wide) {
    return groups * t.mat_tiled_tokens_per_lane;
}
// The token groups of the tile a tiled step of `n_tokens` runs under `t`: the narrow tile where
// it pads the step to fewer tokens than the wide one (t.mat_tiled_narrow), else the wide one.
inline std::uint32_t mat_tiled_groups_for(const pipeline_tuning& t, std::uint32_t n_tokens) {
    auto padded = [&](std::uint32_t groups) {
        std::uint32_t tn = mat_tiled_tokens(t, groups);
        return (std::uint64_t(n_tokens) + tn - 1) / tn * tn;
    };
    return t.mat_tiled_narrow && padded(mat_tiled_groups_narrow) < padded(mat_tiled_groups_wide)
               ? mat_tiled_groups_narrow
               : mat_tiled_groups_wide;
}
// The cooperative-matrix kernel's large-tile variant (its key among the token-group variants).
inline constexpr std::uint32_t mat_coop_groups_large = 16;
// The cooperative-matrix tile a step of `n_tokens` runs under `t`: mat_tiled_groups_narrow (the
// narrow tile) where its tokens hold the step, mat_coop_groups_large (the large tile) from
// `large_from` tokens (0: never), else mat_tiled_groups_wide; and that tile.
inline std::uint32_t mat_coop_groups_for(const pipeline_tuning& t, std::uint32_t n_tokens,
                                         std::uint32_t large_from = 0) {
    if (n_tokens <= t.mat_coop_narrow.tokens()) return mat_tiled_groups_narrow;
    return large_from != 0 && n_tokens >= large_from ? mat_coop_groups_large
                                                     : mat_tiled_groups_wide;
}
inline const mat_coop_shape& mat_coop_tile(const pipeline_tuning& t, std::uint32_t groups) {
    return groups == mat_tiled_groups_narrow ? t.mat_coop_narrow
           : groups == mat_coop_groups_large ? t.mat_coop_large
                                             : t.mat_coop_wide;
}
// The shared memory the tiled mul_mat takes under `t` (its weight and activation tiles), the
// larger of its tiles' where it runs both.
inline std::uint64_t mat_tiled_shared_bytes(const pipeline_tuning& t) {
    auto bytes = [&](std::uint32_t groups) {
        return std::uint64_t(4) * t.mat_tiled_k_step *
               (mat_tiled_rows(t, groups) + mat_tiled_tokens(t, groups));
    };
    std::uint64_t wide = bytes(mat_tiled_groups_wide);
    return t.mat_tiled_narrow ? std::max(wide, bytes(mat_tiled_groups_narrow)) : wide;
}

// Floats of scratch the tiled mul_mat's group split needs under `t` for any weight of at most
// `rows_max` rows (one chunk) at up to `tokens_max` tokens: 8 partial sums per output of the
// largest grid it splits, at most mat_split_scratch_bytes_max (0 when `t` never splits). A
// grid whose partials do not fit runs unsplit (the 1B shape's 128k-row output head past 128
// tokens). Measured on an H200 (gpu/PERF.md session 20): the head at 64 sequences unsplit
// doubled a 64-sequence step's mat-mul time (26.6 against 13.0 ms), although its grid of
// 4008 workgroups fills the GPU: each workgroup's walk over all of K is the cost.
constexpr std::uint64_t mat_split_scratch_bytes_max = 512ull << 20;
std::uint64_t mat_split_scratch_floats(const pipeline_tuning& t, std::uint64_t rows_max,
                                       std::uint32_t tokens_max);

// XXH3-64 of every embedded SPIR-V module, in table order: what this build compiles. The
// pipeline cache file (pipeline_cache.hpp) is valid only for the build that wrote it.
std::uint64_t shader_build_id();

// What a variant is built as beyond its id, K, tile rows and token groups: another
// mul_mat_vec shape or tiled layout than the tuning's (for_cols, for_token_groups): its
// key among the variants (0: the tuning's own), the tuning it is built under (nullptr: the
// pipelines'), and its name in messages.
struct pipeline_form {
    std::uint32_t key = 0;
    const pipeline_tuning* tuning = nullptr;
    std::string name;
};

class pipelines {
public:
    // `cache`: the VkPipelineCache every pipeline is created through (pipeline_cache.hpp), or
    // none; it must outlive this object.
    static result<std::unique_ptr<pipelines>> create(const device& dev,
                                                     const pipeline_tuning& tuning,
                                                     VkPipelineCache cache = VK_NULL_HANDLE);
    ~pipelines();
    pipelines(const pipelines&) = delete;
    pipelines& operator=(const pipelines&) = delete;

    // A pipeline built by create(): every id but those built on request (built_on_request():
    // find, for_k, for_tile, for_cols); asking get() for one is a programming error.
    const pipeline& get(pipeline_id id) const;
    const pipeline_tuning& tuning() const { return _tuning; }
    const device& dev() const { return _device; }

    // Pipelines specialized on K (specialization constant 2): the mul_mat_tx1_* ids (K = the
    // weight's n_in) and the attention_tx* ids (K = head_dim), whose table entries stay empty.
    // Built on first request and kept (llvmpipe compiles one in ~10-100 ms, so the runner asks
    // for them at load, not on the step path).
    // Thread-safe; the returned pipeline lives as long as this object.
    static bool specialized_on_k(pipeline_id id) { return props_of(id).made == made_when::k; }
    result<const pipeline*> for_k(pipeline_id id, std::uint32_t k) const;

    // The weight-typed pipelines (get_rows_* and mul_mat_*: 13 types x 9 kernels) are not built
    // by create(): llvmpipe compiles each in 10-100 ms and a model uses a few types, so each is
    // built on its first request and kept (thread-safe, like for_k). The runner asks for a
    // weight's pipelines when it uploads it (prepare_mul_mat), never on the step path.
    static bool built_on_request(pipeline_id id) { return props_of(id).made != made_when::create; }
    // Any id but the K-specialized ones: get()'s pipeline, or a weight-typed one, built on its
    // first request. Errors: the build's, gpu_bad_config for a K-specialized id.
    result<const pipeline*> find(pipeline_id id) const;

    // The mul_mat_vec_* pipeline specialized on `cols` tokens per pass over the weights
    // (specialization constant 2, 1..ORDO_MMV_COLS): its accumulators and loops are sized by
    // it, so a one-token decode carries no unused token slots. Built on first request and kept,
    // like for_k (the runner asks at load). Other ids or counts: an error. `shape` (one token
    // only): the variant of that shape (check_mat_vec_shape), the tuning's when tuned().
    result<const pipeline*> for_cols(pipeline_id id, std::uint32_t cols,
                                     mat_vec_shape shape = {}) const;

    // The tx4/txm (mul_mat_tx4_*, mul_mat_txm_*) pipeline whose workgroups cover about
    // `wg_rows` weight rows (ORDO_TX_TILE_ROWS or ORDO_TX_TILE_ROWS_NARROW), built on first
    // request and kept, like for_k (the runner asks at load). The pipeline's
    // workgroup_rows() says what it covers (lanes x rows per lane). Other ids or tiles: an error.
    result<const pipeline*> for_tile(pipeline_id id, std::uint32_t wg_rows) const;

    // The tiled mul_mat_* pipeline with `groups` token groups (mat_tiled_groups_wide: find()'s;
    // mat_tiled_groups_narrow, and mat_coop_groups_large for mul_mat_cm/cme: built on first
    // request and kept, like for_k). Other ids or
    // groups: an error.
    // `layout` (the invariant tiled kernel's ids only; nullptr: the tuning's): the variant in
    // that layout (check_mat_tiled_layout).
    result<const pipeline*> for_token_groups(pipeline_id id, std::uint32_t groups,
                                             const mat_tiled_layout* layout = nullptr) const;

private:
    explicit pipelines(const device& dev) : _device(dev) {}
    status build(pipeline& pl, pipeline_id id, std::uint32_t k, std::uint32_t wg_rows,
                 std::uint32_t token_groups = mat_tiled_groups_wide,
                 const pipeline_form& form = {}) const;
    result<const pipeline*> variant(pipeline_id id, std::uint32_t k, std::uint32_t wg_rows,
                                    std::uint32_t token_groups = mat_tiled_groups_wide,
                                    const pipeline_form& form = {}) const;
    // The variant of that key built already, else nullptr (thread-safe): the step path finds a
    // shape's or a layout's pipeline without checking or describing it again.
    const pipeline* built(pipeline_id id, std::uint32_t k, std::uint32_t wg_rows,
                          std::uint32_t token_groups, std::uint32_t form_key) const;
    void destroy(pipeline& pl) const;

    const device& _device;
    pipeline_tuning _tuning;
    std::uint32_t _mat_vec_cols = 0;  // mat_vec_cols_max on this device
    VkPipelineCache _cache = VK_NULL_HANDLE;
    std::array<pipeline, pipeline_count> _all{};  // create()'s; weight-typed entries stay empty
    // Pipelines built on request (find, for_k, for_tile, for_cols, for_token_groups), keyed by
    // (id, K, tile rows, token groups, form: a mul_mat_vec shape or a tiled layout).
    mutable std::mutex _variants_mutex;
    mutable std::map<
        std::tuple<pipeline_id, std::uint32_t, std::uint32_t, std::uint32_t, std::uint32_t>,
        std::unique_ptr<pipeline>>
        _variants;
};

}  // namespace ordo::gpu
