// load_options.cpp: see load_options.hpp.
#include "bench/ordo_load/load_options.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace ordo::load {

const char* const usage_text =
    "usage: ordo-load [--host H] [--port P]\n"
    "                 | --spawn-server BIN --model FILE [--config FILE]\n"
    "                 [--streams 1,8,16] [--requests R] [--prompt-tokens P | --prompt TEXT]\n"
    "                 [--max-tokens M] [--temperature T] [--seed S] [--label NAME]\n"
    "                 [--duration-max-s S] [--event-timeout-s S] [--startup-timeout-s S]\n"
    "Runs N concurrent streams (one connection each) of R streamed generate requests against\n"
    "ordo-server and prints one JSON line per --streams entry. Defaults: --host 127.0.0.1\n"
    "--port 7070 --streams 1 --requests 1 --prompt-tokens 32 --max-tokens 64\n"
    "--temperature 1 --seed 1 --duration-max-s 300 --event-timeout-s 120\n"
    "--startup-timeout-s 300. Exit 0: every request ended with done; 1: some failed;\n"
    "2: usage; 3: the server could not be reached or started.\n";

namespace {

error usage(const std::string& why) { return make_error("usage", why); }

result<uint64_t> parse_u64(const std::string& flag, const std::string& text, uint64_t lo,
                           uint64_t hi) {
    char* end = nullptr;
    errno = 0;
    unsigned long long v = std::strtoull(text.c_str(), &end, 10);
    bool digits = !text.empty() && text[0] >= '0' && text[0] <= '9';
    if (!digits || *end != '\0' || errno == ERANGE || v < lo || v > hi) {
        return usage(flag + " '" + text + "': must be an integer in [" + std::to_string(lo) +
                     ", " + std::to_string(hi) + "]");
    }
    return static_cast<uint64_t>(v);
}

result<double> parse_temperature(const std::string& text) {
    char* end = nullptr;
    double v = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || !std::isfinite(v) || v < 0 || v > 100) {
        return usage("--temperature '" + text + "': must be a number in [0, 100]");
    }
    return v;
}

// Applies one flag with its value; false when the flag is unknown.
status apply_flag(options& o, const std::string& flag, const std::string& v, bool& known) {
    known = true;
    auto u32 = [&](uint32_t& out, uint64_t lo, uint64_t hi) -> status {
        auto r = parse_u64(flag, v, lo, hi);
        if (!r) return r.err();
        out = static_cast<uint32_t>(*r);
        return {};
    };
    if (flag == "--host") o.host = v;
    else if (flag == "--port") {
        uint32_t p = 0;
        if (auto st = u32(p, 1, 65535); !st) return st;
        o.port = static_cast<uint16_t>(p);
    } else if (flag == "--spawn-server") o.spawn_server = v;
    else if (flag == "--model") o.model = v;
    else if (flag == "--config") o.config = v;
    else if (flag == "--prompt") o.prompt = v;
    else if (flag == "--label") o.label = v;
    else if (flag == "--requests") return u32(o.requests, 1, requests_max);
    else if (flag == "--prompt-tokens") return u32(o.prompt_tokens, 1, prompt_tokens_max);
    else if (flag == "--max-tokens") return u32(o.max_tokens, 1, max_tokens_max);
    else if (flag == "--duration-max-s") return u32(o.duration_max_s, 1, duration_max_s_max);
    else if (flag == "--event-timeout-s") return u32(o.event_timeout_s, 1, timeout_s_max);
    else if (flag == "--startup-timeout-s") return u32(o.startup_timeout_s, 1, timeout_s_max);
    else if (flag == "--seed") {
        auto r = parse_u64(flag, v, 0, UINT32_MAX);  // headroom: seeds are seed + offsets
        if (!r) return r.err();
        o.seed = *r;
    } else if (flag == "--temperature") {
        auto r = parse_temperature(v);
        if (!r) return r.err();
        o.temperature = *r;
    } else if (flag == "--streams") {
        auto r = parse_streams_list(v);
        if (!r) return r.err();
        o.streams = *r;
    } else known = false;
    return {};
}

}  // namespace

result<std::vector<uint32_t>> parse_streams_list(const std::string& text) {
    std::vector<uint32_t> out;
    size_t start = 0;
    while (start <= text.size()) {
        if (out.size() == stream_configs_max) {
            return usage("--streams: at most " + std::to_string(stream_configs_max) + " entries");
        }
        size_t comma = text.find(',', start);
        if (comma == std::string::npos) comma = text.size();
        auto n = parse_u64("--streams", text.substr(start, comma - start), 1, streams_max);
        if (!n) return n.err();
        out.push_back(static_cast<uint32_t>(*n));
        start = comma + 1;
    }
    return out;
}

result<options> parse_options(const std::vector<std::string>& args) {
    options o;
    bool prompt_tokens_given = false;
    for (size_t i = 0; i < args.size(); i++) {
        const std::string& flag = args[i];
        if (i + 1 >= args.size()) return usage(flag + ": unknown flag or missing value");
        bool known = false;
        if (auto st = apply_flag(o, flag, args[i + 1], known); !st) return st.err();
        if (!known) return usage("unknown flag " + flag);
        prompt_tokens_given = prompt_tokens_given || flag == "--prompt-tokens";
        i++;
    }
    if (!o.prompt.empty() && prompt_tokens_given) {
        return usage("--prompt and --prompt-tokens exclude each other");
    }
    if (!o.spawn_server.empty() && o.model.empty()) {
        return usage("--spawn-server needs --model FILE");
    }
    if (o.spawn_server.empty() && (!o.model.empty() || !o.config.empty())) {
        return usage("--model and --config are for --spawn-server");
    }
    if (!o.prompt.empty()) o.prompt_tokens = 0;
    return o;
}

}  // namespace ordo::load
