// draft_actor.cpp: see draft_actor.hpp.
#include "draft/draft_actor.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cassert>

namespace ordo::draft {

namespace {

// Replies to the scheduler: its mailbox drains in microseconds; one refused this long is given
// up, and the scheduler's own bound on the round (draft_wait_ms) decides what it became.
constexpr actors::delivery_limits reply_delivery_limits{
    .pending_max = 1024, .retry_ms = 2, .deadline_ms = 30'000};

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    const size_t n = std::min(a.size(), b.size());
    size_t i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

}  // namespace

draft_actor::draft_actor(draft_actor_options options, gpu::logits_exchange& exchange,
                         draft_replies replies)
    : actor("draft", options.mailbox_capacity),
      _opt(options),
      _exchange(exchange),
      _reply_out(std::move(replies)) {}

void draft_actor::on_start() {
    uv_timer_init(loop(), &_round_timer);
    _round_timer.data = this;
    must(_replies.init(loop(), _reply_out, reply_delivery_limits,
                       [this](const reply_delivery::message& m, const actors::refusal& why) {
                           if (why.outcome == actors::delivery_outcome::actor_stopped) return;
                           log().error("{} to the scheduler given up: {}",
                                       std::visit([](const auto& r) { return r.msg_name; }, m),
                                       why.message);
                       }),
         "delivery init");
}

void draft_actor::on_stop() {
    if (_round) fail_round("the draft actor is stopping");
    _waiting.clear();
    _replies.close();
    uv_close(reinterpret_cast<uv_handle_t*>(&_round_timer), nullptr);
}

// ---- the scheduler's requests -------------------------------------------------------------

void draft_actor::on(const draft_request& m) {
    if (_waiting.size() >= draft_rounds_queued_max) {
        _rounds_failed++;
        _replies.send(draft_reply{
            m.round,
            {},
            std::to_string(draft_rounds_queued_max) + " drafting rounds are waiting already"});
        return;
    }
    _waiting.push_back(m);
    start_next_round();
}

void draft_actor::on(const draft_forget& m) {
    for (uint64_t seq : m.seqs) {
        const bool in_round = _round && std::any_of(_round->seqs.begin(), _round->seqs.end(),
                                                    [&](const work& w) { return w.seq == seq; });
        if (in_round) {
            _forget_after_round.insert(seq);
        } else {
            forget(seq);
        }
    }
}

void draft_actor::on(const gpu::inject_fault& m) {
    if (auto st = _to_gpu.tell(m); !st.ok()) {
        log().error("fault for the draft model's device not delivered: {}", st.err().message);
    }
}

// ---- rounds -------------------------------------------------------------------------------

void draft_actor::start_next_round() {
    while (!_round && !_waiting.empty() && !stopping()) {
        draft_request req = std::move(_waiting.front());
        _waiting.pop_front();
        if (!_ready) {
            _rounds_failed++;
            _replies.send(draft_reply{req.round, {}, "the draft model's device is not ready"});
            continue;
        }
        _round.emplace();
        _round->id = req.round;
        for (const draft_seq& s : req.seqs) prepare(s, *_round);
        if (_round->seqs.empty()) {
            finish_round();  // nothing to run: answered at once
            continue;
        }
        uv_timer_start(&_round_timer, &draft_actor::round_timer_cb, _opt.round_ms_max, 0);
        run_step();
    }
}

bool draft_actor::prepare(const draft_seq& s, round_state& r) {
    auto it = _seqs.find(s.seq_id);
    const bool lost = it == _seqs.end() || it->second.truth.size() < s.known;
    const bool runnable = std::all_of(s.tokens.begin(), s.tokens.end(), [&](int32_t t) {
        return t >= 0 && uint32_t(t) < _exchange.n_vocab();
    });
    if ((s.known > 0 && lost) || !runnable) {
        // It holds less than the scheduler believes (a lost device, an eviction): the next
        // round sends the sequence whole.
        forget(s.seq_id);
        r.answered.push_back({s.seq_id, 0, {}});
        return false;
    }
    seq_state& st = _seqs[s.seq_id];
    // A sequence's tokens only grow: what it held before `known` is the scheduler's too.
    st.truth.resize(s.known);
    st.truth.insert(st.truth.end(), s.tokens.begin(), s.tokens.end());
    st.used = r.id;
    const auto n = uint32_t(st.truth.size());
    // Draft j (from 0) is read after position n - 1 + j ran; the last one is never run.
    uint32_t max = std::min(s.max, draft_tokens_per_round_max);
    max = n == 0 || n > _n_ctx ? 0 : std::min(max, _n_ctx - n + 1);
    // Roll back: the KV keeps the longest prefix that agrees with the truth, never all of it
    // (the last token runs again: its logits give the first draft).
    st.kv.resize(std::min(common_prefix(st.kv, st.truth), size_t(n == 0 ? 0 : n - 1)));
    std::set<uint64_t> keep{s.seq_id};
    for (const work& w : r.seqs) keep.insert(w.seq);
    if (max == 0 || !reserve_blocks(st, n + max - 1, keep)) {
        r.answered.push_back({s.seq_id, n, {}});
        return false;
    }
    r.seqs.push_back({s.seq_id, max, {}, false});
    return true;
}

bool draft_actor::reserve_blocks(seq_state& st, uint32_t positions,
                                 const std::set<uint64_t>& keep) {
    const size_t need = (size_t(positions) + _block_tokens - 1) / _block_tokens;
    while (st.blocks.size() > need) {
        _free.push_back(st.blocks.back());
        st.blocks.pop_back();
    }
    while (st.blocks.size() < need) {
        if (_free.empty()) {
            // The sequence used longest ago that this round does not need gives its blocks up.
            auto victim = _seqs.end();
            for (auto it = _seqs.begin(); it != _seqs.end(); ++it) {
                if (keep.count(it->first) != 0 || it->second.blocks.empty()) continue;
                if (victim == _seqs.end() || it->second.used < victim->second.used) victim = it;
            }
            if (victim == _seqs.end()) return false;
            forget(victim->first);
            continue;
        }
        st.blocks.push_back(_free.back());
        _free.pop_back();
    }
    return true;
}

void draft_actor::run_step() {
    assert(_round && _round->step_id == 0);
    round_state& r = *_round;
    gpu::step s;
    r.step.clear();
    uint32_t budget = _opt.max_batch_tokens;
    bool prefill = false, decode = false;
    for (size_t i = 0; i < r.seqs.size() && budget > 0 && s.seqs.size() < _rows_max; i++) {
        work& w = r.seqs[i];
        if (w.done) continue;
        seq_state& st = _seqs.at(w.seq);
        gpu::step_seq q;
        q.seq_id = w.seq;
        q.pos0 = uint32_t(st.kv.size());
        if (st.kv.size() < st.truth.size()) {
            // Catching up: what the KV lacks of the truth, a chunk at a time; logits after the
            // last token of it give the first draft.
            const auto n = uint32_t(std::min<size_t>(st.truth.size() - st.kv.size(), budget));
            q.tokens.assign(st.truth.begin() + q.pos0, st.truth.begin() + q.pos0 + n);
            q.logits_rows = q.pos0 + n == st.truth.size() ? 1 : 0;
        } else {
            assert(!w.drafts.empty() && st.kv.size() == st.truth.size() + w.drafts.size() - 1);
            q.tokens = {w.drafts.back()};
            q.logits_rows = 1;
        }
        const size_t blocks = (q.pos0 + q.tokens.size() + _block_tokens - 1) / _block_tokens;
        assert(blocks <= st.blocks.size());
        q.block_table.assign(st.blocks.begin(), st.blocks.begin() + blocks);
        budget -= uint32_t(q.tokens.size());
        (q.tokens.size() > 1 ? prefill : decode) = true;
        r.step.push_back({i, q.tokens, q.logits_rows});
        s.seqs.push_back(std::move(q));
    }
    assert(!s.seqs.empty() && "a round with work left has a sequence that fits a step");
    s.step_id = r.step_id = _next_step++;
    s.sample_vocab = _opt.n_vocab;  // the summaries' first candidate is greedy's draft
    s.phase = prefill && decode ? gpu::step_phase::mixed
              : prefill         ? gpu::step_phase::prefill
                                : gpu::step_phase::decode;
    if (auto st = _to_gpu.tell(s); !st.ok()) {
        fail_round("the draft model's gpu actor refused a step: " + st.err().message);
    }
}

void draft_actor::on(const gpu::step_done& m) {
    if (!_round || m.step_id != _round->step_id) {
        // The answer to a round that failed or timed out since: nothing in it is wanted.
        _exchange.release(m.slot);
        return;
    }
    round_state& r = *_round;
    r.step_id = 0;
    uint32_t row = 0;
    bool consistent = true;
    for (const ran& x : r.step) {
        work& w = r.seqs[x.work_index];
        seq_state& st = _seqs.at(w.seq);
        st.kv.insert(st.kv.end(), x.tokens.begin(), x.tokens.end());
        if (x.logits_rows == 0) continue;
        if (row >= m.rows.size() || m.rows[row] != w.seq) {
            consistent = false;
            break;
        }
        // The draft model's choice: its argmax over the ids both models share (sample_vocab),
        // the lowest on a tie, so the same row always drafts the same token.
        w.drafts.push_back(_exchange.greedy_token(m.slot, row, m.summarized, _opt.n_vocab));
        row++;
        w.done = w.drafts.size() == w.max;
    }
    _exchange.release(m.slot);
    if (!consistent) {
        // The runner answers rows in the order they were asked for; anything else is a defect,
        // and this round's KV records cannot be trusted.
        for (const work& w : r.seqs) _forget_after_round.insert(w.seq);
        fail_round("the draft step's logits rows are not the ones asked for");
        return;
    }
    if (std::all_of(r.seqs.begin(), r.seqs.end(), [](const work& w) { return w.done; })) {
        finish_round();
    } else {
        run_step();
    }
}

void draft_actor::finish_round() {
    assert(_round && _round->step_id == 0);
    uv_timer_stop(&_round_timer);
    draft_reply reply{_round->id, std::move(_round->answered), ""};
    for (work& w : _round->seqs) {
        reply.seqs.push_back({w.seq, uint32_t(_seqs.at(w.seq).truth.size()), std::move(w.drafts)});
    }
    _rounds_done++;
    _round.reset();
    for (uint64_t seq : std::exchange(_forget_after_round, {})) forget(seq);
    _replies.send(std::move(reply));
    start_next_round();
}

void draft_actor::fail_round(const std::string& why) {
    assert(_round);
    uv_timer_stop(&_round_timer);
    // A failed step wrote nothing the records count (they grow only with a step that ran), so
    // what they say is still true; a late step writes only past them.
    _rounds_failed++;
    const uint64_t id = _round->id;
    _round.reset();
    for (uint64_t seq : std::exchange(_forget_after_round, {})) forget(seq);
    _replies.send(draft_reply{id, {}, why});
    start_next_round();
}

void draft_actor::round_timer_cb(uv_timer_t* t) {
    auto& self = *static_cast<draft_actor*>(t->data);
    if (!self._round) return;
    self.log().warn("drafting round {} unanswered after {} ms", self._round->id,
                    self._opt.round_ms_max);
    self.fail_round("no answer from the draft model within " +
                    std::to_string(self._opt.round_ms_max) + " ms");
}

void draft_actor::forget(uint64_t seq) {
    auto it = _seqs.find(seq);
    if (it == _seqs.end()) return;
    _free.insert(_free.end(), it->second.blocks.begin(), it->second.blocks.end());
    _seqs.erase(it);
}

void draft_actor::forget_all() {
    // The pool went with the device: there is nothing to give back until device_ready.
    _seqs.clear();
    _free.clear();
}

// ---- the draft model's device -------------------------------------------------------------

void draft_actor::set_ready(bool ready, std::string reason) {
    if (ready != _ready) {
        log().info("draft model {}: {}", ready ? "ready" : "not ready", reason);
    }
    _ready = ready;
    _replies.send(drafter_state{ready, std::move(reason), ready ? _n_ctx : 0});
}

void draft_actor::on(const gpu::step_failed& m) {
    const bool current = _round && m.step_id == _round->step_id;
    const std::string why =
        "draft step failed: " + std::string(enum_name(m.code)) + ": " + m.message;
    if (m.device_lost) {
        forget_all();
        set_ready(false, why + " (the draft model's device is being rebuilt)");
    }
    if (current || (m.device_lost && _round)) fail_round(why);
}

void draft_actor::on(const gpu::device_ready& m) {
    if (_round) fail_round("the draft model's device was rebuilt");
    _seqs.clear();
    _free.resize(m.kv_blocks);
    // Handed out from the back: the lowest ids first.
    for (uint32_t i = 0; i < m.kv_blocks; i++) _free[i] = m.kv_blocks - 1 - i;
    _block_tokens = std::max<uint32_t>(1, m.kv_block_tokens);
    _n_ctx = m.n_ctx != 0 ? m.n_ctx : m.kv_blocks * _block_tokens;
    _rows_max = std::max<uint32_t>(1, m.rows_max);
    set_ready(true, m.device);
}

void draft_actor::on(const gpu::device_unavailable& m) {
    forget_all();
    set_ready(false, "the draft model's device is unavailable: " + m.message);
    if (_round) fail_round("the draft model's device is unavailable");
}

void draft_actor::on(const gpu::fault_refused& m) {
    log().warn("the draft model's device refused a fault: {}", m.message);
}

void draft_actor::on(const gpu::device_progress&) {
    // The draft model's build says how far it is; health follows the served model only.
}

}  // namespace ordo::draft
