// test_http_server.cpp: the HTTP front door of the real ordo-server, over raw TCP sockets.
//
// Each test starts its own server on ephemeral ports (both front doors) with a model
// `ordo-model mk` makes and a ChatML template file (--chat-template), small [http] limits and
// fault injection on. Checks:
// (1) /health, /v1/models, /v1/models/{id}; an unknown path 404 and a wrong method 405, in
//     OpenAI's error shape; malformed JSON, unknown fields, n != 1 and a wrong model answer 400 /
//     404 with the error naming the field; the connection stays usable (keep-alive).
// (2) /v1/chat/completions and /v1/completions, greedy, answer exactly the text the msgpack
//     protocol's `chat` and `generate` ops give for the same request; the same seed gives the
//     same sampled text twice.
// (3) Streaming: chunked server-sent events, the role chunk first, the content deltas adding up
//     to the non-streamed answer, finish_reason, the usage chunk (choices empty) with
//     include_usage, and `data: [DONE]` last.
// (4) Pipelining: three requests in one write are answered in order on one connection; a
//     malformed request behind a good one is answered 400 after it, then the connection closes.
// (5) Limits: a body over http.max_body_bytes is 413 at once (before the body is sent), headers
//     over http.max_header_bytes 431, both closing the connection.
// (6) A request that does not arrive whole within http.header_timeout_ms, and a connection that
//     sends nothing, get 408 and are closed.
// (7) A client that disconnects mid-stream (decode steps slowed by a step_delay fault) is a
//     client_gone: the scheduler counts one disconnect and every sequence, queue entry and KV
//     block is free again (the protocol's stats).
// (8) A compute failure mid-stream (device_lost on a decode step, batch_failure_policy "fail")
//     ends the stream with an error event (gpu_failed), never with [DONE]; the server serves on.
// (11) A full scheduler mailbox (a mailbox_refuse fault) answers 429 overloaded at once, and the
//     next request is served.
// (12) --http-listen "" turns the HTTP front door off: no HTTP listening line, the protocol serves.
// (13) SIGTERM while a slowed stream runs longer than server.shutdown_grace_ms: the stream ends
//     with a shutting_down error event (no [DONE]) and the server exits 0.
// (17) llama.cpp's /tokenize and /detokenize: the ids equal the protocol's tokenize op's
//     (add_special and parse_special as its add_bos and special), detokenize gives the text
//     back, and bad bodies are 400 naming the field.
// (10) GET /metrics after some traffic: Prometheus text with the stats op's counters and gauges
//     (net, http, scheduler, kv, gpu), the histograms (time to first token, ...) counting the
//     requests served, every metric docs/deploy.md's "Metrics for a fleet" names, and `promtool
//     check metrics` (Debian's prometheus package) accepting it;
//     without promtool that part skips visibly (fails under ORDO_HTTP_CLIENT_REQUIRED=1, CI).
// (14) The protocol's `stats` op reports this front door's counters as its `http` map: after a
//     known set of HTTP requests (200s, a 404, a stream, a 413), `stats` over msgpack shows their
//     exact counts (requests, responses by class, streams, too_large, connections, bytes_in to
//     the byte) once every connection has closed, and GET /metrics shows the same numbers (its
//     own request, connection and bytes added). With HTTP off (12) the map is absent.
// (15) A net_stop_reading fault on an HTTP stream: the server stops reading the connection for
//     `ms` but goes on writing. The stream ends complete ([DONE]) during the pause; a next
//     request begun before the pause (its headers unfinished) is neither lost nor cut off by
//     http.header_timeout_ms (300 ms here) while the server is the one not reading: its last
//     bytes, sent after the stream, are read when the pause ends and it is answered 200 no
//     earlier than `ms` after the stream began. stats count the pause (http.fault_pauses,
//     scheduler.net_faults) and no 408, and once the client leaves every connection, sequence
//     and KV block is free again.
// (16) The lingering close (http.linger_ms 1500, http.max_linger_bytes 16 MiB here): a client
//     uploading 8 MiB in 64 KiB pieces against the 4 KiB body limit sends every piece without a
//     reset and then reads the whole 413 JSON answer and an EOF; a client that never stops
//     sending is cut off once about max_linger_bytes were discarded (never 256 MiB); a client
//     trickling 1 KiB every 50 ms after its 413 is closed linger_ms after it, not at once and
//     not never. Then no connection is open or lingering, and stats count 3 lingering closes,
//     2 of them cut off.
// (9) With ../shared/models (skipped visibly without it): llama3-tiny-Q4_K_M.gguf and the chat
//     template in its metadata: /v1/models names it, and chat and completions over HTTP, streamed
//     and not, answer the text the protocol's ops answer.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "tests/http/http_client.hpp"
#include "tests/support/scratch_dir.hpp"
#include "tests/support/server_process.hpp"
#include "tests/support/shared_models.hpp"

