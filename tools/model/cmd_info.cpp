// cmd_info.cpp: `ordo-model info FILE [--json]`: everything a person wants to know about a GGUF
// file before serving it: format facts, Llama hyperparameters (model/llama.hpp, with their
// defaults applied), tokenizer summary, the model fingerprint (model/fingerprint.hpp), all
// metadata, a histogram of tensor types (count and bytes per type, in type-id order; a type the
// CPU reference does not compute with is marked) and the tensor table.
//
// A file the reader rejects is a one-line error and exit 1. A readable file whose
// hyperparameters or tokenizer are unusable still prints, with the problem in place of that
// section, because diagnosing such files is what `info` is for.
#include <cstdio>
#include <vector>

#include "model/fingerprint.hpp"
#include "model/gguf.hpp"
#include "model/llama.hpp"
#include "model/tokenizer.hpp"
#include "tools/model/commands.hpp"

namespace ordo::tools {

namespace {

int run_info(std::span<const std::string> argv);

const command k_info{"info", "info FILE [--json]",
                     "format, hyperparameters, tokenizer, metadata and tensor table", run_info};
const command_registrar k_info_reg{k_info};

// Arrays longer than this print as a summary in JSON (a 32000-token vocab would drown the rest).
constexpr size_t k_json_array_items_max = 64;

std::string histogram_json(const model::gguf_file& f) {
    std::string out = "{";
    for (const auto& c : model::tensor_type_histogram(f)) {
        out += std::string(out.size() > 1 ? ", " : "") + json_string(model::type_name(c.type)) +
               ": {\"tensors\": " + std::to_string(c.tensors) +
               ", \"bytes\": " + std::to_string(c.bytes) +
               ", \"supported\": " + (model::is_supported(c.type) ? "true" : "false") + "}";
    }
    return out + "}";
}

std::string shape_json(const model::gguf_tensor_info& t) {
    std::string out = "[";
    for (uint32_t d = 0; d < t.n_dims; ++d) out += (d ? ", " : "") + std::to_string(t.ne[d]);
    return out + "]";
}

std::string value_json(const model::gguf_value& v) {
    using model::gguf_value_type;
    if (const auto* s = v.as_string()) return json_string(*s);
    if (const auto* b = std::get_if<bool>(&v.data)) return *b ? "true" : "false";
    if (auto f = v.as_f64()) return json_number(*f);
    if (auto i = v.as_i64()) return std::to_string(*i);
    if (auto u = v.as_u64()) return std::to_string(*u);
    const auto* a = v.as_array();
    if (a == nullptr) return "null";
    if (a->items.size() > k_json_array_items_max) {
        return "{\"array_of\": " + json_string(value_type_name(a->elem_type)) +
               ", \"length\": " + std::to_string(a->items.size()) + "}";
    }
    std::string out = "[";
    for (size_t i = 0; i < a->items.size(); ++i) {
        out += (i ? ", " : "") + value_json(a->items[i]);
    }
    return out + "]";
}

std::string hparams_json(const result<model::llama_hparams>& hp) {
    if (!hp) {
        return "{\"error\": {\"code\": " + json_string(hp.err().code) +
               ", \"message\": " + json_string(hp.err().message) + "}}";
    }
    auto num = [](const char* k, double v) {
        return "\"" + std::string(k) + "\": " + json_number(v);
    };
    return "{" + num("n_embd", hp->n_embd) + ", " + num("n_layer", hp->n_layer) + ", " +
           num("n_head", hp->n_head) + ", " + num("n_head_kv", hp->n_head_kv) + ", " +
           num("n_ff", hp->n_ff) + ", " + num("n_ctx", hp->n_ctx) + ", " +
           num("n_vocab", hp->n_vocab) + ", " + num("n_rot", hp->n_rot) + ", " +
           num("head_dim", hp->head_dim()) + ", " + num("rope_freq_base", hp->rope_freq_base) +
           ", " + num("rope_scale_linear", hp->rope_scale_linear) + ", " +
           num("rms_eps", hp->rms_eps) + "}";
}

std::string vocab_json(const result<model::vocab>& v) {
    if (!v) {
        return "{\"error\": {\"code\": " + json_string(v.err().code) +
               ", \"message\": " + json_string(v.err().message) + "}}";
    }
    return "{\"model\": " + json_string(v->model()) + ", \"pre\": " + json_string(v->pre()) +
           ", \"n_tokens\": " + std::to_string(v->size()) +
           ", \"bos\": " + std::to_string(v->bos()) + ", \"eos\": " + std::to_string(v->eos()) +
           ", \"unk\": " + std::to_string(v->unk()) + ", \"pad\": " + std::to_string(v->pad()) +
           ", \"add_bos\": " + (v->add_bos() ? "true" : "false") +
           ", \"add_eos\": " + (v->add_eos() ? "true" : "false") + "}";
}

// The fingerprint's hex, or null when the file is not a usable Llama model.
std::string fingerprint_json(const model::gguf_file& f) {
    auto fp = model::model_fingerprint(f);
    return fp ? json_string(fp->hex()) : std::string("null");
}

void print_json(const std::string& path, const model::gguf_file& f) {
    auto hp = model::read_llama_hparams(f);
    auto voc = model::vocab::from_gguf(f);
    std::string out = "{\"file\": " + json_string(path) +
                      ", \"version\": " + std::to_string(f.version()) +
                      ", \"alignment\": " + std::to_string(f.alignment()) +
                      ", \"data_offset\": " + std::to_string(f.data_offset()) +
                      ", \"file_size\": " + std::to_string(f.file_size()) + ", \"architecture\": " +
                      json_string(f.get_string_or("general.architecture", "").ok()
                                      ? *f.get_string_or("general.architecture", "")
                                      : "") +
                      ", \"hparams\": " + hparams_json(hp) + ", \"tokenizer\": " + vocab_json(voc) +
                      ", \"fingerprint\": " + fingerprint_json(f) +
                      ", \"tensor_types\": " + histogram_json(f) + ", \"metadata\": {";
    for (size_t i = 0; i < f.metadata().size(); ++i) {
        const auto& kv = f.metadata()[i];
        out += (i ? ", " : "") + json_string(kv.key) + ": " + value_json(kv.value);
    }
    out += "}, \"tensors\": [";
    for (size_t i = 0; i < f.tensors().size(); ++i) {
        const auto& t = f.tensors()[i];
        out += std::string(i ? ", " : "") + "{\"name\": " + json_string(t.name) +
               ", \"type\": " + json_string(model::type_name(t.type)) +
               ", \"shape\": " + shape_json(t) + ", \"bytes\": " + std::to_string(t.n_bytes) +
               ", \"offset\": " + std::to_string(t.offset) + "}";
    }
    std::printf("%s]}\n", out.c_str());
}

void print_hparams_text(const result<model::llama_hparams>& hp) {
    if (!hp) {
        std::printf("hyperparameters: unusable: %s: %s\n", hp.err().code.c_str(),
                    hp.err().message.c_str());
        return;
    }
    std::printf(
        "hyperparameters: n_embd %u, n_layer %u, n_head %u, n_head_kv %u "
        "(head_dim %u), n_ff %u, n_ctx %u, n_vocab %u, n_rot %u, rope_freq_base %g, "
        "rope_scale_linear %g, rms_eps %g\n",
        hp->n_embd, hp->n_layer, hp->n_head, hp->n_head_kv, hp->head_dim(), hp->n_ff, hp->n_ctx,
        hp->n_vocab, hp->n_rot, double(hp->rope_freq_base), double(hp->rope_scale_linear),
        double(hp->rms_eps));
}

void print_text(const std::string& path, const model::gguf_file& f) {
    std::printf("file: %s (%llu bytes)\n", path.c_str(), (unsigned long long)f.file_size());
    std::printf("gguf: version %u, alignment %llu, data offset %llu\n", f.version(),
                (unsigned long long)f.alignment(), (unsigned long long)f.data_offset());
    auto arch = f.get_string_or("general.architecture", "(absent)");
    std::printf("architecture: %s\n", arch ? arch->c_str() : "(not a string)");
    print_hparams_text(model::read_llama_hparams(f));
    if (auto v = model::vocab::from_gguf(f)) {
        std::printf(
            "tokenizer: %s, %zu tokens, bos %d, eos %d, unk %d, pad %d, add_bos %s, "
            "add_eos %s\n",
            v->describe().c_str(), v->size(), v->bos(), v->eos(), v->unk(), v->pad(),
            v->add_bos() ? "true" : "false", v->add_eos() ? "true" : "false");
    } else {
        std::printf("tokenizer: unusable: %s: %s\n", v.err().code.c_str(), v.err().message.c_str());
    }
    if (auto fp = model::model_fingerprint(f)) {
        std::printf("fingerprint: %s\n", fp->hex().c_str());
    } else {
        std::printf("fingerprint: unavailable: %s: %s\n", fp.err().code.c_str(),
                    fp.err().message.c_str());
    }
    std::printf("metadata (%zu keys):\n", f.metadata().size());
    for (const auto& kv : f.metadata()) {
        std::printf("  %s = %s\n", json_string(kv.key).c_str(),
                    model::format_value(kv.value).c_str());
    }
    std::printf("tensor types:\n");
    for (const auto& c : model::tensor_type_histogram(f)) {
        std::printf("  %-8s %6zu tensors %14llu bytes%s\n",
                    std::string(model::type_name(c.type)).c_str(), c.tensors,
                    (unsigned long long)c.bytes,
                    model::is_supported(c.type) ? "" : "  (ordo does not run this type)");
    }
    uint64_t total = 0;
    for (const auto& t : f.tensors()) total += t.n_bytes;
    std::printf("tensors (%zu, %llu bytes):\n", f.tensors().size(), (unsigned long long)total);
    std::printf("  %-32s %-8s %-22s %12s %12s\n", "name", "type", "shape", "bytes", "offset");
    for (const auto& t : f.tensors()) {
        std::printf("  %-32s %-8s %-22s %12llu %12llu\n", json_string(t.name).c_str(),
                    std::string(model::type_name(t.type)).c_str(), shape_json(t).c_str(),
                    (unsigned long long)t.n_bytes, (unsigned long long)t.offset);
    }
}

int run_info(std::span<const std::string> argv) {
    auto args = parse_args(argv, {{}, {"json"}, 1, 1});
    if (!args) return report_error(args.err(), &k_info);
    const std::string& path = args->positional[0];
    auto f = model::gguf_file::open(path);
    if (!f) return report_error(f.err());
    if (args->flag("json")) {
        print_json(path, *f);
    } else {
        print_text(path, *f);
    }
    return k_exit_ok;
}

}  // namespace

}  // namespace ordo::tools
