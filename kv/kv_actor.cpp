// kv_actor.cpp: see kv_actor.hpp.
#include "kv/kv_actor.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

namespace ordo::kv {

namespace {

constexpr std::string_view quarantine_dir_name = "quarantine";
// The write probe's file, ".ordo-probe.<writer>": a name classify_kv_dir_entry calls foreign, so
// no scan touches it, and each writer sharing a directory has its own.
constexpr std::string_view probe_file_prefix = ".ordo-probe";
constexpr size_t probe_bytes = 4096;

// After a failed read: whether the file is simply not there (removed by someone else).
bool file_absent(const std::string& path) {
    struct stat st {};
    return ::lstat(path.c_str(), &st) != 0 && errno == ENOENT;
}

double ms_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// Writes, syncs and removes a small file: whether the directory takes writes now.
status probe_write(const std::string& path) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return kv_errno_error(path + ": open");
    std::vector<char> zeros(probe_bytes, 0);
    status st;
    size_t done = 0;
    while (done < zeros.size()) {
        ssize_t n = ::write(fd, zeros.data() + done, zeros.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            st = kv_errno_error(path + ": write");
            break;
        }
        done += size_t(n);
    }
    if (st && ::fsync(fd) != 0) st = kv_errno_error(path + ": fsync");
    ::close(fd);
    ::unlink(path.c_str());
    return st;
}

struct quarantined_file {
    std::string path;
    time_t mtime = 0;
    uint64_t bytes = 0;
};

// Deletes the oldest quarantined files beyond quarantine_files_max / quarantine_bytes_max.
void trim_quarantine(const std::string& qdir) {
    DIR* d = ::opendir(qdir.c_str());
    if (d == nullptr) return;
    std::vector<quarantined_file> files;
    uint64_t total = 0;
    while (dirent* e = ::readdir(d)) {
        struct stat st {};
        std::string p = qdir + "/" + e->d_name;
        if (::fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) {
            continue;
        }
        files.push_back({p, st.st_mtime, uint64_t(st.st_size)});
        total += uint64_t(st.st_size);
    }
    ::closedir(d);
    std::sort(files.begin(), files.end(),
              [](const auto& a, const auto& b) { return a.mtime < b.mtime; });
    size_t n = files.size();
    for (const auto& f : files) {
        if (n <= quarantine_files_max && total <= quarantine_bytes_max) break;
        ::unlink(f.path.c_str());
        n--;
        total -= f.bytes;
    }
}

// Moves <dir>/<stem>.kv into <dir>/quarantine (never overwriting an earlier one), then trims.
// A file that cannot be moved (read-only disk) stays where it is: the next scan refuses it
// again, it is never loaded.
void move_to_quarantine(const std::string& dir, const std::string& stem, kv_failure why) {
    const std::string qdir = dir + "/" + std::string(quarantine_dir_name);
    auto stamp = std::chrono::duration_cast<std::chrono::microseconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
    const std::string from = dir + "/" + stem + std::string(kv_file_suffix);
    const std::string to = qdir + "/" + stem + "." + std::string(enum_name(why)) + "." +
                           std::to_string(stamp) + std::string(kv_file_suffix);
    if (::rename(from.c_str(), to.c_str()) != 0) {
        spdlog::warn("kv: quarantine {}: {}", from, std::strerror(errno));
        return;
    }
    trim_quarantine(qdir);
}

}  // namespace

// ---- the scan (thread pool) -------------------------------------------------------------------

struct scan_result {
    std::vector<std::pair<time_t, kv_entry>> entries;
    std::vector<std::tuple<std::string, kv_error, std::string>> bad;  // stem, code, message
    uint64_t ignored = 0;
    uint64_t leftovers = 0;
    uint64_t others = 0;  // shared: other writers' young .tmp files and other models' files
    std::optional<error> dir_error;  // the directory cannot be created or written
};

