// scheduler_core.cpp: construction, the client ops (generate admission, cancel, tokenize,
// detokenize, stats, model) and lookups. Planning is in scheduler_plan.cpp, step outcomes and
// terminal events in scheduler_outcomes.cpp.
#include "scheduler/scheduler_core.hpp"

#include <algorithm>
#include <cassert>
#include <random>

#include "grammar/tool_calls.hpp"

namespace ordo::sched {

using door::errc;

door::request_error error_event(uint64_t conn, uint64_t id, errc code, std::string message) {
    return door::request_error{conn, id, code, std::move(message)};
}

result<scheduler_core> scheduler_core::create(const core_options& options,
                                              const model::tokenizer* tokenizer, model_info info) {
    if (tokenizer == nullptr) return make_error("internal", "scheduler needs a tokenizer");
    if (options.n_ctx == 0 || options.max_sequences == 0 || options.max_batch_tokens == 0) {
        return make_error("internal",
                          "scheduler options: n_ctx, max_sequences and "
                          "max_batch_tokens must be > 0");
    }
    return scheduler_core(options, tokenizer, std::move(info));
}

scheduler_core::scheduler_core(const core_options& o, const model::tokenizer* t, model_info info)
    : _opt(o), _tok(t), _info(std::move(info)) {
    _seed_state = o.unseeded_source;
    if (_seed_state == 0) {
        // std::random_device reads the OS's entropy (getrandom on Linux); the clock is mixed in
        // so that even a device that returned a constant would not repeat across starts.
        std::random_device rd;
        _seed_state = (uint64_t(rd()) << 32 | rd()) ^
                      uint64_t(std::chrono::system_clock::now().time_since_epoch().count());
    }
}

uint64_t scheduler_core::fresh_seed() {
    return splitmix64_next(_seed_state);
}

scheduler_core::request_state* scheduler_core::find(seq_id seq) {
    auto it = _requests.find(seq);
    return it == _requests.end() ? nullptr : &it->second;
}

scheduler_core::request_state* scheduler_core::find(uint64_t conn, uint64_t id) {
    auto it = _by_client.find({conn, id});
    return it == _by_client.end() ? nullptr : find(it->second);
}

bool scheduler_core::fits_pool(uint64_t tokens) const {
    const auto& c = _kv->config();
    return (tokens + c.block_tokens - 1) / c.block_tokens <= c.n_blocks;
}

std::string scheduler_core::pool_message(uint64_t tokens) const {
    const auto& c = _kv->config();
    return "prompt + max_tokens (" + std::to_string(tokens) + " tokens) exceeds the KV pool (" +
           std::to_string(c.n_blocks) + " blocks of " + std::to_string(c.block_tokens) +
           " tokens; raise gpu.kv_memory_bytes)";
}

std::pair<door::health_status, std::string> scheduler_core::health() const {
    if (_device_unavailable) return {door::health_status::degraded, _unavailable_reason};
    if (!_device_ready) {
        std::string what =
            _counters.device_epochs == 0 ? "starting the gpu device" : "rebuilding the gpu device";
        return {door::health_status::loading,
                _build_progress.empty() ? what : what + ": " + _build_progress};
    }
    // Persistence off after a disk fault: still ok (serving goes on); the reason says why.
    return {door::health_status::ok, _kv_reason};
}

kv_blocks_stats scheduler_core::kv_stats() const {
    return _kv ? _kv->stats() : kv_blocks_stats{};
}

// ---- ops ------------------------------------------------------------------------------------

result<std::vector<int32_t>> scheduler_core::prompt_tokens(const generate_request& g) const {
    if (!g.prompt) {
        for (int32_t t : g.tokens) {
            if (!_tok->vocab().valid(t)) {
                return make_error("bad_request", "tokens: id " + std::to_string(t) +
                                                     " is outside the vocabulary (size " +
                                                     std::to_string(_tok->vocab().size()) + ")");
            }
        }
        if (g.tokens.empty()) return make_error("bad_request", "tokens: the prompt is empty");
        return g.tokens;
    }
    std::vector<int32_t> ids =
        g.chat ? chat_tokens(*g.prompt) : _tok->encode(*g.prompt, true, g.special);
    if (ids.empty()) return make_error("bad_request", "prompt: the prompt is empty");
    return ids;
}

std::vector<int32_t> scheduler_core::chat_tokens(const std::string& text) const {
    const auto& v = _tok->vocab();
    std::vector<int32_t> ids = _tok->encode(text, false, true);
    // Templates such as Llama 3's write BOS themselves; one BOS, never two.
    if (v.add_bos() && v.bos() != model::k_no_token && (ids.empty() || ids[0] != v.bos())) {
        ids.insert(ids.begin(), v.bos());
    }
    return ids;
}

door::request_error scheduler_core::draining_refusal(uint64_t conn, uint64_t id) const {
    return error_event(conn, id, errc::shutting_down,
                       "the server is stopping (draining in-flight requests)");
}

std::optional<door::request_error> scheduler_core::refusal_at_admission(uint64_t conn,
                                                                        uint64_t id) {
    if (_draining) return draining_refusal(conn, id);
    if (find(conn, id) != nullptr) {
        // The front door refuses live ids; a second request under one would break the index.
        return error_event(conn, id, errc::internal,
                           "request id " + std::to_string(id) + " is live");
    }
    if (_device_unavailable) {
        return error_event(conn, id, errc::gpu_unavailable, _unavailable_reason);
    }
    return std::nullopt;
}

void scheduler_core::on_generate(const generate& m, std::vector<outgoing_event>& out) {
    const generate_request& g = m.params;
    if (auto refused = refusal_at_admission(m.conn, m.id)) return out.push_back(*refused);
    // Text in (a prompt) or text matched (stop strings) needs the tokenizer; ids do not.
    const char* needs_text = g.prompt ? "a text prompt" : !g.stop.empty() ? "stop strings" : "";
    if (!_tok->support() && *needs_text != '\0') {
        return out.push_back(tokenizer_error(m.conn, m.id, needs_text));
    }
    auto ids = prompt_tokens(g);
    if (!ids.ok())
        return out.push_back(error_event(m.conn, m.id, errc::bad_request, ids.err().message));
    uint64_t need = ids->size() + uint64_t(g.max_tokens);
    if (need > n_ctx()) {
        return out.push_back(
            error_event(m.conn, m.id, errc::context_exceeded,
                        "prompt (" + std::to_string(ids->size()) + " tokens) + max_tokens (" +
                            std::to_string(g.max_tokens) + ") exceeds the context of " +
                            std::to_string(n_ctx()) + " tokens"));
    }
    if (_kv && !fits_pool(need)) {
        return out.push_back(error_event(m.conn, m.id, errc::context_exceeded, pool_message(need)));
    }
    if (g.session && _sessions.count(*g.session) != 0) {
        _counters.session_busy++;
        return out.push_back(error_event(m.conn, m.id, errc::session_busy,
                                         "session " + *g.session +
                                             " is used by a live request; send the next turn "
                                             "after its terminal event"));
    }
    if (_queue.size() >= _opt.max_queue) {
        _counters.overloaded++;
        return out.push_back(error_event(
            m.conn, m.id, errc::overloaded,
            "the queue is full (scheduler.max_queue = " + std::to_string(_opt.max_queue) + ")"));
    }
    // A request without a seed samples afresh; the seed drawn is reported (done.seed) so the
    // answer can be reproduced by sending it.
    sampling_params sampling = g.sampling;
    if (!g.seed_given) sampling.seed = fresh_seed();
    auto smp = sampler::create(sampling);
    auto stops = stop_matcher::create(g.stop);
    if (!smp.ok() || !stops.ok()) {
        const error& e = !smp.ok() ? smp.err() : stops.err();
        return out.push_back(error_event(m.conn, m.id, errc::bad_request, e.message));
    }
    std::optional<grammar_constraint> constraint;
    if (g.grammar) {
        auto c = make_grammar(*g.grammar, g.grammar_triggers);
        if (!c) return out.push_back(error_event(m.conn, m.id, errc::bad_request, c.err().message));
        constraint.emplace(std::move(*c));
    }
    seq_id seq = _next_seq++;
    request_state& r = _requests[seq];
    r.conn = m.conn;
    r.id = m.id;
    r.seq = seq;
    r.params = g;
    r.params.sampling.seed = sampling.seed;
    r.smp.emplace(std::move(*smp));
    r.grammar = std::move(constraint);
    r.stops.emplace(std::move(*stops));
    if (_tok->support()) r.decoder.emplace(*_tok, g.special);  // else the text fields stay empty
    r.tokens = std::move(*ids);
    r.n_prompt = static_cast<uint32_t>(r.tokens.size());
    r.submitted = clock::now();
    r.speculating = _opt.speculative.mode != config::speculative_mode::off && g.speculative;
    r.draft_len = _opt.speculative.draft_tokens_max;
    _by_client[{m.conn, m.id}] = seq;
    if (g.session) _sessions[*g.session] = seq;
    _queue.push_back(seq);
    _counters.requests++;
    _counters.prompt_tokens += r.n_prompt;
    reach_phase(r, request_phase::queued);
}

result<grammar_constraint> scheduler_core::make_grammar(const std::string& source,
                                                        const std::vector<std::string>& triggers) {
    if (!_tok->support()) {
        return make_error("bad_request",
                          "\"grammar\" needs the model's tokenizer, which ordo "
                          "does not support for this model");
    }
    if (!_grammar_vocab) {
        const model::vocab& v = _tok->vocab();
        std::vector<std::string> pieces(v.size());
        std::vector<int32_t> eog;
        for (size_t t = 0; t < v.size(); ++t) {
            const auto id = static_cast<model::token_id>(t);
            if (v.is_eog(id)) eog.push_back(id);
            pieces[t] = _tok->token_bytes(id, false);
            // A tool-call marker that is a control token is how the model writes the marker:
            // a grammar's literal "<tool_call>" allows it (grammar/tool_calls.hpp).
            if (v.type(id) == model::token_type::control &&
                std::find(grammar::tool_call_markers.begin(), grammar::tool_call_markers.end(),
                          v.piece(id)) != grammar::tool_call_markers.end()) {
                pieces[t] = v.piece(id);
            }
        }
        _grammar_vocab = std::make_unique<grammar_vocab>(std::move(pieces), std::move(eog));
    }
    auto c = grammar_constraint::create(source, *_grammar_vocab, triggers);
    if (!c) return make_error("bad_request", "\"grammar\": " + c.err().message);
    return c;
}

status scheduler_core::arm_net_fault(const fault_spec& spec) {
    if (_net_armed.size() >= net_faults_armed_max) {
        return make_error("bad_request",
                          "net faults armed at most: " + std::to_string(net_faults_armed_max));
    }
    _net_armed.push_back(spec);
    return {};
}

void scheduler_core::reach_phase(request_state& r, request_phase phase) {
    const auto bit = static_cast<std::size_t>(phase);
    if (r.phases_reached.test(bit)) return;
    r.phases_reached.set(bit);
    if (_net_armed.empty()) return;
    for (auto it = _net_armed.begin(); it != _net_armed.end(); ++it) {
        if (it->net_phase != phase) continue;
        _net_fired.push_back(door::net_fault{r.conn, it->kind, it->delay_ms});
        _counters.net_faults++;
        if (--it->count == 0) _net_armed.erase(it);
        return;  // one fault per request and phase
    }
}

void scheduler_core::on_cancel(const cancel& m, std::vector<outgoing_event>& out) {
    request_state* r = find(m.conn, m.target);
    bool live = r != nullptr && !r->cancel_requested;
    if (live) {
        _counters.cancels++;
        r->cancel_requested = true;
        // A request inside the running step ends when that step's outcome is applied (F2).
        if (!_in_flight || std::none_of(_in_flight->seqs.begin(), _in_flight->seqs.end(),
                                        [&](const planned& p) { return p.seq == r->seq; })) {
            finish(*r, door::finish_reason::cancelled, out);
        }
    }
    out.push_back(door::cancel_done{m.conn, m.id, live});
}

void scheduler_core::on_client_gone(const client_gone& m, std::vector<outgoing_event>& out) {
    std::vector<seq_id> gone;
    for (auto it = _by_client.lower_bound({m.conn, 0});
         it != _by_client.end() && it->first.first == m.conn; ++it) {
        gone.push_back(it->second);
    }
    for (seq_id seq : gone) {
        request_state& r = *find(seq);
        r.client_gone = true;
        r.cancel_requested = true;
        _counters.disconnects++;
        bool stepping = _in_flight && std::any_of(_in_flight->seqs.begin(), _in_flight->seqs.end(),
                                                  [&](const planned& p) { return p.seq == seq; });
        if (!stepping) finish(r, door::finish_reason::cancelled, out);
    }
}

door::request_error scheduler_core::tokenizer_error(uint64_t conn, uint64_t id,
                                                    const std::string& what) const {
    return error_event(conn, id, errc::tokenizer_unsupported,
                       what + " needs the tokenizer: " + _tok->support().err().message);
}

void scheduler_core::on_tokenize(const tokenize& m, std::vector<outgoing_event>& out) {
    if (!_tok->support()) return out.push_back(tokenizer_error(m.conn, m.id, "tokenize"));
    if (m.chat) {
        return out.push_back(door::tokenize_done{m.conn, m.id, chat_tokens(m.text), m.text});
    }
    const auto& v = _tok->vocab();
    bool add_bos = m.add_bos.value_or(v.add_bos());
    std::vector<int32_t> ids = _tok->encode(m.text, false, m.special);
    if (add_bos && v.bos() != model::k_no_token) ids.insert(ids.begin(), v.bos());
    out.push_back(door::tokenize_done{m.conn, m.id, std::move(ids), std::nullopt});
}

void scheduler_core::on_detokenize(const detokenize& m, std::vector<outgoing_event>& out) {
    if (!_tok->support()) return out.push_back(tokenizer_error(m.conn, m.id, "detokenize"));
    auto text = _tok->decode(m.tokens, m.special);
    if (!text.ok())
        return out.push_back(error_event(m.conn, m.id, errc::bad_request, text.err().message));
    out.push_back(door::detokenize_done{m.conn, m.id, std::move(text.value())});
}

void scheduler_core::on_stats(const stats_query& m, std::vector<outgoing_event>& out) {
    const auto& k = _counters;
    kv_blocks_stats kv = kv_stats();
    door::stats_done d{m.conn, m.id, {}};
    door::stats_report& r = d.stats;
    r.active_sequences = _running.size();
    r.queued_requests = _queue.size();
    r.kv_blocks_used = kv.blocks_used;
    r.kv_blocks_free = kv.blocks_free + kv.blocks_cached;
    r.net = m.net;
    r.http = m.http;
    r.scheduler = {{"requests", k.requests},
                   {"tokens_generated", k.tokens_generated},
                   {"candidate_draws", k.candidate_draws},
                   {"decode_iterations_ahead", k.decode_iterations_ahead},
                   {"decode_steps_ended_early", k.decode_steps_ended_early},
                   {"decode_steps_ends_asked", k.decode_steps_ends_asked},
                   {"prompt_tokens", k.prompt_tokens},
                   {"cached_tokens", k.cached_tokens},
                   {"cancels", k.cancels},
                   {"disconnects", k.disconnects},
                   {"failures", k.failures},
                   {"retries", k.retries},
                   {"gpu_failed", k.gpu_failed},
                   {"preemptions", k.preemptions},
                   {"overloaded", k.overloaded},
                   {"steps", k.steps},
                   {"device_epochs", k.device_epochs},
                   {"handler_errors", k.handler_errors},
                   {"disk_lookups", k.disk_lookups},
                   {"disk_hits", k.disk_hits},
                   {"disk_restores", k.disk_restores},
                   {"disk_restored_tokens", k.disk_restored_tokens},
                   {"disk_restore_failures", k.disk_restore_failures},
                   {"disk_restore_timeouts", k.disk_restore_timeouts},
                   {"session_delete_timeouts", k.session_delete_timeouts},
                   {"session_delete_late_answers", k.session_delete_late_answers},
                   {"disk_invalidations", k.disk_invalidations},
                   {"disk_saves", k.disk_saves},
                   {"disk_evicted", k.disk_evicted},
                   {"session_busy", k.session_busy},
                   {"net_faults", k.net_faults},
                   {"embeddings", k.embeddings},
                   {"embedding_tokens", k.embedding_tokens},
                   {"spec_rounds", k.spec_rounds},
                   {"spec_drafted_tokens", k.spec_drafted},
                   {"spec_accepted_tokens", k.spec_accepted},
                   {"spec_draft_rounds", k.spec_draft_rounds},
                   {"spec_draft_rounds_failed", k.spec_draft_rounds_failed}};
    for (size_t i = 0; i < k.spec_fallbacks.size(); i++) {
        r.scheduler["spec_fallbacks_" + std::string(spec_fallback_names[i])] = k.spec_fallbacks[i];
    }
    r.kv = {{"blocks_total", kv.blocks_total}, {"blocks_used", kv.blocks_used},
            {"blocks_free", kv.blocks_free},   {"blocks_cached", kv.blocks_cached},
            {"prefix_hits", kv.hits},          {"prefix_misses", kv.misses},
            {"evictions", kv.evictions},       {"pins", kv.pins}};
    r.device = _gpu.device;
    r.epoch = _gpu.epoch;
    r.steps = _gpu.steps;
    r.busy_ms = _gpu.busy_ms;
    r.step_wall_ms = _gpu.step_wall_ms;
    r.between_steps_ms = _gpu.between_steps_ms;
    r.back_to_back_steps = _gpu.back_to_back_steps;
    r.run_ms = _gpu.run_ms;
    r.segments = _gpu.segments;
    r.segments_replayed = _gpu.segments_replayed;
    r.timeouts = _gpu.timeouts;
    r.device_lost = _gpu.device_lost;
    r.nan_logits = _gpu.nan_logits;
    r.other_failures = _gpu.other_failures;
    r.histograms = {{"time_to_first_token_seconds", _histograms.ttft},
                    {"inter_token_seconds", _histograms.inter_token},
                    {"request_duration_seconds", _histograms.duration},
                    {"prompt_tokens", _histograms.prompt_tokens},
                    {"completion_tokens", _histograms.completion_tokens},
                    {"spec_acceptance_rate", _histograms.spec_acceptance},
                    {"spec_draft_round_seconds", _histograms.spec_draft_round}};
    out.push_back(std::move(d));
}

void scheduler_core::on_model(const model_info_query& m, std::vector<outgoing_event>& out) {
    const auto& i = _info;
    const auto& v = _tok->vocab();
    door::model_done d{m.conn, m.id, {}};
    door::model_report& r = d.model;
    r.architecture = i.architecture;
    r.path = i.path;
    r.fingerprint = i.fingerprint;
    r.weight_type = i.weight_type;
    r.tensor_types = i.tensor_types;
    r.n_vocab = i.n_vocab, r.n_ctx_train = i.n_ctx, r.context = n_ctx();
    r.context_bound = n_ctx_bound();
    r.weights_device_bytes = _weight_bytes, r.kv_device_bytes = _kv_bytes;
    r.max_sequences = _opt.max_sequences, r.max_batch_tokens = _opt.max_batch_tokens;
    r.tokenizer = v.describe();
    r.tokenizer_supported = _tok->support().ok();
    r.chat_template = _info.chat_template;
    r.n_embd = i.n_embd, r.n_layer = i.n_layer, r.n_head = i.n_head;
    r.n_head_kv = i.n_head_kv, r.n_ff = i.n_ff;
    r.bos_token = v.bos(), r.eos_token = v.eos();
    r.eog_tokens = v.eog();
    r.generated = i.generated;
    r.hint = i.hint;
    r.gpu = _gpu.device;
    const auto& spec = _opt.speculative;
    r.speculative.mode = std::string(config::to_string(spec.mode));
    if (spec.mode == config::speculative_mode::draft) {
        r.speculative.draft_model = spec.draft_model;
        r.speculative.draft_ready = _drafter_ready;
        r.speculative.draft_reason = _drafter_reason;
    }
    out.push_back(std::move(d));
}

void scheduler_core::abort_request(uint64_t conn, uint64_t id, const std::string& why,
                                   std::vector<outgoing_event>& out) {
    _counters.handler_errors++;
    if (request_state* r = find(conn, id); r != nullptr) {
        bool stepping =
            _in_flight && std::any_of(_in_flight->seqs.begin(), _in_flight->seqs.end(),
                                      [&](const planned& p) { return p.seq == r->seq; });
        if (!stepping) {
            remove(*r);
        } else {
            // It stays until its step's outcome is applied, silent, and its id is free for the
            // client's next request (which may reuse it once it has this error).
            r->client_gone = true;
            r->cancel_requested = true;
            r->detached = true;
            _by_client.erase({conn, id});
        }
    }
    out.push_back(error_event(conn, id, errc::internal, "the request failed: " + why));
}

}  // namespace ordo::sched
