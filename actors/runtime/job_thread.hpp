// job_thread.hpp: an actor's own worker thread for its long jobs (the gpu actor's steps, KV
// copies and device builds), one job at a time, with each job's completion handed back to the
// actor's loop.
//
// Why not libuv's thread pool (uv_queue_work): that pool is one per process (4 threads unless
// UV_THREADPOOL_SIZE says otherwise) and first come, first served. The kv actor's file jobs run
// there too (saves_pending_max = 4 writes, restores, unlinks), so four saves stuck on a slow or
// hung disk (a shared filesystem) held every pool thread, and the gpu actor's next step waited
// behind them: decode stopped for every stream, and after the scheduler's step backstop the
// steps failed as if the device had. A job_thread shares its thread with nothing, so disk work
// can only ever delay disk work.
//
// Loop thread: start() (e.g. in on_start), post(), stop() (once no job runs: in on_stop, or in
// the completion of the job that was running then). The completion runs on the loop thread,
// after the job's writes are visible to it (the mutex orders them).
#pragma once

#include <uv.h>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "actors/runtime/result.hpp"

namespace ordo::actors {

class job_thread {
public:
    job_thread() = default;
    job_thread(const job_thread&) = delete;
    job_thread& operator=(const job_thread&) = delete;
    ~job_thread();  // a thread still running is stopped and joined (after its job)

    // Starts the thread (named "ordo-<name>") and binds completions to `loop`; an error if the
    // loop's handle or the thread cannot be made.
    status start(uv_loop_t* loop, std::string name);

    // Runs `run` on the thread, then `done` on the loop thread. One job at a time: the caller
    // posts the next one only after the previous one's `done` (asserted).
    void post(std::function<void()> run, std::function<void()> done);

    // Whether a posted job's `done` has not run yet.
    bool busy() const { return _busy; }

    // Ends the thread (waiting for nothing: no job may be running) and closes the loop handle.
    void stop();

private:
    static void completed_cb(uv_async_t* a);
    void thread_main();
    void end_thread();  // quit (after the job it runs, if any) and join; nothing if none runs

    std::string _name;
    std::thread _thread;
    uv_async_t _completed{};
    bool _started = false;
    bool _busy = false;           // loop thread
    std::function<void()> _done;  // loop thread

    std::mutex _mutex;
    std::condition_variable _wake;
    std::function<void()> _run;  // guarded: the job to run, empty when none
    bool _quit = false;          // guarded
};

}  // namespace ordo::actors
