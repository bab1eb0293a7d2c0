// chat.cpp: see chat.hpp.
#include "net/chat.hpp"

#include <array>
#include <ctime>
#include <span>

#include "scheduler/scheduler_msgs.hpp"

namespace ordo::net {
namespace {

using fields::bad;

// The roles a message may have (docs/protocol.md "chat").
constexpr std::array<std::string_view, 4> k_roles{"system", "user", "assistant", "tool"};
// The keys a message may have besides role and content.
constexpr std::array<std::string_view, 3> k_message_extras{"name", "tool_call_id", "tool_calls"};
// Variables the request's own keys set; chat_template_kwargs may not replace them.
constexpr std::array<std::string_view, 5> k_reserved_vars{
    "messages", "tools", "add_generation_prompt", "bos_token", "eos_token"};

// A client's key inside a path ("messages[0].name"): quoted bytes without the quotes.
std::string path_key(std::string_view k) {
    std::string q = fields::quote(k);
    return q.substr(1, q.size() - 2);
}

template <size_t N>
bool one_of(const std::array<std::string_view, N>& set, std::string_view s) {
    for (std::string_view x : set) {
        if (x == s) return true;
    }
    return false;
}

std::string join(std::span<const std::string_view> set) {
    std::string out;
    for (size_t i = 0; i < set.size(); i++) {
        if (i > 0) out += i + 1 == set.size() ? " or " : ", ";
        out += set[i];
    }
    return out;
}

result<jinja::value> convert(const std::string& path, const msgpack::object& o, uint32_t depth,
                             uint32_t depth_max) {
    if (depth > depth_max) {
        return bad(path, "nested at most " + std::to_string(depth_max) + " levels", "deeper");
    }
    switch (o.type) {
        case msgpack::type::NIL:
            return jinja::value::none();
        case msgpack::type::BOOLEAN:
            return jinja::value(o.via.boolean);
        case msgpack::type::POSITIVE_INTEGER:
            if (o.via.u64 > uint64_t(INT64_MAX)) return bad(path, "an integer within int64", o);
            return jinja::value(int64_t(o.via.u64));
        case msgpack::type::NEGATIVE_INTEGER:
            return jinja::value(int64_t(o.via.i64));
        case msgpack::type::FLOAT32:
        case msgpack::type::FLOAT64:
            return jinja::value(o.via.f64);
        case msgpack::type::STR: {
            auto s = fields::read_string(path, o, sched::prompt_bytes_max);
            if (!s) return s.err();
            return jinja::value(std::move(*s));
        }
        case msgpack::type::ARRAY: {
            std::vector<jinja::value> items;
            items.reserve(o.via.array.size);
            for (uint32_t i = 0; i < o.via.array.size; i++) {
                auto v = convert(path + "[" + std::to_string(i) + "]", o.via.array.ptr[i],
                                 depth + 1, depth_max);
                if (!v) return v.err();
                items.push_back(std::move(*v));
            }
            return jinja::value::list(std::move(items));
        }
        case msgpack::type::MAP: {
            jinja::dict_data d;
            for (uint32_t i = 0; i < o.via.map.size; i++) {
                const auto& kv = o.via.map.ptr[i];
                auto k = fields::read_string(path + " key", kv.key, sched::prompt_bytes_max);
                if (!k) return k.err();
                if (d.find(std::string_view(*k)) != nullptr)
                    return bad(path, "unique keys", fields::quote(*k) + " twice");
                auto v = convert(path + "." + path_key(*k), kv.val, depth + 1, depth_max);
                if (!v) return v.err();
                d.set(jinja::value(std::move(*k)), std::move(*v));
            }
            return jinja::value::dict(std::move(d));
        }
        default:
            return bad(path, "nil, a boolean, a number, a string, an array or a map", o);
    }
}

// One message: {role, content, name?, tool_call_id?, tool_calls?}.
result<jinja::value> read_message(size_t index, const msgpack::object& o) {
    const std::string at = "messages[" + std::to_string(index) + "]";
    if (o.type != msgpack::type::MAP) return bad(at, "a map {role, content}", o);
    const msgpack::object* role = nullptr;
    const msgpack::object* content = nullptr;
    const msgpack::object* tool_calls = nullptr;
    for (uint32_t i = 0; i < o.via.map.size; i++) {
        const auto& kv = o.via.map.ptr[i];
        if (kv.key.type != msgpack::type::STR) return bad(at + " key", "a string", kv.key);
        std::string_view k(kv.key.via.str.ptr, kv.key.via.str.size);
        if (k == "role")
            role = &kv.val;
        else if (k == "content")
            content = &kv.val;
        else if (k == "tool_calls")
            tool_calls = &kv.val;
        else if (!one_of(k_message_extras, k)) {
            return make_error("bad_request", "unknown key \"" + at + "." + path_key(k) + "\"" +
                                                 " (a message has role, content, name, "
                                                 "tool_call_id, tool_calls)");
        }
    }
    if (role == nullptr) return make_error("bad_request", "\"" + at + ".role\" is required");
    auto r = fields::read_string(at + ".role", *role, 16);
    if (!r) return r.err();
    if (!one_of(k_roles, *r)) {
        return bad(at + ".role", join(k_roles), fields::quote(*r));
    }
    if (content == nullptr) return make_error("bad_request", "\"" + at + ".content\" is required");
    const bool may_be_nil = *r == "assistant" && tool_calls != nullptr;
    if (content->type == msgpack::type::NIL ? !may_be_nil : content->type != msgpack::type::STR) {
        return bad(at + ".content",
                   may_be_nil ? "a string or nil" : "a string (nil only with tool_calls)",
                   *content);
    }
    if (tool_calls != nullptr && tool_calls->type != msgpack::type::ARRAY) {
        return bad(at + ".tool_calls", "an array", *tool_calls);
    }
    // Keys in the order the client sent them (tojson prints them so).
    return convert(at, o, 1, chat_value_depth_max);
}

}  // namespace

chat_setup make_chat_setup(std::string_view source_text, std::string source, std::string bos_token,
                           std::string eos_token) {
    chat_setup s;
    s.source = std::move(source);
    s.bos_token = std::move(bos_token);
    s.eos_token = std::move(eos_token);
    if (s.source == "none") return s;
    auto t = jinja::chat_template::parse(source_text, chat_render_limits());
    if (t) {
        s.tmpl = std::move(*t);
        s.tools = grammar::tool_format_of(source_text);
    } else {
        s.problem = t.err().message;
    }
    return s;
}

result<jinja::value> template_value(std::string_view key, const msgpack::object& o,
                                    uint32_t depth_max) {
    return convert(std::string(key), o, 1, depth_max);
}

result<chat_input> parse_chat_input(const fields::param_map& pm) {
    chat_input in;
    const msgpack::object* m = pm.get("messages");
    if (m == nullptr) return make_error("bad_request", "\"messages\" is required");
    if (m->type != msgpack::type::ARRAY) return bad("messages", "an array of messages", *m);
    if (m->via.array.size == 0 || m->via.array.size > chat_messages_max) {
        return bad("messages", "1.." + std::to_string(chat_messages_max) + " messages",
                   std::to_string(m->via.array.size));
    }
    std::vector<jinja::value> messages;
    messages.reserve(m->via.array.size);
    for (uint32_t i = 0; i < m->via.array.size; i++) {
        auto v = read_message(i, m->via.array.ptr[i]);
        if (!v) return v.err();
        messages.push_back(std::move(*v));
    }
    in.messages = jinja::value::list(std::move(messages));

    in.tools = jinja::value::none();
    if (const auto* t = pm.get("tools")) {
        if (t->type != msgpack::type::ARRAY)
            return bad("tools", "an array of tool definitions", *t);
        if (t->via.array.size > chat_tools_max) {
            return bad("tools", "at most " + std::to_string(chat_tools_max) + " tools",
                       std::to_string(t->via.array.size));
        }
        for (uint32_t i = 0; i < t->via.array.size; i++) {
            if (t->via.array.ptr[i].type != msgpack::type::MAP) {
                return bad("tools[" + std::to_string(i) + "]", "a map", t->via.array.ptr[i]);
            }
        }
        auto v = template_value("tools", *t);
        if (!v) return v.err();
        in.tools = std::move(*v);
    }
    if (const auto* g = pm.get("add_generation_prompt")) {
        auto v = fields::read_bool("add_generation_prompt", *g);
        if (!v) return v.err();
        in.add_generation_prompt = *v;
    }
    if (const auto* k = pm.get("chat_template_kwargs")) {
        if (k->type != msgpack::type::MAP) {
            return bad("chat_template_kwargs", "a map of variables", *k);
        }
        if (k->via.map.size > chat_kwargs_max) {
            return bad("chat_template_kwargs",
                       "at most " + std::to_string(chat_kwargs_max) + " variables",
                       std::to_string(k->via.map.size));
        }
        for (uint32_t i = 0; i < k->via.map.size; i++) {
            const auto& kv = k->via.map.ptr[i];
            auto name = fields::read_string("chat_template_kwargs key", kv.key, 64);
            if (!name) return name.err();
            if (one_of(k_reserved_vars, *name)) {
                return make_error("bad_request",
                                  "chat_template_kwargs." + *name + " is set by the request (" +
                                      join(k_reserved_vars) + " cannot be passed here)");
            }
            for (const auto& [n, _] : in.kwargs) {
                if (n == *name) {
                    return bad("chat_template_kwargs", "unique keys",
                               fields::quote(*name) + " twice");
                }
            }
            auto v = template_value("chat_template_kwargs." + path_key(*name), kv.val);
            if (!v) return v.err();
            in.kwargs.emplace_back(std::move(*name), std::move(*v));
        }
    }
    return in;
}

result<std::string> render_chat(const chat_setup* setup, const chat_input& in) {
    if (setup == nullptr || setup->source == "none") {
        return make_error(std::string(k_no_chat_template),
                          "the model file has no chat template (tokenizer.chat_template); give "
                          "one with model.chat_template_path in the config or "
                          "`ordo-server --chat-template FILE`, or send a `generate` prompt");
    }
    if (!setup->tmpl) {
        return make_error(
            std::string(jinja::k_template_error),
            "the chat template (" + setup->source + ") did not parse: " + setup->problem);
    }
    jinja::variables vars;
    for (const auto& [name, v] : in.kwargs) vars[name] = v;
    vars["messages"] = in.messages;
    vars["tools"] = in.tools;
    vars["add_generation_prompt"] = jinja::value(in.add_generation_prompt);
    vars["bos_token"] = jinja::value(setup->bos_token);
    vars["eos_token"] = jinja::value(setup->eos_token);
    jinja::render_options opt;
    opt.bounds = chat_render_limits();
    auto text = setup->tmpl->render(vars, opt);
    if (!text) {
        return make_error(std::string(jinja::k_template_error),
                          "chat template (" + setup->source + "): " + text.err().message);
    }
    if (text->size() > sched::prompt_bytes_max) {
        return make_error(std::string(jinja::k_template_error),
                          "the rendered chat is " + std::to_string(text->size()) +
                              " bytes; a prompt is at most " +
                              std::to_string(sched::prompt_bytes_max));
    }
    return std::move(*text);
}

}  // namespace ordo::net
