// value.cpp: construction, dict lookup and Python's ==, truth and type names.
#include "template/value.hpp"

#include <algorithm>

namespace ordo::jinja {

namespace {

// Below this many entries a linear scan beats hashing; chat messages have a handful of keys.
constexpr size_t k_dict_index_min = 8;

}  // namespace

const value* dict_data::find(std::string_view key) const {
    if (!_index.empty()) {
        auto it = _index.find(key);
        return it == _index.end() ? nullptr : &entries[it->second].second;
    }
    for (const auto& [k, v] : entries) {
        if (k.is_string() && k.as_string() == key) return &v;
    }
    return nullptr;
}

const value* dict_data::find(const value& key) const {
    if (key.is_string()) return find(std::string_view(key.as_string()));
    for (const auto& [k, v] : entries) {
        if (equals(k, key)) return &v;
    }
    return nullptr;
}

void dict_data::set(value key, value v) {
    if (const value* existing = find(key)) {
        const_cast<value&>(*existing) = std::move(v);
        return;
    }
    entries.emplace_back(std::move(key), std::move(v));
    if (entries.size() == k_dict_index_min) {
        for (size_t i = 0; i < entries.size(); ++i) {
            if (entries[i].first.is_string()) _index.emplace(entries[i].first.as_string(), i);
        }
    } else if (entries.size() > k_dict_index_min && entries.back().first.is_string()) {
        _index.emplace(entries.back().first.as_string(), entries.size() - 1);
    }
}

value value::undefined(std::string hint) {
    return value(undefined_t{std::make_shared<const std::string>(std::move(hint))});
}

value value::sequence(std::vector<value> items, bool tuple) {
    uint32_t depth = 0;
    for (const value& v : items) depth = std::max(depth, v.depth());
    return value(
        std::make_shared<const list_data>(list_data{std::move(items), tuple, depth + 1, {}, {}}));
}

value value::named_tuple(std::string type, std::vector<std::string> fields,
                         std::vector<value> items) {
    value v = sequence(std::move(items), true);
    auto& l = const_cast<list_data&>(v.as_list());  // not yet shared
    l.type_name = std::move(type);
    l.fields = std::move(fields);
    return v;
}

value value::list(std::vector<value> items) {
    return sequence(std::move(items), false);
}
value value::tuple(std::vector<value> items) {
    return sequence(std::move(items), true);
}

value value::dict(dict_data d) {
    uint32_t depth = 0;
    for (const auto& [k, v] : d.entries) depth = std::max({depth, k.depth(), v.depth()});
    d.depth = depth + 1;
    return value(std::make_shared<const dict_data>(std::move(d)));
}

uint32_t value::depth() const {
    if (is_list()) return as_list().depth;
    if (is_dict()) return as_dict().depth;
    return 0;
}

value value::dict(std::vector<std::pair<std::string, value>> entries) {
    dict_data d;
    for (auto& [k, v] : entries) d.set(value(std::move(k)), std::move(v));
    return dict(std::move(d));
}

const std::string& value::undefined_hint() const {
    static const std::string empty;
    const auto& h = std::get<undefined_t>(_v).hint;
    return h ? *h : empty;
}

const void* value::identity() const {
    switch (type()) {
        case kind::string:
            return std::get<str_ptr>(_v).get();
        case kind::list:
            return std::get<list_ptr>(_v).get();
        case kind::dict:
            return std::get<dict_ptr>(_v).get();
        case kind::callable:
            return std::get<call_ptr>(_v).get();
        case kind::ns:
            return std::get<ns_ptr>(_v).get();
        default:
            return nullptr;
    }
}

bool equals(const value& a, const value& b) {
    uint64_t unbounded = UINT64_MAX;
    return equals_within(a, b, unbounded);
}

bool equals_within(const value& a, const value& b, uint64_t& budget) {
    if (a.is_number() && b.is_number()) {
        if (a.is_float() || b.is_float()) return a.float_of() == b.float_of();
        return a.int_of() == b.int_of();
    }
    if (a.type() != b.type()) return false;
    if (a.identity() != nullptr && a.identity() == b.identity()) return true;
    if (a.is_list() || a.is_dict()) {
        if (budget == 0) throw compare_budget_exhausted{};
        --budget;
    }
    switch (a.type()) {
        case value::kind::undefined:
        case value::kind::none:
            return true;
        case value::kind::string:
            return a.as_string() == b.as_string();
        case value::kind::list: {
            if (a.is_tuple() != b.is_tuple()) return false;
            const auto& x = a.items();
            const auto& y = b.items();
            if (x.size() != y.size()) return false;
            for (size_t i = 0; i < x.size(); ++i) {
                if (!equals_within(x[i], y[i], budget)) return false;
            }
            return true;
        }
        case value::kind::dict: {
            const auto& x = a.as_dict().entries;
            if (x.size() != b.as_dict().entries.size()) return false;
            for (const auto& [k, v] : x) {
                const value* other = b.as_dict().find(k);
                if (other == nullptr || !equals_within(v, *other, budget)) return false;
            }
            return true;
        }
        default:
            return a.identity() == b.identity();
    }
}

bool truthy(const value& v) {
    switch (v.type()) {
        case value::kind::undefined:
        case value::kind::none:
            return false;
        case value::kind::boolean:
            return v.as_bool();
        case value::kind::integer:
            return v.as_int() != 0;
        case value::kind::floating:
            return v.as_float() != 0.0;
        case value::kind::string:
            return !v.as_string().empty();
        case value::kind::list:
            return !v.items().empty();
        case value::kind::dict:
            return !v.as_dict().entries.empty();
        default:
            return true;
    }
}

std::string_view type_name(const value& v) {
    switch (v.type()) {
        case value::kind::undefined:
            return "undefined";
        case value::kind::none:
            return "NoneType";
        case value::kind::boolean:
            return "bool";
        case value::kind::integer:
            return "int";
        case value::kind::floating:
            return "float";
        case value::kind::string:
            return "str";
        case value::kind::list:
            return v.is_tuple() ? "tuple" : "list";
        case value::kind::dict:
            return "dict";
        case value::kind::callable:
            return v.as_callable().is_macro ? "Macro" : "function";
        case value::kind::ns:
            return "Namespace";
    }
    return "object";
}

}  // namespace ordo::jinja
