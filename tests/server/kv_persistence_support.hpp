// kv_persistence_support.hpp: what the KV persistence server tests share (test_kv_persistence.cpp
// and test_kv_faults.cpp): temporary directories, one ordo-server process with its connection
// (start, ops, generates, waits, the idle check every test ends with), the stats view, prompts
// from stories260K's tokenizer, and the on-disk file format as docs/kv-format.md lays it out.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/server_process.hpp"
#include "tests/support/shared_models.hpp"

namespace ordo::test::kv_persistence {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using tokens_t = std::vector<int32_t>;

inline const std::string stories = std::string(ORDO_SHARED_MODELS_DIR) + "/stories260K.gguf";
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
inline std::vector<std::string> files_in(const std::string& dir, const std::string& suffix) {
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

inline std::string read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A name the startup scan takes for one of ours: "p-" + 32 hex digits.
inline std::string random_prefix_name(std::mt19937& rng) {
    static constexpr char hex[] = "0123456789abcdef";
    std::string s = "p-";
    for (int i = 0; i < 32; i++) s += hex[rng() % 16];
    return s;
}

// `ordo-model kv-inspect FILE --verify`: its exit status (0 valid, 1 refused or corrupt).
inline int kv_inspect_verify(const std::string& path) {
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

inline gen_result to_result(const event& e) {
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

inline const char* const story_texts[] = {
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
inline tokens_t prompt_of(server& s, const std::string& text, size_t len = prompt_len) {
    tokens_t t = s.tokenize(text, true);
    EXPECT_GE(t.size(), len) << "\"" << text << "\" is too short";
    t.resize(std::min(t.size(), len));
    return t;
}

// A prompt made of seeded random words, cut to `len` ids.
inline tokens_t random_prompt(server& s, std::mt19937& rng, size_t len) {
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

inline uint64_t le(const std::string& b, size_t off, size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v |= uint64_t(uint8_t(b[off + i])) << (8 * i);
    return v;
}

inline void put_le(std::string& b, size_t off, size_t n, uint64_t v) {
    for (size_t i = 0; i < n; i++) b[off + i] = char((v >> (8 * i)) & 0xff);
}

// Where a file's regions start, from its header.
struct file_layout {
    uint64_t n_blocks = 0, n_tokens = 0, block_bytes = 0;
    uint64_t table = 0, payload = 0, size = 0;
};

inline file_layout layout_of(const std::string& b) {
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
inline tokens_t tokens_of_file(const std::string& b) {
    file_layout l = layout_of(b);
    tokens_t t;
    for (uint64_t i = 0; i < l.n_tokens; i++) t.push_back(int32_t(le(b, header_bytes + 4 * i, 4)));
    return t;
}

// The file in `dir` whose token ids are the first whole blocks of `prompt` (n_blocks of them).
inline std::string file_for(const std::string& dir, const tokens_t& prompt, size_t n_blocks) {
    tokens_t want(prompt.begin(), prompt.begin() + long(n_blocks * block_tokens));
    for (const auto& name : files_in(dir, ".kv")) {
        if (tokens_of_file(read_bytes(dir + "/" + name)) == want) return dir + "/" + name;
    }
    ADD_FAILURE() << "no file in " << dir << " holds the prompt's " << n_blocks << " blocks";
    return {};
}

inline void flip_bit(std::string& b, size_t offset, std::mt19937& rng) {
    b[offset] = char(uint8_t(b[offset]) ^ uint8_t(1u << (rng() % 8)));
}

inline void set_mtime(const std::string& path, std::chrono::seconds ago) {
    timespec now{};
    clock_gettime(CLOCK_REALTIME, &now);
    timespec t[2] = {{now.tv_sec - ago.count(), 0}, {now.tv_sec - ago.count(), 0}};
    EXPECT_EQ(::utimensat(AT_FDCWD, path.c_str(), t, 0), 0) << path;
}

// ---- checks shared by the tests ---------------------------------------------------------------

inline void expect_same_output(const gen_result& got, const gen_result& want,
                               const std::string& what) {
    EXPECT_TRUE(got.finished()) << what << ": " << got.outcome();
    EXPECT_EQ(got.tokens, want.tokens) << what << ": tokens differ from the from-scratch ones";
    EXPECT_EQ(got.text, want.text) << what;
}

}  // namespace ordo::test::kv_persistence
