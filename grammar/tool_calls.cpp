// tool_calls.cpp: see tool_calls.hpp.
#include "grammar/tool_calls.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cassert>
#include <cctype>
#include <optional>

namespace ordo::grammar {
namespace {

using json = nlohmann::json;

bool is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

size_t skip_ws(std::string_view s, size_t pos) {
    while (pos < s.size() && is_ws(s[pos])) pos++;
    return pos;
}

bool starts_with_at(std::string_view s, size_t pos, std::string_view what) {
    return s.substr(pos, what.size()) == what;
}

// The text without trailing whitespace.
std::string_view rtrim(std::string_view s) {
    while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
    return s;
}

// The end of the JSON value beginning at `pos` (a structural scan: brackets outside strings;
// json::accept checks the text afterwards), or npos when the text ends first. A scalar ends at
// the first byte that cannot continue it, so a number at the very end is incomplete.
size_t value_end(std::string_view s, size_t pos) {
    if (pos >= s.size()) return std::string_view::npos;
    const char first = s[pos];
    if (first == '{' || first == '[' || first == '"') {
        size_t depth = 0;
        bool in_string = false;
        for (size_t i = pos; i < s.size(); i++) {
            const char c = s[i];
            if (in_string) {
                if (c == '\\') {
                    i++;
                } else if (c == '"') {
                    in_string = false;
                    if (depth == 0) return i + 1;  // a string value
                }
            } else if (c == '"') {
                in_string = true;
            } else if (c == '{' || c == '[') {
                depth++;
            } else if (c == '}' || c == ']') {
                if (depth == 0) return i;  // unbalanced: accept() refuses the span
                if (--depth == 0) return i + 1;
            }
        }
        return std::string_view::npos;
    }
    size_t i = pos;
    while (i < s.size() && (std::isalnum(static_cast<unsigned char>(s[i])) || s[i] == '-' ||
                            s[i] == '+' || s[i] == '.')) {
        i++;
    }
    return i == s.size() ? std::string_view::npos : i;
}

// One call's object as far as the text goes: {"name": F, ARGS_KEY: {...}} and, besides, "type":
// "function" or a string "id" (what models add). Keys in any order.
struct call_read {
    enum class state { whole, cut, bad } st = state::bad;
    std::optional<std::string> name;  // once its string is whole
    size_t args_begin = std::string_view::npos, args_end = std::string_view::npos;
    size_t end = 0;  // after the closing brace (whole)
};

call_read read_call(std::string_view s, size_t pos) {
    call_read r;
    auto cut = [&] {
        r.st = call_read::state::cut;
        return r;
    };
    if (pos >= s.size()) return cut();
    if (s[pos] != '{') return r;
    pos = skip_ws(s, pos + 1);
    bool first = true;
    while (true) {
        if (pos >= s.size()) return cut();
        if (s[pos] == '}' && !first) {
            if (!r.name || r.args_begin == std::string_view::npos) return r;
            r.end = pos + 1;
            r.st = call_read::state::whole;
            return r;
        }
        if (!first) {
            if (s[pos] != ',') return r;
            pos = skip_ws(s, pos + 1);
            if (pos >= s.size()) return cut();
        }
        first = false;
        const size_t key_end = value_end(s, pos);
        if (key_end == std::string_view::npos) return cut();
        if (s[pos] != '"' || !json::accept(s.substr(pos, key_end - pos))) return r;
        const std::string key = json::parse(s.substr(pos, key_end - pos)).get<std::string>();
        pos = skip_ws(s, key_end);
        if (pos >= s.size()) return cut();
        if (s[pos] != ':') return r;
        pos = skip_ws(s, pos + 1);
        const size_t v_end = value_end(s, pos);
        const bool is_args = key == "arguments" || key == "parameters";
        if (is_args) {
            if (r.args_begin != std::string_view::npos || pos >= s.size()) {
                return pos >= s.size() ? cut() : r;
            }
            if (s[pos] != '{') return r;
            r.args_begin = pos;
        }
        if (v_end == std::string_view::npos) return cut();
        const std::string_view v = s.substr(pos, v_end - pos);
        if (!json::accept(v)) return r;
        if (key == "name") {
            if (v[0] != '"' || r.name) return r;
            r.name = json::parse(v).get<std::string>();
        } else if (is_args) {
            r.args_end = v_end;
        } else if (!(key == "type" && v == "\"function\"") && !(key == "id" && v[0] == '"')) {
            return r;
        }
        pos = skip_ws(s, v_end);
    }
}

// The calls region of an answer, read as far as it goes.
struct region_read {
    bool ok = false;   // whole (or, when cut is allowed, whole so far)
    bool cut = false;  // the text ended inside a call
    std::vector<call_read> calls;
};

// Expects `what` at pos; with the text ending inside it, reports cut.
enum class literal_match { yes, no, cut };
literal_match expect(std::string_view s, size_t pos, std::string_view what) {
    const std::string_view have = s.substr(pos, what.size());
    if (have == what) return literal_match::yes;
    return what.substr(0, have.size()) == have && have.size() < what.size() ? literal_match::cut
                                                                            : literal_match::no;
}

// Reads the calls of format f from `begin` (where the region starts) to the end of `s`.
region_read read_region(tool_format f, std::string_view s, size_t begin) {
    region_read out;
    size_t pos = begin;
    auto literal = [&](std::string_view what) {
        switch (expect(s, pos, what)) {
            case literal_match::yes:
                pos += what.size();
                return true;
            case literal_match::cut:
                out.cut = true;
                return false;
            case literal_match::no:
                return false;
        }
        return false;
    };
    // One call after whitespace; false: the region ends here (cut, where the text ends too, or
    // malformed).
    auto call = [&] {
        pos = skip_ws(s, pos);
        call_read c = read_call(s, pos);
        if (c.st == call_read::state::bad) {
            // Kept for a constrained answer's reading (a call named is a call begun, whatever
            // follows), never for a whole parse (ok stays false).
            if (c.name) out.calls.push_back(c);
            return false;
        }
        out.calls.push_back(c);
        if (c.st == call_read::state::cut || out.calls.size() > tool_calls_max) {
            out.cut = c.st == call_read::state::cut;
            return false;
        }
        pos = skip_ws(s, c.end);
        return true;
    };
    switch (f) {
        case tool_format::none:
            return out;
        case tool_format::hermes:
            while ((pos = skip_ws(s, pos)) < s.size()) {
                if (!literal("<tool_call>") || !call() || !literal("</tool_call>")) return out;
            }
            break;
        case tool_format::mistral:
            if (!literal("[TOOL_CALLS]")) return out;
            pos = skip_ws(s, pos);
            if (!literal("[")) return out;
            while (true) {
                if (!call()) return out;
                if (pos == s.size()) {
                    out.cut = true;
                    return out;
                }
                if (s[pos] == ']') break;
                if (s[pos] != ',') return out;
                pos++;
            }
            if (skip_ws(s, pos + 1) != s.size()) return out;
            break;
        case tool_format::llama3_json:
            if (starts_with_at(s, pos, "<|python_tag|>")) {
                pos += std::string_view("<|python_tag|>").size();
            } else if (!literal("<|python_tag|>") && out.cut) {
                return out;
            }
            do {
                if (!call()) return out;
                while (pos < s.size() && (is_ws(s[pos]) || s[pos] == ';')) pos++;
            } while (pos < s.size());
            break;
    }
    out.ok = !out.calls.empty();
    return out;
}

// Where format f's calls may begin in `s`: npos when nowhere (yet).
size_t region_begin(tool_format f, std::string_view s) {
    switch (f) {
        case tool_format::none:
            return std::string_view::npos;
        case tool_format::hermes:
            return s.find("<tool_call>");
        case tool_format::mistral:
            return s.find("[TOOL_CALLS]");
        case tool_format::llama3_json: {
            const size_t p = skip_ws(s, 0);  // the answer itself is the call
            return p < s.size() && (s[p] == '{' || starts_with_at(s, p, "<|python_tag|>"))
                       ? p
                       : std::string_view::npos;
        }
    }
    return std::string_view::npos;
}

// How many bytes at the end of `s` may be the first bytes of where a call begins: held back
// from the stream. For llama3_json: all of a text that is whitespace so far, or the first bytes
// of "<|python_tag|>" after it; once something else begins the answer, nothing.
size_t held_tail(tool_format f, std::string_view s) {
    std::string_view marker;
    switch (f) {
        case tool_format::none:
            return 0;
        case tool_format::hermes:
            marker = "<tool_call>";
            break;
        case tool_format::mistral:
            marker = "[TOOL_CALLS]";
            break;
        case tool_format::llama3_json: {
            const size_t p = skip_ws(s, 0);
            if (p == s.size()) return s.size();
            return expect(s, p, "<|python_tag|>") == literal_match::cut ? s.size() : 0;
        }
    }
    for (size_t n = std::min(marker.size() - 1, s.size()); n > 0; n--) {
        if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
    }
    return 0;
}

tool_delta content_delta(std::string text) {
    return {std::move(text), -1, "", ""};
}

tool_call call_of(std::string_view s, const call_read& c) {
    const size_t end = c.args_end != std::string_view::npos ? c.args_end : s.size();
    const size_t begin = c.args_begin != std::string_view::npos ? c.args_begin : end;
    return {*c.name, std::string(s.substr(begin, end - begin))};
}

}  // namespace

tool_format tool_format_of(std::string_view t) {
    auto has = [&](std::string_view what) { return t.find(what) != std::string_view::npos; };
    if (has("<tool_call>")) return tool_format::hermes;
    if (has("[TOOL_CALLS]")) return tool_format::mistral;
    // Llama 3.1's templates tell the model 'Respond in the format {"name": function name,
    // "parameters": ...}' inside Llama 3's header tokens.
    if (has("<|start_header_id|>") && has("\"parameters\": ")) return tool_format::llama3_json;
    return tool_format::none;
}

result<std::string> tool_calls_gbnf(tool_format f, std::span<const tool_function> tools,
                                    bool parallel, const json_schema_limits& limits) {
    assert(f != tool_format::none && !tools.empty());
    json_schema_rules rules(limits);
    const std::string_view args_key = f == tool_format::llama3_json ? "parameters" : "arguments";
    std::string fn;
    for (size_t i = 0; i < tools.size(); i++) {
        const tool_function& t = tools[i];
        const std::string at = "tools: the parameters of function \"" + t.name + "\"";
        std::string args = "object-any";
        const auto& p = t.parameters;
        if (!p.is_null() && !(p.is_object() && p.empty())) {
            if (!p.is_object() || !p.contains("type") || p["type"] != "object") {
                return make_error("bad_schema", at + ": a schema of type \"object\" (arguments "
                                                     "are a JSON object)");
            }
            auto e = rules.add(p);
            if (!e) return make_error("bad_schema", at + ": " + e.err().message);
            args = std::move(*e);
        }
        // Names are letters, digits, '_' and '-' (checked by the caller): no escapes needed.
        fn += std::string(i == 0 ? "" : " | ") + "\"\\\"" + t.name + "\\\", \\\"" +
              std::string(args_key) + "\\\": \" " + args;
    }
    const std::string more = "{0," + std::to_string(tool_calls_max - 1) + "}";
    std::string g = "fn ::= " + fn + "\n" + "call ::= \"{\\\"name\\\": \" fn \"}\"\n";
    switch (f) {
        case tool_format::llama3_json:
            g = "root ::= \"<|python_tag|>\"? call\n" + g;
            break;
        case tool_format::hermes:
            g = "root ::= tagged" + (parallel ? " (\"\\n\" tagged)" + more : std::string()) +
                "\ntagged ::= \"<tool_call>\\n\" call \"\\n</tool_call>\"\n" + g;
            break;
        case tool_format::mistral:
            g = "root ::= \"[TOOL_CALLS][\" call" +
                (parallel ? " (\", \" call)" + more : std::string()) + " \"]\"\n" + g;
            break;
        case tool_format::none:
            break;
    }
    return g + rules.rules();
}

std::vector<std::string> tool_call_triggers(tool_format f) {
    switch (f) {
        case tool_format::none:
            return {};
        case tool_format::hermes:
            return {"<tool_call>"};
        case tool_format::mistral:
            return {"[TOOL_CALLS]"};
        // The answer itself is the call: only where it begins.
        case tool_format::llama3_json:
            return {"^{", "^<|python_tag|>"};
    }
    return {};
}

tool_output parse_tool_output(tool_format f, bool constrained, std::string_view text) {
    tool_output out;
    const size_t begin = region_begin(f, text);
    if (begin == std::string_view::npos) {
        out.content = std::string(text);
        return out;
    }
    const region_read r = read_region(f, text, begin);
    if (constrained) {
        for (const call_read& c : r.calls) {
            if (c.name) out.calls.push_back(call_of(text, c));
        }
    } else if (r.ok && !r.cut) {
        for (const call_read& c : r.calls) out.calls.push_back(call_of(text, c));
    }
    out.content = out.calls.empty() ? std::string(text) : std::string(rtrim(text.substr(0, begin)));
    return out;
}

std::vector<tool_delta> tool_stream::feed(std::string_view text) {
    _text += text;
    if (_constrained) return constrained_pieces(false);
    std::vector<tool_delta> out;
    if (_in_calls) return out;
    if (region_begin(_f, _text) != std::string_view::npos) _in_calls = true;
    // Content as far as it is certain: not a marker's first bytes, nor whitespace that comes
    // before a call (the whole answer's content ends before it).
    size_t end = _in_calls ? region_begin(_f, _text) : _text.size() - held_tail(_f, _text);
    if (_f != tool_format::none) {
        while (end > _content_sent && is_ws(_text[end - 1])) end--;
    }
    if (end > _content_sent) {
        out.push_back(content_delta(_text.substr(_content_sent, end - _content_sent)));
        _content_sent = end;
    }
    return out;
}

std::vector<tool_delta> tool_stream::finish() {
    if (_constrained) return constrained_pieces(true);
    std::vector<tool_delta> out;
    const tool_output whole = parse_tool_output(_f, false, _text);
    // What went out is the start of the content (feed never passes the end of it).
    assert(whole.content.compare(0, _content_sent, _text, 0, _content_sent) == 0);
    if (whole.content.size() > _content_sent) {
        out.push_back(content_delta(whole.content.substr(_content_sent)));
        _content_sent = whole.content.size();
    }
    for (size_t i = 0; i < whole.calls.size(); i++) {
        out.push_back({"", int32_t(i), whole.calls[i].name, whole.calls[i].arguments});
    }
    _calls_begun = whole.calls.size();
    return out;
}

// The constrained answer's calls so far (parse_tool_output's reading of the text so far): a new
// call's name, then what its arguments grew by.
std::vector<tool_delta> tool_stream::constrained_pieces(bool last) {
    std::vector<tool_delta> out;
    const tool_output now = parse_tool_output(_f, true, _text);
    // Content: none under a grammar, whose answer is calls only; at the end of one cut before
    // its first name, the text so far (as parse_tool_output says).
    if ((last || !now.calls.empty()) && _content_sent < now.content.size()) {
        out.push_back(content_delta(now.content.substr(_content_sent)));
        _content_sent = now.content.size();
    }
    for (size_t i = 0; i < now.calls.size(); i++) {
        const tool_call& c = now.calls[i];
        if (i + 1 < _calls_begun) continue;  // sent whole already
        if (i >= _calls_begun) {
            _calls_begun = i + 1;
            _args_sent = 0;
            out.push_back({"", int32_t(i), c.name, ""});
        }
        if (c.arguments.size() > _args_sent) {
            out.push_back({"", int32_t(i), "", c.arguments.substr(_args_sent)});
            _args_sent = c.arguments.size();
        }
    }
    return out;
}

std::string tool_call_id(tool_format f, std::string_view answer_id, size_t index) {
    static constexpr char alphabet[] =
        "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    const size_t n = f == tool_format::mistral ? 9 : 24;
    std::string out = f == tool_format::mistral ? "" : "call_";
    // Ten characters per hash (62^10 < 2^64), each hash of the answer's id seeded by the
    // call's index and the block.
    uint64_t h = 0;
    for (size_t i = 0; i < n; i++) {
        if (i % 10 == 0) {
            h = XXH3_64bits_withSeed(answer_id.data(), answer_id.size(),
                                     (uint64_t(index) << 8) | (i / 10));
        }
        out += alphabet[h % 62];
        h /= 62;
    }
    return out;
}

}  // namespace ordo::grammar
