// ordo-bench: `ordo-bench --model FILE [--prompts 128,512] [--gen 128] [--parallel 4,8,16]
// [--json] [--flush-every N] [--device SEL] [--kernels auto|texel|storage] [--reps N]
// [--label NAME] [--mm-split-wg N] [--row-summaries auto|on|off] [--attention-flash on|off]
// [--logits-in-place on|off] [--first-segment N] [--replay on|off]
// [--batch-invariant on|off|emulated] [--mmv-shapes auto|on|off] [--mm-layouts auto|on|off]
// [--attn-k-pairs N] [--attn-v-group N] [--qkv-rope on|off]`
// (--mm-split-wg: the tiled mat-mul's group split threshold, an A/B knob: pipeline_tuning::
// mat_tiled_split_wg; 0 never splits; --row-summaries: gpu.row_summaries; --attention-flash
// off: prefill attention on attention.comp instead of attention_flash, an A/B knob with the
// same bits: runner_options::attention_flash; --logits-in-place off: the logits rows copied
// out of the device's buffer each step instead of written into the logits exchange,
// runner_options::logits_in_place; --first-segment N: layers in a step's first segment,
// runner_options::first_segment_layers, 0 as many as the others; --replay off: every segment
// recorded, none replayed from the stream's kept recordings, runner_options::replay_segments 0;
// --batch-invariant off: gpu.batch_invariant = false, the tiled steps on cooperative matrices
// where the device has them; emulated: on their plain-GLSL stand-in, any device; --mmv-shapes
// off: every weight's one-token mul_mat_vec in the tuning's shape, not the one measured at
// warm-up, runner_options::mat_vec_shapes, the same bits; --mm-layouts off: the invariant tiled
// mul_mat in the tuning's layout at every token count, not the ones measured at warm-up,
// runner_options::mat_tiled_layouts, the same bits; --attn-k-pairs / --attn-v-group:
// attention.comp's load groups, runner_options::attention_k_pairs / attention_v_group, the same
// bits; --qkv-rope off: a decode step's q|k|v mat-vec without RoPE and the KV store folded in
// (mul_mat_vec_norm then rope_kv), runner_options::qkv_rope_fusion, the same bits).
//
// Measures what ../shared/peer/bench_llamacpp.mjs measures for llama.cpp, named the same way,
// one JSON line per measurement (--json) or a readable table:
//   pp<N>      prefill of N random tokens as one step (chunks of max_batch_tokens): prefill_tok_s,
//              and gpu_ms, the best rep's GPU time (submit to fence) against its wall seconds
//   tg<G>      batch 1: a 16-token prompt, then G single-token decode steps timed: decode_tok_s
//   tg<G>x<P>  P sequences (16-token prompts), then G decode steps of all P: aggregate tok/s
//   (each tg line also splits a step's wall time: gpu_ms_per_step is the gpu actor's submit to
//   fence time summed over the step's segments, host_ms_per_step the rest: recording what the
//   GPU did not overlap, the waits between segments, the messages, and the next step's tokens
//   (greedy, as the server's sampler takes them: each row summary's first candidate, or a pass
//   over the row where the device makes no summaries); issue 28's "is a decode step
//   host-bound")
// Every step goes through a real gpu actor (gpu_session): messages, the worker thread, the
// logits exchange. Best of --reps. Then a second, timestamped runner gives "where the time
// goes": per-pipeline GPU time of one decode step (after 16 + G/2 tokens) and one prefill step
// (lines kernels_decode / kernels_prefill<N>, a "kernels" list of {name, ms, dispatches}), and
// one decode step of the largest --parallel P sequences (kernels_decode_x<P>).
// Every line also carries engine, backend, model, device, flush_every_layers,
// first_segment_layers and kernel_family
// (the --kernels choice), row_summaries (whether the steps came with them), attention_flash,
// logits_in_place (whether the device wrote the rows into the exchange), replay and
// batch_invariant (false: the tiled steps ran on cooperative matrices).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpu/client/gpu_client.hpp"
#include "gpu/runner/runner.hpp"
#include "model/gguf.hpp"
#include "model/llama.hpp"

using namespace ordo;
using namespace ordo::gpu;

