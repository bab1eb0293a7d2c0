// scheduler_core.hpp: the scheduler's decisions, without the actor around them.
//
// Owns every request and sequence: the queue, the running set, the paged KV block table and
// prefix cache (kv_blocks), sampling, stop conditions, retry and fallback policy. It is the one
// place where a request's terminal event is decided: every request gets exactly one, `done`
// (stop | length | cancelled) or `error{code}`.
//
// The scheduler actor feeds it messages in arrival order and carries out what it returns:
// events to write to clients, and at most one gpu step in flight at a time. Because inputs are
// applied strictly in order, a step's outcome is always applied to the sequences in it before a
// later cancel or disconnect takes effect (ARCHITECTURE.md F2), and a failure invalidates the
// affected sequences completely — KV frontier, blocks, prefix-cache entries they produced — so
// they re-prefill from token 0 (F1). Failed batches are retried in isolation, bisected or
// sequentially by config, to find a poison request while the rest complete (F4, F6).
//
// Single-threaded: only the scheduler actor's loop calls it.
#pragma once

#include <algorithm>
#include <array>
#include <bitset>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "actors/config/config.hpp"
#include "actors/runtime/result.hpp"
#include "door/door_msgs.hpp"
#include "draft/draft_msgs.hpp"
#include "gpu/gpu_msgs.hpp"
#include "kv/kv_msgs.hpp"
#include "model/tokenizer.hpp"
#include "scheduler/drafter.hpp"
#include "scheduler/grammar_constraint.hpp"
#include "scheduler/kv_blocks.hpp"
#include "scheduler/sampling.hpp"
#include "scheduler/scheduler_msgs.hpp"
#include "scheduler/stop_matcher.hpp"

