// frame_decoder.hpp: turns a TCP byte stream into msgpack frames, with a size limit.
//
// Pure logic, no sockets: the net actor feeds it whatever a read returned and takes out whole
// msgpack values. A frame is one msgpack value; the wire has no length prefix, so the size of a
// frame is only known once it has been parsed. The limit is therefore enforced on the bytes
// received since the end of the last whole frame: once more than `frame_bytes_max` are pending
// without completing a value, the stream is refused (`bad_frame`, oversized) without waiting
// for the rest. Malformed msgpack is refused the same way. After an error the decoder is dead:
// the connection must be closed, because the stream can no longer be resynchronised.
//
// Declared sizes are bounded too (unpack_limit), so a 5-byte header claiming a 4-billion
// element array cannot make the parser allocate before the bytes exist.
#pragma once

#include <msgpack.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "actors/runtime/result.hpp"

namespace ordo::net {

// Nesting deeper than this is refused: no request needs it, and the parser recurses per level.
inline constexpr size_t frame_depth_max = 32;

class frame_decoder {
public:
    explicit frame_decoder(size_t frame_bytes_max);

    // Appends received bytes. Never fails by itself; errors surface from next().
    void feed(const char* data, size_t size);

    // The next whole frame, std::nullopt when more bytes are needed, or an error
    // (code "bad_frame") when the stream is malformed or a frame is too large.
    result<std::optional<msgpack::object_handle>> next();

    size_t frame_bytes_max() const { return _frame_bytes_max; }
    uint64_t frames() const { return _frames; }

private:
    msgpack::unpacker _unpacker;
    size_t _frame_bytes_max;
    uint64_t _fed_bytes = 0;       // total bytes fed so far
    uint64_t _frame_start = 0;     // stream offset where the pending frame begins
    uint64_t _frames = 0;
    std::optional<error> _failed;  // sticky: a broken stream stays broken
};

}  // namespace ordo::net