namespace {

constexpr std::uint32_t block_tokens = 16;
constexpr std::uint32_t decode_prompt = 16;  // the peer's decode prompt length
constexpr std::uint32_t list_max = 16;       // entries of --prompts / --parallel
constexpr std::uint32_t batch_tokens_max = 4096;

struct bench_options {
    std::string model, device, label;
    std::vector<std::uint32_t> prompts{128, 512};
    std::uint32_t gen = 128;
    std::vector<std::uint32_t> parallel{4, 8, 16};
    std::uint32_t flush_every = 0;  // 0: the device's (gpu.flush_every_layers)
    std::string kernels = "auto";   // gpu.kernels
    std::uint32_t reps = 2;
    bool json = false;
    std::optional<std::uint32_t> mm_split_wg;    // runner_options::mat_tiled_split_wg
    std::string row_summaries = "auto";          // gpu.row_summaries
    bool attention_flash = true;                 // runner_options::attention_flash
    bool logits_in_place = true;                 // runner_options::logits_in_place
    std::optional<std::uint32_t> first_segment;  // runner_options::first_segment_layers
    bool replay = true;                          // runner_options::replay_segments (0 when off)
    std::string batch_invariant = "on";          // gpu.batch_invariant; emulated: mul_mat_cme
    std::string mmv_shapes = "auto";             // runner_options::mat_vec_shapes
    std::string mm_layouts = "auto";             // runner_options::mat_tiled_layouts
    std::optional<std::uint32_t> attn_k_pairs;   // runner_options::attention_k_pairs
    std::optional<std::uint32_t> attn_v_group;   // runner_options::attention_v_group
    bool qkv_rope = true;                        // runner_options::qkv_rope_fusion
};

[[noreturn]] void usage(const std::string& why) {
    std::fprintf(stderr,
                 "ordo-bench: %s\nusage: ordo-bench --model FILE [--prompts 128,512] [--gen 128] "
                 "[--parallel 4,8,16] [--json] [--flush-every N] [--device SEL] "
                 "[--kernels auto|texel|storage] [--reps N] [--label NAME] "
                 "[--mm-split-wg N] [--row-summaries auto|on|off] [--attention-flash on|off] "
                 "[--logits-in-place on|off] [--first-segment N] [--replay on|off] "
                 "[--batch-invariant on|off|emulated] [--mmv-shapes auto|on|off] "
                 "[--mm-layouts auto|on|off] [--attn-k-pairs N] [--attn-v-group N] "
                 "[--qkv-rope on|off]\n",
                 why.c_str());
    std::exit(2);
}

std::uint32_t parse_u32(const std::string& s, std::uint32_t lo, std::uint32_t hi) {
    char* end = nullptr;
    unsigned long v = std::strtoul(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || v < lo || v > hi) usage("bad number '" + s + "'");
    return static_cast<std::uint32_t>(v);
}

// `v` if it is one of `allowed` (the flag's values), else the usage message naming them.
std::string one_of(const std::string& flag, std::string v,
                   std::initializer_list<std::string_view> allowed) {
    std::string names;
    for (std::string_view a : allowed) {
        if (v == a) return v;
        names += (names.empty() ? "" : ", ") + std::string(a);
    }
    usage(flag + " must be one of " + names);
}

std::vector<std::uint32_t> parse_list(const std::string& s, std::uint32_t lo, std::uint32_t hi) {
    std::vector<std::uint32_t> out;
    std::size_t at = 0;
    while (at <= s.size() && out.size() < list_max) {
        std::size_t comma = s.find(',', at);
        std::size_t len = comma == std::string::npos ? std::string::npos : comma - at;
        std::string item = s.substr(at, len);
        if (!item.empty()) out.push_back(parse_u32(item, lo, hi));
        if (comma == std::string::npos) break;
        at = comma + 1;
    }
    return out;
}

bench_options parse(int argc, char** argv) {
    bench_options o;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) usage(a + " needs a value");
            return argv[++i];
        };
        if (a == "--model")
            o.model = value();
        else if (a == "--prompts")
            o.prompts = parse_list(value(), 1, batch_tokens_max);
        else if (a == "--gen")
            o.gen = parse_u32(value(), 1, 100'000);
        else if (a == "--parallel")
            o.parallel = parse_list(value(), 0, 256);
        else if (a == "--flush-every")
            o.flush_every = parse_u32(value(), 0, 1024);
        else if (a == "--device")
            o.device = value();
        else if (a == "--kernels")
            o.kernels = one_of(a, value(), {"auto", "texel", "storage"});
        else if (a == "--row-summaries")
            o.row_summaries = one_of(a, value(), {"auto", "on", "off"});
        else if (a == "--batch-invariant")
            o.batch_invariant = one_of(a, value(), {"on", "off", "emulated"});
        else if (a == "--attention-flash")
            o.attention_flash = one_of(a, value(), {"on", "off"}) == "on";
        else if (a == "--logits-in-place")
            o.logits_in_place = one_of(a, value(), {"on", "off"}) == "on";
        else if (a == "--replay")
            o.replay = one_of(a, value(), {"on", "off"}) == "on";
        else if (a == "--qkv-rope")
            o.qkv_rope = one_of(a, value(), {"on", "off"}) == "on";
        else if (a == "--mmv-shapes")
            o.mmv_shapes = one_of(a, value(), {"auto", "on", "off"});
        else if (a == "--mm-layouts")
            o.mm_layouts = one_of(a, value(), {"auto", "on", "off"});
        else if (a == "--first-segment")
            o.first_segment = parse_u32(value(), 0, 1024);
        else if (a == "--attn-k-pairs")
            o.attn_k_pairs = parse_u32(value(), 1, 1024);
        else if (a == "--attn-v-group")
            o.attn_v_group = parse_u32(value(), 1, 1024);
        else if (a == "--mm-split-wg")
            o.mm_split_wg = parse_u32(value(), 0, 1u << 20);
        else if (a == "--reps")
            o.reps = parse_u32(value(), 1, 100);
        else if (a == "--label")
            o.label = value();
        else if (a == "--json")
            o.json = true;
        else
            usage("unknown argument " + a);
    }
    if (o.model.empty()) usage("--model is required");
    if (o.label.empty()) {
        o.label = o.model.substr(o.model.find_last_of('/') + 1);
        if (o.label.ends_with(".gguf")) o.label.resize(o.label.size() - 5);
    }
    return o;
}

