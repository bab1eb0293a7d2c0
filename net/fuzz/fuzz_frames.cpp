// fuzz_frames.cpp: libFuzzer entry point for the protocol's edge: frame_decoder and the
// envelope checks every decoded frame goes through.
//
// Input layout: byte 0 picks max_frame_bytes from a small table, bytes 1..4 are the sizes
// (1..256) of the chunks the rest is fed in, cycling; the rest is the TCP byte stream. The
// stream is decoded twice, in those chunks and in one feed, and every decoded frame goes to
// check_frame(), the place for whatever the server does with a frame before dispatching it.
//
// Asserted (abort = a crash report with the input saved): both decodings give the same frames
// and the same error; an error is bad_frame, repeats on every later next(), survives more bytes
// and is never followed by a frame; a frame's smallest encoding is no larger than
// max_frame_bytes; and the decoder agrees with an oracle, msgpack::unpack over the whole stream:
// each frame it finds that fits the limit comes out equal, a frame over the limit, malformed or
// too deep is refused, and an unfinished tail longer than the limit is refused before it ends.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <msgpack.hpp>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "net/frame_decoder.hpp"
#include "net/ops.hpp"
#include "net/protocol.hpp"
#include "scheduler/stop_matcher.hpp"

namespace net = ordo::net;

