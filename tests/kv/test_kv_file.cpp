// test_kv_file.cpp: the persisted KV file format (kv/kv_file.hpp), on real files in a fresh
// temporary directory per test.
//
// Checks: random blocks round-trip bit-identical for f16 and f32 geometry (whole file and a
// sub-range); a flipped bit in every bit of the header is refused with a header error; a flipped
// bit at random offsets past the header is caught by the token checksum or by exactly the block
// it lands in (payload or checksum table entry), never accepted; truncation at every region
// boundary and at random offsets is kv_truncated, one byte more is kv_oversize, an empty file is
// kv_truncated; another fingerprint, geometry, dtype, block size and a newer version are each
// refused with their own code, while read_kv_header_any (no model to compare with) accepts a
// valid file of any model and still refuses a corrupt header or a wrong size; symlinks,
// directories and fifos are refused (kv_not_regular); a write that "crashed" (mid .tmp, or
// before the rename) leaves the old .kv loading and the .tmp never readable; an injected ENOSPC
// or EIO half-way through the .tmp fails with kv_no_space / kv_io_error (disk faults), removes
// the .tmp and leaves the old .kv loading; an injected read bit flip is caught by the checksum
// of the block it lands in and leaves the file intact; a file replaced
// after its header was read is kv_changed; a writer tag puts the .tmp under the writer's own
// name (a crash leaves that name, another writer's .tmp is never touched, a bad tag is refused);
// bad write arguments are refused; file names are
// stable (golden values), distinct and never hold the raw session name. Seeded RNG, small
// geometry: the whole suite runs in well under a second.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kv/kv_file.hpp"

namespace {

using namespace ordo::kv;
using ordo::status;
namespace fs = std::filesystem;

constexpr std::uint64_t test_seed = 0x6b76'6669'6c65;  // "kvfile"
constexpr int payload_flips = 300;
constexpr int random_truncations = 60;

const ordo::model::fingerprint fp_a{0x0123456789abcdefull, 0xfedcba9876543210ull};
const ordo::model::fingerprint fp_b{0x0123456789abcdefull, 0xfedcba9876543211ull};

kv_file_geometry small_geometry(kv_file_dtype dtype) {
    return kv_file_geometry{
        .n_layer = 2, .n_head_kv = 2, .head_dim = 8, .block_tokens = 4, .dtype = dtype};
}

std::string code(kv_error e) {
    return std::string(ordo::enum_name(e));
}

std::vector<std::uint8_t> slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void spit(const std::string& path, std::span<const std::uint8_t> bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
}

// A file's content, written by write_kv_file into a fresh directory.
class kv_file_test : public ::testing::Test {
protected:
    void SetUp() override {
        std::string tmpl = (fs::temp_directory_path() / "ordo-kv-test-XXXXXX").string();
        ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
        _dir = tmpl;
        _rng.seed(test_seed);
    }
    void TearDown() override { fs::remove_all(_dir); }

    // Fills tokens and blocks with random content for n_blocks of geometry g.
    void make_content(const kv_file_geometry& g, std::uint32_t n_blocks) {
        _tokens.resize(std::size_t{n_blocks} * g.block_tokens);
        for (auto& t : _tokens) t = static_cast<std::int32_t>(_rng() % 32000);
        _blocks.resize(n_blocks * g.block_bytes());
        for (auto& b : _blocks) b = static_cast<std::uint8_t>(_rng());
        _meta = kv_file_meta{.fingerprint = fp_a, .geometry = g};
        _expect = kv_expect{.fingerprint = fp_a, .geometry = g};
        _name = kv_prefix_name(fp_a, _tokens);
        _path = _dir + "/" + _name + ".kv";
    }
    void write_good(const kv_file_geometry& g, std::uint32_t n_blocks) {
        make_content(g, n_blocks);
        ASSERT_TRUE(write_kv_file(_dir, _name, _meta, _tokens, _blocks));
    }
    // Every check a loader makes, in order; returns the first error code ("" when all pass).
    std::string load_all(std::vector<std::uint8_t>* blocks_out = nullptr) {
        auto h = read_kv_header(_path, _expect);
        if (!h) return h.err().code;
        auto t = read_kv_tokens(_path, *h);
        if (!t) return t.err().code;
        std::vector<std::uint8_t> dst(h->n_blocks * h->meta.geometry.block_bytes());
        if (auto s = read_kv_blocks(_path, *h, 0, h->n_blocks, dst); !s) return s.err().code;
        if (blocks_out) *blocks_out = std::move(dst);
        return "";
    }

