// test_gguf_malformed.cpp: checks that every class of malformed GGUF file is rejected with the
// right error code and a message naming the culprit, never a crash or an out-of-bounds read.
//
// How: a table of files crafted with gguf_writer's escape hatches (header overrides, raw
// tensor specs, raw key/value bytes, byte patches), each parsed with gguf_file::from_bytes and
// checked for its expected code and a substring of the message. Then a valid file is cut at
// every length short of its last tensor byte and each prefix must fail with a bounds error, and
// a tensor of every type ordo decodes, cut one byte short of its blocks, is refused naming it.
// Run under -DORDO_SANITIZE=ON, any out-of-bounds read here aborts the test.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "model/gguf.hpp"
#include "model/gguf_writer.hpp"

using namespace ordo::model;

namespace {

gguf_writer base_writer() {
    gguf_writer w;
    w.set_string("general.architecture", "llama");
    w.set_u32("llama.block_count", 1);
    const float scores[] = {0.f, 1.f};
    w.set_f32_array("tokenizer.ggml.scores", scores);
    w.set_string_array("tokenizer.ggml.tokens", {"a", "b"});
    const uint64_t ne[] = {8, 2};
    EXPECT_TRUE(w.add_tensor("w0", ggml_type::f32, ne, std::vector<uint8_t>(64, 1)).ok());
    const uint64_t ne2[] = {32};
    EXPECT_TRUE(w.add_tensor("w1", ggml_type::q8_0, ne2, std::vector<uint8_t>(34, 2)).ok());
    return w;
}

gguf_tensor_spec spec(std::string name, ggml_type t, std::vector<uint64_t> ne, size_t bytes) {
    gguf_tensor_spec s;
    s.name = std::move(name);
    s.type_raw = static_cast<uint32_t>(t);
    s.ne = std::move(ne);
    s.bytes.assign(bytes, 0);
    return s;
}

void patch_u32(std::vector<uint8_t>& b, size_t at, uint32_t v) {
    std::memcpy(&b[at], &v, 4);
}
void patch_u64(std::vector<uint8_t>& b, size_t at, uint64_t v) {
    std::memcpy(&b[at], &v, 8);
}

struct malformed_case {
    const char* name;
    std::function<std::vector<uint8_t>()> make;
    const char* code;
    const char* message_part;  // must appear in the error message
};

std::vector<malformed_case> cases() {
    return {
        {"empty file", [] { return std::vector<uint8_t>{}; }, "gguf_truncated", "magic"},
        {"three bytes",
         [] {
             return std::vector<uint8_t>{'G', 'G', 'U'};
         },
         "gguf_truncated", "magic"},
        {"bad magic",
         [] {
             auto w = base_writer();
             w.overrides.magic = 0x4c4d4747;
             return w.to_bytes();
         },
         "gguf_bad_magic", "offset 0"},
        {"version 1",
         [] {
             auto w = base_writer();
             w.overrides.version = 1;
             return w.to_bytes();
         },
         "gguf_bad_version", "version 1"},
        {"version 4",
         [] {
             auto w = base_writer();
             w.overrides.version = 4;
             return w.to_bytes();
         },
         "gguf_bad_version", "version 4"},
        {"huge kv count",
         [] {
             auto w = base_writer();
             w.overrides.n_kv = UINT64_MAX / 2;
             return w.to_bytes();
         },
         "gguf_bad_count", "metadata count"},
        {"kv count fits the limit but not the file",
         [] {
             auto w = base_writer();
             w.overrides.n_kv = 1000;
             return w.to_bytes();
         },
         "gguf_bad_count", "cannot fit"},
        {"array longer than the value limit",
         [] {
             // Every item is present, so only the memory cap can stop it.
             auto w = base_writer();
             const uint64_t n = k_gguf_metadata_values_max + 1;
             std::vector<uint8_t> raw;
             gguf_put_string(raw, "big.array");
             gguf_put_u32(raw, 9);
             gguf_put_u32(raw, 0);
             gguf_put_u64(raw, n);
             raw.resize(raw.size() + n, 0x55);
             w.append_raw_kv_bytes(raw, 1);
             return w.to_bytes();
         },
         "gguf_bad_count", "big.array"},
        {"huge tensor count",
         [] {
             auto w = base_writer();
             w.overrides.n_tensors = 1ull << 40;
             return w.to_bytes();
         },
         "gguf_bad_count", "tensor count"},
        {"tensor count fits the limit but not the file",
         [] {
             auto w = base_writer();
             w.overrides.n_tensors = 1000;
             return w.to_bytes();
         },
         "gguf_bad_count", "tensor count 1000"},
        // The fifth "key" is the first tensor record, read as a kv; the table after it is then
        // misread from the wrong position and its first name length runs past the end.
        {"kv count one too many",
         [] {
             auto w = base_writer();
             w.overrides.n_kv = 5;
             return w.to_bytes();
         },
         "gguf_truncated", "tensor #0"},
        {"huge array length",
         [] {
             gguf_layout lay;
             auto w = base_writer();
             auto b = w.to_bytes(&lay);
             // Key 0 "general.architecture" is a string; key 2 is the f32 array. Its length
             // sits after key (8+21), type (4), elem type (4).
             size_t at = lay.kv_start;
             at += 8 + 20 + 4 + 8 + 5;  // key 0: "general.architecture" = "llama"
             at += 8 + 17 + 4 + 4;      // key 1: "llama.block_count" u32
             at += 8 + 21 + 4 + 4;      // key 2 up to its length field
             patch_u64(b, at, 1ull << 60);
             return b;
         },
         "gguf_bad_count", "tokenizer.ggml.scores"},
        {"string length past EOF",
         [] {
             gguf_layout lay;
             auto b = base_writer().to_bytes(&lay);
             patch_u64(b, lay.kv_start, b.size());  // the first key's length
             return b;
         },
         "gguf_truncated", "runs past the end"},
        {"value string past EOF",
         [] {
             gguf_layout lay;
             auto b = base_writer().to_bytes(&lay);
             patch_u64(b, lay.kv_start + 8 + 20 + 4, 1ull << 62);
             return b;
         },
         "gguf_truncated", "general.architecture"},
        {"unknown value type",
         [] {
             auto w = base_writer();
             std::vector<uint8_t> raw;
             gguf_put_string(raw, "bad.key");
             gguf_put_u32(raw, 13);
             gguf_put_u32(raw, 0);
             w.append_raw_kv_bytes(raw, 1);
             return w.to_bytes();
         },
         "gguf_bad_value_type", "bad.key"},
        {"unknown array element type",
         [] {
             auto w = base_writer();
             std::vector<uint8_t> raw;
             gguf_put_string(raw, "bad.arr");
             gguf_put_u32(raw, 9);
             gguf_put_u32(raw, 77);
             gguf_put_u64(raw, 1);
             w.append_raw_kv_bytes(raw, 1);
             return w.to_bytes();
         },
         "gguf_bad_value_type", "bad.arr"},
        {"arrays nested too deep",
         [] {
             auto w = base_writer();
             gguf_value v(gguf_array{gguf_value_type::u8, {}});
             for (int i = 0; i < 6; ++i) {
                 gguf_array a{gguf_value_type::array, {}};
                 a.items.push_back(v);
                 v = gguf_value(a);
             }
             w.set("deep", v);
             return w.to_bytes();
         },
         "gguf_bad_value_type", "nested"},
        {"duplicate key",
         [] {
             auto w = base_writer();
             w.append_kv("llama.block_count", gguf_value(uint32_t(2)));
             return w.to_bytes();
         },
         "gguf_duplicate_key", "llama.block_count"},
        {"alignment not a power of two",
         [] {
             auto w = base_writer();
             w.set_u32("general.alignment", 48);
             return w.to_bytes();
         },
         "gguf_bad_alignment", "48"},
        {"alignment zero",
         [] {
             auto w = base_writer();
             w.set_u32("general.alignment", 0);
             return w.to_bytes();
         },
         "gguf_bad_alignment", ""},
        {"alignment as string",
         [] {
             auto w = base_writer();
             w.set_string("general.alignment", "32");
             return w.to_bytes();
         },
         "gguf_bad_alignment", ""},
        {"zero dims",
         [] {
             auto w = base_writer();
             auto s = spec("z", ggml_type::f32, {}, 4);
             w.add_tensor_raw(s);
             return w.to_bytes();
         },
         "gguf_bad_dims", "'z'"},
        {"five dims",
         [] {
             auto w = base_writer();
             w.add_tensor_raw(spec("five", ggml_type::f32, {1, 1, 1, 1, 1}, 4));
             return w.to_bytes();
         },
         "gguf_bad_dims", "five"},
        {"zero dimension",
         [] {
             auto w = base_writer();
             w.add_tensor_raw(spec("zd", ggml_type::f32, {4, 0}, 0));
             return w.to_bytes();
         },
         "gguf_bad_dims", "zd"},
        {"element count overflow",
         [] {
             auto w = base_writer();
             w.add_tensor_raw(spec("big", ggml_type::f32, {1ull << 32, 1ull << 32, 1ull << 32}, 4));
             return w.to_bytes();
         },
         "gguf_bad_dims", "big"},
        {"byte size overflow",
         [] {
             auto w = base_writer();
             w.add_tensor_raw(spec("big2", ggml_type::f32, {1ull << 31, 1ull << 31}, 4));
             return w.to_bytes();
         },
         "gguf_bad_dims", "big2"},
        {"unknown tensor type",
         [] {
             auto w = base_writer();
             auto s = spec("t99", ggml_type::f32, {4}, 16);
             s.type_raw = 99;
             w.add_tensor_raw(s);
             return w.to_bytes();
         },
         "gguf_unsupported_type", "99"},
        {"retired tensor type id 4",
         [] {
             auto w = base_writer();
             auto s = spec("t4", ggml_type::f32, {32}, 20);
             s.type_raw = 4;
             w.add_tensor_raw(s);
             return w.to_bytes();
         },
         "gguf_unsupported_type", "t4"},
        {"row not whole blocks",
         [] {
             auto w = base_writer();
             w.add_tensor_raw(spec("q", ggml_type::q8_0, {16, 2}, 34));
             return w.to_bytes();
         },
         "gguf_bad_shape", "'q'"},
        {"tensor past end of file",
         [] {
             auto w = base_writer();
             auto s = spec("far", ggml_type::f32, {8}, 32);
             s.offset_raw = 1 << 20;
             w.add_tensor_raw(s);
             return w.to_bytes();
         },
         "gguf_tensor_out_of_bounds", "far"},
        {"tensor offset near 2^64",
         [] {
             auto w = base_writer();
             auto s = spec("wrap", ggml_type::f32, {8}, 32);
             s.offset_raw = UINT64_MAX - 31;  // aligned; offset + size wraps around
             w.add_tensor_raw(s);
             return w.to_bytes();
         },
         "gguf_tensor_out_of_bounds", "wrap"},
        {"tensor bytes missing",
         [] {
             auto w = base_writer();
             auto s = spec("short", ggml_type::f32, {64}, 0);  // declares 256 bytes, has none
             w.add_tensor_raw(s);
             return w.to_bytes();
         },
         "gguf_tensor_out_of_bounds", "short"},
        {"overlapping tensors",
         [] {
             auto w = base_writer();
             auto s = spec("dup_range", ggml_type::f32, {8}, 32);
             s.offset_raw = 0;  // same bytes as w0
             w.add_tensor_raw(s);
             return w.to_bytes();
         },
         "gguf_tensor_overlap", "dup_range"},
        {"misaligned offset",
         [] {
             auto w = base_writer();
             auto s = spec("mis", ggml_type::f32, {8}, 32);
             s.offset_raw = 68;
             w.add_tensor_raw(s);
             return w.to_bytes();
         },
         "gguf_tensor_misaligned", "mis"},
        {"duplicate tensor name",
         [] {
             auto w = base_writer();
             w.add_tensor_raw(spec("w0", ggml_type::f32, {8}, 32));
             return w.to_bytes();
         },
         "gguf_duplicate_tensor", "w0"},
        {"tensor name past EOF",
         [] {
             gguf_layout lay;
             auto b = base_writer().to_bytes(&lay);
             patch_u64(b, lay.tensor_info_offsets[1], 1ull << 40);
             return b;
         },
         "gguf_truncated", "tensor #1"},
        {"n_dims patched to 2^32-1",
         [] {
             gguf_layout lay;
             auto b = base_writer().to_bytes(&lay);
             patch_u32(b, lay.tensor_info_offsets[0] + 8 + 2, 0xFFFFFFFFu);
             return b;
         },
         "gguf_bad_dims", "w0"},
    };
}

}  // namespace

