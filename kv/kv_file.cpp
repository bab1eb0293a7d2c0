// kv_file.cpp: encoding, the atomic write protocol and the validating readers of persisted KV
// files (kv_file.hpp has the format essay; docs/kv-format.md the byte table). POSIX file I/O
// only; every descriptor is closed on every path (fd_guard).
#include "kv/kv_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cassert>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>

namespace ordo::kv {

static_assert(std::endian::native == std::endian::little,
              "token ids and the checksum table are written with memcpy: little-endian hosts only");

namespace {

// ---- Header field offsets (docs/kv-format.md) --------------------------------------------------
constexpr std::size_t off_magic = 0;
constexpr std::size_t off_version = 8;
constexpr std::size_t off_header_bytes = 12;
constexpr std::size_t off_fp_hi = 16;
constexpr std::size_t off_fp_lo = 24;
constexpr std::size_t off_n_layer = 32;
constexpr std::size_t off_n_head_kv = 36;
constexpr std::size_t off_head_dim = 40;
constexpr std::size_t off_block_tokens = 44;
constexpr std::size_t off_dtype = 48;
constexpr std::size_t off_kind = 49;
constexpr std::size_t off_reserved0 = 50;  // u16, zero
constexpr std::size_t off_n_blocks = 52;
constexpr std::size_t off_block_bytes = 56;
constexpr std::size_t off_session_hash = 64;
constexpr std::size_t off_file_bytes = 72;
constexpr std::size_t off_tokens_checksum = 80;
constexpr std::size_t off_reserved1 = 88;  // 32 bytes, zero
constexpr std::size_t off_header_checksum = 120;
static_assert(off_header_checksum + 8 == kv_header_bytes);

// Domain tags keep a prefix name and a session name of equal bytes apart.
constexpr std::string_view prefix_name_tag = "ordo-kv-prefix-v1";
constexpr std::string_view session_name_tag = "ordo-kv-session-v1";

using header_bytes = std::array<std::uint8_t, kv_header_bytes>;

template <typename T>
void put(header_bytes& b, std::size_t off, T v) {
    std::memcpy(b.data() + off, &v, sizeof v);  // little-endian host (static_assert above)
}
template <typename T>
T get(const header_bytes& b, std::size_t off) {
    T v;
    std::memcpy(&v, b.data() + off, sizeof v);
    return v;
}

error fail(kv_error e, const std::string& path, const std::string& what) {
    return make_error(std::string(enum_name(e)), path + ": " + what);
}
kv_error errno_class(int e) {
    switch (e) {
        case ENOSPC:
        case EDQUOT:
            return kv_error::no_space;
        case EROFS:
            return kv_error::read_only;
        case EACCES:
        case EPERM:
            return kv_error::permission;
        case EIO:
            return kv_error::io_error;
        default:
            return kv_error::io;
    }
}

error fail_errno(const std::string& path, const char* call) {
    return kv_errno_error(path + ": " + call);
}

// Closes a descriptor on every path.
class fd_guard {
public:
    explicit fd_guard(int fd) : _fd(fd) {}
    ~fd_guard() {
        if (_fd >= 0) ::close(_fd);
    }
    fd_guard(const fd_guard&) = delete;
    fd_guard& operator=(const fd_guard&) = delete;
    int get() const { return _fd; }
    int release() {
        int fd = _fd;
        _fd = -1;
        return fd;
    }

private:
    int _fd;
};

std::uint64_t block_checksum(std::span<const std::uint8_t> block, std::uint32_t index) {
    return XXH3_64bits_withSeed(block.data(), block.size(), index);
}

// The bytes of an array of little-endian integers, as they go to disk.
template <typename T>
std::span<const std::uint8_t> as_bytes_of(std::span<const T> v) {
    return {reinterpret_cast<const std::uint8_t*>(v.data()), v.size_bytes()};
}

bool is_power_of_two(std::uint32_t v) {
    return v != 0 && (v & (v - 1)) == 0;
}

// Geometry within the limits (the same rule for writer and reader).
bool geometry_ok(const kv_file_geometry& g) {
    return g.n_layer >= 1 && g.n_layer <= kv_n_layer_max && g.n_head_kv >= 1 &&
           g.n_head_kv <= kv_n_head_kv_max && g.head_dim >= 1 && g.head_dim <= kv_head_dim_max &&
           is_power_of_two(g.block_tokens) && g.block_tokens <= kv_block_tokens_max &&
           (g.dtype == kv_file_dtype::f16 || g.dtype == kv_file_dtype::f32);
}

std::uint64_t layout_bytes(const kv_file_geometry& g, std::uint64_t n_blocks) {
    return kv_header_bytes + n_blocks * (4ull * g.block_tokens + 8ull + g.block_bytes());
}

header_bytes encode_header(const kv_file_header& h) {
    header_bytes b{};
    const kv_file_geometry& g = h.meta.geometry;
    std::memcpy(b.data() + off_magic, kv_magic, sizeof kv_magic);
    put<std::uint32_t>(b, off_version, kv_format_version);
    put<std::uint32_t>(b, off_header_bytes, kv_header_bytes);
    put<std::uint64_t>(b, off_fp_hi, h.meta.fingerprint.hi);
    put<std::uint64_t>(b, off_fp_lo, h.meta.fingerprint.lo);
    put<std::uint32_t>(b, off_n_layer, g.n_layer);
    put<std::uint32_t>(b, off_n_head_kv, g.n_head_kv);
    put<std::uint32_t>(b, off_head_dim, g.head_dim);
    put<std::uint32_t>(b, off_block_tokens, g.block_tokens);
    put<std::uint8_t>(b, off_dtype, static_cast<std::uint8_t>(g.dtype));
    put<std::uint8_t>(b, off_kind, static_cast<std::uint8_t>(h.meta.kind));
    put<std::uint32_t>(b, off_n_blocks, h.n_blocks);
    put<std::uint64_t>(b, off_block_bytes, g.block_bytes());
    put<std::uint64_t>(b, off_session_hash, h.meta.session_hash);
    put<std::uint64_t>(b, off_file_bytes, h.file_bytes);
    put<std::uint64_t>(b, off_tokens_checksum, h.tokens_checksum);
    put<std::uint64_t>(b, off_header_checksum, XXH3_64bits(b.data(), off_header_checksum));
    return b;
}

// Decodes a header whose magic, version and checksum are already verified; checks that its
// fields are consistent and within the limits.
result<kv_file_header> decode_header(const header_bytes& b, const std::string& path) {
    kv_file_header h;
    kv_file_geometry& g = h.meta.geometry;
    h.meta.fingerprint = {get<std::uint64_t>(b, off_fp_hi), get<std::uint64_t>(b, off_fp_lo)};
    g.n_layer = get<std::uint32_t>(b, off_n_layer);
    g.n_head_kv = get<std::uint32_t>(b, off_n_head_kv);
    g.head_dim = get<std::uint32_t>(b, off_head_dim);
    g.block_tokens = get<std::uint32_t>(b, off_block_tokens);
    g.dtype = static_cast<kv_file_dtype>(get<std::uint8_t>(b, off_dtype));
    h.meta.kind = static_cast<kv_file_kind>(get<std::uint8_t>(b, off_kind));
    h.meta.session_hash = get<std::uint64_t>(b, off_session_hash);
    h.n_blocks = get<std::uint32_t>(b, off_n_blocks);
    h.file_bytes = get<std::uint64_t>(b, off_file_bytes);
    h.tokens_checksum = get<std::uint64_t>(b, off_tokens_checksum);

    bool reserved_zero = get<std::uint16_t>(b, off_reserved0) == 0;
    for (std::size_t i = off_reserved1; i < off_header_checksum; ++i) {
        reserved_zero = reserved_zero && b[i] == 0;
    }
    auto bad = [&](const char* what) { return fail(kv_error::bad_header, path, what); };
    if (get<std::uint32_t>(b, off_header_bytes) != kv_header_bytes) return bad("header size");
    if (!reserved_zero) return bad("reserved bytes are not zero");
    if (!geometry_ok(g)) return bad("geometry beyond the limits or unknown dtype");
    if (h.meta.kind != kv_file_kind::prefix && h.meta.kind != kv_file_kind::session) {
        return bad("unknown kind");
    }
    if (h.meta.kind == kv_file_kind::prefix && h.meta.session_hash != 0) {
        return bad("a prefix file with a session hash");
    }
    if (h.n_blocks == 0 || h.n_blocks > kv_file_blocks_max ||
        std::uint64_t{h.n_blocks} * g.block_tokens > kv_file_tokens_max) {
        return bad("block count beyond the limits");
    }
    if (get<std::uint64_t>(b, off_block_bytes) != g.block_bytes()) {
        return bad("block bytes disagree with the geometry");
    }
    if (h.file_bytes != layout_bytes(g, h.n_blocks) || h.file_bytes > kv_file_bytes_max) {
        return bad("file size disagrees with the layout or exceeds the limit");
    }
    return h;
}

// Opens a regular file for reading: never follows a symlink, refuses anything but a regular
// file (O_NONBLOCK so a fifo cannot block the open). Returns the descriptor and its size.
struct opened {
    int fd;
    std::uint64_t size;
};
result<opened> open_regular(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        if (errno == ELOOP) return fail(kv_error::not_regular, path, "a symbolic link");
        return fail_errno(path, "open");
    }
    fd_guard guard(fd);
    struct stat st {};
    if (::fstat(fd, &st) != 0) return fail_errno(path, "fstat");
    if (!S_ISREG(st.st_mode)) return fail(kv_error::not_regular, path, "not a regular file");
    return opened{guard.release(), static_cast<std::uint64_t>(st.st_size)};
}

// Reads exactly dst.size() bytes at `offset`; a short file is kv_truncated.
status read_exact(int fd, std::uint64_t offset, std::span<std::uint8_t> dst,
                  const std::string& path) {
    std::size_t done = 0;
    while (done < dst.size()) {
        const std::size_t want = std::min(dst.size() - done, kv_io_chunk_bytes);
        const ssize_t n = ::pread(fd, dst.data() + done, want, static_cast<off_t>(offset + done));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return fail_errno(path, "pread");
        if (n == 0) return fail(kv_error::truncated, path, "ends inside a region");
        done += static_cast<std::size_t>(n);
    }
    return {};
}

status write_exact(int fd, std::span<const std::uint8_t> src, const std::string& path) {
    std::size_t done = 0;
    while (done < src.size()) {
        const std::size_t want = std::min(src.size() - done, kv_io_chunk_bytes);
        const ssize_t n = ::write(fd, src.data() + done, want);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return fail_errno(path, "write");
        done += static_cast<std::size_t>(n);
    }
    return {};
}

bool is_stem_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
}
bool valid_stem(std::string_view stem) {
    if (stem.empty() || stem.size() > kv_name_bytes_max) return false;
    for (char c : stem) {
        if (!is_stem_char(c)) return false;
    }
    return true;
}

