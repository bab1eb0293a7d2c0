// step_plan.cpp: see step_plan.hpp.
#include "gpu/runner/step_plan.hpp"

#include <algorithm>
#include <cmath>

#include "gpu/vk/gpu_failure.hpp"

namespace ordo::gpu {

namespace {

error bad_step(const step& s, const std::string& why) {
    return gpu_error(gpu_failure::bad_step, "step " + std::to_string(s.step_id) + ": " + why);
}

std::string seq_name(const step_seq& q, std::size_t i) {
    return "sequence " + std::to_string(i) + " (id " + std::to_string(q.seq_id) + ")";
}

// Checks one sequence's tokens, positions and block table.
status check_seq(const step& s, const step_seq& q, std::size_t i, const step_limits& lim) {
    if (q.tokens.empty()) return bad_step(s, seq_name(q, i) + " has no tokens");
    if (q.logits_rows > q.tokens.size()) {
        return bad_step(s, seq_name(q, i) + " asks for " + std::to_string(q.logits_rows) +
                               " logits rows of " + std::to_string(q.tokens.size()) + " tokens");
    }
    if (!(std::isfinite(q.temperature) && q.temperature >= 0.0f)) {
        return bad_step(s, seq_name(q, i) + " has temperature " + std::to_string(q.temperature) +
                               "; finite and at least 0 allowed");
    }
    std::uint64_t end = std::uint64_t(q.pos0) + q.tokens.size();
    if (end > lim.n_ctx) {
        return bad_step(s, seq_name(q, i) + " reaches position " + std::to_string(end - 1) +
                               ", past the context of " + std::to_string(lim.n_ctx));
    }
    for (std::int32_t t : q.tokens) {
        if (t < 0 || std::uint32_t(t) >= lim.n_vocab) {
            return bad_step(s, seq_name(q, i) + " has token id " + std::to_string(t) +
                                   " outside the vocab of " + std::to_string(lim.n_vocab));
        }
    }
    std::uint64_t blocks = (end + lim.block_tokens - 1) / lim.block_tokens;
    if (q.block_table.size() < blocks) {
        return bad_step(s, seq_name(q, i) + " needs " + std::to_string(blocks) +
                               " KV blocks for positions 0.." + std::to_string(end - 1) +
                               " but its block table has " + std::to_string(q.block_table.size()));
    }
    if (q.block_table.size() > lim.blocks_per_seq_max) {
        return bad_step(s, seq_name(q, i) + " has a block table of " +
                               std::to_string(q.block_table.size()) + " entries; at most " +
                               std::to_string(lim.blocks_per_seq_max));
    }
    for (std::size_t b = 0; b < blocks; ++b) {
        if (q.block_table[b] >= lim.n_blocks) {
            return bad_step(s, seq_name(q, i) + " names KV block " +
                                   std::to_string(q.block_table[b]) + " outside the pool of " +
                                   std::to_string(lim.n_blocks));
        }
    }
    return {};
}

status check_shape(const step& s, const step_limits& lim) {
    if (!enum_valid(s.phase)) {
        return bad_step(s, "phase " + std::to_string(static_cast<int>(s.phase)) + " is not " +
                               enum_names_listed<step_phase>());
    }
    if (s.seqs.empty() || s.seqs.size() > lim.seqs_max) {
        return bad_step(s, std::to_string(s.seqs.size()) + " sequences; 1.." +
                               std::to_string(lim.seqs_max) + " allowed");
    }
    std::uint64_t tokens = 0, rows = 0, hidden = 0;
    for (const step_seq& q : s.seqs) {
        tokens += q.tokens.size();
        rows += q.logits_rows;
        hidden += q.hidden != hidden_output::none ? 1 : 0;
        if (q.hidden > hidden_output::first) {
            return bad_step(s, "hidden output " + std::to_string(int(q.hidden)) +
                                   " is not none, sum, last or first");
        }
    }
    if (tokens > lim.max_batch_tokens) {
        return bad_step(s, std::to_string(tokens) + " tokens; at most " +
                               std::to_string(lim.max_batch_tokens) + " per step");
    }
    if (rows > lim.rows_max) {
        return bad_step(s, std::to_string(rows) + " logits rows; at most " +
                               std::to_string(lim.rows_max) + " per step");
    }
    if (hidden > lim.rows_max) {
        return bad_step(s, std::to_string(hidden) + " hidden rows; at most " +
                               std::to_string(lim.rows_max) + " per step");
    }
    return {};
}

// Every token writes its own KV slot; two writers of one slot would race in kv_write.
status check_unique_slots(const step& s, const step_plan& p, std::vector<std::int32_t>& scratch) {
    scratch.assign(p.slots.begin(), p.slots.end());
    std::sort(scratch.begin(), scratch.end());
    auto dup = std::adjacent_find(scratch.begin(), scratch.end());
    if (dup != scratch.end()) {
        return bad_step(s, "two tokens write KV slot " + std::to_string(*dup) +
                               " (a block being written is shared between sequences)");
    }
    return {};
}

// The hidden row of sequence q, whose tokens are the last q.tokens.size() of out.ids.
void plan_hidden(const step_seq& q, step_plan& out) {
    if (q.hidden == hidden_output::none) return;
    const auto n = static_cast<std::uint32_t>(q.tokens.size());
    const auto first = static_cast<std::uint32_t>(out.ids.size()) - n;
    row_run run{first, out.hidden_tokens, n};
    if (q.hidden == hidden_output::last) run.token0 = first + n - 1, run.n = 1;
    if (q.hidden == hidden_output::first) run.n = 1;
    out.hidden_runs.push_back(run);
    out.hidden_seq_ids.push_back(q.seq_id);
    out.hidden_tokens += run.n;
}

}  // namespace

status plan_step(const step& s, const step_limits& lim, step_plan& out) {
    status shape = check_shape(s, lim);
    if (!shape) return shape;
    std::uint32_t width = 1;
    for (std::size_t i = 0; i < s.seqs.size(); ++i) {
        status ok = check_seq(s, s.seqs[i], i, lim);
        if (!ok) return ok;
        std::uint64_t end = std::uint64_t(s.seqs[i].pos0) + s.seqs[i].tokens.size();
        width = std::max<std::uint32_t>(
            width, static_cast<std::uint32_t>((end + lim.block_tokens - 1) / lim.block_tokens));
    }
    out.n_seqs = static_cast<std::uint32_t>(s.seqs.size());
    out.blocks_per_seq = width;
    out.ids.clear();
    out.positions.clear();
    out.slots.clear();
    out.attn.clear();
    out.runs.clear();
    out.row_seq_ids.clear();
    out.row_temperatures.clear();
    out.sample_vocab = s.sample_vocab != 0 ? std::min(s.sample_vocab, lim.n_vocab) : lim.n_vocab;
    out.hidden_runs.clear();
    out.hidden_seq_ids.clear();
    out.hidden_tokens = 0;
    out.tables.assign(std::size_t(out.n_seqs) * width, 0);
    for (std::size_t i = 0; i < s.seqs.size(); ++i) {
        const step_seq& q = s.seqs[i];
        for (std::size_t t = 0; t < q.tokens.size(); ++t) {
            auto pos = static_cast<std::int32_t>(q.pos0 + t);
            auto block = static_cast<std::int32_t>(q.block_table[pos / lim.block_tokens]);
            out.ids.push_back(q.tokens[t]);
            out.positions.push_back(pos);
            out.slots.push_back(block * std::int32_t(lim.block_tokens) +
                                pos % std::int32_t(lim.block_tokens));
            out.attn.push_back(static_cast<std::int32_t>(i));
            out.attn.push_back(pos);
        }
        // Only the blocks the sequence's positions reach: entries past them were not checked.
        std::size_t used = (q.pos0 + q.tokens.size() + lim.block_tokens - 1) / lim.block_tokens;
        for (std::size_t b = 0; b < used; ++b) {
            out.tables[i * width + b] = static_cast<std::int32_t>(q.block_table[b]);
        }
        plan_hidden(q, out);
        if (q.logits_rows == 0) continue;
        // The last logits_rows tokens, continuing the previous run where they follow it.
        auto token = static_cast<std::uint32_t>(out.ids.size() - q.logits_rows);
        if (!out.runs.empty() && out.runs.back().token0 + out.runs.back().n == token) {
            out.runs.back().n += q.logits_rows;
        } else {
            out.runs.push_back({token, out.rows(), q.logits_rows});
        }
        out.row_seq_ids.insert(out.row_seq_ids.end(), q.logits_rows, q.seq_id);
        out.row_temperatures.insert(out.row_temperatures.end(), q.logits_rows, q.temperature);
    }
    out.n_tokens = static_cast<std::uint32_t>(out.ids.size());
    return check_unique_slots(s, out, out.sort_scratch);
}

std::string segment_label(const step& s, std::uint32_t layer_first, std::uint32_t layer_last) {
    return std::string(enum_name(s.phase)) + "#" + std::to_string(s.step_id) +
           " seqs=" + std::to_string(s.seqs.size()) + " layers " + std::to_string(layer_first) +
           "-" + std::to_string(layer_last);
}

}  // namespace ordo::gpu
