// slot_owners.hpp: who holds which slot of a fixed set, shared by logits_exchange and
// kv_staging (host memory handed from one actor to another by slot number).
//
// One atomic flag per slot: free -> held (acquire, compare-exchange; never blocks, nullopt when
// every slot is held) -> free (release). The thread that holds a slot is the only one touching
// its memory; the mailbox message that hands the slot over orders the two threads' accesses.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>

namespace ordo::gpu {

class slot_owners {
public:
    explicit slot_owners(std::uint32_t slots) : _slots(slots), _held(new std::atomic<bool>[slots]) {
        for (std::uint32_t s = 0; s < slots; ++s) _held[s].store(false);
    }

    std::optional<std::uint32_t> acquire() {
        for (std::uint32_t s = 0; s < _slots; ++s) {
            bool expected = false;
            if (_held[s].compare_exchange_strong(expected, true, std::memory_order_acq_rel)) {
                return s;
            }
        }
        return std::nullopt;
    }
    // Whether the slot was held (releasing a free slot is the caller's bug to report).
    bool release(std::uint32_t slot) {
        return slot < _slots && _held[slot].exchange(false, std::memory_order_acq_rel);
    }
    bool is_held(std::uint32_t slot) const {
        return slot < _slots && _held[slot].load(std::memory_order_acquire);
    }
    std::uint32_t held() const {
        std::uint32_t n = 0;
        for (std::uint32_t s = 0; s < _slots; ++s) n += _held[s].load() ? 1 : 0;
        return n;
    }
    std::uint32_t size() const { return _slots; }

private:
    std::uint32_t _slots;
    std::unique_ptr<std::atomic<bool>[]> _held;
};

}  // namespace ordo::gpu
