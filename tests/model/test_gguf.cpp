// test_gguf.cpp: checks that the GGUF writer and reader agree, and that real files parse.
//
// How: builds files in memory with gguf_writer holding every metadata type (scalars, strings,
// arrays of numbers and strings, nested arrays) and a tensor of every known ggml type, reads
// them back with gguf_file and compares every value, shape, offset and byte; writes one to disk
// atomically and maps it with open(); checks the typed getters (absent vs wrong type, integer
// widening); parses ../shared/models/stories260K.gguf and compares against the header facts in
// that folder's README (skipped with a message when the folder is absent).
#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>

#include "model/gguf.hpp"
#include "model/gguf_writer.hpp"
#include "tests/support/shared_models.hpp"

using namespace ordo::model;

namespace {

const std::string k_stories = std::string(ORDO_SHARED_MODELS_DIR) + "/stories260K.gguf";

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 31);
    return v;
}

gguf_writer every_type_writer() {
    gguf_writer w;
    w.set_u8("t.u8", 200);
    w.set_i8("t.i8", -100);
    w.set_u16("t.u16", 60000);
    w.set_i16("t.i16", -30000);
    w.set_u32("t.u32", 4000000000u);
    w.set_i32("t.i32", -2000000000);
    w.set_u64("t.u64", 18000000000000000000ull);
    w.set_i64("t.i64", -9000000000000000000ll);
    w.set_f32("t.f32", 1.5f);
    w.set_f64("t.f64", -2.25e300);
    w.set_bool("t.bool", true);
    w.set_string("t.str", "h\xC3\xA9llo\n");
    w.set_string("t.empty", "");
    w.set_string_array("t.strs", {"a", "", "\xE2\x96\x81x"});
    const float fs[] = {0.5f, -1.0f, 3.0e-8f};
    w.set_f32_array("t.f32s", fs);
    const int32_t is[] = {1, -2, 3};
    w.set_i32_array("t.i32s", is);
    const uint32_t us[] = {7, 4000000000u};
    w.set_u32_array("t.u32s", us);
    gguf_array inner;
    inner.elem_type = gguf_value_type::u8;
    inner.items = {gguf_value(uint8_t(1)), gguf_value(uint8_t(2))};
    gguf_array outer;
    outer.elem_type = gguf_value_type::array;
    outer.items = {gguf_value(inner), gguf_value(gguf_array{gguf_value_type::u8, {}})};
    w.set("t.nested", gguf_value(outer));
    return w;
}

}  // namespace

TEST(GgufTypes, TableIsConsistent) {
    for (const auto& t : k_ggml_types) {
        EXPECT_EQ(find_type_traits(static_cast<uint32_t>(t.type)), &t);
        EXPECT_GT(t.block_size, 0u);
        EXPECT_GT(t.block_bytes, 0u);
        EXPECT_EQ(type_from_name(t.name), t.type);
    }
    EXPECT_EQ(block_bytes(ggml_type::q8_0), 34u);
    EXPECT_EQ(block_bytes(ggml_type::q4_0), 18u);
    EXPECT_EQ(block_size(ggml_type::q4_k), 256u);
    EXPECT_EQ(block_bytes(ggml_type::q6_k), 210u);
    EXPECT_FALSE(is_known_type(4));
    EXPECT_FALSE(is_known_type(1000));
    EXPECT_TRUE(is_supported(ggml_type::q4_0));
    EXPECT_TRUE(is_supported(ggml_type::q4_k));
    EXPECT_TRUE(is_supported(ggml_type::bf16));
    for (auto t : {ggml_type::q8_1, ggml_type::q8_k, ggml_type::iq2_xxs, ggml_type::iq4_nl,
                   ggml_type::tq1_0, ggml_type::mxfp4, ggml_type::i8, ggml_type::f64}) {
        EXPECT_FALSE(is_supported(t)) << type_name(t);
    }
    EXPECT_EQ(supported_type_names(),
              "f32, f16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k, bf16");
    EXPECT_EQ(supported_type_names(" or "),
              "f32, f16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k or bf16");
    // ggml's ids and geometry of the types added for llama.cpp's files (GGUF on disk).
    struct id_geometry {
        ggml_type type;
        uint32_t id, block_size, block_bytes;
    };
    for (const auto& g : {id_geometry{ggml_type::q4_1, 3, 32, 20},
                          {ggml_type::q5_0, 6, 32, 22},
                          {ggml_type::q5_1, 7, 32, 24},
                          {ggml_type::q2_k, 10, 256, 84},
                          {ggml_type::q3_k, 11, 256, 110},
                          {ggml_type::q4_k, 12, 256, 144},
                          {ggml_type::q5_k, 13, 256, 176},
                          {ggml_type::q6_k, 14, 256, 210},
                          {ggml_type::bf16, 30, 1, 2}}) {
        EXPECT_EQ(static_cast<uint32_t>(g.type), g.id) << type_name(g.type);
        EXPECT_EQ(block_size(g.type), g.block_size) << type_name(g.type);
        EXPECT_EQ(block_bytes(g.type), g.block_bytes) << type_name(g.type);
    }
    EXPECT_EQ(type_from_name("Q8_0"), ggml_type::q8_0);
    EXPECT_EQ(bytes_for(ggml_type::q8_0, 64), 68u);
    EXPECT_EQ(bytes_for(ggml_type::q8_0, 33), std::nullopt);
}