namespace ordo::sched {

// What the `model` op reports, filled in by the bootstrap from the loaded GGUF.
struct model_info {
    std::string path;
    std::string architecture;
    std::string fingerprint;
    uint32_t n_vocab = 0, n_ctx = 0, n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0, n_ff = 0;
    std::string weight_type;
    std::map<std::string, uint64_t> tensor_types;  // type name -> tensors of that type
    std::string context_bound;  // "trained" or "config": what set n_ctx before the device did
    std::string chat_template = "none";  // gguf | file:PATH | none (net/chat.hpp)
    bool generated = false;              // a random-weight model made by set-up, not a real one
    std::string hint;                    // how to point the server at a real GGUF (when generated)
};

// Speculative decoding ([speculative], docs/speculative.md).
struct speculative_options {
    config::speculative_mode mode = config::speculative_mode::off;
    uint32_t draft_tokens_max = 8;
    ngram_options ngram;
    uint32_t fallback_rounds = 8;  // verifications in a row without an accepted draft
    std::string draft_model;       // mode draft: the draft model's file (the model op says it)
};

// Why a request stopped speculating: its drafter failed (a draft_fail fault, or a draft
// model's failed step), or fallback_rounds verifications in a row accepted nothing. Either way
// it decodes on without speculation: a fallback never ends a request or changes its output.
enum class spec_fallback : uint8_t { drafter_error, no_acceptance };
inline constexpr std::array<std::string_view, 2> spec_fallback_names = {"drafter_error",
                                                                        "no_acceptance"};
constexpr const auto& names_of(spec_fallback) {
    return spec_fallback_names;
}
static_assert(static_cast<size_t>(spec_fallback::no_acceptance) + 1 == spec_fallback_names.size());

// Draft faults armed at most at once (the `fault` op's draft kinds; more is bad_request).
inline constexpr size_t draft_faults_armed_max = 16;

struct core_options {
    uint32_t max_sequences = 16;
    uint32_t max_queue = 256;
    uint32_t max_batch_tokens = 512;
    uint32_t max_tokens_default = 256;
    uint32_t retry_max = 2;
    config::batch_failure_policy policy = config::batch_failure_policy::bisect;
    bool prefix_cache = true;
    uint32_t n_ctx = 0;  // context the server allows (<= the model's)
    // KV persistence ([kv] enabled): disk lookups and restores at admission, saves at the end
    // of each request, sessions. restore_retry_max: failed restores (or failed steps right
    // after one) a request may follow with another disk lookup.
    bool kv_disk = false;
    uint32_t restore_retry_max = 1;
    // How long a request waits for the kv actor (its disk lookup and restore) before it stops
    // waiting and recomputes the prefix instead ([kv] restore_wait_ms): a slow or hung disk
    // delays a request by this much at most, never forever. A session_delete waits as long for
    // its answer, then gets a kv_io error.
    uint32_t restore_wait_ms = 10000;
    // Where the seeds of requests that give none come from (fresh_seed): 0 = the OS's entropy
    // mixed with the clock, so every server draws differently (OpenAI's, llama.cpp's and vLLM's
    // behaviour: regenerating samples afresh); tests set a value to replay the draws.
    uint64_t unseeded_source = 0;
    // How embed requests pool their final hidden states: the GGUF's pooling_type, else
    // model.embedding_pooling (the bootstrap decides; model/pooling.hpp).
    model::pooling pooling = model::pooling::mean;
    speculative_options speculative;
    // Decode iterations one step may run on the GPU back to back (scheduler.decode_steps,
    // resolved; gpu::step::decode_steps): 1 = every token goes through the scheduler. More
    // only for a step of decodes without penalties, grammars or drafts, with nothing waiting
    // (plan_decode_steps).
    uint32_t decode_steps = 1;
};

// A request to the kv actor, as the scheduler hands it over (kv/kv_msgs.hpp).
using kv_request = std::variant<kv::kv_lookup, kv::kv_restore, kv::kv_release, kv::kv_save,
                                kv::kv_invalidate, kv::kv_session_delete>;

// An event for a client, as the scheduler hands it to the front door.
using client_event = actors::variant_for<door::request_events>;
using outgoing_event = client_event;

// The request an event belongs to.
inline std::pair<uint64_t, uint64_t> request_of(const client_event& e) {
    return std::visit([](const auto& m) { return std::pair{m.conn, m.id}; }, e);
}

door::request_error error_event(uint64_t conn, uint64_t id, door::errc code, std::string message);

struct scheduler_counters {
    uint64_t requests = 0;  // generate requests accepted into the queue
    uint64_t tokens_generated = 0;
    uint64_t candidate_draws = 0;  // tokens drawn from the row summary's candidates alone
    // Decode iterations the GPU ran behind another in the same step (gpu::step::decode_steps:
    // a step of k iterations counts k - 1), without the host in between.
    uint64_t decode_iterations_ahead = 0;
    // Steps of several decode iterations the gpu actor ended before the last one: a sampled
    // draw needed a row of which only the summary is kept (gpu::step_draws), or the scheduler
    // asked (gpu::end_decode_steps).
    uint64_t decode_steps_ended_early = 0;
    // Of those, the steps the scheduler asked to end early (take_decode_steps_end) because a
    // request arrived that could be admitted, or one of theirs was cancelled.
    uint64_t decode_steps_ends_asked = 0;
    uint64_t prompt_tokens = 0;
    uint64_t cached_tokens = 0;
    uint64_t cancels = 0;
    uint64_t disconnects = 0;  // requests ended because their client went away
    uint64_t failures = 0;     // failed steps
    uint64_t retries = 0;      // sequence re-runs after a failed step
    uint64_t gpu_failed = 0;   // requests that ended with error{gpu_failed}
    uint64_t preemptions = 0;
    uint64_t steps = 0;
    uint64_t overloaded = 0;
    uint64_t device_epochs = 0;
    uint64_t handler_errors = 0;  // requests ended with error{internal} by a failed handler
    // KV persistence, as the scheduler sees it (the kv actor's own counters are kv_disk).
    uint64_t disk_lookups = 0;          // kv_lookup sent
    uint64_t disk_hits = 0;             // lookups that offered more than the memory cache
    uint64_t disk_restores = 0;         // restores that completed
    uint64_t disk_restored_tokens = 0;  // tokens they covered
    uint64_t disk_restore_failures = 0;
    uint64_t disk_restore_timeouts = 0;    // waits given up after restore_wait_ms (recomputed)
    uint64_t session_delete_timeouts = 0;  // session_deletes answered kv_io after restore_wait_ms
    uint64_t session_delete_late_answers = 0;  // the disk's answers to those, dropped
    uint64_t disk_invalidations = 0;           // entries quarantined after a failed step
    uint64_t disk_saves = 0;                   // kv_save sent
    uint64_t disk_evicted = 0;                 // kv_evicted received
    uint64_t session_busy = 0;
    uint64_t net_faults = 0;        // net fault points fired (the `fault` op's net kinds)
    uint64_t embeddings = 0;        // embed requests accepted into the queue
    uint64_t embedding_tokens = 0;  // their input tokens
    // Speculative decoding: verifications (a sequence's decode with drafted tokens), the
    // tokens drafted into them, those the model's own draws confirmed, and the requests that
    // stopped speculating, by reason.
    uint64_t spec_rounds = 0;
    uint64_t spec_drafted = 0;
    // With a draft model: drafting rounds asked of it, and those that failed (an error, a
    // refusal, no answer in time).
    uint64_t spec_draft_rounds = 0;
    uint64_t spec_draft_rounds_failed = 0;
    uint64_t spec_accepted = 0;
    std::array<uint64_t, enum_count<spec_fallback>> spec_fallbacks{};
};

// Net fault points armed at most at once (the `fault` op's net kinds; more is bad_request).
inline constexpr size_t net_faults_armed_max = 16;

// session_deletes waiting for the kv actor at most at once (more get an overloaded error): each
// costs a few words until its answer or restore_wait_ms.
inline constexpr size_t session_deletes_waiting_max = 256;

// The stats op's `gpu` map (docs/protocol.md): the device as the gpu actor announced it at its
// last device_ready, and what the scheduler saw of its steps.
struct gpu_view {
    gpu::device_summary device;
    uint64_t epoch = 0;  // device rebuilds so far (0 = the first start)
    uint64_t steps = 0;  // steps that ran
    double busy_ms = 0;  // their submit-to-fence time, summed
    // Where a loaded server's GPU waits (issue 29): the wall time of the steps that ran, from
    // the scheduler sending each to its outcome arriving (run_ms plus the messages' hops),
    // summed; and the time from a step's outcome arriving to the next step being sent, for
    // each step the outcome's own handler sent (back to back: sampling, events, planning; a
    // step that waited for work or for a draft round is not one), summed, with their count.
    double step_wall_ms = 0;
    double between_steps_ms = 0;
    uint64_t back_to_back_steps = 0;
    double run_ms = 0;      // the gpu actor's worker in run_step (step_done::run_ms), summed
    uint64_t segments = 0;  // the steps' command-buffer segments (step_done::segments)
    uint64_t segments_replayed = 0;  // of them, replayed from a kept recording
    uint64_t timeouts = 0;           // failed steps: gpu_timeout (watchdog)
    uint64_t device_lost = 0;        // failed steps: gpu_device_lost
    uint64_t nan_logits = 0;         // failed steps: gpu_nan
    uint64_t other_failures = 0;     // failed steps: any other code
    MSGPACK_DEFINE_MAP(device, epoch, steps, busy_ms, step_wall_ms, between_steps_ms,
                       back_to_back_steps, run_ms, segments, segments_replayed, timeouts,
                       device_lost, nan_logits, other_failures);
};

class scheduler_core {
public:
    using clock = std::chrono::steady_clock;

