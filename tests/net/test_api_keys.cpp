// test_api_keys.cpp: the pure parts of API-key authentication (door/api_keys.hpp) and the `auth`
// op's parser.
//
// Checks: the key file's text (comments, blank lines, trimming; a malformed key refused naming
// the line and never quoting the key; the key count bound); the file itself (mode 0600 read;
// group- or other-readable or -writable, unreadable, empty or comment-only files refused naming
// the file); matching (every key, exact length, no prefix or padding match, none configured);
// the failure table (the cut-off after auth_failures_max failures within the window, not when
// they are spread over windows, its end after the cool-down, a success forgetting failures, the
// address bound with the least recently seen one evicted); the gate both doors share; Bearer
// header parsing; loopback detection; and `auth` {key} parsed by the one validator.
//
// How: time is passed in (a fixed origin plus offsets), so nothing depends on the clock; files
// are written under the temp directory with explicit modes.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "door/api_keys.hpp"
#include "net/ops.hpp"
#include "net/protocol.hpp"
#include "tests/support/scratch_dir.hpp"

namespace {

using namespace ordo::net;
using namespace ordo::door;
namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;

const clock_type::time_point t0 = clock_type::time_point{} + std::chrono::hours(1);

std::string key_file(const std::string& name, const std::string& text, mode_t mode) {
    const fs::path& dir = ordo::test::scratch_dir("ordo_api_keys");
    std::string p = (dir / name).string();
    fs::remove(p);
    std::ofstream(p) << text;
    EXPECT_EQ(::chmod(p.c_str(), mode), 0);
    return p;
}

}  // namespace

TEST(api_keys_text, comments_blank_lines_and_spaces_are_skipped) {
    auto keys = parse_api_keys("# team keys\n\n  alpha-1  \r\n\t# old: beta\nsk-gamma_2\n", "f");
    ASSERT_TRUE(keys.ok()) << keys.err().message;
    EXPECT_EQ(*keys, (std::vector<std::string>{"alpha-1", "sk-gamma_2"}));
    auto none = parse_api_keys("# nothing\n\n", "f");
    ASSERT_TRUE(none.ok());
    EXPECT_TRUE(none->empty());
}

TEST(api_keys_text, a_malformed_key_is_refused_by_line_without_quoting_it) {
    auto spaced = parse_api_keys("good\nsecret with-space\n", "keys.txt");
    ASSERT_FALSE(spaced.ok());
    EXPECT_EQ(spaced.err().code, "config_invalid");
    EXPECT_NE(spaced.err().message.find("keys.txt:2:"), std::string::npos) << spaced.err().message;
    EXPECT_EQ(spaced.err().message.find("secret"), std::string::npos) << spaced.err().message;
    auto long_key = parse_api_keys(std::string(api_key_bytes_max + 1, 'k'), "f");
    EXPECT_FALSE(long_key.ok());
    EXPECT_TRUE(parse_api_keys(std::string(api_key_bytes_max, 'k'), "f").ok());
    EXPECT_FALSE(parse_api_keys("caf\xc3\xa9\n", "f").ok());  // not ASCII
    std::string many;
    for (size_t i = 0; i <= api_keys_max; i++) many += "k" + std::to_string(i) + "\n";
    auto too_many = parse_api_keys(many, "f");
    ASSERT_FALSE(too_many.ok());
    EXPECT_NE(too_many.err().message.find("more than"), std::string::npos);
}

TEST(api_keys_file, mode_0600_is_read) {
    auto keys = load_api_keys_file(key_file("ok.keys", "# k\nkey-one\nkey-two\n", 0600));
    ASSERT_TRUE(keys.ok()) << keys.err().message;
    EXPECT_EQ(keys->size(), 2u);
    EXPECT_TRUE(load_api_keys_file(key_file("ro.keys", "key\n", 0400)).ok());
}

TEST(api_keys_file, group_or_other_access_unreadable_or_keyless_files_are_refused) {
    for (mode_t mode : {0640, 0604, 0620, 0602, 0644, 0666}) {
        std::string p = key_file("open.keys", "the-secret\n", mode);
        auto keys = load_api_keys_file(p);
        ASSERT_FALSE(keys.ok()) << std::oct << mode;
        EXPECT_EQ(keys.err().code, "config_invalid");
        EXPECT_NE(keys.err().message.find(p), std::string::npos) << keys.err().message;
        EXPECT_NE(keys.err().message.find("chmod 600"), std::string::npos) << keys.err().message;
        EXPECT_EQ(keys.err().message.find("the-secret"), std::string::npos);
    }
    auto missing = load_api_keys_file("/nonexistent/ordo.keys");
    ASSERT_FALSE(missing.ok());
    EXPECT_NE(missing.err().message.find("/nonexistent/ordo.keys: cannot be read"),
              std::string::npos)
        << missing.err().message;
    std::string empty = key_file("empty.keys", "# only a comment\n\n", 0600);
    auto none = load_api_keys_file(empty);
    ASSERT_FALSE(none.ok());
    EXPECT_NE(none.err().message.find(empty + ": holds no key"), std::string::npos)
        << none.err().message;
    auto dir = load_api_keys_file(fs::temp_directory_path().string());
    EXPECT_FALSE(dir.ok());
    if (::geteuid() != 0) {  // root reads a mode-000 file anyway
        auto unreadable = load_api_keys_file(key_file("locked.keys", "key\n", 0000));
        EXPECT_FALSE(unreadable.ok());
    }
}

