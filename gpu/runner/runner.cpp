// runner.cpp: see runner.hpp. Creation (device, weights, KV pool, buffers), KV staging and
// drain; the step recording lives in runner_forward.cpp.
#include "gpu/runner/runner.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "gpu/vk/kernels.hpp"
#include "gpu/vk/shaders/abi.h"
#include "gpu/vk/vk_util.hpp"
#include "model/cpu_ops.hpp"

namespace ordo::gpu {

namespace {

// Weight arena pages: one storage binding each, capped so a device with a 4 GiB binding range
// does not reserve 4 GiB pages for a small model.
constexpr std::uint64_t arena_page_bytes_max = 256ull << 20;
// Dispatches a segment may hold, at most, whatever flush_every_layers says (F5).
constexpr std::uint32_t segment_dispatches_max = 16'384;
// Norm weight rows are rounded to this many floats so each starts binding-aligned (256 B).
constexpr std::uint32_t norm_align_floats = 64;

std::uint32_t round_up(std::uint32_t n, std::uint32_t m) {
    return (n + m - 1) / m * m;
}

error bad_config(const std::string& why) {
    return gpu_error(gpu_failure::bad_config, why);
}

status check_options(const runner_options& o) {
    if (o.flush_every_layers > runner_flush_every_layers_max) {
        return bad_config("flush_every_layers must be 0 (the device's) or 1.." +
                          std::to_string(runner_flush_every_layers_max));
    }
    if (o.watchdog_ms == 0) return bad_config("watchdog_ms must be > 0");
    if (o.warmup_ms_max == 0) return bad_config("warmup_ms_max must be > 0");
    if (o.kv_block_tokens == 0) return bad_config("kv_block_tokens must be > 0");
    if (o.max_batch_tokens == 0 || o.max_batch_tokens > runner_max_batch_tokens_max) {
        return bad_config("max_batch_tokens must be 1.." +
                          std::to_string(runner_max_batch_tokens_max));
    }
    if (o.rows_max == 0 || o.rows_max > o.max_batch_tokens) {
        return bad_config("rows_max must be 1..max_batch_tokens");
    }
    if (o.seqs_max == 0 || o.seqs_max > runner_seqs_max_max) {
        return bad_config("seqs_max must be 1.." + std::to_string(runner_seqs_max_max));
    }
    if (o.kv_copy_blocks_max == 0 || o.kv_copy_blocks_max > runner_kv_copy_blocks_max_max) {
        return bad_config("kv_copy_blocks_max must be 1.." +
                          std::to_string(runner_kv_copy_blocks_max_max));
    }
    if (o.kv_blocks == 0 && o.kv_memory_bytes == 0) {
        return bad_config("kv_blocks or kv_memory_bytes must be > 0");
    }
    return {};
}

}  // namespace

std::string_view build_stage_name(build_stage s) {
    switch (s) {
        case build_stage::device:
            return "device";
        case build_stage::weights:
            return "weights";
        case build_stage::warm_up:
            return "warm-up";
    }
    return "device";
}

std::string_view context_bound_name(context_bound b) {
    switch (b) {
        case context_bound::trained:
            return "trained";
        case context_bound::config:
            return "config";
        case context_bound::kv_pool:
            return "kv pool";
        case context_bound::device:
            return "device";
    }
    return "trained";
}

context_choice choose_context(std::uint32_t trained, std::uint32_t configured,
                              std::uint64_t pool_tokens, std::uint64_t device_max) {
    context_choice c{trained, context_bound::trained};
    const std::pair<std::uint64_t, context_bound> others[] = {{configured, context_bound::config},
                                                              {pool_tokens, context_bound::kv_pool},
                                                              {device_max, context_bound::device}};
    for (const auto& [limit, bound] : others) {
        if (limit != 0 && limit < c.n_ctx) c = {static_cast<std::uint32_t>(limit), bound};
    }
    return c;
}

status check_weight_types(const model::llama_weights& w) {
    std::vector<const model::matrix_view*> mats{&w.token_embd, &w.output};
    for (const auto& l : w.layers) {
        for (const auto* m : {&l.attn_q, &l.attn_k, &l.attn_v, &l.attn_output, &l.ffn_gate,
                              &l.ffn_up, &l.ffn_down}) {
            mats.push_back(m);
        }
    }
    for (const auto* m : mats) {
        if (kernels_run(m->type)) continue;
        return gpu_error(gpu_failure::unsupported_type,
                         "tensor '" + std::string(m->name) + "' has type " +
                             std::string(model::type_name(m->type)) +
                             ", which the Vulkan kernels do not run yet (they run " +
                             kernel_type_names() +
                             "); the CPU reference (`ordo-model generate "
                             "--backend cpu`) runs it");
    }
    return {};
}

result<std::unique_ptr<runner>> runner::create(const model::gguf_file& file,
                                               const runner_options& options) {
    status ok = check_options(options);
    if (!ok) return ok.err();
    std::unique_ptr<runner> r(new runner(options));
    r->_segment_wait_ms = options.watchdog_ms;
    status s = r->init(file);
    if (!s) return s.err();
    return r;
}

runner::~runner() {
    // A segment may still run after a timeout; destroying its buffers under it is undefined.
    if (_stream && _stream->state() == stream_state::in_flight) {
        (void)_stream->wait(_options.watchdog_ms);
    }
    if (_dev) (void)_dev->wait_idle();
}

status runner::init(const model::gguf_file& file) {
    auto w = model::map_llama_weights(file);
    if (!w) return w.err();
    if (status s = check_weight_types(*w); !s) return s;
    _hp = w->hp;
    if (_options.n_ctx > _hp.n_ctx) {
        return bad_config("n_ctx " + std::to_string(_options.n_ctx) + " exceeds the model's " +
                          std::to_string(_hp.n_ctx));
    }
    _embd_stride = round_up(_hp.n_embd, 8);
    _qkv_stride = round_up(_hp.n_embd + 2 * _hp.kv_dim(), 8);
    _ff_stride = round_up(_hp.n_ff, 8);
    _gu_stride = round_up(2 * _hp.n_ff, 8);
    report(build_stage::device, 0, 1);
    status s = init_device();
    if (!s) return s;
    auto blocks = kv_pool_blocks();
    if (!blocks) return blocks.err();
    init_context(*blocks);
    s = upload_model(*w);
    if (!s) return s;
    s = check_mat_coop();
    if (!s) return s;
    s = init_buffers(*blocks);
    if (!s) return s;
    import_logits_regions();
    s = init_stream();
    if (!s) return s;
    s = warm_up();
    if (!s) return s;
    s = choose_mat_vec_crossover();
    if (!s) return s;
    s = choose_mat_coop_tile();
    if (!s) return s;
    s = choose_mat_tiled_layouts();
    if (!s) return s;
    s = choose_mat_vec_shapes();
    if (!s) return s;
    // Every pipeline the steps use exists now (created at load, compiled by the warm-up): keep
    // them for the next start. A cache that cannot be written costs the next start time only.
    if (status saved = _pcache->save(); !saved) {
        logger()->warn("runner: pipeline cache not saved: {}", saved.err().message);
    }
    return {};
}

void runner::report(build_stage stage, std::uint32_t done, std::uint32_t total) const {
    if (_options.on_progress) _options.on_progress(build_progress{stage, done, total});
}

status runner::warm_up() {
    // llvmpipe compiles a pipeline's machine code at its first dispatch, not at creation
    // (~0.3-1.5 s for the unrolled mat-mul variants): run one step of each shape family now,
    // so the first request does not pay it. The steps write KV into blocks no sequence owns
    // yet; every sequence writes its own positions before it reads them.
    auto t0 = std::chrono::steady_clock::now();
    const std::uint32_t block = _options.kv_block_tokens;
    std::vector<float> logits;
    std::uint64_t step_id = 0;
    auto run = [&](std::uint32_t n_seqs, std::uint32_t tokens_per_seq) -> status {
        tokens_per_seq = std::min(tokens_per_seq, _limits.n_ctx);
        if (tokens_per_seq == 0) return {};
        std::uint32_t blocks_each = (tokens_per_seq + block - 1) / block;
        n_seqs = std::min({n_seqs, _options.seqs_max, _options.rows_max,
                           _options.max_batch_tokens / tokens_per_seq,
                           _limits.n_blocks / std::max<std::uint32_t>(blocks_each, 1)});
        if (n_seqs == 0 || blocks_each > _blocks_per_seq_max) return {};
        step st;
        st.step_id = ++step_id;
        st.phase = tokens_per_seq > 1 ? step_phase::prefill : step_phase::decode;
        std::uint32_t next_block = 0;
        for (std::uint32_t i = 0; i < n_seqs; ++i) {
            step_seq q;
            q.seq_id = i;
            q.tokens.assign(tokens_per_seq, 0);
            for (std::uint32_t b = 0; b < blocks_each; ++b) q.block_table.push_back(next_block++);
            q.logits_rows = 1;
            st.seqs.push_back(std::move(q));
        }
        logits.resize(std::size_t(n_seqs) * _hp.n_vocab);
        auto r = run_step(st, logits.data());
        if (!r) {
            // The stream names the bound it waited (here warmup_ms_max) as "(watchdog)".
            return make_error(r.err().code, "warm-up: " + r.err().message + " [gpu.warmup_ms_max " +
                                                std::to_string(_options.warmup_ms_max) + " ms]");
        }
        return {};
    };
    // Decode steps of 1, 2, 4 and 8 sequences (tx1, tx1t2, tx1t4, tx4), then a prefill chunk
    // (txm, grouped attention). Their submissions wait up to warmup_ms_max, not the watchdog:
    // a first dispatch that compiles its kernel on a busy machine is slow, not hung.
    constexpr std::pair<std::uint32_t, std::uint32_t> shapes[] = {
        {1, 1}, {2, 1}, {4, 1}, {8, 1}, {1, 32}};
    constexpr auto n_shapes = static_cast<std::uint32_t>(std::size(shapes));
    _segment_wait_ms = _options.warmup_ms_max;
    status s;
    for (std::uint32_t i = 0; s && i < n_shapes; ++i) {
        report(build_stage::warm_up, i, n_shapes);
        s = run(shapes[i].first, shapes[i].second);
    }
    _segment_wait_ms = _options.watchdog_ms;
    if (!s) return s;
    report(build_stage::warm_up, n_shapes, n_shapes);
    logger()->info(
        "runner: warm-up steps ran in {:.0f} ms (kernels compiled; pipeline cache {})",
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
        _pcache->load_note());
    return {};
}

// A timestamped stream for the warm-up's measurements, with the steps' split scratch and
// mat-vec crossover (time_mat_muls' segments are a few dispatches each).
result<std::unique_ptr<stream>> runner::timing_stream() const {
    auto str = stream::create(*_dev, *_pipes, {64, true});
    if (!str) return str.err();
    (*str)->set_mat_split_scratch(_stream->mat_split_scratch());
    (*str)->set_mat_vec_tokens_max(_stream->mat_vec_tokens_max());
    (*str)->set_mat_tiled_layouts(_stream->mat_tiled_layouts());
    return str;
}

// The GPU time of layer 0's gate|up (or gate) and down mat-muls at n_tokens on `path`, best
// of three segments; the activations are the step buffers (a step rewrites them before use).
result<double> runner::time_mat_muls(stream& str, mat_path path, std::uint32_t n_tokens) {
    const layer_weights& l = _layers[0];
    const weight_tensor& gu = l.gate_up.chunks.empty() ? l.gate : l.gate_up;
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) {
        ORDO_TRY(str.begin("mat_vec crossover"));
        ORDO_TRY(encode_mul_mat(str, gu, {whole(_xn), 0, _embd_stride}, {whole(_gu), 0, _gu_stride},
                                n_tokens, false, path));
        ORDO_TRY(encode_mul_mat(str, l.down, {whole(_hid), 0, _ff_stride},
                                {whole(_att), 0, _embd_stride}, n_tokens, false, path));
        ORDO_TRY(str.run(_options.warmup_ms_max));
        double ms = 0;
        for (const dispatch_timing& t : str.timings()) ms += t.ms;
        best = rep == 0 ? ms : std::min(best, ms);
    }
    return best;
}