    std::string _dir;
    std::mt19937_64 _rng;
    std::vector<std::int32_t> _tokens;
    std::vector<std::uint8_t> _blocks;
    kv_file_meta _meta;
    kv_expect _expect;
    std::string _name;
    std::string _path;
};

TEST_F(kv_file_test, round_trip_f16_is_bit_identical) {
    write_good(small_geometry(kv_file_dtype::f16), 5);
    auto h = read_kv_header(_path, _expect);
    ASSERT_TRUE(h) << h.err().message;
    EXPECT_EQ(h->meta, _meta);
    EXPECT_EQ(h->n_blocks, 5u);
    EXPECT_EQ(h->file_bytes, fs::file_size(_path));
    auto tokens = read_kv_tokens(_path, *h);
    ASSERT_TRUE(tokens) << tokens.err().message;
    EXPECT_EQ(*tokens, _tokens);
    std::vector<std::uint8_t> all(_blocks.size());
    ASSERT_TRUE(read_kv_blocks(_path, *h, 0, 5, all));
    EXPECT_EQ(all, _blocks);
    // A sub-range lands at its own offset.
    const std::uint64_t bb = h->meta.geometry.block_bytes();
    std::vector<std::uint8_t> part(2 * bb);
    ASSERT_TRUE(read_kv_blocks(_path, *h, 2, 2, part));
    EXPECT_TRUE(std::equal(part.begin(), part.end(), _blocks.begin() + 2 * bb));
    EXPECT_FALSE(fs::exists(_dir + "/" + _name + ".tmp"));
}

TEST_F(kv_file_test, round_trip_f32_session_is_bit_identical) {
    make_content(small_geometry(kv_file_dtype::f32), 3);
    EXPECT_EQ(_meta.geometry.block_bytes(), 2u * 2 * 2 * 4 * 8 * 4);
    auto name = kv_session_name(fp_a, "chat-42");
    ASSERT_TRUE(name);
    _meta.kind = kv_file_kind::session;
    _meta.session_hash = kv_session_hash("chat-42");
    _path = _dir + "/" + *name + ".kv";
    ASSERT_TRUE(write_kv_file(_dir, *name, _meta, _tokens, _blocks));
    auto h = read_kv_header(_path, _expect);
    ASSERT_TRUE(h) << h.err().message;
    EXPECT_EQ(h->meta, _meta);
    std::vector<std::uint8_t> all;
    EXPECT_EQ(load_all(&all), "");
    EXPECT_EQ(all, _blocks);
}

TEST_F(kv_file_test, every_header_bit_flip_is_refused) {
    write_good(small_geometry(kv_file_dtype::f16), 2);
    const std::vector<std::uint8_t> good = slurp(_path);
    for (std::size_t byte = 0; byte < kv_header_bytes; ++byte) {
        for (int bit = 0; bit < 8; ++bit) {
            std::vector<std::uint8_t> bad = good;
            bad[byte] ^= static_cast<std::uint8_t>(1u << bit);
            spit(_path, bad);
            auto h = read_kv_header(_path, _expect);
            ASSERT_FALSE(h) << "byte " << byte << " bit " << bit << " accepted";
            const std::string c = h.err().code;
            const std::string want = byte < 8    ? code(kv_error::bad_magic)
                                     : byte < 12 ? code(kv_error::version)
                                                 : code(kv_error::header_checksum);
            EXPECT_EQ(c, want) << "byte " << byte << " bit " << bit;
        }
    }
}

TEST_F(kv_file_test, payload_bit_flips_are_caught_by_the_right_checksum) {
    write_good(small_geometry(kv_file_dtype::f16), 4);
    const std::vector<std::uint8_t> good = slurp(_path);
    auto h = read_kv_header(_path, _expect);
    ASSERT_TRUE(h);
    const std::uint64_t bb = h->meta.geometry.block_bytes();
    std::uniform_int_distribution<std::size_t> where(kv_header_bytes, good.size() - 1);
    for (int i = 0; i < payload_flips; ++i) {
        const std::size_t off = where(_rng);
        std::vector<std::uint8_t> bad = good;
        bad[off] ^= static_cast<std::uint8_t>(1u << (_rng() % 8));
        spit(_path, bad);
        ASSERT_TRUE(read_kv_header(_path, _expect)) << "header untouched at " << off;
        auto tokens = read_kv_tokens(_path, *h);
        if (off < h->table_offset()) {
            ASSERT_FALSE(tokens) << "token flip at " << off << " accepted";
            EXPECT_EQ(tokens.err().code, code(kv_error::tokens_checksum));
            continue;
        }
        ASSERT_TRUE(tokens);
        const std::uint64_t block = off < h->payload_offset() ? (off - h->table_offset()) / 8
                                                              : (off - h->payload_offset()) / bb;
        for (std::uint32_t b = 0; b < h->n_blocks; ++b) {
            std::vector<std::uint8_t> dst(bb);
            status s = read_kv_blocks(_path, *h, b, 1, dst);
            if (b != block) {
                EXPECT_TRUE(s) << "block " << b << " hit by a flip in block " << block;
                continue;
            }
            ASSERT_FALSE(s) << "flip at " << off << " in block " << block << " accepted";
            EXPECT_EQ(s.err().code, code(kv_error::block_checksum));
            EXPECT_NE(s.err().message.find("block " + std::to_string(block) + " of"),
                      std::string::npos)
                << s.err().message;
        }
        EXPECT_EQ(load_all(), code(kv_error::block_checksum));
    }
}

TEST_F(kv_file_test, truncation_anywhere_is_refused) {
    write_good(small_geometry(kv_file_dtype::f16), 3);
    const std::vector<std::uint8_t> good = slurp(_path);
    auto h = read_kv_header(_path, _expect);
    ASSERT_TRUE(h);
    const std::uint64_t bb = h->meta.geometry.block_bytes();
    std::vector<std::uint64_t> cuts = {0,
                                       1,
                                       kv_header_bytes - 1,
                                       kv_header_bytes,
                                       kv_header_bytes + 1,
                                       h->table_offset() - 1,
                                       h->table_offset(),
                                       h->payload_offset() - 1,
                                       h->payload_offset(),
                                       h->payload_offset() + bb,
                                       h->payload_offset() + 2 * bb,
                                       good.size() - 1};
    std::uniform_int_distribution<std::size_t> where(0, good.size() - 1);
    for (int i = 0; i < random_truncations; ++i) cuts.push_back(where(_rng));
    for (std::uint64_t cut : cuts) {
        spit(_path, std::span(good).first(cut));
        auto r = read_kv_header(_path, _expect);
        ASSERT_FALSE(r) << "cut at " << cut << " accepted";
        EXPECT_EQ(r.err().code, code(kv_error::truncated)) << "cut at " << cut;
        // The readers refuse it too when handed the header read before the cut.
        std::vector<std::uint8_t> dst(bb);
        EXPECT_FALSE(read_kv_blocks(_path, *h, 2, 1, dst));
    }
    std::vector<std::uint8_t> longer = good;
    longer.push_back(0);
    spit(_path, longer);
    auto r = read_kv_header(_path, _expect);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.err().code, code(kv_error::oversize));
}

