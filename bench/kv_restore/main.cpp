// ordo-bench-kv-restore: `ordo-bench-kv-restore [--sizes 512,2048] [--reps 3] [--model PATH]
// [--server BIN] [--batch-tokens 512] [--keep]`.
//
// How much faster a prompt prefix comes back from a persisted KV file than it is recomputed,
// measured the way a user sees it: the real ordo-server over TCP, restarted on the same
// --kv-dir. One process, single-threaded; it owns a temp dir (model, config, kv dir) that it
// deletes at the end unless --keep.
//
//   1. Writes the medium model of bench/README.md (~110M parameters, F16; the recipe of
//      `ordo-model mk`), unless --model names a file.
//   2. Server A on a fresh kv dir. Per size N and repetition: `generate` with N+1 random ids
//      (fixed seeds, distinct per size and repetition, so nothing hits the prefix cache),
//      max_tokens 1, temperature 0. Client wall time send -> done = recompute_ms; the server's
//      usage.prefill_ms is kept too. It must report cached_tokens 0. Then it waits until the
//      kv actor has written every prompt's file (stats kv_disk.saves) and SIGTERMs the server.
//   3. The kv files: size on disk per prompt (bytes_per_token = file bytes / tokens in it),
//      and how long this process takes to read and verify one (read_kv_blocks, page cache
//      warm: the file was just written): file_read_ms.
//   4. Server B on the same dir, after its startup scan has indexed the files. The same
//      requests: wall time = restore_ms; cached_tokens must be N rounded down to full blocks
//      (exit 1 otherwise); the kv actor's own time from stats kv_disk.restore_ms =
//      restore_kv_ms (read + verify + copy into the pool). Each is sent a second time on the
//      same server: the in-memory prefix cache hit, memory_hit_ms.
//
// Every number is the median of --reps. Each server first serves one short warm-up request.
// Prints one JSON object (device from the `model` op). Exit 0 ok, 1 a check failed or the
// server misbehaved, 2 bad command line. A measurement, not a test: not run by CTest.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "bench/ordo_load/load_stream.hpp"
#include "bench/ordo_load/server_spawn.hpp"
#include "kv/kv_file.hpp"
#include "model/synth.hpp"
#include "tools/client/connection.hpp"