std::vector<std::int32_t> random_tokens(std::uint32_t n, std::uint32_t n_vocab,
                                        std::uint32_t seed) {
    std::vector<std::int32_t> t(n);
    std::uint64_t x = 0x9E3779B97F4A7C15ull * (seed + 1);
    for (auto& v : t) {
        x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
        v = static_cast<std::int32_t>((x * 0x2545F4914F6CDD1Dull >> 33) % n_vocab);
    }
    return t;
}

// One step of P sequences: sequence i runs tokens[i] at pos0 in blocks i * seq_blocks, ...
step seqs_step(std::uint64_t id, step_phase phase,
               const std::vector<std::vector<std::int32_t>>& tokens, std::uint32_t pos0,
               std::uint32_t seq_blocks) {
    step st;
    st.step_id = id;
    st.phase = phase;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        step_seq q;
        q.seq_id = i;
        q.tokens = tokens[i];
        q.pos0 = pos0;
        std::uint32_t end = pos0 + static_cast<std::uint32_t>(tokens[i].size());
        for (std::uint32_t b = 0; b * block_tokens < end; ++b) {
            q.block_table.push_back(static_cast<std::uint32_t>(i) * seq_blocks + b);
        }
        q.logits_rows = 1;
        st.seqs.push_back(std::move(q));
    }
    return st;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Sizes the runner for the largest measurement.
runner_options runner_for(const bench_options& o, std::uint32_t n_ctx) {
    runner_options r;
    r.device = o.device;
    r.flush_every_layers = o.flush_every;
    if (o.kernels != "auto") r.texel_kernels = o.kernels == "texel";
    if (o.row_summaries != "auto") r.row_summaries = o.row_summaries == "on";
    r.attention_flash = o.attention_flash;
    r.batch_invariant = o.batch_invariant == "on";
    r.mat_coop_emulated = o.batch_invariant == "emulated";
    r.logits_in_place = o.logits_in_place;
    r.first_segment_layers = o.first_segment;
    if (!o.replay) r.replay_segments = 0;
    if (o.mmv_shapes != "auto") r.mat_vec_shapes = o.mmv_shapes == "on";
    if (o.mm_layouts != "auto") r.mat_tiled_layouts = o.mm_layouts == "on";
    r.mat_tiled_split_wg = o.mm_split_wg;
    r.attention_k_pairs = o.attn_k_pairs;
    r.attention_v_group = o.attn_v_group;
    r.qkv_rope_fusion = o.qkv_rope;
    r.watchdog_ms = 600'000;
    r.kv_block_tokens = block_tokens;
    std::uint32_t pmax = 1, prompt_max = decode_prompt;
    for (auto p : o.parallel) pmax = std::max(pmax, p);
    for (auto p : o.prompts) prompt_max = std::max(prompt_max, p);
    std::uint32_t seq_blocks = (decode_prompt + o.gen + 1 + block_tokens - 1) / block_tokens;
    r.kv_blocks = std::max((prompt_max + block_tokens - 1) / block_tokens, pmax * seq_blocks);
    r.max_batch_tokens = std::max(prompt_max, decode_prompt * pmax);
    r.rows_max = pmax;
    r.seqs_max = pmax;
    r.n_ctx = std::min(n_ctx, std::max(prompt_max, decode_prompt + o.gen + 1));
    return r;
}

}  // namespace

