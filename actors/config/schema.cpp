// schema.cpp: the configuration key table (see schema.hpp) and the value checks it implies.
//
// The table is constexpr: a bound that does not fit the member's C++ type, or a row whose kind
// does not match its member, fails to compile. Defaults are not repeated here; they are the
// member initialisers in config.hpp.
#include "actors/config/schema.hpp"

#include <array>
#include <limits>
#include <type_traits>

#include "actors/config/internal.hpp"

namespace ordo::config {
namespace {

constexpr std::int64_t kib = 1024;
constexpr std::int64_t mib = 1024 * kib;
constexpr std::int64_t gib = 1024 * mib;
constexpr std::int64_t tib = 1024 * gib;

// Paths and names longer than this are refused: no legitimate value comes close, and a bound
// keeps error messages and logs readable.
constexpr std::size_t string_bytes_max = 4096;

constexpr std::array<std::string_view, 3> batch_failure_policy_names = {"bisect", "sequential",
                                                                        "fail"};
constexpr std::array<std::string_view, 2> kv_dtype_names = {"f16", "f32"};
constexpr std::array<std::string_view, 3> speculative_mode_names = {"off", "ngram", "draft"};
static_assert(static_cast<std::size_t>(speculative_mode::draft) + 1 ==
                  speculative_mode_names.size(),
              "speculative_mode_names names every speculative_mode, in order");
constexpr std::array<std::string_view, 3> gpu_kernels_names = {"auto", "texel", "storage"};
constexpr std::array<std::string_view, 3> gpu_row_summaries_names = {"auto", "on", "off"};
static_assert(static_cast<std::size_t>(gpu_row_summaries::off) + 1 ==
                  gpu_row_summaries_names.size(),
              "gpu_row_summaries_names names every gpu_row_summaries, in order");
// In model::pooling's order.
constexpr std::array<std::string_view, 3> embedding_pooling_names = {"mean", "last", "cls"};
static_assert(static_cast<std::size_t>(embedding_pooling::cls) + 1 == 3,
              "embedding_pooling_names lists every model::pooling, in order");
constexpr std::array<std::string_view, 7> log_level_names = {"trace", "debug",    "info", "warn",
                                                             "error", "critical", "off"};

constexpr key_spec row(std::string_view section, std::string_view name, value_kind kind,
                       std::string_view doc) {
    key_spec s{};
    s.section = section;
    s.name = name;
    s.kind = kind;
    s.doc = doc;
    return s;
}

// Accessors for member M of section S of config, generated once per row.
template <auto S, auto M>
struct field {
    using type = std::remove_cvref_t<decltype(std::declval<config&>().*S.*M)>;
    static type& ref(config& c) { return (c.*S).*M; }
    static const type& cref(const config& c) { return (c.*S).*M; }
    static std::int64_t get_int(const config& c) { return static_cast<std::int64_t>(cref(c)); }
    static void set_int(config& c, std::int64_t v) { ref(c) = static_cast<type>(v); }
    static const std::string& get_str(const config& c) { return cref(c); }
    static void set_str(config& c, std::string_view v) { ref(c) = std::string(v); }
};

// Accessors for a std::vector<enum> member M of section S, as choice indices.
template <auto S, auto M>
struct list_field {
    using type = std::remove_cvref_t<decltype(std::declval<config&>().*S.*M)>;
    using entry = typename type::value_type;
    static std::vector<std::int64_t> get_list(const config& c) {
        std::vector<std::int64_t> out;
        for (entry e : (c.*S).*M) out.push_back(static_cast<std::int64_t>(e));
        return out;
    }
    static void set_list(config& c, const std::vector<std::int64_t>& v) {
        type& member = (c.*S).*M;
        member.clear();
        for (std::int64_t i : v) member.push_back(static_cast<entry>(i));
    }
};

// Accessors for a std::vector<std::string> member M of section S.
template <auto S, auto M>
struct strings_field {
    using type = std::remove_cvref_t<decltype(std::declval<config&>().*S.*M)>;
    static const std::vector<std::string>& get_strs(const config& c) { return (c.*S).*M; }
    static void set_strs(config& c, const std::vector<std::string>& v) { (c.*S).*M = v; }
};

template <auto S, auto M>
constexpr key_spec integer(std::string_view section, std::string_view name, std::int64_t min,
                           std::int64_t max, std::string_view doc,
                           std::string (*check)(std::int64_t) = nullptr) {
    using f = field<S, M>;
    using T = typename f::type;
    static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>, "integer key on non-int");
    if (min < 0 || min > max || static_cast<std::uint64_t>(max) > std::numeric_limits<T>::max()) {
        throw "integer key bounds do not fit its member type";  // compile-time error
    }
    key_spec s = row(section, name, value_kind::integer, doc);
    s.min = min;
    s.max = max;
    s.get_int = &f::get_int;
    s.set_int = &f::set_int;
    s.check_int = check;
    return s;
}

template <auto S, auto M>
constexpr key_spec boolean(std::string_view section, std::string_view name, std::string_view doc) {
    using f = field<S, M>;
    static_assert(std::is_same_v<typename f::type, bool>, "boolean key on non-bool");
    key_spec s = row(section, name, value_kind::boolean, doc);
    s.min = 0;
    s.max = 1;
    s.get_int = &f::get_int;
    s.set_int = &f::set_int;
    return s;
}

template <auto S, auto M>
constexpr key_spec string(std::string_view section, std::string_view name, std::string_view doc,
                          std::string (*check)(std::string_view) = nullptr) {
    using f = field<S, M>;
    static_assert(std::is_same_v<typename f::type, std::string>, "string key on non-string");
    key_spec s = row(section, name, value_kind::string, doc);
    s.get_str = &f::get_str;
    s.set_str = &f::set_str;
    s.check_str = check;
    return s;
}

template <auto S, auto M, std::size_t N>
constexpr key_spec choice(std::string_view section, std::string_view name,
                          const std::array<std::string_view, N>& names, std::string_view doc) {
    using f = field<S, M>;
    static_assert(std::is_enum_v<typename f::type>, "choice key on non-enum");
    key_spec s = row(section, name, value_kind::choice, doc);
    s.min = 0;
    s.max = static_cast<std::int64_t>(N) - 1;
    s.choices = names;
    s.get_int = &f::get_int;
    s.set_int = &f::set_int;
    return s;
}

template <auto S, auto M, std::size_t N>
constexpr key_spec choice_list(std::string_view section, std::string_view name,
                               const std::array<std::string_view, N>& names,
                               std::size_t entries_max, std::string_view doc) {
    using f = list_field<S, M>;
    static_assert(std::is_enum_v<typename f::entry>, "choice_list key on a non-enum vector");
    key_spec s = row(section, name, value_kind::choice_list, doc);
    s.min = 0;
    s.max = static_cast<std::int64_t>(N) - 1;
    s.choices = names;
    s.entries_max = entries_max;
    s.get_list = &f::get_list;
    s.set_list = &f::set_list;
    return s;
}

template <auto S, auto M>
constexpr key_spec string_list(std::string_view section, std::string_view name,
                               std::size_t entries_max, std::string_view doc,
                               std::string (*check)(std::string_view) = nullptr) {
    using f = strings_field<S, M>;
    static_assert(std::is_same_v<typename f::type, std::vector<std::string>>,
                  "string_list key on a member that is not a vector of strings");
    key_spec s = row(section, name, value_kind::string_list, doc);
    s.entries_max = entries_max;
    s.get_strs = &f::get_strs;
    s.set_strs = &f::set_strs;
    s.check_str = check;
    return s;
}

std::string power_of_two(std::int64_t v) {
    return (v & (v - 1)) == 0 ? "" : "must be a power of two";
}

// gpu.kv_memory_bytes: 0 (the device's choice) or a pool of at least 1 MiB.
std::string zero_or_at_least_a_mib(std::int64_t v) {
    return v == 0 || v >= (std::int64_t{1} << 20)
               ? ""
               : "must be 0 (the device's choice) or at least 1048576 (1 MiB)";
}

std::string listen_rule(std::string_view v) {
    auto addr = parse_listen_address(v);
    return addr.ok() ? "" : addr.err().message;
}

// http.listen: an address as server.listen takes, or empty (no HTTP front door).
std::string optional_listen_rule(std::string_view v) {
    return v.empty() ? "" : listen_rule(v);
}

// True when v is well-formed UTF-8 (TOML text must be; a command-line value may not be).
bool valid_utf8(std::string_view v) {
    std::size_t i = 0;
    while (i < v.size()) {
        const auto c = static_cast<unsigned char>(v[i]);
        std::size_t extra = 0;
        std::uint32_t cp = 0;
        if (c < 0x80) {
            ++i;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            extra = 1, cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            extra = 2, cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            extra = 3, cp = c & 0x07;
        } else {
            return false;
        }
        if (extra > v.size() - i - 1) return false;  // truncated sequence
        for (std::size_t k = 1; k <= extra; ++k) {
            const auto cc = static_cast<unsigned char>(v[i + k]);
            if ((cc & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (cc & 0x3F);
        }
        constexpr std::uint32_t min_for[] = {0, 0x80, 0x800, 0x10000};
        if (cp < min_for[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += extra + 1;
    }
    return true;
}

// http.cors_allow_origins entries: "*", or an origin as a browser sends it in its Origin header
// (RFC 6454: scheme "://" host [":" port], lower case, nothing after), compared byte for byte.
// A path, a trailing slash or upper case would never match, so they are refused here rather
// than silently ignored; "null" (sandboxed pages, file:// URLs) is refused because any page can
// make itself send it.
std::string cors_origin_rule(std::string_view v) {
    if (v == "*") return "";
    const std::string_view shape = "must be \"*\" or scheme://host[:port] with no path";
    std::string_view rest;
    if (v.starts_with("http://")) {
        rest = v.substr(7);
    } else if (v.starts_with("https://")) {
        rest = v.substr(8);
    } else {
        return std::string(shape) + " (http or https)";
    }
    if (rest.empty()) return std::string(shape);
    for (const char c : rest) {
        if (c == '/' || c == '?' || c == '#') return std::string(shape);
        if (c >= 'A' && c <= 'Z') return "must be lower case (browsers send origins so)";
        if (static_cast<unsigned char>(c) <= ' ' || c == ',') {
            return "must not contain spaces, commas or control characters";
        }
    }
    return "";
}

std::string not_empty(std::string_view v) {
    return v.empty() ? "must not be empty" : "";
}

using C = config;
constexpr std::array<std::string_view, 9> section_names = {
    "server", "http", "model", "gpu", "scheduler", "speculative", "kv", "log", "fault"};

constexpr auto table = std::to_array<key_spec>({
    // [server]
    string<&C::server, &server_config::listen>(
        "server", "listen", "TCP address to serve on: IPv4:port or [IPv6]:port; port 0 = any free",
        &listen_rule),
    integer<&C::server, &server_config::max_connections>(
        "server", "max_connections", 1, 65536,
        "open client connections at most; more are accepted and closed at once"),
    integer<&C::server, &server_config::max_frame_bytes>(
        "server", "max_frame_bytes", 64, 64 * mib,
        "bytes of one request frame at most; a bigger frame is bad_frame and closes the "
        "connection"),
    integer<&C::server, &server_config::max_frame_values>(
        "server", "max_frame_values", 16, 16 * mib,
        "msgpack values (scalars, strings, arrays, maps, each key and element) in one frame at "
        "most; more is bad_frame and closes the connection"),
    integer<&C::server, &server_config::max_inflight_per_connection>(
        "server", "max_inflight_per_connection", 1, 4096,
        "requests without a terminal event per connection at most (too_many_inflight beyond)"),
    integer<&C::server, &server_config::write_buffer_bytes_max>(
        "server", "write_buffer_bytes_max", 4 * kib, 1 * gib,
        "bytes of unsent events per connection at most; past it the client is a slow_reader"),
    integer<&C::server, &server_config::mailbox_capacity>(
        "server", "mailbox_capacity", 16, 16 * mib,
        "messages waiting in one actor mailbox at most; a send beyond is refused to the sender"),
    integer<&C::server, &server_config::shutdown_grace_ms>(
        "server", "shutdown_grace_ms", 0, 600000,
        "milliseconds in-flight requests may run after SIGTERM before they are cancelled"),
    integer<&C::server, &server_config::read_timeout_ms>(
        "server", "read_timeout_ms", 100, 3600000,
        "milliseconds a connection may hold a partly sent frame (or send nothing after "
        "connecting); then error read_timeout and the connection is closed"),
    string<&C::server, &server_config::api_keys_file>(
        "server", "api_keys_file",
        "file of API keys, one per line ('#' comments); with keys (here or --api-key) both "
        "front doors require one; refused if group or others may read it; empty = no file"),
    // [http]
    string<&C::http, &http_config::listen>(
        "http", "listen",
        "TCP address of the OpenAI-compatible HTTP API, as server.listen; empty = no HTTP",
        &optional_listen_rule),
    integer<&C::http, &http_config::max_connections>(
        "http", "max_connections", 1, 65536,
        "open HTTP connections at most; one more gets 429 overloaded and is closed"),
    integer<&C::http, &http_config::max_header_bytes>(
        "http", "max_header_bytes", 1 * kib, 1 * mib,
        "bytes of one request's request line and headers at most (431 beyond)"),
    integer<&C::http, &http_config::max_body_bytes>(
        "http", "max_body_bytes", 1 * kib, 64 * mib,
        "bytes of one request body at most (413 beyond, then the connection is closed)"),
    integer<&C::http, &http_config::header_timeout_ms>(
        "http", "header_timeout_ms", 100, 3600000,
        "milliseconds a request may take to arrive whole (headers and body) once begun, or a "
        "new connection to begin one; then 408 and the connection is closed"),
    integer<&C::http, &http_config::keep_alive_timeout_ms>(
        "http", "keep_alive_timeout_ms", 100, 3600000,
        "milliseconds an idle kept-alive connection stays open between requests"),
    integer<&C::http, &http_config::max_pipelined_requests>(
        "http", "max_pipelined_requests", 1, 1024,
        "requests of one connection read ahead of the one being answered; beyond, the "
        "connection is not read until answers are written"),
    integer<&C::http, &http_config::linger_ms>(
        "http", "linger_ms", 0, 600000,
        "milliseconds a connection closed by the server after its answer (413, 431, 408, 400, "
        "429, Connection: close) goes on reading and discarding what the client still sends, "
        "so that the client reads the answer rather than a reset; 0 = close at once"),
    integer<&C::http, &http_config::max_linger_bytes>(
        "http", "max_linger_bytes", 0, 1 * gib,
        "bytes a lingering connection discards at most; past them it is closed (a reset)"),
    boolean<&C::http, &http_config::metrics_require_key>(
        "http", "metrics_require_key",
        "with API keys configured, GET /metrics needs one too (Bearer); /health never does"),
    string_list<&C::http, &http_config::cors_allow_origins>(
        "http", "cors_allow_origins", cors_allow_origins_max,
        "origins whose browser pages may call the API (CORS), e.g. \"https://app.example.com\"; "
        "\"*\" = any page; empty = none",
        &cors_origin_rule),
    // [model]
    string<&C::model, &model_config::path>(
        "model", "path", "GGUF file to serve; empty = the generated default model"),
    string<&C::model, &model_config::generated_path>(
        "model", "generated_path", "where set-up writes the generated random-weight model",
        &not_empty),
    integer<&C::model, &model_config::context_tokens>(
        "model", "context_tokens", 0, 1048576,
        "context length in tokens; 0 = the model's own; must not exceed the model's"),
    string<&C::model, &model_config::chat_template_path>(
        "model", "chat_template_path",
        "Jinja chat template file used instead of the GGUF's tokenizer.chat_template; empty = "
        "the file's"),
    choice<&C::model, &model_config::embedding_pooling>(
        "model", "embedding_pooling", embedding_pooling_names,
        "how embeddings pool the prompt's hidden states when the GGUF names no pooling_type: "
        "mean, last token or first (cls) token"),
    // [gpu]
    string<&C::gpu, &gpu_config::device>(
        "gpu", "device", "Vulkan device: \"\"/\"auto\", an index, or a name substring"),
    integer<&C::gpu, &gpu_config::flush_every_layers>(
        "gpu", "flush_every_layers", 0, flush_every_layers_max,
        "layers per command-buffer submission at most; 0 = the device's (16 on GPUs, 4 on CPU "
        "devices)"),
    integer<&C::gpu, &gpu_config::watchdog_ms>(
        "gpu", "watchdog_ms", 100, 600000,
        "milliseconds one submission may run before it is a timeout and the device is rebuilt"),
    integer<&C::gpu, &gpu_config::warmup_ms_max>(
        "gpu", "warmup_ms_max", 1000, 3600000,
        "milliseconds one warm-up submission may run while the device is built (first "
        "dispatches compile kernels: not judged by watchdog_ms)"),
    string<&C::gpu, &gpu_config::pipeline_cache_dir>(
        "gpu", "pipeline_cache_dir",
        "folder of the Vulkan pipeline cache kept between starts; empty = none on disk"),
    integer<&C::gpu, &gpu_config::kv_block_tokens>("gpu", "kv_block_tokens", 8, kv_block_tokens_max,
                                                   "tokens per paged KV block; a power of two",
                                                   &power_of_two),
    integer<&C::gpu, &gpu_config::kv_blocks>(
        "gpu", "kv_blocks", 0, kv_blocks_max,
        "KV blocks in the pool; 0 = as many as kv_memory_bytes fits"),
    integer<&C::gpu, &gpu_config::kv_memory_bytes>(
        "gpu", "kv_memory_bytes", 0, 1 * tib,
        "device bytes for the KV pool when kv_blocks = 0; 0 = the device's choice",
        &zero_or_at_least_a_mib),
    choice<&C::gpu, &gpu_config::kv_dtype>("gpu", "kv_dtype", kv_dtype_names,
                                           "element type of the KV pool"),
    integer<&C::gpu, &gpu_config::recovery_max>(
        "gpu", "recovery_max", 0, 100,
        "device rebuilds in a row without a good step before the server reports degraded"),
    choice<&C::gpu, &gpu_config::kernels>("gpu", "kernels", gpu_kernels_names,
                                          "kernel family: auto, texel or storage (gpu/PERF.md)"),
    choice<&C::gpu, &gpu_config::row_summaries>(
        "gpu", "row_summaries", gpu_row_summaries_names,
        "each logits row's summary from the GPU for the sampler: auto (GPUs), on or off"),
    boolean<&C::gpu, &gpu_config::batch_invariant>(
        "gpu", "batch_invariant",
        "a token's logits never depend on its step's batch (false: cooperative-matrix "
        "mat-muls where the device has them)"),
    // [scheduler]
    integer<&C::scheduler, &scheduler_config::max_sequences>(
        "scheduler", "max_sequences", 0, max_sequences_max,
        "sequences decoded together at most; 0 = the device's choice"),
    integer<&C::scheduler, &scheduler_config::max_queue>(
        "scheduler", "max_queue", 1, 65536,
        "requests waiting for a sequence slot at most; beyond, overloaded"),
    integer<&C::scheduler, &scheduler_config::max_batch_tokens>(
        "scheduler", "max_batch_tokens", 1, max_batch_tokens_max,
        "tokens in one step at most (prefill chunks + one per decoding sequence)"),
    integer<&C::scheduler, &scheduler_config::max_tokens_default>(
        "scheduler", "max_tokens_default", 1, max_tokens_default_max,
        "max_tokens of a generate request that gives none"),
    choice<&C::scheduler, &scheduler_config::batch_failure_policy>(
        "scheduler", "batch_failure_policy", batch_failure_policy_names,
        "what a failed batched step does: retry alone then bisect, retry alone, or fail all"),
    integer<&C::scheduler, &scheduler_config::retry_max>(
        "scheduler", "retry_max", 0, 16, "retries of one sequence's failed step at most"),
    boolean<&C::scheduler, &scheduler_config::prefix_cache>(
        "scheduler", "prefix_cache", "share full KV blocks of equal prompt prefixes"),
    integer<&C::scheduler, &scheduler_config::decode_steps>(
        "scheduler", "decode_steps", 1, decode_steps_max,
        "greedy decode iterations one step may run on the GPU back to back (1: one)"),
    // [speculative]
    choice<&C::speculative, &speculative_config::mode>(
        "speculative", "mode", speculative_mode_names,
        "speculative decoding: off, ngram (drafts from prompt lookup) or draft (drafts from "
        "speculative.draft_model), verified in one step; "
        "the output is byte-identical to plain decoding)"),
    integer<&C::speculative, &speculative_config::draft_tokens_max>(
        "speculative", "draft_tokens_max", 1, draft_tokens_max_max,
        "drafted tokens one verification step checks for a sequence, at most"),
    integer<&C::speculative, &speculative_config::ngram_min>(
        "speculative", "ngram_min", 1, ngram_max_max,
        "the shortest suffix of a sequence that prompt lookup matches earlier in it"),
    integer<&C::speculative, &speculative_config::ngram_max>(
        "speculative", "ngram_max", 1, ngram_max_max,
        "the longest suffix prompt lookup matches (tried first, then shorter ones)"),
    integer<&C::speculative, &speculative_config::fallback_rounds>(
        "speculative", "fallback_rounds", 1, 1000000,
        "verifications in a row that accept no drafted token before the request decodes "
        "without speculation"),
    string<&C::speculative, &speculative_config::draft_model>(
        "speculative", "draft_model",
        "mode = \"draft\": GGUF file of the draft model (the served model's vocabulary)"),
    integer<&C::speculative, &speculative_config::draft_wait_ms>(
        "speculative", "draft_wait_ms", 100, 600000,
        "mode = \"draft\": how long one drafting round may take before its sequences decode "
        "without speculation"),
    // [kv]
    boolean<&C::kv, &kv_config::enabled>(
        "kv", "enabled", "persist KV prefixes and named sessions to disk, restore them later"),
    string<&C::kv, &kv_config::dir>("kv", "dir", "directory of persisted KV files", &not_empty),
    boolean<&C::kv, &kv_config::shared>(
        "kv", "shared",
        "other servers of the same model share dir: sessions they save are restored here"),
    integer<&C::kv, &kv_config::bytes_budget>(
        "kv", "bytes_budget", 1 * mib, 1024 * tib,
        "bytes of persisted KV files at most; least recently used are evicted"),
    integer<&C::kv, &kv_config::restore_retry_max>(
        "kv", "restore_retry_max", 0, 8,
        "retries of a failed KV restore before recomputing the prefix"),
    integer<&C::kv, &kv_config::restore_wait_ms>(
        "kv", "restore_wait_ms", 100, 600000,
        "how long a request waits for its disk lookup and restore before recomputing the prefix "
        "(and a session_delete for the removal before a kv_io error)"),
    integer<&C::kv, &kv_config::flush_ms_max>(
        "kv", "flush_ms_max", 0, 600000,
        "at shutdown, ms to wait for KV saves in flight; what is not written by then is dropped"),
    // [log]
    choice<&C::log, &log_config::level>("log", "level", log_level_names,
                                        "least severe level written"),
    string<&C::log, &log_config::file>("log", "file",
                                       "log file, written besides stderr; empty = stderr only"),
    integer<&C::log, &log_config::queue_lines>(
        "log", "queue_lines", log_queue_lines_min, log_queue_lines_max,
        "lines waiting for the log writer at most; when full the oldest is dropped and counted "
        "(stats log_lines_dropped)"),
    // [fault]
    boolean<&C::fault, &fault_config::enabled>(
        "fault", "enabled", "accept the fault-injection op (testing only; never in production)"),
    integer<&C::fault, &fault_config::seed>("fault", "seed", 0,
                                            std::numeric_limits<std::int64_t>::max(),
                                            "seed of the fault plan's draws: same seed and steps, "
                                            "same faults"),
    choice_list<&C::fault, &fault_config::plan>(
        "fault", "plan", fault_kind_names, fault_plan_entries_max,
        "fault kinds the plan draws from at gpu steps; empty = no plan; needs enabled"),
    integer<&C::fault, &fault_config::plan_every_steps>(
        "fault", "plan_every_steps", 1, 1000000,
        "mean gpu steps between planned faults: each step draws one with probability 1/this"),
    integer<&C::fault, &fault_config::plan_faults_max>(
        "fault", "plan_faults_max", 0, 1000000,
        "faults the plan fires in the server's life at most; then it is spent"),
    integer<&C::fault, &fault_config::plan_delay_ms>(
        "fault", "plan_delay_ms", 1, fault_delay_ms_max,
        "milliseconds a planned step_delay holds its step (a net_stop_reading pauses, a kv "
        "stall holds its disk job)"),
});

}  // namespace

std::string_view to_string(value_kind k) {
    switch (k) {
        case value_kind::integer:
            return "integer";
        case value_kind::boolean:
            return "boolean";
        case value_kind::string:
            return "string";
        case value_kind::choice:
            return "string";
        case value_kind::choice_list:
        case value_kind::string_list:
            return "array";
    }
    return "?";
}

std::string_view to_string(batch_failure_policy v) {
    return batch_failure_policy_names.at(static_cast<std::size_t>(v));
}
std::string_view to_string(kv_dtype v) {
    return kv_dtype_names.at(static_cast<std::size_t>(v));
}
std::string_view to_string(gpu_kernels v) {
    return gpu_kernels_names.at(static_cast<std::size_t>(v));
}
std::string_view to_string(gpu_row_summaries v) {
    return gpu_row_summaries_names.at(static_cast<std::size_t>(v));
}
std::string_view to_string(speculative_mode v) {
    return speculative_mode_names.at(static_cast<std::size_t>(v));
}
std::string_view to_string(embedding_pooling v) {
    return embedding_pooling_names.at(static_cast<std::size_t>(v));
}
std::string_view to_string(log_level v) {
    return log_level_names.at(static_cast<std::size_t>(v));
}
std::span<const key_spec> schema() {
    return table;
}

std::span<const std::string_view> sections() {
    return section_names;
}

const key_spec* find_key(std::string_view section, std::string_view name) {
    for (const key_spec& s : table) {
        if (s.section == section && s.name == name) return &s;
    }
    return nullptr;
}

std::string check_int_value(const key_spec& spec, std::int64_t v) {
    if (v < spec.min || v > spec.max) {
        if (spec.kind == value_kind::choice) return "must be " + describe_domain(spec);
        return "must be between " + std::to_string(spec.min) + " and " + std::to_string(spec.max);
    }
    return spec.check_int ? spec.check_int(v) : "";
}

std::string check_list_value(const key_spec& spec, const std::vector<std::int64_t>& v) {
    if (v.size() > spec.entries_max) {
        return "must have at most " + std::to_string(spec.entries_max) + " entries";
    }
    for (std::int64_t i : v) {
        if (i < spec.min || i > spec.max) return "every entry must be " + choices_text(spec);
    }
    return "";
}

std::string check_strs_value(const key_spec& spec, const std::vector<std::string>& v) {
    if (v.size() > spec.entries_max) {
        return "must have at most " + std::to_string(spec.entries_max) + " entries";
    }
    for (std::size_t i = 0; i < v.size(); ++i) {
        if (auto why = check_str_value(spec, v[i]); !why.empty()) {
            return "entry " + std::to_string(i + 1) + " (" + quote_toml(v[i]) + "): " + why;
        }
    }
    return "";
}

std::string check_str_value(const key_spec& spec, std::string_view v) {
    if (v.size() > string_bytes_max) {
        return "must be at most " + std::to_string(string_bytes_max) + " bytes";
    }
    if (v.find('\0') != std::string_view::npos) return "must not contain NUL characters";
    if (!valid_utf8(v)) return "must be valid UTF-8";
    return spec.check_str ? spec.check_str(v) : "";
}

std::string describe_domain(const key_spec& spec) {
    switch (spec.kind) {
        case value_kind::integer:
            return "integer " + std::to_string(spec.min) + ".." + std::to_string(spec.max);
        case value_kind::boolean:
            return "true or false";
        case value_kind::string:
            return "string";
        case value_kind::choice:
            return choices_text(spec);
        case value_kind::choice_list:
            return "array of at most " + std::to_string(spec.entries_max) + " entries, each " +
                   choices_text(spec);
        case value_kind::string_list:
            return "array of at most " + std::to_string(spec.entries_max) + " strings";
    }
    return "?";
}

std::string choices_text(const key_spec& spec) {
    std::string out = "one of ";
    for (std::size_t i = 0; i < spec.choices.size(); ++i) {
        out += (i ? ", \"" : "\"") + std::string(spec.choices[i]) + "\"";
    }
    return out;
}

}  // namespace ordo::config
