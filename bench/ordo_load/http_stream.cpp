// http_stream.cpp: see http_stream.hpp.
#include "bench/ordo_load/http_stream.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <thread>

#include "tools/client/connection.hpp"

namespace ordo::load {
namespace {

using client::connection;
using nlohmann::json;
using std::chrono::milliseconds;

constexpr uint32_t reads_per_event_max = 1 << 16;  // reads that complete no event, at most

response_reader& self_of(llhttp_t* p) {
    return *static_cast<response_reader*>(p->data);
}

std::string request_text(const std::string& method, const std::string& host, uint16_t port,
                         const std::string& path, const std::string& body) {
    std::string r =
        method + " " + path + " HTTP/1.1\r\nHost: " + host + ":" + std::to_string(port) + "\r\n";
    if (!body.empty()) {
        r += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
             "\r\n";
    }
    return r + "\r\n" + body;
}

// The code an error answer names: ordo's "code" string, else OpenAI's "type", else the status.
std::string error_code_of(const json& j, int status) {
    if (j.is_object() && j.contains("error") && j["error"].is_object()) {
        const json& e = j["error"];
        if (e.contains("code") && e["code"].is_string()) return e["code"].get<std::string>();
        if (e.contains("type") && e["type"].is_string()) return e["type"].get<std::string>();
    }
    return "http_" + std::to_string(status);
}

// Reads until `reader` has a complete message or `on_body` says stop; every read bounded by
// `plan`'s event timeout and the run. Returns "" or an error code.
template <typename OnBody>
std::string read_response(connection& c, response_reader& reader, const stream_plan& plan,
                          run_control& control, OnBody&& on_body) {
    for (uint32_t reads = 0; !reader.complete(); reads++) {
        if (reads == reads_per_event_max) return "too_many_reads";
        std::string bytes;
        event_wait wait(plan, control);
        while (bytes.empty()) {
            auto slice = wait.next_slice();
            if (!slice.ok()) return slice.err().code;
            auto st = c.recv_bytes(bytes, *slice);
            if (!st.ok() && st.err().code != "timeout" && st.err().code != "interrupted") {
                return st.err().code;
            }
        }
        if (auto st = reader.feed(bytes); !st.ok()) return st.err().code;
        std::string body = reader.take_body();
        if (!body.empty()) {
            if (std::string e = on_body(body); !e.empty()) return e;
        }
    }
    return "";
}

// One whole answer to a GET on a connection of its own.
result<std::pair<int, std::string>> http_get(const std::string& host, uint16_t port,
                                             const std::string& path, milliseconds timeout,
                                             const run_control& control) {
    connection c;
    if (auto st = c.open(host, port, std::min(connect_timeout, timeout)); !st.ok()) {
        return make_error("unreachable", st.err().message);
    }
    if (auto st = c.send_bytes(request_text("GET", host, port, path, "")); !st.ok()) {
        return make_error("unreachable", st.err().message);
    }
    stream_plan plan;
    plan.event_timeout = timeout;
    run_control bounded;
    bounded.deadline = std::min(control.deadline, clock::now() + timeout);
    response_reader reader;
    std::string body;
    std::string e = read_response(c, reader, plan, bounded, [&](const std::string& b) {
        body += b;
        return body.size() > http_answer_bytes_max ? std::string("answer_too_large") : "";
    });
    if (!e.empty()) return make_error(e, "GET " + path + ": " + e);
    return std::make_pair(reader.status_code(), std::move(body));
}

}  // namespace

response_reader::response_reader() {
    llhttp_settings_init(&_settings);
    _settings.on_status_complete = on_status_complete;
    _settings.on_body = on_body;
    _settings.on_message_complete = on_message_complete;
    reset();
}

void response_reader::reset() {
    llhttp_init(&_parser, HTTP_RESPONSE, &_settings);
    _parser.data = this;
    _status = 0;
    _complete = false;
    _keep_alive = false;
    _body.clear();
}

status response_reader::feed(std::string_view bytes) {
    if (bytes.empty()) return {};
    if (_complete) return make_error("bad_http", "bytes after a complete response");
    llhttp_errno_t rc = llhttp_execute(&_parser, bytes.data(), bytes.size());
    if (rc == HPE_PAUSED) {
        // on_message_complete pauses: anything after the message is not an answer we asked for.
        const char* pos = llhttp_get_error_pos(&_parser);
        if (pos != nullptr && pos != bytes.data() + bytes.size()) {
            return make_error("bad_http", "bytes after a complete response");
        }
        return {};
    }
    if (rc != HPE_OK) {
        const char* why = llhttp_get_error_reason(&_parser);
        return make_error("bad_http", std::string("malformed HTTP response: ") +
                                          (why != nullptr ? why : llhttp_errno_name(rc)));
    }
    return {};
}

std::string response_reader::take_body() {
    return std::exchange(_body, {});
}

int response_reader::on_status_complete(llhttp_t* p) {
    self_of(p)._status = p->status_code;
    return 0;
}

int response_reader::on_body(llhttp_t* p, const char* at, size_t n) {
    self_of(p)._body.append(at, n);
    return 0;
}

int response_reader::on_message_complete(llhttp_t* p) {
    response_reader& r = self_of(p);
    r._complete = true;
    r._keep_alive = llhttp_should_keep_alive(p) != 0;
    return HPE_PAUSED;
}

result<std::vector<std::string>> sse_splitter::feed(std::string_view bytes) {
    std::vector<std::string> out;
    _line.append(bytes);
    size_t start = 0;
    // Line by line (\n or \r\n); a blank line ends an event.
    for (size_t eol; (eol = _line.find('\n', start)) != std::string::npos; start = eol + 1) {
        std::string_view l(_line.data() + start, eol - start);
        if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
        if (l.empty()) {
            if (_has_data) out.push_back(std::exchange(_data, {}));
            _has_data = false;
        } else if (l.substr(0, 5) == "data:") {
            l.remove_prefix(5);
            if (!l.empty() && l.front() == ' ') l.remove_prefix(1);
            if (_has_data) _data += '\n';
            _data.append(l);
            _has_data = true;
        }
    }
    _line.erase(0, start);
    if (_line.size() + _data.size() > sse_event_bytes_max) {
        return make_error("bad_event", "a server-sent event over " +
                                           std::to_string(sse_event_bytes_max) + " bytes");
    }
    return out;
}

std::string completion_body(const stream_plan& plan, uint32_t r) {
    json j = {{"model", plan.model_id},
              {"max_tokens", plan.max_tokens},
              {"temperature", plan.temperature},
              {"seed", plan.seed_first + r},
              {"stream", true},
              {"stream_options", {{"include_usage", true}}}};
    if (plan.prompt_tokens == 0) {
        j["prompt"] = plan.prompt_text;
    } else {
        // Distinct per request, so a prefix cache does not turn the run into cache hits.
        j["prompt"] = random_prompt(plan.seed_first + r, plan.prompt_tokens, plan.vocab_size);
    }
    if (plan.sampler.top_k) j["top_k"] = *plan.sampler.top_k;
    if (plan.sampler.top_p) j["top_p"] = *plan.sampler.top_p;
    if (plan.sampler.min_p) j["min_p"] = *plan.sampler.min_p;
    return j.dump();
}

namespace {

// What one attempt of a request reports besides its sample.
enum class attempt { done, closed_unanswered, end_stream };

attempt send_and_read(connection& c, const stream_plan& plan, uint32_t r, run_control& control,
                      request_sample& s) {
    auto t0 = clock::now();
    auto last_token = t0;
    if (auto st = c.send_bytes(request_text("POST", plan.host, plan.port, "/v1/completions",
                                            completion_body(plan, r)));
        !st.ok()) {
        s.error_code = "closed";
        return attempt::closed_unanswered;
    }
    response_reader reader;
    sse_splitter events;
    std::string error_body;
    std::string stream_error;  // an error event's code
    std::string finish;        // the finish_reason of the final chunk
    bool done_marker = false;  // data: [DONE]
    std::optional<uint64_t> usage_tokens;
    uint32_t token_events = 0;
    const uint32_t events_max = plan.max_tokens + 2 + stray_events_max;
    uint32_t n_events = 0;
    auto on_event = [&](const std::string& data) -> std::string {
        if (++n_events > events_max) return "too_many_events";
        if (data == "[DONE]") {
            done_marker = true;
            return "";
        }
        json j = json::parse(data, nullptr, false);
        if (!j.is_object()) return "bad_event";
        if (j.contains("error")) {
            // The server ends the answer after it (no [DONE]): read on to its end.
            if (stream_error.empty()) stream_error = error_code_of(j, 200);
            return "";
        }
        auto now = clock::now();
        if (j.contains("usage") && j["usage"].is_object()) {
            const json& u = j["usage"];
            if (u.contains("completion_tokens") && u["completion_tokens"].is_number_unsigned()) {
                usage_tokens = u["completion_tokens"].get<uint64_t>();
            }
        }
        if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) return "";
        const json& choice = j["choices"][0];
        const json fr = choice.value("finish_reason", json());
        bool has_text = choice.contains("text") && choice["text"].is_string() &&
                        !choice["text"].get_ref<const std::string&>().empty();
        // A chunk before the final one is one token (its text may be empty: part of a UTF-8
        // character); the final chunk counts only when it carries text.
        if (fr.is_null() || has_text) {
            if (token_events == 0)
                s.ttft_ms = ms_between(t0, now);
            else
                s.itl_ms.push_back(ms_between(last_token, now));
            last_token = now;
            token_events++;
        }
        if (fr.is_string()) finish = fr.get<std::string>();
        return "";
    };
    std::string e = read_response(c, reader, plan, control, [&](const std::string& body) {
        if (reader.status_code() != 200) {
            error_body += body;
            return error_body.size() > http_answer_bytes_max ? std::string("answer_too_large") : "";
        }
        auto got = events.feed(body);
        if (!got.ok()) return got.err().code;
        for (const auto& data : *got) {
            if (std::string err = on_event(data); !err.empty()) return err;
        }
        return std::string();
    });
    s.total_ms = ms_between(t0, clock::now());
    s.tokens = usage_tokens ? static_cast<uint32_t>(*usage_tokens) : token_events;
    if (!e.empty()) {
        s.error_code = e;
        // No status line yet: the server closed before answering (nor any body, which follows it).
        return e == "closed" && reader.status_code() == 0 ? attempt::closed_unanswered
                                                          : attempt::end_stream;
    }
    if (reader.status_code() != 200) {
        s.error_code = error_code_of(json::parse(error_body, nullptr, false), reader.status_code());
    } else if (!stream_error.empty()) {
        s.error_code = stream_error;
    } else if (finish != "stop" && finish != "length") {
        s.error_code = finish.empty() ? "no_finish_reason" : "finish_" + finish;
    } else if (!done_marker) {
        s.error_code = "no_done_marker";
    } else {
        s.ok = true;
    }
    // Connection: close is not the end of the stream: connect again now (a failure shows as
    // the next request's "unreachable").
    if (!reader.keep_alive()) (void)c.open(plan.host, plan.port, connect_timeout);
    return attempt::done;
}

}  // namespace

