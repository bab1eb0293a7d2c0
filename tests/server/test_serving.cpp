// test_serving.cpp: generation served by the real ordo-server over TCP, on stories260K (the
// trained model in ../shared/models; skipped with a message when absent) and on a model made
// with `ordo-model mk`, with the gpu actor on the real Vulkan device (lavapipe in CI).
//
// Checks: greedy output equals the golden text token for token, streamed and not, with
// gpu.row_summaries on (every token drawn from the GPU's row summary: stats candidate_draws =
// tokens_generated) and off (every token from the whole row: candidate_draws = 0); 16
// concurrent clients with different prompts and seeds get exactly what each gets alone;
// cancel mid-prefill and mid-decode end the request once with done{cancelled}; disconnects
// (FIN and RST) while queued, prefilling and decoding cancel silently, and afterwards stats
// show zero active sequences and every KV block free; a second request sharing a long prefix
// reports cached tokens and gives output identical to a cold-cache server; overload, context
// exceeded and bad parameters get their error codes; tokenize/detokenize/model answer; the
// gpu map of model and stats describes the device (lavapipe: texel kernels, no row summaries,
// segments of 4 layers by default, logits rows written in place: it imports host memory) and
// counts steps (their wall time holds their GPU time; each decode is sent back to back by the
// handler of the step before it) and an injected hang;
// gpu.kernels = "storage" and "texel" each serve the golden text; requests without a seed sample
// afresh (two at temperature 1 differ) and the seed their done event reports reproduces them.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "tests/support/scratch_dir.hpp"
#include "tests/support/server_process.hpp"
#include "tests/support/shared_models.hpp"

