// server.cpp: see server.hpp.
#include "tools/server/server.hpp"

#include <uv.h>

#include <chrono>
#include <csignal>
#include <ctime>
#include <filesystem>
#include <future>
#include <optional>

#include "actors/config/device_choices.hpp"
#include "actors/runtime/log.hpp"
#include "draft/draft_actor.hpp"
#include "gpu/actor/gpu_actor.hpp"
#include "gpu/vk/device.hpp"
#include "gpu/vk/device_select.hpp"
#include "http/http_actor.hpp"
#include "kv/kv_actor.hpp"
#include "net/net_actor.hpp"
#include "net/ops.hpp"
#include "scheduler/kv_blocks.hpp"
#include "scheduler/scheduler_actor.hpp"

namespace ordo {
namespace {

// Logits rows one step may return: one per sequence, and with speculation one more per drafted
// token (a verification's rows), at most max_batch_tokens (a row is a token of the step).
uint32_t logits_rows_max(const config::config& cfg) {
    const uint64_t per_seq = cfg.speculative.mode == config::speculative_mode::off
                                 ? 1
                                 : 1 + cfg.speculative.draft_tokens_max;
    return uint32_t(std::min<uint64_t>(uint64_t(cfg.scheduler.max_sequences) * per_seq,
                                       cfg.scheduler.max_batch_tokens));
}

// What the config check accepts, the actors run: each bound an actor holds its options to when
// it starts is at least the schema's bound for the key that feeds it (actors/config/config.hpp).
static_assert(config::max_batch_tokens_max <= gpu::runner_max_batch_tokens_max);
static_assert(config::max_sequences_max <= gpu::runner_seqs_max_max);  // seqs_max and rows_max
static_assert(config::flush_every_layers_max <= gpu::runner_flush_every_layers_max);
static_assert(config::kv_block_tokens_max <= sched::kv_block_tokens_max);
static_assert(config::kv_blocks_max <= sched::kv_blocks_max);
static_assert(config::decode_steps_max <= gpu::decode_steps_max);
static_assert(config::log_queue_lines_min >= log_queue_lines_min &&
              config::log_queue_lines_max <= log_queue_lines_max);
static_assert(config::kv_pool_tokens_max <= sched::kv_pool_tokens_max);
static_assert(config::max_tokens_default_max <= sched::max_tokens_max);
static_assert(config::fault_delay_ms_max <= gpu::armed_faults::delay_ms_max);  // plan_delay_ms
// A pool the runner sizes from gpu.kv_memory_bytes is one the scheduler's block table takes.
static_assert(gpu::runner_kv_pool_tokens_max <= sched::kv_pool_tokens_max);

// Row summaries one logits slot holds: a step of several decode iterations (one row a sequence,
// scheduler.decode_steps iterations) keeps every iteration's summary but the last one's rows alone
// (gpu_msgs.hpp decode_row), so on a device that summarizes, steps of up to max_sequences
// sequences run every iteration; at most 4 slots x 1024 x 16 x 528 bytes.
uint32_t logits_summary_rows_max(const config::config& cfg) {
    return std::max(logits_rows_max(cfg), cfg.scheduler.max_sequences *
                                              std::max<uint32_t>(1, cfg.scheduler.decode_steps));
}

struct main_loop {
    uv_loop_t loop{};
    uv_signal_t sigint{};
    uv_signal_t sigterm{};
    std::function<void()> on_stop;
    bool stopping = false;
};

void begin_stop(main_loop& m) {
    if (m.stopping) return;
    m.stopping = true;
    m.on_stop();
    uv_close(reinterpret_cast<uv_handle_t*>(&m.sigint), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&m.sigterm), nullptr);
}

// Start-up failed before the actors ran: close the signal watchers and the loop.
void abandon(main_loop& m) {
    m.on_stop = [] {};
    begin_stop(m);
    uv_run(&m.loop, UV_RUN_DEFAULT);
    uv_loop_close(&m.loop);
}

void signal_cb(uv_signal_t* handle, int signum) {
    auto& m = *static_cast<main_loop*>(handle->data);
    logger("main")->info("received {}, stopping", signum == SIGINT ? "SIGINT" : "SIGTERM");
    begin_stop(m);
}

net::net_options net_options_from(const config::config& cfg, const config::listen_address& a,
                                  const loaded_model& m) {
    net::net_options o;
    o.host = a.host;
    o.port = a.port;
    o.connections_max = cfg.server.max_connections;
    o.frame_bytes_max = cfg.server.max_frame_bytes;
    o.frame_values_max = cfg.server.max_frame_values;
    o.inflight_per_connection_max = cfg.server.max_inflight_per_connection;
    o.write_buffer_bytes_max = cfg.server.write_buffer_bytes_max;
    o.shutdown_grace_ms = cfg.server.shutdown_grace_ms;
    o.read_timeout_ms = cfg.server.read_timeout_ms;
    o.limits.max_tokens_default = cfg.scheduler.max_tokens_default;
    o.limits.vocab_size = static_cast<uint32_t>(m.tokenizer->vocab().size());
    o.limits.kv_enabled = cfg.kv.enabled;
    o.limits.chat = m.chat;
    return o;
}

http::http_options http_options_from(const config::config& cfg, const config::listen_address& a,
                                     const loaded_model& m, const net::request_limits& limits) {
    http::http_options o;
    o.host = a.host;
    o.port = a.port;
    o.connections_max = cfg.http.max_connections;
    o.header_bytes_max = cfg.http.max_header_bytes;
    o.body_bytes_max = cfg.http.max_body_bytes;
    o.header_timeout_ms = cfg.http.header_timeout_ms;
    o.keep_alive_timeout_ms = cfg.http.keep_alive_timeout_ms;
    o.pipelined_max = cfg.http.max_pipelined_requests;
    o.linger_ms = cfg.http.linger_ms;
    o.linger_bytes_max = cfg.http.max_linger_bytes;
    o.write_buffer_bytes_max = cfg.server.write_buffer_bytes_max;
    o.shutdown_grace_ms = cfg.server.shutdown_grace_ms;
    o.limits = limits;
    // The name clients give as `model`: the file's name without its extension.
    o.model.id = std::filesystem::path(m.path).stem().string();
    o.model.created = uint64_t(std::time(nullptr));
    o.model.n_vocab = m.hp.n_vocab;
    o.model.n_ctx_train = m.hp.n_ctx;
    o.model.n_embd = m.hp.n_embd;
    return o;
}

gpu::gpu_actor_options gpu_options_from(const config::config& cfg, const loaded_model& m) {
    gpu::gpu_actor_options o;
    o.model_path = m.path;
    o.recovery_max = cfg.gpu.recovery_max;
    o.mailbox_capacity = cfg.server.mailbox_capacity;
    auto& r = o.runner;
    r.device = cfg.gpu.device;
    r.flush_every_layers = cfg.gpu.flush_every_layers;
    r.watchdog_ms = cfg.gpu.watchdog_ms;
    r.warmup_ms_max = cfg.gpu.warmup_ms_max;
    r.pipeline_cache_dir = cfg.gpu.pipeline_cache_dir;
    r.kv_block_tokens = cfg.gpu.kv_block_tokens;
    r.kv_blocks = cfg.gpu.kv_blocks;
    r.kv_memory_bytes = cfg.gpu.kv_memory_bytes;
    r.kv_f16 = cfg.gpu.kv_dtype == config::kv_dtype::f16;
    r.max_batch_tokens = cfg.scheduler.max_batch_tokens;
    r.rows_max = logits_rows_max(cfg);
    r.seqs_max = cfg.scheduler.max_sequences;
    r.n_ctx = cfg.model.context_tokens;  // 0: the model's; the runner names the bound it takes
    if (cfg.gpu.kernels != config::gpu_kernels::automatic) {
        r.texel_kernels = cfg.gpu.kernels == config::gpu_kernels::texel;
    }
    if (cfg.gpu.row_summaries != config::gpu_row_summaries::automatic) {
        r.row_summaries = cfg.gpu.row_summaries == config::gpu_row_summaries::on;
    }
    r.batch_invariant = cfg.gpu.batch_invariant;
    return o;
}

// The layout of one KV block of a model with hyperparameters `hp` under this config: what a
// persisted file must match, and (block_bytes) what a block of its pool takes.
kv::kv_file_geometry kv_geometry_of(const config::config& cfg, const model::llama_hparams& hp) {
    kv::kv_file_geometry g;
    g.n_layer = hp.n_layer;
    g.n_head_kv = hp.n_head_kv;
    g.head_dim = hp.head_dim();
    g.block_tokens = cfg.gpu.kv_block_tokens;
    g.dtype =
        cfg.gpu.kv_dtype == config::kv_dtype::f16 ? kv::kv_file_dtype::f16 : kv::kv_file_dtype::f32;
    return g;
}

// The draft model's gpu actor: the served model's device settings, its own context, one logits
// row per sequence (a draft step asks for no more), and a KV pool of as many positions as the
// served model's (gpu.kv_blocks, or gpu.kv_memory_bytes scaled by the two models' KV per
// position: a smaller draft model takes less memory, never more).
gpu::gpu_actor_options draft_gpu_options_from(const config::config& cfg, const loaded_model& served,
                                              const loaded_model& d) {
    gpu::gpu_actor_options o = gpu_options_from(cfg, d);
    o.name = "draft-gpu";
    o.runner.rows_max = cfg.scheduler.max_sequences;
    o.runner.n_ctx = 0;
    if (cfg.gpu.kv_blocks == 0) {
        const uint64_t served_block = kv_geometry_of(cfg, served.hp).block_bytes();
        const uint64_t draft_block = kv_geometry_of(cfg, d.hp).block_bytes();
        const uint64_t scaled =
            uint64_t(double(cfg.gpu.kv_memory_bytes) * double(draft_block) / double(served_block));
        o.runner.kv_memory_bytes =
            std::max<uint64_t>(std::min(cfg.gpu.kv_memory_bytes, scaled), draft_block);
    }
    return o;
}

sched::core_options core_options_from(const config::config& cfg, const loaded_model& m) {
    sched::core_options o;
    o.max_sequences = cfg.scheduler.max_sequences;
    o.max_queue = cfg.scheduler.max_queue;
    o.max_batch_tokens = cfg.scheduler.max_batch_tokens;
    o.max_tokens_default = cfg.scheduler.max_tokens_default;
    o.retry_max = cfg.scheduler.retry_max;
    o.policy = cfg.scheduler.batch_failure_policy;
    o.prefix_cache = cfg.scheduler.prefix_cache;
    o.decode_steps = cfg.scheduler.decode_steps;
    o.n_ctx = m.n_ctx;
    o.kv_disk = cfg.kv.enabled;
    o.restore_retry_max = cfg.kv.restore_retry_max;
    o.restore_wait_ms = cfg.kv.restore_wait_ms;
    // The file's own pooling_type wins: it names how the model was trained to embed.
    o.pooling = m.hp.embedding_pooling.value_or(cfg.model.embedding_pooling);
    o.speculative.mode = cfg.speculative.mode;
    o.speculative.draft_tokens_max = cfg.speculative.draft_tokens_max;
    o.speculative.ngram.ngram_min = cfg.speculative.ngram_min;
    o.speculative.ngram.ngram_max = cfg.speculative.ngram_max;
    o.speculative.fallback_rounds = cfg.speculative.fallback_rounds;
    o.speculative.draft_model = cfg.speculative.draft_model;
    return o;
}

// What a persisted KV file must match to be loaded: this model, this pool's block layout.
result<kv::kv_actor_options> kv_options_from(const config::config& cfg, const loaded_model& m,
                                             uint32_t copy_blocks_max) {
    auto fp = model::fingerprint::from_hex(m.info.fingerprint);
    if (!fp) return fp.err();
    kv::kv_actor_options o;
    o.dir = cfg.kv.dir;
    o.shared = cfg.kv.shared;
    o.bytes_budget = cfg.kv.bytes_budget;
    o.expect.fingerprint = *fp;
    o.expect.geometry = kv_geometry_of(cfg, m.hp);
    o.copy_blocks_max = copy_blocks_max;
    o.flush_ms_max = cfg.kv.flush_ms_max;
    o.mailbox_capacity = cfg.server.mailbox_capacity;
    return o;
}

// A step may take several segments, each bounded by the watchdog; past all of them plus the
// time to rebuild a device the scheduler stops waiting.
uint64_t step_backstop_ms(const config::config& cfg, const loaded_model& m) {
    // flush_every_layers 0 is the device's choice: 4 layers a segment or more (fewer only
    // where a segment's dispatches would pass the runner's bound).
    const uint64_t per = cfg.gpu.flush_every_layers != 0 ? cfg.gpu.flush_every_layers : 4;
    // A step of several decode iterations runs its segments that many times, and a step_delay
    // fault delays each iteration (the first's within the 60 s).
    const uint64_t k = cfg.scheduler.decode_steps;
    uint64_t segments = (m.hp.n_layer + per - 1) / per * k;
    return cfg.gpu.watchdog_ms * (segments + 2) + 60000 + (k - 1) * gpu::armed_faults::delay_ms_max;
}

// With no API key anyone who can reach a non-loopback address can use the server: said once
// per front door at start.
void warn_if_open(const door::api_keys& keys, const config::listen_address& a, const char* key) {
    if (keys.required() || door::is_loopback_host(a.host)) return;
    logger("main")->warn(
        "{} = {}:{} is not a loopback address and no API key is configured: "
        "anyone who can reach it can use this server (server.api_keys_file, "
        "--api-key)",
        key, a.ipv6 ? "[" + a.host + "]" : a.host, a.port);
}

// The front doors' addresses: the net door's always, the HTTP door's when http.listen is set.
struct listen_addresses {
    config::listen_address net;
    std::optional<config::listen_address> http;  // off when http.listen is empty
};

result<listen_addresses> read_listen_addresses(const config::config& cfg) {
    auto address = config::parse_listen_address(cfg.server.listen);
    if (!address.ok()) return address.err();
    listen_addresses out{*address, std::nullopt};
    if (!cfg.http.listen.empty()) {
        auto a = config::parse_listen_address(cfg.http.listen);
        if (!a.ok()) return a.err();
        out.http = *a;
    }
    return out;
}

// One gate for both doors: a client that fails on one is cut off on the other too.
std::shared_ptr<door::auth_gate> open_auth_gate(const door::api_keys& keys,
                                                const listen_addresses& addresses) {
    warn_if_open(keys, addresses.net, "server.listen");
    if (addresses.http) warn_if_open(keys, *addresses.http, "http.listen");
    auto auth = std::make_shared<door::auth_gate>(keys);
    if (keys.required()) {
        logger("main")->info("API keys: {} configured; both front doors require one", keys.size());
    }
    return auth;
}

// Signal watchers first: a SIGTERM that arrives while the actors start must take the orderly
// path, not the default action.
void start_signal_watchers(main_loop& m) {
    uv_loop_init(&m.loop);
    uv_signal_init(&m.loop, &m.sigint);
    uv_signal_init(&m.loop, &m.sigterm);
    m.sigint.data = m.sigterm.data = &m;
    uv_signal_start(&m.sigint, signal_cb, SIGINT);
    uv_signal_start(&m.sigterm, signal_cb, SIGTERM);
}

// What is served, said once at start. The context served is logged by the gpu runner once it
// knows every bound (KV pool, device).
void log_model(const config::config& cfg, const loaded_model& model, const loaded_model* draft) {
    auto log = logger("main");
    log->info("model {}{}: {} layers, n_embd {}, vocab {}, trained context {}, fingerprint {}",
              model.path, model.generated ? " (generated, random weights)" : "", model.hp.n_layer,
              model.hp.n_embd, model.hp.n_vocab, model.hp.n_ctx, model.info.fingerprint);
    if (model.generated) log->warn("{}", model.info.hint);
    log->info("embeddings pool by {} ({})",
              config::to_string(model.hp.embedding_pooling.value_or(cfg.model.embedding_pooling)),
              model.hp.embedding_pooling ? "the GGUF's pooling_type" : "model.embedding_pooling");
    if (cfg.speculative.mode == config::speculative_mode::ngram) {
        log->info(
            "speculative decoding: ngram (draft_tokens_max {}, n-grams {}..{}, fallback after "
            "{} rounds without an accepted draft)",
            cfg.speculative.draft_tokens_max, cfg.speculative.ngram_min, cfg.speculative.ngram_max,
            cfg.speculative.fallback_rounds);
    } else if (cfg.speculative.mode == config::speculative_mode::draft) {
        log->info(
            "speculative decoding: draft model {} ({} layers, n_embd {}; draft_tokens_max {}, "
            "a round waited for {} ms at most, fallback after {} rounds without an accepted "
            "draft)",
            draft->path, draft->hp.n_layer, draft->hp.n_embd, cfg.speculative.draft_tokens_max,
            cfg.speculative.draft_wait_ms, cfg.speculative.fallback_rounds);
    }
    if (const status& tok = model.tokenizer->support(); !tok.ok()) {
        log->warn(
            "{}: serving token ids only (generate with `tokens`); text ops answer "
            "tokenizer_unsupported",
            tok.err().message);
    }

    if (!model.chat->problem.empty()) {
        log->warn(
            "the model's chat template does not parse ({}): chat answers template_error; "
            "give one with --chat-template FILE",
            model.chat->problem);
    } else {
        log->info("chat template: {}", model.chat->source);
    }
}

// The scheduler actor's options, all but its callbacks (on_drained, kv_report: they point into
// the server_actors that build_actors fills).
sched::scheduler_actor::options scheduler_options_from(const config::config& cfg,
                                                       const loaded_model& model) {
    sched::scheduler_actor::options so;
    so.mailbox_capacity = cfg.server.mailbox_capacity;
    so.step_backstop_ms = step_backstop_ms(cfg, model);
    so.draft_wait_ms = cfg.speculative.draft_wait_ms;
    so.faults_enabled = cfg.fault.enabled;
    so.plan = {cfg.fault.seed, cfg.fault.plan, cfg.fault.plan_every_steps,
               cfg.fault.plan_faults_max};
    so.plan_delay_ms = cfg.fault.plan_delay_ms;
    if (!cfg.fault.plan.empty()) {
        logger("main")->warn(
            "fault plan on: seed {}, {} kinds, a fault every {} steps on average, at most {}",
            cfg.fault.seed, cfg.fault.plan.size(), cfg.fault.plan_every_steps,
            cfg.fault.plan_faults_max);
    }
    return so;
}

// Every actor of one server and what they share, declared in the order they are built and so
// destroyed in reverse: the net actor (which reads the http actor's counters, the stats op's
// `http` map) before the http actor; every actor before the logits exchange and the staging
// slot it points into, and before the promise the scheduler's on_drained sets.
struct server_actors {
    server_actors(const config::config& cfg, const loaded_model& model)
        : logits(logits_rows_max(cfg), model.hp.n_vocab, model.hp.n_embd,
                 logits_summary_rows_max(cfg)) {}