TEST_F(kv_file_test, empty_and_foreign_files_are_refused) {
    make_content(small_geometry(kv_file_dtype::f16), 1);
    spit(_path, {});
    auto r = read_kv_header(_path, _expect);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.err().code, code(kv_error::truncated));
    const std::string text(200, 'x');
    spit(_path, std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
    r = read_kv_header(_path, _expect);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.err().code, code(kv_error::bad_magic));
}

TEST_F(kv_file_test, mismatches_with_the_loaded_model_each_have_their_code) {
    write_good(small_geometry(kv_file_dtype::f16), 2);
    auto refused_with = [&](kv_expect e) {
        auto r = read_kv_header(_path, e);
        return r ? std::string("accepted") : r.err().code;
    };
    kv_expect e = _expect;
    e.fingerprint = fp_b;
    EXPECT_EQ(refused_with(e), code(kv_error::fingerprint));
    e = _expect;
    e.geometry.n_layer = 3;
    EXPECT_EQ(refused_with(e), code(kv_error::geometry));
    e = _expect;
    e.geometry.head_dim = 16;
    EXPECT_EQ(refused_with(e), code(kv_error::geometry));
    e = _expect;
    e.geometry.dtype = kv_file_dtype::f32;
    EXPECT_EQ(refused_with(e), code(kv_error::dtype));
    e = _expect;
    e.geometry.block_tokens = 8;
    EXPECT_EQ(refused_with(e), code(kv_error::block_tokens));
    EXPECT_EQ(refused_with(_expect), "accepted");
}

