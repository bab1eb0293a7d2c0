// api_keys.cpp: see api_keys.hpp.
#include "door/api_keys.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstring>

namespace ordo::door {
namespace {

bool is_blank(char c) {
    return c == ' ' || c == '\t' || c == '\r';
}

std::string_view trim(std::string_view s) {
    while (!s.empty() && is_blank(s.front())) s.remove_prefix(1);
    while (!s.empty() && is_blank(s.back())) s.remove_suffix(1);
    return s;
}

bool iequals(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); i++) {
        char x = a[i] >= 'A' && a[i] <= 'Z' ? char(a[i] - 'A' + 'a') : a[i];
        char y = b[i] >= 'A' && b[i] <= 'Z' ? char(b[i] - 'A' + 'a') : b[i];
        if (x != y) return false;
    }
    return true;
}

uint64_t ms_between(std::chrono::steady_clock::time_point from,
                    std::chrono::steady_clock::time_point to) {
    if (to <= from) return 0;
    return uint64_t(std::chrono::duration_cast<std::chrono::milliseconds>(to - from).count());
}

std::string file_error(const std::string& path, const std::string& why) {
    return "server.api_keys_file = " + path + ": " + why;
}

}  // namespace

// ---- keys ------------------------------------------------------------------------------------

std::string check_api_key(std::string_view key) {
    if (key.empty()) return "an API key must not be empty";
    if (key.size() > api_key_bytes_max) {
        return "an API key is " + std::to_string(api_key_bytes_max) + " bytes at most";
    }
    for (char c : key) {
        if (c <= ' ' || c > '~') {
            return "an API key is printable ASCII without spaces (a Bearer token)";
        }
    }
    return "";
}

result<std::vector<std::string>> parse_api_keys(std::string_view text, std::string_view source) {
    std::vector<std::string> keys;
    size_t line_no = 0;
    while (!text.empty()) {
        size_t end = text.find('\n');
        std::string_view line = trim(text.substr(0, end));
        text.remove_prefix(end == std::string_view::npos ? text.size() : end + 1);
        line_no++;
        if (line.empty() || line.front() == '#') continue;
        if (std::string why = check_api_key(line); !why.empty()) {
            return make_error("config_invalid",
                              std::string(source) + ":" + std::to_string(line_no) + ": " + why);
        }
        if (keys.size() == api_keys_max) {
            return make_error("config_invalid", std::string(source) + ":" +
                                                    std::to_string(line_no) + ": more than " +
                                                    std::to_string(api_keys_max) + " keys");
        }
        keys.emplace_back(line);
    }
    return keys;
}

result<std::vector<std::string>> load_api_keys_file(const std::string& path) {
    // Opened first, then checked through the descriptor: what is checked is what is read.
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return make_error("config_invalid",
                          file_error(path, std::string("cannot be read: ") + std::strerror(errno)));
    }
    struct fd_closer {
        int fd;
        ~fd_closer() { ::close(fd); }
    } closer{fd};
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        return make_error("config_invalid", file_error(path, "not a regular file"));
    }
    if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
        char mode[8];
        std::snprintf(mode, sizeof mode, "%04o", unsigned(st.st_mode & 07777));
        return make_error("config_invalid",
                          file_error(path, std::string("mode ") + mode +
                                               " lets group or others use it; it holds secrets: "
                                               "chmod 600 it"));
    }
    // Checked by size first, then by what is read (the file may grow meanwhile).
    auto too_large = [&] {
        return make_error(
            "config_invalid",
            file_error(path, "larger than " + std::to_string(api_keys_file_bytes_max) + " bytes"));
    };
    if (uint64_t(st.st_size) > api_keys_file_bytes_max) return too_large();
    std::string text;
    char buf[4096];
    while (text.size() <= api_keys_file_bytes_max) {
        ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            return make_error("config_invalid", file_error(path, std::string("cannot be read: ") +
                                                                     std::strerror(errno)));
        }
        if (n == 0) break;
        text.append(buf, size_t(n));
    }
    if (text.size() > api_keys_file_bytes_max) return too_large();
    auto keys = parse_api_keys(text, "server.api_keys_file " + path);
    if (!keys.ok()) return keys.err();
    if (keys->empty()) {
        return make_error("config_invalid",
                          file_error(path, "holds no key (one per line; '#' starts a comment)"));
    }
    return keys;
}

api_keys::api_keys(const std::vector<std::string>& keys) {
    assert(keys.size() <= api_keys_max);
    _keys.reserve(keys.size());
    for (const std::string& k : keys) {
        assert(check_api_key(k).empty());
        padded p;
        std::memcpy(p.bytes.data(), k.data(), std::min(k.size(), api_key_bytes_max));
        p.size = uint32_t(k.size());
        _keys.push_back(p);
    }
}

