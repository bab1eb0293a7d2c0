// scheduler_events.hpp: encoding of the events the scheduler sends to clients (docs/protocol.md).
#pragma once

#include <string>
#include <string_view>

#include "actors/scheduler/scheduler_core.hpp"

namespace ordo::sched {

outgoing_event error_event(uint64_t conn, uint64_t id, std::string_view code,
                           std::string_view message);

}  // namespace ordo::sched
