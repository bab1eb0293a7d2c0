// cmd_generate.cpp: `ordo-model generate FILE --prompt TEXT -n N [--temp T] [--seed S] [--json]
// [--backend cpu|vulkan [--device SEL]]`: text generation with the CPU reference forward pass
// (model/reference.hpp, the default; slow on purpose, plain loops) or with the Vulkan runner
// through a real gpu actor (gpu/client/runner_generate.hpp; f32 KV, so the two paths can be
// compared on any model) on the device SEL picks (gpu.device's syntax: index, name substring,
// "auto"). It exists to check models and the gpu path by hand.
//
// The prompt is encoded with the model's tokenizer (BOS as the vocab says); generation stops
// after n tokens, or early on EOS or BOS (a generated BOS starts a new document, which is where
// llama2.c's run.c stops too). Text streams to stdout through the UTF-8-safe stream decoder;
// with --json one object {"tokens": [generated ids], "text": "generated text"} is printed.
#include <algorithm>
#include <cstdio>
#include <functional>

#include "model/gguf.hpp"
#include "model/llama.hpp"
#include "model/reference.hpp"
#include "model/tokenizer.hpp"
#include "tools/model/commands.hpp"
#ifdef ORDO_HAVE_GPU_RUNNER
#include "gpu/client/runner_generate.hpp"
#endif

