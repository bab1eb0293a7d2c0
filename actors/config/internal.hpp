// internal.hpp: helpers shared by the config sources (config.cpp, report.cpp, cross_rules.cpp);
// not part of the public API and not included outside actors/config/ and its tests.
//
// Owns how problems are collected and worded (`report`), how values are shown as TOML text, and
// the rules that tie two keys together.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "actors/config/schema.hpp"

namespace ordo::config {

// Collects every problem of one load, then answers them all at once, sorted by line.
class report {
public:
    explicit report(std::string_view source_name) : _source(source_name) {}

    // "SOURCE:LINE: section.key = VALUE: WHY" (no ":LINE" when line is 0: not from a file).
    void add(std::uint32_t line, const key_spec& spec, std::string_view value_text,
             std::string_view why);
    // "SOURCE:LINE: KEY: WHY" for keys that have no spec (unknown keys and sections).
    void add_unknown(std::uint32_t line, std::string_view key, std::string_view why);

    bool empty() const { return _items.empty(); }
    // ok when nothing was added; else config_invalid with one problem per line.
    status finish();

private:
    struct item {
        std::uint32_t line;
        std::string text;
    };
    std::string prefix(std::uint32_t line) const;

    std::string _source;
    std::vector<item> _items;
};

// "; did you mean server.listen?" when a known key or section is close to `name`, else "".
// section "" means `name` was found outside any section.
std::string suggestion(std::string_view section, std::string_view name);

// Index of `name` in spec.choices, or -1 (which check_int_value refuses).
std::int64_t choice_index(const key_spec& spec, std::string_view name);

// The choice_list value named by `names` (as spec.set_list takes it) in `out`; returns "" when
// every name is a choice and the list is within spec's bounds, else what is wrong, naming the
// first unknown name and the allowed ones ("\"bogus\" is not one of \"a\", \"b\"").
std::string choice_list_from_names(const key_spec& spec, const std::vector<std::string>& names,
                                   std::vector<std::int64_t>& out);

// s as a TOML basic string: quoted, with \ " and control characters escaped.
std::string quote_toml(std::string_view s);

// The current value of spec in cfg as TOML text.
std::string value_toml(const key_spec& spec, const config& cfg);

// Checks the rules that involve two keys; `lines[i]` is the line schema()[i] was set on (0 when
// not set in a file). Each broken rule is reported on the later of its keys' lines.
void check_cross_rules(const config& cfg, const std::vector<std::uint32_t>& lines, report& r);

}  // namespace ordo::config
