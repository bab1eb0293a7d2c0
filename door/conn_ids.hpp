// conn_ids.hpp: how a request names the front door it came through, and what a door tells the
// scheduler about its connections (client_gone). Both doors and the scheduler read it; it
// depends on nothing above the runtime, so the doors' skeleton (front_door.hpp) needs nothing
// of the scheduler's.
//
// A request is named by (conn, id). The scheduler answers every request to the front door that
// sent it, without knowing its wire format: the door is written in the top byte of the conn id,
// which the door assigns (conn_id) and the scheduler only reads (door_kind_of). The scheduler
// keeps one ordered, bounded delivery per door, so the events of one connection still arrive
// in order, and one door that is slow or stuck never delays the other's events. The net actor's
// ids have a top byte of 0 (its counter never reaches 2^56); the HTTP actor makes its ids with
// conn_id.
#pragma once

#include <cstddef>
#include <cstdint>
#include <msgpack.hpp>
#include <string>

namespace ordo::door {

enum class door_kind : uint8_t { net = 0, http = 1 };
inline constexpr size_t door_kinds = 2;
inline constexpr unsigned door_kind_shift = 56;
inline constexpr uint64_t conn_id(door_kind d, uint64_t local) {
    return (uint64_t(d) << door_kind_shift) | (local & ((uint64_t(1) << door_kind_shift) - 1));
}
// The door of `conn`; an id of no known door maps to net (whose delivery then finds no such
// connection and drops the event, as for any connection that is gone).
inline constexpr door_kind door_kind_of(uint64_t conn) {
    uint64_t d = conn >> door_kind_shift;
    return d < door_kinds ? door_kind(d) : door_kind::net;
}
inline constexpr const char* door_kind_name(door_kind d) {
    return d == door_kind::http ? "http" : "net";
}

// door → scheduler: the connection is gone (EOF, reset, write error, slow reader, timeout).
// Every live request of `conn` is cancelled in order; no events are sent for them. No reply.
struct client_gone {
    static constexpr const char* msg_name = "client_gone";
    uint64_t conn = 0;
    std::string reason;
    MSGPACK_DEFINE_MAP(conn, reason);
};

}  // namespace ordo::door
