// json_schema.cpp: see json_schema.hpp.
#include "grammar/json_schema.hpp"

#include <algorithm>
#include <array>
#include <initializer_list>
#include <map>
#include <set>
#include <string_view>
#include <vector>

namespace ordo::grammar {
namespace {

using json = nlohmann::ordered_json;

// The JSON primitives every converted schema shares. Whitespace and numbers are bounded as in
// grammar/json.hpp, so a model cannot pad forever inside the grammar.
constexpr std::string_view k_primitives = R"(ws ::= | " " | "\n" [ \t]{0,20}
char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
string ::= "\"" char* "\""
integer ::= "-"? ([0-9] | [1-9] [0-9]{1,15})
number ::= integer ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?
boolean ::= "true" | "false"
null ::= "null"
value ::= object-any | array-any | string | number | boolean | null
object-any ::= "{" ws ( string ws ":" ws value ws ("," ws string ws ":" ws value ws)* )? "}"
array-any ::= "[" ws ( value ws ("," ws value ws)* )? "]"
)";

// Keywords that annotate and never constrain: ignored.
constexpr std::array<std::string_view, 11> k_annotations{
    "title",    "description", "$schema",  "$id",       "$comment", "default",
    "examples", "deprecated",  "readOnly", "writeOnly", "$anchor"};

// String formats with a cheap shape (validators treat format as an annotation by default, so
// these shapes only make the output look as asked).
const std::map<std::string, std::string, std::less<>>& formats() {
    static const std::map<std::string, std::string, std::less<>> f = {
        {"date", R"("\"" [0-9]{4} "-" [0-1] [0-9] "-" [0-3] [0-9] "\"")"},
        {"time",
         R"("\"" [0-2] [0-9] ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? ("Z" | [+-] [0-2] [0-9] ":" [0-5] [0-9]) "\"")"},
        {"date-time",
         R"("\"" [0-9]{4} "-" [0-1] [0-9] "-" [0-3] [0-9] "T" [0-2] [0-9] ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? ("Z" | [+-] [0-2] [0-9] ":" [0-5] [0-9]) "\"")"},
        {"uuid",
         R"("\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} "\"")"},
    };
    return f;
}

// A GBNF literal matching exactly `text`.
std::string literal(std::string_view text) {
    std::string out = "\"";
    for (char c : text) {
        auto u = static_cast<unsigned char>(c);
        if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (c == '\n') {
            out += "\\n";
        } else if (c == '\r') {
            out += "\\r";
        } else if (c == '\t') {
            out += "\\t";
        } else if (u < 0x20 || u == 0x7F) {
            static constexpr char hex[] = "0123456789ABCDEF";
            out += "\\x";
            out += hex[u >> 4];
            out += hex[u & 15];
        } else {
            out += c;
        }
    }
    return out + "\"";
}

// A JSON pointer's next token (RFC 6901 escapes).
std::string pointer(const std::string& at, std::string_view token) {
    std::string out = at + "/";
    for (char c : token) {
        if (c == '~')
            out += "~0";
        else if (c == '/')
            out += "~1";
        else
            out += c;
    }
    return out;
}

}  // namespace

class json_schema_rules::converter {
public:
    explicit converter(const json_schema_limits& limits) : _limits(limits) {}

    // The expression of one schema; its $refs resolve inside it.
    result<std::string> add(const json& schema) {
        _root = &schema;
        _refs.clear();
        auto top = expr(schema, "", 0);
        _root = nullptr;
        return top;
    }

    std::string rules() const {
        std::string g;
        for (const auto& [name, body] : _rules) g += name + " ::= " + body + "\n";
        return g + std::string(k_primitives);
    }

private:
    error bad(const std::string& at, const std::string& what) const {
        return make_error("bad_schema",
                          "schema" + (at.empty() ? std::string() : " at " + at) + ": " + what);
    }

    result<std::string> add_rule(std::string body) {
        if (_rules.size() >= _limits.rules_max) {
            return make_error("bad_schema", "the schema needs more than " +
                                                std::to_string(_limits.rules_max) +
                                                " grammar rules");
        }
        std::string name = "s" + std::to_string(_rules.size());
        _rules.emplace_back(name, std::move(body));
        return name;
    }

