// openai.hpp: the OpenAI API's JSON, both ways (docs/http.md). Pure: no sockets, no actor; the
// HTTP actor calls it, tests call it directly.
//
// In: a /v1/chat/completions or /v1/completions body becomes the same validated
// sched::generate_request the msgpack front door makes. The OpenAI fields are checked here
// (model, n, stream_options, the penalties ordo refuses, fields it does not know), then the body
// is rewritten with ordo's parameter names and handed to the one validator (net/ops.hpp
// parse_chat / parse_generate), which renders the chat template too. So a bound or rule of the
// protocol holds over HTTP without being written twice. A /v1/embeddings body becomes one
// sched::embed per input.
//
// Out: the scheduler's typed events (door/door_msgs.hpp) as OpenAI's response objects, stream
// chunks and error objects.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "door/door_msgs.hpp"
#include "door/error_code.hpp"
#include "grammar/tool_calls.hpp"
#include "net/ops.hpp"
#include "scheduler/scheduler_msgs.hpp"

namespace ordo::http {

// JSON nested deeper than this is refused before anything walks it (the parser itself is
// iterative; what reads the value afterwards is not).
inline constexpr uint32_t json_depth_max = 64;

enum class api_kind { chat, completion };

// What the server serves, as /v1/models and every response name it.
struct served_model {
    std::string id;        // the GGUF file's name without ".gguf"
    uint64_t created = 0;  // unix seconds: when the server started
    // Reported in /v1/models' "meta" (llama-server reports the same keys): load generators
    // draw token-id prompts below n_vocab; n_embd is the embeddings' width.
    uint32_t n_vocab = 0;
    uint32_t n_ctx_train = 0;  // the context the model was trained for (GGUF)
    uint32_t n_embd = 0;       // the width of its embeddings (/v1/embeddings `dimensions`)
};

// One OpenAI error: the HTTP status and the body's fields.
struct api_error {
    int status = 400;
    std::string code;  // ordo's code (door/error_code.hpp wire names) or an HTTP one
    std::string message;
    std::string param;  // the field concerned, "" when none
};

// An answer read for tool calls (docs/http.md "Tool calls"): the format the chat template
// teaches, and whether the grammar of its calls constrained the answer (tool_choice "required"
// or a named function).
struct tool_use {
    grammar::tool_format format = grammar::tool_format::none;
    bool constrained = false;
};

// A validated request and how its answer must be shaped.
struct api_request {
    api_kind kind = api_kind::chat;
    sched::generate_request params;
    bool stream = false;
    bool include_usage = false;     // stream_options.include_usage
    bool logprobs = false;          // report logprobs in the answer
    uint32_t top_logprobs = 0;      // alternatives per token in the answer (0..20)
    std::optional<tool_use> tools;  // set: the answer is read for tool calls
};

// Parses and validates a request body. Errors: 400 (malformed JSON, a wrong field, a refused
// one; the message and `param` name it), 404 (`model` is not the served model), and the
// template's no_chat_template / template_error as 400.
std::variant<api_request, api_error> parse_api_request(api_kind kind, std::string_view body,
                                                       const net::request_limits& limits,
                                                       const served_model& model);

// llama.cpp server's /tokenize and /detokenize (docs/http.md "Tokens"), parsed into the
// scheduler's ops (conn and id left for the caller). /tokenize: {"content": string,
// "add_special": bool = false (BOS/EOS as the model adds them), "parse_special": bool = true
// (control-token text becomes those tokens), "with_pieces": false only}. /detokenize:
// {"tokens": [ids < the vocabulary]}; control tokens show their text. Errors: 400 naming the
// field.
std::variant<sched::tokenize, api_error> parse_tokenize_request(std::string_view body);
std::variant<sched::detokenize, api_error> parse_detokenize_request(
    std::string_view body, const net::request_limits& limits);
std::string tokenize_json(const door::tokenize_done& d);      // {"tokens": [...]}
std::string detokenize_json(const door::detokenize_done& d);  // {"content": "..."}

// POST /v1/embeddings (docs/http.md "Embeddings"): `input` a string, an array of strings, an
// array of token ids or an array of such arrays, each one input (the scheduler's embed op;
// conn and id left for the caller); `encoding_format` float or base64; `dimensions` only the
// model's n_embd; `user` any string. Errors: 400 naming the field, 404 for another model.
// OpenAI's own bound on the inputs of one request.
inline constexpr size_t embedding_inputs_max = 2048;
struct embeddings_request {
    std::vector<sched::embed> inputs;  // in order
    bool base64 = false;               // encoding_format "base64": little-endian float32 bytes
};
std::variant<embeddings_request, api_error> parse_embeddings_request(
    std::string_view body, const net::request_limits& limits, const served_model& model);
// The answer: {"object": "list", "data": [{"object": "embedding", "index", "embedding"}],
// "model", "usage": {"prompt_tokens", "total_tokens"}}; `done[i]` answers input i.
std::string embeddings_json(const std::string& model, const std::vector<door::embed_done>& done,
                            bool base64);

// The `code` of a 401 (missing or wrong API key), as OpenAI's API names it.
inline constexpr std::string_view invalid_api_key_code = "invalid_api_key";

// The HTTP status of an ordo error code (docs/http.md "Errors").
int status_of(door::errc code);
// OpenAI's error body: {"error": {"message", "type", "param", "code"}}.
std::string error_json(const api_error& e);
api_error error_of(const door::request_error& e);

// Identity of one answer: the id (chatcmpl-... / cmpl-...), its creation time and the model.
struct answer_meta {
    api_kind kind = api_kind::chat;
    std::string id;
    uint64_t created = 0;
    std::string model;
};

// The whole non-streamed answer of `done`; read for tool calls when `r.tools` says so (the
// message's tool_calls, content null without text, finish_reason "tool_calls").
std::string completion_json(const answer_meta& m, const api_request& r,
                            const door::generate_done& done);

// Server-sent events of a streamed answer. Each returns one `data: ...\n\n` event.
std::string sse_role_chunk(const answer_meta& m);  // chat only: the first chunk
// text_offset: bytes of text the stream carried before this token (completions' logprobs
// text_offset counts from the start of the answer, as in the non-streamed one).
std::string sse_token_chunk(const answer_meta& m, const api_request& r, const door::token_info& t,
                            size_t text_offset);
// A tool request's stream (r.tools): the pieces of grammar::tool_stream, one chunk each: text
// as delta.content, a call's first piece as delta.tool_calls [{index, id, type, function: {name,
// arguments}}], later pieces as [{index, function: {arguments}}].
std::string sse_tool_chunks(const answer_meta& m, const api_request& r,
                            std::span<const grammar::tool_delta> pieces);
// finish_reason (+ usage); `tool_calls`: the calls the stream carried.
std::string sse_final_chunk(const answer_meta& m, const api_request& r,
                            const door::generate_done& done, size_t tool_calls = 0);
std::string sse_usage_chunk(const answer_meta& m, const door::generate_done& done);
std::string sse_error(const api_error& e);
inline constexpr std::string_view sse_done = "data: [DONE]\n\n";

// /v1/models and /v1/models/{id}.
std::string models_json(const served_model& m);
std::string model_json(const served_model& m);

}  // namespace ordo::http
