// ops.hpp: the one validator of requests. Turns a request's envelope (net/protocol.hpp) into the
// typed op message the scheduler accepts (scheduler/scheduler_msgs.hpp), or a
// bad_request / unknown_op error naming the key. Pure and actor-free: the net actor calls it
// once per request, tests and the protocol fuzzer call it directly.
//
// The rules of docs/protocol.md: every key must be known and appear once ("id" and "op" belong
// to the envelope); integers are accepted where floats are expected, never floats where
// integers are; values must be in range. What needs the model or config (the vocabulary size,
// `session` without `[kv] enabled`, the default max_tokens) comes in `request_limits`; what
// needs the scheduler's state (context, KV pool, queue) is checked there.
#pragma once

#include <cstdint>
#include <memory>
#include <msgpack.hpp>
#include <variant>

#include "actors/runtime/result.hpp"
#include "net/chat.hpp"
#include "net/protocol.hpp"
#include "scheduler/scheduler_msgs.hpp"

namespace ordo::net {

struct request_limits {
    uint32_t max_tokens_default = 256;  // config scheduler.max_tokens_default
    uint32_t vocab_size = 0;            // 0: ids are not checked against the vocabulary here
    bool kv_enabled = false;            // config kv.enabled: `session` is refused without it
    // The chat template `chat` and `apply_template` render (null: none, no_chat_template).
    std::shared_ptr<const chat_setup> chat = nullptr;
};

// `health`, answered by the net actor itself.
struct health_op {};

// `auth` {key}: the connection's API key (door/api_keys.hpp), checked by the net actor itself.
struct auth_op {
    std::string key;
};

using op = std::variant<health_op, auth_op, sched::stats_query, sched::model_info_query,
                        sched::generate, sched::cancel, sched::tokenize, sched::detokenize,
                        sched::fault, sched::session_delete, sched::embed>;

// The typed op of request `r` with its id set (conn 0: the caller fills it in). Errors:
// bad_request naming the key, or unknown_op; `chat` and `apply_template` also no_chat_template
// and template_error (chat.hpp). `chat` becomes a generate whose prompt is the rendered chat
// (params.chat set); `apply_template` a tokenize of it (chat set).
result<op> parse_op(const request& r, const request_limits& limits);

// The parameter parsers parse_op uses, one per op (the whole request map, "id"/"op" skipped).
result<sched::generate_request> parse_generate(const msgpack::object& frame,
                                               const request_limits& limits);
result<sched::generate_request> parse_chat(const msgpack::object& frame,
                                           const request_limits& limits);
result<sched::tokenize> parse_apply_template(const msgpack::object& frame,
                                             const request_limits& limits);
result<sched::tokenize> parse_tokenize(const msgpack::object& frame);
result<sched::detokenize> parse_detokenize(const msgpack::object& frame,
                                           const request_limits& limits);
result<sched::cancel> parse_cancel(const msgpack::object& frame);
// `embed` {input | tokens}: one input, a string or token ids (docs/protocol.md "embed").
result<sched::embed> parse_embed(const msgpack::object& frame, const request_limits& limits);
result<sched::fault> parse_fault(const msgpack::object& frame);
result<sched::session_delete> parse_session_delete(const msgpack::object& frame,
                                                   const request_limits& limits);
result<auth_op> parse_auth(const msgpack::object& frame);

}  // namespace ordo::net