// read_kv_header_any makes every check of read_kv_header except the comparison with a model.
TEST_F(kv_file_test, header_any_validates_without_a_model) {
    write_good(small_geometry(kv_file_dtype::f16), 3);
    auto any = read_kv_header_any(_path);
    ASSERT_TRUE(any) << any.err().message;
    auto loaded = read_kv_header(_path, _expect);
    ASSERT_TRUE(loaded) << loaded.err().message;
    EXPECT_EQ(*any, *loaded);
    EXPECT_EQ(any->meta, _meta);

    // Written for another model: read_kv_header refuses it, read_kv_header_any names its model.
    kv_expect other = _expect;
    other.fingerprint = fp_b;
    auto refused = read_kv_header(_path, other);
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.err().code, code(kv_error::fingerprint));
    other = _expect;
    other.geometry.n_layer = 3;
    EXPECT_FALSE(read_kv_header(_path, other));
    EXPECT_TRUE(read_kv_header_any(_path));

    const std::vector<std::uint8_t> good = slurp(_path);
    std::vector<std::uint8_t> bad = good;
    bad[40] ^= 0x01;  // head_dim
    spit(_path, bad);
    auto flipped = read_kv_header_any(_path);
    ASSERT_FALSE(flipped);
    EXPECT_EQ(flipped.err().code, code(kv_error::header_checksum));

    spit(_path, std::span(good).first(good.size() - 1));
    auto cut = read_kv_header_any(_path);
    ASSERT_FALSE(cut);
    EXPECT_EQ(cut.err().code, code(kv_error::truncated));
    bad = good;
    bad.push_back(0);
    spit(_path, bad);
    auto longer = read_kv_header_any(_path);
    ASSERT_FALSE(longer);
    EXPECT_EQ(longer.err().code, code(kv_error::oversize));
}

// A file of a newer format version, with a valid checksum over its header, is kv_version.
TEST_F(kv_file_test, newer_version_is_refused) {
    write_good(small_geometry(kv_file_dtype::f16), 1);
    std::vector<std::uint8_t> bytes = slurp(_path);
    const std::uint32_t newer = kv_format_version + 1;
    std::memcpy(bytes.data() + 8, &newer, 4);
    const std::uint64_t sum = XXH3_64bits(bytes.data(), kv_header_bytes - 8);
    std::memcpy(bytes.data() + kv_header_bytes - 8, &sum, 8);
    spit(_path, bytes);
    auto r = read_kv_header(_path, _expect);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.err().code, code(kv_error::version));
}