// Where the storage family runs mul_mat_vec (GPUs; tests force it on lavapipe) and the option
// leaves it open, times mul_mat_vec against the tiled kernel on this model's FFN matrices at
// 2..16 tokens and keeps mul_mat_vec up to the last count where it was at least as fast at
// every count so far (issue 29: a measured crossover per device and model, not one constant).
// Both sum in one order (mat_order.glsl), so the choice changes speed, never a bit.
status runner::choose_mat_vec_crossover() {
    const pipeline_tuning& tu = _pipes->tuning();
    std::uint32_t chosen = gpu::mat_vec_tokens_max;
    if (_options.mat_vec_tokens_max) {
        chosen = std::clamp<std::uint32_t>(*_options.mat_vec_tokens_max, 1, mat_vec_tokens_limit);
    }
    const bool vec_runs = !tu.prefer_texel_kernels && tu.rows_tokens_max == 0;
    if (!_options.mat_vec_tokens_max && vec_runs && _dev->info().timestamps) {
        auto str = timing_stream();
        if (!str) return str.err();
        constexpr std::uint32_t counts[] = {2, 3, 4, 6, 8, 12, 16};
        std::string seen;
        chosen = 1;
        bool vec_ahead = true;
        for (std::uint32_t n : counts) {
            if (n > _options.max_batch_tokens) break;
            auto vec = time_mat_muls(**str, mat_path::vec, n);
            if (!vec) return vec.err();
            auto tiled = time_mat_muls(**str, mat_path::tiled, n);
            if (!tiled) return tiled.err();
            vec_ahead = vec_ahead && *vec <= *tiled;
            if (vec_ahead) chosen = n;
            char line[64];
            std::snprintf(line, sizeof line, " %u: %.3f/%.3f", n, *vec, *tiled);
            seen += line;
            if (!vec_ahead) break;  // the choice is made: no more start-up time on it
        }
        logger()->info("runner: mul_mat_vec serves up to {} tokens (measured, ms vec/tiled:{})",
                       chosen, seen);
    }
    _stream->set_mat_vec_tokens_max(chosen);
    return {};
}

// Where the tiled steps run on cooperative matrices and the option leaves it open, times the
// wide tile against the large one (more products per staged element, a quarter of the
// workgroups) on this model's FFN matrices at 64..512 tokens (those max_batch_tokens allows)
// and runs the large tile from the smallest count where it was at least as fast there and at
// every larger count measured (0: never). Not batch invariant either way (mat_coop).
status runner::choose_mat_coop_tile() {
    const pipeline_tuning& tu = _pipes->tuning();
    std::uint32_t chosen = 0;
    if (_options.mat_coop_large_from) {
        chosen = *_options.mat_coop_large_from;
    } else if (tu.mat_coop && _dev->info().timestamps &&
               tu.mat_coop_large.rows() * tu.mat_coop_large.tokens() >
                   tu.mat_coop_wide.rows() * tu.mat_coop_wide.tokens()) {
        auto str = timing_stream();
        if (!str) return str.err();
        constexpr std::uint32_t counts[] = {64, 128, 256, 512};
        std::string seen;
        for (std::uint32_t n : counts) {
            if (n > _options.max_batch_tokens) break;
            (*str)->set_mat_coop_large_from(0);
            auto wide = time_mat_muls(**str, mat_path::tiled, n);
            if (!wide) return wide.err();
            (*str)->set_mat_coop_large_from(1);
            auto large = time_mat_muls(**str, mat_path::tiled, n);
            if (!large) return large.err();
            // The large tile from here, unless a larger count finds it slower.
            if (*large > *wide) {
                chosen = 0;
            } else if (chosen == 0) {
                chosen = n;
            }
            char line[64];
            std::snprintf(line, sizeof line, " %u: %.3f/%.3f", n, *wide, *large);
            seen += line;
        }
        logger()->info(
            "runner: the cooperative-matrix large tile serves {} (measured, ms wide/large:{})",
            chosen != 0 ? "from " + std::to_string(chosen) + " tokens" : "no step", seen);
    }
    _stream->set_mat_coop_large_from(chosen);
    return {};
}

