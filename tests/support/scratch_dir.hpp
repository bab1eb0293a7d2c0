// scratch_dir.hpp: a test process's scratch directory, <temp>/<name>_<pid>, for the models,
// configs, logs and KV files a suite writes. Made on first use; removed with everything in it
// when the process that made it exits normally, so a test run leaves nothing in /tmp (ctest runs
// each test as its own process: before this, every one left its directory behind, a few hundred
// MiB a run). A forked child that exits leaves its parent's directory alone; a process that
// crashes leaves it for inspection.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <system_error>

namespace ordo::test {

class scratch_owner {
public:
    explicit scratch_owner(std::filesystem::path path) : _path(std::move(path)), _pid(::getpid()) {
        std::filesystem::create_directories(_path);
    }
    ~scratch_owner() {
        std::error_code ignored;  // nothing to report to at exit
        if (::getpid() == _pid) std::filesystem::remove_all(_path, ignored);
    }
    scratch_owner(const scratch_owner&) = delete;
    scratch_owner& operator=(const scratch_owner&) = delete;
    const std::filesystem::path& path() const { return _path; }

private:
    std::filesystem::path _path;
    pid_t _pid;
};

// <temp>/<name>_<pid>, made if missing; the same path for every call with `name`.
inline const std::filesystem::path& scratch_dir(const std::string& name) {
    static std::mutex mutex;
    static std::map<std::string, scratch_owner> dirs;
    std::lock_guard lock(mutex);
    auto it = dirs.find(name);
    if (it == dirs.end()) {
        it = dirs.try_emplace(name, std::filesystem::temp_directory_path() /
                                        (name + "_" + std::to_string(::getpid())))
                 .first;
    }
    return it->second.path();
}

}  // namespace ordo::test
