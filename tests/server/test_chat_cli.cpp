// test_chat_cli.cpp: the chat clients against the real ordo-server over TCP: `ordo chat` (the
// CLI, stdin a pipe) and the Python client (clients/python/ordo_client.py), on a model made
// with `ordo-model mk` and a ChatML-like template given with `--chat-template FILE`.
//
// Checks, each by redoing the conversation with plain protocol requests and comparing:
//   - two lines piped to `ordo chat` then EOF: exit 0; stdout is exactly the two replies, each
//     ended by a newline; the turns' prompt_tokens (printed by --usage) are those of the
//     conversations [system, user1] and [system, user1, assistant: reply1, user2] rendered with
//     the --var value (so the history, --system and --var were sent); the second is larger;
//   - Ctrl-C (SIGINT) during a reply slowed down by a step_delay fault: the reply ends
//     [cancelled], the chat goes on, the next turn's prompt holds the partial reply (what was
//     printed, a prefix of the full greedy reply), and stdin's EOF then exits 0;
//   - --session NAME reaches the server: the session exists afterwards (session_delete says
//     deleted);
//   - an error mid-conversation (a line too long for the context) prints `ordo: code: message`
//     and the chat goes on without that turn; a malformed --var is a usage error (exit 2);
//   - a model without a chat template: `ordo chat` prints no_chat_template and exits 1;
//   - the Python client's chat, chat_stream, apply_template and its cancel on leaving a stream
//     early (tests/server/chat_client_check.py, run by Debian's python3).
// Every wait is bounded: the CLI and python3 run under `timeout`, polls have an iteration cap,
// every read has the support code's deadline.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "tests/support/scratch_dir.hpp"
#include "tests/support/server_process.hpp"

namespace {

using namespace ordo::test;
namespace fs = std::filesystem;
using message_list = std::vector<std::map<std::string, std::string>>;

// Bounds of the polls here: tries and the pause between them (a bound, not an expectation).
constexpr int poll_tries_max = 2400;
constexpr std::chrono::milliseconds poll_pause{25};
// The wall-clock bound `timeout` puts on one CLI or python3 run.
constexpr int command_timeout_s = 180;

std::string temp_path(const std::string& name) {
    const fs::path& dir = ordo::test::scratch_dir("ordo_chat_cli");
    return (dir / name).string();
}

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string shell_quote(const std::string& s) {
    std::string q = "'";
    for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    return q + "'";
}

// ChatML-like, with one variable from chat_template_kwargs. No newline at the end: Jinja drops
// a source's last newline anyway.
const std::string chat_template_source =
    "{% if greeting is defined %}{{ greeting }}\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{{ m.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% endif %}";

const std::string system_text = "Be terse.";
const std::string user1 = "What is ordo?";
const std::string user2 = "And then?";
const std::map<std::string, std::string> kwargs = {{"greeting", "hi there"}};

// One turn's line of `--usage` on stderr: "[reason] prompt_tokens=N cached_tokens=N ...".
struct usage_line {
    std::string reason;
    uint64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
};

std::vector<usage_line> usage_lines(const std::string& err) {
    std::vector<usage_line> r;
    std::istringstream in(err);
    for (std::string l; std::getline(in, l);) {
        if (l.empty() || l[0] != '[' || l.find("prompt_tokens=") == std::string::npos) continue;
        usage_line u;
        u.reason = l.substr(1, l.find(']') - 1);
        auto num = [&](const std::string& key) -> uint64_t {
            size_t at = l.find(" " + key + "=");
            return at == std::string::npos ? 0 : std::stoull(l.substr(at + key.size() + 2));
        };
        u.prompt_tokens = num("prompt_tokens");
        u.cached_tokens = num("cached_tokens");
        u.completion_tokens = num("completion_tokens");
        r.push_back(u);
    }
    return r;
}

class chat_cli : public ::testing::Test {
protected:
    // A random-weight model: replies are gibberish but deterministic, which is all the
    // comparisons need. A 1024-token context holds a few turns of the byte-level vocabulary.
    void SetUp() override {
        std::signal(SIGPIPE, SIG_IGN);  // a CLI that died must fail the test, not kill it
        model = temp_path("chat.gguf");
        std::string mk = std::string(ORDO_MODEL_BIN) + " mk --out " + model +
                         " --n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 --n-ff 128"
                         " --n-vocab 300 --type f32 --seed 3 --ctx 1024 > /dev/null";
        ASSERT_EQ(std::system(mk.c_str()), 0);
        template_file = temp_path("chatml.jinja");
        std::ofstream(template_file) << chat_template_source;
    }

