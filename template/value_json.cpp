// value_json.cpp: the JSON -> value converter (see value_json.hpp).
#include "template/value_json.hpp"

namespace ordo::jinja {

namespace {

struct too_deep {};
struct too_big {};

value convert(const nlohmann::ordered_json& j, uint32_t depth, uint32_t depth_max) {
    if (depth > depth_max) throw too_deep{};
    switch (j.type()) {
        case nlohmann::json::value_t::null:
            return value::none();
        case nlohmann::json::value_t::boolean:
            return value(j.get<bool>());
        case nlohmann::json::value_t::number_integer:
            return value(j.get<int64_t>());
        case nlohmann::json::value_t::number_unsigned: {
            const uint64_t u = j.get<uint64_t>();
            if (u > uint64_t(INT64_MAX)) throw too_big{};
            return value(int64_t(u));
        }
        case nlohmann::json::value_t::number_float:
            return value(j.get<double>());
        case nlohmann::json::value_t::string:
            return value(j.get<std::string>());
        case nlohmann::json::value_t::array: {
            std::vector<value> items;
            items.reserve(j.size());
            for (const auto& e : j) items.push_back(convert(e, depth + 1, depth_max));
            return value::list(std::move(items));
        }
        case nlohmann::json::value_t::object: {
            dict_data d;
            for (const auto& [k, v] : j.items()) d.set(value(k), convert(v, depth + 1, depth_max));
            return value::dict(std::move(d));
        }
        default:
            return value::none();  // binary and discarded values do not come from text
    }
}

}  // namespace

result<value> from_json(const nlohmann::ordered_json& j, uint32_t depth_max) {
    try {
        return convert(j, 1, depth_max);
    } catch (const too_deep&) {
        return make_error("bad_json",
                          "JSON nesting exceeds " + std::to_string(depth_max) + " levels");
    } catch (const too_big&) {
        return make_error("bad_json", "an integer does not fit in 64 bits");
    }
}

}  // namespace ordo::jinja