namespace {

// A `.tmp` another writer last wrote shared_tmp_stale_seconds ago or more: its writer died.
bool stale_tmp(const struct stat& st) {
    return st.st_mtime <= ::time(nullptr) - shared_tmp_stale_seconds;
}

// Deletes the stale `.tmp` files of `dir` (at most scan_entries_max entries looked at); how
// many.
uint64_t sweep_stale_tmp(const std::string& dir) {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return 0;
    uint64_t deleted = 0;
    uint32_t seen = 0;
    while (dirent* e = ::readdir(d)) {
        if (++seen > scan_entries_max) break;
        if (classify_kv_dir_entry(e->d_name) != kv_dir_entry::tmp_leftover) continue;
        struct stat st {};
        if (::fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
            stale_tmp(st) && ::unlinkat(dirfd(d), e->d_name, 0) == 0) {
            deleted++;
        }
    }
    ::closedir(d);
    return deleted;
}

// A file refused for being another model's or another KV layout's, not for being damaged.
bool other_layout(kv_error e) {
    return e == kv_error::fingerprint || e == kv_error::geometry || e == kv_error::dtype ||
           e == kv_error::block_tokens;
}

void scan_dir(const std::string& dir, const kv_expect& expect, bool shared,
              const std::string& probe_path, scan_result& r) {
    std::error_code ec;
    std::filesystem::create_directories(dir + "/" + std::string(quarantine_dir_name), ec);
    if (ec) {
        errno = ec.value();
        r.dir_error = kv_errno_error(dir + ": create");
    } else if (auto p = probe_write(probe_path); !p) {
        r.dir_error = p.err();
    }
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) {
        if (!r.dir_error) r.dir_error = kv_errno_error(dir + ": opendir");
        return;
    }
    uint32_t seen = 0;
    while (dirent* e = ::readdir(d)) {
        const std::string fname = e->d_name;
        if (fname == "." || fname == ".." || fname == quarantine_dir_name ||
            fname.starts_with(probe_file_prefix))
            continue;
        if (++seen > scan_entries_max) {
            spdlog::warn("kv: {} has more than {} entries; the rest are left alone", dir,
                         scan_entries_max);
            break;
        }
        const std::string path = dir + "/" + fname;
        struct stat st {};
        const bool regular =
            ::fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
        switch (classify_kv_dir_entry(fname)) {
            case kv_dir_entry::foreign:
                r.ignored++;
                continue;
            case kv_dir_entry::tmp_leftover:
                // A write that never renamed (a crash): never read, deleted. In a shared
                // directory a young one may be another server's save in the making.
                if (regular && shared && !stale_tmp(st)) {
                    r.others++;
                } else if (regular && ::unlinkat(dirfd(d), e->d_name, 0) == 0) {
                    r.leftovers++;
                } else {
                    r.ignored++;
                }
                continue;
            case kv_dir_entry::kv_file:
                break;
        }
        const std::string stem = fname.substr(0, fname.size() - kv_file_suffix.size());
        auto header = read_kv_header(path, expect);
        if (!header && kv_error_of(header.err()) == kv_error::not_regular) {
            r.ignored++;  // a symlink or directory named like ours: never followed or moved
            continue;
        }
        result<std::vector<int32_t>> tokens =
            header ? read_kv_tokens(path, *header) : result<std::vector<int32_t>>(header.err());
        if (!tokens) {
            const kv_error e = kv_error_of(tokens.err());
            if (shared && other_layout(e)) {
                r.others++;  // another model's replicas may share the directory
                continue;
            }
            r.bad.emplace_back(stem, e, tokens.err().message);
            if (!kv_disk_fault(e)) move_to_quarantine(dir, stem, kv_failure_of(e));
            continue;
        }
        kv_entry entry;
        entry.name = stem;
        entry.header = *header;
        entry.tokens = std::move(*tokens);
        r.entries.emplace_back(st.st_mtime, std::move(entry));
    }
    ::closedir(d);
    std::sort(r.entries.begin(), r.entries.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
}

}  // namespace

// ---- jobs ---------------------------------------------------------------------------------------

struct kv_actor::job {
    enum class kind { save, restore } k = kind::save;
    uint64_t id = 0;   // key in _jobs
    uint64_t ref = 0;  // save_id (save) or seq (restore)
    std::string name;
    kv_file_meta meta;
    std::vector<int32_t> tokens;   // save: the ids written
    std::vector<uint32_t> blocks;  // pool blocks, one per file block copied
    uint64_t epoch = 0;
    uint32_t first_block = 0;  // restore: first file block
    kv_file_header header;     // restore: the entry's header
    // The blocks' bytes: the first blocks.size() * block_bytes of it (a reused buffer may be
    // longer; take_buffer).
    std::vector<uint8_t> bytes;
    uint32_t copied = 0;
    bool dropped = false;  // save: its session was deleted meanwhile
    clock::time_point start = clock::now();
    status io;                              // thread pool's result
    std::optional<kv_file_header> written;  // save: the header read back after the write
    bool gone = false;  // restore: the file was removed; save: another writer replaced it
};

struct kv_actor::work {
    uv_work_t req{};
    kv_actor* self = nullptr;
    std::function<void()> run, done;
};

kv_actor::kv_actor(kv_actor_options options, gpu::kv_staging& staging)
    : actor("kv", options.mailbox_capacity),
      _opt(std::move(options)),
      _staging(staging),
      _block_bytes(_opt.expect.geometry.block_bytes()),
      _index(_opt.expect.geometry.block_tokens) {
    if (_opt.writer.empty()) _opt.writer = kv_writer_tag();
    _counters.enabled = true;
    _counters.shared = _opt.shared;
    _counters.bytes_budget = _opt.bytes_budget;
    _snapshot = _counters;
}

kv_actor::~kv_actor() = default;

std::string kv_actor::path_of(const std::string& name) const {
    return _opt.dir + "/" + name + std::string(kv_file_suffix);
}

std::string kv_actor::probe_path() const {
    return _opt.dir + "/" + std::string(probe_file_prefix) + "." + _opt.writer;
}