    static result<scheduler_core> create(const core_options& options,
                                         const model::tokenizer* tokenizer, model_info info);

    // ---- inputs, applied in arrival order ----
    void on_generate(const generate& m, std::vector<outgoing_event>& out);
    void on_embed(const embed& m, std::vector<outgoing_event>& out);
    // What every new request (generate, embed) is refused for before its own checks: a
    // draining server, an id already live on its connection, an unavailable device.
    std::optional<door::request_error> refusal_at_admission(uint64_t conn, uint64_t id);
    // A draining server's answer to a new request (a generate, an embed, a session_delete).
    door::request_error draining_refusal(uint64_t conn, uint64_t id) const;
    void on_cancel(const cancel& m, std::vector<outgoing_event>& out);
    void on_tokenize(const tokenize& m, std::vector<outgoing_event>& out);
    void on_detokenize(const detokenize& m, std::vector<outgoing_event>& out);
    void on_stats(const stats_query& m, std::vector<outgoing_event>& out);
    void on_model(const model_info_query& m, std::vector<outgoing_event>& out);
    void on_client_gone(const client_gone& m, std::vector<outgoing_event>& out);
    void on_device_ready(const gpu::device_ready& m, std::vector<outgoing_event>& out);
    void on_device_unavailable(const gpu::device_unavailable& m, std::vector<outgoing_event>& out);
    // How far the device build under way is: health's "loading" reason says it.
    void on_device_progress(const gpu::device_progress& m);
    // `row(i)` returns the logits of step_done.rows[i], `hidden_row(i)` the hidden row of
    // step_done.hidden_rows[i].
    using row_reader = std::function<std::span<const float>(uint32_t)>;
    // `summary(i)`: the summary words of step_done.rows[i] (logits_exchange::read_summary);
    // empty (no reader): the rows come without summaries and are sampled over the vocabulary.
    using summary_reader = std::function<std::span<const uint32_t>(uint32_t)>;
    void on_step_done(const gpu::step_done& m, const row_reader& row, const row_reader& hidden_row,
                      std::vector<outgoing_event>& out, const summary_reader& summary = {});
    void on_step_failed(const gpu::step_failed& m, std::vector<outgoing_event>& out);
    void on_session_delete(const session_delete& m, std::vector<outgoing_event>& out);
    // The kv actor's answers (kv_msgs.hpp).
    void on_kv_lookup_done(const kv::kv_lookup_done& m, std::vector<outgoing_event>& out);
    void on_kv_restore_done(const kv::kv_restore_done& m, std::vector<outgoing_event>& out);
    void on_kv_save_done(const kv::kv_save_done& m);
    void on_kv_evicted(const kv::kv_evicted& m);
    void on_kv_status(const kv::kv_status& m);
    void on_kv_session_deleted(const kv::kv_session_deleted& m, std::vector<outgoing_event>& out);
    // The earliest instant a request waiting for the kv actor passes restore_wait_ms (none:
    // nobody waits). The actor's timer calls expire_restores then.
    std::optional<std::chrono::steady_clock::time_point> restore_deadline() const;
    // Every request that has waited restore_wait_ms by `now` stops waiting and recomputes
    // (scheduler_kv.cpp): a late answer finds it gone from `restoring` and only releases what
    // the kv actor held for it.
    void expire_restores(std::chrono::steady_clock::time_point now);
    // The earliest instant a session_delete waiting for the kv actor passes restore_wait_ms
    // (none: none waits), and expiring them: each late one is answered with a kv_io error
    // (whether the file went is unknown), and its answer, if it ever comes, is dropped.
    std::optional<std::chrono::steady_clock::time_point> session_delete_deadline() const;
    void expire_session_deletes(std::chrono::steady_clock::time_point now,
                                std::vector<outgoing_event>& out);
    // What to send the kv actor, in order (taken after every input).
    std::vector<kv_request> take_kv_requests() { return std::exchange(_kv_out, {}); }
    // Net fault points (kinds net_fin, net_rst, net_stop_reading; spec.net_phase the request
    // phase; spec.count requests; spec.delay_ms the pause). Fired when a request reaches the
    // phase (at most once per request and phase): what fired is taken after every input and
    // every planned step, and sent to the net actor after the events made before it. Error:
    // net_faults_armed_max are armed already.
    status arm_net_fault(const fault_spec& spec);
    std::vector<door::net_fault> take_net_faults() { return std::exchange(_net_fired, {}); }
    // Draft faults (kinds draft_fail, draft_garbage, draft_eos; spec.count drafting rounds):
    // each fires at the next round a speculating sequence drafts in, in arming order. Error:
    // speculation is off, or draft_faults_armed_max are armed already.
    status arm_draft_fault(const fault_spec& spec);
    // The draft model (speculative mode draft): whether the draft actor can take rounds, and a
    // round's answer. A round's failure (its error, the actor's bound on the wait, a refused
    // send) sends its sequences back to plain decoding.
    void on_drafter_state(const draft::drafter_state& m);
    void on_draft_reply(const draft::draft_reply& m);
    void draft_round_failed(uint64_t round, const std::string& why);
    // What to send the draft actor (taken after every planned step): the round next_step()
    // started instead of a step (it waits for the answer), and the sequences it may forget.
    std::optional<draft::draft_request> take_draft_request() {
        return std::exchange(_draft_out, {});
    }
    std::vector<uint64_t> take_draft_forgets() { return std::exchange(_draft_forget, {}); }
    // The step in flight, once, when it runs several decode iterations (plan_decode_steps) whose
    // later ones would keep someone waiting: a queued request a sequence is free for, or one of
    // its requests cancelled. The actor asks the gpu actor to end it after the iteration that
    // runs (gpu::end_decode_steps); taken after every input.
    std::optional<uint64_t> take_decode_steps_end();
    uint64_t draft_round_in_flight() const { return _draft_round ? _draft_round->id : 0; }
    // Decisions worth a log line (a fallback, a draft fault fired), taken after every input
    // and every planned step.
    std::vector<std::string> take_notes() { return std::exchange(_notes, {}); }
    // Ends every live request (server stopping): error{shutting_down}.
    void shutdown(std::vector<outgoing_event>& out);
    // The server is draining: new generate requests are refused with shutting_down; live ones
    // go on until shutdown().
    void begin_drain() { _draining = true; }
    // A handler failed on this request: it ends with error{internal} (when it was registered,
    // it sends nothing more).
    void abort_request(uint64_t conn, uint64_t id, const std::string& why,
                       std::vector<outgoing_event>& out);

