// step_plan.hpp: the pure host-side half of running a step: validates a gpu::step against the
// runner's limits and turns it into the int arrays the kernels read (token ids, positions, KV
// slots, attention {sequence, position} pairs, block tables) plus the map from logits rows to
// tokens. Knows nothing about Vulkan; unit-tested directly. Used by gpu/runner/runner.cpp.
//
// Token order: the step's sequences in order, each sequence's new tokens in order; token t of
// sequence i sits at position pos0_i + t. A sequence with logits_rows n gets n logits rows (its
// last n tokens, in order), rows in sequence order; one with a hidden output gets one hidden row,
// pooled on the host from the final-normed rows of the tokens it names (all, the last or the
// first).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "actors/runtime/result.hpp"
#include "gpu/gpu_msgs.hpp"

namespace ordo::gpu {

struct step_limits {
    std::uint32_t n_vocab = 0;
    std::uint32_t n_ctx = 0;               // positions a sequence may reach
    std::uint32_t block_tokens = 0;        // positions per KV block
    std::uint32_t n_blocks = 0;            // blocks in the pool
    std::uint32_t max_batch_tokens = 0;    // tokens in one step, at most
    std::uint32_t rows_max = 0;            // logits rows in one step, at most
    std::uint32_t seqs_max = 0;            // sequences in one step, at most
    std::uint32_t blocks_per_seq_max = 0;  // block table entries per sequence, at most
};

// A contiguous run of tokens whose logits are wanted: tokens [token0, token0 + n) go to logits
// rows [row0, row0 + n). Decode steps are one run; prefill chunks are one row each.
struct row_run {
    std::uint32_t token0 = 0;
    std::uint32_t row0 = 0;
    std::uint32_t n = 0;
};

struct step_plan {
    std::uint32_t n_tokens = 0;
    std::uint32_t n_seqs = 0;
    std::uint32_t blocks_per_seq = 0;        // width of `tables` in this step
    std::vector<std::int32_t> ids;           // (n_tokens) token ids
    std::vector<std::int32_t> positions;     // (n_tokens)
    std::vector<std::int32_t> slots;         // (n_tokens) block * block_tokens + offset
    std::vector<std::int32_t> attn;          // (n_tokens, 2) {sequence index, position}
    std::vector<std::int32_t> tables;        // (n_seqs, blocks_per_seq) block ids, 0-padded
    std::vector<row_run> runs;               // logits rows, in row order
    std::vector<std::uint64_t> row_seq_ids;  // (rows) seq id of each logits row
    std::vector<float> row_temperatures;     // (rows) each logits row's step_seq::temperature
    std::uint32_t sample_vocab = 0;          // entries of a row the summaries cover (<= n_vocab)
    // Hidden rows (embeddings), in row order: run i's tokens are final-normed into rows
    // [row0, row0 + n) of the runner's hidden buffer and summed into hidden row i (n is 1 for
    // last and first). The runs' n add up to hidden_tokens.
    std::vector<row_run> hidden_runs;
    std::vector<std::uint64_t> hidden_seq_ids;  // (hidden rows) seq id of each hidden row
    std::uint32_t hidden_tokens = 0;
    std::vector<std::int32_t> sort_scratch;  // (n_tokens) slot uniqueness check
    std::uint32_t rows() const { return static_cast<std::uint32_t>(row_seq_ids.size()); }
    std::uint32_t hidden_rows() const { return static_cast<std::uint32_t>(hidden_seq_ids.size()); }
};

// Validates `s` and fills `out` (its vectors are reused: no allocation once warm). Errors, all
// code gpu_bad_step with a message naming the sequence and the value: no sequences or too many,
// a sequence without tokens or with more logits rows than tokens or a temperature that is not
// finite and at least 0, too many tokens, logits rows or
// hidden rows (each at most rows_max), an unknown hidden output, a token id outside the vocab,
// positions past n_ctx, a block table too short or too long or naming a block outside the
// pool, two tokens writing the same KV slot (a block shared between sequences being written),
// an unknown phase. Nothing is recorded for a step that fails here.
status plan_step(const step& s, const step_limits& lim, step_plan& out);

// "decode#812 seqs=4 layers 8-15": names a command-buffer segment in logs and failures.
std::string segment_label(const step& s, std::uint32_t layer_first, std::uint32_t layer_last);

}  // namespace ordo::gpu
