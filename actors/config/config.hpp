// config.hpp: ordo's configuration — one plain struct per TOML section, and the functions that
// read, validate, override and print it.
//
// Owns: the in-memory shape of etc/ordo.toml and every rule a value must satisfy. Used by the
// bootstrap (`ordo-server` main) before any actor starts; actors receive the section they need
// by value and never read the file themselves.
//
// Defaults live in the member initialisers below and nowhere else; the key table in schema.cpp
// (name, type, range, doc) reads and writes these members, so validation, command-line
// overrides and `to_toml` all follow the same rules. Every loader reports ALL problems it finds,
// one per line, as `FILE:LINE: section.key = value: what is wrong`, in one ordo::error with code
// "config_invalid" (the server exits 2 on it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "actors/runtime/fault_kind.hpp"
#include "actors/runtime/result.hpp"
#include "model/pooling.hpp"

namespace ordo::config {

// How a batched step that failed is retried (ARCHITECTURE.md F4).
enum class batch_failure_policy : std::uint8_t {
    bisect,      // retry each sequence alone, then bisect to isolate a poison request
    sequential,  // retry each sequence alone; fail only the ones that fail alone
    fail,        // fail every sequence of the batch
};

// Element type of the paged KV pool on the device.
enum class kv_dtype : std::uint8_t { f16, f32 };

// Which kernel family runs the model (gpu/PERF.md): texel-fetch kernels (mul_mat_tx,
// attention_tx, ...) or the storage-buffer ones; automatic = the device's own default
// (gpu::tuning_for).
enum class gpu_kernels : std::uint8_t { automatic, texel, storage };

// Whether each step's logits rows come with the GPU's row summary (logits_summary.comp), which
// the scheduler's sampler draws from instead of reading the rows (scheduler/sampling.hpp):
// automatic = on GPUs, off on CPU devices such as lavapipe, where the kernel runs on the same
// cores as the host's pass over the row and costs more than it (gpu/PERF.md, session 22).
enum class gpu_row_summaries : std::uint8_t { automatic, on, off };

// How /v1/embeddings and the `embed` op pool an input's final hidden states into one vector
// when the GGUF names no `<arch>.pooling_type` (model/pooling.hpp; docs/http.md "Embeddings").
using embedding_pooling = model::pooling;

// Speculative decoding (docs/speculative.md): off, drafts from prompt lookup (n-gram matches in
// the sequence's own prompt and output), or drafts from a smaller model with the same
// vocabulary (speculative.draft_model); either way verified by the model in one step.
enum class speculative_mode : std::uint8_t { off, ngram, draft };

// Same order and values as spdlog::level::level_enum, so main can static_cast.
enum class log_level : std::uint8_t { trace, debug, info, warn, error, critical, off };

// Upper bounds of the keys that an actor also checks when it starts. tools/server/server.cpp
// asserts at compile time that each is within what its actor accepts, so a value that passes
// the config check is one the server runs (never a start that ends in health "degraded").
inline constexpr std::uint32_t max_batch_tokens_max = 65535;  // gpu: a grid row per token
inline constexpr std::uint32_t max_sequences_max = 1024;
inline constexpr std::uint32_t max_tokens_default_max = 1048576;
inline constexpr std::uint32_t flush_every_layers_max = 1024;
inline constexpr std::uint32_t kv_block_tokens_max = 256;
inline constexpr std::uint32_t draft_tokens_max_max = 64;  // speculative.draft_tokens_max
inline constexpr std::uint32_t ngram_max_max = 16;         // speculative.ngram_min/ngram_max
inline constexpr std::uint32_t kv_blocks_max = 1048576;
inline constexpr std::uint32_t decode_steps_max = 16;  // scheduler.decode_steps (gpu: a step's)
// gpu.kv_blocks x gpu.kv_block_tokens at most (a cross rule): the scheduler's block table keeps
// every token id of the pool in host memory, 4 B each, 64 MiB at this bound.
inline constexpr std::uint64_t kv_pool_tokens_max = std::uint64_t{1} << 24;
// log.queue_lines: the log writer's queue (actors/runtime/log.hpp holds the same bounds).
inline constexpr std::uint32_t log_queue_lines_min = 16;
inline constexpr std::uint32_t log_queue_lines_max = 1048576;
inline constexpr std::uint32_t fault_delay_ms_max = 10000;  // gpu: a step_delay's delay
// Entries of fault.plan at most: a kind may be listed more than once to be drawn more often,
// and a few dozen entries give any weighting a soak needs.
inline constexpr std::size_t fault_plan_entries_max = 64;
// Entries of http.cors_allow_origins at most: a browser app has a handful of origins; a longer
// list is a mistake, and every preflight scans it.
inline constexpr std::size_t cors_allow_origins_max = 64;

std::string_view to_string(batch_failure_policy v);
std::string_view to_string(kv_dtype v);
std::string_view to_string(gpu_kernels v);
std::string_view to_string(gpu_row_summaries v);
std::string_view to_string(embedding_pooling v);
std::string_view to_string(speculative_mode v);
std::string_view to_string(log_level v);

struct server_config {
    std::string listen = "127.0.0.1:7070";  // IPv4:port or [IPv6]:port; port 0 = ephemeral
    std::uint32_t max_connections = 256;
    std::uint32_t max_frame_bytes = 1048576;
    std::uint32_t max_frame_values = 262144;  // msgpack values in one frame (frame_decoder.hpp)
    std::uint32_t max_inflight_per_connection = 64;
    std::uint64_t write_buffer_bytes_max = 8388608;
    std::uint32_t mailbox_capacity = 65536;  // messages, per actor mailbox
    std::uint32_t shutdown_grace_ms = 5000;
    std::uint32_t read_timeout_ms = 30000;  // a frame begun, or a new silent connection
    // API keys, one per line (door/api_keys.hpp); empty: none from a file. Keys configured (here
    // or with --api-key) = both front doors require one. Holds the path, never a key.
    std::string api_keys_file;
    bool operator==(const server_config&) const = default;
};

// [http]: the OpenAI-compatible HTTP front door (docs/http.md).
struct http_config {
    std::string listen = "127.0.0.1:8080";  // as server.listen; empty: no HTTP front door
    std::uint32_t max_connections = 256;
    std::uint32_t max_header_bytes = 16384;      // request line and headers of one request
    std::uint32_t max_body_bytes = 4194304;      // one request body (413 beyond)
    std::uint32_t header_timeout_ms = 30000;     // a request begun must arrive whole within
    std::uint32_t keep_alive_timeout_ms = 5000;  // an idle kept-alive connection is closed after
    std::uint32_t max_pipelined_requests = 8;    // requests read ahead of the one being answered
    // Lingering close: after an answer that closes the connection, what the client still sends
    // is read and discarded for at most this long and this many bytes (0 ms: no lingering).
    std::uint32_t linger_ms = 5000;
    std::uint32_t max_linger_bytes = 67108864;
    bool metrics_require_key = false;  // with API keys configured, GET /metrics needs one too
    // Origins ("https://app.example.com", or "*" for any) whose browser pages may call the API:
    // preflights answered, Access-Control-Allow-Origin sent (docs/http.md "Browsers (CORS)").
    // Empty: no CORS headers at all, the same-origin policy holds.
    std::vector<std::string> cors_allow_origins;
    bool operator==(const http_config&) const = default;
};

struct model_config {
    std::string path;  // empty: serve the generated default model at generated_path
    std::string generated_path = "var/models/ordo-default.gguf";
    std::uint32_t context_tokens = 0;  // 0: the model's own context length
    std::string chat_template_path;    // empty: the GGUF's tokenizer.chat_template
    // Pooling of embeddings when the GGUF names none (its <arch>.pooling_type wins).
    model::pooling embedding_pooling = model::pooling::mean;
    bool operator==(const model_config&) const = default;
};

struct gpu_config {
    std::string device;  // "" or "auto": prefer a discrete GPU; digits: index; else name substring
    std::uint32_t flush_every_layers = 0;  // 0: the device's (16 on GPUs, 4 on CPU devices)
    std::uint32_t watchdog_ms = 10000;
    std::uint32_t warmup_ms_max = 180000;  // one warm-up submission, at most (not the watchdog)
    std::string pipeline_cache_dir = "var/pipeline-cache";  // "": no cache on disk
    std::uint32_t kv_block_tokens = 16;                     // power of two
    std::uint32_t kv_blocks = 0;                            // 0: as many as fit in kv_memory_bytes
    std::uint64_t kv_memory_bytes = 0;  // 0: the device's choice (device_choices.hpp)
    enum kv_dtype kv_dtype = kv_dtype::f16;
    std::uint32_t recovery_max = 3;
    gpu_kernels kernels = gpu_kernels::automatic;
    gpu_row_summaries row_summaries = gpu_row_summaries::automatic;
    // false: the tiled steps may run on cooperative matrices where the device has them
    // (faster, f16 inputs; a token's logits then depend on its step's batch).
    bool batch_invariant = true;
    bool operator==(const gpu_config&) const = default;
};

struct scheduler_config {
    std::uint32_t max_sequences = 0;  // 0: the device's choice (device_choices.hpp)
    std::uint32_t max_queue = 256;
    std::uint32_t max_batch_tokens = 512;
    std::uint32_t max_tokens_default = 256;
    enum batch_failure_policy batch_failure_policy = batch_failure_policy::bisect;
    std::uint32_t retry_max = 2;
    bool prefix_cache = true;
    std::uint32_t decode_steps = 4;
    bool operator==(const scheduler_config&) const = default;
};

struct speculative_config {
    enum speculative_mode mode = speculative_mode::off;
    std::uint32_t draft_tokens_max = 8;  // drafted tokens one verification checks, at most
    std::uint32_t ngram_min = 2;         // the shortest suffix prompt lookup matches
    std::uint32_t ngram_max = 4;         // the longest, tried first
    // Verifications in a row that accept no drafted token before the request decodes plainly
    // for the rest of its life (a fallback, counted by reason).
    std::uint32_t fallback_rounds = 8;
    // mode = "draft": the draft model's GGUF (the target's vocabulary), and how long the
    // scheduler waits for one drafting round before the sequences in it decode plainly.
    std::string draft_model;
    std::uint32_t draft_wait_ms = 30000;
    bool operator==(const speculative_config&) const = default;
};

struct kv_config {
    bool enabled = false;
    std::string dir = "var/kv";
    bool shared = false;  // other servers read and write dir too (kv_actor.hpp "Shared directory")
    std::uint64_t bytes_budget = 1073741824;
    std::uint32_t restore_retry_max = 1;
    // How long a request waits for its disk lookup and restore before it recomputes instead.
    std::uint32_t restore_wait_ms = 10000;
    std::uint64_t flush_ms_max = 5000;
    bool operator==(const kv_config&) const = default;
};

struct log_config {
    log_level level = log_level::info;
    std::string file;                  // empty: stderr only
    std::uint32_t queue_lines = 8192;  // lines waiting for the log writer at most (log.hpp)
    bool operator==(const log_config&) const = default;
};

struct fault_config {
    bool enabled = false;    // the `fault` protocol op is refused unless true; a plan needs it
    std::uint64_t seed = 0;  // the plan's draws are a function of (seed, step id) only
    // The plan: kinds drawn from, uniformly by entry (a kind listed twice is drawn twice as
    // often); empty = no plan. kv kinds need [kv] enabled.
    std::vector<fault_kind> plan;
    std::uint32_t plan_every_steps = 50;  // each gpu step draws a fault with probability 1/this
    std::uint32_t plan_faults_max = 100;  // faults the plan fires in the server's life, at most
    std::uint32_t plan_delay_ms = 200;    // a planned step_delay's delay
    bool operator==(const fault_config&) const = default;
};

struct config {
    server_config server;
    http_config http;
    model_config model;
    gpu_config gpu;
    scheduler_config scheduler;
    speculative_config speculative;
    kv_config kv;
    log_config log;
    fault_config fault;
    bool operator==(const config&) const = default;
};

// A validated listen address. `host` is the numeric address without brackets ("::1").
struct listen_address {
    std::string host;
    std::uint16_t port = 0;
    bool ipv6 = false;
    bool operator==(const listen_address&) const = default;
};

// Parses "IPv4:port" or "[IPv6]:port" (numeric addresses only; port 0..65535, 0 = ephemeral).
// Error code "config_invalid"; the message says what is wrong without file or key.
result<listen_address> parse_listen_address(std::string_view text);

// Reads and validates a TOML file; `path` is used as the source name in errors.
result<config> load_file(const std::string& path);

// Validates TOML text. Keys not present keep their defaults.
result<config> parse(std::string_view toml_text, std::string_view source_name);

// Sets one key ("server.listen", "log.level", ...) from its command-line text, checked with the
// same rules as the file; errors name the key with source "command line". Strings are taken
// verbatim, integers in decimal, booleans as true/false, enums by name, arrays of enum names or
// of strings as the entries separated by commas ("nan_logits,hang"; "" = empty). Cross-key
// rules are not checked here (a later override may fix an earlier one): call validate() after
// the last one.
status apply_override(config& cfg, std::string_view key, std::string_view value);

// Checks every value range and every cross-key rule of an in-memory config (parse runs the same
// checks; use this after apply_override or on a config built in code).
status validate(const config& cfg, std::string_view source_name);

// The effective configuration as TOML, every key with a one-line comment (range and doc);
// parse(to_toml(c)) == c.
std::string to_toml(const config& cfg);

}  // namespace ordo::config