namespace {

struct timed_step {
    double seconds = 0;
    double gpu_ms = 0;  // of the timed steps
};

struct bench {
    const bench_options& o;
    gpu_session& s;
    std::uint32_t n_vocab;
    std::uint32_t seq_blocks;
    std::string common;  // JSON fields every line carries
    std::uint64_t step_id = 0;
    std::vector<std::int32_t> greedy;  // the last step's rows' greedy tokens
    double gpu_ms = 0;                 // step_done.gpu_ms of the steps run, summed

    // One step: sequence i runs tokens[i] at pos0 with blocks i * seq_blocks, ...
    void run(const std::vector<std::vector<std::int32_t>>& tokens, std::uint32_t pos0,
             step_phase phase) {
        step st = seqs_step(++step_id, phase, tokens, pos0, seq_blocks);
        auto d = s.run_greedy(st, greedy, 3'600'000);
        if (!d) {
            std::fprintf(stderr, "ordo-bench: step failed: %s: %s\n", d.err().code.c_str(),
                         d.err().message.c_str());
            std::exit(1);
        }
        gpu_ms += d->gpu_ms;
    }

    // Wall seconds of one prefill step and its GPU ms (submit to fence).
    timed_step prefill(std::uint32_t n, std::uint32_t seed) {
        const double gpu0 = gpu_ms;
        auto t0 = std::chrono::steady_clock::now();
        run({random_tokens(n, n_vocab, seed)}, 0, step_phase::prefill);
        return {seconds_since(t0), gpu_ms - gpu0};
    }

    // P sequences: a 16-token prompt each (untimed), then gen greedy decode steps (timed).
    timed_step decode(std::uint32_t p, std::uint32_t seed) {
        std::vector<std::vector<std::int32_t>> toks;
        for (std::uint32_t i = 0; i < p; ++i) {
            toks.push_back(random_tokens(decode_prompt, n_vocab, seed + i));
        }
        run(toks, 0, step_phase::prefill);
        const double gpu0 = gpu_ms;
        auto t0 = std::chrono::steady_clock::now();
        for (std::uint32_t g = 0; g < o.gen; ++g) {
            for (std::uint32_t i = 0; i < p; ++i) toks[i] = {greedy[i]};
            run(toks, decode_prompt + g, step_phase::decode);
        }
        return {seconds_since(t0), gpu_ms - gpu0};
    }

    void emit(const std::string& fields, const std::string& human) {
        if (o.json) {
            std::printf("{%s, %s}\n", common.c_str(), fields.c_str());
        } else {
            std::printf("%s\n", human.c_str());
        }
        std::fflush(stdout);
    }
};

std::string fmt(double v) {
    char b[64];
    std::snprintf(b, sizeof b, "%.2f", v);
    return b;
}

std::string json_str(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') out += '\\';
        if (static_cast<unsigned char>(c) >= 0x20) out += c;
    }
    return out + "\"";
}

