// error_code.hpp: the protocol's error codes (docs/protocol.md §6), one enum and the one place
// that names them on the wire.
//
// Every actor that ends a request with an error uses a value of this enum; only the front doors
// turn it into what a client reads (the msgpack door's `code` string, the HTTP door's status
// and error type). A new code is added here, in wire_name and in
// docs/protocol.md, nowhere else.
#pragma once

#include <cstdint>
#include <msgpack.hpp>
#include <optional>
#include <string_view>

namespace ordo::door {

enum class errc : uint8_t {
    bad_frame,              // the byte stream is unusable (id 0, the connection closes)
    bad_request,            // a parameter is unknown, of the wrong type or out of range
    unknown_op,             // `op` names no op
    duplicate_id,           // the id is live on this connection
    too_many_inflight,      // server.max_inflight_per_connection reached
    overloaded,             // a queue or mailbox is full, or too many connections
    context_exceeded,       // prompt + max_tokens beyond the context or the KV pool
    gpu_unavailable,        // the device could not be rebuilt
    gpu_failed,             // the request's steps failed and retries are spent
    shutting_down,          // the server is stopping
    fault_disabled,         // `fault` while [fault] enabled = false
    response_too_large,     // an answer larger than server.write_buffer_bytes_max
    read_timeout,           // a frame was not completed within server.read_timeout_ms
    session_busy,           // another live request uses the session
    kv_io,                  // persisted KV could not be read or written (session_delete)
    tokenizer_unsupported,  // a text op on a model whose tokenizer ordo cannot run yet
    no_chat_template,       // chat / apply_template and the model has no chat template
    template_error,         // the chat template failed to parse or render
    internal,               // a bug: an invariant did not hold
    unauthorized,           // API keys are configured and the connection has not authenticated
};

inline constexpr errc errc_last = errc::unauthorized;

constexpr std::string_view wire_name(errc c) {
    switch (c) {
        case errc::bad_frame:
            return "bad_frame";
        case errc::bad_request:
            return "bad_request";
        case errc::unknown_op:
            return "unknown_op";
        case errc::duplicate_id:
            return "duplicate_id";
        case errc::too_many_inflight:
            return "too_many_inflight";
        case errc::overloaded:
            return "overloaded";
        case errc::context_exceeded:
            return "context_exceeded";
        case errc::gpu_unavailable:
            return "gpu_unavailable";
        case errc::gpu_failed:
            return "gpu_failed";
        case errc::shutting_down:
            return "shutting_down";
        case errc::fault_disabled:
            return "fault_disabled";
        case errc::response_too_large:
            return "response_too_large";
        case errc::read_timeout:
            return "read_timeout";
        case errc::session_busy:
            return "session_busy";
        case errc::kv_io:
            return "kv_io";
        case errc::tokenizer_unsupported:
            return "tokenizer_unsupported";
        case errc::no_chat_template:
            return "no_chat_template";
        case errc::template_error:
            return "template_error";
        case errc::internal:
            return "internal";
        case errc::unauthorized:
            return "unauthorized";
    }
    return "internal";
}

// The code whose wire name is `name`, or nullopt: for an error made below a door whose code is
// already a wire name (the op parser's bad_request and unknown_op, the chat template's
// no_chat_template and template_error), read once where the door answers it.
constexpr std::optional<errc> errc_from_wire_name(std::string_view name) {
    for (auto i = 0; i <= static_cast<int>(errc_last); ++i) {
        if (wire_name(static_cast<errc>(i)) == name) return static_cast<errc>(i);
    }
    return std::nullopt;
}

}  // namespace ordo::door

MSGPACK_ADD_ENUM(ordo::door::errc);
