// test_speculative.cpp: speculative decoding (docs/speculative.md) on the real ordo-server over
// TCP, on the real Vulkan device (lavapipe in CI), with trained and llama.cpp-quantized files.
//
// Checks the guarantee itself: for the same request and seed, the output is byte-identical
// (tokens and text) with speculation on and off. Each server speculates (`[speculative] mode =
// "ngram"`) and every prompt is sent twice, once opting out (`speculative: false`: plain
// decoding) and once speculating, at temperatures 0 and 0.8 with a seed per prompt:
//   - stories260K (F32, trained): 200 prompts (text that repeats itself, as in an edit or a
//     quote, and token-id prompts with repeated segments), every pair compared, 8 requests in
//     flight at once (the speculating ones batched with others' drafts, decodes and prefills),
//     and 24 prompts again one request at a time;
//   - stories260K-Q4_K_M, stories260K-Q8_0 and ktiny-Q4_K_M (random weights: few drafts kept,
//     exercising rejection), made by llama.cpp's llama-quantize: 40 prompts each, batched;
//   - with gpu.kernels = "storage" and gpu.row_summaries = "on" (what GPUs run; lavapipe
//     defaults to texel kernels and no row summaries): stories260K and its Q4_K_M file, 50
//     prompts each, batched and 8 alone.
// And that speculation ran both ways: verifications kept drafts and rejected some
// (stats.scheduler spec_rounds, spec_drafted_tokens, spec_accepted_tokens; the acceptance
// histogram counted every verification), and the server ended idle (no KV block used).
// Skipped with a visible message without ../shared/models (CI has them).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "tests/support/server_process.hpp"
#include "tests/support/shared_models.hpp"

