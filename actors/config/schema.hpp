// schema.hpp: the table of every configuration key — section, name, type, range or choices, a
// one-line doc, and accessors into ordo::config::config.
//
// Owns: the single description of the key set. config.cpp walks it to validate TOML and
// command-line overrides and to print the effective config; tests walk it to check that
// etc/ordo.toml documents every key. Adding a key = a member in config.hpp + one row in
// schema.cpp (+ its documented line in etc/ordo.toml). No per-key code anywhere else.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "actors/config/config.hpp"

namespace ordo::config {

// choice_list: a TOML array of names, each one of `choices` (an array of strings on the command
// line: the names separated by commas). string_list: a TOML array of strings, each checked as a
// string key's value is (on the command line: the strings separated by commas).
enum class value_kind : std::uint8_t { integer, boolean, string, choice, choice_list, string_list };

std::string_view to_string(value_kind k);

struct key_spec {
    std::string_view section;  // "server"
    std::string_view name;     // "max_connections"
    value_kind kind;
    std::string_view doc;  // one line: what it does and its unit

    // integer: inclusive bounds. boolean and choice values travel as 0/1 and choice indices,
    // and so do the entries of a choice_list (each within min..max).
    std::int64_t min = 0;
    std::int64_t max = 0;
    std::span<const std::string_view> choices;  // choice, choice_list: names in enum order
    std::size_t entries_max = 0;                // choice_list, string_list: entries at most

    // Used by integer, boolean and choice keys.
    std::int64_t (*get_int)(const config&) = nullptr;
    void (*set_int)(config&, std::int64_t) = nullptr;
    // Used by string keys.
    const std::string& (*get_str)(const config&) = nullptr;
    void (*set_str)(config&, std::string_view) = nullptr;
    // Used by choice_list keys: the entries as choice indices, in order.
    std::vector<std::int64_t> (*get_list)(const config&) = nullptr;
    void (*set_list)(config&, const std::vector<std::int64_t>&) = nullptr;
    // Used by string_list keys: the entries, in order.
    const std::vector<std::string>& (*get_strs)(const config&) = nullptr;
    void (*set_strs)(config&, const std::vector<std::string>&) = nullptr;

    // Extra rule beyond the bounds; returns "" when the value is fine, else what is wrong
    // ("must be a power of two"). Null when there is none.
    std::string (*check_int)(std::int64_t) = nullptr;
    // string and each entry of a string_list.
    std::string (*check_str)(std::string_view) = nullptr;
};

// Every key, grouped by section in the order sections() lists them.
std::span<const key_spec> schema();

// Section names in file order: server, model, gpu, scheduler, kv, log, fault.
std::span<const std::string_view> sections();

// The spec of section.name, or null.
const key_spec* find_key(std::string_view section, std::string_view name);

// "" when v is acceptable for spec (bounds, choices, extra rule), else what is wrong, e.g.
// "must be between 1 and 1024". For choice keys v is the index.
std::string check_int_value(const key_spec& spec, std::int64_t v);
std::string check_str_value(const key_spec& spec, std::string_view v);
// The same for a choice_list's entries (indices; -1 is a name that is not a choice, and the
// caller says which name that was).
std::string check_list_value(const key_spec& spec, const std::vector<std::int64_t>& v);
// The same for a string_list: the entry count, then each entry as check_str_value checks a
// string ("entry 2 (\"ftp://x\"): must be ...", naming the first bad one).
std::string check_strs_value(const key_spec& spec, const std::vector<std::string>& v);

// "integer 1..1024", "one of \"f16\", \"f32\"", "true or false", "string", "array of at most
// 64 of \"a\", \"b\"", "array of at most 64 strings": for docs and error hints.
std::string describe_domain(const key_spec& spec);
// "one of \"f16\", \"f32\"": the names of a choice or choice_list key.
std::string choices_text(const key_spec& spec);

}  // namespace ordo::config
