// enum_names.hpp: how a closed set is named. A closed set (a fault kind, a phase, a failure
// code, a delivery outcome) travels as its enum, in messages too (MSGPACK_ADD_ENUM packs its
// number), so a compare of enum values, never of strings, decides behaviour. Its names, for
// logs and the wire, are one table beside the enum, in the enum's order:
//
//     inline constexpr std::array<std::string_view, N> step_phase_names = {"prefill", ...};
//     constexpr const auto& names_of(step_phase) { return step_phase_names; }
//
// found here by argument-dependent lookup. enum_name and enum_from_name read that table;
// nothing else spells the names. enum_from_name is for the few places that read a name from
// outside (the config, a request, the fault harness's command line). The table is a variable,
// not a temporary, so a config key may keep a span of it.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace ordo {

// Values of E: the length of its table.
template <typename E>
inline constexpr std::size_t enum_count = names_of(E{}).size();

// The name of v; "?" for a value outside the table (a malformed message).
template <typename E>
constexpr std::string_view enum_name(E v) {
    const auto& names = names_of(E{});
    const auto i = static_cast<std::size_t>(v);
    return i < names.size() ? names[i] : std::string_view("?");
}

// The value named `name`, or nullopt.
template <typename E>
constexpr std::optional<E> enum_from_name(std::string_view name) {
    const auto& names = names_of(E{});
    for (std::size_t i = 0; i < names.size(); ++i) {
        if (names[i] == name) return static_cast<E>(i);
    }
    return std::nullopt;
}

// Whether v is one of E's values (a number read from a message may be any).
template <typename E>
constexpr bool enum_valid(E v) {
    return static_cast<std::size_t>(v) < enum_count<E>;
}

// The tables of several sets one after another: the table of an enum whose values are a few
// closed sets in a row, each keeping its own table (kv::kv_failure: the kv actor's own, the
// file's, the gpu copy's and the delivery's).
template <std::size_t... N>
constexpr std::array<std::string_view, (N + ...)> names_joined(
    const std::array<std::string_view, N>&... tables) {
    std::array<std::string_view, (N + ...)> out{};
    std::size_t i = 0;
    (..., [&] {
        for (std::string_view name : tables) out[i++] = name;
    }());
    return out;
}

// "a, b or c": every name, in order, for a message that says what is accepted.
template <typename E>
std::string enum_names_listed() {
    const auto& names = names_of(E{});
    std::string out;
    for (std::size_t i = 0; i < names.size(); ++i) {
        if (i > 0) out += i + 1 == names.size() ? " or " : ", ";
        out += names[i];
    }
    return out;
}

}  // namespace ordo