namespace {

using namespace ordo::test;

const std::string models = std::string(ORDO_SHARED_MODELS_DIR);
constexpr uint32_t k_max_tokens = 32;
constexpr size_t k_in_flight = 8;

struct prompt {
    std::string text;             // a text prompt, or
    std::vector<int32_t> tokens;  // token ids
};

// Prompts whose answers tend to repeat them: texts that repeat a phrase (stories260K's
// vocabulary is English), and token ids where a random segment comes back.
std::vector<prompt> make_prompts(size_t n, uint32_t n_vocab, bool with_text, uint64_t seed) {
    static const char* phrases[] = {"Once upon a time, there was a little girl named Lily.",
                                    "The cat sat on the mat.",
                                    "Tom and Sue went to the park to play.",
                                    "She liked to play with her ball.",
                                    "The sun was hot and the sky was blue.",
                                    "He said, \"I want to go home.\"",
                                    "They were happy and they played all day.",
                                    "The dog ran to the big tree."};
    std::mt19937_64 rng(seed);
    auto pick = [&](uint64_t k) { return size_t(rng() % k); };
    std::vector<prompt> out;
    for (size_t i = 0; i < n; i++) {
        prompt p;
        if (with_text && i % 2 == 0) {
            const std::string a = phrases[pick(std::size(phrases))];
            const std::string b = phrases[pick(std::size(phrases))];
            p.text = a + " " + b + " " + a + " " + b.substr(0, b.size() / 2);
        } else {
            std::vector<int32_t> seg(4 + pick(8));
            for (auto& t : seg) t = int32_t(3 + pick(n_vocab - 3));
            for (size_t r = 0; r < 2 + pick(2); r++) {
                p.tokens.insert(p.tokens.end(), seg.begin(), seg.end());
                if (pick(2) == 0) p.tokens.push_back(int32_t(3 + pick(n_vocab - 3)));
            }
            p.tokens.insert(p.tokens.end(), seg.begin(), seg.begin() + long(seg.size() / 2));
        }
        out.push_back(std::move(p));
    }
    return out;
}

struct answer {
    std::vector<int32_t> tokens;
    std::string text;
    std::string outcome;
};

msgpack::sbuffer request(uint64_t id, const prompt& p, double temperature, uint64_t seed,
                         bool speculative) {
    if (p.text.empty()) {
        return frame("id", id, "op", "generate", "tokens", p.tokens, "max_tokens", k_max_tokens,
                     "temperature", temperature, "seed", seed, "speculative", speculative);
    }
    return frame("id", id, "op", "generate", "prompt", p.text, "max_tokens", k_max_tokens,
                 "temperature", temperature, "seed", seed, "speculative", speculative);
}

// Every (prompt, temperature) once with `speculative`, `in_flight` requests at a time on one
// connection; answers by (prompt index, temperature index).
std::map<std::pair<size_t, int>, answer> run_all(uint16_t port, const std::vector<prompt>& ps,
                                                 bool speculative, size_t in_flight) {
    tcp_client c;
    EXPECT_TRUE(c.connect(port));
    std::vector<std::pair<size_t, int>> todo;
    for (size_t i = 0; i < ps.size(); i++) todo.push_back({i, 0}), todo.push_back({i, 1});
    std::map<uint64_t, std::pair<size_t, int>> live;
    std::map<std::pair<size_t, int>, answer> out;
    size_t next_todo = 0;
    uint64_t next_id = 1;
    while (next_todo < todo.size() || !live.empty()) {
        while (live.size() < in_flight && next_todo < todo.size()) {
            const auto [i, t] = todo[next_todo++];
            const uint64_t id = next_id++;
            EXPECT_TRUE(c.send(request(id, ps[i], t == 0 ? 0.0 : 0.8, 1000 + i, speculative)));
            live[id] = {i, t};
        }
        auto e = next(c);
        if (!e) {
            ADD_FAILURE() << "the connection ended or timed out with " << live.size() << " live";
            break;
        }
        auto it = live.find(e->u("id"));
        if (it == live.end() || !e->terminal()) continue;
        answer& a = out[it->second];
        a.tokens = e->ints("tokens");
        a.text = e->str("text");
        a.outcome = e->outcome();
        live.erase(it);
    }
    return out;
}

std::map<std::string, uint64_t> scheduler_stats(uint16_t port) {
    auto e = stats_event(port);
    EXPECT_TRUE(e.has_value());
    std::map<std::string, uint64_t> r;
    if (!e) return r;
    const msgpack::object& st = e->o();
    if (const auto* s = field(st, "scheduler")) s->convert(r);
    r["kv_blocks_used"] = uint_field(st, "kv_blocks_used");
    if (const auto* h = field(st, "histograms")) {
        if (const auto* a = field(*h, "spec_acceptance_rate")) {
            r["acceptance_observed"] = uint_field(*a, "count");
        }
        if (const auto* a = field(*h, "spec_draft_round_seconds")) {
            r["draft_rounds_observed"] = uint_field(*a, "count");
        }
    }
    return r;
}

// The [speculative] section of a server that drafts by prompt lookup, or with a draft model.
std::string ngram_section() {
    return "[speculative]\nmode = \"ngram\"\ndraft_tokens_max = 6\nngram_min = 1\nngram_max = 3\n";
}
std::string draft_section(const std::string& draft_model) {
    return "[speculative]\nmode = \"draft\"\ndraft_tokens_max = 6\ndraft_model = \"" + draft_model +
           "\"\n";
}

// Waits until the model op says the draft model drafts (its device built, or rebuilt after a
// loss), at most device_ready_deadline; the last `speculative` map's draft_reason otherwise.
std::string wait_draft_ready(uint16_t port) {
    const auto until = std::chrono::steady_clock::now() + device_ready_deadline;
    std::string why = "no answer";
    while (std::chrono::steady_clock::now() < until) {
        tcp_client c;
        if (c.connect(port) && c.send(frame("id", 1, "op", "model"))) {
            if (auto m = next(c); m && m->terminal()) {
                const draft_state d = draft_state_of(m->o());
                if (!d.present) return "no speculative map in the model op";
                if (d.ready) return "";
                why = d.reason;
            }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return "the draft model never became ready: " + why;
}

struct served {
    server_process proc;
    // kernels: "auto" (lavapipe's defaults: texel kernels, no row summaries) or "storage" (what
    // GPUs run: gpu.kernels = "storage" and gpu.row_summaries = "on", so the samplers and the
    // draft actor read the summaries). extra: more TOML (a [fault] section).
    bool start(const std::string& model, const std::string& name, const std::string& kernels,
               const std::string& speculative, const std::string& extra = "") {
        const std::string cfg = scratch_path("speculative", name + "-" + kernels + ".toml");
        std::ofstream(cfg) << "[model]\npath = \"" << model << "\"\n"
                           << "[gpu]\nkernels = \"" << kernels << "\"\n"
                           << (kernels == "storage" ? "row_summaries = \"on\"\n" : "")
                           << "[scheduler]\nmax_sequences = 16\n"
                           << speculative << extra;
        if (!proc.start(ORDO_SERVER_BIN, {"--config", cfg})) return false;
        if (!wait_healthy(proc.port()).empty()) return false;
        // A draft model builds its device beside the served one's: speculation starts once
        // it is ready (the tests count its rounds).
        if (speculative.find("\"draft\"") == std::string::npos) return true;
        const std::string why = wait_draft_ready(proc.port());
        EXPECT_EQ(why, "");
        return why.empty();
    }
};

// Runs every prompt plainly and speculating on a speculating server; returns the stats after.
std::map<std::string, uint64_t> compare(const std::string& file, size_t n_prompts, bool text,
                                        size_t alone, const std::string& kernels = "auto",
                                        const std::string& speculative = ngram_section()) {
    served s;
    const std::string name = std::filesystem::path(file).stem().string() +
                             (speculative == ngram_section() ? "" : "-draft");
    if (!s.start(file, name, kernels, speculative)) {
        ADD_FAILURE() << "server did not start on " << file << ": " << s.proc.output();
        return {};
    }
    tcp_client c;
    EXPECT_TRUE(c.connect(s.proc.port()));
    EXPECT_TRUE(c.send(frame("id", 1, "op", "model")));
    auto m = next(c);
    EXPECT_TRUE(m.has_value());
    const uint32_t n_vocab = m ? uint32_t(m->u("n_vocab")) : 0;
    EXPECT_GT(n_vocab, 3u);
    const auto ps = make_prompts(n_prompts, n_vocab, text, 7);
    const auto plain = run_all(s.proc.port(), ps, false, k_in_flight);
    const auto spec = run_all(s.proc.port(), ps, true, k_in_flight);
    size_t compared = 0;
    for (const auto& [key, want] : plain) {
        const std::string what = file + " prompt " + std::to_string(key.first) + " temperature " +
                                 (key.second == 0 ? "0" : "0.8");
        EXPECT_EQ(want.outcome.substr(0, 4), "done") << what << ": " << want.outcome;
        auto it = spec.find(key);
        if (it == spec.end()) {
            ADD_FAILURE() << what << ": no speculating answer";
            continue;
        }
        EXPECT_EQ(it->second.outcome, want.outcome) << what;
        EXPECT_EQ(it->second.tokens, want.tokens) << what;
        EXPECT_EQ(it->second.text, want.text) << what;
        compared++;
    }
    EXPECT_EQ(compared, 2 * ps.size());
    // One request at a time: nothing batched beside the verifications.
    if (alone > 0) {
        const std::vector<prompt> few(ps.begin(), ps.begin() + long(alone));
        const auto one = run_all(s.proc.port(), few, true, 1);
        for (const auto& [key, got] : one) {
            EXPECT_EQ(got.tokens, plain.at(key).tokens)
                << file << " alone, prompt " << key.first << " temperature index " << key.second;
        }
    }
    auto st = scheduler_stats(s.proc.port());
    EXPECT_EQ(st["kv_blocks_used"], 0u) << file;
    EXPECT_EQ(st["acceptance_observed"], st["spec_rounds"]) << file;
    // A draft model's rounds: each answered one timed (none without a draft model).
    EXPECT_EQ(st["draft_rounds_observed"], st["spec_draft_rounds"] - st["spec_draft_rounds_failed"])
        << file;
    return st;
}

TEST(speculative_server, stories260K_output_is_identical_with_speculation_on_and_off) {
    const std::string file = models + "/stories260K.gguf";
    ORDO_REQUIRE_SHARED(file);
    auto st = compare(file, 200, true, 24);
    // Drafts were made, and verifications both kept and rejected them.
    EXPECT_GT(st["spec_rounds"], 200u);
    EXPECT_GT(st["spec_accepted_tokens"], 0u);
    EXPECT_LT(st["spec_accepted_tokens"], st["spec_drafted_tokens"]);
    std::printf("stories260K: %llu verifications, %llu of %llu drafted tokens kept\n",
                (unsigned long long)st["spec_rounds"],
                (unsigned long long)st["spec_accepted_tokens"],
                (unsigned long long)st["spec_drafted_tokens"]);
}

TEST(speculative_server, quantized_files_output_is_identical_with_speculation_on_and_off) {
    for (const char* name :
         {"stories260K-Q4_K_M.gguf", "stories260K-Q8_0.gguf", "ktiny-Q4_K_M.gguf"}) {
        const std::string file = models + "/quant/" + name;
        ORDO_REQUIRE_SHARED(file);
        auto st = compare(file, 40, std::string(name).starts_with("stories"), 0);
        EXPECT_GT(st["spec_rounds"], 0u) << name;
        EXPECT_LT(st["spec_accepted_tokens"], st["spec_drafted_tokens"]) << name;
    }
}

// The storage kernels, which GPUs run (lavapipe runs the texel family by default): a
// verification's multi-token mat-muls and attention against the single-token decode kernels.
TEST(speculative_server, storage_kernels_output_is_identical_with_speculation_on_and_off) {
    for (const char* name : {"stories260K.gguf", "quant/stories260K-Q4_K_M.gguf"}) {
        const std::string file = models + "/" + name;
        ORDO_REQUIRE_SHARED(file);
        auto st = compare(file, 50, true, 8, "storage");
        EXPECT_GT(st["spec_accepted_tokens"], 0u) << name;
        EXPECT_LT(st["spec_accepted_tokens"], st["spec_drafted_tokens"]) << name;
    }
}

// ---- a draft model (mode = "draft") ----

// stories260K drafting for itself: at temperature 0 its greedy drafts are the target's own
// draws, so nearly every draft is kept; at 0.8 many are not. The draft actor rolls its KV back
// to what the target kept after every rejection, and the output stays the plain one.
TEST(speculative_server, draft_model_stories260K_drafting_for_itself_output_is_identical) {
    const std::string file = models + "/stories260K.gguf";
    ORDO_REQUIRE_SHARED(file);
    auto st = compare(file, 200, true, 24, "auto", draft_section(file));
    EXPECT_GT(st["spec_rounds"], 200u);
    EXPECT_GT(st["spec_accepted_tokens"], st["spec_drafted_tokens"] / 2);
    EXPECT_LT(st["spec_accepted_tokens"], st["spec_drafted_tokens"]);
    EXPECT_EQ(st["spec_fallbacks_drafter_error"], 0u);
    EXPECT_GT(st["spec_draft_rounds"], 200u);
    EXPECT_EQ(st["spec_draft_rounds_failed"], 0u);
    std::printf("stories260K drafting for itself: %llu verifications, %llu of %llu kept\n",
                (unsigned long long)st["spec_rounds"],
                (unsigned long long)st["spec_accepted_tokens"],
                (unsigned long long)st["spec_drafted_tokens"]);
}

// Draft models that are not the target: the F32 file drafting for llama.cpp's Q4_K_M
// quantization of it (close, not equal: some drafts rejected at temperature 0 too), and a
// random-weight model with stories260K's vocabulary (ordo-model mk --vocab-from): its drafts
// are nearly all rejected, so requests fall back to plain decoding (no_acceptance), with the
// same output. The storage kernels (the GPUs' family) run the first pair too.
TEST(speculative_server, draft_models_other_than_the_target_output_is_identical) {
    const std::string f32 = models + "/stories260K.gguf";
    const std::string q4 = models + "/quant/stories260K-Q4_K_M.gguf";
    ORDO_REQUIRE_SHARED(f32);
    ORDO_REQUIRE_SHARED(q4);
    for (const char* kernels : {"auto", "storage"}) {
        auto st = compare(q4, 40, true, 4, kernels, draft_section(f32));
        EXPECT_GT(st["spec_accepted_tokens"], 0u) << kernels;
        EXPECT_LT(st["spec_accepted_tokens"], st["spec_drafted_tokens"]) << kernels;
    }
    const std::string random =
        generated_model(ORDO_MODEL_BIN, scratch_path("speculative", "random-draft.gguf"),
                        "--n-embd 32 --n-layer 1 --n-head 2 --n-ff 64 --vocab-from " + f32 +
                            " --type f32 --seed 9 --ctx 512");
    auto st = compare(f32, 40, true, 0, "auto", draft_section(random));
    EXPECT_GT(st["spec_rounds"], 0u);
    EXPECT_LT(st["spec_accepted_tokens"], st["spec_drafted_tokens"] / 4);
    EXPECT_GT(st["spec_fallbacks_no_acceptance"], 0u);
}

// The draft model's device fails (draft_fail: its gpu actor loses the device on its next step
// and rebuilds it, the real failure path): the requests whose round failed decode on without
// speculation (drafter_error), none ends early, empty or in error, each has one terminal event
// and its plain output; the target's device is untouched, and once the draft device is back,
// later requests speculate again.
TEST(speculative_server, a_failing_draft_model_fails_no_request) {
    const std::string file = models + "/stories260K.gguf";
    ORDO_REQUIRE_SHARED(file);
    served s;
    ASSERT_TRUE(
        s.start(file, "draft-fail", "auto", draft_section(file), "[fault]\nenabled = true\n"))
        << s.proc.output();
    const auto ps = make_prompts(24, 512, true, 11);
    const auto plain = run_all(s.proc.port(), ps, false, k_in_flight);
    for (int round = 0; round < 3; round++) {
        // Rounds 0 and 1 lose the draft device on its next step; round 2 runs once it is back.
        ASSERT_EQ(wait_draft_ready(s.proc.port()), "");
        const auto before = scheduler_stats(s.proc.port());
        if (round == 2) {
            const auto spec = run_all(s.proc.port(), ps, true, k_in_flight);
            for (const auto& [key, want] : plain) {
                EXPECT_EQ(spec.at(key).tokens, want.tokens) << "prompt " << key.first;
            }
            const auto after = scheduler_stats(s.proc.port());
            // Speculation goes on after the failures: drafts again, kept.
            EXPECT_GT(after.at("spec_accepted_tokens"), before.at("spec_accepted_tokens"));
            EXPECT_EQ(after.at("spec_draft_rounds_failed"), before.at("spec_draft_rounds_failed"));
            break;
        }
        tcp_client c;
        ASSERT_TRUE(c.connect(s.proc.port()));
        ASSERT_TRUE(c.send(frame("id", 1, "op", "fault", "kind", "draft_fail", "count", 1)));
        auto armed = next(c);
        ASSERT_TRUE(armed.has_value());
        EXPECT_EQ(armed->str("event"), "done") << armed->str("message");
        const auto spec = run_all(s.proc.port(), ps, true, k_in_flight);
        ASSERT_EQ(spec.size(), plain.size());
        for (const auto& [key, want] : plain) {
            EXPECT_EQ(spec.at(key).outcome, want.outcome) << "prompt " << key.first;
            EXPECT_EQ(spec.at(key).tokens, want.tokens) << "prompt " << key.first;
        }
    }
    auto st = scheduler_stats(s.proc.port());
    EXPECT_GE(st["spec_fallbacks_drafter_error"], 2u);
    EXPECT_GE(st["spec_draft_rounds_failed"], 2u);
    EXPECT_EQ(st["gpu_failed"], 0u);
    EXPECT_EQ(st["failures"], 0u);  // no target step failed
    EXPECT_EQ(st["kv_blocks_used"], 0u);
}

// A draft model whose vocabulary is not the served model's is refused at start (exit 2), with
// the key named.
TEST(speculative_server, a_draft_model_with_another_vocabulary_is_refused_at_start) {
    const std::string file = models + "/stories260K.gguf";
    const std::string other = models + "/quant/llama3-tiny-Q4_K_M.gguf";  // a Llama 3 vocabulary
    ORDO_REQUIRE_SHARED(file);
    ORDO_REQUIRE_SHARED(other);
    const std::string cfg = scratch_path("speculative", "vocab-mismatch.toml");
    std::ofstream(cfg) << "[model]\npath = \"" << file << "\"\n" << draft_section(other);
    // Bounded: a server that wrongly started is stopped, and the test fails on its status.
    const auto r =
        run_command("timeout 120 " + std::string(ORDO_SERVER_BIN) + " --config " + cfg + " 2>&1");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("speculative.draft_model = " + other), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("vocabulary is not the served model's"), std::string::npos) << r.output;
}

}  // namespace