namespace {

using namespace ordo::test;
namespace fs = std::filesystem;

const std::string stories = std::string(ORDO_SHARED_MODELS_DIR) + "/stories260K.gguf";

#define REQUIRE_STORIES() ORDO_REQUIRE_SHARED(stories)

std::string temp_path(const std::string& name) {
    const fs::path& dir = ordo::test::scratch_dir("ordo_serving");
    return (dir / name).string();
}

std::string write_config(const std::string& name, const std::string& model,
                         const std::string& extra = "") {
    std::string p = temp_path(name);
    std::ofstream(p) << "[model]\npath = \"" << model << "\"\n" << extra;
    return p;
}

// Sends a generate map built from key/value pairs and returns its events.
template <typename... kv>
std::vector<event> generate(tcp_client& c, uint64_t id, const kv&... params) {
    EXPECT_TRUE(c.send(frame("id", id, "op", "generate", params...)));
    return until_terminal(c, id);
}

// The model op's reply (its "gpu" map describes the device), or nullopt.
std::optional<event> model_op(tcp_client& c, uint64_t id) {
    EXPECT_TRUE(c.send(frame("id", id, "op", "model")));
    return next(c);
}

std::map<std::string, uint64_t> stats(uint16_t port) {
    auto e = stats_event(port);
    EXPECT_TRUE(e.has_value());
    std::map<std::string, uint64_t> r;
    if (!e) return r;
    for (const char* k : {"active_sequences", "queued_requests", "kv_blocks_used"}) {
        r[k] = e->u(k);
    }
    const auto* s = field(e->o(), "scheduler");
    if (s) {
        for (const char* k :
             {"disconnects", "cancels", "requests", "tokens_generated", "candidate_draws"}) {
            r[k] = uint_field(*s, k);
        }
    }
    return r;
}

// Polls stats (every 25 ms, 400 times at most) until `done` holds for them.
template <typename Pred>
bool wait_stats(uint16_t port, Pred done) {
    for (int i = 0; i < 400; i++) {
        if (done(stats(port))) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return false;
}

// Polls stats until the server has no active or queued sequence and no used KV block.
bool wait_idle(uint16_t port) {
    return wait_stats(port, [](auto s) {
        return s["active_sequences"] == 0 && s["queued_requests"] == 0 && s["kv_blocks_used"] == 0;
    });
}

// Polls stats until the scheduler has received at least `n` requests in all.
bool wait_requests(uint16_t port, uint64_t n) {
    return wait_stats(port, [n](auto s) { return s["requests"] >= n; });
}

struct golden_case {
    std::vector<int32_t> prompt_ids;
    std::vector<int32_t> generated;
    std::string prompt, expected_text;
};

// The two greedy cases of stories260K.golden.json, read with msgpack-free minimal parsing: the
// test reads the fields it needs by running Debian's python3 (the json is the source of truth).
std::vector<golden_case> golden_cases() {
    std::string out = temp_path("golden.txt");
    std::string cmd =
        "/usr/bin/python3 -c \"import json,sys; d=json.load(open('" +
        std::string(ORDO_SHARED_MODELS_DIR) +
        "/stories260K.golden.json'));\n"
        "for c in d['cases']:\n"
        "  print(' '.join(map(str,c['prompt_token_ids'])));"
        " print(' '.join(map(str,c['generated_token_ids'])));"
        " print(json.dumps(c['prompt'])); print(json.dumps(c['expected_text']))\" > " +
        out;
    EXPECT_EQ(std::system(cmd.c_str()), 0);
    std::ifstream in(out);
    std::vector<golden_case> cases;
    std::string l1, l2, l3, l4;
    auto ints = [](const std::string& s) {
        std::vector<int32_t> v;
        std::istringstream is(s);
        for (int32_t x; is >> x;) v.push_back(x);
        return v;
    };
    auto unjson = [](std::string s) {  // the strings here only use \" \n and \\ escapes
        std::string r;
        for (size_t i = 1; i + 1 < s.size(); i++) {
            if (s[i] == '\\' && i + 2 < s.size()) {
                char n = s[++i];
                r += n == 'n' ? '\n' : n;
            } else {
                r += s[i];
            }
        }
        return r;
    };
    while (std::getline(in, l1) && std::getline(in, l2) && std::getline(in, l3) &&
           std::getline(in, l4)) {
        cases.push_back({ints(l1), ints(l2), unjson(l3), unjson(l4)});
    }
    return cases;
}

// Waits for the device: health turns "ok" (within device_ready_deadline).
void require_healthy(uint16_t port) {
    ASSERT_EQ(wait_healthy(port), "");
}

class stories_server : public ::testing::Test {
protected:
    void start(const std::string& extra = "") {
        std::string cfg =
            write_config("stories.toml", stories, "[scheduler]\nmax_batch_tokens = 64\n" + extra);
        ASSERT_TRUE(server.start(ORDO_SERVER_BIN, {"--config", cfg, "--log-level", "warn"}))
            << server.output();
        require_healthy(server.port());
    }
    void expect_golden_output(bool summaries);
    server_process server;
};

TEST_F(stories_server, greedy_output_equals_golden_streamed_and_not) {
    REQUIRE_STORIES();
    for (const bool summaries : {true, false}) {
        SCOPED_TRACE(summaries ? "row summaries on" : "row summaries off");
        start(std::string("[gpu]\nrow_summaries = \"") + (summaries ? "on" : "off") + "\"\n");
        expect_golden_output(summaries);
        EXPECT_EQ(server.stop(), 0) << server.output();
    }
}

// The golden cases, streamed and not, on the running server; then whether its stats say every
// token was drawn from the row summaries' candidates (they settle every greedy draw) or none.
void stories_server::expect_golden_output(bool summaries) {
    auto cases = golden_cases();
    ASSERT_EQ(cases.size(), 2u);
    tcp_client c;
    ASSERT_TRUE(c.connect(server.port()));
    uint64_t id = 1;
    for (const auto& g : cases) {
        for (bool stream : {false, true}) {
            auto evs = generate(c, id, "tokens", g.prompt_ids, "max_tokens", g.generated.size(),
                                "temperature", 0, "stream", stream);
            const event& done = evs.back();
            ASSERT_EQ(done.str("event"), "done") << done.str("message");
            EXPECT_EQ(done.ints("tokens"), g.generated);
            EXPECT_EQ(g.prompt + done.str("text"), g.expected_text);
            std::string streamed;
            size_t token_events = 0;
            for (const auto& e : evs) {
                if (e.str("event") == "token") streamed += e.str("text"), token_events++;
            }
            EXPECT_EQ(token_events, stream ? g.generated.size() : 0u);
            if (stream) {
                EXPECT_EQ(streamed, done.str("text"));
            }
            id++;
        }
    }
    // Greedy without penalties: the summary settles every draw, and the golden text says the
    // summaries' candidates are the rows' own.
    auto st = stats(server.port());
    EXPECT_GT(st["tokens_generated"], 0u);
    EXPECT_EQ(st["candidate_draws"], summaries ? st["tokens_generated"] : 0u);
}

// gpu.kernels picks the kernel family whatever the device's default: the model op says which
// one runs, and greedy output still equals the golden text with each of them.
TEST_F(stories_server, each_kernel_family_gives_the_golden_text) {
    REQUIRE_STORIES();
    auto cases = golden_cases();
    ASSERT_FALSE(cases.empty());
    const auto& g = cases.front();
    for (const char* family : {"storage", "texel"}) {
        SCOPED_TRACE(family);
        start(std::string("[gpu]\nkernels = \"") + family + "\"\n");
        tcp_client c;
        ASSERT_TRUE(c.connect(server.port()));
        auto m = model_op(c, 1);
        const msgpack::object* dev = m ? field(m->o(), "gpu") : nullptr;
        ASSERT_NE(dev, nullptr);
        EXPECT_EQ(str_field(*dev, "kernels"), family);
        auto evs = generate(c, 2, "tokens", g.prompt_ids, "max_tokens", g.generated.size(),
                            "temperature", 0);
        ASSERT_EQ(evs.back().str("event"), "done") << evs.back().str("message");
        EXPECT_EQ(evs.back().ints("tokens"), g.generated);
        EXPECT_EQ(server.stop(), 0) << server.output();
    }
}

TEST_F(stories_server, sixteen_concurrent_clients_get_what_each_gets_alone) {
    REQUIRE_STORIES();
    start();
    const std::vector<std::string> starts = {
        "Once upon a time", "The cat",        "Lily wanted",   "One day",
        "Tom and Sue",      "The sun",        "A little bird", "Mom said",
        "The big dog",      "Once there was", "She saw",       "The park",
        "He liked",         "They played",    "The ball",      "At night"};
    auto request = [&](tcp_client& c, size_t i) {
        return generate(c, 1, "prompt", starts[i], "max_tokens", 24, "temperature", 0.9, "top_k",
                        40, "seed", 1000 + i)
            .back()
            .ints("tokens");
    };
    std::vector<std::vector<int32_t>> alone(starts.size());
    {
        tcp_client c;
        ASSERT_TRUE(c.connect(server.port()));
        for (size_t i = 0; i < starts.size(); i++) alone[i] = request(c, i);
    }
    std::vector<std::vector<int32_t>> together(starts.size());
    std::vector<std::thread> clients;
    for (size_t i = 0; i < starts.size(); i++) {
        clients.emplace_back([&, i] {
            tcp_client c;
            ASSERT_TRUE(c.connect(server.port()));
            together[i] = request(c, i);
        });
    }
    for (auto& t : clients) t.join();
    for (size_t i = 0; i < starts.size(); i++) {
        EXPECT_FALSE(alone[i].empty());
        EXPECT_EQ(together[i], alone[i]) << "prompt " << i;
    }
    EXPECT_TRUE(wait_idle(server.port()));
}

// A prompt long enough that its prefill takes many 64-token steps.
std::vector<int32_t> long_prompt(size_t n) {
    std::vector<int32_t> t{1};
    for (size_t i = 1; i < n; i++) t.push_back(int32_t(300 + i % 150));
    return t;
}

TEST_F(stories_server, cancel_mid_prefill_and_mid_decode) {
    REQUIRE_STORIES();
    start();
    tcp_client c;
    ASSERT_TRUE(c.connect(server.port()));
    // Mid-prefill: the cancel follows the request at once; 1500 prompt tokens take ~24 steps.
    ASSERT_TRUE(c.send(frame("id", 1, "op", "generate", "tokens", long_prompt(1500), "max_tokens",
                             8, "temperature", 0)));
    ASSERT_TRUE(c.send(frame("id", 2, "op", "cancel", "target", 1)));
    auto a = until_terminal(c, 1);
    EXPECT_EQ(a.back().str("reason"), "cancelled");
    EXPECT_TRUE(a.back().ints("tokens").empty());
    // Mid-decode: cancel after three streamed tokens.
    ASSERT_TRUE(c.send(frame("id", 3, "op", "generate", "prompt", "Once upon a time", "max_tokens",
                             500, "temperature", 0, "stream", true)));
    size_t tokens = 0, terminals = 0;
    std::string reason;
    bool cancel_answered = false;
    while (auto e = next(c)) {
        if (e->u("id") == 4) cancel_answered = true;
        if (e->u("id") != 3) continue;
        if (e->str("event") == "token" && ++tokens == 3) {
            ASSERT_TRUE(c.send(frame("id", 4, "op", "cancel", "target", 3)));
        }
        if (e->terminal()) {
            terminals++;
            reason = e->str("reason");
            break;
        }
    }
    EXPECT_EQ(terminals, 1u);
    EXPECT_EQ(reason, "cancelled");
    EXPECT_LT(tokens, 500u);
    if (!cancel_answered) {
        EXPECT_EQ(until_terminal(c, 4).back().str("event"), "done");
    }
    EXPECT_TRUE(wait_idle(server.port()));
}

TEST_F(stories_server, disconnects_in_queue_prefill_and_decode_free_everything) {
    REQUIRE_STORIES();
    start("max_sequences = 2\n");
    auto before = stats(server.port());
    for (bool rst : {false, true}) {
        std::vector<std::unique_ptr<tcp_client>> clients;
        // Two long prefills occupy both sequence slots; the third request waits in the queue;
        // the fourth client is mid-decode when it leaves.
        for (int i = 0; i < 3; i++) {
            clients.push_back(std::make_unique<tcp_client>());
            ASSERT_TRUE(clients.back()->connect(server.port()));
            ASSERT_TRUE(clients.back()->send(
                frame("id", 1, "op", "generate", "tokens", long_prompt(1200), "max_tokens", 50)));
        }
        // The scheduler holds all three before they leave (none has finished: 1200-token
        // prompts with 50 tokens each).
        ASSERT_TRUE(wait_requests(server.port(), before["requests"] + (rst ? 4 : 0) + 3));
        for (auto& c : clients) rst ? c->reset() : c->close();
        tcp_client decoding;
        ASSERT_TRUE(decoding.connect(server.port()));
        ASSERT_TRUE(decoding.send(frame("id", 1, "op", "generate", "prompt", "Once upon a time",
                                        "max_tokens", 400, "stream", true)));
        ASSERT_TRUE(next(decoding).has_value());  // the first token: it is decoding
        rst ? decoding.reset() : decoding.close();
        EXPECT_TRUE(wait_idle(server.port())) << (rst ? "RST" : "FIN");
    }
    auto after = stats(server.port());
    EXPECT_EQ(after["disconnects"] - before["disconnects"], 8u);
    // The server still serves.
    tcp_client c;
    ASSERT_TRUE(c.connect(server.port()));
    EXPECT_EQ(generate(c, 1, "prompt", "Once", "max_tokens", 4).back().str("event"), "done");
}

TEST(serving, prefix_cache_reports_cached_tokens_and_identical_output) {
    REQUIRE_STORIES();
    std::vector<int32_t> shared = long_prompt(300);
    std::vector<int32_t> second = shared;
    for (int32_t t : {403, 407, 261, 378}) second.push_back(t);
    auto run = [&](bool cache) {
        std::string cfg = write_config(
            cache ? "cache.toml" : "nocache.toml", stories,
            std::string("[scheduler]\nprefix_cache = ") + (cache ? "true" : "false") + "\n");
        server_process s;
        EXPECT_TRUE(s.start(ORDO_SERVER_BIN, {"--config", cfg, "--log-level", "warn"}));
        tcp_client c;
        EXPECT_TRUE(c.connect(s.port()));
        generate(c, 1, "tokens", shared, "max_tokens", 4, "temperature", 0);
        auto done = generate(c, 2, "tokens", second, "max_tokens", 16, "temperature", 0).back();
        const auto* usage = field(done.o(), "usage");
        uint64_t cached = usage ? uint_field(*usage, "cached_tokens") : 0;
        return std::make_pair(cached, done.ints("tokens"));
    };
    auto [cold_cached, cold] = run(false);
    auto [warm_cached, warm] = run(true);
    EXPECT_EQ(cold_cached, 0u);
    EXPECT_GE(warm_cached, 256u);
    EXPECT_EQ(warm, cold);
    EXPECT_EQ(warm.size(), 16u);
}

// The rest runs on a model generated here, so it needs nothing from ../shared.
class generated_server : public ::testing::Test {
protected:
    void SetUp() override {
        model = temp_path("tiny.gguf");
        std::string mk = std::string(ORDO_MODEL_BIN) + " mk --out " + model +
                         " --n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 --n-ff 128"
                         " --n-vocab 300 --type f32 --seed 3 --ctx 256 > /dev/null";
        ASSERT_EQ(std::system(mk.c_str()), 0);
        std::string cfg =
            write_config("tiny.toml", model, "[scheduler]\nmax_sequences = 1\nmax_queue = 1\n");
        ASSERT_TRUE(server.start(ORDO_SERVER_BIN, {"--config", cfg, "--log-level", "warn"}))
            << server.output();
        require_healthy(server.port());
        ASSERT_TRUE(c.connect(server.port()));
    }
    std::string model;
    server_process server;
    tcp_client c;
};

TEST_F(generated_server, bad_parameters_get_clear_codes) {
    struct bad {
        msgpack::sbuffer f;
        std::string code, key;
    };
    std::vector<bad> table;
    table.push_back({frame("id", 1, "op", "generate", "prompt", "a", "temperature", -1),
                     "bad_request", "temperature"});
    table.push_back(
        {frame("id", 2, "op", "generate", "prompt", "a", "top_p", 2), "bad_request", "top_p"});
    table.push_back({frame("id", 3, "op", "generate", "prompt", "a", "colour", "red"),
                     "bad_request", "colour"});
    table.push_back({frame("id", 4, "op", "generate", "prompt", "a", "max_tokens", "many"),
                     "bad_request", "max_tokens"});
    table.push_back({frame("id", 5, "op", "generate", "tokens", std::vector<int>{1, 99999}),
                     "bad_request", "tokens"});
    table.push_back({frame("id", 6, "op", "generate", "prompt", "a", "max_tokens", 100000),
                     "context_exceeded", ""});
    table.push_back({frame("id", 7, "op", "generate"), "bad_request", "prompt"});
    for (auto& b : table) {
        ASSERT_TRUE(c.send(b.f));
        auto e = next(c);
        ASSERT_TRUE(e.has_value());
        EXPECT_EQ(e->str("event"), "error");
        EXPECT_EQ(e->str("code"), b.code) << e->str("message");
        EXPECT_NE(e->str("message").find(b.key), std::string::npos) << e->str("message");
    }
}

// Without a seed the server draws one (issue 27): two identical unseeded requests at
// temperature 1 give different tokens, each done event reports its seed, and sending a
// reported seed back gives that answer's tokens exactly.
TEST_F(generated_server, unseeded_requests_sample_afresh_and_report_a_reproducing_seed) {
    auto run = [&](uint64_t id, std::optional<uint64_t> seed) {
        msgpack::sbuffer f = seed ? frame("id", id, "op", "generate", "prompt", "hello",
                                          "max_tokens", 24, "temperature", 1, "seed", *seed)
                                  : frame("id", id, "op", "generate", "prompt", "hello",
                                          "max_tokens", 24, "temperature", 1);
        EXPECT_TRUE(c.send(f));
        auto evs = until_terminal(c, id);
        EXPECT_FALSE(evs.empty());
        EXPECT_EQ(evs.back().str("event"), "done") << evs.back().outcome();
        return std::make_pair(evs.back().ints("tokens"), evs.back().u("seed"));
    };
    auto [a, seed_a] = run(1, std::nullopt);
    auto [b, seed_b] = run(2, std::nullopt);
    EXPECT_NE(seed_a, seed_b) << "two unseeded requests got the same seed";
    EXPECT_NE(a, b) << "two unseeded requests at temperature 1 gave the same 24 tokens";
    auto [again, seed_again] = run(3, seed_a);
    EXPECT_EQ(seed_again, seed_a);
    EXPECT_EQ(again, a) << "the reported seed did not reproduce its answer";
}

TEST_F(generated_server, full_queue_is_overloaded_at_once) {
    // One running, one queued; the third is refused without waiting.
    for (uint64_t id = 1; id <= 3; id++) {
        ASSERT_TRUE(
            c.send(frame("id", id, "op", "generate", "prompt", "hello", "max_tokens", 100)));
    }
    std::map<uint64_t, std::string> outcome;
    while (outcome.size() < 3) {
        auto e = next(c);
        ASSERT_TRUE(e.has_value());
        if (e->terminal()) outcome[e->u("id")] = e->str("event") + ":" + e->str("code");
    }
    EXPECT_EQ(outcome[1], "done:");
    EXPECT_EQ(outcome[2], "done:");
    EXPECT_EQ(outcome[3], "error:overloaded");
}

TEST_F(generated_server, tokenize_detokenize_model) {
    ASSERT_TRUE(c.send(frame("id", 1, "op", "tokenize", "text", "hi there")));
    auto t = next(c);
    ASSERT_TRUE(t.has_value());
    auto ids = t->ints("tokens");
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids[0], 1);  // BOS
    ASSERT_TRUE(c.send(frame("id", 2, "op", "detokenize", "tokens", ids)));
    auto d = next(c);
    ASSERT_TRUE(d.has_value());
    EXPECT_EQ(d->str("text"), "hi there");
    ASSERT_TRUE(c.send(frame("id", 3, "op", "model")));
    auto m = next(c);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->str("architecture"), "llama");
    EXPECT_EQ(m->u("n_vocab"), 300u);
    EXPECT_EQ(m->str("fingerprint").size(), 32u);
}

