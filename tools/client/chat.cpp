// chat.cpp: `ordo chat`, a conversation with the served model in the terminal: one `chat`
// request per turn (docs/protocol.md "chat"), the whole history each time.
//
// The loop: read a line from stdin, send the history with op `chat` and `stream: true`, write
// the text of the token events to stdout as they arrive, and on the terminal event update the
// history (chat_state.hpp has the rules: a reply is done.text; a failed turn is taken back).
// Ctrl-C during a reply sends one `cancel` for it and goes on reading until its terminal event,
// done{cancelled}, whose partial text stays in the history; Ctrl-C at the prompt prints a hint.
// Ctrl-D (end of input) or /exit leaves with 0.
//
// stdin may be a pipe (scripts, tests): each line is one user message and no prompt is
// printed; the "> " prompt and the greeting appear only when stdin is a terminal. Replies go
// to stdout, one per turn, each ended by a newline; everything else (errors, reasons, usage)
// goes to stderr, so stdout holds the replies alone.
//
// Request ids: 1 is the model op sent at start; each turn and each cancel takes the next one,
// so a cancel's own answer arriving late is never taken for the current turn's events.
#include "tools/client/chat.hpp"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>
#include <vector>

#include "tools/client/chat_state.hpp"

namespace ordo::client {
namespace {

constexpr uint64_t model_request_id = 1;
constexpr size_t stdin_chunk_bytes = 4096;

constexpr const char* help_text =
    "each line is a message; the whole conversation is sent with every turn.\n"
    "  /reset  start over (the --system prompt stays)\n"
    "  /exit   leave (also Ctrl-D)\n"
    "  /help   this text\n"
    "  Ctrl-C  stop the reply being written (what was written stays in the conversation)\n";

struct chat_flags {
    request_builder base;  // every turn's parameters but `messages` and `stream`
    std::string system;    // "" = no system message
    bool usage = false;    // print the reason and done.usage on stderr after each reply
};

void parse_chat_flags(const std::vector<std::string>& a, chat_flags& f) {
    std::vector<std::string> stops;
    std::vector<template_var> vars;
    auto value = [&](size_t& i) -> const std::string& {
        if (i + 1 >= a.size()) usage_error(a[i] + " needs a value");
        return a[++i];
    };
    for (size_t i = 1; i < a.size(); i++) {
        if (parse_sampling_flag(a, i, f.base)) continue;
        if (a[i] == "--system") {
            f.system = value(i);
        } else if (a[i] == "--session") {
            f.base.add("session", value(i));
        } else if (a[i] == "--stop") {
            stops.push_back(value(i));
        } else if (a[i] == "--usage") {
            f.usage = true;
        } else if (a[i] == "--var") {
            auto v = parse_var(value(i));
            if (!v.ok()) usage_error(v.err().message);
            vars.push_back(std::move(*v));
        } else {
            usage_error("unknown chat flag " + a[i]);
        }
    }
    if (!stops.empty()) f.base.add("stop", stops);
    if (!vars.empty()) {
        msgpack::sbuffer packed = pack_vars(vars);
        msgpack::object_handle kwargs = msgpack::unpack(packed.data(), packed.size());
        f.base.add("chat_template_kwargs", kwargs.get());  // a deep copy into f.base.zone
    }
}

uint64_t get_uint(const msgpack::object* map, std::string_view key) {
    const auto* v = map != nullptr ? find(*map, key) : nullptr;
    return v != nullptr && v->type == msgpack::type::POSITIVE_INTEGER ? v->via.u64 : 0;
}

double get_double(const msgpack::object* map, std::string_view key) {
    const auto* v = map != nullptr ? find(*map, key) : nullptr;
    if (v == nullptr) return 0.0;
    if (v->type == msgpack::type::FLOAT32 || v->type == msgpack::type::FLOAT64) return v->via.f64;
    return v->type == msgpack::type::POSITIVE_INTEGER ? static_cast<double>(v->via.u64) : 0.0;
}

// Errors after which no later turn can succeed, whatever the user types: the chat ends (exit 1)
// instead of prompting again. unknown_op is a server older than the chat op. Any other error
// (context_exceeded, template_error, gpu_failed, bad_request, ...) is printed and the
// conversation goes on without the failed turn.
bool ends_chat(std::string_view code) {
    return code == "no_chat_template" || code == "unknown_op" || code == "tokenizer_unsupported" ||
           code == "shutting_down" || code == "gpu_unavailable";
}

// Sends the model op and reads its answer. It is the connection's first frame: the server
// closes a connection that sends nothing for server.read_timeout_ms after connecting, and a
// person may take longer than that to type the first message. Its `chat_template` says whether
// there is a template at all ("none": exit 1 now, not after the first message). Returns an
// exit code, or -1 to go on.
int check_model(connection& c, const options& o, bool tty) {
    auto ev = exchange(c, request_builder{}.pack(model_request_id, "model"), o.timeout);
    if (!ev) return exit_unreachable;
    const msgpack::object& e = ev->get();
    if (get_str(e, "event") == "error") return report_error(e);
    std::string path = get_str(e, "path"), source = get_str(e, "chat_template");
    if (source == "none") {
        std::fprintf(stderr,
                     "ordo: no_chat_template: the model %s has no chat template; start "
                     "ordo-server with --chat-template FILE (or set model.chat_template_path)\n",
                     path.c_str());
        return exit_server_error;
    }
    if (tty) {
        std::fprintf(stderr, "ordo chat: %s (chat template: %s); /help lists the commands\n",
                     path.c_str(), source.empty() ? "?" : source.c_str());
    }
    return -1;
}

enum class input { line, end, interrupted };

// The next line of stdin. Waits in poll() with no deadline, since this is a person typing (the
// server does not time a connection idle between frames); Ctrl-C meanwhile returns
// `interrupted`.
input read_line(line_buffer& in, std::string& line) {
    while (true) {
        switch (in.take(line)) {
            case line_buffer::status::line:
                return input::line;
            case line_buffer::status::end:
                return input::end;
            case line_buffer::status::too_long:
                std::fprintf(stderr, "ordo: a line longer than %zu bytes was skipped\n",
                             line_buffer::line_bytes_max);
                continue;
            case line_buffer::status::need_more:
                break;
        }
        if (sigint_pending()) return input::interrupted;
        pollfd p{STDIN_FILENO, POLLIN, 0};
        if (poll(&p, 1, -1) < 0) {
            if (errno != EINTR) in.feed_eof();
            continue;
        }
        char chunk[stdin_chunk_bytes];
        ssize_t n = ::read(STDIN_FILENO, chunk, sizeof chunk);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n <= 0) {
            in.feed_eof();
        } else {
            in.feed({chunk, static_cast<size_t>(n)});
        }
    }
}

enum class turn_outcome { done, error, lost };

struct turn_end {
    turn_outcome outcome = turn_outcome::lost;  // lost: the connection failed (already printed)
    msgpack::object_handle terminal;            // the done or error event
    bool printed = false;                       // some reply text reached stdout
};

// Sends one turn and writes its reply to stdout until the terminal event. Ctrl-C sends one
// cancel and reading goes on: the turn ends with done{cancelled}, or with the outcome of the
// step that was running when the cancel arrived (docs/protocol.md "cancel"). Every read waits
// at most o.timeout.
turn_end run_turn(connection& c, const options& o, const msgpack::sbuffer& request, uint64_t id,
                  uint64_t& next_id) {
    turn_end t;
    bool cancel_sent = false;
    auto fail = [&](const std::string& why) {
        std::fprintf(stderr, "%sordo: %s\n", t.printed ? "\n" : "", why.c_str());
        return std::move(t);
    };
    if (auto st = c.send(request); !st.ok()) return fail(st.err().message);
    while (true) {
        if (sigint_pending() && !cancel_sent) {
            request_builder cancel;
            cancel.add("target", id);
            if (auto st = c.send(cancel.pack(next_id++, "cancel")); !st.ok()) {
                return fail(st.err().message);
            }
            cancel_sent = true;
        }
        auto ev = c.recv(o.timeout);
        if (!ev.ok() && ev.err().code == "interrupted") continue;
        if (!ev.ok()) return fail(ev.err().message);
        const msgpack::object& e = ev->get();
        uint64_t eid = event_id(e);
        if (eid == 0) {  // a connection-level error: the server closes the connection
            return fail(get_str(e, "code") + ": " + get_str(e, "message"));
        }
        if (eid != id) continue;  // a cancel's own answer
        std::string kind = get_str(e, "event");
        if (kind == "token") {
            std::string text = get_str(e, "text");
            std::fwrite(text.data(), 1, text.size(), stdout);
            std::fflush(stdout);
            t.printed = t.printed || !text.empty();
        } else if (kind == "done" || kind == "error") {
            t.outcome = kind == "done" ? turn_outcome::done : turn_outcome::error;
            t.terminal = std::move(*ev);
            return t;
        }
    }
}

// After a reply: its reason on stderr when it is not a plain stop, or with --usage always,
// with done.usage.
void print_reply_end(const msgpack::object& done, bool usage) {
    std::string reason = get_str(done, "reason");
    if (!usage) {
        if (reason != "stop") std::fprintf(stderr, "[%s]\n", reason.c_str());
        return;
    }
    const msgpack::object* u = find(done, "usage");
    std::fprintf(stderr,
                 "[%s] prompt_tokens=%llu cached_tokens=%llu completion_tokens=%llu "
                 "prefill_ms=%.1f decode_ms=%.1f\n",
                 reason.c_str(), static_cast<unsigned long long>(get_uint(u, "prompt_tokens")),
                 static_cast<unsigned long long>(get_uint(u, "cached_tokens")),
                 static_cast<unsigned long long>(get_uint(u, "completion_tokens")),
                 get_double(u, "prefill_ms"), get_double(u, "decode_ms"));
}

// Applies a turn's end to the history and tells the user. Returns an exit code when the chat
// must end, -1 to go on.
int finish_turn(conversation& conv, const chat_flags& f, const turn_end& t) {
    if (t.outcome == turn_outcome::lost) {
        conv.abandon_turn();
        return exit_unreachable;
    }
    const msgpack::object& e = t.terminal.get();
    if (t.outcome == turn_outcome::done) {
        conv.end_turn(get_str(e, "text"));
        std::fputc('\n', stdout);
        std::fflush(stdout);
        print_reply_end(e, f.usage);
        return -1;
    }
    conv.abandon_turn();
    if (t.printed) std::fputc('\n', stdout), std::fflush(stdout);
    report_error(e);
    std::string code = get_str(e, "code");
    if (ends_chat(code)) return exit_server_error;
    if (code == "context_exceeded") {
        std::fputs("ordo: the conversation no longer fits the context; /reset starts over\n",
                   stderr);
    }
    return -1;
}

// A command line (/reset, /help, ...): acts on it; false when the chat should end (/exit).
bool run_command_line(line_kind kind, const std::string& line, conversation& conv, bool tty) {
    switch (kind) {
        case line_kind::exit:
            return false;
        case line_kind::reset:
            conv.reset();
            if (tty) std::fputs("(conversation cleared)\n", stderr);
            return true;
        case line_kind::help:
            std::fputs(help_text, stderr);
            return true;
        case line_kind::unknown_command:
            std::fprintf(stderr, "ordo: unknown command %s (/help lists them)\n", line.c_str());
            return true;
        case line_kind::blank:
        case line_kind::message:
            return true;
    }
    return true;
}

}  // namespace

