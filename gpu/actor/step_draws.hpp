// step_draws.hpp: the draws a step of several decode iterations makes between two of them
// (gpu_msgs.hpp step::decode_steps, step_seq::draw), on the gpu actor's worker; the scheduler's
// test harness runs the same ones.
//
// A greedy sequence's next token is its row's greedy token (logits_exchange::greedy_of: what the
// sampler picks at temperature 0 without penalties). A sampled sequence's is drawn by a copy of
// its request's sampler (sched::sampler::resume: the request's filters and its generator's state
// before the step) from what the scheduler will keep of the iteration: the row's summary alone
// where the step summarized (the earlier iterations' logits rows are written over), else the
// row. The scheduler then draws each token again with the request's own sampler from the same
// inputs and checks the two agree (scheduler_core::apply_decode_steps).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "actors/runtime/result.hpp"
#include "gpu/gpu_msgs.hpp"
#include "scheduler/sampling.hpp"

namespace ordo::gpu {

class step_draws {
public:
    // One draw per sequence of `m`, over each row's first n_draw entries (the step's
    // sample_vocab). An error names the sequence whose draw no sampler could make.
    static result<step_draws> create(const step& m, std::uint32_t n_draw);

    // Sequence j's token for the next iteration, from this iteration's logits row j and, where
    // the step summarized, its summary (empty: none). -1 when a sampled draw is not settled by
    // the summary alone (the step then ends at this iteration, and the scheduler draws from the
    // row, which is still in the slot).
    std::int32_t next(std::uint32_t j, std::span<const float> row,
                      std::span<const std::uint32_t> summary);
    // Whether a draw of `token` ends the step after this iteration (step::end_tokens): its
    // request ends there, and a request waits for its sequence.
    bool ends(std::int32_t token) const;

private:
    explicit step_draws(std::uint32_t n_draw) : _n_draw(n_draw) {}

    std::uint32_t _n_draw;
    std::vector<std::optional<sched::sampler>> _samplers;  // per sequence; none: greedy
    std::vector<std::int32_t> _end_tokens;                 // step::end_tokens, sorted
};

}  // namespace ordo::gpu
