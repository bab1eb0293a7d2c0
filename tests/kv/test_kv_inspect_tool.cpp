// test_kv_inspect_tool.cpp: checks `ordo-model kv-inspect` (tools/model/cmd_kv_inspect.cpp) end
// to end: on a valid file it prints the header (fingerprint, geometry, sizes) and, with --verify,
// "result: ok" with exit 0; a flipped payload byte is exit 1 naming kv_block_checksum and the
// block (without --verify only the header is read, so it still passes); every corrupt block is
// named, in the first 64 MiB read chunk and in a later one; corrupt token ids are
// kv_tokens_checksum; a flipped header byte is refused with kv_header_checksum; --json prints one
// object; a wrong command line is exit 2.
//
// How: files are made by kv::write_kv_file in a fresh temporary directory and corrupted in
// place; the built binary (ORDO_MODEL_TOOL) runs through the shell with stdout and stderr
// captured together.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kv/kv_file.hpp"
#include "tests/support/server_process.hpp"

namespace {

using namespace ordo::kv;
namespace fs = std::filesystem;

const ordo::model::fingerprint fp{0x0123456789abcdefull, 0xfedcba9876543210ull};

using tool_run = ordo::test::command_result;

tool_run inspect(const std::string& args) {
    return ordo::test::run_command("'" + std::string(ORDO_MODEL_TOOL) + "' kv-inspect " + args +
                                   " 2>&1");
}

bool has(const tool_run& r, const std::string& text) {
    return r.output.find(text) != std::string::npos;
}

class kv_inspect_tool : public ::testing::Test {
protected:
    void SetUp() override {
        std::string tmpl = (fs::temp_directory_path() / "ordo-kv-inspect-XXXXXX").string();
        ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
        _dir = tmpl;
    }
    void TearDown() override { fs::remove_all(_dir); }

    // Writes a prefix file of n_blocks blocks of geometry g with patterned content.
    void write(const kv_file_geometry& g, std::uint32_t n_blocks) {
        std::vector<std::int32_t> tokens(std::size_t{n_blocks} * g.block_tokens);
        for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int>(i % 500);
        std::vector<std::uint8_t> blocks(n_blocks * g.block_bytes());
        for (std::size_t i = 0; i < blocks.size(); ++i) {
            blocks[i] = static_cast<std::uint8_t>(i * 131 + (i >> 12));
        }
        const std::string name = kv_prefix_name(fp, tokens);
        ASSERT_TRUE(write_kv_file(_dir, name, {.fingerprint = fp, .geometry = g}, tokens, blocks));
        _path = _dir + "/" + name + ".kv";
        auto h = read_kv_header_any(_path);
        ASSERT_TRUE(h);
        _header = *h;
    }
    void flip(std::uint64_t offset) {
        std::fstream f(_path, std::ios::in | std::ios::out | std::ios::binary);
        f.seekg(static_cast<std::streamoff>(offset));
        const char c = static_cast<char>(f.get() ^ 0x10);
        f.seekp(static_cast<std::streamoff>(offset));
        f.put(c);
    }
    std::uint64_t block_offset(std::uint32_t block) const {
        return _header.payload_offset() + block * _header.meta.geometry.block_bytes();
    }