TEST(Gguf, MetadataRoundTripEveryType) {
    gguf_writer w = every_type_writer();
    auto bytes = w.to_bytes();
    auto f = gguf_file::from_bytes(bytes);
    ASSERT_TRUE(f.ok()) << f.err().code << ": " << f.err().message;
    EXPECT_EQ(f->version(), 3u);
    EXPECT_EQ(f->metadata().size(), w.kv_count());
    EXPECT_EQ(std::get<uint8_t>(f->find("t.u8")->data), 200);
    EXPECT_EQ(std::get<int8_t>(f->find("t.i8")->data), -100);
    EXPECT_EQ(std::get<uint16_t>(f->find("t.u16")->data), 60000);
    EXPECT_EQ(std::get<int16_t>(f->find("t.i16")->data), -30000);
    EXPECT_EQ(*f->get_u32("t.u32"), 4000000000u);
    EXPECT_EQ(*f->get_i64("t.i32"), -2000000000);
    EXPECT_EQ(std::get<uint64_t>(f->find("t.u64")->data), 18000000000000000000ull);
    EXPECT_EQ(*f->get_i64("t.i64"), -9000000000000000000ll);
    EXPECT_EQ(*f->get_f32("t.f32"), 1.5f);
    EXPECT_EQ(std::get<double>(f->find("t.f64")->data), -2.25e300);
    EXPECT_EQ(*f->get_bool("t.bool"), true);
    EXPECT_EQ(*f->get_string("t.str"), "h\xC3\xA9llo\n");
    EXPECT_EQ(*f->get_string("t.empty"), "");
    EXPECT_EQ(*f->get_string_array("t.strs"), (std::vector<std::string>{"a", "", "\xE2\x96\x81x"}));
    EXPECT_EQ(*f->get_f32_array("t.f32s"), (std::vector<float>{0.5f, -1.0f, 3.0e-8f}));
    EXPECT_EQ(*f->get_i32_array("t.i32s"), (std::vector<int32_t>{1, -2, 3}));
    auto nested = f->get_array("t.nested");
    ASSERT_TRUE(nested.ok());
    ASSERT_EQ((*nested)->elem_type, gguf_value_type::array);
    ASSERT_EQ((*nested)->items.size(), 2u);
    const gguf_array* first = (*nested)->items[0].as_array();
    ASSERT_NE(first, nullptr);
    ASSERT_EQ(first->items.size(), 2u);
    EXPECT_EQ(std::get<uint8_t>(first->items[1].data), 2);
    EXPECT_TRUE((*nested)->items[1].as_array()->items.empty());
    // Re-encoding what was read gives the same bytes.
    gguf_writer again;
    for (const auto& kv : f->metadata()) again.set(kv.key, kv.value);
    EXPECT_EQ(again.to_bytes(), bytes);
}

TEST(Gguf, TypedGettersSeparateAbsentFromWrongType) {
    auto f = gguf_file::from_bytes(every_type_writer().to_bytes());
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(f->get_u32("nope").err().code, "gguf_key_missing");
    EXPECT_EQ(f->get_u32("t.str").err().code, "gguf_key_wrong_type");
    EXPECT_EQ(f->get_u32("t.i32").err().code, "gguf_key_wrong_type");  // negative
    EXPECT_EQ(f->get_u32("t.u64").err().code, "gguf_key_wrong_type");  // does not fit
    EXPECT_EQ(f->get_i64("t.u64").err().code, "gguf_key_wrong_type");  // > INT64_MAX
    EXPECT_EQ(*f->get_u32("t.u8"), 200u);                              // widened
    EXPECT_EQ(*f->get_i64("t.i16"), -30000);
    EXPECT_EQ(f->get_bool("t.u8").err().code, "gguf_key_wrong_type");
    EXPECT_EQ(f->get_string_array("t.i32s").err().code, "gguf_key_wrong_type");
    EXPECT_EQ(f->get_f32_array("t.strs").err().code, "gguf_key_wrong_type");
    EXPECT_EQ(f->get_i32_array("t.u32s").err().code, "gguf_key_wrong_type");  // 4e9 too big
    EXPECT_EQ(*f->get_u32_or("nope", 7), 7u);
    EXPECT_EQ(f->get_u32_or("t.str", 7).err().code, "gguf_key_wrong_type");
    EXPECT_EQ(*f->get_f32_or("nope", 1e-5f), 1e-5f);
    EXPECT_EQ(*f->get_string_or("nope", "x"), "x");
    EXPECT_EQ(*f->get_bool_or("t.bool", false), true);
}

