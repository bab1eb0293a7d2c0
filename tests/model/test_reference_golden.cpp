// test_reference_golden.cpp: checks the CPU reference forward pass against the trained
// stories260K model's goldens (../shared/models/stories260K.golden.json).
//
// How: loads stories260K.gguf, runs BOS at position 0 and compares all 512 logits with the
// golden values (max abs difference <= 1e-4, the float64-vs-float32 tolerance the golden file
// states) and the argmax; then replays both greedy cases from their prompt token ids and
// requires every generated token to match. Also checks that forward rejects an out-of-vocab
// token and a position that skips ahead of the cache. Skips when the shared models folder is
// absent (a fresh clone).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "model/gguf.hpp"
#include "model/reference.hpp"
#include "tests/support/golden_json.hpp"
#include "tests/support/shared_models.hpp"

using namespace ordo::model;

namespace {

const std::string k_models = ORDO_SHARED_MODELS_DIR;

std::string read_text(const std::string& path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

class StoriesGolden : public ::testing::Test {
protected:
    void SetUp() override {
        ORDO_REQUIRE_SHARED(k_models + "/stories260K.gguf");
        golden = read_text(k_models + "/stories260K.golden.json");
        ASSERT_FALSE(golden.empty());
        auto f = gguf_file::open(k_models + "/stories260K.gguf");
        ASSERT_TRUE(f.ok()) << f.err().message;
        file = std::make_unique<gguf_file>(std::move(*f));
        auto m = reference_model::create(*file);
        ASSERT_TRUE(m.ok()) << m.err().code << ": " << m.err().message;
        model = std::make_unique<reference_model>(std::move(*m));
    }

    // Replays the named case: its prompt ids, then greedy decoding of as many tokens as golden.
    void check_case(const std::string& name) {
        const size_t at = golden.find("\"" + name + "\"");
        ASSERT_NE(at, std::string::npos) << name;
        const auto prompt_d = json_numbers(golden, "prompt_token_ids", at);
        const auto want_d = json_numbers(golden, "generated_token_ids", at);
        ASSERT_FALSE(prompt_d.empty());
        ASSERT_FALSE(want_d.empty());
        std::vector<uint32_t> prompt(prompt_d.begin(), prompt_d.end());
        std::vector<uint32_t> want(want_d.begin(), want_d.end());
        sampler greedy(0.0f, 0);
        generate_options opt;
        opt.n_predict = static_cast<uint32_t>(want.size());
        auto got = generate(*model, prompt, opt, greedy);
        ASSERT_TRUE(got.ok()) << got.err().message;
        ASSERT_EQ(got->size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) {
            ASSERT_EQ((*got)[i], want[i]) << name << ": first mismatch at generated token " << i;
        }
    }

    std::string golden;
    std::unique_ptr<gguf_file> file;
    std::unique_ptr<reference_model> model;
};

}  // namespace

TEST_F(StoriesGolden, HyperparametersFromMetadata) {
    const auto& hp = model->hparams();
    EXPECT_EQ(hp.n_embd, 64u);
    EXPECT_EQ(hp.n_layer, 5u);
    EXPECT_EQ(hp.n_head, 8u);
    EXPECT_EQ(hp.n_head_kv, 4u);
    EXPECT_EQ(hp.n_ff, 172u);
    EXPECT_EQ(hp.n_vocab, 512u);
    EXPECT_EQ(hp.n_rot, 8u);
    EXPECT_EQ(hp.rope_freq_base, 10000.0f);  // absent in the file: the default
    EXPECT_FLOAT_EQ(hp.rms_eps, 1e-5f);
}

TEST_F(StoriesGolden, LogitsAfterBosMatch) {
    const size_t at = golden.find("\"logits_after_bos_pos0\"");
    ASSERT_NE(at, std::string::npos);
    const auto want = json_numbers(golden, "values", at);
    ASSERT_EQ(want.size(), 512u);
    auto logits = model->forward(1, 0);
    ASSERT_TRUE(logits.ok()) << logits.err().message;
    ASSERT_EQ(logits->size(), 512u);
    double max_diff = 0.0;
    size_t argmax = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        max_diff = std::max(max_diff, std::fabs((*logits)[i] - want[i]));
        if ((*logits)[i] > (*logits)[argmax]) argmax = i;
    }
    EXPECT_LE(max_diff, 1e-4);
    EXPECT_EQ(argmax, 403u);
}

TEST_F(StoriesGolden, GreedyBosOnly200Steps) {
    check_case("bos_only_200_steps");
}

TEST_F(StoriesGolden, GreedyOnceUponATime64Steps) {
    check_case("once_upon_a_time_64_steps");
}

TEST_F(StoriesGolden, RejectsBadTokenAndPosition) {
    auto r = model->forward(512, 0);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.err().code, "reference_bad_token");
    r = model->forward(1, 1);  // nothing cached yet: position 1 would skip position 0
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.err().code, "reference_bad_pos");
    ASSERT_TRUE(model->forward(1, 0).ok());
    EXPECT_EQ(model->n_past(), 1u);
}

TEST_F(StoriesGolden, RewindReproducesLogits) {
    // Running pos 0..2, then rewinding to pos 1 with the same token must give the same logits.
    ASSERT_TRUE(model->forward(1, 0).ok());
    auto a = model->forward(403, 1);
    ASSERT_TRUE(a.ok());
    const std::vector<float> first(a->begin(), a->end());
    ASSERT_TRUE(model->forward(407, 2).ok());
    auto b = model->forward(403, 1);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(first, std::vector<float>(b->begin(), b->end()));
    EXPECT_EQ(model->n_past(), 2u);
}
