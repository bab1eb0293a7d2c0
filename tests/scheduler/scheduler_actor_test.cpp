// scheduler_actor_test.cpp: the scheduler actor on its real loop, wired to probe actors in place
// of the net and gpu actors (tests/support/actor_probe.hpp); the test plays the gpu. Sequences
// are asserted on the trace of deliveries, in the order they really happened.
//
// Checks: (1) a cancel that arrives while the request's step runs is answered at once, the
// step's outcome is applied first and the request then ends done{cancelled} (F2), as the trace
// shows: generate, step, cancel, step_done, generate_done; (2) a step the gpu actor refuses
// (it has stopped) fails like any other and the next plan follows by itself — no unrelated
// message is needed — until the request's bounded retries end it with error{gpu_failed};
// (3) a step left unanswered past the backstop asks the gpu actor to rebuild (reset_device),
// health says loading only then, the device_ready of the rebuild resumes the request from token
// 0 and it completes, and the stale answer of the lost step is ignored with its logits slot
// released; (4) drain: a new generate is refused with shutting_down while the running one
// completes, then on_drained fires; (5) stop: a request still live ends with
// error{shutting_down} — a refusal, never silence; every loop closes cleanly; (6) the config's
// fault plan: each planned gpu fault reaches the gpu as an inject_fault (count 1, any phase,
// plan_step = the step id) right before the step it was drawn for, plan_faults_max stops it,
// a fault_refused from the gpu takes one back, and stats carries the fault_plan map;
// (7) two front doors: the events of a connection whose id names the HTTP front door reach the
// probe connected as that front door and never the net one, each request's events in order,
// and set_health reaches both; (8) device_progress while the device is built: health stays
// loading with a reason naming the stage, the step and the attempt, and says ok at device_ready;
// (9) a request that arrives during a step of several decode iterations asks the gpu actor to
// end that step (end_decode_steps), and both requests complete.
#include "scheduler/scheduler_actor.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <future>
#include <set>

#include "model/gguf.hpp"
#include "model/synth.hpp"
#include "tests/support/actor_probe.hpp"

namespace {

using namespace ordo;
using namespace ordo::sched;
using ordo::test::probe;
using ordo::test::trace_script;

// A front door: what the scheduler sends one (door/door_msgs.hpp).
using net_probe = test::probe_for<door::scheduler_events>;
using gpu_probe = probe<gpu::step, gpu::inject_fault, gpu::reset_device, gpu::end_decode_steps>;

constexpr int32_t k_token = 100;  // what the fake gpu's logits make greedy sampling pick

struct model_files {
    model_files() {
        path = (std::filesystem::temp_directory_path() /
                ("ordo_sched_actor_" + std::to_string(getpid()) + ".gguf"))
                   .string();
        model::synth_options o;
        o.n_embd = 32, o.n_layer = 1, o.n_head = 2, o.n_head_kv = 2, o.n_ff = 64;
        o.n_vocab = 300, o.n_ctx = 256, o.seed = 3;
        EXPECT_TRUE(model::write_synth_model(o, path).ok());
        auto f = model::gguf_file::open(path);
        EXPECT_TRUE(f.ok());
        auto t = model::tokenizer::from_gguf(*f);
        EXPECT_TRUE(t.ok());
        tok.emplace(std::move(*t));
    }
    ~model_files() { std::filesystem::remove(path); }
    std::string path;
    std::optional<model::tokenizer> tok;
};

model_files& files() {
    static model_files m;
    return m;
}

// One scheduler actor between two probes, all traced into one sink.
struct rig {
    explicit rig(scheduler_actor::options o = {}, uint32_t decode_steps = 1) : logits(16, 300) {
        core_options co;
        co.n_ctx = 256;
        co.retry_max = 2;
        co.decode_steps = decode_steps;
        auto core = scheduler_core::create(co, &*files().tok, model_info{});
        EXPECT_TRUE(core.ok());
        o.on_drained = [this] { drained.set_value(); };
        sched.emplace(std::move(*core), &logits, std::move(o));
        sched->connect(net, gpu);
        sched->connect_front_door(door::door_kind::http, http);
        for (actors::actor_core* a :
             std::initializer_list<actors::actor_core*>{&net, &http, &gpu, &*sched}) {
            a->set_trace(&trace);
            EXPECT_TRUE(a->start().ok());
        }
    }
    ~rig() { stop(); }

