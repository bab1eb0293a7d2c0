// test_start.cpp: what the real ordo-server binary refuses at start, and that what its config
// check accepts it then runs.
//
// Checks: a model that can never run (the file absent, not a GGUF, blk.0.ffn_up.weight missing,
// blk.0.attn_k.weight mis-shaped, one IQ2_XXS ffn_down: a weight type ordo does not run,
// model.context_tokens above the model's context) stops ordo-server at start with exit 2 and one
// error line naming the file exactly once and, for a tensor, the tensor and what was expected;
// the same model copied with nothing changed serves, so the copying is not what the others trip
// on, and so do the models the Vulkan kernels once refused (all Q4_K, one Q6_K ffn_down): every
// type the loader accepts now has kernels, so the gpu's own refusal (gpu::check_weight_types)
// cannot be reached from a file (tests/gpu/test_runner.cpp checks it directly). Then the edges
// of the config check run healthy
// (never "degraded"): scheduler.max_batch_tokens = 65535 (65536 is refused by --check-config),
// and a model with a 2-float KV row under a 1 GiB KV budget, whose pool the runner caps at the
// 2^24 tokens the scheduler's block table takes. Last, the device's choices
// (scheduler.max_sequences = 0, gpu.kv_memory_bytes = 0, the defaults): on lavapipe, a CPU
// device, the server logs 16 sequences and a pool of every sequence's context (at least 1 MiB,
// at most 256 MiB; on a GPU 64 sequences, the pool as much of it as the device holds) and runs
// with them (the `model` op's max_sequences and kv_device_bytes); an
// explicit max_batch_tokens under that holds the choice to it; keys the file sets are run as
// set, with no choice logged. And the running server's threads carry names (top -H, perf): each
// actor's loop "ordo-<actor>", the pool thread that ran the gpu's warm-up "ordo-gpu-job".
//
// How: models are made with `ordo-model mk` and rewritten through gguf_file and gguf_writer
// with one tensor dropped or reshaped; the server listens on an ephemeral port on lavapipe;
// health is asked over TCP until it says ok.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "model/gguf.hpp"
#include "model/gguf_writer.hpp"
#include "model/quant.hpp"
#include "tests/support/scratch_dir.hpp"
#include "tests/support/server_process.hpp"

namespace {

using namespace ordo::test;
namespace fs = std::filesystem;

std::string temp_path(const std::string& name) {
    const fs::path& dir = ordo::test::scratch_dir("ordo_start_test");
    return (dir / name).string();
}

std::string write_text(const std::string& name, const std::string& text) {
    std::string p = temp_path(name);
    std::ofstream(p) << text;
    return p;
}

// Runs `ordo-model mk ARGS --out NAME` once per name; returns the model's path.
std::string make_model(const std::string& name, const std::string& args,
                       const std::string& type = "f32") {
    std::string p = temp_path(name);
    if (!fs::exists(p)) {
        std::string mk = std::string(ORDO_MODEL_BIN) + " mk --out " + p + " " + args +
                         " --n-vocab 260 --type " + type + " --seed 1 --ctx 128 > /dev/null";
        EXPECT_EQ(std::system(mk.c_str()), 0) << mk;
    }
    return p;
}

// n_embd 32, one layer, 2 heads of 16, n_ff 64: attn_k is [32, 32], ffn_up [32, 64].
const std::string& tiny_model() {
    static const std::string p =
        make_model("tiny.gguf", "--n-embd 32 --n-layer 1 --n-head 2 --n-head-kv 2 --n-ff 64");
    return p;
}

// How copy_model changes the file: one tensor left out, or one written with another shape of
// the same element count.
struct model_edit {
    std::string drop;
    std::string reshape;
    std::vector<uint64_t> ne;
    std::string retype;  // re-encoded (from F32) as `type` (zero blocks for an IQ type)
    ordo::model::ggml_type type = ordo::model::ggml_type::f32;
};

// Copies the GGUF at `src` to a new file `name` (metadata and tensors in order) with `e` applied.
std::string copy_model(const std::string& src, const std::string& name, const model_edit& e) {
    std::string dst = temp_path(name);
    auto f = ordo::model::gguf_file::open(src);
    EXPECT_TRUE(f.ok()) << f.err().message;
    if (!f.ok()) return dst;
    ordo::model::gguf_writer w;
    for (const auto& kv : f->metadata()) {
        if (kv.key == "general.alignment") {
            w.set_alignment(static_cast<uint32_t>(f->alignment()));
        } else {
            w.set(kv.key, kv.value);
        }
    }
    for (const auto& t : f->tensors()) {
        if (t.name == e.drop) continue;
        std::vector<uint64_t> ne(t.ne.begin(), t.ne.begin() + t.n_dims);
        if (t.name == e.reshape) ne = e.ne;
        if (t.name == e.retype) {
            EXPECT_EQ(t.type, ordo::model::ggml_type::f32) << t.name;
            std::vector<float> values(t.n_elements);
            std::memcpy(values.data(), t.data.data(), t.n_bytes);
            // A type ordo has no quantizer for (IQ*) gets zero blocks: only its type matters.
            std::vector<uint8_t> bytes(*ordo::model::bytes_for(e.type, t.n_elements));
            EXPECT_TRUE(
                !ordo::model::is_supported(e.type) ||
                ordo::model::quantize_row(e.type, values.data(), bytes.data(), values.size()).ok());
            auto st = w.add_tensor(t.name, e.type, ne, bytes);
            EXPECT_TRUE(st.ok()) << t.name << ": " << st.err().message;
            continue;
        }
        auto st = w.add_tensor(t.name, t.type, ne, t.data);
        EXPECT_TRUE(st.ok()) << t.name << ": " << st.err().message;
    }
    auto st = w.write_file(dst);
    EXPECT_TRUE(st.ok()) << st.err().message;
    return dst;
}

size_t count(const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) n++;
    return n;
}

