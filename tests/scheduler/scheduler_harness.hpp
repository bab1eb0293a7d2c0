// scheduler_harness.hpp: the scheduler core's test harness (scheduler_core_test.cpp,
// scheduler_kv_test.cpp): a generated model, the CPU reference forward pass running every step
// the core plans (real logits, no stand-ins), an emulated paged KV pool that remembers each
// slot's token so a sharing mistake shows as wrong output, and `disk`, an in-memory stand-in for
// the kv actor.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "gpu/actor/step_draws.hpp"
#include "model/gguf.hpp"
#include "model/reference.hpp"
#include "model/synth.hpp"
#include "net/ops.hpp"
#include "net/protocol.hpp"
#include "scheduler/scheduler_core.hpp"

namespace ordo::sched::core_test {

using ordo::gpu::gpu_failure;

struct event {
    uint64_t conn = 0, id = 0;
    bool terminal = false;
    std::map<std::string, msgpack::object> fields;
    std::shared_ptr<msgpack::object_handle> holder;
    std::string str(const std::string& k) const {
        auto it = fields.find(k);
        return it == fields.end() ? "" : it->second.as<std::string>();
    }
    std::vector<int32_t> tokens() const { return fields.at("tokens").as<std::vector<int32_t>>(); }
};

constexpr uint32_t k_model_n_embd = 64;

class model_fixture {
public:
    model_fixture() {
        path = (std::filesystem::temp_directory_path() /
                ("ordo_sched_core_" + std::to_string(getpid()) + ".gguf"))
                   .string();
        model::synth_options o;
        o.n_embd = k_model_n_embd, o.n_layer = 2, o.n_head = 4, o.n_head_kv = 2, o.n_ff = 96;
        o.n_vocab = 300, o.n_ctx = 256, o.seed = 7;
        EXPECT_TRUE(model::write_synth_model(o, path).ok());
        auto f = model::gguf_file::open(path);
        EXPECT_TRUE(f.ok());
        file.emplace(std::move(*f));
        auto t = model::tokenizer::from_gguf(*file);
        EXPECT_TRUE(t.ok());
        tok.emplace(std::move(*t));
    }
    ~model_fixture() { std::filesystem::remove(path); }
    std::string path;
    std::optional<model::gguf_file> file;
    std::optional<model::tokenizer> tok;
};

inline model_fixture& shared_model() {
    static model_fixture m;
    return m;
}

// The kv actor's answers, in memory: entries of token ids (whole blocks). Restores write the
// entry's ids into the emulated pool's block slots, saves read them from there.
struct disk {
    std::vector<std::vector<int32_t>> entries;  // empty: quarantined or deleted
    std::map<uint64_t, size_t> leases;          // seq -> entry
    std::vector<std::pair<std::string, std::vector<int32_t>>> sessions;
    bool fail_restores = false;
    bool hold_restores = false;      // answer restores only when released
    bool restore_other_ids = false;  // restores write other token ids than the entry's
    std::vector<kv::kv_restore> held;
    bool hold_deletes = false;  // session deletes are never answered (a hung unlink)
    std::vector<kv::kv_session_delete> held_deletes;
    int saves = 0, restores = 0, invalidated = 0, lookups = 0;
};

// Runs the scheduler against CPU reference models, one per sequence.
class harness {
public:
    // `tok`: the tokenizer the scheduler sees (default: the model's own).
    explicit harness(core_options o = {}, uint32_t kv_blocks = 256, uint32_t block_tokens = 8,
                     uint32_t device_n_ctx = 0, const model::tokenizer* tok = nullptr) {
        o.n_ctx = o.n_ctx ? o.n_ctx : 256;
        model_info info;
        info.n_embd = k_model_n_embd;
        auto c = scheduler_core::create(o, tok ? tok : &*shared_model().tok, info);
        EXPECT_TRUE(c.ok());
        core.emplace(std::move(*c));
        std::vector<outgoing_event> out;
        core->on_device_ready(
            {0, "cpu-reference", kv_blocks, block_tokens, 16, {}, device_n_ctx, "device", 0, 0},
            out);
        collect(out);
    }

