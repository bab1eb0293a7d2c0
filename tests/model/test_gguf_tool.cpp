// test_gguf_tool.cpp: checks the `ordo-model` binary's info / tokenize / detokenize commands
// and its exit statuses, end to end.
//
// How: runs the built binary (ORDO_MODEL_TOOL) through the shell, captures stdout+stderr and the
// exit code. On stories260K it checks the reported header facts and the golden prompt's token
// ids; on llama-quantize's files (../shared/models/quant) the tensor-type histogram against the
// counts their README lists; on files crafted here (one with a type ordo does not run) (truncated
// copy, no tokenizer) and on bad command lines it checks for a one-line error naming the problem
// and exit 1 (bad input) or 2 (usage).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "model/gguf_writer.hpp"
#include "tests/support/server_process.hpp"
#include "tests/support/shared_models.hpp"

using namespace ordo::model;

namespace {

const std::string k_tool = ORDO_MODEL_TOOL;
const std::string k_stories = std::string(ORDO_SHARED_MODELS_DIR) + "/stories260K.gguf";

ordo::test::command_result run(const std::string& args) {
    return ordo::test::run_command("'" + k_tool + "' " + args + " 2>&1");
}

class ToolTest : public ::testing::Test {
protected:
    void SetUp() override {
        _dir = std::filesystem::temp_directory_path() /
               ("ordo_tool_" + std::to_string(getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        std::filesystem::create_directories(_dir);
    }
    void TearDown() override { std::filesystem::remove_all(_dir); }
    std::string path(const char* name) const { return (_dir / name).string(); }

    std::filesystem::path _dir;
};

#define SKIP_WITHOUT_STORIES() ORDO_REQUIRE_SHARED(k_stories)

}  // namespace

TEST_F(ToolTest, InfoOnStories) {
    SKIP_WITHOUT_STORIES();
    auto r = run("info " + k_stories);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("data offset 14176"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("tensors (48,"), std::string::npos);
    EXPECT_NE(r.output.find("metadata (19 keys)"), std::string::npos);
    EXPECT_NE(r.output.find("n_embd 64, n_layer 5, n_head 8, n_head_kv 4"), std::string::npos);
    EXPECT_NE(r.output.find("tokenizer: llama, 512 tokens, bos 1, eos 2"), std::string::npos);
    EXPECT_NE(r.output.find("\"blk.0.ffn_down.weight\""), std::string::npos);
    auto j = run("info --json " + k_stories);
    ASSERT_EQ(j.exit_code, 0) << j.output;
    EXPECT_EQ(j.output.front(), '{');
    EXPECT_NE(j.output.find("\"data_offset\": 14176"), std::string::npos);
    EXPECT_NE(j.output.find("\"shape\": [172, 64]"), std::string::npos);
    EXPECT_NE(j.output.find("\"n_tokens\": 512"), std::string::npos);
}

// The tensor-type histogram of llama-quantize's files equals the counts their README lists,
// and its bytes add up to the tensor table's total.
TEST_F(ToolTest, InfoHistogramOfQuantizedFiles) {
    const std::string dir = std::string(ORDO_SHARED_MODELS_DIR) + "/quant/";
    struct want {
        const char* file;
        std::vector<std::string> lines;  // "type count"
    };
    const want wants[] = {
        {"stories260K-Q4_K_M.gguf", {"f32 11", "f16 5", "q5_0 29", "q8_0 3"}},
        {"stories260K-Q5_1.gguf", {"f32 11", "f16 5", "q5_1 32"}},
        {"ktiny-Q4_K_M.gguf", {"f32 5", "q4_k 13", "q6_k 3"}},
        {"ktiny-Q2_K.gguf", {"f32 5", "q2_k 16"}},
        {"ktiny-Q3_K_S.gguf", {"f32 5", "q3_k 16"}},
    };
    for (const auto& w : wants) {
        SCOPED_TRACE(w.file);
        ORDO_REQUIRE_SHARED(dir + w.file);
        auto r = run("info --json " + dir + w.file);
        ASSERT_EQ(r.exit_code, 0) << r.output;
        const size_t at = r.output.find("\"tensor_types\": {");
        ASSERT_NE(at, std::string::npos) << r.output;
        const std::string hist = r.output.substr(at, r.output.find("}}", at) - at);
        uint64_t bytes_sum = 0;
        size_t types = 0;
        for (size_t p = hist.find("\"bytes\": "); p != std::string::npos;
             p = hist.find("\"bytes\": ", p + 1)) {
            bytes_sum += std::stoull(hist.substr(p + 9));
            ++types;
        }
        EXPECT_EQ(types, w.lines.size()) << hist;
        for (const auto& line : w.lines) {
            const std::string type = line.substr(0, line.find(' '));
            const std::string count = line.substr(line.find(' ') + 1);
            EXPECT_NE(hist.find("\"" + type + "\": {\"tensors\": " + count + ","),
                      std::string::npos)
                << line << " in " << hist;
        }
        auto t = run("info " + dir + w.file);
        ASSERT_EQ(t.exit_code, 0);
        EXPECT_NE(t.output.find("tensor types:\n"), std::string::npos);
        EXPECT_NE(t.output.find(", " + std::to_string(bytes_sum) + " bytes):"), std::string::npos)
            << "histogram bytes " << bytes_sum << " differ from the table's total\n"
            << t.output;
    }
}

// A type ordo does not run is listed (and marked) rather than refused: info is for diagnosis.
TEST_F(ToolTest, InfoListsTypesOrdoDoesNotRun) {
    gguf_writer w;
    w.set_string("general.architecture", "llama");
    const uint64_t ne[] = {256, 2};
    ASSERT_TRUE(w.add_tensor("a", ggml_type::iq2_xxs, ne, std::vector<uint8_t>(2 * 66, 1)).ok());
    ASSERT_TRUE(w.add_tensor("b", ggml_type::q4_k, ne, std::vector<uint8_t>(2 * 144, 1)).ok());
    ASSERT_TRUE(w.add_tensor("c", ggml_type::q4_k, ne, std::vector<uint8_t>(2 * 144, 1)).ok());
    ASSERT_TRUE(w.write_file(path("iq.gguf")).ok());
    auto r = run("info " + path("iq.gguf"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("  q4_k          2 tensors            576 bytes\n"), std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("  iq2_xxs       1 tensors            132 bytes  (ordo does not "
                            "run this type)"),
              std::string::npos)
        << r.output;
    auto j = run("info --json " + path("iq.gguf"));
    EXPECT_NE(j.output.find("\"tensor_types\": {\"q4_k\": {\"tensors\": 2, \"bytes\": 576, "
                            "\"supported\": true}, \"iq2_xxs\": {\"tensors\": 1, \"bytes\": 132, "
                            "\"supported\": false}}"),
              std::string::npos)
        << j.output;
}

TEST_F(ToolTest, TokenizeAndDetokenize) {
    SKIP_WITHOUT_STORIES();
    auto t = run("tokenize " + k_stories + " 'Once upon a time' --json");
    ASSERT_EQ(t.exit_code, 0) << t.output;
    EXPECT_EQ(t.output, "{\"tokens\": [1, 403, 407, 261, 378]}\n");
    auto nb = run("tokenize --no-bos --json " + k_stories + " 'Once upon a time'");
    EXPECT_EQ(nb.output, "{\"tokens\": [403, 407, 261, 378]}\n");
    auto d = run("detokenize " + k_stories + " 1 403 407 261 378 --json");
    ASSERT_EQ(d.exit_code, 0) << d.output;
    EXPECT_EQ(d.output, "{\"text\": \"Once upon a time\"}\n");
    auto plain = run("detokenize " + k_stories + " 1 403 407");
    EXPECT_EQ(plain.output, "Once upon\n");
    auto bad_id = run("detokenize " + k_stories + " 1 99999");
    EXPECT_EQ(bad_id.exit_code, 1);
    EXPECT_NE(bad_id.output.find("token_out_of_range"), std::string::npos) << bad_id.output;
    auto not_int = run("detokenize " + k_stories + " 1 x7");
    EXPECT_EQ(not_int.exit_code, 2);
}

TEST_F(ToolTest, MalformedFileIsOneLineError) {
    SKIP_WITHOUT_STORIES();
    // Prefixes of stories260K: cut inside the tensor table, and cut inside the tensor data.
    std::ifstream in(k_stories, std::ios::binary);
    std::vector<char> bytes(1000000);
    in.read(bytes.data(), std::streamsize(bytes.size()));
    std::ofstream(path("table.gguf"), std::ios::binary).write(bytes.data(), 14000);
    std::ofstream(path("data.gguf"), std::ios::binary).write(bytes.data(), 1000000);
    const std::pair<const char*, const char*> files[] = {
        {"table.gguf", "ordo-model: gguf_truncated: "},
        {"data.gguf", "ordo-model: gguf_tensor_out_of_bounds: "},
    };
    for (const auto& [file, prefix] : files) {
        for (const char* cmd : {"info ", "tokenize ", "info --json "}) {
            auto r = run(std::string(cmd) + path(file) + (cmd[0] == 't' ? " hi" : ""));
            EXPECT_EQ(r.exit_code, 1) << cmd << r.output;
            EXPECT_EQ(r.output.rfind(prefix, 0), 0u) << r.output;
            EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
        }
    }
}

TEST_F(ToolTest, FileWithoutTokenizer) {
    gguf_writer w;
    w.set_string("general.architecture", "llama");
    const uint64_t ne[] = {4};
    ASSERT_TRUE(w.add_tensor("x", ggml_type::f32, ne, std::vector<uint8_t>(16)).ok());
    ASSERT_TRUE(w.write_file(path("notok.gguf")).ok());
    auto t = run("tokenize " + path("notok.gguf") + " hello");
    EXPECT_EQ(t.exit_code, 1);
    EXPECT_NE(t.output.find("tokenizer_missing"), std::string::npos) << t.output;
    // info still describes it, with the problems in place of the missing sections.
    auto i = run("info " + path("notok.gguf"));
    EXPECT_EQ(i.exit_code, 0) << i.output;
    EXPECT_NE(i.output.find("tokenizer: unusable: tokenizer_missing"), std::string::npos);
    EXPECT_NE(i.output.find("hyperparameters: unusable"), std::string::npos) << i.output;
    auto missing = run("info " + path("absent.gguf"));
    EXPECT_EQ(missing.exit_code, 1);
    EXPECT_NE(missing.output.find("gguf_io"), std::string::npos);
}

TEST_F(ToolTest, CommandLineErrors) {
    auto none = run("");
    EXPECT_EQ(none.exit_code, 2);
    auto unknown = run("frobnicate");
    EXPECT_EQ(unknown.exit_code, 2);
    EXPECT_NE(unknown.output.find("unknown command 'frobnicate'"), std::string::npos);
    EXPECT_NE(unknown.output.find("info FILE"), std::string::npos);  // usage follows
    auto help = run("help");
    EXPECT_EQ(help.exit_code, 0);
    EXPECT_NE(help.output.find("tokenize FILE TEXT"), std::string::npos);
    auto bad_opt = run("info x.gguf --frob");
    EXPECT_EQ(bad_opt.exit_code, 2);
    EXPECT_NE(bad_opt.output.find("unknown option --frob"), std::string::npos);
    auto too_many = run("info a b");
    EXPECT_EQ(too_many.exit_code, 2);
}