std::string base_name(const std::string& path) {
    const std::size_t slash = path.rfind('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string hex128(XXH128_hash_t h) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string s(32, '0');
    for (int i = 0; i < 16; ++i) {
        s[i] = digits[(h.high64 >> (60 - 4 * i)) & 0xf];
        s[16 + i] = digits[(h.low64 >> (60 - 4 * i)) & 0xf];
    }
    return s;
}

// XXH3-128 over (tag, fingerprint hi, lo, bytes).
XXH128_hash_t tagged_hash(std::string_view tag, const model::fingerprint& fp, const void* data,
                          std::size_t size) {
    // The state's layout is private to the shared library: allocate it there.
    std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state(XXH3_createState(),
                                                                          XXH3_freeState);
    assert(state);
    XXH3_128bits_reset(state.get());
    XXH3_128bits_update(state.get(), tag.data(), tag.size());
    const std::uint64_t words[2] = {fp.hi, fp.lo};
    XXH3_128bits_update(state.get(), words, sizeof words);
    XXH3_128bits_update(state.get(), data, size);
    return XXH3_128bits_digest(state.get());
}

}  // namespace

error kv_errno_error(const std::string& what) {
    const int e = errno;
    return make_error(std::string(enum_name(errno_class(e))), what + ": " + std::strerror(e));
}