    // ---- outputs ----
    // The next step to send, when the device is ready, no step is in flight and there is work.
    std::optional<gpu::step> next_step();
    bool step_in_flight() const { return _in_flight.has_value(); }
    uint64_t in_flight_step_id() const { return _in_flight ? _in_flight->step_id : 0; }

    // Health as the scheduler sees it: loading, ok or degraded (+ reason).
    std::pair<door::health_status, std::string> health() const;
    const scheduler_counters& counters() const { return _counters; }
    size_t active_sequences() const { return _running.size(); }
    size_t queued_requests() const { return _queue.size(); }
    // Requests owed a terminal event: generates and embeds, and session_deletes waiting for the
    // disk (a drain waits for them too; shutdown answers what is left).
    size_t live_requests() const { return _requests.size() + _deletes.size(); }
    kv_blocks_stats kv_stats() const;
    // Test hook: every structure consistent (kv invariants, indexes, exactly-once bookkeeping).
    status check_invariants() const;

private:
    // restoring: admitted, waiting for the kv actor (a lookup, then a restore); holds its
    // sequence and, during a restore, a pin on the blocks being written.
    enum class phase { queued, restoring, running };

    struct request_state {
        uint64_t conn = 0, id = 0;
        seq_id seq = 0;
        generate_request params;
        std::optional<sampler> smp;
        std::optional<grammar_constraint> grammar;  // the request's grammar, if it gave one
        std::optional<stop_matcher> stops;
        std::optional<model::stream_decoder> decoder;  // none: the tokenizer is unsupported
        std::vector<int32_t> tokens;                   // prompt, then every generated token
        uint32_t n_prompt = 0;
        uint32_t n_past = 0;  // tokens whose KV is in the pool (the prefill frontier)
        uint32_t cached_tokens = 0;
        std::vector<int32_t> generated;
        std::string text;                        // emitted text (what token events carried)
        std::vector<door::token_info> logprobs;  // non-stream logprobs, per token
        phase ph = phase::queued;
        bool in_kv = false;  // registered in _kv
        bool cancel_requested = false;
        bool client_gone = false;
        bool detached = false;      // aborted inside a running step: no longer in _by_client
        bool disk_checked = false;  // a disk lookup was made for this admission
        clock::time_point
            restore_due{};  // phase restoring: when it stops waiting (restore_wait_ms)
        uint32_t restore_failures = 0;
        uint32_t restore_to = 0;      // tokens covered once the restore in flight is done
        std::string restored_from;    // entry restored, until a step confirms it
        uint32_t retries = 0;         // failures while running alone
        uint32_t batch_failures = 0;  // failures while batched with others
        clock::time_point submitted, first_step, first_token, last_token;
        bool started = false, has_first_token = false;
        std::bitset<enum_count<request_phase>> phases_reached;  // net fault points
        // An embed request: how its hidden states pool. It generates nothing (max_tokens 0),
        // never takes cached or restored KV (every token's hidden state is computed), and
        // ends with embed_done once its whole input has run.
        std::optional<model::pooling> embed;
        std::vector<double> pooled;  // (n_embd) embed: its hidden rows added up so far
        // Speculative decoding: its decodes carry drafts while `speculating` (the server
        // speculates, the request did not opt out, it is not an embedding, no fallback ended
        // it); verifications in a row that kept no draft.
        bool speculating = false;
        uint32_t rounds_unaccepted = 0;
        // Drafts it asks for next, at most (1..draft_tokens_max): two more after a
        // verification that kept every draft, one fewer after one that did not, so a sequence
        // whose drafts miss spends less of each step on them (the output is the same).
        uint32_t draft_len = 0;
        // With a draft model: the tokens the draft actor holds (a round sends the rest), the
        // drafts it answered and the length of `tokens` they follow (they are used only while
        // it is still the length), and whether any round named it (it is forgotten there at
        // the end).
        uint32_t draft_known = 0;
        std::vector<int32_t> drafts_ready;
        size_t drafts_for = 0;
        bool draft_told = false;
    };

