// atomic_file.hpp: writing a whole file so that a crash or a concurrent writer leaves either the
// old file or the new one, never a mix. Header-only (POSIX calls, no state), so the pure
// libraries (model/: GGUF files; gpu/vk: the pipeline cache) use it without linking the runtime.
// Any thread; touches only `path`, its temporary sibling and their folder.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "actors/runtime/result.hpp"

namespace ordo {

// Writes `bytes` to `path`: a temporary file beside it (named for this process and call, so two
// writers never share one), fsync, rename over `path`, then a best-effort fsync of the folder
// (the rename is durable once the folder is). The folder must exist. Errors carry `code` and
// name the file and the step: "cannot create|write|flush|rename ...".
inline status write_file_atomically(const std::string& path, std::span<const std::uint8_t> bytes,
                                    std::string_view code) {
    static std::atomic<std::uint64_t> writes{0};
    auto fail = [&](const std::string& what, int err) {
        return make_error(std::string(code), what + ": " + std::strerror(err));
    };
    const std::string tmp =
        path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(writes.fetch_add(1));
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return fail("cannot create " + tmp, errno);
    std::size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            const int e = n < 0 ? errno : EIO;
            ::close(fd);
            ::unlink(tmp.c_str());
            return fail("cannot write " + tmp, e);
        }
        done += static_cast<std::size_t>(n);
    }
    const int sync_rc = ::fsync(fd);
    const int sync_errno = errno;
    const int close_rc = ::close(fd);
    if (sync_rc != 0 || close_rc != 0) {
        const int e = sync_rc != 0 ? sync_errno : errno;
        ::unlink(tmp.c_str());
        return fail("cannot flush " + tmp, e);
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        const int e = errno;
        ::unlink(tmp.c_str());
        return fail("cannot rename " + tmp + " to " + path, e);
    }
    const std::size_t slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
    if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
        (void)::fsync(dfd);  // best effort: the file itself is already whole and in place
        ::close(dfd);
    }
    return {};
}

}  // namespace ordo
