// frame_decoder.cpp: see frame_decoder.hpp.
#include "net/frame_decoder.hpp"

#include <algorithm>
#include <cassert>
#include <cstring>

namespace ordo::net {
namespace {

// ---- msgpack headers --------------------------------------------------------------------------
// The first byte of every msgpack value says how long its header is and where its size lives:
// in the byte itself (fixstr, fixarray, fixmap, fixext), in a 1/2/4-byte big-endian field after
// it (str/bin/ext/array/map 8/16/32), or nowhere because the value has a fixed size (ints,
// floats, nil, bool: their "header" is the whole value). ext8/16/32 and fixext carry one more
// header byte, the ext type. That is all the scanner needs to know about the format.

enum class value_kind : uint8_t {
    scalar,    // the header is the whole value
    payload,   // str, bin, ext: `length` bytes follow the header
    array,     // `length` elements follow
    map,       // `length` key/value pairs follow
    reserved,  // 0xc1: never valid
};

struct header_shape {
    const char* name;  // msgpack spec name, for error messages
    value_kind kind;
    uint8_t header_bytes;   // type byte + length field + ext type byte (scalars: whole value)
    uint8_t length_bytes;   // width of the big-endian length field after the type byte, or 0
    uint32_t fixed_length;  // the length when length_bytes is 0 (fixstr, fixarray, fixext, ...)
};

// 0xc0..0xdf, in order; the fix* ranges are decoded arithmetically in shape_of().
constexpr header_shape shapes_c0_df[32] = {
    {"nil", value_kind::scalar, 1, 0, 0},
    {"reserved byte 0xc1", value_kind::reserved, 1, 0, 0},
    {"false", value_kind::scalar, 1, 0, 0},
    {"true", value_kind::scalar, 1, 0, 0},
    {"bin8", value_kind::payload, 2, 1, 0},
    {"bin16", value_kind::payload, 3, 2, 0},
    {"bin32", value_kind::payload, 5, 4, 0},
    {"ext8", value_kind::payload, 3, 1, 0},
    {"ext16", value_kind::payload, 4, 2, 0},
    {"ext32", value_kind::payload, 6, 4, 0},
    {"float32", value_kind::scalar, 5, 0, 0},
    {"float64", value_kind::scalar, 9, 0, 0},
    {"uint8", value_kind::scalar, 2, 0, 0},
    {"uint16", value_kind::scalar, 3, 0, 0},
    {"uint32", value_kind::scalar, 5, 0, 0},
    {"uint64", value_kind::scalar, 9, 0, 0},
    {"int8", value_kind::scalar, 2, 0, 0},
    {"int16", value_kind::scalar, 3, 0, 0},
    {"int32", value_kind::scalar, 5, 0, 0},
    {"int64", value_kind::scalar, 9, 0, 0},
    {"fixext1", value_kind::payload, 2, 0, 1},
    {"fixext2", value_kind::payload, 2, 0, 2},
    {"fixext4", value_kind::payload, 2, 0, 4},
    {"fixext8", value_kind::payload, 2, 0, 8},
    {"fixext16", value_kind::payload, 2, 0, 16},
    {"str8", value_kind::payload, 2, 1, 0},
    {"str16", value_kind::payload, 3, 2, 0},
    {"str32", value_kind::payload, 5, 4, 0},
    {"array16", value_kind::array, 3, 2, 0},
    {"array32", value_kind::array, 5, 4, 0},
    {"map16", value_kind::map, 3, 2, 0},
    {"map32", value_kind::map, 5, 4, 0},
};

// The longest header: a type byte and an 8-byte value (uint64, int64, float64).
constexpr size_t header_bytes_max = 9;

header_shape shape_of(uint8_t b) {
    if (b <= 0x7f) return {"positive fixint", value_kind::scalar, 1, 0, 0};
    if (b <= 0x8f) return {"fixmap", value_kind::map, 1, 0, b & 0x0fu};
    if (b <= 0x9f) return {"fixarray", value_kind::array, 1, 0, b & 0x0fu};
    if (b <= 0xbf) return {"fixstr", value_kind::payload, 1, 0, b & 0x1fu};
    if (b >= 0xe0) return {"negative fixint", value_kind::scalar, 1, 0, 0};
    header_shape s = shapes_c0_df[b - 0xc0];
    assert(s.header_bytes >= 1 && s.header_bytes <= header_bytes_max);
    return s;
}

uint64_t read_big_endian(const uint8_t* p, size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

// Copy every str/bin/ext into the object's zone: frames then own their bytes and the decoder's
// buffer can drop them as soon as a frame is taken out.
bool never_reference(msgpack::type::object_type, std::size_t, void*) {
    return false;
}

msgpack::unpack_limit limits_for(size_t frame_bytes_max) {
    // Every array element and map key/value occupies at least one byte on the wire, so a frame
    // the scanner accepted stays under all of these.
    return msgpack::unpack_limit(frame_bytes_max, frame_bytes_max / 2, frame_bytes_max,
                                 frame_bytes_max, frame_bytes_max, frame_depth_max);
}

}  // namespace

frame_decoder::frame_decoder(size_t frame_bytes_max, size_t frame_values_max)
    : _frame_bytes_max(frame_bytes_max),
      _frame_values_max(frame_values_max),
      _unpack_limit(limits_for(frame_bytes_max)) {
    assert(frame_values_max >= 1);
}

void frame_decoder::feed(const char* data, size_t size) {
    if (_failed || size == 0) return;
    drop_consumed();
    _buffer.insert(_buffer.end(), data, data + size);
}

// Frames already taken out are dropped from the front of the buffer, but only once they are at
// least half of it, so each byte is moved O(1) times on average.
void frame_decoder::drop_consumed() {
    if (_frame_begin == 0 || _frame_begin < _buffer.size() - _frame_begin) return;
    _buffer.erase(_buffer.begin(), _buffer.begin() + static_cast<ptrdiff_t>(_frame_begin));
    _dropped_bytes += _frame_begin;
    _scan -= _frame_begin;
    _frame_begin = 0;
}

result<std::optional<msgpack::object_handle>> frame_decoder::next() {
    if (_failed) return *_failed;
    switch (scan()) {
        case scan_state::need_more:
            return std::optional<msgpack::object_handle>();
        case scan_state::frame_done:
            return take_frame();
        case scan_state::failed:
            break;
        case scan_state::advanced:
            assert(false && "scan() never stops on advanced");
            break;
    }
    assert(_failed);
    return *_failed;
}

frame_decoder::scan_state frame_decoder::scan() {
    while (true) {
        uint64_t skip = std::min<uint64_t>(_payload_left, _buffer.size() - _scan);
        _scan += skip;
        _payload_left -= skip;
        if (_payload_left > 0) return scan_state::need_more;
        if (_value_started && _depth == 0) return scan_state::frame_done;
        if (_scan == _buffer.size()) return scan_state::need_more;
        scan_state s = scan_header();
        if (s != scan_state::advanced) return s;
    }
}

frame_decoder::scan_state frame_decoder::scan_header() {
    assert(_scan < _buffer.size() && _payload_left == 0);
    // value_done() closes a container as soon as its last element ends, so the innermost open
    // one always has an element left for this header.
    assert(_depth == 0 || _elements_left[_depth - 1] > 0);
    const auto* at = reinterpret_cast<const uint8_t*>(_buffer.data()) + _scan;
    const size_t available = _buffer.size() - _scan;
    const header_shape shape = shape_of(at[0]);
    // Messages are built only on refusal: this runs once per msgpack value.
    auto where = [&] {
        return std::string(shape.name) + " at stream byte " + std::to_string(stream_offset(_scan));
    };
    const bool container = shape.kind == value_kind::array || shape.kind == value_kind::map;
    if (shape.kind == value_kind::reserved) return refuse("malformed msgpack: " + where());
    if (container && _depth == frame_depth_max) {
        return refuse("frame nests deeper than " + std::to_string(frame_depth_max) +
                      " levels: " + where());
    }

    // The smallest frame this value allows: what is already in, this header, and one byte for
    // every element of the open containers that has not started yet (this value is one of them).
    const uint64_t elements_after = _elements_pending - (_depth > 0 ? 1 : 0);
    const uint64_t frame_pos = _scan - _frame_begin;
    const uint64_t max = _frame_bytes_max;
    auto too_big = [&](uint64_t needed, const std::string& what) {
        return refuse("frame exceeds max_frame_bytes " + std::to_string(max) + ": " + what +
                      " needs it to be at least " + std::to_string(needed) + " bytes");
    };
    if (frame_pos + shape.header_bytes + elements_after > max) {
        return too_big(frame_pos + shape.header_bytes + elements_after, where());
    }
    if (available < shape.header_bytes) return scan_state::need_more;

    uint64_t length = shape.fixed_length;
    if (shape.length_bytes > 0) length = read_big_endian(at + 1, shape.length_bytes);
    uint64_t declared = 0;  // payload bytes, or elements (a map's keys and values both count)
    const char* unit = "";
    switch (shape.kind) {
        case value_kind::payload:
            declared = length, unit = " bytes";
            break;
        case value_kind::array:
            declared = length, unit = " elements";
            break;
        case value_kind::map:
            declared = 2 * length, unit = " keys and values";
            break;
        case value_kind::scalar:
        case value_kind::reserved:
            break;
    }
    const uint64_t needed = frame_pos + shape.header_bytes + declared + elements_after;
    if (needed > max) {
        return too_big(needed, where() + " declaring " + std::to_string(declared) + unit);
    }
    // Values, counted the same way: those accepted, this one, the elements it declares and
    // those still to come (each of them is at least one value).
    const uint64_t values = _values + 1 + (container ? declared : 0) + elements_after;
    if (values > _frame_values_max) {
        return refuse("frame exceeds max_frame_values " + std::to_string(_frame_values_max) + ": " +
                      where() + " needs it to hold at least " + std::to_string(values) +
                      " msgpack values");
    }

    // Accept the header: it starts one element of the innermost open container.
    if (_depth > 0) {
        _elements_left[_depth - 1]--;
        _elements_pending--;
    }
    _value_started = true;
    _values++;
    _scan += shape.header_bytes;
    if (container && declared > 0) {
        _elements_left[_depth++] = declared;
        _elements_pending += declared;
        return scan_state::advanced;
    }
    // A scalar, a str/bin/ext (its payload is skipped by scan()) or an empty container.
    if (shape.kind == value_kind::payload) _payload_left = declared;
    value_done();
    return scan_state::advanced;
}

void frame_decoder::value_done() {
    while (_depth > 0 && _elements_left[_depth - 1] == 0) _depth--;
}

frame_decoder::scan_state frame_decoder::refuse(std::string message) {
    _failed = make_error("bad_frame", std::move(message));
    std::vector<char>().swap(_buffer);  // a dead decoder holds no bytes
    _frame_begin = _scan = 0;
    return scan_state::failed;
}

result<std::optional<msgpack::object_handle>> frame_decoder::take_frame() {
    const size_t size = _scan - _frame_begin;
    assert(size >= 1 && size <= _frame_bytes_max && _depth == 0 && _elements_pending == 0);
    const uint64_t frame_at = stream_offset(_frame_begin);
    msgpack::object_handle oh;
    size_t unpacked = 0;
    std::string why;
    try {
        oh = msgpack::unpack(_buffer.data() + _frame_begin, size, unpacked, &never_reference,
                             nullptr, _unpack_limit);
    } catch (const std::exception& e) {
        why = e.what();
    }
    _frame_begin = _scan;
    _value_started = false;
    _values = 0;
    // The scanner accepted exactly these bytes as one value within every limit, so msgpack-c
    // must agree (the fuzzer checks it, built with assertions on). Should it ever not, the
    // stream is refused rather than guessed at.
    const bool agreed = why.empty() && oh.zone() && unpacked == size;
    assert(agreed && "msgpack::unpack disagrees with the frame scanner");
    if (!agreed) {
        refuse("msgpack could not unpack the " + std::to_string(size) +
               "-byte frame at stream byte " + std::to_string(frame_at) + " (" +
               (why.empty() ? "length mismatch" : why) + ")");
        return *_failed;
    }
    _frames++;
    return std::optional<msgpack::object_handle>(std::move(oh));
}

}  // namespace ordo::net