int run_chat(connection& c, const options& o) {
    chat_flags f;
    try {
        parse_chat_flags(o.args, f);
    } catch (const std::exception&) {
        usage_error("bad number in chat flags");
    }
    const bool tty = isatty(STDIN_FILENO) != 0;
    // Ctrl-C still ends the program while it waits for the model op; from here on it is ours.
    if (int rc = check_model(c, o, tty); rc >= 0) return rc;
    sigint_install();
    conversation conv(f.system);
    line_buffer in;
    uint64_t next_id = model_request_id + 1;
    std::string line;
    while (true) {
        if (tty) std::fputs("> ", stdout), std::fflush(stdout);
        input got = read_line(in, line);
        if (got == input::end) {
            if (tty) std::fputc('\n', stdout);
            return exit_ok;
        }
        if (got == input::interrupted) {
            sigint_clear();
            std::fputs("\n(Ctrl-D or /exit leaves; Ctrl-C stops a reply; /help)\n", stderr);
            continue;
        }
        line_kind kind = classify_line(line);
        if (kind != line_kind::message) {
            if (!run_command_line(kind, line, conv, tty)) return exit_ok;
            continue;
        }
        if (!conv.begin_turn(line)) {
            std::fprintf(stderr,
                         "ordo: the conversation holds %zu messages, the most a chat "
                         "request takes; /reset starts over\n",
                         conv.messages().size());
            continue;
        }
        uint64_t id = next_id++;
        request_builder turn;
        turn.fields = f.base.fields;  // their objects live in f.base.zone, which outlives `turn`
        turn.add("messages", conv.messages());
        turn.add("stream", true);
        turn_end t = run_turn(c, o, turn.pack(id, "chat"), id, next_id);
        sigint_clear();  // a Ctrl-C that came after the reply ended was meant for that reply
        if (int rc = finish_turn(conv, f, t); rc >= 0) return rc;
    }
}

}  // namespace ordo::client