std::uint64_t kv_file_geometry::block_bytes() const {
    const std::uint64_t elem = dtype == kv_file_dtype::f16 ? 2 : 4;
    return 2ull * n_layer * n_head_kv * block_tokens * head_dim * elem;
}

// ---- Names --------------------------------------------------------------------------------------

std::string kv_prefix_name(const model::fingerprint& fp, std::span<const std::int32_t> tokens) {
    return "p-" + hex128(tagged_hash(prefix_name_tag, fp, tokens.data(), tokens.size_bytes()));
}

status validate_session_name(std::string_view session) {
    if (session.empty() || session.size() > kv_session_bytes_max) {
        return make_error(std::string(enum_name(kv_error::bad_session)),
                          "session name must be 1..128 bytes");
    }
    for (char c : session) {
        const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                        (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
        if (!ok) {
            return make_error(std::string(enum_name(kv_error::bad_session)),
                              "session name must be made of [A-Za-z0-9._-]");
        }
    }
    return {};
}

result<std::string> kv_session_name(const model::fingerprint& fp, std::string_view session) {
    if (auto s = validate_session_name(session); !s) return s.err();
    return "s-" + hex128(tagged_hash(session_name_tag, fp, session.data(), session.size()));
}

std::uint64_t kv_session_hash(std::string_view session) {
    return XXH3_64bits(session.data(), session.size());
}

kv_dir_entry classify_kv_dir_entry(std::string_view file_name) {
    if (file_name.size() > kv_file_suffix.size() && file_name.ends_with(kv_file_suffix) &&
        valid_stem(file_name.substr(0, file_name.size() - kv_file_suffix.size()))) {
        return kv_dir_entry::kv_file;
    }
    if (file_name.size() > kv_tmp_suffix.size() && file_name.ends_with(kv_tmp_suffix)) {
        std::string_view base = file_name.substr(0, file_name.size() - kv_tmp_suffix.size());
        // "<stem>.<writer>" or "<stem>"
        if (const std::size_t dot = base.rfind('.'); dot != std::string_view::npos) {
            if (!valid_writer_tag(base.substr(dot + 1))) return kv_dir_entry::foreign;
            base = base.substr(0, dot);
        }
        if (valid_stem(base)) return kv_dir_entry::tmp_leftover;
    }
    return kv_dir_entry::foreign;
}

std::string kv_writer_tag() {
    std::random_device rd;
    const std::uint64_t now =
        static_cast<std::uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
    const std::array<std::uint64_t, 4> seed = {(std::uint64_t{rd()} << 32) ^ rd(), now,
                                               static_cast<std::uint64_t>(::getpid()),
                                               reinterpret_cast<std::uintptr_t>(&seed)};
    char out[17];
    std::snprintf(out, sizeof out, "%016llx",
                  static_cast<unsigned long long>(XXH3_64bits(seed.data(), sizeof seed)));
    return out;
}

bool valid_writer_tag(std::string_view tag) {
    return !tag.empty() && tag.size() <= kv_writer_tag_bytes_max &&
           std::all_of(tag.begin(), tag.end(),
                       [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::uint64_t kv_tokens_checksum(std::span<const std::int32_t> tokens) {
    return XXH3_64bits(tokens.data(), tokens.size_bytes());
}

// ---- Write --------------------------------------------------------------------------------------

namespace {

status check_write_args(const std::string& path, std::string_view name, const kv_file_meta& meta,
                        std::span<const std::int32_t> tokens,
                        std::span<const std::uint8_t> blocks) {
    auto bad = [&](const char* what) { return fail(kv_error::bad_request, path, what); };
    if (!valid_stem(name)) return fail(kv_error::bad_name, path, "invalid file stem");
    const kv_file_geometry& g = meta.geometry;
    if (!geometry_ok(g)) return bad("geometry beyond the limits");
    if (meta.kind != kv_file_kind::prefix && meta.kind != kv_file_kind::session) {
        return bad("unknown kind");
    }
    if (meta.kind == kv_file_kind::prefix && meta.session_hash != 0) {
        return bad("a prefix with a session hash");
    }
    if (tokens.empty() || tokens.size() > kv_file_tokens_max ||
        tokens.size() % g.block_tokens != 0) {
        return bad("tokens must be a whole number of full blocks, within the limit");
    }
    const std::uint64_t n_blocks = tokens.size() / g.block_tokens;
    if (blocks.size() != n_blocks * g.block_bytes())
        return bad("blocks size != n_blocks x block_bytes");
    if (layout_bytes(g, n_blocks) > kv_file_bytes_max) return bad("file beyond kv_file_bytes_max");
    return {};
}

// Writes the whole file to an open descriptor; `stop` cuts it short as a crash would.
status write_body(int fd, const kv_file_header& h, std::span<const std::int32_t> tokens,
                  std::span<const std::uint64_t> table, std::span<const std::uint8_t> blocks,
                  kv_write_stop stop, const std::string& path) {
    const header_bytes hb = encode_header(h);
    if (auto s = write_exact(fd, hb, path); !s) return s;
    if (auto s = write_exact(fd, as_bytes_of(tokens), path); !s) return s;
    if (auto s = write_exact(fd, as_bytes_of(table), path); !s) return s;
    switch (stop) {
        case kv_write_stop::none:
        case kv_write_stop::before_rename:
            return write_exact(fd, blocks, path);
        case kv_write_stop::mid_tmp:
            return write_exact(fd, blocks.first(blocks.size() / 2), path);
        case kv_write_stop::enospc_mid_tmp:
        case kv_write_stop::eio_mid_tmp:
            break;
    }
    // An injected disk fault: half the blocks reach the file, then the next write(2) "fails"
    // and the error is built from errno exactly as write_exact builds a real one.
    if (auto s = write_exact(fd, blocks.first(blocks.size() / 2), path); !s) return s;
    errno = stop == kv_write_stop::enospc_mid_tmp ? ENOSPC : EIO;
    return fail_errno(path, "write");
}

}  // namespace

status write_kv_file(const std::string& dir, std::string_view name, const kv_file_meta& meta,
                     std::span<const std::int32_t> tokens, std::span<const std::uint8_t> blocks,
                     kv_write_stop stop, std::string_view writer) {
    const std::string stem(name);
    if (!writer.empty() && !valid_writer_tag(writer)) {
        return fail(kv_error::bad_name, dir + "/" + stem, "invalid writer tag");
    }
    const std::string tmp_name =
        stem + (writer.empty() ? "" : "." + std::string(writer)) + std::string(kv_tmp_suffix);
    const std::string kv_name = stem + std::string(kv_file_suffix);
    const std::string tmp_path = dir + "/" + tmp_name;
    if (auto s = check_write_args(tmp_path, name, meta, tokens, blocks); !s) return s;

    // Checksums right before the write (pair assertion with the readers).
    kv_file_header h;
    h.meta = meta;
    h.n_blocks = static_cast<std::uint32_t>(tokens.size() / meta.geometry.block_tokens);
    h.tokens_checksum = kv_tokens_checksum(tokens);
    h.file_bytes = layout_bytes(meta.geometry, h.n_blocks);
    const std::uint64_t bb = meta.geometry.block_bytes();
    std::vector<std::uint64_t> table(h.n_blocks);
    for (std::uint32_t i = 0; i < h.n_blocks; ++i) {
        table[i] = block_checksum(blocks.subspan(i * bb, bb), i);
    }

    fd_guard dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (dfd.get() < 0) return fail_errno(dir, "open dir");
    // A leftover .tmp (a crash, or a symlink planted there) is removed, then created afresh:
    // O_EXCL | O_NOFOLLOW never write through a link.
    if (::unlinkat(dfd.get(), tmp_name.c_str(), 0) != 0 && errno != ENOENT) {
        return fail_errno(tmp_path, "unlink leftover");
    }
    fd_guard fd(::openat(dfd.get(), tmp_name.c_str(),
                         O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (fd.get() < 0) return fail_errno(tmp_path, "open");
    status written = write_body(fd.get(), h, tokens, table, blocks, stop, tmp_path);
    const bool crash_mid_tmp = stop == kv_write_stop::mid_tmp;
    if (written && !crash_mid_tmp && ::fsync(fd.get()) != 0) {
        written = fail_errno(tmp_path, "fsync");
    }
    if (!written) {
        ::unlinkat(dfd.get(), tmp_name.c_str(), 0);
        return written;
    }
    if (stop != kv_write_stop::none) return {};  // the "crash": .tmp stays, nothing renamed
    if (::renameat(dfd.get(), tmp_name.c_str(), dfd.get(), kv_name.c_str()) != 0) {
        status s = fail_errno(tmp_path, "rename");
        ::unlinkat(dfd.get(), tmp_name.c_str(), 0);
        return s;
    }
    if (::fsync(dfd.get()) != 0) return fail_errno(dir, "fsync dir");
    return {};
}

// ---- Read ---------------------------------------------------------------------------------------

namespace {

status check_kv_path(const std::string& path) {
    if (classify_kv_dir_entry(base_name(path)) != kv_dir_entry::kv_file) {
        return fail(kv_error::bad_name, path, "not a <stem>.kv file name");
    }
    return {};
}

// Header bytes from an open file, with magic, version and checksum verified (right after the
// read).
result<header_bytes> read_verified_header(int fd, std::uint64_t size, const std::string& path) {
    if (size == 0) return fail(kv_error::truncated, path, "empty file");
    if (size < kv_header_bytes) return fail(kv_error::truncated, path, "shorter than the header");
    header_bytes b{};
    if (auto s = read_exact(fd, 0, b, path); !s) return s.err();
    if (std::memcmp(b.data() + off_magic, kv_magic, sizeof kv_magic) != 0) {
        return fail(kv_error::bad_magic, path, "bad magic");
    }
    const auto version = get<std::uint32_t>(b, off_version);
    if (version != kv_format_version) {
        return fail(kv_error::version, path,
                    "format version " + std::to_string(version) + ", this build reads " +
                        std::to_string(kv_format_version));
    }
    if (XXH3_64bits(b.data(), off_header_checksum) != get<std::uint64_t>(b, off_header_checksum)) {
        return fail(kv_error::header_checksum, path, "header checksum mismatch");
    }
    return b;
}

status compare_expect(const kv_file_header& h, const kv_expect& e, const std::string& path) {
    const kv_file_geometry& g = h.meta.geometry;
    const kv_file_geometry& x = e.geometry;
    if (h.meta.fingerprint != e.fingerprint) {
        return fail(kv_error::fingerprint, path,
                    "model " + h.meta.fingerprint.hex() + ", loaded " + e.fingerprint.hex());
    }
    if (g.n_layer != x.n_layer || g.n_head_kv != x.n_head_kv || g.head_dim != x.head_dim) {
        return fail(kv_error::geometry, path, "n_layer/n_head_kv/head_dim differ");
    }
    if (g.dtype != x.dtype) return fail(kv_error::dtype, path, "kv dtype differs");
    if (g.block_tokens != x.block_tokens) {
        return fail(kv_error::block_tokens, path,
                    "block_tokens " + std::to_string(g.block_tokens) + ", expected " +
                        std::to_string(x.block_tokens));
    }
    return {};
}

// An open <stem>.kv file and its header bytes, magic, version and checksum verified. The caller
// owns `file.fd`.
struct opened_header {
    opened file;
    header_bytes bytes;
};
result<opened_header> open_verified(const std::string& path) {
    if (auto s = check_kv_path(path); !s) return s.err();
    auto f = open_regular(path);
    if (!f) return f.err();
    fd_guard guard(f->fd);
    auto b = read_verified_header(f->fd, f->size, path);
    if (!b) return b.err();
    guard.release();
    return opened_header{*f, *b};
}

// The size on disk against the size the header promises.
status check_size(std::uint64_t size, const kv_file_header& h, const std::string& path) {
    const std::string sizes =
        std::to_string(size) + " bytes, header says " + std::to_string(h.file_bytes);
    if (size < h.file_bytes) return fail(kv_error::truncated, path, sizes);
    if (size > h.file_bytes) return fail(kv_error::oversize, path, sizes);
    return {};
}

// Opens the file and checks that its header is still exactly `h` and its size h.file_bytes.
result<opened> reopen_same(const std::string& path, const kv_file_header& h) {
    auto o = open_verified(path);
    if (!o) return o.err();
    fd_guard guard(o->file.fd);
    if (o->bytes != encode_header(h)) {
        return fail(kv_error::changed, path, "header changed since read");
    }
    if (auto s = check_size(o->file.size, h, path); !s) return s.err();
    guard.release();
    return o->file;
}

}  // namespace

result<kv_file_header> read_kv_header_any(const std::string& path) {
    auto o = open_verified(path);
    if (!o) return o.err();
    fd_guard guard(o->file.fd);
    auto h = decode_header(o->bytes, path);
    if (!h) return h.err();
    if (auto s = check_size(o->file.size, *h, path); !s) return s.err();
    return h;
}

result<kv_file_header> read_kv_header(const std::string& path, const kv_expect& expect) {
    auto h = read_kv_header_any(path);
    if (!h) return h.err();
    if (auto s = compare_expect(*h, expect, path); !s) return s.err();
    return h;
}

result<std::vector<std::int32_t>> read_kv_tokens(const std::string& path,
                                                 const kv_file_header& header) {
    auto f = reopen_same(path, header);
    if (!f) return f.err();
    fd_guard guard(f->fd);
    std::vector<std::int32_t> tokens(header.n_tokens());
    std::span<std::uint8_t> dst(reinterpret_cast<std::uint8_t*>(tokens.data()),
                                tokens.size() * sizeof(std::int32_t));
    if (auto s = read_exact(f->fd, header.tokens_offset(), dst, path); !s) return s.err();
    // Right after the read.
    if (kv_tokens_checksum(tokens) != header.tokens_checksum) {
        return fail(kv_error::tokens_checksum, path, "token ids checksum mismatch");
    }
    return tokens;
}

status read_kv_blocks(const std::string& path, const kv_file_header& header,
                      std::uint32_t first_block, std::uint32_t n_blocks,
                      std::span<std::uint8_t> dst, kv_read_fault fault) {
    const std::uint64_t bb = header.meta.geometry.block_bytes();
    if (n_blocks == 0 || first_block > header.n_blocks ||
        n_blocks > header.n_blocks - first_block || dst.size() != n_blocks * bb) {
        return fail(kv_error::bad_request, path, "block range or destination size");
    }
    auto f = reopen_same(path, header);
    if (!f) return f.err();
    fd_guard guard(f->fd);
    std::vector<std::uint64_t> table(n_blocks);
    std::span<std::uint8_t> table_dst(reinterpret_cast<std::uint8_t*>(table.data()),
                                      table.size() * sizeof(std::uint64_t));
    if (auto s = read_exact(f->fd, header.table_offset() + 8ull * first_block, table_dst, path);
        !s) {
        return s;
    }
    if (auto s = read_exact(f->fd, header.payload_offset() + first_block * bb, dst, path); !s) {
        return s;
    }
    if (fault == kv_read_fault::flip_bit) dst[dst.size() / 2] ^= 1u;  // an injected bad read
    // Right after the read: every block against its table entry (seeded by its index, so a
    // block moved to another slot fails too).
    for (std::uint32_t i = 0; i < n_blocks; ++i) {
        const std::uint32_t index = first_block + i;
        if (block_checksum(dst.subspan(i * bb, bb), index) != table[i]) {
            return fail(kv_error::block_checksum, path,
                        "block " + std::to_string(index) + " of " +
                            std::to_string(header.n_blocks) + " checksum mismatch");
        }
    }
    return {};
}

}  // namespace ordo::kv