void kv_actor::on_start() {
    actors::delivery_limits lim;
    must(_to_sched.init(
             loop(), _sched_out, lim,
             [this](const auto& m, const actors::refusal& why) {
                 // The scheduler stopped: nobody waits for the answer.
                 if (why.outcome == actors::delivery_outcome::actor_stopped) return;
                 count_error(kv_failure::undelivered);
                 log().error("kv: {} to the scheduler given up: {}",
                             std::visit([](const auto& x) { return std::string(x.msg_name); }, m),
                             why.message);
             }),
         "scheduler delivery init");
    must(_to_gpu.init(loop(), _gpu_out, lim,
                      [this](const auto& m, const actors::refusal& why) {
                          uint64_t id = std::visit([](const auto& x) { return x.job_id; }, m);
                          if (_copy_job != 0 && id == _gpu_job_id) {
                              copy_finished(false, kv_failure_of(why.outcome),
                                            "copy job not delivered: " + why.message);
                          }
                      }),
         "gpu delivery init");
    uv_timer_init(loop(), &_probe_timer);
    _probe_timer.data = this;
    uv_timer_init(loop(), &_sweep_timer);
    _sweep_timer.data = this;
    if (_opt.shared && _opt.sweep_ms > 0) {
        uv_timer_start(&_sweep_timer, sweep_cb, _opt.sweep_ms, _opt.sweep_ms);
    }
    if (_staging.slot_bytes() < uint64_t(_opt.copy_blocks_max) * _block_bytes) {
        must(make_error("bad_config", "a kv staging slot does not hold copy_blocks_max blocks"),
             "kv staging");
    }
    if (auto s = _staging.acquire(); s) {
        _slot = *s;
    } else {
        log().error("kv: no staging slot ({}); saves and restores will fail", s.err().message);
    }
    auto r = std::make_shared<scan_result>();
    offload([r, dir = _opt.dir, expect = _opt.expect, shared = _opt.shared,
             probe = probe_path()] { scan_dir(dir, expect, shared, probe, *r); },
            [this, r] { apply_scan(*r); });
    publish();
}

void kv_actor::on_stop() {
    _flushing = true;
    _to_sched.close();
    _to_gpu.close();
    uv_timer_stop(&_probe_timer);
    uv_close(reinterpret_cast<uv_handle_t*>(&_probe_timer), nullptr);
    uv_timer_stop(&_sweep_timer);
    uv_close(reinterpret_cast<uv_handle_t*>(&_sweep_timer), nullptr);
    // A copy still in flight keeps its slot: the gpu may write it until it answers.
    if (_slot && _copy_job == 0) _staging.release(*_slot);
    _slot.reset();
    publish();
}

// ---- thread pool --------------------------------------------------------------------------------

void kv_actor::offload(std::function<void()> run, std::function<void()> done) {
    auto* w = new work{};
    w->req.data = w;
    w->self = this;
    w->run = std::move(run);
    w->done = std::move(done);
    _works++;
    int rc = uv_queue_work(
        loop(), &w->req,
        [](uv_work_t* req) {
            actors::name_this_thread("kv-job");
            static_cast<work*>(req->data)->run();
        },
        [](uv_work_t* req, int) {
            std::unique_ptr<work> own(static_cast<work*>(req->data));
            own->self->_works--;
            own->done();
            own->self->publish();
        });
    if (rc != 0) {
        // No thread pool: run it here rather than lose it (bounded file work).
        log().warn("kv: uv_queue_work: {}; running on the loop", uv_strerror(rc));
        std::unique_ptr<work> own(w);
        _works--;
        own->run();
        own->done();
    }
}

void kv_actor::apply_scan(scan_result& r) {
    for (auto& [mtime, e] : r.entries) _index.put(std::move(e));
    _counters.ignored += r.ignored;
    for (const auto& [stem, code, message] : r.bad) {
        if (kv_disk_fault(code)) {
            log().warn("kv: {} unreadable ({}): {}; left in place", stem, enum_name(code), message);
        } else {
            _counters.quarantined++;
            log().warn("kv: {} quarantined ({}): {}", stem, enum_name(code), message);
        }
        count_error(kv_failure_of(code));
    }
    log().info(
        "kv: {} ready: {} files ({} sessions), {} bytes; {} quarantined, {} ignored, {} "
        "leftovers deleted{}",
        _opt.dir, _index.files(), _index.sessions(), _index.bytes(), r.bad.size(), r.ignored,
        r.leftovers,
        _opt.shared ? fmt::format("; shared as writer {}, {} files of other writers or models "
                                  "left alone",
                                  _opt.writer, r.others)
                    : std::string());
    _scan_done = true;
    if (r.dir_error) disk_fault(kv_error_of(*r.dir_error), r.dir_error->message);
    evict_to_budget();
}

// ---- lookups and restores ---------------------------------------------------------------------

void kv_actor::on(const kv_lookup& m) {
    if (auto old = _leases.find(m.seq); old != _leases.end()) {
        _index.unlease(old->second);
        _leases.erase(old);
    }
    std::optional<std::string> session_name;
    if (m.session) {
        auto n = kv_session_name(_opt.expect.fingerprint, *m.session);
        if (n) session_name = *n;
    }
    if (_opt.shared && session_name && _scan_done && !_flushing) {
        refresh_session(m, *session_name);
        return;
    }
    answer_lookup(m, session_name);
}

// What a shared session file holds now, read off the loop (refresh_session).
struct session_read {
    enum class outcome { absent, same, fresh, refused } what = outcome::absent;
    kv_entry entry;  // fresh
    error why;       // refused
};