    struct planned {
        seq_id seq = 0;
        uint32_t n_tokens = 0;  // of the sequence's own tokens (drafts come after them)
        uint32_t logits_rows = 0;
        gpu::hidden_output hidden = gpu::hidden_output::none;
        std::vector<int32_t> drafts;  // a verification's drafted tokens
    };
    std::optional<gpu::step> plan_next_step();  // next_step without its timing
    struct in_flight_step {
        uint64_t step_id = 0;
        std::vector<planned> seqs;
        bool isolated = false;
        uint32_t decode_steps = 1;  // gpu::step::decode_steps
        bool end_asked = false;     // take_decode_steps_end() named it
        clock::time_point sent{};   // when next_step handed it out
    };

    scheduler_core(const core_options& o, const model::tokenizer* t, model_info info);

    // requests (scheduler_core.cpp)
    result<std::vector<int32_t>> prompt_tokens(const generate_request& g) const;
    // A rendered chat's ids: control-token text parsed, BOS added unless the text begins with it.
    std::vector<int32_t> chat_tokens(const std::string& text) const;
    // error{tokenizer_unsupported}: `what` (an op, "a text prompt", "stop strings") needs the
    // tokenizer, which ordo cannot run for this model (tokenizer::support()).
    door::request_error tokenizer_error(uint64_t conn, uint64_t id, const std::string& what) const;
    // Whether a sequence of `tokens` positions can ever fit the whole KV pool.
    bool fits_pool(uint64_t tokens) const;
    std::string pool_message(uint64_t tokens) const;