    // The expression for the schema at `at`.
    result<std::string> expr(const json& s, const std::string& at, std::size_t depth) {
        if (depth > _limits.depth_max) {
            return bad(at, "nested deeper than " + std::to_string(_limits.depth_max));
        }
        if (s.is_boolean()) {
            if (s.get<bool>()) return std::string("value");
            return bad(at, "the schema false allows nothing");
        }
        if (!s.is_object()) return bad(at, "a schema is an object or a boolean");
        static constexpr std::array<std::string_view, 20> known{
            "type",        "enum",       "const",       "anyOf",
            "oneOf",       "allOf",      "$ref",        "$defs",
            "definitions", "properties", "required",    "additionalProperties",
            "items",       "minItems",   "maxItems",    "minLength",
            "maxLength",   "format",     "uniqueItems", "nullable"};
        for (const auto& [k, v] : s.items()) {
            if (!is_annotation(k) && std::find(known.begin(), known.end(), k) == known.end()) {
                return bad(at, "\"" + k + "\" is not supported");
            }
        }
        if (s.contains("$defs") && !at.empty()) return bad(at, "$defs only at the top level");
        if (s.contains("$ref")) {
            if (!constraint_beside(s, {"$ref"}).empty()) {
                return bad(at, "$ref beside other constraints is not supported");
            }
            return ref(s["$ref"], pointer(at, "$ref"), depth);
        }
        // A combinator or a value list stands alone (beside a type list at most, for enum and
        // const): the grammar takes the branches or the values as they are, so any other
        // constraint beside them would go unchecked.
        for (std::string_view k : {"const", "enum", "anyOf", "oneOf", "allOf"}) {
            if (!s.contains(k)) continue;
            const bool values = k == "const" || k == "enum";
            const std::string other = constraint_beside(s, {k, values ? "type" : k});
            if (!other.empty()) {
                return bad(at,
                           "\"" + other + "\" beside \"" + std::string(k) + "\" is not supported");
            }
        }
        if (s.contains("const") || s.contains("enum")) {
            // The values the type (when given) also allows, each written as it is.
            json values = s.contains("const") ? json::array({s["const"]}) : s["enum"];
            if (!values.is_array() || values.empty()) {
                return bad(pointer(at, "enum"), "a non-empty array");
            }
            auto types = type_list(s, at);
            if (!types) return types.err();
            std::string alt;
            for (const json& v : values) {
                if (!types->empty() &&
                    std::none_of(types->begin(), types->end(),
                                 [&](const std::string& t) { return has_type(v, t); })) {
                    continue;
                }
                alt += (alt.empty() ? "" : " | ") + literal(v.dump());
            }
            if (alt.empty()) return bad(at, "no value of the enum has the schema's type");
            return "(" + alt + ")";
        }
        for (const char* k : {"anyOf", "oneOf"}) {
            if (!s.contains(k)) continue;
            const json& a = s[k];
            if (!a.is_array() || a.empty()) return bad(pointer(at, k), "a non-empty array");
            // oneOf: exactly one branch may match, which a grammar cannot count; taken only
            // when no document can match two branches (their JSON types are disjoint).
            if (std::string_view(k) == "oneOf" && !disjoint(a)) {
                return bad(pointer(at, k),
                           "a oneOf whose branches may overlap is not supported "
                           "(branches of distinct types are)");
            }
            std::string alt;
            for (std::size_t i = 0; i < a.size(); ++i) {
                auto e = expr(a[i], pointer(pointer(at, k), std::to_string(i)), depth + 1);
                if (!e) return e.err();
                alt += (alt.empty() ? "" : " | ") + *e;
            }
            return "(" + alt + ")";
        }
        if (s.contains("allOf")) {
            const json& a = s["allOf"];
            if (!a.is_array() || a.size() != 1) {
                return bad(pointer(at, "allOf"), "only an allOf of one schema is supported");
            }
            return expr(a[0], pointer(pointer(at, "allOf"), "0"), depth + 1);
        }
        auto listed = type_list(s, at);
        if (!listed) return listed.err();
        std::vector<std::string> types = std::move(*listed);
        if (types.empty()) {
            // No type: keywords of a type constrain the instances of that type only, and every
            // other type is allowed as it is.
            if (constraint_beside(s, {"nullable"}).empty()) return std::string("value");
            types = {"object", "array", "string", "number", "boolean", "null"};
        }
        if (s.value("nullable", false)) types.push_back("null");
        std::string alt;
        for (const std::string& t : types) {
            auto e = typed(s, t, at, depth);
            if (!e) return e.err();
            alt += (alt.empty() ? "" : " | ") + *e;
        }
        return types.size() == 1 ? alt : "(" + alt + ")";
    }

