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

// Every number inside the (possibly nested) array `"key": [...]` after `from`, in order:
// `[[3, 1.5], [4, 2.5]]` gives 3 1.5 4 2.5. Empty when the key is absent.
inline std::vector<double> json_nested_numbers(const std::string& text, const std::string& key,
                                               std::size_t from) {
    std::vector<double> out;
    std::size_t k = text.find("\"" + key + "\"", from);
    if (k == std::string::npos) return out;
    std::size_t open = text.find('[', k);
    if (open == std::string::npos) return out;
    std::size_t close = open;
    for (int depth = 0; close < text.size(); ++close) {
        if (text[close] == '[') ++depth;
        if (text[close] == ']' && --depth == 0) break;
    }
    std::string body = text.substr(open, close - open + 1);
    for (char& c : body) {
        if (c == ',' || c == '[' || c == ']') c = ' ';
    }
    std::istringstream in(body);
    double v;
    while (in >> v) out.push_back(v);
    return out;
}

// The string value of `"key": "..."` after `from` (no escapes inside: file names, paths);
// empty when the key is absent or its value is not a string (null).
inline std::string json_string_value(const std::string& text, const std::string& key,
                                     std::size_t from) {
    std::size_t k = text.find("\"" + key + "\":", from);
    if (k == std::string::npos) return {};
    std::size_t v = text.find_first_not_of(" \n", k + key.size() + 3);
    if (v == std::string::npos || text[v] != '"') return {};
    return text.substr(v + 1, text.find('"', v + 1) - v - 1);
}
