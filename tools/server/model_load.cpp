// model_load.cpp: see model_load.hpp.
#include "tools/server/model_load.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "gpu/runner/runner.hpp"
#include "model/fingerprint.hpp"

namespace ordo {
namespace {

std::string weight_type_of(const model::gguf_file& f) {
    const auto* t = f.find_tensor("blk.0.attn_q.weight");
    return t ? std::string(model::type_name(t->type)) : "unknown";
}

// An error about the content of the file at `path`: its message gets the path, once, in front.
// (gguf_file::open names the path in its own errors; those are passed on as they are.)
error in_file(const std::string& path, const error& e) {
    return make_error(e.code, path + ": " + e.message);
}

// The chat template: model.chat_template_path's file when set (it must read and parse: the
// operator asked for it), else the GGUF's tokenizer.chat_template when there is one.
result<std::shared_ptr<const net::chat_setup>> load_chat_template(const config::config& cfg,
                                                                  const model::gguf_file& file,
                                                                  const model::vocab& v) {
    auto text_of = [&](model::token_id id) { return v.valid(id) ? v.piece(id) : std::string(); };
    const std::string& path = cfg.model.chat_template_path;
    if (!path.empty()) {
        const size_t bytes_max = jinja::limits{}.source_bytes_max;
        std::error_code ec;
        const auto size = std::filesystem::file_size(path, ec);
        std::ifstream f(path, std::ios::binary);
        if (ec || !f) {
            return make_error("config_invalid",
                              "model.chat_template_path = " + path + ": cannot read the file");
        }
        if (size > bytes_max) {
            return make_error("config_invalid", "model.chat_template_path = " + path + ": " +
                                                    std::to_string(size) +
                                                    " bytes; a template "
                                                    "is at most " +
                                                    std::to_string(bytes_max));
        }
        std::stringstream ss;
        ss << f.rdbuf();
        auto s = net::make_chat_setup(ss.str(), "file:" + path, text_of(v.bos()), text_of(v.eos()));
        if (!s.problem.empty()) {
            return make_error("config_invalid",
                              "model.chat_template_path = " + path + ": " + s.problem);
        }
        return std::make_shared<const net::chat_setup>(std::move(s));
    }
    auto text = file.get_string_or("tokenizer.chat_template", "");
    if (!text.ok()) return text.err();
    const bool none = text->empty();
    return std::make_shared<const net::chat_setup>(
        net::make_chat_setup(*text, none ? "none" : "gguf", text_of(v.bos()), text_of(v.eos())));
}

}  // namespace

result<loaded_model> load_model(const config::config& cfg) {
    loaded_model m;
    m.generated = cfg.model.path.empty();
    m.path = m.generated ? cfg.model.generated_path : cfg.model.path;
    if (m.generated && !std::filesystem::exists(m.path)) {
        return make_error("model_missing",
                          "model.path is not set and the generated default model " + m.path +
                              " does not exist; run `bash tools/dev.sh run` (which makes it with "
                              "`ordo-model mk`) or set model.path / --model to a GGUF file");
    }
    auto file = model::gguf_file::open(m.path);
    if (!file.ok()) return file.err();
    // Hyperparameters and every tensor the forward pass reads; the views are not kept.
    auto weights = model::map_llama_weights(*file);
    if (!weights.ok()) return in_file(m.path, weights.err());
    // The server computes on the gpu: a type its kernels do not run can never serve.
    if (auto st = gpu::check_weight_types(*weights); !st) return in_file(m.path, st.err());
    // Any vocabulary serves token ids; one ordo cannot tokenize (an unknown BPE pre-tokenizer)
    // leaves the text ops answering tokenizer_unsupported (tokenizer::support()).
    auto voc = model::vocab::from_gguf(*file);
    if (!voc.ok()) return in_file(m.path, voc.err());
    auto chat = load_chat_template(cfg, *file, *voc);
    if (!chat.ok()) return chat.err();
    m.chat = std::move(*chat);
    m.hp = weights->hp;
    m.tokenizer.emplace(std::move(*voc));
    m.n_ctx = cfg.model.context_tokens ? cfg.model.context_tokens : m.hp.n_ctx;
    if (m.n_ctx > m.hp.n_ctx) {
        return make_error("config_invalid", "model.context_tokens = " + std::to_string(m.n_ctx) +
                                                " exceeds the context length " +
                                                std::to_string(m.hp.n_ctx) + " of " + m.path);
    }
    auto& i = m.info;
    i.path = m.path;
    i.architecture = m.hp.arch;
    i.fingerprint = model::model_fingerprint(*file, m.hp).hex();
    i.n_vocab = m.hp.n_vocab, i.n_ctx = m.hp.n_ctx, i.n_embd = m.hp.n_embd;
    i.n_layer = m.hp.n_layer, i.n_head = m.hp.n_head, i.n_head_kv = m.hp.n_head_kv;
    i.n_ff = m.hp.n_ff;
    i.weight_type = weight_type_of(*file);
    for (const auto& c : model::tensor_type_histogram(*file)) {
        i.tensor_types[std::string(model::type_name(c.type))] = c.tensors;
    }
    // The gpu runner may shorten the context further (KV pool, device) and says so at start.
    i.context_bound = m.n_ctx < m.hp.n_ctx ? "config" : "trained";
    i.chat_template = m.chat->source;
    i.generated = m.generated;
    if (m.generated) {
        i.hint =
            "this is a random-weight model generated by set-up (its output is gibberish); "
            "serve a real Llama GGUF with `ordo-server --model FILE` or model.path in "
            "etc/ordo.toml";
    }
    return m;
}

result<loaded_model> load_draft_model(const config::config& cfg, const loaded_model& served) {
    config::config c = cfg;
    c.model.path = cfg.speculative.draft_model;
    c.model.context_tokens = 0;
    c.model.chat_template_path.clear();
    auto draft = load_model(c);
    if (!draft.ok()) {
        return make_error(draft.err().code, "speculative.draft_model: " + draft.err().message);
    }
    const model::vocab& a = served.tokenizer->vocab();
    const model::vocab& b = draft->tokenizer->vocab();
    const auto differ = [&](const std::string& what) {
        return make_error("config_invalid",
                          "speculative.draft_model = " + draft->path +
                              ": its vocabulary is not the served model's (" + what +
                              "); a draft model must share the vocabulary of " + served.path);
    };
    if (a.size() != b.size()) {
        return differ(std::to_string(b.size()) + " tokens, not " + std::to_string(a.size()));
    }
    for (size_t i = 0; i < a.size(); i++) {
        const auto id = model::token_id(i);
        if (a.piece(id) != b.piece(id)) return differ("token " + std::to_string(i) + " differs");
    }
    if (b.size() > draft->hp.n_vocab) {
        return differ("its output head has " + std::to_string(draft->hp.n_vocab) + " rows");
    }
    return draft;
}

}  // namespace ordo