// Another replica may have written, replaced or removed the session's file since this one
// indexed it: its header is read first, its token ids only when the header is news. The
// lookup is answered after, from the index brought up to date.
void kv_actor::refresh_session(const kv_lookup& m, const std::string& name) {
    std::optional<kv_file_header> known;
    if (const kv_entry* e = _index.find(name)) known = e->header;
    auto r = std::make_shared<session_read>();
    offload(
        [r, name, known, path = path_of(name), expect = _opt.expect] {
            using o = session_read::outcome;
            auto h = read_kv_header(path, expect);
            if (!h) {
                r->what = file_absent(path) ? o::absent : o::refused;
                r->why = h.err();
                return;
            }
            if (known && *h == *known) {
                r->what = o::same;
                return;
            }
            auto t = read_kv_tokens(path, *h);
            if (!t) {
                r->what = o::refused;
                r->why = t.err();
                return;
            }
            r->what = o::fresh;
            r->entry.name = name;
            r->entry.header = *h;
            r->entry.tokens = std::move(*t);
        },
        [this, m, name, known, r] {
            using o = session_read::outcome;
            const kv_entry* now = _index.find(name);
            // A save of this replica's (or a drop) changed the entry meanwhile: it is newer
            // than what was read.
            const bool moved =
                (now != nullptr) != known.has_value() || (now != nullptr && now->header != *known);
            if (!moved) {
                switch (r->what) {
                    case o::same:
                        break;
                    case o::absent:
                        if (now != nullptr && now->leases == 0) forget(name);
                        break;
                    case o::fresh:
                        _counters.session_reads++;
                        log().info(
                            "kv: session file {} read from the shared directory ({} "
                            "tokens)",
                            name, r->entry.tokens.size());
                        _index.put(std::move(r->entry));
                        evict_to_budget();
                        break;
                    case o::refused: {
                        const kv_error e = kv_error_of(r->why);
                        if (e == kv_error::changed || other_layout(e) || kv_disk_fault(e) ||
                            e == kv_error::io) {
                            // Replaced while read, another layout's, or unreadable now: not a
                            // bad file. A miss; the entry stays out of the index.
                            log().warn("kv: session file {} not read: {}", name, r->why.message);
                            if (now != nullptr && now->leases == 0) forget(name);
                        } else {
                            count_error(kv_failure_of(e));
                            log().warn("kv: {} quarantined ({}): {}", name, enum_name(e),
                                       r->why.message);
                            quarantine(name, kv_failure_of(e));
                        }
                        break;
                    }
                }
            }
            answer_lookup(m, name);
        });
}

void kv_actor::answer_lookup(const kv_lookup& m, const std::optional<std::string>& session_name) {
    kv_lookup_done reply{m.seq, 0, ""};
    if (_scan_done) {
        if (auto match = _index.longest(m.tokens, session_name ? &*session_name : nullptr)) {
            reply.n_blocks = match->n_blocks;
            reply.name = match->name;
            _index.lease(match->name);
            _leases[m.seq] = match->name;
        }
    }
    _to_sched.send(reply);
    publish();
}

void kv_actor::on(const kv_release& m) {
    if (auto it = _leases.find(m.seq); it != _leases.end()) {
        _index.unlease(it->second);
        _leases.erase(it);
    }
}

void kv_actor::on(const kv_restore& m) {
    auto lease = _leases.find(m.seq);
    if (lease == _leases.end()) {
        _to_sched.send(
            kv_restore_done{m.seq, false, kv_failure::no_lease, "no entry is leased to it", 0});
        return;
    }
    const std::string name = lease->second;
    _leases.erase(lease);
    const kv_entry* e = _index.find(name);
    auto refuse = [&](kv_failure code, const std::string& message) {
        _index.unlease(name);
        _counters.restore_failures++;
        count_error(code);
        _to_sched.send(kv_restore_done{m.seq, false, code, message, 0});
        publish();
    };
    if (e == nullptr) return refuse(kv_failure::evicted, name + " left the index");
    if (m.blocks.empty() || uint64_t(m.first_block) + m.blocks.size() > e->header.n_blocks) {
        return refuse(kv_failure_of(kv_error::bad_request), "blocks out of the entry's range");
    }
    if (_flushing) return refuse(kv_failure::stopping, "the kv actor is stopping");
    auto j = std::make_unique<job>();
    j->k = job::kind::restore;
    j->ref = m.seq;
    j->name = name;
    j->header = e->header;
    j->blocks = m.blocks;
    j->epoch = m.epoch;
    j->first_block = m.first_block;
    j->bytes = take_buffer(uint64_t(m.blocks.size()) * _block_bytes);
    j->id = _next_job++;
    const uint64_t id = j->id;
    _jobs.emplace(id, std::move(j));
    read_restore(id);
}

