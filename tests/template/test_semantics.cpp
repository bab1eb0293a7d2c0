// test_semantics.cpp: checks the engine feature by feature against Python's jinja2: every case
// of data/semantics.json (whitespace control, literals, printing, operators, statements,
// scoping, each filter, test, str/dict/list method and global) renders exactly as jinja2
// rendered it, and every error case (undefined misuse, type errors, syntax errors, refused
// tags, sandbox refusals) fails with template_error.
//
// How: make_semantics_cases.py wrote the file with jinja2 in transformers' configuration; this
// test renders each template with the file's variables and strftime_now pinned to 2024-07-26.
// Each case is its own test, named after the case.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "template/template.hpp"
#include "template/value_json.hpp"

using namespace ordo::jinja;
using json = nlohmann::ordered_json;

namespace {

json load() {
    std::ifstream f(std::string(ORDO_SOURCE_DIR) + "/tests/template/data/semantics.json");
    std::stringstream ss;
    ss << f.rdbuf();
    return json::parse(ss.str());
}

const json& doc() {
    static const json d = load();
    return d;
}

variables vars_of(const json& d) {
    variables out;
    for (const auto& [k, v] : d["variables"].items()) {
        auto converted = from_json(v);
        if (converted.ok()) out[k] = *converted;
    }
    return out;
}

struct semantics_case {
    std::string name;
    std::string source;
    bool expect_error;
    std::string expected;
};

std::vector<semantics_case> all_cases() {
    std::vector<semantics_case> out;
    for (const auto& c : doc()["cases"]) {
        out.push_back({c["name"], c["template"], c.contains("error"),
                       c.contains("expected") ? c["expected"].get<std::string>() : ""});
    }
    return out;
}

class Semantics : public ::testing::TestWithParam<semantics_case> {};

TEST_P(Semantics, RendersAsJinja2) {
    const semantics_case& c = GetParam();
    render_options opt;
    std::tm t{};
    t.tm_year = 124, t.tm_mon = 6, t.tm_mday = 26, t.tm_wday = 5, t.tm_yday = 207;
    opt.now = t;
    auto parsed = chat_template::parse(c.source);
    if (!parsed.ok()) {
        EXPECT_TRUE(c.expect_error) << c.source << "\n" << parsed.err().message;
        EXPECT_EQ(parsed.err().code, "template_error");
        return;
    }
    auto out = parsed->render(vars_of(doc()), opt);
    if (c.expect_error) {
        ASSERT_FALSE(out.ok()) << c.source << "\nrendered: " << *out;
        EXPECT_EQ(out.err().code, "template_error");
        return;
    }
    ASSERT_TRUE(out.ok()) << c.source << "\n" << out.err().message;
    EXPECT_EQ(*out, c.expected) << c.source;
}

INSTANTIATE_TEST_SUITE_P(Jinja2, Semantics, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(SemanticsFile, HasCases) {
    EXPECT_GT(all_cases().size(), 150u);
}

}  // namespace
