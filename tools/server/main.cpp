// main.cpp: ordo-server's command line. Parses flags, loads and validates the whole config
// before any actor starts (exit 2 on a bad config), sets up logging, loads and checks the model
// (exit 2 on a model that can never run: missing, malformed, a tensor missing or mis-shaped),
// then runs the server (exit 1 when that fails: a runtime failure such as a busy port).
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "actors/config/config.hpp"
#include "actors/runtime/log.hpp"
#include "door/api_keys.hpp"
#include "tools/server/model_load.hpp"
#include "tools/server/server.hpp"

namespace {

constexpr int exit_ok = 0;
constexpr int exit_failure = 1;
constexpr int exit_usage = 2;  // bad flags or bad config
// A model that can never run is refused like a bad config: retrying cannot help, the operator
// must change model.path or the file.
constexpr int exit_bad_model = exit_usage;

constexpr const char* usage_text =
    "usage: ordo-server [--config FILE] [--listen HOST:PORT] [--http-listen HOST:PORT]\n"
    "                   [--model PATH] [--log-level LEVEL] [--kv-dir DIR] [--chat-template FILE]\n"
    "                   [--api-key KEY]... [--print-config]\n"
    "       ordo-server --check-config FILE\n"
    "\n"
    "  --config FILE        TOML configuration (default: built-in defaults, see etc/ordo.toml)\n"
    "  --check-config FILE  validate FILE and exit (0 valid, 2 invalid)\n"
    "  --listen HOST:PORT   override server.listen (port 0 = ephemeral)\n"
    "  --http-listen HOST:PORT  override http.listen, the OpenAI-compatible HTTP API\n"
    "                       (\"\" = no HTTP; port 0 = ephemeral)\n"
    "  --model PATH         override model.path\n"
    "  --log-level LEVEL    override log.level (trace|debug|info|warn|error|critical|off)\n"
    "  --kv-dir DIR         persist KV in DIR (sets kv.dir and kv.enabled = true)\n"
    "  --chat-template FILE the Jinja chat template `chat` renders, instead of the model\n"
    "                       file's (overrides model.chat_template_path)\n"
    "  --api-key KEY        require this API key on both front doors (repeatable; with\n"
    "                       server.api_keys_file's keys, any of them is accepted)\n"
    "  --print-config       print the effective configuration and exit (keys not shown)\n"
    "\n"
    "exit status: 0 stopped cleanly; 1 a runtime failure (a busy port, ...); 2 bad flags, a bad\n"
    "config, or a model that can never run (missing, malformed, a tensor missing or mis-shaped)\n";

struct options {
    std::string config_path;
    std::string check_path;
    std::vector<std::pair<std::string, std::string>> overrides;  // key, value
    std::vector<std::string> api_keys;  // --api-key: secrets, never printed
    bool print_config = false;
};

// Returns false (after printing why) on a bad command line.
bool parse_args(int argc, char** argv, options& o) {
    for (int i = 1; i < argc; i++) {
        std::string_view a = argv[i];
        auto value = [&](const char* flag) -> const char* {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "ordo-server: %s needs a value\n", flag);
                return nullptr;
            }
            return argv[++i];
        };
        const char* v = nullptr;
        if (a == "--help" || a == "-h") {
            std::fputs(usage_text, stdout);
            std::exit(exit_ok);
        } else if (a == "--print-config") {
            o.print_config = true;
        } else if (a == "--config" || a == "--check-config") {
            if (!(v = value(a.data()))) return false;
            (a == "--config" ? o.config_path : o.check_path) = v;
        } else if (a == "--listen" || a == "--http-listen" || a == "--model" ||
                   a == "--log-level" || a == "--chat-template") {
            if (!(v = value(a.data()))) return false;
            const char* key = a == "--listen"          ? "server.listen"
                              : a == "--http-listen"   ? "http.listen"
                              : a == "--model"         ? "model.path"
                              : a == "--chat-template" ? "model.chat_template_path"
                                                       : "log.level";
            o.overrides.emplace_back(key, v);
        } else if (a == "--api-key") {
            if (!(v = value(a.data()))) return false;
            if (std::string why = ordo::door::check_api_key(v); !why.empty()) {
                std::fprintf(stderr, "ordo-server: --api-key: %s\n", why.c_str());
                return false;
            }
            if (o.api_keys.size() == ordo::door::api_keys_max) {
                std::fprintf(stderr, "ordo-server: --api-key: %zu keys at most\n",
                             ordo::door::api_keys_max);
                return false;
            }
            o.api_keys.emplace_back(v);
        } else if (a == "--kv-dir") {
            if (!(v = value(a.data()))) return false;
            o.overrides.emplace_back("kv.dir", v);
            o.overrides.emplace_back("kv.enabled", "true");
        } else {
            std::fprintf(stderr, "ordo-server: unknown argument '%s'\n%s", argv[i], usage_text);
            return false;
        }
    }
    return true;
}

