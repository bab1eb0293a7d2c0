// kv_file.hpp: the on-disk format of one persisted KV prefix, its atomic writer, its validating
// readers and the names of its files. Pure functions over files: no actor, no Vulkan, no global
// state. The kv actor calls them from its own thread; tests call them directly.
//
// ## Why this format is paranoid (ARCHITECTURE.md F7)
// A server killed while persisting KV, then restarted with a stale cache, failed every prefill
// and retried forever. So a file carries everything needed to refuse it before its bytes reach
// the GPU: the model fingerprint, the KV geometry and dtype, a header checksum, a checksum of
// its token ids and one checksum per block. It is written to `<name>.tmp`, fsynced, renamed to
// `<name>.kv` and the directory fsynced, so a crash at any instant leaves the old file or the
// new one, never a torn `.kv`. Every refusal has its own error code, so the startup scan can
// count why each file was quarantined.
//
// ## Layout (little-endian; docs/kv-format.md has the table and the reasons)
//   [0, 128)            header, fixed size; its last 8 bytes are XXH3-64 of the first 120
//   [128, +4*n_tokens)  token ids of the prefix, int32, n_tokens = n_blocks * block_tokens
//   then 8*n_blocks     block checksum table: entry i = XXH3-64(block i bytes, seed = i)
//   then n_blocks * block_bytes   the blocks, each exactly as gpu::runner::read_kv_blocks lays
//                       it out: for each layer, K bytes then V bytes, (head, slot, dim)
//                       row-major, f16 or f32 elements
// Nothing is optional and there is no padding: the header alone fixes every offset and the
// file's exact size, which is checked against the size on disk.
//
// ## Pair assertions
// Checksums are computed right before the write (write_kv_file) and verified right after the
// read (read_kv_header / read_kv_header_any: header; read_kv_tokens: ids; read_kv_blocks: each
// block it returns).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "actors/runtime/enum_names.hpp"
#include "actors/runtime/result.hpp"
#include "model/fingerprint.hpp"

