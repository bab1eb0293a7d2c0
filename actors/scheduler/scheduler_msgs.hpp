// scheduler_msgs.hpp: the messages the scheduler actor accepts from the net actor. (It also
// accepts the gpu actor's replies, declared in gpu/gpu_msgs.hpp.)
#pragma once

#include <msgpack.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "actors/runtime/actor.hpp"

namespace ordo::sched {

// net → scheduler: a client request the net actor does not answer itself (every op but
// `health`). `frame` is the request's msgpack map exactly as received; the scheduler parses and
// validates its parameters. `net` carries the net actor's counters for the `stats` op. Reply:
// events for (conn, id) through net::deliver_event, ending with exactly one terminal event.
struct client_request {
    static constexpr const char* msg_name = "client_request";
    uint64_t conn = 0;
    uint64_t id = 0;
    std::string op;
    std::vector<char> frame;
    std::map<std::string, uint64_t> net;  // only for op == "stats"
    MSGPACK_DEFINE_MAP(conn, id, op, frame, net);
};

// net → scheduler: the connection is gone (EOF, reset, write error, slow reader). Every live
// request of `conn` is cancelled in order; no events are sent for them. No reply.
struct client_gone {
    static constexpr const char* msg_name = "client_gone";
    uint64_t conn = 0;
    std::string reason;
    MSGPACK_DEFINE_MAP(conn, reason);
};

}  // namespace ordo::sched
