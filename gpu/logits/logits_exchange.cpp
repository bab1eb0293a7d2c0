// logits_exchange.cpp: see logits_exchange.hpp.
#include "gpu/logits/logits_exchange.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "gpu/vk/gpu_failure.hpp"

namespace ordo::gpu {

namespace {

// Asserts that stay on in release builds: a slot mix-up would hand one step's logits to another.
void require(bool ok, const char* why) {
    if (!ok) {
        std::fprintf(stderr, "logits_exchange: %s\n", why);
        std::abort();
    }
}

}  // namespace

void logits_exchange::free_aligned::operator()(float* p) const {
    std::free(p);
}

logits_exchange::logits_exchange(std::uint32_t rows_max, std::uint32_t n_vocab,
                                 std::uint32_t n_embd, std::uint32_t summary_rows_max)
    : _rows_max(rows_max),
      _summary_rows_max(summary_rows_max == 0 ? rows_max : summary_rows_max),
      _n_vocab(n_vocab),
      _n_embd(n_embd),
      _owners(slots_max),
      _region_floats((std::size_t(rows_max) * n_vocab * sizeof(float) + region_align - 1) /
                     region_align * region_align / sizeof(float)),
      _summaries(std::size_t(slots_max) * _summary_rows_max * summary_words, 0u),
      _hidden(std::size_t(slots_max) * rows_max * n_embd, 0.0f) {
    require(rows_max > 0 && n_vocab > 0, "rows_max and n_vocab must be > 0");
    require(_summary_rows_max >= rows_max, "summary_rows_max must be at least rows_max");
    const std::size_t bytes = slots_max * _region_floats * sizeof(float);
    _data.reset(static_cast<float*>(std::aligned_alloc(region_align, bytes)));
    require(_data != nullptr, "out of memory for the logits rows");
    std::memset(_data.get(), 0, bytes);
}

result<std::uint32_t> logits_exchange::acquire() {
    if (auto s = _owners.acquire()) return *s;
    return gpu_error(gpu_failure::busy,
                     "every logits slot (" + std::to_string(slots_max) +
                         ") is held: the scheduler has not released earlier steps");
}

void logits_exchange::release(std::uint32_t slot) {
    if (slot == no_slot) return;
    require(slot < slots_max, "release of a slot out of range");
    require(_owners.release(slot), "release of a slot that is not held");
}

std::size_t logits_exchange::row_index(std::uint32_t slot, std::uint32_t r) const {
    require(slot < slots_max && r < _rows_max, "logits row out of range");
    require(_owners.is_held(slot), "logits row of a free slot");
    return std::size_t(slot) * _region_floats + std::size_t(r) * _n_vocab;
}

std::size_t logits_exchange::hidden_index(std::uint32_t slot, std::uint32_t r) const {
    require(_n_embd > 0, "hidden row of an exchange without hidden rows");
    require(slot < slots_max && r < _rows_max, "hidden row out of range");
    require(_owners.is_held(slot), "hidden row of a free slot");
    return (std::size_t(slot) * _rows_max + r) * _n_embd;
}

float* logits_exchange::hidden_row(std::uint32_t slot, std::uint32_t r) {
    return _hidden.data() + hidden_index(slot, r);
}

std::span<const float> logits_exchange::read_hidden_row(std::uint32_t slot, std::uint32_t r) const {
    return {_hidden.data() + hidden_index(slot, r), _n_embd};
}

float* logits_exchange::row(std::uint32_t slot, std::uint32_t r) {
    return _data.get() + row_index(slot, r);
}

std::span<const float> logits_exchange::read_row(std::uint32_t slot, std::uint32_t r) const {
    return {_data.get() + row_index(slot, r), _n_vocab};
}

std::span<float> logits_exchange::logits_region(std::uint32_t slot) {
    require(slot < slots_max, "logits region out of range");
    return {_data.get() + std::size_t(slot) * _region_floats, _region_floats};
}

std::size_t logits_exchange::summary_index(std::uint32_t slot, std::uint32_t r) const {
    require(slot < slots_max && r < _summary_rows_max, "summary row out of range");
    require(_owners.is_held(slot), "summary row of a free slot");
    return (std::size_t(slot) * _summary_rows_max + r) * summary_words;
}

std::uint32_t* logits_exchange::summary_row(std::uint32_t slot, std::uint32_t r) {
    return _summaries.data() + summary_index(slot, r);
}

std::span<const std::uint32_t> logits_exchange::read_summary(std::uint32_t slot,
                                                             std::uint32_t r) const {
    return {_summaries.data() + summary_index(slot, r), summary_words};
}

std::int32_t logits_exchange::greedy_token(std::uint32_t slot, std::uint32_t r, bool summarized,
                                           std::uint32_t n_sample) const {
    return greedy_of(read_row(slot, r),
                     summarized ? read_summary(slot, r) : std::span<const std::uint32_t>(),
                     n_sample);
}

std::int32_t logits_exchange::greedy_of(std::span<const float> row,
                                        std::span<const std::uint32_t> summary,
                                        std::uint32_t n_sample) {
    const std::size_t n = std::min<std::size_t>(row.size(), std::max<std::uint32_t>(n_sample, 1));
    // A summary whose best id is outside the row's ids is not trusted: the row decides.
    if (summary.size() > summary_best_word && summary[summary_count_word] > 0 &&
        summary[summary_best_word] < n) {
        return static_cast<std::int32_t>(summary[summary_best_word]);
    }
    std::size_t best = 0;
    for (std::size_t i = 1; i < n; i++) {
        if (row[i] > row[best]) best = i;
    }
    return static_cast<std::int32_t>(best);
}

bool logits_exchange::is_held(std::uint32_t slot) const {
    return _owners.is_held(slot);
}

std::uint32_t logits_exchange::held() const {
    return _owners.held();
}

}  // namespace ordo::gpu
