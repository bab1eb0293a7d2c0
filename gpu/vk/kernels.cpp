// kernels.cpp: see kernels.hpp.
#include "gpu/vk/kernels.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "gpu/vk/shaders/abi.h"
#include "gpu/vk/vk_util.hpp"

namespace ordo::gpu {

namespace {

// Elementwise grids stop growing here; lanes loop over the rest (fewer, fuller workgroups).
constexpr std::uint32_t elementwise_groups_max = 256;

std::uint32_t ceil_div(std::uint64_t a, std::uint64_t b) {
    return static_cast<std::uint32_t>((a + b - 1) / b);
}

error bad(const char* kernel, const std::string& why) {
    return gpu_error(gpu_failure::bad_shape, std::string(kernel) + ": " + why);
}

// Whether rows [0, n_rows) x columns [0, n_cols) lie inside the view (floats).
bool fits(const rows_view& r, std::uint32_t n_rows, std::uint64_t n_cols) {
    if (r.view.buf == nullptr || n_rows == 0) return false;
    std::uint64_t last = r.offset + std::uint64_t(n_rows - 1) * r.stride + n_cols;
    return (n_rows == 1 || r.stride >= n_cols) && last * 4 <= r.view.range;
}

bool fits(const ints_view& v, std::uint64_t n) {
    return v.view.buf != nullptr && (v.offset + n) * 4 <= v.view.range;
}

// abi.h's ORDO_WTYPE_* of a type the kernels run (kernels_run; upload_weight refuses the others).
std::uint32_t wtype(model::ggml_type t) {
    switch (t) {
#define ORDO_WTYPE_CASE(NAME, name, ...) \
    case model::ggml_type::name:         \
        return abi::ORDO_WTYPE_##NAME;
        ORDO_WEIGHT_TYPE_LIST(ORDO_WTYPE_CASE)
#undef ORDO_WTYPE_CASE
        default:
            return abi::ORDO_WTYPE_F32;
    }
}

pipeline_id pick(pipeline_id f32, model::ggml_type t) {
    return static_cast<pipeline_id>(static_cast<std::uint32_t>(f32) + wtype(t));
}

std::uint32_t rows_limit(const stream& s) {
    return s.dev().info().max_workgroup_count[1];
}

// Whether the rows of `r` start on 4-float boundaries (the texel variants write vec4s).
bool vec4_rows(const rows_view& r) {
    return r.offset % 4 == 0 && r.stride % 4 == 0;
}

// Whether the elementwise texel variants (rms_norm_tx, swiglu_tx) can read `r` (n_rows rows of
// n floats) through its buffer's texel view: everything 4-aligned.
bool texel_rows(const rows_view& r, std::uint32_t n_rows, std::uint32_t n) {
    const buffer* b = r.view.buf;
    if (b == nullptr || b->texel_view() == VK_NULL_HANDLE || r.view.offset % 16 != 0 ||
        !vec4_rows(r) || n % 4 != 0) {
        return false;
    }
    std::uint64_t end = r.view.offset / 4 + r.offset + std::uint64_t(n_rows - 1) * r.stride + n;
    return (end + 3) / 4 <= b->texel_count();
}

// Float offset of r's first element from its buffer's start (texel bindings see the buffer).
std::uint32_t buffer_offset(const rows_view& r) {
    return static_cast<std::uint32_t>(r.view.offset / 4 + r.offset);
}

bool prefer_texel(const stream& s) {
    return s.pipes().tuning().prefer_texel_kernels;
}

}  // namespace

status encode_get_rows(stream& s, const weight_tensor& table, ints_view ids, std::uint32_t n_ids,
                       rows_view out) {
    if (n_ids == 0 || n_ids > rows_limit(s)) return bad("get_rows", "bad id count");
    if (!fits(ids, n_ids)) return bad("get_rows", "ids outside their binding");
    if (!fits(out, n_ids, table.n_in)) return bad("get_rows", "output outside its binding");
    pipeline_id id = pick(pipeline_id::get_rows_f32, table.type);
    auto pl = s.pipes().find(id);
    if (!pl) return pl.err();
    std::uint32_t gx =
        std::min(ceil_div(table.n_in / 8, (*pl)->workgroup_size), elementwise_groups_max);
    for (std::size_t c = 0; c < table.chunks.size(); ++c) {
        const weight_chunk& ch = table.chunks[c];
        abi::get_rows_push p{table.n_in,      n_ids,      ch.row_begin, ch.row_count,
                             ch.scale_offset, ids.offset, out.offset,   out.stride};
        bool last = c + 1 == table.chunks.size();
        s.dispatch(**pl, id, {ch.view, ids.view, out.view}, p, {gx, n_ids, 1}, last);
    }
    return {};
}

bool texel_path_usable(const weight_tensor& w, const rows_view& x, std::uint32_t n_tokens) {
    if (n_tokens == 0 || x.view.buf == nullptr || x.view.buf->texel_view() == VK_NULL_HANDLE ||
        x.view.offset % 16 != 0 || x.offset % 4 != 0 || x.stride % 4 != 0) {
        return false;
    }
    std::uint64_t x_end =
        (x.view.offset + 4 * (x.offset + std::uint64_t(n_tokens - 1) * x.stride + w.n_in) + 15) /
        16;
    if (x_end > x.view.buf->texel_count()) return false;
    for (const weight_chunk& ch : w.chunks) {
        const buffer* b = ch.view.buf;
        if (b == nullptr || b->texel_view() == VK_NULL_HANDLE || ch.view.offset % 16 != 0) {
            return false;
        }
        // The last texel read: the end of the quants (F32/F16: of the rows), or the last scale.
        std::uint64_t end = (ch.view.offset + packed_bytes(w.type, w.n_in, ch.row_count) + 15) / 16;
        if (end > b->texel_count() || (4ull * ch.scale_offset) % 16 != 0) return false;
    }
    return true;
}

namespace {

// Elements of K per texel-kernel unit (weight_units.glsl UNIT).
std::uint32_t tx_unit(model::ggml_type t) {
    switch (t) {
        case model::ggml_type::f32:
            return 4;
        case model::ggml_type::f16:
        case model::ggml_type::bf16:
            return 8;
        default:
            return abi::ORDO_QK;
    }
}

// The tiled kernel a stream's tuning runs: mul_mat (mat_order.glsl's order) or, where the tuning
// asks (gpu.batch_invariant = false on a device with cooperative matrices), mul_mat_cm.
pipeline_id tiled_kernel(const pipeline_tuning& t) {
    if (!t.mat_coop) return pipeline_id::mul_mat_f32;
    return t.mat_coop_emulated ? pipeline_id::mul_mat_cme_f32 : pipeline_id::mul_mat_cm_f32;
}

}  // namespace

bool tx1_usable(const device_info& info, model::ggml_type type, std::uint32_t k) {
    std::uint32_t unit = tx_unit(type);
    // One subgroup of 8-lane teams per workgroup; more than one team folds by shuffle.
    bool lanes_ok = info.subgroup_size % abi::ORDO_MAT_GROUPS == 0 &&
                    (info.subgroup_size == abi::ORDO_MAT_GROUPS || info.subgroup_shuffle);
    return info.subgroup_ballot && lanes_ok && k % unit == 0 &&
           k / unit <= abi::ORDO_TX1_UNITS_MAX * abi::ORDO_MAT_GROUPS;
}

result<const pipeline*> mul_mat_tx_tile(const pipelines& pipes, pipeline_id id,
                                        std::uint32_t rows) {
    std::uint32_t lanes = pipes.tuning().mat_tx_tile_wg;  // pipelines.cpp wg_for
    auto padded = [&](std::uint32_t wg_rows) {
        std::uint64_t covered = std::uint64_t(lanes) * tx_rows_per_lane(lanes, wg_rows);
        return ceil_div(rows, covered) * covered;
    };
    bool narrow = padded(abi::ORDO_TX_TILE_ROWS_NARROW) < padded(abi::ORDO_TX_TILE_ROWS);
    return pipes.for_tile(id, narrow ? abi::ORDO_TX_TILE_ROWS_NARROW : abi::ORDO_TX_TILE_ROWS);
}

status prepare_get_rows(const pipelines& pipes, const weight_tensor& table) {
    auto pl = pipes.find(pick(pipeline_id::get_rows_f32, table.type));
    return pl ? status{} : status{pl.err()};
}

status prepare_mul_mat_coop(const pipelines& pipes, const weight_tensor& w) {
    const pipeline_tuning& tu = pipes.tuning();
    if (!tu.mat_coop || tu.prefer_texel_kernels) return {};
    for (std::uint32_t groups :
         {mat_tiled_groups_wide, mat_tiled_groups_narrow, mat_coop_groups_large}) {
        auto pl = pipes.for_token_groups(pick(tiled_kernel(tu), w.type), groups);
        if (!pl) return pl.err();
    }
    return {};
}

namespace {

// The fused mul_mat_vec kernels' f32 ids `fusion` may run (none: empty): a rope_kv fusion's
// own, and the norm one it falls back to.
std::vector<pipeline_id> fused_mat_vecs(mat_fusion fusion) {
    switch (fusion) {
        case mat_fusion::none:
            return {};
        case mat_fusion::norm:
            return {pipeline_id::mul_mat_vec_norm_f32};
        case mat_fusion::glu:
            return {pipeline_id::mul_mat_vec_glu_f32};
        case mat_fusion::rope_kv_f32:
            return {pipeline_id::mul_mat_vec_rope32_f32, pipeline_id::mul_mat_vec_norm_f32};
        case mat_fusion::rope_kv_f16:
            return {pipeline_id::mul_mat_vec_rope16_f32, pipeline_id::mul_mat_vec_norm_f32};
    }
    return {};
}

}  // namespace

status prepare_mul_mat_vec_shape(const pipelines& pipes, const weight_tensor& w, mat_fusion fusion,
                                 mat_vec_shape shape) {
    auto pl = pipes.for_cols(pick(pipeline_id::mul_mat_vec_f32, w.type), 1, shape);
    if (!pl) return pl.err();
    for (pipeline_id fused : fused_mat_vecs(fusion)) {
        pl = pipes.for_cols(pick(fused, w.type), 1, shape);
        if (!pl) return pl.err();
    }
    return {};
}

status prepare_mul_mat_tiled_layout(const pipelines& pipes, const weight_tensor& w,
                                    const mat_tiled_layout& layout) {
    for (std::uint32_t groups : {mat_tiled_groups_wide, mat_tiled_groups_narrow}) {
        if (groups == mat_tiled_groups_narrow && !pipes.tuning().mat_tiled_narrow) continue;
        auto pl = pipes.for_token_groups(pick(pipeline_id::mul_mat_f32, w.type), groups, &layout);
        if (!pl) return pl.err();
    }
    return {};
}

status prepare_mul_mat(const pipelines& pipes, const weight_tensor& w, mat_fusion fusion) {
    const pipeline_tuning& tu = pipes.tuning();
    if (!tu.prefer_texel_kernels) {
        // The storage kernels encode_mul_mat's automatic path picks by token count.
        bool rows = tu.rows_tokens_max != 0;
        for (pipeline_id id : {pipeline_id::mul_mat_f32, pipeline_id::mul_mat_rows_f32}) {
            if (id == pipeline_id::mul_mat_rows_f32 && !rows) continue;
            auto pl = pipes.find(pick(id, w.type));
            if (!pl) return pl.err();
        }
        if (tu.mat_tiled_narrow) {
            auto pl = pipes.for_token_groups(pick(pipeline_id::mul_mat_f32, w.type),
                                             mat_tiled_groups_narrow);
            if (!pl) return pl.err();
        }
        ORDO_TRY(prepare_mul_mat_coop(pipes, w));
        // mul_mat_vec: one variant per token count it serves, and its fused variants'.
        const std::vector<pipeline_id> fused = fused_mat_vecs(fusion);
        for (std::uint32_t cols = 1; !rows && cols <= mat_vec_tokens_max; ++cols) {
            auto pl = pipes.for_cols(pick(pipeline_id::mul_mat_vec_f32, w.type), cols);
            if (!pl) return pl.err();
            for (pipeline_id id : fused) {
                pl = pipes.for_cols(pick(id, w.type), cols);
                if (!pl) return pl.err();
            }
        }
        return {};
    }
    if (tx1_usable(pipes.dev().info(), w.type, w.n_in)) {
        for (pipeline_id id : {pipeline_id::mul_mat_tx1_f32, pipeline_id::mul_mat_tx1t2_f32,
                               pipeline_id::mul_mat_tx1t4_f32}) {
            auto pl = pipes.for_k(pick(id, w.type), w.n_in);
            if (!pl) return pl.err();
        }
    }
    for (const weight_chunk& ch : w.chunks) {
        for (pipeline_id id : {pipeline_id::mul_mat_tx4_f32, pipeline_id::mul_mat_txm_f32}) {
            auto pl = mul_mat_tx_tile(pipes, pick(id, w.type), ch.row_count);
            if (!pl) return pl.err();
        }
    }
    return {};
}

namespace {

// The texel-fetch kernels (mul_mat_tx.comp); operands already validated by encode_mul_mat.
status encode_mul_mat_tx(stream& s, const weight_tensor& w, const rows_view& x, const rows_view& y,
                         std::uint32_t n_tokens, bool accumulate) {
    if (!texel_path_usable(w, x, n_tokens)) {
        return bad("mul_mat", "texel path: an operand has no texel view covering it");
    }
    const device_info& info = s.dev().info();
    // The split-K variants (tx1, tx1t2, tx1t4; K-specialized pipelines) up to
    // ORDO_TX1_TOKENS_MAX tokens where they apply: measured faster than tx4's 16x8 lane tiles
    // there, slower at 8 tokens (gpu/PERF.md); otherwise tx4/txm. All sum in one order, so the
    // choice never changes a result.
    bool split = n_tokens <= abi::ORDO_TX1_TOKENS_MAX && tx1_usable(info, w.type, w.n_in);
    bool few = n_tokens <= mat_vec_tokens_max;
    pipeline_id id = pick(split ? (n_tokens == 1   ? pipeline_id::mul_mat_tx1_f32
                                   : n_tokens == 2 ? pipeline_id::mul_mat_tx1t2_f32
                                                   : pipeline_id::mul_mat_tx1t4_f32)
                          : few ? pipeline_id::mul_mat_tx4_f32
                                : pipeline_id::mul_mat_txm_f32,
                          w.type);
    std::uint32_t t = split ? abi::ORDO_TX1_TOKENS_MAX : few ? abi::ORDO_TX4_T : abi::ORDO_TXM_T;
    std::uint32_t gy = ceil_div(n_tokens, t);
    if (gy > info.max_workgroup_count[1]) return bad("mul_mat", "too many tokens for one dispatch");
    for (std::size_t c = 0; c < w.chunks.size(); ++c) {
        const weight_chunk& ch = w.chunks[c];
        // tx1: K-specialized, ORDO_TX1_ROWS rows per workgroup over its teams; tx4/txm: the row
        // tile that pads this chunk least.
        auto pl =
            split ? s.pipes().for_k(id, w.n_in) : mul_mat_tx_tile(s.pipes(), id, ch.row_count);
        if (!pl) return pl.err();
        std::uint64_t rows_per_group = split ? abi::ORDO_TX1_ROWS : (*pl)->workgroup_rows();
        std::uint32_t gx = ceil_div(ch.row_count, rows_per_group);
        if (gx > info.max_workgroup_count[0]) return bad("mul_mat", "too many rows per chunk");
        abi::mul_mat_tx_push p{};
        p.k = w.n_in;
        p.n_rows = ch.row_count;
        p.n_cols = n_tokens;
        p.row_begin = ch.row_begin;
        p.w_texel = static_cast<std::uint32_t>(ch.view.offset / 16);
        p.s_texel = static_cast<std::uint32_t>((ch.view.offset + 4ull * ch.scale_offset) / 16);
        p.x_texel = static_cast<std::uint32_t>((x.view.offset + 4ull * x.offset) / 16);
        p.x_stride4 = x.stride / 4;
        p.y_offset = y.offset;
        p.y_stride = y.stride;
        p.accumulate = accumulate ? 1u : 0u;
        s.dispatch(**pl, id, {ch.view, x.view, y.view}, p, {gx, gy, 1}, c + 1 == w.chunks.size());
    }
    return {};
}

}  // namespace

namespace {

// The storage-family kernel encode_mul_mat's `path` resolves to for these operands: texel where
// the device prefers it and the views allow, else by token count (every kernel sums in
// mat_order.glsl's order: the choice never changes a bit).
mat_path resolve_path(stream& s, const weight_tensor& w, const rows_view& x, std::uint32_t n_tokens,
                      mat_path path) {
    const pipeline_tuning& tu = s.pipes().tuning();
    if (path != mat_path::automatic) return path;
    if (tu.prefer_texel_kernels && texel_path_usable(w, x, n_tokens)) return mat_path::texel;
    if (n_tokens <= tu.rows_tokens_max) return mat_path::rows;
    const std::uint32_t vec_max =
        s.mat_vec_tokens_max() != 0 ? s.mat_vec_tokens_max() : mat_vec_tokens_max;
    return n_tokens > vec_max ? mat_path::tiled : mat_path::vec;
}

// The checks every storage mat-mul's operands pass.
status check_mul_mat(const weight_tensor& w, const rows_view& x, const rows_view& y,
                     std::uint32_t n_tokens, std::uint64_t y_cols) {
    if (n_tokens == 0) return bad("mul_mat", "no tokens");
    if (x.offset % 4 != 0 || x.stride % 4 != 0) {
        return bad("mul_mat", "x offset and stride must be multiples of 4 floats");
    }
    if (!fits(x, n_tokens, w.n_in)) return bad("mul_mat", "x outside its binding");
    if (!fits(y, n_tokens, y_cols)) return bad("mul_mat", "y outside its binding");
    return {};
}

// What a storage mat-mul dispatch carries beyond W, x and y: the fused variants' norm weight,
// eps and up rows (mul_mat_vec.comp NORM / GLU), and ROPE's store (its push half and bindings).
struct mat_extra {
    pipeline_id kernel = pipeline_id::count;  // the f32 id of a fused variant; count: none
    buffer_view norm_weight;
    float eps = 0.0f;
    std::uint32_t out_rows = 0;  // GLU: output rows (n_ff), the chunk's up rows follow them
    const abi::rope_kv_push* rope = nullptr;     // ROPE: rope_kv's push constants
    std::array<buffer_view, 4> rope_bindings{};  // ROPE: ints, pool K, pool V, the rope table
};

// Whether a tiled grid of gx x gy workgroups runs the group split: forced (mat_path::split), or
// a grid under the tuning's mat_tiled_split_wg; either way only with scratch for its partials.
bool split_tiled(const stream& s, std::uint32_t gx, std::uint32_t gy, std::uint32_t out_rows,
                 std::uint32_t n_tokens, bool forced, bool coop) {
    const buffer_view& scratch = s.mat_split_scratch();
    std::uint64_t need = 4ull * abi::ORDO_MAT_GROUPS * n_tokens * out_rows;
    if (scratch.buf == nullptr || scratch.range < need) return false;
    if (n_tokens > s.dev().info().max_workgroup_count[1]) return false;  // the fold's grid
    const pipeline_tuning& tu = s.pipes().tuning();
    std::uint32_t limit = coop ? tu.mat_coop_split_wg : tu.mat_tiled_split_wg;
    return forced || std::uint64_t(gx) * gy < limit;
}

// The group split of one chunk: mul_mat with workgroup z summing group z into the scratch,
// then mul_mat_fold into y. Each dispatch ends with a barrier: the fold reads what the split
// wrote, and the next split (any mat-mul's) rewrites the scratch the fold read.
void dispatch_split(stream& s, const pipeline& pl, pipeline_id id, const weight_chunk& ch,
                    const rows_view& x, const rows_view& y, abi::mul_mat_push p, std::uint32_t gx,
                    std::uint32_t gy) {
    const buffer_view& scratch = s.mat_split_scratch();
    abi::mat_fold_push f{p.n_rows,   p.n_cols,   0,           p.n_rows,
                         p.y_offset, p.y_stride, p.row_begin, p.accumulate};
    p.split = 1;
    p.y_offset = 0;
    p.y_stride = p.n_rows;
    p.row_begin = 0;
    p.accumulate = 0;
    s.dispatch(pl, id, {ch.view, x.view, scratch}, p, {gx, gy, abi::ORDO_MAT_GROUPS});
    std::uint32_t wg = s.pipes().get(pipeline_id::mul_mat_fold).workgroup_size;
    s.dispatch(pipeline_id::mul_mat_fold, {scratch, y.view}, f,
               {std::min(ceil_div(p.n_rows, wg), elementwise_groups_max), p.n_cols, 1});
}

// One dispatch per weight chunk of the resolved storage kernel.
status dispatch_storage(stream& s, const weight_tensor& w, const rows_view& x, const rows_view& y,
                        std::uint32_t n_tokens, bool accumulate, mat_path path,
                        const mat_extra& extra = {}) {
    const pipeline_tuning& tuning = s.pipes().tuning();
    bool vec = path == mat_path::vec;
    bool rows = path == mat_path::rows;
    bool forced_split = path == mat_path::split;
    bool coop = path == mat_path::tiled && tuning.mat_coop;
    bool fused = extra.kernel != pipeline_id::count;
    ORDO_GPU_CHECK(!fused || vec, "fused mat-mul off the mul_mat_vec path");
    pipeline_id id = pick(fused  ? extra.kernel
                          : rows ? pipeline_id::mul_mat_rows_f32
                          : vec  ? pipeline_id::mul_mat_vec_f32
                          : coop ? tiled_kernel(tuning)
                                 : pipeline_id::mul_mat_f32,
                          w.type);
    // mul_mat_vec: the variant for this many tokens per pass (ORDO_MMV_COLS at most), at one
    // token in the weight's own shape (runner::choose_mat_vec_shapes); the tiled kernels: the
    // tile that pads this many tokens least, the invariant one in the stream's layout for this
    // many tokens (runner::choose_mat_tiled_layouts).
    const std::uint32_t groups =
        coop ? mat_coop_groups_for(tuning, n_tokens, s.mat_coop_large_from())
             : mat_tiled_groups_for(tuning, n_tokens);
    auto found = vec    ? s.pipes().for_cols(id, std::min(n_tokens, abi::ORDO_MMV_COLS),
                                          n_tokens == 1 ? w.vec_shape : mat_vec_shape{})
                    : rows ? s.pipes().find(id)
                        : s.pipes().for_token_groups(
                              id, groups, coop ? nullptr : s.mat_tiled_layout_for(n_tokens));
    if (!found) return found.err();
    const pipeline& pl = **found;
    const device_info& info = s.dev().info();
    const mat_coop_shape& coop_tile = mat_coop_tile(tuning, groups);
    const std::uint32_t tile_rows = coop ? coop_tile.rows() : mat_tiled_rows(tuning, groups);
    const std::uint32_t tile_tokens = coop ? coop_tile.tokens() : mat_tiled_tokens(tuning, groups);
    if (!vec && ceil_div(n_tokens, tile_tokens) > info.max_workgroup_count[1]) {
        return bad("mul_mat", "too many tokens for one dispatch");
    }
    if (coop && tuning.mat_coop_emulated && info.loop_iterations_max != 0 &&
        coop_tile.emulated_loop_iterations(w.n_in) > info.loop_iterations_max) {
        return bad("mul_mat", "the emulated cooperative-matrix kernel at K " +
                                  std::to_string(w.n_in) + " runs past the device's " +
                                  std::to_string(info.loop_iterations_max) +
                                  " loop iterations a lane");
    }
    for (std::size_t c = 0; c < w.chunks.size(); ++c) {
        const weight_chunk& ch = w.chunks[c];
        // GLU: the chunk (the whole matrix) holds out_rows gate rows, then their up rows.
        std::uint32_t out_rows = extra.out_rows != 0 ? extra.out_rows : ch.row_count;
        std::uint32_t gx = rows  ? ceil_div(out_rows, pl.workgroup_size)
                           : vec ? ceil_div(out_rows, mat_vec_workgroup_rows(pl))
                                 : ceil_div(out_rows, tile_rows);
        std::uint32_t gy = (vec || rows) ? 1 : ceil_div(n_tokens, tile_tokens);
        if (gx > info.max_workgroup_count[0]) return bad("mul_mat", "too many rows per chunk");
        abi::mul_mat_push p{w.n_in,   out_rows, n_tokens, ch.row_begin, ch.scale_offset,
                            x.offset, x.stride, y.offset, y.stride,     accumulate ? 1u : 0u};
        p.norm_eps = extra.eps;
        p.glu_up_row = extra.out_rows;
        if (!vec && !rows && split_tiled(s, gx, gy, out_rows, n_tokens, forced_split, coop)) {
            dispatch_split(s, pl, id, ch, x, y, p, gx, gy);
            continue;
        }
        if (forced_split) return bad("mul_mat", "split path: no scratch for the partial sums");
        // Chunks write disjoint rows of y: only the last needs the barrier.
        bool last = c + 1 == w.chunks.size();
        if (extra.rope != nullptr) {
            const auto& rb = extra.rope_bindings;
            s.dispatch(pl, id,
                       {ch.view, x.view, y.view, extra.norm_weight, rb[0], rb[1], rb[2], rb[3]},
                       abi::mul_mat_rope_push{p, *extra.rope}, {gx, gy, 1}, last);
        } else if (fused) {
            s.dispatch(pl, id, {ch.view, x.view, y.view, extra.norm_weight}, p, {gx, gy, 1}, last);
        } else {
            s.dispatch(pl, id, {ch.view, x.view, y.view}, p, {gx, gy, 1}, last);
        }
    }
    return {};
}

// Whether the fused norm can stand in for rms_norm: the weight's rows are exactly the norm's n
// elements (not padded: upload_padded) and the norm weight covers them.
bool norm_fusable(const weight_tensor& w, const norm_input& in) {
    return w.n_in == in.n && in.weight.range >= 4ull * in.n;
}

}  // namespace

status encode_mul_mat(stream& s, const weight_tensor& w, rows_view x, rows_view y,
                      std::uint32_t n_tokens, bool accumulate, mat_path path) {
    if (status c = check_mul_mat(w, x, y, n_tokens, w.n_out); !c) return c;
    path = resolve_path(s, w, x, n_tokens, path);
    if (path == mat_path::texel) return encode_mul_mat_tx(s, w, x, y, n_tokens, accumulate);
    return dispatch_storage(s, w, x, y, n_tokens, accumulate, path);
}

status encode_norm_mul_mat(stream& s, const weight_tensor& w, const norm_input& in, rows_view y,
                           std::uint32_t n_tokens, mat_path path) {
    mat_path resolved = resolve_path(s, w, in.x, n_tokens, path);
    if (resolved == mat_path::vec && norm_fusable(w, in)) {
        if (status c = check_mul_mat(w, in.x, y, n_tokens, w.n_out); !c) return c;
        mat_extra e{pipeline_id::mul_mat_vec_norm_f32, in.weight, in.eps, 0};
        return dispatch_storage(s, w, in.x, y, n_tokens, false, resolved, e);
    }
    ORDO_TRY(encode_rms_norm(s, in.x, in.weight, in.scratch, in.n, n_tokens, in.eps));
    return encode_mul_mat(s, w, in.scratch, y, n_tokens, false, path);
}

status encode_norm_glu(stream& s, const weight_tensor& w, const norm_input& in, rows_view gate_up,
                       rows_view out, std::uint32_t n_ff, std::uint32_t n_tokens, mat_path path) {
    if (n_ff == 0 || w.n_out != 2ull * n_ff)
        return bad("glu", "W must be n_ff gate + n_ff up rows");
    mat_path resolved = resolve_path(s, w, in.x, n_tokens, path);
    if (resolved == mat_path::vec && w.chunks.size() == 1 && norm_fusable(w, in)) {
        if (status c = check_mul_mat(w, in.x, out, n_tokens, n_ff); !c) return c;
        mat_extra e{pipeline_id::mul_mat_vec_glu_f32, in.weight, in.eps, n_ff};
        return dispatch_storage(s, w, in.x, out, n_tokens, false, resolved, e);
    }
    ORDO_TRY(encode_rms_norm(s, in.x, in.weight, in.scratch, in.n, n_tokens, in.eps));
    ORDO_TRY(encode_mul_mat(s, w, in.scratch, gate_up, n_tokens, false, path));
    rows_view up{gate_up.view, gate_up.offset + n_ff, gate_up.stride};
    return encode_swiglu(s, gate_up, up, out, n_ff, n_tokens);
}

logits_summary_chunking summary_chunking(std::uint32_t n_sample) {
    const std::uint32_t n_chunks = std::clamp<std::uint32_t>(
        (n_sample + abi::ORDO_SUMMARY_CHUNK - 1) / abi::ORDO_SUMMARY_CHUNK, 1,
        abi::ORDO_SUMMARY_CHUNKS_MAX);
    return {n_chunks, (n_sample + n_chunks - 1) / n_chunks};
}

std::uint64_t logits_summary_scratch_words(std::uint32_t n_sample, std::uint32_t n_rows) {
    return std::uint64_t(n_rows) * summary_chunking(n_sample).n_chunks * abi::ORDO_SUMMARY_WORDS;
}

status encode_logits_summary(stream& s, rows_view logits, buffer_view temps, buffer_view scratch,
                             buffer_view summary, std::uint32_t n_sample, std::uint32_t n_rows) {
    const auto& groups = s.dev().info().max_workgroup_count;
    if (n_sample == 0 || n_rows == 0 || n_rows > groups[0] || n_rows > groups[1] ||
        (n_rows > 1 && logits.stride < n_sample)) {
        return bad("logits_summary", "bad shape");
    }
    const logits_summary_chunking c = summary_chunking(n_sample);
    if (!fits(logits, n_rows, n_sample) || temps.range < 4ull * n_rows ||
        scratch.range < 4 * logits_summary_scratch_words(n_sample, n_rows) ||
        summary.range < 4ull * abi::ORDO_SUMMARY_WORDS * n_rows) {
        return bad("logits_summary", "operand outside its binding");
    }
    abi::logits_summary_push p{n_sample,      n_rows,     logits.offset,
                               logits.stride, c.n_chunks, c.chunk_len};
    s.dispatch(pipeline_id::logits_summary, {logits.view, temps, scratch}, p,
               {c.n_chunks, n_rows, 1});
    s.dispatch(pipeline_id::logits_summary_merge, {scratch, temps, summary}, p, {n_rows, 1, 1});
    return {};
}

status encode_rms_norm(stream& s, rows_view x, buffer_view weight, rows_view out, std::uint32_t n,
                       std::uint32_t n_rows, float eps) {
    if (n == 0 || n_rows == 0 || n_rows > rows_limit(s)) return bad("rms_norm", "bad shape");
    if (!fits(x, n_rows, n) || !fits(out, n_rows, n) || weight.range < 4ull * n) {
        return bad("rms_norm", "operand outside its binding");
    }
    // rms_norm_tx reads the weight from texel 0 of its buffer.
    bool texel = prefer_texel(s) &&
                 s.pipes().get(pipeline_id::rms_norm_tx).handle != VK_NULL_HANDLE &&
                 texel_rows(x, n_rows, n) && vec4_rows(out) && weight.offset == 0 &&
                 texel_rows({weight, 0, n}, 1, n);
    if (texel) {
        abi::rms_norm_push p{n, n_rows, buffer_offset(x), x.stride, out.offset, out.stride, eps};
        s.dispatch(pipeline_id::rms_norm_tx, {x.view, weight, out.view}, p, {1, n_rows, 1});
        return {};
    }
    abi::rms_norm_push p{n, n_rows, x.offset, x.stride, out.offset, out.stride, eps};
    s.dispatch(pipeline_id::rms_norm, {x.view, weight, out.view}, p, {1, n_rows, 1});
    return {};
}

std::vector<float> rope_turns_table(std::span<const double> freq) {
    constexpr double two_pi = 6.283185307179586476925286766559;
    constexpr int bits = static_cast<int>(abi::ORDO_ROPE_SPLIT_BITS);
    // x cut to `bits` significant bits, toward zero (exact in float).
    auto cut = [](double x) {
        if (x == 0.0) return 0.0;
        int e = 0;
        double m = std::frexp(x, &e);  // x = m * 2^e, 0.5 <= |m| < 1
        return std::ldexp(std::trunc(std::ldexp(m, bits)), e - bits);
    };
    std::vector<float> table(4 * freq.size(), 0.0f);
    for (std::size_t j = 0; j < freq.size(); ++j) {
        const double turns = freq[j] / two_pi;
        const double hi = cut(turns);
        const double mid = cut(turns - hi);  // both differences are exact in double
        table[4 * j] = static_cast<float>(hi);
        table[4 * j + 1] = static_cast<float>(mid);
        table[4 * j + 2] = static_cast<float>(turns - hi - mid);
    }
    return table;
}

namespace {

// The rope table's shape check.
bool rope_shape_ok(const rope_table& rope, std::uint32_t head_dim) {
    return rope.n_rot != 0 && rope.n_rot % 2 == 0 && rope.n_rot <= head_dim &&
           rope.view.range >= 8ull * rope.n_rot;  // n_rot / 2 vec4s
}

}  // namespace

status encode_swiglu(stream& s, rows_view gate, rows_view up, rows_view out, std::uint32_t n,
                     std::uint32_t n_rows) {
    if (n == 0 || n_rows == 0 || n_rows > rows_limit(s)) return bad("swiglu", "bad shape");
    if (!fits(gate, n_rows, n) || !fits(up, n_rows, n) || !fits(out, n_rows, n)) {
        return bad("swiglu", "operand outside its binding");
    }
    if (prefer_texel(s) && texel_rows(gate, n_rows, n) && texel_rows(up, n_rows, n) &&
        vec4_rows(out)) {
        std::uint32_t wg = s.pipes().get(pipeline_id::swiglu_tx).workgroup_size;
        abi::swiglu_push p{
            n,         n_rows,     buffer_offset(gate), gate.stride, buffer_offset(up),
            up.stride, out.offset, out.stride};
        s.dispatch(pipeline_id::swiglu_tx, {gate.view, up.view, out.view}, p,
                   {std::min(ceil_div(n / 4, wg), elementwise_groups_max), n_rows, 1});
        return {};
    }
    std::uint32_t wg = s.pipes().get(pipeline_id::swiglu).workgroup_size;
    abi::swiglu_push p{n,         n_rows,    gate.offset, gate.stride,
                       up.offset, up.stride, out.offset,  out.stride};
    s.dispatch(pipeline_id::swiglu, {gate.view, up.view, out.view}, p,
               {std::min(ceil_div(n, wg), elementwise_groups_max), n_rows, 1});
    return {};
}

status encode_add(stream& s, rows_view a, rows_view b, rows_view out, std::uint32_t n,
                  std::uint32_t n_rows) {
    if (n == 0 || n_rows == 0 || n_rows > rows_limit(s)) return bad("add", "bad shape");
    if (!fits(a, n_rows, n) || !fits(b, n_rows, n) || !fits(out, n_rows, n)) {
        return bad("add", "operand outside its binding");
    }
    std::uint32_t wg = s.pipes().get(pipeline_id::add).workgroup_size;
    abi::add_push p{n, n_rows, a.offset, a.stride, b.offset, b.stride, out.offset, out.stride};
    s.dispatch(pipeline_id::add, {a.view, b.view, out.view}, p,
               {std::min(ceil_div(n, wg), elementwise_groups_max), n_rows, 1});
    return {};
}

status encode_kv_write(stream& s, const kv_pool& pool, std::uint32_t layer, rows_view k,
                       rows_view v, ints_view slots, std::uint32_t n_tokens) {
    const kv_geometry& g = pool.geometry();
    std::uint64_t width = std::uint64_t(g.n_head_kv) * g.head_dim;
    if (layer >= g.n_layer || n_tokens == 0 || n_tokens > rows_limit(s)) {
        return bad("kv_write", "bad layer or token count");
    }
    // The shader takes one source binding with two offsets: k and v must share a buffer view.
    if (k.view.buf != v.view.buf || k.view.offset != v.view.offset || k.stride != v.stride) {
        return bad("kv_write", "k and v must be rows of the same view with the same stride");
    }
    if (!fits(k, n_tokens, width) || !fits(v, n_tokens, width) || !fits(slots, n_tokens)) {
        return bad("kv_write", "operand outside its binding");
    }
    pipeline_id id = g.f16 ? pipeline_id::kv_write_f16 : pipeline_id::kv_write_f32;
    std::uint32_t wg = s.pipes().get(id).workgroup_size;
    abi::kv_write_push p{n_tokens, g.n_head_kv, g.head_dim, g.block_tokens, g.n_blocks,
                         k.stride, k.offset,    v.offset,   slots.offset};
    s.dispatch(id, {k.view, slots.view, pool.k(layer), pool.v(layer)}, p,
               {std::min(ceil_div(width / 2, wg), elementwise_groups_max), n_tokens, 1});
    return {};
}

namespace {

// rope_kv's checks and push constants (both rope_kv kernels and mul_mat_vec's ROPE store).
result<abi::rope_kv_push> rope_kv_params(const stream& s, const kv_pool& pool, std::uint32_t layer,
                                         const rows_view& qkv, const ints_view& positions,
                                         const ints_view& slots, const rope_table& rope,
                                         std::uint32_t n_tokens, std::uint32_t n_head) {
    const kv_geometry& g = pool.geometry();
    const std::uint32_t hd = g.head_dim, width = (n_head + 2 * g.n_head_kv) * hd;
    if (layer >= g.n_layer) return bad("rope_kv", "bad layer");
    if (n_tokens == 0 || n_tokens > rows_limit(s) || n_head == 0 || !rope_shape_ok(rope, hd)) {
        return bad("rope_kv",
                   "bad shape (n_rot must be even and <= head_dim, the table n_rot / "
                   "2 pairs)");
    }
    if (!fits(qkv, n_tokens, width)) return bad("rope_kv", "operand outside its binding");
    if (!fits(positions, n_tokens) || !fits(slots, n_tokens) ||
        positions.view.buf != slots.view.buf || positions.view.offset != slots.view.offset) {
        return bad("rope_kv", "positions and slots must be ints of one binding");
    }
    abi::rope_kv_push p{};
    p.n_tokens = n_tokens;
    p.n_head = n_head;
    p.n_head_kv = g.n_head_kv;
    p.head_dim = hd;
    p.n_rot = rope.n_rot;
    p.q_offset = qkv.offset;
    p.stride = qkv.stride;
    p.pos_offset = positions.offset;
    p.slots_offset = slots.offset;
    p.block_tokens = g.block_tokens;
    p.n_blocks = g.n_blocks;
    return p;
}

}  // namespace

status encode_rope_kv(stream& s, const kv_pool& pool, std::uint32_t layer, rows_view qkv,
                      ints_view positions, ints_view slots, const rope_table& rope,
                      std::uint32_t n_tokens, std::uint32_t n_head) {
    auto params = rope_kv_params(s, pool, layer, qkv, positions, slots, rope, n_tokens, n_head);
    if (!params) return params.err();
    abi::rope_kv_push p = *params;
    const kv_geometry& g = pool.geometry();
    const std::uint32_t hd = g.head_dim, width = (n_head + 2 * g.n_head_kv) * hd;
    if (prefer_texel(s) && hd % 4 == 0 && texel_rows(qkv, n_tokens, width)) {
        // One subgroup per token, a lane per texel of every head.
        p.src_texel = buffer_offset(qkv) / 4;
        pipeline_id id = g.f16 ? pipeline_id::rope_kv_tx_f16 : pipeline_id::rope_kv_tx_f32;
        s.dispatch(id,
                   {qkv.view, qkv.view, positions.view, pool.k(layer), pool.v(layer), rope.view}, p,
                   {1, n_tokens, 1});
        return {};
    }
    // A lane per pair of every head.
    pipeline_id id = g.f16 ? pipeline_id::rope_kv_f16 : pipeline_id::rope_kv_f32;
    std::uint32_t wg = s.pipes().get(id).workgroup_size;
    s.dispatch(id, {qkv.view, positions.view, pool.k(layer), pool.v(layer), rope.view}, p,
               {std::min(ceil_div(width / 2, wg), elementwise_groups_max), n_tokens, 1});
    return {};
}

status encode_norm_qkv_rope_kv(stream& s, const weight_tensor& w, const norm_input& in,
                               rows_view qkv, const rope_kv_input& rk, std::uint32_t n_tokens,
                               mat_path path) {
    if (rk.pool == nullptr) return bad("rope_kv", "no KV pool");
    const kv_geometry& g = rk.pool->geometry();
    // The fused store finds a row's head from its index: W must be exactly the q|k|v rows.
    if (w.n_out != (std::uint64_t(rk.n_head) + 2ull * g.n_head_kv) * g.head_dim) {
        return bad("rope_kv", "W must be the q|k|v rows: n_head q heads, n_head_kv k and v heads");
    }
    mat_path resolved = resolve_path(s, w, in.x, n_tokens, path);
    if (rk.fuse && resolved == mat_path::vec && w.chunks.size() == 1 && norm_fusable(w, in)) {
        auto params = rope_kv_params(s, *rk.pool, rk.layer, qkv, rk.positions, rk.slots, rk.rope,
                                     n_tokens, rk.n_head);
        if (!params) return params.err();
        if (status c = check_mul_mat(w, in.x, qkv, n_tokens, w.n_out); !c) return c;
        const pipeline_id id =
            g.f16 ? pipeline_id::mul_mat_vec_rope16_f32 : pipeline_id::mul_mat_vec_rope32_f32;
        auto pl = s.pipes().for_cols(pick(id, w.type), std::min(n_tokens, abi::ORDO_MMV_COLS),
                                     n_tokens == 1 ? w.vec_shape : mat_vec_shape{});
        if (!pl) return pl.err();
        // A RoPE pair's two rows in one workgroup (the head's rows start even).
        if (mat_vec_workgroup_rows(**pl) % 2 == 0) {
            mat_extra e{id, in.weight, in.eps, 0, &*params, {}};
            e.rope_bindings = {rk.positions.view, rk.pool->k(rk.layer), rk.pool->v(rk.layer),
                               rk.rope.view};
            return dispatch_storage(s, w, in.x, qkv, n_tokens, false, resolved, e);
        }
    }
    ORDO_TRY(encode_norm_mul_mat(s, w, in, qkv, n_tokens, path));
    return encode_rope_kv(s, *rk.pool, rk.layer, qkv, rk.positions, rk.slots, rk.rope, n_tokens,
                          rk.n_head);
}

namespace {

// One split (split_keys 0): a split longer than any context (the shaders add it to a key count,
// so half the range keeps that sum from wrapping).
constexpr std::uint32_t attention_one_split_keys = 0x7fffffffu;

// attention.comp for a pool geometry, and its workgroup: attention_flash's too (its key tile).
pipeline_id attention_id(const kv_geometry& g) {
    return g.f16 ? pipeline_id::attention_f16 : pipeline_id::attention_f32;
}

std::uint32_t attention_wg(const pipelines& pipes, const kv_geometry& g) {
    return pipes.get(attention_id(g)).workgroup_size;
}

// Whether attention_flash's shape fits the device: head_dim even and within the lanes'
// accumulators, its shared memory (queries, scores, key bases) within the device's.
bool attention_flash_geometry(const pipelines& pipes, const kv_geometry& g) {
    const std::uint64_t wg = attention_wg(pipes, g);
    const std::uint64_t shared = 4 * (abi::ORDO_ATTN_FLASH_ROWS * (g.head_dim + wg) + wg);
    return g.head_dim % 2 == 0 && g.head_dim <= wg * abi::ORDO_ATTN_ACC &&
           shared <= pipes.dev().info().max_shared_memory_bytes;
}

// Whether the device and the pool geometry allow attention_tx at all (the batch's views aside).
bool attention_tx_geometry(const pipelines& pipes, const kv_geometry& g) {
    const device_info& info = pipes.dev().info();
    return info.subgroup_arithmetic && pipes.tuning().attention_tx_wg == info.subgroup_size &&
           g.head_dim % 8 == 0 && g.head_dim <= abi::ORDO_ATTN_TX_HD_LARGE;
}

// Whether encode_attention's automatic path serves this geometry with attention_tx: the tuning
// prefers the texel kernels and the geometry allows them.
bool attention_tx_preferred(const pipelines& pipes, const kv_geometry& g) {
    return pipes.tuning().prefer_texel_kernels && attention_tx_geometry(pipes, g);
}

// Whether attention_tx can run this batch (see attention_path in kernels.hpp).
bool attention_tx_usable(const stream& s, const kv_pool& pool, std::uint32_t layer,
                         const attention_batch& b) {
    const kv_geometry& g = pool.geometry();
    auto covered = [](const buffer_view& v, std::uint64_t end_bytes) {
        return v.buf != nullptr && v.buf->texel_view() != VK_NULL_HANDLE && v.offset % 16 == 0 &&
               (v.offset + end_bytes + 15) / 16 <= v.buf->texel_count();
    };
    std::uint64_t width = std::uint64_t(b.n_head) * g.head_dim;
    std::uint64_t q_end = 4 * (b.q.offset + std::uint64_t(b.n_tokens - 1) * b.q.stride + width);
    return attention_tx_geometry(s.pipes(), g) && b.q.offset % 4 == 0 && b.q.stride % 4 == 0 &&
           covered(b.q.view, q_end) && covered(pool.k(layer), pool.k(layer).range) &&
           covered(pool.v(layer), pool.v(layer).range) &&
           covered(b.tables.view, 4ull * b.n_seqs * b.max_blocks_per_seq);
}

// The push fields attention.comp and attention_tx.comp share (abi.h).
template <typename Push>
Push attention_push_common(const kv_geometry& g, const attention_batch& b) {
    Push p{};
    p.n_tokens = b.n_tokens;
    p.n_head = b.n_head;
    p.n_head_kv = g.n_head_kv;
    p.head_dim = g.head_dim;
    p.block_tokens = g.block_tokens;
    p.n_blocks = g.n_blocks;
    p.max_blocks_per_seq = b.max_blocks_per_seq;
    p.n_seqs = b.n_seqs;
    p.tokens_offset = b.tokens.offset;
    p.out_offset = b.out.offset;
    p.out_stride = b.out.stride;
    p.scale = 1.0f / std::sqrt(static_cast<float>(g.head_dim));
    return p;
}

// The attention_tx variant for a pool geometry: grouped (prefill) or per query, head rows up to
// 64 or 128, F16 or F32 pool. Specialized on head_dim (pipelines::for_k).
pipeline_id attention_tx_id(const kv_geometry& g, bool grouped) {
    bool small = g.head_dim <= abi::ORDO_ATTN_TX_HD_SMALL;
    return grouped ? (small ? (g.f16 ? pipeline_id::attention_txg64_f16
                                     : pipeline_id::attention_txg64_f32)
                            : (g.f16 ? pipeline_id::attention_txg128_f16
                                     : pipeline_id::attention_txg128_f32))
           : small ? (g.f16 ? pipeline_id::attention_tx64_f16 : pipeline_id::attention_tx64_f32)
                   : (g.f16 ? pipeline_id::attention_tx128_f16 : pipeline_id::attention_tx128_f32);
}

status encode_attention_tx(stream& s, const kv_pool& pool, std::uint32_t layer,
                           const attention_batch& b) {
    const kv_geometry& g = pool.geometry();
    // Prefill-like steps (several tokens per sequence on average) take the grouped variant;
    // both give every query the same bits (attention_tx.comp).
    bool grouped = b.n_tokens >= abi::ORDO_ATTN_TX_GROUP * b.n_seqs;
    pipeline_id id = attention_tx_id(g, grouped);
    auto pl = s.pipes().for_k(id, g.head_dim);
    if (!pl) return pl.err();
    std::uint32_t gy = grouped ? ceil_div(b.n_tokens, abi::ORDO_ATTN_TX_GROUP) : b.n_tokens;
    auto p = attention_push_common<abi::attention_tx_push>(g, b);
    p.q_texel = static_cast<std::uint32_t>((b.q.view.offset + 4ull * b.q.offset) / 16);
    p.q_stride4 = b.q.stride / 4;
    p.k_texel = static_cast<std::uint32_t>(pool.k(layer).offset / 16);
    p.v_texel = static_cast<std::uint32_t>(pool.v(layer).offset / 16);
    p.tables_texel = static_cast<std::uint32_t>(b.tables.view.offset / 16);
    s.dispatch(**pl, id,
               {b.q.view, pool.k(layer), pool.v(layer), b.tokens.view, b.tables.view, b.out.view},
               p, {b.n_head, gy, 1});
    return {};
}

// Loop iterations one attention invocation runs for a sequence of `positions`: attention_tx
// walks positions / lanes keys per lane, once per query when a grouped workgroup mixes
// sequences (at most ORDO_ATTN_TX_GROUP passes); attention.comp walks key tiles of wg keys,
// each with a head_dim / 2 loop and two tile loops.
std::uint64_t attention_iterations(bool tx, std::uint64_t positions, std::uint64_t lanes,
                                   std::uint64_t wg, std::uint64_t head_dim) {
    return tx ? (positions + lanes - 1) / lanes * abi::ORDO_ATTN_TX_GROUP + 64
              : (positions + wg - 1) / wg * (head_dim / 2 + 2 * wg) + head_dim;
}

// attention.comp over a batch (or a range of one): one workgroup per (head, token), or for few
// tokens over long contexts the split grid and the merge (flash decoding).
status encode_attention_classic(stream& s, const kv_pool& pool, std::uint32_t layer,
                                const attention_batch& b) {
    const kv_geometry& g = pool.geometry();
    pipeline_id id = attention_id(g);
    const std::uint64_t positions = std::uint64_t(b.max_blocks_per_seq) * g.block_tokens;
    auto p = attention_push_common<abi::attention_push>(g, b);
    p.q_offset = b.q.offset;
    p.q_stride = b.q.stride;
    p.split_keys = b.split_keys != 0 ? b.split_keys : attention_one_split_keys;
    const std::uint64_t n_splits = (positions + p.split_keys - 1) / p.split_keys;
    const bool grid = b.split_keys != 0 && b.partials.buf != nullptr && n_splits > 1 &&
                      b.n_tokens <= attention_split_tokens_max;
    if (!grid) {
        // The partials binding is unused: the output stands in for it.
        s.dispatch(id,
                   {b.q.view, pool.k(layer), pool.v(layer), b.tokens.view, b.tables.view,
                    b.out.view, b.out.view},
                   p, {b.n_head, b.n_tokens, 1});
        return {};
    }
    // Flash decoding: one workgroup per (head, token, split), then the merge.
    if (n_splits > b.max_splits || n_splits > s.dev().info().max_workgroup_count[2] ||
        b.partials.range < 4 * attention_partials_floats(b.n_head, g.head_dim, b.max_splits)) {
        return bad("attention", "the partials binding holds fewer splits than the context");
    }
    p.split_grid = 1;
    p.max_splits = b.max_splits;
    s.dispatch(id,
               {b.q.view, pool.k(layer), pool.v(layer), b.tokens.view, b.tables.view, b.out.view,
                b.partials},
               p, {b.n_head, b.n_tokens, static_cast<std::uint32_t>(n_splits)});
    abi::attention_merge_push m{
        b.n_tokens,   b.n_head,    g.head_dim, b.max_splits, static_cast<std::uint32_t>(n_splits),
        b.out.offset, b.out.stride};
    s.dispatch(pipeline_id::attention_merge, {b.partials, b.out.view}, m,
               {b.n_head, b.n_tokens, 1});
    return {};
}

pipeline_id attention_flash_id(const kv_geometry& g) {
    return g.f16 ? pipeline_id::attention_flash_f16 : pipeline_id::attention_flash_f32;
}

// Whether attention_flash can run a batch of this geometry whose tiles meet at most `passes`
// sequences: its shape fits the device (attention_flash_geometry) and, on a device that caps
// loop iterations (llvmpipe), its loops stay under the cap: per pass, each key tile's
// head_dim / 2 score loop and two key loops, and the query load.
bool attention_flash_fits(const stream& s, const kv_geometry& g, const attention_batch& b,
                          std::uint32_t passes) {
    const std::uint32_t cap = s.dev().info().loop_iterations_max;
    const std::uint64_t wg = attention_wg(s.pipes(), g);
    const std::uint64_t rows = abi::ORDO_ATTN_FLASH_ROWS;
    const std::uint64_t positions = std::uint64_t(b.max_blocks_per_seq) * g.block_tokens;
    const std::uint64_t splits =
        b.split_keys != 0 ? (positions + b.split_keys - 1) / b.split_keys : 1;
    const std::uint64_t iterations =
        std::uint64_t(std::max<std::uint32_t>(1, passes)) *
            ((positions + wg - 1) / wg * (g.head_dim / 2 + 2 * wg) + splits) +
        (rows * g.head_dim / 2 + wg - 1) / wg;
    return attention_flash_geometry(s.pipes(), g) && (cap == 0 || iterations <= cap);
}

// attention_flash.comp over a batch (or a range of one): per KV head, one workgroup per tile of
// tile_rows (token, query head) rows (1..ORDO_ATTN_FLASH_ROWS).
status encode_attention_flash(stream& s, const kv_pool& pool, std::uint32_t layer,
                              const attention_batch& b,
                              std::uint32_t tile_rows = abi::ORDO_ATTN_FLASH_ROWS) {
    const kv_geometry& g = pool.geometry();
    pipeline_id id = attention_flash_id(g);
    auto pl = s.pipes().for_k(id, g.head_dim);
    if (!pl) return pl.err();
    const std::uint64_t rows = std::uint64_t(b.n_tokens) * (b.n_head / g.n_head_kv);
    const std::uint64_t gy = (rows + tile_rows - 1) / tile_rows;
    if (gy > s.dev().info().max_workgroup_count[1]) {
        return bad("attention", "flash path: more query tiles than the device's grid");
    }
    auto p = attention_push_common<abi::attention_push>(g, b);
    p.q_offset = b.q.offset;
    p.q_stride = b.q.stride;
    p.split_keys = b.split_keys != 0 ? b.split_keys : attention_one_split_keys;
    p.tile_rows = tile_rows;
    s.dispatch(**pl, id,
               {b.q.view, pool.k(layer), pool.v(layer), b.tokens.view, b.tables.view, b.out.view},
               p, {g.n_head_kv, static_cast<std::uint32_t>(gy), 1});
    return {};
}

// Tokens [t0, t0 + n) of a batch, as a batch.
attention_batch attention_range(const attention_batch& b, std::uint32_t t0, std::uint32_t n) {
    attention_batch r = b;
    r.q.offset += t0 * b.q.stride;
    r.out.offset += t0 * b.out.stride;
    r.tokens.offset += 2 * t0;
    r.n_tokens = n;
    if (!b.host_tokens.empty()) r.host_tokens = b.host_tokens.subspan(2ull * t0, 2ull * n);
    return r;
}

}  // namespace

std::uint64_t attention_positions_max(const pipelines& pipes, const kv_geometry& g) {
    const device_info& info = pipes.dev().info();
    const std::uint32_t cap = info.loop_iterations_max;
    if (cap == 0) return 0;
    bool tx = attention_tx_preferred(pipes, g);
    std::uint64_t lanes = std::max<std::uint32_t>(1, info.subgroup_size);
    std::uint64_t wg = attention_wg(pipes, g);
    auto fits = [&](std::uint64_t blocks) {
        return attention_iterations(tx, blocks * g.block_tokens, lanes, wg, g.head_dim) <= cap;
    };
    // The most whole blocks within the cap (iterations grow with positions): a binary search
    // over the same count encode_attention checks, so the two cannot disagree.
    std::uint64_t lo = 1, hi = 2;
    while (fits(hi)) hi *= 2;
    while (hi - lo > 1) {
        std::uint64_t mid = lo + (hi - lo) / 2;
        (fits(mid) ? lo : hi) = mid;
    }
    return lo * g.block_tokens;
}

status prepare_attention(const pipelines& pipes, const kv_geometry& g) {
    if (!attention_tx_preferred(pipes, g)) return {};
    for (bool grouped : {false, true}) {
        auto pl = pipes.for_k(attention_tx_id(g, grouped), g.head_dim);
        if (!pl) return pl.err();
    }
    return {};
}

bool attention_flash_candidate(const pipelines& pipes, const kv_geometry& g) {
    return !attention_tx_preferred(pipes, g) && attention_flash_geometry(pipes, g);
}

status prepare_attention_flash(const pipelines& pipes, const kv_geometry& g) {
    auto pl = pipes.for_k(attention_flash_id(g), g.head_dim);
    if (!pl) return pl.err();
    return {};
}

status encode_attention(stream& s, const kv_pool& pool, std::uint32_t layer,
                        const attention_batch& b) {
    return encode_attention(s, pool, layer, b, attention_path::automatic);
}

status encode_attention(stream& s, const kv_pool& pool, std::uint32_t layer,
                        const attention_batch& b, attention_path path) {
    const kv_geometry& g = pool.geometry();
    std::uint32_t wg = attention_wg(s.pipes(), g);
    if (layer >= g.n_layer || b.n_tokens == 0 || b.n_tokens > rows_limit(s) || b.n_seqs == 0 ||
        b.max_blocks_per_seq == 0 || b.n_head == 0 || b.n_head % g.n_head_kv != 0 ||
        b.n_head > s.dev().info().max_workgroup_count[0]) {
        return bad("attention", "bad shape (n_head must be a multiple of n_head_kv)");
    }
    if (g.head_dim > wg * abi::ORDO_ATTN_ACC || g.head_dim > abi::ORDO_ATTN_HEAD_DIM_MAX) {
        return bad("attention", "head_dim " + std::to_string(g.head_dim) +
                                    " exceeds this device's attention workgroup");
    }
    std::uint64_t width = std::uint64_t(b.n_head) * g.head_dim;
    if (!fits(b.q, b.n_tokens, width) || !fits(b.out, b.n_tokens, width) ||
        !fits(b.tokens, 2ull * b.n_tokens) ||
        !fits(b.tables, std::uint64_t(b.n_seqs) * b.max_blocks_per_seq) || b.tables.offset != 0) {
        return bad("attention", "operand outside its binding (tables must start at offset 0)");
    }
    bool tx_ok = attention_tx_usable(s, pool, layer, b);
    if (path == attention_path::texel && !tx_ok) {
        return bad("attention", "texel path: head_dim, subgroup or texel views do not allow it");
    }
    bool tx = path == attention_path::texel || (path == attention_path::automatic && tx_ok &&
                                                s.pipes().tuning().prefer_texel_kernels);
    // The loop iterations one invocation runs for the longest sequence of the step: attention_tx
    // walks a lane's keys (per query when a grouped workgroup mixes sequences); attention.comp
    // walks key tiles, each with a head_dim loop and two tile loops. A device that caps them
    // would end the loops early and attend over a prefix without a word: refused instead.
    const std::uint32_t cap = s.dev().info().loop_iterations_max;
    const std::uint64_t positions = std::uint64_t(b.max_blocks_per_seq) * g.block_tokens;
    const std::uint64_t iterations = attention_iterations(
        tx, positions, std::max<std::uint32_t>(1, s.dev().info().subgroup_size), wg, g.head_dim);
    if (cap != 0 && iterations > cap) {
        return bad("attention", "attending over " + std::to_string(positions) +
                                    " positions needs ~" + std::to_string(iterations) +
                                    " loop iterations per invocation; this device ends loops "
                                    "after " +
                                    std::to_string(cap) +
                                    " (llvmpipe): use a shorter context (model.context_tokens)");
    }
    if (tx) return encode_attention_tx(s, pool, layer, b);
    if (b.split_keys % wg != 0) {
        return bad("attention", "split_keys must be a multiple of the attention workgroup");
    }
    if (path == attention_path::flash) {
        if (!attention_flash_fits(s, g, b, std::min(abi::ORDO_ATTN_FLASH_ROWS, b.n_seqs))) {
            return bad("attention",
                       "flash path: head_dim, shared memory or the device's loop cap do not "
                       "allow it");
        }
        return encode_attention_flash(s, pool, layer, b);
    }
    if (path == attention_path::classic || b.host_tokens.size() != 2ull * b.n_tokens ||
        !attention_flash_fits(s, g, b, 2)) {
        return encode_attention_classic(s, pool, layer, b);
    }
    // Runs of one sequence that fill a flash tile go to attention_flash, whole tiles; the rest
    // (decode tokens, short runs), where there are more than the split grid serves, grouped-
    // query heads to share keys and the tuning asks (pipeline_tuning::attention_token_tiles),
    // to attention_flash with a tile per token of its heads (the largest divisor of G within a
    // tile: one sequence a tile); else to attention.comp.
    // Neighbouring runs of one kind share a dispatch. A range of long runs meets at most two
    // sequences a tile (the fits check above: two passes).
    const std::uint32_t group = b.n_head / g.n_head_kv;
    const std::uint32_t run_min =
        ceil_div(attention_flash_tiles_min * abi::ORDO_ATTN_FLASH_ROWS, group);
    std::uint32_t token_tile = std::min(group, abi::ORDO_ATTN_FLASH_ROWS);
    while (group % token_tile != 0) --token_tile;
    auto encode_range = [&](std::uint32_t t0, std::uint32_t t1, bool long_runs) {
        attention_batch r = attention_range(b, t0, t1 - t0);
        if (long_runs) return encode_attention_flash(s, pool, layer, r);
        if (group > 1 && r.n_tokens > attention_split_tokens_max &&
            s.pipes().tuning().attention_token_tiles) {
            return encode_attention_flash(s, pool, layer, r, token_tile);
        }
        return encode_attention_classic(s, pool, layer, r);
    };
    std::uint32_t range0 = 0;
    bool range_long = false;
    for (std::uint32_t t0 = 0, t1 = 0; t0 < b.n_tokens; t0 = t1) {
        t1 = t0 + 1;
        while (t1 < b.n_tokens && b.host_tokens[2 * t1] == b.host_tokens[2 * t0]) ++t1;
        bool long_run = t1 - t0 >= run_min;
        if (t0 == 0) {
            range_long = long_run;
        } else if (long_run != range_long) {
            ORDO_TRY(encode_range(range0, t0, range_long));
            range0 = t0;
            range_long = long_run;
        }
    }
    return encode_range(range0, b.n_tokens, range_long);
}

std::uint32_t attention_split_keys(std::uint64_t positions, std::uint32_t wg) {
    std::uint64_t keys = std::max<std::uint64_t>(
        attention_split_keys_min, (positions + attention_splits_max - 1) / attention_splits_max);
    keys = (keys + wg - 1) / wg * wg;
    return static_cast<std::uint32_t>(keys);
}

std::uint64_t attention_partials_floats(std::uint32_t n_head, std::uint32_t head_dim,
                                        std::uint32_t max_splits) {
    return std::uint64_t(attention_split_tokens_max) * n_head * max_splits * (head_dim + 2);
}

status encode_spin_until(stream& s, buffer_view flag, std::uint32_t rounds) {
    if (flag.range < 8 || rounds == 0 || rounds > s.dev().info().max_workgroup_count[0]) {
        return bad("spin_until", "bad arguments");
    }
    std::uint32_t cap = s.dev().info().loop_iterations_max;
    abi::spin_push p{cap != 0 ? std::min<std::uint32_t>(abi::ORDO_SPIN_POLLS, cap)
                              : abi::ORDO_SPIN_POLLS_UNCAPPED,
                     2};
    s.dispatch(pipeline_id::spin_until, {flag}, p, {rounds, 1, 1});
    return {};
}

status encode_spin(stream& s, buffer_view data, std::uint32_t iterations,
                   std::uint32_t workgroups) {
    if (data.range < 4 || iterations == 0 || workgroups == 0 ||
        workgroups > s.dev().info().max_workgroup_count[0]) {
        return bad("spin", "bad arguments");
    }
    abi::spin_push p{iterations,
                     static_cast<std::uint32_t>(std::min<std::uint64_t>(data.range / 4, 1u << 20))};
    s.dispatch(pipeline_id::spin, {data}, p, {workgroups, 1, 1});
    return {};
}

}  // namespace ordo::gpu
