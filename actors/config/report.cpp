// report.cpp: wording of configuration problems — the error collector, "did you mean"
// suggestions, and values rendered as TOML text. Used by config.cpp and cross_rules.cpp.
#include <algorithm>
#include <array>
#include <cassert>

#include "actors/config/internal.hpp"

namespace ordo::config {
namespace {

// A file full of mistakes still gets a readable answer: the first problems, then a count.
constexpr std::size_t report_items_max = 64;

// Values quoted in an error are cut here; the line number finds the rest.
constexpr std::size_t value_text_bytes_max = 80;

// Names longer than this get no suggestion (edit distance is quadratic in length).
constexpr std::size_t suggest_name_bytes_max = 64;

// Edit distance between two short names (bounded by suggest_name_bytes_max).
std::size_t edit_distance(std::string_view a, std::string_view b) {
    assert(a.size() <= suggest_name_bytes_max && b.size() <= suggest_name_bytes_max);
    std::array<std::size_t, suggest_name_bytes_max + 1> prev{}, cur{};
    for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
        cur[0] = i;
        for (std::size_t j = 1; j <= b.size(); ++j) {
            const std::size_t subst = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
            cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, subst});
        }
        prev = cur;
    }
    return prev[b.size()];
}

std::string clip(std::string_view text) {
    if (text.size() <= value_text_bytes_max) return std::string(text);
    std::size_t cut = value_text_bytes_max;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
    return std::string(text.substr(0, cut)) + "...";
}

}  // namespace

std::string report::prefix(std::uint32_t line) const {
    return line == 0 ? _source + ": " : _source + ":" + std::to_string(line) + ": ";
}

void report::add(std::uint32_t line, const key_spec& spec, std::string_view value_text,
                 std::string_view why) {
    _items.push_back({line, prefix(line) + std::string(spec.section) + "." +
                                std::string(spec.name) + " = " + clip(value_text) + ": " +
                                std::string(why)});
}

void report::add_unknown(std::uint32_t line, std::string_view key, std::string_view why) {
    _items.push_back({line, prefix(line) + clip(key) + ": " + std::string(why)});
}

status report::finish() {
    if (_items.empty()) return {};
    // toml++ tables iterate in key order, not file order; readers expect file order.
    std::stable_sort(_items.begin(), _items.end(),
                     [](const item& a, const item& b) { return a.line < b.line; });
    std::string text;
    const std::size_t shown = std::min(_items.size(), report_items_max);
    for (std::size_t i = 0; i < shown; ++i) text += (i ? "\n" : "") + _items[i].text;
    if (_items.size() > shown) {
        text += "\n" + _source + ": ... and " + std::to_string(_items.size() - shown) +
                " more problems";
    }
    return make_error("config_invalid", std::move(text));
}

std::string suggestion(std::string_view section, std::string_view name) {
    if (name.empty() || name.size() > suggest_name_bytes_max) return "";
    // Close enough to be a typo, not so loose that every short name matches.
    const std::size_t limit = std::min<std::size_t>(2, (name.size() - 1) / 2);
    std::size_t best = limit + 1;
    std::string best_text;
    auto consider = [&](std::size_t d, std::string text) {
        if (d < best) {
            best = d;
            best_text = std::move(text);
        }
    };
    if (section.empty()) {
        for (std::string_view s : sections()) {
            consider(edit_distance(name, s), "[" + std::string(s) + "]");
        }
    }
    for (const key_spec& spec : schema()) {
        if (!section.empty() && spec.section == section && spec.name == name) continue;
        // A key of another section costs one edit more, unless its name matches exactly (then
        // the key was simply put in the wrong section).
        const std::size_t d = edit_distance(name, spec.name);
        const bool other = spec.section != section && d != 0;
        consider(d + (other ? 1 : 0), std::string(spec.section) + "." + std::string(spec.name));
    }
    return best_text.empty() ? "" : "; did you mean " + best_text + "?";
}

std::int64_t choice_index(const key_spec& spec, std::string_view name) {
    for (std::size_t i = 0; i < spec.choices.size(); ++i) {
        if (spec.choices[i] == name) return static_cast<std::int64_t>(i);
    }
    return -1;
}

std::string choice_list_from_names(const key_spec& spec, const std::vector<std::string>& names,
                                   std::vector<std::int64_t>& out) {
    out.clear();
    for (const std::string& name : names) {
        const std::int64_t i = choice_index(spec, name);
        if (i < 0) return clip(quote_toml(name)) + " is not " + choices_text(spec);
        out.push_back(i);
    }
    return check_list_value(spec, out);
}

std::string quote_toml(std::string_view s) {
    static constexpr char hex[] = "0123456789ABCDEF";
    std::string out = "\"";
    for (const char ch : s) {
        const auto c = static_cast<unsigned char>(ch);
        switch (c) {
            case '"':
                out += "\\\"";
                break;
            case '\\':
                out += "\\\\";
                break;
            case '\n':
                out += "\\n";
                break;
            case '\t':
                out += "\\t";
                break;
            case '\r':
                out += "\\r";
                break;
            default:
                if (c < 0x20 || c == 0x7F) {
                    out += "\\u00";
                    out += hex[c >> 4];
                    out += hex[c & 0xF];
                } else {
                    out += ch;
                }
        }
    }
    return out + "\"";
}

std::string value_toml(const key_spec& spec, const config& cfg) {
    switch (spec.kind) {
        case value_kind::string:
            return quote_toml(spec.get_str(cfg));
        case value_kind::integer:
            return std::to_string(spec.get_int(cfg));
        case value_kind::boolean:
            return spec.get_int(cfg) != 0 ? "true" : "false";
        case value_kind::choice: {
            const std::int64_t i = spec.get_int(cfg);
            if (i < 0 || static_cast<std::size_t>(i) >= spec.choices.size()) {
                return std::to_string(i);  // only reachable for a config built wrongly in code
            }
            return quote_toml(spec.choices[static_cast<std::size_t>(i)]);
        }
        case value_kind::choice_list: {
            std::string out = "[";
            for (const std::int64_t i : spec.get_list(cfg)) {
                if (out.size() > 1) out += ", ";
                // An index out of range is only reachable for a config built wrongly in code.
                const bool known = i >= 0 && static_cast<std::size_t>(i) < spec.choices.size();
                out += known ? quote_toml(spec.choices[static_cast<std::size_t>(i)])
                             : std::to_string(i);
            }
            return out + "]";
        }
        case value_kind::string_list: {
            std::string out = "[";
            for (const std::string& entry : spec.get_strs(cfg)) {
                out += (out.size() > 1 ? ", " : "") + quote_toml(entry);
            }
            return out + "]";
        }
    }
    return "?";
}

}  // namespace ordo::config
