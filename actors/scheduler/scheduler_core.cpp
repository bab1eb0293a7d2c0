// scheduler_core.cpp: construction, the client ops (generate admission, cancel, tokenize,
// detokenize, stats, model) and lookups. Planning is in scheduler_plan.cpp, step outcomes and
// terminal events in scheduler_outcomes.cpp.
#include "actors/scheduler/scheduler_core.hpp"

#include <cassert>

#include "actors/scheduler/scheduler_events.hpp"
#include "net/protocol.hpp"

namespace ordo::sched {

outgoing_event error_event(uint64_t conn, uint64_t id, std::string_view code,
                           std::string_view message) {
    return {conn, id, true, net::encode_error(id, code, message)};
}

result<scheduler_core> scheduler_core::create(const core_options& options,
                                              const model::tokenizer* tokenizer,
                                              model_info info) {
    if (tokenizer == nullptr) return make_error("internal", "scheduler needs a tokenizer");
    if (options.n_ctx == 0 || options.max_sequences == 0 || options.max_batch_tokens == 0) {
        return make_error("internal", "scheduler options: n_ctx, max_sequences and "
                                      "max_batch_tokens must be > 0");
    }
    return scheduler_core(options, tokenizer, std::move(info));
}

scheduler_core::scheduler_core(const core_options& o, const model::tokenizer* t, model_info info)
    : _opt(o), _tok(t), _info(std::move(info)) {}

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

std::pair<std::string, std::string> scheduler_core::health() const {
    if (_device_unavailable) return {"degraded", _unavailable_reason};
    if (!_device_ready) {
        return {"loading", _counters.device_epochs == 0 ? "starting the gpu device"
                                                          : "rebuilding the gpu device"};
    }
    return {"ok", ""};
}

kv_blocks_stats scheduler_core::kv_stats() const { return _kv ? _kv->stats() : kv_blocks_stats{}; }

// ---- ops ------------------------------------------------------------------------------------

void scheduler_core::on_request(const client_request& m, std::vector<outgoing_event>& out) {
    msgpack::object_handle oh;
    try {
        oh = msgpack::unpack(m.frame.data(), m.frame.size());
    } catch (const std::exception& e) {
        out.push_back(error_event(m.conn, m.id, "internal", "undecodable forwarded frame"));
        return;
    }
    const msgpack::object& frame = oh.get();
    if (m.op == "generate") return op_generate(m, frame, out);
    if (m.op == "cancel") return op_cancel(m, frame, out);
    if (m.op == "tokenize") return op_tokenize(m, frame, out);
    if (m.op == "detokenize") return op_detokenize(m, frame, out);
    if (m.op == "stats") return op_stats(m, out);
    if (m.op == "model") return op_model(m, out);
    out.push_back(error_event(m.conn, m.id, "unknown_op", "unknown op \"" + m.op + "\""));
}

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
    std::vector<int32_t> ids = _tok->encode(*g.prompt, true);
    if (ids.empty()) return make_error("bad_request", "prompt: the prompt is empty");
    return ids;
}

void scheduler_core::op_generate(const client_request& m, const msgpack::object& frame,
                                 std::vector<outgoing_event>& out) {
    request_limits limits;
    limits.max_tokens_default = _opt.max_tokens_default;
    limits.vocab_size = static_cast<uint32_t>(_tok->vocab().size());
    limits.kv_enabled = _opt.kv_enabled;
    auto parsed = parse_generate(frame, limits);
    if (!parsed.ok()) return out.push_back(error_event(m.conn, m.id, parsed.err().code,
                                                       parsed.err().message));
    if (_device_unavailable) {
        return out.push_back(error_event(m.conn, m.id, "gpu_unavailable", _unavailable_reason));
    }
    auto ids = prompt_tokens(*parsed);
    if (!ids.ok()) return out.push_back(error_event(m.conn, m.id, ids.err().code, ids.err().message));
    uint64_t need = ids->size() + uint64_t(parsed->max_tokens);
    if (need > n_ctx()) {
        return out.push_back(error_event(
            m.conn, m.id, "context_exceeded",
            "prompt (" + std::to_string(ids->size()) + " tokens) + max_tokens (" +
                std::to_string(parsed->max_tokens) + ") exceeds the context of " +
                std::to_string(n_ctx()) + " tokens"));
    }
    if (_kv && !fits_pool(need)) {
        return out.push_back(error_event(m.conn, m.id, "context_exceeded", pool_message(need)));
    }
    if (_queue.size() >= _opt.max_queue) {
        _counters.overloaded++;
        return out.push_back(error_event(m.conn, m.id, "overloaded",
                                         "the queue is full (scheduler.max_queue = " +
                                             std::to_string(_opt.max_queue) + ")"));
    }
    auto smp = sampler::create(parsed->sampling);
    auto stops = stop_matcher::create(parsed->stop);
    if (!smp.ok() || !stops.ok()) {
        const error& e = !smp.ok() ? smp.err() : stops.err();
        return out.push_back(error_event(m.conn, m.id, e.code, e.message));
    }
    seq_id seq = _next_seq++;
    request_state& r = _requests[seq];
    r.conn = m.conn;
    r.id = m.id;
    r.seq = seq;
    r.params = std::move(*parsed);
    r.smp.emplace(std::move(*smp));
    r.stops.emplace(std::move(*stops));
    r.decoder.emplace(*_tok);
    r.tokens = std::move(*ids);
    r.n_prompt = static_cast<uint32_t>(r.tokens.size());
    r.submitted = clock::now();
    _by_client[{m.conn, m.id}] = seq;
    _queue.push_back(seq);
    _counters.requests++;
    _counters.prompt_tokens += r.n_prompt;
}

