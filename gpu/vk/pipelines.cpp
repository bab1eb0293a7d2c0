// pipelines.cpp: see pipelines.hpp.
#include "gpu/vk/pipelines.hpp"

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <string>

#include "gpu/vk/kernels.hpp"
#include "gpu/vk/shaders/abi.h"
#include "gpu/vk/vk_util.hpp"

namespace ordo::gpu {

namespace spirv {
#define ORDO_X(name, bindings, push, ...) \
    extern const std::uint32_t name[];    \
    extern const std::size_t name##_words;
ORDO_GPU_PIPELINES(ORDO_X)
#undef ORDO_X
}  // namespace spirv

#define ORDO_X(name, bindings, push, ...) \
    static_assert(sizeof(abi::push) % 4 == 0 && sizeof(abi::push) <= 128, #push " size");
ORDO_GPU_PIPELINES(ORDO_X)
#undef ORDO_X

namespace {

// What build() needs of each table row: the SPIR-V and the interface sizes.
struct pipeline_source {
    const std::uint32_t* code;
    std::size_t words;
    std::uint32_t bindings;
    std::uint32_t push_bytes;
};

const pipeline_source& source_of(pipeline_id id) {
    static const pipeline_source sources[] = {
#define ORDO_X(name, bindings, push, ...) \
    {spirv::name, spirv::name##_words, bindings, static_cast<std::uint32_t>(sizeof(abi::push))},
        ORDO_GPU_PIPELINES(ORDO_X)
#undef ORDO_X
    };
    return sources[static_cast<std::size_t>(id)];
}

}  // namespace

const pipeline_props& props_of(pipeline_id id) {
    static const pipeline_props props[] = {
#define ORDO_X(name, bindings, push, wg, texel, needs, made) \
    {wg_class::wg, texel, pipeline_need::needs, made_when::made},
        ORDO_GPU_PIPELINES(ORDO_X)
#undef ORDO_X
    };
    return props[static_cast<std::size_t>(id)];
}

std::uint64_t shader_build_id() {
    // The embedded modules never change while the process runs: hashed once, not per build.
    static const std::uint64_t id = [] {
        XXH3_state_t* st = XXH3_createState();
        ORDO_GPU_CHECK(st != nullptr, "XXH3_createState");
        XXH3_64bits_reset(st);
        for (std::size_t i = 0; i < pipeline_count; ++i) {
            const pipeline_source& src = source_of(static_cast<pipeline_id>(i));
            XXH3_64bits_update(st, src.code, src.words * sizeof(std::uint32_t));
        }
        const std::uint64_t digest = XXH3_64bits_digest(st);
        XXH3_freeState(st);
        return digest;
    }();
    return id;
}

std::string_view pipeline_name(pipeline_id id) {
    static constexpr std::string_view names[] = {
#define ORDO_X(name, ...) #name,
        ORDO_GPU_PIPELINES(ORDO_X)
#undef ORDO_X
    };
    auto i = static_cast<std::size_t>(id);
    return i < pipeline_count ? names[i] : "unknown";
}

std::uint32_t mat_vec_helpers(const pipeline_tuning& t, std::uint32_t cols) {
    return cols <= t.mat_vec_split_cols ? t.mat_vec_split : 1;
}

bool mat_vec_block_units(pipeline_id id) {
    // The mul_mat_vec kernels' rows are in weight_types.h's order from their f32 row.
    for (pipeline_id base : {pipeline_id::mul_mat_vec_f32, pipeline_id::mul_mat_vec_norm_f32,
                             pipeline_id::mul_mat_vec_glu_f32, pipeline_id::mul_mat_vec_rope32_f32,
                             pipeline_id::mul_mat_vec_rope16_f32}) {
        auto w = static_cast<std::uint32_t>(id) - static_cast<std::uint32_t>(base);
        if (id >= base && w < abi::ORDO_WTYPE_COUNT) {
            return w != abi::ORDO_WTYPE_F32 && w != abi::ORDO_WTYPE_F16 &&
                   w != abi::ORDO_WTYPE_BF16;
        }
    }
    return false;
}

std::uint64_t mat_vec_shared_bytes(const pipeline_tuning& t, std::uint32_t cols_max) {
    // mul_mat_vec.comp's xs[], partial[] and dsh[] at the token count that needs the most, in
    // its widest variant: the GLU one (twice the rows per team, and the fused norm's nsum[]
    // and ninv[]; the ROPE one's partial[] and ys[] take at most 9/16 of GLU's partial[]),
    // for the block types' units (32 elements: 9 vec4s with the padding, 8 parts,
    // mat_vec_block_unroll) and for F16's (8 elements: 3 vec4s, 2 parts, mat_vec_unroll).
    std::uint64_t most = 0;
    const std::uint64_t rows = 2ull * t.mat_vec_rows;
    for (std::uint64_t cols = 1; cols <= cols_max; ++cols) {
        std::uint64_t h = mat_vec_helpers(t, static_cast<std::uint32_t>(cols));
        std::uint64_t teams = t.mat_vec_wg / (abi::ORDO_MAT_GROUPS * h);
        std::uint64_t partial = 4ull * t.mat_vec_wg * rows * cols;
        std::uint64_t norm = 4ull * cols * (abi::ORDO_NORM_PARTS + 1);
        for (auto [unroll, vec4s, parts] :
             {std::array<std::uint64_t, 3>{t.mat_vec_block_unroll, abi::ORDO_QK / 4 + 1,
                                           abi::ORDO_QK / 4},
              std::array<std::uint64_t, 3>{t.mat_vec_unroll, 3, 2}}) {
            std::uint64_t xs = 16ull * cols * abi::ORDO_MAT_GROUPS * unroll * vec4s;
            std::uint64_t dsh =
                h == 1 ? 4 : 4ull * teams * rows * abi::ORDO_MAT_GROUPS * unroll * parts * cols;
            most = std::max(most, xs + partial + dsh + norm);
        }
    }
    return most;
}

namespace {

// mul_mat_vec's part of a tuning's validity, with its one-token staging (the least every
// variant needs) within `shared` bytes.
bool mat_vec_tuning_valid(const pipeline_tuning& t, std::uint64_t shared) {
    auto lanes_per_group = [](std::uint32_t v) { return v == 1 || v == 2 || v == 4 || v == 8; };
    return t.mat_vec_wg != 0 && t.mat_vec_rows != 0 && lanes_per_group(t.mat_vec_split) &&
           t.mat_vec_unroll != 0 && t.mat_vec_unroll <= 8 && t.mat_vec_block_unroll != 0 &&
           t.mat_vec_block_unroll <= 8 && t.mat_vec_unroll % t.mat_vec_split == 0 &&
           t.mat_vec_block_unroll % t.mat_vec_split == 0 &&
           t.mat_vec_wg % (abi::ORDO_MAT_GROUPS * t.mat_vec_split) == 0 &&
           mat_vec_shared_bytes(t, 1) <= shared;
}

}  // namespace

pipeline_tuning with_mat_vec_shape(const pipeline_tuning& t, mat_vec_shape s) {
    pipeline_tuning r = t;
    if (s.split != 0) {
        r.mat_vec_split = s.split;
        r.mat_vec_split_cols = 1;
    }
    if (s.unroll != 0) {
        r.mat_vec_unroll = s.unroll;
        r.mat_vec_block_unroll = s.unroll;
    }
    return r;
}

status check_mat_vec_shape(const pipeline_tuning& t, mat_vec_shape s, std::uint64_t shared) {
    if (mat_vec_tuning_valid(with_mat_vec_shape(t, s), shared)) return {};
    return gpu_error(gpu_failure::bad_config,
                     "mul_mat_vec shape " + std::to_string(s.split) + " lanes a group x " +
                         std::to_string(s.unroll) + " units a lane: needs 1, 2, 4 or 8 lanes " +
                         "dividing an unroll of at most 8, " + std::to_string(t.mat_vec_wg) +
                         " lanes a multiple of 8 x the split, and its staging within " +
                         std::to_string(shared) + " bytes");
}

std::string mat_vec_shape_name(const pipeline_tuning& t, mat_vec_shape s, bool block_units) {
    const pipeline_tuning own = with_mat_vec_shape(t, s);
    return std::to_string(mat_vec_helpers(own, 1)) + "x" +
           std::to_string(block_units ? own.mat_vec_block_unroll : own.mat_vec_unroll);
}

std::vector<mat_vec_shape> mat_vec_shape_candidates(const pipeline_tuning& t, bool block_units,
                                                    std::uint64_t shared) {
    const mat_vec_shape own{mat_vec_helpers(t, 1),
                            block_units ? t.mat_vec_block_unroll : t.mat_vec_unroll};
    std::vector<mat_vec_shape> out{mat_vec_shape{}};
    for (const mat_vec_shape& s : mat_vec_shapes_tried) {
        if (s != own && check_mat_vec_shape(t, s, shared)) out.push_back(s);
    }
    return out;
}

std::string mat_tiled_layout::name() const {
    return std::string(swizzle ? "s " : "") + (tokens_first ? "t " : "") +
           (row_staging ? "r " : "") + "k" + std::to_string(k_step);
}

mat_tiled_layout mat_tiled_layout_of(const pipeline_tuning& t) {
    return {t.mat_tiled_swizzle, t.mat_tiled_k_step, t.mat_tiled_tokens_first,
            t.mat_tiled_row_staging};
}

pipeline_tuning with_mat_tiled_layout(const pipeline_tuning& t, const mat_tiled_layout& l) {
    pipeline_tuning r = t;
    r.mat_tiled_swizzle = l.swizzle;
    r.mat_tiled_k_step = l.k_step;
    r.mat_tiled_tokens_first = l.tokens_first;
    r.mat_tiled_row_staging = l.row_staging;
    return r;
}

status check_mat_tiled_layout(const pipeline_tuning& t, const mat_tiled_layout& l,
                              std::uint64_t shared) {
    const std::uint64_t bytes = mat_tiled_shared_bytes(with_mat_tiled_layout(t, l));
    if ((l.k_step == 32 || l.k_step == 64) && bytes <= shared) return {};
    return gpu_error(gpu_failure::bad_config,
                     "tiled mul_mat layout " + l.name() + ": needs a K step of 32 or 64 and its " +
                         std::to_string(bytes) + " bytes of tiles within " +
                         std::to_string(shared));
}

std::vector<mat_tiled_layout> mat_tiled_layout_candidates(const pipeline_tuning& t,
                                                          std::uint64_t shared) {
    const mat_tiled_layout own = mat_tiled_layout_of(t);
    std::vector<mat_tiled_layout> out{own};
    auto add = [&](mat_tiled_layout l) {
        if (std::find(out.begin(), out.end(), l) == out.end() &&
            check_mat_tiled_layout(t, l, shared)) {
            out.push_back(l);
        }
    };
    mat_tiled_layout l = own;
    l.swizzle = !own.swizzle;
    add(l);
    l = own;
    l.tokens_first = !own.tokens_first;
    add(l);
    l = own;
    l.k_step = own.k_step == 32 ? 64 : 32;
    add(l);
    for (std::uint32_t k : {32u, 64u}) {
        l = own;
        l.row_staging = !own.row_staging;
        l.k_step = k;
        add(l);
    }
    return out;
}

std::uint32_t mat_vec_cols_max(const pipeline_tuning& t, std::uint64_t shared) {
    std::uint32_t cols = abi::ORDO_MMV_COLS;
    while (cols > 0 && mat_vec_shared_bytes(t, cols) > shared) --cols;
    return cols;
}

pipeline_tuning tuning_for(const device_info& info) {
    // Lanes are cheap to add until a workgroup no longer fits the device; a multiple of the
    // subgroup keeps every SIMD lane busy (lavapipe: 8 wide; NVIDIA: 32).
    std::uint32_t sg = std::max<std::uint32_t>(info.subgroup_size, 1);
    std::uint32_t cap = std::min<std::uint32_t>(info.max_workgroup_invocations, 256);
    pipeline_tuning t;
    t.elementwise_wg = std::min<std::uint32_t>(cap, std::max<std::uint32_t>(64, sg * 4));
    t.norm_wg = std::min<std::uint32_t>(cap, std::max<std::uint32_t>(64, sg * 4));
    // mul_mat_vec: 8-lane teams (mat_order.glsl's groups), four subgroups per workgroup and
    // one row per team by default (NVIDIA: 128 lanes, 16 rows per workgroup).
    t.mat_vec_wg = std::min<std::uint32_t>(cap, std::max<std::uint32_t>(32, sg * 4));
    t.mat_vec_rows = 1;
    // Units in flight per lane: 2 (F32/F16/BF16) and 4 (the block types: measured on an
    // H200, gpu/PERF.md session 15), fewer where the device's shared memory cannot stage the
    // steps of x (Vulkan guarantees 16 KiB; lavapipe has 32 KiB, NVIDIA 48 KiB).
    t.mat_vec_unroll = 2;
    t.mat_vec_block_unroll = 4;
    while (mat_vec_shared_bytes(t) > info.max_shared_memory_bytes && t.mat_vec_block_unroll > 2) {
        t.mat_vec_block_unroll /= 2;
    }
    if (mat_vec_shared_bytes(t) > info.max_shared_memory_bytes) {
        t.mat_vec_unroll = 1;
        t.mat_vec_block_unroll = 1;
    }
    // Still too much (the GLU variant's partials on a 16 KiB device): fewer teams per workgroup.
    while (mat_vec_shared_bytes(t) > info.max_shared_memory_bytes &&
           t.mat_vec_wg > abi::ORDO_MAT_GROUPS) {
        t.mat_vec_wg /= 2;
    }
    t.mat_rows_wg = std::min<std::uint32_t>(cap, 64);
    // GPUs: split the tiled kernel's groups for every grid whose partials fit the scratch
    // (measured on an H200, gpu/PERF.md session 20: a 64-sequence step of the 1B Q4_K model
    // spent 38.7 ms in the tiled mat-muls unsplit, 27.0 split below 1024 workgroups, 13.0
    // below 16384; prefill 512 the same either way). CPU devices run the texel family.
    t.mat_tiled_split_wg = info.kind == device_kind::cpu ? 0 : 16384;
    // The tiled kernel's swizzled shared tiles and token-tiles-first grid are for GPUs (banked
    // shared memory, an L2 shared by the workgroups in flight). A CPU device has neither: on
    // lavapipe (2 threads, one 1B layer's Q4_K mat-muls at 512 tokens) the swizzle's index
    // arithmetic cost 13-15% and the grid order 5% (gpu/PERF.md session 27).
    t.mat_tiled_swizzle = info.kind != device_kind::cpu;
    t.mat_tiled_tokens_first = info.kind != device_kind::cpu;
    // Narrow tiles wherever the device holds them (Vulkan guarantees 16 KiB of shared memory;
    // the narrow tile takes 18): they take out the zero-padded tokens' work on any device
    // (lavapipe, one 1B layer's Q4_K mat-muls at 16 tokens: 776-793 -> 452 ms).
    t.mat_tiled_narrow = true;
    if (mat_tiled_shared_bytes(t) > info.max_shared_memory_bytes) t.mat_tiled_narrow = false;
    if (t.mat_coop_large.shared_bytes() > info.max_shared_memory_bytes) {
        t.mat_coop_large = t.mat_coop_wide;
    }
    // A CPU device (lavapipe) runs the barrier-free row-per-lane kernel for every few-token
    // count in the storage family; a GPU the 8-lanes-per-row mul_mat_vec (gpu/PERF.md).
    t.rows_tokens_max = info.kind == device_kind::cpu ? mat_vec_tokens_max : 0;
    // One subgroup: a 16-row tile per lane gives 128 rows per workgroup (measured: 32 lanes
    // left 768-row outputs at 3 workgroups per token group, 1.2-1.5x slower on 2 threads).
    t.mat_tx_tile_wg = std::min<std::uint32_t>(cap, std::max<std::uint32_t>(8, sg));
    // tx1: one subgroup of 8-lane teams (mul_mat_tx.comp); 8 where the subgroup is not a
    // multiple of 8 (tx1 is then not used: tx1_usable).
    t.mat_tx1_wg = sg % abi::ORDO_MAT_GROUPS == 0 && sg <= cap ? sg : abi::ORDO_MAT_GROUPS;
    t.prefer_texel_kernels = info.kind == device_kind::cpu;
    t.attention_tx_wg = std::min<std::uint32_t>(cap, sg);
    t.attention_wg = std::min<std::uint32_t>(cap, std::max<std::uint32_t>(32, sg * 2));
    t.row_summaries = info.kind != device_kind::cpu;
    t.flush_every_layers = info.kind == device_kind::cpu ? 4 : 16;
    return t;
}

std::uint64_t mat_split_scratch_floats(const pipeline_tuning& t, std::uint64_t rows_max,
                                       std::uint32_t tokens_max) {
    // A split grid has gx * gy < mat_tiled_split_wg workgroups of TM rows x TN tokens
    // (mul_mat_cm's: under mat_coop_split_wg of its wide tile, where the tuning runs it).
    std::uint64_t grid =
        std::uint64_t(t.mat_tiled_split_wg) * mat_tiled_rows(t) * mat_tiled_tokens(t);
    if (t.mat_coop) {
        for (const mat_coop_shape* c : {&t.mat_coop_wide, &t.mat_coop_large}) {
            grid = std::max(grid, std::uint64_t(t.mat_coop_split_wg) * c->rows() * c->tokens());
        }
    }
    if (grid == 0) return 0;
    return std::min(abi::ORDO_MAT_GROUPS * std::min(grid, rows_max * tokens_max),
                    mat_split_scratch_bytes_max / 4);
}

status check_mat_coop_tile(const mat_coop_shape& tile, const device_info& device) {
    if (tile.valid() && tile.shared_bytes() <= device.max_shared_memory_bytes) return {};
    return gpu_error(gpu_failure::bad_config,
                     "pipeline tuning: the cooperative-matrix tile " +
                         std::to_string(tile.sg_rows) + " x " + std::to_string(tile.frag_rows) +
                         " x " + std::to_string(tile.frag_tokens) +
                         " (subgroup rows x fragment rows x fragment tokens) must be 1, 2 or 4 "
                         "each, and its " +
                         std::to_string(tile.shared_bytes()) + " bytes fit the device's " +
                         std::to_string(device.max_shared_memory_bytes) + " of shared memory");
}

namespace {

std::uint32_t wg_for(pipeline_id id, const pipeline_tuning& t) {
    switch (props_of(id).wg) {
        case wg_class::elementwise:
            return t.elementwise_wg;
        case wg_class::norm:
            return t.norm_wg;
        case wg_class::mat_vec:
            return t.mat_vec_wg;
        case wg_class::mat_rows:
            return t.mat_rows_wg;
        case wg_class::mat_tiled:
            return 128;  // fixed by the tile mapping in mul_mat.comp
        case wg_class::mat_coop:
            return 128;  // mul_mat_cm.comp's 4 subgroups of 32
        case wg_class::mat_tx1:
            return t.mat_tx1_wg;
        case wg_class::mat_tx_tile:
            return t.mat_tx_tile_wg;
        case wg_class::attention:
            return t.attention_wg;
        case wg_class::subgroup:
            return t.attention_tx_wg;
        case wg_class::single:
            return 1;
        case wg_class::summary:
            return abi::ORDO_SUMMARY_WG;
    }
    return t.elementwise_wg;
}

}  // namespace

result<std::unique_ptr<pipelines>> pipelines::create(const device& dev,
                                                     const pipeline_tuning& tuning,
                                                     VkPipelineCache cache) {
    std::unique_ptr<pipelines> p(new pipelines(dev));
    p->_tuning = tuning;
    p->_mat_vec_cols = mat_vec_cols_max(tuning, dev.info().max_shared_memory_bytes);
    p->_cache = cache;
    bool pow2 = tuning.norm_wg != 0 && (tuning.norm_wg & (tuning.norm_wg - 1)) == 0;
    if (!pow2 || tuning.elementwise_wg == 0 ||
        !mat_vec_tuning_valid(tuning, dev.info().max_shared_memory_bytes) ||
        tuning.attention_wg == 0 || tuning.mat_rows_wg == 0 || tuning.mat_tx_tile_wg == 0 ||
        tuning.mat_tx1_wg == 0 || tuning.attention_tx_wg == 0 ||
        std::max({tuning.elementwise_wg, tuning.norm_wg, tuning.mat_vec_wg, tuning.attention_wg,
                  tuning.mat_rows_wg, tuning.mat_tx_tile_wg, 128u}) >
            dev.info().max_workgroup_invocations) {
        return gpu_error(gpu_failure::bad_config,
                         "pipeline tuning: workgroup sizes must be nonzero, fit the device "
                         "(mul_mat_vec's shared memory too), norm_wg a power of two, "
                         "mat_vec_wg a multiple of 8 x mat_vec_split, and mat_vec_split 1, 2, "
                         "4 or 8 dividing both mat_vec unrolls");
    }
    // attention.comp's load groups: a key group divides the workgroup (so a group's indexes stay
    // in its shared tile), both within what registers hold.
    const std::uint32_t vg = tuning.attention_v_group;
    if (tuning.attention_k_pairs == 0 || tuning.attention_k_pairs > attention_k_pairs_max ||
        vg == 0 || vg > attention_v_group_max || tuning.attention_wg % vg != 0) {
        return gpu_error(gpu_failure::bad_config,
                         "pipeline tuning: attention_k_pairs must be 1.." +
                             std::to_string(attention_k_pairs_max) + " and attention_v_group 1.." +
                             std::to_string(attention_v_group_max) + " dividing attention_wg (" +
                             std::to_string(tuning.attention_wg) + ")");
    }
    auto lane_block = [](std::uint32_t v) { return v == 4 || v == 8; };
    if (!lane_block(tuning.mat_tiled_rows_per_lane) ||
        !lane_block(tuning.mat_tiled_tokens_per_lane)) {
        return gpu_error(gpu_failure::bad_config,
                         "pipeline tuning: the tiled mat-mul's rows and tokens per lane must be "
                         "4 or 8");
    }
    if ((tuning.mat_tiled_k_step != 32 && tuning.mat_tiled_k_step != 64) ||
        mat_tiled_shared_bytes(tuning) > dev.info().max_shared_memory_bytes) {
        return gpu_error(gpu_failure::bad_config,
                         "pipeline tuning: the tiled mat-mul's K step must be 32 or 64 and its "
                         "tiles (" +
                             std::to_string(mat_tiled_shared_bytes(tuning)) +
                             " bytes) fit the device's shared memory");
    }
    if (tuning.mat_coop) {
        const bool emulated = tuning.mat_coop_emulated;
        for (const mat_coop_shape* c :
             {&tuning.mat_coop_wide, &tuning.mat_coop_narrow, &tuning.mat_coop_large}) {
            ORDO_TRY(check_mat_coop_tile(*c, dev.info()));
        }
        if (emulated && !dev.info().shader_float16) {
            return gpu_error(gpu_failure::unsupported,
                             "pipeline tuning: the emulated cooperative-matrix mat-mul stages f16 "
                             "tiles, and " +
                                 dev.info().name + " has no f16 arithmetic (shaderFloat16)");
        }
        if (!emulated && !dev.info().cooperative_matrix) {
            return gpu_error(gpu_failure::unsupported,
                             "pipeline tuning: cooperative-matrix mat-muls on " + dev.info().name +
                                 ", which has no usable VK_NV_cooperative_matrix");
        }
    }
    for (std::size_t i = 0; i < pipeline_count; ++i) {
        auto id = static_cast<pipeline_id>(i);
        if (props_of(id).made != made_when::create) continue;  // built on request
        status s = p->build(p->_all[i], id, 0, abi::ORDO_TX_TILE_ROWS);
        if (!s) return s.err();
    }
    return p;
}

const pipeline& pipelines::get(pipeline_id id) const {
    ORDO_GPU_CHECK(!built_on_request(id),
                   "a pipeline built on request: use find, for_k, for_tile or for_cols");
    return _all[static_cast<std::size_t>(id)];
}

result<const pipeline*> pipelines::find(pipeline_id id) const {
    switch (props_of(id).made) {
        case made_when::create:
            return &get(id);
        case made_when::k:
            return gpu_error(gpu_failure::bad_config,
                             std::string(pipeline_name(id)) + " is specialized on K: use for_k");
        case made_when::cols:
            return for_cols(id, abi::ORDO_MMV_COLS);
        case made_when::type:
        case made_when::tile:
            break;
    }
    return variant(id, 0, abi::ORDO_TX_TILE_ROWS);
}

result<const pipeline*> pipelines::for_k(pipeline_id id, std::uint32_t k) const {
    if (!specialized_on_k(id)) return find(id);
    return variant(id, k, abi::ORDO_TX_TILE_ROWS);
}

result<const pipeline*> pipelines::for_cols(pipeline_id id, std::uint32_t cols,
                                            mat_vec_shape shape) const {
    if (props_of(id).made != made_when::cols || cols == 0 || cols > abi::ORDO_MMV_COLS ||
        (!shape.tuned() && cols != 1)) {
        return gpu_error(gpu_failure::bad_config, std::string(pipeline_name(id)) + ": no " +
                                                      std::to_string(cols) + "-token variant" +
                                                      (shape.tuned() ? "" : " of another shape"));
    }
    if (!shape.tuned()) {
        if (const pipeline* pl =
                built(id, 1, abi::ORDO_TX_TILE_ROWS, mat_tiled_groups_wide, shape.key())) {
            return pl;
        }
        ORDO_TRY(check_mat_vec_shape(_tuning, shape, _device.info().max_shared_memory_bytes));
        const pipeline_tuning t = with_mat_vec_shape(_tuning, shape);
        return variant(id, 1, abi::ORDO_TX_TILE_ROWS, mat_tiled_groups_wide,
                       {shape.key(), &t, mat_vec_shape_name(t, {}, mat_vec_block_units(id))});
    }
    // Past what the device's shared memory stages: the widest variant that fits, in passes.
    return variant(id, std::min(cols, _mat_vec_cols), abi::ORDO_TX_TILE_ROWS);
}

result<const pipeline*> pipelines::for_tile(pipeline_id id, std::uint32_t wg_rows) const {
    if (props_of(id).made != made_when::tile ||
        (wg_rows != abi::ORDO_TX_TILE_ROWS && wg_rows != abi::ORDO_TX_TILE_ROWS_NARROW)) {
        return gpu_error(gpu_failure::bad_config, std::string(pipeline_name(id)) + ": no " +
                                                      std::to_string(wg_rows) +
                                                      "-row tile variant");
    }
    return variant(id, 0, wg_rows);
}

result<const pipeline*> pipelines::for_token_groups(pipeline_id id, std::uint32_t groups,
                                                    const mat_tiled_layout* layout) const {
    wg_class wg = props_of(id).wg;
    const bool large = wg == wg_class::mat_coop && groups == mat_coop_groups_large;
    if ((wg != wg_class::mat_tiled && wg != wg_class::mat_coop) ||
        (groups != mat_tiled_groups_wide && groups != mat_tiled_groups_narrow && !large)) {
        return gpu_error(gpu_failure::bad_config, std::string(pipeline_name(id)) + ": no " +
                                                      std::to_string(groups) +
                                                      "-token-group variant");
    }
    if (layout != nullptr && wg == wg_class::mat_tiled && *layout != mat_tiled_layout_of(_tuning)) {
        if (const pipeline* pl = built(id, 0, abi::ORDO_TX_TILE_ROWS, groups, layout->key())) {
            return pl;
        }
        ORDO_TRY(check_mat_tiled_layout(_tuning, *layout, _device.info().max_shared_memory_bytes));
        const pipeline_tuning t = with_mat_tiled_layout(_tuning, *layout);
        return variant(id, 0, abi::ORDO_TX_TILE_ROWS, groups,
                       {layout->key(), &t, "layout " + layout->name()});
    }
    return variant(id, 0, abi::ORDO_TX_TILE_ROWS, groups);
}

const pipeline* pipelines::built(pipeline_id id, std::uint32_t k, std::uint32_t wg_rows,
                                 std::uint32_t token_groups, std::uint32_t form_key) const {
    std::lock_guard lock(_variants_mutex);
    auto it = _variants.find(std::make_tuple(id, k, wg_rows, token_groups, form_key));
    return it != _variants.end() ? it->second.get() : nullptr;
}

result<const pipeline*> pipelines::variant(pipeline_id id, std::uint32_t k, std::uint32_t wg_rows,
                                           std::uint32_t token_groups,
                                           const pipeline_form& form) const {
    std::lock_guard lock(_variants_mutex);
    auto key = std::make_tuple(id, k, wg_rows, token_groups, form.key);
    auto it = _variants.find(key);
    if (it != _variants.end()) return it->second.get();
    auto pl = std::make_unique<pipeline>();
    status s = build(*pl, id, k, wg_rows, token_groups, form);
    if (!s) {
        destroy(*pl);
        return s.err();
    }
    return _variants.emplace(key, std::move(pl)).first->second.get();
}

status pipelines::build(pipeline& pl, pipeline_id id, std::uint32_t k, std::uint32_t wg_rows,
                        std::uint32_t token_groups, const pipeline_form& form) const {
    const pipeline_tuning& tu = form.tuning != nullptr ? *form.tuning : _tuning;
    VkDevice d = _device.handle();
    const pipeline_source& src = source_of(id);
    const std::uint32_t bindings = src.bindings;
    const pipeline_props& props = props_of(id);
    // A pipeline whose shader needs subgroup arithmetic (attention_tx, rms_norm_tx), which
    // Vulkan does not require: without it the pipeline stays null and its encoder never picks
    // it (it checks the same flag). Without subgroup ballot (mul_mat_tx1), asking for one is
    // an error: its encoder checks the flag first (tx1_usable).
    if (props.needs == pipeline_need::subgroup_arithmetic && !_device.info().subgroup_arithmetic) {
        return {};
    }
    if (props.needs == pipeline_need::subgroup_ballot && !_device.info().subgroup_ballot) {
        return gpu_error(gpu_failure::unsupported,
                         std::string(pipeline_name(id)) + " needs subgroup ballot operations");
    }
    if (props.needs == pipeline_need::cooperative_matrix && !_device.info().cooperative_matrix) {
        return gpu_error(gpu_failure::unsupported,
                         std::string(pipeline_name(id)) + " needs cooperative matrices");
    }
    if (props.needs == pipeline_need::float16 && !_device.info().shader_float16) {
        return gpu_error(gpu_failure::unsupported,
                         std::string(pipeline_name(id)) + " needs f16 arithmetic");
    }
    pl.bindings = bindings;
    pl.push_bytes = src.push_bytes;
    pl.k = k;
    pl.workgroup_size = wg_for(id, tu);
    const bool mat_vec = props.made == made_when::cols;
    pl.rows_per_workgroup = mat_vec ? tu.mat_vec_rows : 1;
    pl.texel_bindings = props.texel_bindings;
    std::string_view name = pipeline_name(id);
    std::string what = "pipeline " + std::string(pipeline_name(id));
    if (k != 0) what += (mat_vec ? " (tokens " : " (K ") + std::to_string(k) + ")";
    if (wg_rows != abi::ORDO_TX_TILE_ROWS) what += " (" + std::to_string(wg_rows) + "-row tile)";
    pl.token_groups = token_groups;
    if (token_groups != mat_tiled_groups_wide) {
        what += " (" + std::to_string(token_groups) + " token groups)";
    }
    if (!form.name.empty()) what += " (" + form.name + ")";

    VkDescriptorSetLayoutBinding b[8]{};
    ORDO_GPU_CHECK(bindings <= 8, "binding count");
    for (std::uint32_t i = 0; i < bindings; ++i) {
        b[i].binding = i;
        b[i].descriptorType = ((pl.texel_bindings >> i) & 1u)
                                  ? VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER
                                  : VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        b[i].descriptorCount = 1;
        b[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
    }
    VkDescriptorSetLayoutCreateInfo dl{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
    dl.flags = VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR;
    dl.bindingCount = bindings;
    dl.pBindings = b;
    VkResult r = vkCreateDescriptorSetLayout(d, &dl, nullptr, &pl.set_layout);
    if (r != VK_SUCCESS) return vk_error(r, what + " set layout");

    VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, src.push_bytes};
    VkPipelineLayoutCreateInfo li{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
    li.setLayoutCount = 1;
    li.pSetLayouts = &pl.set_layout;
    li.pushConstantRangeCount = 1;
    li.pPushConstantRanges = &range;
    r = vkCreatePipelineLayout(d, &li, nullptr, &pl.layout);
    if (r != VK_SUCCESS) return vk_error(r, what + " layout");

    VkShaderModuleCreateInfo mi{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
    mi.codeSize = src.words * 4;
    mi.pCode = src.code;
    VkShaderModule module = VK_NULL_HANDLE;
    r = vkCreateShaderModule(d, &mi, nullptr, &module);
    if (r != VK_SUCCESS) return vk_error(r, what + " shader module");

    // Constant 2 (K) only matters to the shaders specialized on it (0 elsewhere); Vulkan
    // ignores map entries whose constant a module does not declare.
    // Constant 3: mul_mat_tx tx4/txm rows per lane (wg_rows rows per workgroup).
    // mul_mat_vec: constant 3 is its unroll (the block types': mat_vec_block_unroll).
    pl.tile_rows = !mat_vec                  ? tx_rows_per_lane(pl.workgroup_size, wg_rows)
                   : mat_vec_block_units(id) ? tu.mat_vec_block_unroll
                                             : tu.mat_vec_unroll;
    // Constant 4: mul_mat_vec's lanes per group for this token count (k).
    pl.helpers = mat_vec ? mat_vec_helpers(tu, k) : 1;
    // Constants 5 and 6: the tiled mul_mat's outputs per lane (rows, tokens); 7-10 its layout
    // (swizzled tiles, K step, token tiles first, staging by rows), 11 its token groups; 12-14
    // mul_mat_cm's tile (the wide or the narrow one, by token groups).
    const mat_coop_shape& coop = mat_coop_tile(tu, token_groups);
    // 15 and 16: attention.comp's load groups (K pairs, V keys).
    std::uint32_t spec_values[17] = {pl.workgroup_size,
                                     pl.rows_per_workgroup,
                                     k,
                                     pl.tile_rows,
                                     pl.helpers,
                                     tu.mat_tiled_rows_per_lane,
                                     tu.mat_tiled_tokens_per_lane,
                                     tu.mat_tiled_swizzle ? 1u : 0u,
                                     tu.mat_tiled_k_step,
                                     tu.mat_tiled_tokens_first ? 1u : 0u,
                                     tu.mat_tiled_row_staging ? 1u : 0u,
                                     pl.token_groups,
                                     coop.sg_rows,
                                     coop.frag_rows,
                                     coop.frag_tokens,
                                     tu.attention_k_pairs,
                                     tu.attention_v_group};
    constexpr std::uint32_t n_spec = std::size(spec_values);
    VkSpecializationMapEntry entries[n_spec];
    for (std::uint32_t i = 0; i < n_spec; ++i) entries[i] = {i, 4 * i, 4};
    VkSpecializationInfo spec{n_spec, entries, sizeof(spec_values), spec_values};
    VkComputePipelineCreateInfo ci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
    ci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
    ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    ci.stage.module = module;
    ci.stage.pName = "main";
    ci.stage.pSpecializationInfo = &spec;
    ci.layout = pl.layout;
    r = vkCreateComputePipelines(d, _cache, 1, &ci, nullptr, &pl.handle);
    if (r == VK_SUCCESS && !_tuning.fault_create_fails.empty() &&
        name.starts_with(_tuning.fault_create_fails)) {
        vkDestroyPipeline(d, pl.handle, nullptr);
        pl.handle = VK_NULL_HANDLE;
        r = VK_ERROR_UNKNOWN;
    }
    vkDestroyShaderModule(d, module, nullptr);
    if (r != VK_SUCCESS) {
        error e = vk_error(r, what + " create");
        // A driver that cannot build a kernel fails the same way on every try: the device
        // cannot run it (gpu_unsupported: not retried, and the runner may fall back to the
        // other kernel family). Out of memory and a lost device stay device faults.
        if (gpu_failure_of(e) == gpu_failure::device_error) {
            e.code = std::string(enum_name(gpu_failure::unsupported));
        }
        return e;
    }
    return {};
}

void pipelines::destroy(pipeline& pl) const {
    VkDevice d = _device.handle();
    if (pl.handle != VK_NULL_HANDLE) vkDestroyPipeline(d, pl.handle, nullptr);
    if (pl.layout != VK_NULL_HANDLE) vkDestroyPipelineLayout(d, pl.layout, nullptr);
    if (pl.set_layout != VK_NULL_HANDLE) vkDestroyDescriptorSetLayout(d, pl.set_layout, nullptr);
    pl = pipeline{};
}

pipelines::~pipelines() {
    for (pipeline& pl : _all) destroy(pl);
    for (auto& [key, pl] : _variants) destroy(*pl);
}

}  // namespace ordo::gpu
