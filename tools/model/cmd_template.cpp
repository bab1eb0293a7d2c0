// cmd_template.cpp: `ordo-model template FILE.jinja --messages FILE.json ...`: renders a chat
// template outside a server, with the variables transformers' apply_chat_template passes
// (messages, add_generation_prompt, tools, documents, bos_token, eos_token) plus any --var,
// and prints the text exactly (no newline added). For people writing or debugging templates.
#include <cstdio>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "template/template.hpp"
#include "template/value_json.hpp"
#include "tools/model/commands.hpp"

namespace ordo::tools {

namespace {

int run_template(std::span<const std::string> argv);

const command k_template{
    "template",
    "template FILE.jinja --messages FILE.json [--tools FILE.json] [--var NAME=JSON]... "
    "[--now YYYY-MM-DD] [--bos-token S] [--eos-token S] [--no-generation-prompt]",
    "render a chat template with messages (as transformers' apply_chat_template)", run_template};
const command_registrar k_template_reg{k_template};

result<std::string> read_text(const std::string& path, std::string_view what) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return make_error("bad_input", "cannot read " + std::string(what) + " " + path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

result<nlohmann::ordered_json> parse_json(const std::string& text, const std::string& where) {
    auto j = nlohmann::ordered_json::parse(text, nullptr, false);
    if (j.is_discarded()) return make_error("bad_input", where + " is not valid JSON");
    return j;
}

// A JSON file whose top level must be an array (messages, tools).
result<jinja::value> read_json_array(const std::string& path, std::string_view what) {
    auto text = read_text(path, what);
    if (!text) return text.err();
    auto j = parse_json(*text, std::string(what) + " file " + path);
    if (!j) return j.err();
    if (!j->is_array()) {
        return make_error("bad_input",
                          std::string(what) + " file " + path + " must hold a JSON array");
    }
    auto v = jinja::from_json(*j);
    if (!v) return make_error("bad_input", path + ": " + v.err().message);
    return *v;
}

// --var NAME=JSON: the value is JSON ("\"text\"", 3, [1, 2]).
status add_var(jinja::variables& vars, const std::string& spec) {
    const size_t eq = spec.find('=');
    if (eq == 0 || eq == std::string::npos) {
        return make_error("usage", "--var needs NAME=JSON, got '" + spec + "'");
    }
    auto j = parse_json(spec.substr(eq + 1), "--var " + spec.substr(0, eq));
    if (!j) return make_error("usage", j.err().message + " (quote strings: NAME='\"text\"')");
    auto v = jinja::from_json(*j);
    if (!v) return make_error("usage", v.err().message);
    vars[spec.substr(0, eq)] = *v;
    return {};
}

// --now YYYY-MM-DD: strftime_now() sees that day at 00:00:00.
result<std::tm> parse_day(const std::string& s) {
    std::tm t{};
    char tail = 0;
    if (std::sscanf(s.c_str(), "%4d-%2d-%2d%c", &t.tm_year, &t.tm_mon, &t.tm_mday, &tail) != 3 ||
        s.size() != 10 || t.tm_mon < 1 || t.tm_mon > 12 || t.tm_mday < 1 || t.tm_mday > 31) {
        return make_error("usage", "--now needs YYYY-MM-DD, got '" + s + "'");
    }
    t.tm_year -= 1900;
    t.tm_mon -= 1;
    const int day = t.tm_mday;
    const std::time_t when = timegm(&t);  // normalises and fills the weekday and year day
    std::tm out{};
    gmtime_r(&when, &out);
    if (out.tm_mday != day) return make_error("usage", "--now: no such day '" + s + "'");
    return out;
}

// parse_args keeps one value per option; --var may repeat, so it is taken out first.
result<std::vector<std::string>> take_vars(std::span<const std::string> argv,
                                           std::vector<std::string>& rest) {
    std::vector<std::string> vars;
    for (size_t i = 0; i < argv.size(); ++i) {
        if (argv[i] == "--") {
            rest.insert(rest.end(), argv.begin() + i, argv.end());
            break;
        }
        if (argv[i] == "--var") {
            if (i + 1 >= argv.size()) return make_error("usage", "--var needs a value");
            vars.push_back(argv[++i]);
        } else if (argv[i].starts_with("--var=")) {
            vars.push_back(argv[i].substr(6));
        } else {
            rest.push_back(argv[i]);
        }
    }
    return vars;
}

int run_template(std::span<const std::string> argv) {
    std::vector<std::string> rest;
    auto var_specs = take_vars(argv, rest);
    if (!var_specs) return report_error(var_specs.err(), &k_template);
    auto args = parse_args(
        rest,
        {{"messages", "tools", "now", "bos-token", "eos-token"}, {"no-generation-prompt"}, 1, 1});
    if (!args) return report_error(args.err(), &k_template);
    auto messages_path = args->option("messages");
    if (!messages_path) {
        return report_error(make_error("usage", "--messages FILE is required"), &k_template);
    }

    jinja::render_options opt;
    if (auto now = args->option("now")) {
        auto day = parse_day(*now);
        if (!day) return report_error(day.err(), &k_template);
        opt.now = *day;
    }
    jinja::variables vars;
    vars["add_generation_prompt"] = jinja::value(!args->flag("no-generation-prompt"));
    vars["tools"] = jinja::value::none();
    vars["documents"] = jinja::value::none();
    if (auto bos = args->option("bos-token")) vars["bos_token"] = jinja::value(*bos);
    if (auto eos = args->option("eos-token")) vars["eos_token"] = jinja::value(*eos);
    for (const std::string& v : *var_specs) {
        if (auto s = add_var(vars, v); !s) return report_error(s.err(), &k_template);
    }

    auto source = read_text(args->positional[0], "template");
    if (!source) return report_error(source.err());
    auto messages = read_json_array(*messages_path, "messages");
    if (!messages) return report_error(messages.err());
    vars["messages"] = *messages;
    if (auto tools_path = args->option("tools")) {
        auto tools = read_json_array(*tools_path, "tools");
        if (!tools) return report_error(tools.err());
        vars["tools"] = *tools;
    }

    auto tmpl = jinja::chat_template::parse(*source);
    if (!tmpl) return report_error(tmpl.err());
    auto text = tmpl->render(vars, opt);
    if (!text) return report_error(text.err());
    std::fwrite(text->data(), 1, text->size(), stdout);
    return k_exit_ok;
}

}  // namespace

}  // namespace ordo::tools