    // The device says again that it is ready (same epoch and pool), with the logits rows a step
    // may have and those a step of several decode iterations may bring back in all
    // (gpu::device_ready::decode_rows_max); a device rebuild says the same.
    void device_rows(uint32_t rows_max, uint32_t decode_rows_max) {
        device_rows_max = rows_max;
        device_decode_rows_max = decode_rows_max;
        std::vector<outgoing_event> out;
        core->on_device_ready({epoch,
                               "cpu-reference",
                               core->kv_stats().blocks_total,
                               block_tokens(),
                               rows_max,
                               {},
                               0,
                               "",
                               0,
                               0,
                               decode_rows_max},
                              out);
        collect(out);
    }

    // Parses the frame with the front door's validator (net/ops.hpp) and applies the typed op,
    // as the scheduler actor would; a refused frame becomes the error event net would send.
    void request(uint64_t conn, uint64_t id, const std::string& op, msgpack::sbuffer frame) {
        auto oh = msgpack::unpack(frame.data(), frame.size());
        auto env = net::parse_envelope(oh.get());
        ASSERT_TRUE(std::holds_alternative<net::request>(env));
        ASSERT_EQ(std::get<net::request>(env).op, op);
        net::request_limits limits{256, uint32_t(shared_model().tok->vocab().size()),
                                   kv != nullptr};
        auto parsed = net::parse_op(std::get<net::request>(env), limits);
        std::vector<outgoing_event> out;
        if (!parsed.ok()) {
            out.push_back(error_event(conn, id, door::errc::bad_request, parsed.err().message));
            collect(out);
            return;
        }
        std::visit(
            [&](auto& m) {
                using T = std::decay_t<decltype(m)>;
                if constexpr (requires { m.conn; }) m.conn = conn;
                if constexpr (std::is_same_v<T, sched::generate>) core->on_generate(m, out);
                if constexpr (std::is_same_v<T, sched::embed>) core->on_embed(m, out);
                if constexpr (std::is_same_v<T, sched::cancel>) core->on_cancel(m, out);
                if constexpr (std::is_same_v<T, sched::tokenize>) core->on_tokenize(m, out);
                if constexpr (std::is_same_v<T, sched::detokenize>) core->on_detokenize(m, out);
                if constexpr (std::is_same_v<T, stats_query>) core->on_stats(m, out);
                if constexpr (std::is_same_v<T, model_info_query>) core->on_model(m, out);
                if constexpr (std::is_same_v<T, sched::session_delete>) {
                    core->on_session_delete(m, out);
                }
            },
            *parsed);
        collect(out);
    }

    void generate(uint64_t conn, uint64_t id, const std::string& prompt, uint32_t max_tokens,
                  double temperature = 0, uint64_t seed = 0, const std::string& session = "") {
        msgpack::sbuffer b;
        msgpack::packer<msgpack::sbuffer> pk(b);
        pk.pack_map(session.empty() ? 7 : 8);
        pk.pack("id"), pk.pack(id), pk.pack("op"), pk.pack("generate");
        pk.pack("prompt"), pk.pack(prompt), pk.pack("max_tokens"), pk.pack(max_tokens);
        pk.pack("temperature"), pk.pack(temperature), pk.pack("seed"), pk.pack(seed);
        pk.pack("stream"), pk.pack(true);
        if (!session.empty()) pk.pack("session"), pk.pack(session);
        request(conn, id, "generate", std::move(b));
    }

    void session_delete(uint64_t conn, uint64_t id, const std::string& session) {
        msgpack::sbuffer b;
        msgpack::packer<msgpack::sbuffer> pk(b);
        pk.pack_map(3);
        pk.pack("id"), pk.pack(id), pk.pack("op"), pk.pack("session_delete");
        pk.pack("session"), pk.pack(session);
        request(conn, id, "session_delete", std::move(b));
        serve_kv();
    }

