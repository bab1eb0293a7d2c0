// main.cpp: entry point of `ordo-model`, the command-line tool for people who hold a GGUF file.
// Dispatches to the sub-commands that cmd_*.cpp files register (see commands.hpp); owns only
// `help` and the unknown-command path.
#include <cstdio>
#include <string>
#include <vector>

#include "tools/model/commands.hpp"

namespace {

void print_usage(FILE* out) {
    std::fprintf(out, "usage: ordo-model COMMAND [ARGS...]\n\ncommands:\n");
    // Usage lines vary from 4 to 150 characters: print the summary indented below each.
    for (const auto& c : ordo::tools::all_commands()) {
        std::fprintf(out, "  %.*s\n      %.*s\n", int(c.usage.size()), c.usage.data(),
                     int(c.summary.size()), c.summary.data());
    }
    std::fprintf(out, "  help\n      this list\n");
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        print_usage(stderr);
        return ordo::tools::k_exit_usage;
    }
    std::string name = argv[1];
    if (name == "help" || name == "--help" || name == "-h") {
        print_usage(stdout);
        return ordo::tools::k_exit_ok;
    }
    const ordo::tools::command* cmd = ordo::tools::find_command(name);
    if (cmd == nullptr) {
        std::fprintf(stderr, "ordo-model: unknown command '%s'\n", name.c_str());
        print_usage(stderr);
        return ordo::tools::k_exit_usage;
    }
    std::vector<std::string> rest(argv + 2, argv + argc);
    return cmd->run(rest);
}
