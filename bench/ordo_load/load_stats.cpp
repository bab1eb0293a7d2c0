// load_stats.cpp: see load_stats.hpp.
#include "bench/ordo_load/load_stats.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>

namespace ordo::load {
namespace {

// Length of the valid UTF-8 sequence starting at s[i], or 0 when it is not one.
size_t utf8_sequence_length(const std::string& s, size_t i) {
    auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
    unsigned char b = byte(i);
    size_t n = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return 0;
    for (size_t k = 1; k < n; k++) {
        if ((byte(i + k) >> 6) != 0x2) return 0;
    }
    return n;
}

std::string number(std::optional<double> v) {
    if (!v || !std::isfinite(*v)) return "null";
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3f", *v);
    return buf;
}

}  // namespace

std::optional<double> percentile(std::vector<double> values, double p) {
    assert(p > 0 && p <= 100);
    if (values.empty()) return std::nullopt;
    std::sort(values.begin(), values.end());
    // Nearest rank: the smallest value with at least p% of the values at or below it.
    auto rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(values.size())));
    rank = std::clamp<size_t>(rank, 1, values.size());
    return values[rank - 1];
}

run_summary summarize(uint32_t streams, const std::vector<request_sample>& samples, double wall_s) {
    run_summary s;
    s.streams = streams;
    s.wall_s = wall_s;
    std::vector<double> ttft, itl;
    for (const auto& r : samples) {
        s.requests++;
        s.tokens += r.tokens;
        if (r.ok) {
            s.requests_ok++;
        } else {
            assert(!r.error_code.empty());
            s.errors[r.error_code]++;
        }
        if (r.ttft_ms) ttft.push_back(*r.ttft_ms);
        itl.insert(itl.end(), r.itl_ms.begin(), r.itl_ms.end());
    }
    s.aggregate_tok_s = wall_s > 0 ? static_cast<double>(s.tokens) / wall_s : 0;
    s.ttft_ms_p50 = percentile(ttft, 50);
    s.ttft_ms_p99 = percentile(ttft, 99);
    s.itl_ms_p50 = percentile(itl, 50);
    s.itl_ms_p99 = percentile(itl, 99);
    if (!itl.empty()) {
        double sum = 0;
        for (double v : itl) sum += v;
        s.itl_ms_mean = sum / static_cast<double>(itl.size());
        if (*s.itl_ms_mean > 0) s.decode_tok_s_per_stream = 1000.0 / *s.itl_ms_mean;
    }
    return s;
}

std::string json_quote(const std::string& text) {
    std::string out = "\"";
    for (size_t i = 0; i < text.size();) {
        auto c = static_cast<unsigned char>(text[i]);
        size_t n = utf8_sequence_length(text, i);
        if (n == 0) {
            out += "\\ufffd";  // not UTF-8: JSON text must be, so say a byte was replaced
            i++;
        } else if (c == '"' || c == '\\') {
            out += '\\', out += static_cast<char>(c), i++;
        } else if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf, i++;
        } else {
            out.append(text, i, n), i += n;
        }
    }
    return out + "\"";
}

std::string to_json_line(const run_summary& s, const run_labels& labels) {
    std::string errors = "{";
    for (const auto& [code, count] : s.errors) {
        if (errors.size() > 1) errors += ", ";
        errors += json_quote(code) + ": " + std::to_string(count);
    }
    errors += "}";
    std::string j = "{\"test\": \"load\"";
    j += ", \"streams\": " + std::to_string(s.streams);
    j += ", \"requests\": " + std::to_string(s.requests);
    j += ", \"requests_ok\": " + std::to_string(s.requests_ok);
    j += ", \"tokens\": " + std::to_string(s.tokens);
    j += ", \"aggregate_tok_s\": " + number(s.aggregate_tok_s);
    j += ", \"ttft_ms_p50\": " + number(s.ttft_ms_p50);
    j += ", \"ttft_ms_p99\": " + number(s.ttft_ms_p99);
    j += ", \"itl_ms_p50\": " + number(s.itl_ms_p50);
    j += ", \"itl_ms_p99\": " + number(s.itl_ms_p99);
    j += ", \"itl_ms_mean\": " + number(s.itl_ms_mean);
    j += ", \"decode_tok_s_per_stream\": " + number(s.decode_tok_s_per_stream);
    j += ", \"errors\": " + errors;
    j += ", \"model\": " + json_quote(labels.model);
    j += ", \"prompt_tokens\": " + std::to_string(labels.prompt_tokens);
    j += ", \"max_tokens\": " + std::to_string(labels.max_tokens);
    j += ", \"temperature\": " + number(labels.temperature);
    j += ", \"protocol\": " + json_quote(labels.protocol);
    j += ", \"ramp_s\": " + number(labels.ramp_s);
    j += ", \"wall_s\": " + number(s.wall_s);
    return j + "}";
}

}  // namespace ordo::load