// The keys of server.api_keys_file (none when it is empty) with those of --api-key. Error: the
// file cannot be used (its message names the file, never a key).
ordo::result<ordo::door::api_keys> load_keys(const ordo::config::config& cfg,
                                             const std::vector<std::string>& given) {
    std::vector<std::string> keys = given;
    if (!cfg.server.api_keys_file.empty()) {
        auto from_file = ordo::door::load_api_keys_file(cfg.server.api_keys_file);
        if (!from_file.ok()) return from_file.err();
        keys.insert(keys.end(), from_file->begin(), from_file->end());
    }
    if (keys.size() > ordo::door::api_keys_max) {
        return ordo::make_error("config_invalid", "more than " +
                                                      std::to_string(ordo::door::api_keys_max) +
                                                      " API keys (file and --api-key together)");
    }
    return ordo::door::api_keys(keys);
}

int check_config(const std::string& path) {
    auto cfg = ordo::config::load_file(path);
    if (!cfg.ok()) {
        std::fprintf(stderr, "%s\n", cfg.err().message.c_str());
        return exit_usage;
    }
    if (auto keys = load_keys(*cfg, {}); !keys.ok()) {
        std::fprintf(stderr, "%s\n", keys.err().message.c_str());
        return exit_usage;
    }
    std::printf("%s: ok\n", path.c_str());
    return exit_ok;
}

}  // namespace

int main(int argc, char** argv) {
    // A client that resets its connection makes a socket write fail with EPIPE; without this the
    // kernel would kill the whole server with SIGPIPE instead (issue 13: a client closing
    // mid-stream killed it).
    std::signal(SIGPIPE, SIG_IGN);
    options o;
    if (!parse_args(argc, argv, o)) return exit_usage;
    if (!o.check_path.empty()) return check_config(o.check_path);

    ordo::result<ordo::config::config> cfg =
        o.config_path.empty() ? ordo::result<ordo::config::config>(ordo::config::config{})
                              : ordo::config::load_file(o.config_path);
    if (!cfg.ok()) {
        std::fprintf(stderr, "%s\n", cfg.err().message.c_str());
        return exit_usage;
    }
    for (const auto& [key, value] : o.overrides) {
        if (auto st = ordo::config::apply_override(*cfg, key, value); !st.ok()) {
            std::fprintf(stderr, "%s\n", st.err().message.c_str());
            return exit_usage;
        }
    }
    if (auto st = ordo::config::validate(*cfg, "command line"); !st.ok()) {
        std::fprintf(stderr, "%s\n", st.err().message.c_str());
        return exit_usage;
    }
    if (o.print_config) {
        std::fputs(ordo::config::to_toml(*cfg).c_str(), stdout);
        if (!o.api_keys.empty()) {
            std::printf("# and %zu API key(s) given with --api-key (not shown)\n",
                        o.api_keys.size());
        }
        return exit_ok;
    }
    // Before logging starts: a key file that cannot be used is a bad config (exit 2).
    auto keys = load_keys(*cfg, o.api_keys);
    if (!keys.ok()) {
        std::fprintf(stderr, "%s\n", keys.err().message.c_str());
        return exit_usage;
    }
    std::string level(ordo::config::to_string(cfg->log.level));
    if (auto st = ordo::init_logging(level, cfg->log.file, cfg->log.queue_lines); !st.ok()) {
        std::fprintf(stderr, "ordo-server: %s\n", st.err().message.c_str());
        return exit_usage;
    }
    auto log = ordo::logger("main");
    log->info("ordo-server starting (config: {})",
              o.config_path.empty() ? "built-in defaults" : o.config_path);

    // Before run_server installs its signal watchers: a SIGTERM while the file is read takes
    // the default action, which is right while nothing has started.
    auto model = ordo::load_model(*cfg);
    if (!model.ok()) {
        log->error("{}: {}", model.err().code, model.err().message);
        return exit_bad_model;
    }
    std::optional<ordo::loaded_model> draft;
    if (cfg->speculative.mode == ordo::config::speculative_mode::draft) {
        auto d = ordo::load_draft_model(*cfg, *model);
        if (!d.ok()) {
            log->error("{}: {}", d.err().code, d.err().message);
            return exit_bad_model;
        }
        draft = std::move(*d);
    }

    ordo::server_hooks hooks;
    // One machine-readable line on stdout per front door: scripts and tests wait for them. The
    // HTTP one comes first, so a reader that waits for the protocol's line has both.
    auto print_listening = [](const char* what, const std::string& host, uint16_t port) {
        bool v6 = host.find(':') != std::string::npos;
        std::printf("ordo-server %s on %s%s%s:%u\n", what, v6 ? "[" : "", host.c_str(),
                    v6 ? "]" : "", port);
        std::fflush(stdout);
    };
    hooks.on_http_listening = [&](const std::string& host, uint16_t port) {
        print_listening("http listening", host, port);
    };
    hooks.on_listening = [&](const std::string& host, uint16_t port) {
        print_listening("listening", host, port);
    };
    auto st = ordo::run_server(*cfg, *model, draft ? &*draft : nullptr, hooks, *keys);
    if (!st.ok()) log->error("{}: {}", st.err().code, st.err().message);
    // Every line logged so far reaches stderr (and the file) before exit, unless the reader has
    // stopped reading: then shutdown waits log_flush_ms_max, not forever, and the process ends
    // with _Exit. A normal exit would flush std::cerr, which waits for stderr's lock, and the
    // log writer holds that lock, blocked in write(2) for good. Everything else is already shut
    // down and stdout was flushed after each line.
    const int code = st.ok() ? exit_ok : exit_failure;
    if (!ordo::shutdown_logging()) std::_Exit(code);
    return code;
}
