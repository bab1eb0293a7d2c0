// make_seeds.cpp: writes a seed corpus for ordo_fuzz_gguf into the directory given as argv[1]:
// small valid GGUF files built with gguf_writer (every metadata type, tensors of every block
// type ordo decodes and one it does not, a tiny SentencePiece vocab), so the fuzzer starts deep
// inside the format.
#include <cstdio>
#include <string>

#include "model/gguf_writer.hpp"

using namespace ordo::model;

namespace {

void add_vocab(gguf_writer& w) {
    std::vector<std::string> pieces = {"<unk>",         "<s>", "</s>", "<0x41>", "<0xC3>",
                                       "\xE2\x96\x81",  "H",   "e",    "l",      "o",
                                       "\xE2\x96\x81H", "ll"};
    std::vector<float> scores(pieces.size(), 0.0f);
    scores[10] = 2.0f;
    scores[11] = 1.0f;
    std::vector<int32_t> types(pieces.size(), 1);
    types[0] = 2;
    types[1] = types[2] = 3;
    types[3] = types[4] = 6;
    w.set_string("tokenizer.ggml.model", "llama");
    w.set_string_array("tokenizer.ggml.tokens", pieces);
    w.set_f32_array("tokenizer.ggml.scores", scores);
    w.set_i32_array("tokenizer.ggml.token_type", types);
    w.set_u32("tokenizer.ggml.bos_token_id", 1);
    w.set_u32("tokenizer.ggml.padding_token_id", 0xFFFFFFFFu);
    w.set_bool("tokenizer.ggml.add_bos_token", true);
}

bool save(const std::string& dir, const char* name, const gguf_writer& w) {
    auto st = w.write_file(dir + "/" + name);
    if (!st) std::fprintf(stderr, "%s\n", st.err().message.c_str());
    return st.ok();
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: ordo_fuzz_gguf_seeds DIR\n");
        return 2;
    }
    std::string dir = argv[1];
    bool ok = true;
    {
        gguf_writer w;
        w.set_string("general.architecture", "llama");
        w.set_u8("a.u8", 1);
        w.set_i16("a.i16", -2);
        w.set_u64("a.u64", 3);
        w.set_f64("a.f64", 4.5);
        w.set_f32("a.f32", 5.5f);
        w.set_i64("a.i64", -6);
        add_vocab(w);
        ok &= save(dir, "vocab_only.gguf", w);
        const uint64_t ne[] = {32, 2};
        ok &= w.add_tensor("q8", ggml_type::q8_0, ne, std::vector<uint8_t>(68, 3)).ok();
        ok &= w.add_tensor("q4", ggml_type::q4_0, ne, std::vector<uint8_t>(36, 4)).ok();
        ok &= w.add_tensor("f16", ggml_type::f16, ne, std::vector<uint8_t>(128, 5)).ok();
        ok &= w.add_tensor("f32", ggml_type::f32, ne, std::vector<uint8_t>(256, 6)).ok();
        ok &= save(dir, "tensors.gguf", w);
    }
    {
        gguf_writer w;
        w.set_alignment(64);
        gguf_array inner{gguf_value_type::u16, {gguf_value(uint16_t(1))}};
        w.set("nested", gguf_value(gguf_array{gguf_value_type::array, {gguf_value(inner)}}));
        const uint64_t ne[] = {256};
        ok &= w.add_tensor("k", ggml_type::q4_k, ne, std::vector<uint8_t>(144, 7)).ok();
        ok &= save(dir, "aligned64_q4k.gguf", w);
    }
    {
        // One tensor of every block type ordo decodes, plus one it parses but does not run,
        // each with patterned bytes (the fuzzer mutates the scales and quants from there).
        gguf_writer w;
        for (const auto& tr : k_ggml_types) {
            const bool wanted = is_supported(tr.type) || tr.type == ggml_type::iq2_xxs;
            if (!wanted || tr.block_size == 1) continue;
            const uint64_t ne[] = {tr.block_size, 2};
            std::vector<uint8_t> bytes(2 * tr.block_bytes);
            for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 37 + 11);
            ok &= w.add_tensor(std::string(tr.name), tr.type, ne, bytes).ok();
        }
        const uint64_t ne[] = {16};
        ok &= w.add_tensor("bf16", ggml_type::bf16, ne, std::vector<uint8_t>(32, 0x3f)).ok();
        ok &= save(dir, "block_types.gguf", w);
    }
    return ok ? 0 : 1;
}