// Where the invariant tiled kernel serves steps on a GPU (or the option asks), times its layouts
// (mat_tiled_layout_candidates: the tuning's, each of its knobs turned, staging by rows) on this
// model's layer-0 FFN matrices at 16, 64 and 512 tokens (those past the mat-vec crossover that
// max_batch_tokens allows; best of three segments each) and runs a step in the layout that was
// fastest at the measured count nearest its own (the boundaries at the counts' geometric means:
// 33 and 182 tokens). Every weight's pipelines in a candidate layout are built first, never on
// the step path; a layout the driver cannot build is not timed. No bit depends on the layout.
status runner::choose_mat_tiled_layouts() {
    const pipeline_tuning& tu = _pipes->tuning();
    const device_info& info = _dev->info();
    const bool wanted = _options.mat_tiled_layouts.value_or(info.kind != device_kind::cpu);
    if (!wanted || tu.prefer_texel_kernels || tu.mat_coop || !info.timestamps || _layers.empty()) {
        return {};
    }
    std::vector<const weight_tensor*> weights;
    for (const layer_weights& l : _layers) {
        for (const weight_tensor* w :
             {&l.qkv, &l.wq, &l.wk, &l.wv, &l.wo, &l.gate_up, &l.gate, &l.up, &l.down}) {
            if (!w->chunks.empty()) weights.push_back(w);
        }
    }
    weights.push_back(&_output);
    // The layouts every weight's pipelines can be built in.
    std::vector<mat_tiled_layout> layouts;
    for (const mat_tiled_layout& l :
         mat_tiled_layout_candidates(tu, info.max_shared_memory_bytes)) {
        status built;
        for (const weight_tensor* w : weights) {
            if (built) built = prepare_mul_mat_tiled_layout(*_pipes, *w, l);
        }
        if (built) {
            layouts.push_back(l);
        } else {
            logger()->info("runner: tiled mul_mat layout {} not timed: {}", l.name(),
                           built.err().message);
        }
    }
    if (layouts.size() < 2) return {};
    auto str = timing_stream();
    if (!str) return str.err();
    constexpr std::uint32_t counts[] = {16, 64, 512};
    std::vector<std::pair<std::uint32_t, mat_tiled_layout>> chosen;
    std::string seen;
    std::uint32_t prev = 0;
    for (std::uint32_t n : counts) {
        if (n > _options.max_batch_tokens) break;
        if (n <= _stream->mat_vec_tokens_max()) continue;  // mul_mat_vec serves it
        std::vector<double> ms;
        std::size_t best = 0;
        for (const mat_tiled_layout& l : layouts) {
            (*str)->set_mat_tiled_layouts({{0, l}});
            auto t = time_mat_muls(**str, mat_path::tiled, n);
            if (!t) return t.err();
            ms.push_back(*t);
            if (*t < ms[best]) best = ms.size() - 1;
        }
        const auto from =
            prev == 0 ? 0u : static_cast<std::uint32_t>(std::sqrt(double(prev) * n)) + 1;
        chosen.emplace_back(from, layouts[best]);
        seen += (seen.empty() ? "" : "; ") + std::to_string(n) + ":";
        for (std::size_t i = 0; i < layouts.size(); ++i) {
            char line[48];
            std::snprintf(line, sizeof line, " %s %.3f%s", layouts[i].name().c_str(), ms[i],
                          i == best ? "*" : "");
            seen += line;
        }
        prev = n;
    }
    if (chosen.empty()) return {};
    _stream->set_mat_tiled_layouts(chosen);
    _mat_tiled_layouts = seen;
    logger()->info(
        "runner: tiled mul_mat layouts by token count (measured, ms of layer 0's FFN mat-muls; "
        "s swizzled, t token tiles first, r staged by rows, k the K step; * serves from the "
        "count to the next boundary): {}",
        seen);
    return {};
}

// Where the storage family runs mul_mat_vec on a GPU (or the option asks), times each weight's
// one-token mat-vec in every shape mat_vec_shape_candidates lists and keeps, per role and type
// (q|k|v, o, gate|up, down, the output head, ...), the fastest. One segment per shape runs
// every layer's weights of every role in a decode step's order, so the model streams from
// memory once as in a step and no weight is timed from a warm cache; best of three. The shapes
// sum in one order (mul_mat_vec.comp): the choice changes speed, never a bit.
status runner::choose_mat_vec_shapes() {
    const pipeline_tuning& tu = _pipes->tuning();
    const device_info& info = _dev->info();
    const bool vec_runs = !tu.prefer_texel_kernels && tu.rows_tokens_max == 0;
    const bool wanted = _options.mat_vec_shapes.value_or(info.kind != device_kind::cpu);
    if (!wanted || !vec_runs || !info.timestamps || _layers.empty()) return {};
    // One decode token's mat-vecs, as record_layer and record_logits encode them.
    enum class op { norm, glu, plain, accumulate };
    struct job {
        weight_tensor* w;
        op how;
        rows_view x, y;
        const buffer* norm;  // op::norm, op::glu: the layer's norm weights
        std::size_t role;
        std::uint32_t first = 0, last = 0;  // its dispatches in the segment
    };
    struct role {
        std::string name;
        bool block_units;
        std::vector<mat_vec_shape> shapes;
        std::vector<double> ms;
    };
    std::vector<job> jobs;
    std::vector<role> roles;
    const std::uint32_t embd = _hp.n_embd;
    const auto [x, xn, q, k, v, att, gate, up, hid] = step_rows();
    auto add = [&](weight_tensor& w, const char* name, op how, rows_view in, rows_view out,
                   const buffer* norm = nullptr) {
        if (w.chunks.empty()) return;
        const std::string key = std::string(name) + " " + std::string(model::type_name(w.type));
        auto r =
            std::find_if(roles.begin(), roles.end(), [&](const role& c) { return c.name == key; });
        if (r == roles.end()) {
            const bool block = w.type != model::ggml_type::f32 && w.type != model::ggml_type::f16 &&
                               w.type != model::ggml_type::bf16;
            // The shapes a driver cannot build are not timed (the tuning's serves already).
            // (q|k|v: its norm variant is timed; the rope_kv one it runs is built too)
            const mat_fusion fusion = how == op::norm  ? qkv_fusion()
                                      : how == op::glu ? mat_fusion::glu
                                                       : mat_fusion::none;
            std::vector<mat_vec_shape> shapes;
            for (mat_vec_shape sh :
                 mat_vec_shape_candidates(tu, block, info.max_shared_memory_bytes)) {
                status built = prepare_mul_mat_vec_shape(*_pipes, w, fusion, sh);
                if (built || sh.tuned()) {
                    shapes.push_back(sh);
                } else {
                    logger()->info("runner: {} mul_mat_vec shape {}x{} not timed: {}", key,
                                   sh.split, sh.unroll, built.err().message);
                }
            }
            roles.push_back({key, block, std::move(shapes)});
            r = roles.end() - 1;
        }
        jobs.push_back({&w, how, in, out, norm, static_cast<std::size_t>(r - roles.begin())});
    };
    for (layer_weights& l : _layers) {
        add(l.qkv, "q|k|v", op::norm, x, q, &l.attn_norm);
        add(l.wq, "q", op::plain, xn, q);
        add(l.wk, "k", op::plain, xn, k);
        add(l.wv, "v", op::plain, xn, v);
        add(l.wo, "o", op::accumulate, att, x);
        add(l.gate_up, "gate|up", op::glu, x, gate, &l.ffn_norm);
        add(l.gate, "gate", op::plain, xn, gate);
        add(l.up, "up", op::plain, xn, up);
        add(l.down, "down", op::accumulate, hid, x);
    }
    add(_output, "output", op::plain, {whole(_final), 0, _embd_stride},
        {logits_view(), 0, _hp.n_vocab});
    std::size_t shapes_max = 0, dispatches = 0;
    for (const role& r : roles) shapes_max = std::max(shapes_max, r.shapes.size());
    // (+2: an unfused norm and SwiGLU, where a weight of several chunks cannot fuse them)
    for (const job& j : jobs) dispatches += j.w->chunks.size() + 2;
    auto str = stream::create(*_dev, *_pipes, {static_cast<std::uint32_t>(dispatches), true});
    if (!str) return str.err();
    stream& s = **str;
    for (int rep = 0; rep < 3; ++rep) {
        for (std::size_t shape = 0; shape < shapes_max; ++shape) {
            ORDO_TRY(s.begin("mul_mat_vec shapes"));
            for (job& j : jobs) {
                j.first = j.last = s.dispatches();
                const role& r = roles[j.role];
                if (shape >= r.shapes.size()) continue;
                j.w->vec_shape = r.shapes[shape];
                const norm_input in{x, j.norm ? whole(*j.norm) : buffer_view{}, embd, _hp.rms_eps,
                                    xn};
                status e = j.how == op::norm ? encode_norm_mul_mat(s, *j.w, in, j.y, 1)
                           : j.how == op::glu
                               ? encode_norm_glu(s, *j.w, in, j.y, hid, _hp.n_ff, 1)
                               : encode_mul_mat(s, *j.w, j.x, j.y, 1, j.how == op::accumulate);
                if (!e) {
                    s.discard();
                    return e;
                }
                j.last = s.dispatches();
            }
            ORDO_TRY(s.run(_options.warmup_ms_max));
            const std::vector<dispatch_timing>& t = s.timings();
            std::vector<double> ms(roles.size(), 0.0);
            for (const job& j : jobs) {
                for (std::uint32_t d = j.first; d < j.last && d < t.size(); ++d) {
                    ms[j.role] += t[d].ms;
                }
            }
            for (std::size_t i = 0; i < roles.size(); ++i) {
                role& r = roles[i];
                if (shape >= r.shapes.size()) continue;
                if (r.ms.size() <= shape) r.ms.push_back(ms[i]);
                r.ms[shape] = std::min(r.ms[shape], ms[i]);
            }
        }
    }
    // Per role: the fastest shape (the tuning's on a tie), for every weight of the role.
    std::string seen;
    for (std::size_t i = 0; i < roles.size(); ++i) {
        const role& r = roles[i];
        std::size_t best = 0;
        for (std::size_t c = 1; c < r.ms.size(); ++c) {
            if (r.ms[c] < r.ms[best]) best = c;
        }
        for (const job& j : jobs) {
            if (j.role == i) j.w->vec_shape = r.shapes[best];
        }
        seen += (seen.empty() ? "" : "; ") + r.name + ":";
        for (std::size_t c = 0; c < r.ms.size(); ++c) {
            char line[48];
            std::snprintf(line, sizeof line, " %s %.3f%s",
                          mat_vec_shape_name(tu, r.shapes[c], r.block_units).c_str(), r.ms[c],
                          c == best ? "*" : "");
            seen += line;
        }
    }
    _mat_vec_shapes = seen;
    logger()->info(
        "runner: mul_mat_vec shapes at one token (measured, lanes a group x units a lane, ms a "
        "pass over the layers, * serves): {}",
        seen);
    return {};
}

