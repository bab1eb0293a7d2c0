// config_test.cpp: checks the accepted side of the configuration: the shipped etc/ordo.toml
// (read through ORDO_SOURCE_DIR) parses to exactly the built-in defaults and documents every
// key; to_toml round-trips; each schema row writes only its own member; command-line overrides
// apply with the file's rules and refused ones name the key and leave the config unchanged;
// listen addresses parse; load_file refuses missing, unreadable and oversized files clearly.
#include "actors/config/config.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "actors/config/schema.hpp"

namespace {

namespace cfgns = ordo::config;
using cfgns::config;

const std::string shipped_path = std::string(ORDO_SOURCE_DIR) + "/etc/ordo.toml";

std::string read_all(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream os;
    os << in.rdbuf();
    return os.str();
}

TEST(shipped_config, parses_and_equals_the_defaults) {
    auto cfg = cfgns::load_file(shipped_path);
    ASSERT_TRUE(cfg.ok()) << cfg.err().message;
    EXPECT_TRUE(*cfg == config{}) << cfgns::to_toml(*cfg);
    // Spot-check values from the brief so a wrong default in config.hpp cannot hide behind
    // an equally wrong line in the file.
    EXPECT_EQ(cfg->server.listen, "127.0.0.1:7070");
    EXPECT_EQ(cfg->server.max_frame_bytes, 1048576u);
    EXPECT_EQ(cfg->gpu.kv_dtype, cfgns::kv_dtype::f16);
    EXPECT_EQ(cfg->scheduler.batch_failure_policy, cfgns::batch_failure_policy::bisect);
    EXPECT_EQ(cfg->log.level, cfgns::log_level::info);
    EXPECT_EQ(cfg->model.generated_path, "var/models/ordo-default.gguf");
    EXPECT_TRUE(cfgns::validate(*cfg, "defaults").ok());
}

TEST(shipped_config, documents_every_key_with_a_comment_above_it) {
    const std::string text = read_all(shipped_path);
    ASSERT_FALSE(text.empty()) << "cannot read " << shipped_path;
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    for (const cfgns::key_spec& spec : cfgns::schema()) {
        const std::string header = "[" + std::string(spec.section) + "]";
        const std::string assign = std::string(spec.name) + " = ";
        std::string section;
        bool found = false;
        for (std::size_t i = 0; i < lines.size(); ++i) {
            if (!lines[i].empty() && lines[i][0] == '[') section = lines[i];
            if (section == header && lines[i].rfind(assign, 0) == 0) {
                found = true;
                ASSERT_GT(i, 0u);
                EXPECT_EQ(lines[i - 1].rfind("# ", 0), 0u)
                    << spec.section << "." << spec.name << " has no comment above it";
            }
        }
        EXPECT_TRUE(found) << spec.section << "." << spec.name << " missing from etc/ordo.toml";
    }
}

TEST(parse, empty_text_gives_the_defaults) {
    auto cfg = cfgns::parse("", "empty");
    ASSERT_TRUE(cfg.ok()) << cfg.err().message;
    EXPECT_TRUE(*cfg == config{});
}

// http.listen: empty turns the HTTP front door off (unlike server.listen, which is required).
TEST(parse, http_listen_may_be_empty_and_is_overridden) {
    auto cfg = cfgns::parse("[http]\nlisten = \"\"\n", "t.toml");
    ASSERT_TRUE(cfg.ok()) << cfg.err().message;
    EXPECT_EQ(cfg->http.listen, "");
    EXPECT_TRUE(cfgns::apply_override(*cfg, "http.listen", "[::1]:0").ok());
    EXPECT_EQ(cfg->http.listen, "[::1]:0");
    EXPECT_FALSE(cfgns::apply_override(*cfg, "http.listen", "nowhere").ok());
    EXPECT_FALSE(cfgns::parse("[server]\nlisten = \"\"\n", "t.toml").ok());
}

TEST(parse, reads_every_kind_of_value) {
    auto cfg = cfgns::parse(
        "[server]\nlisten = \"[::1]:0\"\nmax_frame_bytes = 64\n"
        "[gpu]\nkv_dtype = \"f32\"\nkv_block_tokens = 256\nrow_summaries = \"off\"\n"
        "flush_every_layers = 12\n"
        "[scheduler]\nprefix_cache = false\nbatch_failure_policy = \"fail\"\n"
        "[log]\nlevel = \"off\"\nfile = \"/tmp/ordo.log\"\n"
        "[kv]\nenabled = true\n"
        "[http]\ncors_allow_origins = [\"https://app.example.com\", \"http://127.0.0.1:3000\", "
        "\"*\"]\n"
        "[model]\nembedding_pooling = \"last\"\n"
        "[fault]\nseed = 9223372036854775807\nenabled = true\n"
        "plan = [\"nan_logits\", \"kv_eio\", \"nan_logits\", \"net_rst\"]\nplan_every_steps = 1\n"
        "plan_faults_max = 0\nplan_delay_ms = 10000\n",
        "t.toml");
    ASSERT_TRUE(cfg.ok()) << cfg.err().message;
    EXPECT_EQ(cfg->server.listen, "[::1]:0");
    EXPECT_EQ(cfg->server.max_frame_bytes, 64u);
    EXPECT_EQ(cfg->gpu.kv_dtype, cfgns::kv_dtype::f32);
    EXPECT_EQ(cfg->gpu.kv_block_tokens, 256u);
    EXPECT_EQ(cfg->gpu.row_summaries, cfgns::gpu_row_summaries::off);
    EXPECT_EQ(cfg->gpu.flush_every_layers, 12u);
    EXPECT_FALSE(cfg->scheduler.prefix_cache);
    EXPECT_EQ(cfg->scheduler.batch_failure_policy, cfgns::batch_failure_policy::fail);
    EXPECT_EQ(cfg->log.level, cfgns::log_level::off);
    EXPECT_EQ(cfg->log.file, "/tmp/ordo.log");
    EXPECT_EQ(cfg->fault.seed, 9223372036854775807ull);
    using fk = ordo::fault_kind;
    EXPECT_EQ(cfg->fault.plan,
              (std::vector<fk>{fk::nan_logits, fk::kv_eio, fk::nan_logits, fk::net_rst}));
    EXPECT_EQ(cfg->fault.plan_every_steps, 1u);
    EXPECT_EQ(cfg->fault.plan_faults_max, 0u);
    EXPECT_EQ(cfg->fault.plan_delay_ms, 10000u);
    EXPECT_EQ(cfg->http.cors_allow_origins,
              (std::vector<std::string>{"https://app.example.com", "http://127.0.0.1:3000", "*"}));
    EXPECT_EQ(cfg->model.embedding_pooling, cfgns::embedding_pooling::last);
}

// A valid value different from the default, for any key.
void set_non_default(const cfgns::key_spec& spec, config& c) {
    if (spec.kind == cfgns::value_kind::choice_list) {
        spec.set_list(c, spec.get_list(c).empty() ? std::vector<std::int64_t>{spec.max, spec.min}
                                                  : std::vector<std::int64_t>{});
        return;
    }
    if (spec.kind == cfgns::value_kind::string_list) {
        spec.set_strs(c, spec.get_strs(c).empty()
                             ? std::vector<std::string>{"https://a.example:8443", "*"}
                             : std::vector<std::string>{});
        return;
    }
    if (spec.kind == cfgns::value_kind::string) {
        spec.set_str(c, spec.name == "listen" ? "[::1]:9" : "changed \"path\"\\\t");
        return;
    }
    const std::int64_t now = spec.get_int(c);
    spec.set_int(c, now == spec.max ? spec.min : spec.max);
}

TEST(schema, each_row_writes_only_its_own_member) {
    for (const cfgns::key_spec& spec : cfgns::schema()) {
        config c;
        set_non_default(spec, c);
        ASSERT_FALSE(c == config{}) << spec.name;
        const config d;
        EXPECT_EQ(c.server == d.server, spec.section != "server") << spec.name;
        EXPECT_EQ(c.http == d.http, spec.section != "http") << spec.name;
        EXPECT_EQ(c.model == d.model, spec.section != "model") << spec.name;
        EXPECT_EQ(c.gpu == d.gpu, spec.section != "gpu") << spec.name;
        EXPECT_EQ(c.scheduler == d.scheduler, spec.section != "scheduler") << spec.name;
        EXPECT_EQ(c.speculative == d.speculative, spec.section != "speculative") << spec.name;
        EXPECT_EQ(c.kv == d.kv, spec.section != "kv") << spec.name;
        EXPECT_EQ(c.log == d.log, spec.section != "log") << spec.name;
        EXPECT_EQ(c.fault == d.fault, spec.section != "fault") << spec.name;
        // Exactly one row reads the changed member back as changed.
        int changed = 0;
        for (const cfgns::key_spec& other : cfgns::schema()) {
            const bool differs = other.kind == cfgns::value_kind::string
                                     ? other.get_str(c) != other.get_str(d)
                                 : other.kind == cfgns::value_kind::choice_list
                                     ? other.get_list(c) != other.get_list(d)
                                 : other.kind == cfgns::value_kind::string_list
                                     ? other.get_strs(c) != other.get_strs(d)
                                     : other.get_int(c) != other.get_int(d);
            changed += differs ? 1 : 0;
        }
        EXPECT_EQ(changed, 1) << spec.section << "." << spec.name;
    }
}

TEST(to_toml, round_trips_defaults_and_every_changed_key) {
    auto back = cfgns::parse(cfgns::to_toml(config{}), "printed");
    ASSERT_TRUE(back.ok()) << back.err().message;
    EXPECT_TRUE(*back == config{});

    config c;
    for (const cfgns::key_spec& spec : cfgns::schema()) set_non_default(spec, c);
    c.scheduler.max_batch_tokens = 4096;  // keep the cross-key rules satisfied
    c.model.context_tokens = 0;
    c.gpu.kv_blocks = 4096;  // kv_blocks x kv_block_tokens within the pool's token bound
    ASSERT_TRUE(cfgns::validate(c, "built").ok()) << cfgns::validate(c, "built").err().message;
    const std::string text = cfgns::to_toml(c);
    auto again = cfgns::parse(text, "printed");
    ASSERT_TRUE(again.ok()) << again.err().message << "\n" << text;
    EXPECT_TRUE(*again == c) << text;
    EXPECT_NE(
        text.find("[scheduler]\n# sequences decoded together at most; 0 = the device's choice "
                  "(integer 0..1024)\n"),
        std::string::npos)
        << text;
    EXPECT_NE(text.find("\nplan = [\"draft_eos\", \"device_lost\"]\n"), std::string::npos) << text;
}

TEST(validate, refuses_a_config_built_wrongly_in_code) {
    config c;
    c.gpu.kv_block_tokens = 12;
    c.log.level = static_cast<cfgns::log_level>(42);
    c.fault.plan = {ordo::fault_kind::hang, static_cast<ordo::fault_kind>(42)};
    c.http.cors_allow_origins = {"*", "https://x.example/"};
    auto st = cfgns::validate(c, "code");
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.err().message.find("code: gpu.kv_block_tokens = 12: must be a power of two"),
              std::string::npos)
        << st.err().message;
    EXPECT_NE(st.err().message.find("code: log.level = 42: must be one of"), std::string::npos)
        << st.err().message;
    EXPECT_NE(st.err().message.find("code: fault.plan = [\"hang\", 42]: every entry must be one "
                                    "of \"device_lost\""),
              std::string::npos)
        << st.err().message;
    EXPECT_NE(st.err().message.find("code: http.cors_allow_origins = [\"*\", "
                                    "\"https://x.example/\"]: entry 2 (\"https://x.example/\")"),
              std::string::npos)
        << st.err().message;
}