    // planning (scheduler_plan.cpp)
    bool admit(request_state& r);
    bool reserve_or_preempt(request_state& r, uint32_t n_tokens,
                            const std::vector<seq_id>& in_step);
    void preempt(request_state& r);
    // Releases r's KV blocks (r.in_kv: its sequence is registered, check_invariants), so the
    // release cannot fail; r is no longer in the pool.
    void free_kv(request_state& r);
    // r's next n_tokens tokens join step s, followed by `drafts` (a verification: logits rows
    // for the last token and every draft).
    void add_to_step(request_state& r, uint32_t n_tokens, gpu::step& s, in_flight_step& f,
                     std::vector<int32_t> drafts = {});
    // speculation (scheduler_speculate.cpp)
    // How many tokens r may draft into a step with `budget` tokens and `rows` logits rows left:
    // what fits them, its draft_len, and what r can still generate and place in its context.
    uint32_t draft_room(const request_state& r, uint32_t budget, uint32_t rows) const;
    // r's drafts for its next decode (up to `max`; empty when it does not speculate, nothing
    // matches or its drafter failed), armed draft faults applied.
    std::vector<int32_t> draft_for(request_state& r, uint32_t max);
    // A verification's outcome: row row0 + i holds the logits after the step's token i; each
    // row is sampled as plain decoding would, and a drafted token is kept while it equals the
    // token drawn. Ends at the first draft that differs (the token drawn there is the output),
    // at the last row, or when the request ends.
    void verify(request_state& r, const planned& p, uint32_t row0, const row_reader& row,
                const summary_reader& summary, std::vector<outgoing_event>& out);
    void stop_speculating(request_state& r, spec_fallback why, const std::string& detail = "");
    // Starts a drafting round (draft model) for the decoding sequences whose drafts are not
    // ready yet; false when none needs one.
    bool start_draft_round();
    std::optional<gpu::step> launch(gpu::step s, in_flight_step f);
    std::optional<gpu::step> plan_isolated();
    std::optional<gpu::step> plan_batch();
    // Makes the planned step run several decode iterations on the GPU where it may.
    void plan_decode_steps(gpu::step& s, in_flight_step& f);
    // A queued request has a sequence free for it (whether the KV pool takes it or not): a step
    // of several decode iterations would keep it waiting.
    bool queued_request_has_a_sequence() const {
        return !_queue.empty() && _running.size() + _restoring.size() < _opt.max_sequences;
    }

