// cross_rules.cpp: the configuration rules that tie two keys together, written as a table.
//
// Per-key bounds live in schema.cpp; a rule belongs here only when neither key alone is wrong.
// Rules that need the model (context_tokens <= the model's context) are checked when the model
// is loaded, not here.
#include <algorithm>
#include <array>
#include <cassert>

#include "actors/config/internal.hpp"

namespace ordo::config {
namespace {

struct cross_rule {
    std::string_view section_a, key_a;
    std::string_view section_b, key_b;
    bool (*holds)(const config&);
    std::string_view why;
};

constexpr auto rules = std::to_array<cross_rule>({
    {"scheduler", "max_batch_tokens", "scheduler", "max_sequences",
     [](const config& c) { return c.scheduler.max_batch_tokens >= c.scheduler.max_sequences; },
     "max_batch_tokens must be at least max_sequences (every decoding sequence takes one token "
     "of each step)"},
    {"scheduler", "max_tokens_default", "model", "context_tokens",
     [](const config& c) {
         return c.model.context_tokens == 0 ||
                c.scheduler.max_tokens_default < c.model.context_tokens;
     },
     "max_tokens_default must be less than a non-zero context_tokens (else every request "
     "without max_tokens would exceed the context)"},
    {"gpu", "kv_blocks", "gpu", "kv_block_tokens",
     [](const config& c) {
         return std::uint64_t{c.gpu.kv_blocks} * c.gpu.kv_block_tokens <= kv_pool_tokens_max;
     },
     "kv_blocks x kv_block_tokens must be at most 16777216 tokens (the scheduler's block table "
     "refuses a bigger pool)"},
    {"gpu", "warmup_ms_max", "gpu", "watchdog_ms",
     [](const config& c) { return c.gpu.warmup_ms_max >= c.gpu.watchdog_ms; },
     "warmup_ms_max must be at least watchdog_ms (a warm-up step also compiles kernels: it is "
     "never held to less than a step)"},
    {"speculative", "ngram_min", "speculative", "ngram_max",
     [](const config& c) { return c.speculative.ngram_min <= c.speculative.ngram_max; },
     "ngram_min must be at most ngram_max"},
    {"speculative", "draft_tokens_max", "scheduler", "max_batch_tokens",
     [](const config& c) {
         return c.speculative.mode == speculative_mode::off ||
                c.speculative.draft_tokens_max < c.scheduler.max_batch_tokens;
     },
     "draft_tokens_max must be less than max_batch_tokens (a verification runs its pending "
     "token and its drafts in one step)"},
    {"speculative", "draft_model", "speculative", "mode",
     [](const config& c) {
         return (c.speculative.mode == speculative_mode::draft) ==
                !c.speculative.draft_model.empty();
     },
     "mode = \"draft\" needs a draft_model, and a draft_model needs mode = \"draft\""},
    {"fault", "plan", "fault", "enabled",
     [](const config& c) { return c.fault.plan.empty() || c.fault.enabled; },
     "a fault plan needs enabled = true (faults are injected only where fault injection is on)"},
    {"fault", "plan", "kv", "enabled",
     [](const config& c) {
         return c.kv.enabled || std::none_of(c.fault.plan.begin(), c.fault.plan.end(), is_kv_fault);
     },
     "a plan with kv kinds (kv_*) needs [kv] enabled = true (no kv actor to fault without it)"},
});
static_assert(kv_pool_tokens_max == 16777216, "the kv pool rule's message names this bound");

}  // namespace

void check_cross_rules(const config& cfg, const std::vector<std::uint32_t>& lines, report& r) {
    const auto all = schema();
    for (const cross_rule& rule : rules) {
        if (rule.holds(cfg)) continue;
        const key_spec* a = find_key(rule.section_a, rule.key_a);
        const key_spec* b = find_key(rule.section_b, rule.key_b);
        assert(a != nullptr && b != nullptr);  // a rule naming a missing key is a typo here
        const std::uint32_t line = std::max(lines.at(static_cast<std::size_t>(a - all.data())),
                                            lines.at(static_cast<std::size_t>(b - all.data())));
        const std::string other =
            std::string(b->section) + "." + std::string(b->name) + " = " + value_toml(*b, cfg);
        r.add(line, *a, value_toml(*a, cfg) + ", " + other, rule.why);
    }
}

}  // namespace ordo::config
