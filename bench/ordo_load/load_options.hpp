// load_options.hpp: ordo-load's command line (pure parsing, no I/O), used by main.cpp and
// unit-tested by test_ordo_load.cpp. Every numeric flag has a named range; a bad value is a
// clear usage error naming the flag.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "actors/runtime/result.hpp"
#include "bench/ordo_load/load_stream.hpp"

namespace ordo::load {

// Bounds of the flags: every loop of the benchmark is bounded by one of these.
inline constexpr uint32_t streams_max = 256;        // one thread + connection each
inline constexpr uint32_t stream_configs_max = 16;  // entries of --streams 1,8,16
inline constexpr uint32_t requests_max = 100000;    // per stream and configuration
inline constexpr uint32_t max_tokens_max = 1 << 20;
inline constexpr uint32_t prompt_tokens_max = 1 << 17;  // 5 bytes each fits a 1 MiB frame
inline constexpr uint32_t duration_max_s_max = 86400;
inline constexpr uint32_t timeout_s_max = 3600;

inline constexpr uint32_t ramp_s_max = 3600;
inline constexpr int32_t top_k_max = 1 << 20;

struct options {
    // What the streams speak: "msgpack" (generate over ordo's TCP protocol) or "http" (the
    // OpenAI completions API, streamed: ordo-server's HTTP front door, llama.cpp's llama-server).
    wire protocol = wire::msgpack;
    // Where the server is: a running one, or one spawned for the run.
    std::string host = "127.0.0.1";
    uint16_t port = 0;         // 0: 7070 (msgpack) or 8080 (http)
    std::string spawn_server;  // ordo-server binary; empty = connect to host:port
    std::string model;         // --model for the spawned server
    std::string config;        // --config for the spawned server
    // The load.
    std::vector<uint32_t> streams{1};
    uint32_t requests = 1;        // per stream, one after another
    uint32_t prompt_tokens = 32;  // random-but-seeded token ids (when prompt is empty)
    std::string prompt;           // text prompt instead of token ids
    uint32_t max_tokens = 64;
    double temperature = 1.0;
    sampler_options sampler;  // --top-k, --top-p, --min-p; sent only when given
    uint32_t vocab_size = 0;  // random prompt ids below it; 0: what the server reports
    double ramp_s = 0;        // stream s starts s/N x ramp_s after the common start
    uint64_t seed = 1;        // base of the prompt and sampler seeds
    // Bounds in time.
    uint32_t duration_max_s = 300;     // whole run, all configurations
    uint32_t event_timeout_s = 120;    // silence allowed between two events of one request
    uint32_t startup_timeout_s = 300;  // spawned server: listening and health "ok"
    std::string label;                 // "model" in the JSON line; default from the model op
};

// Parses argv[1..]; a usage error has code "usage" and a message naming the flag.
result<options> parse_options(const std::vector<std::string>& args);

// "1,8,16" -> {1, 8, 16}; each in [1, streams_max], at most stream_configs_max entries.
result<std::vector<uint32_t>> parse_streams_list(const std::string& text);

extern const char* const usage_text;

}  // namespace ordo::load
