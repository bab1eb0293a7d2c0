// ordo-bench-kv-copy: how long moving KV-cache blocks between the device pool and host memory
// takes through the runner (read_kv_blocks / write_kv_blocks: one submission per run of
// kv_copy_blocks_max blocks), on the small and medium model shapes of bench/README.md (f16 KV,
// 16-token blocks), on the current Vulkan device. Prints one JSON line per shape; checks that
// the bytes read back are the bytes written (exit 1 otherwise). A measurement, not a test.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "gpu/runner/runner.hpp"
#include "model/gguf.hpp"
#include "model/synth.hpp"

namespace {

using namespace ordo;

constexpr std::uint32_t copy_blocks = 64;
constexpr int reps = 5;  // the best of these is printed

struct shape {
    const char* name;
    std::uint32_t n_embd, n_layer, n_head, n_ff;
};

double best_ms(const std::function<bool()>& fn, bool& ok) {
    double best = 1e300;
    for (int i = 0; i < reps; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        ok = fn() && ok;
        best = std::min(
            best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                      .count());
    }
    return best;
}

bool time_shape(const shape& sh, const std::string& dir) {
    model::synth_options o;
    o.n_embd = sh.n_embd, o.n_layer = sh.n_layer, o.n_head = sh.n_head, o.n_head_kv = sh.n_head;
    o.n_ff = sh.n_ff, o.n_vocab = 512, o.n_ctx = 2048, o.type = model::ggml_type::f16;
    o.seed = 3;
    std::string path = dir + "/kv_copy_" + sh.name + ".gguf";
    auto f = model::write_synth_model(o, path).ok() ? model::gguf_file::open(path)
                                                    : result<model::gguf_file>(error{"io", path});
    if (!f) {
        std::fprintf(stderr, "%s: %s\n", path.c_str(), f.err().message.c_str());
        return false;
    }
    gpu::runner_options ro;
    ro.kv_block_tokens = 16;
    ro.kv_blocks = 2 * copy_blocks;
    ro.max_batch_tokens = 64;
    ro.rows_max = 8;
    ro.seqs_max = 8;
    ro.watchdog_ms = 120'000;
    auto r = gpu::runner::create(*f, ro);
    if (!r) {
        std::fprintf(stderr, "runner: %s\n", r.err().message.c_str());
        return false;
    }
    gpu::runner& run = **r;
    std::vector<std::uint32_t> ids;
    for (std::uint32_t b = 0; b < copy_blocks; ++b) ids.push_back(copy_blocks + b);
    std::vector<std::uint8_t> in(copy_blocks * run.kv_block_bytes()), out(in.size());
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<std::uint8_t>(i * 131 + 7);
    bool ok = true;
    double in_ms = best_ms([&] { return run.write_kv_blocks(ids, in).ok(); }, ok);
    double out_ms = best_ms([&] { return run.read_kv_blocks(ids, out).ok(); }, ok);
    ok = ok && out == in;
    std::printf(
        "{\"bench\": \"kv_copy\", \"shape\": \"%s\", \"device\": \"%s\", \"blocks\": %u, "
        "\"block_bytes\": %llu, \"out_ms\": %.3f, \"in_ms\": %.3f, \"ok\": %s}\n",
        sh.name, run.info().name.c_str(), copy_blocks,
        static_cast<unsigned long long>(run.kv_block_bytes()), out_ms, in_ms,
        ok ? "true" : "false");
    std::filesystem::remove(path);
    return ok;
}

}  // namespace

int main() {
    std::string dir = std::filesystem::temp_directory_path().string();
    bool ok = time_shape({"small", 288, 6, 6, 768}, dir);
    ok = time_shape({"medium", 768, 12, 12, 2048}, dir) && ok;
    return ok ? 0 : 1;
}
