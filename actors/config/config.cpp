// config.cpp: reads, validates, overrides and prints the configuration by walking the key table
// in schema.cpp. Pure logic: no actors, no logging; used by the bootstrap before anything starts.
//
// Validation collects every problem before answering, so one run of `--check-config` shows them
// all. toml++ reports only its first syntax error (it stops parsing there), so a syntax error is
// reported alone. toml++ exceptions (Debian builds it with them) are caught here and never leave.
#include "actors/config/config.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <vector>

#include "actors/config/internal.hpp"
#include "actors/config/schema.hpp"

namespace ordo::config {
namespace {

// A config file is a few kilobytes; anything past this is not one.
constexpr std::size_t config_file_bytes_max = 1024 * 1024;

constexpr std::string_view command_line_source = "command line";

std::string_view node_type_name(const toml::node& n) {
    switch (n.type()) {
        case toml::node_type::table:
            return "table";
        case toml::node_type::array:
            return "array";
        case toml::node_type::string:
            return "string";
        case toml::node_type::integer:
            return "integer";
        case toml::node_type::floating_point:
            return "float";
        case toml::node_type::boolean:
            return "boolean";
        case toml::node_type::date:
            return "date";
        case toml::node_type::time:
            return "time";
        case toml::node_type::date_time:
            return "date-time";
        case toml::node_type::none:
            break;
    }
    return "nothing";
}

// The node as TOML text for an error message; tables and arrays are abbreviated.
std::string node_text(const toml::node& n) {
    if (n.is_table()) return "{...}";
    if (n.is_array()) return "[...]";
    // Strings are shown as written in basic (double-quoted) form, the way to_toml writes them.
    if (n.is_string()) return quote_toml(n.as_string()->get());
    std::ostringstream os;
    n.visit([&](const auto& v) { os << v; });
    return os.str();
}

// An array as TOML text, its entries shown as node_text shows them (nested ones abbreviated).
std::string array_text(const toml::array& a) {
    std::string out = "[";
    for (const toml::node& n : a) out += (out.size() > 1 ? ", " : "") + node_text(n);
    return out + "]";
}

// A choice_list's names or a string_list's strings from a TOML array: "" and the strings in
// `names`, or what is wrong with it.
std::string names_of(const key_spec& spec, const toml::array& a, std::vector<std::string>& names) {
    for (const toml::node& n : a) {
        if (!n.is_string()) {
            return "wrong type: expected " + describe_domain(spec) + ", got an entry of type " +
                   std::string(node_type_name(n));
        }
        names.push_back(n.as_string()->get());
    }
    return "";
}

std::uint32_t line_of(const toml::key& k) {
    return k.source().begin.line;
}

// Applies one TOML value to cfg after checking its type and domain; false when refused.
bool apply_node(const key_spec& spec, const toml::node& node, std::uint32_t line, config& cfg,
                report& r) {
    const bool list =
        (spec.kind == value_kind::choice_list || spec.kind == value_kind::string_list) &&
        node.is_array();
    const std::string value = list ? array_text(*node.as_array()) : node_text(node);
    auto wrong_type = [&] {
        r.add(line, spec, value,
              "wrong type: expected " + describe_domain(spec) + ", got " +
                  std::string(node_type_name(node)));
        return false;
    };
    std::string why;
    switch (spec.kind) {
        case value_kind::integer: {
            if (!node.is_integer()) return wrong_type();
            const std::int64_t v = node.as_integer()->get();
            if (why = check_int_value(spec, v); why.empty()) spec.set_int(cfg, v);
            break;
        }
        case value_kind::boolean:
            if (!node.is_boolean()) return wrong_type();
            spec.set_int(cfg, node.as_boolean()->get() ? 1 : 0);
            break;
        case value_kind::string: {
            if (!node.is_string()) return wrong_type();
            const std::string& v = node.as_string()->get();
            if (why = check_str_value(spec, v); why.empty()) spec.set_str(cfg, v);
            break;
        }
        case value_kind::choice: {
            if (!node.is_string()) return wrong_type();
            const std::int64_t index = choice_index(spec, node.as_string()->get());
            if (why = check_int_value(spec, index); why.empty()) spec.set_int(cfg, index);
            break;
        }
        case value_kind::choice_list: {
            if (!list) return wrong_type();
            std::vector<std::string> names;
            std::vector<std::int64_t> indices;
            why = names_of(spec, *node.as_array(), names);
            if (why.empty()) why = choice_list_from_names(spec, names, indices);
            if (why.empty()) spec.set_list(cfg, indices);
            break;
        }
        case value_kind::string_list: {
            if (!list) return wrong_type();
            std::vector<std::string> strings;
            why = names_of(spec, *node.as_array(), strings);
            if (why.empty()) why = check_strs_value(spec, strings);
            if (why.empty()) spec.set_strs(cfg, strings);
            break;
        }
    }
    if (!why.empty()) r.add(line, spec, value, why);
    return why.empty();
}

void apply_section(const toml::table& tbl, std::string_view section, config& cfg,
                   std::vector<std::uint32_t>& lines, report& r) {
    const auto all = schema();
    for (auto&& [k, node] : tbl) {
        const key_spec* spec = find_key(section, k.str());
        if (spec == nullptr) {
            const std::string full = std::string(section) + "." + std::string(k.str());
            r.add_unknown(line_of(k), full, "unknown key" + suggestion(section, k.str()));
            continue;
        }
        lines[static_cast<std::size_t>(spec - all.data())] = line_of(k);
        apply_node(*spec, node, line_of(k), cfg, r);
    }
}

void apply_root(const toml::table& root, config& cfg, std::vector<std::uint32_t>& lines,
                report& r) {
    const auto known = sections();
    for (auto&& [k, node] : root) {
        const std::string_view name = k.str();
        const bool is_section = std::find(known.begin(), known.end(), name) != known.end();
        if (!is_section) {
            const std::string why = node.is_table() ? "unknown section [" + std::string(name) + "]"
                                                    : "unknown key outside any section";
            r.add_unknown(line_of(k), std::string(name), why + suggestion("", name));
        } else if (!node.is_table()) {
            r.add_unknown(line_of(k), std::string(name),
                          "must be a table ([" + std::string(name) + "]), got " +
                              std::string(node_type_name(node)));
        } else {
            apply_section(*node.as_table(), name, cfg, lines, r);
        }
    }
}

// Parses TOML into a table, or says where the syntax is wrong.
result<toml::table> parse_toml(std::string_view text, std::string_view source_name) {
    auto syntax_error = [&](const toml::parse_error& e) {
        const auto& at = e.source().begin;
        return make_error("config_invalid",
                          std::string(source_name) + ":" + std::to_string(at.line) + ":" +
                              std::to_string(at.column) +
                              ": TOML syntax error: " + std::string(e.description()));
    };
#if TOML_EXCEPTIONS
    try {
        return toml::parse(text, source_name);
    } catch (const toml::parse_error& e) {
        return syntax_error(e);
    }
#else
    toml::parse_result parsed = toml::parse(text, source_name);
    if (!parsed) return syntax_error(parsed.error());
    return std::move(parsed).table();
#endif
}

// Parses command-line text for spec into the integer form (integer, boolean, choice index).
bool int_from_text(const key_spec& spec, std::string_view text, std::int64_t& out) {
    switch (spec.kind) {
        case value_kind::integer: {
            const char* end = text.data() + text.size();
            auto [ptr, ec] = std::from_chars(text.data(), end, out);
            return !text.empty() && ec == std::errc{} && ptr == end;
        }
        case value_kind::boolean:
            if (text != "true" && text != "false") return false;
            out = text == "true" ? 1 : 0;
            return true;
        case value_kind::choice:
            out = choice_index(spec, text);
            return true;
        case value_kind::string:
        case value_kind::choice_list:
        case value_kind::string_list:
            break;
    }
    return false;
}

// "a,b" as the names a choice_list or string_list override gives; "" is the empty list.
std::vector<std::string> split_names(std::string_view text) {
    std::vector<std::string> names;
    while (!text.empty()) {
        const std::size_t comma = text.find(',');
        names.emplace_back(text.substr(0, comma));
        if (comma == std::string_view::npos) break;
        text.remove_prefix(comma + 1);
        if (text.empty()) names.emplace_back();  // "a," names an empty entry: refused
    }
    return names;
}

}  // namespace

result<config> parse(std::string_view toml_text, std::string_view source_name) {
    try {
        auto root = parse_toml(toml_text, source_name);
        if (!root.ok()) return root.err();
        config cfg;
        report r(source_name);
        std::vector<std::uint32_t> lines(schema().size(), 0);
        apply_root(*root, cfg, lines, r);
        // A refused value left its default behind; cross rules on it would only mislead.
        if (r.empty()) check_cross_rules(cfg, lines, r);
        if (auto st = r.finish(); !st.ok()) return st.err();
        return cfg;
    } catch (const std::exception& e) {
        // Only allocation failure can land here; it must not cross the module boundary.
        return make_error("config_invalid",
                          std::string(source_name) + ": cannot parse: " + e.what());
    }
}

result<config> load_file(const std::string& path) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) {
        return make_error("config_invalid", path + ": cannot open: " + std::strerror(errno));
    }
    std::string text(config_file_bytes_max + 1, '\0');
    const std::size_t n = std::fread(text.data(), 1, text.size(), f);
    const int read_errno = std::ferror(f) ? errno : 0;
    std::fclose(f);
    if (read_errno != 0) {
        return make_error("config_invalid", path + ": cannot read: " + std::strerror(read_errno));
    }
    if (n > config_file_bytes_max) {
        return make_error("config_invalid", path + ": larger than " +
                                                std::to_string(config_file_bytes_max) +
                                                " bytes; not a config file");
    }
    text.resize(n);
    return parse(text, path);
}

