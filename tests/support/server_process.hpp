// server_process.hpp: test support — run the real ordo-server binary and talk to it over TCP.
//
// server_process forks/execs ordo-server with the given arguments (always on an ephemeral port
// unless the caller passes --listen; the HTTP front door too unless --http-listen is passed),
// waits for its "listening on" line, and on destruction
// sends SIGTERM and reaps it (SIGKILL after a bounded wait). tcp_client is a blocking msgpack
// client with a receive deadline on every read, so no test can hang forever.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <msgpack.hpp>
#include <optional>
#include <string>
#include <vector>

namespace ordo::test {

// Every wait in the support code is bounded by this.
inline constexpr std::chrono::milliseconds io_deadline{20000};
// How long a test asks health before it gives up on the device becoming ready: the build
// compiles every pipeline, and on a loaded 2-core CI machine that once took over 20 s.
inline constexpr std::chrono::seconds device_ready_deadline{90};

class server_process {
public:
    server_process() = default;
    ~server_process();
    server_process(const server_process&) = delete;
    server_process& operator=(const server_process&) = delete;

    // Before start(): the server's stderr goes to a pipe of `pipe_bytes` (at least a page) that
    // nobody reads, held open until this object is destroyed, as under a supervisor whose log
    // reader has stopped. stdout still goes to output().
    void stderr_to_unread_pipe(std::size_t pipe_bytes) { _unread_pipe_bytes = pipe_bytes; }
    // Starts `binary args...`; returns false (with stderr captured in output()) if it exited
    // before listening or did not listen within the deadline.
    bool start(const std::string& binary, const std::vector<std::string>& args);
    // SIGTERM, then wait; returns the exit status (or -1 when killed after the deadline).
    int stop();
    // Waits for exit without sending a signal; returns the exit status.
    int wait_exit();

    uint16_t port() const { return _port; }
    // The HTTP front door's port (0 when it is off: --http-listen "").
    uint16_t http_port() const { return _http_port; }
    // Exit status of a process that ended during start() or wait_exit(); -1 while running.
    int exit_status() const { return _exit_status; }
    int pid() const { return _pid; }
    // Everything the process wrote to stdout and stderr so far (drained on stop/wait).
    std::string output();

private:
    void drain(int timeout_ms);

    int _pid = -1;
    int _out_fd = -1;
    std::size_t _unread_pipe_bytes = 0;  // stderr_to_unread_pipe
    int _unread_pipe_fd = -1;            // its read end, never read
    uint16_t _port = 0;
    uint16_t _http_port = 0;
    int _exit_status = -1;
    std::string _output;
};

class tcp_client {
public:
    tcp_client() = default;
    ~tcp_client();
    tcp_client(const tcp_client&) = delete;
    tcp_client& operator=(const tcp_client&) = delete;