void runner::init_context(std::uint32_t blocks) {
    // A device that caps shader loops (llvmpipe) bounds how far attention can look back.
    kv_geometry g{_hp.n_layer, _hp.n_head_kv,  _hp.head_dim(), _options.kv_block_tokens,
                  1,           _options.kv_f16};
    const std::uint64_t device_max = attention_positions_max(*_pipes, g);
    const std::uint64_t pool_tokens = std::uint64_t(blocks) * _options.kv_block_tokens;
    context_choice c = choose_context(_hp.n_ctx, _options.n_ctx, pool_tokens, device_max);
    _n_ctx_bound = c.bound;
    logger()->info(
        "runner: context {} positions (bound: {}; trained {}, config {}, kv pool {} "
        "tokens, device {})",
        c.n_ctx, context_bound_name(c.bound), _hp.n_ctx,
        _options.n_ctx != 0 ? std::to_string(_options.n_ctx) : "unset", pool_tokens,
        device_max != 0 ? std::to_string(device_max) : "no limit");
    _blocks_per_seq_max = (c.n_ctx + _options.kv_block_tokens - 1) / _options.kv_block_tokens;
    _limits = step_limits{_hp.n_vocab,
                          c.n_ctx,
                          _options.kv_block_tokens,
                          blocks,
                          _options.max_batch_tokens,
                          _options.rows_max,
                          _options.seqs_max,
                          _blocks_per_seq_max};
}

status runner::init_device() {
    auto d = device::create({_options.device});
    if (!d) return d.err();
    _dev = std::move(*d);
    logger()->info("runner: device {}", _dev->info().name);
    auto cache = pipeline_cache::open(*_dev, _options.pipeline_cache_dir, shader_build_id());
    if (!cache) return cache.err();
    _pcache = std::move(*cache);
    if (!_options.pipeline_cache_dir.empty()) {
        logger()->info("runner: pipeline cache {}: {}", _pcache->path(), _pcache->load_note());
    }
    pipeline_tuning tuning = tuning_for(_dev->info());
    if (_options.texel_kernels) tuning.prefer_texel_kernels = *_options.texel_kernels;
    if (_options.mat_vec_kernels) {
        tuning.rows_tokens_max = *_options.mat_vec_kernels ? 0 : gpu::mat_vec_tokens_max;
    }
    if (_options.mat_tiled_split_wg) tuning.mat_tiled_split_wg = *_options.mat_tiled_split_wg;
    if (_options.attention_k_pairs) tuning.attention_k_pairs = *_options.attention_k_pairs;
    if (_options.attention_v_group) tuning.attention_v_group = *_options.attention_v_group;
    if (_options.row_summaries) tuning.row_summaries = *_options.row_summaries;
    if (!_options.batch_invariant) {
        if (_options.mat_coop_emulated || _dev->info().cooperative_matrix) {
            tuning.mat_coop = true;
            tuning.mat_coop_emulated = _options.mat_coop_emulated;
            logger()->info(
                "runner: gpu.batch_invariant = false: the tiled mat-muls run on cooperative "
                "matrices{} (f16 inputs; a token's logits may depend on its step's batch)",
                _options.mat_coop_emulated ? " (emulated)" : "");
        } else {
            logger()->warn(
                "runner: gpu.batch_invariant = false, but {} has no usable cooperative matrices "
                "(VK_NV_cooperative_matrix with {} fragments, f16 arithmetic, the Vulkan memory "
                "model, 32-lane subgroups): the batch-invariant kernels run",
                _dev->info().name, mat_coop_shape_needed);
        }
    }
    tuning.fault_create_fails = _options.fault_pipeline_create;
    auto p = pipelines::create(*_dev, tuning, _pcache->handle());
    if (!p) return p.err();
    _pipes = std::move(*p);
    std::uint64_t page = std::min(_dev->info().max_storage_buffer_range, arena_page_bytes_max);
    if (_options.weight_page_bytes != 0) page = std::min(page, _options.weight_page_bytes);
    _arena = std::make_unique<arena>(*_dev, page);
    return {};
}

result<weight_tensor> runner::upload(const model::matrix_view& m, mat_fusion fusion) {
    auto t = upload_padded(m);
    if (!t) return t;
    // The K-specialized mat-mul pipelines are compiled now, never on the step path.
    status s = prepare_mul_mat(*_pipes, *t, fusion);
    // A driver that cannot build the cooperative-matrix kernel: the invariant kernels serve.
    if (!s && gpu_failure_of(s.err()) == gpu_failure::unsupported && _pipes->tuning().mat_coop) {
        if (status coop = prepare_mul_mat_coop(*_pipes, *t); !coop) {
            s = fall_back_to_invariant_kernels("cannot be built", coop.err());
            if (s) s = prepare_mul_mat(*_pipes, *t, fusion);
        }
    }
    if (!s && gpu_failure_of(s.err()) == gpu_failure::unsupported &&
        _pipes->tuning().prefer_texel_kernels) {
        s = fall_back_to_storage_kernels(s.err());
        if (s) s = prepare_mul_mat(*_pipes, *t, fusion);
    }
    if (!s) return s.err();
    return t;
}