// Starts ordo-server with `args` and expects it to exit 2 before listening, with one error
// line that names `model_path` once and contains every fragment.
void expect_refused_at_start(const std::vector<std::string>& args, const std::string& model_path,
                             const std::vector<std::string>& fragments) {
    server_process server;
    EXPECT_FALSE(server.start(ORDO_SERVER_BIN, args));
    EXPECT_EQ(server.exit_status(), 2);
    const std::string out = server.output();
    EXPECT_EQ(count(out, "[error]"), 1u) << out;
    EXPECT_EQ(count(out, model_path), 1u) << "the path must be named exactly once:\n" << out;
    for (const auto& f : fragments) EXPECT_NE(out.find(f), std::string::npos) << f << "\n" << out;
}

// Asks health until it says ok; fails on degraded or after device_ready_deadline.
void expect_healthy(uint16_t port) {
    ASSERT_EQ(wait_healthy(port), "");
}

}  // namespace

TEST(start_refuses_a_model_that_cannot_run, missing_tensor_exits_2_naming_file_and_tensor) {
    const std::string p =
        copy_model(tiny_model(), "no_ffn_up.gguf", {"blk.0.ffn_up.weight", "", {}, "", {}});
    expect_refused_at_start({"--model", p}, p,
                            {"llama_missing_tensor: " + p +
                             ": tensor 'blk.0.ffn_up.weight' is missing; expected a [32, 64] "
                             "tensor of f32, f16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, "
                             "q4_k, q5_k, q6_k or bf16"});
}

TEST(start_refuses_a_model_that_cannot_run, mis_shaped_tensor_exits_2_with_expected_shape) {
    const std::string p = copy_model(tiny_model(), "attn_k_64x16.gguf",
                                     {"", "blk.0.attn_k.weight", {64, 16}, "", {}});
    expect_refused_at_start({"--model", p}, p,
                            {"llama_bad_shape: " + p +
                             ": tensor 'blk.0.attn_k.weight' has shape [64, 16], expected "
                             "[32, 32]"});
}

// A type the GGUF reader knows but ordo does not compute with (IQ2_XXS) stops the server at
// start naming the tensor and its type.
TEST(start_refuses_a_model_that_cannot_run, weight_type_ordo_does_not_run_exits_2) {
    const std::string wide =
        make_model("wide_f32.gguf", "--n-embd 256 --n-layer 1 --n-head 4 --n-ff 256", "f32");
    const std::string iq =
        copy_model(wide, "ffn_down_iq2_xxs.gguf",
                   {"", "", {}, "blk.0.ffn_down.weight", ordo::model::ggml_type::iq2_xxs});
    expect_refused_at_start({"--model", iq}, iq,
                            {"llama_unsupported_type: " + iq +
                             ": tensor 'blk.0.ffn_down.weight' has type iq2_xxs, which ordo does "
                             "not run; expected f32, f16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, "
                             "q3_k, q4_k, q5_k, q6_k or bf16"});
}

