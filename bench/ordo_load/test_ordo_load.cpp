// test_ordo_load.cpp: checks ordo-load, the TCP load generator.
//
// Unit tests of its pure parts: nearest-rank percentiles, folding request samples into a run
// summary, the JSON line (validated by Debian's python3 json module), the command line (every
// bad flag is a usage error naming it), the server's listening line, seeded random prompts.
// End-to-end tests run the real ordo-load binary against a real ordo-server (lavapipe) serving
// a tiny model generated here with `ordo-model mk`: --spawn-server runs every --streams entry
// and every request ends with done and its tokens are counted; a plan beyond the context is
// refused; an unreachable server and a server binary that cannot start exit 3 at once; a
// server SIGKILLed under load, a server that stops answering (SIGSTOP), and a run longer than
// --duration-max-s all end the run with errors instead of hanging.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "bench/ordo_load/load_options.hpp"
#include "bench/ordo_load/load_stats.hpp"
#include "bench/ordo_load/load_stream.hpp"
#include "bench/ordo_load/server_spawn.hpp"

namespace {

using namespace ordo::load;
namespace fs = std::filesystem;

std::string temp_path(const std::string& name) {
    fs::path dir = fs::temp_directory_path() / ("ordo_load_test_" + std::to_string(getpid()));
    fs::create_directories(dir);
    return (dir / name).string();
}

struct command_result {
    int exit_code = -1;
    std::string out;  // stdout
    std::string err;  // stderr
    double seconds = 0;
};

std::string read_file(const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

command_result run_command(const std::string& cmd, const std::string& tag) {
    std::string out = temp_path(tag + ".out"), err = temp_path(tag + ".err");
    auto t0 = std::chrono::steady_clock::now();
    int st = std::system((cmd + " > " + out + " 2> " + err).c_str());
    command_result r;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r.out = read_file(out), r.err = read_file(err);
    return r;
}

// Each JSON line of `text`, parsed by python's json module and flattened to key -> JSON text
// of the value ("errors.CODE" -> count). A line that is not valid JSON fails the test.
std::vector<std::map<std::string, std::string>> parse_json_lines(const std::string& text) {
    std::string in = temp_path("lines.json");
    std::ofstream(in) << text;
    auto r = run_command("/usr/bin/python3 -c 'import json,sys\n"
                         "for i,l in enumerate(open(sys.argv[1])):\n"
                         "  for k,v in json.loads(l).items():\n"
                         "    if isinstance(v,dict):\n"
                         "      for k2,v2 in v.items(): print(i, k+\".\"+k2, json.dumps(v2))\n"
                         "    else: print(i, k, json.dumps(v))' " + in, "py");
    EXPECT_EQ(r.exit_code, 0) << "not JSON lines:\n" << text << "\n" << r.err;
    std::vector<std::map<std::string, std::string>> lines;
    std::istringstream is(r.out);
    size_t i;
    std::string key, value;
    while (is >> i >> key && std::getline(is >> std::ws, value)) {
        if (lines.size() <= i) lines.resize(i + 1);
        lines[i][key] = value;
    }
    return lines;
}

double num(const std::map<std::string, std::string>& line, const std::string& key) {
    auto it = line.find(key);
    EXPECT_TRUE(it != line.end()) << "missing " << key;
    return it == line.end() ? -1 : std::stod(it->second);
}

bool has_error(const std::map<std::string, std::string>& line, const std::string& code) {
    return line.count("errors." + code) > 0;
}

// ---- pure logic ----------------------------------------------------------------------------

TEST(load_stats, percentile_is_nearest_rank) {
    EXPECT_FALSE(percentile({}, 50).has_value());
    EXPECT_EQ(percentile({7}, 50), 7);
    EXPECT_EQ(percentile({7}, 99), 7);
    std::vector<double> v;
    for (int i = 100; i >= 1; i--) v.push_back(i);  // unsorted on purpose
    EXPECT_EQ(percentile(v, 50), 50);
    EXPECT_EQ(percentile(v, 99), 99);
    EXPECT_EQ(percentile(v, 100), 100);
    EXPECT_EQ(percentile({1, 2, 3}, 50), 2);
    EXPECT_EQ(percentile({1, 2, 3, 4}, 50), 2);
}

TEST(load_stats, summarize_folds_samples_and_counts_errors_by_code) {
    std::vector<request_sample> samples(4);
    samples[0] = {true, "", 10.0, {2.0, 4.0}, 3, 20.0};
    samples[1] = {true, "", 30.0, {6.0}, 2, 40.0};
    samples[2] = {false, "overloaded", std::nullopt, {}, 0, 1.0};
    samples[3] = {false, "closed", 5.0, {}, 1, 9.0};
    run_summary s = summarize(2, samples, 2.0);
    EXPECT_EQ(s.streams, 2u);
    EXPECT_EQ(s.requests, 4u);
    EXPECT_EQ(s.requests_ok, 2u);
    EXPECT_EQ(s.tokens, 6u);
    EXPECT_DOUBLE_EQ(s.aggregate_tok_s, 3.0);
    EXPECT_EQ(s.ttft_ms_p50, 10.0);  // of {5, 10, 30}
    EXPECT_EQ(s.ttft_ms_p99, 30.0);
    EXPECT_EQ(s.itl_ms_p50, 4.0);    // of {2, 4, 6}
    EXPECT_EQ(s.itl_ms_p99, 6.0);
    EXPECT_DOUBLE_EQ(*s.itl_ms_mean, 4.0);
    EXPECT_DOUBLE_EQ(*s.decode_tok_s_per_stream, 250.0);
    EXPECT_EQ(s.errors, (std::map<std::string, uint32_t>{{"closed", 1}, {"overloaded", 1}}));
}

TEST(load_stats, json_line_is_valid_json_with_every_field) {
    std::vector<request_sample> samples{{true, "", 10.0, {2.0}, 2, 20.0},
                                        {false, "gpu_failed", std::nullopt, {}, 0, 1.0}};
    run_summary s = summarize(1, samples, 0.5);
    std::string line = to_json_line(s, {"tiny \"q\" \\ \x01 caf\xc3\xa9 \xff", 32, 64, 0.8});
    auto lines = parse_json_lines(line + "\n");
    ASSERT_EQ(lines.size(), 1u);
    auto& l = lines[0];
    EXPECT_EQ(l["test"], "\"load\"");
    EXPECT_EQ(num(l, "streams"), 1);
    EXPECT_EQ(num(l, "requests"), 2);
    EXPECT_EQ(num(l, "tokens"), 2);
    EXPECT_EQ(num(l, "aggregate_tok_s"), 4);
    EXPECT_EQ(num(l, "ttft_ms_p50"), 10);
    EXPECT_EQ(num(l, "itl_ms_p99"), 2);
    EXPECT_EQ(num(l, "errors.gpu_failed"), 1);
    EXPECT_EQ(num(l, "wall_s"), 0.5);
    EXPECT_EQ(l["model"], "\"tiny \\\"q\\\" \\\\ \\u0001 caf\\u00e9 \\ufffd\"");
    // No samples at all: percentiles are null, not 0.
    auto empty = parse_json_lines(to_json_line(summarize(1, {}, 1.0), {"m", 1, 1, 0}) + "\n");
    ASSERT_EQ(empty.size(), 1u);
    EXPECT_EQ(empty[0]["ttft_ms_p50"], "null");
    EXPECT_EQ(empty[0]["itl_ms_p99"], "null");
}

TEST(load_options, defaults_and_a_full_command_line) {
    auto d = parse_options({});
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(d->streams, std::vector<uint32_t>{1});
    EXPECT_EQ(d->duration_max_s, 300u);
    auto o = parse_options({"--spawn-server", "/bin/srv", "--model", "m.gguf", "--config",
                            "c.toml", "--streams", "1,8,16", "--requests", "2",
                            "--prompt-tokens", "32", "--max-tokens", "64", "--temperature",
                            "0.7", "--seed", "9", "--duration-max-s", "60", "--label", "x"});
    ASSERT_TRUE(o.ok()) << o.err().message;
    EXPECT_EQ(o->streams, (std::vector<uint32_t>{1, 8, 16}));
    EXPECT_EQ(o->requests, 2u);
    EXPECT_EQ(o->prompt_tokens, 32u);
    EXPECT_EQ(o->max_tokens, 64u);
    EXPECT_DOUBLE_EQ(o->temperature, 0.7);
    EXPECT_EQ(o->seed, 9u);
    EXPECT_EQ(o->duration_max_s, 60u);
    auto p = parse_options({"--prompt", "Once upon a time", "--port", "7071"});
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p->prompt_tokens, 0u);
    EXPECT_EQ(p->port, 7071);
}

TEST(load_options, bad_flags_are_usage_errors_naming_the_flag) {
    const std::vector<std::pair<std::vector<std::string>, std::string>> bad{
        {{"--streams", "0"}, "--streams"},
        {{"--streams", "1,,2"}, "--streams"},
        {{"--streams", "1,x"}, "--streams"},
        {{"--streams", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17"}, "--streams"},
        {{"--streams", "100000"}, "--streams"},
        {{"--requests", "0"}, "--requests"},
        {{"--requests", "-1"}, "--requests"},
        {{"--max-tokens", "1.5"}, "--max-tokens"},
        {{"--temperature", "-1"}, "--temperature"},
        {{"--temperature", "nan"}, "--temperature"},
        {{"--port", "70000"}, "--port"},
        {{"--duration-max-s", "0"}, "--duration-max-s"},
        {{"--bogus", "1"}, "--bogus"},
        {{"--requests"}, "--requests"},
        {{"--prompt", "hi", "--prompt-tokens", "3"}, "--prompt"},
        {{"--spawn-server", "/bin/srv"}, "--model"},
        {{"--model", "m.gguf"}, "--spawn-server"},
    };
    for (const auto& [args, names] : bad) {
        auto r = parse_options(args);
        ASSERT_FALSE(r.ok()) << args[0];
        EXPECT_EQ(r.err().code, "usage");
        EXPECT_NE(r.err().message.find(names), std::string::npos) << r.err().message;
    }
}

TEST(server_spawn, listening_line_is_parsed_only_when_whole) {
    auto v4 = parse_listening_line("log...\nordo-server listening on 127.0.0.1:41234\nmore");
    ASSERT_TRUE(v4.has_value());
    EXPECT_EQ(v4->host, "127.0.0.1");
    EXPECT_EQ(v4->port, 41234);
    auto v6 = parse_listening_line("ordo-server listening on [::1]:7070\n");
    ASSERT_TRUE(v6.has_value());
    EXPECT_EQ(v6->host, "::1");
    EXPECT_EQ(v6->port, 7070);
    EXPECT_FALSE(parse_listening_line("ordo-server listening on 127.0.0.1:4").has_value());
    EXPECT_FALSE(parse_listening_line("ordo-server listening on 127.0.0.1:0\n").has_value());
    EXPECT_FALSE(parse_listening_line("ordo-server listening on 127.0.0.1:99999\n"));
    EXPECT_FALSE(parse_listening_line("ordo-server starting\n").has_value());
}

TEST(load_stream, random_prompts_are_seeded_and_in_range) {
    auto a = random_prompt(42, 1000, 300);
    EXPECT_EQ(a, random_prompt(42, 1000, 300));
    EXPECT_NE(a, random_prompt(43, 1000, 300));
    ASSERT_EQ(a.size(), 1000u);
    for (int32_t id : a) {
        EXPECT_GE(id, static_cast<int32_t>(first_ordinary_token));
        EXPECT_LT(id, 300);
    }
}

// ---- end to end: the real binaries ----------------------------------------------------------

const std::string load_bin = ORDO_LOAD_BIN;

// A tiny random-weight model and a config allowing 4 sequences, made once for the suite.
class load_e2e : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        model = temp_path("tiny.gguf");
        std::string mk = std::string(ORDO_MODEL_BIN) + " mk --out " + model +
                         " --n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 --n-ff 128"
                         " --n-vocab 300 --type f32 --seed 3 --ctx 256 > /dev/null";
        ASSERT_EQ(std::system(mk.c_str()), 0);
        config = temp_path("tiny.toml");
        std::ofstream(config) << "[scheduler]\nmax_sequences = 4\n";
    }
    // Starts ordo-server on an ephemeral port with the tiny model.
    void start_server(spawned_server& s) {
        auto st = s.start(ORDO_SERVER_BIN, {"--listen", "127.0.0.1:0", "--http-listen", "", "--model", model,
                                            "--config", config, "--log-level", "warn"},
                          std::chrono::seconds(60));
        ASSERT_TRUE(st.ok()) << st.err().message;
        run_control control;
        control.deadline = clock::now() + std::chrono::seconds(60);
        auto h = wait_healthy(s.endpoint().host, s.endpoint().port, control.deadline, control);
        ASSERT_TRUE(h.ok()) << h.err().message;
    }
    static inline std::string model, config;
};

TEST_F(load_e2e, spawned_server_serves_every_configuration) {
    auto r = run_command(load_bin + " --spawn-server " ORDO_SERVER_BIN " --model " + model +
                             " --config " + config + " --streams 1,3 --requests 2 "
                             "--max-tokens 6 --prompt-tokens 5 --temperature 0.8 "
                             "--duration-max-s 120",
                         "spawn");
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    auto lines = parse_json_lines(r.out);
    ASSERT_EQ(lines.size(), 2u) << r.out;
    for (size_t i = 0; i < 2; i++) {
        auto& l = lines[i];
        double streams = i == 0 ? 1 : 3;
        EXPECT_EQ(l["test"], "\"load\"");
        EXPECT_EQ(num(l, "streams"), streams);
        EXPECT_EQ(num(l, "requests"), streams * 2);
        EXPECT_EQ(num(l, "requests_ok"), streams * 2);
        // Each request streams at least one token and at most max_tokens (EOS may end it).
        EXPECT_GE(num(l, "tokens"), streams * 2);
        EXPECT_LE(num(l, "tokens"), streams * 2 * 6);
        EXPECT_GT(num(l, "aggregate_tok_s"), 0);
        EXPECT_GT(num(l, "wall_s"), 0);
        EXPECT_LE(num(l, "ttft_ms_p50"), num(l, "ttft_ms_p99"));
        EXPECT_LE(num(l, "itl_ms_p50"), num(l, "itl_ms_p99"));
        EXPECT_EQ(num(l, "max_tokens"), 6);
        EXPECT_NE(l["model"], "\"\"");
        for (const auto& [k, v] : l) EXPECT_NE(k.rfind("errors.", 0), 0u) << k << " " << v;
    }
}

TEST_F(load_e2e, text_prompt_and_a_running_server) {
    spawned_server server;
    start_server(server);
    auto r = run_command(load_bin + " --port " + std::to_string(server.endpoint().port) +
                             " --prompt 'Once upon a time' --streams 2 --requests 1 "
                             "--max-tokens 4 --label tiny --duration-max-s 60",
                         "text");
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    auto lines = parse_json_lines(r.out);
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_EQ(num(lines[0], "requests_ok"), 2);
    EXPECT_EQ(lines[0]["model"], "\"tiny\"");
    EXPECT_EQ(num(lines[0], "prompt_tokens"), 0);
    // The tiny model's context is 256: a plan that cannot fit is refused before any request.
    auto big = run_command(load_bin + " --port " + std::to_string(server.endpoint().port) +
                               " --prompt-tokens 200 --max-tokens 100", "too_long");
    EXPECT_EQ(big.exit_code, 2) << big.err;
    EXPECT_NE(big.err.find("exceed the served context of 256"), std::string::npos) << big.err;
    EXPECT_TRUE(big.out.empty());
}

TEST_F(load_e2e, unreachable_server_and_unstartable_binary_exit_3) {
    // A port nobody listens on: bind an ephemeral one, read it, close it.
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    socklen_t len = sizeof a;
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    close(fd);
    auto r = run_command(load_bin + " --port " + std::to_string(ntohs(a.sin_port)) +
                             " --duration-max-s 60", "closed_port");
    EXPECT_EQ(r.exit_code, 3) << r.err;
    EXPECT_NE(r.err.find("unreachable"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty());
    auto b = run_command(load_bin + " --spawn-server /nonexistent/ordo-server --model " + model,
                         "bad_bin");
    EXPECT_EQ(b.exit_code, 3) << b.err;
    EXPECT_NE(b.err.find("spawn_failed"), std::string::npos) << b.err;
    auto m = run_command(load_bin + " --spawn-server " ORDO_SERVER_BIN
                         " --model /nonexistent/model.gguf", "bad_model");
    EXPECT_EQ(m.exit_code, 3) << m.err;
    EXPECT_NE(m.err.find("ordo-load:"), std::string::npos) << m.err;
}

TEST_F(load_e2e, server_killed_under_load_ends_the_run_with_errors) {
    spawned_server server;
    start_server(server);
    // One request served first, so the window below measures serving, not the device start
    // (health answers before the gpu actor has built its pipelines).
    auto warm = run_command(load_bin + " --port " + std::to_string(server.endpoint().port) +
                                " --streams 1 --requests 1 --max-tokens 2 --prompt-tokens 4"
                                " --duration-max-s 120",
                            "warm");
    ASSERT_EQ(warm.exit_code, 0) << warm.out << warm.err;
    command_result r;
    std::thread load([&] {
        r = run_command(load_bin + " --port " + std::to_string(server.endpoint().port) +
                            " --streams 3 --requests 100000 --max-tokens 4 --prompt-tokens 8"
                            " --duration-max-s 300",
                        "killed");
    });
    // Short requests, and time for several to finish even on a loaded 2-core CI machine.
    std::this_thread::sleep_for(std::chrono::seconds(5));
    ASSERT_EQ(kill(server.pid(), SIGKILL), 0);
    load.join();
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    auto lines = parse_json_lines(r.out);
    ASSERT_EQ(lines.size(), 1u) << r.out << r.err;
    EXPECT_GT(num(lines[0], "requests_ok"), 0);  // it was serving before the kill
    EXPECT_TRUE(has_error(lines[0], "closed")) << r.out;
    EXPECT_FALSE(has_error(lines[0], "duration_exceeded")) << r.out;
    EXPECT_LT(r.seconds, 120) << "a dead server must end the run, not a timeout";
}

TEST_F(load_e2e, silent_server_is_a_timeout_not_a_hang) {
    spawned_server server;
    start_server(server);
    command_result r;
    std::thread load([&] {
        r = run_command(load_bin + " --port " + std::to_string(server.endpoint().port) +
                            " --streams 2 --requests 100000 --max-tokens 16 --event-timeout-s 2"
                            " --duration-max-s 300",
                        "stopped");
    });
    std::this_thread::sleep_for(std::chrono::seconds(2));
    ASSERT_EQ(kill(server.pid(), SIGSTOP), 0);  // alive, connected, silent
    load.join();
    kill(server.pid(), SIGCONT);
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    auto lines = parse_json_lines(r.out);
    ASSERT_EQ(lines.size(), 1u) << r.out << r.err;
    EXPECT_EQ(num(lines[0], "errors.timeout"), 2) << r.out;
    EXPECT_LT(r.seconds, 120) << "a silent server must end the run after --event-timeout-s";
}

TEST_F(load_e2e, duration_max_bounds_the_run) {
    spawned_server server;
    start_server(server);
    auto r = run_command(load_bin + " --port " + std::to_string(server.endpoint().port) +
                             " --streams 2,2 --requests 100000 --max-tokens 4 "
                             "--duration-max-s 8",
                         "duration");
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    auto lines = parse_json_lines(r.out);
    ASSERT_EQ(lines.size(), 1u) << r.out;  // the second configuration never starts
    EXPECT_TRUE(has_error(lines[0], "duration_exceeded")) << r.out;
    EXPECT_GT(num(lines[0], "requests_ok"), 0);
    EXPECT_LT(r.seconds, 60) << r.err;
    EXPECT_NE(r.err.find("--duration-max-s reached"), std::string::npos) << r.err;
}

}  // namespace
