// door_msgs.hpp: the messages every front door accepts (the msgpack door, net/net_actor.hpp;
// the HTTP door, http/http_actor.hpp): one list, door_messages, is both doors' message table.
//
// The events of a request travel typed, from the scheduler (sender of every event) to the front
// door the request came through (the conn id's top byte, door/conn_ids.hpp),
// which alone encodes them for its wire (net/protocol.hpp: msgpack frames; http/openai.hpp:
// OpenAI JSON and server-sent events). Every request gets exactly one terminal event: one of the
// *_done messages or request_error; token_event is the only non-terminal one. Each event names
// its request by (conn, id): the connection the front door assigned, and the id of the request
// on it. The lists at the end are written once and expanded wherever a list of these messages
// is wanted: the doors' tables, the scheduler's outbox and delivery, its client_event.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <msgpack.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "actors/runtime/actor.hpp"
#include "actors/runtime/enum_names.hpp"
#include "actors/runtime/fault_kind.hpp"
#include "actors/runtime/type_list.hpp"
#include "door/error_code.hpp"
#include "gpu/gpu_msgs.hpp"
#include "kv/kv_msgs.hpp"

namespace ordo::door {

// ---- event payloads -------------------------------------------------------------------------

struct top_logprob {
    int32_t token = 0;
    std::string text;  // valid UTF-8 (invalid bytes replaced)
    float logprob = 0;
    MSGPACK_DEFINE_MAP(token, text, logprob);
};

// One generated token as a `token` event (or an element of done.logprobs) reports it.
struct token_info {
    int32_t token = 0;
    std::string text;  // the text this token completes (may be "")
    float logprob = 0;
    std::optional<std::vector<top_logprob>> top_logprobs;  // set when logprobs > 0
    MSGPACK_DEFINE_MAP(token, text, logprob, top_logprobs);
};

struct generate_usage {
    uint32_t prompt_tokens = 0;
    uint32_t cached_tokens = 0;
    uint64_t completion_tokens = 0;
    double prefill_ms = 0;
    double decode_ms = 0;
    MSGPACK_DEFINE_MAP(prompt_tokens, cached_tokens, completion_tokens, prefill_ms, decode_ms);
};

// What the `model` op reports (docs/protocol.md), filled from the loaded GGUF and the device.
// The model op's `speculative` map: how the server speculates, and with a draft model whether
// it drafts now (docs/speculative.md).
struct speculative_report {
    std::string mode;          // off | ngram | draft
    std::string draft_model;   // mode draft: the draft model's file
    bool draft_ready = false;  // mode draft: its device is built and takes rounds
    std::string draft_reason;  // mode draft: its device, or why it is not ready
    MSGPACK_DEFINE_MAP(mode, draft_model, draft_ready, draft_reason);
};

struct model_report {
    std::string path;
    std::string architecture;
    std::string fingerprint;
    std::string weight_type;
    std::map<std::string, uint64_t> tensor_types;  // type name -> tensor count
    uint32_t n_vocab = 0, n_ctx_train = 0, context = 0, n_embd = 0, n_layer = 0, n_head = 0;
    uint32_t n_head_kv = 0, n_ff = 0;
    std::string context_bound;  // trained | config | kv pool | device: what set `context`
    int32_t bos_token = -1, eos_token = -1;
    std::vector<int32_t> eog_tokens;   // every id that ends a generation (eos, eot, eom, ...)
    std::string tokenizer;             // "llama", "gpt2 (pre llama-bpe)"
    bool tokenizer_supported = false;  // false: text ops answer tokenizer_unsupported
    std::string chat_template;         // gguf | file:PATH | none
    uint64_t weights_device_bytes = 0, kv_device_bytes = 0;  // 0 until the device is ready
    // The scheduler's limits: scheduler.max_sequences (or the device's choice where it is 0)
    // and scheduler.max_batch_tokens.
    uint32_t max_sequences = 0, max_batch_tokens = 0;
    bool generated = false;  // a random-weight model made by set-up, not a real one
    std::string hint;        // how to point the server at a real GGUF (when generated)
    gpu::device_summary gpu;
    speculative_report speculative;
    MSGPACK_DEFINE_MAP(path, architecture, fingerprint, weight_type, tensor_types, n_vocab,
                       n_ctx_train, context, n_embd, n_layer, n_head, n_head_kv, n_ff,
                       context_bound, bos_token, eos_token, eog_tokens, tokenizer,
                       tokenizer_supported, chat_template, weights_device_bytes, kv_device_bytes,
                       max_sequences, max_batch_tokens, generated, hint, gpu, speculative);
};

// The stats op's `fault_plan` map: the config's fault plan ([fault] plan) as the scheduler
// fired it (docs/protocol.md). Left out of the answer when there is no plan (active false).
struct fault_plan_report {
    bool active = false;
    uint64_t seed = 0;
    uint64_t fired = 0;                       // faults armed by the plan
    uint64_t refused = 0;                     // drawn, but their target refused them: not fired
    bool spent = false;                       // plan_faults_max reached: no more faults
    std::map<std::string, uint64_t> by_kind;  // fired, by kind name; kinds not fired are absent
    MSGPACK_DEFINE_MAP(active, seed, fired, refused, spent, by_kind);
};

// A histogram of observed values (the stats op's `histograms`, /metrics): `counts[i]` values were
// <= bounds[i] and above bounds[i-1] (not cumulative); the last count is those above every
// bound. Bounds are fixed at construction, so observing allocates nothing.
struct histogram {
    std::vector<double> bounds;    // increasing upper bounds
    std::vector<uint64_t> counts;  // bounds.size() + 1
    double sum = 0;
    uint64_t count = 0;
    histogram() = default;
    explicit histogram(std::vector<double> b) : bounds(std::move(b)), counts(bounds.size() + 1) {}
    void observe(double v) {
        size_t i = 0;
        while (i < bounds.size() && v > bounds[i]) i++;
        counts[i]++;
        sum += v;
        count++;
    }
    MSGPACK_DEFINE_MAP(bounds, counts, sum, count);
};

// The scheduler's half of the `stats` op; the front doors' counters (net, http) come with the
// request and are echoed here.
struct stats_report {
    uint64_t active_sequences = 0;
    uint64_t queued_requests = 0;
    uint64_t kv_blocks_used = 0;
    uint64_t kv_blocks_free = 0;
    std::map<std::string, uint64_t> net;
    std::map<std::string, uint64_t> http;  // empty: the HTTP front door is off
    std::map<std::string, uint64_t> scheduler;
    std::map<std::string, uint64_t> kv;
    // The stats op's `gpu` map: the device as last announced and what its steps did.
    gpu::device_summary device;
    uint64_t epoch = 0, steps = 0, timeouts = 0, device_lost = 0, nan_logits = 0;
    uint64_t other_failures = 0;
    double busy_ms = 0;
    double step_wall_ms = 0, between_steps_ms = 0, run_ms = 0;  // sched::gpu_view's
    uint64_t back_to_back_steps = 0;
    uint64_t segments = 0, segments_replayed = 0;  // sched::gpu_view's
    kv::kv_disk_report kv_disk;
    uint64_t logits_slots_held = 0;  // logits_exchange slots not yet released (0 when idle)
    uint64_t rss_bytes = 0;          // the process's resident memory (0 where unknown)
    uint64_t log_lines_dropped = 0;  // log lines dropped by a full log queue (runtime/log.hpp)
    fault_plan_report fault_plan;
    // Per finished generate request (stop, length or cancelled; every front door):
    // time_to_first_token_seconds, inter_token_seconds (between two tokens of one request),
    // request_duration_seconds (arrival to end), prompt_tokens, completion_tokens.
    std::map<std::string, histogram> histograms;
    MSGPACK_DEFINE_MAP(active_sequences, queued_requests, kv_blocks_used, kv_blocks_free, net, http,
                       scheduler, kv, device, epoch, steps, timeouts, device_lost, nan_logits,
                       other_failures, busy_ms, step_wall_ms, between_steps_ms, back_to_back_steps,
                       run_ms, segments, segments_replayed, kv_disk, logits_slots_held, rss_bytes,
                       fault_plan, histograms, log_lines_dropped);
};

// ---- events (scheduler → front door); none is answered ------------------------------------------

// A streamed token of a generate request. Not terminal.
struct token_event {
    static constexpr const char* msg_name = "token_event";
    uint64_t conn = 0, id = 0;
    token_info token;
    MSGPACK_DEFINE_MAP(conn, id, token);
};

// Why a generate request ended, as generate_done carries it; each door writes it for its wire
// (the msgpack door its name, the HTTP door OpenAI's finish_reason).
enum class finish_reason : uint8_t {
    stop,       // end of generation, a stop string, or a grammar that takes nothing more
    length,     // max_tokens, or the context is full
    cancelled,  // the cancel op, or the client left
};
inline constexpr std::array<std::string_view, 3> finish_reason_names = {"stop", "length",
                                                                        "cancelled"};
constexpr const auto& names_of(finish_reason) {
    return finish_reason_names;
}

// generate ended: reason stop | length | cancelled (finish_reason's names). Terminal.
struct generate_done {
    static constexpr const char* msg_name = "generate_done";
    uint64_t conn = 0, id = 0;
    finish_reason reason = finish_reason::stop;
    std::string stop;  // the stop string that matched ("" when none)
    std::vector<int32_t> tokens;
    std::string text;
    uint64_t seed = 0;
    std::optional<std::vector<token_info>> logprobs;  // non-streamed requests with logprobs > 0
    generate_usage usage;
    MSGPACK_DEFINE_MAP(conn, id, reason, stop, tokens, text, seed, logprobs, usage);
};

// embed ended: the input's pooled, L2-normalized final hidden state (n_embd floats), or, when
// the `cancel` op ended it first, cancelled and no embedding. Terminal.
struct embed_done {
    static constexpr const char* msg_name = "embed_done";
    uint64_t conn = 0, id = 0;
    std::vector<float> embedding;
    uint32_t prompt_tokens = 0;
    std::string pooling;  // mean | last | cls (config.hpp's names)
    bool cancelled = false;
    MSGPACK_DEFINE_MAP(conn, id, embedding, prompt_tokens, pooling, cancelled);
};

struct tokenize_done {
    static constexpr const char* msg_name = "tokenize_done";
    uint64_t conn = 0, id = 0;
    std::vector<int32_t> tokens;
    std::optional<std::string> text = std::nullopt;  // apply_template: the rendered chat
    MSGPACK_DEFINE_MAP(conn, id, tokens, text);
};

struct detokenize_done {
    static constexpr const char* msg_name = "detokenize_done";
    uint64_t conn = 0, id = 0;
    std::string text;
    MSGPACK_DEFINE_MAP(conn, id, text);
};

struct cancel_done {
    static constexpr const char* msg_name = "cancel_done";
    uint64_t conn = 0, id = 0;
    bool cancelled = false;  // the target was live
    MSGPACK_DEFINE_MAP(conn, id, cancelled);
};

struct model_done {
    static constexpr const char* msg_name = "model_done";
    uint64_t conn = 0, id = 0;
    model_report model;
    MSGPACK_DEFINE_MAP(conn, id, model);
};

struct stats_done {
    static constexpr const char* msg_name = "stats_done";
    uint64_t conn = 0, id = 0;
    stats_report stats;
    MSGPACK_DEFINE_MAP(conn, id, stats);
};

// session_delete: whether a session file was removed. Terminal.
struct session_delete_done {
    static constexpr const char* msg_name = "session_delete_done";
    uint64_t conn = 0, id = 0;
    bool deleted = false;
    MSGPACK_DEFINE_MAP(conn, id, deleted);
};

struct fault_done {
    static constexpr const char* msg_name = "fault_done";
    uint64_t conn = 0, id = 0;
    fault_kind armed = fault_kind::device_lost;
    std::string detail;  // what exactly was armed, in words (empty: the kind says it all)
    MSGPACK_DEFINE_MAP(conn, id, armed, detail);
};

// Any request ended by an error. Terminal.
struct request_error {
    static constexpr const char* msg_name = "request_error";
    uint64_t conn = 0, id = 0;
    errc code = errc::internal;
    std::string message;
    MSGPACK_DEFINE_MAP(conn, id, code, message);
};

// ---- control ----------------------------------------------------------------------------------

// What `health` reports (the msgpack op's and GET /health's "status"): the scheduler says
// loading, ok or degraded; a draining front door answers draining itself.
enum class health_status : uint8_t {
    loading,   // the device is being built (the first start or a rebuild)
    ok,        // serving (a reason may still say what is impaired: persistence off)
    degraded,  // the device could not be built: requests fail with gpu_unavailable
    draining,  // SIGTERM: new requests are refused (shutting_down), running ones finish
};
inline constexpr std::array<std::string_view, 4> health_status_names = {"loading", "ok", "degraded",
                                                                        "draining"};
constexpr const auto& names_of(health_status) {
    return health_status_names;
}
static_assert(static_cast<std::size_t>(health_status::draining) + 1 == health_status_names.size(),
              "health_status_names names every health_status, in order");

// scheduler → front door: what `health` reports (loading, ok or degraded, with a reason when not
// ok, or with ok when something that serving does not need is off). No reply.
struct set_health {
    static constexpr const char* msg_name = "set_health";
    health_status status = health_status::loading;
    std::string reason;
    MSGPACK_DEFINE_MAP(status, reason);
};

// scheduler → front door: events for this connection could not be delivered within the delivery
// bound, so its requests can no longer be answered: the connection is closed (the client sees
// it end rather than wait forever). No reply.
struct drop_connection {
    static constexpr const char* msg_name = "drop_connection";
    uint64_t conn = 0;
    std::string reason;
    MSGPACK_DEFINE_MAP(conn, reason);
};

// scheduler → front door: a net fault point fired (the `fault` op's net kinds, docs/protocol.md): a
// request of connection `conn` reached the phase the fault was armed for. `kind` (is_net_fault):
// net_fin (the connection is closed: queued events are flushed, then FIN), net_rst (closed with
// RST: queued events are dropped), net_stop_reading (the connection is not read for `ms`; what
// the client sends meanwhile waits in the socket). Ordered after every event sent before it. No
// reply.
struct net_fault {
    static constexpr const char* msg_name = "net_fault";
    uint64_t conn = 0;
    fault_kind kind = fault_kind::net_fin;
    uint32_t ms = 0;
    MSGPACK_DEFINE_MAP(conn, kind, ms);
};

// bootstrap → front door: the server is draining (SIGTERM): stop accepting connections and answer
// new requests with shutting_down; requests in flight go on. No reply.
struct begin_drain {
    static constexpr const char* msg_name = "begin_drain";
    ORDO_EMPTY_MESSAGE()
};

// ---- the lists -------------------------------------------------------------------------------

// A request's events, as the scheduler hands them to a front door (sched::client_event).
using request_events = actors::type_list<token_event, generate_done, tokenize_done, detokenize_done,
                                         cancel_done, model_done, stats_done, fault_done,
                                         session_delete_done, request_error, embed_done>;
// Everything the scheduler sends a front door, in one ordered delivery per door: the events and
// the control messages about the door's connections and health.
using scheduler_events =
    actors::type_list_cat_t<request_events,
                            actors::type_list<set_health, drop_connection, net_fault>>;
// A front door's message table: the scheduler's messages and the bootstrap's begin_drain.
using door_messages = actors::type_list_cat_t<scheduler_events, actors::type_list<begin_drain>>;

// Whether E is one of a request's events (request_events).
template <typename E>
concept request_event = actors::in_type_list_v<E, request_events>;

}  // namespace ordo::door

MSGPACK_ADD_ENUM(ordo::door::health_status);

MSGPACK_ADD_ENUM(ordo::door::finish_reason);
