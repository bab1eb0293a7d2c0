// scheduler_kv.cpp: the scheduler's side of KV persistence (kv/kv_msgs.hpp, kv_actor.hpp).
//
// Lookup order for every request: the in-memory prefix cache first (admit), then disk. A
// queued request whose prompt has more full blocks (before its last token) than the memory
// cache covered goes to phase `restoring` and asks the kv actor (kv_lookup). When the answer
// offers more blocks, the scheduler reserves them, PINS them (kv_blocks::pin: nobody can
// reallocate them while the copy-in runs, even if the request ends) and sends kv_restore; the
// kv actor verifies every block's checksum before copying. On success the request's KV
// frontier jumps past the restored blocks; they are published to the memory cache only by the
// first step that succeeds with them (commit_full_blocks), so a step that fails right after a
// restore drops them with the rest of the step and the entry is quarantined (kv_invalidate).
// A failed restore simply leaves the blocks to be recomputed. Failures are bounded per request
// by restore_retry_max; no path restores the same entry forever (ARCHITECTURE.md F7). Neither
// does any request wait for the disk forever: after restore_wait_ms in `restoring` (a slow or
// hung disk, or the kv actor's file jobs queued behind saves that are) it stops waiting and
// recomputes (expire_restores). A restore may still be copying into its pinned blocks then, so
// those leave the request's table (the pin keeps them until the kv actor answers) and the
// request starts over from the memory cache, asking the disk no more.
//
// Saves: a request that ends with stop or length hands its computed full blocks to the kv
// actor (kv_save), pinned until kv_save_done: automatic requests their prompt's blocks,
// session requests every computed block (prompt and reply) under the session's name.
#include <cassert>

#include "scheduler/scheduler_core.hpp"