namespace {

using namespace ordo;
using client::connection;
using client::find;
using client::get_str;
using std::chrono::milliseconds;
using clock_type = std::chrono::steady_clock;
namespace fs = std::filesystem;

#ifdef ORDO_SERVER_BIN
constexpr const char* server_bin_default = ORDO_SERVER_BIN;
#else
constexpr const char* server_bin_default = "";
#endif

constexpr uint32_t block_tokens = 16;  // gpu.kv_block_tokens of the config written
constexpr uint32_t sizes_max = 8;      // entries of --sizes
constexpr uint32_t size_tokens_max = 65536;
constexpr uint32_t reps_max = 100;
constexpr uint32_t warmup_tokens = block_tokens / 2;  // no full block: leaves no file
constexpr uint64_t warmup_seed = 1'000'000;           // apart from every prompt seed
// Enough pool for every prompt of a run to stay in the memory cache until its memory hit.
constexpr uint64_t kv_memory_bytes = uint64_t{1} << 29;
constexpr uint64_t kv_bytes_budget = uint64_t{1} << 36;  // nothing is evicted during a run
constexpr uint64_t watchdog_ms = 120'000;  // one prefill chunk on a loaded 2-core lavapipe
constexpr milliseconds startup_deadline{300'000};
constexpr milliseconds request_deadline{900'000};  // one 2048-token prefill on lavapipe: ~20 s
constexpr milliseconds query_deadline{30'000};
constexpr milliseconds saves_deadline{300'000};
constexpr milliseconds poll_interval{100};
constexpr uint32_t events_max = 16;  // events read for one answer before giving up

struct options {
    std::vector<uint32_t> sizes{512, 2048};
    uint32_t reps = 3;
    uint32_t batch_tokens = 512;  // scheduler.max_batch_tokens (the server's default)
    std::string model, server = server_bin_default;
    bool keep = false;
};

// One size's samples, one per repetition.
struct size_samples {
    uint32_t tokens = 0;         // N: the prompt is N + 1 ids
    uint32_t cached_tokens = 0;  // N rounded down to full blocks
    std::vector<double> recompute_ms, recompute_prefill_ms, restore_ms, restore_kv_ms,
        memory_hit_ms, file_read_ms;
    std::vector<uint64_t> file_bytes;
    std::vector<uint64_t> token;  // the greedy token of each recompute: restores must match it
};

[[noreturn]] void usage(const std::string& why) {
    std::fprintf(stderr,
                 "ordo-bench-kv-restore: %s\nusage: ordo-bench-kv-restore [--sizes 512,2048] "
                 "[--reps 3] [--model PATH] [--server BIN] [--batch-tokens 512] [--keep]\n",
                 why.c_str());
    std::exit(2);
}

std::string g_dir;  // the run's temp dir, named when a run fails (and then kept)

[[noreturn]] void fail(const std::string& why) {
    std::fprintf(stderr, "ordo-bench-kv-restore: FAILED: %s\n", why.c_str());
    if (!g_dir.empty()) std::fprintf(stderr, "ordo-bench-kv-restore: left %s\n", g_dir.c_str());
    std::exit(1);
}

uint32_t parse_u32(const std::string& s, uint32_t lo, uint32_t hi) {
    char* end = nullptr;
    unsigned long v = std::strtoul(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || v < lo || v > hi) usage("bad number '" + s + "'");
    return static_cast<uint32_t>(v);
}

options parse(int argc, char** argv) {
    options o;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) usage(a + " needs a value");
            return argv[++i];
        };
        if (a == "--sizes") {
            o.sizes.clear();
            std::string list = value();
            for (size_t at = 0; at <= list.size();) {
                size_t comma = std::min(list.find(',', at), list.size());
                o.sizes.push_back(
                    parse_u32(list.substr(at, comma - at), block_tokens, size_tokens_max));
                if (o.sizes.size() > sizes_max) usage("at most 8 --sizes");
                at = comma + 1;
            }
        } else if (a == "--reps") {
            o.reps = parse_u32(value(), 1, reps_max);
        } else if (a == "--batch-tokens") {
            o.batch_tokens = parse_u32(value(), 16, 65535);
        } else if (a == "--model") {
            o.model = value();
        } else if (a == "--server") {
            o.server = value();
        } else if (a == "--keep") {
            o.keep = true;
        } else {
            usage("unknown argument " + a);
        }
    }
    if (o.server.empty()) usage("--server is required (built without ordo-server)");
    // Files are told apart by their full blocks: no two sizes may round to the same count.
    std::vector<uint32_t> blocks;
    for (uint32_t n : o.sizes) blocks.push_back(n / block_tokens);
    std::sort(blocks.begin(), blocks.end());
    if (std::adjacent_find(blocks.begin(), blocks.end()) != blocks.end()) {
        usage("two --sizes have the same number of full 16-token blocks");
    }
    return o;
}

double ms_since(clock_type::time_point t0) {
    return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    size_t m = v.size() / 2;
    return v.size() % 2 == 1 ? v[m] : (v[m - 1] + v[m]) / 2;
}

uint64_t u64_of(const msgpack::object* map, std::string_view key) {
    const msgpack::object* v = map ? find(*map, key) : nullptr;
    return v && v->type == msgpack::type::POSITIVE_INTEGER ? v->via.u64 : 0;
}

bool bool_of(const msgpack::object* map, std::string_view key) {
    const msgpack::object* v = map ? find(*map, key) : nullptr;
    return v && v->type == msgpack::type::BOOLEAN && v->via.boolean;
}

double f64_of(const msgpack::object* map, std::string_view key) {
    const msgpack::object* v = map ? find(*map, key) : nullptr;
    if (v && v->type == msgpack::type::FLOAT64) return v->via.f64;
    return v && v->type == msgpack::type::POSITIVE_INTEGER ? double(v->via.u64) : 0;
}

// ---- the medium model -------------------------------------------------------------------------

// bench/README.md's medium shape: 768 x 12 layers, 12 heads, n_ff 2048, 32000 ids, F16, tied.
std::string make_model(const std::string& dir, uint32_t context_tokens) {
    model::synth_options o;
    o.n_embd = 768, o.n_layer = 12, o.n_head = 12, o.n_head_kv = 12, o.n_ff = 2048;
    o.n_vocab = 32000, o.type = model::ggml_type::f16, o.seed = 1, o.tied = true;
    o.n_ctx = context_tokens;
    std::string path = dir + "/medium.gguf";
    auto t0 = clock_type::now();
    if (auto st = model::write_synth_model(o, path); !st.ok()) {
        fail("writing the model: " + st.err().message);
    }
    std::fprintf(stderr, "ordo-bench-kv-restore: wrote %s (%u ctx) in %.1f s\n", path.c_str(),
                 context_tokens, ms_since(t0) / 1000);
    return path;
}

std::string write_config(const std::string& dir, const options& o) {
    std::string path = dir + "/bench.toml";
    std::ofstream f(path);
    f << "[gpu]\nkv_block_tokens = " << block_tokens << "\nkv_memory_bytes = " << kv_memory_bytes
      << "\nwatchdog_ms = " << watchdog_ms << "\n[scheduler]\nmax_batch_tokens = " << o.batch_tokens
      << "\n[kv]\nbytes_budget = " << kv_bytes_budget
      << "\nflush_ms_max = " << saves_deadline.count() << "\n";
    if (!f.good()) fail("writing " + path);
    return path;
}

// ---- one server and its connection ------------------------------------------------------------

struct generate_result {
    double wall_ms = 0, prefill_ms = 0;
    uint32_t cached_tokens = 0;
    uint64_t token = 0;  // the one generated id
};

class bench_server {
public:
    void start(const options& o, const std::string& model, const std::string& config,
               const std::string& kv_dir) {
        std::vector<std::string> args{"--listen", "127.0.0.1:0", "--http-listen", "",
                                      "--model",  model,         "--config",      config,
                                      "--kv-dir", kv_dir,        "--log-level",   "warn"};
        auto deadline = clock_type::now() + startup_deadline;
        if (auto st = _proc.start(o.server, args, startup_deadline); !st.ok()) {
            fail("starting ordo-server: " + st.err().message);
        }
        load::run_control control;
        control.deadline = deadline;
        const auto& ep = _proc.endpoint();
        if (auto st = load::wait_healthy(ep.host, ep.port, deadline, control); !st.ok()) {
            fail("ordo-server not healthy: " + st.err().message + "\n" + _proc.output_tail());
        }
        if (auto st = _conn.open(ep.host, ep.port, query_deadline); !st.ok()) {
            fail("connect: " + st.err().message);
        }
    }

    // The done event of one request; anything else ends the run.
    msgpack::object_handle ask(msgpack::sbuffer& frame, uint64_t id, milliseconds deadline) {
        if (auto st = _conn.send(frame); !st.ok()) fail("send: " + st.err().message);
        for (uint32_t i = 0; i < events_max; ++i) {
            auto ev = _conn.recv(deadline);
            if (!ev.ok()) fail("no answer: " + ev.err().message + "\n" + _proc.output_tail());
            if (u64_of(&ev->get(), "id") != id) continue;
            if (get_str(ev->get(), "event") != "done") {
                fail("request " + std::to_string(id) + ": " + get_str(ev->get(), "code") + " " +
                     get_str(ev->get(), "message"));
            }
            return std::move(*ev);
        }
        fail("no done event for request " + std::to_string(id));
    }

    msgpack::object_handle op(const char* name) {
        uint64_t id = ++_next_id;
        msgpack::sbuffer buf;
        msgpack::packer<msgpack::sbuffer> pk(buf);
        pk.pack_map(2), pk.pack("id"), pk.pack(id), pk.pack("op"), pk.pack(name);
        return ask(buf, id, query_deadline);
    }

    generate_result generate(const std::vector<int32_t>& tokens) {
        uint64_t id = ++_next_id;
        msgpack::sbuffer buf;
        msgpack::packer<msgpack::sbuffer> pk(buf);
        pk.pack_map(5);
        pk.pack("id"), pk.pack(id), pk.pack("op"), pk.pack("generate");
        pk.pack("tokens"), pk.pack(tokens);
        pk.pack("max_tokens"), pk.pack(1), pk.pack("temperature"), pk.pack(0.0);
        auto t0 = clock_type::now();
        auto done = ask(buf, id, request_deadline);
        generate_result r;
        r.wall_ms = ms_since(t0);
        const msgpack::object* usage = find(done.get(), "usage");
        r.prefill_ms = f64_of(usage, "prefill_ms");
        r.cached_tokens = static_cast<uint32_t>(u64_of(usage, "cached_tokens"));
        const msgpack::object* ids = find(done.get(), "tokens");
        if (ids == nullptr || ids->type != msgpack::type::ARRAY || ids->via.array.size != 1 ||
            ids->via.array.ptr[0].type != msgpack::type::POSITIVE_INTEGER) {
            fail("request " + std::to_string(id) + ": done.tokens is not one id");
        }
        r.token = ids->via.array.ptr[0].via.u64;
        return r;
    }

    // Polls stats until `ready(kv_disk)` holds; fails after `deadline`.
    template <typename Pred>
    void wait_kv(Pred ready, const std::string& what, milliseconds deadline) {
        auto end = clock_type::now() + deadline;
        while (true) {
            auto s = op("stats");
            if (ready(find(s.get(), "kv_disk"))) return;
            if (clock_type::now() >= end) fail("timed out waiting for " + what);
            std::this_thread::sleep_for(poll_interval);
        }
    }

    void stop() {
        int code = _proc.stop();
        if (code != 0) fail("ordo-server exited with " + std::to_string(code));
    }

private:
    load::spawned_server _proc;
    connection _conn;
    uint64_t _next_id = 0;
};

// ---- the phases ---------------------------------------------------------------------------------

uint64_t prompt_seed(uint32_t size, uint32_t rep) {
    return uint64_t{size} * reps_max + rep;
}

// Server A: every prompt computed from scratch; returns once its files are written.
void measure_recompute(bench_server& srv, std::vector<size_samples>& out, uint32_t vocab,
                       uint32_t reps) {
    srv.wait_kv([](const msgpack::object* k) { return bool_of(k, "ready"); }, "the kv scan",
                startup_deadline);
    srv.generate(load::random_prompt(warmup_seed, warmup_tokens, vocab));
    for (auto& s : out) {
        for (uint32_t rep = 0; rep < reps; ++rep) {
            auto r =
                srv.generate(load::random_prompt(prompt_seed(s.tokens, rep), s.tokens + 1, vocab));
            if (r.cached_tokens != 0) {
                fail("recompute of " + std::to_string(s.tokens) + " tokens found " +
                     std::to_string(r.cached_tokens) + " cached");
            }
            s.token.push_back(r.token);
            s.recompute_ms.push_back(r.wall_ms);
            s.recompute_prefill_ms.push_back(r.prefill_ms);
            std::fprintf(stderr, "recompute %u: %.1f ms (prefill %.1f ms)\n", s.tokens, r.wall_ms,
                         r.prefill_ms);
        }
    }
    const uint64_t files = uint64_t{reps} * out.size();
    srv.wait_kv(
        [files](const msgpack::object* k) {
            if (u64_of(k, "save_failures") != 0) fail("a kv save failed");
            return u64_of(k, "saves") >= files;
        },
        "the kv saves", saves_deadline);
}

// The files server A wrote: their sizes, and how long reading and verifying one takes here.
void measure_files(const std::string& kv_dir, std::vector<size_samples>& out) {
    std::map<uint32_t, size_samples*> by_tokens;
    for (auto& s : out) by_tokens[s.cached_tokens] = &s;
    for (const auto& e : fs::directory_iterator(kv_dir)) {
        if (!e.is_regular_file() || e.path().extension() != kv::kv_file_suffix) continue;
        auto h = kv::read_kv_header_any(e.path().string());
        if (!h) fail(e.path().string() + ": " + h.err().message);
        auto it = by_tokens.find(h->n_tokens());
        if (it == by_tokens.end()) fail(e.path().string() + ": a file no prompt should have left");
        std::vector<uint8_t> bytes(h->n_blocks * h->meta.geometry.block_bytes());
        auto t0 = clock_type::now();
        if (auto st = kv::read_kv_blocks(e.path().string(), *h, 0, h->n_blocks, bytes); !st) {
            fail(e.path().string() + ": " + st.err().message);
        }
        it->second->file_read_ms.push_back(ms_since(t0));
        it->second->file_bytes.push_back(h->file_bytes);
    }
    for (const auto& s : out) {
        if (s.file_bytes.size() != s.recompute_ms.size()) {
            fail(std::to_string(s.file_bytes.size()) + " kv files of " +
                 std::to_string(s.cached_tokens) + " tokens, expected " +
                 std::to_string(s.recompute_ms.size()));
        }
    }
}

// Server B, restarted on the same dir: each prompt restored from disk, then hit in memory.
void measure_restore(bench_server& srv, std::vector<size_samples>& out, uint32_t vocab,
                     uint32_t reps) {
    srv.wait_kv([](const msgpack::object* k) { return bool_of(k, "ready"); }, "the kv scan",
                startup_deadline);
    srv.generate(load::random_prompt(warmup_seed + 1, warmup_tokens, vocab));
    for (auto& s : out) {
        for (uint32_t rep = 0; rep < reps; ++rep) {
            auto prompt = load::random_prompt(prompt_seed(s.tokens, rep), s.tokens + 1, vocab);
            auto before = srv.op("stats");
            auto r = srv.generate(prompt);
            auto after = srv.op("stats");
            // Greedy: the same KV gives the same next token (ordo is batch invariant).
            if (r.token != s.token[rep]) {
                fail("restore of " + std::to_string(s.tokens) + " tokens generated " +
                     std::to_string(r.token) + ", recompute " + std::to_string(s.token[rep]));
            }
            if (r.cached_tokens != s.cached_tokens) {
                fail("restore of " + std::to_string(s.tokens) + " tokens reported " +
                     std::to_string(r.cached_tokens) + " cached, expected " +
                     std::to_string(s.cached_tokens));
            }
            const auto* kb = find(before.get(), "kv_disk");
            const auto* ka = find(after.get(), "kv_disk");
            if (u64_of(ka, "restores") != u64_of(kb, "restores") + 1) {
                fail("the kv actor did not count one restore for " + std::to_string(s.tokens));
            }
            s.restore_ms.push_back(r.wall_ms);
            s.restore_kv_ms.push_back(f64_of(ka, "restore_ms") - f64_of(kb, "restore_ms"));
            auto hit = srv.generate(prompt);
            if (hit.cached_tokens != s.cached_tokens || hit.token != s.token[rep]) {
                fail("memory hit of " + std::to_string(s.tokens) + " tokens reported " +
                     std::to_string(hit.cached_tokens) + " cached, token " +
                     std::to_string(hit.token));
            }
            s.memory_hit_ms.push_back(hit.wall_ms);
            std::fprintf(stderr, "restore %u: %.1f ms (kv actor %.1f ms), memory hit %.1f ms\n",
                         s.tokens, r.wall_ms, s.restore_kv_ms.back(), hit.wall_ms);
        }
    }
}

// ---- output -------------------------------------------------------------------------------------

void print_json(const options& o, const std::string& device, const std::string& model,
                const std::vector<size_samples>& out) {
    std::printf(
        "{\"bench\": \"kv_restore\", \"device\": \"%s\", \"model\": \"%s\", "
        "\"block_tokens\": %u, \"batch_tokens\": %u, \"reps\": %u, \"sizes\": [",
        device.c_str(), model.c_str(), block_tokens, o.batch_tokens, o.reps);
    for (size_t i = 0; i < out.size(); ++i) {
        const size_samples& s = out[i];
        const double recompute = median(s.recompute_ms), restore = median(s.restore_ms);
        const uint64_t bytes = *std::max_element(s.file_bytes.begin(), s.file_bytes.end());
        std::printf(
            "%s\n  {\"tokens\": %u, \"cached_tokens\": %u, \"recompute_ms\": %.1f, "
            "\"recompute_prefill_ms\": %.1f, \"restore_ms\": %.1f, "
            "\"restore_kv_ms\": %.1f, \"file_read_ms\": %.1f, "
            "\"memory_hit_ms\": %.1f, \"speedup\": %.2f, \"kv_file_bytes\": %llu, "
            "\"bytes_per_token\": %.1f}",
            i == 0 ? "" : ",", s.tokens, s.cached_tokens, recompute, median(s.recompute_prefill_ms),
            restore, median(s.restore_kv_ms), median(s.file_read_ms), median(s.memory_hit_ms),
            recompute / restore, static_cast<unsigned long long>(bytes),
            double(bytes) / s.cached_tokens);
    }
    std::printf("\n]}\n");
}

std::string make_temp_dir() {
    std::string pattern = (fs::temp_directory_path() / "ordo-kv-restore-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) fail("mkdtemp " + pattern);
    return pattern;
}

}  // namespace

int main(int argc, char** argv) {
    const options o = parse(argc, argv);
    const uint32_t size_max = *std::max_element(o.sizes.begin(), o.sizes.end());
    const std::string dir = make_temp_dir();
    g_dir = dir;
    // Prompt N + 1 plus the one generated token, rounded up to whole 1024s.
    const uint32_t context = std::max<uint32_t>(2048, (size_max + 2 + 1023) / 1024 * 1024);
    const std::string model = o.model.empty() ? make_model(dir, context) : o.model;
    const std::string config = write_config(dir, o);
    const std::string kv_dir = dir + "/kv";

    std::vector<size_samples> out;
    for (uint32_t n : o.sizes) {
        size_samples s;
        s.tokens = n;
        s.cached_tokens = n / block_tokens * block_tokens;
        out.push_back(std::move(s));
    }
    bench_server a;
    a.start(o, model, config, kv_dir);
    auto m = a.op("model");
    const std::string device = get_str(m.get(), "device");
    const uint32_t vocab = static_cast<uint32_t>(u64_of(&m.get(), "n_vocab"));
    if (u64_of(&m.get(), "context") < size_max + 2) {
        fail("the model's context " + std::to_string(u64_of(&m.get(), "context")) +
             " does not hold " + std::to_string(size_max + 2) + " tokens");
    }
    measure_recompute(a, out, vocab, o.reps);
    a.stop();  // SIGTERM: every save is already written
    measure_files(kv_dir, out);

    bench_server b;
    b.start(o, model, config, kv_dir);
    measure_restore(b, out, vocab, o.reps);
    b.stop();

    const std::string label = o.model.empty() ? "medium-110M-f16" : fs::path(model).stem().string();
    print_json(o, device, label, out);
    if (o.keep) {
        std::fprintf(stderr, "ordo-bench-kv-restore: kept %s\n", dir.c_str());
    } else {
        fs::remove_all(dir);
    }
    return 0;
}