TEST(validate, checks_the_fault_plan_cross_rules_in_code) {
    config c;
    c.fault.plan = {ordo::fault_kind::kv_flip_read};
    auto st = cfgns::validate(c, "code");
    ASSERT_FALSE(st.ok());
    // Both rules are broken: no [fault] enabled, no [kv] enabled; both are reported.
    EXPECT_NE(st.err().message.find("code: fault.plan = [\"kv_flip_read\"], fault.enabled = "
                                    "false: a fault plan needs enabled = true"),
              std::string::npos)
        << st.err().message;
    EXPECT_NE(st.err().message.find("code: fault.plan = [\"kv_flip_read\"], kv.enabled = false: "
                                    "a plan with kv kinds"),
              std::string::npos)
        << st.err().message;
    c.fault.enabled = true;
    c.kv.enabled = true;
    EXPECT_TRUE(cfgns::validate(c, "code").ok());
}

TEST(override, applies_values_with_the_file_rules) {
    config c;
    ASSERT_TRUE(cfgns::apply_override(c, "server.listen", "0.0.0.0:0").ok());
    ASSERT_TRUE(cfgns::apply_override(c, "gpu.device", "Radeon \xc3\xa9\xe2\x82\xac").ok());
    ASSERT_TRUE(cfgns::apply_override(c, "model.path", "models/x.gguf").ok());
    ASSERT_TRUE(cfgns::apply_override(c, "log.level", "debug").ok());
    ASSERT_TRUE(cfgns::apply_override(c, "scheduler.max_sequences", "32").ok());
    ASSERT_TRUE(cfgns::apply_override(c, "scheduler.prefix_cache", "false").ok());
    ASSERT_TRUE(cfgns::apply_override(c, "fault.enabled", "true").ok());
    ASSERT_TRUE(cfgns::apply_override(c, "fault.plan", "hang,step_delay").ok());
    EXPECT_EQ(c.fault.plan, (std::vector<ordo::fault_kind>{ordo::fault_kind::hang,
                                                           ordo::fault_kind::step_delay}));
    EXPECT_EQ(c.server.listen, "0.0.0.0:0");
    EXPECT_EQ(c.model.path, "models/x.gguf");
    EXPECT_EQ(c.gpu.device, "Radeon \xc3\xa9\xe2\x82\xac");
    EXPECT_EQ(c.log.level, cfgns::log_level::debug);
    EXPECT_EQ(c.scheduler.max_sequences, 32u);
    EXPECT_FALSE(c.scheduler.prefix_cache);
    EXPECT_TRUE(cfgns::validate(c, "command line").ok());
    ASSERT_TRUE(cfgns::apply_override(c, "fault.plan", "").ok());  // "" = no plan
    EXPECT_TRUE(c.fault.plan.empty());
    ASSERT_TRUE(
        cfgns::apply_override(c, "http.cors_allow_origins", "https://a.example,http://[::1]:3000")
            .ok());
    EXPECT_EQ(c.http.cors_allow_origins,
              (std::vector<std::string>{"https://a.example", "http://[::1]:3000"}));
    ASSERT_TRUE(cfgns::apply_override(c, "http.cors_allow_origins", "").ok());  // "" = none
    EXPECT_TRUE(c.http.cors_allow_origins.empty());
}

