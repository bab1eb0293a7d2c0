// kv_staging.hpp: host memory shared by the gpu actor and the kv actor (or the scheduler) for
// the bytes of KV-cache blocks copied out of the device pool or into it, so that KV bytes never
// travel inside messages.
//
// `slots` slots of `slot_bytes` bytes each are allocated once (constructor). The sender of a
// kv_copy_out / kv_copy_in (gpu_msgs.hpp) acquires a free slot (none free: kv_staging_busy at
// once; acquire never blocks), fills it first for a copy-in, names it in the message, and after
// kv_copy_done / kv_copy_failed reads it (copy-out) and releases it. The gpu actor only borrows
// the slot between receiving the message and sending its reply; it never releases it.
// Ownership is one atomic per slot: free -> held (acquire, compare-exchange) -> free (release).
// The bytes of a held slot are touched by one thread at a time: the holder until it sends the
// copy message, the gpu actor's worker until it sends the reply, the holder again after it
// receives the reply (the mailbox hand-overs order the three).
// Byte layout of a slot: runner.hpp read_kv_blocks (per block, per layer, K then V).
// Misuse (releasing a free slot, a slot out of range) is a programmer error and asserts.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "actors/runtime/result.hpp"
#include "gpu/logits/slot_owners.hpp"

namespace ordo::gpu {

class kv_staging {
public:
    // Bounds the constructor holds its arguments to: a slot count a linear acquire scan stays
    // cheap over, and 1 GiB per slot (host memory, allocated once).
    static constexpr std::uint32_t slots_max = 64;
    static constexpr std::uint64_t slot_bytes_max = std::uint64_t{1} << 30;
    // kv_copy_*.staging_slot of no slot (never acquired; the gpu actor refuses it).
    static constexpr std::uint32_t no_slot = 0xFFFFFFFFu;

    // 1 <= slots <= slots_max, 1 <= slot_bytes <= slot_bytes_max (asserted).
    kv_staging(std::uint32_t slots, std::uint64_t slot_bytes);
    kv_staging(const kv_staging&) = delete;
    kv_staging& operator=(const kv_staging&) = delete;

    // A free slot, now held by the caller; kv_staging_busy when every slot is held.
    result<std::uint32_t> acquire();
    // Frees a held slot. Releasing no_slot is a no-op; releasing a free slot asserts.
    void release(std::uint32_t slot);

    // The first `bytes` bytes of a held slot (bytes <= slot_bytes(), asserted).
    std::span<std::uint8_t> bytes(std::uint32_t slot, std::uint64_t bytes);
    std::span<const std::uint8_t> read(std::uint32_t slot, std::uint64_t bytes) const;

    std::uint32_t slots() const { return _slots; }
    std::uint64_t slot_bytes() const { return _slot_bytes; }
    std::uint32_t held() const;              // slots currently held (stats, tests)
    bool is_held(std::uint32_t slot) const;  // false for no_slot and out-of-range slots

private:
    std::size_t offset_of(std::uint32_t slot, std::uint64_t bytes) const;

    std::uint32_t _slots;
    std::uint64_t _slot_bytes;
    slot_owners _owners;
    std::vector<std::uint8_t> _data;  // (_slots, _slot_bytes)
};

}  // namespace ordo::gpu
