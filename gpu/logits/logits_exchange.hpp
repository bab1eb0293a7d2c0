// logits_exchange.hpp: host memory shared by the gpu actor (writer) and the scheduler (reader)
// for the logits rows of finished steps, and their hidden rows (embeddings: gpu_msgs.hpp
// hidden_output), so that neither travels inside messages.
//
// `slots_max` slots of `rows_max x n_vocab` floats, of `rows_max x n_embd` for hidden rows and of
// `summary_rows_max` row summaries are allocated once (n_embd 0: no hidden rows; a step that asks
// for some fails). A step of several decode iterations (gpu_msgs.hpp step::decode_steps) keeps
// every iteration's summaries but only the last one's rows, so a slot holds more summaries
// (rows x iterations) than rows. The gpu actor
// acquires a free slot for a step (none free: the step fails with gpu_busy at once; acquire never
// blocks), the runner writes the rows, step_done names the slot, the scheduler reads the rows and
// releases the slot (directly, or with a release_logits message to the gpu actor). Ownership
// hand-over is one atomic per slot: free -> held (acquire, compare-exchange) -> free (release).
// The rows of a held slot are touched by one thread at a time: the writer until it sends
// step_done, the reader after it receives it (the mailbox hand-over orders the two).
// Misuse (releasing a free slot, a row out of range) is a programmer error and asserts.
// Each slot's logits rows are one region that starts and ends on a region_align boundary, so
// the writer's device can import it as a buffer (VK_EXT_external_memory_host) and its kernels
// write the rows where the reader reads them: no copy of the rows per step (the runner's
// runner_options::logits_regions; 64 rows of a 128k vocabulary are 32 MB).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "actors/runtime/result.hpp"
#include "gpu/logits/slot_owners.hpp"

namespace ordo::gpu {

class logits_exchange {
public:
    // Steps whose logits may be waiting for the scheduler at once. Four covers a step being
    // read, one being written and two queued behind them.
    static constexpr std::uint32_t slots_max = 4;
    // step_done.slot when the step asked for no logits rows (nothing to read or release).
    static constexpr std::uint32_t no_slot = 0xFFFFFFFFu;
    // Words of one row's summary (abi.h ORDO_SUMMARY_WORDS; the gpu library asserts they agree).
    static constexpr std::uint32_t summary_words = 4 + 2 * 64;
    // Where a summary keeps its candidate count and its first (best) candidate's id.
    static constexpr std::uint32_t summary_count_word = 3, summary_best_word = 4;
    // The start and size of every slot's logits region: a multiple of every host-import
    // alignment seen (4 KiB on NVIDIA's and Mesa's drivers) and of larger pages.
    static constexpr std::size_t region_align = 64 * 1024;

    // summary_rows_max: the summaries a slot holds, at least rows_max (0: rows_max).
    logits_exchange(std::uint32_t rows_max, std::uint32_t n_vocab, std::uint32_t n_embd = 0,
                    std::uint32_t summary_rows_max = 0);
    logits_exchange(const logits_exchange&) = delete;
    logits_exchange& operator=(const logits_exchange&) = delete;

    // A free slot, now held by the caller; gpu_busy when every slot is held.
    result<std::uint32_t> acquire();
    // Frees a held slot. Releasing no_slot is a no-op; releasing a free slot asserts.
    void release(std::uint32_t slot);

    // Row r of a held slot (n_vocab floats). The writer fills it; the reader reads it.
    float* row(std::uint32_t slot, std::uint32_t r);
    std::span<const float> read_row(std::uint32_t slot, std::uint32_t r) const;
    // The summary of logits row r of a held slot (summary_words words: the logits_summary
    // kernel's output, gpu/vk/shaders/abi.h), the same way, r < summary_rows_max.
    // summary_row(slot, 0) is where the writer puts the step's rows, one after another.
    std::uint32_t* summary_row(std::uint32_t slot, std::uint32_t r);
    std::span<const std::uint32_t> read_summary(std::uint32_t slot, std::uint32_t r) const;
    // The greedy token of row r of a held slot among its first n_sample ids (the lowest id
    // holding the largest logit): the summary's first candidate when the step wrote summaries
    // (step_done::summarized; the step's sample_vocab was n_sample), else a pass over the row.
    std::int32_t greedy_token(std::uint32_t slot, std::uint32_t r, bool summarized,
                              std::uint32_t n_sample) const;
    // The same for a row and its summary (empty: none) wherever they are.
    static std::int32_t greedy_of(std::span<const float> row,
                                  std::span<const std::uint32_t> summary, std::uint32_t n_sample);
    // The whole logits region of `slot` (rows_max x n_vocab floats, padded to region_align), held
    // or not: for the writer's device to import once (the rows are still only touched as above).
    std::span<float> logits_region(std::uint32_t slot);
    // Hidden row r of a held slot (n_embd floats), the same way.
    float* hidden_row(std::uint32_t slot, std::uint32_t r);
    std::span<const float> read_hidden_row(std::uint32_t slot, std::uint32_t r) const;

    std::uint32_t rows_max() const { return _rows_max; }
    std::uint32_t summary_rows_max() const { return _summary_rows_max; }
    std::uint32_t n_vocab() const { return _n_vocab; }
    std::uint32_t n_embd() const { return _n_embd; }
    std::uint32_t held() const;              // slots currently held (stats, tests)
    bool is_held(std::uint32_t slot) const;  // false for no_slot and out-of-range slots

private:
    std::size_t row_index(std::uint32_t slot, std::uint32_t r) const;
    std::size_t hidden_index(std::uint32_t slot, std::uint32_t r) const;
    std::size_t summary_index(std::uint32_t slot, std::uint32_t r) const;

    std::uint32_t _rows_max;
    std::uint32_t _summary_rows_max;
    std::uint32_t _n_vocab;
    std::uint32_t _n_embd;
    struct free_aligned {
        void operator()(float* p) const;
    };

    slot_owners _owners;
    std::size_t _region_floats;                    // a slot's region, padded
    std::unique_ptr<float[], free_aligned> _data;  // (slots_max, region): rows_max x n_vocab used
    std::vector<std::uint32_t> _summaries;         // (slots_max, summary_rows_max, summary_words)
    std::vector<float> _hidden;                    // (slots_max, rows_max, n_embd)
};

}  // namespace ordo::gpu