struct bad_override {
    const char* key;
    const char* value;
    const char* expect;
};

TEST(override, refuses_bad_values_naming_the_key_and_changes_nothing) {
    const bad_override cases[] = {
        {"server.listen", "nope", "command line: server.listen = \"nope\": missing port"},
        {"log.level", "loud", "command line: log.level = \"loud\": must be one of \"trace\""},
        {"scheduler.max_sequences", "2000",
         "command line: scheduler.max_sequences = \"2000\": must be "
         "between 0 and 1024"},
        {"scheduler.max_sequences", "abc", "scheduler.max_sequences = \"abc\": expected integer"},
        {"scheduler.max_sequences", " 5", "scheduler.max_sequences = \" 5\": expected integer"},
        {"scheduler.max_sequences", "5x", "scheduler.max_sequences = \"5x\": expected integer"},
        {"scheduler.max_sequences", "", "scheduler.max_sequences = \"\": expected integer"},
        {"scheduler.max_sequences", "99999999999999999999", "expected integer 0..1024"},
        {"scheduler.prefix_cache", "yes", "scheduler.prefix_cache = \"yes\": expected true or"},
        {"gpu.kv_block_tokens", "48", "gpu.kv_block_tokens = \"48\": must be a power of two"},
        {"server.lisen", "127.0.0.1:1",
         "command line: server.lisen: unknown key; did you mean "
         "server.listen?"},
        {"listen", "127.0.0.1:1", "command line: listen: unknown key; did you mean server.listen?"},
        {"bogus.key", "1", "command line: bogus.key: unknown key"},
        {"model.path", "bad\xff.gguf", "model.path = \"bad\xff.gguf\": must be valid UTF-8"},
        {"model.path", "cut\xe2\x82", "must be valid UTF-8"},
        {"model.path", "surrogate\xed\xa0\x80", "must be valid UTF-8"},
        {"model.path", "overlong\xc0\xaf", "must be valid UTF-8"},
        {"fault.plan", "hang,bogus",
         "command line: fault.plan = \"hang,bogus\": \"bogus\" is not one of \"device_lost\", "
         "\"hang\""},
        {"fault.plan", "hang,", "fault.plan = \"hang,\": \"\" is not one of \"device_lost\""},
        {"fault.plan_every_steps", "0",
         "command line: fault.plan_every_steps = \"0\": must be between 1 and 1000000"},
        {"http.cors_allow_origins", "https://a.example,ftp://b",
         "command line: http.cors_allow_origins = \"https://a.example,ftp://b\": entry 2 "
         "(\"ftp://b\"): must be \"*\" or scheme://host[:port] with no path (http or https)"},
        {"http.cors_allow_origins", "https://a.example,",
         "http.cors_allow_origins = \"https://a.example,\": entry 2 (\"\"): must be"},
    };
    for (const bad_override& b : cases) {
        config c;
        auto st = cfgns::apply_override(c, b.key, b.value);
        ASSERT_FALSE(st.ok()) << b.key << "=" << b.value;
        EXPECT_EQ(st.err().code, "config_invalid");
        EXPECT_NE(st.err().message.find(b.expect), std::string::npos)
            << "expected: " << b.expect << "\ngot: " << st.err().message;
        EXPECT_TRUE(c == config{}) << b.key << " changed the config although refused";
    }
}