void kv_actor::read_restore(uint64_t id) {
    job* j = _jobs.at(id).get();
    kv_read_fault rf = kv_read_fault::none;
    if (_faults.armed() && _faults.flip_read > 0) {
        _faults.flip_read--;
        rf = kv_read_fault::flip_bit;
        log().warn("kv: fault kv_flip_read applied to the restore of {}", j->name);
    }
    uint32_t stall_ms = 0;
    if (_faults.armed() && _faults.stall_read > 0) {
        _faults.stall_read--;
        stall_ms = _faults.stall_read_ms;
        log().warn("kv: fault kv_stall_read: the restore of {} waits {} ms before it reads",
                   j->name, stall_ms);
    }
    offload(
        [j, path = path_of(j->name), bb = _block_bytes, rf, stall_ms] {
            // A slow or hung disk: the pool thread is held as a read that does not return
            // would hold it (kv_stall_ms_max at most).
            if (stall_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(stall_ms));
            std::span<uint8_t> dst(j->bytes.data(), j->blocks.size() * bb);
            // Every block's checksum is verified right after its read (read_kv_blocks).
            j->io = read_kv_blocks(path, j->header, j->first_block,
                                   static_cast<uint32_t>(j->blocks.size()), dst, rf);
            if (!j->io && file_absent(path)) j->gone = true;
        },
        [this, j] {
            if (!j->io) {
                const error why = j->io.err();
                const kv_error e = kv_error_of(why);
                const kv_failure f = kv_failure_of(e);
                if (j->gone || (_opt.shared && e == kv_error::changed)) {
                    // Removed, or replaced by another writer: not a bad file, nothing to move.
                    if (_index.find(j->name) != nullptr) forget(j->name);
                    restore_finished(*j, false, j->gone ? kv_failure::evicted : f, why.message);
                    return;
                }
                // A file that fails verification is never offered again.
                if (_index.find(j->name) != nullptr) quarantine(j->name, f);
                restore_finished(*j, false, f, why.message);
                return;
            }
            queue_copies(*j);
        });
}

void kv_actor::restore_finished(job& j, bool ok, kv_failure code, const std::string& message) {
    double ms = ms_since(j.start);
    _index.unlease(j.name);
    if (ok) {
        _counters.restores++;
        _counters.restore_ms += ms;
    } else {
        _counters.restore_failures++;
        count_error(code);
    }
    _to_sched.send(kv_restore_done{j.ref, ok, code, message, ms});
    const uint64_t id = j.id;
    end_job(id);
    maybe_flushed();
}

// ---- saves --------------------------------------------------------------------------------------

void kv_actor::on(const kv_save& m) {
    auto refuse = [&](kv_failure code) {
        if (code != kv_failure::exists) count_error(code);
        _counters.saves_skipped++;
        _to_sched.send(kv_save_done{m.save_id, false, code});
        publish();
    };
    const uint32_t bt = _opt.expect.geometry.block_tokens;
    const bool session = m.kind == kv_file_kind::session;
    if (!enum_valid(m.kind) || (session && !m.session) || m.blocks.empty() ||
        m.tokens.size() != m.blocks.size() * size_t{bt}) {
        return refuse(kv_failure_of(kv_error::bad_request));
    }
    if (_flushing) return refuse(kv_failure::stopping);
    if (!_scan_done) return refuse(kv_failure::not_ready);
    if (!_persisting) return refuse(kv_failure::persistence_off);
    std::string name;
    if (session) {
        auto n = kv_session_name(_opt.expect.fingerprint, *m.session);
        if (!n) return refuse(kv_failure_of(kv_error_of(n.err())));
        name = *n;
        const kv_entry* e = _index.find(name);
        // Shared: another server may have replaced the file since this one indexed it, so the
        // index cannot tell that the disk already holds these tokens; the save is written.
        if (!_opt.shared && e != nullptr && e->tokens == m.tokens) {
            return refuse(kv_failure::exists);
        }
    } else {
        if (_index.covers(m.tokens)) return refuse(kv_failure::exists);
        name = kv_prefix_name(_opt.expect.fingerprint, m.tokens);
    }
    uint32_t in_memory = 0;
    for (const auto& [id, j] : _jobs) {
        if (j->k != job::kind::save) continue;
        if (j->name == name && !j->dropped) return refuse(kv_failure::exists);
        in_memory++;
    }
    if (in_memory >= saves_pending_max) return refuse(kv_failure::busy);
    const uint64_t n_blocks = m.blocks.size();
    const uint64_t file_bytes =
        kv_header_bytes + 4 * m.tokens.size() + 8 * n_blocks + n_blocks * _block_bytes;
    if (file_bytes > _opt.bytes_budget) return refuse(kv_failure::too_large);

    auto j = std::make_unique<job>();
    j->k = job::kind::save;
    j->ref = m.save_id;
    j->name = name;
    j->meta.fingerprint = _opt.expect.fingerprint;
    j->meta.geometry = _opt.expect.geometry;
    j->meta.kind = m.kind;
    j->meta.session_hash = session ? kv_session_hash(*m.session) : 0;
    j->tokens = m.tokens;
    j->blocks = m.blocks;
    j->epoch = m.epoch;
    j->bytes = take_buffer(n_blocks * _block_bytes);
    j->id = _next_job++;
    job& ref = *j;
    _jobs.emplace(ref.id, std::move(j));
    {
        std::lock_guard lock(_mutex);
        _idle = false;
    }
    queue_copies(ref);
}

void kv_actor::save_copied(job& j, bool ok, kv_failure code) {
    _to_sched.send(kv_save_done{j.ref, ok, code});
    const uint64_t id = j.id;
    if (!ok) {
        _counters.save_failures++;
        count_error(code);
        end_job(id);
        maybe_flushed();
        return;
    }
    write_save(id);
}

