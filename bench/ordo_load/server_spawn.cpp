// server_spawn.cpp: see server_spawn.hpp.
#include "bench/ordo_load/server_spawn.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cassert>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <regex>

namespace ordo::load {
namespace {

constexpr size_t read_chunk_bytes = 4096;
constexpr int drain_poll_ms = 100;  // how often the drainer checks that it should stop
constexpr auto reap_poll = std::chrono::milliseconds(20);
constexpr int exit_exec_failed = 127;

int exit_code_of(int wstatus) {
    if (WIFEXITED(wstatus)) return WEXITSTATUS(wstatus);
    if (WIFSIGNALED(wstatus)) return 128 + WTERMSIG(wstatus);
    return -1;
}

}  // namespace

std::optional<listen_endpoint> parse_listening_line(const std::string& text, bool http) {
    // HOST is "[v6]" or a name/IPv4 without colons; the newline proves the port is complete.
    static const std::string where = R"(listening on (\[[^\]\s]+\]|[^\s:\[\]]+):(\d+)[ \t]*\r?\n)";
    static const std::regex line("ordo-server " + where), http_line("ordo-server http " + where);
    std::smatch m;
    if (!std::regex_search(text, m, http ? http_line : line)) return std::nullopt;
    std::string host = m[1].str();
    if (host.front() == '[') host = host.substr(1, host.size() - 2);
    std::string port_text = m[2].str();
    if (port_text.size() > 5) return std::nullopt;
    unsigned long port = std::stoul(port_text);
    if (port == 0 || port > 65535) return std::nullopt;
    return listen_endpoint{host, static_cast<uint16_t>(port)};
}

spawned_server::~spawned_server() {
    stop();
}

status spawned_server::start(const std::string& binary, const std::vector<std::string>& args,
                             std::chrono::milliseconds deadline, bool http) {
    assert(_pid < 0);
    _want_http = http;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
        return make_error("spawn_failed", std::string("pipe: ") + std::strerror(errno));
    }
    std::vector<std::string> argv_s{binary};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    // Prepared before fork: the child of a threaded process may only make async-signal-safe
    // calls, so it writes this with write(2) instead of formatting.
    std::string exec_failed = "exec " + binary + " failed\n";
    pid_t parent = getpid();
    _pid = fork();
    if (_pid < 0) {
        ::close(fds[0]), ::close(fds[1]);
        return make_error("spawn_failed", std::string("fork: ") + std::strerror(errno));
    }
    if (_pid == 0) {
        // The server must not outlive a crashed or killed ordo-load.
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(exit_exec_failed);
        dup2(fds[1], STDOUT_FILENO);
        dup2(fds[1], STDERR_FILENO);
        execv(argv[0], argv.data());
        ssize_t ignored = ::write(STDERR_FILENO, exec_failed.data(), exec_failed.size());
        (void)ignored;
        _exit(exit_exec_failed);
    }
    ::close(fds[1]);
    _drainer = std::thread([this, fd = fds[0]] { drain_loop(fd); });

    return wait_listening(deadline);
}

status spawned_server::wait_listening(std::chrono::milliseconds deadline) {
    auto end = std::chrono::steady_clock::now() + deadline;
    std::unique_lock lock(_mutex);
    // Wakes on output or pipe close; the slice bounds how late an exit without EOF is seen.
    while (!_found && !_pipe_closed && std::chrono::steady_clock::now() < end && !reap(false)) {
        _changed.wait_for(lock, std::chrono::milliseconds(200));
    }
    bool found = _found;
    lock.unlock();
    if (found) return {};
    bool timed_out = std::chrono::steady_clock::now() >= end;
    int code = stop();
    if (timed_out) {
        return make_error(
            "startup_timeout",
            "ordo-server did not print its listening line in time; output:\n" + output_tail());
    }
    return make_error("spawn_failed", "ordo-server exited (status " + std::to_string(code) +
                                          ") before listening; output:\n" + output_tail());
}

bool spawned_server::reap(bool block) {
    if (_pid < 0) return true;
    int wstatus = 0;
    pid_t r = waitpid(_pid, &wstatus, block ? 0 : WNOHANG);
    if (r == 0) return false;
    _exit_status = r == _pid ? exit_code_of(wstatus) : -1;
    _pid = -1;
    return true;
}

bool spawned_server::alive() {
    return !reap(false);
}

int spawned_server::stop() {
    if (_pid >= 0) {
        kill(_pid, SIGTERM);
        auto end = std::chrono::steady_clock::now() + stop_grace;
        while (!reap(false) && std::chrono::steady_clock::now() < end) {
            std::this_thread::sleep_for(reap_poll);
        }
        if (_pid >= 0) {
            kill(_pid, SIGKILL);
            reap(true);
        }
    }
    if (_drainer.joinable()) {
        {
            std::lock_guard lock(_mutex);
            _stop_draining = true;
        }
        _drainer.join();
    }
    return _exit_status;
}

std::string spawned_server::output_tail() {
    std::lock_guard lock(_mutex);
    return _tail;
}

void spawned_server::drain_loop(int fd) {
    char buf[read_chunk_bytes];
    // Ends at EOF (the child and every copy of the pipe's write end are gone) or when stop()
    // asks, which it does only after the child has been reaped.
    while (true) {
        {
            std::lock_guard lock(_mutex);
            if (_stop_draining) break;
        }
        pollfd p{fd, POLLIN, 0};
        int ready = poll(&p, 1, drain_poll_ms);
        if (ready < 0 && errno == EINTR) continue;
        if (ready == 0) continue;
        ssize_t n = ready < 0 ? -1 : ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        std::lock_guard lock(_mutex);
        if (n <= 0) {
            _pipe_closed = true;
            _changed.notify_all();
            break;
        }
        _tail.append(buf, static_cast<size_t>(n));
        if (!_found) {
            // The lines are printed right after start-up, well inside the kept tail.
            auto ep = parse_listening_line(_tail);
            auto http_ep = _want_http ? parse_listening_line(_tail, true) : std::nullopt;
            if (ep && (http_ep || !_want_http)) {
                _endpoint = *ep, _found = true;
                if (http_ep) _http_endpoint = *http_ep;
            }
        }
        if (_tail.size() > output_tail_bytes) _tail.erase(0, _tail.size() - output_tail_bytes);
        _changed.notify_all();
    }
    ::close(fd);
}

}  // namespace ordo::load