    gpu::logits_exchange logits;
    std::optional<gpu::logits_exchange> draft_logits;  // the draft model's (mode = "draft")
    std::promise<void> drained;  // set by the scheduler when a drain has ended
    // KV persistence (kv.enabled): the kv actor and the staging slot its copies go through.
    std::optional<gpu::kv_staging> staging;
    std::optional<kv::kv_actor> kv;
    std::optional<sched::scheduler_actor> scheduler;
    std::optional<http::http_actor> http;  // the HTTP front door, when http.listen is set
    std::optional<net::net_actor> net;
    std::optional<gpu::gpu_actor> gpu;
    // Speculation with a draft model: the draft actor and the draft model's gpu actor.
    std::optional<draft::draft_actor> drafter;
    std::optional<gpu::gpu_actor> draft_gpu;
};

// Builds the actors into s, none connected or started. Fails only before any actor is built
// (the scheduler's core, the kv actor's options).
status build_actors(server_actors& s, const config::config& cfg, const loaded_model& model,
                    const loaded_model* draft_model, const listen_addresses& addresses,
                    const std::shared_ptr<door::auth_gate>& auth) {
    auto core =
        sched::scheduler_core::create(core_options_from(cfg, model), &*model.tokenizer, model.info);
    if (!core.ok()) return core.err();
    sched::scheduler_actor::options so = scheduler_options_from(cfg, model);
    so.on_drained = [&drained = s.drained] { drained.set_value(); };
    std::optional<kv::kv_actor_options> kv_opts;
    if (cfg.kv.enabled) {
        uint32_t copy_blocks_max = gpu_options_from(cfg, model).runner.kv_copy_blocks_max;
        auto o = kv_options_from(cfg, model, copy_blocks_max);
        if (!o.ok()) return o.err();
        kv_opts = std::move(*o);
    }
    if (kv_opts) {
        s.staging.emplace(
            1, uint64_t(kv_opts->copy_blocks_max) * kv_opts->expect.geometry.block_bytes());
        s.kv.emplace(*kv_opts, *s.staging);
        so.kv_report = [&kv = s.kv] { return kv->report(); };
    }
    s.scheduler.emplace(std::move(*core), &s.logits, so);
    net::net_options net_opts = net_options_from(cfg, addresses.net, model);
    net_opts.auth = auth;
    if (addresses.http) net_opts.http_counters = [&http = s.http] { return http->counters(); };
    s.net.emplace(net_opts, cfg.server.mailbox_capacity);
    s.gpu.emplace(gpu_options_from(cfg, model), s.logits, gpu::gpu_replies(*s.scheduler, "gpu"));
    if (draft_model != nullptr) {
        s.draft_logits.emplace(cfg.scheduler.max_sequences, draft_model->hp.n_vocab,
                               draft_model->hp.n_embd);
        draft::draft_actor_options d;
        d.max_batch_tokens = cfg.scheduler.max_batch_tokens;
        d.n_vocab = uint32_t(model.tokenizer->vocab().size());
        d.round_ms_max = cfg.speculative.draft_wait_ms;
        d.mailbox_capacity = cfg.server.mailbox_capacity;
        s.drafter.emplace(d, *s.draft_logits, draft::draft_replies(*s.scheduler, "draft"));
        s.draft_gpu.emplace(draft_gpu_options_from(cfg, model, *draft_model), *s.draft_logits,
                            gpu::gpu_replies(*s.drafter, "draft-gpu"));
    }
    if (addresses.http) {
        http::http_options ho = http_options_from(cfg, *addresses.http, model, net_opts.limits);
        ho.net_counters = [&net = s.net] { return net->counters(); };
        ho.auth = auth;
        ho.metrics_require_key = cfg.http.metrics_require_key;
        ho.cors_allow_origins = cfg.http.cors_allow_origins;
        s.http.emplace(std::move(ho), cfg.server.mailbox_capacity);
    }
    return {};
}

// Tells each actor the peers it sends to.
void connect_actors(server_actors& s) {
    s.scheduler->connect(*s.net, *s.gpu);
    s.net->connect_scheduler(*s.scheduler);
    // The second front door: the scheduler routes the events of its connections to it by the
    // front door written in their conn ids (door/conn_ids.hpp).
    if (s.http) {
        s.scheduler->connect_front_door(door::door_kind::http, *s.http);
        s.http->connect_scheduler(*s.scheduler);
    }
    if (s.drafter) {
        s.scheduler->connect_drafter(*s.drafter);
        s.drafter->connect_gpu(*s.draft_gpu);
    }
    if (s.kv) {
        s.gpu->connect_kv(*s.staging, gpu::kv_copy_replies(*s.kv, "gpu"));
        s.kv->connect(*s.scheduler, *s.gpu);
        s.scheduler->connect_kv(*s.kv);
    }
}

// Start order: the scheduler before the net actor (nothing is forwarded to a stopped actor),
// the gpu last (its device_ready reaches a running scheduler). Stops at the first failure.
status start_actors(server_actors& s) {
    status started = s.scheduler->start();
    if (started.ok() && s.kv) started = s.kv->start();
    if (started.ok() && s.http) started = s.http->start();
    if (started.ok() && s.http && !s.http->listen_status().ok()) started = s.http->listen_status();
    if (started.ok()) started = s.net->start();
    if (started.ok() && !s.net->listen_status().ok()) started = s.net->listen_status();
    if (started.ok()) started = s.gpu->start();
    if (started.ok() && s.drafter) started = s.drafter->start();
    if (started.ok() && s.draft_gpu) started = s.draft_gpu->start();
    return started;
}

// SIGTERM: stop accepting, let in-flight requests finish within shutdown_grace_ms (the
// scheduler ends what is left with shutting_down when the grace is over), then stop.
void drain_actors(server_actors& s, const config::config& cfg) {
    uint64_t grace_ms = cfg.server.shutdown_grace_ms;
    actors::tell_status a = s.net->tell(door::begin_drain{}, "main");
    if (a.ok() && s.http) a = s.http->tell(door::begin_drain{}, "main");
    actors::tell_status b = s.scheduler->tell(sched::drain{grace_ms}, "main");
    if (!a.ok() || !b.ok()) {
        logger("main")->warn("drain not delivered ({}); stopping at once",
                             (!a.ok() ? a : b).err().message);
        return;
    }
    // The scheduler's own timer ends the drain after grace_ms; the margin covers the
    // terminal events' way out, and bounds this wait if the scheduler is stuck.
    constexpr uint64_t drain_margin_ms = 2000;
    auto done = s.drained.get_future();
    if (done.wait_for(std::chrono::milliseconds(grace_ms + drain_margin_ms)) !=
        std::future_status::ready) {
        logger("main")->warn("drain did not end within {} ms; stopping",
                             grace_ms + drain_margin_ms);
    }
}

// Scheduler first: every live request gets its terminal event (shutting_down) while the net
// actor can still write it; then the kv actor writes the saves in flight (its copies need the
// gpu actor), within kv.flush_ms_max; then the net actor flushes and closes connections; then
// the gpu actor waits out its running step. A failure to join is kept in first_failure unless
// one is there already.
void stop_actors(server_actors& s, const config::config& cfg, status& first_failure) {
    auto stop = [&](actors::actor_core& a) {
        a.request_stop();
        if (auto st = a.join(); !st.ok() && first_failure.ok()) first_failure = st;
    };
    stop(*s.scheduler);
    if (s.kv) {
        if (s.kv->running() && !s.kv->flush(cfg.kv.flush_ms_max)) {
            logger("main")->warn(
                "kv: saves not written within kv.flush_ms_max = {} ms are "
                "dropped",
                cfg.kv.flush_ms_max);
        }
        stop(*s.kv);
    }
    stop(*s.net);
    if (s.http) stop(*s.http);
    stop(*s.gpu);
    if (s.drafter) stop(*s.drafter);
    if (s.draft_gpu) stop(*s.draft_gpu);
}

// Runs the main loop until a signal has drained and stopped the actors, then closes it.
status serve_until_stopped(main_loop& m, server_actors& s, const config::config& cfg) {
    status first_failure;
    m.on_stop = [&] {
        drain_actors(s, cfg);
        stop_actors(s, cfg, first_failure);
    };
    uv_run(&m.loop, UV_RUN_DEFAULT);
    int rc = uv_loop_close(&m.loop);
    if (rc != 0 && first_failure.ok()) {
        first_failure = make_error("loop_leak", std::string("main loop: ") + uv_strerror(rc));
    }
    if (first_failure.ok()) logger("main")->info("stopped cleanly");
    return first_failure;
}

// The device gpu.device selects, as the probe sees it (no device is created).
config::device_facts probe_device(const config::config& cfg) {
    config::device_facts d;
    auto devices = gpu::device::list_devices();
    if (!devices.ok()) {
        d.why_not_found = devices.err().message;
        return d;
    }
    auto index = gpu::select_device(*devices, cfg.gpu.device);
    if (!index.ok()) {
        d.why_not_found = index.err().message;
        return d;
    }
    const gpu::device_candidate& c = (*devices)[*index];
    d.found = true;
    // What the device's pipeline tuning calls a GPU (gpu/vk/pipelines.cpp): anything but a CPU
    // device, so the scheduler's choice and the kernels' agree.
    d.gpu = c.kind != gpu::device_kind::cpu;
    d.name = c.name + " (" + std::string(gpu::device_kind_name(c.kind)) + ", " +
             std::to_string(c.device_local_bytes >> 20) + " MiB device-local)";
    d.device_local_bytes = c.device_local_bytes;
    return d;
}

uint64_t file_bytes(const std::string& path) {
    std::error_code ec;
    const uintmax_t n = std::filesystem::file_size(path, ec);
    return ec ? 0 : uint64_t(n);
}

// cfg with every 0 that means "the device's choice" resolved (actors/config/device_choices.hpp)
// for the device the gpu actor will build, said in one log line.
config::config with_device_choices(const config::config& given, const loaded_model& model,
                                   const loaded_model* draft) {
    config::config cfg = given;
    if (cfg.scheduler.max_sequences != 0 && cfg.gpu.kv_memory_bytes != 0) return cfg;
    const config::device_facts device = probe_device(cfg);
    config::model_facts m;
    m.weights_bytes = file_bytes(model.path) + (draft != nullptr ? file_bytes(draft->path) : 0);
    m.kv_block_bytes = kv_geometry_of(cfg, model.hp).block_bytes();
    m.draft_kv_block_bytes = draft != nullptr ? kv_geometry_of(cfg, draft->hp).block_bytes() : 0;
    m.n_ctx = model.n_ctx;
    const auto choices = config::resolve_device_choices(cfg, device, m);
    if (!choices.empty()) {
        logger("main")->info("the device's choice{}: {}", device.found ? " for " + device.name : "",
                             config::describe(choices));
    }
    return cfg;
}

}  // namespace

status run_server(const config::config& given, const loaded_model& model, const loaded_model* draft,
                  const server_hooks& hooks, const door::api_keys& keys) {
    const config::config cfg = with_device_choices(given, model, draft);
    auto addresses = read_listen_addresses(cfg);
    if (!addresses.ok()) return addresses.err();
    auto auth = open_auth_gate(keys, *addresses);
    main_loop m;
    start_signal_watchers(m);
    log_model(cfg, model, draft);

    server_actors s(cfg, model);
    if (status built = build_actors(s, cfg, model, draft, *addresses, auth); !built.ok()) {
        abandon(m);
        return built;
    }
    connect_actors(s);
    if (status started = start_actors(s); !started.ok()) {
        status ignored;
        stop_actors(s, cfg, ignored);
        abandon(m);
        return started;
    }
    if (s.http && hooks.on_http_listening) {
        hooks.on_http_listening(addresses->http->host, s.http->bound_port());
    }
    if (hooks.on_listening) hooks.on_listening(addresses->net.host, s.net->bound_port());
    return serve_until_stopped(m, s, cfg);
}

}  // namespace ordo