    // The names in "type" (none: absent).
    result<std::vector<std::string>> type_list(const json& s, const std::string& at) const {
        std::vector<std::string> types;
        if (!s.contains("type")) return types;
        const json& t = s["type"];
        if (t.is_string()) {
            types.push_back(t.get<std::string>());
        } else if (t.is_array() && !t.empty()) {
            for (const json& x : t) {
                if (!x.is_string()) return bad(pointer(at, "type"), "names of types");
                types.push_back(x.get<std::string>());
            }
        } else {
            return bad(pointer(at, "type"), "a type name or an array of them");
        }
        return types;
    }

    static bool has_type(const json& v, const std::string& t) {
        if (t == "integer") {
            return v.is_number_integer() ||
                   (v.is_number_float() &&
                    v.get<double>() ==
                        static_cast<double>(static_cast<long long>(v.get<double>())));
        }
        return (t == "number" && v.is_number()) || (t == "string" && v.is_string()) ||
               (t == "boolean" && v.is_boolean()) || (t == "null" && v.is_null()) ||
               (t == "object" && v.is_object()) || (t == "array" && v.is_array());
    }

    // The JSON types a branch can match, as bits (object, array, string, number, boolean,
    // null); all of them when it does not say.
    static unsigned kinds(const json& b) {
        constexpr unsigned all = 0x3F;
        if (!b.is_object()) return all;
        auto bit = [](const std::string& t) -> unsigned {
            if (t == "object") return 1;
            if (t == "array") return 2;
            if (t == "string") return 4;
            if (t == "number" || t == "integer") return 8;
            if (t == "boolean") return 16;
            if (t == "null") return 32;
            return 0x3F;
        };
        unsigned k = 0;
        if (b.contains("type") && b["type"].is_string()) {
            k = bit(b["type"].get<std::string>());
        } else if (b.contains("type") && b["type"].is_array()) {
            for (const json& t : b["type"]) k |= t.is_string() ? bit(t.get<std::string>()) : all;
        } else {
            return all;
        }
        if (b.value("nullable", false)) k |= 32;
        return k;
    }

    static bool disjoint(const json& branches) {
        unsigned seen = 0;
        for (const json& b : branches) {
            const unsigned k = kinds(b);
            if ((k & seen) != 0) return false;
            seen |= k;
        }
        return true;
    }

    static bool is_annotation(std::string_view k) {
        return std::find(k_annotations.begin(), k_annotations.end(), k) != k_annotations.end();
    }

    // The first keyword of `s` that constrains, besides `keep`, annotations and the
    // definitions a $ref reads ("" when there is none).
    static std::string constraint_beside(const json& s,
                                         std::initializer_list<std::string_view> keep) {
        for (const auto& [k, v] : s.items()) {
            if (!is_annotation(k) && k != "$defs" && k != "definitions" &&
                std::find(keep.begin(), keep.end(), k) == keep.end()) {
                return k;
            }
        }
        return "";
    }