// The models the Vulkan kernels refused before they ran the K types serve now.
TEST(what_the_config_check_accepts_runs, k_quant_models_serve) {
    const std::string q4k =
        make_model("q4_k.gguf", "--n-embd 256 --n-layer 1 --n-head 4 --n-ff 256", "q4_k");
    const std::string wide =
        make_model("wide_f32.gguf", "--n-embd 256 --n-layer 1 --n-head 4 --n-ff 256", "f32");
    const std::string mixed =
        copy_model(wide, "ffn_down_q6_k.gguf",
                   {"", "", {}, "blk.0.ffn_down.weight", ordo::model::ggml_type::q6_k});
    for (const std::string& p : {q4k, mixed}) {
        server_process server;
        ASSERT_TRUE(server.start(ORDO_SERVER_BIN, {"--model", p})) << server.output();
        expect_healthy(server.port());
        EXPECT_EQ(server.stop(), 0) << server.output();
    }
}

TEST(start_refuses_a_model_that_cannot_run, absent_or_malformed_file_exits_2) {
    const std::string absent = temp_path("absent.gguf");
    expect_refused_at_start({"--model", absent}, absent, {"gguf_io: cannot open " + absent});
    const std::string text = write_text("not_a_model.gguf", std::string(64, 'x'));
    expect_refused_at_start({"--model", text}, text, {"gguf_bad_magic: " + text + ": "});
}

TEST(start_refuses_a_model_that_cannot_run, context_above_the_models_exits_2) {
    const std::string cfg = write_text(
        "ctx.toml", "[model]\ncontext_tokens = 256\n[scheduler]\nmax_tokens_default = 16\n");
    expect_refused_at_start({"--config", cfg, "--model", tiny_model()}, tiny_model(),
                            {"config_invalid: model.context_tokens = 256 exceeds the context "
                             "length 128 of " +
                             tiny_model()});
}

// The control for the cases above: copy_model with no edit gives a file that serves.
TEST(start_refuses_a_model_that_cannot_run, an_unedited_copy_serves) {
    const std::string p = copy_model(tiny_model(), "copy.gguf", {});
    server_process server;
    ASSERT_TRUE(server.start(ORDO_SERVER_BIN, {"--model", p})) << server.output();
    EXPECT_EQ(server.stop(), 0) << server.output();
}

TEST(what_the_config_check_accepts_runs, max_batch_tokens_at_its_bound) {
    server_process check;
    const std::string over = write_text("over.toml", "[scheduler]\nmax_batch_tokens = 65536\n");
    EXPECT_FALSE(check.start(ORDO_SERVER_BIN, {"--check-config", over}));
    EXPECT_EQ(check.exit_status(), 2);
    EXPECT_NE(check.output().find("scheduler.max_batch_tokens = 65536"), std::string::npos);

    const std::string edge = write_text("edge.toml", "[scheduler]\nmax_batch_tokens = 65535\n");
    server_process server;
    ASSERT_TRUE(server.start(ORDO_SERVER_BIN, {"--config", edge, "--model", tiny_model()}))
        << server.output();
    expect_healthy(server.port());
    EXPECT_EQ(server.stop(), 0) << server.output();
}

// kv_dim 2 (n_embd 4, 2 heads of 2, one KV head): 1 GiB and one 128 MiB storage binding each
// hold 2^22 blocks of 8 tokens, twice what the scheduler takes; the runner stops at 2^21.
TEST(what_the_config_check_accepts_runs, kv_pool_sized_from_memory_fits_the_scheduler) {
    const std::string narrow =
        make_model("narrow.gguf", "--n-embd 4 --n-layer 1 --n-head 2 --n-head-kv 1 --n-ff 8");
    const std::string cfg =
        write_text("big_kv.toml", "[gpu]\nkv_memory_bytes = 1073741824\nkv_block_tokens = 8\n");
    server_process server;
    ASSERT_TRUE(server.start(ORDO_SERVER_BIN, {"--config", cfg, "--model", narrow}))
        << server.output();
    expect_healthy(server.port());
    EXPECT_EQ(server.stop(), 0) << server.output();
    EXPECT_NE(server.output().find("2097152 kv blocks of 8 tokens"), std::string::npos)
        << server.output();
}

// The `model` op's answer from the server on `port`.
// What a server started with `config_text` (none: no --config) on the tiny model runs with: the
// `model` op's answer, and its log once stopped cleanly.
struct served {
    event model;
    std::string log;
};

static served serve_and_ask_model(const std::string& name, const std::string& config_text) {
    std::vector<std::string> args = {"--model", tiny_model()};
    if (!config_text.empty()) args.insert(args.end(), {"--config", write_text(name, config_text)});
    server_process server;
    served out;
    EXPECT_TRUE(server.start(ORDO_SERVER_BIN, args)) << server.output();
    if (server.port() == 0) return out;
    EXPECT_EQ(wait_healthy(server.port()), "");
    tcp_client c;
    EXPECT_TRUE(c.connect(server.port()));
    EXPECT_TRUE(c.send(frame("id", uint64_t{1}, "op", "model")));
    auto evs = until_terminal(c, 1);
    if (!evs.empty()) out.model = evs.back();
    EXPECT_EQ(out.model.str("event"), "done") << (evs.empty() ? "no answer" : out.model.outcome());
    EXPECT_EQ(server.stop(), 0) << server.output();
    out.log = server.output();
    return out;
}

