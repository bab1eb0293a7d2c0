// load_stream.hpp: the client side of ordo-load — one stream (a thread with its own TCP
// connection) sending generate requests one after another and timing their events, plus the
// small queries a run needs first (health, model). Used by main.cpp and test_ordo_load.cpp.
//
// Every wait is bounded: reads happen in short slices so a stream notices the run's stop flag
// and deadline, a silent server is a "timeout" after event_timeout, and a closed connection
// ("closed") ends the stream instead of retrying.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <latch>
#include <optional>
#include <string>
#include <vector>

#include "actors/runtime/result.hpp"
#include "bench/ordo_load/load_stats.hpp"

namespace ordo::load {

using clock = std::chrono::steady_clock;

// Bounds both protocols' streams share.
inline constexpr std::chrono::milliseconds connect_timeout{10000};
inline constexpr std::chrono::milliseconds health_poll_interval{100};
inline constexpr uint32_t health_polls_max = 100000;  // the deadline ends it long before this
inline constexpr uint32_t stray_events_max = 64;      // events beyond a request's expected ones

inline double ms_between(clock::time_point a, clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

// Shared by every stream of a run: main sets `stop` on SIGINT or when the spawned server dies.
struct run_control {
    std::atomic<bool> stop{false};
    clock::time_point deadline;  // --duration-max-s from the start of the run
};

enum class wire { msgpack, http };

// Sampler options sent only when given (a server's own defaults apply otherwise).
struct sampler_options {
    std::optional<int32_t> top_k;
    std::optional<double> top_p;
    std::optional<double> min_p;
};

struct stream_plan {
    wire protocol = wire::msgpack;
    std::string host;
    uint16_t port = 0;
    std::string model_id;                      // HTTP: the request's "model"
    std::chrono::milliseconds start_delay{0};  // after the common start (--ramp-s)
    uint32_t requests = 1;
    uint32_t prompt_tokens = 0;  // random ids per request; 0 = prompt_text
    uint32_t vocab_size = 0;     // ids are drawn below it
    std::string prompt_text;
    uint32_t max_tokens = 1;
    double temperature = 1.0;
    sampler_options sampler;
    uint64_t seed_first = 0;  // request r: sampler and prompt seed_first + r
    std::chrono::milliseconds event_timeout{120000};
};

// Connects, arrives at `ready` (so all streams start together), then runs the plan. Returns one
// sample per request that was sent; when the stream ends before its last request (connect
// failure "unreachable", run deadline "duration_exceeded", stop "aborted") the last sample is a
// failed one naming why.
std::vector<request_sample> run_stream(const stream_plan& plan, run_control& control,
                                       std::latch& ready);

// The bounded wait of one read: next_slice() says how long the next read may block (at most
// read_slice, so the stop flag is seen), or why the wait is over: "duration_exceeded" (run
// deadline), "aborted" (stop flag), "timeout" (silent for event_timeout).
class event_wait {
public:
    static constexpr std::chrono::milliseconds read_slice{250};
    event_wait(const stream_plan& plan, const run_control& control);
    result<std::chrono::milliseconds> next_slice();

private:
    const run_control& _control;
    clock::time_point _silent_until;
    uint64_t _slices = 0, _slices_max = 0;  // backs up the clock (a slice may end early: EINTR)
};

// `count` token ids in [first_ordinary_token, vocab_size) drawn from a generator seeded with
// `seed`: the same seed gives the same prompt. Ids below first_ordinary_token are the special
// tokens of Llama vocabularies (unk, bos, eos) and are avoided.
inline constexpr uint32_t first_ordinary_token = 3;
std::vector<int32_t> random_prompt(uint64_t seed, uint32_t count, uint32_t vocab_size);

// Polls `health` until "ok" (error "not_healthy" on "degraded" or at the deadline,
// "unreachable" when no connection can be made).
status wait_healthy(const std::string& host, uint16_t port, clock::time_point deadline,
                    const run_control& control);

struct model_info {
    std::string name;  // model op's name, else the file name of its path
    uint32_t vocab_size = 0;
    uint32_t context_tokens = 0;
};
result<model_info> query_model(const std::string& host, uint16_t port,
                               std::chrono::milliseconds timeout);

}  // namespace ordo::load
