// protocol.cpp: see protocol.hpp.
#include "net/protocol.hpp"

#include <cassert>

namespace ordo::net {
namespace {

bool key_is(const msgpack::object_kv& kv, std::string_view name) {
    return kv.key.type == msgpack::type::STR &&
           std::string_view(kv.key.via.str.ptr, kv.key.via.str.size) == name;
}

std::string type_name(const msgpack::object& o) {
    switch (o.type) {
        case msgpack::type::NIL: return "nil";
        case msgpack::type::BOOLEAN: return "bool";
        case msgpack::type::POSITIVE_INTEGER: return "unsigned integer";
        case msgpack::type::NEGATIVE_INTEGER: return "negative integer";
        case msgpack::type::FLOAT32:
        case msgpack::type::FLOAT64: return "float";
        case msgpack::type::STR: return "string";
        case msgpack::type::BIN: return "binary";
        case msgpack::type::ARRAY: return "array";
        case msgpack::type::MAP: return "map";
        case msgpack::type::EXT: return "ext";
    }
    return "unknown";
}

}  // namespace

std::variant<request, envelope_error> parse_envelope(const msgpack::object& frame) {
    if (frame.type != msgpack::type::MAP) {
        return envelope_error{0, true,
                              make_error("bad_frame", "a request must be a msgpack map, got " +
                                                          type_name(frame))};
    }
    const msgpack::object* id = nullptr;
    const msgpack::object* op = nullptr;
    for (uint32_t i = 0; i < frame.via.map.size; i++) {
        const auto& kv = frame.via.map.ptr[i];
        if (key_is(kv, "id")) id = &kv.val;
        if (key_is(kv, "op")) op = &kv.val;
    }
    if (id == nullptr || id->type != msgpack::type::POSITIVE_INTEGER || id->via.u64 == 0) {
        std::string why = id == nullptr ? "the request has no \"id\""
                                        : "\"id\" must be an unsigned integer > 0, got " +
                                              type_name(*id);
        return envelope_error{0, true, make_error("bad_frame", why)};
    }
    request r;
    r.id = id->via.u64;
    r.map = &frame;
    if (op == nullptr || op->type != msgpack::type::STR) {
        std::string why = op == nullptr ? "the request has no \"op\""
                                        : "\"op\" must be a string, got " + type_name(*op);
        return envelope_error{r.id, false, make_error("bad_request", why)};
    }
    r.op.assign(op->via.str.ptr, op->via.str.size);
    return r;
}

status check_param_keys(const msgpack::object& map,
                        std::initializer_list<std::string_view> allowed) {
    assert(map.type == msgpack::type::MAP);
    for (uint32_t i = 0; i < map.via.map.size; i++) {
        const auto& kv = map.via.map.ptr[i];
        if (kv.key.type != msgpack::type::STR) {
            return make_error("bad_request", "parameter keys must be strings, got " +
                                                 type_name(kv.key));
        }
        std::string_view key(kv.key.via.str.ptr, kv.key.via.str.size);
        if (key == "id" || key == "op") continue;
        bool known = false;
        for (auto a : allowed) known = known || a == key;
        if (!known) return make_error("bad_request", "unknown parameter \"" + std::string(key) + "\"");
    }
    return {};
}

event_writer::event_writer(uint64_t id, std::string_view event) {
    field("id", id);
    field("event", event);
}

void event_writer::key_only(std::string_view key) {
    _body.pack(key);
    _fields++;
}

std::string event_writer::finish() const {
    msgpack::sbuffer header;
    msgpack::packer<msgpack::sbuffer>(header).pack_map(_fields);
    std::string out;
    out.reserve(header.size() + _buffer.size());
    out.append(header.data(), header.size());
    out.append(_buffer.data(), _buffer.size());
    return out;
}

std::string encode_error(uint64_t id, std::string_view code, std::string_view message) {
    return event_writer(id, "error").field("code", code).field("message", message).finish();
}

}  // namespace ordo::net