TEST(the_devices_choice, is_logged_and_run_with) {
    const served s = serve_and_ask_model("", "");
    ASSERT_TRUE(s.model.h) << s.log;
    const event& m = s.model;
    const msgpack::object* dev = field(m.o(), "gpu");
    ASSERT_NE(dev, nullptr);
    const bool cpu_device = str_field(*dev, "kind") == "cpu";  // lavapipe (CI)
    EXPECT_EQ(m.u("max_sequences"), cpu_device ? 16u : 64u);
    EXPECT_EQ(m.u("max_batch_tokens"), 512u);
    // The tiny model's block: 1 layer x K and V x 32 floats x 16 tokens in f16. The pool is
    // every sequence's context: on a GPU 64 x 128 positions, 1 MiB; on a CPU device 16 x 128
    // positions, 256 KiB, held to the least pool (1 MiB).
    const uint64_t block_bytes = 1 * 2 * 32 * 16 * 2;
    EXPECT_EQ(m.u("kv_device_bytes"),
              cpu_device ? (uint64_t{1} << 20) / block_bytes * block_bytes : 64 * 8 * block_bytes);
    EXPECT_NE(s.log.find("the device's choice for " + m.str("device")), std::string::npos) << s.log;
    const std::string line =
        cpu_device ? ": scheduler.max_sequences = 16 (a CPU device); gpu.kv_memory_bytes = "
                     "1048576 (a CPU device: 16 sequences x 128 positions need 256 KiB)"
                   : ": scheduler.max_sequences = 64 (a GPU); gpu.kv_memory_bytes = 1048576 (a "
                     "GPU: 64 sequences x 128 positions need 1 MiB, which the device holds)";
    EXPECT_NE(s.log.find(line), std::string::npos) << s.log;
}

TEST(the_devices_choice, is_held_to_an_explicit_max_batch_tokens) {
    const served s = serve_and_ask_model("small_step.toml", "[scheduler]\nmax_batch_tokens = 8\n");
    ASSERT_TRUE(s.model.h) << s.log;
    EXPECT_EQ(s.model.u("max_sequences"), 8u);
    EXPECT_EQ(s.model.u("max_batch_tokens"), 8u);
    EXPECT_NE(s.log.find("scheduler.max_sequences = 8 ("), std::string::npos) << s.log;
    EXPECT_NE(s.log.find("; at most scheduler.max_batch_tokens)"), std::string::npos) << s.log;
}

TEST(the_devices_choice, keys_the_config_sets_are_run_as_set) {
    const served s = serve_and_ask_model(
        "set.toml", "[scheduler]\nmax_sequences = 3\n[gpu]\nkv_memory_bytes = 1048576\n");
    ASSERT_TRUE(s.model.h) << s.log;
    EXPECT_EQ(s.model.u("max_sequences"), 3u);
    EXPECT_EQ(s.model.u("kv_device_bytes"), uint64_t{1} << 20);
    EXPECT_EQ(s.log.find("the device's choice"), std::string::npos) << s.log;
}

// The names of the threads of process `pid` (Linux: /proc/PID/task/TID/comm).
static std::multiset<std::string> thread_names(int pid) {
    std::multiset<std::string> names;
    for (const auto& t : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task")) {
        std::string name;
        std::ifstream comm(t.path() / "comm");
        std::getline(comm, name);
        names.insert(name);
    }
    return names;
}

TEST(a_running_server, names_its_threads_after_its_actors) {
    server_process server;
    ASSERT_TRUE(server.start(ORDO_SERVER_BIN, {"--model", tiny_model()})) << server.output();
    expect_healthy(server.port());  // healthy: the gpu's warm-up has run as a pool job
    const std::multiset<std::string> names = thread_names(server.pid());
    for (const char* want :
         {"ordo-scheduler", "ordo-gpu", "ordo-net", "ordo-http", "ordo-gpu-job"}) {
        EXPECT_GE(names.count(want), 1u) << want << " in " << ::testing::PrintToString(names);
    }
    EXPECT_EQ(names.count("ordo-scheduler"), 1u) << ::testing::PrintToString(names);
    EXPECT_EQ(server.stop(), 0) << server.output();
}