    void stop() {
        for (actors::actor_core* a :
             std::initializer_list<actors::actor_core*>{&*sched, &net, &http, &gpu}) {
            a->request_stop();
            EXPECT_TRUE(a->join().ok()) << a->name() << " leaked a handle";
        }
    }

    void device_ready(uint64_t epoch = 0) {
        gpu::device_ready m{epoch, "fake", 64, 8, 16, {}, 0, "", 0, 0};
        ASSERT_TRUE(sched->tell(m, "gpu").ok());
    }

    void generate(uint64_t id, uint32_t max_tokens, uint64_t conn = 1) {
        sched::generate g;
        g.conn = conn, g.id = id;
        g.params.tokens = {1, 2, 3};
        g.params.max_tokens = max_tokens;
        g.params.sampling.temperature = 0;
        g.params.stream = true;
        ASSERT_TRUE(sched->tell(g, "net").ok());
    }

    // Plays the gpu: the rows that asked for logits make greedy sampling pick k_token.
    uint32_t answer(const gpu::step& s) {
        std::vector<uint64_t> rows;
        for (const auto& q : s.seqs) {
            rows.insert(rows.end(), q.logits_rows, q.seq_id);
        }
        uint32_t slot = gpu::logits_exchange::no_slot;
        if (!rows.empty()) {
            auto a = logits.acquire();
            EXPECT_TRUE(a.ok());
            slot = *a;
            for (uint32_t r = 0; r < rows.size(); r++) {
                float* row = logits.row(slot, r);
                std::fill(row, row + 300, -1.0f);
                row[k_token] = 1.0f;
            }
        }
        gpu::step_done done;
        done.step_id = s.step_id;
        done.slot = slot;
        done.rows = rows;
        done.n_vocab = 300;
        done.gpu_ms = 0.5;
        EXPECT_TRUE(sched->tell(std::move(done), "gpu").ok());
        return slot;
    }

    // Answers every step until the request ends; its terminal event.
    door::generate_done run_to_done() {
        for (int guard = 0; guard < 64; guard++) {
            auto m = net.next_any(std::chrono::milliseconds(50));
            if (m) {
                if (auto* d = std::get_if<door::generate_done>(&*m)) return *d;
                continue;
            }
            if (auto s = gpu.next<gpu::step>(std::chrono::milliseconds(50))) answer(*s);
        }
        ADD_FAILURE() << "the request never ended";
        return {};
    }