    // Starts the server on the model; with_template adds --chat-template.
    void start(bool with_template, const std::string& config_extra = "",
               const std::vector<std::string>& more_args = {}) {
        std::string cfg = temp_path("chat.toml");
        std::ofstream(cfg) << "[model]\npath = \"" << model << "\"\n" << config_extra;
        std::vector<std::string> args{"--config", cfg, "--log-level", "warn"};
        if (with_template) args.insert(args.end(), {"--chat-template", template_file});
        args.insert(args.end(), more_args.begin(), more_args.end());
        ASSERT_TRUE(server.start(ORDO_SERVER_BIN, args)) << server.output();
        ASSERT_EQ(wait_healthy(server.port()), "");
        ASSERT_TRUE(c.connect(server.port()));
    }

    std::string cli_prefix() const {
        return "timeout " + std::to_string(command_timeout_s) + " " + ORDO_CLI_BIN + " --port " +
               std::to_string(server.port()) + " --timeout-ms 60000 ";
    }

    // Runs `ordo ... chat ARGS` with `input` on stdin; stdout and stderr into out and err.
    int run_chat(const std::string& input, const std::string& args) {
        std::string in_path = temp_path("in.txt");
        std::ofstream(in_path, std::ios::binary) << input;
        auto r = run_command(cli_prefix() + "chat " + args + " < " + in_path + " > " +
                             temp_path("out.txt") + " 2> " + temp_path("err.txt"));
        out = read_file(temp_path("out.txt"));
        err = read_file(temp_path("err.txt"));
        return r.exit_code;
    }

    // The chat op with greedy sampling, as `ordo chat -n max_tokens --temp 0 --var greeting=..`
    // sends it (but not streamed).
    event chat(const message_list& messages, uint64_t max_tokens) {
        EXPECT_TRUE(c.send(frame("id", ++id, "op", "chat", "messages", messages, "max_tokens",
                                 max_tokens, "temperature", 0, "chat_template_kwargs", kwargs)));
        auto evs = until_terminal(c, id);
        EXPECT_FALSE(evs.empty());
        return evs.back();
    }

    // The prompt chat would evaluate for `messages`: its token count.
    size_t prompt_tokens(const message_list& messages) {
        EXPECT_TRUE(c.send(frame("id", ++id, "op", "apply_template", "messages", messages,
                                 "chat_template_kwargs", kwargs)));
        auto evs = until_terminal(c, id);
        EXPECT_FALSE(evs.empty());
        EXPECT_EQ(evs.back().str("event"), "done") << evs.back().outcome();
        return evs.back().ints("tokens").size();
    }

    uint64_t tokens_generated() {
        EXPECT_TRUE(c.send(frame("id", ++id, "op", "stats")));
        auto evs = until_terminal(c, id);
        const msgpack::object* s = evs.empty() ? nullptr : field(evs.back().o(), "scheduler");
        return s != nullptr ? uint_field(*s, "tokens_generated") : 0;
    }