TEST(GgufMalformed, BaseFileIsValid) {
    auto f = gguf_file::from_bytes(base_writer().to_bytes());
    ASSERT_TRUE(f.ok()) << f.err().code << ": " << f.err().message;
    EXPECT_EQ(f->tensors().size(), 2u);
    // Version 2 has the same layout and is accepted.
    auto w = base_writer();
    w.overrides.version = 2;
    auto f2 = gguf_file::from_bytes(w.to_bytes());
    ASSERT_TRUE(f2.ok());
    EXPECT_EQ(f2->version(), 2u);
}

TEST(GgufMalformed, Table) {
    for (const auto& c : cases()) {
        auto bytes = c.make();
        auto f = gguf_file::from_bytes(bytes);
        ASSERT_FALSE(f.ok()) << c.name << ": parsed but should fail";
        EXPECT_EQ(f.err().code, c.code) << c.name << ": " << f.err().message;
        EXPECT_NE(f.err().message.find(c.message_part), std::string::npos)
            << c.name << ": message '" << f.err().message << "' lacks '" << c.message_part << "'";
    }
}

TEST(GgufMalformed, EveryTruncationFails) {
    gguf_layout lay;
    auto bytes = base_writer().to_bytes(&lay);
    // The last tensor's final byte; cutting anywhere before it must fail.
    const uint64_t end = lay.data_offset + lay.tensor_data_offsets.back() + 34;
    ASSERT_LE(end, bytes.size());
    size_t failures = 0;
    for (uint64_t cut = 0; cut < end; ++cut) {
        auto f = gguf_file::from_bytes(std::span(bytes.data(), size_t(cut)));
        ASSERT_FALSE(f.ok()) << "prefix of " << cut << " bytes parsed";
        const std::string& code = f.err().code;
        EXPECT_TRUE(code == "gguf_truncated" || code == "gguf_bad_count" ||
                    code == "gguf_tensor_out_of_bounds")
            << "cut " << cut << ": " << code << ": " << f.err().message;
        ++failures;
    }
    EXPECT_EQ(failures, end);
    EXPECT_TRUE(gguf_file::from_bytes(std::span(bytes.data(), size_t(end))).ok());
}

