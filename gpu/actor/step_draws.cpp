#include "gpu/actor/step_draws.hpp"

#include <algorithm>
#include <string>

#include "gpu/logits/logits_exchange.hpp"

namespace ordo::gpu {

result<step_draws> step_draws::create(const step& m, std::uint32_t n_draw) {
    step_draws d(n_draw);
    if (m.end_tokens.size() > end_tokens_max) {
        return gpu_error(gpu_failure::bad_step, std::to_string(m.end_tokens.size()) +
                                                    " end_tokens, at most " +
                                                    std::to_string(end_tokens_max));
    }
    d._end_tokens = m.end_tokens;
    std::sort(d._end_tokens.begin(), d._end_tokens.end());
    d._samplers.reserve(m.seqs.size());
    for (const step_seq& q : m.seqs) {
        if (q.draw.rng.empty()) {
            d._samplers.emplace_back();
            continue;
        }
        sched::sampling_params p;
        p.temperature = q.draw.temperature;
        p.top_k = q.draw.top_k;
        p.top_p = q.draw.top_p;
        p.min_p = q.draw.min_p;
        auto s = sched::sampler::resume(p, q.draw.rng);
        if (!s) {
            return gpu_error(gpu_failure::bad_step, "sequence " + std::to_string(q.seq_id) +
                                                        "'s draw: " + s.err().message);
        }
        d._samplers.emplace_back(std::move(*s));
    }
    return d;
}

std::int32_t step_draws::next(std::uint32_t j, std::span<const float> row,
                              std::span<const std::uint32_t> summary) {
    auto& s = _samplers.at(j);
    if (!s) return logits_exchange::greedy_of(row, summary, _n_draw);
    return s->draw_ahead(row, summary, _n_draw);
}

bool step_draws::ends(std::int32_t token) const {
    return std::binary_search(_end_tokens.begin(), _end_tokens.end(), token);
}

}  // namespace ordo::gpu
