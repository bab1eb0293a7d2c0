// runner_generate.cpp: see runner_generate.hpp.
#include "gpu/client/runner_generate.hpp"

#include <algorithm>

#include "gpu/client/gpu_client.hpp"
#include "model/gguf.hpp"
#include "model/llama.hpp"

namespace ordo::gpu {

namespace {

constexpr std::uint32_t block_tokens = 16;
constexpr std::uint32_t prefill_chunk_max = 512;     // tokens per prefill step
constexpr std::uint64_t start_timeout_ms = 600'000;  // weight upload of a large model

}  // namespace

result<std::vector<std::uint32_t>> generate_vulkan(
    const vulkan_generate_options& vo, std::span<const std::uint32_t> prompt,
    const model::generate_options& opt, model::sampler& smp,
    const std::function<void(std::uint32_t)>& on_token) {
    if (prompt.empty()) return make_error("generate_empty_prompt", "no prompt tokens");
    std::uint32_t n_ctx = 0;
    {
        auto f = model::gguf_file::open(vo.model_path);
        if (!f) return f.err();
        auto hp = model::read_llama_hparams(*f);
        if (!hp) return hp.err();
        n_ctx = hp->n_ctx;
    }
    const std::uint64_t positions = prompt.size() + std::uint64_t{opt.n_predict} - 1;
    if (positions > n_ctx) {
        return make_error("generate_ctx_full", std::to_string(prompt.size()) + " prompt tokens + " +
                                                   std::to_string(opt.n_predict) +
                                                   " new tokens exceed the context of " +
                                                   std::to_string(n_ctx));
    }
    gpu_actor_options ao;
    ao.model_path = vo.model_path;
    ao.runner.device = vo.device;
    ao.runner.kv_f16 = vo.kv_f16;
    ao.runner.flush_every_layers = vo.flush_every_layers;
    ao.runner.watchdog_ms = vo.watchdog_ms;
    ao.runner.kv_block_tokens = block_tokens;
    ao.runner.kv_blocks = static_cast<std::uint32_t>((positions + block_tokens - 1) / block_tokens);
    ao.runner.max_batch_tokens = prefill_chunk_max;
    ao.runner.rows_max = 1;
    ao.runner.seqs_max = 1;
    auto session = gpu_session::start(ao, start_timeout_ms);
    if (!session) return session.err();
    std::vector<std::uint32_t> table(ao.runner.kv_blocks);
    for (std::uint32_t b = 0; b < table.size(); ++b) table[b] = b;

    std::vector<float> logits;
    std::uint64_t step_id = 0;
    // Runs tokens at pos0 (one step), leaving the last token's logits in `logits`.
    auto run = [&](std::span<const std::uint32_t> tokens, std::uint32_t pos0,
                   step_phase phase) -> status {
        step s;
        s.step_id = ++step_id;
        s.phase = phase;
        step_seq q;
        q.seq_id = 1;
        q.tokens.assign(tokens.begin(), tokens.end());
        q.pos0 = pos0;
        std::uint64_t blocks = (pos0 + tokens.size() + block_tokens - 1) / block_tokens;
        q.block_table.assign(table.begin(), table.begin() + blocks);
        q.logits_rows = 1;
        s.seqs.push_back(std::move(q));
        auto d = (*session)->run(s, logits, vo.watchdog_ms * 4);
        if (!d) return d.err();
        return {};
    };
    for (std::size_t p = 0; p < prompt.size(); p += prefill_chunk_max) {
        std::size_t n = std::min<std::size_t>(prefill_chunk_max, prompt.size() - p);
        status s = run(prompt.subspan(p, n), static_cast<std::uint32_t>(p), step_phase::prefill);
        if (!s) return s.err();
    }
    std::vector<std::uint32_t> out;
    for (std::uint32_t i = 0; i < opt.n_predict; ++i) {
        const std::uint32_t next = smp.sample(logits);
        out.push_back(next);
        if (on_token) on_token(next);
        bool stop = std::find(opt.stop_tokens.begin(), opt.stop_tokens.end(), next) !=
                    opt.stop_tokens.end();
        if (stop || i + 1 == opt.n_predict) break;
        std::uint32_t one[1] = {next};
        status s = run(one, static_cast<std::uint32_t>(prompt.size() + i), step_phase::decode);
        if (!s) return s.err();
    }
    status st = (*session)->stop();
    if (!st) return st.err();
    return out;
}

}  // namespace ordo::gpu
