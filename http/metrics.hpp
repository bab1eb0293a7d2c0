// metrics.hpp: the stats op's report as Prometheus text (GET /metrics; docs/http.md "Metrics").
// Pure: the HTTP actor asks the scheduler for the report (its query carries both front doors'
// counters, which the report echoes as its `net` and `http` maps) and hands it here.
//
// Names: ordo_<map>_<key> for the stats op's maps (net, scheduler, kv, kv_disk, gpu, fault_plan)
// and for the HTTP front door's counters (http), ordo_<key> for its top-level gauges. Counters
// end in _total; milliseconds summed by the stats op are shown in seconds (Prometheus' base
// unit); the scheduler's histograms keep their names (ordo_time_to_first_token_seconds, ...) with
// cumulative buckets. `promtool check metrics` accepts the output (tests/http).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "door/door_msgs.hpp"

namespace ordo::http {

std::string prometheus_text(const door::stats_report& stats);

}  // namespace ordo::http