namespace ordo::kv {

// ---- Format constants ------------------------------------------------------------------------

// Bumped on any change of layout or meaning; a reader refuses every other version (kv_version).
inline constexpr std::uint32_t kv_format_version = 1;
inline constexpr std::size_t kv_header_bytes = 128;
// "ORDOKV\r\n": the CR LF pair catches a file mangled by a text-mode copy.
inline constexpr char kv_magic[8] = {'O', 'R', 'D', 'O', 'K', 'V', '\r', '\n'};
inline constexpr std::string_view kv_file_suffix = ".kv";
inline constexpr std::string_view kv_tmp_suffix = ".tmp";

// ---- Limits: a header that claims more is refused (kv_bad_header) before anything is read ------

// A prefix is at most one sequence: prompt_tokens_max + max_tokens_max (scheduler_msgs.hpp).
inline constexpr std::uint32_t kv_file_tokens_max = 1u << 21;
// Blocks of at least one token each.
inline constexpr std::uint32_t kv_file_blocks_max = kv_file_tokens_max;
// 64 GiB: far above kv.bytes_budget's useful range, low enough that no size computation from a
// bounded header can overflow 64 bits.
inline constexpr std::uint64_t kv_file_bytes_max = std::uint64_t{1} << 36;
// Geometry bounds, generous for Llama-family models; they keep block_bytes() far from overflow.
inline constexpr std::uint32_t kv_n_layer_max = 1024;
inline constexpr std::uint32_t kv_n_head_kv_max = 1024;
inline constexpr std::uint32_t kv_head_dim_max = 1024;
inline constexpr std::uint32_t kv_block_tokens_max = 256;  // config's gpu.kv_block_tokens bound
// Session names as the front door accepts them (sched::session_bytes_max, net/ops.cpp).
inline constexpr std::size_t kv_session_bytes_max = 128;
// A file name stem (without suffix) as this library builds them: "p-" or "s-" + 32 hex digits.
inline constexpr std::size_t kv_name_bytes_max = 64;
// One read/write syscall moves at most this much (a short count is retried).
inline constexpr std::size_t kv_io_chunk_bytes = std::size_t{8} << 20;

// ---- Errors -----------------------------------------------------------------------------------

// Every way a file is refused. kv_error_names gives the stable snake_case code of ordo::error.
enum class kv_error : std::uint8_t {
    io,  // a syscall failed (open, read, write, fsync, rename): errno in the message
    // The same, for the errno values that mean the disk, not the file, is at fault: the kv
    // actor turns persistence off on them (kv_disk_fault).
    no_space,         // ENOSPC, EDQUOT
    read_only,        // EROFS
    permission,       // EACCES, EPERM
    io_error,         // EIO
    not_regular,      // a symlink, directory, fifo, ...: never opened as a KV file
    bad_name,         // not a "<stem>.kv" path with a valid stem (a leftover .tmp included)
    bad_request,      // write_kv_file / read_kv_blocks called with inconsistent arguments
    truncated,        // shorter than the header, or than the size the header promises
    oversize,         // longer than the size the header promises
    bad_magic,        // not a KV file at all
    version,          // a format version this build does not read (newer or older)
    header_checksum,  // header bytes corrupt
    bad_header,       // checksum fine but the fields are inconsistent or beyond the limits
    fingerprint,      // written for another model
    geometry,         // n_layer / n_head_kv / head_dim differ from the loaded model's
    dtype,            // f16 vs f32 differ from gpu.kv_dtype
    block_tokens,     // block size differs from gpu.kv_block_tokens
    tokens_checksum,  // token ids corrupt
    block_checksum,   // one block's bytes (or its table entry) corrupt; the message names it
    changed,          // the file on disk is no longer the one whose header was read
    bad_session,      // a session name outside 1..128 bytes of [A-Za-z0-9._-]
};
// clang-format off
inline constexpr std::array<std::string_view, 22> kv_error_names = {
    "kv_io",              "kv_no_space",       "kv_read_only",   "kv_permission",
    "kv_io_error",        "kv_not_regular",    "kv_bad_name",    "kv_bad_request",
    "kv_truncated",       "kv_oversize",       "kv_bad_magic",   "kv_version",
    "kv_header_checksum", "kv_bad_header",     "kv_fingerprint", "kv_geometry",
    "kv_dtype",           "kv_block_tokens",   "kv_tokens_checksum", "kv_block_checksum",
    "kv_changed",         "kv_bad_session"};
// clang-format on
constexpr const auto& names_of(kv_error) {
    return kv_error_names;
}
static_assert(static_cast<std::size_t>(kv_error::bad_session) + 1 == kv_error_names.size(),
              "kv_error_names names every kv_error, in order");
// The kv_error an error of this library names. Every error it returns has one of these codes;
// a code it does not name (none is made) counts as the generic io.
inline kv_error kv_error_of(const error& e) {
    return enum_from_name<kv_error>(e.code).value_or(kv_error::io);
}
// Whether the disk, not the file, is at fault (the four errno classes above).
constexpr bool kv_disk_fault(kv_error e) {
    return e == kv_error::no_space || e == kv_error::read_only || e == kv_error::permission ||
           e == kv_error::io_error;
}
// The error for the current errno after a failed syscall: its class's code (kv_no_space, ...,
// kv_io) and "what: strerror". Every file operation of the kv library and actor reports this way.
error kv_errno_error(const std::string& what);

// ---- Header -----------------------------------------------------------------------------------

// On-disk values, fixed forever for version 1 (not config's enum: its order may change).
enum class kv_file_dtype : std::uint8_t { f16 = 0, f32 = 1 };
// kv_file_kind is also what a kv_save asks for (kv_msgs.hpp): an automatic prefix or a session.
enum class kv_file_kind : std::uint8_t { prefix = 0, session = 1 };
inline constexpr std::array<std::string_view, 2> kv_file_kind_names = {"prefix", "session"};
constexpr const auto& names_of(kv_file_kind) {
    return kv_file_kind_names;
}

struct kv_file_geometry {
    std::uint32_t n_layer = 0;
    std::uint32_t n_head_kv = 0;
    std::uint32_t head_dim = 0;
    std::uint32_t block_tokens = 0;  // power of two, <= kv_block_tokens_max
    kv_file_dtype dtype = kv_file_dtype::f16;

    // Bytes of one block for all layers, K and V: runner::kv_block_bytes().
    std::uint64_t block_bytes() const;
    bool operator==(const kv_file_geometry&) const = default;
};

// What the caller states about a file it writes.
struct kv_file_meta {
    model::fingerprint fingerprint;
    kv_file_geometry geometry;
    kv_file_kind kind = kv_file_kind::prefix;
    std::uint64_t session_hash = 0;  // kv_session_hash(name) for a session; 0 for a prefix
    bool operator==(const kv_file_meta&) const = default;
};

// What the loaded model and config expect of a file (compared by read_kv_header).
struct kv_expect {
    model::fingerprint fingerprint;
    kv_file_geometry geometry;
};

// A validated header, as read_kv_header returns it.
struct kv_file_header {
    kv_file_meta meta;
    std::uint32_t n_blocks = 0;         // >= 1
    std::uint64_t tokens_checksum = 0;  // XXH3-64 of the token ids' bytes
    std::uint64_t file_bytes = 0;       // the exact size of the file

