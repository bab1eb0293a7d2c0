// test_runner_support.hpp: shared helpers of the runner and gpu actor tests: where the shared
// models are, small synthetic models written once per test binary into a temp dir, the CPU
// reference's logits for a token sequence, step builders and closeness checks.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "gpu/gpu_msgs.hpp"
#include "gpu/runner/runner.hpp"
#include "model/gguf.hpp"
#include "model/reference.hpp"
#include "model/synth.hpp"
#include "tests/support/golden_json.hpp"
#include "tests/support/scratch_dir.hpp"
#include "tests/support/shared_models.hpp"

namespace ordo::gpu::testing {

inline const std::string k_models = ORDO_SHARED_MODELS_DIR;

inline bool have_stories() {
    return std::filesystem::exists(k_models + "/stories260K.gguf");
}

#define ORDO_REQUIRE_STORIES() \
    ORDO_REQUIRE_SHARED(::ordo::gpu::testing::k_models + "/stories260K.gguf")

inline std::string temp_dir() {
    return ::ordo::test::scratch_dir("ordo_runner_test").string();
}

// Small GQA model: n_embd 64, 2 layers, 4 heads over 2 kv heads, ff 96, vocab 300, ctx 256.
// Written once per (type, layers) per process; the same seed for every type, so the types are
// the same model quantized differently.
// The K types need rows of whole 256-element super-blocks: for them (and for any type when
// `wide`) the model is n_embd 256, ff 512, 4 heads of 64 over 2 kv heads, the rest alike.
inline std::string synth_model(model::ggml_type type, std::uint32_t n_layer = 2,
                               bool wide = false) {
    wide = wide || model::block_size(type) > 32;
    static std::map<std::tuple<int, std::uint32_t, bool>, std::string> made;
    auto key = std::make_tuple(static_cast<int>(type), n_layer, wide);
    if (auto it = made.find(key); it != made.end()) return it->second;
    model::synth_options o;
    o.n_embd = wide ? 256 : 64;
    o.n_layer = n_layer;
    o.n_head = 4;
    o.n_head_kv = 2;
    o.n_ff = wide ? 512 : 96;
    o.n_vocab = 300;
    o.n_ctx = 256;
    o.type = type;
    o.seed = 7;
    std::string path = temp_dir() + "/synth_" + std::string(model::type_name(type)) + "_" +
                       std::to_string(n_layer) + (wide ? "_wide" : "") + ".gguf";
    status s = model::write_synth_model(o, path);
    EXPECT_TRUE(s.ok()) << s.err().message;
    made[key] = path;
    return path;
}

inline std::unique_ptr<model::gguf_file> open_model(const std::string& path) {
    auto f = model::gguf_file::open(path);
    EXPECT_TRUE(f.ok()) << path << ": " << (f.ok() ? "" : f.err().message);
    if (!f) return nullptr;
    return std::make_unique<model::gguf_file>(std::move(*f));
}

// The reference's logits after each token of `tokens` (fed from position 0).
inline std::vector<std::vector<float>> reference_logits(const model::gguf_file& file,
                                                        const std::vector<std::int32_t>& tokens) {
    auto ref = model::reference_model::create(file, static_cast<std::uint32_t>(tokens.size()));
    EXPECT_TRUE(ref.ok()) << (ref.ok() ? "" : ref.err().message);
    std::vector<std::vector<float>> out;
    if (!ref) return out;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        auto l = ref->forward(static_cast<std::uint32_t>(tokens[i]), static_cast<std::uint32_t>(i));
        EXPECT_TRUE(l.ok());
        if (!l) return out;
        out.emplace_back(l->begin(), l->end());
    }
    return out;
}

inline std::vector<std::int32_t> test_tokens(std::size_t n, std::uint32_t n_vocab,
                                             std::uint32_t seed) {
    std::vector<std::int32_t> t(n);
    std::uint32_t x = seed * 2654435761u + 1;
    for (auto& v : t) {
        x = x * 1664525u + 1013904223u;
        v = static_cast<std::int32_t>((x >> 8) % n_vocab);
    }
    return t;
}

