// log.cpp: see log.hpp.
#include "actors/runtime/log.hpp"

#include <spdlog/async.h>
#include <spdlog/async_logger.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

namespace ordo {
namespace {

// The flush barrier: a sink that only counts the lines it is given. flush_logging() logs one
// line to it through the writer's queue; the writer takes lines in order, so once the count
// reaches that line, everything logged before it has been handed to the real sinks.
class barrier_sink final : public spdlog::sinks::base_sink<std::mutex> {
public:
    bool wait_for(std::uint64_t n, std::chrono::milliseconds timeout) {
        std::unique_lock lock(_count_mutex);
        return _cv.wait_for(lock, timeout, [&] { return _count >= n; });
    }

protected:
    void sink_it_(const spdlog::details::log_msg&) override {
        {
            std::lock_guard lock(_count_mutex);
            _count++;
        }
        _cv.notify_all();
    }
    void flush_() override {}

private:
    std::mutex _count_mutex;
    std::condition_variable _cv;
    std::uint64_t _count = 0;
};

struct log_state {
    std::mutex mutex;
    std::vector<spdlog::sink_ptr> sinks;
    spdlog::level::level_enum level = spdlog::level::info;
    std::shared_ptr<spdlog::details::thread_pool> pool;  // null before first use, after shutdown
    bool stopped = false;                                // shutdown_logging ran
    std::shared_ptr<barrier_sink> barrier_out;
    std::shared_ptr<spdlog::async_logger> barrier;  // not registered: apply_all never sees it
    std::uint64_t barriers_sent = 0;
    std::uint64_t dropped_before_shutdown = 0;
};

log_state& state() {
    static log_state s;
    return s;
}

void ensure_sinks_locked(log_state& s) {
    if (s.sinks.empty()) s.sinks.push_back(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
}

std::shared_ptr<spdlog::async_logger> make_async_locked(log_state& s, const std::string& name) {
    auto l = std::make_shared<spdlog::async_logger>(name, s.sinks.begin(), s.sinks.end(), s.pool,
                                                    spdlog::async_overflow_policy::overrun_oldest);
    l->set_level(s.level);
    l->flush_on(spdlog::level::warn);
    return l;
}

void ensure_pool_locked(log_state& s, std::size_t queue_lines) {
    if (s.pool || s.stopped) return;
    ensure_sinks_locked(s);
    // One writer thread: lines from every actor are written in the order they were queued.
    s.pool = std::make_shared<spdlog::details::thread_pool>(queue_lines, 1);
    s.barrier_out = std::make_shared<barrier_sink>();
    s.barrier = std::make_shared<spdlog::async_logger>(
        "log-barrier", s.barrier_out, s.pool, spdlog::async_overflow_policy::overrun_oldest);
    s.barrier->set_level(spdlog::level::trace);
    // spdlog::warn(...) and friends go through the default logger, a synchronous stdout one out
    // of the box. Its sink shares spdlog's console mutex with ours, which the writer holds while
    // it is blocked on a stalled reader: every caller of the default logger would block too.
    // So the default logger queues like every other.
    spdlog::set_default_logger(make_async_locked(s, "ordo"));
}

}  // namespace

status init_logging(const std::string& level, const std::string& file, std::size_t queue_lines) {
    auto lvl = spdlog::level::from_str(level);
    if (lvl == spdlog::level::off && level != "off") {
        return make_error("config_invalid", "log.level: unknown level '" + level + "'");
    }
    if (queue_lines < log_queue_lines_min || queue_lines > log_queue_lines_max) {
        return make_error("config_invalid", "log.queue_lines: " + std::to_string(queue_lines) +
                                                " is outside " +
                                                std::to_string(log_queue_lines_min) + ".." +
                                                std::to_string(log_queue_lines_max));
    }
    auto& s = state();
    std::lock_guard lock(s.mutex);
    ensure_pool_locked(s, queue_lines);
    s.sinks.clear();
    s.sinks.push_back(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    if (!file.empty()) {
        try {
            s.sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(file));
        } catch (const spdlog::spdlog_ex& e) {
            return make_error("log_file", "cannot open log file '" + file + "': " + e.what());
        }
    }
    s.level = lvl;
    // Re-point every logger created so far at the new sinks and level.
    spdlog::apply_all([&](const std::shared_ptr<spdlog::logger>& l) {
        l->sinks() = s.sinks;
        l->set_level(lvl);
    });
    return {};
}

std::shared_ptr<spdlog::logger> logger(const std::string& name) {
    auto& s = state();
    std::lock_guard lock(s.mutex);
    if (auto existing = spdlog::get(name)) return existing;
    ensure_pool_locked(s, log_queue_lines_default);
    std::shared_ptr<spdlog::logger> l;
    if (s.pool) {
        l = make_async_locked(s, name);
    } else {
        // After shutdown_logging: the writer is gone (or stuck); lines go nowhere rather than
        // risk blocking on the console.
        l = std::make_shared<spdlog::logger>(name, std::make_shared<spdlog::sinks::null_sink_mt>());
    }
    spdlog::register_logger(l);
    return l;
}

std::uint64_t log_lines_dropped() {
    auto& s = state();
    std::lock_guard lock(s.mutex);
    return s.dropped_before_shutdown + (s.pool ? s.pool->overrun_counter() : 0);
}

bool flush_logging(std::uint64_t timeout_ms) {
    auto& s = state();
    std::shared_ptr<barrier_sink> out;
    std::uint64_t target = 0;
    {
        std::lock_guard lock(s.mutex);
        if (!s.pool) return true;  // synchronous loggers: nothing waits in a queue
        // A flush request per logger (each flushes the shared sinks), then the barrier line.
        spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { l->flush(); });
        target = ++s.barriers_sent;
        out = s.barrier_out;
        s.barrier->info("flush");
    }
    // A barrier line dropped by a full queue is never counted: then this waits out its bound.
    return out->wait_for(target, std::chrono::milliseconds(timeout_ms));
}

bool shutdown_logging(std::uint64_t timeout_ms) {
    bool flushed = flush_logging(timeout_ms);
    auto& s = state();
    std::shared_ptr<spdlog::details::thread_pool> pool;
    {
        std::lock_guard lock(s.mutex);
        if (!s.pool) return flushed;
        s.dropped_before_shutdown += s.pool->overrun_counter();
        spdlog::drop_all();
        // spdlog::warn(...) after this must not find a null default logger.
        spdlog::set_default_logger(std::make_shared<spdlog::logger>(
            "ordo", std::make_shared<spdlog::sinks::null_sink_mt>()));
        s.barrier.reset();
        s.stopped = true;
        pool = std::move(s.pool);
    }
    if (flushed) {
        pool.reset();  // the writer is idle: its destructor's join returns at once
    } else {
        // The writer is blocked on a reader that stopped reading; ~thread_pool would join it
        // forever. Keep the pool alive for good: the process's exit ends the thread.
        new std::shared_ptr<spdlog::details::thread_pool>(std::move(pool));
    }
    return flushed;
}

}  // namespace ordo
