// server_process.cpp: see server_process.hpp.
#include "tests/support/server_process.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef ORDO_WITH_GTEST
#include <gtest/gtest.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <regex>
#include <thread>

#include "tests/support/scratch_dir.hpp"
#include "tools/client/connection.hpp"

namespace ordo::test {
namespace {

using clock = std::chrono::steady_clock;

// How much of a server's output a failed test prints (its end: the failure is usually there).
constexpr std::size_t failure_output_max = 16384;

int remaining_ms(clock::time_point end) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - clock::now());
    return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

}  // namespace

server_process::~server_process() {
    if (_pid > 0) stop();
    if (_unread_pipe_fd >= 0) ::close(_unread_pipe_fd);
        // A failed test shows what the server said: its log is the only record of a timeout or a
        // rebuild that went wrong, and the process (and its pipe) is gone after this.
#ifdef ORDO_WITH_GTEST
    const bool failed = ::testing::Test::HasFailure();
#else
    const bool failed = false;  // ordo-fault prints what it needs itself
#endif
    if (failed && !_output.empty()) {
        std::size_t n = std::min(_output.size(), failure_output_max);
        std::fprintf(stderr, "---- the server's output (last %zu bytes) ----\n%s\n----\n", n,
                     _output.c_str() + (_output.size() - n));
    }
}

bool server_process::start(const std::string& binary, const std::vector<std::string>& args) {
    if (_out_fd >= 0) ::close(_out_fd);  // a previous run's output file (start after stop)
    _out_fd = -1;
    _output.clear();
    _exit_status = -1;
    // The server's stdout and stderr go to an unlinked temporary file, not a pipe: a pipe
    // nobody drains fills at 64 KiB and the server then blocks in its next log line (a long
    // ordo-fault run stalled the scheduler that way).
    std::string path = (std::filesystem::temp_directory_path() / "ordo-server-out-XXXXXX").string();
    const int out = mkstemp(path.data());
    if (out < 0) return false;
    unlink(path.c_str());
    std::vector<std::string> full{binary};
    bool has_listen = false, has_http_listen = false;
    for (const auto& a : args) {
        has_listen = has_listen || a == "--listen";
        has_http_listen = has_http_listen || a == "--http-listen";
    }
    if (!has_listen) full.insert(full.end(), {"--listen", "127.0.0.1:0"});
    // The HTTP front door on an ephemeral port too, so that servers started in parallel never
    // meet on its default port.
    if (!has_http_listen) full.insert(full.end(), {"--http-listen", "127.0.0.1:0"});
    full.insert(full.end(), args.begin(), args.end());
    int err_fds[2] = {-1, -1};
    if (_unread_pipe_bytes != 0) {
        if (_unread_pipe_fd >= 0) ::close(_unread_pipe_fd);
        if (::pipe2(err_fds, O_CLOEXEC) != 0) return false;
        ::fcntl(err_fds[1], F_SETPIPE_SZ, int(_unread_pipe_bytes));  // rounded up to a page
        _unread_pipe_fd = err_fds[0];
    }
    _pid = fork();
    if (_pid == 0) {
        dup2(out, 1);
        dup2(err_fds[1] >= 0 ? err_fds[1] : out, 2);
        close(out);
        std::vector<char*> argv;
        for (auto& a : full) argv.push_back(a.data());
        argv.push_back(nullptr);
        execv(binary.c_str(), argv.data());
        _exit(127);
    }
    _out_fd = out;
    if (err_fds[1] >= 0) ::close(err_fds[1]);  // the child holds the write end
    static const std::regex listening(R"(ordo-server listening on \S+:(\d+))");
    static const std::regex http_listening(R"(ordo-server http listening on \S+:(\d+))");
    auto end = clock::now() + io_deadline;
    while (clock::now() < end) {
        drain(100);
        std::smatch m;
        if (std::regex_search(_output, m, listening)) {
            _port = static_cast<uint16_t>(std::stoi(m[1]));
            // Printed before the protocol's line, so it is here when the server has HTTP on.
            std::smatch h;
            if (std::regex_search(_output, h, http_listening)) {
                _http_port = static_cast<uint16_t>(std::stoi(h[1]));
            }
            return true;
        }
        int status = 0;
        if (waitpid(_pid, &status, WNOHANG) == _pid) {
            drain(0);
            _pid = -1;
            _exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            return false;
        }
    }
    return false;
}

void server_process::drain(int timeout_ms) {
    if (_out_fd < 0) return;
    // What the server wrote since the last read (pread: the server's writes move the shared
    // offset, this read does not); with nothing new, a short wait (at most 10 ms).
    bool got = false;
    while (true) {
        char buf[4096];
        ssize_t n = pread(_out_fd, buf, sizeof buf, static_cast<off_t>(_output.size()));
        if (n <= 0) break;
        _output.append(buf, static_cast<size_t>(n));
        got = true;
    }
    if (!got && timeout_ms > 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(std::min(timeout_ms, 10)));
    }
}

std::string server_process::output() {
    drain(0);
    return _output;
}

int server_process::wait_exit() {
    if (_pid <= 0) return -1;
    auto end = clock::now() + io_deadline;
    int status = 0;
    while (clock::now() < end) {
        drain(50);
        if (waitpid(_pid, &status, WNOHANG) == _pid) {
            drain(0);
            _pid = -1;
            _exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            return _exit_status;
        }
    }
    kill(_pid, SIGKILL);
    waitpid(_pid, &status, 0);
    _pid = -1;
    return -1;
}

int server_process::stop() {
    if (_pid <= 0) return -1;
    kill(_pid, SIGTERM);
    return wait_exit();
}