    std::uint32_t n_tokens() const { return n_blocks * meta.geometry.block_tokens; }
    std::uint64_t tokens_offset() const { return kv_header_bytes; }
    std::uint64_t table_offset() const { return tokens_offset() + 4ull * n_tokens(); }
    std::uint64_t payload_offset() const { return table_offset() + 8ull * n_blocks; }
    bool operator==(const kv_file_header&) const = default;
};

// ---- Names ------------------------------------------------------------------------------------

// File stem of an automatic prefix: "p-" + 32 hex digits of XXH3-128(tag, fingerprint, token
// ids). Deterministic across runs and machines.
std::string kv_prefix_name(const model::fingerprint& fp, std::span<const std::int32_t> tokens);
// File stem of a named session: "s-" + 32 hex digits of XXH3-128(tag, fingerprint, name). The
// raw name never reaches the file system. Error: kv_bad_session.
result<std::string> kv_session_name(const model::fingerprint& fp, std::string_view session);
// The header's session_hash: XXH3-64 of the name (the name itself is not stored).
std::uint64_t kv_session_hash(std::string_view session);
// 1..kv_session_bytes_max bytes of [A-Za-z0-9._-]. Error: kv_bad_session.
status validate_session_name(std::string_view session);

// What a directory entry of the kv dir is, by its name alone (the startup scan).
enum class kv_dir_entry : std::uint8_t {
    kv_file,  // "<stem>.kv": validate with read_kv_header
    // "<stem>.tmp" or "<stem>.<writer>.tmp": a write not renamed yet (or never: a crash); never
    // read
    tmp_leftover,
    foreign,  // anything else: leave alone
};
kv_dir_entry classify_kv_dir_entry(std::string_view file_name);

// A writer tag: 16 hex digits, random per call (a process draws one at start). Several servers
// sharing one kv dir ([kv] shared) each write their `.tmp` files under their own tag, so no
// writer ever removes or overwrites another's file in the making; the rename that publishes a
// file is atomic, so the last writer's complete file wins.
std::string kv_writer_tag();
// Whether `tag` can name a writer in a `.tmp` name: 1..kv_writer_tag_bytes_max of [0-9a-f].
bool valid_writer_tag(std::string_view tag);
inline constexpr std::size_t kv_writer_tag_bytes_max = 32;

// XXH3-64 of the token ids' bytes: the header's tokens_checksum for these ids.
std::uint64_t kv_tokens_checksum(std::span<const std::int32_t> tokens);

// ---- Write ------------------------------------------------------------------------------------

// Where a test (or an armed `fault`, docs/protocol.md) stops the write protocol. Production
// passes none. The crash stops return ok with the .tmp left behind, as a process killed there
// would leave it; the failing ones take the protocol's own error path (the .tmp is removed and
// the error is the one a real write(2) failing with that errno gives).
enum class kv_write_stop : std::uint8_t {
    none,
    mid_tmp,         // half of <name>.tmp written, nothing synced, no rename
    before_rename,   // <name>.tmp complete and fsynced, no rename
    enospc_mid_tmp,  // half of <name>.tmp written, then write fails with ENOSPC: kv_no_space
    eio_mid_tmp,     // half of <name>.tmp written, then write fails with EIO: kv_io_error
};

// Writes `<dir>/<name>.kv` atomically: `<name>.tmp` (or `<name>.<writer>.tmp` with a writer
// tag; replacing a leftover of the same name), fsync, rename, fsync of the directory. `tokens`
// is n_blocks * block_tokens ids; `blocks` is n_blocks * block_bytes bytes in
// runner::read_kv_blocks layout. `name` is a stem from kv_prefix_name or kv_session_name.
// Errors: kv_bad_name (also a bad writer tag), kv_bad_request (sizes, limits, geometry), kv_io.
status write_kv_file(const std::string& dir, std::string_view name, const kv_file_meta& meta,
                     std::span<const std::int32_t> tokens, std::span<const std::uint8_t> blocks,
                     kv_write_stop stop = kv_write_stop::none, std::string_view writer = {});

// ---- Read -------------------------------------------------------------------------------------

// Reads and validates the header alone, without a model to compare it with (an operator's
// `ordo-model kv-inspect`). In order: kv_bad_name, kv_not_regular, kv_io, kv_truncated (incl.
// empty), kv_bad_magic, kv_version, kv_header_checksum, kv_bad_header, kv_truncated /
// kv_oversize (size on disk vs header). A header it returns may belong to any model.
result<kv_file_header> read_kv_header_any(const std::string& path);

// read_kv_header_any, then compares the header with `expect`: kv_fingerprint, kv_geometry,
// kv_dtype, kv_block_tokens. What a loader calls.
result<kv_file_header> read_kv_header(const std::string& path, const kv_expect& expect);

// Reads the prefix's token ids and verifies their checksum. Errors: those of opening,
// kv_changed, kv_truncated, kv_tokens_checksum.
result<std::vector<std::int32_t>> read_kv_tokens(const std::string& path,
                                                 const kv_file_header& header);

// What an armed `fault` does to a read, between the read and its verification. Production
// passes none.
enum class kv_read_fault : std::uint8_t {
    none,
    flip_bit,  // one bit of the blocks read is flipped (bit 0 of dst's middle byte)
};

// Reads blocks [first_block, first_block + n_blocks) into dst (n_blocks * block_bytes bytes)
// and verifies each block's checksum right after the read. Errors: kv_bad_request, opening
// errors, kv_changed (header on disk differs from `header`), kv_truncated, kv_block_checksum
// (the message names the first bad block; dst's contents are then unspecified).
status read_kv_blocks(const std::string& path, const kv_file_header& header,
                      std::uint32_t first_block, std::uint32_t n_blocks,
                      std::span<std::uint8_t> dst, kv_read_fault fault = kv_read_fault::none);

}  // namespace ordo::kv