namespace {

// Small limits so the fuzzer reaches them; 1 MiB (the server's order) for the reproduction.
constexpr std::array<size_t, 16> frame_bytes_max_choices = {
    1, 8, 16, 24, 32, 48, 64, 100, 128, 200, 256, 512, 1024, 4096, 65536, size_t{1} << 20};
constexpr size_t plan_bytes = 5;  // byte 0: the limit; bytes 1..4: chunk sizes

void check(bool ok, const char* what) {
    if (ok) return;
    std::fprintf(stderr, "fuzz_frames: invariant broken: %s\n", what);
    std::abort();
}

// ---- what the server does with a decoded frame ------------------------------------------------
// Today: the envelope, then the parameter keys as health/stats check them, then the error event
// a refusal would write. Op validation belongs here when it exists.

// The limits parse_op gets, with a chat template that reads every conversation variable, so
// `chat` and `apply_template` frames reach the renderer.
const net::request_limits& fuzz_limits() {
    static const net::request_limits l = [] {
        net::request_limits r{256, 1000, true};
        r.chat = std::make_shared<const net::chat_setup>(net::make_chat_setup(
            "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}"
            "{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}{% endfor %}"
            "{% if tools %}{{ tools | tojson }}{% endif %}{% if x is defined %}{{ x }}{% endif %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}",
            "fuzz", "<s>", "</s>"));
        return r;
    }();
    return l;
}

// What the net actor does with a frame before dispatching it: the envelope, then the one op
// validator. Every refusal is bad_frame / bad_request / unknown_op / template_error and its
// message is valid UTF-8 whatever the client sent.
void check_frame(const msgpack::object& frame) {
    auto parsed = net::parse_envelope(frame);
    if (auto* bad = std::get_if<net::envelope_error>(&parsed)) {
        check(bad->fatal == (bad->id == 0), "fatal envelope errors are exactly those with no id");
        check(bad->err.code == (bad->fatal ? "bad_frame" : "bad_request"), "envelope error code");
        check(ordo::sched::is_valid_utf8(bad->err.message),
              "envelope error messages are valid UTF-8");
        return;
    }
    const auto& r = std::get<net::request>(parsed);
    check(r.id > 0 && r.map == &frame, "a parsed request has an id and points at its frame");
    auto op = net::parse_op(r, fuzz_limits());
    if (!op.ok()) {
        check(op.err().code == "bad_request" || op.err().code == "unknown_op" ||
                  op.err().code == "template_error",
              "parse_op refuses with bad_request, unknown_op or template_error");
        check(ordo::sched::is_valid_utf8(op.err().message), "op error messages are valid UTF-8");
        (void)net::encode_error(r.id, door::errc::bad_request, op.err().message);
    }
}

// Deep equality. Not msgpack::object's operator==: NaN != NaN there, and it calls memcmp with
// the null pointer of an empty string (UBSan reports it).
bool same(const msgpack::object& a, const msgpack::object& b) {
    auto same_bytes = [](const char* x, const char* y, uint32_t n) {
        return n == 0 || std::memcmp(x, y, n) == 0;
    };
    if (a.type != b.type) return false;
    switch (a.type) {
        case msgpack::type::NIL:
            return true;
        case msgpack::type::BOOLEAN:
            return a.via.boolean == b.via.boolean;
        case msgpack::type::POSITIVE_INTEGER:
            return a.via.u64 == b.via.u64;
        case msgpack::type::NEGATIVE_INTEGER:
            return a.via.i64 == b.via.i64;
        case msgpack::type::FLOAT32:
        case msgpack::type::FLOAT64:  // bit for bit, so NaN equals the same NaN
            return std::memcmp(&a.via.f64, &b.via.f64, sizeof(double)) == 0;
        case msgpack::type::STR:
            return a.via.str.size == b.via.str.size &&
                   same_bytes(a.via.str.ptr, b.via.str.ptr, a.via.str.size);
        case msgpack::type::BIN:
            return a.via.bin.size == b.via.bin.size &&
                   same_bytes(a.via.bin.ptr, b.via.bin.ptr, a.via.bin.size);
        case msgpack::type::EXT:  // ptr[0] is the ext type, then size bytes
            return a.via.ext.size == b.via.ext.size &&
                   same_bytes(a.via.ext.ptr, b.via.ext.ptr, a.via.ext.size + 1);
        case msgpack::type::ARRAY:
            if (a.via.array.size != b.via.array.size) return false;
            for (uint32_t i = 0; i < a.via.array.size; i++) {
                if (!same(a.via.array.ptr[i], b.via.array.ptr[i])) return false;
            }
            return true;
        case msgpack::type::MAP:
            if (a.via.map.size != b.via.map.size) return false;
            for (uint32_t i = 0; i < a.via.map.size; i++) {
                if (!same(a.via.map.ptr[i].key, b.via.map.ptr[i].key)) return false;
                if (!same(a.via.map.ptr[i].val, b.via.map.ptr[i].val)) return false;
            }
            return true;
    }
    check(false, "unpack makes no other object type");
    return false;
}

// ---- decoding ---------------------------------------------------------------------------------

struct outcome {
    std::vector<msgpack::object_handle> frames;
    std::optional<ordo::error> failed;
};

// The size of the smallest msgpack encoding of `o`, floats keeping their width. Not
// msgpack::pack: it writes an integral float as an integer, which can be longer (a float32 of
// 1e19 becomes a 9-byte uint64), so "re-packs within the limit" does not hold for it.
size_t minimal_bytes(const msgpack::object& o) {
    auto by_length = [](uint64_t n, size_t b8, size_t b16, size_t b32) {
        return n <= 0xff ? b8 : n <= 0xffff ? b16 : b32;
    };
    switch (o.type) {
        case msgpack::type::NIL:
        case msgpack::type::BOOLEAN:
            return 1;
        case msgpack::type::POSITIVE_INTEGER: {
            uint64_t u = o.via.u64;
            return u < 0x80 ? 1 : u <= 0xffffffff ? by_length(u, 2, 3, 5) : 9;
        }
        case msgpack::type::NEGATIVE_INTEGER: {
            int64_t i = o.via.i64;
            return i >= -32 ? 1 : i >= INT8_MIN ? 2 : i >= INT16_MIN ? 3 : i >= INT32_MIN ? 5 : 9;
        }
        case msgpack::type::FLOAT32:
            return 5;
        case msgpack::type::FLOAT64:
            return 9;
        case msgpack::type::STR:
            return (o.via.str.size < 32 ? 1 : by_length(o.via.str.size, 2, 3, 5)) + o.via.str.size;
        case msgpack::type::BIN:
            return by_length(o.via.bin.size, 2, 3, 5) + o.via.bin.size;
        case msgpack::type::EXT: {
            uint32_t n = o.via.ext.size;
            bool fixed = n == 1 || n == 2 || n == 4 || n == 8 || n == 16;
            return (fixed ? 2 : by_length(n, 3, 4, 6)) + n;
        }
        case msgpack::type::ARRAY: {
            size_t bytes = o.via.array.size < 16 ? 1 : by_length(o.via.array.size, 3, 3, 5);
            for (uint32_t i = 0; i < o.via.array.size; i++) {
                bytes += minimal_bytes(o.via.array.ptr[i]);
            }
            return bytes;
        }
        case msgpack::type::MAP: {
            size_t bytes = o.via.map.size < 16 ? 1 : by_length(o.via.map.size, 3, 3, 5);
            for (uint32_t i = 0; i < o.via.map.size; i++) {
                bytes += minimal_bytes(o.via.map.ptr[i].key) + minimal_bytes(o.via.map.ptr[i].val);
            }
            return bytes;
        }
    }
    check(false, "unpack makes no other object type");
    return 0;
}

// Takes every frame the decoder has, checking the per-call invariants.
void drain(net::frame_decoder& d, size_t frame_bytes_max, outcome& out) {
    while (!out.failed) {
        auto r = d.next();
        if (!r.ok()) {
            check(r.err().code == "bad_frame", "decoder errors are bad_frame");
            check(!r.err().message.empty(), "decoder errors say what");
            out.failed = r.err();
            return;
        }
        if (!r->has_value()) return;
        const msgpack::object& frame = (*r)->get();
        check(minimal_bytes(frame) <= frame_bytes_max, "a frame re-packs within the limit");
        out.frames.push_back(std::move(**r));
        check(d.frames() == out.frames.size(), "frames() counts the frames taken");
    }
}

// After an error: the same error on every call, more bytes included, and no frame ever again.
void check_dead(net::frame_decoder& d, const ordo::error& first, const uint8_t* data, size_t n) {
    uint64_t frames = d.frames();
    for (int i = 0; i < 2; i++) {
        d.feed(reinterpret_cast<const char*>(data), n);
        auto r = d.next();
        check(!r.ok(), "a failed decoder stays failed");
        check(r.err().code == first.code && r.err().message == first.message,
              "a failed decoder repeats its error");
    }
    check(d.frames() == frames, "a failed decoder yields no frame");
}

outcome decode(const uint8_t* stream, size_t size, size_t frame_bytes_max,
               const uint8_t* chunk_plan, size_t chunk_plan_size) {
    net::frame_decoder d(frame_bytes_max);
    outcome out;
    for (size_t at = 0, i = 0; at < size && !out.failed; i++) {
        size_t n = chunk_plan_size == 0 ? size : 1 + size_t{chunk_plan[i % chunk_plan_size]};
        n = std::min(n, size - at);
        d.feed(reinterpret_cast<const char*>(stream + at), n);
        at += n;
        drain(d, frame_bytes_max, out);
    }
    if (out.failed) check_dead(d, *out.failed, stream, size);
    return out;
}

// ---- the oracle -------------------------------------------------------------------------------
// msgpack::unpack over what is left of the stream, with the decoder's own limits on declared
// sizes (so a lying header cannot make it allocate) but no frame-size limit: where it says a
// frame ends, and whether it is malformed, is what the decoder must agree with.
void check_against_oracle(const uint8_t* stream, size_t size, size_t frame_bytes_max,
                          const outcome& got) {
    const msgpack::unpack_limit limit(frame_bytes_max, frame_bytes_max / 2, frame_bytes_max,
                                      frame_bytes_max, frame_bytes_max, net::frame_depth_max);
    const char* bytes = reinterpret_cast<const char*>(stream);
    size_t at = 0;
    for (size_t i = 0;; i++) {
        if (at == size) {
            check(i == got.frames.size() && !got.failed, "a clean stream decodes whole");
            return;
        }
        size_t used = 0;
        msgpack::object_handle want;
        bool incomplete = false;
        bool malformed = false;
        try {
            want = msgpack::unpack(bytes + at, size - at, used, nullptr, nullptr, limit);
        } catch (const msgpack::insufficient_bytes&) {
            incomplete = true;
        } catch (const std::exception&) {
            malformed = true;  // 0xc1, too deep, or a declared size over the limit
        }
        if (incomplete) {
            check(i == got.frames.size(), "every complete frame before a tail comes out");
            if (size - at > frame_bytes_max) check(got.failed.has_value(), "long tail refused");
            return;
        }
        if (malformed || used > frame_bytes_max) {
            check(i == got.frames.size() && got.failed.has_value(), "a bad frame is refused");
            return;
        }
        check(i < got.frames.size(), "a frame within the limit comes out");
        check(same(got.frames[i].get(), want.get()), "the frame equals msgpack::unpack's");
        at += used;
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < plan_bytes) return 0;
    const size_t frame_bytes_max =
        frame_bytes_max_choices[data[0] % frame_bytes_max_choices.size()];
    const uint8_t* stream = data + plan_bytes;
    const size_t stream_size = size - plan_bytes;

    outcome chunked = decode(stream, stream_size, frame_bytes_max, data + 1, plan_bytes - 1);
    outcome whole = decode(stream, stream_size, frame_bytes_max, nullptr, 0);
    check(chunked.frames.size() == whole.frames.size(), "chunking changes no frame count");
    for (size_t i = 0; i < whole.frames.size(); i++) {
        check(same(chunked.frames[i].get(), whole.frames[i].get()), "chunking changes no frame");
    }
    check(chunked.failed.has_value() == whole.failed.has_value(), "chunking changes no error");
    if (whole.failed) {
        check(chunked.failed->message == whole.failed->message, "chunking changes no message");
    }
    check_against_oracle(stream, stream_size, frame_bytes_max, whole);
    for (const auto& f : chunked.frames) check_frame(f.get());
    return 0;
}