TEST(api_keys_match, every_key_exactly_and_nothing_else) {
    api_keys keys({"alpha", "beta-key", std::string(api_key_bytes_max, 'z')});
    EXPECT_TRUE(keys.required());
    EXPECT_TRUE(keys.matches("alpha"));
    EXPECT_TRUE(keys.matches("beta-key"));
    EXPECT_TRUE(keys.matches(std::string(api_key_bytes_max, 'z')));
    EXPECT_FALSE(keys.matches("alph"));                     // a prefix
    EXPECT_FALSE(keys.matches("alphaa"));                   // longer
    EXPECT_FALSE(keys.matches(std::string("alpha\0", 6)));  // the padding itself
    EXPECT_FALSE(keys.matches(""));
    EXPECT_FALSE(keys.matches(std::string(api_key_bytes_max + 1, 'z')));
    EXPECT_FALSE(keys.matches("Alpha"));
    api_keys none;
    EXPECT_FALSE(none.required());
    EXPECT_FALSE(none.matches("alpha"));
}

TEST(auth_failure_table, cut_off_after_failures_max_within_the_window_then_served) {
    auth_failures t;
    for (uint32_t i = 1; i < auth_failures_max; i++) {
        EXPECT_FALSE(t.failed("10.0.0.1", t0 + milliseconds(i)));
        EXPECT_EQ(t.cooldown_left_ms("10.0.0.1", t0 + milliseconds(i)), 0u);
    }
    const auto last = t0 + milliseconds(auth_failures_max);
    EXPECT_TRUE(t.failed("10.0.0.1", last));
    EXPECT_EQ(t.cooldown_left_ms("10.0.0.1", last), auth_cooldown_ms);
    EXPECT_EQ(t.cooldown_left_ms("10.0.0.2", last), 0u);  // another address is not affected
    EXPECT_EQ(t.cooldown_left_ms("10.0.0.1", last + milliseconds(auth_cooldown_ms - 1)), 1u);
    EXPECT_EQ(t.cooldown_left_ms("10.0.0.1", last + milliseconds(auth_cooldown_ms)), 0u);
    // Served: the count starts afresh.
    EXPECT_FALSE(t.failed("10.0.0.1", last + milliseconds(auth_cooldown_ms + 1)));
}

TEST(auth_failure_table, failures_spread_over_windows_never_cut_off) {
    auth_failures t;
    for (uint32_t i = 0; i < 4 * auth_failures_max; i++) {
        // One failure short of the bound per window, then the window passes.
        auto now = t0 + milliseconds(auth_failure_window_ms * (i / (auth_failures_max - 1)) +
                                     i % (auth_failures_max - 1));
        EXPECT_FALSE(t.failed("10.0.0.1", now)) << i;
    }
}

TEST(auth_failure_table, a_success_forgets_the_failures) {
    auth_failures t;
    for (uint32_t i = 1; i < auth_failures_max; i++) t.failed("::1", t0);
    t.succeeded("::1");
    EXPECT_EQ(t.size(), 0u);
    for (uint32_t i = 1; i < auth_failures_max; i++) EXPECT_FALSE(t.failed("::1", t0));
}

TEST(auth_failure_table, the_address_bound_evicts_the_least_recently_seen) {
    auth_failures t({.failures_max = 2, .window_ms = 1000, .cooldown_ms = 1000, .clients_max = 3});
    EXPECT_FALSE(t.failed("a", t0));
    EXPECT_FALSE(t.failed("b", t0));
    EXPECT_FALSE(t.failed("c", t0));
    EXPECT_TRUE(t.failed("a", t0));   // a is now the most recently seen, and cut off
    EXPECT_FALSE(t.failed("d", t0));  // evicts b, the least recently seen
    EXPECT_EQ(t.size(), 3u);
    EXPECT_FALSE(t.failed("b", t0));  // b starts again at one failure (evicting c)
    EXPECT_GT(t.cooldown_left_ms("a", t0), 0u);
    for (int i = 0; i < 1000; i++) t.failed("x" + std::to_string(i), t0);
    EXPECT_EQ(t.size(), 3u);
}

