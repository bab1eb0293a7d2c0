// scheduler_core_test.cpp: the scheduler's decisions, driven message by message, with every step
// executed by the CPU reference forward pass (model/reference.hpp) on a generated model — real
// logits, no stand-ins.
//
// Checks: a batch of concurrent requests with different prompts and seeds each produce exactly
// what they produce alone (and greedy output equals the reference generator's); every request
// gets exactly one terminal event; cancel while a request's step is in flight applies the
// step's outcome first and then ends it `cancelled` (F2); a disconnect ends requests silently
// and frees every block; a failing batch is bisected so a poison request ends with
// error{gpu_failed} while the others complete with fault-free output (F4); device loss makes
// every sequence recompute from token 0 with identical output (F1); KV exhaustion preempts and
// recomputes without corruption; a shared prompt prefix is served from the prefix cache with
// identical output; context_exceeded and overloaded are immediate; a sampled token of the
// vocab's end-of-generation set other than eos (an eot id) ends a request. Invariants are checked
// after every message.
//
// KV persistence (scheduler_kv.cpp), against `disk`, an in-memory stand-in for the kv actor
// that answers its messages and moves block CONTENTS between the emulated pool and its entries
// (so a wrong block id or position shows as wrong output): a prefix saved by one request is
// restored by the next with output equal to a recompute and cached_tokens counting it; a
// failed restore recomputes with identical output and restores nothing later; a step failing
// right after a restore quarantines that entry (kv_invalidate) and the request recomputes; a
// request cancelled while its restore is in flight frees everything once the restore answers;
// a request whose lookup or restore outlasts restore_wait_ms recomputes with identical output,
// and a restore that lands afterwards (with other ids than the entry's) touches nothing it uses;
// sessions: session_busy for a second live request, session_delete refused while busy.
//
// Speculative decoding (scheduler_speculate.cpp), prompt lookup drafting from prompts that repeat
// themselves and from the random model's repetitive output: every request's tokens equal plain
// decoding's at temperatures 0 and 0.8 (several seeds), alone and batched, with verifications
// that accepted drafts and ones that rejected them; the KV of rejected drafts is never
// committed (invariants, the pool emulation, and the outputs); a request's `speculative: false`
// opts out; drafts keep to max_tokens, the context and the step's token budget; draft faults:
// draft_fail falls back (counted drafter_error), draft_garbage and draft_eos change no output;
// fallback_rounds verifications without an accepted draft fall back (counted no_acceptance);
// arming a draft fault with speculation off is refused. With a draft model (the core's side of
// the draft actor, answered by an oracle that knows the plain outputs): a round comes before
// the step that verifies it, each sequence's tokens are sent once, the output is plain
// decoding's with right and wrong drafts; a failed or unanswered round falls back
// (drafter_error) and its late answer is ignored; a draft model not ready, past its context or
// that forgot a sequence costs only drafts.
//
// Embeddings (scheduler_embed.cpp), the harness returning each sequence's hidden row as the
// reference's final hidden states: for mean, last and cls pooling an input chunked across
// steps, alone and batched with generation (whose outputs stay those of running alone), equals
// model::embed (1e-5); a failed step and a device loss recompute it from token 0 with the same
// vector (the accumulator is not counted twice); a shared prefix is never taken from the
// cache; cancel ends it done{reason cancelled}; an empty or too long input is refused.
#include "scheduler/scheduler_core.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "model/gguf.hpp"
#include "model/reference.hpp"
#include "model/synth.hpp"
#include "net/ops.hpp"
#include "net/protocol.hpp"

namespace {

using namespace ordo;
using namespace ordo::sched;
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

model_fixture& shared_model() {
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
                                           16,
                                           {},
                                           0,
                                           "",
                                           0,
                                           0},
                                          out);
                }
            } else {
                gpu::step_done d = execute(*s);
                core->on_step_done(
                    d, [&](uint32_t r) { return std::span<const float>(rows[r]); },
                    [&](uint32_t r) { return std::span<const float>(hidden[r]); }, out);
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
    disk* kv = nullptr;  // set with core_options.kv_disk

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
        size_t before = kv->sessions.size();
        std::erase_if(kv->sessions, [&](const auto& s) { return s.first == m.session; });
        core->on_kv_session_deleted({m.conn, m.id, kv->sessions.size() != before, ""}, out);
    }

    uint32_t block_tokens() const { return 8; }

    // Emulates the paged KV pool faithfully enough to catch sharing mistakes: each block slot
    // remembers the token written there, and a sequence's reference model is replayed from the
    // tokens its block table holds for [0, pos0) whenever they differ from what it has seen.
    gpu::step_done execute(const gpu::step& s) {
        const uint32_t B = block_tokens();
        gpu::step_done d;
        d.step_id = s.step_id;
        d.n_vocab = uint32_t(shared_model().tok->vocab().size());
        rows.clear();
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
    std::vector<std::vector<float>> hidden;  // the last step's hidden rows
};

// What the reference generator gives for a prompt alone (greedy).
std::vector<int32_t> reference_greedy(const std::string& prompt, uint32_t n) {
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

const std::vector<std::string> prompts = {
    "Once upon a time",
    "the cat",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z",
    "hello world, this is a longer prompt that spans several blocks of eight tokens",
    "x",
    "42",
    "zzz top",
    "Lorem ipsum dolor sit amet"};

// Outputs of each prompt run alone with (temperature, seed) = (0.8, i).
std::vector<std::vector<int32_t>> alone_outputs(uint32_t n) {
    std::vector<std::vector<int32_t>> r;
    for (size_t i = 0; i < prompts.size(); i++) {
        harness h;
        h.generate(1, 1, prompts[i], n, 0.8, i);
        h.run();
        r.push_back(h.terminal(1, 1)->tokens());
    }
    return r;
}

// End of generation is the vocab's whole EOG set, not only eos: the model's vocabulary with a
// greedily sampled id named as its end-of-turn token (tokenizer.ggml.eot_token_id) ends the
// same request right there, with reason stop and that token last.
TEST(scheduler_core, stops_on_an_end_of_generation_token_other_than_eos) {
    harness plain;
    plain.generate(1, 1, prompts[0], 8);
    plain.run();
    const std::vector<int32_t> free_run = plain.terminal(1, 1)->tokens();
    ASSERT_EQ(free_run.size(), 8u);
    const model::vocab& v = shared_model().tok->vocab();
    size_t k = 2;  // the first position from 2 on whose token did not occur before it
    while (k < free_run.size() &&
           std::count(free_run.begin(), free_run.begin() + long(k), free_run[k]) != 0) {
        ++k;
    }
    ASSERT_LT(k, free_run.size());
    const int32_t stop = free_run[k];
    ASSERT_NE(stop, v.eos());
    model::vocab_spec spec;
    spec.model = v.model();
    for (int32_t i = 0; i < int32_t(v.size()); ++i) {
        spec.pieces.push_back(v.piece(i));
        spec.scores.push_back(v.score(i));
        spec.types.push_back(v.type(i));
    }
    spec.bos = v.bos(), spec.eos = v.eos(), spec.unk = v.unk(), spec.eot = stop;
    spec.add_bos = v.add_bos(), spec.add_space_prefix = v.add_space_prefix();
    auto eot_vocab = model::vocab::from_spec(std::move(spec));
    ASSERT_TRUE(eot_vocab.ok());
    model::tokenizer eot_tok(std::move(*eot_vocab));
    ASSERT_TRUE(eot_tok.vocab().is_eog(stop));

    harness h({}, 256, 8, 0, &eot_tok);
    h.generate(1, 1, prompts[0], 8);
    h.run();
    const auto* t = h.terminal(1, 1);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->str("event"), "done");
    EXPECT_EQ(t->str("reason"), "stop");
    EXPECT_EQ(t->tokens(), std::vector<int32_t>(free_run.begin(), free_run.begin() + long(k) + 1));
}

