// gpu_actor.cpp: see gpu_actor.hpp.
#include "gpu/actor/gpu_actor.hpp"

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "gpu/actor/step_draws.hpp"
#include "gpu/runner/finite_copy.hpp"
#include "gpu/vk/device_select.hpp"
#include "gpu/vk/shaders/abi.h"

namespace ordo::gpu {

static_assert(logits_exchange::summary_words == abi::ORDO_SUMMARY_WORDS,
              "the exchange's summary rows are the kernel's");

namespace {

// Whether a failed build is worth another try (build_retryable). A code outside gpu_failure's
// table is the model file's or the tokenizer's (gguf_*, llama_*): the file fails again.
bool build_retryable(const error& e) {
    const auto f = enum_from_name<gpu_failure>(e.code);
    return f.has_value() && build_retryable(*f);
}

// The text a runner's error travels with: its message, and its own code first when that is
// not one gpu_failure names (gpu_failure_of made it a device error), so the name is not lost.
std::string failure_text(const error& e, gpu_failure f) {
    return enum_name(f) == e.code ? e.message : e.code + ": " + e.message;
}

std::uint64_t copy_job_id(const std::variant<kv_copy_out, kv_copy_in>& c) {
    return std::visit([](const auto& m) { return m.job_id; }, c);
}

}  // namespace

gpu_actor::gpu_actor(gpu_actor_options options, logits_exchange& exchange, gpu_replies replies)
    : actor(options.name, options.mailbox_capacity),
      _options(std::move(options)),
      _exchange(exchange),
      _reply_out(std::move(replies)) {}

gpu_actor::~gpu_actor() = default;

void gpu_actor::connect_kv(kv_staging& staging, kv_copy_replies replies) {
    _kv_staging = &staging;
    _kv_out = std::move(replies);
}

// ---- jobs on the actor's job thread -----------------------------------------------------

void gpu_actor::start_job(job_kind kind) {
    assert(!_worker.busy() && "one job at a time: the worker and _job are the running job's");
    _job.kind = kind;
    _job.err.reset();
    _job.nan = false;
    _job.res = {};
    _job.segment.clear();
    _job.draws.clear();
    _job.iterations = 1;
    if (kind == job_kind::build) {
        // The first build and its retries make epoch 0; finish_build counts each retry.
        _job.epoch = 0;
        _job.attempt = _rebuilds_in_row + 1;
        _job.attempts_max = _options.recovery_max + 1;
    } else if (kind == job_kind::rebuild) {
        // A rebuild makes the next epoch; begin_recovery counted it before it started.
        _job.epoch = _epoch + 1;
        _job.attempt = _rebuilds_in_row;
        _job.attempts_max = _options.recovery_max;
    }
    _worker.post([this] { run_job(); }, [this] { job_done(); });
}

void gpu_actor::job_done() {
    if (_job.kind == job_kind::step) {
        finish_step();
    } else if (_job.kind == job_kind::kv_copy) {
        finish_kv_copy();
    } else {
        finish_build();
    }
    if (stopping()) {
        // on_stop left these to us: the job was running then, and its reply is still owed.
        _runner.reset();
        _replies.close();
        _kv_replies.close();
        _worker.stop();
        return;
    }
    if (_reset_requested && _state == state::ready) {
        _reset_requested = false;
        begin_recovery();
    }
    pump();
}

void gpu_actor::run_job() {
    if (_job.kind == job_kind::step) {
        run_step_job();
        return;
    }
    if (_job.kind == job_kind::kv_copy) {
        run_kv_copy_job();
        return;
    }
    if (_runner) {
        // A timed-out segment may still run: let it end (bounded) before the teardown.
        status d = _runner->drain(_options.drain_ms);
        if (!d) spdlog::warn("gpu: drain before rebuild: {}", d.err().message);
        _runner.reset();
        // The old device's memory (all of it host memory on a CPU device such as lavapipe) is
        // free now; glibc keeps freed memory in its per-thread arenas, and the rebuild runs on
        // whichever pool thread is free, so without a trim every rebuild could leave a device's
        // worth of memory resident.
#ifdef __GLIBC__
        malloc_trim(0);
#endif
    }
    if (!_file) {
        auto f = model::gguf_file::open(_options.model_path);
        if (!f) {
            _job.err = f.err();
            return;
        }
        _file = std::make_unique<model::gguf_file>(std::move(*f));
    }
    runner_options ro = _options.runner;
    ro.on_progress = [this](const build_progress& p) { report_progress(p); };
    // The head writes each step's rows straight into the slot the step holds (where the device
    // can import host memory): the scheduler reads them there, and nothing is copied per step.
    for (std::uint32_t slot = 0; slot < logits_exchange::slots_max; ++slot) {
        ro.logits_regions.push_back(_exchange.logits_region(slot));
    }
    auto r = runner::create(*_file, ro);
    if (!r) {
        _job.err = r.err();
        return;
    }
    if ((*r)->hparams().n_vocab != _exchange.n_vocab() ||
        (_exchange.n_embd() != 0 && (*r)->hparams().n_embd != _exchange.n_embd()) ||
        _options.runner.rows_max > _exchange.rows_max()) {
        _job.err = gpu_error(gpu_failure::bad_config, "the logits exchange does not fit the model");
        return;
    }
    _job.built = std::move(*r);
}

void gpu_actor::report_progress(const build_progress& p) {
    device_progress m{
        _job.epoch, _job.attempt, _job.attempts_max, std::string(build_stage_name(p.stage)),
        p.done,     p.total};
    if (!_reply_out.tell(m)) _progress_refused++;  // only the loading reason is late
}

void gpu_actor::run_step_job() {
    // step_delay: on the worker, before anything is submitted, so the loop stays free (cancels
    // and disconnects race the running step) and the runner's watchdog times only the real
    // submissions. Shutdown waits for it like for any running step (at most delay_ms_max).
    if (_job.fault.delay_ms != 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(_job.fault.delay_ms));
    }
    if (_options.on_step_begin) _options.on_step_begin(_job.msg);
    if (_job.msg.decode_steps != 1) {
        run_decode_steps();
        return;
    }
    _runner->arm_fault(_job.fault);
    // A step that wants no rows writes nothing; the pointers are never dereferenced then.
    const bool held = _job.slot != logits_exchange::no_slot;
    float* out = held ? _exchange.row(_job.slot, 0) : nullptr;
    float* hidden = held && _exchange.n_embd() > 0 ? _exchange.hidden_row(_job.slot, 0) : nullptr;
    std::uint32_t* summary = held ? _exchange.summary_row(_job.slot, 0) : nullptr;
    const auto t0 = std::chrono::steady_clock::now();
    auto res = _runner->run_step(_job.msg, out, hidden, summary);
    _job.run_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    _job.segment = _runner->last_segment();
    if (!res) {
        _job.err = res.err();
        return;
    }
    _job.res = std::move(*res);
    const std::size_t n_hidden = _job.res.hidden_rows.size() * std::size_t(_exchange.n_embd());
    _job.nan = !_job.res.logits_finite || !all_finite(hidden, n_hidden);
}

