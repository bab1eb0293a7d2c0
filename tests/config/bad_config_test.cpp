// bad_config_test.cpp: checks that every kind of bad configuration is refused with an error that
// names the file, the line and the key. A table of inline TOML texts, each with the exact
// fragments its config_invalid message must contain; several cases check that all problems of a
// file are reported together, one per line, in file order. Cases named after an actor's start
// check (the gpu grid, the scheduler's block table) hold the schema to what the actors run.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "actors/config/config.hpp"

namespace {

using ordo::config::parse;

struct bad_case {
    const char* name;
    const char* toml;
    std::vector<std::string> expect;  // fragments the error message must contain
    std::size_t lines = 1;            // problems (message lines) expected
};

// Names the case in gtest output instead of dumping its bytes.
void PrintTo(const bad_case& c, std::ostream* os) {
    *os << c.name;
}

const std::vector<bad_case>& bad_cases() {
    static const std::vector<bad_case> cases = {
        {"unknown_key",
         "[server]\nlisten = \"127.0.0.1:1\"\nlistn = 5\n",
         {"t.toml:3: server.listn: unknown key; did you mean server.listen?"}},
        {"key_in_wrong_section",
         "[server]\nkv_dtype = \"f16\"\n",
         {"t.toml:2: server.kv_dtype: unknown key; did you mean gpu.kv_dtype?"}},
        {"unknown_section",
         "[server]\nmax_connections = 3\n\n[srever]\nx = 1\n",
         {"t.toml:4: srever: unknown section [srever]; did you mean [server]?"}},
        {"key_outside_section",
         "listen = \"127.0.0.1:1\"\n",
         {"t.toml:1: listen: unknown key outside any section; did you mean server.listen?"}},
        {"section_not_table",
         "\n\nserver = 5\n",
         {"t.toml:3: server: must be a table ([server]), got integer"}},
        {"array_of_tables",
         "[[gpu]]\ndevice = \"0\"\n",
         {"t.toml:1: gpu: must be a table ([gpu]), got array"}},
        {"nested_table",
         "[server]\n[server.tls]\ncert = \"x\"\n",
         {"t.toml:2: server.tls: unknown key"}},
        {"string_for_int",
         "[server]\nmax_connections = \"many\"\n",
         {"t.toml:2: server.max_connections = \"many\": wrong type: expected integer 1..65536, "
          "got string"}},
        {"int_for_bool",
         "[scheduler]\n\nprefix_cache = 1\n",
         {"t.toml:3: scheduler.prefix_cache = 1: wrong type: expected true or false, got integer"}},
        {"float_for_int",
         "[scheduler]\nmax_sequences = 4.0\n",
         {"t.toml:2: scheduler.max_sequences = 4.0: wrong type: expected integer 0..1024, got "
          "float"}},
        {"int_for_string",
         "[model]\npath = 7\n",
         {"t.toml:2: model.path = 7: wrong type: expected string, got integer"}},
        {"int_for_enum",
         "[log]\nlevel = 2\n",
         {"t.toml:2: log.level = 2: wrong type: expected one of \"trace\", \"debug\""}},
        {"array_for_int",
         "[gpu]\nwatchdog_ms = [1, 2]\n",
         {"t.toml:2: gpu.watchdog_ms = [...]: wrong type", "got array"}},
        {"zero",
         "[scheduler]\nmax_queue = 0\n",
         {"t.toml:2: scheduler.max_queue = 0: must be between 1 and 65536"}},
        {"over_the_device_choice_range",
         "[scheduler]\nmax_sequences = 1025\n",
         {"t.toml:2: scheduler.max_sequences = 1025: must be between 0 and 1024"}},
        {"kv_pool_under_a_mib",
         "[gpu]\nkv_memory_bytes = 1048575\n",
         {"t.toml:2: gpu.kv_memory_bytes = 1048575: must be 0 (the device's choice) or at least "
          "1048576 (1 MiB)"}},
        {"too_big",
         "[server]\nmax_frame_bytes = 67108865\n",
         {"t.toml:2: server.max_frame_bytes = 67108865: must be between 64 and 67108864"}},
        {"too_small",
         "[server]\nmax_frame_bytes = 63\n",
         {"t.toml:2: server.max_frame_bytes = 63: must be between 64 and 67108864"}},
        {"flush_past_its_range",
         "[gpu]\nflush_every_layers = 1025\n",
         {"t.toml:2: gpu.flush_every_layers = 1025: must be between 0 and 1024"}},
        {"negative",
         "[gpu]\nkv_blocks = -1\n",
         {"t.toml:2: gpu.kv_blocks = -1: must be between 0 and 1048576"}},
        {"not_power_of_two",
         "[gpu]\nkv_block_tokens = 24\n",
         {"t.toml:2: gpu.kv_block_tokens = 24: must be a power of two"}},
        {"bad_enum",
         "[gpu]\nkv_dtype = \"bf16\"\n",
         {"t.toml:2: gpu.kv_dtype = \"bf16\": must be one of \"f16\", \"f32\""}},
        {"bad_row_summaries",
         "[gpu]\n\nrow_summaries = \"yes\"\n",
         {"t.toml:3: gpu.row_summaries = \"yes\": must be one of \"auto\", \"on\", \"off\""}},
        {"bad_batch_invariant",
         "[gpu]\nbatch_invariant = \"no\"\n",
         {"t.toml:2: gpu.batch_invariant = \"no\": wrong type: expected true or false, got "
          "string"}},
        {"bad_enum_case",
         "[scheduler]\nbatch_failure_policy = \"Bisect\"\n",
         {"t.toml:2: scheduler.batch_failure_policy = \"Bisect\": must be one of \"bisect\", "
          "\"sequential\", \"fail\""}},
        {"listen_hostname",
         "[server]\nlisten = \"localhost:7070\"\n",
         {"t.toml:2: server.listen = \"localhost:7070\": not a numeric IPv4 address"}},
        {"listen_no_port",
         "[server]\nlisten = \"127.0.0.1\"\n",
         {"t.toml:2: server.listen = \"127.0.0.1\": missing port"}},
        {"listen_port_too_big",
         "[server]\nlisten = \"127.0.0.1:70000\"\n",
         {"t.toml:2: server.listen = \"127.0.0.1:70000\": bad port"}},
        {"listen_ipv6_unbracketed",
         "[server]\nlisten = \"::1:7070\"\n",
         {"t.toml:2: server.listen = \"::1:7070\": an IPv6 address must be in brackets"}},
        {"http_listen_hostname",
         "[http]\nlisten = \"localhost:8080\"\n",
         {"t.toml:2: http.listen = \"localhost:8080\": not a numeric IPv4 address"}},
        {"http_body_bytes_too_small",
         "[http]\nmax_body_bytes = 10\n",
         {"t.toml:2: http.max_body_bytes = 10: must be between 1024 and 67108864"}},
        {"empty_required_string",
         "[kv]\ndir = \"\"\n",
         {"t.toml:2: kv.dir = \"\": must not be empty"}},
        {"nul_in_string",
         "[model]\npath = \"a\\u0000b\"\n",
         {"t.toml:2: model.path = ", "must not contain NUL"}},
        {"syntax_missing_value",
         "[server]\nmax_connections = 256\nlisten =\n",
         {"t.toml:3:", "TOML syntax error"}},
        {"syntax_duplicate_key",
         "[gpu]\nwatchdog_ms = 100\nwatchdog_ms = 200\n",
         {"t.toml:3:", "TOML syntax error"}},
        {"syntax_int_overflow",
         "[fault]\nseed = 99999999999999999999\n",
         {"t.toml:2:", "TOML syntax error"}},
        {"syntax_bad_utf8", "[log]\nfile = \"\xff\xfe\"\n", {"t.toml:2:", "TOML syntax error"}},
        {"cross_batch_below_sequences",
         "[scheduler]\nmax_sequences = 32\nmax_batch_tokens = 16\n",
         {"t.toml:3: scheduler.max_batch_tokens = 16, scheduler.max_sequences = 32: "
          "max_batch_tokens must be at least max_sequences"}},
        {"cross_default_tokens_vs_context",
         "[model]\ncontext_tokens = 128\n",
         {"t.toml:2: scheduler.max_tokens_default = 256, model.context_tokens = 128"}},
        // The gpu runner refuses a step of more than 65535 tokens (a grid row per token);
        // the schema once let 65536 through and the server then started degraded.
        {"max_batch_tokens_above_the_gpu_grid",
         "[scheduler]\nmax_batch_tokens = 65536\n",
         {"t.toml:2: scheduler.max_batch_tokens = 65536: must be between 1 and 65535"}},
        // The scheduler's block table refuses a pool of more than 2^24 tokens; each key alone
        // was in range, so the device built and the scheduler then reported degraded.
        {"cross_kv_pool_above_the_scheduler_table",
         "[gpu]\nkv_blocks = 1048576\nkv_block_tokens = 32\n",
         {"t.toml:3: gpu.kv_blocks = 1048576, gpu.kv_block_tokens = 32: kv_blocks x "
          "kv_block_tokens must be at most 16777216 tokens"}},
        // Warm-up is judged by warmup_ms_max instead of the watchdog, never by less (issue 26).
        {"cross_warmup_below_watchdog",
         "[gpu]\nwatchdog_ms = 20000\nwarmup_ms_max = 15000\n",
         {"t.toml:3: gpu.warmup_ms_max = 15000, gpu.watchdog_ms = 20000: warmup_ms_max must be "
          "at least watchdog_ms"}},
        // [fault] plan (issue 15): an array of fault kind names, checked name by name.
        {"plan_unknown_kind",
         "[fault]\nenabled = true\nplan = [\"nan_logits\", \"bogus\", \"hang\"]\n",
         {"t.toml:3: fault.plan = [\"nan_logits\", \"bogus\", \"hang\"]: \"bogus\" is not one "
          "of \"device_lost\", \"hang\", \"nan_logits\", \"step_delay\", \"mailbox_refuse\", "
          "\"kv_enospc\", \"kv_eio\", \"kv_torn_exit\", \"kv_flip_read\", \"kv_stall_read\", "
          "\"kv_stall_unlink\", \"kv_fingerprint\""}},
        {"plan_not_an_array",
         "[fault]\nenabled = true\nplan = \"nan_logits\"\n",
         {"t.toml:3: fault.plan = \"nan_logits\": wrong type: expected array of at most 64 "
          "entries, each one of \"device_lost\"",
          "got string"}},
        {"plan_entry_not_a_string",
         "[fault]\nenabled = true\n\nplan = [\"hang\", 3]\n",
         {"t.toml:4: fault.plan = [\"hang\", 3]: wrong type: expected array of at most 64",
          "got an entry of type integer"}},
        {"plan_nested_array",
         "[fault]\nenabled = true\nplan = [[\"hang\"]]\n",
         {"t.toml:3: fault.plan = [[...]]: wrong type", "got an entry of type array"}},
        {"plan_too_many_entries",
         "[fault]\nenabled = true\nplan = [\"hang\", \"hang\", \"hang\", \"hang\", \"hang\", "
         "\"hang\", \"hang\", \"hang\", \"hang\", \"hang\", \"hang\", \"hang\", \"hang\", "
         "\"hang\", \"hang\", \"hang\", \"hang\", \"hang\", \"hang\", \"hang\", \"hang\", "
         "\"hang\", \"hang\", \"hang\", \"hang\", \"hang\", \"hang\", \"hang\", \"hang\", "
         "\"hang\", \"hang\", \"hang\", \"hang\", \"hang\", \"hang\", \"hang\", \"hang\", "
         "\"hang\", \"hang\", \"hang\", \"hang\", \"hang\", \"hang\", \"hang\", \"hang\", "
         "\"hang\", \"hang\", \"hang\", \"hang\", \"hang\", \"hang\", \"hang\", \"hang\", "
         "\"hang\", \"hang\", \"hang\", \"hang\", \"hang\", \"hang\", \"hang\", \"hang\", "
         "\"hang\", \"hang\", \"hang\", \"hang\"]\n",
         {"t.toml:3: fault.plan = [\"hang\", ", "...: must have at most 64 entries"}},
        {"cross_plan_without_enabled",
         "[fault]\nplan = [\"nan_logits\"]\n",
         {"t.toml:2: fault.plan = [\"nan_logits\"], fault.enabled = false: a fault plan needs "
          "enabled = true"}},
        {"cross_plan_kv_kind_without_kv",
         "[kv]\nenabled = false\n[fault]\nenabled = true\nplan = [\"hang\", \"kv_torn_exit\"]\n",
         {"t.toml:5: fault.plan = [\"hang\", \"kv_torn_exit\"], kv.enabled = false: a plan with "
          "kv kinds (kv_*) needs [kv] enabled = true"}},
        {"plan_every_steps_zero",
         "[fault]\nplan_every_steps = 0\n",
         {"t.toml:2: fault.plan_every_steps = 0: must be between 1 and 1000000"}},
        {"plan_every_steps_too_big",
         "[fault]\nplan_every_steps = 1000001\n",
         {"t.toml:2: fault.plan_every_steps = 1000001: must be between 1 and 1000000"}},
        {"plan_faults_max_negative",
         "[fault]\n\nplan_faults_max = -1\n",
         {"t.toml:3: fault.plan_faults_max = -1: must be between 0 and 1000000"}},
        {"plan_faults_max_too_big",
         "[fault]\nplan_faults_max = 1000001\n",
         {"t.toml:2: fault.plan_faults_max = 1000001: must be between 0 and 1000000"}},
        {"plan_delay_ms_zero",
         "[fault]\nplan_delay_ms = 0\n",
         {"t.toml:2: fault.plan_delay_ms = 0: must be between 1 and 10000"}},
        {"plan_delay_ms_above_the_gpu_bound",
         "[fault]\nplan_delay_ms = 10001\n",
         {"t.toml:2: fault.plan_delay_ms = 10001: must be between 1 and 10000"}},
        {"plan_every_steps_string",
         "[fault]\nplan_every_steps = \"often\"\n",
         {"t.toml:2: fault.plan_every_steps = \"often\": wrong type: expected integer "
          "1..1000000, got string"}},
        // [http] cors_allow_origins (issue 27): an array of strings, each "*" or an origin as
        // a browser sends it; the message names the key, the line and the bad entry.
        {"cors_origins_not_an_array",
         "[http]\ncors_allow_origins = \"https://a.example\"\n",
         {"t.toml:2: http.cors_allow_origins = \"https://a.example\": wrong type: expected "
          "array of at most 64 strings, got string"}},
        {"cors_origin_not_a_string",
         "[http]\n\ncors_allow_origins = [\"https://a.example\", 8080]\n",
         {"t.toml:3: http.cors_allow_origins = [\"https://a.example\", 8080]: wrong type",
          "got an entry of type integer"}},
        {"cors_origin_with_path",
         "[http]\ncors_allow_origins = [\"https://a.example\", \"https://b.example/app\"]\n",
         {"t.toml:2: http.cors_allow_origins = [\"https://a.example\", "
          "\"https://b.example/app\"]: entry 2 (\"https://b.example/app\"): must be \"*\" or "
          "scheme://host[:port] with no path"}},
        {"cors_origin_trailing_slash",
         "[http]\ncors_allow_origins = [\"http://localhost:3000/\"]\n",
         {"t.toml:2: http.cors_allow_origins", "entry 1 (\"http://localhost:3000/\"): must be"}},
        {"cors_origin_no_scheme",
         "[http]\ncors_allow_origins = [\"app.example.com\"]\n",
         {"t.toml:2: http.cors_allow_origins", "(http or https)"}},
        {"cors_origin_upper_case",
         "[http]\ncors_allow_origins = [\"https://App.example.com\"]\n",
         {"t.toml:2: http.cors_allow_origins", "must be lower case"}},
        {"cors_origin_null",
         "[http]\ncors_allow_origins = [\"null\"]\n",
         {"t.toml:2: http.cors_allow_origins = [\"null\"]: entry 1 (\"null\"): must be"}},
        {"cors_origin_empty",
         "[http]\ncors_allow_origins = [\"\"]\n",
         {"t.toml:2: http.cors_allow_origins = [\"\"]: entry 1 (\"\"): must be"}},
        {"embedding_pooling_unknown",
         "[model]\nembedding_pooling = \"max\"\n",
         {"t.toml:2: model.embedding_pooling = \"max\": must be one of \"mean\", \"last\", "
          "\"cls\""}},
        {"speculative_mode_unknown",
         "[speculative]\nmode = \"medusa\"\n",
         {"t.toml:2: speculative.mode = \"medusa\": must be one of \"off\", \"ngram\", "
          "\"draft\""}},
        {"speculative_draft_without_model",
         "[speculative]\nmode = \"draft\"\n",
         {"t.toml:2: speculative.draft_model = \"\", speculative.mode = \"draft\": mode = "
          "\"draft\" needs a draft_model"}},
        {"speculative_draft_model_without_mode",
         "[speculative]\ndraft_model = \"d.gguf\"\n",
         {"speculative.draft_model = \"d.gguf\", speculative.mode = \"off\": mode = \"draft\" "
          "needs a draft_model, and a draft_model needs mode = \"draft\""}},
        {"speculative_draft_wait_too_short",
         "[speculative]\ndraft_wait_ms = 5\n",
         {"t.toml:2: speculative.draft_wait_ms = 5: must be between 100 and 600000"}},
        {"speculative_ngram_min_above_max",
         "[speculative]\nngram_min = 5\nngram_max = 3\n",
         {"t.toml:3: speculative.ngram_min = 5, speculative.ngram_max = 3: ngram_min must be at "
          "most ngram_max"}},
        {"speculative_drafts_past_the_batch",
         "[scheduler]\nmax_batch_tokens = 16\n[speculative]\nmode = \"ngram\"\n"
         "draft_tokens_max = 16\n",
         {"speculative.draft_tokens_max = 16, scheduler.max_batch_tokens = 16: draft_tokens_max "
          "must be less than max_batch_tokens"}},
        {"speculative_draft_tokens_zero",
         "[speculative]\ndraft_tokens_max = 0\n",
         {"t.toml:2: speculative.draft_tokens_max = 0: must be between 1 and 64"}},
        {"many_errors_in_file_order",
         "[server]\nmax_connections = 0\nbogus = 1\n[gpu]\nkv_dtype = \"f8\"\n"
         "[scheduler]\nprefix_cache = \"yes\"\n[nope]\n",
         {"t.toml:2: server.max_connections = 0: must be between 1 and 65536\n"
          "t.toml:3: server.bogus: unknown key\n"
          "t.toml:5: gpu.kv_dtype = \"f8\": must be one of \"f16\", \"f32\"\n"
          "t.toml:7: scheduler.prefix_cache = \"yes\": wrong type: expected true or false, got "
          "string\n"
          "t.toml:8: nope: unknown section [nope]"},
         5},
    };
    return cases;
}

class bad_config : public testing::TestWithParam<bad_case> {};

TEST_P(bad_config, is_refused_naming_file_line_and_key) {
    const bad_case& c = GetParam();
    auto cfg = parse(c.toml, "t.toml");
    ASSERT_FALSE(cfg.ok()) << "accepted:\n" << c.toml;
    EXPECT_EQ(cfg.err().code, "config_invalid");
    const std::string& msg = cfg.err().message;
    for (const std::string& fragment : c.expect) {
        EXPECT_NE(msg.find(fragment), std::string::npos)
            << "expected fragment: " << fragment << "\nfull message:\n"
            << msg;
    }
    const auto lines = static_cast<std::size_t>(std::count(msg.begin(), msg.end(), '\n')) + 1;
    EXPECT_EQ(lines, c.lines) << msg;
}

INSTANTIATE_TEST_SUITE_P(table, bad_config, testing::ValuesIn(bad_cases()),
                         [](const testing::TestParamInfo<bad_case>& info) {
                             return std::string(info.param.name);
                         });

// The other side of the two cases above: the values just inside the bounds the actors check
// at start pass the config check (tests/server/test_start.cpp serves them).
TEST(bad_config_limits, the_edges_the_actors_accept_pass) {
    for (const char* toml : {"[scheduler]\nmax_batch_tokens = 65535\n",
                             "[gpu]\nkv_blocks = 1048576\nkv_block_tokens = 16\n",
                             "[gpu]\nkv_blocks = 65536\nkv_block_tokens = 256\n",
                             // the gpu actor's armed_faults::delay_ms_max
                             "[fault]\nenabled = true\nplan = [\"step_delay\"]\n"
                             "plan_delay_ms = 10000\n"}) {
        auto cfg = parse(toml, "t.toml");
        EXPECT_TRUE(cfg.ok()) << toml << (cfg.ok() ? "" : cfg.err().message);
    }
}

TEST(bad_config_limits, a_file_full_of_mistakes_lists_the_first_64_and_counts_the_rest) {
    std::string text = "[server]\n";
    for (int i = 0; i < 100; ++i) text += "unknown_" + std::to_string(i) + " = 1\n";
    auto cfg = parse(text, "t.toml");
    ASSERT_FALSE(cfg.ok());
    const std::string& msg = cfg.err().message;
    EXPECT_EQ(std::count(msg.begin(), msg.end(), '\n'), 64) << msg;
    EXPECT_NE(msg.find("t.toml:2: server.unknown_0: unknown key"), std::string::npos);
    EXPECT_NE(msg.find("t.toml: ... and 36 more problems"), std::string::npos);
}

TEST(bad_config_limits, a_long_bad_value_is_clipped_in_the_message) {
    const std::string big(5000, 'x');
    auto cfg = parse("[model]\npath = \"" + big + "\"\n", "t.toml");
    ASSERT_FALSE(cfg.ok());
    const std::string& msg = cfg.err().message;
    EXPECT_NE(msg.find("t.toml:2: model.path = \"xxx"), std::string::npos) << msg;
    EXPECT_NE(msg.find("...: must be at most 4096 bytes"), std::string::npos) << msg;
    EXPECT_LT(msg.size(), 200u);
}

}  // namespace

