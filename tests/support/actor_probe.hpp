// actor_probe.hpp: test support for actor-level tests (the C++ Actor Framework's deterministic
// fixture, done with ordo's own runtime).
//
// `probe<Msgs...>` is a real actor that accepts `Msgs` and hands each one, in arrival order, to
// the test thread (`next<T>(timeout)`), so an actor under test can be wired to probes instead
// of its real peers. `trace_script` walks a memory_trace_sink's records in delivery order:
// `expect<T>(from, to)` finds the next delivery of a T from `from` to `to` after the previous
// match and decodes it, so a test asserts a message sequence — "generate, then step, then
// cancel, then step_done, then generate_done{cancelled}" — the way the messages really flowed.
// Every wait is bounded.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "actors/runtime/actor.hpp"
#include "actors/runtime/trace.hpp"

namespace ordo::test {

inline constexpr std::chrono::milliseconds probe_wait{20000};

template <actors::message_type... Msgs>
class probe final : public actors::actor<probe<Msgs...>, Msgs...> {
public:
    using any = std::variant<Msgs...>;

    explicit probe(std::string name, size_t mailbox_capacity = 4096)
        : actors::actor<probe<Msgs...>, Msgs...>(std::move(name), mailbox_capacity) {}

    template <typename T>
    void on(const T& m) {
        std::lock_guard lock(_mutex);
        _inbox.push_back(any(m));
        _cv.notify_all();
    }

    // The next message, whatever its type; nullopt after `timeout`.
    std::optional<any> next_any(std::chrono::milliseconds timeout = probe_wait) {
        std::unique_lock lock(_mutex);
        if (!_cv.wait_for(lock, timeout, [&] { return !_inbox.empty(); })) return std::nullopt;
        any m = std::move(_inbox.front());
        _inbox.pop_front();
        return m;
    }

    // The next message if it is a T (anything else first is skipped when `skip_others`, else
    // it is a failure reported as nullopt).
    template <typename T>
    std::optional<T> next(std::chrono::milliseconds timeout = probe_wait, bool skip_others = true) {
        auto end = std::chrono::steady_clock::now() + timeout;
        while (true) {
            auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                end - std::chrono::steady_clock::now());
            if (left.count() <= 0) return std::nullopt;
            auto m = next_any(left);
            if (!m) return std::nullopt;
            if (auto* t = std::get_if<T>(&*m)) return std::move(*t);
            if (!skip_others) return std::nullopt;
        }
    }

    // Nothing arrives within `quiet` (the test's way to say "and nothing else").
    bool stays_empty(std::chrono::milliseconds quiet) {
        std::unique_lock lock(_mutex);
        return !_cv.wait_for(lock, quiet, [&] { return !_inbox.empty(); });
    }

private:
    std::mutex _mutex;
    std::condition_variable _cv;
    std::deque<any> _inbox;
};

class trace_script {
public:
    explicit trace_script(std::vector<actors::trace_record> records)
        : _records(std::move(records)) {}

    // The next delivery of a T from `from` to `to` after the last match; nullopt (and a test
    // failure naming what was missing) when there is none.
    template <typename T>
    std::optional<T> expect(const std::string& from, const std::string& to) {
        for (size_t i = _cursor; i < _records.size(); i++) {
            const auto& r = _records[i];
            if (r.type != T::msg_name || r.sender != from || r.receiver != to) continue;
            _cursor = i + 1;
            T m;
            msgpack::unpack(r.bytes.data(), r.bytes.size()).get().convert(m);
            return m;
        }
        ADD_FAILURE() << "no " << T::msg_name << " from " << from << " to " << to
                      << " after delivery #" << _cursor << "\n"
                      << dump();
        return std::nullopt;
    }

    std::string dump() const {
        std::string s;
        for (const auto& r : _records) {
            s += "  " + std::to_string(r.seq) + " " + r.sender + " -> " + r.receiver + ": " +
                 r.type + "\n";
        }
        return s;
    }

private:
    std::vector<actors::trace_record> _records;
    size_t _cursor = 0;
};

// probe_for<type_list<Msgs...>>: probe<Msgs...>, for a list written once (door/door_msgs.hpp).
struct probe_fn {
    template <actors::message_type... Msgs>
    using fn = probe<Msgs...>;
};
template <typename List>
using probe_for = actors::list_apply_t<probe_fn, List>;

}  // namespace ordo::test