    // embeddings (scheduler_embed.cpp)
    gpu::hidden_output hidden_for(const request_state& r, uint32_t n_tokens) const;
    // A step's outcome for an embed request: its hidden row (when it asked for one) added to
    // the accumulator (`start`: where the chunk began; 0 clears it first: a recompute), and
    // embed_done once the whole input has run. A missing or wrong-width row: error internal.
    void apply_embed_step(request_state& r, const planned& p, uint32_t start,
                          const gpu::step_done& m, const row_reader& hidden_row,
                          std::vector<outgoing_event>& out);
    // Its whole input has run: embed_done with the normalized vector.
    void finish_embed(request_state& r, std::vector<outgoing_event>& out);

    // outcomes (scheduler_outcomes.cpp)
    // The row's logits of the tokenizer's vocabulary (a padded output head's extra ids cut).
    std::span<const float> vocab_logits(std::span<const float> logits) const;
    // `summary`: the row's summary words (empty: none). `logits` empty: a decode iteration the
    // GPU ran ahead whose row came back as its summary alone (apply_decode_steps), of
    // `row_vocab` entries; the request draws from it alone (sampler::sample_summarized).
    void apply_token(request_state& r, std::span<const float> logits,
                     std::span<const uint32_t> summary, std::vector<outgoing_event>& out,
                     uint32_t row_vocab = 0);
    // A step of several decode iterations (gpu::step::decode_steps), applied to each sequence
    // as that many steps of one token.
    void apply_decode_steps(const in_flight_step& f, const gpu::step_done& m, const row_reader& row,
                            const summary_reader& summary, std::vector<outgoing_event>& out);
    void finish(request_state& r, door::finish_reason reason, std::vector<outgoing_event>& out,
                const std::string& stop_string = "");
    void fail(request_state& r, door::errc code, const std::string& message,
              std::vector<outgoing_event>& out);
    void reset_for_recompute(request_state& r);
    void remove(request_state& r);
    void requeue_front(std::vector<seq_id> seqs);
    void isolate(std::vector<seq_id> seqs);
    // KV persistence (scheduler_kv.cpp)
    bool wants_disk(const request_state& r) const;
    void start_disk_lookup(request_state& r);
    void restored_to_running(request_state& r);
    void save_to_disk(request_state& r);
    void restore_step_failed(request_state& r, const std::string& why);

    // A request reached a phase: fires an armed net fault point for it.
    void reach_phase(request_state& r, request_phase phase);

    // The request's grammar constraint, or a bad_request message (also when the model has no
    // usable tokenizer: a grammar constrains text).
    result<grammar_constraint> make_grammar(const std::string& source,
                                            const std::vector<std::string>& triggers);

    request_state* find(seq_id seq);
    request_state* find(uint64_t conn, uint64_t id);