TEST(scheduler_core, greedy_matches_reference_generator) {
    harness h;
    h.generate(1, 1, prompts[0], 20);
    h.run();
    const event* t = h.terminal(1, 1);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->str("event"), "done");
    EXPECT_EQ(t->tokens(), reference_greedy(prompts[0], 20));
    // Streamed texts concatenate to done.text.
    std::string streamed;
    for (const auto& e : h.events_of(1, 1)) {
        if (e.str("event") == "token") streamed += e.str("text");
    }
    EXPECT_EQ(streamed, t->str("text"));
    h.expect_idle();
}

TEST(scheduler_core, batched_requests_equal_running_alone) {
    auto alone = alone_outputs(12);
    core_options o;
    o.max_batch_tokens = 24;  // forces chunked prefill next to decodes
    harness h(o);
    for (size_t i = 0; i < prompts.size(); i++) h.generate(1, i + 1, prompts[i], 12, 0.8, i);
    h.run();
    for (size_t i = 0; i < prompts.size(); i++) {
        const event* t = h.terminal(1, i + 1);
        ASSERT_NE(t, nullptr) << i;
        EXPECT_EQ(t->tokens(), alone[i]) << "prompt " << i;
    }
    h.expect_idle();
}

TEST(scheduler_core, cancel_during_step_applies_outcome_then_cancels) {
    harness h;
    h.generate(1, 1, prompts[3], 50);
    h.generate(1, 2, prompts[0], 5);
    int steps = 0;
    h.run([&](const gpu::step&) {
        if (++steps == 3) h.cancel(1, 9, 1);  // request 1 is inside this step
    });
    const event* t = h.terminal(1, 1);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->str("reason"), "cancelled");
    // The step that was running when the cancel arrived still produced... nothing new for a
    // cancelled request, but its KV was committed: the blocks were published, not leaked.
    const event* c = h.terminal(1, 9);
    ASSERT_NE(c, nullptr);
    EXPECT_TRUE(c->fields.at("cancelled").as<bool>());
    ASSERT_NE(h.terminal(1, 2), nullptr);
    EXPECT_EQ(h.terminal(1, 2)->tokens(), reference_greedy(prompts[0], 5));
    // Cancelling a finished request answers cancelled=false.
    h.cancel(1, 10, 2);
    EXPECT_FALSE(h.terminal(1, 10)->fields.at("cancelled").as<bool>());
    h.expect_idle();
}

// A handler that failed on a request (the actor's on_failure) ends it with error{internal} at
// once. Inside a running step it stays, silent, until the step's outcome is applied, and its id
// is free at once: the client may reuse it and is served normally.
TEST(scheduler_core, an_aborted_request_ends_once_and_frees_its_id) {
    harness h;
    h.generate(1, 1, prompts[1], 20);
    bool aborted = false;
    h.run([&](const gpu::step&) {
        if (aborted) return;
        aborted = true;  // request 1 is inside this step
        std::vector<outgoing_event> out;
        h.core->abort_request(1, 1, "handler threw", out);
        h.apply(out);
        h.generate(1, 1, prompts[0], 5);  // the same id again
    });
    std::vector<event> first = h.events_of(1, 1);
    ASSERT_GE(first.size(), 2u);
    EXPECT_EQ(first[0].str("code"), "internal");
    const event& last = first.back();
    EXPECT_TRUE(last.terminal);
    EXPECT_EQ(last.str("reason"), "length");
    EXPECT_EQ(last.tokens(), reference_greedy(prompts[0], 5));
    int terminals = 0;
    for (const auto& e : first) terminals += e.terminal;
    EXPECT_EQ(terminals, 2) << "one error for the aborted request, one done for its successor";
    EXPECT_EQ(h.core->counters().handler_errors, 1u);
    h.expect_idle();
}

TEST(scheduler_core, disconnect_ends_requests_silently_and_frees_blocks) {
    harness h;
    h.generate(7, 1, prompts[3], 40);
    h.generate(7, 2, prompts[1], 40);
    h.generate(8, 1, prompts[0], 6);
    int steps = 0;
    h.run([&](const gpu::step&) {
        if (++steps == 2) {
            std::vector<outgoing_event> out;
            h.core->on_client_gone({7, "client closed"}, out);
            EXPECT_TRUE(out.empty());
        }
    });
    EXPECT_EQ(h.terminal(7, 1), nullptr);
    EXPECT_EQ(h.terminal(7, 2), nullptr);
    ASSERT_NE(h.terminal(8, 1), nullptr);
    EXPECT_EQ(h.core->counters().disconnects, 2u);
    h.expect_idle();
}

TEST(scheduler_core, poison_request_is_isolated_by_bisection) {
    auto alone = alone_outputs(8);
    harness h;
    for (size_t i = 0; i < 4; i++) h.generate(1, i + 1, prompts[i], 8, 0.8, i);
    uint64_t poison_seq = 3;  // the third request admitted
    h.run({}, [&](const gpu::step& s) -> std::optional<gpu::step_failed> {
        for (const auto& q : s.seqs) {
            if (q.seq_id == poison_seq) {
                return gpu::step_failed{0, gpu_failure::device_lost, "injected",
                                        "decode#1 layers 0-1", false};
            }
        }
        return std::nullopt;
    });
    for (size_t i = 0; i < 4; i++) {
        const event* t = h.terminal(1, i + 1);
        ASSERT_NE(t, nullptr) << i;
        if (i == 2) {
            EXPECT_EQ(t->str("event"), "error");
            EXPECT_EQ(t->str("code"), "gpu_failed");
        } else {
            EXPECT_EQ(t->tokens(), alone[i]) << i;
        }
    }
    h.expect_idle();
}