// A tensor of every type ordo decodes whose block data ends one byte short (the file is cut
// there) is refused, the message naming the tensor, its type and its blocks.
TEST(GgufMalformed, TruncatedBlockDataOfEveryType) {
    for (const auto& tr : k_ggml_types) {
        if (!is_supported(tr.type)) continue;
        SCOPED_TRACE(tr.name);
        auto w = base_writer();
        const uint64_t ne[] = {tr.block_size, 3};
        const std::string name = "last_" + std::string(tr.name);
        ASSERT_TRUE(
            w.add_tensor(name, tr.type, ne, std::vector<uint8_t>(3 * tr.block_bytes, 9)).ok());
        gguf_layout lay;
        auto bytes = w.to_bytes(&lay);
        const uint64_t end = lay.data_offset + lay.tensor_data_offsets.back() + 3 * tr.block_bytes;
        ASSERT_TRUE(gguf_file::from_bytes(std::span(bytes.data(), size_t(end))).ok());
        auto f = gguf_file::from_bytes(std::span(bytes.data(), size_t(end - 1)));
        ASSERT_FALSE(f.ok());
        EXPECT_EQ(f.err().code, "gguf_tensor_out_of_bounds");
        const std::string unit = tr.block_size == 1 ? " elements of " : " blocks of ";
        const std::string want = "tensor '" + name + "' (" + std::string(tr.name) + ", " +
                                 std::to_string(tr.block_size == 1 ? 3 * tr.block_size : 3) + unit +
                                 std::to_string(tr.block_bytes) + " bytes)";
        EXPECT_NE(f.err().message.find(want), std::string::npos)
            << f.err().message << "\nlacks: " << want;
    }
}

TEST(GgufMalformed, OpenReportsPath) {
    auto f = gguf_file::open("/nonexistent/dir/model.gguf");
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.err().code, "gguf_io");
    EXPECT_NE(f.err().message.find("/nonexistent/dir/model.gguf"), std::string::npos);
}
