// cmd_mk.cpp: `ordo-model mk`: writes a synthetic Llama GGUF of any shape and weight type with
// deterministic random weights (model/synth.hpp owns the recipe; this file only turns the
// command line into synth_options and reports the result). TYPE is any type the CPU reference
// computes with, named as llama.cpp names it, case-insensitive: f32 f16 bf16 q4_0 q4_1 q5_0 q5_1
// q8_0 q2_k q3_k q4_k q5_k q6_k. Norms are always F32. --rope-llama3 FACTOR adds a Llama 3.1
// rope_freqs.weight (llama3_rope_factors: low 1, high 4, original context 8192), --rope-linear
// FACTOR linear RoPE scaling keys, --rope-base F llama.rope.freq_base (default 10000).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

#include "model/gguf.hpp"
#include "model/synth.hpp"
#include "tools/model/commands.hpp"

namespace ordo::tools {

namespace {

int run_mk(std::span<const std::string> argv);

const command k_mk{"mk",
                   "mk --out FILE --n-embd N --n-layer N --n-head N [--n-head-kv N] --n-ff N "
                   "(--n-vocab N | --vocab-from GGUF) --type TYPE --seed S "
                   "[--ctx N] [--tied] [--rope-base F] [--rope-llama3 FACTOR] "
                   "[--rope-linear FACTOR] [--json]",
                   "write a synthetic Llama model with seeded random weights", run_mk};
const command_registrar k_mk_reg{k_mk};

// Reads --name as a uint32 into dst; absent leaves dst unchanged unless required.
status read_u32(const parsed_args& a, std::string_view name, uint32_t& dst, bool required) {
    auto v = a.option_i64(name);
    if (!v) return v.err();
    if (!*v) {
        if (required) return make_error("usage", "--" + std::string(name) + " is required");
        return {};
    }
    if (**v < 0 || **v > std::numeric_limits<uint32_t>::max()) {
        return make_error(
            "usage", "--" + std::string(name) + " " + std::to_string(**v) + " is out of range");
    }
    dst = static_cast<uint32_t>(**v);
    return {};
}

result<model::synth_options> options_from(const parsed_args& a) {
    model::synth_options o;
    struct field {
        std::string_view name;
        uint32_t* dst;
        bool required;
    };
    const field fields[] = {
        {"n-embd", &o.n_embd, true}, {"n-layer", &o.n_layer, true},
        {"n-head", &o.n_head, true}, {"n-head-kv", &o.n_head_kv, false},
        {"n-ff", &o.n_ff, true},     {"n-vocab", &o.n_vocab, false},
        {"ctx", &o.n_ctx, false},
    };
    for (const auto& f : fields) {
        if (auto st = read_u32(a, f.name, *f.dst, f.required); !st) return st.err();
    }
    auto type = a.option("type");
    if (!type) {
        return make_error("usage",
                          "--type is required (" + model::supported_type_names(" or ") + ")");
    }
    auto t = model::type_from_name(*type);
    if (!t || !model::is_supported(*t)) {
        return make_error("usage",
                          "--type '" + *type + "' is not one of " + model::supported_type_names());
    }
    o.type = *t;
    auto seed = a.option_i64("seed");
    if (!seed) return seed.err();
    if (!*seed) return make_error("usage", "--seed is required");
    o.seed = static_cast<uint64_t>(**seed);
    o.vocab_from = a.option("vocab-from").value_or("");
    o.tied = a.flag("tied");
    // RoPE: the base, Llama 3.1 frequency factors (rope_freqs.weight) and linear scaling.
    const std::pair<std::string_view, float*> rope[] = {{"rope-base", &o.rope_freq_base},
                                                        {"rope-llama3", &o.rope_llama3_factor},
                                                        {"rope-linear", &o.rope_linear}};
    for (const auto& [name, dst] : rope) {
        auto v = a.option_f64(name);
        if (!v) return v.err();
        if (!*v) continue;
        if (!(**v > 0.0) || !std::isfinite(**v) || **v > std::numeric_limits<float>::max()) {
            return make_error("usage", "--" + std::string(name) + " must be a finite number > 0");
        }
        *dst = static_cast<float>(**v);
    }
    return o;
}

int run_mk(std::span<const std::string> argv) {
    const arg_spec spec{
        {"out", "n-embd", "n-layer", "n-head", "n-head-kv", "n-ff", "n-vocab", "vocab-from", "type",
         "seed", "ctx", "rope-base", "rope-llama3", "rope-linear"},
        {"tied", "json"},
        0,
        0};
    auto args = parse_args(argv, spec);
    if (!args) return report_error(args.err(), &k_mk);
    auto out = args->option("out");
    if (!out) return report_error(make_error("usage", "--out is required"), &k_mk);
    auto opt = options_from(*args);
    if (!opt) return report_error(opt.err(), &k_mk);

    const auto t0 = std::chrono::steady_clock::now();
    if (auto st = model::write_synth_model(*opt, *out); !st) return report_error(st.err());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    // Re-open what was written: a file mk cannot read back is a bug worth failing loudly on.
    auto f = model::gguf_file::open(*out);
    if (!f) return report_error(f.err());
    if (args->flag("json")) {
        std::printf("{\"out\": %s, \"bytes\": %llu, \"tensors\": %zu, \"seconds\": %s}\n",
                    json_string(*out).c_str(), static_cast<unsigned long long>(f->file_size()),
                    f->tensors().size(), json_number(seconds).c_str());
    } else {
        std::printf("wrote %s: %llu bytes, %zu tensors, %s weights, %.2f s\n", out->c_str(),
                    static_cast<unsigned long long>(f->file_size()), f->tensors().size(),
                    std::string(model::type_name(opt->type)).c_str(), seconds);
    }
    return k_exit_ok;
}

}  // namespace

}  // namespace ordo::tools