    core_options _opt;
    const model::tokenizer* _tok;
    model_info _info;
    // The vocabulary's side of grammars: built on the first request with one (a trie of every
    // token's bytes: once per model, then shared by every grammar request).
    std::unique_ptr<grammar_vocab> _grammar_vocab;
    std::optional<kv_blocks> _kv;  // created at the first device_ready (pool size from gpu)
    std::map<seq_id, request_state> _requests;                   // every live generate request
    std::map<std::pair<uint64_t, uint64_t>, seq_id> _by_client;  // (conn, id) → seq
    std::deque<seq_id> _queue;                                   // waiting, FIFO
    std::vector<seq_id> _restoring;                              // waiting for the kv actor
    // session_deletes waiting for the kv actor, oldest first (their waits are all
    // restore_wait_ms, so their deadlines are in order); at most session_deletes_waiting_max.
    struct delete_wait {
        uint64_t conn = 0, id = 0;
        uint64_t ticket = 0;  // kv_session_delete::ticket
        clock::time_point due{};
    };
    std::deque<delete_wait> _deletes;
    uint64_t _next_delete_ticket = 1;
    std::map<seq_id, pin_id> _restore_pins;  // restores in flight
    // Pins of the saves in flight (kv_save until kv_save_done). Dropped with the pool's contents
    // (device lost or rebuilt): a later answer then has nothing to release.
    std::set<pin_id> _save_pins;
    std::map<std::string, seq_id> _sessions;  // live session -> request
    std::vector<kv_request> _kv_out;
    std::vector<fault_spec> _net_armed;       // net fault points armed, in arming order
    std::vector<door::net_fault> _net_fired;  // fired, not yet taken
    struct draft_fault {
        fault_kind kind;
        uint32_t rounds_left = 0;
    };
    std::vector<draft_fault> _draft_armed;      // in arming order
    uint64_t _garbage_state = 0x6472616674ull;  // splitmix64 state of draft_garbage's tokens
    // The draft model's side: whether its actor takes rounds, the round in flight (at most one:
    // no step is planned until it is answered), what is still to send.
    bool _drafter_ready = false;
    uint32_t _drafter_n_ctx = 0;              // positions the draft model reaches (0: not said)
    std::string _drafter_reason = "loading";  // the last drafter_state's reason
    struct draft_round {
        uint64_t id = 0;
        std::vector<seq_id> seqs;
        clock::time_point started;
    };
    std::optional<draft_round> _draft_round;
    std::optional<draft::draft_request> _draft_out;
    std::vector<uint64_t> _draft_forget;
    uint64_t _next_draft_round = 1;
    std::vector<std::string> _notes;
    std::string _kv_reason;                      // persistence off: why
    std::vector<seq_id> _running;                // admission order, oldest first
    std::deque<std::vector<seq_id>> _isolation;  // groups to run alone (F4)
    std::optional<in_flight_step> _in_flight;
    // When the last step's outcome arrived, until the next next_step (gpu_view's
    // between_steps_ms).
    std::optional<clock::time_point> _outcome_at;
    seq_id _next_seq = 1;
    // splitmix64 state of the seeds drawn for requests without one (core_options::
    // unseeded_source); each seed drawn is reported in the request's done event.
    uint64_t _seed_state = 0;
    uint64_t fresh_seed();
    uint64_t _next_step = 1;
    bool _device_ready = false;
    bool _device_unavailable = false;
    bool _draining = false;
    gpu_view _gpu;
    uint32_t _device_n_ctx = 0;                 // device_ready's context (0: not stated)
    std::string _device_n_ctx_bound;            // and the bound that set it
    uint64_t _weight_bytes = 0, _kv_bytes = 0;  // device memory, as device_ready said
    // The context requests must fit: the configured one, or the device's where it is shorter.
    uint32_t n_ctx() const {
        return _device_n_ctx != 0 ? std::min(_opt.n_ctx, _device_n_ctx) : _opt.n_ctx;
    }
    // The bound that set n_ctx() (runner: context_bound_name).
    const std::string& n_ctx_bound() const {
        return _device_n_ctx != 0 && _device_n_ctx < _opt.n_ctx ? _device_n_ctx_bound
                                                                : _info.context_bound;
    }
    std::string _unavailable_reason;
    std::string _build_progress;  // the last device_progress, as health's reason says it
    uint32_t _rows_max = 0;
    uint32_t _decode_rows_max = 0;  // device_ready::decode_rows_max (at least _rows_max)
    scheduler_counters _counters;
    // Latency and size histograms of the stats op (door_msgs.hpp stats_report::histograms).
    // Bounds: seconds from 1 ms to 60 s (CPU devices are slow, GPUs fast), tokens from 1 to
    // 128 Ki, each about 2.5x the last.
    struct latency_histograms {
        door::histogram ttft{
            {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
        door::histogram inter_token{
            {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}};
        door::histogram duration{
            {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}};
        door::histogram prompt_tokens{{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 131072}};
        door::histogram completion_tokens{{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 131072}};
        // Each verification's drafted tokens kept, as a fraction of those drafted.
        door::histogram spec_acceptance{{0, 0.25, 0.5, 0.75, 0.99, 1}};
        // Each drafting round's time with a draft model, asked to answered (the steps wait).
        door::histogram spec_draft_round{
            {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}};
    } _histograms;
};

}  // namespace ordo::sched
