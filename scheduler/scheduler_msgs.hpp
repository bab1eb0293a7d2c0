// scheduler_msgs.hpp: the messages the scheduler actor accepts from the front doors (the net and
// HTTP actors), first; it also accepts the gpu actor's replies, declared in
// gpu/gpu_msgs.hpp.
//
// Every op is a typed message, parsed and validated once at the edge (net/ops.hpp) and named by
// (conn, id): the connection the front door assigned and the id the client chose. Reply: the
// request's events (door/door_msgs.hpp) through the scheduler's delivery to its front door,
// ending with exactly one terminal event. What needs the scheduler's state (the context, the KV
// pool, the queue, the vocabulary for text) is checked by the scheduler.
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
#include "door/conn_ids.hpp"
#include "gpu/gpu_msgs.hpp"
#include "scheduler/sampling.hpp"

namespace ordo::sched {

// The front doors and their connection ids, and client_gone, are the doors' own
// (door/conn_ids.hpp): the scheduler accepts door::client_gone as one of its messages.
using door::client_gone;

// Bounds on one request; the frame limit (server.max_frame_bytes) is usually tighter.
inline constexpr size_t prompt_bytes_max = 4u << 20;   // a prompt or tokenize text
inline constexpr size_t prompt_tokens_max = 1u << 20;  // a `tokens` array
inline constexpr uint32_t max_tokens_max = 1u << 20;   // matches scheduler.max_tokens_default
inline constexpr size_t session_bytes_max = 128;

// A generate request's parameters, validated (docs/protocol.md "generate").
struct generate_request {
    std::optional<std::string> prompt;  // exactly one of prompt and tokens is given
    std::vector<int32_t> tokens;        // when prompt is not given: the prompt ids, verbatim
    uint32_t max_tokens = 0;
    sampling_params sampling;  // seed: the scheduler draws one when not given (seed_given)
    bool seed_given = false;
    std::vector<std::string> stop;  // validated: count, length, UTF-8
    bool stream = false;
    std::optional<std::string> session;
    // A text prompt's control-token text becomes those tokens, and streamed text shows control
    // tokens (tokenizer.hpp).
    bool special = false;
    // The prompt is a rendered chat (the `chat` op): its control-token text always becomes
    // those tokens, and BOS is added only when the model wants one and the text does not
    // already begin with it (`special` then only shows control tokens in the reply).
    bool chat = false;
    // A GBNF grammar the output must follow (docs/grammar.md): parsed by the scheduler, which
    // answers bad_request naming the line and column.
    std::optional<std::string> grammar;
    // A lazy grammar (docs/grammar.md "Triggers"): the output is free until one of these texts
    // appears in it, and from there on follows the grammar (the trigger's text is where the
    // grammar's sentence begins). "^" first: only where the output begins (after whitespace).
    // Empty: the grammar holds from the first token.
    std::vector<std::string> grammar_triggers;
    // false: this request decodes without speculation even where the server speculates
    // ([speculative] mode; the output is the same either way, docs/speculative.md).
    bool speculative = true;
    MSGPACK_DEFINE_MAP(prompt, tokens, max_tokens, sampling, seed_given, stop, stream, session,
                       special, chat, grammar, grammar_triggers, speculative);
};

// front door → scheduler: generate text. Reply: token_event* then generate_done or
// request_error.
struct generate {
    static constexpr const char* msg_name = "generate";
    uint64_t conn = 0, id = 0;
    generate_request params;
    MSGPACK_DEFINE_MAP(conn, id, params);
};

// front door → scheduler: cancel request `target` of the same connection. Reply: cancel_done.
struct cancel {
    static constexpr const char* msg_name = "cancel";
    uint64_t conn = 0, id = 0;
    uint64_t target = 0;  // > 0
    MSGPACK_DEFINE_MAP(conn, id, target);
};

// front door → scheduler: text to token ids. Reply: tokenize_done.
struct tokenize {
    static constexpr const char* msg_name = "tokenize";
    uint64_t conn = 0, id = 0;
    std::string text;
    std::optional<bool> add_bos;  // unset: the model's add_bos_token
    bool special = false;         // control-token text becomes those tokens
    // A rendered chat (the `apply_template` op): tokenized as a chat prompt (generate_request
    // `chat`), and the reply carries the text too.
    bool chat = false;
    MSGPACK_DEFINE_MAP(conn, id, text, add_bos, special, chat);
};

// front door → scheduler: token ids to text. Reply: detokenize_done or request_error.
struct detokenize {
    static constexpr const char* msg_name = "detokenize";
    uint64_t conn = 0, id = 0;
    std::vector<int32_t> tokens;  // each < the vocabulary size the front door was given
    bool special = false;         // control tokens show their text (else nothing)
    MSGPACK_DEFINE_MAP(conn, id, tokens, special);
};

// front door → scheduler: the embedding of one input: its tokens run as a prefill (batched with
// generation, under the same queue, context and KV limits), their final hidden states pooled
// as core_options::pooling says and L2-normalized (docs/protocol.md "embed"). Reply:
// embed_done or request_error.
struct embed {
    static constexpr const char* msg_name = "embed";
    uint64_t conn = 0, id = 0;
    std::optional<std::string> text;  // tokenized with BOS per the model; else `tokens`
    std::vector<int32_t> tokens;      // when text is not given: the ids, verbatim
    MSGPACK_DEFINE_MAP(conn, id, text, tokens);
};

// front door → scheduler: what is being served. Reply: model_done.
struct model_info_query {
    static constexpr const char* msg_name = "model";
    uint64_t conn = 0, id = 0;
    MSGPACK_DEFINE_MAP(conn, id);
};

// front door → scheduler: gauges and counters. `net` and `http` carry the two front doors'
// counters as the sender read them (each front door reads the other's atomics through the
// other's counters(); an empty `http`: the HTTP front door is off), and come back in the report.
// Reply: stats_done.
struct stats_query {
    static constexpr const char* msg_name = "stats";
    uint64_t conn = 0, id = 0;
    std::map<std::string, uint64_t> net;
    std::map<std::string, uint64_t> http;
    MSGPACK_DEFINE_MAP(conn, id, net, http);
};

// front door → scheduler: remove a persisted session (needs [kv] enabled). Reply:
// session_delete_done, or request_error{session_busy} while a request uses it.
struct session_delete {
    static constexpr const char* msg_name = "session_delete";
    uint64_t conn = 0, id = 0;
    std::string session;  // validated like generate's `session`
    MSGPACK_DEFINE_MAP(conn, id, session);
};

// A request's phases, in the order it reaches them. A net fault fires when a request reaches
// the phase it was armed for (docs/protocol.md "fault").
enum class request_phase : uint8_t { queued, prefill, decode };
inline constexpr std::array<std::string_view, 3> request_phase_names = {"queued", "prefill",
                                                                        "decode"};
constexpr const auto& names_of(request_phase) {
    return request_phase_names;
}
static_assert(static_cast<std::size_t>(request_phase::decode) + 1 == request_phase_names.size());

// The actors whose mailbox a mailbox_refuse fault refuses.
enum class fault_actor : uint8_t { scheduler, net, gpu, kv };
inline constexpr std::array<std::string_view, 4> fault_actor_names = {"scheduler", "net", "gpu",
                                                                      "kv"};
constexpr const auto& names_of(fault_actor) {
    return fault_actor_names;
}
static_assert(static_cast<std::size_t>(fault_actor::kv) + 1 == fault_actor_names.size());

// A fault's parameters, checked once by the front door (net/ops.cpp parse_fault) or made by the
// config's fault plan. Each kind reads the fields it takes; the scheduler turns them into the
// message of the kind's target (scheduler_actor::arm_fault).
struct fault_spec {
    fault_kind kind = fault_kind::device_lost;
    std::optional<gpu::step_phase> gpu_phase;         // gpu kinds: the steps it matches; none = any
    request_phase net_phase = request_phase::queued;  // net kinds: the phase that fires it
    int32_t layer = -1;        // gpu failure kinds: the layer's segment fails; -1 = any
    uint32_t after_steps = 0;  // gpu kinds: matching steps let through first
    uint32_t count = 1;        // steps, saves or restores, requests or refusals it applies to
    uint32_t delay_ms = 0;     // step_delay: each step's wait; net_stop_reading: the pause
    fault_actor actor = fault_actor::scheduler;  // mailbox_refuse: whose mailbox refuses
    MSGPACK_DEFINE_MAP(kind, gpu_phase, net_phase, layer, after_steps, count, delay_ms, actor);
};

// front door → scheduler: arm a fault (needs [fault] enabled). Reply: fault_done or
// request_error{fault_disabled}. The gpu kinds go to the gpu actor as an inject_fault, the kv
// kinds to the kv actor as a kv_fault; the net kinds are armed in the scheduler and sent to the
// front door as a net_fault when they fire; mailbox_refuse is armed by the scheduler itself on
// the mailbox of spec.actor.
struct fault {
    static constexpr const char* msg_name = "fault";
    uint64_t conn = 0, id = 0;
    fault_spec spec;
    MSGPACK_DEFINE_MAP(conn, id, spec);
};

// bootstrap → scheduler: the server is draining (SIGTERM). New generate requests are refused
// with shutting_down; running and queued ones go on for up to `grace_ms`, after which they end
// with shutting_down. Reply: none; `drained()` on the actor turns true once no request is live.
struct drain {
    static constexpr const char* msg_name = "drain";
    uint64_t grace_ms = 0;
    MSGPACK_DEFINE_MAP(grace_ms);
};

}  // namespace ordo::sched

MSGPACK_ADD_ENUM(ordo::sched::request_phase);
MSGPACK_ADD_ENUM(ordo::sched::fault_actor);