void kv_actor::write_save(uint64_t id) {
    job* j = _jobs.at(id).get();
    const save_fault f = _faults.armed() ? take_save_fault() : save_fault{};
    // As if another model had written it: the pair assertion below refuses it (kv_fingerprint)
    // and the file stays on disk for the next startup scan to quarantine.
    if (f.fingerprint) j->meta.fingerprint.lo ^= 1;
    offload(
        [j, dir = _opt.dir, expect = _opt.expect, path = path_of(j->name), bb = _block_bytes, f,
         writer = _opt.writer] {
            std::span<const uint8_t> payload(j->bytes.data(), j->blocks.size() * bb);
            j->io = write_kv_file(dir, j->name, j->meta, j->tokens, payload, f.stop, writer);
            if (f.torn_exit) {
                std::fprintf(stderr, "kv: fault kv_torn_exit: exiting %d mid-save of %s\n",
                             kv_torn_exit_code, j->name.c_str());
                std::_Exit(kv_torn_exit_code);  // a crash: no destructor, no flush, no rename
            }
            if (!j->io) return;
            // Pair assertion: what was written reads back as a valid file of this model.
            auto h = read_kv_header(path, expect);
            if (!h) {
                j->io = h.err();
                return;
            }
            // ... and is the file written, not another writer's that replaced it since the
            // rename (a shared directory).
            if (h->meta != j->meta || h->n_blocks != j->blocks.size() ||
                h->tokens_checksum != kv_tokens_checksum(j->tokens)) {
                j->gone = true;
                return;
            }
            j->written = *h;
        },
        [this, id, j] {
            if (!j->io) {
                const error why = j->io.err();
                const kv_error e = kv_error_of(why);
                _counters.save_failures++;
                count_error(kv_failure_of(e));
                log().warn("kv: save {} failed: {}", j->name, why.message);
                if (kv_disk_fault(e)) disk_fault(e, why.message);
            } else if (j->gone) {
                // Another writer's file took its place at once; that one is the newest. A
                // session's next lookup reads it.
                log().info("kv: {} was replaced by another writer right after this save", j->name);
                if (_index.find(j->name) != nullptr) forget(j->name);
                _counters.saves++;
                _counters.save_ms += ms_since(j->start);
            } else if (j->dropped) {
                // Its session was deleted while it was written.
                std::string path = path_of(j->name);
                offload([path] { ::unlink(path.c_str()); }, [] {});
            } else {
                kv_entry e;
                e.name = j->name;
                e.header = *j->written;
                e.tokens = std::move(j->tokens);
                _index.put(std::move(e));
                _counters.saves++;
                _counters.save_ms += ms_since(j->start);
                evict_to_budget();
            }
            end_job(id);
            maybe_flushed();
        });
}

// One armed save fault, if any, in a fixed order; the loop thread's log says which.
kv_actor::save_fault kv_actor::take_save_fault() {
    save_fault f;
    std::optional<fault_kind> kind;
    if (_faults.torn_exit > 0) {
        _faults.torn_exit--;
        f.stop = kv_write_stop::mid_tmp;
        f.torn_exit = true;
        kind = fault_kind::kv_torn_exit;
    } else if (_faults.enospc > 0) {
        _faults.enospc--;
        f.stop = kv_write_stop::enospc_mid_tmp;
        kind = fault_kind::kv_enospc;
    } else if (_faults.eio > 0) {
        _faults.eio--;
        f.stop = kv_write_stop::eio_mid_tmp;
        kind = fault_kind::kv_eio;
    } else if (_faults.fingerprint > 0) {
        _faults.fingerprint--;
        f.fingerprint = true;
        kind = fault_kind::kv_fingerprint;
    }
    if (kind) log().warn("kv: fault {} applied to the next save", enum_name(*kind));
    return f;
}

// A buffer is only ever touched by its job: on the loop, or in the one thread-pool request the
// job has in flight, which always completes before the job ends.
std::vector<uint8_t> kv_actor::take_buffer(uint64_t bytes) {
    std::vector<uint8_t> b;
    b.swap(_spare);
    // Replaced, never grown: growing would copy bytes nobody reads.
    if (b.size() < bytes) b = std::vector<uint8_t>(bytes);
    return b;
}

void kv_actor::end_job(uint64_t id) {
    auto it = _jobs.find(id);
    assert(it != _jobs.end());
    std::vector<uint8_t>& b = it->second->bytes;
    if (b.size() <= spare_buffer_bytes_max && b.size() > _spare.size()) _spare.swap(b);
    _jobs.erase(it);
}

// ---- copies through the staging slot ------------------------------------------------------------

void kv_actor::queue_copies(job& j) {
    const uint64_t id = j.id;
    for (uint32_t first = 0; first < j.blocks.size(); first += _opt.copy_blocks_max) {
        _copies.emplace_back(id, first);
    }
    start_next_copy();
}

void kv_actor::start_next_copy() {
    while (_copy_job == 0 && !_copies.empty()) {
        auto [id, first] = _copies.front();
        _copies.pop_front();
        auto it = _jobs.find(id);
        if (it == _jobs.end()) continue;  // the job already failed
        job& j = *it->second;
        if (!_slot) {
            if (j.k == job::kind::save) {
                save_copied(j, false, kv_failure::no_staging);
            } else {
                restore_finished(j, false, kv_failure::no_staging, "no staging slot");
            }
            continue;
        }
        const uint32_t count = std::min<uint32_t>(_opt.copy_blocks_max,
                                                  static_cast<uint32_t>(j.blocks.size()) - first);
        std::vector<uint32_t> ids(j.blocks.begin() + first, j.blocks.begin() + first + count);
        _copy_job = id;
        _copy_first = first;
        _copy_count = count;
        _gpu_job_id++;
        if (j.k == job::kind::save) {
            _to_gpu.send(gpu::kv_copy_out{_gpu_job_id, std::move(ids), *_slot, j.epoch});
        } else {
            auto dst = _staging.bytes(*_slot, uint64_t(count) * _block_bytes);
            std::memcpy(dst.data(), j.bytes.data() + uint64_t(first) * _block_bytes, dst.size());
            _to_gpu.send(gpu::kv_copy_in{_gpu_job_id, std::move(ids), *_slot, j.epoch});
        }
    }
}

