// vocab_vectors.hpp: test support: llama.cpp's tokenizer test vectors (`<vocab>.gguf.inp` and
// `.out` in ../shared/models): cases split on "\n__ggml_vocab_test__\n" (a trailing empty piece
// is not a case), line i of .out holding case i's ids. Used by tests/model's tokenizer tests.
#pragma once

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace ordo::test {

struct vocab_case {
    std::string text;
    std::vector<int32_t> ids;
};

inline std::string read_file_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// The cases of `gguf_path`.inp/.out; empty when the files are missing or disagree in count.
inline std::vector<vocab_case> read_vocab_cases(const std::string& gguf_path) {
    std::string inp = read_file_bytes(gguf_path + ".inp");
    std::string outp = read_file_bytes(gguf_path + ".out");
    const std::string sep = "\n__ggml_vocab_test__\n";
    std::vector<vocab_case> cases;
    for (size_t pos = 0;;) {
        size_t next = inp.find(sep, pos);
        if (next == std::string::npos) {
            if (pos < inp.size()) cases.push_back({inp.substr(pos), {}});
            break;
        }
        cases.push_back({inp.substr(pos, next - pos), {}});
        pos = next + sep.size();
    }
    std::istringstream lines(outp);
    size_t i = 0;
    for (std::string line; std::getline(lines, line) && i < cases.size(); ++i) {
        std::istringstream ids(line);
        for (int32_t id; ids >> id;) cases[i].ids.push_back(id);
    }
    if (i != cases.size()) return {};
    return cases;
}

}  // namespace ordo::test
