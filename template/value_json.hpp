// value_json.hpp: nlohmann::json -> template value, for the CLI (`ordo-model template`) and
// the tests, which read messages and variables from JSON files. Object key order is kept
// (the reader must be nlohmann::ordered_json): tojson prints keys in the order given.
#pragma once

#include <nlohmann/json.hpp>

#include "actors/runtime/result.hpp"
#include "template/value.hpp"

namespace ordo::jinja {

// Nesting deeper than depth_max (arrays in objects in ...) is an error, as is an integer that
// does not fit in 64 bits. Error code "bad_json".
result<value> from_json(const nlohmann::ordered_json& j, uint32_t depth_max = 256);

}  // namespace ordo::jinja
