// job_thread.cpp: see job_thread.hpp.
#include "actors/runtime/job_thread.hpp"

#include <cassert>
#include <string>
#include <system_error>
#include <utility>

#include "actors/runtime/actor.hpp"

namespace ordo::actors {

job_thread::~job_thread() {
    end_thread();
}

status job_thread::start(uv_loop_t* loop, std::string name) {
    if (_started) return make_error("job_thread_open", "job_thread::start: already started");
    _name = std::move(name);
    _busy = false;
    _quit = false;
    _run = nullptr;
    int rc = uv_async_init(loop, &_completed, &job_thread::completed_cb);
    if (rc != 0) {
        return make_error("uv_error",
                          std::string("job_thread::start: uv_async_init: ") + uv_strerror(rc));
    }
    _completed.data = this;
    try {
        _thread = std::thread([this] { thread_main(); });
    } catch (const std::system_error& e) {
        uv_close(reinterpret_cast<uv_handle_t*>(&_completed), nullptr);
        return make_error("thread_start", std::string("job_thread::start: ") + e.what());
    }
    _started = true;
    return {};
}

void job_thread::post(std::function<void()> run, std::function<void()> done) {
    assert(_started && !_busy && "one job at a time");
    _busy = true;
    _done = std::move(done);
    {
        std::lock_guard lock(_mutex);
        _run = std::move(run);
    }
    _wake.notify_one();
}

void job_thread::stop() {
    if (!_started) return;
    assert(!_busy && "stop() only once no job runs");
    end_thread();
    uv_close(reinterpret_cast<uv_handle_t*>(&_completed), nullptr);
    _started = false;
}

void job_thread::end_thread() {
    if (!_thread.joinable()) return;
    {
        std::lock_guard lock(_mutex);
        _quit = true;
    }
    _wake.notify_one();
    _thread.join();
}

void job_thread::thread_main() {
    name_this_thread(_name);
    std::unique_lock lock(_mutex);
    for (;;) {
        _wake.wait(lock, [this] { return _quit || _run; });
        if (!_run) return;  // quit, and no job left
        std::function<void()> run = std::move(_run);
        _run = nullptr;
        lock.unlock();
        run();
        run = nullptr;
        lock.lock();
        // After the job's writes (the mutex orders them before the loop's read in the
        // completion, which locks it too).
        uv_async_send(&_completed);
    }
}

void job_thread::completed_cb(uv_async_t* a) {
    auto* self = static_cast<job_thread*>(a->data);
    {
        // Pairs with the worker's unlock after the job: its writes happen before this.
        std::lock_guard lock(self->_mutex);
    }
    if (!self->_busy) return;  // a coalesced wakeup for a job already completed
    self->_busy = false;
    std::function<void()> done = std::move(self->_done);
    self->_done = nullptr;
    if (done) done();
}

}  // namespace ordo::actors