namespace {

// Why a step of decode_steps != 1 cannot run as one (step::decode_steps); empty: it can.
// rows_max: the logits rows a step may have; decode_rows_max: the rows of all its iterations
// (gpu_actor::decode_rows_max).
std::string decode_steps_refusal(const step& m, std::uint32_t rows_max,
                                 std::uint32_t decode_rows_max) {
    const std::uint32_t k = m.decode_steps;
    if (k == 0 || k > decode_steps_max) {
        return "decode_steps " + std::to_string(k) + " is outside 1.." +
               std::to_string(decode_steps_max);
    }
    for (const step_seq& q : m.seqs) {
        if (q.tokens.size() != 1 || q.logits_rows != 1 || q.hidden != hidden_output::none) {
            return "sequence " + std::to_string(q.seq_id) +
                   " does not decode one token with one logits row and no hidden row";
        }
    }
    if (m.seqs.empty() || m.seqs.size() > rows_max) {
        return std::to_string(m.seqs.size()) + " rows do not fit the " + std::to_string(rows_max) +
               " rows of a slot";
    }
    if (std::uint64_t(m.seqs.size()) * k > decode_rows_max) {
        return std::to_string(m.seqs.size()) + " rows x " + std::to_string(k) +
               " iterations do not fit the " + std::to_string(decode_rows_max) +
               " rows of a slot's iterations";
    }
    return {};
}

}  // namespace

