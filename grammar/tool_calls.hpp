// tool_calls.hpp: tool calls as the chat-template families write them (issue 31, docs/http.md
// "Tool calls"). Pure: no actors, no I/O; the HTTP door uses it on both sides of a request.
//
// A model trained for tools writes a call in its family's text format, which its chat template
// teaches it (the template renders the tools and the calls of earlier turns):
//   - llama3_json (Llama 3.1 / 3.2 / 3.3): the answer is {"name": F, "parameters": {...}}, one
//     call per turn (the template refuses several in history);
//   - hermes (Hermes 2/3, Qwen 2.5): <tool_call>\n{"name": F, "arguments": {...}}\n</tool_call>,
//     after optional text, repeated for parallel calls;
//   - mistral (Mistral Nemo and its v3 tokenizer kin): [TOOL_CALLS][{"name": F, "arguments":
//     {...}}, ...].
// The family is read from the template's text (tool_format_of). This file gives each family
//   - the grammar of its calls (tool_calls_gbnf), for tool_choice "required" or a named
//     function: the output then is calls and nothing else, arguments valid against each
//     function's parameters schema;
//   - the parse of a whole answer into content and calls (parse_tool_output), for any
//     tool_choice: text that does not parse as calls stays content;
//   - the parse of an answer as it streams (tool_stream): content and call pieces as soon as
//     they are certain, such that the pieces of a streamed answer put together are the
//     whole-answer parse of the same text.
// A call's arguments are the model's own text of the JSON object (never re-serialized), so a
// streamed piece is a prefix of what the whole answer reports.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "actors/runtime/result.hpp"
#include "grammar/json_schema.hpp"

namespace ordo::grammar {

enum class tool_format : uint8_t { none, llama3_json, hermes, mistral };
inline constexpr std::array<std::string_view, 4> tool_format_names = {"none", "llama3_json",
                                                                      "hermes", "mistral"};
constexpr const auto& names_of(tool_format) {
    return tool_format_names;
}

// The family whose calls the template teaches, from its text; none when it shows no known one.
tool_format tool_format_of(std::string_view template_source);

// The formats' markers. Some vocabularies have them as control tokens, whose text a reply does
// not show by default: the grammar's vocabulary and a tool request's reply spell these.
inline constexpr std::array<std::string_view, 4> tool_call_markers = {
    "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|python_tag|>"};

// Bounds of a tool request: OpenAI's own bound on a function's name, and the calls one answer
// may carry.
inline constexpr size_t tool_name_bytes_max = 64;
inline constexpr size_t tool_calls_max = 64;

struct tool_function {
    std::string name;                   // [A-Za-z0-9_-]{1,64}, checked by the caller
    nlohmann::ordered_json parameters;  // a JSON Schema; null: any JSON object
};

// GBNF for calls in format `f` (not none) of the functions in `tools` (at least one): one call,
// or with `parallel` (and a format that has it: not llama3_json) up to tool_calls_max of them.
// Each call's arguments are valid against its function's parameters. Errors: bad_schema naming
// the function and the place inside its parameters.
result<std::string> tool_calls_gbnf(tool_format f, std::span<const tool_function> tools,
                                    bool parallel, const json_schema_limits& limits = {});

// Where format f's calls begin, as a lazy grammar's triggers (generate_request::
// grammar_triggers): tool_choice "auto" lets the model write text, and once it begins a call
// the call follows tool_calls_gbnf.
std::vector<std::string> tool_call_triggers(tool_format f);

struct tool_call {
    std::string name;
    std::string arguments;  // the JSON text of an object, as the model wrote it
};

struct tool_output {
    std::string content;  // the text before the calls, or all of it when there are none
    std::vector<tool_call> calls;
};

// A whole answer read in format f. With `constrained` (the answer was generated under
// tool_calls_gbnf) the answer is calls only, and an answer cut short (max_tokens) keeps the calls
// whose name is whole, the last one's arguments as far as they came. Otherwise calls are found
// where the format puts them, their text must parse whole (else the whole answer is content),
// and content is the text before them without trailing whitespace.
tool_output parse_tool_output(tool_format f, bool constrained, std::string_view text);

// What a stream shows next: text, or a piece of call `index` (its name comes once, in the first
// piece; arguments come in pieces, in order).
struct tool_delta {
    std::string content;
    int32_t index = -1;  // >= 0: a call's piece
    std::string name;    // the call's first piece only
    std::string arguments;
};

// An answer parsed as it streams. Unconstrained, content streams until a call may begin (a
// marker's first bytes are held back); from a call on, everything waits for finish(), where the
// whole-answer parse decides between calls and content. Constrained, a call's name and each
// piece of its arguments go out as soon as they are generated.
class tool_stream {
public:
    tool_stream(tool_format f, bool constrained) : _f(f), _constrained(constrained) {}
    std::vector<tool_delta> feed(std::string_view text);
    // The rest, after the last token.
    std::vector<tool_delta> finish();
    // Calls the stream has begun.
    size_t calls() const { return _calls_begun; }

private:
    std::vector<tool_delta> constrained_pieces(bool last);

    tool_format _f;
    bool _constrained;
    std::string _text;         // everything fed
    size_t _content_sent = 0;  // unconstrained: bytes of _text shown as content
    bool _in_calls = false;    // unconstrained: a call may have begun; the rest waits
    size_t _calls_begun = 0;
    size_t _args_sent = 0;  // constrained: bytes of the last begun call's arguments shown
};

// The id of call `index` of the answer `answer_id`: derived, so the streamed and whole forms of
// one answer agree. Mistral's templates want 9 letters and digits; the others get "call_" and 24.
std::string tool_call_id(tool_format f, std::string_view answer_id, size_t index);

}  // namespace ordo::grammar
