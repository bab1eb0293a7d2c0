// http_stream.hpp: ordo-load's HTTP mode — the same streams as the msgpack mode, speaking the
// OpenAI completions API (POST /v1/completions with "stream": true, server-sent events), so
// that ordo-server's HTTP front door and llama.cpp's llama-server can be measured by one client
// in one run (bench/serving_side_by_side.sh).
//
// Responses are parsed with llhttp (the parser ordo's HTTP actor uses, here in response mode)
// and JSON with nlohmann-json. Every read is bounded as in the msgpack mode (load_stream.hpp):
// event_timeout of silence, the run deadline, the stop flag; a response's events and an
// event's bytes are bounded too, so a misbehaving server ends a request instead of growing the
// client without limit.
#pragma once

#include <llhttp.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "actors/runtime/result.hpp"
#include "bench/ordo_load/load_stream.hpp"

namespace ordo::client {
class connection;
}

namespace ordo::load {

inline constexpr size_t sse_event_bytes_max = 1 << 20;     // one event's bytes, at most
inline constexpr size_t http_answer_bytes_max = 16 << 20;  // a whole non-streamed answer

// One HTTP/1.1 response at a time, fed in pieces: the status, the body (chunked transfer
// coding removed) as it arrives, and whether the message is complete. reset() reads the next
// response of the same connection.
class response_reader {
public:
    response_reader();
    response_reader(const response_reader&) = delete;
    response_reader& operator=(const response_reader&) = delete;

    // Error "bad_http" naming llhttp's reason. Bytes after a complete message are an error too:
    // a client that sends one request at a time never gets any.
    status feed(std::string_view bytes);
    int status_code() const { return _status; }
    bool complete() const { return _complete; }
    bool keep_alive() const { return _keep_alive; }
    // Body bytes received since the last call.
    std::string take_body();
    void reset();

private:
    static int on_status_complete(llhttp_t* p);
    static int on_body(llhttp_t* p, const char* at, size_t n);
    static int on_message_complete(llhttp_t* p);

    llhttp_settings_t _settings{};
    llhttp_t _parser{};
    int _status = 0;
    bool _complete = false;
    bool _keep_alive = false;
    std::string _body;
};

// Splits a text/event-stream body into its events' data (the "data:" lines of one event joined
// with "\n"; comments and other fields skipped; lines end with \n or \r\n). Error "bad_event" when
// one event grows past sse_event_bytes_max.
class sse_splitter {
public:
    result<std::vector<std::string>> feed(std::string_view bytes);

private:
    std::string _line;  // bytes of lines not yet ended
    std::string _data;  // the current event's data so far
    bool _has_data = false;
};

// The body of completion request `r` of `plan` (JSON): model, prompt (token ids or text),
// max_tokens, temperature, seed, the sampler options given, stream with include_usage.
std::string completion_body(const stream_plan& plan, uint32_t r);

// Sends request `r` on `c` and reads its answer into `s`. Returns false when the connection
// cannot carry another request (closed, timed out, or the server said Connection: close).
bool run_http_request(client::connection& c, const stream_plan& plan, uint32_t r,
                      run_control& control, request_sample& s);

// Polls GET /health until 200 (error "not_healthy" at the deadline or when the answer says
// "degraded", "unreachable" when no connection can be made).
status wait_healthy_http(const std::string& host, uint16_t port, clock::time_point deadline,
                         const run_control& control);

// GET /v1/models: the first model's id, and its vocabulary size and per-request context when
// the server reports them in "meta" (llama-server and ordo-server both do).
result<model_info> query_model_http(const std::string& host, uint16_t port,
                                    std::chrono::milliseconds timeout);

}  // namespace ordo::load