std::uint32_t gpu_actor::decode_rows_max() const {
    // The earlier iterations' rows are kept as their summaries alone where steps summarize
    // (run_decode_steps), in the slot's summary rows; else as rows, in its logits rows.
    return _runner->row_summaries() ? _exchange.summary_rows_max() : _options.runner.rows_max;
}

void gpu_actor::run_decode_steps() {
    const step& m = _job.msg;
    if (std::string why = decode_steps_refusal(m, _options.runner.rows_max, decode_rows_max());
        !why.empty()) {
        _job.err =
            gpu_error(gpu_failure::bad_step, "step " + std::to_string(m.step_id) + ": " + why);
        return;
    }
    const std::uint32_t k = m.decode_steps;
    const auto rows = static_cast<std::uint32_t>(m.seqs.size());
    const std::uint32_t n_vocab = _exchange.n_vocab();
    const std::uint32_t n_draw =
        m.sample_vocab == 0 || m.sample_vocab > n_vocab ? n_vocab : m.sample_vocab;
    auto draws = step_draws::create(m, n_draw);
    if (!draws) {
        _job.err = gpu_error(gpu_failure::bad_step,
                             "step " + std::to_string(m.step_id) + ": " + draws.err().message);
        return;
    }
    step it = m;
    float* out = _exchange.row(_job.slot, 0);
    std::uint32_t* summary = _exchange.summary_row(_job.slot, 0);
    std::vector<std::int32_t> next(rows);
    const auto t0 = std::chrono::steady_clock::now();
    _runner->arm_fault(_job.fault);  // the first iteration's: the fault names the step
    for (std::uint32_t i = 0; i < k; i++) {
        // step_delay (a slow device) delays each iteration as it would each step of one; the
        // first's delay was run_step_job's.
        if (i > 0 && _job.fault.delay_ms != 0) {
            std::this_thread::sleep_for(std::chrono::milliseconds(_job.fault.delay_ms));
        }
        auto res = _runner->run_step(it, out, nullptr, summary);
        _job.segment = _runner->last_segment();
        if (!res) {
            _job.err = res.err();
            break;
        }
        const bool first = i == 0;
        step_result r = std::move(*res);
        if (first) {
            _job.res = r;
        } else {
            _job.res.gpu_ms += r.gpu_ms;
            _job.res.n_tokens += r.n_tokens;
            _job.res.segments += r.segments;
            _job.res.segments_replayed += r.segments_replayed;
        }
        _job.iterations = i + 1;
        if (!r.logits_finite) {
            _job.nan = true;
            break;
        }
        if (i + 1 == k) break;
        // The scheduler asked to end the step here (a request waits for it): this iteration's
        // rows stay where the last iteration's are.
        if (_end_decode_steps_of.load(std::memory_order_acquire) == m.step_id) break;
        // Each row's draw for the next iteration, from what the scheduler keeps of this one; a
        // draw the summary alone does not settle, or one of the step's end_tokens, ends the step
        // here (this iteration's rows stay where the last iteration's are, and the scheduler
        // draws from the row).
        bool settled = true;
        for (std::uint32_t j = 0; j < rows && settled; j++) {
            next[j] = draws->next(j, _exchange.read_row(_job.slot, j),
                                  r.summarized ? _exchange.read_summary(_job.slot, j)
                                               : std::span<const std::uint32_t>());
            settled = next[j] >= 0 && !draws->ends(next[j]);
        }
        if (!settled) break;
        // This iteration's rows move to their place (decode_row) before the next one writes
        // over row 0: the summaries where there are some, else the logits rows.
        const std::uint32_t to = decode_row(i, k, rows, 0);
        if (r.summarized) {
            std::memcpy(_exchange.summary_row(_job.slot, to), summary,
                        std::size_t(rows) * abi::ORDO_SUMMARY_WORDS * 4);
        } else {
            std::memcpy(_exchange.row(_job.slot, to), out, std::size_t(rows) * n_vocab * 4);
        }
        for (std::uint32_t j = 0; j < rows; j++) {
            _job.draws.push_back(next[j]);
            it.seqs[j].tokens[0] = next[j];
            it.seqs[j].pos0++;
        }
    }
    _job.run_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void gpu_actor::run_kv_copy_job() {
    // The slot was checked held and large enough on the loop; its bytes are ours until the
    // reply is sent.
    status s;
    if (const auto* out = std::get_if<kv_copy_out>(&_job.copy)) {
        s = _runner->copy_kv_out(out->blocks,
                                 _kv_staging->bytes(out->staging_slot, _job.copy_bytes));
    } else {
        const auto& in = std::get<kv_copy_in>(_job.copy);
        s = _runner->copy_kv_in(in.blocks, _kv_staging->read(in.staging_slot, _job.copy_bytes));
    }
    _job.segment = _runner->last_segment();
    if (!s) _job.err = s.err();
}

// ---- loop thread ------------------------------------------------------------------------

namespace {

// Replies to the scheduler: its mailbox drains in microseconds, so one that waits this long means
// the scheduler is stuck; the reply is then given up (its logits slot released) and the
// scheduler's backstop decides what the step became.
constexpr actors::delivery_limits reply_delivery_limits{
    .pending_max = 4096, .retry_ms = 2, .deadline_ms = 30'000};

}  // namespace

void gpu_actor::reply_gave_up(const reply_delivery::message& m, const actors::refusal& why) {
    _replies_undelivered++;
    if (const auto* d = std::get_if<step_done>(&m); d && d->slot != logits_exchange::no_slot) {
        _exchange.release(d->slot);
    }
    if (why.outcome != actors::delivery_outcome::actor_stopped) {
        log().error("reply {} to the scheduler given up: {}",
                    std::visit([](const auto& r) { return std::string(r.msg_name); }, m),
                    why.message);
    }
}

void gpu_actor::on_start() {
    must(_worker.start(loop(), _options.name + "-job"), "job thread start");
    must(_replies.init(loop(), _reply_out, reply_delivery_limits,
                       [this](const reply_delivery::message& m, const actors::refusal& why) {
                           reply_gave_up(m, why);
                       }),
         "delivery init");
    // KV copy replies: the same bounds. A given-up reply loses nothing but the reply: the
    // staging slot stays with its holder.
    must(_kv_replies.init(
             loop(), _kv_out, reply_delivery_limits,
             [this](const kv_delivery::message& m, const actors::refusal& why) {
                 _replies_undelivered++;
                 if (why.outcome == actors::delivery_outcome::actor_stopped) return;
                 log().error("reply {} to the kv receiver given up: {}",
                             std::visit([](const auto& r) { return std::string(r.msg_name); }, m),
                             why.message);
             }),
         "kv delivery init");
    _state = state::starting;
    _epoch = 0;
    _rebuilds_in_row = 0;
    start_job(job_kind::build);
}

void gpu_actor::on_stop() {
    fail_queued(gpu_failure::stopped, "the gpu actor is stopping", false);
    // A running job ends within its watchdog; job_done then sends its reply, frees the runner,
    // closes the delivery and ends the job thread.
    if (!_worker.busy()) {
        _runner.reset();
        _replies.close();
        _kv_replies.close();
        _worker.stop();
    }
}

namespace {

device_summary summarize(const runner& r) {
    const device_info& i = r.info();
    device_summary s;
    s.name = i.name;
    s.kind = std::string(device_kind_name(i.kind));
    s.driver = i.driver_name + (i.driver_info.empty() ? "" : " " + i.driver_info);
    s.vulkan = i.api_version;
    s.index = i.index;
    s.subgroup_size = i.subgroup_size;
    s.max_storage_buffer_range = i.max_storage_buffer_range;
    s.max_shared_memory_bytes = i.max_shared_memory_bytes;
    s.max_workgroup_invocations = i.max_workgroup_invocations;
    for (const memory_heap_info& h : i.heaps) {
        if (h.device_local) s.device_local_bytes = std::max(s.device_local_bytes, h.size_bytes);
    }
    const std::pair<bool, const char*> features[] = {
        {i.storage_buffer_16bit, "storage_16bit"},      {i.shader_float16, "float16"},
        {i.storage_buffer_8bit, "storage_8bit"},        {i.shader_int8, "int8"},
        {i.subgroup_arithmetic, "subgroup_arithmetic"}, {i.subgroup_ballot, "subgroup_ballot"},
        {i.subgroup_shuffle, "subgroup_shuffle"},       {i.timestamps, "timestamps"},
        {i.cooperative_matrix, "cooperative_matrix"}};
    for (const auto& [on, name] : features) {
        if (on) s.features.emplace_back(name);
    }
    s.kernels = r.texel_kernels() ? "texel" : "storage";
    s.row_summaries = r.row_summaries();
    s.flush_every_layers = r.flush_every_layers();
    s.first_segment_layers = r.first_segment_layers();
    s.logits_in_place = r.logits_regions_imported() > 0;
    s.batch_invariant = !r.mat_coop();
    return s;
}

}  // namespace

void gpu_actor::finish_build() {
    if (_job.err) {
        log().error("device build failed: {}: {}", _job.err->code, _job.err->message);
        if (_job.kind == job_kind::rebuild && ++_rebuilds_in_row < _options.recovery_max &&
            !stopping()) {
            start_job(job_kind::rebuild);  // bounded by recovery_max
            return;
        }
        if (_job.kind == job_kind::build && build_retryable(*_job.err) &&
            _rebuilds_in_row < _options.recovery_max && !stopping()) {
            _rebuilds_in_row++;
            log().warn("retrying the device build (attempt {} of {})", _rebuilds_in_row + 1,
                       _options.recovery_max + 1);
            start_job(job_kind::build);  // bounded by recovery_max
            return;
        }
        _state = state::unavailable;
        fail_queued(gpu_failure::unavailable, "the device could not be built", false);
        _replies.send(device_unavailable{_job.err->code + ": " + _job.err->message});
        return;
    }
    assert(_job.built != nullptr);
    _runner = std::move(_job.built);
    _device_name = _runner->info().name;
    if (_job.kind == job_kind::rebuild) {
        _epoch++;
        _recoveries++;
    }
    _state = state::ready;
    log().info("device ready (epoch {}): {}", _epoch, _device_name);
    device_ready m{_epoch,
                   _device_name,
                   _runner->limits().n_blocks,
                   _runner->limits().block_tokens,
                   _options.runner.rows_max,
                   summarize(*_runner),
                   _runner->limits().n_ctx,
                   std::string(context_bound_name(_runner->n_ctx_bound())),
                   _runner->weight_bytes(),
                   _runner->kv_bytes(),
                   decode_rows_max()};
    _replies.send(m);
}

void gpu_actor::finish_step() {
    const step& m = _job.msg;
    // The slot pump() acquired for the step is still held: only this reply releases it.
    assert(_job.slot == logits_exchange::no_slot || _exchange.is_held(_job.slot));
    _busy_ms += _job.res.gpu_ms;
    if (!_job.err && !_job.nan) {
        _steps++;
        _tokens += _job.res.n_tokens;
        _rebuilds_in_row = 0;
        step_done d{.step_id = m.step_id,
                    .slot = _job.slot,
                    .rows = _job.res.rows,
                    .n_vocab = _exchange.n_vocab(),
                    .gpu_ms = _job.res.gpu_ms,
                    .hidden_rows = _job.res.hidden_rows,
                    .summarized = _job.res.summarized,
                    .run_ms = _job.run_ms,
                    .segments = _job.res.segments,
                    .segments_replayed = _job.res.segments_replayed,
                    .decode_steps = _job.iterations,
                    .draws = std::move(_job.draws)};
        _replies.send(d);
        return;
    }
    // A segment that timed out may still be writing this slot's rows (the head writes them in
    // place): the slot goes back, but no step runs, and so none is handed out, until the
    // rebuild has drained the old device and destroyed it (its teardown waits for it idle).
    _exchange.release(_job.slot);
    if (_job.nan) {
        fail(m, gpu_failure::nan, "non-finite logits or hidden states", _job.segment, false);
        return;
    }
    const gpu_failure f = gpu_failure_of(*_job.err);
    const bool lost = device_fault(f);
    fail(m, f, failure_text(*_job.err, f), lost ? _job.segment : "", lost);
    if (lost) begin_recovery();
}

void gpu_actor::finish_kv_copy() {
    const std::uint64_t id = copy_job_id(_job.copy);
    if (!_job.err) {
        _rebuilds_in_row = 0;
        _kv_replies.send(kv_copy_done{id, _job.copy_bytes});
        return;
    }
    const gpu_failure f = gpu_failure_of(*_job.err);
    const bool lost = device_fault(f);
    std::string where = lost ? " [" + _job.segment + "]" : "";
    fail_copy(_job.copy, f, failure_text(*_job.err, f) + where);
    if (lost) begin_recovery();
}

bool gpu_actor::start_kv_copy(kv_copy c) {
    const auto [blocks, slot, epoch] = std::visit(
        [](const auto& m) { return std::make_tuple(m.blocks.size(), m.staging_slot, m.epoch); }, c);
    if (epoch != _epoch) {
        fail_copy(c, gpu_failure::stale_epoch,
                  "the copy names blocks of device epoch " + std::to_string(epoch) +
                      "; the pool is of epoch " + std::to_string(_epoch));
        return false;
    }
    if (_kv_staging == nullptr) {
        fail_copy(c, gpu_failure::bad_request, "no KV staging is connected (connect_kv)");
        return false;
    }
    assert(_runner != nullptr);  // pump() starts jobs only while the device is ready
    if (!_kv_staging->is_held(slot)) {
        fail_copy(c, gpu_failure::bad_request,
                  "KV staging slot " + std::to_string(slot) + " is not held by the sender");
        return false;
    }
    std::uint64_t bytes = blocks * _runner->kv_block_bytes();
    if (bytes > _kv_staging->slot_bytes()) {
        fail_copy(c, gpu_failure::bad_request,
                  std::to_string(blocks) + " KV blocks need " + std::to_string(bytes) +
                      " B; a staging slot holds " + std::to_string(_kv_staging->slot_bytes()));
        return false;
    }
    _job.copy = std::move(c);
    _job.copy_bytes = bytes;
    start_job(job_kind::kv_copy);
    return true;
}

void gpu_actor::begin_recovery() {
    fail_queued(gpu_failure::device_lost, "dropped: the device was lost while the step was queued",
                true);
    if (_rebuilds_in_row >= _options.recovery_max || stopping()) {
        _state = state::unavailable;
        _replies.send(device_unavailable{std::to_string(_rebuilds_in_row) +
                                         " device rebuilds without a successful step "
                                         "(recovery_max " +
                                         std::to_string(_options.recovery_max) + ")"});
        return;
    }
    _state = state::recovering;
    _rebuilds_in_row++;
    start_job(job_kind::rebuild);
}

void gpu_actor::pump() {
    // Bounded by the queue: each pass starts the head step or fails it.
    while (!_worker.busy() && _state == state::ready && !_queue.empty() && !stopping()) {
        queued head = std::move(_queue.front());
        _queue.pop_front();
        if (auto* c = std::get_if<kv_copy>(&head)) {
            start_kv_copy(std::move(*c));
            continue;
        }
        _job.msg = std::move(std::get<step>(head));
        bool rows = false;
        for (const step_seq& q : _job.msg.seqs) {
            rows = rows || q.logits_rows != 0 || q.hidden != hidden_output::none;
        }
        _job.slot = logits_exchange::no_slot;
        if (rows) {
            auto slot = _exchange.acquire();
            if (!slot) {
                const gpu_failure f = gpu_failure_of(slot.err());
                fail(_job.msg, f, failure_text(slot.err(), f), "", false);
                continue;
            }
            _job.slot = *slot;
        }
        _job.fault = _faults.next(_job.msg.phase);
        assert(_runner != nullptr);
        start_job(job_kind::step);
    }
}

void gpu_actor::fail(const step& m, gpu_failure code, const std::string& message,
                     const std::string& segment, bool device_lost) {
    _failures++;
    if (code != gpu_failure::bad_step) {
        log().warn("step {} failed: {}: {} [{}]", m.step_id, enum_name(code), message, segment);
    }
    _replies.send(step_failed{m.step_id, code, message, segment, device_lost});
}

void gpu_actor::fail_queued(gpu_failure code, const std::string& message, bool device_lost) {
    while (!_queue.empty()) {
        fail_job(_queue.front(), code, message, device_lost);
        _queue.pop_front();
    }
}

void gpu_actor::fail_job(const queued& q, gpu_failure code, const std::string& message,
                         bool device_lost) {
    if (const auto* m = std::get_if<step>(&q)) {
        fail(*m, code, message, "", device_lost);
    } else {
        fail_copy(std::get<kv_copy>(q), code, message);
    }
}

void gpu_actor::fail_copy(const kv_copy& c, gpu_failure code, const std::string& message) {
    _failures++;
    const std::uint64_t id = copy_job_id(c);
    log().warn("kv copy {} failed: {}: {}", id, enum_name(code), message);
    _kv_replies.send(kv_copy_failed{id, code, message});
}

void gpu_actor::enqueue(queued q) {
    auto refuse = [&](gpu_failure code, const std::string& message, bool lost) {
        fail_job(q, code, message, lost);
    };
    if (_state == state::unavailable) {
        refuse(gpu_failure::unavailable, "the device is unavailable", false);
    } else if (_state == state::recovering) {
        refuse(gpu_failure::device_lost, "the device is being rebuilt; wait for device_ready",
               true);
    } else if (_queue.size() >= _options.queue_max) {
        refuse(gpu_failure::busy, std::to_string(_queue.size()) + " jobs already queued", false);
    } else {
        _queue.push_back(std::move(q));
        assert(_queue.size() <= _options.queue_max);
        pump();
    }
}

void gpu_actor::on(const step& m) {
    enqueue(m);
}
void gpu_actor::on(const kv_copy_out& m) {
    enqueue(kv_copy{m});
}
void gpu_actor::on(const kv_copy_in& m) {
    enqueue(kv_copy{m});
}

void gpu_actor::on(const end_decode_steps& m) {
    // Read by the worker between the decode iterations of the step it names (run_decode_steps),
    // whether that step runs now, waits in the queue or is done (then nothing reads it).
    _end_decode_steps_of.store(m.step_id, std::memory_order_release);
    _decode_steps_ends.fetch_add(1);
}

void gpu_actor::on(const reset_device& m) {
    log().warn("device reset requested: {}", m.reason);
    if (_state == state::unavailable) {
        _replies.send(device_unavailable{"the device is unavailable; it cannot be reset"});
        return;
    }
    if (_state != state::ready) return;  // the build under way answers with device_ready
    if (_worker.busy()) {
        _reset_requested = true;  // job_done rebuilds once the running step is answered
        return;
    }
    begin_recovery();
}

void gpu_actor::on(const inject_fault& m) {
    status s = _faults.arm(m);
    if (!s) {
        log().warn("inject_fault refused: {}", s.err().message);
        count_handler_error();
        // The fault plan's scheduler counts what it armed: it hears of a refusal.
        if (m.plan_step != 0) _replies.send(fault_refused{m.plan_step, m.kind, s.err().message});
        return;
    }
    log().warn("fault armed: {} phase {} layer {} after {} count {} delay {} ms", enum_name(m.kind),
               m.phase ? enum_name(*m.phase) : "any", m.layer, m.after_steps, m.count, m.delay_ms);
}

}  // namespace ordo::gpu