// Seeded mutations of a valid file (byte flips, truncations, insertions of TOML punctuation):
// every result is either a config or a config_invalid error that names the source; never a
// crash (run under ORDO_SANITIZE to also catch out-of-bounds reads).
TEST(bad_config_limits, mutated_files_are_refused_cleanly) {
    constexpr int mutations = 3000;
    const std::string base =
        "[server]\nlisten = \"127.0.0.1:7070\"\nmax_frame_bytes = 1048576\n"
        "[gpu]\nkv_dtype = \"f16\"\nkv_block_tokens = 16\n[scheduler]\nprefix_cache = true\n"
        "[log]\nlevel = \"info\"\nfile = \"\"\n";
    const std::string noise = "[]=\"'.#\n\\{},0x-+e_ \xc3\xff";
    std::uint64_t state = 0x9E3779B97F4A7C15ull;  // fixed seed: failures reproduce
    auto next = [&state](std::uint64_t bound) {
        state ^= state << 13, state ^= state >> 7, state ^= state << 17;
        return state % bound;
    };
    int accepted = 0;
    for (int i = 0; i < mutations; ++i) {
        std::string text = base;
        const int edits = 1 + static_cast<int>(next(4));
        for (int e = 0; e < edits && !text.empty(); ++e) {
            const std::size_t at = next(text.size());
            switch (next(3)) {
                case 0:
                    text[at] = noise[next(noise.size())];
                    break;
                case 1:
                    text.insert(at, 1, noise[next(noise.size())]);
                    break;
                default:
                    text.resize(at);
                    break;
            }
        }
        auto cfg = parse(text, "m.toml");
        if (cfg.ok()) {
            ++accepted;
            continue;
        }
        ASSERT_EQ(cfg.err().code, "config_invalid") << text;
        ASSERT_EQ(cfg.err().message.rfind("m.toml:", 0), 0u) << cfg.err().message << "\n" << text;
    }
    // Both outcomes must occur, or the mutations are not exercising the validator.
    EXPECT_GT(accepted, 0);
    EXPECT_LT(accepted, mutations);
}