namespace {

using namespace ordo::test;
namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr size_t k_body_max = 4096;
constexpr size_t k_header_max = 2048;

std::string temp_path(const std::string& name) {
    const fs::path& dir = ordo::test::scratch_dir("ordo_http");
    return (dir / name).string();
}

struct server {
    server_process proc;
    std::string error;  // "" when it serves
    uint16_t http() const { return proc.http_port(); }
};

// A server on a made model named "tiny", with the ChatML template; `http_extra`: more [http]
// keys, one per line.
std::unique_ptr<server> start_server(const std::string& http_extra = "") {
    const std::string model = temp_path("tiny.gguf");
    std::string mk = std::string(ORDO_MODEL_BIN) + " mk --out " + model +
                     " --n-embd 32 --n-layer 1 --n-head 2 --n-head-kv 2 --n-ff 64"
                     " --n-vocab 260 --type f32 --seed 1 --ctx 512 > /dev/null";
    EXPECT_EQ(std::system(mk.c_str()), 0) << mk;
    const std::string tmpl = temp_path("chatml.jinja");
    std::ofstream(tmpl) << "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                           "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}"
                           "<|im_start|>assistant\n{% endif %}";
    const std::string cfg = temp_path("http.toml");
    std::ofstream(cfg) << "[http]\nmax_body_bytes = " << k_body_max
                       << "\nmax_header_bytes = " << k_header_max
                       << "\nheader_timeout_ms = 300\nkeep_alive_timeout_ms = 60000\n"
                       << http_extra
                       << "[scheduler]\nmax_tokens_default = 8\nbatch_failure_policy = \"fail\"\n"
                       << "[fault]\nenabled = true\n";
    auto s = std::make_unique<server>();
    if (!s->proc.start(ORDO_SERVER_BIN,
                       {"--config", cfg, "--model", model, "--chat-template", tmpl})) {
        s->error = "the server did not start:\n" + s->proc.output();
    } else if (s->proc.http_port() == 0) {
        s->error = "no http listening line:\n" + s->proc.output();
    } else {
        s->error = wait_healthy(s->proc.port());
    }
    return s;
}

#define START()                \
    auto srv = start_server(); \
    ASSERT_EQ(srv->error, "") << srv->proc.output()

json body_json(const http_response& r) {
    return json::parse(r.body, nullptr, false);
}

// An OpenAI error body: {"error": {message, type, param, code}}.
void expect_error(const std::optional<http_response>& r, int status, const std::string& code,
                  const std::string& param = "") {
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, status) << r->body;
    EXPECT_EQ(r->header("content-type"), "application/json");
    json j = body_json(*r);
    ASSERT_TRUE(j.contains("error")) << r->body;
    EXPECT_EQ(j["error"]["code"], code) << r->body;
    EXPECT_TRUE(j["error"]["message"].is_string());
    EXPECT_TRUE(j["error"]["type"].is_string());
    if (param.empty()) {
        EXPECT_TRUE(j["error"]["param"].is_null()) << r->body;
    } else {
        EXPECT_EQ(j["error"]["param"], param) << r->body;
    }
}

// One msgpack protocol request on `c`; its terminal event.
event op(tcp_client& c, uint64_t id, const std::string& name, json params) {
    json j = {{"id", id}, {"op", name}};
    for (auto& [k, v] : params.items()) j[k] = v;
    std::vector<uint8_t> bytes = json::to_msgpack(j);
    EXPECT_TRUE(c.send_raw(std::string(bytes.begin(), bytes.end())));
    auto evs = until_terminal(c, id);
    return evs.empty() ? event{} : evs.back();
}

const json k_messages = json::array({{{"role", "system"}, {"content", "Be brief."}},
                                     {{"role", "user"}, {"content", "Hello there"}}});

json chat_body(json extra = json::object()) {
    json j = {{"model", "tiny"}, {"messages", k_messages}, {"max_tokens", 12}, {"temperature", 0}};
    for (auto& [k, v] : extra.items()) j[k] = v;
    return j;
}

std::string post(uint16_t port, const std::string& path, const json& body, int expect = 200) {
    auto r = http_call(port, "POST", path, body.dump());
    EXPECT_TRUE(r.has_value());
    if (!r) return "";
    EXPECT_EQ(r->status, expect) << r->body;
    return r->body;
}

}  // namespace

// (1)
TEST(http_server, endpoints_and_error_shapes) {
    START();
    auto h = http_call(srv->http(), "GET", "/health");
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 200);
    EXPECT_EQ(body_json(*h)["status"], "ok");
    auto m = http_call(srv->http(), "GET", "/v1/models");
    ASSERT_TRUE(m);
    EXPECT_EQ(body_json(*m)["object"], "list");
    EXPECT_EQ(body_json(*m)["data"][0]["id"], "tiny");
    // The extension load generators read (llama-server's key names).
    EXPECT_EQ(body_json(*m)["data"][0]["meta"]["n_vocab"], 260);
    EXPECT_EQ(body_json(*m)["data"][0]["meta"]["n_ctx_train"], 512);
    EXPECT_EQ(body_json(*m)["data"][0]["meta"]["n_embd"], 32);
    EXPECT_EQ(body_json(*http_call(srv->http(), "GET", "/v1/models/tiny"))["id"], "tiny");
    // A trailing slash names the same endpoint (clients joining a base URL and a path).
    EXPECT_EQ(body_json(*http_call(srv->http(), "GET", "/v1/models/"))["object"], "list");
    auto slashed = http_call(srv->http(), "POST", "/v1/chat/completions/", chat_body().dump());
    ASSERT_TRUE(slashed);
    EXPECT_EQ(slashed->status, 200) << slashed->body;
    expect_error(http_call(srv->http(), "GET", "/v1/models/gpt-4"), 404, "model_not_found",
                 "model");
    expect_error(http_call(srv->http(), "GET", "/v2/nothing"), 404, "not_found");
    expect_error(http_call(srv->http(), "GET", "/v1/chat/completions"), 405, "method_not_allowed");

    // Refusals, all on one kept-alive connection: each is answered and the next still works.
    http_conn c;
    ASSERT_TRUE(c.connect(srv->http()));
    auto ask = [&](const std::string& body) {
        EXPECT_TRUE(c.send(http_request_text("POST", "/v1/chat/completions", body)));
        return c.read();
    };
    expect_error(ask("{\"model\": \"tiny\", \"messages\": ["), 400, "invalid_json");
    expect_error(ask(chat_body({{"response_format", {{"type", "json_schema"}}}}).dump()), 400,
                 "bad_request", "response_format");
    expect_error(ask(chat_body({{"tools", json::array({{{"type", "function"}}})}}).dump()), 400,
                 "bad_request", "tools");
    expect_error(ask(chat_body({{"n", 2}}).dump()), 400, "bad_request", "n");
    expect_error(ask(chat_body({{"model", "gpt-4o"}}).dump()), 404, "model_not_found", "model");
    expect_error(ask(chat_body({{"temperature", -1}}).dump()), 400, "bad_request", "temperature");
    auto fine = ask(chat_body().dump());
    ASSERT_TRUE(fine);
    EXPECT_EQ(fine->status, 200) << fine->body;
    // A context overflow is the scheduler's refusal, as 400 in the same shape.
    expect_error(ask(chat_body({{"max_tokens", 100000}}).dump()), 400, "context_exceeded");
}