    // Answers every kv request the core made, as the kv actor would (until none is left).
    // Returns whether there was any.
    bool serve_kv() {
        if (kv == nullptr) return false;
        const uint32_t B = block_tokens();
        bool any = false;
        for (auto reqs = core->take_kv_requests(); !reqs.empty(); reqs = core->take_kv_requests()) {
            std::vector<outgoing_event> out;
            for (auto& req : reqs) {
                std::visit([&](auto& m) { answer(m, B, out); }, req);
            }
            collect(out);
            any = true;
        }
        return any;
    }

    void release_held_restores() {
        std::vector<kv::kv_restore> held = std::exchange(kv->held, {});
        std::vector<outgoing_event> out;
        for (auto& m : held) finish_restore(m, block_tokens(), out);
        collect(out);
        serve_kv();
    }

    // The `embed` op: `input` text, or `ids` when text is empty.
    void embed(uint64_t conn, uint64_t id, const std::string& input,
               const std::vector<int32_t>& ids = {}) {
        msgpack::sbuffer b;
        msgpack::packer<msgpack::sbuffer> pk(b);
        pk.pack_map(3);
        pk.pack("id"), pk.pack(id), pk.pack("op"), pk.pack("embed");
        if (input.empty()) {
            pk.pack("tokens"), pk.pack(ids);
        } else {
            pk.pack("input"), pk.pack(input);
        }
        request(conn, id, "embed", std::move(b));
    }

    void cancel(uint64_t conn, uint64_t id, uint64_t target) {
        msgpack::sbuffer b;
        msgpack::packer<msgpack::sbuffer> pk(b);
        pk.pack_map(3);
        pk.pack("id"), pk.pack(id), pk.pack("op"), pk.pack("cancel");
        pk.pack("target"), pk.pack(target);
        request(conn, id, "cancel", std::move(b));
    }

    // The draft actor's part (speculative mode draft): answers each round the core starts
    // (none set: a round stays unanswered and run() returns, as with nothing to do).
    std::function<draft::draft_reply(const draft::draft_request&)> drafter;
    uint64_t draft_rounds = 0;
    std::vector<uint64_t> draft_forgets;  // sequences the core let the draft actor forget

    // Executes steps until none is left. `between(step)` runs after a step is planned and
    // before its outcome is applied; `fail(step)` decides whether the step fails.
    void run(std::function<void(const gpu::step&)> between = {},
             std::function<std::optional<gpu::step_failed>(const gpu::step&)> fail = {}) {
        for (int guard = 0; guard < 100000; guard++) {
            serve_kv();
            auto s = core->next_step();
            auto forgets = core->take_draft_forgets();
            draft_forgets.insert(draft_forgets.end(), forgets.begin(), forgets.end());
            if (!s) {
                // Planning may have started a drafting round instead of a step.
                if (auto round = core->take_draft_request()) {
                    draft_rounds++;
                    if (drafter) core->on_draft_reply(drafter(*round));
                    continue;
                }
                if (!serve_kv()) return;  // planning may have asked for a disk lookup
                continue;
            }
            serve_kv();
            if (between) between(*s);
            std::vector<outgoing_event> out;
            if (auto f = fail ? fail(*s) : std::nullopt) {
                f->step_id = s->step_id;
                core->on_step_failed(*f, out);
                if (f->device_lost) {
                    collect(out);
                    out.clear();
                    core->on_device_ready({++epoch,
                                           "cpu-reference",
                                           core->kv_stats().blocks_total,
                                           block_tokens(),
                                           device_rows_max,
                                           {},
                                           0,
                                           "",
                                           0,
                                           0,
                                           device_decode_rows_max},
                                          out);
                }
            } else {
                // An end the scheduler asks for once the step is out (a request arrived or was
                // cancelled: take_decode_steps_end), taken as early as the gpu actor could take
                // it: after the step's first iteration.
                const auto end = core->take_decode_steps_end();
                if (end) ends_asked.push_back(*end);
                gpu::step_done d = execute(*s, end == s->step_id ? 1 : s->decode_steps);
                scheduler_core::summary_reader sums;
                if (d.summarized) {
                    sums = [&](uint32_t r) { return std::span<const uint32_t>(summaries[r]); };
                }
                core->on_step_done(
                    d, [&](uint32_t r) { return std::span<const float>(rows[r]); },
                    [&](uint32_t r) { return std::span<const float>(hidden[r]); }, out, sums);
            }
            collect(out);
        }
        FAIL() << "scheduler never went idle";
    }

