// cmd_tokenize.cpp: `ordo-model tokenize FILE TEXT` and `ordo-model detokenize FILE IDS...`,
// thin wrappers over model/tokenizer for checking what the engine will feed a model.
#include <charconv>
#include <cstdio>

#include "model/gguf.hpp"
#include "model/tokenizer.hpp"
#include "tools/model/commands.hpp"

namespace ordo::tools {

namespace {

result<model::tokenizer> load(const std::string& path) {
    auto f = model::gguf_file::open(path);
    if (!f) return f.err();
    return model::tokenizer::from_gguf(*f);
}

int run_tokenize(std::span<const std::string> argv);
int run_detokenize(std::span<const std::string> argv);

const command k_tokenize{"tokenize", "tokenize FILE TEXT [--json] [--no-bos] [--special]",
                         "text -> token ids (BOS added when the model says so; --special: "
                         "control-token text such as <|eot_id|> becomes that token)",
                         run_tokenize};
const command k_detokenize{"detokenize", "detokenize FILE ID... [--json] [--special]",
                           "token ids -> text (valid UTF-8; --special: control tokens shown)",
                           run_detokenize};
const command_registrar k_tokenize_reg{k_tokenize};
const command_registrar k_detokenize_reg{k_detokenize};

int run_tokenize(std::span<const std::string> argv) {
    auto args = parse_args(argv, {{}, {"json", "no-bos", "special"}, 2, 2});
    if (!args) return report_error(args.err(), &k_tokenize);
    auto tok = load(args->positional[0]);
    if (!tok) return report_error(tok.err());
    auto ids = tok->encode(args->positional[1], !args->flag("no-bos"), args->flag("special"));
    if (args->flag("json")) {
        std::string out = "{\"tokens\": [";
        for (size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
        std::printf("%s]}\n", out.c_str());
        return k_exit_ok;
    }
    // One token per line: id and its piece, so a person can see the split.
    for (model::token_id id : ids) {
        std::printf("%d\t%s\n", id, json_string(tok->vocab().piece(id)).c_str());
    }
    return k_exit_ok;
}

int run_detokenize(std::span<const std::string> argv) {
    auto args = parse_args(argv, {{}, {"json", "special"}, 1, SIZE_MAX});
    if (!args) return report_error(args.err(), &k_detokenize);
    std::vector<model::token_id> ids;
    for (size_t i = 1; i < args->positional.size(); ++i) {
        const std::string& s = args->positional[i];
        model::token_id id = 0;
        auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), id);
        if (ec != std::errc() || end != s.data() + s.size()) {
            return report_error(make_error("usage", "'" + s + "' is not a token id"),
                                &k_detokenize);
        }
        ids.push_back(id);
    }
    auto tok = load(args->positional[0]);
    if (!tok) return report_error(tok.err());
    auto text = tok->decode(ids, args->flag("special"));
    if (!text) return report_error(text.err());
    if (args->flag("json")) {
        std::printf("{\"text\": %s}\n", json_string(*text).c_str());
    } else {
        std::printf("%s\n", text->c_str());
    }
    return k_exit_ok;
}

}  // namespace

}  // namespace ordo::tools