void scheduler_core::op_cancel(const client_request& m, const msgpack::object& frame,
                               std::vector<outgoing_event>& out) {
    auto parsed = parse_cancel(frame);
    if (!parsed.ok()) return out.push_back(error_event(m.conn, m.id, parsed.err().code,
                                                       parsed.err().message));
    request_state* r = find(m.conn, parsed->target);
    bool live = r != nullptr && !r->cancel_requested;
    if (live) {
        _counters.cancels++;
        r->cancel_requested = true;
        // A request inside the running step ends when that step's outcome is applied (F2).
        if (!_in_flight || std::none_of(_in_flight->seqs.begin(), _in_flight->seqs.end(),
                                        [&](const planned& p) { return p.seq == r->seq; })) {
            finish(*r, "cancelled", out);
        }
    }
    out.push_back({m.conn, m.id, true,
                   net::event_writer(m.id, "done").field("cancelled", live).finish()});
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
        if (!stepping) finish(r, "cancelled", out);
    }
}

void scheduler_core::op_tokenize(const client_request& m, const msgpack::object& frame,
                                 std::vector<outgoing_event>& out) {
    auto parsed = parse_tokenize(frame);
    if (!parsed.ok()) return out.push_back(error_event(m.conn, m.id, parsed.err().code,
                                                       parsed.err().message));
    const auto& v = _tok->vocab();
    bool add_bos = parsed->add_bos.value_or(v.add_bos());
    std::vector<int32_t> ids = _tok->encode(parsed->text, false);
    if (add_bos && v.bos() != model::k_no_token) ids.insert(ids.begin(), v.bos());
    out.push_back({m.conn, m.id, true,
                   net::event_writer(m.id, "done").field("tokens", ids).finish()});
}

void scheduler_core::op_detokenize(const client_request& m, const msgpack::object& frame,
                                   std::vector<outgoing_event>& out) {
    request_limits limits;
    limits.vocab_size = static_cast<uint32_t>(_tok->vocab().size());
    auto parsed = parse_detokenize(frame, limits);
    if (!parsed.ok()) return out.push_back(error_event(m.conn, m.id, parsed.err().code,
                                                       parsed.err().message));
    auto text = _tok->decode(parsed->tokens);
    if (!text.ok()) return out.push_back(error_event(m.conn, m.id, "bad_request",
                                                     text.err().message));
    out.push_back({m.conn, m.id, true,
                   net::event_writer(m.id, "done").field("text", text.value()).finish()});
}

void scheduler_core::op_stats(const client_request& m, std::vector<outgoing_event>& out) {
    const auto& k = _counters;
    kv_blocks_stats kv = kv_stats();
    net::event_writer w(m.id, "done");
    w.field("active_sequences", _running.size());
    w.field("queued_requests", _queue.size());
    w.field("kv_blocks_used", kv.blocks_used);
    w.field("kv_blocks_free", kv.blocks_free + kv.blocks_cached);
    w.field("connections_open", m.net.count("connections_open") ? m.net.at("connections_open") : 0);
    w.field("net", m.net);
    w.field("scheduler", std::map<std::string, uint64_t>{
                             {"requests", k.requests},
                             {"tokens_generated", k.tokens_generated},
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
                             {"device_epochs", k.device_epochs}});
    w.field("kv", std::map<std::string, uint64_t>{{"blocks_total", kv.blocks_total},
                                                  {"blocks_used", kv.blocks_used},
                                                  {"blocks_free", kv.blocks_free},
                                                  {"blocks_cached", kv.blocks_cached},
                                                  {"prefix_hits", kv.hits},
                                                  {"prefix_misses", kv.misses},
                                                  {"evictions", kv.evictions}});
    w.nested("gpu").pack(_gpu);
    out.push_back({m.conn, m.id, true, w.finish()});
}

void scheduler_core::op_model(const client_request& m, std::vector<outgoing_event>& out) {
    const auto& i = _info;
    const auto& v = _tok->vocab();
    net::event_writer w(m.id, "done");
    w.field("architecture", i.architecture);
    w.field("path", i.path);
    w.field("fingerprint", i.fingerprint);
    w.field("weight_type", i.weight_type);
    w.field("n_vocab", i.n_vocab).field("n_ctx_train", i.n_ctx).field("context", n_ctx());
    w.field("n_embd", i.n_embd).field("n_layer", i.n_layer).field("n_head", i.n_head);
    w.field("n_head_kv", i.n_head_kv).field("n_ff", i.n_ff);
    w.field("bos_token", v.bos()).field("eos_token", v.eos());
    w.field("generated", i.generated);
    if (i.generated) w.field("hint", i.hint);
    w.field("device", _gpu.device.name);
    w.nested("gpu").pack(_gpu.device);
    out.push_back({m.conn, m.id, true, w.finish()});
}

}  // namespace ordo::sched
