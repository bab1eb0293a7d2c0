// test_engine.cpp: checks the engine's C++ interface as the server and CLI use it: values built
// directly (as from msgpack) render like their JSON twins and keep dict order; from_json's
// errors (nesting, 64-bit range); errors carry code template_error, the template line and
// column, and raise_exception's text; a parsed template renders many times with different
// variables; undefined variables print as nothing; strftime_now uses the pinned or the
// current date; the Python repr of floats and strings; Unicode-aware str methods.
#include <gtest/gtest.h>

#include <ctime>
#include <nlohmann/json.hpp>

#include "template/format.hpp"
#include "template/template.hpp"
#include "template/value_json.hpp"

using namespace ordo::jinja;

namespace {

std::string render(const std::string& src, const variables& vars = {}) {
    auto t = chat_template::parse(src);
    if (!t) return "PARSE ERROR: " + t.err().message;
    auto r = t->render(vars);
    return r.ok() ? *r : "ERROR: " + r.err().message;
}

TEST(Engine, ValuesBuiltDirectlyMatchJson) {
    value msg = value::dict({{"role", value("user")},
                             {"content", value("hé \"x\"")},
                             {"n", value(int64_t(3))},
                             {"f", value(0.5)},
                             {"ok", value(true)},
                             {"none", value::none()},
                             {"list", value::list({value(1), value("a")})}});
    const std::string text = R"({"role": "user", "content": "hé \"x\"", "n": 3, "f": 0.5, )"
                             R"("ok": true, "none": null, "list": [1, "a"]})";
    auto from = from_json(nlohmann::ordered_json::parse(text));
    ASSERT_TRUE(from.ok());
    const std::string src = "{{ m|tojson }}|{{ m.role }}|{{ m['list'][1] }}|{{ m.missing }}|";
    EXPECT_EQ(render(src, {{"m", msg}}), text + "|user|a||");
    EXPECT_EQ(render(src, {{"m", *from}}), text + "|user|a||");
    EXPECT_TRUE(equals(msg, *from));
}

TEST(Engine, FromJsonRefusesWhatValuesCannotHold) {
    std::string deep;
    for (int i = 0; i < 300; ++i) deep += "[";
    for (int i = 0; i < 300; ++i) deep += "]";
    auto d = from_json(nlohmann::ordered_json::parse(deep));
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.err().code, "bad_json");
    auto big = from_json(nlohmann::ordered_json::parse("18446744073709551615"));
    ASSERT_FALSE(big.ok());
    EXPECT_NE(big.err().message.find("64 bits"), std::string::npos);
    EXPECT_TRUE(from_json(nlohmann::ordered_json::parse("9223372036854775807")).ok());
}

TEST(Engine, ErrorsNameLineAndColumn) {
    auto t = chat_template::parse("line one\n{% for x in y %}\n  {{ x | nosuch }}\n{% endfor %}");
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.err().code, "template_error");
    EXPECT_EQ(t.err().message, "template line 3, column 10: no filter named 'nosuch'");

    auto u = chat_template::parse("a\nb {{ 1 +\n}}");
    ASSERT_FALSE(u.ok());
    EXPECT_EQ(u.err().message.rfind("template line 3, column 1:", 0), 0u) << u.err().message;

    auto r = chat_template::parse("x\n\n   {{ raise_exception('Only user and assistant roles') }}");
    ASSERT_TRUE(r.ok());
    auto out = r->render({});
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.err().code, "template_error");
    EXPECT_EQ(out.err().message, "template line 3, column 7: Only user and assistant roles");

    EXPECT_EQ(render("{{ d.a.b }}", {{"d", value::dict(dict_data{})}}),
              "ERROR: template line 1, column 7: 'dict object' has no attribute 'a'");
    EXPECT_EQ(render("{% include 'x' %}")
                  .rfind("PARSE ERROR: template line 1, column 4: 'include' "
                         "is not supported",
                         0),
              0u);
}

TEST(Engine, ParsedOnceRenderedMany) {
    auto t = chat_template::parse("{% for m in messages %}{{ m }};{% endfor %}{{ extra }}");
    ASSERT_TRUE(t.ok());
    for (int i = 0; i < 3; ++i) {
        variables v{{"messages", value::list({value(int64_t(i)), value("x")})}};
        if (i == 2) v["extra"] = value("!");
        auto out = t->render(v);
        ASSERT_TRUE(out.ok());
        EXPECT_EQ(*out, std::to_string(i) + ";x;" + (i == 2 ? "!" : ""));
    }
}

TEST(Engine, StrftimeNowPinnedOrCurrent) {
    auto t = chat_template::parse("{{ strftime_now('%Y-%m-%d') }}");
    ASSERT_TRUE(t.ok());
    render_options pinned;
    std::tm day{};
    day.tm_year = 99, day.tm_mon = 11, day.tm_mday = 31;
    pinned.now = day;
    EXPECT_EQ(*t->render({}, pinned), "1999-12-31");
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buf[16];
    std::strftime(buf, sizeof buf, "%Y-%m-%d", &local);
    EXPECT_EQ(*t->render({}), buf);
}

TEST(Engine, PythonRepr) {
    EXPECT_EQ(float_repr(1.0), "1.0");
    EXPECT_EQ(float_repr(0.1), "0.1");
    EXPECT_EQ(float_repr(1e-05), "1e-05");
    EXPECT_EQ(float_repr(0.0001), "0.0001");
    EXPECT_EQ(float_repr(1e16), "1e+16");
    EXPECT_EQ(float_repr(1234567890123456.0), "1234567890123456.0");
    EXPECT_EQ(float_repr(-2.5e-300), "-2.5e-300");
    EXPECT_EQ(float_repr(1.0 / 0.0), "inf");
    EXPECT_EQ(string_repr("it's"), "\"it's\"");
    EXPECT_EQ(string_repr("a'b\"c"), "'a\\'b\"c'");
    EXPECT_EQ(string_repr("\x01\n\xc2\xa0\xe2\x80\x8d\xf0\x9f\x98\x80"), "'\\x01\\n\\xa0\\u200d😀'");
}

TEST(Engine, UnicodeStrSemantics) {
    variables v{{"s", value("ΣΑΣ ǅ straße\xc2\xa0")}};
    EXPECT_EQ(
        render("{{ s|lower }}|{{ s|upper }}|{{ s|length }}|[{{ s.strip() }}]|{{ s[1:3] }}", v),
        "σας ǆ straße\xc2\xa0|ΣΑΣ Ǆ STRASSE\xc2\xa0|13|[ΣΑΣ ǅ straße]|ΑΣ");
}

// Invalid UTF-8 (a server must validate, but the engine must not crash or loop on it).
TEST(Engine, InvalidUtf8IsHandled) {
    variables v{{"s", value(std::string("a\xff\xc3(b\xe2\x82"))}};
    const std::string out =
        render("{{ s|length }}|{{ s|upper }}|{{ s[::-1]|length }}|{{ s|tojson|length }}", v);
    EXPECT_EQ(out.rfind("7|A", 0), 0u) << out;
}

}  // namespace