TEST(scheduler_core, device_loss_recomputes_with_identical_output) {
    auto alone = alone_outputs(10);
    harness h;
    for (size_t i = 0; i < 4; i++) h.generate(1, i + 1, prompts[i], 10, 0.8, i);
    int steps = 0;
    h.run({}, [&](const gpu::step&) -> std::optional<gpu::step_failed> {
        if (++steps == 5 || steps == 9) {
            return gpu::step_failed{0, gpu_failure::timeout, "injected", "decode#5 layers 0-1",
                                    true};
        }
        return std::nullopt;
    });
    for (size_t i = 0; i < 4; i++) {
        const event* t = h.terminal(1, i + 1);
        ASSERT_NE(t, nullptr);
        EXPECT_EQ(t->tokens(), alone[i]) << i;
    }
    EXPECT_EQ(h.core->counters().failures, 2u);
    h.expect_idle();
}

TEST(scheduler_core, kv_exhaustion_preempts_without_corruption) {
    auto alone = alone_outputs(24);
    core_options o;
    o.prefix_cache = false;
    harness h(o, /*kv_blocks=*/16);  // 128 tokens for 8 requests needing up to ~105 each
    for (size_t i = 0; i < prompts.size(); i++) h.generate(1, i + 1, prompts[i], 24, 0.8, i);
    h.run();
    for (size_t i = 0; i < prompts.size(); i++) {
        const event* t = h.terminal(1, i + 1);
        ASSERT_NE(t, nullptr);
        EXPECT_EQ(t->tokens(), alone[i]) << i;
    }
    EXPECT_GT(h.core->counters().preemptions, 0u);
    h.expect_idle();
}

TEST(scheduler_core, shared_prefix_is_served_from_the_cache) {
    std::string base = prompts[3] + " and then some more words to fill blocks";
    harness h;
    h.generate(1, 1, base, 6);
    h.run();
    h.generate(1, 2, base + " again", 6);
    h.run();
    const event* first = h.terminal(1, 1);
    const event* second = h.terminal(1, 2);
    ASSERT_NE(second, nullptr);
    auto usage = second->fields.at("usage").as<std::map<std::string, msgpack::object>>();
    EXPECT_GE(usage.at("cached_tokens").as<uint32_t>(), 8u);
    EXPECT_EQ(second->tokens(), reference_greedy(base + " again", 6));
    EXPECT_EQ(first->tokens(), reference_greedy(base, 6));
    h.expect_idle();
}

// A device that announces a shorter context than the configured one (llvmpipe's loop cap bounds
// attention) gets requests past it refused at once, with its number, and the rest served.
TEST(scheduler_core, the_device_context_bounds_requests) {
    harness h({}, 256, 8, 40);
    h.generate(1, 1, prompts[0], 60);  // fits the configured 256, not the device's 40
    const event* refused = h.terminal(1, 1);
    ASSERT_NE(refused, nullptr);
    EXPECT_EQ(refused->str("code"), "context_exceeded");
    EXPECT_NE(refused->str("message").find("context of 40"), std::string::npos)
        << refused->str("message");
    h.generate(1, 2, prompts[0], 4);
    h.run();
    EXPECT_EQ(h.terminal(1, 2)->str("event"), "done");
    h.expect_idle();
}

TEST(scheduler_core, context_exceeded_and_overloaded_are_immediate) {
    core_options o;
    o.max_queue = 2;
    harness h(o);
    h.generate(1, 1, prompts[0], 1000);
    EXPECT_EQ(h.terminal(1, 1)->str("code"), "context_exceeded");
    h.generate(1, 2, prompts[0], 4);
    h.generate(1, 3, prompts[0], 4);
    h.generate(1, 4, prompts[0], 4);
    EXPECT_EQ(h.terminal(1, 4)->str("code"), "overloaded");
    h.run();
    EXPECT_EQ(h.terminal(1, 2)->str("event"), "done");
    EXPECT_EQ(h.terminal(1, 3)->str("event"), "done");
    h.expect_idle();
}

}  // namespace

// ---- KV persistence (scheduler_kv.cpp) against the in-memory kv actor ------------------------