    std::vector<event> events_of(uint64_t conn, uint64_t id) const {
        std::vector<event> r;
        for (const auto& e : events) {
            if (e.conn == conn && e.id == id) r.push_back(e);
        }
        return r;
    }
    const event* terminal(uint64_t conn, uint64_t id) const {
        const event* t = nullptr;
        for (const auto& e : events) {
            if (e.conn == conn && e.id == id && e.terminal) {
                EXPECT_EQ(t, nullptr) << "two terminal events for " << conn << "/" << id;
                t = &e;
            }
        }
        return t;
    }
    // Records events the test produced by calling the core directly.
    void apply(std::vector<outgoing_event>& out) { collect(out); }

    void expect_idle() const {
        EXPECT_EQ(core->active_sequences(), 0u);
        EXPECT_EQ(core->queued_requests(), 0u);
        auto kv = core->kv_stats();
        EXPECT_EQ(kv.blocks_used, 0u);
        EXPECT_EQ(kv.sequences, 0u);
    }

    std::optional<scheduler_core> core;
    std::vector<event> events;
    uint64_t epoch = 0;
    uint32_t device_rows_max = 16, device_decode_rows_max = 0;  // device_rows
    disk* kv = nullptr;                                         // set with core_options.kv_disk

private:
    void answer(const kv::kv_lookup& m, uint32_t B, std::vector<outgoing_event>& out) {
        kv->lookups++;
        auto common = [&](const std::vector<int32_t>& e) {
            size_t n = 0;
            while (n < e.size() && n < m.tokens.size() && e[n] == m.tokens[n]) n++;
            return uint32_t(n / B);
        };
        uint32_t best = 0;
        size_t which = 0;
        std::vector<int32_t>* session_entry = nullptr;
        if (m.session) {
            for (auto& [name, t] : kv->sessions) {
                if (name == *m.session) session_entry = &t;
            }
        }
        if (session_entry != nullptr && common(*session_entry) > 0) {
            kv->entries.push_back(*session_entry);  // a lease needs an entry id
            best = common(*session_entry);
            which = kv->entries.size() - 1;
        }
        for (size_t i = 0; i < kv->entries.size(); i++) {
            if (common(kv->entries[i]) > best) best = common(kv->entries[i]), which = i;
        }
        if (best > 0) kv->leases[m.seq] = which;
        core->on_kv_lookup_done({m.seq, best, best ? "e" + std::to_string(which) : ""}, out);
    }
    void answer(const kv::kv_restore& m, uint32_t B, std::vector<outgoing_event>& out) {
        if (kv->hold_restores) return kv->held.push_back(m);
        finish_restore(m, B, out);
    }
    void finish_restore(const kv::kv_restore& m, uint32_t B, std::vector<outgoing_event>& out) {
        auto lease = kv->leases.find(m.seq);
        EXPECT_NE(lease, kv->leases.end()) << "restore without a lease";
        if (lease == kv->leases.end()) return;
        const auto& e = kv->entries[lease->second];
        kv->leases.erase(lease);
        if (kv->fail_restores || e.empty()) {
            core->on_kv_restore_done({m.seq, false, kv::kv_failure_of(kv::kv_error::block_checksum),
                                      "block 0 corrupt", 0},
                                     out);
            return;
        }
        for (size_t i = 0; i < m.blocks.size(); i++) {
            auto& blk = pool[m.blocks[i]];
            blk.assign(e.begin() + (m.first_block + i) * B,
                       e.begin() + (m.first_block + i + 1) * B);
            if (kv->restore_other_ids) {
                for (int32_t& id : blk) id = id == 7 ? 8 : 7;
            }
        }
        kv->restores++;
        core->on_kv_restore_done({m.seq, true, kv::kv_failure::none, "", 1.0}, out);
    }
    void answer(const kv::kv_release& m, uint32_t, std::vector<outgoing_event>&) {
        kv->leases.erase(m.seq);
    }
    void answer(const kv::kv_save& m, uint32_t B, std::vector<outgoing_event>&) {
        // The pinned blocks must hold exactly the ids the save names.
        std::vector<int32_t> held;
        for (uint32_t b : m.blocks) {
            auto& blk = pool[b];
            held.insert(held.end(), blk.begin(), blk.end());
        }
        EXPECT_EQ(held, m.tokens) << "a save names blocks that do not hold its tokens";
        kv->saves++;
        if (m.kind == kv::kv_file_kind::session) {
            std::erase_if(kv->sessions, [&](const auto& s) { return s.first == *m.session; });
            kv->sessions.emplace_back(*m.session, m.tokens);
        } else {
            kv->entries.push_back(m.tokens);
        }
        core->on_kv_save_done({m.save_id, true, kv::kv_failure::none});
    }
    void answer(const kv::kv_invalidate& m, uint32_t, std::vector<outgoing_event>&) {
        kv->invalidated++;
        kv->entries.at(std::stoul(m.name.substr(1))).clear();
    }
    void answer(const kv::kv_session_delete& m, uint32_t, std::vector<outgoing_event>& out) {
        if (kv->hold_deletes) return kv->held_deletes.push_back(m);
        size_t before = kv->sessions.size();
        std::erase_if(kv->sessions, [&](const auto& s) { return s.first == m.session; });
        core->on_kv_session_deleted({m.conn, m.id, kv->sessions.size() != before, "", m.ticket},
                                    out);
    }

