// generate_request.hpp: parsing and validating the parameters of the scheduler's ops
// (generate, tokenize, detokenize, cancel) from a request frame (pure, actor-free).
//
// Used by the scheduler actor (and by net, which may validate before forwarding) on the whole
// msgpack request map, "id" and "op" included (they are skipped: net's envelope parser owns
// them). The rules of docs/protocol.md: every key must be known and appear once; ints are
// accepted where floats are expected, never floats where ints are; values must be in range.
// Any violation is error{code "bad_request", message naming the key and what was expected}.
// What needs the model or config (prompt + max_tokens against the context, `session` without
// `[kv] enabled`, ids against the vocabulary) is checked here when `request_limits` says so.
#pragma once

#include <cstdint>
#include <msgpack.hpp>
#include <optional>
#include <string>
#include <vector>

#include "actors/runtime/result.hpp"
#include "actors/scheduler/sampling.hpp"

namespace ordo::sched {

// Bounds on one request; the frame limit (server.max_frame_bytes) is usually tighter.
inline constexpr size_t prompt_bytes_max = 4u << 20;   // a prompt or tokenize text
inline constexpr size_t prompt_tokens_max = 1u << 20;  // a `tokens` array
inline constexpr uint32_t max_tokens_max = 1u << 20;   // matches scheduler.max_tokens_default
inline constexpr size_t session_bytes_max = 128;

struct request_limits {
    uint32_t max_tokens_default = 256;  // config scheduler.max_tokens_default
    uint32_t vocab_size = 0;            // 0: ids are not checked against the vocabulary here
    bool kv_enabled = false;            // config kv.enabled: `session` is refused without it
};

struct generate_request {
    std::optional<std::string> prompt;  // exactly one of prompt and tokens is given
    std::vector<int32_t> tokens;        // when prompt is not given: the prompt ids, verbatim
    uint32_t max_tokens = 0;
    sampling_params sampling;  // seed = seed_default when not given
    bool seed_given = false;
    std::vector<std::string> stop;  // validated: count, length, UTF-8
    bool stream = false;
    std::optional<std::string> session;
};

struct tokenize_request {
    std::string text;
    std::optional<bool> add_bos;  // unset: the model's add_bos_token
};

struct detokenize_request {
    std::vector<int32_t> tokens;
};

struct cancel_request {
    uint64_t target = 0;  // > 0
};

result<generate_request> parse_generate(const msgpack::object& frame, const request_limits& limits);
result<tokenize_request> parse_tokenize(const msgpack::object& frame);
result<detokenize_request> parse_detokenize(const msgpack::object& frame,
                                            const request_limits& limits);
result<cancel_request> parse_cancel(const msgpack::object& frame);

}  // namespace ordo::sched