TEST(Gguf, TensorRoundTripEveryType) {
    gguf_writer w;
    w.set_string("general.architecture", "llama");
    std::vector<std::vector<uint8_t>> datas;
    for (const auto& t : k_ggml_types) {
        // Two rows of two blocks each, 3 dims to exercise ne[2].
        std::vector<uint64_t> ne = {uint64_t(t.block_size) * 2, 2, 1};
        auto data = pattern(size_t(t.block_bytes) * 4, uint8_t(t.block_bytes));
        ASSERT_TRUE(w.add_tensor("t." + std::string(t.name), t.type, ne, data).ok()) << t.name;
        datas.push_back(std::move(data));
    }
    gguf_layout lay;
    auto bytes = w.to_bytes(&lay);
    auto f = gguf_file::from_bytes(bytes);
    ASSERT_TRUE(f.ok()) << f.err().code << ": " << f.err().message;
    ASSERT_EQ(f->tensors().size(), k_ggml_types.size());
    EXPECT_EQ(f->data_offset(), lay.data_offset);
    EXPECT_EQ(f->data_offset() % 32, 0u);
    for (size_t i = 0; i < k_ggml_types.size(); ++i) {
        const auto& tr = k_ggml_types[i];
        const gguf_tensor_info* t = f->find_tensor("t." + std::string(tr.name));
        ASSERT_NE(t, nullptr);
        EXPECT_EQ(t->type, tr.type);
        EXPECT_EQ(t->n_dims, 3u);
        EXPECT_EQ(t->ne[0], tr.block_size * 2u);
        EXPECT_EQ(t->ne[1], 2u);
        EXPECT_EQ(t->ne[3], 1u);
        EXPECT_EQ(t->n_elements, tr.block_size * 4u);
        EXPECT_EQ(t->n_bytes, datas[i].size());
        EXPECT_EQ(t->offset, lay.tensor_data_offsets[i]);
        EXPECT_EQ(std::vector<uint8_t>(t->data.begin(), t->data.end()), datas[i]);
    }
    EXPECT_EQ(f->require_supported_types().err().code, "gguf_unsupported_type");
    EXPECT_TRUE(require_supported(*f->find_tensor("t.q8_0")).ok());
    EXPECT_TRUE(require_supported(*f->find_tensor("t.q4_k")).ok());
    const auto iq = require_supported(*f->find_tensor("t.iq2_xxs"));
    EXPECT_EQ(iq.err().code, "gguf_unsupported_type");
    EXPECT_NE(iq.err().message.find("'t.iq2_xxs' has type iq2_xxs"), std::string::npos)
        << iq.err().message;
    EXPECT_EQ(f->find_tensor("absent"), nullptr);
}

TEST(Gguf, WriterRejectsInvalidTensors) {
    gguf_writer w;
    const uint64_t ne_ok[] = {32};
    std::vector<uint8_t> q8(34);
    EXPECT_TRUE(w.add_tensor("a", ggml_type::q8_0, ne_ok, q8).ok());
    EXPECT_EQ(w.add_tensor("a", ggml_type::q8_0, ne_ok, q8).err().code, "gguf_duplicate_tensor");
    const uint64_t ne_bad_block[] = {16};
    EXPECT_EQ(w.add_tensor("b", ggml_type::q8_0, ne_bad_block, q8).err().code, "gguf_bad_shape");
    EXPECT_EQ(w.add_tensor("c", ggml_type::q8_0, ne_ok, std::vector<uint8_t>(33)).err().code,
              "gguf_bad_tensor_size");
    const uint64_t ne_zero[] = {32, 0};
    EXPECT_EQ(w.add_tensor("d", ggml_type::q8_0, ne_zero, q8).err().code, "gguf_bad_dims");
    const uint64_t ne_5[] = {1, 1, 1, 1, 1};
    EXPECT_EQ(w.add_tensor("e", ggml_type::f32, ne_5, std::vector<uint8_t>(4)).err().code,
              "gguf_bad_dims");
}