// Where the tiled steps would run on cooperative matrices, checks the kernel on this driver
// before it serves anything: for each weight type among the layers' matrices, the smallest such
// matrix (so the check's buffers stay small beside a large model's weights: about 9 MiB for an
// 8B's 4096 x 1024 v matrix) on fixed pseudo-random activations at 16, 48 and 144 tokens (the
// narrow, the wide and the large tile), its K split and unsplit, against the invariant tiled
// kernel on the same inputs. The largest difference over a token's RMS is about 1e-3 where the
// kernel is right (the f16 inputs' rounding) and about 1 where a driver lays its fragments out
// otherwise; past mat_coop_check_err_max the invariant kernels serve, with a warning giving the
// numbers. Always logged: the first GPU to run the kernel says it here. (The output head is not
// checked: its rows would need a scratch of hundreds of MiB; every type shares the kernel's
// staging and fragments, and its dequantization is the invariant kernels' own.)
status runner::check_mat_coop() {
    const pipeline_tuning& tu = _pipes->tuning();
    if (!tu.mat_coop || tu.prefer_texel_kernels || _layers.empty()) return {};
    std::vector<std::pair<const weight_tensor*, std::string>> checked;
    for (std::size_t i = 0; i < _layers.size(); ++i) {
        const layer_weights& l = _layers[i];
        const std::pair<const weight_tensor*, const char*> matrices[] = {
            {&l.qkv, "q|k|v"}, {&l.wq, "q"},  {&l.wk, "k"},
            {&l.wv, "v"},      {&l.wo, "o"},  {&l.gate_up, "gate|up"},
            {&l.gate, "gate"}, {&l.up, "up"}, {&l.down, "down"}};
        for (auto [w, name] : matrices) {
            if (w->chunks.empty()) continue;
            auto size = [](const weight_tensor* t) { return std::uint64_t(t->n_in) * t->n_out; };
            auto same = std::find_if(checked.begin(), checked.end(),
                                     [&](const auto& c) { return c.first->type == w->type; });
            if (same == checked.end()) {
                checked.emplace_back(w, std::to_string(i) + "." + name);
            } else if (size(w) < size(same->first)) {
                *same = {w, std::to_string(i) + "." + name};
            }
        }
    }
    std::uint64_t k_max = 0, rows_max = 0;
    std::size_t chunks_max = 0;
    for (const auto& c : checked) {
        k_max = std::max<std::uint64_t>(k_max, c.first->n_in);
        rows_max = std::max<std::uint64_t>(rows_max, c.first->n_out);
        chunks_max = std::max(chunks_max, c.first->chunks.size());
    }
    constexpr std::uint32_t n_max = 144;
    // Memory it cannot have leaves the kernel unchecked, so not serving.
    auto x = _dev->create_buffer(4 * k_max * n_max, memory_use::host_readback);
    if (!x) return fall_back_to_invariant_kernels("cannot be checked", x.err());
    auto y = _dev->create_buffer(4 * rows_max * n_max * 3, memory_use::host_readback);
    if (!y) return fall_back_to_invariant_kernels("cannot be checked", y.err());
    auto scratch =
        _dev->create_buffer(4 * abi::ORDO_MAT_GROUPS * rows_max * n_max, memory_use::device);
    if (!scratch) return fall_back_to_invariant_kernels("cannot be checked", scratch.err());
    auto* xs = static_cast<float*>(x->mapped());
    std::uint32_t state = 12345;
    for (std::uint64_t i = 0; i < k_max * n_max; ++i) {
        state = state * 1664525u + 1013904223u;
        xs[i] = float(state >> 8) / float(1u << 24) * 2.0f - 1.0f;
    }
    // Per chunk: the invariant kernel, the cooperative one unsplit, and split (two dispatches).
    auto str = stream::create(*_dev, *_pipes, {std::uint32_t(4 * chunks_max + 4), false});
    if (!str) return str.err();
    stream& s = **str;
    auto* ys = static_cast<float*>(y->mapped());
    double worst = 0;
    std::string seen;
    for (const auto& [w, name] : checked) {
        const std::uint64_t k = w->n_in, rows = w->n_out;
        seen += std::string(seen.empty() ? "" : ";") + " " + name + " (" +
                std::string(model::type_name(w->type)) + "):";
        for (std::uint32_t n : {16u, 48u, n_max}) {
            // Outputs: the invariant kernel's, the cooperative one's unsplit, then split.
            auto out = [&](std::uint32_t i) {
                return rows_view{{&*y, 4 * rows * n_max * i, 4 * rows * n_max},
                                 0,
                                 static_cast<std::uint32_t>(rows)};
            };
            s.set_mat_coop_large_from(n == n_max ? 1 : 0);
            status e = s.begin("cooperative-matrix check");
            const rows_view xv{whole(*x), 0, static_cast<std::uint32_t>(k)};
            // (The invariant kernel's group split: the same bits as unsplit.)
            s.set_mat_split_scratch(whole(*scratch));
            if (e) e = encode_mul_mat(s, *w, xv, out(0), n, false, mat_path::split);
            if (e) e = encode_mul_mat(s, *w, xv, out(2), n, false, mat_path::tiled);
            s.set_mat_split_scratch({});
            if (e) e = encode_mul_mat(s, *w, xv, out(1), n, false, mat_path::tiled);
            if (!e) return fall_back_to_invariant_kernels("cannot be checked", e.err());
            ORDO_TRY(s.run(_options.warmup_ms_max));
            // Fault injection (tests): the cooperative kernel's first output wrong, as a driver
            // that laid its fragments out otherwise would leave it; the check below is real.
            if (_options.fault_mat_coop_wrong) {
                ys[rows * n_max] = ys[0] + 1.0f + std::fabs(ys[0]) * 4;
            }
            double err[2] = {0, 0};
            for (std::uint32_t t = 0; t < n; ++t) {
                const float* want = ys + t * rows;
                double ss = 0;
                for (std::uint64_t r = 0; r < rows; ++r) ss += double(want[r]) * want[r];
                const double rms = std::sqrt(ss / double(rows)) + 1e-30;
                for (std::uint32_t v = 0; v < 2; ++v) {
                    const float* got = ys + (v + 1) * rows * n_max + t * rows;
                    for (std::uint64_t r = 0; r < rows; ++r) {
                        const double d = std::fabs(double(got[r]) - want[r]) / rms;
                        err[v] = std::isnan(d) ? 1e30 : std::max(err[v], d);
                    }
                }
            }
            worst = std::max({worst, err[0], err[1]});
            char line[80];
            std::snprintf(line, sizeof line, " %u tokens %.2e/%.2e", n, err[0], err[1]);
            seen += line;
        }
    }
    _mat_coop_check = seen.empty() ? seen : seen.substr(1);
    if (worst > mat_coop_check_err_max) {
        char line[160];
        std::snprintf(line, sizeof line,
                      "on the layers' matrices their largest difference from the invariant "
                      "kernel is %.2e of a token's RMS, past %.0e",
                      worst, mat_coop_check_err_max);
        return fall_back_to_invariant_kernels(
            "compute wrong results",
            gpu_error(gpu_failure::unsupported,
                      line + std::string(" (unsplit/split:") + seen + ")"));
    }
    logger()->info(
        "runner: the cooperative-matrix kernel agrees with the invariant one on a matrix of "
        "each weight type (largest difference over a token's RMS, unsplit/split:{})",
        seen);
    return {};
}

status runner::fall_back_to_invariant_kernels(std::string_view what, const error& why) {
    // Only weights were prepared so far (as below): the invariant kernels of those already
    // uploaded are built at their first dispatch, in the warm-up.
    logger()->warn(
        "runner: the cooperative-matrix kernels {} on {} ({}: {}); serving with the "
        "batch-invariant kernels, as gpu.batch_invariant = true would",
        what, _dev->info().name, why.code, why.message);
    pipeline_tuning tuning = _pipes->tuning();
    tuning.mat_coop = false;
    tuning.mat_coop_emulated = false;
    auto p = pipelines::create(*_dev, tuning, _pcache->handle());
    if (!p) return p.err();
    _pipes = std::move(*p);
    return {};
}

status runner::fall_back_to_storage_kernels(const error& why) {
    // The families share the mat-mul order (mat_order.glsl); their norm and attention kernels
    // may differ in the last bits, as between two servers set to the two families. Only
    // weights were prepared so far (upload_model runs before the stream and buffers exist); the
    // storage pipelines of the weights already uploaded are built at their first dispatch, in
    // the warm-up.
    logger()->warn(
        "runner: the texel kernels cannot be built on {} ({}: {}); serving with the "
        "storage kernels, as gpu.kernels = \"storage\" would",
        _dev->info().name, why.code, why.message);
    pipeline_tuning tuning = _pipes->tuning();
    tuning.prefer_texel_kernels = false;
    auto p = pipelines::create(*_dev, tuning, _pcache->handle());
    if (!p) return p.err();
    _pipes = std::move(*p);
    // Attention's reach on a loop-capped device depends on the family: choose the context
    // again (nothing has used it yet: it is announced after the build).
    init_context(_limits.n_blocks);
    return {};
}