namespace {

const std::string long_prompt =
    "hello world, this is a longer prompt that spans several blocks of eight tokens and more";

// ---- speculative decoding ---------------------------------------------------------------------

const std::vector<std::string> repeating_prompts = {
    "the cat sat on the mat and the cat sat on the mat and the cat sat",
    "a b c d e f a b c d e f a b c", "one two three one two three one two",
    "hello world hello world hello world hello"};

core_options speculating(uint32_t draft_tokens_max = 8) {
    core_options o;
    o.speculative.mode = config::speculative_mode::ngram;
    o.speculative.draft_tokens_max = draft_tokens_max;
    o.speculative.ngram = {1, 3};
    return o;
}

// Each prompt of `all` alone with (temperature, seed): the plain outputs.
std::vector<std::vector<int32_t>> outputs_of(const std::vector<std::string>& all, uint32_t n,
                                             double temperature, uint64_t seed,
                                             core_options o = {}) {
    std::vector<std::vector<int32_t>> r;
    for (size_t i = 0; i < all.size(); i++) {
        harness h(o);
        h.generate(1, 1, all[i], n, temperature, seed + i);
        h.run();
        EXPECT_NE(h.terminal(1, 1), nullptr);
        r.push_back(h.terminal(1, 1) ? h.terminal(1, 1)->tokens() : std::vector<int32_t>{});
        h.expect_idle();
    }
    return r;
}

std::vector<std::string> speculation_prompts() {
    std::vector<std::string> all = repeating_prompts;
    all.insert(all.end(), prompts.begin(), prompts.end());
    return all;
}

TEST(scheduler_speculate, outputs_equal_plain_decoding_alone_and_batched) {
    const auto all = speculation_prompts();
    uint64_t rounds = 0, drafted = 0, accepted = 0;
    for (double temperature : {0.0, 0.8}) {
        for (uint64_t seed : {11u, 12u}) {
            const auto plain = outputs_of(all, 24, temperature, seed);
            const auto spec = outputs_of(all, 24, temperature, seed, speculating());
            for (size_t i = 0; i < all.size(); i++) {
                EXPECT_EQ(spec[i], plain[i]) << "alone, prompt " << i << " t " << temperature;
            }
            // Batched, under a small token budget (drafts compete with prefill chunks).
            core_options o = speculating();
            o.max_batch_tokens = 32;
            harness h(o);
            for (size_t i = 0; i < all.size(); i++) {
                h.generate(1, i + 1, all[i], 24, temperature, seed + i);
            }
            h.run([&](const gpu::step& s) {
                uint32_t tokens = 0;
                for (const auto& q : s.seqs) {
                    tokens += uint32_t(q.tokens.size());
                    EXPECT_LE(q.logits_rows, 1u + o.speculative.draft_tokens_max);
                }
                EXPECT_LE(tokens, o.max_batch_tokens);
            });
            for (size_t i = 0; i < all.size(); i++) {
                const event* t = h.terminal(1, i + 1);
                ASSERT_NE(t, nullptr) << i;
                EXPECT_EQ(t->tokens(), plain[i]) << "batched, prompt " << i << " t " << temperature;
            }
            h.expect_idle();
            const auto& k = h.core->counters();
            rounds += k.spec_rounds, drafted += k.spec_drafted, accepted += k.spec_accepted;
        }
    }
    // Both outcomes of a verification were exercised.
    EXPECT_GT(rounds, 0u);
    EXPECT_GT(accepted, 0u);
    EXPECT_LT(accepted, drafted);
}

TEST(scheduler_speculate, drafts_keep_to_max_tokens_context_and_opt_out) {
    // max_tokens 3: a verification never asks for more rows than tokens left to generate.
    harness h(speculating());
    h.generate(1, 1, repeating_prompts[1], 3);
    h.run([&](const gpu::step& s) {
        for (const auto& q : s.seqs) EXPECT_LE(q.logits_rows, 3u);
    });
    ASSERT_NE(h.terminal(1, 1), nullptr);
    EXPECT_EQ(h.terminal(1, 1)->tokens(), outputs_of({repeating_prompts[1]}, 3, 0, 0)[0]);
    // A context of 48 tokens, which the request fills: no step reaches past it.
    core_options o = speculating();
    o.n_ctx = 48;
    harness c(o);
    const auto n_prompt = uint32_t(shared_model().tok->encode(repeating_prompts[1], true).size());
    ASSERT_LT(n_prompt, 40u);
    c.generate(1, 1, repeating_prompts[1], 48 - n_prompt);
    c.run([&](const gpu::step& s) {
        for (const auto& q : s.seqs) EXPECT_LE(q.pos0 + q.tokens.size(), 48u);
    });
    ASSERT_NE(c.terminal(1, 1), nullptr);
    EXPECT_EQ(c.terminal(1, 1)->str("reason"), "length");
    // speculative: false: no step carries drafts for it.
    harness off(speculating());
    msgpack::sbuffer b;
    msgpack::packer<msgpack::sbuffer> pk(b);
    pk.pack_map(6);
    pk.pack("id"), pk.pack(1), pk.pack("op"), pk.pack("generate");
    pk.pack("prompt"), pk.pack(repeating_prompts[1]), pk.pack("max_tokens"), pk.pack(12);
    pk.pack("temperature"), pk.pack(0), pk.pack("speculative"), pk.pack(false);
    off.request(1, 1, "generate", std::move(b));
    off.run([&](const gpu::step& s) {
        for (const auto& q : s.seqs) EXPECT_LE(q.logits_rows, 1u);
    });
    ASSERT_NE(off.terminal(1, 1), nullptr);
    EXPECT_EQ(off.terminal(1, 1)->tokens(), outputs_of({repeating_prompts[1]}, 12, 0, 0)[0]);
    EXPECT_EQ(off.core->counters().spec_rounds, 0u);
}

TEST(scheduler_speculate, draft_faults_and_fallbacks_change_no_output) {
    const std::vector<std::string> one = {repeating_prompts[0]};
    const auto plain = outputs_of(one, 20, 0.8, 5)[0];
    auto run_with = [&](fault_kind kind, uint32_t rounds, core_options o) {
        harness h(o);
        fault_spec f;
        f.kind = kind;
        f.count = rounds;
        EXPECT_TRUE(h.core->arm_draft_fault(f).ok());
        h.generate(1, 1, one[0], 20, 0.8, 5);
        h.run();
        EXPECT_NE(h.terminal(1, 1), nullptr);
        if (h.terminal(1, 1) != nullptr) EXPECT_EQ(h.terminal(1, 1)->tokens(), plain);
        h.expect_idle();
        return h.core->counters();
    };
    auto k = run_with(fault_kind::draft_fail, 1, speculating());
    EXPECT_EQ(k.spec_fallbacks[size_t(spec_fallback::drafter_error)], 1u);
    EXPECT_EQ(k.spec_rounds, 0u);  // it failed at its first drafting: no verification after
    k = run_with(fault_kind::draft_garbage, 3, speculating());
    EXPECT_GE(k.spec_rounds, 3u);
    EXPECT_LT(k.spec_accepted, k.spec_drafted);
    k = run_with(fault_kind::draft_eos, 2, speculating());
    EXPECT_GE(k.spec_rounds, 2u);
    // Garbage every round and fallback_rounds 2: two verifications without an accepted draft
    // end speculation for the request.
    core_options o = speculating();
    o.speculative.fallback_rounds = 2;
    k = run_with(fault_kind::draft_garbage, 100, o);
    EXPECT_EQ(k.spec_fallbacks[size_t(spec_fallback::no_acceptance)], 1u);
    // With speculation off a draft fault is refused.
    harness h;
    fault_spec f;
    f.kind = fault_kind::draft_fail;
    EXPECT_FALSE(h.core->arm_draft_fault(f).ok());
}

// ---- speculation with a draft model (the core's side of the draft actor) ----

core_options drafting(uint32_t draft_tokens_max = 6) {
    core_options o = speculating(draft_tokens_max);
    o.speculative.mode = config::speculative_mode::draft;
    return o;
}

// A draft actor for the core's tests: it keeps each sequence's tokens as the rounds tell them
// (checking the `known` protocol: the tokens it was told are the sequence's own), and drafts
// from `answers` (each prompt's tokens followed by its plain output): an oracle, all of whose
// drafts the target keeps, unless `wrong_every` > 0 (every wrong_every-th draft is wrong).
struct oracle_drafter {
    std::vector<std::vector<int32_t>> answers;
    uint32_t wrong_every = 0;
    std::map<uint64_t, std::vector<int32_t>> told;
    uint64_t drafts = 0;

