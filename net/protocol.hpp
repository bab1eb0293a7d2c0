// protocol.hpp: the ordo wire protocol's envelope (docs/protocol.md), as pure functions.
//
// Requests are msgpack maps {"id": uint > 0, "op": string, ...params}; every request gets
// exactly one terminal event, {"id", "event": "done", ...} or {"id", "event": "error", "code",
// "message"}, possibly preceded by streamed {"id", "event": "token", ...} events. This file
// parses the envelope of one frame (the parameters are net/ops.hpp's) and encodes the typed
// events of door/door_msgs.hpp as wire frames — the only place that does; it knows nothing about
// sockets or actors, so it is unit-tested directly.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <msgpack.hpp>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>

#include "actors/runtime/result.hpp"
#include "door/door_msgs.hpp"
#include "door/error_code.hpp"

namespace ordo::net {

inline constexpr uint32_t protocol_version = 1;

// A float field as the protocol documents it: always a msgpack float64. msgpack-c's packer
// writes a whole-number double (2.0) as an integer, which a client decoding a typed float
// would refuse; `pk.pack(wire_f64{x})` writes the 9 bytes itself.
struct wire_f64 {
    double value;
};

struct request {
    uint64_t id = 0;
    std::string op;
    const msgpack::object* map = nullptr;  // the whole frame (params beside id/op); not owned
};

// A frame whose envelope is unusable. `fatal` (no usable id: code bad_frame, id 0) means the
// connection must be closed after the error is written; otherwise the error answers `id`.
struct envelope_error {
    uint64_t id = 0;
    bool fatal = false;
    error err;
};

std::variant<request, envelope_error> parse_envelope(const msgpack::object& frame);

// Builds one event map. The map header is written last, so fields may be added freely.
class event_writer {
public:
    event_writer(uint64_t id, std::string_view event);

    template <typename T>
    event_writer& field(std::string_view key, const T& value) {
        key_only(key);
        _body.pack(value);
        return *this;
    }
    // Adds a key and returns the packer: the caller packs exactly one value (e.g. a nested map).
    msgpack::packer<msgpack::sbuffer>& nested(std::string_view key) {
        key_only(key);
        return _body;
    }
    std::string finish() const;

private:
    void key_only(std::string_view key);

    msgpack::sbuffer _buffer;
    msgpack::packer<msgpack::sbuffer> _body{_buffer};
    uint32_t _fields = 0;
};

std::string encode_error(uint64_t id, door::errc code, std::string_view message);

// The wire frame of each event (docs/protocol.md §3). `conn` is not part of the frame.
std::string encode(const door::token_event& e);
std::string encode(const door::generate_done& e);
std::string encode(const door::tokenize_done& e);
std::string encode(const door::detokenize_done& e);
std::string encode(const door::cancel_done& e);
std::string encode(const door::session_delete_done& e);
std::string encode(const door::model_done& e);
std::string encode(const door::stats_done& e);
std::string encode(const door::fault_done& e);
std::string encode(const door::request_error& e);
std::string encode(const door::embed_done& e);

// Whether an event ends its request.
template <typename T>
constexpr bool is_terminal() {
    return !std::is_same_v<T, door::token_event>;
}

}  // namespace ordo::net

namespace msgpack {
MSGPACK_API_VERSION_NAMESPACE(MSGPACK_DEFAULT_API_NS) {
    namespace adaptor {
    template <>
    struct pack<ordo::net::wire_f64> {
        template <typename Stream>
        packer<Stream>& operator()(packer<Stream>& o, const ordo::net::wire_f64& v) const {
            uint64_t bits;
            std::memcpy(&bits, &v.value, sizeof bits);
            char raw[9];
            raw[0] = static_cast<char>(0xcb);
            for (int i = 0; i < 8; i++) raw[1 + i] = static_cast<char>(bits >> (56 - 8 * i));
            o.pack_bin_body(raw, sizeof raw);  // appends the bytes verbatim
            return o;
        }
    };
    }  // namespace adaptor
}  // MSGPACK_API_VERSION_NAMESPACE(MSGPACK_DEFAULT_API_NS)
}  // namespace msgpack
