// test_chat_cases.cpp: checks that the template engine renders every case of
// ../shared/models/chat/cases.json byte for byte as Python's jinja2 did in transformers'
// configuration, and that every `error` case fails with template_error (carrying the
// raise_exception text where the case names one).
//
// How: for each case, the template file is parsed and rendered with the variables
// apply_chat_template passes (messages, add_generation_prompt, tools or None, documents=None,
// bos/eos tokens, date_string unless omitted) and strftime_now pinned to 2024-07-26 00:00:00
// (the README in that folder). Skips with a visible message without ../shared.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "template/template.hpp"
#include "template/value_json.hpp"
#include "tests/support/shared_models.hpp"

using namespace ordo::jinja;
using json = nlohmann::ordered_json;

namespace {

const std::string k_chat_dir = std::string(ORDO_SHARED_MODELS_DIR) + "/chat";

std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

value to_value(const json& j) {
    auto v = from_json(j);
    EXPECT_TRUE(v.ok()) << (v.ok() ? "" : v.err().message);
    return v.ok() ? *v : value();
}

render_options pinned_now() {
    render_options opt;
    std::tm t{};
    t.tm_year = 2024 - 1900;
    t.tm_mon = 6;
    t.tm_mday = 26;
    t.tm_wday = 5;  // a Friday
    t.tm_yday = 207;
    opt.now = t;
    return opt;
}

variables case_variables(const json& c) {
    variables vars;
    vars["messages"] = to_value(c["messages"]);
    vars["add_generation_prompt"] = value(c["add_generation_prompt"].get<bool>());
    vars["tools"] = c.contains("tools") ? to_value(c["tools"]) : value::none();
    vars["documents"] = value::none();
    vars["bos_token"] = value(c["bos_token"].get<std::string>());
    vars["eos_token"] = value(c["eos_token"].get<std::string>());
    vars["date_string"] = value("26 Jul 2024");
    if (c.contains("omit_vars")) {
        for (const auto& name : c["omit_vars"]) vars.erase(name.get<std::string>());
    }
    return vars;
}

}  // namespace

TEST(ChatCases, EveryCaseRendersAsJinja2Does) {
    ORDO_REQUIRE_SHARED(k_chat_dir + "/cases.json");
    const json doc = json::parse(read_file(k_chat_dir + "/cases.json"));
    const render_options opt = pinned_now();
    size_t rendered = 0, failed_as_expected = 0;
    for (const json& c : doc["cases"]) {
        const std::string id = c["id"].get<std::string>();
        const std::string source =
            read_file(k_chat_dir + "/templates/" + c["template"].get<std::string>() + ".jinja");
        auto t = chat_template::parse(source);
        ASSERT_TRUE(t.ok()) << id << ": " << t.err().message;
        auto out = t->render(case_variables(c), opt);
        if (c.contains("expected")) {
            ASSERT_TRUE(out.ok()) << id << ": " << out.err().message;
            EXPECT_EQ(*out, c["expected"].get<std::string>()) << id;
            ++rendered;
            continue;
        }
        ASSERT_FALSE(out.ok()) << id << " should fail, rendered:\n" << *out;
        EXPECT_EQ(out.err().code, "template_error") << id;
        if (c["error_kind"] == "raise_exception") {
            EXPECT_NE(out.err().message.find(c["error"].get<std::string>()), std::string::npos)
                << id << ": " << out.err().message;
        }
        ++failed_as_expected;
    }
    // The README's counts: a changed file must not silently shrink what is checked.
    EXPECT_EQ(rendered, 345u);
    EXPECT_EQ(failed_as_expected, 26u);
}
