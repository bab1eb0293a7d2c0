// chat.hpp: the `chat` and `apply_template` ops' conversation part (docs/protocol.md): reading
// `messages`, `tools`, `add_generation_prompt` and `chat_template_kwargs` from a request, and
// rendering them with the model's chat template into the prompt text.
//
// Rendering happens at the edge, where a request is validated: a template that fails is the
// request's error (template_error naming the template line), like a bad parameter, before the
// scheduler sees it. The template is parsed once at start (chat_setup); a render is bounded by
// chat_render_limits (steps, depth, output), so one request cannot hold the front door's loop
// for long: at the step bound, about 50 ms.
#pragma once

#include <memory>
#include <msgpack.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "actors/runtime/result.hpp"
#include "grammar/tool_calls.hpp"
#include "net/request_fields.hpp"
#include "template/template.hpp"

namespace ordo::net {

inline constexpr std::string_view k_no_chat_template = "no_chat_template";

// Bounds of one conversation in a request.
inline constexpr size_t chat_messages_max = 4096;
inline constexpr size_t chat_tools_max = 256;
inline constexpr size_t chat_kwargs_max = 64;
inline constexpr uint32_t chat_value_depth_max = 32;  // nesting of tools / tool_calls / kwargs

// A render's bounds in the server: a tenth of the engine's default steps (real templates take
// hundreds per message), its depth and output bounds.
inline jinja::limits chat_render_limits() {
    jinja::limits l;
    l.steps_max = 1'000'000;
    return l;
}

// The model's chat template as the server starts with it. Immutable; shared by the front doors.
struct chat_setup {
    std::optional<jinja::chat_template> tmpl;  // unset: none, or it did not parse (`problem`)
    std::string source = "none";               // "gguf", "file:PATH" or "none"
    std::string problem;                       // the parse error of a template that has one
    std::string bos_token, eos_token;          // the vocabulary's texts of BOS and EOS ("" if none)
    // The tool-call format the template teaches (grammar/tool_calls.hpp): how the HTTP door
    // reads calls from an answer; none when the template shows no known one.
    grammar::tool_format tools = grammar::tool_format::none;
};

// Parses `source_text` (a template found in the GGUF, or read from an override file), named
// `source` in the result. A syntax error is kept in `problem` (chat answers template_error with
// it) rather than returned: the model still serves everything else.
chat_setup make_chat_setup(std::string_view source_text, std::string source, std::string bos_token,
                           std::string eos_token);

// A request's conversation, as template values.
struct chat_input {
    jinja::value messages;  // list of dicts
    jinja::value tools;     // list, or none
    bool add_generation_prompt = true;
    std::vector<std::pair<std::string, jinja::value>> kwargs;  // chat_template_kwargs
};

// Reads and validates the conversation keys (messages, tools, add_generation_prompt,
// chat_template_kwargs; the op opens `pm` with them) (bad_request naming the key, e.g.
// messages[2].role).
result<chat_input> parse_chat_input(const fields::param_map& pm);

// Renders `in` with the setup's template. Errors: no_chat_template (with how to give one),
// template_error (the template's message, naming its line).
result<std::string> render_chat(const chat_setup* setup, const chat_input& in);

// A msgpack value as a template value: nil, bool, integers (within int64), floats, strings
// (valid UTF-8), arrays and maps with string keys, nested at most depth_max. bad_request
// naming `key` (and the path inside it) otherwise.
result<jinja::value> template_value(std::string_view key, const msgpack::object& o,
                                    uint32_t depth_max = chat_value_depth_max);

}  // namespace ordo::net
