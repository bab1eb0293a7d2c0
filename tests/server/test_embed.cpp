// test_embed.cpp: the msgpack `embed` op (docs/protocol.md "embed") on the real ordo-server,
// over TCP, against the CPU reference (model/reference.hpp embed).
//
// Checks, on a generated model (always) and on stories260K (skipped visibly without
// ../shared/models), with f32 KV: `input` text and `tokens` give done{embedding, prompt_tokens,
// pooling} with the reference's vector within 1e-4 per component (mean pooling, the default), an
// input longer than scheduler.max_batch_tokens (prefilled in chunks) included; embeds pipelined
// with a generate request on one connection all end once, the generate's text equal to what it
// gives alone; `[model] embedding_pooling = "last"` (with the default f16 KV, within 1e-3: K and V
// rounded to f16 move a normalized component by about 1e-4) changes the vector to the
// reference's last-token one and done.pooling says so; bad requests (neither or both of input and
// tokens, an empty input, an id outside the vocabulary) are bad_request naming the key, an input
// longer than the context is context_exceeded; stats counts scheduler.embeddings and
// embedding_tokens.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "model/gguf.hpp"
#include "model/reference.hpp"
#include "model/tokenizer.hpp"
#include "tests/support/server_process.hpp"
#include "tests/support/shared_models.hpp"

namespace {

using namespace ordo::test;
namespace fs = std::filesystem;

constexpr double k_tolerance = 1e-4;      // f32 KV
constexpr double k_tolerance_f16 = 1e-3;  // the default f16 KV

std::string temp_path(const std::string& name) {
    return scratch_path("embed", name);
}

std::string tiny_model() {
    return generated_model(ORDO_MODEL_BIN, temp_path("tiny.gguf"),
                           "--n-embd 32 --n-layer 2 --n-head 2 --n-head-kv 2 --n-ff 64 "
                           "--n-vocab 260 --type f32 --seed 3 --ctx 256");
}

// The CPU reference of one model: token ids of a text, and embeddings.
class reference {
public:
    explicit reference(const std::string& path) {
        auto f = ordo::model::gguf_file::open(path);
        EXPECT_TRUE(f.ok());
        _file = std::make_unique<ordo::model::gguf_file>(std::move(*f));
        auto t = ordo::model::tokenizer::from_gguf(*_file);
        EXPECT_TRUE(t.ok());
        _tok.emplace(std::move(*t));
    }
    std::vector<int32_t> ids(const std::string& text) const { return _tok->encode(text, true); }
    std::vector<float> embed(const std::vector<int32_t>& ids, ordo::model::pooling p) const {
        auto m = ordo::model::reference_model::create(*_file, 256);
        EXPECT_TRUE(m.ok());
        std::vector<uint32_t> u(ids.begin(), ids.end());
        auto e = ordo::model::embed(*m, u, p);
        EXPECT_TRUE(e.ok());
        return e.ok() ? *e : std::vector<float>{};
    }

private:
    std::unique_ptr<ordo::model::gguf_file> _file;
    std::optional<ordo::model::tokenizer> _tok;
};

void expect_embedding(const event& e, const std::vector<float>& want, uint32_t tokens,
                      const std::string& pooling, const std::string& what,
                      double tolerance = k_tolerance) {
    ASSERT_EQ(e.str("event"), "done") << what << ": " << e.outcome();
    const auto* f = field(e.o(), "embedding");
    ASSERT_NE(f, nullptr) << what;
    auto got = f->as<std::vector<float>>();
    ASSERT_EQ(got.size(), want.size()) << what;
    double worst = 0;
    for (size_t i = 0; i < got.size(); i++) {
        worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
    }
    EXPECT_LE(worst, tolerance) << what;
    EXPECT_EQ(e.u("prompt_tokens"), tokens) << what;
    EXPECT_EQ(e.str("pooling"), pooling) << what;
}

event call(tcp_client& c, const msgpack::sbuffer& f, uint64_t id) {
    EXPECT_TRUE(c.send(f));
    auto events = until_terminal(c, id);
    EXPECT_FALSE(events.empty());
    return events.empty() ? event{} : events.back();
}

const std::string short_text = "Once upon a time";
// Longer than the 32-token step budget below: prefilled in chunks.
const std::string long_text =
    "Once upon a time there was a little girl who lived in a village near the forest and "
    "every day she walked to the river to see the fish";

void check_model(const std::string& model, const std::string& name) {
    reference ref(model);
    const std::string cfg = temp_path(name + ".toml");
    std::ofstream(cfg) << "[scheduler]\nmax_batch_tokens = 32\nmax_sequences = 4\n"
                          "[gpu]\nkv_dtype = \"f32\"\n";
    server_process s;
    ASSERT_TRUE(s.start(ORDO_SERVER_BIN, {"--config", cfg, "--model", model})) << s.output();
    ASSERT_EQ(wait_healthy(s.port()), "") << s.output();
    tcp_client c;
    ASSERT_TRUE(c.connect(s.port()));
    const auto mean = ordo::model::pooling::mean;

    const auto short_ids = ref.ids(short_text), long_ids = ref.ids(long_text);
    ASSERT_GT(long_ids.size(), 32u) << "the long input must take several chunks";
    expect_embedding(call(c, frame("id", 1, "op", "embed", "input", short_text), 1),
                     ref.embed(short_ids, mean), uint32_t(short_ids.size()), "mean",
                     name + " short text");
    expect_embedding(call(c, frame("id", 2, "op", "embed", "input", long_text), 2),
                     ref.embed(long_ids, mean), uint32_t(long_ids.size()), "mean",
                     name + " long text");
    const std::vector<int32_t> ids = {1, 20, 40, 60, 80, 100, 7};
    expect_embedding(call(c, frame("id", 3, "op", "embed", "tokens", ids), 3), ref.embed(ids, mean),
                     uint32_t(ids.size()), "mean", name + " token ids");

    // Pipelined beside a generate request: each ends once, the generate as it does alone.
    event alone = call(
        c, frame("id", 4, "op", "generate", "tokens", ids, "max_tokens", 12, "temperature", 0), 4);
    ASSERT_EQ(alone.str("event"), "done") << alone.outcome();
    ASSERT_TRUE(c.send(frame("id", 10, "op", "embed", "input", long_text)));
    ASSERT_TRUE(c.send(
        frame("id", 11, "op", "generate", "tokens", ids, "max_tokens", 12, "temperature", 0)));
    ASSERT_TRUE(c.send(frame("id", 12, "op", "embed", "input", short_text)));
    std::map<uint64_t, event> ends;
    while (ends.size() < 3) {
        auto e = next(c);
        ASSERT_TRUE(e) << "the connection ended";
        if (e->terminal()) {
            ASSERT_EQ(ends.count(e->u("id")), 0u) << "two terminal events for " << e->u("id");
            ends[e->u("id")] = *e;
        }
    }
    expect_embedding(ends[10], ref.embed(long_ids, mean), uint32_t(long_ids.size()), "mean",
                     name + " batched long");
    expect_embedding(ends[12], ref.embed(short_ids, mean), uint32_t(short_ids.size()), "mean",
                     name + " batched short");
    EXPECT_EQ(ends[11].ints("tokens"), alone.ints("tokens")) << "generate beside embeds";

    // Refusals, each naming the key.
    auto refused = [&](const msgpack::sbuffer& f, uint64_t id, const std::string& code,
                       const std::string& text) {
        event e = call(c, f, id);
        EXPECT_EQ(e.str("event"), "error") << id;
        EXPECT_EQ(e.str("code"), code) << id << ": " << e.outcome();
        EXPECT_NE(e.str("message").find(text), std::string::npos) << id << ": " << e.outcome();
    };
    refused(frame("id", 20, "op", "embed"), 20, "bad_request", "\"input\"");
    refused(frame("id", 21, "op", "embed", "input", "a", "tokens", ids), 21, "bad_request",
            "got both");
    refused(frame("id", 22, "op", "embed", "input", ""), 22, "bad_request", "\"input\"");
    refused(frame("id", 23, "op", "embed", "tokens", std::vector<int32_t>{1, 100000}), 23,
            "bad_request", "\"tokens[1]\"");
    refused(frame("id", 24, "op", "embed", "tokens", std::vector<int32_t>(5000, 5)), 24,
            "context_exceeded", "context");
    event st = call(c, frame("id", 30, "op", "stats"), 30);
    const auto* sched = field(st.o(), "scheduler");
    ASSERT_NE(sched, nullptr);
    EXPECT_EQ(uint_field(*sched, "embeddings"), 5u);
    EXPECT_EQ(uint_field(*sched, "embedding_tokens"),
              2 * long_ids.size() + 2 * short_ids.size() + ids.size());
    EXPECT_EQ(s.stop(), 0) << s.output();
}

}  // namespace