    result<std::string> ref(const json& r, const std::string& at, std::size_t depth) {
        if (!r.is_string()) return bad(at, "a string");
        const std::string target = r.get<std::string>();
        std::string name;
        for (std::string_view prefix : {"#/$defs/", "#/definitions/"}) {
            if (target.rfind(prefix, 0) == 0) {
                name = target.substr(prefix.size());
                const json* defs = nullptr;
                const std::string section(prefix.substr(2, prefix.size() - 3));
                if (_root->is_object() && _root->contains(section)) defs = &(*_root)[section];
                if (defs == nullptr || !defs->is_object() || !defs->contains(name)) {
                    return bad(at, "\"" + target + "\" names nothing");
                }
                auto it = _refs.find(target);
                if (it != _refs.end()) return it->second;  // also a recursive reference
                // Reserve the rule's name first, so a schema that refers to itself ends.
                const std::size_t slot = _rules.size();
                auto rule = add_rule("");
                if (!rule) return rule.err();
                _refs[target] = *rule;
                auto body = expr((*defs)[name], "/" + section + "/" + name, depth + 1);
                if (!body) return body.err();
                _rules[slot].second = std::move(*body);
                return *rule;
            }
        }
        return bad(at, "only \"#/$defs/NAME\" and \"#/definitions/NAME\" references are supported");
    }

    result<std::uint32_t> count(const json& s, const char* key, const std::string& at,
                                std::uint32_t otherwise) {
        if (!s.contains(key)) return otherwise;
        const json& v = s[key];
        if (!v.is_number_integer() || v.get<std::int64_t>() < 0 ||
            v.get<std::int64_t>() > _limits.repeat_max) {
            return bad(pointer(at, key), "an integer 0.." + std::to_string(_limits.repeat_max));
        }
        return v.get<std::uint32_t>();
    }

    // "x{min,max}" (max ~0u: unbounded).
    static std::string repeat(const std::string& x, std::uint32_t min, std::uint32_t max) {
        if (max == ~0u) return min == 0 ? x + "*" : x + "{" + std::to_string(min) + ",}";
        return x + "{" + std::to_string(min) + "," + std::to_string(max) + "}";
    }

    result<std::string> typed(const json& s, const std::string& t, const std::string& at,
                              std::size_t depth) {
        if (t == "null" || t == "boolean" || t == "number" || t == "integer") return t;
        if (t == "string") {
            if (s.contains("format")) {
                const json& f = s["format"];
                auto it = f.is_string() ? formats().find(f.get<std::string>()) : formats().end();
                if (it == formats().end()) {
                    return bad(pointer(at, "format"),
                               f.dump() + " is not supported (date, time, date-time, uuid are)");
                }
                return "(" + it->second + ")";
            }
            auto lo = count(s, "minLength", at, 0);
            if (!lo) return lo.err();
            auto hi = count(s, "maxLength", at, ~0u);
            if (!hi) return hi.err();
            if (*lo == 0 && *hi == ~0u) return std::string("string");
            if (*hi < *lo) return bad(at, "maxLength below minLength");
            return "(\"\\\"\" " + repeat("char", *lo, *hi) + " \"\\\"\")";
        }
        if (t == "array") {
            if (s.value("uniqueItems", false)) {
                return bad(pointer(at, "uniqueItems"), "uniqueItems true is not supported");
            }
            std::string item = "value";
            if (s.contains("items")) {
                auto e = expr(s["items"], pointer(at, "items"), depth + 1);
                if (!e) return e.err();
                item = *e;
            }
            auto lo = count(s, "minItems", at, 0);
            if (!lo) return lo.err();
            auto hi = count(s, "maxItems", at, ~0u);
            if (!hi) return hi.err();
            if (*hi < *lo) return bad(at, "maxItems below minItems");
            auto one = add_rule(item + " ws");
            if (!one) return one.err();
            std::string body;
            if (*hi == 0) {
                body = "\"[\" ws \"]\"";
            } else {
                // The first item, then the rest with commas: min and max shifted by the first.
                const std::uint32_t rest_lo = *lo == 0 ? 0 : *lo - 1;
                const std::uint32_t rest_hi = *hi == ~0u ? ~0u : *hi - 1;
                std::string items =
                    *one + " " + repeat("(\",\" ws " + *one + ")", rest_lo, rest_hi);
                body = "\"[\" ws " + (*lo == 0 ? "(" + items + ")?" : items) + " \"]\"";
            }
            return add_rule(body);
        }
        if (t == "object") return object(s, at, depth);
        return bad(pointer(at, "type"), "\"" + t + "\" is not a JSON Schema type");
    }

