// test_kv_persistence.cpp: KV persistence (kv/, ARCHITECTURE.md F7) end to end: the real
// ordo-server binary over TCP on an ephemeral port, the real stories260K model (../shared; the
// tests skip visibly without it), the gpu actor on the real Vulkan device (lavapipe in CI), KV
// directories made with mkdtemp under /tmp and removed after. Temperature 0 everywhere, so
// "correct output" means token for token what a server computes without any persisted KV.
//
// Checks, one test each:
// 1. prefix_survives_restart: a prompt of 45 tokens (2 full blocks of gpu.kv_block_tokens = 16)
//    saved by server A (SIGTERM flushes it) is restored by server B on the same directory:
//    same tokens and text, usage.cached_tokens = 32, kv_disk.restores = 1; a server without
//    --kv-dir gives the same tokens.
// 2. session_across_restart_busy_and_delete: turn 1 with session "s1"; after a restart turn 2
//    (turn 1's tokens + its reply + new tokens) restores blocks past turn 1's prompt and gives
//    what a server without KV gives; a second live request on the session, and session_delete
//    while it runs, get error session_busy; session_delete answers deleted true, then false;
//    after delete and a restart kv_disk.sessions = 0 and turn 2 restores nothing.
// 3. corrupt_and_foreign_files_are_never_loaded: from real files (this model, another model of
//    the same shape made with `ordo-model mk`, gpu.kv_block_tokens = 32, gpu.kv_dtype = f32)
//    it makes header bit flips, a token-id flip, truncations at every region boundary, an empty
//    and an oversized file, format version 2 with a correct header checksum, payload flips (a
//    checksum-table entry, a first and a last block), a directory x.kv and a symlink y.kv; the
//    startup scan quarantines each refused file under its error code, ignores and leaves alone
//    the directory and the symlink, keeps the payload-corrupt ones (only the blocks' checksums
//    catch them), which the first restore quarantines while the request recomputes; outputs
//    equal the from-scratch ones and restores come only from the valid file, which stays
//    reachable after a longer corrupt file sharing its blocks is quarantined.
// 4. kill_9_during_saves: N rounds (ORDO_KV_SOAK_ITERS, default 4; the seed is printed and
//    ORDO_KV_SOAK_SEED replays one): concurrent generates with distinct prompts (one of them a
//    session), SIGKILL at a random instant around their saves, restart: no *.tmp survives the
//    scan, every .kv left passes `ordo-model kv-inspect FILE --verify` or was quarantined, and
//    the requests answer what a server without KV answers.
// 5. kv_disk_faults.enospc_then_read_only (root and a tmpfs mount needed, else skipped with a
//    message): a 32 KiB tmpfs takes one save, the next fails with ENOSPC: persistence turns off,
//    health stays ok with a reason, kv_disk.errors counts kv_no_space, serving and restores go on
//    with correct output; then the same tmpfs remounted read-only: the server starts with
//    persistence off (reason, read-only) and still restores from the valid file.
// 6. gpu_fault_right_after_a_restore: with [fault] enabled, a nan_logits fault on the first
//    prefill after a restore and a device_lost one on another: both requests finish with the
//    from-scratch tokens after one recompute, each entry is quarantined (kv_step_failed,
//    disk_invalidations), every failure counter is exactly one per fault, and the next
//    identical request restores from the file the recompute saved, never the quarantined one.
// 7. Idle after everything: every test ends every server's life by checking that stats show no
//    active or queued sequence, no used KV block and kv.pins = 0 (no pin outlives its save or
//    restore), after restores, busy sessions, cancels, corrupt files and gpu faults.
// 8. kv faults through the `fault` op ([fault] enabled; docs/protocol.md "fault"), each through
//    the path a real fault takes:
//    - kv_enospc / kv_eio: the next save fails half-way through its .tmp: persistence off, the
//      health reason and kv_disk.errors name kv_no_space / kv_io_error, no .tmp or .kv is left,
//      serving goes on with correct output; a server without --kv-dir refuses kv kinds with
//      bad_request.
//    - kv_torn_exit: the server exits with status 86 mid-save, leaving half a .tmp; the restart's
//      scan deletes it, nothing is loaded or quarantined, the output is the from-scratch one.
//    - kv_flip_read: the next restore reads a flipped bit: restore_failures 1, quarantined 1
//      (kv_block_checksum), output identical to the from-scratch one; the recompute's new file
//      is then restored.
//    - kv_fingerprint: the next save is written as another model's file (its pair check fails,
//      kv_fingerprint); the restart's scan quarantines it as kv_fingerprint; nothing restores.
//    - kv_stall_unlink: a session_delete whose unlink the disk holds 30 times kv.restore_wait_ms
//      is answered kv_io naming the key (scheduler.session_delete_timeouts 1) while a generate
//      is served with correct output; the held unlink still removes the session's file, its late
//      answer is dropped (session_delete_late_answers 1, no second event for the request), the
//      next delete answers deleted false, and a restart finds no session. A SIGTERM while such
//      a delete waits: the drain waits for it, its client gets kv_io before the server exits 0.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/server_process.hpp"
#include "tests/support/shared_models.hpp"

namespace {

using namespace ordo::test;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
using tokens_t = std::vector<int32_t>;

const std::string stories = std::string(ORDO_SHARED_MODELS_DIR) + "/stories260K.gguf";
#define REQUIRE_STORIES() ORDO_REQUIRE_SHARED(stories)

// gpu.kv_block_tokens of every server here but the one that writes a foreign block size.
constexpr uint32_t block_tokens = 16;
// Prompt lengths: two full blocks and a tail, so a prefix file holds 2 blocks and a lookup
// (full blocks before the last token) asks for exactly those 2.
constexpr size_t prompt_len = 45;
constexpr uint32_t max_tokens = 12;
// Polls of stats (wait_for) are bounded by this; a bound, not a timing assertion.
constexpr auto poll_deadline = 30s;

// ---- temporary directories --------------------------------------------------------------------

// A directory made with mkdtemp under /tmp, removed with everything in it at destruction.
class temp_dir {
public:
    temp_dir() {
        char t[] = "/tmp/ordo_kvp_XXXXXX";
        if (char* p = ::mkdtemp(t)) _path = p;
        EXPECT_FALSE(_path.empty()) << "mkdtemp: " << std::strerror(errno);
    }
    ~temp_dir() {
        std::error_code ec;
        if (!_path.empty()) fs::remove_all(_path, ec);
    }
    temp_dir(const temp_dir&) = delete;
    temp_dir& operator=(const temp_dir&) = delete;
    const std::string& path() const { return _path; }
    std::string sub(const std::string& name) const { return _path + "/" + name; }

private:
    std::string _path;
};

// Regular files directly in `dir` whose names end with `suffix`, sorted.
std::vector<std::string> files_in(const std::string& dir, const std::string& suffix) {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
        std::string n = e.path().filename().string();
        if (e.is_regular_file() && !e.is_symlink() && n.size() > suffix.size() &&
            n.ends_with(suffix)) {
            names.push_back(n);
        }
    }
    std::sort(names.begin(), names.end());
    return names;
}

std::string read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A name the startup scan takes for one of ours: "p-" + 32 hex digits.
std::string random_prefix_name(std::mt19937& rng) {
    static constexpr char hex[] = "0123456789abcdef";
    std::string s = "p-";
    for (int i = 0; i < 32; i++) s += hex[rng() % 16];
    return s;
}