TEST(auth_gate_check, verdicts_and_the_shared_cut_off) {
    auth_gate gate(
        api_keys({"right"}),
        {.failures_max = 3, .window_ms = 60000, .cooldown_ms = 60000, .clients_max = 16});
    EXPECT_TRUE(gate.required());
    EXPECT_EQ(gate.check("1.2.3.4", "right", t0), auth_verdict::ok);
    EXPECT_EQ(gate.check("1.2.3.4", std::nullopt, t0), auth_verdict::missing);
    EXPECT_EQ(gate.check("1.2.3.4", "wrong", t0), auth_verdict::wrong);
    EXPECT_EQ(gate.cooldown_left_ms("1.2.3.4", t0), 0u);
    EXPECT_EQ(gate.check("1.2.3.4", "wrong", t0), auth_verdict::wrong);  // the third: cut off
    EXPECT_EQ(gate.cooldown_left_ms("1.2.3.4", t0), 60000u);
    // Cut off: even the right key is refused until the cool-down ends.
    EXPECT_EQ(gate.check("1.2.3.4", "right", t0), auth_verdict::cut_off);
    EXPECT_EQ(gate.check("5.6.7.8", "right", t0), auth_verdict::ok);
    EXPECT_EQ(gate.check("1.2.3.4", "right", t0 + milliseconds(60000)), auth_verdict::ok);

    auth_gate open{api_keys{}};
    EXPECT_FALSE(open.required());
    EXPECT_EQ(open.check("1.2.3.4", std::nullopt, t0), auth_verdict::ok);
    EXPECT_EQ(open.check("1.2.3.4", "anything", t0), auth_verdict::ok);
}

TEST(bearer_header, the_key_of_a_bearer_authorization) {
    EXPECT_EQ(bearer_key("Bearer sk-123"), std::optional<std::string_view>("sk-123"));
    EXPECT_EQ(bearer_key("bearer   sk-123  "), std::optional<std::string_view>("sk-123"));
    EXPECT_EQ(bearer_key("BEARER\tk"), std::optional<std::string_view>("k"));
    EXPECT_FALSE(bearer_key("Basic dXNlcjpwYXNz"));
    EXPECT_FALSE(bearer_key("Bearer"));
    EXPECT_FALSE(bearer_key("Bearer   "));
    EXPECT_FALSE(bearer_key("Bearersk-123"));
    EXPECT_FALSE(bearer_key(""));
}

TEST(loopback, numeric_hosts) {
    EXPECT_TRUE(is_loopback_host("127.0.0.1"));
    EXPECT_TRUE(is_loopback_host("127.3.2.1"));
    EXPECT_TRUE(is_loopback_host("::1"));
    EXPECT_TRUE(is_loopback_host("::ffff:127.0.0.1"));
    EXPECT_FALSE(is_loopback_host("0.0.0.0"));
    EXPECT_FALSE(is_loopback_host("::"));
    EXPECT_FALSE(is_loopback_host("10.0.0.1"));
    EXPECT_FALSE(is_loopback_host("::ffff:10.0.0.1"));
    EXPECT_FALSE(is_loopback_host("localhost"));  // listen addresses are numeric
}

TEST(auth_op, parsed_by_the_one_validator) {
    auto parse = [](const msgpack::sbuffer& b) {
        auto oh = msgpack::unpack(b.data(), b.size());
        auto env = parse_envelope(oh.get());
        return parse_op(std::get<request>(env), {});
    };
    auto pack = [](auto&&... kv) {
        msgpack::sbuffer b;
        msgpack::packer<msgpack::sbuffer> pk(b);
        pk.pack_map(sizeof...(kv) / 2);
        (pk.pack(kv), ...);
        return b;
    };
    auto ok = parse(pack("id", 1, "op", "auth", "key", "sk-1"));
    ASSERT_TRUE(ok.ok()) << ok.err().message;
    ASSERT_TRUE(std::holds_alternative<auth_op>(*ok));
    EXPECT_EQ(std::get<auth_op>(*ok).key, "sk-1");
    auto missing = parse(pack("id", 1, "op", "auth"));
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.err().code, "bad_request");
    EXPECT_FALSE(parse(pack("id", 1, "op", "auth", "key", 7)).ok());
    EXPECT_FALSE(parse(pack("id", 1, "op", "auth", "key", "k", "extra", 1)).ok());
    auto too_long =
        parse(pack("id", 1, "op", "auth", "key", std::string(api_key_bytes_max + 1, 'k')));
    ASSERT_FALSE(too_long.ok());
    EXPECT_EQ(too_long.err().message.find("kkkk"), std::string::npos);  // never quoted
}
