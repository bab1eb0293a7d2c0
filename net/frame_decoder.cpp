// frame_decoder.cpp: see frame_decoder.hpp.
#include "net/frame_decoder.hpp"

#include <cstring>

namespace ordo::net {
namespace {

// Copy every str/bin into the object's zone: frames then own their bytes and the unpacker's
// buffer can be reused as soon as a frame is taken out.
bool never_reference(msgpack::type::object_type, std::size_t, void*) { return false; }

msgpack::unpack_limit limits_for(size_t frame_bytes_max) {
    // Every array element and map key/value occupies at least one byte on the wire.
    return msgpack::unpack_limit(frame_bytes_max, frame_bytes_max / 2, frame_bytes_max,
                                 frame_bytes_max, frame_bytes_max, frame_depth_max);
}

}  // namespace

frame_decoder::frame_decoder(size_t frame_bytes_max)
    : _unpacker(&never_reference, nullptr, 64 * 1024, limits_for(frame_bytes_max)),
      _frame_bytes_max(frame_bytes_max) {}

void frame_decoder::feed(const char* data, size_t size) {
    if (_failed || size == 0) return;
    _unpacker.reserve_buffer(size);
    std::memcpy(_unpacker.buffer(), data, size);
    _unpacker.buffer_consumed(size);
    _fed_bytes += size;
}

result<std::optional<msgpack::object_handle>> frame_decoder::next() {
    if (_failed) return *_failed;
    msgpack::object_handle oh;
    bool complete = false;
    try {
        complete = _unpacker.next(oh);
    } catch (const msgpack::depth_size_overflow&) {
        _failed = make_error("bad_frame", "frame nests deeper than " +
                                              std::to_string(frame_depth_max) + " levels");
    } catch (const msgpack::size_overflow& e) {
        _failed = make_error("bad_frame", std::string("frame declares a size over the limit (") +
                                              e.what() + ")");
    } catch (const std::exception& e) {
        _failed = make_error("bad_frame", "malformed msgpack after byte " +
                                              std::to_string(_frame_start) + ": " + e.what());
    }
    if (_failed) return *_failed;

    uint64_t frame_end = _fed_bytes - _unpacker.nonparsed_size();
    if (complete) {
        uint64_t size = frame_end - _frame_start;
        _frame_start = frame_end;
        if (size > _frame_bytes_max) {
            _failed = make_error("bad_frame", "frame of " + std::to_string(size) +
                                                  " bytes exceeds max_frame_bytes " +
                                                  std::to_string(_frame_bytes_max));
            return *_failed;
        }
        _frames++;
        return std::optional<msgpack::object_handle>(std::move(oh));
    }
    if (_fed_bytes - _frame_start > _frame_bytes_max) {
        _failed = make_error("bad_frame", "frame exceeds max_frame_bytes " +
                                              std::to_string(_frame_bytes_max) +
                                              " before completing");
        return *_failed;
    }
    return std::optional<msgpack::object_handle>();
}

}  // namespace ordo::net
