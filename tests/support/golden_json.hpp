// golden_json.hpp: test support — reads number arrays out of the golden json files in
// ../shared/models (trusted test data; a missing key gives an empty array, which fails the test
// that expects numbers rather than crashing it). Used by tests/model and tests/gpu.
#pragma once

#include <sstream>
#include <string>
#include <vector>

// The numbers of `"key": [...]` after `from` in the golden json (ours; trusted test data).
inline std::vector<double> json_numbers(const std::string& text, const std::string& key,
                                        std::size_t from) {
    std::vector<double> out;
    std::size_t k = text.find("\"" + key + "\"", from);
    if (k == std::string::npos) return out;
    std::size_t open = text.find('[', k), close = text.find(']', open);
    if (open == std::string::npos || close == std::string::npos) return out;
    std::string body = text.substr(open + 1, close - open - 1);
    for (char& c : body) {
        if (c == ',') c = ' ';
    }
    std::istringstream in(body);
    double v;
    while (in >> v) out.push_back(v);
    return out;
}
