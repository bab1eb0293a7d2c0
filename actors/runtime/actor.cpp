// actor.cpp: actor_core, the thread/loop/mailbox/stop half of every actor (see actor.hpp).
#include "actors/runtime/actor.hpp"

#include <pthread.h>

#include <cassert>
#include <cstdlib>
#include <exception>
#include <future>

#include "actors/runtime/log.hpp"

namespace ordo::actors {

void name_this_thread(std::string_view what) {
    std::string name = ("ordo-" + std::string(what)).substr(0, 15);
    pthread_setname_np(pthread_self(), name.c_str());  // a refused name changes nothing
}

actor_core::actor_core(std::string name, size_t mailbox_capacity)
    : _name(std::move(name)), _mailbox(mailbox_capacity), _log(ordo::logger(_name)) {
    assert(mailbox_capacity > 0);
}

actor_core::~actor_core() {
    // Destroying a running actor would free state its thread still uses.
    assert(!_thread.joinable() && "actor destroyed without stop+join");
}

status actor_core::start() {
    if (_thread.joinable()) return make_error("actor_running", _name + " is already started");
    _stop_requested = false;
    _stopping = false;
    std::promise<void> started;
    auto started_future = started.get_future();
    _thread = std::thread([this, &started] {
        name_this_thread(_name);
        // Both can only fail on resource exhaustion at thread start; nothing can run without them.
        if (uv_loop_init(&_loop) != 0 ||
            uv_async_init(&_loop, &_wakeup, &actor_core::wakeup_cb) != 0) {
            std::abort();
        }
        _wakeup.data = this;
        _mailbox.open(&_wakeup);
        _running = true;
        on_start();
        started.set_value();
        thread_main();
    });
    started_future.wait();
    return {};
}

void actor_core::must(const status& st, std::string_view what) {
    if (st.ok()) return;
    _log->critical("{}: {}: {}", what, st.err().code, st.err().message);
    std::abort();
}

void actor_core::request_stop() {
    if (_stop_requested.exchange(true)) return;
    // The wakeup handle lives until the loop has seen the request; the mailbox mutex orders
    // this against close(). A stopped or never-started actor has nothing to wake.
    _mailbox.wake();
}

status actor_core::join() {
    if (!_thread.joinable()) return {};
    _thread.join();
    if (_loop_close_rc != 0) {
        return make_error("loop_leak", _name + ": uv_loop_close returned " +
                                           std::string(uv_strerror(_loop_close_rc)) +
                                           " (a handle was left open)");
    }
    return {};
}

void actor_core::wakeup_cb(uv_async_t* handle) {
    auto* self = static_cast<actor_core*>(handle->data);
    self->deliver_queued();
    if (self->_stop_requested && !self->_stopping) self->begin_stop();
}

void actor_core::deliver_queued() {
    _mailbox.drain(_inbox);
    while (!_inbox.empty()) {
        envelope e = std::move(_inbox.front());
        _inbox.pop_front();
        if (trace_sink* sink = _trace.load()) {
            sink->record(trace_record{next_trace_seq(), e.sender, _name, e.type_name, e.bytes});
        }
        // The typed half catches decoding and handler failures itself (actor::handle); this is
        // the last guard, for a throw that escapes it, so the actor is never taken down.
        try {
            deliver(e);
        } catch (const std::exception& ex) {
            _handler_errors++;
            _log->error("handler for {} from {} threw: {}", e.type_name, e.sender, ex.what());
        }
    }
}

void actor_core::report_failure(const envelope& e, const ordo::error& why) {
    _handler_errors++;
    _log->error("{} from {} failed ({}): {}", e.type_name, e.sender, why.code, why.message);
}

void actor_core::begin_stop() {
    _stopping = true;
    // Closing first draws one line under the mailbox: a push that lands before it is delivered
    // below, a push after it is refused to its sender with actor_stopped. Either way the
    // sender learns the outcome; nothing is queued that no handler will ever see.
    _mailbox.close();
    deliver_queued();
    // Last: on_stop() sees every message the actor accepted, and no handler runs after it.
    on_stop();
    uv_close(reinterpret_cast<uv_handle_t*>(&_wakeup), nullptr);
}

void actor_core::thread_main() {
    uv_run(&_loop, UV_RUN_DEFAULT);
    _running = false;
    _loop_close_rc = uv_loop_close(&_loop);
    if (_loop_close_rc != 0) {
        uv_walk(
            &_loop,
            [](uv_handle_t* h, void* arg) {
                static_cast<spdlog::logger*>(arg)->error("leaked handle type {}",
                                                         uv_handle_type_name(h->type));
            },
            _log.get());
        // Run the loop until the leaked handles are closed so the thread can exit cleanly.
        uv_walk(
            &_loop,
            [](uv_handle_t* h, void*) {
                if (!uv_is_closing(h)) uv_close(h, nullptr);
            },
            nullptr);
        uv_run(&_loop, UV_RUN_DEFAULT);
        uv_loop_close(&_loop);
    }
}

}  // namespace ordo::actors
