// main.cpp: `ordo`, the command-line client. Talks the ordo protocol (docs/protocol.md) to a
// running ordo-server: health, stats, model, tokenize, detokenize, generate (streams text to
// the terminal; Ctrl-C cancels the request and waits for its terminal event), and chat (a
// conversation, chat.cpp).
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "tools/client/chat.hpp"
#include "tools/client/cli.hpp"
#include "tools/client/connection.hpp"

namespace ordo::client {

constexpr const char* usage_text =
    "usage: ordo [--host H] [--port P] [--timeout-ms N] [--api-key KEY] COMMAND ...\n"
    "  health | stats | model           print the server's answer\n"
    "  tokenize TEXT [--no-bos]         token ids of TEXT\n"
    "  detokenize ID...                 text of token ids\n"
    "  generate PROMPT [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P]\n"
    "           [--repeat-penalty R] [--presence-penalty P] [--frequency-penalty F]\n"
    "           [--seed S] [--stop TEXT]... [--json]\n"
    "                                   stream a completion (Ctrl-C cancels)\n"
    "  chat [--system TEXT] [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P]\n"
    "       [--repeat-penalty R] [--presence-penalty P] [--frequency-penalty F]\n"
    "       [--seed S] [--stop TEXT]... [--session NAME]\n"
    "       [--var NAME=JSON]... [--usage]\n"
    "                                   a conversation, one message per line of stdin;\n"
    "                                   /reset, /exit or Ctrl-D, /help; Ctrl-C stops a\n"
    "                                   reply; --usage prints done.usage after each\n"
    "defaults: --host 127.0.0.1 --port 7070 --timeout-ms 600000 (per event)\n"
    "--api-key KEY (else the environment's ORDO_API_KEY): sent first, as the `auth` request,\n"
    "to a server that requires API keys\n";

void usage_error(const std::string& why) {
    std::fprintf(stderr, "ordo: %s\n%s", why.c_str(), usage_text);
    std::exit(exit_usage);
}

}  // namespace ordo::client

namespace {

using namespace ordo::client;

options parse_global(int argc, char** argv) {
    options o;
    for (int i = 1; i < argc; i++) {
        std::string_view a = argv[i];
        bool has_value = i + 1 < argc;
        if (a == "--help" || a == "-h") {
            std::fputs(usage_text, stdout);
            std::exit(exit_ok);
        } else if (a == "--host" && has_value) {
            o.host = argv[++i];
        } else if (a == "--port" && has_value) {
            long p = std::strtol(argv[++i], nullptr, 10);
            if (p <= 0 || p > 65535) usage_error("bad --port");
            o.port = static_cast<uint16_t>(p);
        } else if (a == "--timeout-ms" && has_value) {
            o.timeout = std::chrono::milliseconds(std::strtol(argv[++i], nullptr, 10));
        } else if (a == "--api-key" && has_value) {
            o.api_key = argv[++i];
        } else {
            o.args.emplace_back(a);
        }
    }
    if (o.args.empty()) usage_error("no command");
    if (o.api_key.empty()) {
        if (const char* env = std::getenv("ORDO_API_KEY")) o.api_key = env;
    }
    return o;
}

// Sends one request and prints its single terminal event.
int simple_op(connection& c, const options& o, const std::string& op, const request_builder& b) {
    auto ev = exchange(c, b.pack(1, op), o.timeout);
    if (!ev) return exit_unreachable;
    if (get_str(ev->get(), "event") == "error") return report_error(ev->get());
    std::cout << ev->get() << "\n";
    return exit_ok;
}

void parse_generate_flags(const std::vector<std::string>& a, request_builder& b, bool& json) {
    std::vector<std::string> stops;
    for (size_t i = 2; i < a.size(); i++) {
        if (parse_sampling_flag(a, i, b)) continue;
        if (a[i] == "--stop") {
            if (i + 1 >= a.size()) usage_error("--stop needs a value");
            stops.push_back(a[++i]);
        } else if (a[i] == "--json") {
            json = true;
        } else {
            usage_error("unknown generate flag " + a[i]);
        }
    }
    if (!stops.empty()) b.add("stop", stops);
}

int generate(connection& c, const options& o) {
    if (o.args.size() < 2) usage_error("generate needs a PROMPT");
    request_builder b;
    b.add("prompt", o.args[1]);
    b.add("stream", true);
    bool json = false;
    try {
        parse_generate_flags(o.args, b, json);
    } catch (const std::exception&) {
        usage_error("bad number in generate flags");
    }
    sigint_install();
    if (auto st = c.send(b.pack(1, "generate")); !st.ok()) return exit_unreachable;
    bool cancel_sent = false;
    while (true) {
        if (sigint_pending() && !cancel_sent) {
            // The server answers the cancel itself and ends request 1 with done{cancelled}.
            request_builder cancel;
            cancel.add("target", uint64_t{1});
            (void)c.send(cancel.pack(2, "cancel"));
            cancel_sent = true;
        }
        auto ev = c.recv(o.timeout);
        if (!ev.ok() && ev.err().code == "interrupted") continue;
        if (!ev.ok()) {
            std::fprintf(stderr, "\nordo: %s\n", ev.err().message.c_str());
            return exit_unreachable;
        }
        const auto& e = ev->get();
        if (event_id(e) != 1) continue;  // the cancel request's own answer
        std::string kind = get_str(e, "event");
        if (kind == "token") {
            if (!json) std::fputs(get_str(e, "text").c_str(), stdout), std::fflush(stdout);
        } else if (kind == "error") {
            return report_error(e);
        } else if (kind == "done") {
            if (json)
                std::cout << e << "\n";
            else
                std::printf("\n"), std::fprintf(stderr, "[%s]\n", get_str(e, "reason").c_str());
            return exit_ok;
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    options o = parse_global(argc, argv);
    connection c;
    if (auto st = c.open(o.host, o.port, std::chrono::milliseconds(5000)); !st.ok()) {
        std::fprintf(stderr, "ordo: %s\n", st.err().message.c_str());
        return exit_unreachable;
    }
    if (!o.api_key.empty()) {
        // The first request on the connection; a refused key is unauthorized (exit 1) and the
        // server closes the connection.
        request_builder auth;
        auth.add("key", o.api_key);
        auto ev = exchange(c, auth.pack(1, "auth"), o.timeout);
        if (!ev) return exit_unreachable;
        if (get_str(ev->get(), "event") == "error") return report_error(ev->get());
    }
    const std::string& cmd = o.args[0];
    request_builder b;
    if (cmd == "health" || cmd == "stats" || cmd == "model") return simple_op(c, o, cmd, b);
    if (cmd == "tokenize") {
        if (o.args.size() < 2) usage_error("tokenize needs TEXT");
        b.add("text", o.args[1]);
        if (o.args.size() > 2 && o.args[2] == "--no-bos") b.add("add_bos", false);
        return simple_op(c, o, cmd, b);
    }
    if (cmd == "detokenize") {
        std::vector<int64_t> ids;
        for (size_t i = 1; i < o.args.size(); i++) ids.push_back(std::stoll(o.args[i]));
        b.add("tokens", ids);
        return simple_op(c, o, cmd, b);
    }
    if (cmd == "generate") return generate(c, o);
    if (cmd == "chat") return run_chat(c, o);
    usage_error("unknown command " + cmd);
}
