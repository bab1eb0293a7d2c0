// test_json_schema_suite.cpp: JSON Schema to GBNF (grammar/json_schema.hpp) against the public
// JSON Schema Test Suite (draft 2020-12, the keywords ordo supports; json_schema_suite/README.md
// says where the files come from). Every schema of those files either converts or is refused
// with bad_schema naming why; for every converted one, the grammar never accepts a document
// the suite marks invalid (an answer that follows the grammar validates), and it accepts many
// of the valid ones (it is stricter by design: properties in the schema's order, only the
// listed ones, numbers as written). Counts go to stderr; minimums keep the test from passing
// by refusing everything.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "grammar/gbnf.hpp"
#include "grammar/json_schema.hpp"

namespace ordo::grammar {
namespace {

using json = nlohmann::ordered_json;

TEST(json_schema_suite, converted_grammars_accept_no_invalid_document) {
    const char* files[] = {"additionalProperties",
                           "allOf",
                           "anyOf",
                           "boolean_schema",
                           "const",
                           "enum",
                           "items",
                           "maxItems",
                           "maxLength",
                           "minItems",
                           "minLength",
                           "oneOf",
                           "properties",
                           "ref",
                           "required",
                           "type"};
    std::size_t groups = 0, converted = 0, refused = 0, valid_accepted = 0, valid_refused = 0,
                invalid_refused = 0;
    for (const char* name : files) {
        const std::string path =
            std::string(ORDO_SOURCE_DIR) + "/tests/grammar/json_schema_suite/" + name + ".json";
        std::ifstream in(path);
        ASSERT_TRUE(in.good()) << path;
        const json suite = json::parse(in);
        for (const json& group : suite) {
            ++groups;
            SCOPED_TRACE(std::string(name) + ": " + group["description"].get<std::string>());
            auto src = json_schema_to_gbnf(group["schema"]);
            if (!src) {
                EXPECT_EQ(src.err().code, "bad_schema") << src.err().message;
                ++refused;
                continue;
            }
            auto g = parse_gbnf(*src);
            ASSERT_TRUE(g.ok()) << g.err().message << "\n" << *src;
            ++converted;
            for (const json& t : group["tests"]) {
                const std::string doc = t["data"].dump();
                matcher m(*g);
                auto ok = m.advance_utf8(doc);
                const bool accepted = ok.ok() && *ok && m.accepting();
                if (t["valid"].get<bool>()) {
                    ++(accepted ? valid_accepted : valid_refused);
                } else {
                    EXPECT_FALSE(accepted) << "accepted the invalid " << doc << " ("
                                           << t["description"].get<std::string>() << ")";
                    invalid_refused += accepted ? 0 : 1;
                }
            }
        }
    }
    std::fprintf(stderr,
                 "json_schema_suite: %zu schemas, %zu converted, %zu refused as unsupported; "
                 "valid documents accepted %zu, refused %zu (stricter); invalid refused %zu\n",
                 groups, converted, refused, valid_accepted, valid_refused, invalid_refused);
    EXPECT_GE(converted, 60u);
    EXPECT_GE(valid_accepted, 100u);
}

}  // namespace
}  // namespace ordo::grammar