    actors::memory_trace_sink trace;
    gpu::logits_exchange logits;
    net_probe net{"net"};
    net_probe http{"http"};  // the second front door (door::door_kind::http)
    gpu_probe gpu{"gpu"};
    std::promise<void> drained;
    std::optional<scheduler_actor> sched;
};

TEST(scheduler_actor, cancel_during_a_running_step_applies_the_step_first) {
    rig r;
    r.device_ready();
    r.generate(7, 5);
    auto s = r.gpu.next<gpu::step>();
    ASSERT_TRUE(s);
    ASSERT_TRUE(r.sched->tell(sched::cancel{1, 8, 7}, "net").ok());
    auto c = r.net.next<door::cancel_done>();
    ASSERT_TRUE(c);
    EXPECT_TRUE(c->cancelled);
    r.answer(*s);
    auto d = r.net.next<door::generate_done>();
    ASSERT_TRUE(d);
    EXPECT_EQ(d->reason, door::finish_reason::cancelled);
    EXPECT_TRUE(r.net.stays_empty(std::chrono::milliseconds(100)));
    r.stop();

    trace_script t(r.trace.snapshot());
    t.expect<sched::generate>("net", "scheduler");
    t.expect<gpu::step>("scheduler", "gpu");
    t.expect<sched::cancel>("net", "scheduler");
    t.expect<gpu::step_done>("gpu", "scheduler");
    auto done = t.expect<door::generate_done>("scheduler", "net");
    ASSERT_TRUE(done);
    EXPECT_EQ(done->id, 7u);
}

// A request that arrives while a step of several decode iterations runs asks the gpu to end
// that step (end_decode_steps naming it, right after the generate in the trace); the step's
// answer of one iteration is applied, and both requests complete.
TEST(scheduler_actor, a_request_arriving_during_decode_steps_asks_the_gpu_to_end_them) {
    rig r({}, 4);
    r.device_ready();
    r.generate(1, 12);
    auto prefill = r.gpu.next<gpu::step>();
    ASSERT_TRUE(prefill);
    r.answer(*prefill);
    auto multi = r.gpu.next<gpu::step>();
    ASSERT_TRUE(multi);
    ASSERT_EQ(multi->decode_steps, 4u);
    r.generate(2, 3);
    auto end = r.gpu.next<gpu::end_decode_steps>();
    ASSERT_TRUE(end);
    EXPECT_EQ(end->step_id, multi->step_id);
    r.answer(*multi);  // one iteration ran
    std::set<uint64_t> done;
    for (int i = 0; i < 2; i++) {
        auto d = r.run_to_done();
        EXPECT_EQ(d.reason, door::finish_reason::length);
        done.insert(d.id);
    }
    EXPECT_EQ(done, (std::set<uint64_t>{1, 2}));
    r.stop();

    trace_script t(r.trace.snapshot());
    t.expect<sched::generate>("net", "scheduler");
    t.expect<gpu::step>("scheduler", "gpu");
    t.expect<gpu::step_done>("gpu", "scheduler");
    t.expect<gpu::step>("scheduler", "gpu");
    t.expect<sched::generate>("net", "scheduler");
    auto e = t.expect<gpu::end_decode_steps>("scheduler", "gpu");
    ASSERT_TRUE(e);
    EXPECT_EQ(e->step_id, multi->step_id);
}

TEST(scheduler_actor, a_refused_step_replans_by_itself_until_retries_end_it) {
    rig r;
    r.gpu.request_stop();  // every step is now refused with actor_stopped
    ASSERT_TRUE(r.gpu.join().ok());
    r.device_ready();
    r.generate(3, 4);
    // Nothing else is sent: the scheduler must plan again by itself after each refusal.
    auto e = r.net.next<door::request_error>();
    ASSERT_TRUE(e) << "the request never ended";
    EXPECT_EQ(e->code, door::errc::gpu_failed);
    EXPECT_EQ(e->id, 3u);
    r.stop();
    // retry_max 2: three failed attempts alone, then the error.
    EXPECT_EQ(r.sched->core().counters().failures, 3u);
    EXPECT_EQ(r.sched->core().live_requests(), 0u);
}

TEST(scheduler_actor, device_progress_is_the_loading_reason_until_the_device_is_ready) {
    rig r;
    auto starting = r.net.next<door::set_health>();
    ASSERT_TRUE(starting);
    EXPECT_EQ(starting->status, door::health_status::loading);
    gpu::device_progress p{0, 2, 4, "warm-up", 3, 5};
    ASSERT_TRUE(r.sched->tell(p, "gpu").ok());
    auto loading = r.net.next<door::set_health>();
    ASSERT_TRUE(loading) << "device_progress changed nothing health says";
    EXPECT_EQ(loading->status, door::health_status::loading);
    EXPECT_EQ(loading->reason, "starting the gpu device: warm-up 3/5 (attempt 2 of 4)");
    r.device_ready();
    auto ok = r.net.next<door::set_health>();
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, door::health_status::ok);
    EXPECT_EQ(ok->reason, "");
    r.stop();
}

