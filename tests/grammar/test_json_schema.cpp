// test_json_schema.cpp: JSON Schema to GBNF (grammar/json_schema.hpp). Checks, per schema, that
// the grammar parses and its matcher accepts documents valid against the schema (as the
// grammar writes them: properties in the schema's order) and refuses invalid ones, for types
// and type lists, nested objects with required and optional properties (none required too),
// additionalProperties maps, arrays with minItems/maxItems, enum and const, anyOf/oneOf,
// string lengths and formats, $ref into $defs (recursive too) and nullable; and that every
// unsupported keyword or value is a bad_schema error naming its place.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "grammar/gbnf.hpp"
#include "grammar/json_schema.hpp"

namespace ordo::grammar {
namespace {

using json = nlohmann::ordered_json;  // the schema's key order is the output's

bool accepts(const gbnf& g, const std::string& doc) {
    matcher m(g);
    auto ok = m.advance_utf8(doc);
    return ok.ok() && *ok && m.accepting();
}

void check(const json& schema, const std::vector<std::string>& valid,
           const std::vector<std::string>& invalid) {
    SCOPED_TRACE(schema.dump());
    auto src = json_schema_to_gbnf(schema);
    ASSERT_TRUE(src.ok()) << src.err().message;
    auto g = parse_gbnf(*src);
    ASSERT_TRUE(g.ok()) << g.err().message << "\n" << *src;
    for (const auto& d : valid) EXPECT_TRUE(accepts(*g, d)) << "refused " << d << "\n" << *src;
    for (const auto& d : invalid) EXPECT_FALSE(accepts(*g, d)) << "accepted " << d;
}

TEST(json_schema, types_objects_and_arrays) {
    check({{"type", "integer"}}, {"0", "-12", " 7"}, {"1.5", "\"1\"", "01"});
    check({{"type", {"string", "null"}}}, {"\"a\"", "null"}, {"1", "nul"});
    check({{"type", "number"}}, {"1.5e3", "-0.25"}, {"1.", ".5"});
    check(json::parse(R"({"type": "object", "properties": {
              "name": {"type": "string"}, "age": {"type": "integer"},
              "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["name", "age"], "additionalProperties": false})"),
          {R"({"name": "a", "age": 3})", R"({"name":"a","age":3,"tags":["x", "y"]})",
           "{\n  \"name\": \"\\u00e9\",\n  \"age\": -1\n}"},
          {R"({"age": 3})", R"({"name": "a"})", R"({"name": 1, "age": 3})",
           R"({"name": "a", "age": 3, "other": 1})"});
    check(json::parse(R"({"properties": {"a": {"type": "boolean"}, "b": {"type": "null"}}})"),
          {"{}", R"({"a": true})", R"({"b": null})", R"({"a": false, "b": null})"},
          {R"({"b": null, "a": true})", R"({, "b": null})", R"({"a": 1})"});
    check(json::parse(R"({"type": "object", "additionalProperties": {"type": "integer"}})"),
          {"{}", R"({"x": 1, "y": 2})"}, {R"({"x": "1"})"});
    check(json::parse(R"({"type": "array", "items": {"type": "integer"}, "minItems": 1,
                          "maxItems": 3})"),
          {"[1]", "[1, 2, 3]"}, {"[]", "[1, 2, 3, 4]", "[\"a\"]"});
    check(json::parse(R"({"type": "array", "maxItems": 0})"), {"[]"}, {"[1]"});
}

TEST(json_schema, enums_consts_alternatives_strings_refs) {
    check(json::parse(R"({"enum": ["red", 2, null, {"a": [1]}]})"),
          {"\"red\"", "2", "null", R"({"a":[1]})"}, {"\"blue\"", "3"});
    check(json::parse(R"({"const": "on"})"), {"\"on\""}, {"\"off\""});
    check(json::parse(R"({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}]})"),
          {"4", "\"ab\""}, {"\"abc\"", "true"});
    check(json::parse(R"({"oneOf": [{"type": "boolean"}, {"type": "null"}]})"), {"true", "null"},
          {"1"});
    check(json::parse(R"({"type": "string", "minLength": 2, "maxLength": 3})"),
          {"\"ab\"", "\"a\\nb\""}, {"\"a\"", "\"abcd\""});
    check(json::parse(R"({"type": "string", "format": "date"})"), {"\"2026-11-26\""},
          {"\"26/11/2026\""});
    check(json::parse(R"({"type": "string", "format": "uuid"})"),
          {"\"123e4567-e89b-12d3-a456-426614174000\""}, {"\"123\""});
    check(json::parse(R"({"type": "integer", "nullable": true})"), {"1", "null"}, {"\"1\""});
    // A tree: a node refers to itself through its children.
    check(json::parse(R"({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object",
            "properties": {"v": {"type": "integer"},
                           "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            "required": ["v"]}}})"),
          {R"({"v": 1})", R"({"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}]})"},
          {R"({"kids": []})", R"({"v": 1, "kids": [{}]})"});
    check(json::parse(R"({"title": "T", "description": "d", "$schema":
            "https://json-schema.org/draft/2020-12/schema", "type": "boolean", "default": true})"),
          {"true"}, {"1"});
}

TEST(json_schema, unsupported_keywords_name_their_place) {
    struct refused {
        const char* schema;
        const char* says;
    };
    for (const refused& r : std::vector<refused>{
             {R"({"type": "string", "pattern": "^a"})", "\"pattern\" is not supported"},
             {R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}})",
              "at /properties/n: \"minimum\" is not supported"},
             {R"({"type": "string", "format": "email"})", "/format"},
             {R"({"allOf": [{"type": "string"}, {"maxLength": 3}]})", "/allOf"},
             {R"({"$ref": "#/$defs/missing", "$defs": {}})", "names nothing"},
             {R"({"$ref": "https://example.com/s.json"})", "references"},
             {R"({"type": "array", "uniqueItems": true})", "uniqueItems"},
             {R"({"type": "array", "maxItems": 100000})", "maxItems"},
             {R"({"type": "thing"})", "not a JSON Schema type"},
             {R"({"type": "object", "properties": {}, "required": ["x"]})", "\"x\" is required"},
             {R"(false)", "allows nothing"},
             {R"(3)", "an object or a boolean"},
             {R"({"items": {"prefixItems": []}})", "/items"}}) {
        auto g = json_schema_to_gbnf(json::parse(r.schema));
        ASSERT_FALSE(g.ok()) << r.schema;
        EXPECT_EQ(g.err().code, "bad_schema") << r.schema;
        EXPECT_NE(g.err().message.find(r.says), std::string::npos)
            << r.schema << ": " << g.err().message;
    }
}

}  // namespace
}  // namespace ordo::grammar
