// json_schema_check.hpp: test support — whether a JSON document validates against a JSON
// Schema, by a maintained validator (Debian's python3-jsonschema, draft 2020-12), for the
// tests of structured output and tool calls.
#pragma once

#include <cstdio>
#include <fstream>
#include <string>

#include "tests/support/server_process.hpp"

namespace ordo::test {

// Whether python3-jsonschema is installed (tools/dev.sh installs it); said once when not.
inline bool json_schema_validator() {
    static const bool have = [] {
        const bool ok = run_command("/usr/bin/python3 -c 'import jsonschema' 2>&1").exit_code == 0;
        if (!ok) {
            std::fprintf(stderr,
                         "\n*** python3-jsonschema is missing: documents are checked by "
                         "the grammar only (tools/dev.sh installs it)\n");
        }
        return ok;
    }();
    return have;
}

// "" when `doc` validates against `schema` (both JSON text); else the validator's words.
inline std::string json_schema_violation(const std::string& doc, const std::string& schema,
                                         const std::string& suite) {
    const std::string doc_path = scratch_path(suite, "doc.json");
    const std::string schema_path = scratch_path(suite, "schema.json");
    std::ofstream(doc_path) << doc;
    std::ofstream(schema_path) << schema;
    auto v = run_command(
        "/usr/bin/python3 -c 'import json, sys, jsonschema; "
        "jsonschema.Draft202012Validator(json.load(open(sys.argv[2])))"
        ".validate(json.load(open(sys.argv[1])))' " +
        doc_path + " " + schema_path + " 2>&1");
    return v.exit_code == 0 ? "" : v.output.empty() ? "invalid" : v.output;
}

}  // namespace ordo::test
