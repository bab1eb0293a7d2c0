// test_job_thread.cpp: actors::job_thread, an actor's own worker thread, on a real libuv loop.
//
// Checks: (1) a chain of jobs, each posted from the previous one's completion, all run on one
// thread that is not the loop's, named "ordo-<name>", and each completion runs on the loop
// thread and sees what its job wrote (plain, unsynchronized fields); (2) stop() ends the thread
// and closes the loop's handle (uv_loop_close == 0), and the same object starts again after;
// (3) start/stop with no job at all closes cleanly; (4) a second start() is refused.
#include <gtest/gtest.h>
#include <pthread.h>
#include <uv.h>

#include <string>
#include <thread>

#include "actors/runtime/job_thread.hpp"

namespace {

using ordo::actors::job_thread;

struct chain {
    job_thread* worker = nullptr;
    std::thread::id loop_thread, job_thread_id;
    int posted = 0, completed = 0, limit = 0;
    std::uint64_t written = 0;  // by the job, read by its completion: no atomics
    bool same_thread = true, completion_on_loop = true, completion_saw_write = true;
    std::string name;

    void post_next() {
        const int n = ++posted;
        worker->post(
            [this, n] {
                if (job_thread_id == std::thread::id{}) {
                    job_thread_id = std::this_thread::get_id();
                    char buf[16] = {};
                    pthread_getname_np(pthread_self(), buf, sizeof buf);
                    name = buf;
                }
                same_thread = same_thread && job_thread_id == std::this_thread::get_id();
                written = std::uint64_t(n) * 1000003u;
            },
            [this, n] {
                completed++;
                completion_on_loop =
                    completion_on_loop && std::this_thread::get_id() == loop_thread;
                completion_saw_write =
                    completion_saw_write && written == std::uint64_t(n) * 1000003u;
                if (posted < limit) {
                    post_next();
                } else {
                    worker->stop();  // no job runs now: the handle closes, the loop runs dry
                }
            });
    }
};

TEST(JobThread, ChainedJobsRunOffTheLoopAndCompleteOnIt) {
    uv_loop_t loop;
    ASSERT_EQ(uv_loop_init(&loop), 0);
    job_thread worker;
    for (int round = 0; round < 2; ++round) {  // the same object starts again after stop()
        SCOPED_TRACE(round);
        ASSERT_TRUE(worker.start(&loop, "gpu-job").ok());
        EXPECT_FALSE(worker.start(&loop, "gpu-job").ok());
        chain c;
        c.worker = &worker;
        c.loop_thread = std::this_thread::get_id();
        c.limit = 200;
        c.post_next();
        EXPECT_TRUE(worker.busy());
        uv_run(&loop, UV_RUN_DEFAULT);  // returns once stop() closed the handle
        EXPECT_FALSE(worker.busy());
        EXPECT_EQ(c.completed, 200);
        EXPECT_NE(c.job_thread_id, c.loop_thread);
        EXPECT_TRUE(c.same_thread);
        EXPECT_TRUE(c.completion_on_loop);
        EXPECT_TRUE(c.completion_saw_write);
        EXPECT_EQ(c.name, "ordo-gpu-job");
    }
    EXPECT_EQ(uv_loop_close(&loop), 0);
}

TEST(JobThread, StartThenStopWithoutJobsClosesCleanly) {
    uv_loop_t loop;
    ASSERT_EQ(uv_loop_init(&loop), 0);
    job_thread worker;
    ASSERT_TRUE(worker.start(&loop, "idle").ok());
    worker.stop();
    worker.stop();  // a second stop does nothing
    uv_run(&loop, UV_RUN_DEFAULT);
    EXPECT_EQ(uv_loop_close(&loop), 0);
}

}  // namespace
