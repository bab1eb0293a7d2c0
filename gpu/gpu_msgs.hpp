// gpu_msgs.hpp: the messages the gpu actor accepts (first) and the ones it sends back to the
// scheduler. The scheduler is the only sender of steps; replies go to it through the gpu
// actor's delivery (bounded, ordered; a step_done that cannot be delivered releases its slot).
//
// Logits never travel in messages: the gpu actor writes them into a shared host-side
// logits_exchange slot (gpu/logits/logits_exchange.hpp) and step_done names the slot; the scheduler
// reads the rows and releases the slot. KV-cache bytes never travel in messages either: a
// kv_copy_out / kv_copy_in names a kv_staging slot (gpu/logits/kv_staging.hpp) its sender holds.
#pragma once

#include <array>
#include <cstdint>
#include <msgpack.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "actors/runtime/actor.hpp"
#include "actors/runtime/enum_names.hpp"
#include "actors/runtime/fault_kind.hpp"
#include "gpu/vk/gpu_failure.hpp"

namespace ordo::gpu {

// What a sequence of a step returns of its final hidden states (the residual stream after the
// output norm, before the classifier: what embeddings pool), as one hidden row of n_embd floats
// in the step's exchange slot. The scheduler pools over a whole input across prefill chunks:
// the sum of each chunk (mean), the last chunk's last token (last), the first chunk's first
// token (cls).
enum class hidden_output : uint8_t {
    none,
    sum,    // the sum over every token of `tokens`
    last,   // the last token's
    first,  // the first token's
};

// What a step runs: prompt chunks (prefill: a sequence with more than one token), single tokens
// (decode), or both (mixed); verify: a step with a speculative verification (a sequence's
// pending token and its drafts, logits for each), whatever else it holds. It labels the step's
// segments and selects armed faults.
enum class step_phase : uint8_t { prefill, decode, mixed, verify };
inline constexpr std::array<std::string_view, 4> step_phase_names = {"prefill", "decode", "mixed",
                                                                     "verify"};
constexpr const auto& names_of(step_phase) {
    return step_phase_names;
}
static_assert(static_cast<std::size_t>(step_phase::verify) + 1 == step_phase_names.size());

// How a step of several decode iterations (step::decode_steps) draws a sequence's token between
// two of them (step_draws.hpp). No generator state: greedy, the row's greedy token. Else a copy
// of the request's sampler (sched::sampler::resume: these filters, no penalty, its generator's
// state before the step) draws it from what the scheduler keeps of the iteration.
struct step_draw {
    float temperature = 0.0f;
    int32_t top_k = 0;
    float top_p = 1.0f;
    float min_p = 0.0f;
    std::vector<uint64_t> rng;  // the generator's four words (sched::sampler::rng_state); empty
    MSGPACK_DEFINE_MAP(temperature, top_k, top_p, min_p, rng);
};

// One sequence's part of a step.
struct step_seq {
    uint64_t seq_id = 0;                // scheduler's sequence id (echoed in replies)
    std::vector<int32_t> tokens;        // the new tokens to run (prefill chunk or 1 for decode)
    uint32_t pos0 = 0;                  // position of tokens[0]; KV for [0, pos0) is in the pool
    std::vector<uint32_t> block_table;  // pool blocks covering positions [0, pos0 + tokens.size())
    // Return logits rows for the last logits_rows tokens, in token order (0: none; decode and a
    // prompt's last chunk: 1; a speculative verification: its pending token and its drafts).
    uint32_t logits_rows = 0;
    hidden_output hidden = hidden_output::none;  // return a hidden row (embeddings)
    // The sampling temperature of the sequence's logits rows: each row's summary (step_done)
    // carries its normaliser at this temperature too (0: none; finite, at least 0).
    float temperature = 0.0f;
    step_draw draw;  // a step of decode_steps > 1: how its next tokens are drawn
    MSGPACK_DEFINE_MAP(seq_id, tokens, pos0, block_table, logits_rows, hidden, temperature, draw);
};

// Decode iterations one step may run (step::decode_steps), at most.
inline constexpr uint32_t decode_steps_max = 16;
// step::end_tokens, at most (a vocabulary's end-of-generation set is a handful of ids).
inline constexpr uint32_t end_tokens_max = 256;

// scheduler → gpu: run one forward step over a batch. Reply: step_done or step_failed, exactly
// one, with the same step_id.
struct step {
    static constexpr const char* msg_name = "step";
    uint64_t step_id = 0;
    step_phase phase = step_phase::decode;  // for labels and fault targeting
    std::vector<step_seq> seqs;
    // The logits rows' summaries cover their first sample_vocab entries (the tokenizer's
    // vocabulary, which a model's output head may pad); 0 or more than a row: the whole row.
    uint32_t sample_vocab = 0;
    // Decode iterations this step runs back to back, 1..decode_steps_max. More than 1 (a
    // decode step, every sequence one token with one logits row and no hidden row, their rows
    // times decode_steps at most device_ready::decode_rows_max): iteration i + 1 runs each
    // sequence's draw from iteration i (step_seq::draw: greedy's token, or its sampler's) at the
    // next position, without the host in between; the block tables cover every iteration's
    // positions. The step ends early, after iteration i, when a sampled draw from iteration i needs
    // the row that only its summary will stand for, when one is of end_tokens, or when
    // end_decode_steps asks. step_done says how many ran, what was drawn (draws) and where each
    // iteration's rows are (decode_row).
    uint32_t decode_steps = 1;
    // A step of several decode iterations also ends after an iteration in which a sequence drew
    // one of these (the scheduler sends the end-of-generation ids while a request waits for a
    // busy sequence: the sequence whose request ends there frees at once); at most
    // end_tokens_max.
    std::vector<int32_t> end_tokens;
    MSGPACK_DEFINE_MAP(step_id, phase, seqs, sample_vocab, decode_steps, end_tokens);
};

// scheduler → gpu: end step `step_id`, a step of several decode iterations, after the iteration
// that runs when this arrives (or after its first, if it has not begun): a request arrived that
// could be admitted, or one of its requests was cancelled, and its later iterations would keep
// them waiting. step_done then says how many ran (step_done::decode_steps). Best effort (tell):
// one refused costs only the wait it would have saved; a step done or of one iteration ignores it.
struct end_decode_steps {
    static constexpr const char* msg_name = "end_decode_steps";
    uint64_t step_id = 0;
    MSGPACK_DEFINE_MAP(step_id);
};

// Where row r (of `rows`, one per sequence, in step_done::rows order) of decode iteration
// `iteration` (of `iterations`) is in step_done's slot: the last iteration's rows first (where
// the device writes each iteration's), the earlier iterations' after them in order.
constexpr uint32_t decode_row(uint32_t iteration, uint32_t iterations, uint32_t rows, uint32_t r) {
    return (iteration + 1 == iterations ? 0 : (iteration + 1) * rows) + r;
}

// scheduler → gpu: rebuild the device (a step went unanswered past the scheduler's backstop,
// so the device is not trusted). Queued steps fail with device_lost; the rebuild ends with
// device_ready{epoch + 1}, or device_unavailable. While a step runs, the rebuild follows it.
// While a build is already under way it is that build's device_ready that answers.
struct reset_device {
    static constexpr const char* msg_name = "reset_device";
    std::string reason;
    MSGPACK_DEFINE_MAP(reason);
};

// fault harness (through the scheduler/net) or the config's fault plan (the scheduler) → gpu:
// arm a fault that goes through the real failure path. kind: one of the gpu kinds
// (is_gpu_fault: device_lost, hang, nan_logits, step_delay). Matches when the step number
// (counting from 1 after arming), phase (none = any) and layer (-1 = any) agree. No reply,
// except fault_refused for a planned fault (plan_step != 0) that cannot be armed.
struct inject_fault {
    static constexpr const char* msg_name = "inject_fault";
    fault_kind kind = fault_kind::device_lost;
    std::optional<step_phase> phase;
    int32_t layer = -1;
    uint32_t after_steps = 0;  // 0 = the next matching step
    uint32_t count = 1;        // how many matching steps fail (step_delay: are delayed)
    uint32_t delay_ms = 0;  // step_delay: how long each matching step (each decode iteration) waits
    uint64_t plan_step = 0;  // armed by the fault plan for this step id; 0 = by the `fault` op
    MSGPACK_DEFINE_MAP(kind, phase, layer, after_steps, count, delay_ms, plan_step);
};

// scheduler or kv actor → gpu: copy the pool blocks `blocks` (in order) into the held
// kv_staging slot `staging_slot` (layout: runner.hpp read_kv_blocks), in one submission. Runs on
// the same FIFO as steps: after every step sent before it, before every step sent after it (so
// a copy-out finishes before a later step reuses its blocks). A copy whose epoch is not the
// device's current one is refused (gpu_stale_epoch): its block ids name a pool that was lost
// and rebuilt since its sender chose them. Reply: kv_copy_done or
// kv_copy_failed, exactly one, with the same job_id, to the receiver bound by connect_kv. The
// slot stays held by the sender, who reads it after the reply and releases it.
struct kv_copy_out {
    static constexpr const char* msg_name = "kv_copy_out";
    uint64_t job_id = 0;
    std::vector<uint32_t> blocks;
    uint32_t staging_slot = 0;
    uint64_t epoch = 0;  // the device epoch the block ids belong to (device_ready.epoch)
    MSGPACK_DEFINE_MAP(job_id, blocks, staging_slot, epoch);
};

// scheduler or kv actor → gpu: copy the held kv_staging slot `staging_slot` (filled by the
// sender) into the pool blocks `blocks`, each named once, in one submission. Same FIFO, reply
// and slot rules as kv_copy_out.
struct kv_copy_in {
    static constexpr const char* msg_name = "kv_copy_in";
    uint64_t job_id = 0;
    std::vector<uint32_t> blocks;
    uint32_t staging_slot = 0;
    uint64_t epoch = 0;  // the device epoch the block ids belong to (device_ready.epoch)
    MSGPACK_DEFINE_MAP(job_id, blocks, staging_slot, epoch);
};

// ---- replies (gpu → scheduler) ----------------------------------------------------------

// A planned inject_fault (plan_step != 0) was not armed: the fault plan already holds
// armed_faults::armed_max faults, or the fault is malformed. The step it was armed for runs
// without it; the scheduler counts it as not fired.
struct fault_refused {
    static constexpr const char* msg_name = "fault_refused";
    uint64_t plan_step = 0;
    fault_kind kind = fault_kind::device_lost;
    std::string message;
    MSGPACK_DEFINE_MAP(plan_step, kind, message);
};

// The step ran. Row i of `slot` holds the logits of `rows[i]` (the sequences that asked, a
// sequence once per row it asked for, its rows in token order) and their summary
// (logits_exchange::read_summary), hidden
// row i the hidden output of `hidden_rows[i]` (logits_exchange::read_hidden_row).
struct step_done {
    static constexpr const char* msg_name = "step_done";
    uint64_t step_id = 0;
    uint32_t slot = 0;
    std::vector<uint64_t> rows;  // seq ids, in row order
    uint32_t n_vocab = 0;
    double gpu_ms = 0;                  // submit → last fence, summed over segments
    std::vector<uint64_t> hidden_rows;  // seq ids, in hidden row order
    bool summarized = false;            // the rows' summaries are in the slot too
    // The gpu actor's worker's wall time in the runner's run_step: gpu_ms plus its host share
    // (recording before the first submission, the inputs, the waits' wakeups, the checks).
    double run_ms = 0;
    // Command-buffer segments the step ran, and of them those submitted as a recording the
    // runner's stream kept from an earlier step (stream.hpp "Replay"): not recorded again.
    uint32_t segments = 0, segments_replayed = 0;
    // A step of decode_steps > 1: the iterations that ran (1..step::decode_steps; fewer when a
    // draw or end_decode_steps ended it early) and the tokens the gpu drew and ran, iteration-major
    // (iteration i's draw for row r at i x rows.size() + r, for i < decode_steps - 1: what
    // iteration i + 1 ran). Each iteration's rows are at decode_row(i, decode_steps, ...); with
    // `summarized`, the earlier iterations' rows hold only their summaries (the logits rows are the
    // last iteration's alone), without it their logits rows.
    uint32_t decode_steps = 1;
    std::vector<int32_t> draws;
    MSGPACK_DEFINE_MAP(step_id, slot, rows, n_vocab, gpu_ms, hidden_rows, summarized, run_ms,
                       segments, segments_replayed, decode_steps, draws);
};

// The step failed. code (gpu_failure.hpp): timeout, device_lost or another device fault, nan,
// bad_step, busy, unavailable, stopped; the scheduler makes its own unanswered, internal and
// busy (a step its gpu mailbox refused).
// `segment` is the label of the failing command-buffer segment (e.g. "decode#812 seqs=4 layers
// 8-15"). When device_lost is true the device is being rebuilt: every KV block in the pool is
// gone (the scheduler invalidates every sequence and cached prefix) and no step is accepted
// until device_ready.
struct step_failed {
    static constexpr const char* msg_name = "step_failed";
    uint64_t step_id = 0;
    gpu_failure code = gpu_failure::device_error;
    std::string message;
    std::string segment;
    bool device_lost = false;
    MSGPACK_DEFINE_MAP(step_id, code, message, segment, device_lost);
};

// ---- replies to kv copies (gpu → the receiver bound by connect_kv) -----------------------

// The copy ran: `bytes` bytes of the staging slot were written (copy-out) or read (copy-in).
struct kv_copy_done {
    static constexpr const char* msg_name = "kv_copy_done";
    uint64_t job_id = 0;
    uint64_t bytes = 0;
    MSGPACK_DEFINE_MAP(job_id, bytes);
};

// The copy failed; nothing may be read from the slot. code (gpu_failure.hpp): stale_epoch,
// bad_request (unknown or repeated block, slot not held or too small, no staging connected),
// busy (queue full), device_lost / timeout / another device fault (the device is being rebuilt:
// every block of the pool is gone, as for step_failed{device_lost}), unavailable, stopped.
struct kv_copy_failed {
    static constexpr const char* msg_name = "kv_copy_failed";
    uint64_t job_id = 0;
    gpu_failure code = gpu_failure::device_error;
    std::string message;
    MSGPACK_DEFINE_MAP(job_id, code, message);
};

// What the served device is, for the model and stats ops (docs/protocol.md): identity, the
// limits the kernels depend on, the optional features enabled and the kernel family the
// encoders prefer.
struct device_summary {
    std::string name;
    std::string kind;    // discrete | integrated | virtual | cpu | other
    std::string driver;  // driver name and version string
    std::string vulkan;  // API version, e.g. "1.3.230"
    uint32_t index = 0;  // physical device index
    uint32_t subgroup_size = 0;
    uint64_t max_storage_buffer_range = 0;
    uint32_t max_shared_memory_bytes = 0;
    uint32_t max_workgroup_invocations = 0;
    uint64_t device_local_bytes = 0;    // the largest device-local heap
    std::vector<std::string> features;  // the optional features enabled
    std::string kernels;                // "texel" (texel-buffer kernels) | "storage"
    bool row_summaries = false;         // steps come with their rows' summaries (step_done)
    uint32_t flush_every_layers = 0;  // layers per command-buffer segment (gpu.flush_every_layers)
    uint32_t first_segment_layers = 0;  // layers in a step's first segment (the GPU starts on them)
    // The device writes logits rows straight into the logits exchange (runner_options::
    // logits_regions imported), instead of the host copying them out of its buffer each step.
    bool logits_in_place = false;
    // A token's logits do not depend on its step's other tokens (gpu.batch_invariant): false
    // only while the tiled steps run on cooperative matrices.
    bool batch_invariant = true;
    MSGPACK_DEFINE_MAP(name, kind, driver, vulkan, index, subgroup_size, max_storage_buffer_range,
                       max_shared_memory_bytes, max_workgroup_invocations, device_local_bytes,
                       features, kernels, row_summaries, flush_every_layers, first_segment_layers,
                       logits_in_place, batch_invariant);
};

// The device is (again) ready: sent after start-up and after each rebuild. epoch counts
// rebuilds (0 = first start). The KV pool is empty.
struct device_ready {
    static constexpr const char* msg_name = "device_ready";
    uint64_t epoch = 0;
    std::string device;  // device name
    uint32_t kv_blocks = 0;
    uint32_t kv_block_tokens = 0;
    uint32_t rows_max = 0;  // most logits rows one step may ask for
    device_summary info;
    // Positions a sequence may reach here (runner: choose_context): the smallest of the
    // trained context, the configured one, the KV pool's tokens and what attention can walk on
    // the device (llvmpipe's loop cap); 0 = not stated. n_ctx_bound names the one that applied
    // ("trained", "config", "kv pool", "device").
    uint32_t n_ctx = 0;
    std::string n_ctx_bound;
    // Device memory held by the weights and by the KV pool.
    uint64_t weight_bytes = 0, kv_bytes = 0;
    // Rows a step of several decode iterations (step::decode_steps) may bring back over all its
    // iterations (rows x decode_steps): rows_max where steps come without summaries; where they
    // come with them (info.row_summaries) the summaries a logits slot holds, since the earlier
    // iterations keep only their summaries (decode_row). 0: rows_max.
    uint32_t decode_rows_max = 0;
    MSGPACK_DEFINE_MAP(epoch, device, kv_blocks, kv_block_tokens, rows_max, info, n_ctx,
                       n_ctx_bound, weight_bytes, kv_bytes, decode_rows_max);
};

// A device build (the first, or a rebuild) advanced: health says "loading" with this progress
// until device_ready or device_unavailable. Sent as each stage starts and as it advances, at
// most one per layer uploaded and per warm-up step; none is owed (a lost one changes only the
// reason health gives).
struct device_progress {
    static constexpr const char* msg_name = "device_progress";
    uint64_t epoch = 0;         // the epoch the build will have when it is ready
    uint32_t attempt = 1;       // 1 for a build's first try; retries after a failed build count up
    uint32_t attempts_max = 1;  // 1 + gpu.recovery_max
    std::string stage;          // build_stage_name: "device", "weights", "warm-up"
    uint32_t done = 0, total = 0;
    MSGPACK_DEFINE_MAP(epoch, attempt, attempts_max, stage, done, total);
};

// Rebuilding failed for good (recovery_max exceeded): the server reports health degraded.
struct device_unavailable {
    static constexpr const char* msg_name = "device_unavailable";
    std::string message;
    MSGPACK_DEFINE_MAP(message);
};

}  // namespace ordo::gpu

MSGPACK_ADD_ENUM(ordo::gpu::hidden_output);
MSGPACK_ADD_ENUM(ordo::gpu::step_phase);