result<weight_tensor> runner::upload_padded(const model::matrix_view& m) {
    auto n_in = static_cast<std::uint32_t>(m.n_in);
    auto n_out = static_cast<std::uint32_t>(m.n_out);
    bool plain = m.type == model::ggml_type::f32 || m.type == model::ggml_type::f16 ||
                 m.type == model::ggml_type::bf16;
    if (!plain || n_in % 8 == 0) return upload_weight(*_dev, *_arena, m.type, n_in, n_out, m.data);
    // The kernels read rows 8 elements at a time: pad each row with zeros (stories260K's
    // ffn_down has n_in 172). The activations' pad columns are never written, so they stay 0.
    std::size_t elem = m.type == model::ggml_type::f32 ? 4 : 2;
    std::uint32_t padded = round_up(n_in, 8);
    std::vector<std::uint8_t> bytes(std::size_t(padded) * n_out * elem, 0);
    for (std::uint32_t r = 0; r < n_out; ++r) {
        std::memcpy(bytes.data() + std::size_t(r) * padded * elem,
                    m.data.data() + std::size_t(r) * n_in * elem, std::size_t(n_in) * elem);
    }
    return upload_weight(*_dev, *_arena, m.type, padded, n_out, bytes);
}

result<weight_tensor> runner::upload_concat(std::initializer_list<const model::matrix_view*> parts,
                                            mat_fusion fusion) {
    const model::matrix_view& first = **parts.begin();
    model::matrix_view all{first.type, {}, first.n_in, 0};
    std::size_t bytes = 0;
    for (const model::matrix_view* m : parts) {
        if (m->type != first.type || m->n_in != first.n_in) return weight_tensor{};
        all.n_out += m->n_out;
        bytes += m->data.size();
    }
    std::vector<std::uint8_t> joined;
    joined.reserve(bytes);
    for (const model::matrix_view* m : parts) {
        joined.insert(joined.end(), m->data.begin(), m->data.end());
    }
    all.data = joined;
    return upload(all, fusion);
}

result<buffer> runner::upload_norm(const model::matrix_view& m) {
    std::vector<float> w(round_up(_hp.n_embd, norm_align_floats), 0.0f);
    model::get_row(w.data(), m, 0);
    return upload_floats(w);
}

result<buffer> runner::upload_floats(std::span<const float> values) {
    auto b = _dev->create_buffer(values.size() * 4, memory_use::device);
    if (!b) return b.err();
    status s = _dev->write(*b, 0, values.data(), values.size() * 4);
    if (!s) return s.err();
    return std::move(*b);
}

status runner::upload_model(const model::llama_weights& w) {
    auto emb = upload(w.token_embd);
    if (!emb) return emb.err();
    _token_embd = std::move(*emb);
    _output_tied = w.output_tied;
    if (status s = prepare_get_rows(*_pipes, _token_embd); !s) return s;
    if (w.output_tied) {
        _output = _token_embd;  // the same device chunks serve get_rows and the classifier
    } else {
        auto out = upload(w.output);
        if (!out) return out.err();
        _output = std::move(*out);
    }
    auto on = upload_norm(w.output_norm);
    if (!on) return on.err();
    _output_norm = std::move(*on);
    auto rope = upload_floats(rope_turns_table(w.rope_freq));
    if (!rope) return rope.err();
    _rope_freq = std::move(*rope);
    const auto n_layers = static_cast<std::uint32_t>(w.layers.size());
    for (const model::llama_layer& l : w.layers) {
        report(build_stage::weights, static_cast<std::uint32_t>(_layers.size()), n_layers);
        layer_weights lw;
        auto qkv = upload_concat({&l.attn_q, &l.attn_k, &l.attn_v}, qkv_fusion());
        if (!qkv) return qkv.err();
        lw.qkv = std::move(*qkv);
        auto gu = upload_concat({&l.ffn_gate, &l.ffn_up}, mat_fusion::glu);
        if (!gu) return gu.err();
        lw.gate_up = std::move(*gu);
        std::vector<std::pair<weight_tensor*, const model::matrix_view*>> mats = {
            {&lw.wo, &l.attn_output}, {&lw.down, &l.ffn_down}};
        if (lw.qkv.n_out == 0) {
            mats.insert(mats.end(),
                        {{&lw.wq, &l.attn_q}, {&lw.wk, &l.attn_k}, {&lw.wv, &l.attn_v}});
        }
        if (lw.gate_up.n_out == 0) {
            mats.insert(mats.end(), {{&lw.gate, &l.ffn_gate}, {&lw.up, &l.ffn_up}});
        }
        for (auto& [dst, src] : mats) {
            auto t = upload(*src);
            if (!t) return t.err();
            *dst = std::move(*t);
        }
        auto an = upload_norm(l.attn_norm);
        if (!an) return an.err();
        auto fn = upload_norm(l.ffn_norm);
        if (!fn) return fn.err();
        lw.attn_norm = std::move(*an);
        lw.ffn_norm = std::move(*fn);
        _layers.push_back(std::move(lw));
    }
    return {};
}

std::uint64_t runner::kv_layer_block_bytes() const {
    return std::uint64_t(_hp.n_head_kv) * _options.kv_block_tokens * _hp.head_dim() *
           (_options.kv_f16 ? 2 : 4);
}

result<std::uint32_t> runner::kv_pool_blocks() const {
    std::uint64_t per_block = kv_layer_block_bytes();
    std::uint64_t blocks = _options.kv_blocks;
    const std::uint64_t blocks_max = runner_kv_pool_tokens_max / _options.kv_block_tokens;
    if (blocks == 0) {
        // From the memory budget, capped so one layer's K (or V) fits one storage binding and
        // the pool holds no more tokens than the scheduler takes.
        blocks = _options.kv_memory_bytes / (2 * _hp.n_layer * per_block);
        blocks = std::min({blocks, _dev->info().max_storage_buffer_range / per_block, blocks_max});
    }
    if (blocks == 0 || blocks > blocks_max) {
        return bad_config("the KV pool would hold " + std::to_string(blocks) + " blocks of " +
                          std::to_string(_options.kv_block_tokens) + " tokens (1.." +
                          std::to_string(blocks_max) + ")");
    }
    return static_cast<std::uint32_t>(blocks);
}

std::uint64_t runner::weight_bytes() const {
    auto bytes_of = [](const weight_tensor& w) {
        std::uint64_t b = 0;
        for (const weight_chunk& c : w.chunks) b += c.view.range;
        return b;
    };
    std::uint64_t bytes = bytes_of(_token_embd) + (_output_tied ? 0 : bytes_of(_output)) +
                          _output_norm.size() + _rope_freq.size();
    for (const layer_weights& l : _layers) {
        for (const weight_tensor* w :
             {&l.qkv, &l.gate_up, &l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down}) {
            bytes += bytes_of(*w);
        }
        bytes += l.attn_norm.size() + l.ffn_norm.size();
    }
    return bytes;
}

std::uint64_t runner::kv_bytes() const {
    return 2ull * _hp.n_layer * _limits.n_blocks * kv_layer_block_bytes();
}