// (17)
TEST(http_server, tokenize_and_detokenize_as_llama_cpp_names_them) {
    START();
    tcp_client c;
    ASSERT_TRUE(c.connect(srv->proc.port()));
    const std::string text = "Hello there, <|im_start|> world";
    for (bool add_special : {false, true}) {
        for (bool parse_special : {false, true}) {
            SCOPED_TRACE(std::to_string(add_special) + std::to_string(parse_special));
            json t = json::parse(post(srv->http(), "/tokenize",
                                      {{"content", text},
                                       {"add_special", add_special},
                                       {"parse_special", parse_special}}));
            event e = op(c, 1 + 2 * add_special + parse_special, "tokenize",
                         {{"text", text}, {"add_bos", add_special}, {"special", parse_special}});
            ASSERT_EQ(e.str("event"), "done") << e.outcome();
            EXPECT_EQ(t["tokens"].get<std::vector<int32_t>>(), e.ints("tokens"));
        }
    }
    // Defaults: add_special false, parse_special true (llama.cpp's).
    json plain = json::parse(post(srv->http(), "/tokenize", {{"content", text}}));
    event want = op(c, 9, "tokenize", {{"text", text}, {"add_bos", false}, {"special", true}});
    EXPECT_EQ(plain["tokens"].get<std::vector<int32_t>>(), want.ints("tokens"));
    json back = json::parse(post(srv->http(), "/detokenize", {{"tokens", plain["tokens"]}}));
    EXPECT_EQ(back["content"], text);
    // A trailing slash and keep-alive work as for the other endpoints.
    json again = json::parse(post(srv->http(), "/tokenize/", {{"content", "x"}}));
    EXPECT_FALSE(again["tokens"].empty());

    expect_error(http_call(srv->http(), "POST", "/tokenize", json{{"text", "x"}}.dump()), 400,
                 "bad_request", "text");
    expect_error(http_call(srv->http(), "POST", "/tokenize", json::object().dump()), 400,
                 "bad_request", "content");
    expect_error(http_call(srv->http(), "POST", "/tokenize",
                           json{{"content", "x"}, {"with_pieces", true}}.dump()),
                 400, "bad_request", "with_pieces");
    expect_error(http_call(srv->http(), "POST", "/detokenize",
                           json{{"tokens", json::array({1, 999999})}}.dump()),
                 400, "bad_request", "tokens");
    expect_error(http_call(srv->http(), "GET", "/tokenize"), 405, "method_not_allowed");
}

// (2)
TEST(http_server, answers_equal_the_protocol_ops) {
    START();
    tcp_client c;
    ASSERT_TRUE(c.connect(srv->proc.port()));
    json chat = body_json({200, {}, post(srv->http(), "/v1/chat/completions", chat_body())});
    ASSERT_TRUE(chat.contains("choices")) << chat.dump();
    EXPECT_EQ(chat["object"], "chat.completion");
    EXPECT_EQ(chat["model"], "tiny");
    EXPECT_EQ(chat["choices"][0]["message"]["role"], "assistant");
    EXPECT_EQ(chat["choices"][0]["finish_reason"], "length");
    event e = op(c, 1, "chat", {{"messages", k_messages}, {"max_tokens", 12}, {"temperature", 0}});
    ASSERT_EQ(e.str("event"), "done") << e.outcome();
    EXPECT_EQ(chat["choices"][0]["message"]["content"], e.str("text"));
    EXPECT_EQ(chat["usage"]["completion_tokens"], 12);
    EXPECT_EQ(chat["usage"]["prompt_tokens"], uint_field(*field(e.o(), "usage"), "prompt_tokens"));

    json comp_body = {
        {"model", "tiny"}, {"prompt", "Once upon"}, {"max_tokens", 10}, {"temperature", 0}};
    json comp = body_json({200, {}, post(srv->http(), "/v1/completions", comp_body)});
    EXPECT_EQ(comp["object"], "text_completion");
    event g =
        op(c, 2, "generate", {{"prompt", "Once upon"}, {"max_tokens", 10}, {"temperature", 0}});
    EXPECT_EQ(comp["choices"][0]["text"], g.str("text"));

    // Sampling with a seed repeats.
    json seeded = chat_body({{"temperature", 1.0}, {"seed", 42}});
    json a = body_json({200, {}, post(srv->http(), "/v1/chat/completions", seeded)});
    json b = body_json({200, {}, post(srv->http(), "/v1/chat/completions", seeded)});
    EXPECT_EQ(a["choices"][0]["message"]["content"], b["choices"][0]["message"]["content"]);
}

