// trace.hpp: recording of delivered actor messages.
//
// Every message an actor delivers can be recorded to a trace_sink: a global sequence number
// (the order deliveries happened in, across all actors), the sender, the receiver, the message
// type and its msgpack-encoded bytes. Tests and the fault harness use traces to assert orderings
// ("StepDone for seq 3 was applied before ClientGone"). Sinks are called on the receiving
// actor's thread and must be thread-safe; the runtime never blocks on anything else.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace ordo::actors {

struct trace_record {
    uint64_t seq = 0;         // global delivery order, starts at 1
    std::string sender;       // sending actor's name ("external" for non-actor code)
    std::string receiver;     // receiving actor's name
    std::string type;         // the message's msg_name
    std::vector<char> bytes;  // msgpack encoding of the message, exactly as delivered
};

class trace_sink {
public:
    virtual ~trace_sink() = default;
    virtual void record(const trace_record& r) = 0;
};

// Keeps every record in memory, bounded by `records_max` (older records are kept; once full,
// further records are counted in dropped() rather than growing without limit).
class memory_trace_sink final : public trace_sink {
public:
    explicit memory_trace_sink(size_t records_max = 1u << 20) : _records_max(records_max) {}

    void record(const trace_record& r) override;
    std::vector<trace_record> snapshot() const;
    uint64_t dropped() const;

private:
    mutable std::mutex _mutex;
    std::vector<trace_record> _records;
    size_t _records_max;
    uint64_t _dropped = 0;
};

// The next global sequence number; shared by every actor in the process.
uint64_t next_trace_seq();

}  // namespace ordo::actors