status apply_override(config& cfg, std::string_view key, std::string_view value) {
    report r(command_line_source);
    const std::size_t dot = key.find('.');
    const key_spec* spec =
        dot == std::string_view::npos ? nullptr : find_key(key.substr(0, dot), key.substr(dot + 1));
    if (spec == nullptr) {
        const std::string_view section = dot == std::string_view::npos ? "" : key.substr(0, dot);
        const std::string_view name = dot == std::string_view::npos ? key : key.substr(dot + 1);
        r.add_unknown(0, std::string(key), "unknown key" + suggestion(section, name));
        return r.finish();
    }
    const std::string shown = quote_toml(value);
    if (spec->kind == value_kind::choice_list) {
        std::vector<std::int64_t> indices;
        if (auto why = choice_list_from_names(*spec, split_names(value), indices); !why.empty()) {
            r.add(0, *spec, shown, why);
        } else {
            spec->set_list(cfg, indices);
        }
        return r.finish();
    }
    if (spec->kind == value_kind::string_list) {
        const std::vector<std::string> strings = split_names(value);
        if (auto why = check_strs_value(*spec, strings); !why.empty()) {
            r.add(0, *spec, shown, why);
        } else {
            spec->set_strs(cfg, strings);
        }
        return r.finish();
    }
    if (spec->kind == value_kind::string) {
        if (auto why = check_str_value(*spec, value); !why.empty()) {
            r.add(0, *spec, shown, why);
        } else {
            spec->set_str(cfg, value);
        }
        return r.finish();
    }
    std::int64_t v = 0;
    if (!int_from_text(*spec, value, v)) {
        r.add(0, *spec, shown, "expected " + describe_domain(*spec));
    } else if (auto why = check_int_value(*spec, v); !why.empty()) {
        r.add(0, *spec, shown, why);
    } else {
        spec->set_int(cfg, v);
    }
    return r.finish();
}

