// draft_actor.hpp: the draft actor (speculative decoding with a draft model,
// docs/speculative.md). Between the scheduler and a second gpu actor that serves the draft
// model on the same device, with its own KV pool.
//
// The scheduler sends a draft_request for the sequences about to decode (one round at a time;
// a few more queue, past that a round is refused). For each sequence the draft actor holds the
// tokens the scheduler told it (`truth`) and what its own KV holds (`kv`: the truth it has run,
// then the drafts it ran after it). A round first rolls each sequence's KV back to the longest
// prefix that still agrees with the truth (the drafts the target rejected are dropped there,
// and nothing else), runs what the KV lacks (prompt chunks, and the target's tokens since the
// last round) and then one token per draft: greedy, the draft model's argmax, lowest id on a
// tie. Every sequence of the round goes in the same steps, under the draft gpu's token budget
// and logits rows. The reply carries each sequence's drafts; the scheduler verifies them
// against the target's own draws, so the draft model decides how many steps an answer takes,
// never the answer.
//
// Failures: a draft step that fails fails its round (draft_reply.error), and the scheduler
// sends the round's sequences back to plain decoding; it fails no request. A lost draft device
// (the draft gpu actor rebuilds it) takes every sequence's KV with it: the draft actor forgets
// them all and says drafter_state{ready = false} until the rebuild's device_ready. A round
// unanswered for round_ms_max fails the same way (the gpu actor's watchdog normally answers
// first); a late answer to its step is ignored, its logits slot released. Blocks: the draft
// pool's blocks are the draft actor's alone (a free list); a round that needs more takes them
// from the sequences used longest ago that are not in it, and a sequence that still does not
// fit gets no drafts this round.
#pragma once

#include <uv.h>

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "actors/runtime/actor.hpp"
#include "actors/runtime/delivery.hpp"
#include "actors/runtime/outbox.hpp"
#include "draft/draft_msgs.hpp"
#include "gpu/gpu_msgs.hpp"
#include "gpu/logits/logits_exchange.hpp"

namespace ordo::draft {

using draft_replies = actors::outbox<draft_reply, drafter_state>;
using draft_gpu_outbox = actors::outbox<gpu::step, gpu::inject_fault>;

// Rounds waiting behind the one running, at most; one more is refused (its reply says so).
inline constexpr size_t draft_rounds_queued_max = 4;
// Drafts one sequence may ask for in a round (config::draft_tokens_max_max).
inline constexpr uint32_t draft_tokens_per_round_max = 64;

struct draft_actor_options {
    uint32_t max_batch_tokens = 512;  // tokens one draft step runs, at most (the draft runner's)
    uint32_t n_vocab = 0;             // the served model's: drafts are below it
    uint64_t round_ms_max = 30000;    // speculative.draft_wait_ms
    size_t mailbox_capacity = 4096;
};

class draft_actor final
    : public actors::actor<draft_actor, draft_request, draft_forget, gpu::inject_fault,
                           gpu::step_done, gpu::step_failed, gpu::device_ready,
                           gpu::device_unavailable, gpu::fault_refused, gpu::device_progress> {
public:
    // `exchange` is the draft gpu actor's logits exchange and must outlive the actor.
    draft_actor(draft_actor_options options, gpu::logits_exchange& exchange, draft_replies replies);

    // Before start(): the draft model's gpu actor.
    template <typename Gpu>
    void connect_gpu(Gpu& gpu) {
        _to_gpu = draft_gpu_outbox(gpu, "draft");
    }

    void on(const draft_request& m);
    void on(const draft_forget& m);
    // A fault for the draft model's device (the scheduler's draft_fail): passed on to its gpu
    // actor, ahead of the next draft step, so it fails through the real path.
    void on(const gpu::inject_fault& m);
    void on(const gpu::step_done& m);
    void on(const gpu::step_failed& m);
    void on(const gpu::device_ready& m);
    void on(const gpu::device_unavailable& m);
    void on(const gpu::fault_refused& m);
    void on(const gpu::device_progress& m);

    // For tests, after join(): rounds answered with drafts, rounds failed, sequences held.
    uint64_t rounds_done() const { return _rounds_done; }
    uint64_t rounds_failed() const { return _rounds_failed; }
    size_t sequences_held() const { return _seqs.size(); }

protected:
    void on_start() override;
    void on_stop() override;

private:
    struct seq_state {
        std::vector<int32_t> truth;    // the sequence's tokens, as the scheduler told them
        std::vector<int32_t> kv;       // what the draft pool holds for it, position by position
        std::vector<uint32_t> blocks;  // its pool blocks, in position order
        uint64_t used = 0;             // the round that last used it (eviction: oldest first)
    };
    // One sequence of the running round.
    struct work {
        uint64_t seq = 0;
        uint32_t max = 0;
        std::vector<int32_t> drafts;
        bool done = false;
    };
    // What the step in flight runs of one sequence.
    struct ran {
        size_t work_index = 0;
        std::vector<int32_t> tokens;
        uint32_t logits_rows = 0;
    };
    struct round_state {
        uint64_t id = 0;
        std::vector<work> seqs;
        std::vector<drafted> answered;  // sequences answered without running (no drafts)
        uint64_t step_id = 0;           // the step in flight (0: none)
        std::vector<ran> step;
    };
    using reply_delivery = actors::delivery<draft_reply, drafter_state>;

    void start_next_round();
    // Fits one sequence into the round: rolls its KV back, sizes its blocks. False: it gets no
    // drafts this round (answered with what is known).
    bool prepare(const draft_seq& s, round_state& r);
    bool reserve_blocks(seq_state& st, uint32_t positions, const std::set<uint64_t>& keep);
    void run_step();
    void finish_round();
    void fail_round(const std::string& why);
    void forget(uint64_t seq);
    void forget_all();
    void set_ready(bool ready, std::string reason);
    static void round_timer_cb(uv_timer_t* t);

    draft_actor_options _opt;
    gpu::logits_exchange& _exchange;
    draft_replies _reply_out;
    reply_delivery _replies;
    draft_gpu_outbox _to_gpu;
    uv_timer_t _round_timer{};

    bool _ready = false;
    uint32_t _block_tokens = 0;
    uint32_t _n_ctx = 0;     // positions a sequence may reach in the draft model
    uint32_t _rows_max = 0;  // logits rows one draft step may ask for
    std::vector<uint32_t> _free;
    std::map<uint64_t, seq_state> _seqs;
    std::optional<round_state> _round;
    std::deque<draft_request> _waiting;
    std::set<uint64_t> _forget_after_round;  // forgotten while in the running round
    uint64_t _next_step = 1;
    uint64_t _rounds_done = 0, _rounds_failed = 0;
};

}  // namespace ordo::draft