// A header whose checksum is right but whose fields lie (a buggy writer) is kv_bad_header.
TEST_F(kv_file_test, consistent_checksum_over_inconsistent_fields_is_bad_header) {
    write_good(small_geometry(kv_file_dtype::f16), 2);
    const std::vector<std::uint8_t> good = slurp(_path);
    auto rewrite = [&](std::size_t off, std::uint32_t v) {
        std::vector<std::uint8_t> bytes = good;
        std::memcpy(bytes.data() + off, &v, 4);
        const std::uint64_t sum = XXH3_64bits(bytes.data(), kv_header_bytes - 8);
        std::memcpy(bytes.data() + kv_header_bytes - 8, &sum, 8);
        spit(_path, bytes);
        auto r = read_kv_header(_path, _expect);
        return r ? std::string("accepted") : r.err().code;
    };
    EXPECT_EQ(rewrite(52, 3), code(kv_error::bad_header));  // n_blocks vs file size
    EXPECT_EQ(rewrite(44, 3), code(kv_error::bad_header));  // block_tokens not 2^k
    EXPECT_EQ(rewrite(32, 0), code(kv_error::bad_header));  // n_layer 0
    EXPECT_EQ(rewrite(48, 7), code(kv_error::bad_header));  // unknown dtype
    EXPECT_EQ(rewrite(52, kv_file_blocks_max + 1), code(kv_error::bad_header));
    EXPECT_EQ(rewrite(96, 1), code(kv_error::bad_header));  // reserved
}

TEST_F(kv_file_test, symlinks_directories_and_fifos_are_not_opened) {
    write_good(small_geometry(kv_file_dtype::f16), 1);
    const std::string link = _dir + "/p-link.kv";
    ASSERT_EQ(::symlink(_path.c_str(), link.c_str()), 0);
    auto r = read_kv_header(link, _expect);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.err().code, code(kv_error::not_regular));
    const std::string dir = _dir + "/p-dir.kv";
    fs::create_directory(dir);
    r = read_kv_header(dir, _expect);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.err().code, code(kv_error::not_regular));
    const std::string fifo = _dir + "/p-fifo.kv";
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    r = read_kv_header(fifo, _expect);  // must not block
    ASSERT_FALSE(r);
    EXPECT_EQ(r.err().code, code(kv_error::not_regular));
    // A leftover .tmp planted as a symlink is replaced, never written through.
    const std::string victim = _dir + "/victim";
    spit(victim, std::vector<std::uint8_t>{1, 2, 3});
    ASSERT_EQ(::symlink(victim.c_str(), (_dir + "/" + _name + ".tmp").c_str()), 0);
    ASSERT_TRUE(write_kv_file(_dir, _name, _meta, _tokens, _blocks));
    EXPECT_EQ(slurp(victim), (std::vector<std::uint8_t>{1, 2, 3}));
    EXPECT_EQ(load_all(), "");
}

// A crash before the rename leaves the previous .kv intact and loadable; the .tmp is never
// read as a KV file; the next write cleans it up.
TEST_F(kv_file_test, crashed_write_leaves_the_old_file) {
    write_good(small_geometry(kv_file_dtype::f16), 2);
    const std::vector<std::uint8_t> old_blocks = _blocks;
    const std::string tmp = _dir + "/" + _name + ".tmp";
    for (kv_write_stop stop : {kv_write_stop::mid_tmp, kv_write_stop::before_rename}) {
        std::vector<std::uint8_t> new_blocks(_blocks.size());
        for (auto& b : new_blocks) b = static_cast<std::uint8_t>(_rng());
        ASSERT_TRUE(write_kv_file(_dir, _name, _meta, _tokens, new_blocks, stop));
        ASSERT_TRUE(fs::exists(tmp));
        std::vector<std::uint8_t> loaded;
        EXPECT_EQ(load_all(&loaded), "");
        EXPECT_EQ(loaded, old_blocks);
        auto r = read_kv_header(tmp, _expect);
        ASSERT_FALSE(r);
        EXPECT_EQ(r.err().code, code(kv_error::bad_name));
        EXPECT_EQ(classify_kv_dir_entry(_name + ".tmp"), kv_dir_entry::tmp_leftover);
    }
    std::vector<std::uint8_t> newest(_blocks.size(), 0x5a);
    ASSERT_TRUE(write_kv_file(_dir, _name, _meta, _tokens, newest));
    EXPECT_FALSE(fs::exists(tmp));
    std::vector<std::uint8_t> loaded;
    EXPECT_EQ(load_all(&loaded), "");
    EXPECT_EQ(loaded, newest);
}

