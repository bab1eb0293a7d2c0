// test_bounds.cpp: checks that hostile templates end with template_error naming the bound they
// hit, quickly, without crashing or exhausting memory: unbounded recursion (macros, recursive
// loops), huge and nested loops, string doubling, output floods, exponential structures
// (a list holding itself twice, n times), a namespace holding itself, deep syntax nesting, and
// oversized sources. Also that the bounds are options: a template that passes under the
// defaults fails under a tighter limit.
//
// How: each template renders with the default limits (or the stated ones); the test asserts
// the error code, that the message names the bound, and that it took under k_seconds_max.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "template/template.hpp"

using namespace ordo::jinja;

namespace {

// Generous for the ASan build on a loaded 2-core machine; a plain build takes well under 1 s.
constexpr double k_seconds_max = 60.0;

struct outcome {
    bool ok;
    std::string text;  // the render, or the error message
    double seconds;
};

outcome render(const std::string& src, const limits& lim = {}) {
    const auto start = std::chrono::steady_clock::now();
    outcome o{false, "", 0};
    auto t = chat_template::parse(src, lim);
    if (!t) {
        o.text = t.err().message;
        EXPECT_EQ(t.err().code, "template_error");
    } else {
        render_options opt;
        opt.bounds = lim;
        auto r = t->render({}, opt);
        o.ok = r.ok();
        o.text = r.ok() ? *r : r.err().message;
        if (!r.ok()) {
            EXPECT_EQ(r.err().code, "template_error");
        }
    }
    o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return o;
}

void expect_bound(const std::string& src, const std::string& bound, const limits& lim = {}) {
    outcome o = render(src, lim);
    EXPECT_FALSE(o.ok) << src;
    EXPECT_NE(o.text.find(bound), std::string::npos) << src << "\n -> " << o.text;
    EXPECT_LT(o.seconds, k_seconds_max) << src;
}

TEST(Bounds, InfiniteMacroRecursion) {
    expect_bound("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "depth bound");
    expect_bound(
        "{% macro a() %}{{ b() }}{% endmacro %}{% macro b() %}{{ a() }}{% endmacro %}"
        "{{ a() }}",
        "depth bound");
}

TEST(Bounds, RecursiveLoopOnItself) {
    expect_bound(
        "{% set ns = namespace(t=[1]) %}{% for x in ns.t recursive %}{{ loop(ns.t) }}"
        "{% endfor %}",
        "depth bound");
}

TEST(Bounds, HugeAndNestedLoops) {
    expect_bound("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                 "step bound");
    expect_bound("{{ range(10**9)|length }}", "range too big");
}

TEST(Bounds, StringDoubling) {
    expect_bound(
        "{% set ns = namespace(s='ab') %}{% for i in range(100) %}"
        "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
        "bytes");
    expect_bound("{{ 'x' * 10**12 }}", "bytes");
    expect_bound("{{ 'abc'|replace('', 'x' * 1000000) * 100 }}", "bytes");
    expect_bound("{{ 'x'.center(10**12) }}", "bytes");
}

TEST(Bounds, OutputFlood) {
    expect_bound("{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}", "output exceeds");
}

TEST(Bounds, ExponentialStructures) {
    // [[x, x], [x, x]] ... 60 levels: tiny in memory, 2^60 when expanded.
    const std::string dag =
        "{% set ns = namespace(l=[1], m=[1]) %}{% for i in range(60) %}"
        "{% set ns.l = [ns.l, ns.l] %}{% set ns.m = [ns.m, ns.m] %}{% endfor %}";
    expect_bound(dag + "{{ ns.l }}", "bound");
    expect_bound(dag + "{{ ns.l|tojson }}", "bound");
    expect_bound(dag + "{{ ns.l == ns.m }}", "step bound");
    expect_bound(dag + "{{ [ns.l, ns.m]|sort }}", "step bound");
    expect_bound(dag + "{{ ns.l|pprint }}", "bound");
}

TEST(Bounds, DeepValues) {
    expect_bound(
        "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}"
        "{% set ns.l = [ns.l] %}{% endfor %}",
        "depth bound");
    expect_bound("{% set ns = namespace() %}{% set ns.self = ns %}{{ ns }}", "depth bound");
    expect_bound("{% set ns = namespace() %}{% set ns.l = [ns] %}{{ ns|tojson }}",
                 "not JSON serializable");
}

TEST(Bounds, DeepSyntax) {
    expect_bound("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}",
                 "parse depth bound");
    expect_bound(
        "{{ 1" +
            [] {
                std::string s;
                for (int i = 0; i < 100000; ++i) s += " + 1";
                return s;
            }() +
            " }}",
        "parse depth bound");
    std::string nested;
    for (int i = 0; i < 5000; ++i) nested += "{% if true %}";
    expect_bound(nested, "parse depth bound");
    expect_bound(
        "{{ x" +
            [] {
                std::string s;
                for (int i = 0; i < 100000; ++i) s += ".a";
                return s;
            }() +
            " }}",
        "parse depth bound");
    expect_bound("{{ " + std::string(100000, '-') + "1 }}", "parse depth bound");
    expect_bound(
        "{{ " +
            [] {
                std::string s;
                for (int i = 0; i < 50000; ++i) s += "not ";
                return s;
            }() +
            "1 }}",
        "parse depth bound");
}

TEST(Bounds, SourceSize) {
    limits lim;
    lim.source_bytes_max = 1000;
    expect_bound(std::string(1001, 'x'), "over the bound of 1000", lim);
    EXPECT_TRUE(render(std::string(1000, 'x'), lim).ok);
}

TEST(Bounds, LimitsAreOptions) {
    const std::string loop = "{% for i in range(1000) %}{{ i }}{% endfor %}";
    ASSERT_TRUE(render(loop).ok);
    limits few_steps;
    few_steps.steps_max = 500;
    expect_bound(loop, "step bound of 500", few_steps);

    const std::string recurse =
        "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(20) }}";
    ASSERT_TRUE(render(recurse).ok);
    limits shallow;
    shallow.depth_max = 30;
    expect_bound(recurse, "depth bound of 30", shallow);

    limits small_output;
    small_output.output_bytes_max = 100;
    expect_bound(loop, "output exceeds the bound of 100", small_output);

    limits shallow_parse;
    shallow_parse.parse_depth_max = 10;
    expect_bound("{{ ((((((((((((1)))))))))))) }}", "parse depth bound of 10", shallow_parse);
}

// Real templates stay far from the defaults: a long conversation renders.
TEST(Bounds, LongConversationFitsTheDefaults) {
    const std::string src =
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content|trim }}{% if not loop.last %}\n"
        "{% endif %}{% endfor %}";
    std::vector<value> msgs;
    for (int i = 0; i < 2000; ++i) {
        msgs.push_back(value::dict({{"role", value(i % 2 ? "assistant" : "user")},
                                    {"content", value(std::string(2000, 'w'))}}));
    }
    auto t = chat_template::parse(src);
    ASSERT_TRUE(t.ok());
    auto out = t->render({{"messages", value::list(std::move(msgs))}});
    ASSERT_TRUE(out.ok()) << out.err().message;
    EXPECT_GT(out->size(), 4'000'000u);
}

}  // namespace
