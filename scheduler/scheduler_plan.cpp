// scheduler_plan.cpp: building the next step (iteration-level continuous batching).
//
// One step is in flight at a time. Each step, under the token budget max_batch_tokens:
//   1. every running sequence that has exactly one pending token decodes it (oldest first);
//   2. running sequences with a longer pending run (prompt, or recompute after a failure or a
//      preemption) get a prefill chunk of what budget is left;
//   3. queued requests are admitted while there is budget, a free sequence slot and KV blocks,
//      reusing the longest cached prefix of their prompt (and, with KV persistence, asking
//      the kv actor for a longer one on disk first: scheduler_kv.cpp).
// A sequence whose KV cannot be reserved preempts the newest running sequence (its blocks are
// freed, it goes back to the head of the queue and is recomputed later, usually mostly from the
// prefix cache), never corrupting anyone's KV. Sequences isolated after a failed batch (F4) run
// in steps of their own before normal batching resumes. A step of decodes without penalties,
// grammars or drafts, with nothing waiting, may run several decode iterations on the device
// (plan_decode_steps).
#include <algorithm>
#include <cassert>

#include "scheduler/scheduler_core.hpp"

namespace ordo::sched {

std::optional<gpu::step> scheduler_core::next_step() {
    std::optional<gpu::step> s = plan_next_step();
    const clock::time_point now = clock::now();
    if (s) {
        _in_flight->sent = now;
        if (_outcome_at) {
            _gpu.between_steps_ms +=
                std::chrono::duration<double, std::milli>(now - *_outcome_at).count();
            _gpu.back_to_back_steps++;
        }
    }
    _outcome_at.reset();  // only the first plan after an outcome is back to back
    return s;
}

std::optional<gpu::step> scheduler_core::plan_next_step() {
    if (!_device_ready || _in_flight || !_kv) return std::nullopt;
    while (!_isolation.empty()) {
        if (auto s = plan_isolated()) return s;
    }
    // With a draft model, decoding sequences get their drafts first: no step until the round
    // is answered (or fails), so the step verifies them.
    if (_draft_round || start_draft_round()) return std::nullopt;
    return plan_batch();
}

// Registers a sequence with the KV manager (first admission, or after its KV was invalidated or
// it was preempted) and takes what the prefix cache already holds.
bool scheduler_core::admit(request_state& r) {
    if (r.in_kv) return true;
    if (!_kv->add_sequence(r.seq).ok()) return false;
    r.in_kv = true;
    r.n_past = 0;
    // An embedding needs every token's hidden state: it never starts from cached KV.
    if (_opt.prefix_cache && !r.embed) {
        auto cached = _kv->lookup_prefix(r.seq, r.tokens);
        if (cached.ok()) r.n_past = *cached;
    }
    if (!r.started) {
        r.cached_tokens = std::min(r.n_past, r.n_prompt);
        _counters.cached_tokens += r.cached_tokens;
    }
    return true;
}

void scheduler_core::preempt(request_state& r) {
    assert(r.ph == phase::running);
    free_kv(r);
    r.n_past = 0;
    r.ph = phase::queued;
    std::erase(_running, r.seq);
    _queue.push_front(r.seq);
    _counters.preemptions++;
}

void scheduler_core::free_kv(request_state& r) {
    if (!r.in_kv) return;
    [[maybe_unused]] const status freed = _kv->free_sequence(r.seq);
    assert(freed.ok() && "in_kv: the sequence is registered with the pool");
    r.in_kv = false;
}

// Reserves KV for r's next n_tokens positions, preempting newer sequences (not already in the
// step being built) while that helps. False when r cannot run this step (it may itself have
// been preempted).
bool scheduler_core::reserve_or_preempt(request_state& r, uint32_t n_tokens,
                                        const std::vector<seq_id>& in_step) {
    for (size_t attempt = 0; attempt <= _running.size(); attempt++) {
        if (_kv->reserve(r.seq, n_tokens).ok()) return true;
        std::vector<seq_id> candidates;
        for (seq_id s : _running) {
            if (std::find(in_step.begin(), in_step.end(), s) == in_step.end()) {
                candidates.push_back(s);
            }
        }
        auto victim = _kv->pick_victim(candidates);
        if (!victim) return false;
        request_state& v = *find(*victim);
        preempt(v);
        if (v.seq == r.seq) return false;
    }
    return false;
}

void scheduler_core::add_to_step(request_state& r, uint32_t n_tokens, gpu::step& s,
                                 in_flight_step& f, std::vector<int32_t> drafts) {
    assert(n_tokens > 0 && r.n_past + n_tokens <= r.tokens.size());
    const bool last = r.n_past + n_tokens == r.tokens.size() && !r.embed;
    assert((drafts.empty() || last) && "only a decode carries drafts");
    gpu::step_seq q;
    q.seq_id = r.seq;
    q.tokens.assign(r.tokens.begin() + r.n_past, r.tokens.begin() + r.n_past + n_tokens);
    q.tokens.insert(q.tokens.end(), drafts.begin(), drafts.end());
    q.pos0 = r.n_past;
    auto table = _kv->block_table(r.seq);
    q.block_table.assign(table.begin(), table.end());
    q.logits_rows = last ? 1 + uint32_t(drafts.size()) : 0;
    // The summaries' tempered normaliser is for the temperature this request samples at.
    if (q.logits_rows > 0 && r.smp) q.temperature = r.smp->params().temperature;
    q.hidden = hidden_for(r, n_tokens);
    s.seqs.push_back(std::move(q));
    f.seqs.push_back(
        {r.seq, n_tokens, s.seqs.back().logits_rows, s.seqs.back().hidden, std::move(drafts)});
    if (!r.started) {
        r.started = true;
        r.first_step = clock::now();
    }
    // Prompt positions are prefill, the generated ones decode (net fault points).
    reach_phase(r, r.n_past < r.n_prompt ? request_phase::prefill : request_phase::decode);
}

namespace {

gpu::step_phase phase_of(const gpu::step& s) {
    using gpu::step_phase;
    bool prefill = false, decode = false;
    for (const auto& q : s.seqs) {
        if (q.logits_rows > 1) return step_phase::verify;
        (q.tokens.size() > 1 ? prefill : decode) = true;
    }
    return prefill && decode ? step_phase::mixed
           : prefill         ? step_phase::prefill
                             : step_phase::decode;
}

}  // namespace

// Numbers a planned step and records it as the one in flight (nothing when it is empty).
std::optional<gpu::step> scheduler_core::launch(gpu::step s, in_flight_step f) {
    if (s.seqs.empty()) return std::nullopt;
    s.step_id = f.step_id = _next_step++;
    s.phase = phase_of(s);
    // The rows' summaries cover what can be sampled: the tokenizer's vocabulary.
    s.sample_vocab = static_cast<uint32_t>(_tok->vocab().size());
    _in_flight = std::move(f);
    return s;
}

std::optional<gpu::step> scheduler_core::plan_isolated() {
    std::vector<seq_id> group = std::move(_isolation.front());
    _isolation.pop_front();
    gpu::step s;
    in_flight_step f;
    f.isolated = true;
    std::vector<seq_id> in_step;
    uint32_t budget = _opt.max_batch_tokens;
    for (seq_id seq : group) {
        request_state* r = find(seq);
        if (r == nullptr || r->ph != phase::running || budget == 0) continue;
        if (s.seqs.size() >= _rows_max || !admit(*r)) continue;
        uint32_t n = std::min<uint32_t>(uint32_t(r->tokens.size()) - r->n_past, budget);
        if (!reserve_or_preempt(*r, r->n_past + n, in_step)) continue;
        add_to_step(*r, n, s, f);
        in_step.push_back(seq);
        budget -= n;
    }
    return launch(std::move(s), std::move(f));
}

std::optional<gpu::step> scheduler_core::plan_batch() {
    gpu::step s;
    in_flight_step f;
    std::vector<seq_id> in_step;
    uint32_t budget = _opt.max_batch_tokens;
    // Logits rows past one per sequence (drafts): every sequence counts as one row against
    // rows_max, whether it asks for logits or not.
    uint32_t draft_rows = 0;
    auto rows_left = [&] {
        return _rows_max - std::min<uint32_t>(_rows_max, uint32_t(s.seqs.size()) + draft_rows);
    };
    // Decodes first (with their drafts when they speculate), then prefill chunks: one pass
    // each over a snapshot (preemption edits _running).
    for (bool decodes : {true, false}) {
        std::vector<seq_id> order = _running;
        for (seq_id seq : order) {
            request_state* r = find(seq);
            if (r == nullptr || r->ph != phase::running) continue;
            if (std::find(in_step.begin(), in_step.end(), seq) != in_step.end()) continue;
            if (budget == 0 || rows_left() == 0) break;
            if (!admit(*r)) continue;
            uint32_t pending = uint32_t(r->tokens.size()) - r->n_past;
            if (decodes != (pending == 1)) continue;
            uint32_t n = std::min(pending, budget);
            std::vector<int32_t> drafts;
            if (decodes) drafts = draft_for(*r, draft_room(*r, budget, rows_left()));
            // Drafts never preempt anyone: without room for them the sequence decodes plainly.
            if (!drafts.empty() &&
                !_kv->reserve(r->seq, r->n_past + n + uint32_t(drafts.size())).ok()) {
                drafts.clear();
            }
            if (drafts.empty() && !reserve_or_preempt(*r, r->n_past + n, in_step)) continue;
            const auto extra = uint32_t(drafts.size());
            add_to_step(*r, n, s, f, std::move(drafts));
            in_step.push_back(seq);
            budget -= n + extra;
            draft_rows += extra;
        }
    }
    // Admission from the queue, oldest first, while there is room.
    while (!_queue.empty() && budget > 0 &&
           _running.size() + _restoring.size() < _opt.max_sequences && rows_left() > 0) {
        request_state& r = *find(_queue.front());

        if (!admit(r)) break;
        if (wants_disk(r)) {
            // More full blocks may be on disk than in memory: ask the kv actor first; the
            // request runs once it answers (scheduler_kv.cpp).
            _queue.pop_front();
            start_disk_lookup(r);
            continue;
        }
        uint32_t n = std::min<uint32_t>(uint32_t(r.tokens.size()) - r.n_past, budget);
        if (!_kv->reserve(r.seq, r.n_past + n).ok()) {
            // Not enough KV for its first chunk: it waits, holding nothing.
            assert(r.in_kv && "admitted");
            free_kv(r);
            r.n_past = 0;
            break;
        }
        _queue.pop_front();
        r.ph = phase::running;
        _running.push_back(r.seq);
        add_to_step(r, n, s, f);
        in_step.push_back(r.seq);
        budget -= n;
    }
    plan_decode_steps(s, f);
    return launch(std::move(s), std::move(f));
}

// Several decode iterations in one step (gpu::step::decode_steps: the gpu actor's worker draws
// each sequence's next token and runs it at the next position without the host in between,
// which leaves the GPU idle between steps for the fence's wake-up, four thread hops, sampling,
// events and planning), only where that changes nothing a client sees but when its tokens
// arrive:
//   - every sequence in the step decodes one token of a request without a penalty, a grammar
//     or drafts: its draws depend only on each row and its generator, so a copy of its sampler
//     (gpu::step_seq::draw) draws on the worker what its own draws here after the step (which
//     checks they agree); a sampled draw that needs a row of which only the summary is kept
//     ends the step early there (gpu::step_draws);
//   - every running sequence is in the step, no request waits for the disk and none waits in
//     the queue with a sequence free for it: nobody who could start waits for the longer step.
//     A request queued while every sequence is busy starts when one ends, which a step ends
//     no later than where a request reaches its max_tokens (below) or draws an end of
//     generation (gpu::step::end_tokens); one that ends at a stop string frees its sequence at
//     the step's end, up to decode_steps - 1 iterations late. A request that arrives with a
//     sequence free during such a step ends it after the iteration running
//     (take_decode_steps_end);
//   - no iteration runs past a sequence's max_tokens or its context, and every iteration's rows
//     fit a logits slot (device_ready::decode_rows_max: where steps come with row summaries, the
//     earlier iterations keep only those, and every sequence the scheduler runs fits; without
//     them, rows_max rows: small batches, where the host's share of a step is largest).
// A sequence that ends at an earlier iteration (end of generation, a stop string) wastes the
// later ones' compute; their KV lands in its own tail blocks, freed with it.
void scheduler_core::plan_decode_steps(gpu::step& s, in_flight_step& f) {
    if (_opt.decode_steps <= 1 || s.seqs.empty() || queued_request_has_a_sequence() ||
        !_restoring.empty() || s.seqs.size() != _running.size()) {
        return;
    }
    uint64_t k = std::min<uint64_t>(_opt.decode_steps, _decode_rows_max / s.seqs.size());
    for (const planned& p : f.seqs) {
        const request_state& r = *find(p.seq);
        if (p.n_tokens != 1 || p.logits_rows != 1 || !p.drafts.empty() ||
            p.hidden != gpu::hidden_output::none || r.embed || r.grammar || !r.smp ||
            !r.smp->draws_ahead() || r.cancel_requested) {
            return;
        }
        k = std::min<uint64_t>(k, r.params.max_tokens - r.generated.size());
        k = std::min<uint64_t>(k, n_ctx() - r.tokens.size());
    }
    if (k <= 1) return;
    // The positions of every iteration; without room for them (the pool is nearly full) the step
    // runs one (what was reserved serves the sequences' next steps).
    for (const planned& p : f.seqs) {
        const request_state& r = *find(p.seq);
        if (!_kv->reserve(r.seq, r.n_past + uint32_t(k)).ok()) return;
    }
    for (gpu::step_seq& q : s.seqs) {
        auto table = _kv->block_table(q.seq_id);
        q.block_table.assign(table.begin(), table.end());
        const sampler& smp = *find(q.seq_id)->smp;
        const sampling_params& p = smp.params();
        if (p.temperature != 0.0f) {
            const auto state = smp.rng_state();
            q.draw = {p.temperature, p.top_k, p.top_p, p.min_p, {state.begin(), state.end()}};
        }
    }
    s.decode_steps = f.decode_steps = uint32_t(k);
    // A request waits for a busy sequence: a sequence whose draw ends its request (the vocab's
    // end of generation) ends the step there, so the request starts at the next iteration.
    const auto& eog = _tok->vocab().eog();
    if (!_queue.empty() && eog.size() <= gpu::end_tokens_max) {
        s.end_tokens.assign(eog.begin(), eog.end());
    }
}

std::optional<uint64_t> scheduler_core::take_decode_steps_end() {
    if (!_in_flight || _in_flight->decode_steps <= 1 || _in_flight->end_asked) return std::nullopt;
    const bool admissible = queued_request_has_a_sequence();
    const bool cancelled =
        std::any_of(_in_flight->seqs.begin(), _in_flight->seqs.end(), [&](const planned& p) {
            const request_state* r = find(p.seq);
            return r == nullptr || r->cancel_requested;
        });
    if (!admissible && !cancelled) return std::nullopt;
    _in_flight->end_asked = true;
    _counters.decode_steps_ends_asked++;
    return _in_flight->step_id;
}

}  // namespace ordo::sched
