// scheduler_outcomes.cpp: applying step outcomes and deciding terminal events.
//
// A step's outcome is applied to every sequence in it, including ones cancelled or whose
// client left while it ran (F2): KV frontiers advance and full blocks are published, or, on a
// failure, the sequences' KV is invalidated completely and they recompute from token 0 (F1).
// Retry policy (F4/F6) is decided here and nowhere else:
//   - a failed batch of several sequences is split (bisect: in halves; sequential: one by one)
//     and the parts run in steps of their own before normal batching resumes;
//   - a sequence that fails alone is retried up to scheduler.retry_max times, then ends with
//     error{gpu_failed}; the others complete;
//   - device loss invalidates every sequence (the pool is gone) and waits for device_ready;
//   - batch_failure_policy = fail ends every sequence of a failed step at once.
#include <algorithm>
#include <cassert>
#include <cmath>

#include "scheduler/scheduler_core.hpp"

namespace ordo::sched {
namespace {

// Failures a sequence may take part in while batched with others, on top of retry_max alone:
// bisection needs log2(max_sequences) of them; the cap stops a flaky request from dragging
// batches into failure forever.
constexpr uint32_t batch_failures_max = 8;

double ms_between(std::chrono::steady_clock::time_point a,
                  std::chrono::steady_clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

// ---- device events --------------------------------------------------------------------------

void scheduler_core::on_device_ready(const gpu::device_ready& m, std::vector<outgoing_event>& out) {
    _gpu.device = m.info;
    _gpu.epoch = m.epoch;
    _device_n_ctx = m.n_ctx;
    _device_n_ctx_bound = m.n_ctx_bound;
    _weight_bytes = m.weight_bytes;
    _kv_bytes = m.kv_bytes;
    _rows_max = std::max<uint32_t>(1, m.rows_max);
    _decode_rows_max = std::max(_rows_max, m.decode_rows_max);
    _counters.device_epochs = m.epoch + 1;
    if (!_kv || _kv->config().n_blocks != m.kv_blocks ||
        _kv->config().block_tokens != m.kv_block_tokens) {
        auto kv = kv_blocks::create({m.kv_blocks, m.kv_block_tokens, _opt.prefix_cache});
        if (!kv.ok()) {
            _device_unavailable = true;
            _unavailable_reason = "kv pool: " + kv.err().message;
            return;
        }
        for (auto& [seq, r] : _requests) r.in_kv = false, r.n_past = 0;
        _save_pins.clear();
        _kv.emplace(std::move(*kv));
    } else if (m.epoch > 0) {
        // A rebuilt device has an empty pool, whatever we were told before.
        _kv->invalidate_all();
        _save_pins.clear();
        for (auto& [seq, r] : _requests) r.in_kv = false, r.n_past = 0;
    }
    _device_ready = true;
    _build_progress.clear();
    // Requests queued before the pool size was known that could never fit it end now.
    // So do those past the device's context (it may be shorter than the configured one).
    std::vector<std::pair<seq_id, uint64_t>> too_big;  // and what each needs
    for (auto& [seq, r] : _requests) {
        uint64_t need = uint64_t(r.n_prompt) + r.params.max_tokens;
        if (!fits_pool(need) || need > n_ctx()) too_big.emplace_back(seq, need);
    }
    for (auto [seq, need] : too_big) {
        fail(*find(seq), door::errc::context_exceeded,
             need > n_ctx()
                 ? "prompt + max_tokens (" + std::to_string(need) +
                       ") exceeds this device's context of " + std::to_string(n_ctx()) + " tokens"
                 : pool_message(need),
             out);
    }
}

void scheduler_core::on_device_progress(const gpu::device_progress& m) {
    // "warm-up 2/5 (attempt 1 of 4)"; a stage without steps says only its name.
    _build_progress = m.stage;
    if (m.total != 0) {
        _build_progress += " " + std::to_string(m.done) + "/" + std::to_string(m.total);
    }
    if (m.attempts_max > 1) {
        _build_progress += " (attempt " + std::to_string(m.attempt) + " of " +
                           std::to_string(m.attempts_max) + ")";
    }
}

void scheduler_core::on_device_unavailable(const gpu::device_unavailable& m,
                                           std::vector<outgoing_event>& out) {
    _device_ready = false;
    _device_unavailable = true;
    _unavailable_reason = m.message;
    _in_flight.reset();
    std::vector<seq_id> all;
    for (auto& [seq, r] : _requests) all.push_back(seq);
    for (seq_id seq : all) fail(*find(seq), door::errc::gpu_unavailable, m.message, out);
}

// ---- step done ---------------------------------------------------------------------------------

void scheduler_core::on_step_done(const gpu::step_done& m, const row_reader& row,
                                  const row_reader& hidden_row, std::vector<outgoing_event>& out,
                                  const summary_reader& summary) {
    if (!_in_flight || _in_flight->step_id != m.step_id) return;  // not ours (stale): ignore
    in_flight_step f = std::move(*_in_flight);
    _in_flight.reset();
    _counters.steps++;
    _gpu.steps++;
    _gpu.busy_ms += m.gpu_ms;
    _gpu.run_ms += m.run_ms;
    _gpu.segments += m.segments;
    _gpu.segments_replayed += m.segments_replayed;
    _outcome_at = clock::now();
    _gpu.step_wall_ms += ms_between(f.sent, *_outcome_at);
    if (f.decode_steps > 1) {
        apply_decode_steps(f, m, row, summary, out);
        return;
    }
    for (const planned& p : f.seqs) {
        request_state* r = find(p.seq);
        if (r == nullptr) continue;
        const uint32_t start = r->n_past;
        r->n_past += p.n_tokens;
        // The step ran on the blocks reserved for it (reserve before every step), so they
        // cover n_past and the commit cannot be refused.
        [[maybe_unused]] const status committed =
            _kv->commit_full_blocks(r->seq, std::span(r->tokens).first(r->n_past));
        assert(committed.ok() && "a sequence of a step that ran holds the KV reserved for it");
        r->restored_from.clear();  // a step succeeded with the restored blocks
        if (f.isolated) r->batch_failures = 0;
        if (r->cancel_requested) {
            finish(*r, door::finish_reason::cancelled, out);
            continue;
        }
        if (r->embed) {
            apply_embed_step(*r, p, start, m, hidden_row, out);
            continue;
        }
        if (p.logits_rows == 0) continue;
        // The sequence's rows, together and in token order (step_done).
        auto it = std::find(m.rows.begin(), m.rows.end(), p.seq);
        if (it == m.rows.end() || m.n_vocab == 0 || size_t(m.rows.end() - it) < p.logits_rows ||
            std::any_of(it, it + p.logits_rows, [&](uint64_t s) { return s != p.seq; })) {
            fail(*r, door::errc::internal, "the gpu returned no logits row for this sequence", out);
            continue;
        }
        const auto row0 = uint32_t(it - m.rows.begin());
        if (p.drafts.empty()) {
            apply_token(*r, vocab_logits(row(row0)),
                        summary ? summary(row0) : std::span<const uint32_t>(), out);
        } else {
            verify(*r, p, row0, row, summary, out);
        }
    }
}

void scheduler_core::apply_decode_steps(const in_flight_step& f, const gpu::step_done& m,
                                        const row_reader& row, const summary_reader& summary,
                                        std::vector<outgoing_event>& out) {
    // The iterations that ran: all the step asked for, or fewer where a draw ended it early.
    const uint32_t k = m.decode_steps;
    const auto rows = uint32_t(m.rows.size());
    const bool whole = k >= 1 && k <= f.decode_steps && rows == f.seqs.size() &&
                       m.draws.size() == size_t(k - 1) * rows && m.n_vocab != 0 &&
                       (!m.summarized || summary);
    if (whole) {
        _counters.decode_iterations_ahead += k - 1;
        if (k < f.decode_steps) _counters.decode_steps_ended_early++;
    }
    const auto row_vocab = uint32_t(std::min<size_t>(m.n_vocab, _tok->vocab().size()));
    for (const planned& p : f.seqs) {
        request_state* r = find(p.seq);
        if (r == nullptr) continue;
        auto it = std::find(m.rows.begin(), m.rows.end(), p.seq);
        if (!whole || it == m.rows.end()) {
            fail(*r, door::errc::internal,
                 "the gpu's answer to a step of " + std::to_string(f.decode_steps) +
                     " decode iterations does not match it",
                 out);
            continue;
        }
        const auto j = uint32_t(it - m.rows.begin());
        // Iteration i ran position start + i: the sequence's pending token, then the gpu's
        // draws, each applied here as the step of one token that drew it would be.
        for (uint32_t i = 0; i < k; i++) {
            if (i > 0) {
                const int32_t ran = m.draws[size_t(i - 1) * rows + j];
                if (ran != r->tokens.back()) {
                    // Its KV from here holds another token's: the request cannot go on.
                    fail(*r, door::errc::internal,
                         "decode iteration " + std::to_string(i) + " ran token " +
                             std::to_string(ran) + ", not the sampler's " +
                             std::to_string(r->tokens.back()),
                         out);
                    break;
                }
            }
            r->n_past += 1;
            [[maybe_unused]] const status committed =
                _kv->commit_full_blocks(r->seq, std::span(r->tokens).first(r->n_past));
            assert(committed.ok() && "the step's positions were reserved for it");
            r->restored_from.clear();
            if (r->cancel_requested) {
                finish(*r, door::finish_reason::cancelled, out);
                break;
            }
            // The earlier iterations' rows are summaries alone where the step summarized.
            const uint32_t at = gpu::decode_row(i, k, rows, j);
            const bool logits = i + 1 == k || !m.summarized;
            apply_token(*r, logits ? vocab_logits(row(at)) : std::span<const float>(),
                        m.summarized ? summary(at) : std::span<const uint32_t>(), out, row_vocab);
            if (find(p.seq) == nullptr) break;  // it ended at this token
        }
    }
}

std::span<const float> scheduler_core::vocab_logits(std::span<const float> logits) const {
    // A model may pad its output head past the tokenizer's vocabulary: those ids cannot be
    // sampled, since they could never be turned into text.
    return logits.first(std::min(logits.size(), _tok->vocab().size()));
}

void scheduler_core::apply_token(request_state& r, std::span<const float> logits,
                                 std::span<const uint32_t> summary_words,
                                 std::vector<outgoing_event>& out, uint32_t row_vocab) {
    // The step's summary of the row (a bad one is the device's fault, like a NaN logit).
    std::optional<logits_summary> summary;
    if (!summary_words.empty()) {
        auto s = read_summary(summary_words, logits.empty() ? row_vocab : uint32_t(logits.size()),
                              r.smp->params().temperature);
        if (!s.ok())
            return fail(r, door::errc::internal, "sampling failed: " + s.err().message, out);
        summary = *s;
    }
    const logits_summary* sum = summary ? &*summary : nullptr;
    std::optional<sampled> s;
    if (logits.empty()) {
        // A decode iteration the GPU ran ahead (plan_decode_steps): the summary settles it, as
        // it did for the draw the gpu actor made from it (gpu::step_draws).
        if (sum != nullptr && !r.grammar) s = r.smp->sample_summarized(*sum, row_vocab);
        if (!s) {
            return fail(r, door::errc::internal,
                        "a decode iteration came back without the row its draw needs", out);
        }
        _counters.candidate_draws++;
    }
    // A grammar: the draw (greedy's best few tokens, or one random draw) is offered to the
    // grammar token by token, and only when it refuses is the whole vocabulary's mask computed
    // (sampler::sample_checked: the distribution is the masked one either way).
    if (!s && r.grammar) {
        auto g = r.smp->sample_checked(
            logits, r.tokens, [&](int32_t t) { return r.grammar->allows(t); },
            grammar_greedy_checks_max, sum);
        if (!g.ok())
            return fail(r, door::errc::internal, "sampling failed: " + g.err().message, out);
        s = std::move(*g);
    }
    if (!s) {
        std::span<const uint8_t> allowed;
        if (r.grammar) {
            auto a = r.grammar->allowed();
            if (!a) return fail(r, door::errc::bad_request, a.err().message, out);
            allowed = a->first(std::min(a->size(), logits.size()));
        }
        const uint64_t settled = r.smp->summary_draws();
        auto d = r.smp->sample(logits, r.tokens, allowed, sum);
        if (!d.ok())
            return fail(r, door::errc::internal, "sampling failed: " + d.err().message, out);
        _counters.candidate_draws += r.smp->summary_draws() - settled;
        s = std::move(*d);
    }
    int32_t token = s->token;
    if (r.grammar) {
        if (auto g = r.grammar->accept(token); !g) {
            return fail(r, door::errc::internal, g.err().message, out);
        }
    }
    const auto now = clock::now();
    if (!r.has_first_token) {
        r.has_first_token = true, r.first_token = now;
        _histograms.ttft.observe(ms_between(r.submitted, now) / 1000.0);
    } else {
        _histograms.inter_token.observe(ms_between(r.last_token, now) / 1000.0);
    }
    r.last_token = now;
    r.tokens.push_back(token);
    r.generated.push_back(token);
    _counters.tokens_generated++;

    std::string emit;
    std::optional<door::finish_reason> reason;
    std::string stop_string;
    if (_tok->vocab().is_eog(token)) {  // eos, eot, eom, ...: the vocab's end-of-generation set
        emit = r.stops->finish();
        reason = door::finish_reason::stop;
    } else {
        // Without a tokenizer (unsupported) no text is made: token events carry ids only.
        auto piece = r.decoder ? r.decoder->feed(token) : result<std::string>(std::string());
        auto o = r.stops->feed(piece.ok() ? *piece : std::string());
        emit = std::move(o.text);
        if (o.stopped) {
            reason = door::finish_reason::stop;
            stop_string = r.stops->stops()[size_t(o.stop_index)];
        } else if (const bool complete = r.grammar && r.grammar->done();
                   complete || r.generated.size() >= r.params.max_tokens ||
                   r.tokens.size() >= n_ctx()) {
            // A grammar that can take nothing more ends the answer as end of generation would.
            auto tail = r.stops->feed(r.decoder ? r.decoder->flush() : std::string());
            emit += tail.text;
            if (tail.stopped) {
                reason = door::finish_reason::stop;
                stop_string = r.stops->stops()[size_t(tail.stop_index)];
            } else {
                emit += r.stops->finish();
                reason = complete ? door::finish_reason::stop : door::finish_reason::length;
            }
        }
    }
    r.text += emit;
    if (r.params.stream || r.params.sampling.logprobs > 0) {
        door::token_info t{token, std::move(emit), s->logprob, std::nullopt};
        if (r.params.sampling.logprobs > 0) {
            auto& top = t.top_logprobs.emplace();
            for (const auto& e : s->top_logprobs()) {
                std::string text;
                if (r.decoder) model::utf8_sanitize(_tok->token_bytes(e.token, false), true, text);
                top.push_back({e.token, std::move(text), e.logprob});
            }
        }
        if (!r.params.stream) {
            r.logprobs.push_back(std::move(t));
        } else if (!r.client_gone) {
            out.push_back(door::token_event{r.conn, r.id, std::move(t)});
        }
    }
    if (reason) finish(r, *reason, out, stop_string);
}

// ---- step failed -------------------------------------------------------------------------------

void scheduler_core::on_step_failed(const gpu::step_failed& m, std::vector<outgoing_event>& out) {
    if (!_in_flight || _in_flight->step_id != m.step_id) return;
    in_flight_step f = std::move(*_in_flight);
    _in_flight.reset();
    _counters.failures++;
    switch (m.code) {
        case gpu::gpu_failure::timeout:
            _gpu.timeouts++;
            break;
        case gpu::gpu_failure::device_lost:
            _gpu.device_lost++;
            break;
        case gpu::gpu_failure::nan:
            _gpu.nan_logits++;
            break;
        default:
            _gpu.other_failures++;
            break;
    }
    std::vector<seq_id> affected;
    for (const planned& p : f.seqs) {
        if (find(p.seq) != nullptr) affected.push_back(p.seq);
    }
    if (m.device_lost) {
        // The pool is gone: every sequence recomputes from token 0 once the device is back.
        _device_ready = false;
        _kv->invalidate_all();
        _save_pins.clear();
        for (auto& [seq, r] : _requests) r.in_kv = false, r.n_past = 0;
    } else {
        for (seq_id seq : affected) {
            request_state& r = *find(seq);
            auto others = _kv->invalidate_sequence(seq);
            r.in_kv = false;
            r.n_past = 0;
            if (others.ok()) {
                for (seq_id o : *others) reset_for_recompute(*find(o));
            }
        }
    }
    std::string why = std::string(enum_name(m.code)) + " in " + m.segment + ": " + m.message;
    bool alone = affected.size() == 1;
    std::vector<seq_id> retry;
    for (seq_id seq : affected) {
        request_state& r = *find(seq);
        restore_step_failed(r, why);
        _counters.retries++;
        (alone ? r.retries : r.batch_failures)++;
        if (r.cancel_requested) {
            // F2: the step it was in failed, and that is its outcome; a cancel that arrived
            // while the step ran does not mask the failure (invariant: a compute failure is
            // never reported as cancelled).
            _counters.gpu_failed++;
            fail(r, door::errc::gpu_failed, why + " (a cancel was pending)", out);
        } else if (_opt.policy == config::batch_failure_policy::fail ||
                   r.retries > _opt.retry_max || r.batch_failures > batch_failures_max) {
            _counters.gpu_failed++;
            fail(r, door::errc::gpu_failed, why, out);
        } else {
            retry.push_back(seq);
        }
    }
    if (retry.empty()) return;
    if (retry.size() == 1 || _opt.policy == config::batch_failure_policy::sequential) {
        for (seq_id seq : retry) _isolation.push_back({seq});
    } else {
        size_t half = retry.size() / 2;
        _isolation.emplace_back(retry.begin(), retry.begin() + long(half));
        _isolation.emplace_back(retry.begin() + long(half), retry.end());
    }
}

void scheduler_core::reset_for_recompute(request_state& r) {
    free_kv(r);
    r.n_past = 0;
}

// ---- terminal events ---------------------------------------------------------------------------

void scheduler_core::finish(request_state& r, door::finish_reason reason,
                            std::vector<outgoing_event>& out, const std::string& stop_string) {
    if (r.embed) {
        // Only a cancel ends an embedding here; a complete one ends in finish_embed.
        assert(reason == door::finish_reason::cancelled);
        if (!r.client_gone) out.push_back(door::embed_done{r.conn, r.id, {}, r.n_prompt, "", true});
        remove(r);
        return;
    }
    // A cancelled answer's KV is not saved: it may stop anywhere, and nobody asked to keep it.
    if (reason != door::finish_reason::cancelled) save_to_disk(r);
    const auto now = clock::now();
    _histograms.duration.observe(ms_between(r.submitted, now) / 1000.0);
    _histograms.prompt_tokens.observe(r.n_prompt);
    _histograms.completion_tokens.observe(double(r.generated.size()));
    if (!r.client_gone) {
        door::generate_done d;
        d.conn = r.conn, d.id = r.id;
        d.reason = reason;
        d.stop = stop_string;
        d.tokens = r.generated;
        d.text = r.text;
        d.seed = r.params.sampling.seed;
        if (!r.params.stream && r.params.sampling.logprobs > 0) d.logprobs = std::move(r.logprobs);
        auto& u = d.usage;
        u.prompt_tokens = r.n_prompt;
        u.cached_tokens = r.cached_tokens;
        u.completion_tokens = r.generated.size();
        u.prefill_ms =
            r.started ? ms_between(r.first_step, r.has_first_token ? r.first_token : now) : 0;
        u.decode_ms = r.has_first_token ? ms_between(r.first_token, now) : 0;
        out.push_back(std::move(d));
    }
    remove(r);
}

void scheduler_core::fail(request_state& r, door::errc code, const std::string& message,
                          std::vector<outgoing_event>& out) {
    if (!r.client_gone) out.push_back(error_event(r.conn, r.id, code, message));
    remove(r);
}

void scheduler_core::remove(request_state& r) {
    // Never while a step that uses its blocks is in flight: those blocks would be reused.
    assert(!_in_flight || std::none_of(_in_flight->seqs.begin(), _in_flight->seqs.end(),
                                       [&](const planned& p) { return p.seq == r.seq; }));
    free_kv(r);
    if (r.draft_told) _draft_forget.push_back(r.seq);
    std::erase(_running, r.seq);
    std::erase(_queue, r.seq);
    std::erase(_restoring, r.seq);
    if (r.params.session) {
        auto s = _sessions.find(*r.params.session);
        if (s != _sessions.end() && s->second == r.seq) _sessions.erase(s);
    }
    if (!r.detached) _by_client.erase({r.conn, r.id});
    seq_id seq = r.seq;
    _requests.erase(seq);  // r dangles from here
}

void scheduler_core::shutdown(std::vector<outgoing_event>& out) {
    _in_flight.reset();  // its outcome will never be read: the process is ending
    std::vector<seq_id> all;
    for (auto& [seq, r] : _requests) all.push_back(seq);
    for (seq_id seq : all) {
        fail(*find(seq), door::errc::shutting_down, "the server is stopping", out);
    }
    for (const delete_wait& d : _deletes) {
        out.push_back(error_event(d.conn, d.id, door::errc::shutting_down,
                                  "the server is stopping before the disk answered; the "
                                  "session's file may or may not be removed"));
    }
    _deletes.clear();
}

status scheduler_core::check_invariants() const {
    if (_kv) {
        if (auto st = _kv->check_invariants(); !st.ok()) return st;
    }
    size_t attached = size_t(std::count_if(_requests.begin(), _requests.end(),
                                           [](const auto& kv) { return !kv.second.detached; }));
    if (_by_client.size() != attached) {
        return make_error("internal", "client index and request table differ in size");
    }
    for (const auto& [seq, r] : _requests) {
        bool queued = std::count(_queue.begin(), _queue.end(), seq) == 1;
        bool running = std::count(_running.begin(), _running.end(), seq) == 1;
        bool restoring = std::count(_restoring.begin(), _restoring.end(), seq) == 1;
        if (int(queued) + int(running) + int(restoring) != 1 || queued != (r.ph == phase::queued) ||
            restoring != (r.ph == phase::restoring)) {
            return make_error("internal", "sequence " + std::to_string(seq) +
                                              " is not in exactly one of queue, restoring and "
                                              "running");
        }
        if (r.in_kv != (_kv && _kv->has_sequence(seq))) {
            return make_error("internal", "sequence " + std::to_string(seq) + " kv registration");
        }
    }
    for (pin_id p : _save_pins) {
        if (!_kv || !_kv->has_pin(p)) {
            return make_error("internal", "save pin " + std::to_string(p) + " is not held");
        }
    }
    return {};
}

}  // namespace ordo::sched