// (3)
TEST(http_server, streaming_adds_up_and_ends_with_done) {
    START();
    json plain = body_json({200, {}, post(srv->http(), "/v1/chat/completions", chat_body())});
    auto r = http_call(
        srv->http(), "POST", "/v1/chat/completions",
        chat_body({{"stream", true}, {"stream_options", {{"include_usage", true}}}}).dump());
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->header("content-type"), "text/event-stream");
    EXPECT_EQ(r->header("transfer-encoding"), "chunked");
    auto events = sse_data(r->body);
    ASSERT_GE(events.size(), 4u) << r->body;
    EXPECT_EQ(events.back(), "[DONE]");
    json first = json::parse(events[0]);
    EXPECT_EQ(first["object"], "chat.completion.chunk");
    EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
    std::string text, finish;
    json usage;
    for (size_t i = 1; i + 1 < events.size(); i++) {
        json ev = json::parse(events[i]);
        ASSERT_FALSE(ev.contains("error")) << events[i];
        if (ev["choices"].empty()) {
            usage = ev["usage"];
            continue;
        }
        const json& ch = ev["choices"][0];
        if (ch["delta"].contains("content")) text += ch["delta"]["content"].get<std::string>();
        if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
    }
    EXPECT_EQ(text, plain["choices"][0]["message"]["content"]);
    EXPECT_EQ(finish, "length");
    ASSERT_TRUE(usage.is_object()) << r->body;
    EXPECT_EQ(usage["completion_tokens"], 12);

    // Completions stream too, with the same text as their non-streamed answer.
    json cb = {{"model", "tiny"}, {"prompt", "abc"}, {"max_tokens", 6}, {"temperature", 0}};
    json cplain = body_json({200, {}, post(srv->http(), "/v1/completions", cb)});
    cb["stream"] = true;
    auto cr = http_call(srv->http(), "POST", "/v1/completions", cb.dump());
    ASSERT_TRUE(cr);
    std::string ctext;
    for (const auto& d : sse_data(cr->body)) {
        if (d == "[DONE]") continue;
        ctext += json::parse(d)["choices"][0]["text"].get<std::string>();
    }
    EXPECT_EQ(ctext, cplain["choices"][0]["text"]);
    EXPECT_EQ(sse_data(cr->body).back(), "[DONE]");
}

// (4)
TEST(http_server, pipelined_requests_are_answered_in_order) {
    START();
    http_conn c;
    ASSERT_TRUE(c.connect(srv->http()));
    ASSERT_TRUE(c.send(
        http_request_text("POST", "/v1/completions",
                          json({{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 3}}).dump()) +
        http_request_text("GET", "/v1/models") + http_request_text("GET", "/health")));
    auto a = c.read(), b = c.read(), d = c.read();
    ASSERT_TRUE(a && b && d);
    EXPECT_EQ(body_json(*a)["object"], "text_completion");
    EXPECT_EQ(body_json(*b)["object"], "list");
    EXPECT_EQ(body_json(*d)["status"], "ok");

    http_conn e;
    ASSERT_TRUE(e.connect(srv->http()));
    ASSERT_TRUE(e.send(http_request_text("GET", "/health") + "BROKEN\r\n\r\n"));
    auto good = e.read();
    ASSERT_TRUE(good);
    EXPECT_EQ(good->status, 200);
    expect_error(e.read(), 400, "bad_request");
    EXPECT_TRUE(e.wait_closed());
}

// (5)
TEST(http_server, oversized_bodies_and_headers_are_refused) {
    START();
    http_conn c;
    ASSERT_TRUE(c.connect(srv->http()));
    // Only the headers: the 413 comes before any body byte.
    ASSERT_TRUE(c.send("POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: " +
                       std::to_string(k_body_max + 1) + "\r\n\r\n"));
    auto r = c.read();
    expect_error(r, 413, "too_large");
    EXPECT_NE(body_json(*r)["error"]["message"].get<std::string>().find("max_body_bytes"),
              std::string::npos);
    EXPECT_TRUE(c.wait_closed());

    http_conn h;
    ASSERT_TRUE(h.connect(srv->http()));
    ASSERT_TRUE(h.send(http_request_text("GET", "/health", "",
                                         "X-Big: " + std::string(k_header_max, 'a') + "\r\n")));
    expect_error(h.read(), 431, "too_large");
    EXPECT_TRUE(h.wait_closed());
}

// (6)
TEST(http_server, slow_and_silent_clients_get_408) {
    START();
    http_conn slow;
    ASSERT_TRUE(slow.connect(srv->http()));
    ASSERT_TRUE(slow.send("GET /health HTTP/1.1\r\nHost: t\r\n"));  // never finished
    expect_error(slow.read(), 408, "read_timeout");
    EXPECT_TRUE(slow.wait_closed());
    http_conn silent;
    ASSERT_TRUE(silent.connect(srv->http()));
    expect_error(silent.read(), 408, "read_timeout");
    EXPECT_TRUE(silent.wait_closed());
    // The server still answers.
    EXPECT_EQ(http_call(srv->http(), "GET", "/health")->status, 200);
}

