// test_fuzz.cpp: checks that the engine survives arbitrary templates: thousands of random
// mutations of real chat templates and of the feature cases (bytes flipped, Jinja tokens
// inserted, ranges deleted or duplicated) and random token soups each end, within small
// bounds, either rendered or with a template_error, never a crash, hang or other error code.
// Run under the ASan build (tools/dev.sh with ORDO_SANITIZE=1) it also checks memory safety.
//
// How: a fixed-seed mt19937_64 (the seed of a failing case is in the failure message) mutates
// the templates of ../shared/models/chat (when present) and tests/template/data/semantics.json
// and renders each with a conversation and the semantics variables under tight limits.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "template/template.hpp"
#include "template/value_json.hpp"

using namespace ordo::jinja;
using json = nlohmann::ordered_json;

namespace {

constexpr int k_mutants_per_seed_template = 150;
constexpr int k_soups = 5000;

// ORDO_TEMPLATE_FUZZ_SCALE=N runs N times as many cases (for a long run by hand).
int scale() {
    const char* s = std::getenv("ORDO_TEMPLATE_FUZZ_SCALE");
    const int n = s ? std::atoi(s) : 1;
    return n > 0 ? n : 1;
}
constexpr double k_seconds_per_render_max = 5.0;

std::string read_file(const std::filesystem::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

const json& semantics() {
    static const json d = json::parse(
        read_file(std::string(ORDO_SOURCE_DIR) + "/tests/template/data/semantics.json"));
    return d;
}

variables fuzz_variables() {
    variables vars;
    for (const auto& [k, v] : semantics()["variables"].items()) vars[k] = *from_json(v);
    vars["messages"] = vars["msgs"];
    vars["add_generation_prompt"] = value(true);
    vars["bos_token"] = value("<s>");
    vars["eos_token"] = value("</s>");
    vars["tools"] = *from_json(json::parse(
        R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
            "properties": {"x": {"type": "string"}}}}}])"));
    return vars;
}

const char* const k_fragments[] = {
    "{{",
    "}}",
    "{%",
    "%}",
    "{#",
    "#}",
    "{%-",
    "-%}",
    "{{-",
    "-}}",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    "|",
    ",",
    ".",
    ":",
    "'",
    "\"",
    "\\",
    "~",
    "+",
    "-",
    "*",
    "/",
    "//",
    "%",
    "**",
    "==",
    "!=",
    "<",
    ">=",
    " is ",
    " not ",
    " in ",
    " and ",
    " or ",
    " if ",
    " else ",
    "loop",
    "loop.index",
    "namespace()",
    "range(3)",
    "messages",
    "message",
    "ns.x",
    "x",
    "none",
    "true",
    "0",
    "1",
    "-1",
    "1.5",
    "1e308",
    "9223372036854775807",
    "'a'",
    "\"\\u00e9\"",
    "for x in ",
    "endfor",
    "if ",
    "endif",
    "elif ",
    "else",
    "set ",
    "endset",
    "macro m(a, b=1)",
    "endmacro",
    "call ",
    "endcall",
    "filter upper",
    "endfilter",
    "raw",
    "endraw",
    "break",
    "continue",
    "recursive",
    "|tojson",
    "|trim",
    "|length",
    "|join(', ')",
    "|map(attribute='role')",
    "|selectattr('role', 'equalto', 'user')",
    "|default('d')",
    "|int",
    "|string",
    "|list",
    "|sort",
    "|unique",
    "|indent(4)",
    "|batch(2)",
    ".split('x')",
    ".strip()",
    ".items()",
    "[::-1]",
    "[1:]",
    "[-1]",
    " is defined",
    " is none",
    " is string",
    "raise_exception('r')",
    "strftime_now('%Y')",
    "loop(x)",
    "caller()",
    "varargs",
    "kwargs",
    "\n",
    " ",
    "\t",
    "é",
    "\xff",
    "\xc3",
    "include",
    "extends",
};

