// failure.hpp: how the engine unwinds on an error.
//
// Parsing and rendering are deeply recursive; every failure (a syntax error, a runtime type
// error, raise_exception, a bound reached) unwinds by throwing template_failure, which
// template.cpp catches at the library's edge and turns into an ordo::error with code
// "template_error". Nothing thrown here escapes the library (the public API returns result<>).
#pragma once

#include <cstdint>
#include <string>

namespace ordo::jinja {

struct template_failure {
    std::string message;
    uint32_t line = 0;  // 1-based; 0 while unknown (the nearest node with a position sets it)
    uint32_t column = 0;
};

[[noreturn]] inline void fail(std::string message) {
    throw template_failure{std::move(message)};
}

}  // namespace ordo::jinja
