// main.cpp: ordo-load, the TCP load generator for ordo-server (issue 5's benchmark).
//
// For each --streams entry N it opens N connections (one thread each), starts them together,
// has each send --requests streamed generate requests one after another, and prints one JSON
// line: aggregate tokens/s, time to first token and inter-token latency percentiles, errors by
// code. With --spawn-server it runs ordo-server itself on an ephemeral port and stops it at the
// end. The whole run is bounded by --duration-max-s; a dead server ends it with an error.
#include <csignal>
#include <cstdio>
#include <thread>

#include "bench/ordo_load/http_stream.hpp"
#include "bench/ordo_load/load_options.hpp"
#include "bench/ordo_load/load_stream.hpp"
#include "bench/ordo_load/server_spawn.hpp"

namespace {

using namespace ordo::load;
using std::chrono::milliseconds;

constexpr int exit_ok = 0;
constexpr int exit_failed_requests = 1;
constexpr int exit_usage = 2;
constexpr int exit_unreachable = 3;
constexpr milliseconds monitor_interval{10};  // how often main checks streams and the server
constexpr milliseconds model_query_timeout{30000};
constexpr size_t server_log_tail_bytes = 4096;  // of the spawned server's output, on failure

// Set from the signal handler: std::atomic<bool> is lock-free, so this is async-signal-safe.
run_control g_control;

extern "C" void on_signal(int) {
    g_control.stop.store(true);
}

milliseconds left_until(clock::time_point t) {
    return std::max(milliseconds(1), std::chrono::duration_cast<milliseconds>(t - clock::now()));
}

// Runs one configuration of `n` streams; `server` (may be null) is watched for an early exit.
run_summary run_configuration(const options& o, uint32_t n, uint32_t config_index,
                              const model_info& model, const std::string& host, uint16_t port,
                              spawned_server* server) {
    std::vector<stream_plan> plans(n);
    for (uint32_t s = 0; s < n; s++) {
        stream_plan& p = plans[s];
        p.protocol = o.protocol, p.model_id = model.name;
        p.host = host, p.port = port, p.requests = o.requests;
        p.prompt_tokens = o.prompt_tokens, p.vocab_size = model.vocab_size;
        p.prompt_text = o.prompt, p.max_tokens = o.max_tokens, p.temperature = o.temperature;
        p.sampler = o.sampler;
        p.start_delay = std::chrono::milliseconds(int64_t(o.ramp_s * 1000.0 * s / n));
        p.event_timeout = std::chrono::seconds(o.event_timeout_s);
        // Distinct seeds for every request of the whole run (configurations included).
        p.seed_first = o.seed + (uint64_t{config_index} * streams_max + s) * requests_max;
    }
    std::vector<std::vector<request_sample>> results(n);
    std::atomic<uint32_t> finished{0};
    std::latch ready(n + 1);
    std::vector<std::thread> threads;
    for (uint32_t s = 0; s < n; s++) {
        threads.emplace_back([&, s] {
            results[s] = run_stream(plans[s], g_control, ready);
            finished.fetch_add(1);
        });
    }
    ready.arrive_and_wait();
    auto start = clock::now();
    // Streams end by themselves (every read is bounded); main only stops them early when the
    // spawned server has died, so they do not each wait out a timeout.
    while (finished.load() < n) {
        if (server != nullptr && !g_control.stop.load() && !server->alive()) {
            std::fprintf(stderr, "ordo-load: ordo-server exited during the run\n");
            g_control.stop.store(true);
        }
        std::this_thread::sleep_for(monitor_interval);
    }
    double wall_s = std::chrono::duration<double>(clock::now() - start).count();
    for (auto& t : threads) t.join();
    std::vector<request_sample> all;
    for (auto& r : results) all.insert(all.end(), r.begin(), r.end());
    return summarize(n, all, wall_s);
}

// Starts the server when asked; fills host/port. Returns an exit code on failure, else -1.
int start_server(const options& o, spawned_server& server, std::string& host, uint16_t& port) {
    auto startup_deadline =
        std::min(g_control.deadline, clock::now() + std::chrono::seconds(o.startup_timeout_s));
    bool http = o.protocol == wire::http;
    if (!o.spawn_server.empty()) {
        std::vector<std::string> args{
            "--listen", "127.0.0.1:0", "--http-listen", http ? "127.0.0.1:0" : "",
            "--model",  o.model,       "--log-level",   "warn"};
        if (!o.config.empty()) args.insert(args.end(), {"--config", o.config});
        if (auto st = server.start(o.spawn_server, args, left_until(startup_deadline), http); !st) {
            std::fprintf(stderr, "ordo-load: %s: %s\n", st.err().code.c_str(),
                         st.err().message.c_str());
            return exit_unreachable;
        }
        const listen_endpoint& ep = http ? server.http_endpoint() : server.endpoint();
        host = ep.host, port = ep.port;
        std::fprintf(stderr, "ordo-load: spawned ordo-server (pid %d) on %s:%u\n", server.pid(),
                     host.c_str(), port);
    }
    ordo::status st = http ? wait_healthy_http(host, port, startup_deadline, g_control)
                           : wait_healthy(host, port, startup_deadline, g_control);
    if (!st) {
        std::fprintf(stderr, "ordo-load: %s: %s\n", st.err().code.c_str(),
                     st.err().message.c_str());
        return exit_unreachable;
    }
    return -1;
}

int run(const options& o) {
    g_control.deadline = clock::now() + std::chrono::seconds(o.duration_max_s);
    spawned_server server;
    std::string host = o.host;
    uint16_t port = o.port;
    if (int code = start_server(o, server, host, port); code >= 0) return code;
    auto model = o.protocol == wire::http ? query_model_http(host, port, model_query_timeout)
                                          : query_model(host, port, model_query_timeout);
    if (!model) {
        std::fprintf(stderr, "ordo-load: %s\n", model.err().message.c_str());
        return exit_unreachable;
    }
    if (o.vocab_size != 0) model->vocab_size = o.vocab_size;
    if (o.prompt_tokens > 0 && model->vocab_size <= first_ordinary_token) {
        std::fprintf(stderr,
                     "ordo-load: the server does not report its vocabulary size: give "
                     "--vocab-size V (or --prompt TEXT)\n");
        return exit_usage;
    }
    uint64_t request_tokens = uint64_t{o.prompt_tokens} + o.max_tokens;
    bool known = o.prompt_tokens > 0 && model->context_tokens > 0;
    if (known && request_tokens > model->context_tokens) {
        // Every request would get context_exceeded: say so once instead of measuring errors.
        std::fprintf(stderr,
                     "ordo-load: --prompt-tokens %u + --max-tokens %u exceed the served "
                     "context of %u tokens\n",
                     o.prompt_tokens, o.max_tokens, model->context_tokens);
        return exit_usage;
    }
    run_labels labels{
        o.label.empty() ? model->name : o.label,       o.prompt_tokens, o.max_tokens, o.temperature,
        o.protocol == wire::http ? "http" : "msgpack", o.ramp_s};
    spawned_server* watched = o.spawn_server.empty() ? nullptr : &server;
    int code = exit_ok;
    for (uint32_t i = 0; i < o.streams.size(); i++) {
        if (g_control.stop.load() || clock::now() >= g_control.deadline) {
            std::fprintf(stderr, "ordo-load: stopped before --streams %u (%s)\n", o.streams[i],
                         g_control.stop.load() ? "stopped" : "--duration-max-s reached");
            code = exit_failed_requests;
            break;
        }
        run_summary s = run_configuration(o, o.streams[i], i, *model, host, port, watched);
        std::printf("%s\n", to_json_line(s, labels).c_str());
        std::fflush(stdout);
        if (!s.errors.empty() || s.requests_ok < s.streams * o.requests) {
            code = exit_failed_requests;
        }
    }
    if (watched != nullptr) {
        int st = server.stop();
        if (st != 0 || code != exit_ok) {
            // Failed requests are often explained by the server's log (e.g. someone else sent
            // it SIGTERM: shutting_down), so show what it said last.
            std::string tail = server.output_tail();
            if (tail.size() > server_log_tail_bytes) {
                tail.erase(0, tail.size() - server_log_tail_bytes);
            }
            std::fprintf(stderr, "ordo-load: ordo-server exit status %d; its last output:\n%s\n",
                         st, tail.c_str());
        }
    }
    return code;
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<std::string> args(argv + 1, argv + argc);
    for (const auto& a : args) {
        if (a == "--help" || a == "-h") {
            std::fputs(usage_text, stdout);
            return exit_ok;
        }
    }
    auto o = parse_options(args);
    if (!o) {
        std::fprintf(stderr, "ordo-load: %s\n%s", o.err().message.c_str(), usage_text);
        return exit_usage;
    }
    std::signal(SIGPIPE, SIG_IGN);
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    return run(*o);
}