bool api_keys::matches(std::string_view candidate) const {
    // The candidate padded like the keys; a longer one cannot match (its size differs from
    // every key's) and is compared over its first api_key_bytes_max bytes all the same.
    std::array<uint8_t, api_key_bytes_max> given{};
    std::memcpy(given.data(), candidate.data(), std::min(candidate.size(), api_key_bytes_max));
    const uint64_t given_size = candidate.size();
    uint32_t found = 0;
    for (const padded& k : _keys) {
        // diff is 0 exactly when sizes and every padded byte agree; no branch on the bytes.
        uint64_t diff = given_size ^ k.size;
        for (size_t i = 0; i < api_key_bytes_max; i++) diff |= uint64_t(given[i] ^ k.bytes[i]);
        // 1 when diff == 0, else 0, without a comparison the compiler could turn into a branch.
        found |= uint32_t(((diff | (0 - diff)) >> 63) ^ 1);
    }
    return found != 0;
}

// ---- the failure table -------------------------------------------------------------------------

auth_failures::auth_failures(auth_limits limits) : _limits(limits) {
    assert(_limits.failures_max > 0 && _limits.clients_max > 0);
}

// The entry of `address`, created if needed (the least recently seen one evicted at the bound),
// moved to the front.
auth_failures::order::iterator auth_failures::touch(std::string_view address,
                                                    clock::time_point now) {
    if (auto it = _by_address.find(address); it != _by_address.end()) {
        _entries.splice(_entries.begin(), _entries, it->second);
        return it->second;
    }
    if (_by_address.size() >= _limits.clients_max) {
        _by_address.erase(_entries.back().address);
        _entries.pop_back();
    }
    _entries.push_front(entry{std::string(address), 0, now, std::nullopt});
    _by_address.emplace(_entries.front().address, _entries.begin());
    assert(_by_address.size() == _entries.size() && _entries.size() <= _limits.clients_max);
    return _entries.begin();
}

uint64_t auth_failures::cooldown_left_ms(std::string_view address, clock::time_point now) {
    auto it = _by_address.find(address);
    if (it == _by_address.end()) return 0;
    entry& e = *it->second;
    if (!e.cut_off_until) return 0;
    uint64_t left = ms_between(now, *e.cut_off_until);
    if (left == 0) e.cut_off_until.reset();  // served: the address starts afresh
    return left;
}

bool auth_failures::failed(std::string_view address, clock::time_point now) {
    entry& e = *touch(address, now);
    if (e.failures == 0 || ms_between(e.window_start, now) >= _limits.window_ms) {
        e.failures = 0;
        e.window_start = now;
    }
    e.failures++;
    if (e.failures < _limits.failures_max) return false;
    e.failures = 0;
    e.cut_off_until = now + std::chrono::milliseconds(_limits.cooldown_ms);
    return true;
}

void auth_failures::succeeded(std::string_view address) {
    auto it = _by_address.find(address);
    if (it == _by_address.end()) return;
    auto node = it->second;
    _by_address.erase(it);
    _entries.erase(node);
}

// ---- the gate both doors share --------------------------------------------------------------

auth_gate::auth_gate(api_keys keys, auth_limits limits) : _keys(std::move(keys)), _table(limits) {}

uint64_t auth_gate::cooldown_left_ms(std::string_view address, clock::time_point now) {
    if (!required()) return 0;
    std::lock_guard lock(_mutex);
    return _table.cooldown_left_ms(address, now);
}

auth_verdict auth_gate::check(std::string_view address, std::optional<std::string_view> key,
                              clock::time_point now) {
    if (!required()) return auth_verdict::ok;
    // Compared before the lock and whatever the table says: the time taken is the same.
    const bool match = key && _keys.matches(*key);
    std::lock_guard lock(_mutex);
    if (_table.cooldown_left_ms(address, now) > 0) return auth_verdict::cut_off;
    if (match) {
        _table.succeeded(address);
        return auth_verdict::ok;
    }
    _table.failed(address, now);
    return key ? auth_verdict::wrong : auth_verdict::missing;
}

// ---- helpers for the doors ------------------------------------------------------------------

std::string cut_off_message(uint64_t left_ms) {
    return "too many failed authentications from this address: refused for " +
           (left_ms > 0 ? std::to_string((left_ms + 999) / 1000) + " s more" : "now");
}

std::optional<std::string_view> bearer_key(std::string_view authorization) {
    std::string_view v = trim(authorization);
    constexpr std::string_view scheme = "bearer";
    if (v.size() <= scheme.size() || !iequals(v.substr(0, scheme.size()), scheme) ||
        !is_blank(v[scheme.size()])) {
        return std::nullopt;
    }
    std::string_view key = trim(v.substr(scheme.size()));
    if (key.empty()) return std::nullopt;
    return key;
}

bool is_loopback_host(std::string_view host) {
    std::string h(host);
    in_addr v4{};
    if (::inet_pton(AF_INET, h.c_str(), &v4) == 1) {
        return (ntohl(v4.s_addr) >> 24) == 127;
    }
    in6_addr v6{};
    if (::inet_pton(AF_INET6, h.c_str(), &v6) != 1) return false;
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
}

}  // namespace ordo::door