    draft::draft_reply operator()(const draft::draft_request& q) {
        draft::draft_reply r;
        r.round = q.round;
        for (const draft::draft_seq& s : q.seqs) {
            std::vector<int32_t>& t = told[s.seq_id];
            EXPECT_LE(s.known, t.size()) << "told less than the core believes";
            t.resize(std::min<size_t>(s.known, t.size()));
            t.insert(t.end(), s.tokens.begin(), s.tokens.end());
            draft::drafted d{s.seq_id, uint32_t(t.size()), {}};
            for (const auto& a : answers) {
                if (a.size() <= t.size() || !std::equal(t.begin(), t.end(), a.begin())) continue;
                for (size_t i = t.size(); i < a.size() && d.tokens.size() < s.max; i++) {
                    const bool wrong = wrong_every != 0 && ++drafts % wrong_every == 0;
                    d.tokens.push_back(wrong ? (a[i] + 1) % 500 : a[i]);
                }
                break;
            }
            r.seqs.push_back(std::move(d));
        }
        return r;
    }
};

// prompt tokens (with BOS, as the core encodes them) then `output`.
std::vector<int32_t> prompt_then(const std::string& prompt, const std::vector<int32_t>& output) {
    std::vector<int32_t> all = shared_model().tok->encode(prompt, true);
    all.insert(all.end(), output.begin(), output.end());
    return all;
}

// With a draft model the core asks for a round before the step that verifies it, sends each
// sequence's tokens once (the `known` protocol), keeps an oracle's drafts and rejects wrong
// ones at any temperature with the plain output, and lets every sequence it named be forgotten.
TEST(scheduler_speculate, draft_model_rounds_come_before_the_step_and_change_no_output) {
    const auto all = speculation_prompts();
    for (double temperature : {0.0, 0.8}) {
        const auto plain = outputs_of(all, 24, temperature, 21);
        for (uint32_t wrong_every : {0u, 3u}) {
            oracle_drafter d;
            d.wrong_every = wrong_every;
            for (size_t i = 0; i < all.size(); i++)
                d.answers.push_back(prompt_then(all[i], plain[i]));
            core_options o = drafting();
            o.max_batch_tokens = 32;
            harness h(o);
            h.core->on_drafter_state({true, "test"});
            h.drafter = std::ref(d);
            for (size_t i = 0; i < all.size(); i++)
                h.generate(1, i + 1, all[i], 24, temperature, 21 + i);
            h.run([&](const gpu::step& s) {
                // A drafting round is answered before the step that verifies it is planned.
                EXPECT_EQ(h.core->draft_round_in_flight(), 0u);
                for (const auto& q : s.seqs)
                    EXPECT_LE(q.logits_rows, 1u + o.speculative.draft_tokens_max);
            });
            for (size_t i = 0; i < all.size(); i++) {
                const event* t = h.terminal(1, i + 1);
                ASSERT_NE(t, nullptr) << i;
                EXPECT_EQ(t->tokens(), plain[i]) << "prompt " << i << " t " << temperature;
            }
            h.expect_idle();
            const auto& k = h.core->counters();
            EXPECT_GT(h.draft_rounds, 0u);
            EXPECT_EQ(k.spec_draft_rounds, h.draft_rounds);
            EXPECT_EQ(k.spec_draft_rounds_failed, 0u);
            EXPECT_GT(k.spec_accepted, 0u);
            if (wrong_every == 0) {
                EXPECT_EQ(k.spec_accepted, k.spec_drafted) << "an oracle's drafts are all kept";
            } else {
                EXPECT_LT(k.spec_accepted, k.spec_drafted);
            }
            // Every sequence a round named is forgotten by the end.
            std::set<uint64_t> forgotten(h.draft_forgets.begin(), h.draft_forgets.end());
            for (const auto& [seq, told] : d.told) EXPECT_EQ(forgotten.count(seq), 1u) << seq;
        }
    }
}

// A round that failed (its error) or went unanswered (the actor's bound) sends its sequences
// back to plain decoding, counted as drafter_error; a late answer is ignored.
TEST(scheduler_speculate, a_failed_or_unanswered_round_falls_back_and_changes_no_output) {
    const std::vector<std::string> two = {repeating_prompts[0], repeating_prompts[2]};
    const auto plain = outputs_of(two, 16, 0.8, 3);
    oracle_drafter oracle;
    for (size_t i = 0; i < two.size(); i++) oracle.answers.push_back(prompt_then(two[i], plain[i]));
    // The draft model's step failed: the round's error sends both back to plain decoding.
    {
        harness h(drafting());
        h.core->on_drafter_state({true, "test"});
        int rounds = 0;
        h.drafter = [&](const draft::draft_request& q) {
            if (++rounds == 2)
                return draft::draft_reply{q.round, {}, "draft step failed: gpu_device_lost"};
            return oracle(q);
        };
        for (size_t i = 0; i < two.size(); i++) h.generate(1, i + 1, two[i], 16, 0.8, 3 + i);
        h.run();
        for (size_t i = 0; i < two.size(); i++) {
            ASSERT_NE(h.terminal(1, i + 1), nullptr);
            EXPECT_EQ(h.terminal(1, i + 1)->tokens(), plain[i]) << i;
        }
        EXPECT_EQ(rounds, 2) << "no round after both fell back";
        EXPECT_EQ(h.core->counters().spec_fallbacks[size_t(spec_fallback::drafter_error)], 2u);
        auto notes = h.core->take_notes();
        EXPECT_TRUE(std::any_of(notes.begin(), notes.end(), [](const std::string& n) {
            return n.find("gpu_device_lost") != std::string::npos;
        }));
        h.expect_idle();
    }
    // A round unanswered past the actor's bound fails; its late answer changes nothing.
    {
        harness h(drafting());
        h.core->on_drafter_state({true, "test"});
        h.generate(1, 1, two[0], 16, 0.8, 3);
        h.run();  // prefill ran; the first round is left unanswered
        const uint64_t round = h.core->draft_round_in_flight();
        ASSERT_NE(round, 0u);
        EXPECT_FALSE(h.core->next_step().has_value()) << "no step while a round is out";
        h.core->draft_round_failed(round, "no drafts within speculative.draft_wait_ms = 100 ms");
        EXPECT_EQ(h.core->draft_round_in_flight(), 0u);
        draft::draft_request late_q{round, {{0, 0, {}, 4}}};
        h.core->on_draft_reply(oracle(late_q));  // stale: ignored
        h.drafter = std::ref(oracle);
        h.run();
        ASSERT_NE(h.terminal(1, 1), nullptr);
        EXPECT_EQ(h.terminal(1, 1)->tokens(), plain[0]);
        EXPECT_EQ(h.core->counters().spec_fallbacks[size_t(spec_fallback::drafter_error)], 1u);
        EXPECT_EQ(h.core->counters().spec_rounds, 0u);
        EXPECT_EQ(h.core->counters().spec_draft_rounds_failed, 1u);
        h.expect_idle();
    }
}

// Sequences decode plainly, without a fallback, while the draft model is not ready, past its
// context, or after it forgot them (they are sent whole again).
TEST(scheduler_speculate, a_draft_model_not_ready_or_forgetful_only_costs_drafts) {
    const std::vector<std::string> one = {repeating_prompts[1]};
    const auto plain = outputs_of(one, 20, 0.8, 8);
    oracle_drafter oracle;
    oracle.answers.push_back(prompt_then(one[0], plain[0]));
    // Not ready (its device still building, or being rebuilt): no rounds, plain steps.
    harness h(drafting());
    h.drafter = std::ref(oracle);
    h.generate(1, 1, one[0], 20, 0.8, 8);
    int steps = 0;
    h.run([&](const gpu::step&) {
        // Ready from the fourth step on; after the eighth its device is lost (everything the
        // draft actor held is gone) and rebuilt: rounds start again from token 0.
        if (++steps == 4) h.core->on_drafter_state({true, "test"});
        if (steps == 8) {
            h.core->on_drafter_state({false, "device lost"});
            oracle.told.clear();
        }
        if (steps == 9) h.core->on_drafter_state({true, "test"});
    });
    ASSERT_NE(h.terminal(1, 1), nullptr);
    EXPECT_EQ(h.terminal(1, 1)->tokens(), plain[0]);
    EXPECT_GT(h.draft_rounds, 1u);
    EXPECT_EQ(h.core->counters().spec_fallbacks[size_t(spec_fallback::drafter_error)], 0u);
    h.expect_idle();
    // Past the draft model's context (drafter_state.n_ctx) no round is asked for.
    harness short_draft(drafting());
    short_draft.core->on_drafter_state({true, "test", 8});
    short_draft.drafter = std::ref(oracle);
    short_draft.generate(1, 1, one[0], 20, 0.8, 8);
    short_draft.run();
    ASSERT_NE(short_draft.terminal(1, 1), nullptr);
    EXPECT_EQ(short_draft.terminal(1, 1)->tokens(), plain[0]);
    EXPECT_EQ(short_draft.draft_rounds, 0u);
    short_draft.expect_idle();
    // An answer that says the draft actor holds none of the sequence (known 0): the next round
    // sends it whole.
    harness f(drafting());
    f.core->on_drafter_state({true, "test"});
    oracle_drafter o2;
    o2.answers = oracle.answers;
    int calls = 0;
    f.drafter = [&](const draft::draft_request& q) {
        if (++calls == 3) {
            o2.told.clear();
            EXPECT_GT(q.seqs.at(0).known, 0u);
            return draft::draft_reply{q.round, {{q.seqs.at(0).seq_id, 0, {}}}, ""};
        }
        if (calls == 4) EXPECT_EQ(q.seqs.at(0).known, 0u) << "sent whole after it was lost";
        return o2(q);
    };
    f.generate(1, 1, one[0], 20, 0.8, 8);
    f.run();
    ASSERT_NE(f.terminal(1, 1), nullptr);
    EXPECT_EQ(f.terminal(1, 1)->tokens(), plain[0]);
    EXPECT_GE(calls, 4);
    f.expect_idle();
}

core_options kv_options() {
    core_options o;
    o.kv_disk = true;
    return o;
}

// A disk holding what one scheduler saved after running long_prompt for max_tokens.
disk saved_disk(uint32_t max_tokens) {
    disk d;
    harness a(kv_options());
    a.kv = &d;
    a.generate(1, 1, long_prompt, max_tokens);
    a.run();
    EXPECT_NE(a.terminal(1, 1), nullptr);
    a.expect_idle();
    EXPECT_EQ(a.core->kv_stats().pins, 0u);
    return d;
}

uint32_t cached_tokens(const event& e) {
    return e.fields.at("usage")
        .as<std::map<std::string, msgpack::object>>()
        .at("cached_tokens")
        .as<uint32_t>();
}

}  // namespace

