// log.hpp: one named spdlog logger per actor, all writing to the same sinks.
//
// init_logging() is called once by the bootstrap (level and optional file from [log]);
// logger("net") returns the shared logger for that name, creating it on first use with the
// process-wide sinks and level. Safe to call from any thread.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <string>

#include "actors/runtime/result.hpp"

namespace ordo {

// level: trace|debug|info|warn|error|critical|off. file: empty = stderr only.
status init_logging(const std::string& level, const std::string& file);
std::shared_ptr<spdlog::logger> logger(const std::string& name);

}  // namespace ordo
