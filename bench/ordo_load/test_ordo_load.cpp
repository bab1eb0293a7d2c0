// test_ordo_load.cpp: checks ordo-load, the load generator (msgpack and HTTP modes).
//
// Unit tests of its pure parts: nearest-rank percentiles, folding request samples into a run
// summary, the JSON line (validated by Debian's python3 json module), the command line (every
// bad flag is a usage error naming it), the server's listening lines, seeded random prompts;
// the HTTP mode's response reader (chunked bodies split at every byte, keep-alive, garbage) and
// server-sent event splitter (every split point, CRLF, multi-line data, the size bound), and
// the completion request body.
// HTTP end to end: --protocol http against ordo-server's HTTP front door (spawned, with a ramp),
// and against a scripted HTTP server in this test that closes the connection after every answer
// (as llama-server does) and sends an error event: the client connects again, counts the error
// and goes on.
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
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "bench/ordo_load/http_stream.hpp"
#include "bench/ordo_load/load_options.hpp"
#include "bench/ordo_load/load_stats.hpp"
#include "bench/ordo_load/load_stream.hpp"
#include "bench/ordo_load/server_spawn.hpp"
#include "tests/support/scratch_dir.hpp"
#include "tools/client/connection.hpp"

namespace {

using namespace ordo::load;
namespace fs = std::filesystem;

std::string temp_path(const std::string& name) {
    const fs::path& dir = ordo::test::scratch_dir("ordo_load_test");
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
    auto r = run_command(
        "/usr/bin/python3 -c 'import json,sys\n"
        "for i,l in enumerate(open(sys.argv[1])):\n"
        "  for k,v in json.loads(l).items():\n"
        "    if isinstance(v,dict):\n"
        "      for k2,v2 in v.items(): print(i, k+\".\"+k2, json.dumps(v2))\n"
        "    else: print(i, k, json.dumps(v))' " +
            in,
        "py");
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
    EXPECT_EQ(s.itl_ms_p50, 4.0);  // of {2, 4, 6}
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
    auto o = parse_options(
        {"--spawn-server",   "/bin/srv", "--model",       "m.gguf", "--config",        "c.toml",
         "--streams",        "1,8,16",   "--requests",    "2",      "--prompt-tokens", "32",
         "--max-tokens",     "64",       "--temperature", "0.7",    "--seed",          "9",
         "--duration-max-s", "60",       "--label",       "x"});
    ASSERT_TRUE(o.ok()) << o.err().message;
    EXPECT_EQ(o->streams, (std::vector<uint32_t>{1, 8, 16}));
    EXPECT_EQ(o->requests, 2u);
    EXPECT_EQ(o->prompt_tokens, 32u);
    EXPECT_EQ(o->max_tokens, 64u);
    EXPECT_DOUBLE_EQ(o->temperature, 0.7);
    EXPECT_EQ(o->seed, 9u);
    EXPECT_EQ(o->duration_max_s, 60u);
    EXPECT_EQ(o->protocol, wire::msgpack);
    EXPECT_EQ(o->port, 7070);
    EXPECT_FALSE(o->sampler.top_k || o->sampler.top_p || o->sampler.min_p);
    auto p = parse_options({"--prompt", "Once upon a time", "--port", "7071"});
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p->prompt_tokens, 0u);
    EXPECT_EQ(p->port, 7071);
    auto h = parse_options({"--protocol", "http", "--top-k", "40", "--top-p", "0.95", "--min-p",
                            "0.05", "--ramp-s", "2.5", "--vocab-size", "32000"});
    ASSERT_TRUE(h.ok()) << h.err().message;
    EXPECT_EQ(h->protocol, wire::http);
    EXPECT_EQ(h->port, 8080);  // the HTTP front door's default
    EXPECT_EQ(h->sampler.top_k, 40);
    EXPECT_EQ(h->sampler.top_p, 0.95);
    EXPECT_EQ(h->sampler.min_p, 0.05);
    EXPECT_DOUBLE_EQ(h->ramp_s, 2.5);
    EXPECT_EQ(h->vocab_size, 32000u);
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
        {{"--protocol", "grpc"}, "--protocol"},
        {{"--top-k", "-1"}, "--top-k"},
        {{"--top-p", "1.5"}, "--top-p"},
        {{"--min-p", "x"}, "--min-p"},
        {{"--ramp-s", "-2"}, "--ramp-s"},
        {{"--vocab-size", "2"}, "--vocab-size"},
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
    // The HTTP front door's line, told apart from the msgpack one.
    std::string both =
        "ordo-server listening on 127.0.0.1:7070\n"
        "ordo-server http listening on 127.0.0.1:8081\n";
    EXPECT_EQ(parse_listening_line(both)->port, 7070);
    EXPECT_EQ(parse_listening_line(both, true)->port, 8081);
    EXPECT_FALSE(parse_listening_line("ordo-server listening on 127.0.0.1:7070\n", true));
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

// ---- the HTTP mode's parts ----------------------------------------------------------------

std::string chunked(const std::vector<std::string>& pieces) {
    std::string out;
    for (const auto& p : pieces) {
        char size[16];
        std::snprintf(size, sizeof size, "%zx\r\n", p.size());
        out += size + p + "\r\n";
    }
    return out + "0\r\n\r\n";
}

TEST(http_stream, response_reader_reads_chunked_answers_split_anywhere) {
    const std::string body = "data: {\"a\":1}\n\ndata: [DONE]\n\n";
    const std::string answer =
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        "Transfer-Encoding: chunked\r\n\r\n" +
        chunked({body.substr(0, 7), body.substr(7)});
    for (size_t cut = 0; cut <= answer.size(); cut++) {
        response_reader r;
        ASSERT_TRUE(r.feed(answer.substr(0, cut)).ok()) << cut;
        std::string got = r.take_body();
        EXPECT_EQ(r.complete(), cut == answer.size());
        ASSERT_TRUE(r.feed(answer.substr(cut)).ok()) << cut;
        got += r.take_body();
        EXPECT_TRUE(r.complete());
        EXPECT_EQ(r.status_code(), 200);
        EXPECT_TRUE(r.keep_alive());
        EXPECT_EQ(got, body);
    }
    response_reader r;
    ASSERT_TRUE(r.feed("HTTP/1.1 429 Too Many Requests\r\nContent-Length: 2\r\n"
                       "Connection: close\r\n\r\n{}")
                    .ok());
    EXPECT_TRUE(r.complete());
    EXPECT_EQ(r.status_code(), 429);
    EXPECT_FALSE(r.keep_alive());
    EXPECT_EQ(r.take_body(), "{}");
    // Bytes after the answer, and bytes that are not HTTP, are errors naming the problem.
    EXPECT_EQ(r.feed("HTTP/1.1 200 OK\r\n").err().code, "bad_http");
    r.reset();
    auto both = r.feed("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\nHTTP/1.1 200 OK\r\n");
    EXPECT_EQ(both.err().code, "bad_http");
    r.reset();
    auto bad = r.feed("SMTP ready\r\n");
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.err().code, "bad_http");
    EXPECT_NE(bad.err().message.find("malformed HTTP response"), std::string::npos);
}