status runner::init_buffers(std::uint32_t blocks) {
    kv_geometry g{_hp.n_layer, _hp.n_head_kv,  _hp.head_dim(), _options.kv_block_tokens,
                  blocks,      _options.kv_f16};
    auto kv = kv_pool::create(*_dev, g);
    if (!kv) return kv.err();
    _kv = std::move(*kv);
    if (status s = prepare_attention(*_pipes, g); !s) return s;
    // attention_flash takes prompt runs where the storage path serves attention; a driver that
    // cannot build it leaves them on attention.comp (the same bits), with a warning.
    _attention_flash = _options.attention_flash && attention_flash_candidate(*_pipes, g);
    if (_attention_flash) {
        if (status s = prepare_attention_flash(*_pipes, g); !s) {
            logger()->warn(
                "runner: attention_flash cannot be built on {} ({}: {}); prompts attend on "
                "attention.comp",
                _dev->info().name, s.err().code, s.err().message);
            _attention_flash = false;
        }
    }

    std::uint64_t t = _options.max_batch_tokens, rows = _options.rows_max;
    // Flash decoding's splits (kernels.hpp attention_split_keys): fixed for the runner's
    // longest context, so every step cuts a token's keys the same way.
    const std::uint32_t attn_wg =
        _pipes->get(g.f16 ? pipeline_id::attention_f16 : pipeline_id::attention_f32).workgroup_size;
    const std::uint64_t positions = std::uint64_t(_blocks_per_seq_max) * g.block_tokens;
    _attn_split_keys = _options.attention_split_keys != 0
                           ? _options.attention_split_keys
                           : attention_split_keys(positions, attn_wg);
    if (_attn_split_keys % attn_wg != 0) {
        return bad_config("attention_split_keys " + std::to_string(_attn_split_keys) +
                          " is not a multiple of the attention workgroup (" +
                          std::to_string(attn_wg) + ")");
    }
    _attn_max_splits =
        static_cast<std::uint32_t>((positions + _attn_split_keys - 1) / _attn_split_keys);
    // What sizes each buffer, for the message when one would exceed a storage binding (the
    // logits rows of a 128k vocabulary: 513 KB each).
    const char* batch = "scheduler.max_batch_tokens";
    const char* seqs = "scheduler.max_sequences";
    const char* seqs_ctx = "scheduler.max_sequences or model.context_tokens";
    struct spec {
        buffer* b;
        std::uint64_t floats;
        memory_use use;
        const char* name;
        const char* lower;
    };
    const spec specs[] = {
        {&_x, t * _embd_stride, memory_use::device, "residual", batch},
        {&_xn, t * _embd_stride, memory_use::device, "normed", batch},
        {&_qkv, t * _qkv_stride, memory_use::device, "q|k|v", batch},
        {&_att, t * _embd_stride, memory_use::device, "attention", batch},
        {&_gu, t * _gu_stride, memory_use::device, "gate|up", batch},
        {&_hid, t * _ff_stride, memory_use::device, "hidden", batch},
        {&_final, rows * _embd_stride, memory_use::device, "final", seqs},
        {&_ints, 5 * t, memory_use::host_readback, "inputs", batch},
        {&_tables, std::uint64_t(_options.seqs_max) * _blocks_per_seq_max,
         memory_use::host_readback, "block tables", seqs_ctx},
        {&_logits, rows * _hp.n_vocab, memory_use::host_readback, "logits", seqs},
        {&_summary, rows * abi::ORDO_SUMMARY_WORDS, memory_use::host_readback, "logits summaries",
         seqs},
        {&_summary_chunks, logits_summary_scratch_words(_hp.n_vocab, _options.rows_max),
         memory_use::device, "logits summary chunks", seqs},
        {&_temperatures, rows, memory_use::host_readback, "row temperatures", seqs},
        {&_hidden, t * _embd_stride, memory_use::host_readback, "final hidden", batch},
        {&_spin, 1024, memory_use::device, "spin", batch},
        {&_attn_partials, attention_partials_floats(_hp.n_head, g.head_dim, _attn_max_splits),
         memory_use::device, "attention partials", "model.context_tokens"},
    };
    // The KV copy staging (_kv_host) is made by the first copy job: a server that never
    // persists KV does not pay kv_copy_blocks_max blocks of host memory (512 MiB for a 7B
    // model without GQA at the default 64).
    _kv_regions.resize(_options.kv_copy_blocks_max);
    _hidden_sum.assign(_hp.n_embd, 0.0);
    _kv_seen.assign(g.n_blocks, 0);
    for (const spec& sp : specs) {
        if (sp.floats * 4 > _dev->info().max_storage_buffer_range) {
            return bad_config("the " + std::string(sp.name) + " buffer of " +
                              std::to_string(sp.floats * 4) + " B exceeds one storage binding (" +
                              std::to_string(_dev->info().max_storage_buffer_range) +
                              " B); lower " + sp.lower);
        }
        auto b = _dev->create_buffer(sp.floats * 4, sp.use);
        if (!b) return b.err();
        *sp.b = std::move(*b);
        // Zeroed once: the pad columns of every activation row must read as 0 forever.
        status s = _dev->fill_zero(*sp.b);
        if (!s) return s;
    }
    return {};
}

void runner::import_logits_regions() {
    if (!_options.logits_in_place) return;
    const std::uint64_t bytes = std::uint64_t(_options.rows_max) * _hp.n_vocab * 4;
    for (std::span<float> region : _options.logits_regions) {
        std::string why = "a logits region holds fewer than rows_max rows";
        if (region.size_bytes() >= bytes) {
            auto b = _dev->import_host(region.data(), region.size_bytes());
            if (b) {
                _logits_regions.push_back(std::move(*b));
                continue;
            }
            why = b.err().message;
        }
        logger()->info("runner: logits rows are copied out of the device's buffer each step ({})",
                       why);
        _logits_regions.clear();
        return;
    }
    if (!_logits_regions.empty()) {
        logger()->info("runner: logits rows are written in place ({} host regions imported)",
                       _logits_regions.size());
    }
}

result<std::uint32_t> choose_segment_layers(const segment_shape& shape, std::uint32_t configured,
                                            std::uint32_t device_default,
                                            std::uint64_t dispatches_max) {
    // A configured length is refused if too long; the device's choice shrinks to what fits.
    std::uint32_t layers = configured != 0 ? configured : std::max(1u, device_default);
    if (configured == 0) {
        while (layers > 1 && shape.dispatches(layers) > dispatches_max) --layers;
    }
    if (shape.dispatches(layers) > dispatches_max) {
        return bad_config("flush_every_layers " + std::to_string(layers) + " makes segments of " +
                          std::to_string(shape.dispatches(layers)) + " dispatches; lower it");
    }
    return layers;
}

status runner::init_stream() {
    // The tiled mat-mul's group split turns a chunk's dispatch into two (split, fold), and so
    // does the cooperative-matrix kernel's (which splits on devices whose invariant kernels
    // never do: lavapipe with the emulation).
    const pipeline_tuning& tu = _pipes->tuning();
    const bool split = tu.mat_tiled_split_wg != 0 || (tu.mat_coop && tu.mat_coop_split_wg != 0);
    auto chunks = [split](const weight_tensor& w) {
        return std::uint32_t(w.chunks.size()) * (split ? 2u : 1u);
    };
    std::uint32_t per_layer = 0;
    for (const layer_weights& l : _layers) {
        // Fused tensors are non-empty exactly when their parts are empty.
        per_layer = std::max(per_layer, 7 + chunks(l.qkv) + chunks(l.wq) + chunks(l.wk) +
                                            chunks(l.wv) + chunks(l.wo) + chunks(l.gate_up) +
                                            chunks(l.gate) + chunks(l.up) + chunks(l.down));
    }
    // Embedding + final-norm runs + classifier + the logits summary (two dispatches) +
    // hidden-row norm runs + the fault's spin dispatch, besides the layers.
    segment_shape shape{
        chunks(_token_embd) + _options.rows_max + chunks(_output) + 2 + _options.rows_max + 1,
        per_layer, _hp.n_layer};
    auto layers =
        choose_segment_layers(shape, _options.flush_every_layers,
                              _pipes->tuning().flush_every_layers, segment_dispatches_max);
    if (!layers) return layers.err();
    _flush_every = *layers;
    const std::uint32_t first = _options.first_segment_layers.value_or(
        _options.flush_every_layers == 0 ? _pipes->tuning().first_segment_layers : 0);
    _first_segment = first == 0 ? _flush_every : std::min(first, _flush_every);
    std::uint64_t budget = shape.dispatches(_flush_every);
    // A KV copy job is one segment of one copy per layer buffer (K and V of each layer).
    budget = std::max<std::uint64_t>(budget, 2ull * _hp.n_layer);
    if (budget > segment_dispatches_max) {
        return bad_config("a KV copy segment of " + std::to_string(budget) +
                          " copies exceeds the segment bound");
    }
    stream_options so;
    so.dispatches_per_segment_max = static_cast<std::uint32_t>(budget);
    so.timestamps = _options.timestamps;
    so.replay_segments = _options.replay_segments;
    auto s = stream::create(*_dev, *_pipes, so);
    if (!s) return s.err();
    _stream = std::move(*s);
    return init_mat_split();
}

