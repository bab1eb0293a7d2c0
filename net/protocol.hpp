// protocol.hpp: the ordo wire protocol's envelope (docs/protocol.md), as pure functions.
//
// Requests are msgpack maps {"id": uint > 0, "op": string, ...params}; every request gets
// exactly one terminal event, {"id", "event": "done", ...} or {"id", "event": "error", "code",
// "message"}, possibly preceded by streamed {"id", "event": "token", ...} events. This file
// parses the envelope of one frame, checks parameter maps, and encodes events; it knows nothing
// about sockets or actors, so it is unit-tested directly.
#pragma once

#include <msgpack.hpp>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <variant>

#include "actors/runtime/result.hpp"

namespace ordo::net {

inline constexpr uint32_t protocol_version = 1;

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

// bad_request naming the first key of `map` that is neither "id", "op" nor in `allowed`.
status check_param_keys(const msgpack::object& map, std::initializer_list<std::string_view> allowed);

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

std::string encode_error(uint64_t id, std::string_view code, std::string_view message);

}  // namespace ordo::net
