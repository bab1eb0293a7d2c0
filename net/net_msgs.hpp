// net_msgs.hpp: the messages the net actor accepts (its message table is net_actor::message).
#pragma once

#include <msgpack.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace ordo::net {

// scheduler → net: one encoded event frame for request `id` on connection `conn`. `terminal`
// marks the request's done/error event, after which the id is free again. No reply.
struct deliver_event {
    static constexpr const char* msg_name = "deliver_event";
    uint64_t conn = 0;
    uint64_t id = 0;
    bool terminal = false;
    std::vector<char> frame;
    MSGPACK_DEFINE_MAP(conn, id, terminal, frame);
};

// bootstrap → net: what `health` reports ("ok", "loading" or "degraded", with a reason when
// not ok). No reply.
struct set_health {
    static constexpr const char* msg_name = "set_health";
    std::string status;
    std::string reason;
    MSGPACK_DEFINE_MAP(status, reason);
};

}  // namespace ordo::net