    std::string _dir;
    std::string _path;
    kv_file_header _header;
};

const kv_file_geometry small{
    .n_layer = 2, .n_head_kv = 2, .head_dim = 8, .block_tokens = 4, .dtype = kv_file_dtype::f16};

TEST_F(kv_inspect_tool, valid_file_prints_header_and_ok) {
    write(small, 3);
    auto r = inspect("--verify " + _path);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(has(r, "fingerprint: " + fp.hex())) << r.output;
    EXPECT_TRUE(has(r, "format: version 1")) << r.output;
    EXPECT_TRUE(has(r, "kind: prefix, session_hash 0x0000000000000000")) << r.output;
    EXPECT_TRUE(has(r, "n_layer 2, n_head_kv 2, head_dim 8, block_tokens 4, dtype f16"))
        << r.output;
    EXPECT_TRUE(has(r, "3 blocks, 12 tokens, 512 bytes per block, " +
                           std::to_string(fs::file_size(_path)) + " bytes in the file"))
        << r.output;
    EXPECT_TRUE(has(r, "tokens: ok")) << r.output;
    EXPECT_TRUE(has(r, "blocks: 3 of 3 checked, 0 corrupt")) << r.output;
    EXPECT_TRUE(has(r, "result: ok")) << r.output;

    auto j = inspect("--json --verify " + _path);
    EXPECT_EQ(j.exit_code, 0) << j.output;
    ASSERT_FALSE(j.output.empty());
    EXPECT_EQ(j.output.front(), '{');
    EXPECT_TRUE(has(j, "\"ok\": true")) << j.output;
    EXPECT_TRUE(has(j, "\"fingerprint\": \"" + fp.hex() + "\"")) << j.output;
    EXPECT_TRUE(has(j, "\"blocks_checked\": 3")) << j.output;
}

TEST_F(kv_inspect_tool, flipped_payload_byte_is_block_checksum) {
    write(small, 3);
    flip(block_offset(2) + 7);
    auto header_only = inspect(_path);
    EXPECT_EQ(header_only.exit_code, 0) << header_only.output;
    EXPECT_TRUE(has(header_only, "not verified")) << header_only.output;

    auto r = inspect("--verify " + _path);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(has(r, "kv_block_checksum")) << r.output;
    EXPECT_TRUE(has(r, "block 2 of 3")) << r.output;
    EXPECT_TRUE(has(r, "blocks: 3 of 3 checked, 1 corrupt")) << r.output;
    EXPECT_TRUE(has(r, "result: corrupt (kv_block_checksum)")) << r.output;
    auto j = inspect("--verify --json " + _path);
    EXPECT_EQ(j.exit_code, 1) << j.output;
    EXPECT_TRUE(has(j, "\"ok\": false")) << j.output;
    EXPECT_TRUE(has(j, "\"code\": \"kv_block_checksum\"")) << j.output;
}

// 8 MiB blocks: the 64 MiB chunk holds 8, so blocks 1 and 9 are corrupt in different chunks.
TEST_F(kv_inspect_tool, every_corrupt_block_is_named_across_chunks) {
    const kv_file_geometry big{.n_layer = 32,
                               .n_head_kv = 8,
                               .head_dim = 128,
                               .block_tokens = 64,
                               .dtype = kv_file_dtype::f16};
    ASSERT_EQ(big.block_bytes(), std::uint64_t{8} << 20);
    write(big, 10);
    flip(block_offset(1) + 100);
    flip(block_offset(9) + 5);
    flip(_header.tokens_offset() + 3);
    auto r = inspect("--verify " + _path);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(has(r, "tokens: corrupt")) << r.output;
    EXPECT_TRUE(has(r, "kv_tokens_checksum")) << r.output;
    EXPECT_TRUE(has(r, "block 1 of 10")) << r.output;
    EXPECT_TRUE(has(r, "block 9 of 10")) << r.output;
    EXPECT_TRUE(has(r, "blocks: 10 of 10 checked, 2 corrupt")) << r.output;
    EXPECT_TRUE(has(r, "result: corrupt (kv_tokens_checksum)")) << r.output;
}

TEST_F(kv_inspect_tool, refused_header_and_bad_command_lines) {
    write(small, 1);
    flip(40);  // head_dim
    auto r = inspect(_path);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(has(r, "kv_header_checksum")) << r.output;
    auto j = inspect("--json " + _path);
    EXPECT_EQ(j.exit_code, 1) << j.output;
    EXPECT_TRUE(has(j, "\"error\": {\"code\": \"kv_header_checksum\"")) << j.output;

    auto missing = inspect(_dir + "/p-absent.kv");
    EXPECT_EQ(missing.exit_code, 1) << missing.output;
    EXPECT_TRUE(has(missing, "kv_io")) << missing.output;
    EXPECT_EQ(inspect("").exit_code, 2);
    EXPECT_EQ(inspect("--bogus " + _path).exit_code, 2);
    EXPECT_EQ(inspect(_path + " " + _path).exit_code, 2);
}

}  // namespace
