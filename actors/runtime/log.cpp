// log.cpp: see log.hpp.
#include "actors/runtime/log.hpp"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <mutex>
#include <vector>

namespace ordo {
namespace {

struct log_state {
    std::mutex mutex;
    std::vector<spdlog::sink_ptr> sinks;
    spdlog::level::level_enum level = spdlog::level::info;
};

log_state& state() {
    static log_state s;
    return s;
}

void ensure_sinks_locked(log_state& s) {
    if (s.sinks.empty()) s.sinks.push_back(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
}

}  // namespace

status init_logging(const std::string& level, const std::string& file) {
    auto lvl = spdlog::level::from_str(level);
    if (lvl == spdlog::level::off && level != "off") {
        return make_error("config_invalid", "log.level: unknown level '" + level + "'");
    }
    auto& s = state();
    std::lock_guard lock(s.mutex);
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
    ensure_sinks_locked(s);
    auto l = std::make_shared<spdlog::logger>(name, s.sinks.begin(), s.sinks.end());
    l->set_level(s.level);
    l->flush_on(spdlog::level::warn);
    spdlog::register_logger(l);
    return l;
}

}  // namespace ordo
