// template.hpp: ordo's Jinja chat-template engine: parse a template once, render it with
// variables. The subset, the refusals and the bounds are described in docs/templates.md.
//
// Templates are untrusted input (they come inside downloaded model files): rendering can read
// only the variables it is given, cannot load other templates or touch files, and ends within
// the bounds of `limits` (steps, nesting depth, output bytes) with an error naming the bound.
// Every failure is an ordo::error with code "template_error" whose message names the template
// line (and column) and what went wrong; `raise_exception(msg)` fails with msg.
//
// Pure logic, no actors, no globals: a parsed template is immutable and may be rendered from
// several threads at once (each render has its own state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "actors/runtime/result.hpp"
#include "template/value.hpp"

namespace ordo::jinja {

inline constexpr std::string_view k_template_error = "template_error";

// Bounds on one parse and one render. Exceeding any ends it with template_error naming it.
struct limits {
    // Evaluation steps (one per expression node, statement and loop iteration, plus one per 64
    // bytes a string operation copies; a step is roughly 50 ns). Real chat templates need tens
    // to hundreds per message.
    uint64_t steps_max = 10'000'000;
    // Nesting of evaluation (expressions, statements, macro calls, recursive loops) and of
    // values (a list in a list ...): guards the native stack. Python's own limit is ~1000
    // frames; a recursive macro uses several levels per call.
    uint32_t depth_max = 400;
    // Bytes of rendered output, and of any single string a template builds.
    size_t output_bytes_max = size_t(32) << 20;
    // Template source size and syntax nesting (parentheses, blocks) the parser accepts.
    size_t source_bytes_max = size_t(1) << 20;
    uint32_t parse_depth_max = 200;
};

using variables = std::map<std::string, value, std::less<>>;

struct render_options {
    limits bounds;
    // What strftime_now() formats; unset: the local time when the render starts.
    std::optional<std::tm> now;
};

struct parsed;  // the syntax tree (ast.hpp)

class chat_template {
public:
    // Parses `source`; a syntax error is template_error with the line and column.
    static result<chat_template> parse(std::string_view source, const limits& bounds = {});

    result<std::string> render(const variables& vars, const render_options& opt = {}) const;

private:
    std::shared_ptr<const parsed> _tree;
};

}  // namespace ordo::jinja