status validate(const config& cfg, std::string_view source_name) {
    report r(source_name);
    for (const key_spec& spec : schema()) {
        if (spec.kind == value_kind::string) {
            const std::string& v = spec.get_str(cfg);
            if (auto why = check_str_value(spec, v); !why.empty()) {
                r.add(0, spec, quote_toml(v), why);
            }
        } else if (spec.kind == value_kind::choice_list) {
            if (auto why = check_list_value(spec, spec.get_list(cfg)); !why.empty()) {
                r.add(0, spec, value_toml(spec, cfg), why);
            }
        } else if (spec.kind == value_kind::string_list) {
            if (auto why = check_strs_value(spec, spec.get_strs(cfg)); !why.empty()) {
                r.add(0, spec, value_toml(spec, cfg), why);
            }
        } else {
            const std::int64_t v = spec.get_int(cfg);
            if (auto why = check_int_value(spec, v); !why.empty()) {
                r.add(0, spec, value_toml(spec, cfg), why);
            }
        }
    }
    if (r.empty()) check_cross_rules(cfg, std::vector<std::uint32_t>(schema().size(), 0), r);
    return r.finish();
}

std::string to_toml(const config& cfg) {
    std::string out =
        "# ordo effective configuration (see etc/ordo.toml for the full documentation)\n";
    for (std::string_view section : sections()) {
        out += "\n[" + std::string(section) + "]\n";
        for (const key_spec& spec : schema()) {
            if (spec.section != section) continue;
            out += "# " + std::string(spec.doc) + " (" + describe_domain(spec) + ")\n";
            out += std::string(spec.name) + " = " + value_toml(spec, cfg) + "\n";
        }
    }
    return out;
}

}  // namespace ordo::config