    std::string model, template_file, out, err;
    server_process server;
    tcp_client c;
    uint64_t id = 0;
};

TEST_F(chat_cli, two_piped_lines_are_two_turns_with_the_history) {
    start(true);
    int rc = run_chat(user1 + "\n" + user2 + "\n",
                      "--system " + shell_quote(system_text) +
                          " --var 'greeting=\"hi there\"' -n 8 --temp 0 --usage");
    ASSERT_EQ(rc, 0) << "stderr:\n" << err;
    auto lines = usage_lines(err);
    ASSERT_EQ(lines.size(), 2u) << err;

    message_list first = {{{"role", "system"}, {"content", system_text}},
                          {{"role", "user"}, {"content", user1}}};
    event reply1 = chat(first, 8);
    ASSERT_EQ(reply1.str("event"), "done") << reply1.outcome();
    message_list second = first;
    second.push_back({{"role", "assistant"}, {"content", reply1.str("text")}});
    second.push_back({{"role", "user"}, {"content", user2}});
    event reply2 = chat(second, 8);
    ASSERT_EQ(reply2.str("event"), "done") << reply2.outcome();

    EXPECT_EQ(out, reply1.str("text") + "\n" + reply2.str("text") + "\n");
    EXPECT_EQ(lines[0].prompt_tokens, prompt_tokens(first));
    EXPECT_EQ(lines[1].prompt_tokens, prompt_tokens(second));
    EXPECT_GT(lines[1].prompt_tokens, lines[0].prompt_tokens);
    EXPECT_EQ(lines[0].reason, reply1.str("reason"));
    EXPECT_EQ(lines[1].completion_tokens, reply2.ints("tokens").size());
}

// `ordo chat` with stdin a pipe the test writes to, stdout and stderr in files.
class cli_process {
public:
    ~cli_process() {
        if (_stdin >= 0) ::close(_stdin);
        if (_pid > 0) {
            ::kill(_pid, SIGKILL);
            ::waitpid(_pid, nullptr, 0);
        }
    }
    bool start(std::vector<std::string> argv, const std::string& out, const std::string& err) {
        int p[2];
        if (::pipe(p) != 0) return false;
        std::vector<char*> args;
        for (auto& a : argv) args.push_back(a.data());
        args.push_back(nullptr);
        _pid = ::fork();
        if (_pid == 0) {  // only async-signal-safe calls until exec
            ::dup2(p[0], 0);
            ::close(p[0]);
            ::close(p[1]);
            int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
            int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
            ::dup2(o, 1);
            ::dup2(e, 2);
            ::execv(args[0], args.data());
            ::_exit(127);
        }
        ::close(p[0]);
        _stdin = p[1];
        return _pid > 0;
    }
    bool write(const std::string& s) {
        return ::write(_stdin, s.data(), s.size()) == ssize_t(s.size());
    }
    void close_stdin() {
        ::close(_stdin);
        _stdin = -1;
    }
    void interrupt() { ::kill(_pid, SIGINT); }
    // The exit status, or -1 when it did not exit within the polls' bound (then killed).
    int wait_exit() {
        for (int i = 0; i < poll_tries_max; i++) {
            int status = 0;
            if (::waitpid(_pid, &status, WNOHANG) == _pid) {
                _pid = -1;
                return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
            }
            std::this_thread::sleep_for(poll_pause);
        }
        return -1;
    }

private:
    pid_t _pid = -1;
    int _stdin = -1;
};

TEST_F(chat_cli, ctrl_c_cancels_the_reply_keeps_its_text_and_the_chat_goes_on) {
    start(true, "[fault]\nenabled = true\n");
    constexpr uint64_t n = 24;
    message_list first = {{{"role", "user"}, {"content", user1}}};
    // The whole greedy reply, for reference. The checks below need it to run to the length
    // bound and to hold no newline (stdout's first line is then the cancelled reply): true of
    // this model and prompt; if the model generator changes, pick another mk --seed.
    event full = chat(first, n);
    ASSERT_EQ(full.str("reason"), "length") << full.outcome();
    ASSERT_EQ(full.str("text").find('\n'), std::string::npos);

    // Slow the decode steps down so the reply is still being written when SIGINT arrives.
    ASSERT_TRUE(c.send(frame("id", ++id, "op", "fault", "kind", "step_delay", "phase", "decode",
                             "ms", 200, "count", n)));
    ASSERT_EQ(until_terminal(c, id).back().str("event"), "done");
    uint64_t before = tokens_generated();

    cli_process cli;
    std::string out_path = temp_path("cancel_out.txt"), err_path = temp_path("cancel_err.txt");
    ASSERT_TRUE(cli.start(
        {ORDO_CLI_BIN, "--port", std::to_string(server.port()), "--timeout-ms", "60000", "chat",
         "-n", std::to_string(n), "--temp", "0", "--var", "greeting=\"hi there\"", "--usage"},
        out_path, err_path));
    ASSERT_TRUE(cli.write(user1 + "\n"));
    // The prefill has sampled the reply's first token: the turn is running.
    bool running = false;
    for (int i = 0; i < poll_tries_max && !running; i++) {
        running = tokens_generated() > before;
        if (!running) std::this_thread::sleep_for(poll_pause);
    }
    ASSERT_TRUE(running) << read_file(err_path);
    cli.interrupt();
    bool ended = false;
    for (int i = 0; i < poll_tries_max && !ended; i++) {
        ended = !usage_lines(read_file(err_path)).empty();
        if (!ended) std::this_thread::sleep_for(poll_pause);
    }
    ASSERT_TRUE(ended) << read_file(err_path);
    ASSERT_TRUE(cli.write(user2 + "\n"));
    cli.close_stdin();
    EXPECT_EQ(cli.wait_exit(), 0) << read_file(err_path);

    std::string printed = read_file(out_path), errors = read_file(err_path);
    auto lines = usage_lines(errors);
    ASSERT_EQ(lines.size(), 2u) << errors;
    EXPECT_EQ(lines[0].reason, "cancelled");
    EXPECT_LT(lines[0].completion_tokens, n);
    size_t nl = printed.find('\n');
    ASSERT_NE(nl, std::string::npos) << printed;
    std::string partial = printed.substr(0, nl);
    EXPECT_EQ(full.str("text").compare(0, partial.size(), partial), 0)
        << "printed '" << partial << "', full reply '" << full.str("text") << "'";
    message_list second = first;
    second.push_back({{"role", "assistant"}, {"content", partial}});
    second.push_back({{"role", "user"}, {"content", user2}});
    EXPECT_EQ(lines[1].prompt_tokens, prompt_tokens(second));
    event reply2 = chat(second, n);
    EXPECT_EQ(printed.substr(nl + 1), reply2.str("text") + "\n");
}

TEST_F(chat_cli, session_reaches_the_server) {
    std::string kv_dir = temp_path("kv");
    fs::create_directories(kv_dir);
    start(true, "", {"--kv-dir", kv_dir});
    ASSERT_EQ(run_chat(user1 + "\n" + user2 + "\n", "--session talk-1 -n 4 --temp 0 --usage"), 0)
        << err;
    EXPECT_EQ(usage_lines(err).size(), 2u) << err;
    ASSERT_TRUE(c.send(frame("id", ++id, "op", "session_delete", "session", "talk-1")));
    auto done = until_terminal(c, id).back();
    ASSERT_EQ(done.str("event"), "done") << done.outcome();
    const msgpack::object* deleted = field(done.o(), "deleted");
    ASSERT_NE(deleted, nullptr);
    EXPECT_TRUE(deleted->as<bool>());
}

TEST_F(chat_cli, an_error_is_printed_and_the_chat_goes_on_without_that_turn) {
    start(true);
    std::string too_long(1500, 'x');  // more byte tokens than the 1024-token context
    int rc = run_chat(too_long + "\n" + user2 + "\n",
                      "-n 4 --temp 0 --usage --var 'greeting=\"hi there\"'");
    ASSERT_EQ(rc, 0) << err;
    EXPECT_NE(err.find("ordo: context_exceeded: "), std::string::npos) << err;
    auto lines = usage_lines(err);
    ASSERT_EQ(lines.size(), 1u) << err;
    // The failed turn is not in the history: the reply's prompt is the second line alone.
    EXPECT_EQ(lines[0].prompt_tokens, prompt_tokens({{{"role", "user"}, {"content", user2}}}));

    rc = run_chat(user1 + "\n", "--var 'greeting=hi there'");
    EXPECT_EQ(rc, 2) << err;
    EXPECT_NE(err.find("quotes"), std::string::npos) << err;
}

TEST_F(chat_cli, no_chat_template_exits_1) {
    start(false);
    int rc = run_chat(user1 + "\n", "-n 4");
    EXPECT_EQ(rc, 1) << err;
    EXPECT_NE(err.find("ordo: no_chat_template: "), std::string::npos) << err;
    EXPECT_EQ(out, "");
}

TEST_F(chat_cli, python_client_chat_stream_apply_template_and_cancel) {
    start(true);
    auto r = run_command("timeout " + std::to_string(command_timeout_s) +
                         " /usr/bin/python3 " ORDO_SOURCE_DIR
                         "/tests/server/chat_client_check.py --port " +
                         std::to_string(server.port()) + " 2>&1");
    EXPECT_EQ(r.exit_code, 0) << r.output;
}

}  // namespace