TEST(scheduler_actor, an_unanswered_step_rebuilds_the_device_and_the_request_completes) {
    scheduler_actor::options o;
    o.step_backstop_ms = 100;
    rig r(o);
    auto starting = r.net.next<door::set_health>();
    ASSERT_TRUE(starting);
    EXPECT_EQ(starting->status, door::health_status::loading);
    r.device_ready();
    auto ok = r.net.next<door::set_health>();
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, door::health_status::ok);
    r.generate(5, 2);
    auto lost = r.gpu.next<gpu::step>();
    ASSERT_TRUE(lost);
    // No answer: the backstop fires and asks for a rebuild.
    auto reset = r.gpu.next<gpu::reset_device>();
    ASSERT_TRUE(reset) << "no reset_device after the backstop";
    auto loading = r.net.next<door::set_health>();
    ASSERT_TRUE(loading);
    EXPECT_EQ(loading->status, door::health_status::loading);
    r.device_ready(1);
    auto again = r.gpu.next<gpu::step>();
    ASSERT_TRUE(again);
    ASSERT_EQ(again->seqs.size(), 1u);
    EXPECT_EQ(again->seqs[0].pos0, 0u) << "the request must recompute from token 0";
    // The lost step's answer arrives late: ignored, its slot released.
    uint32_t stale = r.answer(*lost);
    r.answer(*again);
    auto d = r.run_to_done();
    EXPECT_EQ(d.reason, door::finish_reason::length);
    EXPECT_EQ(d.tokens, (std::vector<int32_t>{k_token, k_token}));
    r.stop();
    EXPECT_FALSE(r.logits.is_held(stale));
}

TEST(scheduler_actor, drain_refuses_new_work_and_lets_running_requests_finish) {
    rig r;
    r.device_ready();
    r.generate(1, 3);
    auto s = r.gpu.next<gpu::step>();
    ASSERT_TRUE(s);
    ASSERT_TRUE(r.sched->tell(sched::drain{60000}, "main").ok());
    r.generate(2, 3);
    auto refused = r.net.next<door::request_error>();
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->id, 2u);
    EXPECT_EQ(refused->code, door::errc::shutting_down);
    r.answer(*s);
    auto d = r.run_to_done();
    EXPECT_EQ(d.id, 1u);
    EXPECT_EQ(d.reason, door::finish_reason::length);
    EXPECT_EQ(r.drained.get_future().wait_for(std::chrono::seconds(20)), std::future_status::ready);
}

TEST(scheduler_actor, stop_ends_live_requests_with_shutting_down) {
    rig r;
    r.device_ready();
    r.generate(9, 50);
    ASSERT_TRUE(r.gpu.next<gpu::step>());
    r.sched->request_stop();
    ASSERT_TRUE(r.sched->join().ok());
    auto e = r.net.next<door::request_error>();
    ASSERT_TRUE(e);
    EXPECT_EQ(e->id, 9u);
    EXPECT_EQ(e->code, door::errc::shutting_down);
    // A message after the stop is refused to its sender, not dropped.
    auto st = r.sched->tell(sched::cancel{1, 10, 9}, "net");
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.err().outcome, actors::delivery_outcome::actor_stopped);
}

