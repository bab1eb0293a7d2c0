// trace.cpp: memory_trace_sink and the process-wide delivery sequence counter.
#include "actors/runtime/trace.hpp"

#include <atomic>

namespace ordo::actors {

uint64_t next_trace_seq() {
    static std::atomic<uint64_t> seq{0};
    return seq.fetch_add(1, std::memory_order_relaxed) + 1;
}

void memory_trace_sink::record(const trace_record& r) {
    std::lock_guard lock(_mutex);
    if (_records.size() >= _records_max) {
        _dropped++;
        return;
    }
    _records.push_back(r);
}

std::vector<trace_record> memory_trace_sink::snapshot() const {
    std::lock_guard lock(_mutex);
    return _records;
}

uint64_t memory_trace_sink::dropped() const {
    std::lock_guard lock(_mutex);
    return _dropped;
}

}  // namespace ordo::actors