bool run_http_request(connection& c, const stream_plan& plan, uint32_t r, run_control& control,
                      request_sample& s) {
    // A server may close a kept-alive connection between two requests (llama-server does after
    // every streamed answer), as HTTP allows; a client then connects again, once per request.
    for (int tries = 0; tries < 2; tries++) {
        if (tries > 0 || c.peer_closed()) {
            if (auto st = c.open(plan.host, plan.port, connect_timeout); !st.ok()) {
                s = request_sample{};
                s.error_code = "unreachable";
                return false;
            }
        }
        s = request_sample{};
        attempt a = send_and_read(c, plan, r, control, s);
        if (a != attempt::closed_unanswered) return a == attempt::done;
    }
    return false;
}

status wait_healthy_http(const std::string& host, uint16_t port, clock::time_point deadline,
                         const run_control& control) {
    std::string last = "no answer";
    for (uint32_t i = 0; i < health_polls_max; i++) {
        if (control.stop.load() || clock::now() >= deadline) break;
        auto left = std::max(milliseconds(1),
                             std::chrono::duration_cast<milliseconds>(deadline - clock::now()));
        auto got = http_get(host, port, "/health", left, control);
        if (!got.ok()) {
            if (got.err().code == "unreachable") return got.err();
            last = got.err().message;
        } else if (got->first == 200) {
            return {};
        } else {
            last = "status " + std::to_string(got->first) + ": " + got->second;
            if (got->second.find("degraded") != std::string::npos) break;
        }
        std::this_thread::sleep_for(std::min(health_poll_interval, left));
    }
    return make_error("not_healthy", "server health is not ok (" + last + ")");
}