namespace {

// The protocol's stats, polled until nothing is live (bounded: 200 polls).
json settled_stats(uint16_t port) {
    tcp_client c;
    EXPECT_TRUE(c.connect(port));
    json s;
    for (int i = 0; i < 200; i++) {
        event e = op(c, 100 + uint64_t(i), "stats", json::object());
        if (e.u("active_sequences") == 0 && e.u("queued_requests") == 0 &&
            e.u("kv_blocks_used") == 0) {
            return {{"settled", true},
                    {"disconnects", uint_field(*field(e.o(), "scheduler"), "disconnects")}};
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return {{"settled", false}};
}

}  // namespace

// (7)
TEST(http_server, disconnect_mid_stream_frees_everything) {
    START();
    tcp_client p;
    ASSERT_TRUE(p.connect(srv->proc.port()));
    // Slow decode steps, so the request is surely running when the client leaves.
    event armed =
        op(p, 1, "fault", {{"kind", "step_delay"}, {"ms", 50}, {"count", 40}, {"phase", "decode"}});
    ASSERT_EQ(armed.str("event"), "done") << armed.outcome();
    http_conn c;
    ASSERT_TRUE(c.connect(srv->http()));
    ASSERT_TRUE(c.send(http_request_text(
        "POST", "/v1/chat/completions", chat_body({{"max_tokens", 40}, {"stream", true}}).dump())));
    auto head = c.read_head();
    ASSERT_TRUE(head);
    EXPECT_EQ(head->status, 200);
    auto role = c.read_chunk();  // the role chunk
    ASSERT_TRUE(role);
    auto token = c.read_chunk();  // a first token
    ASSERT_TRUE(token && !token->empty());
    c.close();
    json s = settled_stats(srv->proc.port());
    EXPECT_TRUE(s["settled"]) << "sequences, queue or KV blocks still held";
    EXPECT_EQ(s["disconnects"], 1) << "the disconnect was not a client_gone";
}

// (8)
TEST(http_server, compute_failure_mid_stream_ends_with_an_error_event) {
    START();
    tcp_client p;
    ASSERT_TRUE(p.connect(srv->proc.port()));
    event armed =
        op(p, 1, "fault", {{"kind", "device_lost"}, {"phase", "decode"}, {"after_steps", 3}});
    ASSERT_EQ(armed.str("event"), "done") << armed.outcome();
    auto r = http_call(srv->http(), "POST", "/v1/chat/completions",
                       chat_body({{"max_tokens", 20}, {"stream", true}}).dump());
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    auto events = sse_data(r->body);
    ASSERT_GE(events.size(), 2u) << r->body;
    EXPECT_NE(events.back(), "[DONE]") << r->body;
    for (const auto& e : events) EXPECT_NE(e, "[DONE]") << r->body;
    json last = json::parse(events.back(), nullptr, false);
    ASSERT_TRUE(last.contains("error")) << r->body;
    EXPECT_EQ(last["error"]["code"], "gpu_failed");
    EXPECT_EQ(last["error"]["type"], "server_error");
    // Tokens did stream before the failure.
    EXPECT_GE(events.size(), 3u) << r->body;
    // The device is rebuilt and the server serves on.
    EXPECT_EQ(wait_healthy(srv->proc.port()), "");
    post(srv->http(), "/v1/chat/completions", chat_body());
}

// (9)
TEST(http_server, llama3_tiny_chat_equals_the_chat_op) {
    const std::string model =
        std::string(ORDO_SHARED_MODELS_DIR) + "/quant/llama3-tiny-Q4_K_M.gguf";
    ORDO_REQUIRE_SHARED(model);
    server_process s;
    ASSERT_TRUE(s.start(ORDO_SERVER_BIN, {"--model", model})) << s.output();
    ASSERT_EQ(wait_healthy(s.port()), "") << s.output();
    const std::string id = "llama3-tiny-Q4_K_M";
    EXPECT_EQ(body_json(*http_call(s.http_port(), "GET", "/v1/models"))["data"][0]["id"], id);
    const json messages =
        json::array({{{"role", "user"}, {"content", "What is the capital of France?"}}});
    json body = {{"model", id}, {"messages", messages}, {"max_tokens", 16}, {"temperature", 0}};
    json a = body_json({200, {}, post(s.http_port(), "/v1/chat/completions", body)});
    tcp_client c;
    ASSERT_TRUE(c.connect(s.port()));
    event e = op(c, 1, "chat", {{"messages", messages}, {"max_tokens", 16}, {"temperature", 0}});
    ASSERT_EQ(e.str("event"), "done") << e.outcome();
    EXPECT_EQ(a["choices"][0]["message"]["content"], e.str("text"));
    EXPECT_EQ(a["choices"][0]["finish_reason"], e.str("reason") == "length" ? "length" : "stop");
    body["stream"] = true;
    auto r = http_call(s.http_port(), "POST", "/v1/chat/completions", body.dump());
    ASSERT_TRUE(r);
    std::string streamed;
    for (const auto& d : sse_data(r->body)) {
        if (d == "[DONE]") continue;
        json ch = json::parse(d);
        if (!ch["choices"].empty() && ch["choices"][0]["delta"].contains("content")) {
            streamed += ch["choices"][0]["delta"]["content"].get<std::string>();
        }
    }
    EXPECT_EQ(streamed, e.str("text"));
    json comp = body_json({200,
                           {},
                           post(s.http_port(), "/v1/completions",
                                {{"model", id},
                                 {"prompt", "The capital of France is"},
                                 {"max_tokens", 8},
                                 {"temperature", 0}})});
    event g = op(c, 2, "generate",
                 {{"prompt", "The capital of France is"}, {"max_tokens", 8}, {"temperature", 0}});
    EXPECT_EQ(comp["choices"][0]["text"], g.str("text"));
}

// (10)
TEST(http_server, metrics_are_prometheus_text) {
    START();
    // Both greedy (chat_body is): an unseeded draw from the random model can end at its
    // end-of-text token before max_tokens, and the completion-token sum below counts on 4 + 3.
    post(srv->http(), "/v1/chat/completions", chat_body({{"max_tokens", 4}}));
    post(srv->http(), "/v1/completions",
         {{"model", "tiny"}, {"prompt", "a"}, {"max_tokens", 3}, {"temperature", 0}});
    auto r = http_call(srv->http(), "GET", "/metrics");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->header("content-type").rfind("text/plain; version=0.0.4", 0), 0u);
    const std::string& m = r->body;
    for (const char* line :
         {"# TYPE ordo_scheduler_requests_total counter\nordo_scheduler_requests_total 2\n",
          "# TYPE ordo_time_to_first_token_seconds histogram\n",
          "ordo_time_to_first_token_seconds_count 2\n", "ordo_completion_tokens_sum 7\n",
          "ordo_completion_tokens_bucket{le=\"+Inf\"} 2\n", "ordo_active_sequences 0\n",
          "# TYPE ordo_net_connections_open gauge\n", "# TYPE ordo_net_connections_total counter\n",
          "# TYPE ordo_http_requests_total counter\n", "# TYPE ordo_gpu_steps_total counter\n",
          "# TYPE ordo_gpu_step_wall_seconds_total counter\n",
          "# TYPE ordo_gpu_between_steps_seconds_total counter\n",
          "# TYPE ordo_gpu_segments_total counter\n",
          "# TYPE ordo_gpu_segments_replayed_total counter\n",
          "# TYPE ordo_kv_pool_blocks gauge\n"}) {
        EXPECT_NE(m.find(line), std::string::npos) << line << " not in\n" << m;
    }
    // Every metric docs/deploy.md names for a fleet's autoscaler and alerts is served.
    std::ifstream doc(std::string(ORDO_SOURCE_DIR) + "/docs/deploy.md");
    ASSERT_TRUE(doc.good());
    std::string text((std::istreambuf_iterator<char>(doc)), std::istreambuf_iterator<char>());
    const size_t section = text.find("## Metrics for a fleet");
    ASSERT_NE(section, std::string::npos);
    const std::string fleet = text.substr(section, text.find("\n## ", section + 1) - section);
    const std::regex name("`(ordo_[a-z0-9_]+)`");
    size_t named = 0;
    for (auto it = std::sregex_iterator(fleet.begin(), fleet.end(), name);
         it != std::sregex_iterator(); ++it) {
        named++;
        const std::string metric = (*it)[1];
        EXPECT_NE(m.find("# TYPE " + metric + " "), std::string::npos)
            << "docs/deploy.md names " << metric << ", which /metrics does not serve";
    }
    EXPECT_GE(named, 8u) << "the fleet section names no metrics";
    if (run_command("command -v promtool > /dev/null 2>&1").exit_code != 0) {
        const char* req = std::getenv("ORDO_HTTP_CLIENT_REQUIRED");
        if (req != nullptr && std::string(req) == "1") GTEST_FAIL() << "promtool is not installed";
        std::fprintf(stderr,
                     "\n*** SKIPPING promtool check: promtool is not installed "
                     "(Debian's prometheus package) ***\n\n");
        return;
    }
    const std::string file = temp_path("metrics.txt");
    std::ofstream(file) << m;
    command_result check = run_command("promtool check metrics < '" + file + "' 2>&1");
    EXPECT_EQ(check.exit_code, 0) << check.output << "\n" << m;
}

// (11)
TEST(http_server, a_full_scheduler_mailbox_is_429) {
    START();
    tcp_client p;
    ASSERT_TRUE(p.connect(srv->proc.port()));
    // The server is idle: the next message the scheduler's mailbox is offered is the HTTP one.
    event armed =
        op(p, 1, "fault", {{"kind", "mailbox_refuse"}, {"actor", "scheduler"}, {"count", 1}});
    ASSERT_EQ(armed.str("event"), "done") << armed.outcome();
    auto r = http_call(srv->http(), "POST", "/v1/chat/completions", chat_body().dump());
    expect_error(r, 429, "overloaded");
    EXPECT_EQ(body_json(*r)["error"]["type"], "rate_limit_error");
    post(srv->http(), "/v1/chat/completions", chat_body());
}

// (12)
TEST(http_server, an_empty_http_listen_turns_http_off) {
    const std::string model = temp_path("off.gguf");
    std::string mk = std::string(ORDO_MODEL_BIN) + " mk --out " + model +
                     " --n-embd 32 --n-layer 1 --n-head 2 --n-head-kv 2 --n-ff 64"
                     " --n-vocab 260 --type f32 --seed 1 --ctx 256 > /dev/null";
    ASSERT_EQ(std::system(mk.c_str()), 0) << mk;
    server_process s;
    ASSERT_TRUE(s.start(ORDO_SERVER_BIN, {"--model", model, "--http-listen", ""})) << s.output();
    EXPECT_EQ(s.http_port(), 0);
    EXPECT_EQ(s.output().find("http listening"), std::string::npos) << s.output();
    EXPECT_EQ(wait_healthy(s.port()), "") << s.output();
    tcp_client c;
    ASSERT_TRUE(c.connect(s.port()));
    event st = op(c, 1, "stats", json::object());
    ASSERT_EQ(st.str("event"), "done") << st.outcome();
    EXPECT_NE(field(st.o(), "net"), nullptr);
    EXPECT_EQ(field(st.o(), "http"), nullptr) << "an http map with HTTP off";
}

// (13)
TEST(http_server, shutdown_past_the_grace_ends_a_stream_with_an_error) {
    START();
    tcp_client p;
    ASSERT_TRUE(p.connect(srv->proc.port()));
    event armed = op(p, 1, "fault",
                     {{"kind", "step_delay"}, {"ms", 100}, {"count", 100}, {"phase", "decode"}});
    ASSERT_EQ(armed.str("event"), "done") << armed.outcome();
    http_conn c;
    ASSERT_TRUE(c.connect(srv->http()));
    ASSERT_TRUE(
        c.send(http_request_text("POST", "/v1/chat/completions",
                                 chat_body({{"max_tokens", 100}, {"stream", true}}).dump())));
    auto head = c.read_head();
    ASSERT_TRUE(head);
    ASSERT_EQ(head->status, 200);
    ASSERT_TRUE(c.read_chunk());  // the role chunk: the request runs
    // The grace (server.shutdown_grace_ms, 5 s by default) is far shorter than 100 delayed
    // steps of 100 ms.
    ASSERT_EQ(::kill(srv->proc.pid(), SIGTERM), 0);
    std::string body;
    while (auto chunk = c.read_chunk()) {
        if (chunk->empty()) break;
        body += *chunk;
    }
    auto events = sse_data(body);
    ASSERT_FALSE(events.empty());
    EXPECT_NE(events.back(), "[DONE]") << body;
    json last = json::parse(events.back(), nullptr, false);
    ASSERT_TRUE(last.contains("error")) << body;
    EXPECT_EQ(last["error"]["code"], "shutting_down");
    EXPECT_EQ(srv->proc.wait_exit(), 0) << srv->proc.output();
}

namespace {

// The protocol's stats once every HTTP connection has closed, lingering ones included
// (bounded: 200 polls); its `http`
// map as JSON, or null when absent or never settled.
json settled_http_stats(uint16_t port) {
    tcp_client c;
    EXPECT_TRUE(c.connect(port));
    for (int i = 0; i < 200; i++) {
        event e = op(c, 1000 + uint64_t(i), "stats", json::object());
        const msgpack::object* h = field(e.o(), "http");
        if (h == nullptr) return nullptr;
        if (uint_field(*h, "connections_open") == 0 &&
            uint_field(*h, "connections_lingering") == 0) {
            json j = json::object();
            for (const auto& kv : h->via.map) {
                j[kv.key.as<std::string>()] = kv.val.as<uint64_t>();
            }
            return j;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return nullptr;
}

// The value of an unlabelled Prometheus sample `name` in `text`; -1 when absent.
int64_t sample(const std::string& text, const std::string& name) {
    size_t at = text.find("\n" + name + " ");
    if (at == std::string::npos) return -1;
    return std::stoll(text.substr(at + name.size() + 2));
}

}  // namespace

// (14)
TEST(http_server, stats_reports_the_http_counters) {
    START();
    uint64_t sent = 0;  // request bytes, as the server's bytes_in counts them
    auto exchange = [&](const std::string& text) {
        http_conn c;
        EXPECT_TRUE(c.connect(srv->http()));
        EXPECT_TRUE(c.send(text));
        sent += text.size();
        return c.read();
    };
    const std::string close = "Connection: close\r\n";
    auto health = exchange(http_request_text("GET", "/health", "", close));
    ASSERT_TRUE(health);
    EXPECT_EQ(health->status, 200);
    expect_error(exchange(http_request_text("GET", "/v2/nothing", "", close)), 404, "not_found");
    auto chat = exchange(http_request_text("POST", "/v1/chat/completions",
                                           chat_body({{"max_tokens", 3}}).dump(), close));
    ASSERT_TRUE(chat);
    EXPECT_EQ(chat->status, 200);
    auto stream =
        exchange(http_request_text("POST", "/v1/chat/completions",
                                   chat_body({{"max_tokens", 3}, {"stream", true}}).dump(), close));
    ASSERT_TRUE(stream);
    EXPECT_EQ(sse_data(stream->body).back(), "[DONE]");
    // Only the headers: answered 413 before any body byte, not a request.
    expect_error(exchange("POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: " +
                          std::to_string(k_body_max + 1) + "\r\n\r\n"),
                 413, "too_large");

    json h = settled_http_stats(srv->proc.port());
    ASSERT_TRUE(h.is_object()) << "no http map, or connections never closed";
    const json want = {
        {"connections_open", 0}, {"connections_total", 5}, {"connections_refused", 0},
        {"requests", 4},         {"responses_2xx", 3},     {"responses_4xx", 2},
        {"responses_5xx", 0},    {"streams", 1},           {"too_large", 1},
        {"malformed", 0},        {"header_timeouts", 0},   {"slow_readers", 0},
        {"disconnects", 0},      {"bytes_in", sent}};
    for (const auto& [key, value] : want.items()) EXPECT_EQ(h[key], value) << key;
    EXPECT_GT(h["bytes_out"], 0);

    // /metrics: the same counters, read when its own request was taken (connection open, request
    // counted, its answer not yet written).
    const std::string metrics_req = http_request_text("GET", "/metrics", "", close);
    auto m = exchange(metrics_req);
    ASSERT_TRUE(m);
    ASSERT_EQ(m->status, 200);
    const std::string& t = m->body;
    const std::map<std::string, int64_t> shown = {
        {"ordo_http_connections_open", 1},    {"ordo_http_connections_total", 6},
        {"ordo_http_requests_total", 5},      {"ordo_http_responses_2xx_total", 3},
        {"ordo_http_responses_4xx_total", 2}, {"ordo_http_streams_total", 1},
        {"ordo_http_too_large_total", 1},     {"ordo_http_bytes_in_total", int64_t(sent)}};
    for (const auto& [name, value] : shown) EXPECT_EQ(sample(t, name), value) << name << "\n" << t;
    EXPECT_EQ(sample(t, "ordo_http_bytes_out_total"), int64_t(h["bytes_out"].get<uint64_t>())) << t;
}

// (15)
TEST(http_server, net_stop_reading_holds_what_the_client_sends_until_the_pause_ends) {
    START();
    constexpr int pause_ms = 3000;
    tcp_client p;
    ASSERT_TRUE(p.connect(srv->proc.port()));
    event armed =
        op(p, 1, "fault", {{"kind", "net_stop_reading"}, {"phase", "decode"}, {"ms", pause_ms}});
    ASSERT_EQ(armed.str("event"), "done") << armed.outcome();
    http_conn c;
    ASSERT_TRUE(c.connect(srv->http()));
    const auto began = std::chrono::steady_clock::now();
    // The stream, and behind it the start of the next request (no blank line yet).
    ASSERT_TRUE(c.send(http_request_text("POST", "/v1/chat/completions",
                                         chat_body({{"max_tokens", 6}, {"stream", true}}).dump()) +
                       "GET /health HTTP/1.1\r\nHost: t\r\n"));
    auto head = c.read_head();
    ASSERT_TRUE(head);
    ASSERT_EQ(head->status, 200);
    std::string body;
    while (auto chunk = c.read_chunk()) {
        if (chunk->empty()) break;
        body += *chunk;
    }
    ASSERT_FALSE(sse_data(body).empty());
    EXPECT_EQ(sse_data(body).back(), "[DONE]") << body;
    const auto streamed = std::chrono::steady_clock::now() - began;
    // What makes the rest a test of the pause: the stream ended well inside it.
    ASSERT_LT(streamed, std::chrono::milliseconds(pause_ms - 1000)) << "the stream was too slow";
    ASSERT_TRUE(c.send("\r\n"));
    auto health = c.read();
    ASSERT_TRUE(health) << "the request sent during the pause was lost";
    EXPECT_EQ(health->status, 200) << health->body;
    EXPECT_GE(std::chrono::steady_clock::now() - began, std::chrono::milliseconds(pause_ms))
        << "the request sent during the pause was read before the pause ended";

    event st = op(p, 2, "stats", json::object());
    ASSERT_NE(field(st.o(), "http"), nullptr);
    EXPECT_EQ(uint_field(*field(st.o(), "http"), "fault_pauses"), 1u);
    EXPECT_EQ(uint_field(*field(st.o(), "http"), "header_timeouts"), 0u);
    EXPECT_EQ(uint_field(*field(st.o(), "scheduler"), "net_faults"), 1u);
    c.close();
    EXPECT_TRUE(settled_stats(srv->proc.port())["settled"]);
    json h = settled_http_stats(srv->proc.port());
    ASSERT_TRUE(h.is_object()) << "the connection never closed";
    EXPECT_EQ(h["connections_open"], 0);
    EXPECT_EQ(h["disconnects"], 0);
}

namespace {

// Sends on `c` fail after 10 s blocked rather than hang the test.
void bound_sends(http_conn& c) {
    timeval tv{10, 0};
    setsockopt(c.fd(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

std::string upload_head(size_t content_length) {
    return "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
           "Content-Length: " +
           std::to_string(content_length) + "\r\n\r\n";
}

}  // namespace

// (16)
TEST(http_server, an_early_413_is_read_whole_while_the_upload_goes_on) {
    constexpr int linger_ms = 1500;
    constexpr uint64_t linger_bytes = 16 << 20;
    auto srv = start_server("linger_ms = " + std::to_string(linger_ms) +
                            "\nmax_linger_bytes = " + std::to_string(linger_bytes) + "\n");
    ASSERT_EQ(srv->error, "") << srv->proc.output();
    const std::string piece(64 * 1024, 'x');

    // The whole body, then the answer: the 413 was queued after the first piece.
    constexpr size_t body = 8 << 20;
    http_conn up;
    ASSERT_TRUE(up.connect(srv->http()));
    bound_sends(up);
    ASSERT_TRUE(up.send(upload_head(body)));
    size_t sent = 0;
    while (sent < body && up.send(piece)) sent += piece.size();
    EXPECT_EQ(sent, body) << "the upload was cut after " << sent << " bytes";
    auto r = up.read();
    expect_error(r, 413, "too_large");
    EXPECT_TRUE(up.wait_closed());
    EXPECT_EQ(up.peer_closed(), "eof");
    up.close();

    // A client that never stops: cut off near the byte bound (kernel buffers add a few MiB).
    http_conn flood;
    ASSERT_TRUE(flood.connect(srv->http()));
    bound_sends(flood);
    ASSERT_TRUE(flood.send(upload_head(size_t(1) << 30)));
    constexpr uint64_t flood_max = 256 << 20;
    uint64_t flooded = 0;
    while (flooded < flood_max && flood.send(piece)) flooded += piece.size();
    EXPECT_LT(flooded, flood_max) << "never cut off";
    EXPECT_GE(flooded, linger_bytes - piece.size());
    EXPECT_LT(flooded, linger_bytes + (16 << 20));

    // A client that trickles on after reading its 413: closed linger_ms after it.
    http_conn slow;
    ASSERT_TRUE(slow.connect(srv->http()));
    ASSERT_TRUE(slow.send(upload_head(1 << 20) + std::string(1024, 'x')));
    expect_error(slow.read(), 413, "too_large");
    const auto answered = std::chrono::steady_clock::now();
    const std::string drop(1024, 'x');
    // The server's FIN came with the answer; its close shows as a failed send (the first send
    // after it draws a reset, the next fails).
    while (std::chrono::steady_clock::now() - answered < std::chrono::seconds(10)) {
        if (::send(slow.fd(), drop.data(), drop.size(), MSG_NOSIGNAL) <= 0) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    const auto lingered = std::chrono::steady_clock::now() - answered;
    EXPECT_GE(lingered, std::chrono::milliseconds(linger_ms - 100));
    EXPECT_LT(lingered, std::chrono::milliseconds(2 * linger_ms)) << "never cut off";

    json h = settled_http_stats(srv->proc.port());
    ASSERT_TRUE(h.is_object()) << "a connection stayed open or lingering";
    EXPECT_EQ(h["too_large"], 3);
    EXPECT_EQ(h["lingering_closes"], 3);
    EXPECT_EQ(h["linger_cutoffs"], 2);
}