// The gpu map of the model and stats ops over TCP: the device as the gpu actor announced it,
// the steps it ran, and a hang injected through the fault op, which takes the real watchdog
// path: counted as a timeout, the device rebuilt (epoch 1), the request that met it recomputed
// and completed. The server runs with gpu.batch_invariant = false: its map says the steps stay
// batch invariant exactly where the device has no cooperative matrices (lavapipe).
TEST(serving, gpu_map_in_model_and_stats_counts_steps_and_a_watchdog_timeout) {
    std::string model = temp_path("gpu_map.gguf");
    std::string mk = std::string(ORDO_MODEL_BIN) + " mk --out " + model +
                     " --n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 --n-ff 128"
                     " --n-vocab 300 --type f16 --seed 5 --ctx 256 > /dev/null";
    ASSERT_EQ(std::system(mk.c_str()), 0);
    server_process server;
    ASSERT_TRUE(server.start(
        ORDO_SERVER_BIN, {"--config",
                          write_config("gpu_map.toml", model,
                                       "[gpu]\nbatch_invariant = false\n[fault]\nenabled = true\n"),
                          "--log-level", "warn"}))
        << server.output();
    require_healthy(server.port());
    tcp_client c;
    ASSERT_TRUE(c.connect(server.port()));

    auto m = model_op(c, 1);
    const msgpack::object* dev = m ? field(m->o(), "gpu") : nullptr;
    ASSERT_NE(dev, nullptr);
    EXPECT_EQ(str_field(*dev, "name"), m->str("device"));
    EXPECT_FALSE(str_field(*dev, "name").empty());
    EXPECT_FALSE(str_field(*dev, "vulkan").empty());
    EXPECT_GT(uint_field(*dev, "subgroup_size"), 0u);
    EXPECT_GT(uint_field(*dev, "max_storage_buffer_range"), 0u);
    std::string kind = str_field(*dev, "kind"), kernels = str_field(*dev, "kernels");
    EXPECT_TRUE(kernels == "texel" || kernels == "storage") << kernels;
    const msgpack::object* summaries = field(*dev, "row_summaries");
    ASSERT_NE(summaries, nullptr);
    ASSERT_EQ(summaries->type, msgpack::type::BOOLEAN);
    // gpu.flush_every_layers is not set: the device's choice.
    const std::uint64_t flush = uint_field(*dev, "flush_every_layers");
    EXPECT_EQ(uint_field(*dev, "first_segment_layers"), flush);  // no device shortens it yet
    const msgpack::object* in_place = field(*dev, "logits_in_place");
    ASSERT_NE(in_place, nullptr);
    ASSERT_EQ(in_place->type, msgpack::type::BOOLEAN);
    if (kind == "cpu") {
        EXPECT_EQ(kernels, "texel");           // lavapipe
        EXPECT_FALSE(summaries->via.boolean);  // its host pass is cheaper (gpu.row_summaries)
        EXPECT_EQ(flush, 4u);                  // its segments run long
        EXPECT_TRUE(in_place->via.boolean);    // it has VK_EXT_external_memory_host
    } else {
        EXPECT_EQ(flush, 16u);
    }
    const msgpack::object* features = field(*dev, "features");
    ASSERT_NE(features, nullptr);
    ASSERT_EQ(features->type, msgpack::type::ARRAY);
    bool coop = false;
    for (std::uint32_t i = 0; i < features->via.array.size; ++i) {
        const msgpack::object& f = features->via.array.ptr[i];
        coop =
            coop || (f.type == msgpack::type::STR && f.as<std::string>() == "cooperative_matrix");
    }
    const msgpack::object* invariant = field(*dev, "batch_invariant");
    ASSERT_NE(invariant, nullptr);
    ASSERT_EQ(invariant->type, msgpack::type::BOOLEAN);
    // The storage family's tiled steps switch; lavapipe's texel family has no such step.
    EXPECT_EQ(invariant->via.boolean, !(coop && kernels == "storage"));
    if (kind == "cpu") {
        EXPECT_FALSE(coop);
    }

    auto gpu_stats = [&](uint64_t id) {
        EXPECT_TRUE(c.send(frame("id", id, "op", "stats")));
        auto e = next(c);
        EXPECT_TRUE(e.has_value());
        std::map<std::string, double> r;
        const msgpack::object* g = e ? field(e->o(), "gpu") : nullptr;
        EXPECT_NE(g, nullptr);
        if (g == nullptr) return r;
        for (const char* k : {"epoch", "steps", "timeouts", "device_lost", "nan_logits",
                              "other_failures", "segments", "segments_replayed"}) {
            r[k] = static_cast<double>(uint_field(*g, k));
        }
        for (const char* k : {"busy_ms", "step_wall_ms", "between_steps_ms", "run_ms"}) {
            const msgpack::object* v = field(*g, k);
            r[k] = v != nullptr ? v->as<double>() : -1.0;
        }
        r["back_to_back_steps"] = static_cast<double>(uint_field(*g, "back_to_back_steps"));
        const msgpack::object* d = field(*g, "device");
        EXPECT_TRUE(d != nullptr && str_field(*d, "name") == m->str("device"));
        return r;
    };
    // Greedy: an unseeded draw could end at the first token (a random model's end of text),
    // leaving one step where the test counts on a prefill and decodes.
    auto done = generate(c, 2, "prompt", "hello", "max_tokens", 4, "temperature", 0);
    ASSERT_FALSE(done.empty());
    ASSERT_EQ(done.back().str("event"), "done");
    ASSERT_GE(done.back().ints("tokens").size(), 2u) << "greedy ends at once on this model";
    auto before = gpu_stats(3);
    EXPECT_GE(before["steps"], 2.0);  // a prefill and decodes
    EXPECT_GT(before["busy_ms"], 0.0);
    // Each step's wall time holds its GPU time; every decode was sent by the handler of the
    // step before it (the prefill waited for the request), and that took some time.
    EXPECT_GE(before["run_ms"], before["busy_ms"]);
    // Every step ran a segment or more, and the decode steps repeated theirs: replayed, not
    // recorded again (the prefill's, the first decode's and one per table block are recorded).
    EXPECT_GE(before["segments"], before["steps"]);
    EXPECT_GT(before["segments_replayed"], 0.0);
    EXPECT_LT(before["segments_replayed"], before["segments"]);
    EXPECT_GE(before["step_wall_ms"], before["run_ms"]);
    EXPECT_GE(before["back_to_back_steps"], before["steps"] - 1.0);
    EXPECT_LT(before["back_to_back_steps"], before["steps"]);
    EXPECT_GT(before["between_steps_ms"], 0.0);
    EXPECT_EQ(before["epoch"], 0.0);
    EXPECT_EQ(before["timeouts"], 0.0);

    ASSERT_TRUE(c.send(frame("id", 4, "op", "fault", "kind", "hang")));
    auto armed = next(c);
    ASSERT_TRUE(armed.has_value());
    ASSERT_EQ(armed->str("event"), "done") << armed->str("message");
    auto after_fault = generate(c, 5, "prompt", "hello", "max_tokens", 4);
    ASSERT_FALSE(after_fault.empty());
    EXPECT_EQ(after_fault.back().str("event"), "done") << after_fault.back().str("message");
    auto after = gpu_stats(6);
    EXPECT_EQ(after["timeouts"], 1.0);
    EXPECT_EQ(after["device_lost"], 0.0);
    EXPECT_EQ(after["epoch"], 1.0);
    EXPECT_GT(after["steps"], before["steps"]);
}

// The `ordo` command-line client against the same server: health, tokenize, a streamed
// generate (text on stdout, the reason on stderr), and a clear message for a dead port.
std::pair<int, std::string> run_cli(const std::string& args) {
    auto r = run_command(std::string(ORDO_CLI_BIN) + " " + args + " 2>&1");
    return {r.exit_code, r.output};
}

TEST_F(generated_server, command_line_client) {
    std::string port = "--port " + std::to_string(server.port());
    auto [rc, out] = run_cli(port + " health");
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("\"status\":\"ok\""), std::string::npos) << out;
    std::tie(rc, out) = run_cli(port + " tokenize hello");
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("\"tokens\":[1,"), std::string::npos) << out;
    std::tie(rc, out) = run_cli(port + " generate hello -n 5 --temp 0");
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("[length]"), std::string::npos) << out;
    std::tie(rc, out) = run_cli("--port 1 health");
    EXPECT_EQ(rc, 3);
    EXPECT_NE(out.find("cannot connect"), std::string::npos) << out;
    std::tie(rc, out) = run_cli(port + " generate hello -n 5 --temp -1");
    EXPECT_EQ(rc, 1);
    EXPECT_NE(out.find("bad_request"), std::string::npos) << out;
}

}  // namespace
