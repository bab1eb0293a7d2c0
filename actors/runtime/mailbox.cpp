// mailbox.cpp: see mailbox.hpp.
#include "actors/runtime/mailbox.hpp"

#include <cassert>

namespace ordo::actors {

void mailbox::open(uv_async_t* wakeup) {
    std::lock_guard lock(_mutex);
    assert(wakeup != nullptr);
    _wakeup = wakeup;
    _closed = false;
}

tell_status mailbox::push(envelope&& e) {
    std::lock_guard lock(_mutex);
    if (_closed || _wakeup == nullptr) {
        return refusal{delivery_outcome::actor_stopped,
                       "receiver is not running; message " + std::string(e.type_name) + " refused"};
    }
    // A refusal armed by refuse_next() leaves through the same return as a full queue.
    // A compare-exchange, not fetch_sub: refuse_next() may store meanwhile (it does not take
    // the lock), and a decrement of a just-disarmed 0 would wrap.
    uint32_t left = _refuse_next.load(std::memory_order_relaxed);
    while (left != 0 &&
           !_refuse_next.compare_exchange_weak(left, left - 1, std::memory_order_relaxed)) {
    }
    const bool refused = left != 0;
    if (refused || _queue.size() >= _capacity) {
        _rejected_full++;
        return refusal{delivery_outcome::mailbox_full,
                       "receiver mailbox is full (" + std::to_string(_capacity) + " messages); " +
                           std::string(e.type_name) + " refused"};
    }
    _queue.push_back(std::move(e));
    // Under the lock so close() cannot release the handle between the push and the send.
    uv_async_send(_wakeup);
    return {};
}

void mailbox::wake() {
    std::lock_guard lock(_mutex);
    if (_wakeup != nullptr) uv_async_send(_wakeup);
}

size_t mailbox::drain(std::deque<envelope>& out) {
    std::lock_guard lock(_mutex);
    size_t n = _queue.size();
    if (out.empty()) {
        out.swap(_queue);
    } else {
        for (auto& e : _queue) out.push_back(std::move(e));
        _queue.clear();
    }
    return n;
}

void mailbox::close() {
    std::lock_guard lock(_mutex);
    _closed = true;
    _wakeup = nullptr;
}

size_t mailbox::size() const {
    std::lock_guard lock(_mutex);
    return _queue.size();
}

uint64_t mailbox::rejected_full() const {
    std::lock_guard lock(_mutex);
    return _rejected_full;
}

}  // namespace ordo::actors