// ---- embeddings ------------------------------------------------------------------------------

// The reference's embedding of `prompt` (tokenized with BOS, as the scheduler does).
std::vector<float> reference_embedding(const std::string& prompt, model::pooling p) {
    auto& m = shared_model();
    auto r = model::reference_model::create(*m.file, 256);
    EXPECT_TRUE(r.ok());
    std::vector<int32_t> ids = m.tok->encode(prompt, true);
    std::vector<uint32_t> u(ids.begin(), ids.end());
    auto e = model::embed(*r, u, p);
    EXPECT_TRUE(e.ok());
    return e.ok() ? *e : std::vector<float>{};
}

void expect_embedding(const event* t, const std::vector<float>& want, const std::string& what) {
    ASSERT_NE(t, nullptr) << what;
    ASSERT_EQ(t->str("event"), "done") << what << ": " << t->str("message");
    auto got = t->fields.at("embedding").as<std::vector<float>>();
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < want.size(); i++) EXPECT_NEAR(got[i], want[i], 1e-5) << what << " " << i;
}

TEST(scheduler_embed, every_pooling_chunked_and_batched_equals_the_reference) {
    auto alone = alone_outputs(8);
    for (model::pooling p : {model::pooling::mean, model::pooling::last, model::pooling::cls}) {
        core_options o;
        o.pooling = p;
        o.max_batch_tokens = 16;  // prompts[3] (~20 tokens) takes two chunks
        harness h(o);
        h.generate(1, 1, prompts[0], 8, 0.8, 0);
        h.embed(1, 2, prompts[3]);
        h.generate(1, 3, prompts[2], 8, 0.8, 2);
        h.embed(1, 4, prompts[1]);
        h.run();
        const std::string what = "pooling " + std::string(config::to_string(p));
        expect_embedding(h.terminal(1, 2), reference_embedding(prompts[3], p), what);
        expect_embedding(h.terminal(1, 4), reference_embedding(prompts[1], p), what);
        EXPECT_EQ(h.terminal(1, 2)->str("pooling"), config::to_string(p));
        EXPECT_EQ(h.terminal(1, 2)->fields.at("prompt_tokens").as<uint32_t>(),
                  shared_model().tok->encode(prompts[3], true).size());
        EXPECT_EQ(h.terminal(1, 1)->tokens(), alone[0]) << what;
        EXPECT_EQ(h.terminal(1, 3)->tokens(), alone[2]) << what;
        EXPECT_EQ(h.core->counters().embeddings, 2u);
        h.expect_idle();
    }
}

