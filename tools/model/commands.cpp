// commands.cpp: registry, argument parsing and JSON helpers shared by every ordo-model command.
#include "tools/model/commands.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "model/tokenizer.hpp"

namespace ordo::tools {

namespace {

// Function-local so registration from other translation units' static objects is safe
// regardless of initialisation order.
std::vector<command>& registry() {
    static std::vector<command> commands;
    return commands;
}

bool contains(const std::vector<std::string_view>& v, std::string_view s) {
    return std::find(v.begin(), v.end(), s) != v.end();
}

error usage_error(std::string message) {
    return make_error("usage", std::move(message));
}

}  // namespace

void register_command(const command& c) {
    registry().push_back(c);
}

const command* find_command(std::string_view name) {
    for (const auto& c : registry()) {
        if (c.name == name) return &c;
    }
    return nullptr;
}

std::vector<command> all_commands() {
    auto out = registry();
    std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.name < b.name; });
    return out;
}

// ---- arguments --------------------------------------------------------------------------------

bool parsed_args::flag(std::string_view name) const {
    return std::find(flags.begin(), flags.end(), name) != flags.end();
}

std::optional<std::string> parsed_args::option(std::string_view name) const {
    auto it = options.find(name);
    if (it == options.end()) return std::nullopt;
    return it->second;
}

result<std::optional<int64_t>> parsed_args::option_i64(std::string_view name) const {
    auto v = option(name);
    if (!v) return std::optional<int64_t>{};
    int64_t out = 0;
    auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), out);
    if (ec != std::errc() || end != v->data() + v->size()) {
        return usage_error("--" + std::string(name) + " needs an integer, got '" + *v + "'");
    }
    return std::optional<int64_t>(out);
}

result<std::optional<double>> parsed_args::option_f64(std::string_view name) const {
    auto v = option(name);
    if (!v) return std::optional<double>{};
    double out = 0;
    auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), out);
    if (ec != std::errc() || end != v->data() + v->size() || !std::isfinite(out)) {
        return usage_error("--" + std::string(name) + " needs a number, got '" + *v + "'");
    }
    return std::optional<double>(out);
}

result<parsed_args> parse_args(std::span<const std::string> argv, const arg_spec& spec) {
    parsed_args out;
    bool options_done = false;
    for (size_t i = 0; i < argv.size(); ++i) {
        const std::string& a = argv[i];
        if (options_done || a.size() < 3 || a.compare(0, 2, "--") != 0) {
            if (a == "--") {
                options_done = true;
                continue;
            }
            out.positional.push_back(a);
            continue;
        }
        std::string name = a.substr(2);
        std::optional<std::string> value;
        if (auto eq = name.find('='); eq != std::string::npos) {
            value = name.substr(eq + 1);
            name.resize(eq);
        }
        if (contains(spec.flags, name)) {
            if (value) return usage_error("--" + name + " takes no value");
            out.flags.push_back(name);
        } else if (contains(spec.value_options, name)) {
            if (!value) {
                if (i + 1 >= argv.size()) return usage_error("--" + name + " needs a value");
                value = argv[++i];
            }
            out.options[name] = *value;
        } else {
            return usage_error("unknown option --" + name);
        }
    }
    if (out.positional.size() < spec.positional_min) {
        return usage_error("expected at least " + std::to_string(spec.positional_min) +
                           " argument(s), got " + std::to_string(out.positional.size()));
    }
    if (out.positional.size() > spec.positional_max) {
        return usage_error("expected at most " + std::to_string(spec.positional_max) +
                           " argument(s), got " + std::to_string(out.positional.size()));
    }
    return out;
}

// ---- output -----------------------------------------------------------------------------------

int report_error(const error& e, const command* cmd) {
    std::fprintf(stderr, "ordo-model: %s: %s\n", e.code.c_str(), e.message.c_str());
    if (e.code == "usage") {
        if (cmd)
            std::fprintf(stderr, "usage: ordo-model %.*s\n", int(cmd->usage.size()),
                         cmd->usage.data());
        return k_exit_usage;
    }
    return k_exit_failed;
}

std::string json_string(std::string_view s) {
    std::string clean;
    model::utf8_sanitize(s, true, clean);
    std::string out = "\"";
    for (unsigned char c : clean) {
        switch (c) {
            case '"':
                out += "\\\"";
                break;
            case '\\':
                out += "\\\\";
                break;
            case '\n':
                out += "\\n";
                break;
            case '\r':
                out += "\\r";
                break;
            case '\t':
                out += "\\t";
                break;
            default:
                if (c < 0x20 || c == 0x7f) {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\u%04x", c);
                    out += buf;
                } else {
                    out += char(c);
                }
        }
    }
    return out + "\"";
}

std::string json_number(double v) {
    if (!std::isfinite(v)) return "null";
    char buf[40];
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    return ec == std::errc() ? std::string(buf, end) : "null";
}

}  // namespace ordo::tools
