// json_schema.hpp: a JSON Schema (draft 2020-12) turned into a GBNF grammar whose sentences are
// JSON documents valid against the schema (issue 31: OpenAI's response_format json_schema).
// docs/grammar.md "JSON Schema" lists what is supported. The grammar is stricter than the
// schema where a grammar must pick one of several valid shapes: an object's required
// properties come first, then its optional ones, each in the order the schema lists them, and
// properties the schema does not list are not written (additionalProperties only matters for
// an object without `properties`). Every keyword that constrains and is not supported is an
// error naming it and where it is, never silently dropped: an answer that claims to follow a
// schema must.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "actors/runtime/result.hpp"

namespace ordo::grammar {

struct json_schema_limits {
    std::size_t depth_max = 32;      // nested schemas (and $ref chains) one path may pass
    std::size_t rules_max = 512;     // grammar rules made from the schema
    std::uint32_t repeat_max = 256;  // minItems/maxItems/minLength/maxLength
};

// GBNF for documents valid against `schema`. Errors (code "bad_schema"): an unsupported keyword
// or value, a bad type, a $ref that is not "#/$defs/NAME" (or "#/definitions/NAME") or names
// nothing, a limit exceeded; each names the JSON pointer of the place.
// Several schemas in one grammar (tool calls: each function's parameters), sharing the JSON
// primitives. Each schema's $refs resolve inside that schema; the limits hold over them all.
class json_schema_rules {
public:
    explicit json_schema_rules(const json_schema_limits& limits = {});
    ~json_schema_rules();
    // A GBNF expression (a rule name) whose sentences are documents valid against `schema`,
    // without leading whitespace. Errors as json_schema_to_gbnf's.
    result<std::string> add(const nlohmann::ordered_json& schema);
    // The rules add() made, then the primitives (ws, string, value, ...): the rest of a grammar
    // that uses the expressions.
    std::string rules() const;

private:
    class converter;
    std::unique_ptr<converter> _c;
};

result<std::string> json_schema_to_gbnf(const nlohmann::ordered_json& schema,
                                        const json_schema_limits& limits = {});

}  // namespace ordo::grammar