void measure(bench& b) {
    b.prefill(std::min<std::uint32_t>(64, b.o.prompts.empty() ? 64 : b.o.prompts[0]), 7);
    for (std::uint32_t n : b.o.prompts) {
        timed_step best{1e30, 0};
        for (std::uint32_t r = 0; r < b.o.reps; ++r) {
            const timed_step t = b.prefill(n, 100 + r);
            if (t.seconds < best.seconds) best = t;
        }
        // gpu_ms against seconds: how much of the prefill's wall time the GPU ran.
        b.emit("\"test\": \"pp" + std::to_string(n) + "\", \"n_prompt\": " + std::to_string(n) +
                   ", \"prefill_tok_s\": " + fmt(n / best.seconds) +
                   ", \"seconds\": " + fmt(best.seconds) + ", \"gpu_ms\": " + fmt(best.gpu_ms),
               "pp" + std::to_string(n) + "  prefill " + fmt(n / best.seconds) + " tok/s");
    }
    std::vector<std::uint32_t> batches{1};
    for (auto p : b.o.parallel) {
        if (p > 1) batches.push_back(p);
    }
    for (std::uint32_t p : batches) {
        timed_step best{1e30, 0};
        std::uint32_t reps = p == 1 ? b.o.reps : std::max(1u, b.o.reps - 1);
        for (std::uint32_t r = 0; r < reps; ++r) {
            timed_step t = b.decode(p, 200 + 10 * r);
            if (t.seconds < best.seconds) best = t;
        }
        std::string name = "tg" + std::to_string(b.o.gen) + (p > 1 ? "x" + std::to_string(p) : "");
        const double tok_s = double(p) * b.o.gen / best.seconds;
        const double step_ms = 1000 * best.seconds / b.o.gen;
        const double gpu_step_ms = best.gpu_ms / b.o.gen;
        b.emit("\"test\": \"" + name + "\", \"n_gen\": " + std::to_string(b.o.gen) +
                   ", \"batch_seqs\": " + std::to_string(p) + ", \"decode_tok_s\": " + fmt(tok_s) +
                   ", \"ms_per_step\": " + fmt(step_ms) + ", \"gpu_ms_per_step\": " +
                   fmt(gpu_step_ms) + ", \"host_ms_per_step\": " + fmt(step_ms - gpu_step_ms) +
                   ", \"seconds\": " + fmt(best.seconds),
               name + "  decode " + fmt(tok_s) + " tok/s (" + std::to_string(p) + " seqs), " +
                   fmt(step_ms) + " ms a step: gpu " + fmt(gpu_step_ms) + ", host " +
                   fmt(step_ms - gpu_step_ms));
    }
}

std::string kernels_json(const std::vector<kernel_time>& ks, double& total) {
    std::string out = "[";
    total = 0;
    for (std::size_t i = 0; i < ks.size(); ++i) {
        total += ks[i].ms;
        out += std::string(i ? ", " : "") + "{\"name\": " + json_str(ks[i].name) +
               ", \"ms\": " + fmt(ks[i].ms) +
               ", \"dispatches\": " + std::to_string(ks[i].dispatches) + "}";
    }
    return out + "]";
}

// One step on a timestamped runner; prints its per-pipeline GPU times, largest first.
void breakdown(bench& b, runner& r, const step& st, const std::string& test) {
    std::vector<float> out(std::size_t(r.options().rows_max) * b.n_vocab);
    auto res = r.run_step(st, out.data());
    if (!res) {
        std::fprintf(stderr, "ordo-bench: %s: %s\n", test.c_str(), res.err().message.c_str());
        return;
    }
    auto ks = r.last_timings();
    std::sort(ks.begin(), ks.end(), [](auto& x, auto& y) { return x.ms > y.ms; });
    double total = 0;
    std::string js = kernels_json(ks, total);
    std::string human = test + "  gpu " + fmt(total) + " ms:";
    for (const auto& k : ks) human += "  " + k.name + " " + fmt(k.ms);
    b.emit("\"test\": \"" + test + "\", \"n_tokens\": " + std::to_string(res->n_tokens) +
               ", \"gpu_ms\": " + fmt(total) + ", \"kernels\": " + js,
           human);
}

step one_seq_step(std::uint64_t id, step_phase phase, std::vector<std::int32_t> tokens,
                  std::uint32_t pos0) {
    return seqs_step(id, phase, {std::move(tokens)}, pos0, 0);
}