TEST(scheduler_embed, failed_steps_recompute_without_counting_twice) {
    const auto want = reference_embedding(prompts[3], model::pooling::mean);
    core_options o;
    o.max_batch_tokens = 8;  // three chunks
    harness h(o);
    h.embed(1, 1, prompts[3]);
    h.embed(1, 2, prompts[7]);
    int steps = 0;
    h.run({}, [&](const gpu::step&) -> std::optional<gpu::step_failed> {
        ++steps;
        if (steps == 2)
            return gpu::step_failed{0, gpu_failure::nan, "injected", "prefill#2", false};
        if (steps == 5) {
            return gpu::step_failed{0, gpu_failure::timeout, "injected", "prefill#5", true};
        }
        return std::nullopt;
    });
    expect_embedding(h.terminal(1, 1), want, "after failures");
    expect_embedding(h.terminal(1, 2), reference_embedding(prompts[7], model::pooling::mean),
                     "the other input");
    EXPECT_EQ(h.core->counters().failures, 2u);
    h.expect_idle();
}

TEST(scheduler_embed, a_cached_prefix_is_not_taken_and_ids_work_too) {
    harness h;
    h.generate(1, 1, prompts[3], 4);  // publishes the prompt's full blocks
    h.run();
    h.embed(1, 2, prompts[3]);
    h.run();
    expect_embedding(h.terminal(1, 2), reference_embedding(prompts[3], model::pooling::mean),
                     "after a cached prompt");
    std::vector<int32_t> ids = shared_model().tok->encode(prompts[0], true);
    h.embed(1, 3, "", ids);
    h.run();
    expect_embedding(h.terminal(1, 3), reference_embedding(prompts[0], model::pooling::mean),
                     "token ids");
    h.expect_idle();
}

TEST(scheduler_embed, cancel_and_refusals) {
    harness h;
    h.embed(1, 1, prompts[3]);
    h.cancel(1, 2, 1);
    const event* t = h.terminal(1, 1);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->str("event"), "done");
    EXPECT_EQ(t->str("reason"), "cancelled");
    EXPECT_EQ(t->fields.count("embedding"), 0u);
    h.embed(1, 3, "", {});  // an empty token array: the validator refuses it
    EXPECT_EQ(h.terminal(1, 3)->str("event"), "error");
    h.embed(1, 4, "", std::vector<int32_t>(300, 5));  // past the context of 256
    EXPECT_EQ(h.terminal(1, 4)->str("code"), "context_exceeded");
    h.run();
    h.expect_idle();
}

TEST(scheduler_kv, a_saved_prefix_is_restored_with_identical_output) {
    auto want = reference_greedy(long_prompt, 12);
    disk d;
    {
        harness a(kv_options());
        a.kv = &d;
        a.generate(1, 1, long_prompt, 12);
        a.run();
        ASSERT_NE(a.terminal(1, 1), nullptr);
        EXPECT_EQ(a.terminal(1, 1)->tokens(), want);
        a.expect_idle();
        EXPECT_EQ(a.core->kv_stats().pins, 0u);
    }
    ASSERT_EQ(d.saves, 1);
    // A new scheduler (a restart: empty pool and memory cache) restores from "disk".
    harness b(kv_options());
    b.kv = &d;
    b.generate(1, 1, long_prompt, 12);
    b.run();
    const event* t = b.terminal(1, 1);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->tokens(), want);
    EXPECT_EQ(d.restores, 1);
    const uint32_t n_prompt = uint32_t(shared_model().tok->encode(long_prompt, true).size());
    EXPECT_EQ(cached_tokens(*t), (n_prompt - 1) / 8 * 8);
    EXPECT_EQ(b.core->counters().disk_restored_tokens, (n_prompt - 1) / 8 * 8);
    b.expect_idle();
    EXPECT_EQ(b.core->kv_stats().pins, 0u);
}

TEST(scheduler_kv, a_failed_restore_recomputes_once) {
    auto want = reference_greedy(long_prompt, 12);
    disk d = saved_disk(12);
    d.fail_restores = true;
    d.lookups = 0;
    core_options o = kv_options();
    o.restore_retry_max = 0;
    harness b(o);
    b.kv = &d;
    b.generate(1, 1, long_prompt, 12);
    b.run();
    ASSERT_NE(b.terminal(1, 1), nullptr);
    EXPECT_EQ(b.terminal(1, 1)->tokens(), want);
    EXPECT_EQ(cached_tokens(*b.terminal(1, 1)), 0u);
    EXPECT_EQ(b.core->counters().disk_restore_failures, 1u);
    EXPECT_EQ(d.lookups, 1);  // no second attempt with restore_retry_max = 0
    b.expect_idle();
    EXPECT_EQ(b.core->kv_stats().pins, 0u);

    // restore_retry_max = 2: two more lookups, each restore fails, then a recompute.
    o.restore_retry_max = 2;
    d.lookups = 0;
    harness c(o);
    c.kv = &d;
    c.generate(1, 1, long_prompt, 12);
    c.run();
    ASSERT_NE(c.terminal(1, 1), nullptr);
    EXPECT_EQ(c.terminal(1, 1)->tokens(), want);
    EXPECT_EQ(d.lookups, 3);
    EXPECT_EQ(c.core->counters().disk_restore_failures, 3u);
    c.expect_idle();
    EXPECT_EQ(c.core->kv_stats().pins, 0u);
}

TEST(scheduler_kv, a_step_failing_right_after_a_restore_quarantines_the_entry) {
    auto want = reference_greedy(long_prompt, 12);
    disk d = saved_disk(12);
    harness b(kv_options());
    b.kv = &d;
    b.generate(1, 1, long_prompt, 12);
    bool failed = false;
    b.run({}, [&](const gpu::step&) -> std::optional<gpu::step_failed> {
        if (failed) return std::nullopt;
        failed = true;  // the first step after the restore
        return gpu::step_failed{0, gpu_failure::nan, "injected", "prefill#1 layers 0-1", false};
    });
    ASSERT_NE(b.terminal(1, 1), nullptr);
    EXPECT_EQ(b.terminal(1, 1)->tokens(), want);
    EXPECT_EQ(d.invalidated, 1);
    EXPECT_EQ(b.core->counters().disk_invalidations, 1u);
    // The quarantined entry is never offered again.
    b.generate(1, 2, long_prompt, 12);
    b.run();
    ASSERT_NE(b.terminal(1, 2), nullptr);
    EXPECT_EQ(b.terminal(1, 2)->tokens(), want);
    EXPECT_EQ(d.restores, 1);
    b.expect_idle();
    EXPECT_EQ(b.core->kv_stats().pins, 0u);
}