    bool connect(uint16_t port, const std::string& host = "127.0.0.1");
    bool send_raw(const std::string& bytes);
    bool send(const msgpack::sbuffer& frame) { return send_raw({frame.data(), frame.size()}); }
    // The next decoded frame, or nullopt on EOF, error or deadline.
    std::optional<msgpack::object_handle> recv(std::chrono::milliseconds deadline = io_deadline);
    // True when the server closed the connection (EOF) within the deadline, after any frames.
    bool wait_closed(std::chrono::milliseconds deadline = io_deadline);
    void close();
    // Closes with RST instead of FIN (SO_LINGER 0).
    void reset();
    int fd() const { return _fd; }
    // How the server ended the connection, as the last recv/wait_closed saw it: "" (not seen),
    // "eof" (FIN) or "reset" (ECONNRESET, or any other receive error).
    const std::string& peer_closed() const { return _peer_closed; }

private:
    void saw_end(ssize_t n);
    int _fd = -1;
    std::string _peer_closed;
    msgpack::unpacker _unpacker;
};

// Packs a map from alternating keys and values: frame("id", 1, "op", "health").
template <typename... kv>
msgpack::sbuffer frame(const kv&... args) {
    static_assert(sizeof...(args) % 2 == 0, "keys and values come in pairs");
    msgpack::sbuffer buf;
    msgpack::packer<msgpack::sbuffer> pk(buf);
    pk.pack_map(sizeof...(args) / 2);
    (pk.pack(args), ...);
    return buf;
}

// Field lookup on a decoded map; nullptr when absent.
const msgpack::object* field(const msgpack::object& map, const std::string& key);
std::string str_field(const msgpack::object& map, const std::string& key);
uint64_t uint_field(const msgpack::object& map, const std::string& key);

// The `model` op's answer about the draft model ([speculative] mode = "draft"): its
// `speculative` map is there (present), speculative.draft_ready, speculative.draft_reason.
struct draft_state {
    bool present = false;
    bool ready = false;
    std::string reason;
};
draft_state draft_state_of(const msgpack::object& model);

// A decoded event with its own storage.
struct event {
    std::shared_ptr<msgpack::object_handle> h;
    const msgpack::object& o() const { return h->get(); }
    std::string str(const std::string& k) const { return str_field(o(), k); }
    uint64_t u(const std::string& k) const { return uint_field(o(), k); }
    std::vector<int32_t> ints(const std::string& k) const {
        const auto* f = field(o(), k);
        return f ? f->as<std::vector<int32_t>>() : std::vector<int32_t>{};
    }
    bool terminal() const { return str("event") == "done" || str("event") == "error"; }
    // "done", "done:length", "error:overloaded": what a failed expectation prints.
    std::string outcome() const {
        std::string ev = str("event");
        if (ev == "error") return ev + ":" + str("code") + " (" + str("message") + ")";
        std::string reason = str("reason");
        return reason.empty() ? ev : ev + ":" + reason;
    }
};

// Runs a shell command, capturing stdout and stderr together (the command should redirect
// 2>&1); exit_code -1 when it did not exit normally.
struct command_result {
    int exit_code = -1;
    std::string output;
};
command_result run_command(const std::string& cmd);

// <tmp>/ordo_<suite>_test_<pid>/<name>, the directory made: one scratch place per test process.
std::string scratch_path(const std::string& suite, const std::string& name);

// The GGUF file at `path`, made by `<model_bin> mk --out path <mk_flags>` (random weights of the
// shape the flags give) unless it exists; a failed make is a test failure (reported on stderr
// where gtest is not linked).
std::string generated_model(const std::string& model_bin, const std::string& path,
                            const std::string& mk_flags);

// The small f32 model the server tests serve (32 wide, 1 layer, 260-token vocabulary).
inline constexpr const char* tiny_model_flags =
    "--n-embd 32 --n-layer 1 --n-head 2 --n-head-kv 2 --n-ff 64 --n-vocab 260 --type f32 "
    "--seed 1 --ctx 128";

// The next event on `c`, or nullopt on EOF, error or deadline.
inline std::optional<event> next(tcp_client& c, std::chrono::milliseconds deadline = io_deadline) {
    auto r = c.recv(deadline);
    if (!r) return std::nullopt;
    return event{std::make_shared<msgpack::object_handle>(std::move(*r))};
}

// The events of request `id` read from `c`, up to and including its terminal one (events of
// other ids are dropped). A test failure when the connection ends or a read times out first.
std::vector<event> until_terminal(tcp_client& c, uint64_t id);

// Asks health on a new connection until it says "ok": "" then, else why not (the status and
// reason it gave instead of ok or loading, no answer, or still loading after
// device_ready_deadline). With `api_key`, the connection authenticates first.
std::string wait_healthy(uint16_t port, const std::string& api_key = "");

// The `stats` op's answer, asked on a new connection; nullopt when none came.
std::optional<event> stats_event(uint16_t port);

}  // namespace ordo::test
