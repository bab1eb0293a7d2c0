// ops.cpp: see ops.hpp; the typed readers are in request_fields.cpp.
#include "net/ops.hpp"

#include <limits>
#include <utility>
#include <vector>

#include "actors/runtime/enum_names.hpp"
#include "actors/runtime/fault_kind.hpp"
#include "door/api_keys.hpp"
#include "grammar/gbnf.hpp"
#include "net/request_fields.hpp"
#include "scheduler/grammar_constraint.hpp"
#include "scheduler/stop_matcher.hpp"

namespace ordo::net {
namespace {

using fields::param_map;
using sched::generate_request;
using sched::sampling_params;

// Bounds of the `fault` op's numbers.
constexpr uint64_t fault_layer_max = 4096;
constexpr uint64_t fault_steps_max = 1000000;
// step_delay: well below the slack of the scheduler's step backstop (watchdog_ms per segment,
// two more, plus 60 s; tools/server/server.cpp), which counts from the step's send and so
// covers the delay too: a delayed step must still be answered by the gpu actor, not failed by
// the backstop. Same bound as gpu::armed_faults::delay_ms_max.
constexpr uint64_t fault_delay_ms_max = 10000;
// mailbox_refuse: enough to outlast a delivery's deadline (10 s at one refused re-offer per
// 2 ms tick is 5,000 refusals), so the give-up path can be driven too; bounded like the rest.
constexpr uint64_t fault_refusals_max = 100000;

bool is_session_char(char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-';
}

// prompt XOR tokens.
status parse_prompt(const param_map& pm, const request_limits& limits, generate_request& out) {
    const msgpack::object* prompt = pm.get("prompt");
    const msgpack::object* tokens = pm.get("tokens");
    if ((prompt == nullptr) == (tokens == nullptr)) {
        return make_error("bad_request", prompt == nullptr
                                             ? "exactly one of \"prompt\" and \"tokens\" is "
                                               "required, got neither"
                                             : "exactly one of \"prompt\" and \"tokens\" is "
                                               "allowed, got both");
    }
    if (prompt != nullptr) {
        auto s = fields::read_string("prompt", *prompt, sched::prompt_bytes_max);
        if (!s) return s.err();
        out.prompt = std::move(*s);
        return {};
    }
    auto ids =
        fields::read_token_ids("tokens", *tokens, sched::prompt_tokens_max, limits.vocab_size);
    if (!ids) return ids.err();
    if (ids->empty()) return fields::bad("tokens", "a non-empty array", "an empty array");
    out.tokens = std::move(*ids);
    return {};
}

// Reads an optional float parameter into `dst`.
status read_float(const param_map& pm, std::string_view key, float& dst) {
    const msgpack::object* o = pm.get(key);
    if (o == nullptr) return {};
    auto v = fields::read_number(key, *o);
    if (!v) return v.err();
    dst = static_cast<float>(*v);
    return {};
}

status parse_sampling(const param_map& pm, generate_request& out) {
    sampling_params& p = out.sampling;
    for (auto [key, dst] : {std::pair<std::string_view, float*>{"temperature", &p.temperature},
                            {"top_p", &p.top_p},
                            {"min_p", &p.min_p},
                            {"repeat_penalty", &p.repeat_penalty},
                            {"presence_penalty", &p.presence_penalty},
                            {"frequency_penalty", &p.frequency_penalty}}) {
        if (auto s = read_float(pm, key, *dst); !s) return s;
    }
    if (const auto* o = pm.get("top_k")) {
        auto v = fields::read_uint("top_k", *o, 0, std::numeric_limits<int32_t>::max());
        if (!v) return v.err();
        p.top_k = static_cast<int32_t>(*v);
    }
    if (const auto* o = pm.get("seed")) {
        auto v = fields::read_uint("seed", *o, 0, std::numeric_limits<uint64_t>::max());
        if (!v) return v.err();
        p.seed = *v;
        out.seed_given = true;
    }
    if (const auto* o = pm.get("logprobs")) {
        auto v = fields::read_uint("logprobs", *o, 0, sched::logprobs_max);
        if (!v) return v.err();
        p.logprobs = static_cast<uint32_t>(*v);
    }
    return sched::validate(p);  // ranges; names the key
}

// A session name: 1..128 bytes of [A-Za-z0-9._-], and only with persisted KV.
result<std::string> read_session(const msgpack::object& o, const request_limits& limits) {
    auto s = fields::read_string("session", o, sched::session_bytes_max);
    if (!s) return s.err();
    if (s->empty()) return fields::bad("session", "1..128 bytes", "an empty string");
    for (char c : *s) {
        if (!is_session_char(c)) {
            return fields::bad("session", "made of [A-Za-z0-9._-]",
                               "a string containing other characters");
        }
    }
    if (!limits.kv_enabled) {
        return make_error("bad_request",
                          "\"session\" needs persisted KV ([kv] enabled = true "
                          "in the server config)");
    }
    return std::move(*s);
}

status parse_session(const param_map& pm, const request_limits& limits, generate_request& out) {
    const msgpack::object* o = pm.get("session");
    if (o == nullptr) return {};
    auto s = read_session(*o, limits);
    if (!s) return s.err();
    out.session = std::move(*s);
    return {};
}

// An optional boolean parameter `name` into `out` (left as it is when absent).
template <typename T>
status read_optional_bool(const param_map& pm, const char* name, T& out) {
    if (const auto* o = pm.get(name)) {
        auto v = fields::read_bool(name, *o);
        if (!v) return v.err();
        out = *v;
    }
    return {};
}

status parse_output_options(const param_map& pm, const request_limits& limits,
                            generate_request& out) {
    out.max_tokens = limits.max_tokens_default;
    if (const auto* o = pm.get("max_tokens")) {
        auto v = fields::read_uint("max_tokens", *o, 1, sched::max_tokens_max);
        if (!v) return v.err();
        out.max_tokens = static_cast<uint32_t>(*v);
    }
    if (const auto* o = pm.get("stop")) {
        auto v =
            fields::read_strings("stop", *o, sched::stop_strings_max, sched::stop_string_bytes_max);
        if (!v) return v.err();
        if (auto s = sched::validate_stop_strings(*v); !s) return s;
        out.stop = std::move(*v);
    }
    if (auto s = read_optional_bool(pm, "stream", out.stream); !s) return s;
    if (auto s = read_optional_bool(pm, "speculative", out.speculative); !s) return s;
    if (const auto* o = pm.get("grammar")) {
        // Its syntax is the scheduler's to check (one parser for both doors); here its size.
        auto v = fields::read_string("grammar", *o, grammar::gbnf_limits{}.source_bytes_max);
        if (!v) return v.err();
        out.grammar = std::move(*v);
    }
    if (const auto* o = pm.get("grammar_triggers")) {
        auto v = fields::read_strings("grammar_triggers", *o, sched::grammar_triggers_max,
                                      sched::grammar_trigger_bytes_max);
        if (!v) return v.err();
        if (!out.grammar)
            return make_error("bad_request", "\"grammar_triggers\" needs a \"grammar\"");
        for (const std::string& t : *v) {
            if (t.empty() || t == "^") {
                return make_error("bad_request", "\"grammar_triggers\": a trigger is a text");
            }
        }
        out.grammar_triggers = std::move(*v);
    }
    return read_optional_bool(pm, "special", out.special);
}

// Everything of generate but the prompt: sampling, output options, session.
status parse_generation(const param_map& pm, const request_limits& limits, generate_request& out) {
    if (auto s = parse_sampling(pm, out); !s) return s;
    if (auto s = parse_output_options(pm, limits, out); !s) return s;
    return parse_session(pm, limits, out);
}

// generate's keys but the prompt's, then chat's own.
#define ORDO_GENERATION_KEYS                                                                      \
    "max_tokens", "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "presence_penalty", \
        "frequency_penalty", "seed", "stop", "logprobs", "stream", "session", "special",          \
        "grammar", "grammar_triggers", "speculative"
#define ORDO_CHAT_KEYS "messages", "tools", "add_generation_prompt", "chat_template_kwargs"

// The rendered conversation of a chat or apply_template request.
result<std::string> rendered_chat(const param_map& pm, const request_limits& limits) {
    auto in = parse_chat_input(pm);
    if (!in) return in.err();
    return render_chat(limits.chat.get(), *in);
}

}  // namespace

result<generate_request> parse_generate(const msgpack::object& frame,
                                        const request_limits& limits) {
    auto pm = param_map::open(frame, {"prompt", "tokens", ORDO_GENERATION_KEYS});
    if (!pm) return pm.err();
    generate_request out;
    if (auto s = parse_prompt(*pm, limits, out); !s) return s.err();
    if (auto s = parse_generation(*pm, limits, out); !s) return s.err();
    return out;
}

// The request is validated whole before the template renders: a bad parameter is bad_request
// whatever the template would do.
result<generate_request> parse_chat(const msgpack::object& frame, const request_limits& limits) {
    auto pm = param_map::open(frame, {ORDO_CHAT_KEYS, ORDO_GENERATION_KEYS});
    if (!pm) return pm.err();
    generate_request out;
    if (auto s = parse_generation(*pm, limits, out); !s) return s.err();
    auto text = rendered_chat(*pm, limits);
    if (!text) return text.err();
    out.prompt = std::move(*text);
    out.chat = true;
    return out;
}

result<sched::tokenize> parse_apply_template(const msgpack::object& frame,
                                             const request_limits& limits) {
    auto pm = param_map::open(frame, {ORDO_CHAT_KEYS});
    if (!pm) return pm.err();
    auto text = rendered_chat(*pm, limits);
    if (!text) return text.err();
    sched::tokenize out;
    out.text = std::move(*text);
    out.chat = true;
    return out;
}

#undef ORDO_GENERATION_KEYS
#undef ORDO_CHAT_KEYS

result<sched::tokenize> parse_tokenize(const msgpack::object& frame) {
    auto pm = param_map::open(frame, {"text", "add_bos", "special"});
    if (!pm) return pm.err();
    sched::tokenize out;
    const msgpack::object* text = pm->get("text");
    if (text == nullptr) return make_error("bad_request", "\"text\" is required");
    auto s = fields::read_string("text", *text, sched::prompt_bytes_max);
    if (!s) return s.err();
    out.text = std::move(*s);
    if (auto st = read_optional_bool(*pm, "add_bos", out.add_bos); !st) return st.err();
    if (auto st = read_optional_bool(*pm, "special", out.special); !st) return st.err();
    return out;
}

result<sched::detokenize> parse_detokenize(const msgpack::object& frame,
                                           const request_limits& limits) {
    auto pm = param_map::open(frame, {"tokens", "special"});
    if (!pm) return pm.err();
    const msgpack::object* tokens = pm->get("tokens");
    if (tokens == nullptr) return make_error("bad_request", "\"tokens\" is required");
    auto ids =
        fields::read_token_ids("tokens", *tokens, sched::prompt_tokens_max, limits.vocab_size);
    if (!ids) return ids.err();
    sched::detokenize out;
    out.tokens = std::move(*ids);
    if (auto st = read_optional_bool(*pm, "special", out.special); !st) return st.err();
    return out;
}

result<sched::embed> parse_embed(const msgpack::object& frame, const request_limits& limits) {
    auto pm = param_map::open(frame, {"input", "tokens"});
    if (!pm) return pm.err();
    const msgpack::object* input = pm->get("input");
    const msgpack::object* tokens = pm->get("tokens");
    if ((input == nullptr) == (tokens == nullptr)) {
        return make_error("bad_request", input == nullptr
                                             ? "exactly one of \"input\" and \"tokens\" is "
                                               "required, got neither"
                                             : "exactly one of \"input\" and \"tokens\" is "
                                               "allowed, got both");
    }
    sched::embed out;
    if (input != nullptr) {
        auto s = fields::read_string("input", *input, sched::prompt_bytes_max);
        if (!s) return s.err();
        if (s->empty()) return fields::bad("input", "a non-empty string", "an empty string");
        out.text = std::move(*s);
        return out;
    }
    auto ids =
        fields::read_token_ids("tokens", *tokens, sched::prompt_tokens_max, limits.vocab_size);
    if (!ids) return ids.err();
    if (ids->empty()) return fields::bad("tokens", "a non-empty array", "an empty array");
    out.tokens = std::move(*ids);
    return out;
}

result<sched::cancel> parse_cancel(const msgpack::object& frame) {
    auto pm = param_map::open(frame, {"target"});
    if (!pm) return pm.err();
    const msgpack::object* target = pm->get("target");
    if (target == nullptr) return make_error("bad_request", "\"target\" is required");
    auto v = fields::read_uint("target", *target, 1, std::numeric_limits<uint64_t>::max());
    if (!v) return v.err();
    sched::cancel out;
    out.target = *v;
    return out;
}

namespace {

// `fault`'s kind as the client named it: the name is kept for the messages that quote it.
struct named_fault_kind {
    fault_kind kind;
    std::string name;
};

// "kind" (required). The kinds are ordo::fault_kind's (one list, also the [fault] plan's): a new
// kind needs no edit here.
result<named_fault_kind> read_fault_kind(const param_map& pm) {
    const msgpack::object* kind = pm.get("kind");
    if (kind == nullptr) return make_error("bad_request", "\"kind\" is required");
    auto k = fields::read_string("kind", *kind, 32);
    if (!k.ok()) return k.err();
    const auto fk = enum_from_name<fault_kind>(*k);
    if (!fk) return fields::bad("kind", enum_names_listed<fault_kind>(), fields::quote(*k));
    return named_fault_kind{*fk, std::move(*k)};
}

// The keys a kind does not take, in the order they are looked for: a step_delay fails nothing
// (no layer), a mailbox_refuse counts pushes, not steps; the kv and draft kinds take only count
// (saves or restores; drafting rounds), and the kv stalls ms; the net kinds take no step's keys,
// and only net_stop_reading takes ms.
std::vector<const char*> fault_keys_not_taken(fault_kind kind) {
    if (kind == fault_kind::step_delay) return {"layer", "actor"};
    if (kind == fault_kind::mailbox_refuse) return {"phase", "layer", "after_steps", "ms"};
    if (is_kv_stall_fault(kind)) return {"phase", "layer", "after_steps", "actor"};
    if (is_kv_fault(kind) || is_draft_fault(kind)) {
        return {"phase", "layer", "after_steps", "ms", "actor"};
    }
    if (kind == fault_kind::net_stop_reading) return {"layer", "after_steps", "actor"};
    if (is_net_fault(kind)) return {"layer", "after_steps", "actor", "ms"};
    return {"ms", "actor"};
}

// A key the kind does not take is refused by name, not ignored.
status refuse_keys_not_taken(const param_map& pm, const named_fault_kind& k) {
    for (const char* key : fault_keys_not_taken(k.kind)) {
        if (pm.get(key) != nullptr) {
            return make_error(
                "bad_request",
                "\"" + std::string(key) + "\" does not apply to kind " + fields::quote(k.name));
        }
    }
    return {};
}

// "phase": a net kind's request phase (required), not a step's; for the other kinds that take
// it, the step phase the fault matches (none: any step).
status read_fault_phase(const param_map& pm, const named_fault_kind& k, sched::fault_spec& f) {
    const bool net_kind = is_net_fault(k.kind);
    const msgpack::object* p = pm.get("phase");
    if (p == nullptr) {
        if (net_kind) {
            return make_error("bad_request", "\"phase\" is required for " + fields::quote(k.name));
        }
        return {};
    }
    auto ph = fields::read_string("phase", *p, 16);
    if (!ph.ok()) return ph.err();
    if (net_kind) {
        const auto rp = enum_from_name<sched::request_phase>(*ph);
        if (!rp) {
            return fields::bad("phase", enum_names_listed<sched::request_phase>(),
                               fields::quote(*ph));
        }
        f.net_phase = *rp;
    } else {
        f.gpu_phase = enum_from_name<gpu::step_phase>(*ph);
        if (!f.gpu_phase) {
            return fields::bad("phase", enum_names_listed<gpu::step_phase>(), fields::quote(*ph));
        }
    }
    return {};
}

// "layer", "after_steps" and "count", each optional; a mailbox_refuse's count is of refusals,
// with a bound of its own.
status read_fault_counts(const param_map& pm, fault_kind kind, sched::fault_spec& f) {
    if (const auto* l = pm.get("layer")) {
        auto v = fields::read_uint("layer", *l, 0, fault_layer_max);
        if (!v.ok()) return v.err();
        f.layer = int32_t(*v);
    }
    if (const auto* a = pm.get("after_steps")) {
        auto v = fields::read_uint("after_steps", *a, 0, fault_steps_max);
        if (!v.ok()) return v.err();
        f.after_steps = uint32_t(*v);
    }
    if (const auto* c = pm.get("count")) {
        const uint64_t count_max =
            kind == fault_kind::mailbox_refuse ? fault_refusals_max : fault_steps_max;
        auto v = fields::read_uint("count", *c, 1, count_max);
        if (!v.ok()) return v.err();
        f.count = uint32_t(*v);
    }
    return {};
}

// "ms" (required): a step_delay's wait before each step, a net_stop_reading's pause, a
// kv_stall_read's wait before each read, a kv_stall_unlink's before each unlink.
status read_fault_delay(const param_map& pm, const named_fault_kind& k, sched::fault_spec& f) {
    const msgpack::object* ms = pm.get("ms");
    if (ms == nullptr) {
        return make_error("bad_request", "\"ms\" is required for " + fields::quote(k.name));
    }
    auto v = fields::read_uint("ms", *ms, 1, fault_delay_ms_max);
    if (!v.ok()) return v.err();
    f.delay_ms = uint32_t(*v);
    return {};
}

// "actor" (required): the actor whose mailbox a mailbox_refuse refuses pushes to.
status read_fault_actor(const param_map& pm, sched::fault_spec& f) {
    const msgpack::object* a = pm.get("actor");
    if (a == nullptr) return make_error("bad_request", "\"actor\" is required for mailbox_refuse");
    auto name = fields::read_string("actor", *a, 16);
    if (!name.ok()) return name.err();
    const auto actor = enum_from_name<sched::fault_actor>(*name);
    if (!actor) {
        return fields::bad("actor", enum_names_listed<sched::fault_actor>(), fields::quote(*name));
    }
    f.actor = *actor;
    return {};
}

}  // namespace

// `fault` {kind, phase?, layer?, after_steps?, count?, ms?, actor?}: the keys a kind does not
// take (fault_keys_not_taken) are refused by name, not ignored. The kv kinds (is_kv_fault:
// kv_enospc, kv_eio, kv_torn_exit, kv_flip_read, kv_stall_read, kv_stall_unlink, kv_fingerprint)
// take only count (the two stalls also ms, required): the scheduler routes them to the kv actor. So
// do the draft kinds (is_draft_fault: draft_fail, draft_garbage, draft_eos; count is drafting
// rounds), which the scheduler arms for itself. The net kinds (is_net_fault: net_fin, net_rst,
// net_stop_reading) take a request phase (queued, prefill, decode; required) and count (requests),
// net_stop_reading also ms; the scheduler fires them. The keys are read in a fixed order (kind, the
// keys not taken, phase, the counts, ms, actor): the first bad one is the one named.
result<sched::fault> parse_fault(const msgpack::object& frame) {
    auto pm =
        param_map::open(frame, {"kind", "phase", "layer", "after_steps", "count", "ms", "actor"});
    if (!pm.ok()) return pm.err();
    auto k = read_fault_kind(*pm);
    if (!k.ok()) return k.err();
    sched::fault out;
    sched::fault_spec& f = out.spec;
    f.kind = k->kind;
    if (auto s = refuse_keys_not_taken(*pm, *k); !s) return s.err();
    if (auto s = read_fault_phase(*pm, *k, f); !s) return s.err();
    if (auto s = read_fault_counts(*pm, k->kind, f); !s) return s.err();
    if (f.kind == fault_kind::step_delay || f.kind == fault_kind::net_stop_reading ||
        is_kv_stall_fault(f.kind)) {
        if (auto s = read_fault_delay(*pm, *k, f); !s) return s.err();
    }
    if (f.kind == fault_kind::mailbox_refuse) {
        if (auto s = read_fault_actor(*pm, f); !s) return s.err();
    }
    return out;
}

// `session_delete` {session}.
result<sched::session_delete> parse_session_delete(const msgpack::object& frame,
                                                   const request_limits& limits) {
    auto pm = param_map::open(frame, {"session"});
    if (!pm.ok()) return pm.err();
    const msgpack::object* o = pm->get("session");
    if (o == nullptr) return make_error("bad_request", "\"session\" is required");
    auto s = read_session(*o, limits);
    if (!s) return s.err();
    sched::session_delete out;
    out.session = std::move(*s);
    return out;
}

// `auth` {key}: a string of at most api_key_bytes_max bytes; whether it is a key is the net
// actor's question (an empty or malformed one simply matches none).
result<auth_op> parse_auth(const msgpack::object& frame) {
    auto pm = param_map::open(frame, {"key"});
    if (!pm.ok()) return pm.err();
    const msgpack::object* o = pm->get("key");
    if (o == nullptr) return make_error("bad_request", "\"key\" is required");
    auto key = fields::read_string("key", *o, door::api_key_bytes_max);
    if (!key.ok()) return key.err();
    return auth_op{std::move(*key)};
}

namespace {

// An op whose only parameters are the envelope's.
template <typename T>
result<op> no_params(const request& r) {
    auto pm = param_map::open(*r.map, {});
    if (!pm) return pm.err();
    T m;
    m.id = r.id;
    return op(std::move(m));
}

// Sets the id of a parsed op message.
template <typename T>
result<op> with_id(result<T> parsed, uint64_t id) {
    if (!parsed) return parsed.err();
    T m = std::move(*parsed);
    m.id = id;
    return op(std::move(m));
}

// A generate message of parsed parameters (generate, chat).
result<op> as_generate(result<generate_request> params, uint64_t id) {
    if (!params) return params.err();
    sched::generate m;
    m.id = id;
    m.params = std::move(*params);
    return op(std::move(m));
}

}  // namespace

result<op> parse_op(const request& r, const request_limits& limits) {
    const msgpack::object& frame = *r.map;
    if (r.op == "health") {
        auto pm = param_map::open(frame, {});
        if (!pm) return pm.err();
        return op(health_op{});
    }
    if (r.op == "auth") {
        auto a = parse_auth(frame);
        if (!a.ok()) return a.err();
        return op(std::move(*a));
    }
    if (r.op == "stats") return no_params<sched::stats_query>(r);
    if (r.op == "model") return no_params<sched::model_info_query>(r);
    if (r.op == "generate") return as_generate(parse_generate(frame, limits), r.id);
    if (r.op == "chat") return as_generate(parse_chat(frame, limits), r.id);
    if (r.op == "apply_template") return with_id(parse_apply_template(frame, limits), r.id);
    if (r.op == "cancel") return with_id(parse_cancel(frame), r.id);
    if (r.op == "tokenize") return with_id(parse_tokenize(frame), r.id);
    if (r.op == "detokenize") return with_id(parse_detokenize(frame, limits), r.id);
    if (r.op == "embed") return with_id(parse_embed(frame, limits), r.id);
    if (r.op == "session_delete") return with_id(parse_session_delete(frame, limits), r.id);
    if (r.op == "fault") {
        return with_id(parse_fault(frame), r.id);
    }
    return make_error("unknown_op", "unknown op " + fields::quote(r.op));
}

}  // namespace ordo::net