    uint32_t block_tokens() const { return 8; }

    // A step of several decode iterations as the gpu actor runs it (gpu_actor::run_decode_steps):
    // each iteration a step of its own, each row's draw (gpu::step_draws, the actor's own: greedy,
    // or a copy of the request's sampler from the row or, with summarize_rows, its summary
    // alone) the next iteration's token at the next position, ending early where a draw is not
    // settled or is one of the step's end_tokens, or after `end_after` iterations
    // (gpu::end_decode_steps); the rows moved to
    // gpu::decode_row (of the earlier iterations, only the summaries where there are some).
    gpu::step_done execute(const gpu::step& s, uint32_t end_after) {
        if (s.decode_steps <= 1) return execute_one(s);
        const uint32_t k = s.decode_steps;
        const auto n = uint32_t(s.seqs.size());
        auto draws = gpu::step_draws::create(s, s.sample_vocab);
        EXPECT_TRUE(draws.ok()) << (draws.ok() ? "" : draws.err().message);
        if (!draws) return execute_one(s);
        gpu::step it = s;
        it.decode_steps = 1;
        gpu::step_done d;
        std::vector<std::vector<float>> placed(size_t(k) * n);
        std::vector<std::vector<uint32_t>> placed_summaries(size_t(k) * n);
        std::vector<int32_t> next(n);
        uint32_t ran = 0;
        for (uint32_t i = 0; i < k; i++) {
            gpu::step_done one = execute_one(it);
            EXPECT_EQ(one.rows.size(), n);
            if (i == 0) d = one;
            ran = i + 1;
            bool settled = i + 1 < k && i + 1 < end_after;
            for (uint32_t j = 0; settled && j < n && j < rows.size(); j++) {
                next[j] = draws->next(j, rows[j],
                                      one.summarized ? std::span<const uint32_t>(summaries[j])
                                                     : std::span<const uint32_t>());
                settled = next[j] >= 0 && !draws->ends(next[j]);
            }
            // Where this iteration's rows go: after the last's, unless it is the last.
            const uint32_t iterations = settled ? k : i + 1;
            for (uint32_t j = 0; j < n && j < rows.size(); j++) {
                const uint32_t at = gpu::decode_row(i, iterations, n, j);
                if (!one.summarized || at < n) placed[at] = rows[j];
                if (one.summarized) placed_summaries[at] = summaries[j];
            }
            if (!settled) break;
            for (uint32_t j = 0; j < n; j++) {
                int32_t t = next[j];
                if (tamper_draw) t = tamper_draw(it.seqs[j].seq_id, i, t);
                d.draws.push_back(t);
                it.seqs[j].tokens[0] = t;
                it.seqs[j].pos0++;
            }
        }
        d.decode_steps = ran;
        rows = std::move(placed);
        summaries = std::move(placed_summaries);
        return d;
    }

public:
    // Changes the draw a decode iteration hands to the next one (sequence, iteration, draw):
    // a device that draws wrong.
    std::function<int32_t(uint64_t, uint32_t, int32_t)> tamper_draw;
    // The steps the core asked to end early (take_decode_steps_end), in order.
    std::vector<uint64_t> ends_asked;
    // Steps come back with their rows' summaries (summarize(): the GPU kernel's host twin), as
    // on a GPU; a step of several decode iterations then keeps only the earlier ones' summaries.
    bool summarize_rows = false;

private:
    // Emulates the paged KV pool faithfully enough to catch sharing mistakes: each block slot
    // remembers the token written there, and a sequence's reference model is replayed from the
    // tokens its block table holds for [0, pos0) whenever they differ from what it has seen.
    gpu::step_done execute_one(const gpu::step& s) {
        const uint32_t B = block_tokens();
        gpu::step_done d;
        d.step_id = s.step_id;
        d.n_vocab = uint32_t(shared_model().tok->vocab().size());
        d.summarized = summarize_rows;
        rows.clear();
        summaries.clear();
        hidden.clear();
        for (const auto& q : s.seqs) {
            std::vector<int32_t> prefix;
            for (uint32_t p = 0; p < q.pos0; p++) {
                auto& blk = pool[q.block_table.at(p / B)];
                prefix.push_back(blk.empty() ? -1 : blk[p % B]);
            }
            auto& st = states[q.seq_id];
            if (!st.model) {
                auto r = model::reference_model::create(*shared_model().file, 256);
                EXPECT_TRUE(r.ok());
                st.model = std::make_unique<model::reference_model>(std::move(*r));
            }
            if (st.fed.size() < prefix.size() ||
                !std::equal(prefix.begin(), prefix.end(), st.fed.begin())) {
                st.fed.clear();
                for (uint32_t p = 0; p < prefix.size(); p++) {
                    EXPECT_GE(prefix[p], 0) << "block slot read before written";
                    EXPECT_TRUE(st.model->forward(uint32_t(std::max(prefix[p], 0)), p).ok());
                    st.fed.push_back(prefix[p]);
                }
            }
            st.fed.resize(q.pos0);
            std::vector<std::vector<float>> logits;        // each token's
            std::vector<float> sum(k_model_n_embd, 0.0f);  // the hidden row it asked for
            for (size_t i = 0; i < q.tokens.size(); i++) {
                uint32_t pos = q.pos0 + uint32_t(i);
                auto& blk = pool[q.block_table.at(pos / B)];
                blk.resize(B, -1);
                blk[pos % B] = q.tokens[i];
                auto l = st.model->forward(uint32_t(q.tokens[i]), pos);
                EXPECT_TRUE(l.ok());
                logits.emplace_back(l->begin(), l->end());
                st.fed.push_back(q.tokens[i]);
                const bool take =
                    q.hidden == gpu::hidden_output::sum ||
                    (q.hidden == gpu::hidden_output::first && i == 0) ||
                    (q.hidden == gpu::hidden_output::last && i + 1 == q.tokens.size());
                for (uint32_t e = 0; take && e < k_model_n_embd; e++) {
                    sum[e] += st.model->final_hidden()[e];
                }
            }
            for (size_t i = q.tokens.size() - q.logits_rows; i < q.tokens.size(); i++) {
                d.rows.push_back(q.seq_id);
                rows.push_back(logits[i]);
                if (summarize_rows) {
                    summaries.push_back(summary_words(summarize(logits[i], q.temperature)));
                }
            }
            if (q.hidden != gpu::hidden_output::none) {
                d.hidden_rows.push_back(q.seq_id);
                hidden.push_back(std::move(sum));
            }
        }
        return d;
    }