inline step_seq make_seq(std::uint64_t id, std::vector<std::int32_t> tokens, std::uint32_t pos0,
                         std::vector<std::uint32_t> table, bool want = true) {
    step_seq q;
    q.seq_id = id;
    q.tokens = std::move(tokens);
    q.pos0 = pos0;
    q.block_table = std::move(table);
    q.logits_rows = want ? 1 : 0;
    return q;
}

inline step make_step(std::uint64_t id, step_phase phase, std::vector<step_seq> seqs) {
    step s;
    s.step_id = id;
    s.phase = phase;
    s.seqs = std::move(seqs);
    return s;
}

// Blocks first, first + 1, ... covering n positions.
inline std::vector<std::uint32_t> blocks_from(std::uint32_t first, std::uint32_t n_positions,
                                              std::uint32_t block_tokens) {
    std::vector<std::uint32_t> t((n_positions + block_tokens - 1) / block_tokens);
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = first + static_cast<std::uint32_t>(i);
    return t;
}

inline double max_abs_diff(const float* a, const std::vector<float>& b) {
    double m = 0.0;
    for (std::size_t i = 0; i < b.size(); ++i) {
        double d = std::fabs(double(a[i]) - b[i]);
        if (!(d <= m)) m = std::isnan(d) ? INFINITY : d;
    }
    return m;
}

inline std::size_t argmax(const float* v, std::size_t n) {
    std::size_t best = 0;
    for (std::size_t i = 1; i < n; ++i) {
        if (v[i] > v[best]) best = i;
    }
    return best;
}

inline std::string read_text(const std::string& path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// Options for tests: a small pool, f32 KV unless asked, a watchdog long enough for a loaded
// 2-core machine.
inline runner_options test_options(bool kv_f16 = false, std::uint32_t flush = 4) {
    runner_options o;
    o.flush_every_layers = flush;
    o.watchdog_ms = 120'000;
    o.kv_block_tokens = 8;
    o.kv_blocks = 64;
    o.kv_f16 = kv_f16;
    o.max_batch_tokens = 64;
    o.rows_max = 8;
    o.seqs_max = 8;
    return o;
}

// A runner on `f`, or nullptr (a test failure naming the error).
inline std::unique_ptr<runner> make_runner(const model::gguf_file& f, const runner_options& o) {
    auto r = runner::create(f, o);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.err().code + ": " + r.err().message);
    return r.ok() ? std::move(*r) : nullptr;
}

// Runs `tokens` of one sequence as a prefill chunk of `chunk` tokens then single decodes, and
// returns the logits after every token from the chunk's last one on.
inline std::vector<std::vector<float>> run_sequence(runner& r,
                                                    const std::vector<std::int32_t>& tokens,
                                                    std::uint32_t chunk,
                                                    std::uint32_t first_block) {
    std::uint32_t bt = r.limits().block_tokens, nv = r.hparams().n_vocab;
    auto table = blocks_from(first_block, static_cast<std::uint32_t>(tokens.size()), bt);
    std::vector<std::vector<float>> out;
    std::vector<float> row(nv);
    std::uint32_t pos = 0;
    std::uint64_t id = 1;
    while (pos < tokens.size()) {
        std::uint32_t n = pos == 0 ? chunk : 1;
        std::vector<std::int32_t> part(tokens.begin() + pos, tokens.begin() + pos + n);
        step s = make_step(id++, pos == 0 ? step_phase::prefill : step_phase::decode,
                           {make_seq(9, part, pos, table)});
        auto res = r.run_step(s, row.data());
        EXPECT_TRUE(res.ok()) << (res.ok() ? "" : res.err().message);
        if (!res) return out;
        EXPECT_EQ(res->rows, std::vector<std::uint64_t>{9});
        out.push_back(row);
        pos += n;
    }
    return out;
}

}  // namespace ordo::gpu::testing