TEST(scheduler_kv, a_request_cancelled_during_its_restore_frees_everything) {
    disk d = saved_disk(4);
    harness b(kv_options());
    b.kv = &d;
    d.hold_restores = true;
    b.generate(1, 1, long_prompt, 4);
    b.run();  // plans the lookup; the restore is held
    ASSERT_EQ(d.held.size(), 1u);
    EXPECT_EQ(b.core->kv_stats().pins, 1u);
    b.cancel(1, 2, 1);
    ASSERT_NE(b.terminal(1, 1), nullptr);
    EXPECT_EQ(b.terminal(1, 1)->str("reason"), "cancelled");
    // The pinned blocks stay allocated until the restore answers, then everything is free.
    EXPECT_GT(b.core->kv_stats().blocks_used, 0u);
    d.hold_restores = false;
    b.release_held_restores();
    b.run();
    b.expect_idle();
    EXPECT_EQ(b.core->kv_stats().pins, 0u);
}

// restore_wait_ms during the restore: the request lets go of the blocks the restore is copying
// into and recomputes; the late restore then writes OTHER ids into them (a naive give-up that
// kept them in the request's table would read those and decode differently).
TEST(scheduler_kv, a_restore_that_outlasts_restore_wait_ms_is_recomputed) {
    auto want = reference_greedy(long_prompt, 12);
    disk d = saved_disk(12);
    d.hold_restores = true;
    d.lookups = 0;
    core_options o = kv_options();
    o.restore_wait_ms = 100;
    harness b(o);
    b.kv = &d;
    EXPECT_FALSE(b.core->restore_deadline());
    b.generate(1, 1, long_prompt, 12);
    b.run();  // the lookup is answered, the restore held: nothing else to do
    ASSERT_EQ(d.held.size(), 1u);
    EXPECT_EQ(b.core->kv_stats().pins, 1u);
    auto due = b.core->restore_deadline();
    ASSERT_TRUE(due);
    b.core->expire_restores(*due - std::chrono::milliseconds(1));
    EXPECT_EQ(b.core->counters().disk_restore_timeouts, 0u);
    EXPECT_TRUE(b.core->restore_deadline());
    b.core->expire_restores(*due);
    EXPECT_EQ(b.core->counters().disk_restore_timeouts, 1u);
    EXPECT_FALSE(b.core->restore_deadline());
    ASSERT_TRUE(b.core->check_invariants().ok()) << b.core->check_invariants().err().message;
    int steps = 0;
    d.restore_other_ids = true;
    b.run([&](const gpu::step&) {
        if (++steps == 2) b.release_held_restores();  // lands while the recompute runs
    });
    ASSERT_GE(steps, 2);
    const event* t = b.terminal(1, 1);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->tokens(), want);
    EXPECT_EQ(d.restores, 1);                         // the kv side finished it...
    EXPECT_EQ(b.core->counters().disk_restores, 0u);  // ...and the request did not use it
    EXPECT_EQ(b.core->counters().disk_restore_failures, 0u);
    EXPECT_EQ(d.lookups, 1);  // no second disk attempt after a timeout
    b.expect_idle();
    EXPECT_EQ(b.core->kv_stats().pins, 0u);
}

// restore_wait_ms during the lookup: the request runs from the memory cache at once, and the
// late answer only releases the entry's lease.
TEST(scheduler_kv, a_lookup_that_outlasts_restore_wait_ms_is_recomputed) {
    auto want = reference_greedy(long_prompt, 12);
    disk d = saved_disk(12);
    core_options o = kv_options();
    o.restore_wait_ms = 100;
    harness b(o);
    b.kv = &d;
    b.generate(1, 1, long_prompt, 12);
    // Plan without answering the kv actor: the request waits for its lookup.
    EXPECT_FALSE(b.core->next_step());
    auto lookups = b.core->take_kv_requests();
    ASSERT_EQ(lookups.size(), 1u);
    ASSERT_TRUE(std::holds_alternative<kv::kv_lookup>(lookups[0]));
    auto due = b.core->restore_deadline();
    ASSERT_TRUE(due);
    b.core->expire_restores(*due);
    EXPECT_EQ(b.core->counters().disk_restore_timeouts, 1u);
    std::vector<outgoing_event> out;
    // The late answer offers the entry; the request has moved on and releases it.
    b.core->on_kv_lookup_done({std::get<kv::kv_lookup>(lookups[0]).seq, 3, "e0"}, out);
    auto release = b.core->take_kv_requests();
    ASSERT_EQ(release.size(), 1u);
    EXPECT_TRUE(std::holds_alternative<kv::kv_release>(release[0]));
    b.apply(out);
    b.run();
    ASSERT_NE(b.terminal(1, 1), nullptr);
    EXPECT_EQ(b.terminal(1, 1)->tokens(), want);
    EXPECT_EQ(b.core->counters().disk_restores, 0u);
    EXPECT_EQ(d.restores, 0);
    b.expect_idle();
    EXPECT_EQ(b.core->kv_stats().pins, 0u);
}

TEST(scheduler_kv, sessions_are_exclusive_and_deletable) {
    disk d;
    harness h(kv_options());
    h.kv = &d;
    h.generate(1, 1, long_prompt, 6, 0, 0, "chat-1");
    h.generate(1, 2, "another prompt", 6, 0, 0, "chat-1");
    ASSERT_NE(h.terminal(1, 2), nullptr);
    EXPECT_EQ(h.terminal(1, 2)->str("code"), "session_busy");
    h.session_delete(1, 3, "chat-1");
    ASSERT_NE(h.terminal(1, 3), nullptr);
    EXPECT_EQ(h.terminal(1, 3)->str("code"), "session_busy");
    h.run();
    ASSERT_NE(h.terminal(1, 1), nullptr);
    ASSERT_EQ(d.sessions.size(), 1u);
    // Turn 2 on the same session (prompt + reply + more) restores the session's blocks in a
    // new scheduler.
    std::string turn2 = long_prompt + h.terminal(1, 1)->str("text") + " and then";
    auto want = reference_greedy(turn2, 6);
    harness b(kv_options());
    b.kv = &d;
    b.generate(1, 1, turn2, 6, 0, 0, "chat-1");
    b.run();
    ASSERT_NE(b.terminal(1, 1), nullptr);
    EXPECT_EQ(b.terminal(1, 1)->tokens(), want);
    EXPECT_GT(cached_tokens(*b.terminal(1, 1)), 0u);
    b.session_delete(1, 2, "chat-1");
    ASSERT_NE(b.terminal(1, 2), nullptr);
    EXPECT_TRUE(b.terminal(1, 2)->fields.at("deleted").as<bool>());
    b.session_delete(1, 3, "chat-1");
    EXPECT_FALSE(b.terminal(1, 3)->fields.at("deleted").as<bool>());
    b.expect_idle();
}
