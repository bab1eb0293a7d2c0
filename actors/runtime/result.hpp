// result.hpp: the small success-or-error type used everywhere inside ordo.
//
// ordo does not let exceptions cross module or actor boundaries: a function that can fail
// returns result<T>, and a failure that must travel between actors becomes a message carrying
// the same {code, message} pair. `code` is a stable snake_case identifier (it reaches clients
// as the protocol's error code); `message` is human text naming what went wrong. A failure
// from a closed set the caller decides on carries its own type instead (result<T, E>: the
// runtime's refusal, delivery_outcome.hpp), so the decision compares an enum, not a string.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace ordo {

struct error {
    std::string code;     // snake_case, stable, machine-readable ("bad_frame", "gguf_truncated")
    std::string message;  // human text: what, where, why
};

inline error make_error(std::string code, std::string message) {
    return error{std::move(code), std::move(message)};
}

template <typename T, typename E = error>
class [[nodiscard]] result {
public:
    result(T value) : _v(std::in_place_index<0>, std::move(value)) {}
    result(E e) : _v(std::in_place_index<1>, std::move(e)) {}

    bool ok() const { return _v.index() == 0; }
    explicit operator bool() const { return ok(); }

    T& value() & {
        assert(ok());
        return std::get<0>(_v);
    }
    const T& value() const& {
        assert(ok());
        return std::get<0>(_v);
    }
    T&& value() && {
        assert(ok());
        return std::get<0>(std::move(_v));
    }
    T* operator->() { return &value(); }
    const T* operator->() const { return &value(); }
    T& operator*() & { return value(); }
    const T& operator*() const& { return value(); }

    const E& err() const {
        assert(!ok());
        return std::get<1>(_v);
    }

private:
    std::variant<T, E> _v;
};

template <typename E>
class [[nodiscard]] result<void, E> {
public:
    result() = default;
    result(E e) : _err(std::move(e)), _ok(false) {}

    bool ok() const { return _ok; }
    explicit operator bool() const { return ok(); }
    const E& err() const {
        assert(!ok());
        return _err;
    }

private:
    E _err{};
    bool _ok = true;
};

using status = result<void>;

}  // namespace ordo

// Returns the status of `expr` from the enclosing function (returning status or result<T>) when
// it failed; a sequence of encoders reads as the list of steps it is.
#define ORDO_TRY(expr)                              \
    do {                                            \
        ::ordo::status ordo_try_s_ = (expr);        \
        if (!ordo_try_s_) return ordo_try_s_.err(); \
    } while (0)
