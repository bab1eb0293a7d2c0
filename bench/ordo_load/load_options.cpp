// load_options.cpp: see load_options.hpp.
#include "bench/ordo_load/load_options.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace ordo::load {

const char* const usage_text =
    "usage: ordo-load [--protocol msgpack|http] [--host H] [--port P]\n"
    "                 | --spawn-server BIN --model FILE [--config FILE]\n"
    "                 [--streams 1,8,16] [--requests R] [--prompt-tokens P | --prompt TEXT]\n"
    "                 [--max-tokens M] [--temperature T] [--top-k K] [--top-p P] [--min-p P]\n"
    "                 [--seed S] [--vocab-size V] [--ramp-s S] [--label NAME]\n"
    "                 [--duration-max-s S] [--event-timeout-s S] [--startup-timeout-s S]\n"
    "Runs N concurrent streams (one connection each) of R streamed requests one after another\n"
    "and prints one JSON line per --streams entry. msgpack: generate over ordo's TCP protocol;\n"
    "http: POST /v1/completions with stream and include_usage (ordo-server's HTTP front door,\n"
    "or any OpenAI-compatible server such as llama.cpp's llama-server; the model id and\n"
    "vocabulary come from GET /v1/models, else give --vocab-size). --ramp-s spreads the\n"
    "streams' first requests over S seconds. Sampler options are sent only when given.\n"
    "Defaults: --protocol msgpack --host 127.0.0.1 --port 7070 (http: 8080) --streams 1\n"
    "--requests 1 --prompt-tokens 32 --max-tokens 64 --temperature 1 --seed 1 --ramp-s 0\n"
    "--duration-max-s 300 --event-timeout-s 120 --startup-timeout-s 300. Exit 0: every\n"
    "request ended with done; 1: some failed; 2: usage; 3: the server could not be reached\n"
    "or started.\n";

namespace {

error usage(const std::string& why) {
    return make_error("usage", why);
}

std::string format_number(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

result<uint64_t> parse_u64(const std::string& flag, const std::string& text, uint64_t lo,
                           uint64_t hi) {
    char* end = nullptr;
    errno = 0;
    unsigned long long v = std::strtoull(text.c_str(), &end, 10);
    bool digits = !text.empty() && text[0] >= '0' && text[0] <= '9';
    if (!digits || *end != '\0' || errno == ERANGE || v < lo || v > hi) {
        return usage(flag + " '" + text + "': must be an integer in [" + std::to_string(lo) + ", " +
                     std::to_string(hi) + "]");
    }
    return static_cast<uint64_t>(v);
}

result<double> parse_number(const std::string& flag, const std::string& text, double lo,
                            double hi) {
    char* end = nullptr;
    double v = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || !std::isfinite(v) || v < lo || v > hi) {
        return usage(flag + " '" + text + "': must be a number in [" + format_number(lo) + ", " +
                     format_number(hi) + "]");
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
    if (flag == "--host")
        o.host = v;
    else if (flag == "--port") {
        uint32_t p = 0;
        if (auto st = u32(p, 1, 65535); !st) return st;
        o.port = static_cast<uint16_t>(p);
    } else if (flag == "--spawn-server")
        o.spawn_server = v;
    else if (flag == "--model")
        o.model = v;
    else if (flag == "--config")
        o.config = v;
    else if (flag == "--prompt")
        o.prompt = v;
    else if (flag == "--label")
        o.label = v;
    else if (flag == "--requests")
        return u32(o.requests, 1, requests_max);
    else if (flag == "--prompt-tokens")
        return u32(o.prompt_tokens, 1, prompt_tokens_max);
    else if (flag == "--max-tokens")
        return u32(o.max_tokens, 1, max_tokens_max);
    else if (flag == "--duration-max-s")
        return u32(o.duration_max_s, 1, duration_max_s_max);
    else if (flag == "--event-timeout-s")
        return u32(o.event_timeout_s, 1, timeout_s_max);
    else if (flag == "--startup-timeout-s")
        return u32(o.startup_timeout_s, 1, timeout_s_max);
    else if (flag == "--seed") {
        auto r = parse_u64(flag, v, 0, UINT32_MAX);  // headroom: seeds are seed + offsets
        if (!r) return r.err();
        o.seed = *r;
    } else if (flag == "--temperature") {
        auto r = parse_number(flag, v, 0, 100);
        if (!r) return r.err();
        o.temperature = *r;
    } else if (flag == "--top-p" || flag == "--min-p") {
        auto r = parse_number(flag, v, 0, 1);
        if (!r) return r.err();
        (flag == "--top-p" ? o.sampler.top_p : o.sampler.min_p) = *r;
    } else if (flag == "--ramp-s") {
        auto r = parse_number(flag, v, 0, ramp_s_max);
        if (!r) return r.err();
        o.ramp_s = *r;
    } else if (flag == "--top-k") {
        auto r = parse_u64(flag, v, 0, top_k_max);
        if (!r) return r.err();
        o.sampler.top_k = static_cast<int32_t>(*r);
    } else if (flag == "--vocab-size") {
        return u32(o.vocab_size, first_ordinary_token + 1, UINT32_MAX);
    } else if (flag == "--protocol") {
        if (v != "msgpack" && v != "http") {
            return usage("--protocol '" + v + "': must be msgpack or http");
        }
        o.protocol = v == "http" ? wire::http : wire::msgpack;
    } else if (flag == "--streams") {
        auto r = parse_streams_list(v);
        if (!r) return r.err();
        o.streams = *r;
    } else
        known = false;
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
    if (o.port == 0) o.port = o.protocol == wire::http ? 8080 : 7070;
    return o;
}

}  // namespace ordo::load
