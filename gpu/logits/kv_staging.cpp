// kv_staging.cpp: see kv_staging.hpp.
#include "gpu/logits/kv_staging.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace ordo::gpu {

namespace {

// Asserts that stay on in release builds: a slot mix-up would hand one job's KV to another.
void require(bool ok, const char* why) {
    if (!ok) {
        std::fprintf(stderr, "kv_staging: %s\n", why);
        std::abort();
    }
}

}  // namespace

kv_staging::kv_staging(std::uint32_t slots, std::uint64_t slot_bytes)
    // A bad count is refused just below; the clamp only keeps it from allocating first.
    : _slots(slots), _slot_bytes(slot_bytes), _owners(std::min(slots, slots_max)) {
    require(slots > 0 && slots <= slots_max, "slots must be 1..slots_max");
    require(slot_bytes > 0 && slot_bytes <= slot_bytes_max, "slot_bytes must be 1..slot_bytes_max");
    _data.assign(std::size_t(slots) * slot_bytes, 0);
}

result<std::uint32_t> kv_staging::acquire() {
    if (auto s = _owners.acquire()) return *s;
    return make_error("kv_staging_busy", "every KV staging slot (" + std::to_string(_slots) +
                                             ") is held: earlier copies are not released");
}

void kv_staging::release(std::uint32_t slot) {
    if (slot == no_slot) return;
    require(slot < _slots, "release of a slot out of range");
    require(_owners.release(slot), "release of a slot that is not held");
}

std::size_t kv_staging::offset_of(std::uint32_t slot, std::uint64_t bytes) const {
    require(slot < _slots && bytes <= _slot_bytes, "KV staging range out of bounds");
    require(_owners.is_held(slot), "KV staging bytes of a free slot");
    return std::size_t(slot) * _slot_bytes;
}

std::span<std::uint8_t> kv_staging::bytes(std::uint32_t slot, std::uint64_t bytes) {
    return {_data.data() + offset_of(slot, bytes), std::size_t(bytes)};
}

std::span<const std::uint8_t> kv_staging::read(std::uint32_t slot, std::uint64_t bytes) const {
    return {_data.data() + offset_of(slot, bytes), std::size_t(bytes)};
}

bool kv_staging::is_held(std::uint32_t slot) const {
    return _owners.is_held(slot);
}

std::uint32_t kv_staging::held() const {
    return _owners.held();
}

}  // namespace ordo::gpu