TEST(embed_op, generated_model_matches_the_reference) {
    check_model(tiny_model(), "tiny");
}

TEST(embed_op, stories260K_matches_the_reference) {
    const std::string stories = std::string(ORDO_SHARED_MODELS_DIR) + "/stories260K.gguf";
    ORDO_REQUIRE_SHARED(stories);
    check_model(stories, "stories260K");
}

TEST(embed_op, configured_last_token_pooling) {
    reference ref(tiny_model());
    const std::string cfg = temp_path("last.toml");
    std::ofstream(cfg) << "[model]\nembedding_pooling = \"last\"\n";
    server_process s;
    ASSERT_TRUE(s.start(ORDO_SERVER_BIN, {"--config", cfg, "--model", tiny_model()})) << s.output();
    ASSERT_EQ(wait_healthy(s.port()), "") << s.output();
    tcp_client c;
    ASSERT_TRUE(c.connect(s.port()));
    const auto ids = ref.ids(long_text);
    expect_embedding(call(c, frame("id", 1, "op", "embed", "input", long_text), 1),
                     ref.embed(ids, ordo::model::pooling::last), uint32_t(ids.size()), "last",
                     "last-token pooling", k_tolerance_f16);
    EXPECT_EQ(s.stop(), 0) << s.output();
    EXPECT_NE(s.output().find("embeddings pool by last (model.embedding_pooling)"),
              std::string::npos)
        << s.output();
}