tcp_client::~tcp_client() {
    close();
}

bool tcp_client::connect(uint16_t port, const std::string& host) {
    _peer_closed.clear();
    _fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
    return ::connect(_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
}

bool tcp_client::send_raw(const std::string& bytes) {
    size_t off = 0;
    while (off < bytes.size()) {
        ssize_t n = ::send(_fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
        if (n <= 0) return false;
        off += static_cast<size_t>(n);
    }
    return true;
}

std::optional<msgpack::object_handle> tcp_client::recv(std::chrono::milliseconds deadline) {
    auto end = clock::now() + deadline;
    msgpack::object_handle oh;
    while (!_unpacker.next(oh)) {
        pollfd p{_fd, POLLIN, 0};
        if (poll(&p, 1, remaining_ms(end)) <= 0) return std::nullopt;
        _unpacker.reserve_buffer(65536);
        ssize_t n = ::recv(_fd, _unpacker.buffer(), 65536, 0);
        if (n <= 0) {
            saw_end(n);
            return std::nullopt;
        }
        _unpacker.buffer_consumed(static_cast<size_t>(n));
    }
    return std::optional<msgpack::object_handle>(std::move(oh));
}

bool tcp_client::wait_closed(std::chrono::milliseconds deadline) {
    auto end = clock::now() + deadline;
    char buf[4096];
    while (true) {
        pollfd p{_fd, POLLIN, 0};
        if (poll(&p, 1, remaining_ms(end)) <= 0) return false;
        ssize_t n = ::recv(_fd, buf, sizeof buf, 0);
        if (n <= 0) {
            saw_end(n);
            return true;  // EOF or reset
        }
    }
}

void tcp_client::saw_end(ssize_t n) {
    _peer_closed = n == 0 ? "eof" : "reset";
}

void tcp_client::close() {
    if (_fd >= 0) ::close(_fd);
    _fd = -1;
}

void tcp_client::reset() {
    linger l{1, 0};
    setsockopt(_fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close();
}

const msgpack::object* field(const msgpack::object& map, const std::string& key) {
    return client::find(map, key);  // the CLI's lookup (tools/client/connection.hpp)
}

draft_state draft_state_of(const msgpack::object& model) {
    draft_state d;
    const msgpack::object* spec = field(model, "speculative");
    if (spec == nullptr) return d;
    d.present = true;
    const msgpack::object* ready = field(*spec, "draft_ready");
    d.ready = ready != nullptr && ready->type == msgpack::type::BOOLEAN && ready->via.boolean;
    d.reason = str_field(*spec, "draft_reason");
    return d;
}

std::string str_field(const msgpack::object& map, const std::string& key) {
    const auto* f = field(map, key);
    return f && f->type == msgpack::type::STR ? f->as<std::string>() : std::string();
}

uint64_t uint_field(const msgpack::object& map, const std::string& key) {
    const auto* f = field(map, key);
    return f && f->type == msgpack::type::POSITIVE_INTEGER ? f->via.u64 : UINT64_MAX;
}

std::vector<event> until_terminal(tcp_client& c, uint64_t id) {
    std::vector<event> evs;
    while (auto e = next(c)) {
        if (e->u("id") != id) continue;
        evs.push_back(*e);
        if (e->terminal()) return evs;
    }
#ifdef ORDO_WITH_GTEST
    ADD_FAILURE() << "no terminal event for " << id;
#endif
    return evs;
}

std::optional<event> stats_event(uint16_t port) {
    tcp_client c;
    if (!c.connect(port) || !c.send(frame("id", 1, "op", "stats"))) return std::nullopt;
    return next(c);
}

std::string wait_healthy(uint16_t port, const std::string& api_key) {
    tcp_client c;
    if (!c.connect(port)) return "cannot connect to port " + std::to_string(port);
    if (!api_key.empty()) {
        if (!c.send(frame("id", uint64_t(1), "op", "auth", "key", api_key))) {
            return "cannot send auth";
        }
        auto e = next(c);
        if (!e || e->str("event") != "done") return "auth refused: " + (e ? e->outcome() : "");
    }
    const auto end = clock::now() + device_ready_deadline;
    for (uint64_t id = 1; clock::now() < end; id++) {
        if (!c.send(frame("id", id, "op", "health"))) return "cannot send health";
        auto e = next(c);
        if (!e) return "no answer to health";
        const std::string status = e->str("status");
        if (status == "ok") return "";
        if (status != "loading") return "health says " + status + ": " + e->str("reason");
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return "the server never became healthy";
}

std::string scratch_path(const std::string& suite, const std::string& name) {
    return (scratch_dir("ordo_" + suite + "_test") / name).string();
}

std::string generated_model(const std::string& model_bin, const std::string& path,
                            const std::string& mk_flags) {
    if (!std::filesystem::exists(path)) {
        std::string mk = model_bin + " mk --out " + path + " " + mk_flags + " > /dev/null";
        if (std::system(mk.c_str()) != 0) {
#ifdef ORDO_WITH_GTEST
            ADD_FAILURE() << "failed: " << mk;
#else
            std::fprintf(stderr, "failed: %s\n", mk.c_str());
#endif
        }
    }
    return path;
}

command_result run_command(const std::string& cmd) {
    command_result r;
    FILE* pipe = ::popen(cmd.c_str(), "r");
    if (pipe == nullptr) return r;
    std::vector<char> chunk(4096);
    for (std::size_t got; (got = std::fread(chunk.data(), 1, chunk.size(), pipe)) > 0;) {
        r.output.append(chunk.data(), got);
    }
    const int wait_status = ::pclose(pipe);
    r.exit_code = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1;
    return r;
}

}  // namespace ordo::test
