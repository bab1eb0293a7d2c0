// scheduler_embed.cpp: embed requests (the `embed` op, POST /v1/embeddings).
//
// An embedding is a prefill that keeps its final hidden states instead of sampling: the
// request's tokens run through the same queue, admission, KV reservation, prefill chunking,
// batching with generation, preemption and retry as a generate request's prompt, with
// max_tokens 0. Each step asks the gpu for one hidden row per embed sequence
// (gpu_msgs.hpp hidden_output): for mean pooling the sum of the chunk's final-normed rows,
// added up here across chunks; for last the last token's (on the chunk that ends the input);
// for cls the first token's (on the chunk that begins it). When the whole input has run the
// vector is divided (mean), L2-normalized and sent as embed_done.
//
// Two rules keep the pooled vector exact:
//   - an embed request never starts from cached KV (no prefix-cache lookup, no disk restore):
//     mean pooling needs every token's hidden state, and a cached prefix would skip them;
//   - whenever its KV is invalidated (a failed step, a device rebuild, a preemption) it
//     recomputes from token 0, and the accumulator is cleared when a chunk starting at 0 is
//     applied, so a retried input is never counted twice.
// Its KV blocks are published to the prefix cache like any prompt's: they are valid KV.
#include <algorithm>
#include <cassert>
#include <cmath>

#include "scheduler/scheduler_core.hpp"

namespace ordo::sched {

using door::errc;

void scheduler_core::on_embed(const embed& m, std::vector<outgoing_event>& out) {
    if (auto refused = refusal_at_admission(m.conn, m.id)) return out.push_back(*refused);
    if (m.text && !_tok->support()) {
        return out.push_back(tokenizer_error(m.conn, m.id, "a text input"));
    }
    generate_request g;
    g.prompt = m.text;
    g.tokens = m.tokens;
    g.max_tokens = 0;
    auto ids = prompt_tokens(g);
    if (!ids.ok()) {
        return out.push_back(error_event(m.conn, m.id, errc::bad_request, ids.err().message));
    }
    if (ids->size() > n_ctx()) {
        return out.push_back(error_event(m.conn, m.id, errc::context_exceeded,
                                         "the input (" + std::to_string(ids->size()) +
                                             " tokens) exceeds the context of " +
                                             std::to_string(n_ctx()) + " tokens"));
    }
    if (_kv && !fits_pool(ids->size())) {
        return out.push_back(
            error_event(m.conn, m.id, errc::context_exceeded, pool_message(ids->size())));
    }
    if (_queue.size() >= _opt.max_queue) {
        _counters.overloaded++;
        return out.push_back(error_event(
            m.conn, m.id, errc::overloaded,
            "the queue is full (scheduler.max_queue = " + std::to_string(_opt.max_queue) + ")"));
    }
    seq_id seq = _next_seq++;
    request_state& r = _requests[seq];
    r.conn = m.conn;
    r.id = m.id;
    r.seq = seq;
    r.params = std::move(g);
    r.embed = _opt.pooling;
    r.pooled.assign(_info.n_embd, 0.0);
    r.tokens = std::move(*ids);
    r.n_prompt = static_cast<uint32_t>(r.tokens.size());
    r.submitted = clock::now();
    _by_client[{m.conn, m.id}] = seq;
    _queue.push_back(seq);
    _counters.embeddings++;
    _counters.embedding_tokens += r.n_prompt;
    reach_phase(r, request_phase::queued);
}

gpu::hidden_output scheduler_core::hidden_for(const request_state& r, uint32_t n_tokens) const {
    if (!r.embed) return gpu::hidden_output::none;
    switch (*r.embed) {
        case model::pooling::mean:
            return gpu::hidden_output::sum;
        case model::pooling::last:
            return r.n_past + n_tokens == r.tokens.size() ? gpu::hidden_output::last
                                                          : gpu::hidden_output::none;
        case model::pooling::cls:
            return r.n_past == 0 ? gpu::hidden_output::first : gpu::hidden_output::none;
    }
    return gpu::hidden_output::none;
}

void scheduler_core::apply_embed_step(request_state& r, const planned& p, uint32_t start,
                                      const gpu::step_done& m, const row_reader& hidden_row,
                                      std::vector<outgoing_event>& out) {
    assert(r.embed && r.pooled.size() == _info.n_embd);
    if (p.hidden != gpu::hidden_output::none) {
        auto it = std::find(m.hidden_rows.begin(), m.hidden_rows.end(), r.seq);
        if (it == m.hidden_rows.end()) {
            return fail(r, errc::internal, "the gpu returned no hidden row for this sequence", out);
        }
        std::span<const float> row = hidden_row(uint32_t(it - m.hidden_rows.begin()));
        if (row.size() != r.pooled.size()) {
            return fail(r, errc::internal,
                        "the gpu returned a hidden row of " + std::to_string(row.size()) +
                            " floats; the model's width is " + std::to_string(r.pooled.size()),
                        out);
        }
        if (start == 0) std::fill(r.pooled.begin(), r.pooled.end(), 0.0);  // a recompute
        for (size_t i = 0; i < row.size(); ++i) r.pooled[i] += row[i];
    }
    if (r.n_past == r.tokens.size()) finish_embed(r, out);
}

void scheduler_core::finish_embed(request_state& r, std::vector<outgoing_event>& out) {
    assert(r.embed && r.n_past == r.tokens.size());
    // The mean's division does not change the direction: normalizing is enough.
    double norm = 0.0;
    for (double v : r.pooled) norm += v * v;
    norm = std::sqrt(norm);
    door::embed_done d{r.conn, r.id, {}, r.n_prompt, std::string(config::to_string(*r.embed)),
                       false};
    d.embedding.resize(r.pooled.size(), 0.0f);
    if (norm > 0.0) {
        for (size_t i = 0; i < r.pooled.size(); ++i) {
            d.embedding[i] = static_cast<float>(r.pooled[i] / norm);
        }
    }
    if (!r.client_gone) out.push_back(std::move(d));
    remove(r);
}

}  // namespace ordo::sched
