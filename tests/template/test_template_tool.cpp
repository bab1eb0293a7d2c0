// test_template_tool.cpp: checks `ordo-model template` end to end: it prints exactly what the
// engine renders (a Llama 3.2 case from ../shared/models/chat with --now pinning
// strftime_now, a Llama 3.1 tool case with --tools and --var), honours --bos-token,
// --eos-token and --no-generation-prompt, and fails with one clear line and the documented exit
// status: 1 for a bad input (missing or invalid file, a template that fails) and 2 for a bad
// command line (missing --messages, malformed --var or --now).
//
// How: runs the built binary (ORDO_MODEL_TOOL) through the shell on files written to a
// temporary directory; captures stdout and stderr separately where the text must be exact.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/support/server_process.hpp"
#include "tests/support/shared_models.hpp"

namespace {

using json = nlohmann::ordered_json;
const std::string k_tool = ORDO_MODEL_TOOL;
const std::string k_chat = std::string(ORDO_SHARED_MODELS_DIR) + "/chat";

class TemplateTool : public ::testing::Test {
protected:
    void SetUp() override {
        _dir = std::filesystem::temp_directory_path() /
               ("ordo_tmpl_" + std::to_string(getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        std::filesystem::create_directories(_dir);
    }
    void TearDown() override { std::filesystem::remove_all(_dir); }

    std::string write(const std::string& name, const std::string& text) {
        const std::string p = (_dir / name).string();
        std::ofstream(p, std::ios::binary) << text;
        return p;
    }
    // stdout only (exact text), stderr to a file read back by err().
    ordo::test::command_result run(const std::string& args) {
        return ordo::test::run_command("'" + k_tool + "' template " + args + " 2>'" +
                                       (_dir / "stderr").string() + "'");
    }
    std::string err() const {
        std::ifstream f(_dir / "stderr");
        std::stringstream ss;
        ss << f.rdbuf();
        return ss.str();
    }

    std::filesystem::path _dir;
};

json find_case(const std::string& id) {
    std::ifstream f(k_chat + "/cases.json");
    std::stringstream ss;
    ss << f.rdbuf();
    const json doc = json::parse(ss.str());
    for (const auto& c : doc["cases"]) {
        if (c["id"] == id) return c;
    }
    ADD_FAILURE() << "no case " << id;
    return {};
}

TEST_F(TemplateTool, RendersLlama32WithPinnedNow) {
    ORDO_REQUIRE_SHARED(k_chat + "/cases.json");
    const json c = find_case("meta-llama-Llama-3.2-3B-Instruct/no_date_string/gen");
    const std::string msgs = write("m.json", c["messages"].dump());
    auto r =
        run("'" + k_chat + "/templates/meta-llama-Llama-3.2-3B-Instruct.jinja' --messages '" +
            msgs + "' --now 2024-07-26 --bos-token '<|begin_of_text|>' --eos-token '<|eot_id|>'");
    ASSERT_EQ(r.exit_code, 0) << err();
    EXPECT_EQ(r.output, c["expected"].get<std::string>());
}

TEST_F(TemplateTool, RendersToolCaseWithToolsAndVar) {
    ORDO_REQUIRE_SHARED(k_chat + "/cases.json");
    const json c = find_case("meta-llama-Llama-3.1-8B-Instruct/tools_cycle/gen");
    const std::string msgs = write("m.json", c["messages"].dump());
    const std::string tools = write("t.json", c["tools"].dump());
    auto r = run("'" + k_chat + "/templates/meta-llama-Llama-3.1-8B-Instruct.jinja' --messages '" +
                 msgs + "' --tools '" + tools + "' --var date_string='\"26 Jul 2024\"' " +
                 "--bos-token '<|begin_of_text|>' --eos-token '<|eot_id|>'");
    ASSERT_EQ(r.exit_code, 0) << err();
    EXPECT_EQ(r.output, c["expected"].get<std::string>());
}

TEST_F(TemplateTool, VariablesAndFlags) {
    const std::string t =
        write("t.jinja",
              "{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
              "{% if add_generation_prompt %}<gen>{% endif %}{{ eos_token }}|{{ n + 1 }}|{{ s }}|"
              "{{ tools }}|{{ documents }}|{{ strftime_now('%A %d %B %Y') }}");
    const std::string m = write("m.json", R"([{"role": "user", "content": "héllo"}])");
    auto r =
        run(t + " --messages " + m +
            " --var n=41 --var=s='\"x\"' --bos-token '<s>' --eos-token '</s>' --now 2000-02-29");
    ASSERT_EQ(r.exit_code, 0) << err();
    EXPECT_EQ(r.output, "<s>[user:héllo]<gen></s>|42|x|None|None|Tuesday 29 February 2000");
    auto plain = run(t + " --messages " + m + " --var n=1 --no-generation-prompt");
    ASSERT_EQ(plain.exit_code, 0) << err();
    // No bos/eos given: undefined, which prints as nothing; the date is today's.
    EXPECT_EQ(plain.output.rfind("[user:héllo]|2||None|None|", 0), 0u) << plain.output;
}

TEST_F(TemplateTool, BadInputsFailWithOneLineAndExitOne) {
    const std::string t = write("t.jinja", "{{ messages|length }}");
    const std::string m = write("m.json", R"([{"role": "user", "content": "x"}])");
    struct bad {
        std::string args, message;
    };
    const bad cases[] = {
        {write("x.jinja", "{{ 1 }}") + " --messages " + (_dir / "absent.json").string(),
         "bad_input: cannot read messages"},
        {t + " --messages " + write("bad.json", "[{\"role\": "), "is not valid JSON"},
        {t + " --messages " + write("obj.json", R"({"role": "user"})"), "must hold a JSON array"},
        {t + " --messages " + m + " --tools " + write("tools.json", "3"), "must hold a JSON array"},
        {(_dir / "absent.jinja").string() + " --messages " + m, "cannot read template"},
        {write("syntax.jinja", "line one\n{% if %}") + " --messages " + m,
         "template_error: template line 2"},
        {write("raise.jinja", "{{ raise_exception('Roles must alternate') }}") + " --messages " + m,
         "template_error: template line 1, column 4: Roles must alternate"},
    };
    for (const auto& c : cases) {
        auto r = run(c.args);
        const std::string e = err();
        EXPECT_EQ(r.exit_code, 1) << c.args << "\n" << e;
        EXPECT_NE(e.find(c.message), std::string::npos) << c.args << "\n" << e;
        EXPECT_EQ(std::count(e.begin(), e.end(), '\n'), 1) << e;
        EXPECT_EQ(r.output, "");
    }
}

TEST_F(TemplateTool, BadCommandLinesExitTwo) {
    const std::string t = write("t.jinja", "{{ 1 }}");
    const std::string m = write("m.json", "[]");
    const std::pair<std::string, std::string> cases[] = {
        {t, "--messages FILE is required"},
        {t + " --messages " + m + " --var novalue", "--var needs NAME=JSON"},
        {t + " --messages " + m + " --var x=notjson", "is not valid JSON"},
        {t + " --messages " + m + " --now 2024-02-30", "no such day"},
        {t + " --messages " + m + " --now yesterday", "--now needs YYYY-MM-DD"},
        {t + " --messages " + m + " --frobnicate", "unknown option"},
        {"--messages " + m, "expected at least 1"},
    };
    for (const auto& [args, message] : cases) {
        auto r = run(args);
        EXPECT_EQ(r.exit_code, 2) << args << "\n" << err();
        EXPECT_NE(err().find(message), std::string::npos) << args << "\n" << err();
        EXPECT_NE(err().find("usage: ordo-model template"), std::string::npos) << err();
    }
}

}  // namespace