TEST(Gguf, AlignmentAndAtomicFileWrite) {
    gguf_writer w;
    w.set_alignment(64);
    const uint64_t ne[] = {3};
    ASSERT_TRUE(w.add_tensor("x", ggml_type::f32, ne, pattern(12, 1)).ok());
    ASSERT_TRUE(w.add_tensor("y", ggml_type::f16, ne, pattern(6, 2)).ok());
    auto dir = std::filesystem::temp_directory_path() / ("ordo_gguf_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "m.gguf").string();
    ASSERT_TRUE(w.write_file(path).ok());
    auto f = gguf_file::open(path);
    ASSERT_TRUE(f.ok()) << f.err().message;
    EXPECT_EQ(f->alignment(), 64u);
    EXPECT_EQ(f->data_offset() % 64, 0u);
    EXPECT_EQ(f->find_tensor("y")->offset, 64u);
    EXPECT_EQ(
        std::vector<uint8_t>(f->find_tensor("y")->data.begin(), f->find_tensor("y")->data.end()),
        pattern(6, 2));
    // Moving the file keeps tensor spans valid (the mapping does not move).
    gguf_file moved = std::move(*f);
    EXPECT_EQ(moved.find_tensor("x")->data[0], pattern(12, 1)[0]);
    // Only the final file is left behind: no temporary.
    size_t entries = 0;
    for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator(dir)) ++entries;
    EXPECT_EQ(entries, 1u);
    auto missing = gguf_file::open((dir / "absent.gguf").string());
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.err().code, "gguf_io");
    auto is_dir = gguf_file::open(dir.string());
    ASSERT_FALSE(is_dir.ok());
    EXPECT_EQ(is_dir.err().code, "gguf_io");
    std::filesystem::remove_all(dir);
}

TEST(Gguf, Stories260KHeader) {
    ORDO_REQUIRE_SHARED(k_stories);
    auto f = gguf_file::open(k_stories);
    ASSERT_TRUE(f.ok()) << f.err().message;
    EXPECT_EQ(f->version(), 3u);
    EXPECT_EQ(f->metadata().size(), 19u);
    EXPECT_EQ(f->tensors().size(), 48u);
    EXPECT_EQ(f->alignment(), 32u);
    EXPECT_EQ(f->data_offset(), 14176u);
    EXPECT_EQ(*f->get_string("general.architecture"), "llama");
    EXPECT_EQ(*f->get_u32("llama.embedding_length"), 64u);
    EXPECT_EQ(*f->get_u32("llama.block_count"), 5u);
    EXPECT_EQ(*f->get_u32("llama.attention.head_count_kv"), 4u);
    EXPECT_EQ(*f->get_u32("llama.feed_forward_length"), 172u);
    EXPECT_FLOAT_EQ(*f->get_f32("llama.attention.layer_norm_rms_epsilon"), 1e-5f);
    EXPECT_EQ(f->get_f32("llama.rope.freq_base").err().code, "gguf_key_missing");
    EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens")->size(), 512u);
    uint64_t total = 0;
    for (const auto& t : f->tensors()) {
        EXPECT_EQ(t.type, ggml_type::f32) << t.name;
        total += t.n_bytes;
    }
    EXPECT_EQ(f->data_offset() + total, f->file_size());
    auto shape = [&](const char* name) {
        const auto* t = f->find_tensor(name);
        EXPECT_NE(t, nullptr) << name;
        return t ? std::vector<uint64_t>(t->ne.begin(), t->ne.begin() + t->n_dims)
                 : std::vector<uint64_t>{};
    };
    EXPECT_EQ(shape("token_embd.weight"), (std::vector<uint64_t>{64, 512}));
    EXPECT_EQ(shape("output_norm.weight"), (std::vector<uint64_t>{64}));
    EXPECT_EQ(shape("output.weight"), (std::vector<uint64_t>{64, 512}));
    EXPECT_EQ(shape("blk.4.attn_k.weight"), (std::vector<uint64_t>{64, 32}));
    EXPECT_EQ(shape("blk.0.ffn_down.weight"), (std::vector<uint64_t>{172, 64}));
    EXPECT_EQ(shape("blk.2.ffn_gate.weight"), (std::vector<uint64_t>{64, 172}));
    EXPECT_TRUE(f->require_supported_types().ok());
}