// `ordo-model kv-inspect FILE --verify`: its exit status (0 valid, 1 refused or corrupt).
int kv_inspect_verify(const std::string& path) {
    std::string cmd =
        "'" + std::string(ORDO_MODEL_BIN) + "' kv-inspect '" + path + "' --verify > /dev/null 2>&1";
    int rc = std::system(cmd.c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// ---- events and requests ----------------------------------------------------------------------

// What a generate request ended with.
struct gen_result {
    std::string event, reason, code, message, text;
    tokens_t tokens;
    uint64_t cached = UINT64_MAX, prompt_tokens = UINT64_MAX;
    bool finished() const { return event == "done" && (reason == "stop" || reason == "length"); }
    std::string outcome() const {
        return event == "error" ? "error:" + code + " (" + message + ")" : event + ":" + reason;
    }
};

gen_result to_result(const event& e) {
    gen_result g;
    g.event = e.str("event");
    g.reason = e.str("reason");
    g.code = e.str("code");
    g.message = e.str("message");
    g.text = e.str("text");
    if (const auto* t = field(e.o(), "tokens")) g.tokens = t->as<tokens_t>();
    if (const auto* u = field(e.o(), "usage")) {
        g.cached = uint_field(*u, "cached_tokens");
        g.prompt_tokens = uint_field(*u, "prompt_tokens");
    }
    return g;
}

// The stats op's answer, read by path.
struct stats_view {
    std::shared_ptr<msgpack::object_handle> h;
    const msgpack::object& o() const { return h->get(); }
    uint64_t top(const std::string& k) const { return uint_field(o(), k); }
    uint64_t in(const std::string& map, const std::string& k) const {
        const auto* m = field(o(), map);
        return m ? uint_field(*m, k) : UINT64_MAX;
    }
    uint64_t sched(const std::string& k) const { return in("scheduler", k); }
    uint64_t kv(const std::string& k) const { return in("kv", k); }
    uint64_t gpu(const std::string& k) const { return in("gpu", k); }
    uint64_t disk(const std::string& k) const { return in("kv_disk", k); }
    bool disk_flag(const std::string& k) const {
        const auto* m = field(o(), "kv_disk");
        const auto* f = m ? field(*m, k) : nullptr;
        return f && f->type == msgpack::type::BOOLEAN && f->via.boolean;
    }
    std::string disk_str(const std::string& k) const {
        const auto* m = field(o(), "kv_disk");
        return m ? str_field(*m, k) : std::string();
    }
    // kv_disk.errors[code], 0 when absent.
    uint64_t disk_error(const std::string& code) const {
        const auto* m = field(o(), "kv_disk");
        const auto* e = m ? field(*m, "errors") : nullptr;
        if (e == nullptr) return 0;
        uint64_t v = uint_field(*e, code);
        return v == UINT64_MAX ? 0 : v;
    }
};

// ---- a server ---------------------------------------------------------------------------------

struct server_config {
    std::string model = stories;
    std::string kv_dir;  // empty: no KV persistence
    std::string extra;   // TOML appended to the config
};

// One ordo-server process and one connection to it; ids are handed out in order.
class server {
public:
    // Starts the server (config written into `cfg_dir`), waits until health says ok and, with
    // a kv dir, until the startup scan is done (before it, every lookup misses).
    bool start(const std::string& cfg_dir, const server_config& cfg) {
        static int configs = 0;
        std::string path = cfg_dir + "/server" + std::to_string(configs++) + ".toml";
        std::ofstream(path) << "[model]\npath = \"" << cfg.model << "\"\n" << cfg.extra;
        std::vector<std::string> args{"--config", path, "--log-level", "warn"};
        if (!cfg.kv_dir.empty()) args.insert(args.end(), {"--kv-dir", cfg.kv_dir});
        _c = std::make_unique<tcp_client>();
        if (!_proc.start(ORDO_SERVER_BIN, args)) {
            ADD_FAILURE() << "ordo-server did not start:\n" << _proc.output();
            return false;
        }
        if (!_c->connect(_proc.port())) {
            ADD_FAILURE() << "cannot connect to port " << _proc.port();
            return false;
        }
        bool ok = wait_for(
            "health ok",
            [this] {
                auto e = op("health");
                return e && e->str("status") == "ok";
            },
            device_ready_deadline);
        if (ok && !cfg.kv_dir.empty()) {
            ok = wait_for("kv_disk.ready", [this] { return stats().disk_flag("ready"); });
        }
        return ok;
    }

    // SIGTERM (the kv actor flushes its saves) and the exit status.
    int stop() { return _proc.stop(); }
    // Waits (bounded) for the process to exit on its own; its exit status.
    int wait_exit() { return _proc.wait_exit(); }
    // SIGTERM without waiting: the server drains while the test still reads its connection.
    void terminate() { ::kill(_proc.pid(), SIGTERM); }
    // SIGKILL at once and the exit status (128 + 9).
    int kill9() {
        ::kill(_proc.pid(), SIGKILL);
        return _proc.wait_exit();
    }
    uint16_t port() const { return _proc.port(); }
    tcp_client& conn() { return *_c; }
    uint64_t take_id() { return _next_id++; }
    // Whether a terminal event of `id` was read while waiting for another one (and not taken).
    bool holds_terminal(uint64_t id) const { return _terminals.count(id) != 0; }

    // Sends op `name` with key/value parameters under the next id; returns its terminal event.
    template <typename... kv>
    std::optional<event> op(const std::string& name, const kv&... params) {
        uint64_t id = _next_id++;
        if (!_c->send(frame("id", id, "op", name, params...))) return std::nullopt;
        return wait_terminal(id);
    }

    // The terminal event of request `id`; terminal events of other ids read meanwhile are kept
    // for their own wait_terminal, their other events dropped.
    std::optional<event> wait_terminal(uint64_t id) {
        if (auto it = _terminals.find(id); it != _terminals.end()) {
            event e = it->second;
            _terminals.erase(it);
            return e;
        }
        while (auto e = next(*_c)) {
            if (!e->terminal()) continue;
            if (e->u("id") == id) return e;
            _terminals.emplace(e->u("id"), *e);
        }
        return std::nullopt;
    }

    stats_view stats() {
        auto e = op("stats");
        if (!e) {
            ADD_FAILURE() << "no answer to stats";
            return {std::make_shared<msgpack::object_handle>()};
        }
        return {e->h};
    }

    event health() {
        auto e = op("health");
        EXPECT_TRUE(e.has_value()) << "no answer to health";
        return e ? *e : event{std::make_shared<msgpack::object_handle>()};
    }

    // A greedy generate of `prompt` (token ids) with at most `n` tokens and optional extra
    // key/value pairs.
    template <typename... kv>
    gen_result generate_n(const tokens_t& prompt, uint32_t n, const kv&... extra) {
        auto e = op("generate", "tokens", prompt, "max_tokens", n, "temperature", 0, extra...);
        if (!e) {
            ADD_FAILURE() << "no terminal event for a generate";
            return {};
        }
        return to_result(*e);
    }
    template <typename... kv>
    gen_result generate(const tokens_t& prompt, const kv&... extra) {
        return generate_n(prompt, max_tokens, extra...);
    }

    // Every prompt at once on this connection; the results in prompt order.
    std::vector<gen_result> generate_all(const std::vector<tokens_t>& prompts) {
        std::vector<gen_result> out(prompts.size());
        uint64_t first = send_all(prompts);
        for (size_t i = 0; i < prompts.size(); i++) {
            auto e = wait_terminal(first + i);
            if (!e) {
                ADD_FAILURE() << "generate " << i << " had no terminal event";
                break;
            }
            out[i] = to_result(*e);
        }
        return out;
    }

    // Sends a generate per prompt without waiting; returns the first id (ids are consecutive).
    uint64_t send_all(const std::vector<tokens_t>& prompts,
                      const std::optional<std::string>& session_of_first = std::nullopt) {
        uint64_t first = _next_id;
        for (size_t i = 0; i < prompts.size(); i++) {
            uint64_t id = _next_id++;
            bool ok =
                i == 0 && session_of_first
                    ? _c->send(frame("id", id, "op", "generate", "tokens", prompts[i], "max_tokens",
                                     max_tokens, "temperature", 0, "session", *session_of_first))
                    : _c->send(frame("id", id, "op", "generate", "tokens", prompts[i], "max_tokens",
                                     max_tokens, "temperature", 0));
            EXPECT_TRUE(ok);
        }
        return first;
    }

    // The tokenize op.
    tokens_t tokenize(const std::string& text, bool add_bos) {
        auto e = op("tokenize", "text", text, "add_bos", add_bos);
        const auto* t = e ? field(e->o(), "tokens") : nullptr;
        EXPECT_TRUE(t != nullptr) << "no tokens for \"" << text << "\"";
        return t ? t->as<tokens_t>() : tokens_t{};
    }

    // Polls `pred` every 20 ms until it holds (true) or `deadline` passes (a failure).
    bool wait_for(const std::string& what, const std::function<bool()>& pred,
                  std::chrono::seconds deadline =
                      std::chrono::duration_cast<std::chrono::seconds>(poll_deadline)) {
        auto end = std::chrono::steady_clock::now() + deadline;
        while (std::chrono::steady_clock::now() < end) {
            if (pred()) return true;
            std::this_thread::sleep_for(20ms);
        }
        ADD_FAILURE() << "waited " << deadline.count() << " s for " << what;
        return false;
    }

    // Waits until the kv actor has settled `n` saves (written, skipped or failed): a save is
    // written after the request's done event, off the kv actor's loop.
    bool wait_saves_settled(uint64_t n) {
        return wait_for("kv saves settled", [&] {
            auto s = stats();
            return s.disk("saves") + s.disk("saves_skipped") + s.disk("save_failures") >= n;
        });
    }

    // Check 7: nothing live, nothing used, nothing pinned. Polled first: a save's pin is
    // dropped when the kv actor answers, just after the request's done event.
    void expect_idle() {
        auto idle = [](const stats_view& s) {
            return s.top("active_sequences") == 0 && s.top("queued_requests") == 0 &&
                   s.top("kv_blocks_used") == 0 && s.kv("pins") == 0;
        };
        wait_for("idle (no sequence, no used block, no pin)", [&] { return idle(stats()); });
        auto s = stats();
        EXPECT_EQ(s.top("active_sequences"), 0u);
        EXPECT_EQ(s.top("queued_requests"), 0u);
        EXPECT_EQ(s.top("kv_blocks_used"), 0u);
        EXPECT_EQ(s.kv("pins"), 0u);
    }

private:
    server_process _proc;
    std::unique_ptr<tcp_client> _c = std::make_unique<tcp_client>();
    uint64_t _next_id = 1;
    std::map<uint64_t, event> _terminals;
};

// ---- prompts ----------------------------------------------------------------------------------

const char* const story_texts[] = {
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
    "park with her friends. One day, she saw a big red ball under a tall green tree.",
    "Tom was a happy dog who lived in a small house by the sea. Every morning he ran along the "
    "beach and barked at the birds. His best friend was a cat named Tim.",
    "One sunny day, a little boy named Ben went to the farm with his mom. They saw cows, pigs "
    "and a big brown horse. Ben wanted to ride the horse, but it was too big.",
    "There was a small bird who could not fly. She sat on a branch and watched the other birds "
    "in the sky. She was sad, so her mother came to help her try again.",
    "Sue had a pretty doll with a pink dress. She took the doll everywhere she went, to the "
    "shop, to the park and to bed. One night the doll was gone and Sue cried.",
    "The sun was hot and the grass was dry. A little frog jumped from the pond to find some "
    "shade. He met a kind turtle who showed him a cool place under a rock.",
};

// The first `len` ids of `text` tokenized with BOS.
tokens_t prompt_of(server& s, const std::string& text, size_t len = prompt_len) {
    tokens_t t = s.tokenize(text, true);
    EXPECT_GE(t.size(), len) << "\"" << text << "\" is too short";
    t.resize(std::min(t.size(), len));
    return t;
}

// A prompt made of seeded random words, cut to `len` ids.
tokens_t random_prompt(server& s, std::mt19937& rng, size_t len) {
    static const char* const words[] = {
        "the",  "little", "dog",   "ran",  "to",    "a",    "big",    "tree",  "and",
        "saw",  "bird",   "happy", "girl", "named", "Lily", "Tom",    "park",  "sun",
        "red",  "ball",   "mom",   "said", "play",  "with", "friend", "box",   "cat",
        "blue", "sky",    "went",  "home", "night", "moon", "cake",   "sweet", "shop"};
    std::string text = "Once upon a time";
    while (text.size() < 4 * len) text += std::string(" ") + words[rng() % std::size(words)];
    return prompt_of(s, text, len);
}

// ---- the file format, as docs/kv-format.md lays it out ----------------------------------------

constexpr size_t header_bytes = 128;
constexpr size_t version_offset = 8, n_blocks_offset = 52, block_bytes_offset = 56;
constexpr size_t block_tokens_offset = 44, header_checksum_offset = 120;

uint64_t le(const std::string& b, size_t off, size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v |= uint64_t(uint8_t(b[off + i])) << (8 * i);
    return v;
}

void put_le(std::string& b, size_t off, size_t n, uint64_t v) {
    for (size_t i = 0; i < n; i++) b[off + i] = char((v >> (8 * i)) & 0xff);
}

// Where a file's regions start, from its header.
struct file_layout {
    uint64_t n_blocks = 0, n_tokens = 0, block_bytes = 0;
    uint64_t table = 0, payload = 0, size = 0;
};

file_layout layout_of(const std::string& b) {
    file_layout l;
    l.n_blocks = le(b, n_blocks_offset, 4);
    l.n_tokens = l.n_blocks * le(b, block_tokens_offset, 4);
    l.block_bytes = le(b, block_bytes_offset, 8);
    l.table = header_bytes + 4 * l.n_tokens;
    l.payload = l.table + 8 * l.n_blocks;
    l.size = l.payload + l.n_blocks * l.block_bytes;
    return l;
}

// The token ids a file holds.
tokens_t tokens_of_file(const std::string& b) {
    file_layout l = layout_of(b);
    tokens_t t;
    for (uint64_t i = 0; i < l.n_tokens; i++) t.push_back(int32_t(le(b, header_bytes + 4 * i, 4)));
    return t;
}

// The file in `dir` whose token ids are the first whole blocks of `prompt` (n_blocks of them).
std::string file_for(const std::string& dir, const tokens_t& prompt, size_t n_blocks) {
    tokens_t want(prompt.begin(), prompt.begin() + long(n_blocks * block_tokens));
    for (const auto& name : files_in(dir, ".kv")) {
        if (tokens_of_file(read_bytes(dir + "/" + name)) == want) return dir + "/" + name;
    }
    ADD_FAILURE() << "no file in " << dir << " holds the prompt's " << n_blocks << " blocks";
    return {};
}

void flip_bit(std::string& b, size_t offset, std::mt19937& rng) {
    b[offset] = char(uint8_t(b[offset]) ^ uint8_t(1u << (rng() % 8)));
}

void set_mtime(const std::string& path, std::chrono::seconds ago) {
    timespec now{};
    clock_gettime(CLOCK_REALTIME, &now);
    timespec t[2] = {{now.tv_sec - ago.count(), 0}, {now.tv_sec - ago.count(), 0}};
    EXPECT_EQ(::utimensat(AT_FDCWD, path.c_str(), t, 0), 0) << path;
}

// ---- checks shared by the tests ---------------------------------------------------------------

void expect_same_output(const gen_result& got, const gen_result& want, const std::string& what) {
    EXPECT_TRUE(got.finished()) << what << ": " << got.outcome();
    EXPECT_EQ(got.tokens, want.tokens) << what << ": tokens differ from the from-scratch ones";
    EXPECT_EQ(got.text, want.text) << what;
}

// =================================================================================================
// 1. A prefix survives a restart.
// =================================================================================================

TEST(kv_persistence, prefix_survives_restart) {
    REQUIRE_STORIES();
    temp_dir tmp;
    const std::string dir = tmp.sub("kv");

    server a;
    ASSERT_TRUE(a.start(tmp.path(), {stories, dir, ""}));
    const tokens_t prompt = prompt_of(a, story_texts[0]);
    const gen_result first = a.generate(prompt);
    ASSERT_TRUE(first.finished()) << first.outcome();
    EXPECT_EQ(first.cached, 0u);
    EXPECT_EQ(first.prompt_tokens, prompt_len);
    a.expect_idle();
    EXPECT_EQ(a.stop(), 0);  // SIGTERM: the kv actor writes the save before the exit
    auto saved = files_in(dir, ".kv");
    ASSERT_EQ(saved.size(), 1u) << "one automatic prefix file";
    EXPECT_TRUE(saved[0].starts_with("p-")) << saved[0];
    EXPECT_EQ(kv_inspect_verify(dir + "/" + saved[0]), 0);

    server b;
    ASSERT_TRUE(b.start(tmp.path(), {stories, dir, ""}));
    auto before = b.stats();
    EXPECT_EQ(before.disk("files"), 1u);
    EXPECT_EQ(before.disk("quarantined"), 0u);
    const gen_result again = b.generate(prompt);
    expect_same_output(again, first, "after the restart");
    EXPECT_EQ(again.cached, 2u * block_tokens) << "both full blocks restored from disk";
    auto after = b.stats();
    EXPECT_EQ(after.disk("restores"), 1u);
    EXPECT_EQ(after.disk("restore_failures"), 0u);
    EXPECT_EQ(after.sched("disk_restores"), 1u);
    EXPECT_EQ(after.sched("disk_restored_tokens"), 2u * block_tokens);
    b.expect_idle();
    EXPECT_EQ(b.stop(), 0);

    server fresh;  // no --kv-dir: everything computed
    ASSERT_TRUE(fresh.start(tmp.path(), {stories, "", ""}));
    const gen_result computed = fresh.generate(prompt);
    EXPECT_EQ(computed.cached, 0u);
    expect_same_output(computed, first, "a server without KV persistence");
    fresh.expect_idle();
}

// =================================================================================================
// 2. A multi-turn session across a restart; session_busy; session_delete.
// =================================================================================================

TEST(kv_persistence, session_across_restart_busy_and_delete) {
    REQUIRE_STORIES();
    temp_dir tmp;
    const std::string dir = tmp.sub("kv");
    constexpr uint32_t reply_tokens = 40;  // turn 1's reply spans blocks past its prompt

    // Turn 1 on server A: the session file holds the prompt and the reply's computed blocks.
    server a;
    ASSERT_TRUE(a.start(tmp.path(), {stories, dir, ""}));
    const tokens_t turn1 = prompt_of(a, story_texts[1]);
    const gen_result r1 = a.generate_n(turn1, reply_tokens, "session", "s1");
    ASSERT_TRUE(r1.finished()) << r1.outcome();
    EXPECT_EQ(r1.cached, 0u);
    ASSERT_GE(r1.tokens.size(), 20u) << "the reply ended too early to span another block";
    tokens_t turn2 = turn1;
    turn2.insert(turn2.end(), r1.tokens.begin(), r1.tokens.end());
    for (int32_t t : a.tokenize(" Then they went home and had a nap.", false)) turn2.push_back(t);
    ASSERT_TRUE(a.wait_saves_settled(1));
    auto sa = a.stats();
    EXPECT_EQ(sa.disk("saves"), 1u);
    EXPECT_EQ(sa.disk("sessions"), 1u);
    EXPECT_EQ(sa.disk("files"), 1u) << "a session request saves no automatic prefix";
    a.expect_idle();
    EXPECT_EQ(a.stop(), 0);
    ASSERT_EQ(files_in(dir, ".kv").size(), 1u);
    EXPECT_TRUE(files_in(dir, ".kv")[0].starts_with("s-"));

    // The reference: turn 2 computed by a server without KV persistence.
    server fresh;
    ASSERT_TRUE(fresh.start(tmp.path(), {stories, "", ""}));
    const gen_result want2 = fresh.generate(turn2);
    ASSERT_TRUE(want2.finished()) << want2.outcome();
    EXPECT_EQ(want2.cached, 0u);
    fresh.expect_idle();
    EXPECT_EQ(fresh.stop(), 0);

    // Turn 2 on server B after the restart: restored past turn 1's prompt.
    server b;
    ASSERT_TRUE(b.start(tmp.path(), {stories, dir, ""}));
    EXPECT_EQ(b.stats().disk("sessions"), 1u);
    const gen_result r2 = b.generate(turn2, "session", "s1");
    expect_same_output(r2, want2, "turn 2 after the restart");
    const uint64_t turn1_blocks = (turn1.size() - 1) / block_tokens * block_tokens;
    EXPECT_GT(r2.cached, turn1_blocks) << "the session's reply blocks were not restored";
    EXPECT_EQ(r2.cached % block_tokens, 0u);
    EXPECT_LT(r2.cached, turn2.size());
    EXPECT_EQ(b.stats().disk("restores"), 1u);
    ASSERT_TRUE(b.wait_saves_settled(1));  // turn 2 replaces the session's file

    // A live request holds the session: a second one and a delete get session_busy.
    const uint64_t busy_id = b.take_id();
    ASSERT_TRUE(b.conn().send(frame("id", busy_id, "op", "generate", "tokens", turn2, "max_tokens",
                                    1000, "temperature", 0, "stream", true, "session", "s1")));
    bool streaming = false;
    while (auto e = next(b.conn())) {
        ASSERT_EQ(e->u("id"), busy_id);
        ASSERT_FALSE(e->terminal()) << "the long request ended before the busy checks";
        if (e->str("event") == "token") {
            streaming = true;
            break;
        }
    }
    ASSERT_TRUE(streaming);
    const gen_result second = b.generate(turn1, "session", "s1");
    EXPECT_EQ(second.event, "error");
    EXPECT_EQ(second.code, "session_busy") << second.outcome();
    auto del_busy = b.op("session_delete", "session", "s1");
    ASSERT_TRUE(del_busy.has_value());
    EXPECT_EQ(del_busy->str("event"), "error");
    EXPECT_EQ(del_busy->str("code"), "session_busy");
    ASSERT_TRUE(b.conn().send(frame("id", b.take_id(), "op", "cancel", "target", busy_id)));
    std::optional<event> busy_end = b.wait_terminal(busy_id);
    ASSERT_TRUE(busy_end.has_value());
    EXPECT_EQ(busy_end->str("reason"), "cancelled") << "a cancelled request saves nothing";
    EXPECT_EQ(b.stats().sched("session_busy"), 2u);

    // Delete: true, then false; the index forgets the session.
    auto del1 = b.op("session_delete", "session", "s1");
    ASSERT_TRUE(del1.has_value());
    EXPECT_EQ(del1->str("event"), "done");
    const auto* deleted1 = field(del1->o(), "deleted");
    EXPECT_TRUE(deleted1 && deleted1->type == msgpack::type::BOOLEAN && deleted1->via.boolean);
    auto del2 = b.op("session_delete", "session", "s1");
    ASSERT_TRUE(del2.has_value());
    EXPECT_EQ(del2->str("event"), "done");
    const auto* deleted2 = field(del2->o(), "deleted");
    EXPECT_TRUE(deleted2 && deleted2->type == msgpack::type::BOOLEAN && !deleted2->via.boolean);
    EXPECT_EQ(b.stats().disk("sessions"), 0u);
    b.expect_idle();
    EXPECT_EQ(b.stop(), 0);
    EXPECT_TRUE(files_in(dir, ".kv").empty()) << "the session file was removed";

    // After the delete and a restart nothing is restored (no automatic prefix was saved).
    server c;
    ASSERT_TRUE(c.start(tmp.path(), {stories, dir, ""}));
    auto sc = c.stats();
    EXPECT_EQ(sc.disk("sessions"), 0u);
    EXPECT_EQ(sc.disk("files"), 0u);
    const gen_result r3 = c.generate(turn2, "session", "s1");
    expect_same_output(r3, want2, "turn 2 after the delete");
    EXPECT_EQ(r3.cached, 0u);
    EXPECT_EQ(c.stats().disk("restores"), 0u);
    c.expect_idle();
}

// =================================================================================================
// 3. Corrupt and foreign files are never loaded.
// =================================================================================================

// Runs a server with `cfg` on an empty kv dir, generates `prompt`, stops it (flush) and returns
// the one .kv file it wrote.
std::string produce_file(const temp_dir& tmp, const std::string& name, const server_config& cfg,
                         const tokens_t& prompt) {
    server s;
    if (!s.start(tmp.path(), cfg)) return {};
    gen_result r = s.generate(prompt);
    EXPECT_TRUE(r.finished()) << name << ": " << r.outcome();
    EXPECT_TRUE(s.wait_saves_settled(1));
    EXPECT_EQ(s.stats().disk("saves"), 1u) << name;
    s.expect_idle();
    EXPECT_EQ(s.stop(), 0);
    auto files = files_in(cfg.kv_dir, ".kv");
    EXPECT_EQ(files.size(), 1u) << name;
    return files.empty() ? std::string() : cfg.kv_dir + "/" + files[0];
}

TEST(kv_persistence, corrupt_and_foreign_files_are_never_loaded) {
    REQUIRE_STORIES();
    temp_dir tmp;
    const unsigned seed = std::random_device{}();
    std::printf("kv_persistence corrupt files: seed %u\n", seed);
    std::mt19937 rng(seed);
    const std::string good_dir = tmp.sub("good");
    const std::string no_cache = "[scheduler]\nprefix_cache = false\n";

    // Valid files of this model, and from-scratch outputs. P, Q1, Q2: distinct prompts; R1
    // shares P's 2 blocks and goes on for 2 more, so its file W shadows P's file V in the index.
    server f;
    ASSERT_TRUE(f.start(tmp.path(), {stories, good_dir, no_cache}));
    const tokens_t p = prompt_of(f, story_texts[0]);
    const tokens_t q1 = prompt_of(f, story_texts[2]);
    const tokens_t q2 = prompt_of(f, story_texts[3]);
    tokens_t r1(p.begin(), p.begin() + 2 * block_tokens);
    tokens_t tail = f.tokenize(story_texts[4], false);
    ASSERT_GE(tail.size(), 37u);
    r1.insert(r1.end(), tail.begin(), tail.begin() + 37);  // 69 ids: 4 full blocks and 5
    // A session request saves no automatic prefix: R1 computed from scratch before V exists.
    const gen_result want_r1 = f.generate(r1, "session", "ref");
    const gen_result want_p = f.generate(p);
    const gen_result want_q1 = f.generate(q1);
    const gen_result want_q2 = f.generate(q2);
    for (const auto* w : {&want_r1, &want_p, &want_q1, &want_q2}) {
        ASSERT_TRUE(w->finished()) << w->outcome();
        EXPECT_EQ(w->cached, 0u);
    }
    ASSERT_TRUE(f.wait_saves_settled(4));
    const gen_result r1_from_v = f.generate(r1);  // restores V's 2 blocks, then saves W
    expect_same_output(r1_from_v, want_r1, "R1 restored from P's file");
    EXPECT_EQ(r1_from_v.cached, 2u * block_tokens);
    ASSERT_TRUE(f.wait_saves_settled(5));
    EXPECT_EQ(f.stats().disk("saves"), 5u);
    f.expect_idle();
    EXPECT_EQ(f.stop(), 0);
    const std::string v_path = file_for(good_dir, p, 2);
    const std::string w_path = file_for(good_dir, r1, 4);
    const std::string q1_path = file_for(good_dir, q1, 2);
    const std::string q2_path = file_for(good_dir, q2, 2);
    ASSERT_FALSE(v_path.empty() || w_path.empty() || q1_path.empty() || q2_path.empty());

    // Files this model must refuse, written by real servers: another model of the same shape
    // (only the fingerprint differs), another block size, another dtype.
    const std::string other_model = tmp.sub("other.gguf");
    std::string mk = "'" + std::string(ORDO_MODEL_BIN) + "' mk --out " + other_model +
                     " --n-embd 64 --n-layer 5 --n-head 8 --n-head-kv 4 --n-ff 172 --vocab-from " +
                     stories + " --type f32 --seed 7 --ctx 512 > /dev/null";
    ASSERT_EQ(std::system(mk.c_str()), 0);
    const std::string other_file =
        produce_file(tmp, "other model", {other_model, tmp.sub("other"), ""}, p);
    const std::string bt32_file = produce_file(
        tmp, "kv_block_tokens 32", {stories, tmp.sub("bt32"), "[gpu]\nkv_block_tokens = 32\n"}, p);
    const std::string f32_file = produce_file(
        tmp, "kv_dtype f32", {stories, tmp.sub("f32"), "[gpu]\nkv_dtype = \"f32\"\n"}, p);
    ASSERT_FALSE(other_file.empty() || bt32_file.empty() || f32_file.empty());

    // The directory the next server scans: V and the payload-corrupt ones under their own
    // names, every other variant under a fresh valid name, with the code the scan must give it.
    const std::string dir = tmp.sub("scan");
    fs::create_directories(dir);
    const std::string v = read_bytes(v_path);
    const file_layout vl = layout_of(v);
    ASSERT_EQ(vl.n_blocks, 2u);
    ASSERT_EQ(vl.size, v.size());
    std::map<std::string, std::string> refused;  // stem -> expected code ("" = any header code)
    auto plant = [&](const std::string& bytes, const std::string& code) {
        std::string stem = random_prefix_name(rng);
        write_bytes(dir + "/" + stem + ".kv", bytes);
        refused[stem] = code;
    };
    for (int i = 0; i < 4; i++) {  // header: magic, version or checksum refuses it
        std::string b = v;
        flip_bit(b, rng() % header_bytes, rng);
        plant(b, "");
    }
    {
        std::string b = v;
        flip_bit(b, header_bytes + rng() % (4 * vl.n_tokens), rng);
        plant(b, "kv_tokens_checksum");
    }
    for (uint64_t cut : {uint64_t{0}, uint64_t{64}, uint64_t{header_bytes}, vl.table, vl.payload,
                         vl.payload + vl.block_bytes + 123, vl.size - 1}) {
        plant(v.substr(0, cut), "kv_truncated");
    }
    plant(v + "x", "kv_oversize");
    {
        std::string b = v;  // a newer format whose header checksum is right
        put_le(b, version_offset, 4, 2);
        put_le(b, header_checksum_offset, 8, XXH3_64bits(b.data(), header_checksum_offset));
        plant(b, "kv_version");
    }
    plant(read_bytes(other_file), "kv_fingerprint");
    plant(read_bytes(bt32_file), "kv_block_tokens");
    plant(read_bytes(f32_file), "kv_dtype");
    const std::string v_name = fs::path(v_path).filename();
    const std::string w_name = fs::path(w_path).filename();
    const std::string q1_name = fs::path(q1_path).filename();
    const std::string q2_name = fs::path(q2_path).filename();
    write_bytes(dir + "/" + v_name, v);
    set_mtime(dir + "/" + v_name, 100s);  // older than W: W's keys win the shared blocks
    std::string w = read_bytes(w_path);
    const file_layout wl = layout_of(w);
    flip_bit(w, wl.payload + 3 * wl.block_bytes + rng() % wl.block_bytes, rng);  // last block
    write_bytes(dir + "/" + w_name, w);
    set_mtime(dir + "/" + w_name, 10s);
    std::string qa = read_bytes(q1_path);
    flip_bit(qa, layout_of(qa).table + rng() % 8, rng);  // block 0's checksum-table entry
    write_bytes(dir + "/" + q1_name, qa);
    std::string qb = read_bytes(q2_path);
    flip_bit(qb, layout_of(qb).payload + rng() % layout_of(qb).block_bytes, rng);  // block 0
    write_bytes(dir + "/" + q2_name, qb);
    // Never followed, never moved: a directory, a symlink (to a valid file), a foreign name.
    fs::create_directories(dir + "/x.kv");
    write_bytes(dir + "/x.kv/inside", "keep");
    fs::create_symlink(v_path, dir + "/y.kv");
    write_bytes(dir + "/notes.txt", "not ours");
    const std::string leftover = random_prefix_name(rng) + ".tmp";  // a crashed write
    write_bytes(dir + "/" + leftover, v.substr(0, 1000));

    // The scan: every refused file in quarantine/ under its code; the rest left alone.
    server s;
    ASSERT_TRUE(s.start(tmp.path(), {stories, dir, no_cache}));
    auto scanned = s.stats();
    EXPECT_EQ(scanned.disk("quarantined"), refused.size());
    EXPECT_EQ(scanned.disk("ignored"), 3u) << "x.kv, y.kv and notes.txt";
    EXPECT_EQ(scanned.disk("files"), 4u) << "V, W, Q1, Q2: their payload is checked on restore";
    EXPECT_EQ(scanned.disk_error("kv_truncated"), 7u);
    EXPECT_EQ(scanned.disk_error("kv_oversize"), 1u);
    EXPECT_EQ(scanned.disk_error("kv_tokens_checksum"), 1u);
    EXPECT_EQ(scanned.disk_error("kv_fingerprint"), 1u);
    EXPECT_EQ(scanned.disk_error("kv_block_tokens"), 1u);
    EXPECT_EQ(scanned.disk_error("kv_dtype"), 1u);
    EXPECT_EQ(scanned.disk_error("kv_bad_magic") + scanned.disk_error("kv_version") +
                  scanned.disk_error("kv_header_checksum") + scanned.disk_error("kv_bad_header"),
              5u)
        << "4 header flips and the newer version";
    EXPECT_GE(scanned.disk_error("kv_version"), 1u);
    const auto quarantined = files_in(dir + "/quarantine", ".kv");
    EXPECT_EQ(quarantined.size(), refused.size());
    for (const auto& [stem, code] : refused) {
        EXPECT_FALSE(fs::exists(dir + "/" + stem + ".kv")) << stem << " (" << code << ") stayed";
        auto q = std::find_if(quarantined.begin(), quarantined.end(),
                              [&](const std::string& n) { return n.starts_with(stem + "."); });
        ASSERT_NE(q, quarantined.end()) << stem << " is not in quarantine/";
        if (!code.empty()) {
            EXPECT_NE(q->find("." + code + "."), std::string::npos) << *q;
        }
    }
    EXPECT_TRUE(fs::is_directory(fs::symlink_status(dir + "/x.kv")));
    EXPECT_EQ(read_bytes(dir + "/x.kv/inside"), "keep");
    EXPECT_TRUE(fs::is_symlink(dir + "/y.kv"));
    EXPECT_EQ(fs::read_symlink(dir + "/y.kv"), v_path);
    EXPECT_EQ(read_bytes(v_path), v) << "the symlink's target was touched";
    EXPECT_EQ(read_bytes(dir + "/notes.txt"), "not ours");
    EXPECT_FALSE(fs::exists(dir + "/" + leftover)) << "the scan deletes .tmp leftovers";

    // R1 finds W (its 4 blocks): the restore verifies every block, refuses the last, quarantines
    // W; with kv.restore_retry_max = 1 the request looks again and restores V's 2 blocks (which
    // W shadowed), then computes the rest. Cancelled, it saves nothing that could hide what
    // follows.
    const uint64_t r1_id = s.take_id();
    ASSERT_TRUE(s.conn().send(frame("id", r1_id, "op", "generate", "tokens", r1, "max_tokens", 1000,
                                    "temperature", 0, "stream", true)));
    auto first_event = next(s.conn());
    ASSERT_TRUE(first_event.has_value());
    EXPECT_EQ(first_event->str("event"), "token");
    ASSERT_TRUE(s.conn().send(frame("id", s.take_id(), "op", "cancel", "target", r1_id)));
    auto r1_end = s.wait_terminal(r1_id);
    ASSERT_TRUE(r1_end.has_value());
    EXPECT_EQ(r1_end->str("reason"), "cancelled");
    auto after_w = s.stats();
    EXPECT_EQ(after_w.disk("restores"), 1u) << "the retry restores V";
    EXPECT_EQ(after_w.sched("disk_lookups"), 2u);
    EXPECT_EQ(after_w.disk("restore_failures"), 1u);
    EXPECT_EQ(after_w.disk_error("kv_block_checksum"), 1u);
    EXPECT_EQ(after_w.disk("files"), 3u);

    // P: V, which W shadowed, is still found and restored.
    const gen_result got_p = s.generate(p);
    expect_same_output(got_p, want_p, "P from V");
    EXPECT_EQ(got_p.cached, 2u * block_tokens) << "V is valid and on disk but was not restored";
    // Q1, Q2: a bad checksum-table entry and a bad block 0, caught by the restore.
    const gen_result got_q1 = s.generate(q1);
    expect_same_output(got_q1, want_q1, "Q1 (bad table entry)");
    EXPECT_EQ(got_q1.cached, 0u);
    const gen_result got_q2 = s.generate(q2);
    expect_same_output(got_q2, want_q2, "Q2 (bad block 0)");
    EXPECT_EQ(got_q2.cached, 0u);
    // R1 again, in full: V's 2 blocks restored, the rest computed.
    const gen_result got_r1 = s.generate(r1);
    expect_same_output(got_r1, want_r1, "R1 after W's quarantine");
    EXPECT_EQ(got_r1.cached, 2u * block_tokens);
    auto end = s.stats();
    EXPECT_EQ(end.disk("restores"), 3u) << "only V restores (R1's retry, P, R1 again)";
    EXPECT_EQ(end.disk("restore_failures"), 3u);
    EXPECT_EQ(end.disk_error("kv_block_checksum"), 3u);
    EXPECT_EQ(end.disk("quarantined"), refused.size() + 3);
    EXPECT_EQ(end.sched("disk_restore_failures"), 3u);
    const auto q_after = files_in(dir + "/quarantine", ".kv");
    EXPECT_EQ(q_after.size(), refused.size() + 3);
    for (const auto& name : {w_name, q1_name, q2_name}) {
        std::string stem = name.substr(0, name.size() - 3);
        EXPECT_TRUE(std::any_of(
            q_after.begin(), q_after.end(),
            [&](const std::string& n) { return n.starts_with(stem + ".kv_block_checksum."); }))
            << name << " is not quarantined as kv_block_checksum";
    }
    EXPECT_EQ(read_bytes(dir + "/" + v_name), v);
    s.expect_idle();
}

// =================================================================================================
// 4. kill -9 while saves are being written.
// =================================================================================================

uint64_t env_u64(const char* name, uint64_t fallback) {
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}

TEST(kv_persistence, kill_9_during_saves) {
    REQUIRE_STORIES();
    constexpr size_t per_round = 4;  // concurrent generates per round; the first is a session
    const uint64_t rounds = env_u64("ORDO_KV_SOAK_ITERS", 4);
    const auto seed = static_cast<unsigned>(env_u64("ORDO_KV_SOAK_SEED", std::random_device{}()));
    std::printf("kv_persistence kill -9: %llu rounds, seed %u (ORDO_KV_SOAK_SEED replays it)\n",
                static_cast<unsigned long long>(rounds), seed);
    std::mt19937 rng(seed);
    temp_dir tmp;
    const std::string dir = tmp.sub("kv");

    // Every round's prompts, and what a server without KV persistence answers to each.
    std::vector<std::vector<tokens_t>> prompts(rounds + 1);
    std::vector<std::vector<gen_result>> want(rounds + 1);
    {
        server ref;
        ASSERT_TRUE(ref.start(tmp.path(), {stories, "", ""}));
        for (uint64_t r = 0; r < rounds; r++) {
            for (size_t i = 0; i < per_round; i++) {
                size_t len = 40 + rng() % 48;
                if (len % block_tokens == 0) len++;
                prompts[r].push_back(random_prompt(ref, rng, len));
            }
            // A round at a time: server.max_inflight_per_connection bounds one connection.
            want[r] = ref.generate_all(prompts[r]);
            for (const auto& w : want[r]) ASSERT_TRUE(w.finished()) << w.outcome();
        }
        ref.expect_idle();
    }

    uint64_t restored_total = 0;
    for (uint64_t round = 0; round <= rounds; round++) {
        SCOPED_TRACE("round " + std::to_string(round) + ", seed " + std::to_string(seed));
        // A leftover of a crashed write, planted so every scan has one to delete.
        const std::string planted = dir + "/" + random_prefix_name(rng) + ".tmp";
        if (round > 0) write_bytes(planted, "torn");
        std::set<std::string> before;
        if (fs::exists(dir)) {
            for (const auto& n : files_in(dir, ".kv")) before.insert(n);
        }
        const size_t quarantined_before =
            fs::exists(dir + "/quarantine") ? files_in(dir + "/quarantine", ".kv").size() : 0;

        server s;
        ASSERT_TRUE(s.start(tmp.path(), {stories, dir, ""}));
        // The scan: no .tmp survives; every .kv left verifies, every other one is quarantined.
        EXPECT_TRUE(files_in(dir, ".tmp").empty()) << "a .tmp survived the scan";
        auto scanned = s.stats();
        const auto after = files_in(dir, ".kv");
        for (const auto& n : after) {
            EXPECT_EQ(kv_inspect_verify(dir + "/" + n), 0) << n << " is left but does not verify";
        }
        const size_t newly_quarantined =
            files_in(dir + "/quarantine", ".kv").size() - quarantined_before;
        EXPECT_EQ(scanned.disk("quarantined"), newly_quarantined);
        EXPECT_EQ(before.size(), after.size() + newly_quarantined)
            << "a .kv vanished without being quarantined";
        EXPECT_EQ(scanned.disk("files"), after.size());

        // The previous round's prompts answer what a server without KV answers.
        if (round > 0) {
            auto got = s.generate_all(prompts[round - 1]);
            for (size_t i = 0; i < got.size(); i++) {
                expect_same_output(
                    got[i], want[round - 1][i],
                    "round " + std::to_string(round - 1) + " prompt " + std::to_string(i));
                if (got[i].cached != UINT64_MAX) restored_total += got[i].cached;
            }
            EXPECT_EQ(s.stats().disk("restore_failures"), 0u);
        }
        if (round == rounds) {
            s.expect_idle();
            break;
        }

        // This round's prompts at once, the first as a session; SIGKILL after a random number
        // of them ended (their saves start then) and a random few milliseconds more.
        const uint64_t first = s.send_all(prompts[round], "soak" + std::to_string(round));
        const size_t ends_before_kill = rng() % (per_round + 1);
        // Up to 2 ms (a save's copy and write) or up to 20 ms (the other requests' ends).
        const auto delay = std::chrono::microseconds(rng() % (rng() % 2 ? 2000 : 20000));
        size_t ended = 0;
        while (ended < ends_before_kill) {
            auto e = next(s.conn());
            ASSERT_TRUE(e.has_value()) << "no event before the kill";
            if (e->terminal() && e->u("id") >= first) ended++;
        }
        std::this_thread::sleep_for(delay);
        EXPECT_EQ(s.kill9(), 128 + SIGKILL);
        std::printf("round %llu: SIGKILL after %zu of %zu ended + %lld us: %zu .kv, %zu .tmp\n",
                    static_cast<unsigned long long>(round), ends_before_kill, per_round,
                    static_cast<long long>(delay.count()), files_in(dir, ".kv").size(),
                    files_in(dir, ".tmp").size());
    }
    std::printf("kv_persistence kill -9: %llu tokens restored over the rounds\n",
                static_cast<unsigned long long>(restored_total));
}

// =================================================================================================
// 5. Disk faults: ENOSPC and a read-only file system (tmpfs mounts; root only).
// =================================================================================================

class kv_disk_faults : public ::testing::Test {
protected:
    // Mounts a tmpfs of `size` on a fresh directory; false (with the reason) when not allowed.
    bool mount_tmpfs(const std::string& size, std::string& why) {
        if (::geteuid() != 0) {
            why = "not running as root";
            return false;
        }
        _mnt = _tmp.sub("mnt");
        fs::create_directories(_mnt);
        std::string opts = "size=" + size + ",mode=0755";
        if (::mount("ordo-kv-test", _mnt.c_str(), "tmpfs", 0, opts.c_str()) != 0) {
            why = std::string("mount -t tmpfs: ") + std::strerror(errno);
            return false;
        }
        _mounted = true;
        return true;
    }
    bool remount_read_only() {
        return ::mount("ordo-kv-test", _mnt.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, nullptr) == 0;
    }
    void TearDown() override {
        if (_mounted && ::umount(_mnt.c_str()) != 0) {
            EXPECT_EQ(::umount2(_mnt.c_str(), MNT_DETACH), 0) << std::strerror(errno);
        }
        _mounted = false;
    }

    temp_dir _tmp;
    std::string _mnt;
    bool _mounted = false;
};

TEST_F(kv_disk_faults, enospc_then_read_only) {
    REQUIRE_STORIES();
    // One 2-block file of stories260K is 20,752 bytes (6 pages): 32 KiB takes one, not two.
    std::string why;
    if (!mount_tmpfs("32k", why)) {
        std::fprintf(stderr, "\n*** SKIPPING disk faults: %s ***\n\n", why.c_str());
        GTEST_SKIP() << "disk faults need a tmpfs mount: " << why;
    }
    const std::string dir = _mnt + "/kv";
    // No memory prefix cache: a repeated prompt is restored from disk, not from memory.
    const server_config cfg{stories, dir, "[scheduler]\nprefix_cache = false\n"};
    gen_result first_p1, first_p2;
    tokens_t p1, p2;
    {
        server s;
        ASSERT_TRUE(s.start(_tmp.path(), cfg));
        EXPECT_TRUE(s.stats().disk_flag("persisting"));
        p1 = prompt_of(s, story_texts[0]);
        p2 = prompt_of(s, story_texts[5]);
        first_p1 = s.generate(p1);
        ASSERT_TRUE(first_p1.finished()) << first_p1.outcome();
        ASSERT_TRUE(s.wait_saves_settled(1));
        EXPECT_EQ(s.stats().disk("saves"), 1u);
        // The second file does not fit: ENOSPC turns persistence off; serving goes on.
        first_p2 = s.generate(p2);
        ASSERT_TRUE(first_p2.finished()) << first_p2.outcome();
        ASSERT_TRUE(s.wait_saves_settled(2));
        auto full = s.stats();
        EXPECT_EQ(full.disk("saves"), 1u);
        EXPECT_EQ(full.disk("save_failures"), 1u);
        EXPECT_GE(full.disk_error("kv_no_space"), 1u);
        EXPECT_FALSE(full.disk_flag("persisting"));
        const std::string reason = full.disk_str("reason");
        EXPECT_NE(reason.find("kv_no_space"), std::string::npos) << reason;
        EXPECT_NE(reason.find("No space left on device"), std::string::npos) << reason;
        event h = s.health();
        EXPECT_EQ(h.str("status"), "ok");
        EXPECT_EQ(h.str("reason"), reason) << "health does not say why persistence is off";
        EXPECT_TRUE(files_in(dir, ".tmp").empty()) << "a failed write left its .tmp";
        // Restores of what is on disk go on; outputs stay right; nothing more is written.
        const gen_result again_p1 = s.generate(p1);
        expect_same_output(again_p1, first_p1, "P1 restored with persistence off");
        EXPECT_EQ(again_p1.cached, 2u * block_tokens);
        const gen_result again_p2 = s.generate(p2);
        expect_same_output(again_p2, first_p2, "P2 with persistence off");
        EXPECT_EQ(again_p2.cached, 0u);
        ASSERT_TRUE(s.wait_saves_settled(4));
        auto end = s.stats();
        EXPECT_EQ(end.disk("restores"), 1u);
        EXPECT_EQ(end.disk("saves"), 1u);
        EXPECT_EQ(end.disk("save_failures"), 1u) << "no write was tried with persistence off";
        EXPECT_GE(end.disk_error("kv_persistence_off"), 1u);
        s.expect_idle();
        EXPECT_EQ(s.stop(), 0);
    }
    ASSERT_EQ(files_in(dir, ".kv").size(), 1u);

    // The same file system read-only: the server starts, persistence is off and says why, and
    // the valid file is still restored.
    ASSERT_TRUE(remount_read_only()) << std::strerror(errno);
    server s;
    ASSERT_TRUE(s.start(_tmp.path(), cfg));
    auto ro = s.stats();
    EXPECT_FALSE(ro.disk_flag("persisting"));
    EXPECT_EQ(ro.disk("files"), 1u);
    const std::string reason = ro.disk_str("reason");
    EXPECT_NE(reason.find("kv_read_only"), std::string::npos) << reason;
    event h = s.health();
    EXPECT_EQ(h.str("status"), "ok");
    EXPECT_EQ(h.str("reason"), reason);
    const gen_result ro_p1 = s.generate(p1);
    expect_same_output(ro_p1, first_p1, "P1 from a read-only directory");
    EXPECT_EQ(ro_p1.cached, 2u * block_tokens);
    const gen_result ro_p2 = s.generate(p2);
    expect_same_output(ro_p2, first_p2, "P2 on a read-only directory");
    ASSERT_TRUE(s.wait_saves_settled(2));
    auto end = s.stats();
    EXPECT_EQ(end.disk("restores"), 1u);
    EXPECT_EQ(end.disk("saves"), 0u);
    EXPECT_EQ(end.disk("save_failures"), 0u);
    s.expect_idle();
    EXPECT_EQ(s.stop(), 0);
}

// =================================================================================================
// 6. A gpu fault on the first step after a restore.
// =================================================================================================

TEST(kv_persistence, gpu_fault_right_after_a_restore) {
    REQUIRE_STORIES();
    temp_dir tmp;
    const std::string dir = tmp.sub("kv");
    // No memory prefix cache: the request after the fault goes to disk again.
    const std::string extra = "[scheduler]\nprefix_cache = false\n[fault]\nenabled = true\n";
    tokens_t p, q;
    gen_result want_p, want_q;
    {
        server a;
        ASSERT_TRUE(a.start(tmp.path(), {stories, dir, extra}));
        p = prompt_of(a, story_texts[0]);
        q = prompt_of(a, story_texts[3]);
        want_p = a.generate(p);
        want_q = a.generate(q);
        ASSERT_TRUE(want_p.finished() && want_q.finished());
        EXPECT_EQ(want_p.cached + want_q.cached, 0u);
        a.expect_idle();
        EXPECT_EQ(a.stop(), 0);
    }
    ASSERT_EQ(files_in(dir, ".kv").size(), 2u);

    server b;
    ASSERT_TRUE(b.start(tmp.path(), {stories, dir, extra}));
    struct fault_case {
        const char* kind;
        const tokens_t* prompt;
        const gen_result* want;
    };
    uint64_t k = 0;  // faults so far
    for (const fault_case& fc :
         {fault_case{"nan_logits", &p, &want_p}, fault_case{"device_lost", &q, &want_q}}) {
        SCOPED_TRACE(fc.kind);
        k++;
        auto armed = b.op("fault", "kind", fc.kind, "phase", "prefill", "count", 1);
        ASSERT_TRUE(armed.has_value());
        ASSERT_EQ(armed->str("event"), "done") << armed->str("message");
        // Restore, the first prefill fails, the entry is quarantined, one recompute.
        const gen_result got = b.generate(*fc.prompt);
        expect_same_output(got, *fc.want, "after the fault");
        ASSERT_TRUE(b.wait_saves_settled(2 * k - 1));  // the recompute saves the prefix again
        auto st = b.stats();
        EXPECT_EQ(st.sched("disk_restores"), 2 * k - 1);
        EXPECT_EQ(st.sched("disk_invalidations"), k);
        EXPECT_EQ(st.sched("failures"), k);
        EXPECT_EQ(st.sched("retries"), k);
        EXPECT_EQ(st.sched("gpu_failed"), 0u);
        EXPECT_EQ(st.disk("quarantined"), k);
        EXPECT_EQ(st.disk_error("kv_step_failed"), k);
        EXPECT_EQ(st.disk("restore_failures"), 0u);
        EXPECT_EQ(st.disk("saves"), k) << "the recomputed prefix is written again";
        const auto quarantined = files_in(dir + "/quarantine", ".kv");
        EXPECT_EQ(quarantined.size(), k);
        for (const auto& name : quarantined) {
            EXPECT_NE(name.find(".kv_step_failed."), std::string::npos) << name;
        }
        // The same request again restores from the file the recompute wrote, never from the
        // quarantined one, and nothing fails.
        const gen_result again = b.generate(*fc.prompt);
        expect_same_output(again, *fc.want, "the request after");
        EXPECT_EQ(again.cached, 2u * block_tokens);
        ASSERT_TRUE(b.wait_saves_settled(2 * k));  // already on disk: skipped
        auto st2 = b.stats();
        EXPECT_EQ(st2.sched("disk_restores"), 2 * k);
        EXPECT_EQ(st2.sched("disk_invalidations"), k);
        EXPECT_EQ(st2.sched("failures"), k);
        EXPECT_EQ(st2.disk("quarantined"), k);
        EXPECT_EQ(st2.disk("restore_failures"), 0u);
        EXPECT_EQ(st2.disk("saves"), k);
    }
    auto end = b.stats();
    EXPECT_EQ(end.gpu("nan_logits"), 1u);
    EXPECT_EQ(end.gpu("device_lost"), 1u);
    b.expect_idle();
}

// =================================================================================================
// 8. kv faults through the `fault` op.
// =================================================================================================

// [fault] enabled; no memory prefix cache, so a repeated prompt goes to disk.
const std::string kv_fault_extra = "[scheduler]\nprefix_cache = false\n[fault]\nenabled = true\n";
// docs/protocol.md "fault": the exit status of kv_torn_exit (kv::kv_torn_exit_code).
constexpr int kv_torn_exit_status = 86;

// Arms a kv fault on `s` and expects fault_done{armed: kind}.
void arm_kv_fault(server& s, const std::string& kind) {
    auto armed = s.op("fault", "kind", kind, "count", 1);
    ASSERT_TRUE(armed.has_value()) << kind;
    ASSERT_EQ(armed->str("event"), "done") << kind << ": " << armed->str("message");
    EXPECT_EQ(armed->str("armed"), kind);
}

// What a server without KV persistence answers for `prompt`.
gen_result from_scratch(const std::string& cfg_dir, const std::string& text, tokens_t& prompt) {
    server s;
    if (!s.start(cfg_dir, {stories, "", ""})) return {};
    prompt = prompt_of(s, text);
    gen_result g = s.generate(prompt);
    EXPECT_TRUE(g.finished()) << g.outcome();
    EXPECT_EQ(s.stop(), 0);
    return g;
}

// kv_enospc and kv_eio: the save fails as the disk would and persistence turns off.
void expect_disk_fault_path(const std::string& kind, const std::string& code,
                            const std::string& strerror_text) {
    temp_dir tmp;
    const std::string dir = tmp.sub("kv");
    tokens_t p, q;
    const gen_result want_p = from_scratch(tmp.path(), story_texts[0], p);
    server s;
    ASSERT_TRUE(s.start(tmp.path(), {stories, dir, kv_fault_extra}));
    q = prompt_of(s, story_texts[1]);
    arm_kv_fault(s, kind);
    expect_same_output(s.generate(p), want_p, "the request whose save fails");
    ASSERT_TRUE(s.wait_saves_settled(1));
    auto st = s.stats();
    EXPECT_EQ(st.disk("saves"), 0u);
    EXPECT_EQ(st.disk("save_failures"), 1u);
    EXPECT_EQ(st.disk_error(code), 1u);
    EXPECT_FALSE(st.disk_flag("persisting"));
    const std::string reason = st.disk_str("reason");
    EXPECT_NE(reason.find(code), std::string::npos) << reason;
    EXPECT_NE(reason.find(strerror_text), std::string::npos) << reason;
    event h = s.health();
    EXPECT_EQ(h.str("status"), "ok");
    EXPECT_EQ(h.str("reason"), reason) << "health does not say why persistence is off";
    EXPECT_TRUE(files_in(dir, ".tmp").empty()) << "the failed write left its .tmp";
    EXPECT_TRUE(files_in(dir, ".kv").empty());
    // Serving goes on; nothing more is written while persistence is off.
    expect_same_output(s.generate(p), want_p, "the same request with persistence off");
    const gen_result got_q = s.generate(q);
    EXPECT_TRUE(got_q.finished()) << got_q.outcome();
    ASSERT_TRUE(s.wait_saves_settled(3));
    EXPECT_EQ(s.stats().disk("save_failures"), 1u);
    s.expect_idle();
    EXPECT_EQ(s.stop(), 0);
}

TEST(kv_faults, enospc_turns_persistence_off) {
    REQUIRE_STORIES();
    expect_disk_fault_path("kv_enospc", "kv_no_space", "No space left on device");
    // Without --kv-dir there is no kv actor to arm.
    temp_dir tmp;
    server s;
    ASSERT_TRUE(s.start(tmp.path(), {stories, "", kv_fault_extra}));
    auto refused = s.op("fault", "kind", "kv_enospc");
    ASSERT_TRUE(refused.has_value());
    EXPECT_EQ(refused->str("event"), "error");
    EXPECT_EQ(refused->str("code"), "bad_request");
    EXPECT_NE(refused->str("message").find("[kv] enabled"), std::string::npos);
    EXPECT_EQ(s.stop(), 0);
}

TEST(kv_faults, eio_turns_persistence_off) {
    REQUIRE_STORIES();
    expect_disk_fault_path("kv_eio", "kv_io_error", "Input/output error");
}

TEST(kv_faults, torn_exit_leaves_nothing_loadable) {
    REQUIRE_STORIES();
    temp_dir tmp;
    const std::string dir = tmp.sub("kv");
    tokens_t p;
    const gen_result want_p = from_scratch(tmp.path(), story_texts[2], p);
    {
        server a;
        ASSERT_TRUE(a.start(tmp.path(), {stories, dir, kv_fault_extra}));
        arm_kv_fault(a, "kv_torn_exit");
        // The process may die before or after the request's done event: not waited for.
        a.send_all({p});
        EXPECT_EQ(a.wait_exit(), kv_torn_exit_status);
    }
    EXPECT_EQ(files_in(dir, ".tmp").size(), 1u) << "the crash did not leave half a .tmp";
    EXPECT_TRUE(files_in(dir, ".kv").empty());

    server b;
    ASSERT_TRUE(b.start(tmp.path(), {stories, dir, kv_fault_extra}));
    EXPECT_TRUE(files_in(dir, ".tmp").empty()) << "the scan did not delete the torn .tmp";
    auto scanned = b.stats();
    EXPECT_EQ(scanned.disk("files"), 0u);
    EXPECT_EQ(scanned.disk("quarantined"), 0u);
    const gen_result got = b.generate(p);
    expect_same_output(got, want_p, "after the torn save");
    EXPECT_EQ(got.cached, 0u);
    ASSERT_TRUE(b.wait_saves_settled(1));
    EXPECT_EQ(b.stats().disk("saves"), 1u);
    b.expect_idle();
    EXPECT_EQ(b.stop(), 0);
}

TEST(kv_faults, flip_read_quarantines_and_recomputes) {
    REQUIRE_STORIES();
    temp_dir tmp;
    const std::string dir = tmp.sub("kv");
    tokens_t p;
    const gen_result want_p = from_scratch(tmp.path(), story_texts[3], p);
    {
        server a;
        ASSERT_TRUE(a.start(tmp.path(), {stories, dir, kv_fault_extra}));
        expect_same_output(a.generate(p), want_p, "the first run");
        ASSERT_TRUE(a.wait_saves_settled(1));
        EXPECT_EQ(a.stop(), 0);
    }
    ASSERT_EQ(files_in(dir, ".kv").size(), 1u);
    server b;
    ASSERT_TRUE(b.start(tmp.path(), {stories, dir, kv_fault_extra}));
    arm_kv_fault(b, "kv_flip_read");
    const gen_result got = b.generate(p);
    expect_same_output(got, want_p, "the request whose restore read a flipped bit");
    EXPECT_EQ(got.cached, 0u);
    ASSERT_TRUE(b.wait_saves_settled(1));  // the recompute writes the prefix again
    auto st = b.stats();
    EXPECT_EQ(st.disk("restores"), 0u);
    EXPECT_EQ(st.disk("restore_failures"), 1u);
    EXPECT_EQ(st.disk("quarantined"), 1u);
    EXPECT_EQ(st.disk_error("kv_block_checksum"), 1u);
    EXPECT_TRUE(st.disk_flag("persisting"));
    const auto quarantined = files_in(dir + "/quarantine", ".kv");
    ASSERT_EQ(quarantined.size(), 1u);
    EXPECT_NE(quarantined[0].find(".kv_block_checksum."), std::string::npos) << quarantined[0];
    // The fault was spent: the file the recompute wrote restores.
    const gen_result again = b.generate(p);
    expect_same_output(again, want_p, "the request after");
    EXPECT_EQ(again.cached, 2u * block_tokens);
    EXPECT_EQ(b.stats().disk("restores"), 1u);
    b.expect_idle();
    EXPECT_EQ(b.stop(), 0);
}

// Starts `s`, saves session "s1" (one turn) and arms kv_stall_unlink for `stall_ms`: the next
// session_delete's unlink is held.
void start_with_a_held_unlink(server& s, const temp_dir& tmp, const std::string& dir,
                              const std::string& extra, uint32_t stall_ms) {
    ASSERT_TRUE(s.start(tmp.path(), {stories, dir, extra}));
    const gen_result turn = s.generate(prompt_of(s, story_texts[2]), "session", "s1");
    ASSERT_TRUE(turn.finished()) << turn.outcome();
    ASSERT_TRUE(s.wait_saves_settled(1));
    ASSERT_EQ(s.stats().disk("sessions"), 1u);
    auto armed = s.op("fault", "kind", "kv_stall_unlink", "ms", stall_ms);
    ASSERT_TRUE(armed.has_value());
    ASSERT_EQ(armed->str("event"), "done") << armed->str("message");
    EXPECT_NE(armed->str("detail").find("unlink"), std::string::npos) << armed->str("detail");
}

// A session_delete the disk does not answer within kv.restore_wait_ms.
TEST(kv_faults, stalled_unlink_is_answered_kv_io_after_restore_wait_ms) {
    REQUIRE_STORIES();
    temp_dir tmp;
    const std::string dir = tmp.sub("kv");
    tokens_t q;
    const gen_result want_q = from_scratch(tmp.path(), story_texts[3], q);
    constexpr uint32_t wait_ms = 100;    // kv.restore_wait_ms's least
    constexpr uint32_t stall_ms = 3000;  // 30 times the wait: the wait always ends first
    const std::string extra =
        kv_fault_extra + "[kv]\nrestore_wait_ms = " + std::to_string(wait_ms) + "\n";
    const auto session_files = [&] {
        auto all = files_in(dir, ".kv");
        std::erase_if(all, [](const std::string& f) { return !f.starts_with("s-"); });
        return all;
    };
    server s;
    ASSERT_NO_FATAL_FAILURE(start_with_a_held_unlink(s, tmp, dir, extra, stall_ms));
    ASSERT_EQ(session_files().size(), 1u);
    const uint64_t del_id = s.take_id();
    ASSERT_TRUE(s.conn().send(frame("id", del_id, "op", "session_delete", "session", "s1")));
    std::optional<event> told = s.wait_terminal(del_id);
    ASSERT_TRUE(told.has_value());
    EXPECT_EQ(told->str("event"), "error");
    EXPECT_EQ(told->str("code"), "kv_io");
    EXPECT_NE(told->str("message").find("kv.restore_wait_ms = 100 ms"), std::string::npos)
        << told->str("message");
    EXPECT_EQ(s.stats().sched("session_delete_timeouts"), 1u);
    // Serving goes on while the disk holds the unlink.
    expect_same_output(s.generate(q), want_q, "a request while the unlink is held");

    // The held unlink ends: the file is removed, and its answer is dropped.
    ASSERT_TRUE(s.wait_for("the held unlink", [&] { return session_files().empty(); }));
    ASSERT_TRUE(s.wait_for("the late answer dropped",
                           [&] { return s.stats().sched("session_delete_late_answers") == 1; }));
    EXPECT_FALSE(s.holds_terminal(del_id)) << "a second event for the told session_delete";
    auto again = s.op("session_delete", "session", "s1");
    ASSERT_TRUE(again.has_value());
    ASSERT_EQ(again->str("event"), "done") << again->str("message");
    const auto* deleted = field(again->o(), "deleted");
    EXPECT_TRUE(deleted && deleted->type == msgpack::type::BOOLEAN && !deleted->via.boolean);
    auto st = s.stats();
    EXPECT_EQ(st.disk("sessions"), 0u);
    EXPECT_EQ(st.sched("session_delete_timeouts"), 1u);
    EXPECT_EQ(st.sched("session_delete_late_answers"), 1u);
    s.expect_idle();
    EXPECT_EQ(s.stop(), 0);
    server b;
    ASSERT_TRUE(b.start(tmp.path(), {stories, dir, extra}));
    EXPECT_EQ(b.stats().disk("sessions"), 0u);
    EXPECT_TRUE(session_files().empty());
    EXPECT_EQ(b.stop(), 0);
}

// A SIGTERM while a session_delete waits for a held unlink: the drain waits for the delete (it
// is owed a terminal event), which gets kv_io after kv.restore_wait_ms; then the server exits 0.
TEST(kv_faults, a_drain_answers_the_session_delete_that_waits_for_the_disk) {
    REQUIRE_STORIES();
    temp_dir tmp;
    const std::string dir = tmp.sub("kv");
    const std::string extra = kv_fault_extra + "[kv]\nrestore_wait_ms = 100\n";
    server s;
    ASSERT_NO_FATAL_FAILURE(start_with_a_held_unlink(s, tmp, dir, extra, 3000));
    const uint64_t del_id = s.take_id();
    ASSERT_TRUE(s.conn().send(frame("id", del_id, "op", "session_delete", "session", "s1")));
    // The stats answer comes after the scheduler took the delete (one connection, in order):
    // the delete waits for the disk when the drain begins.
    s.stats();
    ASSERT_FALSE(s.holds_terminal(del_id)) << "the delete was answered before the unlink ended";
    s.terminate();
    std::optional<event> told = s.wait_terminal(del_id);
    ASSERT_TRUE(told.has_value()) << "no terminal event for the waiting session_delete";
    EXPECT_EQ(told->str("event"), "error");
    EXPECT_EQ(told->str("code"), "kv_io") << told->str("message");
    EXPECT_EQ(s.wait_exit(), 0);
}

TEST(kv_faults, fingerprint_is_quarantined_after_restart) {
    REQUIRE_STORIES();
    temp_dir tmp;
    const std::string dir = tmp.sub("kv");
    tokens_t p;
    const gen_result want_p = from_scratch(tmp.path(), story_texts[4], p);
    {
        server a;
        ASSERT_TRUE(a.start(tmp.path(), {stories, dir, kv_fault_extra}));
        arm_kv_fault(a, "kv_fingerprint");
        expect_same_output(a.generate(p), want_p, "the request whose file says another model");
        ASSERT_TRUE(a.wait_saves_settled(1));
        auto st = a.stats();
        EXPECT_EQ(st.disk("saves"), 0u);
        EXPECT_EQ(st.disk("save_failures"), 1u);
        EXPECT_EQ(st.disk_error("kv_fingerprint"), 1u);
        EXPECT_TRUE(st.disk_flag("persisting")) << "a foreign file is no disk fault";
        EXPECT_EQ(st.disk("files"), 0u);
        a.expect_idle();
        EXPECT_EQ(a.stop(), 0);
    }
    ASSERT_EQ(files_in(dir, ".kv").size(), 1u);
    server b;
    ASSERT_TRUE(b.start(tmp.path(), {stories, dir, kv_fault_extra}));
    auto scanned = b.stats();
    EXPECT_EQ(scanned.disk("files"), 0u);
    EXPECT_EQ(scanned.disk("quarantined"), 1u);
    EXPECT_EQ(scanned.disk_error("kv_fingerprint"), 1u);
    EXPECT_TRUE(files_in(dir, ".kv").empty());
    const auto quarantined = files_in(dir + "/quarantine", ".kv");
    ASSERT_EQ(quarantined.size(), 1u);
    EXPECT_NE(quarantined[0].find(".kv_fingerprint."), std::string::npos) << quarantined[0];
    const gen_result got = b.generate(p);
    expect_same_output(got, want_p, "after the restart");
    EXPECT_EQ(got.cached, 0u);
    b.expect_idle();
    EXPECT_EQ(b.stop(), 0);
}

}  // namespace