result<model_info> query_model_http(const std::string& host, uint16_t port, milliseconds timeout) {
    run_control control;
    control.deadline = clock::now() + timeout;
    auto got = http_get(host, port, "/v1/models", timeout, control);
    if (!got.ok()) return make_error("unreachable", "GET /v1/models: " + got.err().message);
    if (got->first != 200) {
        return make_error("bad_answer", "GET /v1/models: status " + std::to_string(got->first));
    }
    json j = json::parse(got->second, nullptr, false);
    if (!j.is_object() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
        !j["data"][0].is_object() || !j["data"][0].contains("id") ||
        !j["data"][0]["id"].is_string()) {
        return make_error("bad_answer", "GET /v1/models: no data[0].id in " + got->second);
    }
    const json& m = j["data"][0];
    model_info info;
    info.name = m["id"].get<std::string>();
    auto u32 = [&](const char* key) -> uint32_t {
        if (!m.contains("meta") || !m["meta"].is_object() || !m["meta"].contains(key)) return 0;
        const json& v = m["meta"][key];
        return v.is_number_unsigned() && v.get<uint64_t>() <= UINT32_MAX ? v.get<uint32_t>() : 0;
    };
    info.vocab_size = u32("n_vocab");
    info.context_tokens = u32("n_ctx");
    return info;
}

}  // namespace ordo::load