namespace ordo::tools {

namespace {

int run_generate(std::span<const std::string> argv);

const command k_generate{"generate",
                         "generate FILE --prompt TEXT -n N [--temp T] [--seed S] [--json] "
                         "[--backend cpu|vulkan [--device SEL]]",
                         "generate text with the CPU reference (slow, for checking) or Vulkan",
                         run_generate};
const command_registrar k_generate_reg{k_generate};

// The shared parser only knows "--name"; the documented "-n N" is rewritten to "--n N".
std::vector<std::string> normalize_args(std::span<const std::string> argv) {
    std::vector<std::string> out(argv.begin(), argv.end());
    for (auto& a : out) {
        if (a == "--") break;
        if (a == "-n")
            a = "--n";
        else if (a.starts_with("-n="))
            a = "--n=" + a.substr(3);
    }
    return out;
}

struct generate_request {
    std::string path;
    std::string prompt;
    uint32_t n_predict = 0;
    float temperature = 0.0f;
    uint64_t seed = 0;
    bool json = false;
    bool vulkan = false;
    std::string device;  // gpu.device selector for --backend vulkan ("": the default choice)
};

result<generate_request> request_from(const parsed_args& a) {
    generate_request r;
    r.path = a.positional[0];
    r.prompt = a.option("prompt").value_or("");
    r.json = a.flag("json");
    const std::string backend = a.option("backend").value_or("cpu");
    if (backend != "cpu" && backend != "vulkan") {
        return make_error("usage", "--backend must be cpu or vulkan");
    }
    r.vulkan = backend == "vulkan";
    if (auto device = a.option("device")) {
        if (!r.vulkan) return make_error("usage", "--device needs --backend vulkan");
        r.device = *device;
    }
#ifndef ORDO_HAVE_GPU_RUNNER
    if (r.vulkan) {
        return make_error("backend_unavailable",
                          "the vulkan backend is not built into ordo-model; use --backend cpu");
    }
#endif
    auto n = a.option_i64("n");
    if (!n) return n.err();
    if (!*n) return make_error("usage", "-n N (tokens to generate) is required");
    if (**n < 1 || **n > model::k_llama_n_ctx_max) {
        return make_error("usage", "-n " + std::to_string(**n) + " is out of range");
    }
    r.n_predict = static_cast<uint32_t>(**n);
    auto temp = a.option_f64("temp");
    if (!temp) return temp.err();
    if (*temp && !(**temp >= 0.0 && **temp <= 100.0)) {
        return make_error("usage", "--temp must be between 0 and 100");
    }
    r.temperature = static_cast<float>(temp->value_or(0.0));
    auto seed = a.option_i64("seed");
    if (!seed) return seed.err();
    r.seed = static_cast<uint64_t>(seed->value_or(0));
    return r;
}

// The backend's generation loop: the CPU reference, or the gpu actor.
result<std::vector<uint32_t>> generate_with(const generate_request& req,
                                            const model::gguf_file& file, uint32_t n_ctx,
                                            const std::vector<uint32_t>& prompt,
                                            const model::generate_options& opt, model::sampler& smp,
                                            const std::function<void(uint32_t)>& on_token) {
#ifdef ORDO_HAVE_GPU_RUNNER
    if (req.vulkan) {
        gpu::vulkan_generate_options vo;
        vo.model_path = req.path;
        vo.device = req.device;
        return gpu::generate_vulkan(vo, prompt, opt, smp, on_token);
    }
#endif
    auto ref = model::reference_model::create(file, n_ctx);
    if (!ref) return ref.err();
    return model::generate(*ref, prompt, opt, smp, on_token);
}

// Runs the request; streams text to stdout unless json.
int run_request(const generate_request& req) {
    auto file = model::gguf_file::open(req.path);
    if (!file) return report_error(file.err());
    auto tok = model::tokenizer::from_gguf(*file);
    if (!tok) return report_error(tok.err());
    auto hp = model::read_llama_hparams(*file);
    if (!hp) return report_error(hp.err());

    const std::vector<model::token_id> ids = tok->encode(req.prompt, true);
    if (ids.empty()) {
        return report_error(
            make_error("empty_prompt", "the prompt is empty and this vocab adds no BOS"));
    }
    const std::vector<uint32_t> prompt(ids.begin(), ids.end());
    // Allocate only the positions this run uses (generate reports a context overflow).
    const uint64_t needed = prompt.size() + uint64_t{req.n_predict} - 1;
    const auto n_ctx = static_cast<uint32_t>(std::min<uint64_t>(needed, hp->n_ctx));

    model::generate_options opt;
    opt.n_predict = req.n_predict;
    for (model::token_id stop : tok->vocab().eog()) opt.stop_tokens.push_back(uint32_t(stop));
    if (tok->vocab().valid(tok->vocab().bos()))
        opt.stop_tokens.push_back(uint32_t(tok->vocab().bos()));
    model::sampler smp(req.temperature, req.seed);
    // Feed the prompt through the decoder first so the first generated piece keeps its space.
    model::stream_decoder dec(*tok);
    for (model::token_id id : ids) {
        auto text = dec.feed(id);
        if (text && !req.json) std::fputs(text->c_str(), stdout);
    }
    std::string generated_text;
    auto on_token = [&](uint32_t id) {
        auto text = dec.feed(static_cast<model::token_id>(id));
        if (!text) return;  // ids come from logits over this vocab: always in range
        generated_text += *text;
        if (!req.json) {
            std::fputs(text->c_str(), stdout);
            std::fflush(stdout);
        }
    };
    auto out = generate_with(req, *file, n_ctx, prompt, opt, smp, on_token);
    if (!out) return report_error(out.err());
    const std::string rest = dec.flush();
    generated_text += rest;
    if (!req.json) {
        std::printf("%s\n", rest.c_str());
        return k_exit_ok;
    }
    std::string js = "{\"tokens\": [";
    for (size_t i = 0; i < out->size(); ++i) js += (i ? ", " : "") + std::to_string((*out)[i]);
    js += "], \"text\": " + json_string(generated_text) + "}";
    std::printf("%s\n", js.c_str());
    return k_exit_ok;
}

int run_generate(std::span<const std::string> argv) {
    const std::vector<std::string> norm = normalize_args(argv);
    const arg_spec spec{{"prompt", "n", "temp", "seed", "backend", "device"}, {"json"}, 1, 1};
    auto args = parse_args(norm, spec);
    if (!args) return report_error(args.err(), &k_generate);
    auto req = request_from(*args);
    if (!req) return report_error(req.err(), req.err().code == "usage" ? &k_generate : nullptr);
    return run_request(*req);
}

}  // namespace

}  // namespace ordo::tools
