// load_stats.hpp: what ordo-load measures and how it summarises it (pure logic, no sockets).
//
// A stream records one request_sample per generate request it sent; summarize() folds the
// samples of one configuration (N streams against one server) into a run_summary, and
// to_json_line() prints it as the single JSON line the benchmark emits. Used by main.cpp and
// unit-tested directly by test_ordo_load.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ordo::load {

// One generate request as the client saw it. Times are milliseconds measured on the client's
// steady clock from the moment the request frame was handed to the kernel.
struct request_sample {
    bool ok = false;                // ended with done{reason: stop | length}
    std::string error_code;         // when !ok: the server's code or a client-side one
    std::optional<double> ttft_ms;  // send -> first token event; absent when no token came
    std::vector<double> itl_ms;     // between consecutive token events (tokens - 1 entries)
    uint32_t tokens = 0;            // token events received
    double total_ms = 0;            // send -> terminal event (or -> the failure)
};

// One configuration's results: what the JSON line reports.
struct run_summary {
    uint32_t streams = 0;
    uint32_t requests = 0;  // requests that ended (ok or not)
    uint32_t requests_ok = 0;
    uint64_t tokens = 0;         // token events over all requests, failed ones included
    double wall_s = 0;           // first send of any stream -> last stream finished
    double aggregate_tok_s = 0;  // tokens / wall_s
    std::optional<double> ttft_ms_p50, ttft_ms_p99;
    std::optional<double> itl_ms_p50, itl_ms_p99, itl_ms_mean;
    std::optional<double> decode_tok_s_per_stream;  // 1000 / itl_ms_mean
    std::map<std::string, uint32_t> errors;         // error code -> count
};

// Nearest-rank percentile (p in (0, 100]) of `values`; nullopt when empty. Sorts a copy.
std::optional<double> percentile(std::vector<double> values, double p);

// Folds the samples of every stream of one configuration.
run_summary summarize(uint32_t streams, const std::vector<request_sample>& samples, double wall_s);

// Labels that describe the run rather than its results, printed in the same line.
struct run_labels {
    std::string model;
    uint32_t prompt_tokens = 0;  // per request (0 when --prompt text is used)
    uint32_t max_tokens = 0;
    double temperature = 0;
    std::string protocol = "msgpack";  // "msgpack" or "http"
    double ramp_s = 0;
};

// `{"test": "load", "streams": N, ...}` with no trailing newline. Absent values print as null.
std::string to_json_line(const run_summary& s, const run_labels& labels);

// JSON string literal for `text` (quotes included), escaping control characters and invalid
// UTF-8 never reaching the output unescaped.
std::string json_quote(const std::string& text);

}  // namespace ordo::load
