// load_stream.cpp: see load_stream.hpp.
#include "bench/ordo_load/load_stream.hpp"

#include <algorithm>
#include <cassert>
#include <thread>

#include "actors/runtime/splitmix64.hpp"
#include "bench/ordo_load/http_stream.hpp"
#include "tools/client/connection.hpp"

namespace ordo::load {
namespace {

using client::connection;
using client::find;
using client::get_str;
using std::chrono::milliseconds;

msgpack::sbuffer generate_frame(const stream_plan& plan, uint32_t r, uint64_t id) {
    msgpack::sbuffer buf;
    msgpack::packer<msgpack::sbuffer> pk(buf);
    const sampler_options& so = plan.sampler;
    pk.pack_map(7 + uint32_t(so.top_k.has_value()) + uint32_t(so.top_p.has_value()) +
                uint32_t(so.min_p.has_value()));
    pk.pack("id"), pk.pack(id);
    pk.pack("op"), pk.pack("generate");
    if (plan.prompt_tokens == 0) {
        pk.pack("prompt"), pk.pack(plan.prompt_text);
    } else {
        // Distinct per request, so the prefix cache does not turn the run into cache hits.
        pk.pack("tokens"),
            pk.pack(random_prompt(plan.seed_first + r, plan.prompt_tokens, plan.vocab_size));
    }
    pk.pack("max_tokens"), pk.pack(plan.max_tokens);
    pk.pack("temperature"), pk.pack(plan.temperature);
    pk.pack("seed"), pk.pack(plan.seed_first + r);
    pk.pack("stream"), pk.pack(true);
    if (so.top_k) pk.pack("top_k"), pk.pack(*so.top_k);
    if (so.top_p) pk.pack("top_p"), pk.pack(*so.top_p);
    if (so.min_p) pk.pack("min_p"), pk.pack(*so.min_p);
    return buf;
}

uint64_t event_id(const msgpack::object& ev) {
    const auto* id = find(ev, "id");
    return id && id->type == msgpack::type::POSITIVE_INTEGER ? id->via.u64 : 0;
}

// Reads the next event in bounded slices (event_wait), and the connection's "closed" /
// "bad_frame".
result<msgpack::object_handle> next_event(connection& c, const stream_plan& plan,
                                          run_control& control) {
    event_wait wait(plan, control);
    while (true) {
        auto slice = wait.next_slice();
        if (!slice.ok()) return slice.err();
        auto r = c.recv(*slice);
        if (r.ok()) return r;
        if (r.err().code != "timeout" && r.err().code != "interrupted") return r;
    }
}

request_sample failed_sample(const char* code) {
    request_sample s;
    s.error_code = code;
    return s;
}

// What ended one request, as the stream needs it: whether the connection is still usable.
enum class outcome { next_request, end_stream };

// Applies a terminal event to `s`.
void on_terminal(const msgpack::object& ev, request_sample& s) {
    if (get_str(ev, "event") == "error") {
        s.error_code = get_str(ev, "code");
        if (s.error_code.empty()) s.error_code = "error_without_code";
        return;
    }
    std::string reason = get_str(ev, "reason");
    const auto* tokens = find(ev, "tokens");
    if (reason != "stop" && reason != "length") {
        s.error_code = reason == "cancelled" ? "cancelled" : "bad_done_reason";
    } else if (!tokens || tokens->type != msgpack::type::ARRAY ||
               tokens->via.array.size != s.tokens) {
        // Every generated token is streamed (docs/protocol.md): a mismatch is a server bug.
        s.error_code = "token_count_mismatch";
    } else {
        s.ok = true;
    }
}

// Sends request `r` and reads its events until its terminal one.
outcome run_request(connection& c, const stream_plan& plan, uint32_t r, uint64_t id,
                    run_control& control, request_sample& s) {
    auto t0 = clock::now();
    auto last_token = t0;
    if (auto st = c.send(generate_frame(plan, r, id)); !st.ok()) {
        s.error_code = "closed";
        return outcome::end_stream;
    }
    uint32_t events_max = plan.max_tokens + 1 + stray_events_max;
    for (uint32_t n = 0; n < events_max; n++) {
        auto ev = next_event(c, plan, control);
        auto now = clock::now();
        s.total_ms = ms_between(t0, now);
        if (!ev.ok()) {
            s.error_code = ev.err().code;
            return outcome::end_stream;
        }
        const auto& e = ev->get();
        if (event_id(e) != id) continue;  // not ours: nothing else is in flight, so ignore it
        std::string kind = get_str(e, "event");
        if (kind == "token") {
            if (s.tokens == 0)
                s.ttft_ms = ms_between(t0, now);
            else
                s.itl_ms.push_back(ms_between(last_token, now));
            last_token = now;
            s.tokens++;
        } else if (kind == "done" || kind == "error") {
            on_terminal(e, s);
            return outcome::next_request;
        }
    }
    s.error_code = "too_many_events";
    return outcome::end_stream;
}

}  // namespace

event_wait::event_wait(const stream_plan& plan, const run_control& control)
    : _control(control),
      _silent_until(clock::now() + plan.event_timeout),
      _slices_max(4 * (plan.event_timeout / read_slice + 2)) {}

result<milliseconds> event_wait::next_slice() {
    auto now = clock::now();
    if (now >= _control.deadline) return make_error("duration_exceeded", "run deadline");
    if (_control.stop.load()) return make_error("aborted", "run stopped");
    if (now >= _silent_until || _slices++ >= _slices_max) {
        return make_error("timeout", "no event from the server within event_timeout");
    }
    // Rounded up: a slice truncated to 0 ms returns at once, and the last millisecond before
    // the deadline became a spin that used up _slices_max and ended the request as "timeout"
    // instead of "duration_exceeded" (seen on a loaded machine).
    auto left = std::chrono::ceil<milliseconds>(std::min(_silent_until, _control.deadline) - now);
    return std::min(read_slice, left + milliseconds(1));
}

std::vector<request_sample> run_stream(const stream_plan& plan, run_control& control,
                                       std::latch& ready) {
    assert(plan.prompt_tokens == 0 || plan.vocab_size > first_ordinary_token);
    std::vector<request_sample> samples;
    connection c;
    auto opened = c.open(plan.host, plan.port, connect_timeout);
    ready.arrive_and_wait();
    if (!opened.ok()) {
        samples.push_back(failed_sample("unreachable"));
        return samples;
    }
    // --ramp-s: this stream's first request waits its turn, in slices so a stop is seen.
    for (auto start = clock::now() + plan.start_delay; clock::now() < start;) {
        if (control.stop.load() || clock::now() >= control.deadline) break;
        std::this_thread::sleep_for(
            std::min<clock::duration>(event_wait::read_slice, start - clock::now()));
    }
    for (uint32_t r = 0; r < plan.requests; r++) {
        if (control.stop.load() || clock::now() >= control.deadline) {
            // Cut short between two requests: one failed sample says the plan did not finish.
            bool late = clock::now() >= control.deadline;
            samples.push_back(failed_sample(late ? "duration_exceeded" : "aborted"));
            break;
        }
        request_sample s;
        bool again = plan.protocol == wire::http
                         ? run_http_request(c, plan, r, control, s)
                         : run_request(c, plan, r, r + 1, control, s) == outcome::next_request;
        assert(s.ok != !s.error_code.empty());
        samples.push_back(std::move(s));
        if (!again) break;
    }
    return samples;
}

std::vector<int32_t> random_prompt(uint64_t seed, uint32_t count, uint32_t vocab_size) {
    assert(vocab_size > first_ordinary_token);
    uint64_t state = seed;
    std::vector<int32_t> ids(count);
    for (auto& id : ids) {
        id = static_cast<int32_t>(first_ordinary_token +
                                  splitmix64_next(state) % (vocab_size - first_ordinary_token));
    }
    return ids;
}

status wait_healthy(const std::string& host, uint16_t port, clock::time_point deadline,
                    const run_control& control) {
    connection c;
    auto left = [&] {
        return std::max(milliseconds(1),
                        std::chrono::duration_cast<milliseconds>(deadline - clock::now()));
    };
    if (auto st = c.open(host, port, std::min(connect_timeout, left())); !st.ok()) {
        return make_error("unreachable", st.err().message);
    }
    std::string last = "no answer";
    for (uint32_t i = 1; i <= health_polls_max; i++) {
        if (control.stop.load() || clock::now() >= deadline) break;
        msgpack::sbuffer buf;
        msgpack::packer<msgpack::sbuffer> pk(buf);
        pk.pack_map(2), pk.pack("id"), pk.pack(uint64_t{i}), pk.pack("op"), pk.pack("health");
        if (auto st = c.send(buf); !st.ok()) return make_error("unreachable", st.err().message);
        auto ev = c.recv(left());
        if (!ev.ok()) {
            return make_error(ev.err().code == "timeout" ? "not_healthy" : "unreachable",
                              "health: " + ev.err().message);
        }
        std::string status = get_str(ev->get(), "status");
        if (status == "ok") return {};
        last = status.empty() ? get_str(ev->get(), "code")
                              : status + ": " + get_str(ev->get(), "reason");
        if (status == "degraded") break;
        std::this_thread::sleep_for(std::min(health_poll_interval, left()));
    }
    return make_error("not_healthy", "server health is not ok (" + last + ")");
}

result<model_info> query_model(const std::string& host, uint16_t port, milliseconds timeout) {
    connection c;
    if (auto st = c.open(host, port, timeout); !st.ok()) {
        return make_error("unreachable", st.err().message);
    }
    msgpack::sbuffer buf;
    msgpack::packer<msgpack::sbuffer> pk(buf);
    pk.pack_map(2), pk.pack("id"), pk.pack(uint64_t{1}), pk.pack("op"), pk.pack("model");
    if (auto st = c.send(buf); !st.ok()) return make_error("unreachable", st.err().message);
    auto ev = c.recv(timeout);
    if (!ev.ok()) return make_error("unreachable", "model: " + ev.err().message);
    const auto& e = ev->get();
    if (get_str(e, "event") != "done") {
        return make_error("bad_answer",
                          "model op: " + get_str(e, "code") + " " + get_str(e, "message"));
    }
    auto u32 = [&](const char* key) -> uint32_t {
        const auto* v = find(e, key);
        bool fits = v && v->type == msgpack::type::POSITIVE_INTEGER && v->via.u64 <= UINT32_MAX;
        return fits ? static_cast<uint32_t>(v->via.u64) : 0;
    };
    model_info m;
    m.name = get_str(e, "name");
    if (m.name.empty()) {
        std::string path = get_str(e, "path");
        m.name = path.substr(
            path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
    }
    // docs/protocol.md names them vocab_size and context_tokens; the server currently answers
    // n_vocab and context. Accept both until the two agree.
    m.vocab_size = u32("vocab_size") ? u32("vocab_size") : u32("n_vocab");
    m.context_tokens = u32("context_tokens") ? u32("context_tokens") : u32("context");
    if (m.vocab_size <= first_ordinary_token) {
        return make_error("bad_answer",
                          "model op reports vocab_size " + std::to_string(m.vocab_size));
    }
    return m;
}

}  // namespace ordo::load