// The scratch of the tiled mat-mul's group split, for the largest chunk of any weight at
// max_batch_tokens; capped at one storage binding and a sixteenth of the largest device-local
// heap (a grid that needs more is not split).
status runner::init_mat_split() {
    std::uint64_t rows_max = 0;
    auto widest = [&rows_max](const weight_tensor& w) {
        for (const weight_chunk& ch : w.chunks) {
            rows_max = std::max<std::uint64_t>(rows_max, ch.row_count);
        }
    };
    widest(_output);
    for (const layer_weights& l : _layers) {
        for (const weight_tensor* w :
             {&l.qkv, &l.wq, &l.wk, &l.wv, &l.wo, &l.gate_up, &l.gate, &l.up, &l.down}) {
            widest(*w);
        }
    }
    std::uint64_t floats =
        mat_split_scratch_floats(_pipes->tuning(), rows_max, _options.max_batch_tokens);
    std::uint64_t heap = 0;
    for (const memory_heap_info& h : _dev->info().heaps) {
        if (h.device_local) heap = std::max(heap, h.size_bytes);
    }
    floats = std::min({floats, _dev->info().max_storage_buffer_range / 4, heap / 16 / 4});
    if (floats == 0) return {};
    auto b = _dev->create_buffer(floats * 4, memory_use::device);
    if (!b) return b.err();
    _mat_split = std::move(*b);
    _stream->set_mat_split_scratch(whole(_mat_split));
    return {};
}

status runner::drain(std::uint64_t timeout_ms) {
    if (_stream->state() != stream_state::in_flight) return {};
    return _stream->wait(timeout_ms);
}

namespace {

status check_kv_bytes(std::size_t n_ids, std::uint64_t bytes, std::uint64_t block_bytes) {
    if (bytes == n_ids * block_bytes) return {};
    return gpu_error(gpu_failure::bad_request, "KV staging buffer is " + std::to_string(bytes) +
                                                   " B; " + std::to_string(n_ids) +
                                                   " blocks need " +
                                                   std::to_string(n_ids * block_bytes));
}

status check_kv_request(std::span<const std::uint32_t> ids, std::uint64_t bytes,
                        std::uint64_t block_bytes, std::uint32_t n_blocks,
                        std::uint32_t blocks_max) {
    if (ids.empty() || ids.size() > blocks_max) {
        return gpu_error(gpu_failure::bad_request,
                         "a KV copy moves 1.." + std::to_string(blocks_max) + " blocks, not " +
                             std::to_string(ids.size()));
    }
    if (status s = check_kv_bytes(ids.size(), bytes, block_bytes); !s) return s;
    for (std::uint32_t id : ids) {
        if (id >= n_blocks) {
            return gpu_error(gpu_failure::bad_request, "KV block " + std::to_string(id) +
                                                           " is outside the pool of " +
                                                           std::to_string(n_blocks));
        }
    }
    return {};
}

}  // namespace

// One job: for each layer buffer (K then V of layer 0, 1, ...) one copy with a region per
// block, all in one segment, one fence. Host layout: block i, layer l, K|V at
// ((i * n_layer + l) * 2 + kv) * kv_layer_block_bytes().
// The host side of KV copy jobs, made by the first one (see create()): only ever a copy source
// or destination, never a binding.
status runner::ensure_kv_host() {
    if (_kv_host.size() != 0) return {};
    auto host = _dev->create_buffer(_options.kv_copy_blocks_max * kv_block_bytes(),
                                    memory_use::host_readback);
    if (!host) return host.err();
    if (host->mapped() == nullptr) return bad_config("no host-visible memory for KV copies");
    _kv_host = std::move(*host);
    return {};
}

status runner::run_kv_copy(std::span<const std::uint32_t> ids, bool out) {
    const std::uint64_t lb = kv_layer_block_bytes();
    std::string label = std::string(out ? "kv_out#" : "kv_in#") + std::to_string(++_kv_copies) +
                        " blocks=" + std::to_string(ids.size());
    _last_segment = label;
    status s = _stream->begin(std::move(label));
    if (!s) return s;
    for (std::uint32_t l = 0; l < _hp.n_layer; ++l) {
        for (std::uint32_t kv = 0; kv < 2; ++kv) {
            buffer_view pool = kv == 0 ? _kv->k(l) : _kv->v(l);
            for (std::size_t i = 0; i < ids.size(); ++i) {
                std::uint64_t dev = pool.offset + ids[i] * lb;
                std::uint64_t host = ((i * _hp.n_layer + l) * 2 + kv) * lb;
                _kv_regions[i] = out ? VkBufferCopy{dev, host, lb} : VkBufferCopy{host, dev, lb};
            }
            std::span<const VkBufferCopy> regions(_kv_regions.data(), ids.size());
            if (out) {
                _stream->copy(*pool.buf, _kv_host, regions);
            } else {
                _stream->copy(_kv_host, *pool.buf, regions);
            }
        }
    }
    return _stream->run(_options.watchdog_ms);
}

status runner::copy_kv_out(std::span<const std::uint32_t> ids, std::span<std::uint8_t> dst) {
    if (_stream->state() != stream_state::idle) {
        return gpu_error(gpu_failure::busy, "KV copy-out while a segment is in flight");
    }
    status ok =
        check_kv_request(ids, dst.size(), kv_block_bytes(), _limits.n_blocks, kv_copy_blocks_max());
    if (!ok) return ok;
    if (status h = ensure_kv_host(); !h) return h;
    status s = run_kv_copy(ids, true);
    if (!s) return s;
    std::memcpy(dst.data(), _kv_host.mapped(), dst.size());
    return {};
}

status runner::copy_kv_in(std::span<const std::uint32_t> ids, std::span<const std::uint8_t> src) {
    if (_stream->state() != stream_state::idle) {
        return gpu_error(gpu_failure::busy, "KV copy-in while a segment is in flight");
    }
    status ok =
        check_kv_request(ids, src.size(), kv_block_bytes(), _limits.n_blocks, kv_copy_blocks_max());
    if (!ok) return ok;
    // Two regions writing one block in one copy command is undefined in Vulkan.
    bool repeated = false;
    for (std::uint32_t id : ids) {
        repeated = repeated || _kv_seen[id] != 0;
        _kv_seen[id] = 1;
    }
    for (std::uint32_t id : ids) _kv_seen[id] = 0;
    if (repeated) return gpu_error(gpu_failure::bad_request, "a KV copy-in names a block twice");
    if (status h = ensure_kv_host(); !h) return h;
    std::memcpy(_kv_host.mapped(), src.data(), src.size());
    return run_kv_copy(ids, false);
}

status runner::read_kv_blocks(std::span<const std::uint32_t> ids, std::span<std::uint8_t> dst) {
    const std::uint64_t bb = kv_block_bytes();
    if (status s = check_kv_bytes(ids.size(), dst.size(), bb); !s) return s;
    for (std::size_t at = 0; at < ids.size();) {
        std::size_t n = std::min<std::size_t>(kv_copy_blocks_max(), ids.size() - at);
        status s = copy_kv_out(ids.subspan(at, n), dst.subspan(at * bb, n * bb));
        if (!s) return s;
        at += n;
    }
    return {};
}

status runner::write_kv_blocks(std::span<const std::uint32_t> ids,
                               std::span<const std::uint8_t> src) {
    const std::uint64_t bb = kv_block_bytes();
    if (status s = check_kv_bytes(ids.size(), src.size(), bb); !s) return s;
    for (std::size_t at = 0; at < ids.size();) {
        // A run ends at kv_copy_blocks_max blocks or before a block it already holds (a copy-in
        // names each block once; the later bytes then win, as the run after it writes them).
        std::size_t n = 0;
        while (at + n < ids.size() && n < kv_copy_blocks_max()) {
            std::uint32_t id = ids[at + n];
            if (id < _kv_seen.size() && _kv_seen[id] != 0) break;
            if (id < _kv_seen.size()) _kv_seen[id] = 1;
            ++n;
        }
        for (std::size_t i = 0; i < n; ++i) {
            if (ids[at + i] < _kv_seen.size()) _kv_seen[ids[at + i]] = 0;
        }
        status s = copy_kv_in(ids.subspan(at, n), src.subspan(at * bb, n * bb));
        if (!s) return s;
        at += n;
    }
    return {};
}

}  // namespace ordo::gpu