    result<std::string> object(const json& s, const std::string& at, std::size_t depth) {
        if (s.contains("required") && !s["required"].is_array()) {
            return bad(pointer(at, "required"), "an array of names");
        }
        if (!s.contains("properties")) {
            if (!s.value("required", json::array()).empty()) {
                return bad(pointer(at, "required"), "required names need their properties");
            }
            // A map: any keys, values of additionalProperties' schema (absent or true: any).
            std::string v = "value";
            if (s.contains("additionalProperties")) {
                const json& ap = s["additionalProperties"];
                if (ap.is_boolean() && !ap.get<bool>()) return add_rule("\"{\" ws \"}\"");
                auto e = expr(ap, pointer(at, "additionalProperties"), depth + 1);
                if (!e) return e.err();
                v = *e;
            }
            auto kv = add_rule("string ws \":\" ws " + v + " ws");
            if (!kv) return kv.err();
            return add_rule("\"{\" ws (" + *kv + " (\",\" ws " + *kv + ")*)? \"}\"");
        }
        const json& props = s["properties"];
        if (!props.is_object()) return bad(pointer(at, "properties"), "an object");
        std::set<std::string> required;
        for (const json& r : s.value("required", json::array())) {
            if (!r.is_string()) return bad(pointer(at, "required"), "an array of names");
            if (!props.contains(r.get<std::string>())) {
                return bad(pointer(at, "required"),
                           "\"" + r.get<std::string>() + "\" is required but not in properties");
            }
            required.insert(r.get<std::string>());
        }
        // key: value rules, required ones first in the schema's order, then the optional ones.
        std::vector<std::string> req, opt;
        for (const auto& [name, sub] : props.items()) {
            auto e = expr(sub, pointer(pointer(at, "properties"), name), depth + 1);
            if (!e) return e.err();
            auto kv = add_rule(literal(json(name).dump()) + " ws \":\" ws " + *e + " ws");
            if (!kv) return kv.err();
            (required.count(name) ? req : opt).push_back(*kv);
        }
        std::string body = "\"{\" ws";
        for (std::size_t i = 0; i < req.size(); ++i) body += (i ? " \",\" ws " : " ") + req[i];
        if (!req.empty()) {
            for (const std::string& o : opt) body += " (\",\" ws " + o + ")?";
        } else if (!opt.empty()) {
            // No required property: whichever optional one comes first has no comma before it.
            std::string alt;
            for (std::size_t i = 0; i < opt.size(); ++i) {
                std::string from = opt[i];
                for (std::size_t j = i + 1; j < opt.size(); ++j)
                    from += " (\",\" ws " + opt[j] + ")?";
                alt += (alt.empty() ? "" : " | ") + from;
            }
            body += " (" + alt + ")?";
        }
        return add_rule(body + " \"}\"");
    }

    const json* _root = nullptr;  // the schema add() converts: its $defs
    json_schema_limits _limits;
    std::vector<std::pair<std::string, std::string>> _rules;
    std::map<std::string, std::string> _refs;  // "$ref" target -> its rule, within one schema
};

json_schema_rules::json_schema_rules(const json_schema_limits& limits)
    : _c(std::make_unique<converter>(limits)) {}
json_schema_rules::~json_schema_rules() = default;

result<std::string> json_schema_rules::add(const json& schema) {
    return _c->add(schema);
}

std::string json_schema_rules::rules() const {
    return _c->rules();
}

result<std::string> json_schema_to_gbnf(const json& schema, const json_schema_limits& limits) {
    json_schema_rules rules(limits);
    auto top = rules.add(schema);
    if (!top) return top.err();
    return "root ::= ws " + *top + "\n" + rules.rules();
}

}  // namespace ordo::grammar