namespace ordo::sched {

using door::errc;

bool scheduler_core::wants_disk(const request_state& r) const {
    // An embedding computes every token (scheduler_embed.cpp): nothing to restore.
    if (!_opt.kv_disk || r.disk_checked || !r.in_kv || r.embed) return false;
    if (r.restore_failures > _opt.restore_retry_max) return false;
    const uint32_t bt = _kv->config().block_tokens;
    // Full blocks before the last token: the last one is always computed (it gives logits).
    const uint32_t full = (uint32_t(r.tokens.size()) - 1) / bt;
    return full > r.n_past / bt;
}

void scheduler_core::start_disk_lookup(request_state& r) {
    const uint32_t bt = _kv->config().block_tokens;
    const uint32_t full = (uint32_t(r.tokens.size()) - 1) / bt;
    r.disk_checked = true;
    r.ph = phase::restoring;
    r.restore_due = clock::now() + std::chrono::milliseconds(_opt.restore_wait_ms);
    _restoring.push_back(r.seq);
    _counters.disk_lookups++;
    kv::kv_lookup m;
    m.seq = r.seq;
    m.tokens.assign(r.tokens.begin(), r.tokens.begin() + size_t(full) * bt);
    m.session = r.params.session;
    _kv_out.emplace_back(std::move(m));
}

void scheduler_core::restored_to_running(request_state& r) {
    std::erase(_restoring, r.seq);
    r.ph = phase::running;
    _running.push_back(r.seq);
}

void scheduler_core::on_kv_lookup_done(const kv::kv_lookup_done& m, std::vector<outgoing_event>&) {
    request_state* r = find(m.seq);
    if (r == nullptr || r->ph != phase::restoring || _restore_pins.count(m.seq) != 0) {
        if (m.n_blocks > 0) _kv_out.emplace_back(kv::kv_release{m.seq});
        return;
    }
    const uint32_t bt = _kv->config().block_tokens;
    const uint32_t have = r->n_past / bt;
    bool restoring = false;
    if (m.n_blocks > have && r->in_kv && _device_ready) {
        _counters.disk_hits++;
        if (_kv->reserve(r->seq, m.n_blocks * bt).ok()) {
            auto table = _kv->block_table(r->seq);
            std::vector<block_id> blocks(table.begin() + have, table.begin() + m.n_blocks);
            auto pin = _kv->pin(blocks);
            if (pin.ok()) {
                _restore_pins[r->seq] = *pin;
                r->restore_to = m.n_blocks * bt;
                r->restored_from = m.name;
                _kv_out.emplace_back(kv::kv_restore{r->seq, have, std::move(blocks), _gpu.epoch});
                restoring = true;
            }
        }
    }
    if (!restoring) {
        if (m.n_blocks > 0) _kv_out.emplace_back(kv::kv_release{m.seq});
        restored_to_running(*r);
    }
}

void scheduler_core::on_kv_restore_done(const kv::kv_restore_done& m,
                                        std::vector<outgoing_event>&) {
    auto pin = _restore_pins.find(m.seq);
    if (pin == _restore_pins.end()) return;  // not ours (a stale answer)
    // A pin dropped by invalidate_all: the device was lost meanwhile, the blocks are gone.
    const bool pool_kept = _kv->unpin(pin->second);
    _restore_pins.erase(pin);
    request_state* r = find(m.seq);
    if (r == nullptr || r->ph != phase::restoring) return;  // the request ended meanwhile
    if (m.ok && pool_kept && r->in_kv) {
        const uint32_t restored = r->restore_to - r->n_past;
        r->n_past = r->restore_to;
        _counters.disk_restores++;
        _counters.disk_restored_tokens += restored;
        if (!r->started) {
            const uint32_t cached = std::min(r->n_past, r->n_prompt);
            _counters.cached_tokens += cached - r->cached_tokens;
            r->cached_tokens = cached;
        }
    } else {
        _counters.disk_restore_failures++;
        r->restore_failures++;
        r->restored_from.clear();
        if (r->restore_failures <= _opt.restore_retry_max) {
            // Another disk lookup may find another entry (the kv actor quarantined this one):
            // back to the head of the queue, holding its sequence.
            std::erase(_restoring, r->seq);
            r->ph = phase::queued;
            r->disk_checked = false;
            _queue.push_front(r->seq);
            return;
        }
        // The reserved blocks past n_past are recomputed by the prefill.
    }
    restored_to_running(*r);
}

std::optional<scheduler_core::clock::time_point> scheduler_core::restore_deadline() const {
    std::optional<clock::time_point> first;
    for (seq_id s : _restoring) {
        const request_state& r = _requests.at(s);
        if (!first || r.restore_due < *first) first = r.restore_due;
    }
    return first;
}

void scheduler_core::expire_restores(clock::time_point now) {
    std::vector<seq_id> late;
    for (seq_id s : _restoring) {
        if (now >= _requests.at(s).restore_due) late.push_back(s);
    }
    for (seq_id s : late) {
        request_state& r = *find(s);
        _counters.disk_restore_timeouts++;
        _notes.push_back("request " + std::to_string(r.id) + " (sequence " + std::to_string(s) +
                         ") stopped waiting for the kv actor after restore_wait_ms = " +
                         std::to_string(_opt.restore_wait_ms) + " ms; recomputing its prefix");
        // No more disk for this request: the disk did not answer in time.
        r.restore_failures = _opt.restore_retry_max + 1;
        r.restored_from.clear();
        if (_restore_pins.count(s) == 0) {
            // Still at the lookup: nothing reserved past n_past. A late answer finds the request
            // out of `restoring` and releases the entry's lease (on_kv_lookup_done).
            restored_to_running(r);
            continue;
        }
        // A restore may still copy into the pinned blocks: the sequence lets go of every block
        // (the pin holds those until the answer, which then only unpins them) and is admitted
        // again from the memory cache at the head of the queue.
        if (!r.started) {
            _counters.cached_tokens -= r.cached_tokens;
            r.cached_tokens = 0;
        }
        free_kv(r);
        r.n_past = 0;
        std::erase(_restoring, s);
        r.ph = phase::queued;
        _queue.push_front(s);
    }
}

void scheduler_core::restore_step_failed(request_state& r, const std::string& why) {
    if (r.restored_from.empty()) return;
    _counters.disk_invalidations++;
    _kv_out.emplace_back(kv::kv_invalidate{r.restored_from, why});
    r.restored_from.clear();
    r.restore_failures++;
}

void scheduler_core::save_to_disk(request_state& r) {
    if (!_opt.kv_disk || !r.in_kv || !_device_ready) return;
    const uint32_t bt = _kv->config().block_tokens;
    uint32_t committed = _kv->committed_tokens(r.seq);
    const bool session = r.params.session.has_value();
    if (!session) committed = std::min(committed, r.n_prompt);
    const uint32_t n_blocks = committed / bt;
    if (n_blocks == 0) return;
    auto table = _kv->block_table(r.seq);
    std::vector<block_id> blocks(table.begin(), table.begin() + n_blocks);
    auto pin = _kv->pin(blocks);
    if (!pin.ok()) return;
    _save_pins.insert(*pin);
    kv::kv_save m;
    m.save_id = *pin;
    m.kind = session ? kv::kv_file_kind::session : kv::kv_file_kind::prefix;
    m.session = r.params.session;
    m.tokens.assign(r.tokens.begin(), r.tokens.begin() + size_t(n_blocks) * bt);
    m.blocks = std::move(blocks);
    m.epoch = _gpu.epoch;
    _counters.disk_saves++;
    _kv_out.emplace_back(std::move(m));
}

void scheduler_core::on_kv_save_done(const kv::kv_save_done& m) {
    // Not in flight any more when the pool was dropped since (device lost or rebuilt): its blocks
    // are gone, nothing to release.
    if (_save_pins.erase(m.save_id) == 0) return;
    [[maybe_unused]] const bool unpinned = _kv->unpin(m.save_id);
    assert(unpinned && "a save's pin is held until its answer or the pool's end");
}

void scheduler_core::on_kv_evicted(const kv::kv_evicted&) {
    _counters.disk_evicted++;
}

void scheduler_core::on_kv_status(const kv::kv_status& m) {
    _kv_reason = m.persisting ? "" : m.reason;
}

void scheduler_core::on_session_delete(const session_delete& m, std::vector<outgoing_event>& out) {
    if (!_opt.kv_disk) {
        return out.push_back(error_event(m.conn, m.id, errc::bad_request,
                                         "session_delete needs persisted KV ([kv] enabled)"));
    }
    if (_draining) return out.push_back(draining_refusal(m.conn, m.id));
    if (_sessions.count(m.session) != 0) {
        _counters.session_busy++;
        return out.push_back(error_event(m.conn, m.id, errc::session_busy,
                                         "session " + m.session + " is used by a live request"));
    }
    if (_deletes.size() >= session_deletes_waiting_max) {
        _counters.overloaded++;
        return out.push_back(
            error_event(m.conn, m.id, errc::overloaded,
                        std::to_string(session_deletes_waiting_max) +
                            " session_deletes already wait for the disk; retry later"));
    }
    const uint64_t ticket = _next_delete_ticket++;
    _deletes.push_back(
        {m.conn, m.id, ticket, clock::now() + std::chrono::milliseconds(_opt.restore_wait_ms)});
    _kv_out.emplace_back(kv::kv_session_delete{m.conn, m.id, m.session, ticket});
}

std::optional<scheduler_core::clock::time_point> scheduler_core::session_delete_deadline() const {
    if (_deletes.empty()) return std::nullopt;
    return _deletes.front().due;
}

void scheduler_core::expire_session_deletes(clock::time_point now,
                                            std::vector<outgoing_event>& out) {
    while (!_deletes.empty() && now >= _deletes.front().due) {
        const delete_wait& d = _deletes.front();
        _counters.session_delete_timeouts++;
        out.push_back(error_event(d.conn, d.id, errc::kv_io,
                                  "the disk did not answer within kv.restore_wait_ms = " +
                                      std::to_string(_opt.restore_wait_ms) +
                                      " ms; the session's file may or may not be removed yet"));
        _deletes.pop_front();
    }
}

void scheduler_core::on_kv_session_deleted(const kv::kv_session_deleted& m,
                                           std::vector<outgoing_event>& out) {
    auto waiting = std::find_if(_deletes.begin(), _deletes.end(),
                                [&](const delete_wait& d) { return d.ticket == m.ticket; });
    if (waiting == _deletes.end()) {
        // Answered already: it waited restore_wait_ms (expire_session_deletes).
        _counters.session_delete_late_answers++;
        _notes.push_back("a late session_delete answer (request " + std::to_string(m.id) +
                         ") dropped: its client was told after restore_wait_ms");
        return;
    }
    const delete_wait d = *waiting;
    _deletes.erase(waiting);
    if (!m.error.empty()) return out.push_back(error_event(d.conn, d.id, errc::kv_io, m.error));
    out.push_back(door::session_delete_done{d.conn, d.id, m.deleted});
}

}  // namespace ordo::sched
