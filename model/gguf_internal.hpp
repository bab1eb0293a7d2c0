// gguf_internal.hpp: the bounds-checked byte reader shared by the GGUF parser (gguf.cpp) and
// nothing else outside model/. Not part of the public API.
//
// byte_cursor never reads past `size`: a read that does not fit records a gguf_truncated error
// (the first one wins, later reads return zero values and do not advance), so the parser can
// read a whole record and check `ok()` once. Values are little-endian on disk; ordo only
// targets little-endian hosts (asserted below).
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "actors/runtime/result.hpp"

namespace ordo::model {

static_assert(std::endian::native == std::endian::little, "GGUF reader assumes little-endian");

class byte_cursor {
public:
    byte_cursor(const uint8_t* base, uint64_t size) : _base(base), _size(size) {}

    bool ok() const { return _ok; }
    const error& err() const { return _err; }
    uint64_t pos() const { return _pos; }
    uint64_t remaining() const { return _size - _pos; }
    // Names the record being read, for error messages ("tensor 'blk.0.attn_q.weight'").
    void set_context(std::string ctx) { _ctx = std::move(ctx); }

    // "<context>: <text> (at offset N)"
    std::string where(const std::string& text) const {
        std::string out = _ctx.empty() ? text : _ctx + ": " + text;
        return out + " (at offset " + std::to_string(_pos) + ")";
    }

    template <typename T>
    T read(std::string_view what) {
        T v{};
        if (!take(sizeof(T), what)) return v;
        std::memcpy(&v, _base + _pos - sizeof(T), sizeof(T));
        return v;
    }

    // A u64 length then that many bytes; a length past the end is gguf_truncated before any
    // allocation happens.
    std::string read_string(std::string_view what) {
        uint64_t len = read<uint64_t>(what);
        if (!_ok) return {};
        if (len > remaining()) {
            fail(std::string(what) + " length " + std::to_string(len) + " runs past the end (" +
                 std::to_string(remaining()) + " bytes left)");
            return {};
        }
        std::string s(reinterpret_cast<const char*>(_base + _pos), static_cast<size_t>(len));
        _pos += len;
        return s;
    }

private:
    bool take(uint64_t n, std::string_view what) {
        if (!_ok) return false;
        if (n > remaining()) {
            fail("reading " + std::string(what) + " needs " + std::to_string(n) + " bytes, only " +
                 std::to_string(remaining()) + " left");
            return false;
        }
        _pos += n;
        return true;
    }

    void fail(const std::string& text) {
        _ok = false;
        _err = make_error("gguf_truncated", where(text) + ", file size " + std::to_string(_size));
    }

    const uint8_t* _base;
    uint64_t _size;
    uint64_t _pos = 0;
    bool _ok = true;
    error _err;
    std::string _ctx;
};

}  // namespace ordo::model