std::string mutate(const std::string& src, std::mt19937_64& rng) {
    std::string s = src;
    const int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits; ++e) {
        const size_t at = s.empty() ? 0 : size_t(rng() % (s.size() + 1));
        switch (rng() % 5) {
            case 0:  // flip a byte
                if (!s.empty()) s[at % s.size()] = char(rng() % 256);
                break;
            case 1:  // insert a Jinja fragment
                s.insert(at, k_fragments[rng() % std::size(k_fragments)]);
                break;
            case 2: {  // delete a range
                const size_t n = size_t(rng() % 16);
                if (at < s.size()) s.erase(at, n);
                break;
            }
            case 3: {  // duplicate a range
                if (s.empty()) break;
                const size_t from = size_t(rng() % s.size());
                const size_t n = std::min<size_t>(size_t(rng() % 64), s.size() - from);
                s.insert(at, s.substr(from, n));
                break;
            }
            default: {  // swap two bytes
                if (s.size() < 2) break;
                std::swap(s[at % s.size()], s[rng() % s.size()]);
            }
        }
    }
    return s;
}

std::string soup(std::mt19937_64& rng) {
    std::string s;
    const int n = 1 + int(rng() % 30);
    for (int i = 0; i < n; ++i) s += k_fragments[rng() % std::size(k_fragments)];
    return s;
}

struct tally {
    int rendered = 0;
    int failed = 0;
};

void render_one(const std::string& src, const variables& vars, uint64_t seed, tally& t) {
    limits lim;
    lim.steps_max = 200'000;
    lim.depth_max = 120;
    lim.output_bytes_max = 1 << 20;
    render_options opt;
    opt.bounds = lim;
    std::tm now{};
    now.tm_year = 124, now.tm_mon = 6, now.tm_mday = 26;
    opt.now = now;
    const auto start = std::chrono::steady_clock::now();
    auto parsed = chat_template::parse(src, lim);
    if (!parsed) {
        ASSERT_EQ(parsed.err().code, "template_error") << "seed " << seed;
        ASSERT_FALSE(parsed.err().message.empty());
        ++t.failed;
        return;
    }
    auto out = parsed->render(vars, opt);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ASSERT_LT(seconds, k_seconds_per_render_max) << "seed " << seed << "\n" << src;
    if (out.ok()) {
        ASSERT_LE(out->size(), lim.output_bytes_max);
        ++t.rendered;
    } else {
        ASSERT_EQ(out.err().code, "template_error") << "seed " << seed;
        ++t.failed;
    }
}

std::vector<std::string> seed_templates() {
    std::vector<std::string> out;
    for (const auto& c : semantics()["cases"]) out.push_back(c["template"].get<std::string>());
    const std::filesystem::path chat = std::string(ORDO_SHARED_MODELS_DIR) + "/chat/templates";
    if (std::filesystem::exists(chat)) {
        for (const auto& e : std::filesystem::directory_iterator(chat))
            out.push_back(read_file(e.path()));
    } else {
        std::fprintf(stderr, "*** %s is absent: mutating the feature cases only ***\n",
                     chat.c_str());
    }
    return out;
}

TEST(Fuzz, MutatedTemplatesEndWithinBounds) {
    const variables vars = fuzz_variables();
    tally t;
    uint64_t seed = 1;
    for (const std::string& src : seed_templates()) {
        for (int i = 0; i < k_mutants_per_seed_template * scale(); ++i, ++seed) {
            std::mt19937_64 rng(seed);
            render_one(mutate(src, rng), vars, seed, t);
            if (HasFatalFailure()) return;
        }
    }
    std::printf("mutants: %d rendered, %d failed with template_error\n", t.rendered, t.failed);
    // Mutation must exercise rendering, not only the parser's error paths.
    EXPECT_GT(t.rendered, (t.rendered + t.failed) / 10);
}

TEST(Fuzz, TokenSoupsEndWithinBounds) {
    const variables vars = fuzz_variables();
    tally t;
    for (uint64_t seed = 1; seed <= uint64_t(k_soups) * scale(); ++seed) {
        std::mt19937_64 rng(seed * 7919);
        render_one(soup(rng), vars, seed, t);
        if (HasFatalFailure()) return;
    }
    std::printf("soups: %d rendered, %d failed with template_error\n", t.rendered, t.failed);
    EXPECT_GT(t.rendered, 0);
}

}  // namespace