void where_the_time_goes(bench& b, const model::gguf_file& file, runner_options ro) {
    ro.timestamps = true;
    auto r = runner::create(file, ro);
    if (!r) {
        std::fprintf(stderr, "ordo-bench: timestamped runner: %s\n", r.err().message.c_str());
        return;
    }
    std::uint32_t hist = decode_prompt + b.o.gen / 2;
    std::vector<float> sink(std::size_t(ro.rows_max) * b.n_vocab);
    for (std::uint32_t p = 0; p < hist; p += ro.max_batch_tokens) {
        std::uint32_t n = std::min(ro.max_batch_tokens, hist - p);
        (void)(*r)->run_step(
            one_seq_step(1, step_phase::prefill, random_tokens(n, b.n_vocab, 5), p), sink.data());
    }
    breakdown(b, **r, one_seq_step(2, step_phase::decode, {1}, hist), "kernels_decode");
    // The largest --parallel: P sequences with decode_prompt tokens each, then one decode step
    // of all P (issue 29's batched decode, kernels_decode_x<P>).
    std::uint32_t pmax = 1;
    for (auto p : b.o.parallel) pmax = std::max(pmax, p);
    if (pmax > 1) {
        std::vector<std::vector<std::int32_t>> prompts, next;
        for (std::uint32_t i = 0; i < pmax; ++i) {
            prompts.push_back(random_tokens(decode_prompt, b.n_vocab, 20 + i));
            next.push_back({1});
        }
        auto pre = (*r)->run_step(seqs_step(4, step_phase::prefill, prompts, 0, b.seq_blocks),
                                  sink.data());
        if (pre) {
            breakdown(b, **r, seqs_step(5, step_phase::decode, next, decode_prompt, b.seq_blocks),
                      "kernels_decode_x" + std::to_string(pmax));
        } else {
            std::fprintf(stderr, "ordo-bench: batched prefill: %s\n", pre.err().message.c_str());
        }
    }
    std::uint32_t n = b.o.prompts.empty() ? 128 : b.o.prompts[0];
    breakdown(b, **r, one_seq_step(3, step_phase::prefill, random_tokens(n, b.n_vocab, 9), 0),
              "kernels_prefill" + std::to_string(n));
}

}  // namespace

int main(int argc, char** argv) {
    bench_options o = parse(argc, argv);
    auto file = model::gguf_file::open(o.model);
    if (!file) {
        std::fprintf(stderr, "ordo-bench: %s\n", file.err().message.c_str());
        return 1;
    }
    auto hp = model::read_llama_hparams(*file);
    if (!hp) {
        std::fprintf(stderr, "ordo-bench: %s\n", hp.err().message.c_str());
        return 1;
    }
    gpu_actor_options ao;
    ao.model_path = o.model;
    ao.runner = runner_for(o, hp->n_ctx);
    auto t0 = std::chrono::steady_clock::now();
    auto s = gpu_session::start(ao, 3'600'000);
    if (!s) {
        std::fprintf(stderr, "ordo-bench: %s\n", s.err().message.c_str());
        return 1;
    }
    std::fprintf(stderr, "ordo-bench: %s on %s, load %.2fs\n", o.label.c_str(),
                 (*s)->ready().device.c_str(), seconds_since(t0));
    bench b{o,  **s, hp->n_vocab, (decode_prompt + o.gen + 1 + block_tokens - 1) / block_tokens,
            "", 0,   {}};
    b.common =
        "\"engine\": \"ordo\", \"backend\": \"vulkan\", \"model\": " + json_str(o.label) +
        ", \"device\": " + json_str((*s)->ready().device) +
        ", \"flush_every_layers\": " + std::to_string((*s)->ready().info.flush_every_layers) +
        ", \"first_segment_layers\": " + std::to_string((*s)->ready().info.first_segment_layers) +
        ", \"kernel_family\": " + json_str(o.kernels) +
        ", \"row_summaries\": " + ((*s)->ready().info.row_summaries ? "true" : "false") +
        ", \"attention_flash\": " + (o.attention_flash ? "true" : "false") +
        ", \"logits_in_place\": " + ((*s)->ready().info.logits_in_place ? "true" : "false") +
        ", \"replay\": " + (o.replay ? "true" : "false") +
        ", \"qkv_rope\": " + (o.qkv_rope ? "true" : "false") +
        ", \"mmv_shapes\": " + json_str(o.mmv_shapes) +
        ", \"mm_layouts\": " + json_str(o.mm_layouts) +
        ", \"batch_invariant\": " + ((*s)->ready().info.batch_invariant ? "true" : "false");
    measure(b);
    status st = (*s)->stop();
    if (!st) std::fprintf(stderr, "ordo-bench: stop: %s\n", st.err().message.c_str());
    where_the_time_goes(b, *file, ao.runner);
    return 0;
}