void kv_actor::on(const gpu::kv_copy_done& m) {
    if (_copy_job == 0 || m.job_id != _gpu_job_id) return;  // a stale reply
    copy_finished(true, kv_failure::none, "");
}

void kv_actor::on(const gpu::kv_copy_failed& m) {
    if (_copy_job == 0 || m.job_id != _gpu_job_id) return;
    copy_finished(false, kv_failure_of(m.code), m.message);
}

void kv_actor::copy_finished(bool ok, kv_failure code, const std::string& message) {
    auto it = _jobs.find(_copy_job);
    const uint32_t first = _copy_first, count = _copy_count;
    _copy_job = 0;
    if (it != _jobs.end()) {
        job& j = *it->second;
        if (!ok) {
            if (j.k == job::kind::save) {
                save_copied(j, false, code);
            } else {
                restore_finished(j, false, code, message);
            }
        } else {
            if (j.k == job::kind::save) {
                auto src = _staging.read(*_slot, uint64_t(count) * _block_bytes);
                std::memcpy(j.bytes.data() + uint64_t(first) * _block_bytes, src.data(),
                            src.size());
            }
            j.copied += count;
            if (j.copied == j.blocks.size()) {
                if (j.k == job::kind::save) {
                    save_copied(j, true, kv_failure::none);
                } else {
                    restore_finished(j, true, kv_failure::none, "");
                }
            }
        }
    }
    start_next_copy();
    publish();
}

// ---- index upkeep -------------------------------------------------------------------------------

void kv_actor::on(const kv_invalidate& m) {
    if (_index.find(m.name) == nullptr) return;
    log().warn("kv: {} quarantined: {}", m.name, m.reason);
    count_error(kv_failure::step_failed);
    quarantine(m.name, kv_failure::step_failed);
    publish();
}

// Arms a fault (the scheduler answered the `fault` op already, and sends only the kv kinds).
void kv_actor::on(const kv_fault& m) {
    uint32_t* n = nullptr;
    switch (m.kind) {
        case fault_kind::kv_enospc:
            n = &_faults.enospc;
            break;
        case fault_kind::kv_eio:
            n = &_faults.eio;
            break;
        case fault_kind::kv_torn_exit:
            n = &_faults.torn_exit;
            break;
        case fault_kind::kv_fingerprint:
            n = &_faults.fingerprint;
            break;
        case fault_kind::kv_flip_read:
            n = &_faults.flip_read;
            break;
        case fault_kind::kv_stall_read:
            n = &_faults.stall_read;
            _faults.stall_read_ms = std::min(m.ms, kv_stall_ms_max);
            break;
        case fault_kind::kv_stall_unlink:
            n = &_faults.stall_unlink;
            _faults.stall_unlink_ms = std::min(m.ms, kv_stall_ms_max);
            break;
        default:
            log().error("kv: fault of kind {} ignored: not a kv kind", enum_name(m.kind));
            return;
    }
    *n = static_cast<uint32_t>(std::min<uint64_t>(uint64_t{*n} + m.count, kv_fault_count_max));
    log().warn("kv: fault {} armed for the next {}", enum_name(m.kind), m.count);
}

void kv_actor::on(const kv_session_delete& m) {
    auto name = kv_session_name(_opt.expect.fingerprint, m.session);
    if (!name) {
        _to_sched.send(kv_session_deleted{m.conn, m.id, false, name.err().message, m.ticket});
        return;
    }
    bool pending = false;
    for (auto& [id, j] : _jobs) {
        if (j->k == job::kind::save && j->name == *name && !j->dropped) {
            j->dropped = true;
            pending = true;
        }
    }
    const bool indexed = _index.find(*name) != nullptr;
    // A shared directory may hold the session's file from another replica: removed all the same.
    if (!indexed && !_opt.shared) {
        _to_sched.send(kv_session_deleted{m.conn, m.id, pending, "", m.ticket});
        return;
    }
    if (indexed) {
        _index.erase(*name);
        _to_sched.send(kv_evicted{*name, eviction::deleted});
    }
    auto err = std::make_shared<std::string>();
    auto removed = std::make_shared<bool>(false);
    uint32_t stall_ms = 0;
    if (_faults.armed() && _faults.stall_unlink > 0) {
        _faults.stall_unlink--;
        stall_ms = _faults.stall_unlink_ms;
        log().warn("kv: fault kv_stall_unlink: the removal of {} waits {} ms before it unlinks",
                   *name, stall_ms);
    }
    offload(
        [path = path_of(*name), err, removed, stall_ms] {
            // A slow or hung disk holds the pool thread as an unlink that does not return would.
            if (stall_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(stall_ms));
            if (::unlink(path.c_str()) == 0) {
                *removed = true;
            } else if (errno != ENOENT) {
                *err = path + ": unlink: " + std::strerror(errno);
            }
        },
        [this, m, err, removed, known = indexed || pending] {
            _to_sched.send(kv_session_deleted{m.conn, m.id, err->empty() && (known || *removed),
                                              *err, m.ticket});
        });
    publish();
}

