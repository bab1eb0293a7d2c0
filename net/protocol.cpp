// protocol.cpp: see protocol.hpp.
#include "net/protocol.hpp"

#include <cassert>

#include "net/request_fields.hpp"

namespace ordo::net {
namespace {

bool key_is(const msgpack::object_kv& kv, std::string_view name) {
    return kv.key.type == msgpack::type::STR &&
           std::string_view(kv.key.via.str.ptr, kv.key.via.str.size) == name;
}

using fields::type_name;

void pack_token(msgpack::packer<msgpack::sbuffer>& pk, const door::token_info& t, uint64_t id) {
    bool top = t.top_logprobs.has_value();
    pk.pack_map(top ? 6 : 5);
    pk.pack("id"), pk.pack(id);
    pk.pack("event"), pk.pack("token");
    pk.pack("token"), pk.pack(t.token);
    pk.pack("text"), pk.pack(t.text);
    pk.pack("logprob"), pk.pack(wire_f64{t.logprob});
    if (top) {
        pk.pack("top_logprobs");
        pk.pack_array(uint32_t(t.top_logprobs->size()));
        for (const auto& e : *t.top_logprobs) {
            pk.pack_map(3);
            pk.pack("token"), pk.pack(e.token);
            pk.pack("text"), pk.pack(e.text);
            pk.pack("logprob"), pk.pack(wire_f64{e.logprob});
        }
    }
}

}  // namespace

std::variant<request, envelope_error> parse_envelope(const msgpack::object& frame) {
    if (frame.type != msgpack::type::MAP) {
        return envelope_error{
            0, true,
            make_error("bad_frame", "a request must be a msgpack map, got " + type_name(frame))};
    }
    const msgpack::object* id = nullptr;
    const msgpack::object* op = nullptr;
    for (uint32_t i = 0; i < frame.via.map.size; i++) {
        const auto& kv = frame.via.map.ptr[i];
        if (key_is(kv, "id")) id = &kv.val;
        if (key_is(kv, "op")) op = &kv.val;
    }
    if (id == nullptr || id->type != msgpack::type::POSITIVE_INTEGER || id->via.u64 == 0) {
        std::string why = id == nullptr
                              ? "the request has no \"id\""
                              : "\"id\" must be an unsigned integer > 0, got " + type_name(*id);
        return envelope_error{0, true, make_error("bad_frame", why)};
    }
    request r;
    r.id = id->via.u64;
    r.map = &frame;
    if (op == nullptr || op->type != msgpack::type::STR) {
        std::string why = op == nullptr ? "the request has no \"op\""
                                        : "\"op\" must be a string, got " + type_name(*op);
        return envelope_error{r.id, false, make_error("bad_request", why)};
    }
    r.op.assign(op->via.str.ptr, op->via.str.size);
    return r;
}

event_writer::event_writer(uint64_t id, std::string_view event) {
    field("id", id);
    field("event", event);
}

void event_writer::key_only(std::string_view key) {
    _body.pack(key);
    _fields++;
}

std::string event_writer::finish() const {
    msgpack::sbuffer header;
    msgpack::packer<msgpack::sbuffer>(header).pack_map(_fields);
    std::string out;
    out.reserve(header.size() + _buffer.size());
    out.append(header.data(), header.size());
    out.append(_buffer.data(), _buffer.size());
    return out;
}

std::string encode_error(uint64_t id, door::errc code, std::string_view message) {
    return event_writer(id, "error")
        .field("code", door::wire_name(code))
        .field("message", message)
        .finish();
}

std::string encode(const door::request_error& e) {
    return encode_error(e.id, e.code, e.message);
}

std::string encode(const door::token_event& e) {
    msgpack::sbuffer buf;
    msgpack::packer<msgpack::sbuffer> pk(buf);
    pack_token(pk, e.token, e.id);
    return std::string(buf.data(), buf.size());
}

std::string encode(const door::generate_done& e) {
    event_writer w(e.id, "done");
    w.field("reason", enum_name(e.reason));
    if (!e.stop.empty()) w.field("stop", e.stop);
    w.field("tokens", e.tokens).field("text", e.text).field("seed", e.seed);
    if (e.logprobs) {
        auto& pk = w.nested("logprobs");
        pk.pack_array(uint32_t(e.logprobs->size()));
        for (const auto& t : *e.logprobs) pack_token(pk, t, e.id);
    }
    auto& u = w.nested("usage");
    u.pack_map(5);
    u.pack("prompt_tokens"), u.pack(e.usage.prompt_tokens);
    u.pack("cached_tokens"), u.pack(e.usage.cached_tokens);
    u.pack("completion_tokens"), u.pack(e.usage.completion_tokens);
    u.pack("prefill_ms"), u.pack(wire_f64{e.usage.prefill_ms});
    u.pack("decode_ms"), u.pack(wire_f64{e.usage.decode_ms});
    return w.finish();
}

std::string encode(const door::tokenize_done& e) {
    event_writer w(e.id, "done");
    if (e.text) w.field("text", *e.text);
    return w.field("tokens", e.tokens).finish();
}

std::string encode(const door::embed_done& e) {
    event_writer w(e.id, "done");
    if (e.cancelled) return w.field("reason", std::string_view("cancelled")).finish();
    w.field("embedding", e.embedding).field("prompt_tokens", e.prompt_tokens);
    return w.field("pooling", e.pooling).finish();
}

std::string encode(const door::detokenize_done& e) {
    return event_writer(e.id, "done").field("text", e.text).finish();
}

std::string encode(const door::cancel_done& e) {
    return event_writer(e.id, "done").field("cancelled", e.cancelled).finish();
}

std::string encode(const door::model_done& e) {
    const door::model_report& m = e.model;
    event_writer w(e.id, "done");
    w.field("architecture", m.architecture).field("path", m.path);
    w.field("fingerprint", m.fingerprint).field("weight_type", m.weight_type);
    w.field("tensor_types", m.tensor_types);
    w.field("n_vocab", m.n_vocab).field("n_ctx_train", m.n_ctx_train).field("context", m.context);
    w.field("context_bound", m.context_bound);
    w.field("n_embd", m.n_embd).field("n_layer", m.n_layer).field("n_head", m.n_head);
    w.field("n_head_kv", m.n_head_kv).field("n_ff", m.n_ff);
    w.field("bos_token", m.bos_token).field("eos_token", m.eos_token);
    w.field("eog_tokens", m.eog_tokens);
    w.field("tokenizer", m.tokenizer).field("tokenizer_supported", m.tokenizer_supported);
    w.field("chat_template", m.chat_template);
    w.field("weights_device_bytes", m.weights_device_bytes);
    w.field("kv_device_bytes", m.kv_device_bytes);
    w.field("max_sequences", m.max_sequences).field("max_batch_tokens", m.max_batch_tokens);
    w.field("generated", m.generated);
    if (m.generated) w.field("hint", m.hint);
    w.field("device", m.gpu.name);
    w.nested("gpu").pack(m.gpu);
    w.nested("speculative").pack(m.speculative);
    return w.finish();
}

std::string encode(const door::stats_done& e) {
    const door::stats_report& s = e.stats;
    event_writer w(e.id, "done");
    w.field("active_sequences", s.active_sequences);
    w.field("queued_requests", s.queued_requests);
    w.field("kv_blocks_used", s.kv_blocks_used);
    w.field("kv_blocks_free", s.kv_blocks_free);
    w.field("logits_slots_held", s.logits_slots_held);
    w.field("rss_bytes", s.rss_bytes);
    w.field("log_lines_dropped", s.log_lines_dropped);
    auto open = s.net.find("connections_open");
    w.field("connections_open", open == s.net.end() ? 0 : open->second);
    w.field("net", s.net);
    if (!s.http.empty()) w.field("http", s.http);  // absent: the HTTP front door is off
    w.field("scheduler", s.scheduler).field("kv", s.kv);
    auto& g = w.nested("gpu");
    g.pack_map(14);
    g.pack("device"), g.pack(s.device);
    g.pack("epoch"), g.pack(s.epoch);
    g.pack("steps"), g.pack(s.steps);
    g.pack("busy_ms"), g.pack(wire_f64{s.busy_ms});
    g.pack("step_wall_ms"), g.pack(wire_f64{s.step_wall_ms});
    g.pack("between_steps_ms"), g.pack(wire_f64{s.between_steps_ms});
    g.pack("back_to_back_steps"), g.pack(s.back_to_back_steps);
    g.pack("run_ms"), g.pack(wire_f64{s.run_ms});
    g.pack("segments"), g.pack(s.segments);
    g.pack("segments_replayed"), g.pack(s.segments_replayed);
    g.pack("timeouts"), g.pack(s.timeouts);
    g.pack("device_lost"), g.pack(s.device_lost);
    g.pack("nan_logits"), g.pack(s.nan_logits);
    g.pack("other_failures"), g.pack(s.other_failures);
    const kv::kv_disk_report& k = s.kv_disk;
    auto& d = w.nested("kv_disk");
    d.pack_map(23);
    d.pack("enabled"), d.pack(k.enabled);
    d.pack("ready"), d.pack(k.ready);
    d.pack("persisting"), d.pack(k.persisting);
    d.pack("reason"), d.pack(k.reason);
    d.pack("files"), d.pack(k.files);
    d.pack("sessions"), d.pack(k.sessions);
    d.pack("bytes"), d.pack(k.bytes);
    d.pack("bytes_budget"), d.pack(k.bytes_budget);
    d.pack("saves"), d.pack(k.saves);
    d.pack("saves_skipped"), d.pack(k.saves_skipped);
    d.pack("save_failures"), d.pack(k.save_failures);
    d.pack("restores"), d.pack(k.restores);
    d.pack("restore_failures"), d.pack(k.restore_failures);
    d.pack("quarantined"), d.pack(k.quarantined);
    d.pack("evictions"), d.pack(k.evictions);
    d.pack("ignored"), d.pack(k.ignored);
    d.pack("probes"), d.pack(k.probes);
    d.pack("save_ms"), d.pack(wire_f64{k.save_ms});
    d.pack("restore_ms"), d.pack(wire_f64{k.restore_ms});
    d.pack("errors"), d.pack(k.errors);
    d.pack("shared"), d.pack(k.shared);
    d.pack("session_reads"), d.pack(k.session_reads);
    d.pack("gone"), d.pack(k.gone);
    if (const door::fault_plan_report& p = s.fault_plan; p.active) {
        auto& f = w.nested("fault_plan");
        f.pack_map(5);
        f.pack("seed"), f.pack(p.seed);
        f.pack("fired"), f.pack(p.fired);
        f.pack("refused"), f.pack(p.refused);
        f.pack("spent"), f.pack(p.spent);
        f.pack("by_kind"), f.pack(p.by_kind);
    }
    auto& h = w.nested("histograms");
    h.pack_map(uint32_t(s.histograms.size()));
    for (const auto& [name, hist] : s.histograms) {
        h.pack(name);
        h.pack_map(4);
        h.pack("bounds");
        h.pack_array(uint32_t(hist.bounds.size()));
        for (double b : hist.bounds) h.pack(wire_f64{b});
        h.pack("counts"), h.pack(hist.counts);
        h.pack("sum"), h.pack(wire_f64{hist.sum});
        h.pack("count"), h.pack(hist.count);
    }
    return w.finish();
}

std::string encode(const door::session_delete_done& e) {
    return event_writer(e.id, "done").field("deleted", e.deleted).finish();
}

std::string encode(const door::fault_done& e) {
    event_writer w(e.id, "done");
    w.field("armed", enum_name(e.armed));
    if (!e.detail.empty()) w.field("detail", e.detail);
    return w.finish();
}

}  // namespace ordo::net
