// frame_decoder.hpp: turns a TCP byte stream into msgpack frames, with a size limit.
//
// Pure logic, no sockets: the net actor feeds it whatever a read returned and takes out whole
// msgpack values. A frame is one msgpack value; the wire has no length prefix, so where a frame
// ends is only known by walking its structure. The decoder therefore runs a small resumable
// scanner over the msgpack headers as bytes arrive (see "The scanner" below) and unpacks a
// frame with msgpack::unpack only once the scanner has found its last byte.
//
// What is refused, with code bad_frame, and when:
//  - a header whose declared size would take the frame past `frame_bytes_max`: refused as soon
//    as the header's bytes are in, without waiting for the payload (a str32 declaring 4 GiB
//    after a 16-byte prefix is refused after those 16 bytes). "Size" counts the header, the
//    payload of a str/bin/ext, and one byte for every array/map element still to come, since
//    no element is shorter than that: a frame is refused exactly when no completion of the
//    bytes seen so far could fit.
//  - a frame of more than `frame_values_max` msgpack values (every scalar, str, bin, ext, array
//    and map counts one; a map's keys and values count separately), as soon as a header
//    declares elements that would take it past the bound. Bytes alone do not bound memory:
//    msgpack::unpack makes one ~24-byte object per value, so a 1 MiB frame of one-byte
//    integers would cost ~24 MiB of objects; with this bound a frame costs at most
//    frame_values_max objects whatever its bytes;
//  - the reserved byte 0xc1, at once;
//  - a container nested inside `frame_depth_max` others, at once.
// Hence the bytes pending for an incomplete frame never exceed `frame_bytes_max`. After an error
// the decoder is dead: the connection must be closed, because the stream can no longer be
// resynchronised.
//
// msgpack::unpack still gets an unpack_limit as a second line of defence: a frame the scanner
// accepted never reaches those limits, and the fuzzer (net/fuzz) checks that the two agree.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <msgpack.hpp>
#include <optional>
#include <string>
#include <vector>

#include "actors/runtime/result.hpp"

namespace ordo::net {

// Nesting deeper than this is refused: no request needs it, and the unpacker recurses per level.
// A container may sit inside at most this many others (msgpack-c's unpack_limit depth counts
// the same way).
inline constexpr size_t frame_depth_max = 32;
// Values one frame may hold (server.max_frame_values): the longest prompt sent as token ids
// (a 128k-token context) plus the rest of a request fits in 262144, and the objects msgpack
// makes of them take ~6 MiB.
inline constexpr size_t frame_values_max_default = 262'144;

class frame_decoder {
public:
    explicit frame_decoder(size_t frame_bytes_max,
                           size_t frame_values_max = frame_values_max_default);

    // Appends received bytes. Never fails by itself; errors surface from next().
    void feed(const char* data, size_t size);

    // The next whole frame, std::nullopt when more bytes are needed, or an error
    // (code "bad_frame") when the stream is malformed or a frame is too large. After an error,
    // every later call returns the same error.
    result<std::optional<msgpack::object_handle>> next();

    size_t frame_bytes_max() const { return _frame_bytes_max; }
    size_t frame_values_max() const { return _frame_values_max; }
    uint64_t frames() const { return _frames; }
    // Bytes received of a frame not yet complete (0 between whole frames): the net actor's
    // read timeout runs while this is not 0.
    size_t pending_bytes() const {
        return _buffer.size() > _frame_begin ? _buffer.size() - _frame_begin : 0;
    }

private:
    // ---- The scanner ------------------------------------------------------------------------
    // It walks one frame's headers, never its payloads, and keeps only what it needs to resume
    // on the next feed: where it stopped (`_scan`), how many payload bytes of the current
    // str/bin/ext are still to skip, and for each open array/map how many elements have not
    // started yet. A header cut in two by a read is simply read again from its first byte once
    // more bytes are in (at most 9 bytes), so the whole stream is scanned in O(bytes).
    enum class scan_state {
        need_more,   // every byte in is accounted for; the frame is not complete
        advanced,    // scan_header() accepted one header; scan() goes on
        frame_done,  // _scan is one past the pending frame's last byte
        failed,      // _failed is set
    };
    scan_state scan();
    scan_state scan_header();  // one header at _scan; the caller checked a byte is there
    void value_done();         // a value ended: close every container it completed
    scan_state refuse(std::string message);
    uint64_t stream_offset(size_t buffer_pos) const { return _dropped_bytes + buffer_pos; }

    result<std::optional<msgpack::object_handle>> take_frame();
    void drop_consumed();

    size_t _frame_bytes_max;
    size_t _frame_values_max;
    msgpack::unpack_limit _unpack_limit;

    std::vector<char> _buffer;    // received bytes from the start of the pending frame on
    uint64_t _dropped_bytes = 0;  // stream offset of _buffer[0]
    size_t _frame_begin = 0;      // where the pending frame starts in _buffer
    size_t _scan = 0;             // next byte the scanner has not accounted for
    uint64_t _payload_left = 0;   // str/bin/ext payload bytes still to skip
    bool _value_started = false;  // the pending frame's root header has been read
    std::array<uint64_t, frame_depth_max> _elements_left{};  // per open container, outermost first
    size_t _depth = 0;                                       // open containers in _elements_left
    uint64_t _elements_pending = 0;                          // sum of _elements_left[0.._depth)
    uint64_t _values = 0;  // headers accepted in the pending frame

    uint64_t _frames = 0;
    std::optional<error> _failed;  // sticky: a broken stream stays broken
};

}  // namespace ordo::net