// Counts the file, not its error: the caller counts that once (a failed restore is counted by
// restore_finished, which every restore ends in).
void kv_actor::quarantine(const std::string& name, kv_failure code) {
    // A file another server wrote may not be indexed here yet (refresh_session).
    if (_index.erase(name)) _to_sched.send(kv_evicted{name, eviction::quarantined});
    _counters.quarantined++;
    offload([dir = _opt.dir, name, code] { move_to_quarantine(dir, name, code); }, [] {});
}

void kv_actor::forget(const std::string& name) {
    _index.erase(name);
    _counters.gone++;
    _to_sched.send(kv_evicted{name, eviction::gone});
}

void kv_actor::remove_file(const std::string& name, eviction reason) {
    _index.erase(name);
    _to_sched.send(kv_evicted{name, reason});
    offload([path = path_of(name)] { ::unlink(path.c_str()); }, [] {});
}

void kv_actor::evict_to_budget() {
    for (const std::string& victim : _index.over_budget(_opt.bytes_budget)) {
        _counters.evictions++;
        remove_file(victim, eviction::budget);
    }
}

// ---- disk faults --------------------------------------------------------------------------------

void kv_actor::disk_fault(kv_error code, const std::string& message) {
    if (!_persisting) return;
    _persisting = false;
    _off_reason = "kv persistence is off (" + std::string(enum_name(code)) + "): " + message;
    log().warn("kv: {}; serving goes on without saving", _off_reason);
    _to_sched.send(kv_status{false, _off_reason});
    schedule_probe();
}

void kv_actor::schedule_probe() {
    if (_probes >= _opt.probes_max || _probe_running || stopping()) return;
    uv_timer_start(&_probe_timer, probe_cb, _opt.probe_ms, 0);
}

void kv_actor::probe_cb(uv_timer_t* t) {
    auto* self = static_cast<kv_actor*>(t->data);
    if (self->stopping()) return;
    self->_probes++;
    self->_counters.probes++;
    self->_probe_running = true;
    auto st = std::make_shared<status>();
    self->offload([st, path = self->probe_path()] { *st = probe_write(path); },
                  [self, st] {
                      self->_probe_running = false;
                      if (*st) {
                          self->_persisting = true;
                          self->_off_reason.clear();
                          self->log().info("kv: the disk takes writes again; persistence is on");
                          self->_to_sched.send(kv_status{true, ""});
                          return;
                      }
                      self->count_error(kv_failure_of(kv_error_of(st->err())));
                      self->schedule_probe();
                  });
}

// A shared directory's sweep: another writer's `.tmp` past shared_tmp_stale_seconds is deleted
// (its writer died mid-save). One sweep at a time, off the loop.
void kv_actor::sweep_cb(uv_timer_t* t) {
    auto* self = static_cast<kv_actor*>(t->data);
    if (self->stopping() || self->_sweep_running) return;
    self->_sweep_running = true;
    auto deleted = std::make_shared<uint64_t>(0);
    self->offload([deleted, dir = self->_opt.dir] { *deleted = sweep_stale_tmp(dir); },
                  [self, deleted] {
                      self->_sweep_running = false;
                      if (*deleted > 0) {
                          self->log().info(
                              "kv: {} stale .tmp files of writers that died mid-save deleted",
                              *deleted);
                      }
                  });
}

// ---- flush, stats -------------------------------------------------------------------------------

void kv_actor::on(const kv_flush&) {
    _flushing = true;
    // Saves not copied out yet are dropped whole: their blocks are released now.
    std::vector<job*> uncopied;
    for (auto& [id, j] : _jobs) {
        if (j->k == job::kind::save && j->copied < j->blocks.size() && id != _copy_job) {
            uncopied.push_back(j.get());
        }
    }
    for (job* j : uncopied) save_copied(*j, false, kv_failure::stopping);
    maybe_flushed();
    publish();
}

void kv_actor::maybe_flushed() {
    bool idle = std::none_of(_jobs.begin(), _jobs.end(),
                             [](const auto& kv) { return kv.second->k == job::kind::save; });
    std::lock_guard lock(_mutex);
    _idle = idle;
    if (idle) _idle_cv.notify_all();
}

bool kv_actor::flush(uint64_t timeout_ms) {
    if (!tell(kv_flush{}, "main")) return false;
    std::unique_lock lock(_mutex);
    return _idle_cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), [this] { return _idle; });
}

void kv_actor::count_error(kv_failure code) {
    _counters.errors[std::string(enum_name(code))]++;
}

void kv_actor::publish() {
    std::lock_guard lock(_mutex);
    _snapshot = _counters;
    _snapshot.ready = _scan_done;
    _snapshot.persisting = _persisting && !_flushing;
    _snapshot.reason = _off_reason;
    _snapshot.files = _index.files();
    _snapshot.sessions = _index.sessions();
    _snapshot.bytes = _index.bytes();
    _scan_done_shared = _scan_done;
}

kv_disk_report kv_actor::report() const {
    std::lock_guard lock(_mutex);
    return _snapshot;
}

bool kv_actor::scan_done() const {
    std::lock_guard lock(_mutex);
    return _scan_done_shared;
}

}  // namespace ordo::kv
