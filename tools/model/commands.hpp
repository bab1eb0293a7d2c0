// commands.hpp: the sub-command registry and the small shared helpers of the `ordo-model` tool
// (argument parsing, JSON output, error printing).
//
// Each cmd_*.cpp defines one sub-command and registers it with a static `command_registrar`;
// main.cpp only looks commands up. Exit codes are shared by every command: 0 success,
// 1 the input (file, ids) is bad or an operation failed, 2 the command line is wrong.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "actors/runtime/result.hpp"

namespace ordo::tools {

inline constexpr int k_exit_ok = 0;
inline constexpr int k_exit_failed = 1;
inline constexpr int k_exit_usage = 2;

// The command line after the sub-command name, split by parse_args.
struct parsed_args {
    std::vector<std::string> positional;
    std::map<std::string, std::string, std::less<>> options;  // --name value / --name=value
    std::vector<std::string> flags;                           // --name without a value

    bool flag(std::string_view name) const;
    std::optional<std::string> option(std::string_view name) const;
    // Option parsed as a number; usage error (code "usage") when present but not a number.
    result<std::optional<int64_t>> option_i64(std::string_view name) const;
    result<std::optional<double>> option_f64(std::string_view name) const;
};

// What a command accepts. Names are given without the leading "--".
struct arg_spec {
    std::vector<std::string_view> value_options;  // take a value
    std::vector<std::string_view> flags;          // take none
    size_t positional_min = 0;
    size_t positional_max = 0;
};

// Error code "usage" for an unknown option, a missing value, or a wrong positional count.
// "--" ends options (so TEXT may start with "--").
result<parsed_args> parse_args(std::span<const std::string> argv, const arg_spec& spec);

struct command {
    std::string_view name;
    std::string_view usage;                         // "info FILE [--json]"
    std::string_view summary;                       // one line
    int (*run)(std::span<const std::string> argv);  // argv excludes the command name
};

void register_command(const command& c);
const command* find_command(std::string_view name);
std::vector<command> all_commands();  // sorted by name

struct command_registrar {
    explicit command_registrar(const command& c) { register_command(c); }
};

// ---- output helpers ---------------------------------------------------------------------------

// Prints "ordo-model: <code>: <message>" on stderr; returns k_exit_failed (or k_exit_usage for
// code "usage", after the command's usage line).
int report_error(const error& e, const command* cmd = nullptr);

// A JSON string literal; invalid UTF-8 in `s` is replaced by U+FFFD so the output always parses.
std::string json_string(std::string_view s);
std::string json_number(double v);  // finite -> shortest round-trip text; non-finite -> null

}  // namespace ordo::tools
