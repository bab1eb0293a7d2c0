// openai.cpp: see openai.hpp.
#include "http/openai.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <span>

#include "grammar/json.hpp"
#include "grammar/json_schema.hpp"
#include "net/chat.hpp"
#include "template/template.hpp"

namespace ordo::http {
namespace {

using json = nlohmann::json;
// The body in its own key order: what a template (tojson) or a grammar writes follows it.
using ojson = nlohmann::ordered_json;

// Every field of a request body ordo reads, per API (docs/http.md "Parameters"). Any other
// field is refused with 400 naming it: a client that asks for something ordo would not do
// (tools, logit_bias, ...) learns so instead of getting an answer that silently ignored it.
constexpr std::array<std::string_view, 20> k_common_fields{"model",
                                                           "stream",
                                                           "stream_options",
                                                           "n",
                                                           "max_tokens",
                                                           "temperature",
                                                           "top_p",
                                                           "seed",
                                                           "stop",
                                                           "presence_penalty",
                                                           "frequency_penalty",
                                                           "user",
                                                           "top_k",
                                                           "min_p",
                                                           "repeat_penalty",
                                                           "session",
                                                           "logprobs",
                                                           "grammar",
                                                           "response_format",
                                                           "speculative"};
constexpr std::array<std::string_view, 6> k_chat_fields{"messages",     "max_completion_tokens",
                                                        "top_logprobs", "tools",
                                                        "tool_choice",  "parallel_tool_calls"};
constexpr std::array<std::string_view, 1> k_completion_fields{"prompt"};
// Fields copied to ordo's validator under the same name (it checks their types and ranges).
constexpr std::array<std::string_view, 12> k_passed_fields{"temperature",
                                                           "top_p",
                                                           "seed",
                                                           "stop",
                                                           "top_k",
                                                           "min_p",
                                                           "repeat_penalty",
                                                           "presence_penalty",
                                                           "frequency_penalty",
                                                           "session",
                                                           "grammar",
                                                           "speculative"};

bool contains(std::span<const std::string_view> set, std::string_view s) {
    return std::find(set.begin(), set.end(), s) != set.end();
}

// The validator's messages begin by naming the key in quotes ("\"top_p\" must be ..."): the
// OpenAI error's `param` when it is a field passed on under its own name.
std::string param_named_in(const std::string& message) {
    if (message.empty() || message[0] != '"') return "";
    size_t end = message.find('"', 1);
    if (end == std::string::npos) return "";
    std::string key = message.substr(1, end - 1);
    return contains(k_passed_fields, key) ? key : "";
}

api_error bad(std::string message, std::string param = "", std::string code = "bad_request") {
    return {400, std::move(code), std::move(message), std::move(param)};
}

template <typename J = json>
std::string dump(const J& j) {
    return j.dump(-1, ' ', false, J::error_handler_t::replace);
}

// A JSON value in words, for error messages.
template <typename J>
std::string kind_of(const J& v) {
    switch (v.type()) {
        case nlohmann::detail::value_t::null:
            return "null";
        case nlohmann::detail::value_t::boolean:
            return "a boolean";
        case nlohmann::detail::value_t::number_integer:
        case nlohmann::detail::value_t::number_unsigned:
            return "an integer";
        case nlohmann::detail::value_t::number_float:
            return "a float";
        case nlohmann::detail::value_t::string:
            return "a string";
        case nlohmann::detail::value_t::array:
            return "an array";
        case nlohmann::detail::value_t::object:
            return "an object";
        default:
            return "a value";
    }
}

// JSON text parsed with its nesting bounded while it is parsed: the value, or what is wrong.
template <typename J>
std::variant<J, std::string> parse_json(std::string_view text) {
    auto depth_bound = [](int depth, typename J::parse_event_t, J&) {
        if (depth > int(json_depth_max)) {
            throw std::length_error("JSON nested deeper than " + std::to_string(json_depth_max) +
                                    " levels");
        }
        return true;
    };
    try {
        return J::parse(text, depth_bound);
    } catch (const typename J::parse_error& e) {
        return std::string("malformed JSON: ") + e.what();
    } catch (const std::length_error& e) {
        return std::string(e.what());
    }
}

// The body as a JSON object.
std::variant<json, api_error> parse_body(std::string_view body) {
    auto parsed = parse_json<json>(body);
    if (auto* e = std::get_if<std::string>(&parsed)) return bad(*e, "", "invalid_json");
    json& j = std::get<json>(parsed);
    if (!j.is_object()) {
        return bad("the body must be a JSON object, got " + kind_of(j), "", "invalid_json");
    }
    return std::move(j);
}

// The messages as ordo's chat op takes them (net/chat.hpp): content given as parts becomes the
// text parts joined (ordo's templates take a string); an assistant turn's tool calls get their
// arguments as the JSON object their string holds (templates write them with tojson) and a
// missing content as null; a null field is absent, as everywhere in a body.
std::optional<api_error> prepare_messages(ojson& messages) {
    if (!messages.is_array()) return std::nullopt;  // the validator names the type
    for (size_t i = 0; i < messages.size(); i++) {
        ojson& m = messages[i];
        if (!m.is_object()) continue;
        for (auto it = m.begin(); it != m.end();) {
            it = it->is_null() && it.key() != "content" ? m.erase(it) : std::next(it);
        }
        if (m.contains("tool_calls") && m["tool_calls"].is_array()) {
            if (!m.contains("content")) m["content"] = nullptr;
            for (ojson& call : m["tool_calls"]) {
                if (!call.is_object() || !call.contains("function")) continue;
                ojson& fn = call["function"];
                if (!fn.is_object() || !fn.contains("arguments") || !fn["arguments"].is_string()) {
                    continue;
                }
                auto parsed = parse_json<ojson>(fn["arguments"].get_ref<const std::string&>());
                if (auto* obj = std::get_if<ojson>(&parsed); obj != nullptr && obj->is_object()) {
                    fn["arguments"] = std::move(*obj);
                }
            }
        }
        if (!m.contains("content") || !m["content"].is_array()) continue;
        std::string text;
        const ojson& parts = m["content"];
        for (size_t k = 0; k < parts.size(); k++) {
            const std::string at =
                "messages[" + std::to_string(i) + "].content[" + std::to_string(k) + "]";
            const ojson& p = parts[k];
            if (!p.is_object() || !p.contains("type") || p["type"] != "text" ||
                !p.contains("text") || !p["text"].is_string() || p.size() != 2) {
                return bad(at + ": only text parts {\"type\": \"text\", \"text\": ...} are "
                                "supported (ordo serves text models)",
                           at);
            }
            text += p["text"].get<std::string>();
        }
        m["content"] = std::move(text);
    }
    return std::nullopt;
}

// /v1/completions' prompt: one string, or one array of token ids (n = 1: one prompt).
std::optional<api_error> map_prompt(const json& prompt, ojson& ordo) {
    auto is_ids = [](const json& a) {
        return a.is_array() && !a.empty() &&
               std::all_of(a.begin(), a.end(), [](const json& x) { return x.is_number_integer(); });
    };
    if (prompt.is_string()) {
        ordo["prompt"] = prompt;
    } else if (is_ids(prompt)) {
        ordo["tokens"] = prompt;
    } else if (prompt.is_array() && prompt.size() == 1 &&
               (prompt[0].is_string() || is_ids(prompt[0]))) {
        return map_prompt(prompt[0], ordo);
    } else if (prompt.is_array() && prompt.size() > 1) {
        return bad("prompt: one prompt per request (ordo answers n = 1), got " +
                       std::to_string(prompt.size()),
                   "prompt");
    } else {
        return bad("prompt: a string or an array of token ids, got " + kind_of(prompt), "prompt");
    }
    return std::nullopt;
}

// A field of `body`, nullptr when absent or null (OpenAI takes null as "not given").
template <typename J>
const J* field(const J& body, const char* k) {
    auto it = body.find(k);
    return it == body.end() || it->is_null() ? nullptr : &*it;
}

// OpenAI's fields that ask for something ordo does not do, accepted only in the values that
// ask for exactly what ordo does anyway (docs/http.md "Accepted as no-ops"): a client library
// that always sends its defaults works, and one that asks for more gets a 400 naming the field.
struct inert_field {
    std::string_view name;
    bool completions_only;
    bool (*accepts)(const json& v);
    std::string_view accepted;  // the values accepted, for the error message
    std::string_view why;       // what ordo does not do
};
constexpr std::array<inert_field, 6> k_inert_fields{{
    // OpenAI's deprecated forms of tools and tool_choice.
    {"functions", false, [](const json& v) { return v.is_array() && v.empty(); }, "[]",
     "ordo takes tools instead of the deprecated functions"},
    {"function_call", false, [](const json& v) { return v == "none"; }, "\"none\"",
     "ordo takes tool_choice instead of the deprecated function_call"},
    {"logit_bias", false, [](const json& v) { return v.is_object() && v.empty(); }, "{}",
     "ordo applies no logit bias"},
    {"echo", true, [](const json& v) { return v == false; }, "false",
     "ordo does not echo the prompt"},
    {"suffix", true, [](const json& v) { return v == ""; }, "\"\"",
     "ordo does not insert text (no fill-in-the-middle)"},
    {"best_of", true, [](const json& v) { return v.is_number_integer() && v == 1; }, "1",
     "ordo samples one completion per request"},
}};

bool is_inert_field(std::string_view k, api_kind kind) {
    return std::any_of(k_inert_fields.begin(), k_inert_fields.end(), [&](const inert_field& f) {
        return f.name == k && (!f.completions_only || kind == api_kind::completion);
    });
}

// n, user and the inert fields: accepted only in the values that change nothing.
std::optional<api_error> check_inert_fields(api_kind kind, const json& body) {
    if (const json* n = field(body, "n"); n != nullptr && !(n->is_number_integer() && *n == 1)) {
        return bad("n = " + dump(*n) + ": ordo answers one choice per request (n = 1)", "n");
    }
    for (const inert_field& f : k_inert_fields) {
        if (f.completions_only && kind != api_kind::completion) continue;
        const json* v = field(body, std::string(f.name).c_str());
        if (v == nullptr || f.accepts(*v)) continue;
        return bad(std::string(f.name) + " = " + dump(*v) + ": " + std::string(f.why) +
                       "; accepted: " + std::string(f.accepted) + " or null",
                   std::string(f.name));
    }
    if (const json* u = field(body, "user"); u != nullptr && !u->is_string()) {
        return bad("user: a string, got " + kind_of(*u), "user");
    }
    return std::nullopt;
}

// response_format: {"type": "text"} changes nothing; {"type": "json_object"} is JSON mode (the
// output is one JSON object: grammar/json.hpp); {"type": "json_schema", "json_schema": {"name",
// "schema", "strict", "description"}} a document valid against the schema (grammar/
// json_schema.hpp). Both reach the scheduler as the request's grammar.
std::optional<api_error> map_response_format(const json& body, const ojson& ordered, ojson& ordo) {
    const json* rf = field(body, "response_format");
    if (rf == nullptr) return std::nullopt;
    const std::string type = rf->is_object() ? rf->value("type", "") : "";
    if (type == "text" && rf->size() == 1) return std::nullopt;
    std::string gbnf;
    if (type == "json_object" && rf->size() == 1) {
        gbnf = grammar::json_object_gbnf;
    } else if (type == "json_schema" && rf->size() == 2 && rf->contains("json_schema") &&
               (*rf)["json_schema"].is_object()) {
        const json& js = (*rf)["json_schema"];
        for (const auto& [k, v] : js.items()) {
            if (k != "name" && k != "schema" && k != "strict" && k != "description") {
                return bad("response_format.json_schema." + k + ": unsupported field",
                           "response_format");
            }
        }
        if (!js.contains("schema")) {
            gbnf = grammar::json_object_gbnf;  // no schema: any JSON object
        } else {
            // In the schema's own key order: an object's properties are written in the order
            // the schema lists them.
            auto g =
                grammar::json_schema_to_gbnf(ordered["response_format"]["json_schema"]["schema"]);
            if (!g) return bad("response_format.json_schema." + g.err().message, "response_format");
            gbnf = std::move(*g);
        }
    } else {
        return bad("response_format = " + dump(*rf) +
                       ": ordo takes {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                       "{\"type\": \"json_schema\", \"json_schema\": {\"name\", \"schema\"}}",
                   "response_format");
    }
    if (field(body, "grammar") != nullptr) {
        return bad("response_format " + type + " and grammar: give one of them", "grammar");
    }
    ordo["grammar"] = std::move(gbnf);
    return std::nullopt;
}

// Refuses any field but `known` (a null counts as absent), naming it (`at` first: where the
// object is).
std::optional<api_error> only_fields(const json& j, std::initializer_list<std::string_view> known,
                                     const std::string& at = "") {
    for (const auto& [k, v] : j.items()) {
        if (v.is_null()) continue;
        if (std::find(known.begin(), known.end(), k) == known.end()) {
            return bad(net::fields::quote(at + k) + ": unsupported field", at + k);
        }
    }
    return std::nullopt;
}

// A function's name as OpenAI allows it: 1 to 64 letters, digits, '_' and '-'.
bool valid_tool_name(const std::string& n) {
    return !n.empty() && n.size() <= grammar::tool_name_bytes_max &&
           std::all_of(n.begin(), n.end(), [](char c) {
               return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
           });
}

// `tools`: [{"type": "function", "function": {"name", "description"?, "parameters"?,
// "strict"?}}], names unique. The functions, their parameters in the body's key order.
std::variant<std::vector<grammar::tool_function>, api_error> read_tools(const json& tools,
                                                                        const ojson& ordered) {
    if (!tools.is_array()) return bad("tools: an array of tools, got " + kind_of(tools), "tools");
    if (tools.size() > net::chat_tools_max) {
        return bad("tools: " + std::to_string(tools.size()) + " tools; at most " +
                       std::to_string(net::chat_tools_max),
                   "tools");
    }
    std::vector<grammar::tool_function> out;
    for (size_t i = 0; i < tools.size(); i++) {
        const std::string at = "tools[" + std::to_string(i) + "]";
        const json& t = tools[i];
        const char* shape =
            ": {\"type\": \"function\", \"function\": {\"name\", "
            "\"description\", \"parameters\", \"strict\"}}";
        if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") ||
            !t["function"].is_object()) {
            return bad(at + shape, "tools");
        }
        if (auto e = only_fields(t, {"type", "function"}, at + ".")) return *e;
        const json& fn = t["function"];
        if (auto e = only_fields(fn, {"name", "description", "parameters", "strict"},
                                 at + ".function.")) {
            return *e;
        }
        const json* name = field(fn, "name");
        if (name == nullptr || !name->is_string() || !valid_tool_name(name->get<std::string>())) {
            return bad(at + ".function.name: 1 to " + std::to_string(grammar::tool_name_bytes_max) +
                           " letters, digits, '_' or '-'",
                       "tools");
        }
        if (const json* d = field(fn, "description"); d != nullptr && !d->is_string()) {
            return bad(at + ".function.description: a string, got " + kind_of(*d), "tools");
        }
        if (const json* st = field(fn, "strict"); st != nullptr && !st->is_boolean()) {
            return bad(at + ".function.strict: a boolean, got " + kind_of(*st), "tools");
        }
        const ojson* params = field(ordered["tools"][i]["function"], "parameters");
        if (params != nullptr && !params->is_object()) {
            return bad(at + ".function.parameters: a JSON Schema object, got " + kind_of(*params),
                       "tools");
        }
        for (const auto& f : out) {
            if (f.name == *name)
                return bad(at + ".function.name: " + dump(*name) + " twice", "tools");
        }
        out.push_back({name->get<std::string>(), params != nullptr ? *params : ojson()});
    }
    return out;
}

enum class tool_choice { none, automatic, required, named };

// `tool_choice`: "none", "auto" (the default), "required" or {"type": "function", "function":
// {"name"}}; `named` gets the name.
std::variant<tool_choice, api_error> read_tool_choice(const json& body, std::string& named) {
    const json* c = field(body, "tool_choice");
    if (c == nullptr || *c == "auto") return tool_choice::automatic;
    if (*c == "none") return tool_choice::none;
    if (*c == "required") return tool_choice::required;
    if (c->is_object() && c->size() == 2 && c->value("type", "") == "function" &&
        c->contains("function") && (*c)["function"].is_object() && (*c)["function"].size() == 1 &&
        (*c)["function"].contains("name") && (*c)["function"]["name"].is_string()) {
        named = (*c)["function"]["name"].get<std::string>();
        return tool_choice::named;
    }
    return bad("tool_choice = " + dump(*c) +
                   ": \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                   "\"function\": {\"name\": ...}}",
               "tool_choice");
}

// tools, tool_choice and parallel_tool_calls (docs/http.md "Tool calls"). The tools go to the
// template (not with tool_choice none: the model is not offered them). With a template whose
// call format ordo reads, the answer is read for calls (api_request::tools) and the calls follow
// the format's grammar: from the first token for "required" or a named function, from where a
// call begins for "auto".
std::optional<api_error> map_tools(const json& body, const ojson& ordered,
                                   const net::request_limits& limits, ojson& ordo,
                                   api_request& out) {
    const json* parallel = field(body, "parallel_tool_calls");
    if (parallel != nullptr && !parallel->is_boolean()) {
        return bad("parallel_tool_calls: a boolean, got " + kind_of(*parallel),
                   "parallel_tool_calls");
    }
    std::string named;
    auto choice_read = read_tool_choice(body, named);
    if (auto* e = std::get_if<api_error>(&choice_read)) return *e;
    const tool_choice choice = std::get<tool_choice>(choice_read);
    const bool constrained = choice == tool_choice::required || choice == tool_choice::named;
    const json* tools = field(body, "tools");
    if (tools == nullptr || (tools->is_array() && tools->empty())) {
        if (constrained)
            return bad("tool_choice " + dump(body["tool_choice"]) + " needs tools", "tool_choice");
        return std::nullopt;
    }
    auto read = read_tools(*tools, ordered);
    if (auto* e = std::get_if<api_error>(&read)) return *e;
    std::vector<grammar::tool_function> fns = std::move(std::get<0>(read));
    if (choice == tool_choice::named) {
        auto it = std::find_if(fns.begin(), fns.end(),
                               [&](const grammar::tool_function& f) { return f.name == named; });
        if (it == fns.end()) {
            return bad(
                "tool_choice names the function " + dump(json(named)) + ", which tools do not list",
                "tool_choice");
        }
        fns = {*it};
    }
    if (choice == tool_choice::none) return std::nullopt;
    ordo["tools"] = ordered["tools"];
    const grammar::tool_format format =
        limits.chat != nullptr ? limits.chat->tools : grammar::tool_format::none;
    if (format == grammar::tool_format::none) {
        if (!constrained) return std::nullopt;  // offered through the template; answered as text
        return bad("tool_choice " + dump(body["tool_choice"]) +
                       ": the model's chat template shows no tool-call format ordo reads (Llama "
                       "3.1 JSON, Hermes/Qwen <tool_call>, Mistral [TOOL_CALLS]); with "
                       "tool_choice \"auto\" the tools are rendered and the answer is text",
                   "tool_choice");
    }
    if (ordo.contains("grammar")) {
        return bad(
            "tools and " +
                std::string(field(body, "grammar") != nullptr ? "grammar" : "response_format") +
                ": an answer follows one grammar; give tool_choice \"none\" or leave one out",
            "tools");
    }
    if (out.logprobs) {
        return bad(
            "logprobs with tools: ordo reports no logprobs for an answer read for tool "
            "calls; give tool_choice \"none\" or leave logprobs out",
            "logprobs");
    }
    // "required" or a named function: the answer is calls, from its first token. "auto": the
    // model writes what it likes, and a call it begins follows the grammar (a lazy grammar,
    // triggered where the format's calls begin).
    // A schema the grammar cannot keep is refused where the calls must follow it; under "auto"
    // the calls are then read as the model writes them.
    auto g = grammar::tool_calls_gbnf(format, fns, parallel == nullptr || parallel->get<bool>());
    if (!g && constrained) return bad(g.err().message, "tools");
    if (g) {
        ordo["grammar"] = std::move(*g);
        if (!constrained) ordo["grammar_triggers"] = grammar::tool_call_triggers(format);
    }
    // A format's markers that are control tokens show in the answer, where the calls are read.
    ordo["special"] = true;
    out.tools = tool_use{format, constrained};
    return std::nullopt;
}

// stream and stream_options.include_usage.
std::optional<api_error> map_stream(const json& body, api_request& out) {
    if (const json* s = field(body, "stream")) {
        if (!s->is_boolean()) return bad("stream: a boolean, got " + kind_of(*s), "stream");
        out.stream = s->get<bool>();
    }
    const json* so = field(body, "stream_options");
    if (so == nullptr) return std::nullopt;
    if (!out.stream) return bad("stream_options needs stream = true", "stream_options");
    if (!so->is_object()) {
        return bad("stream_options: an object, got " + kind_of(*so), "stream_options");
    }
    for (const auto& [k, v] : so->items()) {
        if (k != "include_usage") {
            return bad("stream_options." + k + ": unsupported field (ordo knows include_usage)",
                       "stream_options." + k);
        }
        if (!v.is_boolean()) {
            return bad("stream_options.include_usage: a boolean, got " + kind_of(v),
                       "stream_options.include_usage");
        }
        out.include_usage = v.get<bool>();
    }
    return std::nullopt;
}

// An integer 0..logprobs_max, or 400 naming `name`.
std::optional<api_error> check_alternatives(const json& v, const char* name) {
    if (!v.is_number_integer() || v < 0 || v > int(sched::logprobs_max)) {
        return bad(std::string(name) + " = " + dump(v) + ": an integer 0.." +
                       std::to_string(sched::logprobs_max),
                   name);
    }
    return std::nullopt;
}

// logprobs: chat takes a boolean and top_logprobs; completions an integer (alternatives).
std::optional<api_error> map_logprobs(api_kind kind, const json& body, api_request& out) {
    const json* lp = field(body, "logprobs");
    if (kind == api_kind::completion) {
        if (lp == nullptr) return std::nullopt;
        if (auto e = check_alternatives(*lp, "logprobs")) return e;
        out.logprobs = true;
        out.top_logprobs = lp->get<uint32_t>();
        return std::nullopt;
    }
    if (lp != nullptr && !lp->is_boolean()) {
        return bad("logprobs: a boolean, got " + kind_of(*lp), "logprobs");
    }
    out.logprobs = lp != nullptr && lp->get<bool>();
    if (const json* top = field(body, "top_logprobs")) {
        if (auto e = check_alternatives(*top, "top_logprobs")) return e;
        if (!out.logprobs) return bad("top_logprobs needs logprobs = true", "top_logprobs");
        out.top_logprobs = top->get<uint32_t>();
    }
    return std::nullopt;
}

// The OpenAI-only fields: checked here, and what they ask written into `ordo` / `out`.
std::optional<api_error> map_openai_fields(api_kind kind, const json& body, const ojson& ordered,
                                           ojson& ordo, api_request& out) {
    if (auto e = check_inert_fields(kind, body)) return e;
    if (auto e = map_response_format(body, ordered, ordo)) return e;
    if (auto e = map_stream(body, out)) return e;
    // max_tokens, or chat's newer name for it.
    const json* mt = field(body, "max_tokens");
    if (const json* mct = kind == api_kind::chat ? field(body, "max_completion_tokens") : nullptr) {
        if (mt != nullptr) {
            return bad("max_tokens and max_completion_tokens: give one of them",
                       "max_completion_tokens");
        }
        mt = mct;
    }
    if (mt != nullptr) ordo["max_tokens"] = *mt;
    if (auto e = map_logprobs(kind, body, out)) return e;
    // ordo reports logprobs with at least one alternative; the answer shows top_logprobs of them.
    if (out.logprobs) ordo["logprobs"] = std::max<uint32_t>(1, out.top_logprobs);
    ordo["stream"] = out.stream;
    for (std::string_view k : k_passed_fields) {
        if (const json* v = field(body, std::string(k).c_str())) ordo[std::string(k)] = *v;
    }
    // seed -1 is llama.cpp's "random": as if none were given (the scheduler draws one).
    if (const json* s = field(body, "seed"); s != nullptr && s->is_number_integer() && *s == -1) {
        ordo.erase("seed");
    }
    return std::nullopt;
}

std::string type_of_status(int status) {
    switch (status) {
        case 403:
            return "permission_error";  // OpenAI's PermissionDeniedError
        case 404:
            return "not_found_error";
        case 429:
            return "rate_limit_error";
        case 501:
            return "not_supported_error";
        case 503:
            return "unavailable_error";
        default:
            return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

// `calls`: the tool calls the answer carries.
const char* finish_reason(door::finish_reason reason, size_t calls = 0) {
    switch (reason) {
        case door::finish_reason::length:
            return "length";
        case door::finish_reason::stop:
        case door::finish_reason::cancelled:  // only a gone client's are, and nobody reads those
            break;
    }
    return calls > 0 ? "tool_calls" : "stop";
}

json tool_call_json(const answer_meta& m, const api_request& r, size_t index,
                    const std::string& name, const std::string& arguments) {
    return {{"index", index},
            {"id", grammar::tool_call_id(r.tools->format, m.id, index)},
            {"type", "function"},
            {"function", {{"name", name}, {"arguments", arguments}}}};
}

json usage_json(const door::generate_usage& u) {
    return {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"total_tokens", u.prompt_tokens + u.completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

json bytes_of(const std::string& s) {
    json a = json::array();
    for (unsigned char c : s) a.push_back(int(c));
    return a;
}

// One token as chat's logprobs.content[] entry.
json chat_logprob(const api_request& r, const door::token_info& t) {
    json top = json::array();
    if (t.top_logprobs) {
        for (size_t i = 0; i < t.top_logprobs->size() && i < r.top_logprobs; i++) {
            const auto& a = (*t.top_logprobs)[i];
            top.push_back({{"token", a.text}, {"logprob", a.logprob}, {"bytes", bytes_of(a.text)}});
        }
    }
    return {{"token", t.text},
            {"logprob", t.logprob},
            {"bytes", bytes_of(t.text)},
            {"top_logprobs", std::move(top)}};
}

// Tokens as /v1/completions' logprobs object.
json completion_logprobs(const api_request& r, std::span<const door::token_info> tokens,
                         size_t offset) {
    json toks = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
    for (const auto& t : tokens) {
        toks.push_back(t.text);
        lps.push_back(t.logprob);
        json top = json::object();
        if (t.top_logprobs) {
            for (size_t i = 0; i < t.top_logprobs->size() && i < r.top_logprobs; i++) {
                top[(*t.top_logprobs)[i].text] = (*t.top_logprobs)[i].logprob;
            }
        }
        tops.push_back(std::move(top));
        offs.push_back(offset);
        offset += t.text.size();
    }
    return {{"tokens", std::move(toks)},
            {"token_logprobs", std::move(lps)},
            {"top_logprobs", std::move(tops)},
            {"text_offset", std::move(offs)}};
}

json chunk_head(const answer_meta& m) {
    return {{"id", m.id},
            {"object", m.kind == api_kind::chat ? "chat.completion.chunk" : "text_completion"},
            {"created", m.created},
            {"model", m.model}};
}

std::string sse(const json& j) {
    return "data: " + dump(j) + "\n\n";
}

// `model`: required, the served model's id (404 otherwise).
std::optional<api_error> check_model(const json& j, const served_model& model) {
    auto m = j.find("model");
    if (m == j.end() || !m->is_string()) {
        return bad("model: required, a string naming the served model (GET /v1/models)", "model");
    }
    if (m->get<std::string>() != model.id) {
        return api_error{404, "model_not_found",
                         "the model " + net::fields::quote(m->get<std::string>()) +
                             " is not served here; this server serves \"" + model.id + "\"",
                         "model"};
    }
    return std::nullopt;
}

}  // namespace

std::variant<api_request, api_error> parse_api_request(api_kind kind, std::string_view body,
                                                       const net::request_limits& limits,
                                                       const served_model& model) {
    auto parsed = parse_body(body);
    if (auto* e = std::get_if<api_error>(&parsed)) return *e;
    json& j = std::get<json>(parsed);
    for (const auto& [k, v] : j.items()) {
        if (v.is_null()) continue;  // a JSON null counts as an absent field, whatever its name
        bool known = contains(k_common_fields, k) || is_inert_field(k, kind) ||
                     contains(kind == api_kind::chat
                                  ? std::span<const std::string_view>(k_chat_fields)
                                  : std::span<const std::string_view>(k_completion_fields),
                              k);
        if (!known) {
            return bad(net::fields::quote(k) +
                           ": unsupported field (docs/http.md lists what "
                           "ordo reads)",
                       k);
        }
    }
    if (auto e = check_model(j, model)) return *e;
    // The body again in its own key order (json sorts keys): a schema's properties, a tool's
    // and a message's keys are written (by the grammar, by the template's tojson) as the client
    // ordered them. The body parsed once already, within the depth bound.
    const ojson ordered = ojson::parse(body);
    api_request out;
    out.kind = kind;
    ojson ordo = ojson::object();
    if (auto e = map_openai_fields(kind, j, ordered, ordo, out)) return *e;
    if (kind == api_kind::chat) {
        const ojson* msgs = field(ordered, "messages");
        if (msgs == nullptr) return bad("messages: required", "messages");
        ojson messages = *msgs;
        if (auto e = prepare_messages(messages)) return *e;
        ordo["messages"] = std::move(messages);
        if (auto e = map_tools(j, ordered, limits, ordo, out)) return *e;
    } else {
        auto p = j.find("prompt");
        if (p == j.end() || p->is_null()) return bad("prompt: required", "prompt");
        if (auto e = map_prompt(*p, ordo)) return *e;
    }
    // The one validator: ordo's parameter rules (and the chat template's render).
    std::vector<uint8_t> packed = ojson::to_msgpack(ordo);
    msgpack::object_handle oh =
        msgpack::unpack(reinterpret_cast<const char*>(packed.data()), packed.size());
    auto g = kind == api_kind::chat ? net::parse_chat(oh.get(), limits)
                                    : net::parse_generate(oh.get(), limits);
    if (!g) {
        const std::string& code = g.err().code;
        std::string message = g.err().message;
        std::string param = param_named_in(message);
        // max_tokens is passed on under ordo's name: its errors name the field the client sent.
        const std::string mt = "\"max_tokens\"";
        if (message.rfind(mt, 0) == 0) {
            param = kind == api_kind::chat && field(j, "max_completion_tokens") != nullptr
                        ? "max_completion_tokens"
                        : "max_tokens";
            message.replace(0, mt.size(), "\"" + param + "\"");
        }
        return bad(message, param,
                   code == "bad_request" ? "bad_request" : code);  // no_chat_template, ...
    }
    out.params = std::move(*g);
    return out;
}

namespace {

// An optional boolean field: `fallback` when absent.
std::variant<bool, api_error> bool_field(const json& j, const char* k, bool fallback) {
    const json* v = field(j, k);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) return bad(std::string(k) + ": a boolean, got " + kind_of(*v), k);
    return v->get<bool>();
}

}  // namespace

std::variant<sched::tokenize, api_error> parse_tokenize_request(std::string_view body) {
    auto parsed = parse_body(body);
    if (auto* e = std::get_if<api_error>(&parsed)) return *e;
    const json& j = std::get<json>(parsed);
    if (auto e = only_fields(j, {"content", "add_special", "parse_special", "with_pieces"})) {
        return *e;
    }
    const json* content = field(j, "content");
    if (content == nullptr || !content->is_string()) {
        return bad("content: required, a string", "content");
    }
    sched::tokenize t;
    t.text = content->get<std::string>();
    auto add = bool_field(j, "add_special", false);
    if (auto* e = std::get_if<api_error>(&add)) return *e;
    auto special = bool_field(j, "parse_special", true);
    if (auto* e = std::get_if<api_error>(&special)) return *e;
    auto pieces = bool_field(j, "with_pieces", false);
    if (auto* e = std::get_if<api_error>(&pieces)) return *e;
    if (std::get<bool>(pieces)) {
        return bad("with_pieces: only false (ask /detokenize for a token's text)", "with_pieces");
    }
    t.add_bos = std::get<bool>(add);
    t.special = std::get<bool>(special);
    return t;
}

std::variant<sched::detokenize, api_error> parse_detokenize_request(
    std::string_view body, const net::request_limits& limits) {
    auto parsed = parse_body(body);
    if (auto* e = std::get_if<api_error>(&parsed)) return *e;
    const json& j = std::get<json>(parsed);
    if (auto e = only_fields(j, {"tokens"})) return *e;
    const json* tokens = field(j, "tokens");
    if (tokens == nullptr || !tokens->is_array()) {
        return bad("tokens: required, an array of token ids", "tokens");
    }
    sched::detokenize d;
    d.special = true;  // as llama.cpp's server: a control token shows its text
    for (size_t i = 0; i < tokens->size(); i++) {
        const json& t = (*tokens)[i];
        if (!t.is_number_integer() || t < 0 ||
            (limits.vocab_size != 0 && t >= int64_t(limits.vocab_size))) {
            return bad("tokens[" + std::to_string(i) + "] = " + dump(t) + ": a token id 0.." +
                           std::to_string(limits.vocab_size) + " (exclusive)",
                       "tokens");
        }
        d.tokens.push_back(t.get<int32_t>());
    }
    return d;
}

namespace {

// One /v1/embeddings input that is an array: token ids, each within the vocabulary.
std::variant<std::vector<int32_t>, api_error> token_input(const json& a, const std::string& where,
                                                          const net::request_limits& limits) {
    if (a.empty()) return bad(where + ": an empty array of token ids", "input");
    if (a.size() > sched::prompt_tokens_max) {
        return bad(where + ": more than " + std::to_string(sched::prompt_tokens_max) + " tokens",
                   "input");
    }
    std::vector<int32_t> ids;
    ids.reserve(a.size());
    for (size_t i = 0; i < a.size(); i++) {
        const json& t = a[i];
        if (!t.is_number_integer() || t < 0 ||
            (limits.vocab_size != 0 && t >= int64_t(limits.vocab_size)) ||
            t > int64_t(std::numeric_limits<int32_t>::max())) {
            return bad(where + "[" + std::to_string(i) + "] = " + dump(t) + ": a token id 0.." +
                           std::to_string(limits.vocab_size) + " (exclusive)",
                       "input");
        }
        ids.push_back(t.get<int32_t>());
    }
    return ids;
}

// One input: a non-empty string, or an array of token ids.
std::optional<api_error> add_input(const json& v, const std::string& where,
                                   const net::request_limits& limits, embeddings_request& out) {
    sched::embed e;
    if (v.is_string()) {
        if (v.get_ref<const std::string&>().empty()) {
            return bad(where + ": an empty string (nothing to embed)", "input");
        }
        e.text = v.get<std::string>();
    } else if (v.is_array()) {
        auto ids = token_input(v, where, limits);
        if (auto* err = std::get_if<api_error>(&ids)) return *err;
        e.tokens = std::move(std::get<std::vector<int32_t>>(ids));
    } else {
        return bad(where + ": a string or an array of token ids, got " + kind_of(v), "input");
    }
    out.inputs.push_back(std::move(e));
    return std::nullopt;
}

// `input`: a string, token ids, or an array of strings or of token-id arrays.
std::optional<api_error> read_inputs(const json& input, const net::request_limits& limits,
                                     embeddings_request& out) {
    if (input.is_string()) return add_input(input, "input", limits, out);
    if (!input.is_array()) {
        return bad(
            "input: a string or an array (of strings or of token ids), got " + kind_of(input),
            "input");
    }
    if (input.empty()) return bad("input: an empty array (nothing to embed)", "input");
    // An array of numbers is one input of token ids; otherwise each element is an input.
    if (input[0].is_number()) return add_input(input, "input", limits, out);
    if (input.size() > embedding_inputs_max) {
        return bad("input: " + std::to_string(input.size()) + " inputs; at most " +
                       std::to_string(embedding_inputs_max) + " per request",
                   "input");
    }
    for (size_t i = 0; i < input.size(); i++) {
        if (auto e = add_input(input[i], "input[" + std::to_string(i) + "]", limits, out)) {
            return e;
        }
    }
    return std::nullopt;
}

// The little-endian bytes of the floats, in base64 (RFC 4648, padded): what OpenAI's clients
// decode into a Float32Array.
std::string base64_floats(const std::vector<float>& v) {
    static constexpr char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string bytes(v.size() * 4, '\0');
    for (size_t i = 0; i < v.size(); i++) {
        uint32_t bits;
        std::memcpy(&bits, &v[i], 4);
        for (int b = 0; b < 4; b++) bytes[i * 4 + b] = char((bits >> (8 * b)) & 0xff);
    }
    std::string out;
    out.reserve((bytes.size() + 2) / 3 * 4);
    for (size_t i = 0; i < bytes.size(); i += 3) {
        uint32_t n = uint32_t(uint8_t(bytes[i])) << 16;
        if (i + 1 < bytes.size()) n |= uint32_t(uint8_t(bytes[i + 1])) << 8;
        if (i + 2 < bytes.size()) n |= uint32_t(uint8_t(bytes[i + 2]));
        out += alphabet[(n >> 18) & 63];
        out += alphabet[(n >> 12) & 63];
        out += i + 1 < bytes.size() ? alphabet[(n >> 6) & 63] : '=';
        out += i + 2 < bytes.size() ? alphabet[n & 63] : '=';
    }
    return out;
}

}  // namespace

std::variant<embeddings_request, api_error> parse_embeddings_request(
    std::string_view body, const net::request_limits& limits, const served_model& model) {
    auto parsed = parse_body(body);
    if (auto* e = std::get_if<api_error>(&parsed)) return *e;
    const json& j = std::get<json>(parsed);
    if (auto e = only_fields(j, {"model", "input", "encoding_format", "dimensions", "user"})) {
        return *e;
    }
    if (auto e = check_model(j, model)) return *e;
    embeddings_request out;
    if (const json* f = field(j, "encoding_format")) {
        if (*f != "float" && *f != "base64") {
            return bad("encoding_format = " + dump(*f) + ": \"float\" or \"base64\"",
                       "encoding_format");
        }
        out.base64 = *f == "base64";
    }
    if (const json* d = field(j, "dimensions");
        d != nullptr && !(d->is_number_integer() && *d == int64_t(model.n_embd))) {
        return bad("dimensions = " + dump(*d) + ": ordo returns the model's whole width; " +
                       "accepted: " + std::to_string(model.n_embd) + " or null",
                   "dimensions");
    }
    if (const json* u = field(j, "user"); u != nullptr && !u->is_string()) {
        return bad("user: a string, got " + kind_of(*u), "user");
    }
    const json* input = field(j, "input");
    if (input == nullptr) return bad("input: required", "input");
    if (auto e = read_inputs(*input, limits, out)) return *e;
    return out;
}

std::string embeddings_json(const std::string& model, const std::vector<door::embed_done>& done,
                            bool base64) {
    json data = json::array();
    uint64_t tokens = 0;
    for (size_t i = 0; i < done.size(); i++) {
        json e = {{"object", "embedding"}, {"index", i}};
        if (base64) {
            e["embedding"] = base64_floats(done[i].embedding);
        } else {
            e["embedding"] = done[i].embedding;
        }
        data.push_back(std::move(e));
        tokens += done[i].prompt_tokens;
    }
    return dump({{"object", "list"},
                 {"data", std::move(data)},
                 {"model", model},
                 {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}}});
}

std::string tokenize_json(const door::tokenize_done& d) {
    return dump({{"tokens", d.tokens}});
}

std::string detokenize_json(const door::detokenize_done& d) {
    return dump({{"content", d.text}});
}

int status_of(door::errc code) {
    using door::errc;
    switch (code) {
        case errc::bad_frame:
        case errc::bad_request:
        case errc::unknown_op:
        case errc::context_exceeded:
        case errc::fault_disabled:
        case errc::no_chat_template:
        case errc::template_error:
            return 400;
        case errc::unauthorized:
            return 401;
        case errc::read_timeout:
            return 408;
        case errc::duplicate_id:
        case errc::session_busy:
            return 409;
        case errc::too_many_inflight:
        case errc::overloaded:
            return 429;
        case errc::tokenizer_unsupported:
            return 501;
        case errc::gpu_unavailable:
        case errc::shutting_down:
            return 503;
        case errc::gpu_failed:
        case errc::response_too_large:
        case errc::kv_io:
        case errc::internal:
            return 500;
    }
    return 500;
}

api_error error_of(const door::request_error& e) {
    return {status_of(e.code), std::string(door::wire_name(e.code)), e.message, ""};
}

std::string error_json(const api_error& e) {
    json j = {{"error",
               {{"message", e.message},
                {"type", type_of_status(e.status)},
                {"param", e.param.empty() ? json(nullptr) : json(e.param)},
                {"code", e.code}}}};
    return dump(j);
}

std::string completion_json(const answer_meta& m, const api_request& r,
                            const door::generate_done& done) {
    json choice = {{"index", 0}};
    json logprobs = nullptr;
    if (r.logprobs && done.logprobs) {
        if (m.kind == api_kind::chat) {
            json content = json::array();
            for (const auto& t : *done.logprobs) content.push_back(chat_logprob(r, t));
            logprobs = {{"content", std::move(content)}};
        } else {
            logprobs = completion_logprobs(r, *done.logprobs, 0);
        }
    }
    if (m.kind == api_kind::chat && r.tools) {
        const grammar::tool_output out =
            grammar::parse_tool_output(r.tools->format, r.tools->constrained, done.text);
        json message = {{"role", "assistant"}};
        message["content"] = out.calls.empty() || !out.content.empty() ? json(out.content) : json();
        if (!out.calls.empty()) {
            json calls = json::array();
            for (size_t i = 0; i < out.calls.size(); i++) {
                json c = tool_call_json(m, r, i, out.calls[i].name, out.calls[i].arguments);
                c.erase("index");  // a message's calls are a list; index is for stream pieces
                calls.push_back(std::move(c));
            }
            message["tool_calls"] = std::move(calls);
        }
        choice["message"] = std::move(message);
        choice["finish_reason"] = finish_reason(done.reason, out.calls.size());
    } else if (m.kind == api_kind::chat) {
        choice["message"] = {{"role", "assistant"}, {"content", done.text}};
        choice["finish_reason"] = finish_reason(done.reason);
    } else {
        choice["text"] = done.text;
        choice["finish_reason"] = finish_reason(done.reason);
    }
    choice["logprobs"] = std::move(logprobs);
    json j = {{"id", m.id},
              {"object", m.kind == api_kind::chat ? "chat.completion" : "text_completion"},
              {"created", m.created},
              {"model", m.model},
              {"choices", json::array({std::move(choice)})},
              {"usage", usage_json(done.usage)},
              // ordo's extension: the seed the answer was sampled with (drawn by the server when
              // the request gave none); sending it back reproduces the answer.
              {"seed", done.seed}};
    return dump(j);
}

std::string sse_role_chunk(const answer_meta& m) {
    json j = chunk_head(m);
    j["choices"] = json::array({{{"index", 0},
                                 {"delta", {{"role", "assistant"}, {"content", ""}}},
                                 {"logprobs", nullptr},
                                 {"finish_reason", nullptr}}});
    return sse(j);
}

std::string sse_token_chunk(const answer_meta& m, const api_request& r, const door::token_info& t,
                            size_t text_offset) {
    json j = chunk_head(m);
    json choice = {{"index", 0}, {"finish_reason", nullptr}};
    json logprobs = nullptr;
    if (m.kind == api_kind::chat) {
        choice["delta"] = {{"content", t.text}};
        if (r.logprobs) logprobs = {{"content", json::array({chat_logprob(r, t)})}};
    } else {
        choice["text"] = t.text;
        if (r.logprobs) logprobs = completion_logprobs(r, std::span(&t, 1), text_offset);
    }
    choice["logprobs"] = std::move(logprobs);
    j["choices"] = json::array({std::move(choice)});
    if (r.include_usage) j["usage"] = nullptr;
    return sse(j);
}

std::string sse_tool_chunks(const answer_meta& m, const api_request& r,
                            std::span<const grammar::tool_delta> pieces) {
    std::string out;
    for (const grammar::tool_delta& p : pieces) {
        json delta;
        if (p.index < 0) {
            delta = {{"content", p.content}};
        } else if (!p.name.empty()) {
            delta = {{"tool_calls",
                      json::array({tool_call_json(m, r, size_t(p.index), p.name, p.arguments)})}};
        } else {
            delta = {{"tool_calls", json::array({{{"index", p.index},
                                                  {"function", {{"arguments", p.arguments}}}}})}};
        }
        json j = chunk_head(m);
        j["choices"] = json::array({{{"index", 0},
                                     {"delta", std::move(delta)},
                                     {"logprobs", nullptr},
                                     {"finish_reason", nullptr}}});
        if (r.include_usage) j["usage"] = nullptr;
        out += sse(j);
    }
    return out;
}

std::string sse_final_chunk(const answer_meta& m, const api_request& r,
                            const door::generate_done& done, size_t tool_calls) {
    json j = chunk_head(m);
    json choice = {{"index", 0},
                   {"logprobs", nullptr},
                   {"finish_reason", finish_reason(done.reason, tool_calls)}};
    if (m.kind == api_kind::chat) {
        choice["delta"] = json::object();
    } else {
        choice["text"] = "";
    }
    j["choices"] = json::array({std::move(choice)});
    if (r.include_usage) j["usage"] = nullptr;
    j["seed"] = done.seed;  // as in the non-streamed answer: known once the request is done
    return sse(j);
}

std::string sse_usage_chunk(const answer_meta& m, const door::generate_done& done) {
    json j = chunk_head(m);
    j["choices"] = json::array();
    j["usage"] = usage_json(done.usage);
    j["seed"] = done.seed;
    return sse(j);
}

std::string sse_error(const api_error& e) {
    return "data: " + error_json(e) + "\n\n";
}

std::string model_json(const served_model& m) {
    return dump(
        {{"id", m.id},
         {"object", "model"},
         {"created", m.created},
         {"owned_by", "ordo"},
         {"meta", {{"n_vocab", m.n_vocab}, {"n_ctx_train", m.n_ctx_train}, {"n_embd", m.n_embd}}}});
}

std::string models_json(const served_model& m) {
    json one = json::parse(model_json(m));
    return dump({{"object", "list"}, {"data", json::array({std::move(one)})}});
}

}  // namespace ordo::http