// Writers sharing a directory: each writes through its own `<stem>.<writer>.tmp`. A crash
// leaves that name; another writer's save neither removes nor reuses it; a bad tag is refused.
TEST_F(kv_file_test, a_writer_tag_keeps_each_writers_tmp_apart) {
    write_good(small_geometry(kv_file_dtype::f16), 2);
    const std::string tag_a = kv_writer_tag(), tag_b = kv_writer_tag();
    EXPECT_NE(tag_a, tag_b);
    EXPECT_TRUE(valid_writer_tag(tag_a));
    const std::string tmp_a = _dir + "/" + _name + "." + tag_a + ".tmp";
    std::vector<std::uint8_t> crashed(_blocks.size(), 0x11);
    ASSERT_TRUE(write_kv_file(_dir, _name, _meta, _tokens, crashed, kv_write_stop::mid_tmp, tag_a));
    ASSERT_TRUE(fs::exists(tmp_a));
    EXPECT_EQ(classify_kv_dir_entry(_name + "." + tag_a + ".tmp"), kv_dir_entry::tmp_leftover);
    std::vector<std::uint8_t> newest(_blocks.size(), 0x22);
    ASSERT_TRUE(write_kv_file(_dir, _name, _meta, _tokens, newest, kv_write_stop::none, tag_b));
    EXPECT_TRUE(fs::exists(tmp_a)) << "another writer's .tmp was touched";
    EXPECT_FALSE(fs::exists(_dir + "/" + _name + "." + tag_b + ".tmp"));
    std::vector<std::uint8_t> loaded;
    EXPECT_EQ(load_all(&loaded), "");
    EXPECT_EQ(loaded, newest);
    for (const char* bad : {"ABC", "x", "0123/", "", "0123456789abcdef0123456789abcdef0"}) {
        if (std::string_view(bad).empty()) continue;  // empty: no tag, the plain <stem>.tmp
        auto r = write_kv_file(_dir, _name, _meta, _tokens, newest, kv_write_stop::none, bad);
        ASSERT_FALSE(r) << bad;
        EXPECT_EQ(r.err().code, code(kv_error::bad_name)) << bad;
        EXPECT_EQ(classify_kv_dir_entry(_name + "." + bad + ".tmp"), kv_dir_entry::foreign) << bad;
    }
}

// The `fault` op's kv_enospc / kv_eio: half the .tmp is written, then the write fails as the
// disk would, and the protocol's own error path runs (the .tmp is removed, the old file stays).
TEST_F(kv_file_test, injected_write_faults_fail_like_the_disk) {
    write_good(small_geometry(kv_file_dtype::f16), 4);
    const std::vector<std::uint8_t> old_blocks = _blocks;
    const std::string tmp = _dir + "/" + _name + ".tmp";
    const struct {
        kv_write_stop stop;
        kv_error error;
        const char* strerror_text;
    } cases[] = {{kv_write_stop::enospc_mid_tmp, kv_error::no_space, std::strerror(ENOSPC)},
                 {kv_write_stop::eio_mid_tmp, kv_error::io_error, std::strerror(EIO)}};
    for (const auto& c : cases) {
        std::vector<std::uint8_t> new_blocks(_blocks.size(), 0x33);
        status s = write_kv_file(_dir, _name, _meta, _tokens, new_blocks, c.stop);
        ASSERT_FALSE(s);
        EXPECT_EQ(s.err().code, code(c.error));
        EXPECT_TRUE(kv_disk_fault(kv_error_of(s.err())));
        EXPECT_NE(s.err().message.find(std::string("write: ") + c.strerror_text), std::string::npos)
            << s.err().message;
        EXPECT_FALSE(fs::exists(tmp));
        std::vector<std::uint8_t> loaded;
        EXPECT_EQ(load_all(&loaded), "");
        EXPECT_EQ(loaded, old_blocks);
    }
}

