// log.hpp: one named spdlog logger per actor, all writing to the same sinks through one
// background writer, so that no actor ever waits on a log reader.
//
// init_logging() is called once by the bootstrap (level, optional file and queue size from
// [log]); logger("net") returns the shared logger for that name, creating it on first use with
// the process-wide sinks and level. Safe to call from any thread.
//
// ---- Why asynchronous, and what is lost -------------------------------------------------------
// stderr is often a pipe (systemd, Docker, a supervising script). When its reader stops reading,
// the pipe fills and write(2) blocks: with synchronous sinks the actor that logged, the
// scheduler in the soak that found this, stopped with it. Here every logger is spdlog's
// async_logger over one thread pool with ONE writer thread (one thread keeps the lines of all
// actors in the order they were logged): a log call only copies the line into a bounded queue
// (queue_lines) and returns. When the queue is full the OLDEST line is dropped
// (async_overflow_policy::overrun_oldest) and counted: log_lines_dropped() feeds the stats op
// and /metrics. Only the writer thread ever blocks on the reader.
//
// Flushes: after every line at warn or above (the writer flushes the sinks), on
// flush_logging(), and at shutdown_logging(). Each of those waits at most its timeout: a writer
// stuck behind a reader that never reads again is left to the process's exit, not joined.
#pragma once

#include <spdlog/spdlog.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "actors/runtime/result.hpp"

namespace ordo {

// [log] queue_lines: lines waiting for the writer at most. 8192 lines of ~150 B is ~1 MiB; a
// burst of that many lines is seconds of debug logging, which a live reader drains in well
// under a second.
inline constexpr std::size_t log_queue_lines_default = 8192;
inline constexpr std::size_t log_queue_lines_min = 16;
inline constexpr std::size_t log_queue_lines_max = std::size_t{1} << 20;
// How long shutdown waits for the writer to write what is queued: a reader that is alive takes
// milliseconds; one that has stopped reading would be waited on forever.
inline constexpr std::uint64_t log_flush_ms_max = 2000;

// level: trace|debug|info|warn|error|critical|off. file: empty = stderr only. queue_lines takes
// effect at the first call in a process (the writer's queue is made once); later calls change
// level and sinks only.
status init_logging(const std::string& level, const std::string& file,
                    std::size_t queue_lines = log_queue_lines_default);
std::shared_ptr<spdlog::logger> logger(const std::string& name);

// Lines dropped because the writer's queue was full (since the process started).
std::uint64_t log_lines_dropped();
// Waits until every line logged before the call is written and the sinks are flushed, at most
// timeout_ms. False at the deadline (the writer is stuck behind its reader).
bool flush_logging(std::uint64_t timeout_ms = log_flush_ms_max);
// flush_logging(timeout_ms), then stops the writer. When the flush did not finish, the writer
// is left running for the process's exit to end (false): joining it could wait forever. The
// caller should then leave with _Exit: exit() flushes std::cerr, which takes stderr's lock, and
// the stuck writer holds it.
// Loggers made afterwards discard their lines.
bool shutdown_logging(std::uint64_t timeout_ms = log_flush_ms_max);

}  // namespace ordo