TEST(scheduler_actor, a_planned_fault_reaches_the_gpu_right_before_its_step) {
    scheduler_actor::options o;
    o.faults_enabled = true;
    // every_steps 1: every step draws a fault; faults_max 3: steps 1..3 only.
    o.plan = {1234, {ordo::fault_kind::nan_logits}, 1, 3};
    rig r(o);
    r.device_ready();
    r.generate(5, 6);  // a prefill step, then 5 decode steps (the fake gpu applies no fault)
    for (uint64_t id = 1; id <= 6; id++) {
        auto m = r.gpu.next_any();
        ASSERT_TRUE(m) << "nothing for step " << id;
        if (id <= 3) {
            auto* f = std::get_if<gpu::inject_fault>(&*m);
            ASSERT_NE(f, nullptr) << "step " << id << ": no inject_fault first";
            EXPECT_EQ(f->kind, ordo::fault_kind::nan_logits);
            EXPECT_EQ(f->plan_step, id);
            EXPECT_EQ(f->count, 1u);
            EXPECT_EQ(f->after_steps, 0u);
            EXPECT_FALSE(f->phase);
            m = r.gpu.next_any();
            ASSERT_TRUE(m);
        }
        auto* s = std::get_if<gpu::step>(&*m);
        ASSERT_NE(s, nullptr) << "expected step " << id;
        EXPECT_EQ(s->step_id, id);
        r.answer(*s);
    }
    auto d = r.net.next<door::generate_done>();
    ASSERT_TRUE(d);
    EXPECT_EQ(d->id, 5u);
    // The gpu actor could not arm step 3's fault: it no longer counts as fired.
    const gpu::fault_refused refused{3, ordo::fault_kind::nan_logits, "8 faults already armed"};
    ASSERT_TRUE(r.sched->tell(refused, "gpu").ok());
    ASSERT_TRUE(r.sched->tell(stats_query{1, 9, {}, {}}, "net").ok());
    auto st = r.net.next<door::stats_done>();
    ASSERT_TRUE(st);
    const door::fault_plan_report& p = st->stats.fault_plan;
    EXPECT_TRUE(p.active);
    EXPECT_EQ(p.seed, 1234u);
    EXPECT_EQ(p.fired, 2u);
    EXPECT_EQ(p.refused, 1u);
    EXPECT_FALSE(p.spent);
    EXPECT_EQ(p.by_kind, (std::map<std::string, uint64_t>{{"nan_logits", 2}}));
    EXPECT_TRUE(r.gpu.stays_empty(std::chrono::milliseconds(50)));
    r.stop();
}

TEST(scheduler_actor, without_a_plan_stats_has_no_fault_plan_and_no_fault_is_sent) {
    rig r;
    r.device_ready();
    r.generate(5, 3);
    for (uint64_t id = 1; id <= 3; id++) {
        auto m = r.gpu.next_any();
        ASSERT_TRUE(m);
        auto* s = std::get_if<gpu::step>(&*m);
        ASSERT_NE(s, nullptr) << "only steps reach the gpu";
        r.answer(*s);
    }
    ASSERT_TRUE(r.net.next<door::generate_done>());
    ASSERT_TRUE(r.sched->tell(stats_query{1, 9, {}, {}}, "net").ok());
    auto st = r.net.next<door::stats_done>();
    ASSERT_TRUE(st);
    EXPECT_FALSE(st->stats.fault_plan.active);
    r.stop();
}

}  // namespace

// (7)
TEST(scheduler_actor, each_front_door_gets_the_events_of_its_connections) {
    rig r;
    r.device_ready();
    const uint64_t http_conn = door::conn_id(door::door_kind::http, 1);
    r.generate(1, 3, http_conn);
    r.generate(1, 3, 1);  // the same (local conn, id) on the net front door: another request
    std::vector<std::string> http_events, net_events;
    int terminals = 0;
    for (int guard = 0; guard < 200 && terminals < 2; guard++) {
        if (auto s = r.gpu.next<gpu::step>(std::chrono::milliseconds(20))) r.answer(*s);
        for (auto* p : {&r.http, &r.net}) {
            while (auto m = p->next_any(std::chrono::milliseconds(1))) {
                std::visit(
                    [&](const auto& e) {
                        using T = std::decay_t<decltype(e)>;
                        if constexpr (requires { e.conn + e.id; }) {
                            EXPECT_EQ(e.conn, p == &r.http ? http_conn : 1u) << T::msg_name;
                            (p == &r.http ? http_events : net_events).push_back(T::msg_name);
                            if (!std::is_same_v<T, door::token_event>) terminals++;
                        }
                    },
                    *m);
            }
        }
    }
    const std::vector<std::string> expected{"token_event", "token_event", "token_event",
                                            "generate_done"};
    EXPECT_EQ(http_events, expected);
    EXPECT_EQ(net_events, expected);
    r.stop();
    trace_script t(r.trace.snapshot());
    t.expect<door::set_health>("scheduler", "http");
    t.expect<door::generate_done>("scheduler", "http");
}