    // Each typed event is encoded as the net actor would and kept as its decoded wire map.
    void collect(std::vector<outgoing_event>& out) {
        for (auto& o : out) {
            event e;
            std::tie(e.conn, e.id) = request_of(o);
            e.terminal = !std::holds_alternative<door::token_event>(o);
            std::string frame = std::visit([](const auto& m) { return net::encode(m); }, o);
            e.holder = std::make_shared<msgpack::object_handle>(
                msgpack::unpack(frame.data(), frame.size()));
            e.holder->get().convert(e.fields);
            events.push_back(std::move(e));
        }
        out.clear();
        auto st = core->check_invariants();
        EXPECT_TRUE(st.ok()) << st.err().message;
    }

    struct seq_state {
        std::unique_ptr<model::reference_model> model;
        std::vector<int32_t> fed;  // tokens at positions 0.. in the model's cache
    };
    std::map<uint64_t, seq_state> states;
    std::map<uint32_t, std::vector<int32_t>> pool;  // block id -> token per slot
    std::vector<std::vector<float>> rows;
    std::vector<std::vector<uint32_t>> summaries;  // with summarize_rows: each row's
    std::vector<std::vector<float>> hidden;        // the last step's hidden rows
};

// What the reference generator gives for a prompt alone (greedy).
inline std::vector<int32_t> reference_greedy(const std::string& prompt, uint32_t n) {
    auto& m = shared_model();
    auto r = model::reference_model::create(*m.file, 256);
    EXPECT_TRUE(r.ok());
    std::vector<int32_t> ids = m.tok->encode(prompt, true);
    std::vector<int32_t> out;
    std::span<const float> logits;
    for (size_t i = 0; i < ids.size(); i++) logits = *r->forward(uint32_t(ids[i]), uint32_t(i));
    for (uint32_t k = 0; k < n; k++) {
        int32_t best = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
        out.push_back(best);
        if (best == m.tok->vocab().eos()) break;
        logits = *r->forward(uint32_t(best), uint32_t(ids.size() + k));
    }
    return out;
}

inline const std::vector<std::string> prompts = {
    "Once upon a time",
    "the cat",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z",
    "hello world, this is a longer prompt that spans several blocks of eight tokens",
    "x",
    "42",
    "zzz top",
    "Lorem ipsum dolor sit amet"};

// Outputs of each prompt run alone with (temperature, seed) = (0.8, i).
inline std::vector<std::vector<int32_t>> alone_outputs(uint32_t n) {
    std::vector<std::vector<int32_t>> r;
    for (size_t i = 0; i < prompts.size(); i++) {
        harness h;
        h.generate(1, 1, prompts[i], n, 0.8, i);
        h.run();
        r.push_back(h.terminal(1, 1)->tokens());
    }
    return r;
}

// The model's tokenizer with `eot` named as its end-of-turn token (tokenizer.ggml.eot_token_id):
// a vocabulary whose end-of-generation set holds an id the model samples.
inline model::tokenizer tokenizer_with_eot(int32_t eot) {
    const model::vocab& v = shared_model().tok->vocab();
    model::vocab_spec spec;
    spec.model = v.model();
    for (int32_t i = 0; i < int32_t(v.size()); ++i) {
        spec.pieces.push_back(v.piece(i));
        spec.scores.push_back(v.score(i));
        spec.types.push_back(v.type(i));
    }
    spec.bos = v.bos(), spec.eos = v.eos(), spec.unk = v.unk(), spec.eot = eot;
    spec.add_bos = v.add_bos(), spec.add_space_prefix = v.add_space_prefix();
    auto eot_vocab = model::vocab::from_spec(std::move(spec));
    EXPECT_TRUE(eot_vocab.ok());
    return model::tokenizer(std::move(*eot_vocab));
}

// The first index from `from` on whose token does not occur before it in `tokens` (its size:
// none): a token that, named end of generation, ends the output exactly there.
inline size_t first_new_token(const std::vector<int32_t>& tokens, size_t from) {
    size_t k = from;
    while (k < tokens.size() &&
           std::count(tokens.begin(), tokens.begin() + long(k), tokens[k]) != 0) {
        ++k;
    }
    return k;
}

}  // namespace ordo::sched::core_test
