// scheduler_speculate.cpp: speculative decoding's drafts and their verification
// (docs/speculative.md).
//
// A speculating sequence's decode carries drafted tokens after its pending one; the gpu returns
// a logits row after each. Row i is sampled exactly as plain decoding samples the token at that
// position (the same sampler, grammar, stop strings and penalties, in order), and the drafted
// token there is kept only when it equals the token drawn. The first draft that differs ends
// the verification, and the token drawn in its place is the output, as plain decoding would
// have drawn it. Because ordo's kernels are batch-invariant (a token's logits do not depend on
// what else runs in its step), every row equals the logits plain decoding computes for that
// position, and each draw consumes the sampler's random stream once, in the same order: the
// output is byte-identical with speculation on or off, at any temperature and seed. Rows after
// the first rejection are never sampled, so nothing is drawn that must be taken back. KV written
// for rejected drafts sits past the sequence's frontier (n_past), where the next step
// overwrites it, and is never committed or published.
#include <algorithm>
#include <cassert>

#include "actors/runtime/splitmix64.hpp"
#include "scheduler/scheduler_core.hpp"

namespace ordo::sched {
namespace {

// "request CONN:ID", as the notes name a request.
std::string request_name(uint64_t conn, uint64_t id) {
    return "request " + std::to_string(conn) + ":" + std::to_string(id);
}

}  // namespace

uint32_t scheduler_core::draft_room(const request_state& r, uint32_t budget, uint32_t rows) const {
    // Each draft adds a token to the step and a logits row; the row after the last token the
    // request may generate (max_tokens) or place in its context is never sampled.
    const uint64_t generated = r.generated.size();
    const uint64_t can_generate =
        r.params.max_tokens > generated ? r.params.max_tokens - generated : 0;
    const uint64_t can_place = n_ctx() > r.tokens.size() ? n_ctx() - r.tokens.size() : 0;
    const uint64_t rows_useful =
        std::min({uint64_t(budget), uint64_t(rows), can_generate, can_place});
    if (!r.speculating || rows_useful < 2) return 0;
    return uint32_t(std::min<uint64_t>(r.draft_len, rows_useful - 1));
}

std::vector<int32_t> scheduler_core::draft_for(request_state& r, uint32_t max) {
    if (!r.speculating || max == 0) return {};
    std::vector<int32_t> drafts;
    if (_opt.speculative.mode == config::speculative_mode::draft) {
        // The draft model's answer for this very position, if it gave one (start_draft_round).
        if (r.drafts_for == r.tokens.size()) drafts = std::move(r.drafts_ready);
        r.drafts_ready.clear();
        drafts.resize(std::min<size_t>(drafts.size(), max));
    } else {
        drafts = ngram_draft(r.tokens, max, _opt.speculative.ngram);
    }
    if (_draft_armed.empty()) return drafts;
    // An armed draft fault: this drafting round is the one it applies to.
    draft_fault& f = _draft_armed.front();
    const fault_kind kind = f.kind;
    if (--f.rounds_left == 0) _draft_armed.erase(_draft_armed.begin());
    const std::string who = request_name(r.conn, r.id);
    switch (kind) {
        case fault_kind::draft_fail:
            _notes.push_back("fault fired: draft_fail on " + who);
            stop_speculating(r, spec_fallback::drafter_error);
            return {};
        case fault_kind::draft_garbage: {
            drafts.assign(max, 0);
            const auto n_vocab = uint64_t(_tok->vocab().size());
            for (int32_t& t : drafts) t = int32_t(splitmix64_next(_garbage_state) % n_vocab);
            _notes.push_back("fault fired: draft_garbage on " + who + " (" + std::to_string(max) +
                             " random tokens)");
            return drafts;
        }
        case fault_kind::draft_eos: {
            const model::token_id eos = _tok->vocab().eos();
            if (eos == model::k_no_token) break;  // nothing to propose: the round goes as drafted
            drafts.insert(drafts.begin(), eos);
            drafts.resize(std::min<size_t>(drafts.size(), max));
            _notes.push_back("fault fired: draft_eos on " + who);
            return drafts;
        }
        default:
            break;
    }
    return drafts;
}

void scheduler_core::verify(request_state& r0, const planned& p, uint32_t row0,
                            const row_reader& row, const summary_reader& summary,
                            std::vector<outgoing_event>& out) {
    // The pending token's KV is committed (on_step_done), the drafts' is not yet.
    assert(!p.drafts.empty() && r0.n_past == r0.tokens.size());
    const seq_id seq = r0.seq;
    const auto drafted = uint32_t(p.drafts.size());
    uint32_t accepted = 0;
    request_state* r = &r0;  // null once the request has ended
    for (uint32_t i = 0; i <= drafted; i++) {
        apply_token(*r, vocab_logits(row(row0 + i)),
                    summary ? summary(row0 + i) : std::span<const uint32_t>(), out);
        r = find(seq);
        if (r == nullptr) break;  // the request ended with this token (or failed)
        if (i == drafted || r->tokens.back() != p.drafts[i]) break;
        // The token drawn is the drafted one, whose KV this step computed after the ones kept
        // before it: the sequence's frontier moves over it.
        accepted++;
        r->n_past++;
        [[maybe_unused]] const status committed =
            _kv->commit_full_blocks(seq, std::span(r->tokens).first(r->n_past));
        assert(committed.ok() && "a verified draft's KV is in the blocks reserved for the step");
    }
    _counters.spec_rounds++;
    _counters.spec_drafted += drafted;
    _counters.spec_accepted += accepted;
    _histograms.spec_acceptance.observe(double(accepted) / double(drafted));
    if (r == nullptr || !r->speculating) return;
    r->draft_len = accepted == drafted
                       ? std::min(_opt.speculative.draft_tokens_max, r->draft_len + 2)
                       : std::max<uint32_t>(1, r->draft_len - 1);
    r->rounds_unaccepted = accepted == 0 ? r->rounds_unaccepted + 1 : 0;
    if (r->rounds_unaccepted >= _opt.speculative.fallback_rounds) {
        stop_speculating(*r, spec_fallback::no_acceptance);
    }
}

void scheduler_core::stop_speculating(request_state& r, spec_fallback why,
                                      const std::string& detail) {
    if (!r.speculating) return;
    r.speculating = false;
    r.drafts_ready.clear();
    if (r.draft_told) {
        _draft_forget.push_back(r.seq);  // its draft KV can go
        r.draft_told = false;
    }
    _counters.spec_fallbacks[size_t(why)]++;
    _notes.push_back(request_name(r.conn, r.id) + " decodes without speculation from here (" +
                     std::string(enum_name(why)) + (detail.empty() ? "" : ": " + detail) + ")");
}

// ---- the draft model ----------------------------------------------------------------------

bool scheduler_core::start_draft_round() {
    if (_opt.speculative.mode != config::speculative_mode::draft || !_drafter_ready) return false;
    draft::draft_request req;
    draft_round round;
    for (seq_id seq : _running) {
        request_state* found = find(seq);
        if (found == nullptr) continue;
        request_state& r = *found;
        // Decoding (one pending token), speculating, and without an answer for this position.
        if (r.ph != phase::running || !r.speculating || !r.in_kv) continue;
        if (r.tokens.size() - r.n_past != 1 || r.drafts_for == r.tokens.size()) continue;
        // Past the draft model's context it has nothing to say: the sequence decodes plainly.
        if (_drafter_n_ctx != 0 && r.tokens.size() >= _drafter_n_ctx) continue;
        const uint32_t max = draft_room(r, _opt.max_batch_tokens, _rows_max);
        if (max == 0) continue;
        draft::draft_seq q;
        q.seq_id = seq;
        q.known = std::min<uint32_t>(r.draft_known, uint32_t(r.tokens.size()));
        q.tokens.assign(r.tokens.begin() + q.known, r.tokens.end());
        q.max = max;
        req.seqs.push_back(std::move(q));
        round.seqs.push_back(seq);
        r.draft_told = true;
    }
    if (round.seqs.empty()) return false;
    req.round = round.id = _next_draft_round++;
    round.started = clock::now();
    _counters.spec_draft_rounds++;
    _draft_round = std::move(round);
    _draft_out = std::move(req);
    return true;
}

void scheduler_core::on_drafter_state(const draft::drafter_state& m) {
    _drafter_n_ctx = m.n_ctx;
    _drafter_reason = m.reason;
    if (m.ready == _drafter_ready) return;
    _drafter_ready = m.ready;
    // Either way the draft actor starts from nothing: a lost device took what it held.
    for (auto& [seq, r] : _requests) {
        r.draft_known = 0;
        r.draft_told = false;
    }
    _notes.push_back(std::string("the draft model is ") + (m.ready ? "ready" : "not ready") +
                     (m.reason.empty() ? "" : ": " + m.reason) +
                     (m.ready ? "" : " (sequences decode without drafts meanwhile)"));
}

void scheduler_core::on_draft_reply(const draft::draft_reply& m) {
    if (!_draft_round || m.round != _draft_round->id) return;  // a round that failed since
    if (!m.error.empty()) {
        draft_round_failed(m.round, m.error);
        return;
    }
    const draft_round round = std::move(*_draft_round);
    _draft_round.reset();
    _histograms.spec_draft_round.observe(
        std::chrono::duration<double>(clock::now() - round.started).count());
    for (seq_id seq : round.seqs) {
        // A sequence the answer leaves out has no drafts for this position.
        if (request_state* r = find(seq)) {
            r->drafts_ready.clear();
            r->drafts_for = r->tokens.size();
        }
    }
    for (const draft::drafted& d : m.seqs) {
        request_state* r = find(d.seq_id);
        if (r == nullptr || !r->speculating) continue;
        r->draft_known = std::min<uint32_t>(d.known, uint32_t(r->tokens.size()));
        if (d.known == r->tokens.size()) r->drafts_ready = d.tokens;
    }
}

void scheduler_core::draft_round_failed(uint64_t round, const std::string& why) {
    if (!_draft_round || _draft_round->id != round) return;
    const draft_round failed = std::move(*_draft_round);
    _draft_round.reset();
    _counters.spec_draft_rounds_failed++;
    for (seq_id seq : failed.seqs) {
        if (request_state* r = find(seq)) {
            r->draft_known = 0;
            stop_speculating(*r, spec_fallback::drafter_error, why);
        }
    }
}

status scheduler_core::arm_draft_fault(const fault_spec& spec) {
    assert(is_draft_fault(spec.kind));
    if (_opt.speculative.mode == config::speculative_mode::off) {
        return make_error("bad_request",
                          "draft faults need speculative decoding ([speculative] mode)");
    }
    if (_draft_armed.size() >= draft_faults_armed_max) {
        return make_error("bad_request", std::to_string(draft_faults_armed_max) +
                                             " draft faults are armed already");
    }
    _draft_armed.push_back({spec.kind, std::max<uint32_t>(1, spec.count)});
    return {};
}

}  // namespace ordo::sched