// The `fault` op's kv_flip_read: the bit is flipped in the buffer the verification checks, so
// the block it lands in fails its checksum; the file on disk is untouched.
TEST_F(kv_file_test, injected_read_flip_is_caught_by_its_block_checksum) {
    write_good(small_geometry(kv_file_dtype::f16), 4);
    auto h = read_kv_header(_path, _expect);
    ASSERT_TRUE(h);
    std::vector<std::uint8_t> dst(_blocks.size());
    status s = read_kv_blocks(_path, *h, 0, 4, dst, kv_read_fault::flip_bit);
    ASSERT_FALSE(s);
    EXPECT_EQ(s.err().code, code(kv_error::block_checksum));
    EXPECT_NE(s.err().message.find("block 2 of 4"), std::string::npos) << s.err().message;
    // A one-block sub-range: the flip lands in that block.
    const std::uint64_t bb = h->meta.geometry.block_bytes();
    std::vector<std::uint8_t> one(bb);
    s = read_kv_blocks(_path, *h, 3, 1, one, kv_read_fault::flip_bit);
    ASSERT_FALSE(s);
    EXPECT_NE(s.err().message.find("block 3 of 4"), std::string::npos) << s.err().message;
    std::vector<std::uint8_t> loaded;
    EXPECT_EQ(load_all(&loaded), "");
    EXPECT_EQ(loaded, _blocks);
}

// A file replaced between read_kv_header and read_kv_blocks is not read with the old header.
TEST_F(kv_file_test, file_replaced_after_header_read_is_changed) {
    write_good(small_geometry(kv_file_dtype::f16), 2);
    auto h = read_kv_header(_path, _expect);
    ASSERT_TRUE(h);
    std::vector<std::int32_t> other_tokens = _tokens;
    other_tokens[0] += 1;
    ASSERT_TRUE(write_kv_file(_dir, _name, _meta, other_tokens, _blocks));
    std::vector<std::uint8_t> dst(_blocks.size());
    status s = read_kv_blocks(_path, *h, 0, 2, dst);
    ASSERT_FALSE(s);
    EXPECT_EQ(s.err().code, code(kv_error::changed));
    auto t = read_kv_tokens(_path, *h);
    ASSERT_FALSE(t);
    EXPECT_EQ(t.err().code, code(kv_error::changed));
}

TEST_F(kv_file_test, bad_write_and_read_arguments_are_refused) {
    make_content(small_geometry(kv_file_dtype::f16), 2);
    auto refused = [](status s) { return s ? std::string("accepted") : s.err().code; };
    std::vector<std::int32_t> partial(_tokens.begin(), _tokens.end() - 1);
    EXPECT_EQ(refused(write_kv_file(_dir, _name, _meta, partial, _blocks)),
              code(kv_error::bad_request));
    EXPECT_EQ(refused(write_kv_file(_dir, _name, _meta, {}, {})), code(kv_error::bad_request));
    std::vector<std::uint8_t> short_blocks(_blocks.begin(), _blocks.end() - 1);
    EXPECT_EQ(refused(write_kv_file(_dir, _name, _meta, _tokens, short_blocks)),
              code(kv_error::bad_request));
    for (const char* bad_name : {"", "../x", "a/b", "P-UPPER", "x.kv"}) {
        EXPECT_EQ(refused(write_kv_file(_dir, bad_name, _meta, _tokens, _blocks)),
                  code(kv_error::bad_name))
            << bad_name;
    }
    kv_file_meta m = _meta;
    m.session_hash = 1;  // a prefix never carries one
    EXPECT_EQ(refused(write_kv_file(_dir, _name, m, _tokens, _blocks)),
              code(kv_error::bad_request));
    m = _meta;
    m.geometry.n_layer = kv_n_layer_max + 1;
    EXPECT_EQ(refused(write_kv_file(_dir, _name, m, _tokens, _blocks)),
              code(kv_error::bad_request));
    EXPECT_EQ(fs::directory_iterator(_dir) == fs::directory_iterator(), true)
        << "a refused write left a file behind";

    ASSERT_TRUE(write_kv_file(_dir, _name, _meta, _tokens, _blocks));
    auto h = read_kv_header(_path, _expect);
    ASSERT_TRUE(h);
    const std::uint64_t bb = h->meta.geometry.block_bytes();
    std::vector<std::uint8_t> dst(bb);
    EXPECT_EQ(refused(read_kv_blocks(_path, *h, 2, 1, dst)), code(kv_error::bad_request));
    EXPECT_EQ(refused(read_kv_blocks(_path, *h, 1, 0, dst)), code(kv_error::bad_request));
    std::vector<std::uint8_t> wrong(bb + 1);
    EXPECT_EQ(refused(read_kv_blocks(_path, *h, 0, 1, wrong)), code(kv_error::bad_request));
}