TEST(listen_address, parses_ipv4_and_bracketed_ipv6) {
    auto a = cfgns::parse_listen_address("127.0.0.1:7070");
    ASSERT_TRUE(a.ok()) << a.err().message;
    EXPECT_EQ(*a, (cfgns::listen_address{"127.0.0.1", 7070, false}));
    auto b = cfgns::parse_listen_address("[::1]:0");
    ASSERT_TRUE(b.ok()) << b.err().message;
    EXPECT_EQ(*b, (cfgns::listen_address{"::1", 0, true}));
    auto c = cfgns::parse_listen_address("[fe80::1:2]:65535");
    ASSERT_TRUE(c.ok()) << c.err().message;
    EXPECT_EQ(c->port, 65535);
    for (const char* bad : {"", ":", "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:-1",
                            "127.0.0.1:+1", "127.0.0.1:7070x", "256.0.0.1:1", "[127.0.0.1]:1",
                            "::1:80", "[::1:80", "[]:80", "host:80"}) {
        auto r = cfgns::parse_listen_address(bad);
        EXPECT_FALSE(r.ok()) << "accepted " << bad;
        if (!r.ok()) {
            EXPECT_EQ(r.err().code, "config_invalid");
        }
    }
}

TEST(load_file, refuses_missing_directory_and_oversized_files) {
    auto missing = cfgns::load_file("/nonexistent/ordo.toml");
    ASSERT_FALSE(missing.ok());
    EXPECT_NE(missing.err().message.find("/nonexistent/ordo.toml: cannot open"), std::string::npos)
        << missing.err().message;

    const std::string dir = testing::TempDir();
    auto directory = cfgns::load_file(dir);
    ASSERT_FALSE(directory.ok());
    EXPECT_NE(directory.err().message.find(dir), std::string::npos) << directory.err().message;

    const std::string big = dir + "/ordo_config_big.toml";
    {
        std::ofstream out(big, std::ios::binary);
        out << "# " << std::string(1024 * 1024, 'x') << "\n";
    }
    auto oversized = cfgns::load_file(big);
    ASSERT_FALSE(oversized.ok());
    EXPECT_NE(oversized.err().message.find("larger than 1048576 bytes"), std::string::npos)
        << oversized.err().message;
    std::remove(big.c_str());
}

TEST(load_file, names_the_path_in_line_errors) {
    const std::string path = testing::TempDir() + "/ordo_config_bad.toml";
    {
        std::ofstream out(path, std::ios::binary);
        out << "[server]\n\nmax_connections = 0\n";
    }
    auto cfg = cfgns::load_file(path);
    ASSERT_FALSE(cfg.ok());
    EXPECT_EQ(cfg.err().message, path +
                                     ":3: server.max_connections = 0: must be between 1 and "
                                     "65536");
    std::remove(path.c_str());
}

}  // namespace