TEST(http_stream, sse_splitter_finds_every_event_at_every_split_point) {
    const std::string stream =
        ": a comment\n"
        "data: {\"x\": 1}\n\n"
        "event: message\r\ndata: two\r\ndata:lines\r\n\r\n"
        "id: 7\n\n"  // an event without data is no event
        "data: [DONE]\n\n";
    const std::vector<std::string> want{"{\"x\": 1}", "two\nlines", "[DONE]"};
    for (size_t cut = 0; cut <= stream.size(); cut++) {
        sse_splitter sse;
        auto a = sse.feed(stream.substr(0, cut));
        auto b = sse.feed(stream.substr(cut));
        ASSERT_TRUE(a.ok() && b.ok());
        std::vector<std::string> got = *a;
        got.insert(got.end(), b->begin(), b->end());
        EXPECT_EQ(got, want) << "split at " << cut;
    }
    sse_splitter big;
    std::string huge = "data: " + std::string(sse_event_bytes_max, 'x');
    auto r = big.feed(huge);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.err().code, "bad_event");
}

TEST(http_stream, completion_body_carries_the_plan) {
    stream_plan plan;
    plan.model_id = "m";
    plan.prompt_tokens = 5;
    plan.vocab_size = 300;
    plan.max_tokens = 7;
    plan.temperature = 0.5;
    plan.seed_first = 100;
    auto j = nlohmann::json::parse(completion_body(plan, 2));
    EXPECT_EQ(j["model"], "m");
    EXPECT_EQ(j["prompt"].get<std::vector<int32_t>>(), random_prompt(102, 5, 300));
    EXPECT_EQ(j["max_tokens"], 7);
    EXPECT_EQ(j["temperature"], 0.5);
    EXPECT_EQ(j["seed"], 102);
    EXPECT_EQ(j["stream"], true);
    EXPECT_EQ(j["stream_options"]["include_usage"], true);
    EXPECT_FALSE(j.contains("top_k") || j.contains("top_p") || j.contains("min_p"));
    plan.prompt_tokens = 0;
    plan.prompt_text = "Once";
    plan.sampler.top_k = 40;
    plan.sampler.min_p = 0.05;
    j = nlohmann::json::parse(completion_body(plan, 0));
    EXPECT_EQ(j["prompt"], "Once");
    EXPECT_EQ(j["top_k"], 40);
    EXPECT_EQ(j["min_p"], 0.05);
    EXPECT_FALSE(j.contains("top_p"));
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
        auto st = s.start(ORDO_SERVER_BIN,
                          {"--listen", "127.0.0.1:0", "--http-listen", "", "--model", model,
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

// The two lines of a `--streams 1,3 --requests 2 --max-tokens 6` run in which every request
// ended well.
void expect_two_clean_configurations(const command_result& r) {
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
        EXPECT_GT(num(l, "ttft_ms_p50"), 0);
        EXPECT_LE(num(l, "ttft_ms_p50"), num(l, "ttft_ms_p99"));
        EXPECT_LE(num(l, "itl_ms_p50"), num(l, "itl_ms_p99"));
        EXPECT_EQ(num(l, "max_tokens"), 6);
        // The model the server named (HTTP: the id ordo-load sent; a wrong one is a 404).
        EXPECT_NE(l["model"].find("tiny"), std::string::npos) << l["model"];
        for (const auto& [k, v] : l) EXPECT_NE(k.rfind("errors.", 0), 0u) << k << " " << v;
    }
}

TEST_F(load_e2e, spawned_server_serves_every_configuration) {
    auto r = run_command(load_bin + " --spawn-server " ORDO_SERVER_BIN " --model " + model +
                             " --config " + config +
                             " --streams 1,3 --requests 2 "
                             "--max-tokens 6 --prompt-tokens 5 --temperature 0.8 "
                             "--duration-max-s 120",
                         "spawn");
    expect_two_clean_configurations(r);
    EXPECT_NE(r.out.find("\"protocol\": \"msgpack\""), std::string::npos) << r.out;
}

TEST_F(load_e2e, http_mode_against_the_http_front_door) {
    auto r = run_command(load_bin + " --protocol http --spawn-server " ORDO_SERVER_BIN " --model " +
                             model + " --config " + config +
                             " --streams 1,3 --requests 2 --max-tokens 6 --prompt-tokens 5"
                             " --temperature 0.8 --top-k 40 --min-p 0.05 --ramp-s 0.5"
                             " --duration-max-s 120",
                         "http_spawn");
    // tokens: usage.completion_tokens of each answer.
    expect_two_clean_configurations(r);
    EXPECT_NE(r.out.find("\"protocol\": \"http\""), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\"ramp_s\": 0.500"), std::string::npos) << r.out;
}

// A scripted HTTP/1.1 server on an ephemeral port, one connection at a time: /health and
// /v1/models answer; every POST gets a streamed answer of `tokens` chunks (the `error_on`-th
// POST an error event instead of its final chunk), written with keep-alive headers, and then
// the connection is closed, as llama-server does after a streamed answer.
class scripted_http_server {
public:
    scripted_http_server(uint32_t tokens, uint32_t error_on)
        : _tokens(tokens), _error_on(error_on) {
        _fd = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        EXPECT_EQ(bind(_fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
        socklen_t len = sizeof a;
        getsockname(_fd, reinterpret_cast<sockaddr*>(&a), &len);
        _port = ntohs(a.sin_port);
        EXPECT_EQ(listen(_fd, 16), 0);
        _thread = std::thread([this] { serve(); });
    }
    ~scripted_http_server() {
        _stop = true;
        shutdown(_fd, SHUT_RDWR);
        close(_fd);
        _thread.join();
    }
    uint16_t port() const { return _port; }
    uint32_t posts() const { return _posts; }
    uint32_t connections() const { return _connections; }

private:
    // Reads one request (headers and Content-Length body); false at EOF.
    static bool read_request(int c, std::string& head) {
        std::string buf;
        char tmp[4096];
        while (buf.find("\r\n\r\n") == std::string::npos) {
            ssize_t n = recv(c, tmp, sizeof tmp, 0);
            if (n <= 0) return false;
            buf.append(tmp, size_t(n));
        }
        size_t end = buf.find("\r\n\r\n") + 4;
        head = buf.substr(0, end);
        size_t cl = head.find("Content-Length: ");
        size_t want = cl == std::string::npos ? 0 : std::stoul(head.substr(cl + 16));
        while (buf.size() - end < want) {
            ssize_t n = recv(c, tmp, sizeof tmp, 0);
            if (n <= 0) return false;
            buf.append(tmp, size_t(n));
        }
        return true;
    }
    static void write_all(int c, const std::string& s) {
        for (size_t off = 0; off < s.size();) {
            ssize_t n = send(c, s.data() + off, s.size() - off, MSG_NOSIGNAL);
            if (n <= 0) return;
            off += size_t(n);
        }
    }
    void serve() {
        while (!_stop) {
            int c = accept(_fd, nullptr, nullptr);
            if (c < 0) return;
            _connections++;
            std::string head;
            while (read_request(c, head)) {
                if (head.rfind("GET /health", 0) == 0) {
                    write_all(c,
                              "HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n{\"status\":\"ok\"}");
                    continue;
                }
                if (head.rfind("GET /v1/models", 0) == 0) {
                    std::string b =
                        R"({"data":[{"id":"scripted","meta":{"n_vocab":300,"n_ctx":512}}]})";
                    write_all(c, "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(b.size()) +
                                     "\r\n\r\n" + b);
                    continue;
                }
                uint32_t post = ++_posts;
                std::vector<std::string> events;
                for (uint32_t t = 0; t < _tokens; t++) {
                    events.push_back(
                        R"(data: {"choices":[{"text":"t","index":0,"finish_reason":null}]})"
                        "\n\n");
                }
                if (post == _error_on) {
                    events.push_back(R"(data: {"error":{"code":"gpu_failed","message":"x"}})"
                                     "\n\n");
                } else {
                    events.push_back(
                        R"(data: {"choices":[{"text":"","index":0,"finish_reason":"length"}]})"
                        "\n\n");
                    events.push_back("data: {\"choices\":[],\"usage\":{\"completion_tokens\":" +
                                     std::to_string(_tokens) + "}}\n\n");
                    events.push_back("data: [DONE]\n\n");
                }
                write_all(c,
                          "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                          "Transfer-Encoding: chunked\r\nKeep-Alive: timeout=5, max=100\r\n\r\n" +
                              chunked(events));
                break;  // and close, keep-alive headers notwithstanding
            }
            close(c);
        }
    }

    uint32_t _tokens, _error_on;
    int _fd = -1;
    uint16_t _port = 0;
    std::atomic<bool> _stop{false};
    std::atomic<uint32_t> _posts{0}, _connections{0};
    std::thread _thread;
};

TEST(load_http, a_server_that_closes_after_each_answer_gets_new_connections) {
    scripted_http_server server(/*tokens=*/3, /*error_on=*/2);
    auto r = run_command(load_bin + " --protocol http --port " + std::to_string(server.port()) +
                             " --streams 1 --requests 4 --max-tokens 3 --prompt-tokens 4"
                             " --duration-max-s 60 --event-timeout-s 10",
                         "scripted");
    // One request got an error event: exit 1, and the stream went on to its last request.
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    auto lines = parse_json_lines(r.out);
    ASSERT_EQ(lines.size(), 1u) << r.out << r.err;
    EXPECT_EQ(num(lines[0], "requests"), 4);
    EXPECT_EQ(num(lines[0], "requests_ok"), 3);
    EXPECT_EQ(num(lines[0], "errors.gpu_failed"), 1);
    EXPECT_EQ(num(lines[0], "tokens"), 3 * 3 + 3);  // usage of the three; events of the failed
    EXPECT_EQ(lines[0]["model"], "\"scripted\"");
    EXPECT_EQ(server.posts(), 4u);
    // health, models, then one connection per request (every answer closed its connection).
    EXPECT_EQ(server.connections(), 2u + 4u);
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
                               " --prompt-tokens 200 --max-tokens 100",
                           "too_long");
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
    auto r = run_command(
        load_bin + " --port " + std::to_string(ntohs(a.sin_port)) + " --duration-max-s 60",
        "closed_port");
    EXPECT_EQ(r.exit_code, 3) << r.err;
    EXPECT_NE(r.err.find("unreachable"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty());
    auto b = run_command(load_bin + " --spawn-server /nonexistent/ordo-server --model " + model,
                         "bad_bin");
    EXPECT_EQ(b.exit_code, 3) << b.err;
    EXPECT_NE(b.err.find("spawn_failed"), std::string::npos) << b.err;
    auto m = run_command(
        load_bin + " --spawn-server " ORDO_SERVER_BIN " --model /nonexistent/model.gguf",
        "bad_model");
    EXPECT_EQ(m.exit_code, 3) << m.err;
    EXPECT_NE(m.err.find("ordo-load:"), std::string::npos) << m.err;
}

// The scheduler's request count (the `stats` op's scheduler.requests: requests queued since
// start), or 0 when the server does not answer.
uint64_t requests_queued(uint16_t port) {
    ordo::client::connection c;
    if (!c.open("127.0.0.1", port, std::chrono::milliseconds(2000))) return 0;
    msgpack::sbuffer frame;
    msgpack::packer<msgpack::sbuffer> pk(frame);
    pk.pack_map(2);
    pk.pack("id");
    pk.pack(1);
    pk.pack("op");
    pk.pack("stats");
    if (!c.send(frame)) return 0;
    auto e = c.recv(std::chrono::milliseconds(5000));
    if (!e) return 0;
    const msgpack::object* sched = ordo::client::find(e->get(), "scheduler");
    const msgpack::object* n = sched ? ordo::client::find(*sched, "requests") : nullptr;
    return n && n->type == msgpack::type::POSITIVE_INTEGER ? n->via.u64 : 0;
}

// Polls the server's stats until it has received at least `n` requests: true then, false after
// load_wait_polls_max polls 100 ms apart (a stuck run fails instead of hanging).
bool wait_requests(uint16_t port, uint64_t n) {
    constexpr int load_wait_polls_max = 1200;
    for (int i = 0; i < load_wait_polls_max; ++i) {
        if (requests_queued(port) >= n) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
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
    // Kill once several requests finished: the warm one, then 3 streams that each queue their
    // next request when the last one ended, so 7 queued means at least 3 of the run's done.
    const bool served = wait_requests(server.endpoint().port, 7);
    ASSERT_EQ(kill(server.pid(), SIGKILL), 0);
    EXPECT_TRUE(served) << "the run never got 3 requests done";
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
    // Silent once both streams are sending (each then has a request the server never answers).
    const bool sending = wait_requests(server.endpoint().port, 2);
    ASSERT_EQ(kill(server.pid(), SIGSTOP), 0);  // alive, connected, silent
    EXPECT_TRUE(sending) << "the run never sent its requests";
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