TEST(kv_file_names, stable_distinct_and_validated) {
    const std::vector<std::int32_t> tokens = {1, 2, 3, 4};
    const std::string p = kv_prefix_name(fp_a, tokens);
    // Golden: a change of the name derivation orphans every file on disk, so it must be seen.
    EXPECT_EQ(p, "p-ed4e74b2fee07ec04d4cad9b83e47fcb");
    EXPECT_EQ(p, kv_prefix_name(fp_a, tokens));
    EXPECT_EQ(p.substr(0, 2), "p-");
    EXPECT_NE(p, kv_prefix_name(fp_b, tokens));
    EXPECT_NE(p, kv_prefix_name(fp_a, std::vector<std::int32_t>{1, 2, 3, 5}));
    EXPECT_NE(p, kv_prefix_name(fp_a, std::vector<std::int32_t>{1, 2, 3, 4, 5, 6, 7, 8}));

    auto s = kv_session_name(fp_a, "chat-42");
    ASSERT_TRUE(s);
    EXPECT_EQ(*s, "s-efecf66e167d774673635efc819986bc");
    EXPECT_EQ(s->find("chat"), std::string::npos);
    EXPECT_EQ(*s, *kv_session_name(fp_a, "chat-42"));
    EXPECT_NE(*s, *kv_session_name(fp_b, "chat-42"));
    EXPECT_NE(*s, *kv_session_name(fp_a, "chat-43"));
    EXPECT_NE(kv_session_hash("chat-42"), kv_session_hash("chat-43"));
    EXPECT_EQ(classify_kv_dir_entry(p + ".kv"), kv_dir_entry::kv_file);
    EXPECT_EQ(classify_kv_dir_entry(*s + ".kv"), kv_dir_entry::kv_file);

    for (std::string bad : {std::string(), std::string(129, 'a'), std::string("a/b"),
                            std::string("a b"), std::string("..\n")}) {
        auto r = kv_session_name(fp_a, bad);
        ASSERT_FALSE(r) << bad;
        EXPECT_EQ(r.err().code, code(kv_error::bad_session));
    }
    EXPECT_TRUE(kv_session_name(fp_a, std::string(128, 'a')));
    EXPECT_TRUE(kv_session_name(fp_a, "A.b_c-9"));

    EXPECT_EQ(classify_kv_dir_entry("p-abc.tmp"), kv_dir_entry::tmp_leftover);
    EXPECT_EQ(classify_kv_dir_entry("p-abc.0f3a.tmp"), kv_dir_entry::tmp_leftover);
    for (const char* other : {".kv", "x.kv.bak", "README", "p-abc.KV", "a b.kv", ".tmp",
                              "p-abc..tmp", "p-abc.xyz.tmp", ".0f3a.tmp", "p-abc.0f3a.kv"}) {
        EXPECT_EQ(classify_kv_dir_entry(other), kv_dir_entry::foreign) << other;
    }
}

}  // namespace
