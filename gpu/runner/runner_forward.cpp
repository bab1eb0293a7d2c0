// runner_forward.cpp: records and runs one step of the Llama forward pass (the math is written
// out in runner.hpp). One function per stage, each a list of kernel encoders; buffers and
// strides were fixed in runner.cpp, so nothing here allocates device memory.
#include <algorithm>
#include <cassert>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>

#include "gpu/runner/finite_copy.hpp"
#include "gpu/runner/runner.hpp"
#include "gpu/vk/kernels.hpp"
#include "gpu/vk/shaders/abi.h"

namespace ordo::gpu {

namespace {

// The hang fault: the segment gets hang_spin_workgroups invocations spinning this many
// iterations each (about a second on a fast GPU, where they run side by side) and its fence is
// polled once (timeout 0) instead of waited on for watchdog_ms: the segment is still running
// when the wait gives up, so the real timeout path runs (the error, the segment left in flight,
// drain, rebuild) without the test depending on how fast the device spins. llvmpipe caps an
// invocation at 65535 loop iterations (a few ms) and runs the workgroups a few at a time, so
// the many workgroups are what keep the segment running (a few hundred ms) past a poll that a
// loaded machine delays: with one, the spin sometimes ended first and the step succeeded.
constexpr std::uint32_t hang_spin_iterations = 400'000'000;
constexpr std::uint32_t hang_spin_workgroups = 64;
constexpr std::uint64_t hang_wait_ms = 0;

}  // namespace

void runner::write_inputs() {
    // ids | positions | slots | attention pairs, each region max_batch_tokens ints long.
    auto* ints = static_cast<std::int32_t*>(_ints.mapped());
    std::size_t t_max = _options.max_batch_tokens;
    std::size_t n = _plan.n_tokens;
    std::memcpy(ints, _plan.ids.data(), n * 4);
    std::memcpy(ints + t_max, _plan.positions.data(), n * 4);
    std::memcpy(ints + 2 * t_max, _plan.slots.data(), n * 4);
    std::memcpy(ints + 3 * t_max, _plan.attn.data(), 2 * n * 4);
    std::memcpy(_tables.mapped(), _plan.tables.data(), _plan.tables.size() * 4);
    std::memcpy(_temperatures.mapped(), _plan.row_temperatures.data(),
                _plan.row_temperatures.size() * 4);
}

status runner::record_embedding() {
    // x = token_embd[ids]
    return encode_get_rows(*_stream, _token_embd, {whole(_ints), 0}, _plan.n_tokens,
                           {whole(_x), 0, _embd_stride});
}

runner::layer_rows runner::step_rows() const {
    const std::uint32_t embd = _hp.n_embd, kv = _hp.kv_dim();
    return {{whole(_x), 0, _embd_stride},          {whole(_xn), 0, _embd_stride},
            {whole(_qkv), 0, _qkv_stride},         {whole(_qkv), embd, _qkv_stride},
            {whole(_qkv), embd + kv, _qkv_stride}, {whole(_att), 0, _embd_stride},
            {whole(_gu), 0, _gu_stride},           {whole(_gu), _hp.n_ff, _gu_stride},
            {whole(_hid), 0, _ff_stride}};
}

status runner::record_layer(std::uint32_t l) {
    const layer_weights& w = _layers[l];
    stream& s = *_stream;
    const std::uint32_t n = _plan.n_tokens, t_max = _options.max_batch_tokens;
    const std::uint32_t embd = _hp.n_embd;
    const auto [x, xn, q, k, v, att, gate, up, hid] = step_rows();
    const ints_view positions{whole(_ints), t_max}, slots{whole(_ints), 2 * t_max};

    // Attention block: q, k, v = W norm(x), rope q and k (adjacent heads in qkv), and the new
    // tokens' K and V stored into their slots before attention reads them (causal self). A
    // decode mat-vec does all of it in one dispatch (encode_norm_qkv_rope_kv); elsewhere
    // xn = norm(x), the mat-mul, then rope_kv.
    const rope_table rope{whole(_rope_freq), _hp.n_rot};
    if (w.qkv.n_out != 0) {
        // rows q | k | v = columns of qkv
        const norm_input in{x, whole(w.attn_norm), embd, _hp.rms_eps, xn};
        const rope_kv_input rk{
            _kv.get(), l, positions, slots, rope, _hp.n_head, _options.qkv_rope_fusion};
        ORDO_TRY(encode_norm_qkv_rope_kv(s, w.qkv, in, q, rk, n));
    } else {
        ORDO_TRY(encode_rms_norm(s, x, whole(w.attn_norm), xn, embd, n, _hp.rms_eps));
        ORDO_TRY(encode_mul_mat(s, w.wq, xn, q, n, false));
        ORDO_TRY(encode_mul_mat(s, w.wk, xn, k, n, false));
        ORDO_TRY(encode_mul_mat(s, w.wv, xn, v, n, false));
        ORDO_TRY(encode_rope_kv(s, *_kv, l, q, positions, slots, rope, n, _hp.n_head));
    }
    attention_batch b;
    b.q = q;
    b.out = att;
    b.tokens = {whole(_ints), 3 * t_max};
    b.tables = {whole(_tables), 0};
    b.n_tokens = n;
    b.n_seqs = _plan.n_seqs;
    b.max_blocks_per_seq = _plan.blocks_per_seq;
    b.n_head = _hp.n_head;
    b.split_keys = _attn_split_keys;
    b.partials = whole(_attn_partials);
    b.max_splits = _attn_max_splits;
    if (_attention_flash) {
        b.host_tokens = std::span<const std::int32_t>(_plan.attn).first(2ull * n);
    }
    ORDO_TRY(encode_attention(s, *_kv, l, b));
    // x += wo att (the residual add fused into the mat-mul)
    ORDO_TRY(encode_mul_mat(s, w.wo, att, x, n, true));

    // FFN block: x += w_down (silu(w_gate xn) * w_up xn), xn = norm(x). With the fused gate|up
    // matrix, a decode mat-vec runs the norm, both mat-vecs and SwiGLU as one dispatch
    // (encode_norm_glu); elsewhere they run in turn.
    if (w.gate_up.n_out != 0) {
        const norm_input in{x, whole(w.ffn_norm), embd, _hp.rms_eps, xn};
        ORDO_TRY(encode_norm_glu(s, w.gate_up, in, gate, hid, _hp.n_ff, n));
    } else {
        ORDO_TRY(encode_rms_norm(s, x, whole(w.ffn_norm), xn, embd, n, _hp.rms_eps));
        ORDO_TRY(encode_mul_mat(s, w.gate, xn, gate, n, false));
        ORDO_TRY(encode_mul_mat(s, w.up, xn, up, n, false));
        ORDO_TRY(encode_swiglu(s, gate, up, hid, _hp.n_ff, n));
    }
    return encode_mul_mat(s, w.down, hid, x, n, true);
}

status runner::record_final_norm(std::span<const row_run> runs, const buffer& out) {
    // out[row] = norm(x[token of row]) * output_norm, for the rows of every run.
    for (const row_run& run : runs) {
        ORDO_TRY(encode_rms_norm(
            *_stream, {whole(_x), run.token0 * _embd_stride, _embd_stride}, whole(_output_norm),
            {whole(out), run.row0 * _embd_stride, _embd_stride}, _hp.n_embd, run.n, _hp.rms_eps));
    }
    return {};
}

buffer_view runner::logits_view() const {
    return {_logits_target, 0, std::uint64_t(_options.rows_max) * _hp.n_vocab * 4};
}

const buffer* runner::logits_region_at(const float* out) const {
    for (const buffer& b : _logits_regions) {
        if (b.mapped() == out) return &b;
    }
    return nullptr;
}

bool runner::summaries_finite() const {
    const auto* words = static_cast<const std::uint32_t*>(_summary.mapped());
    std::uint32_t flags = 0;
    for (std::uint32_t r = 0; r < _plan.rows(); ++r) {
        flags |= words[std::size_t(r) * abi::ORDO_SUMMARY_WORDS + 3];
    }
    return (flags & abi::ORDO_SUMMARY_NONFINITE) == 0;
}

status runner::record_logits(bool poison) {
    // final[row] = norm(x[token of row]); logits = w_out final. Only the rows that ask. Then
    // each row's summary, which is what the scheduler's sampler reads first (where the device
    // makes them: row_summaries).
    ORDO_TRY(record_final_norm(_plan.runs, _final));
    ORDO_TRY(encode_mul_mat(*_stream, _output, {whole(_final), 0, _embd_stride},
                            {logits_view(), 0, _hp.n_vocab}, _plan.rows(), false));
    if (poison) {
        // The device's output is corrupted (a quiet NaN over the first row); everything after
        // this, the summaries and the host's checks, is the real path.
        _stream->fill({_logits_target, 0, std::uint64_t(_hp.n_vocab) * 4}, 0x7fc00000u);
    }
    if (!row_summaries()) return {};
    return encode_logits_summary(*_stream, {logits_view(), 0, _hp.n_vocab}, whole(_temperatures),
                                 whole(_summary_chunks), whole(_summary), _plan.sample_vocab,
                                 _plan.rows());
}

status runner::record_hidden() {
    // hidden rows: the same final norm into the host-visible buffer, for every token a hidden
    // row pools (all of a sequence's, its last or its first); pool_hidden adds them up.
    return record_final_norm(_plan.hidden_runs, _hidden);
}

void runner::pool_hidden(float* hidden_out) {
    const auto* rows = static_cast<const float*>(_hidden.mapped());
    const std::uint32_t n_embd = _hp.n_embd;
    std::vector<double>& sum = _hidden_sum;
    assert(sum.size() == n_embd);
    for (std::size_t i = 0; i < _plan.hidden_runs.size(); ++i) {
        const row_run& run = _plan.hidden_runs[i];
        std::fill(sum.begin(), sum.end(), 0.0);
        for (std::uint32_t r = run.row0; r < run.row0 + run.n; ++r) {
            const float* row = rows + std::size_t(r) * _embd_stride;
            for (std::uint32_t e = 0; e < n_embd; ++e) sum[e] += row[e];
        }
        float* out = hidden_out + i * n_embd;
        for (std::uint32_t e = 0; e < n_embd; ++e) out[e] = static_cast<float>(sum[e]);
    }
}

bool runner::fault_targets(const step_fault& f, std::uint32_t l0, std::uint32_t l1) const {
    auto target = static_cast<std::uint32_t>(
        f.layer < 0 ? 0 : std::min<std::int64_t>(f.layer, _hp.n_layer - 1));
    return f.kind.has_value() && l0 <= target && target <= l1;
}

status runner::record_segment(const step& s, std::uint32_t l0, std::uint32_t l1,
                              const step_fault& f) {
    std::string label = segment_label(s, l0, l1);
    // begin_ahead while the segment before this one runs (stream.hpp "record ahead").
    ORDO_TRY(_stream->state() == stream_state::idle ? _stream->begin(label)
                                                    : _stream->begin_ahead(label));
    status rec = l0 == 0 ? record_embedding() : status{};
    for (std::uint32_t l = l0; rec && l <= l1; ++l) rec = record_layer(l);
    if (rec && l1 + 1 == _hp.n_layer && _plan.rows() > 0) {
        rec = record_logits(f.kind == fault_kind::nan_logits);
    }
    if (rec && l1 + 1 == _hp.n_layer && _plan.hidden_rows() > 0) rec = record_hidden();
    if (rec && fault_targets(f, l0, l1) && f.kind == fault_kind::hang) {
        rec = encode_spin(*_stream, whole(_spin), hang_spin_iterations, hang_spin_workgroups);
    }
    // Now, while the segment before it runs: a segment the stream kept is not recorded again.
    if (rec) rec = _stream->seal();
    if (!rec) {
        // An encoder refusal is a bug in this file (shapes were validated): the segment is
        // dropped unsubmitted, and the error names it.
        _stream->discard();
        _last_segment = label;
        return make_error(rec.err().code, label + ": " + rec.err().message);
    }
    return {};
}

status runner::submit_segment(std::uint32_t l0, std::uint32_t l1, const step_fault& f) {
    ORDO_TRY(_stream->submit());
    _segment_submitted = std::chrono::steady_clock::now();
    if (fault_targets(f, l0, l1) && f.kind == fault_kind::device_lost) {
        _stream->inject_wait_result(VK_ERROR_DEVICE_LOST);
    }
    return {};
}

status runner::wait_segment(std::uint32_t l0, std::uint32_t l1, const step_fault& f,
                            step_result& r) {
    _last_segment = _stream->label();
    bool hang = fault_targets(f, l0, l1) && f.kind == fault_kind::hang;
    status waited =
        _stream->wait(hang ? std::min(hang_wait_ms, _segment_wait_ms) : _segment_wait_ms);
    r.gpu_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                          _segment_submitted)
                    .count();
    r.segments++;
    if (!waited) return waited;
    add_timings();
    return {};
}

void runner::add_timings() {
    for (const dispatch_timing& t : _stream->timings()) {
        std::string_view name = pipeline_name(t.id);
        auto it = std::find_if(_timings.begin(), _timings.end(),
                               [&](const kernel_time& k) { return k.name == name; });
        if (it == _timings.end()) {
            _timings.push_back({std::string(name), 0.0, 0});
            it = _timings.end() - 1;
        }
        it->ms += t.ms;
        it->dispatches++;
    }
}

result<step_result> runner::run_step(const step& s, float* logits_out, float* hidden_out,
                                     std::uint32_t* summary_out) {
    step_fault fault = std::exchange(_fault, step_fault{});
    if (_stream->state() != stream_state::idle) {
        return gpu_error(gpu_failure::busy,
                         "segment '" + _stream->label() + "' is still in flight");
    }
    status ok = plan_step(s, _limits, _plan);
    if (!ok) return ok.err();
    if ((_plan.rows() > 0 && logits_out == nullptr) ||
        (_plan.hidden_rows() > 0 && hidden_out == nullptr)) {
        return gpu_error(gpu_failure::bad_step, "step " + std::to_string(s.step_id) +
                                                    ": rows are asked for but no output was given");
    }
    const buffer* in_place = logits_region_at(logits_out);
    _logits_target = in_place != nullptr ? in_place : &_logits;
    write_inputs();
    _timings.clear();
    step_result r;
    r.n_tokens = _plan.n_tokens;
    const std::uint64_t replayed_before = _stream->replayed();
    // Segments of flush_every_layers layers (the first of first_segment_layers), one in flight
    // at a time and each waited on under the watchdog; the next one is recorded while the one
    // before it runs, so the host's encoding overlaps the GPU's work instead of leaving the GPU
    // idle.
    auto next_of = [&](std::uint32_t l0) { return l0 + (l0 == 0 ? _first_segment : _flush_every); };
    auto last_of = [&](std::uint32_t l0) { return std::min(_hp.n_layer, next_of(l0)) - 1; };
    ORDO_TRY(record_segment(s, 0, last_of(0), fault));
    ORDO_TRY(submit_segment(0, last_of(0), fault));
    for (std::uint32_t l0 = 0; l0 < _hp.n_layer; l0 = next_of(l0)) {
        const std::uint32_t next = next_of(l0);
        const bool more = next < _hp.n_layer;
        status ahead = more ? record_segment(s, next, last_of(next), fault) : status{};
        status waited = wait_segment(l0, last_of(l0), fault, r);
        if (!waited) {
            _stream->discard();  // the segment recorded ahead never runs
            return waited.err();
        }
        if (!ahead) return ahead.err();
        if (more) ORDO_TRY(submit_segment(next, last_of(next), fault));
    }
    r.segments_replayed = static_cast<std::uint32_t>(_stream->replayed() - replayed_before);
    const std::size_t n = std::size_t(_plan.rows()) * _hp.n_vocab;
    r.summarized = row_summaries();
    r.logits_in_place = in_place != nullptr;
    if (in_place != nullptr) {
        // The rows are where the caller reads them: checked by their summaries' flag, or by a
        // pass that only reads them.
        r.logits_finite = n == 0 || (r.summarized ? summaries_finite() : all_finite(logits_out, n));
    } else {
        // The rows leave the readback buffer checked for inf and NaN on the way (step_result).
        r.logits_finite =
            n == 0 || copy_all_finite(logits_out, static_cast<const float*>(_logits.mapped()), n);
    }
    if (r.summarized && summary_out != nullptr && _plan.rows() > 0) {
        std::memcpy(summary_out, _summary.mapped(),
                    std::size_t(_plan.rows()) * abi::ORDO_SUMMARY_WORDS * 4);
    }
    if (_plan.hidden_rows() > 0) pool_hidden(hidden_out);
    r.rows = _plan.row_seq_ids;
    r.hidden_rows = _plan.hidden_seq_ids;
    return r;
}

}  // namespace ordo::gpu
