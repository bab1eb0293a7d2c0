// kv_failure.hpp: why a save or a restore did not happen, as kv_save_done and kv_restore_done
// carry it to the scheduler and as the stats op's kv_disk.errors counts it.
//
// A failure comes from one of four closed sets, and each keeps its own table: the kv actor's
// own refusals (below), the file's (kv_error, kv_file.hpp: a file refused or a syscall failed),
// the gpu copy's (gpu::gpu_failure: the copy out of or into the pool failed) and the runtime's
// (actors::delivery_outcome: a copy job or an answer could not be delivered). kv_failure's
// values are those four sets in a row, so one enum travels and every name is the one its own
// table spells ("kv_block_checksum", "gpu_stale_epoch", "delivery_timeout"); kv_failure_of maps
// a value of each set in. The kv actor decides on the set it knows where the failure arises (a
// disk fault is a kv_error: kv_disk_fault) and on its own values; the scheduler reads only `ok`.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <msgpack.hpp>
#include <string_view>

#include "actors/runtime/delivery_outcome.hpp"
#include "actors/runtime/enum_names.hpp"
#include "gpu/vk/gpu_failure.hpp"
#include "kv/kv_file.hpp"

namespace ordo::kv {

// The kv actor's own values; the other sets' follow them (kv_failure_of).
enum class kv_failure : std::uint8_t {
    none,             // no failure: the save was copied out, the restore verified and copied in
    no_lease,         // a restore for a sequence no entry is leased to
    evicted,          // the leased entry left the index before its restore
    stopping,         // the kv actor is stopping (flushing)
    not_ready,        // a save before the startup scan is done
    persistence_off,  // a save while a disk fault keeps persistence off
    exists,           // a save of what a file already holds, or is being written
    busy,             // saves_pending_max saves already wait in memory
    too_large,        // a save larger than kv.bytes_budget
    no_staging,       // the actor holds no kv_staging slot to copy through
    step_failed,      // the step right after a restore failed: the entry is quarantined
    undelivered,      // an answer to the scheduler was given up (counted, never sent)
};

// clang-format off
inline constexpr std::array<std::string_view, 12> kv_failure_own_names = {
    "",             "kv_no_lease",        "kv_evicted", "kv_stopping",
    "kv_not_ready", "kv_persistence_off", "kv_exists",  "kv_busy",
    "kv_too_large", "kv_no_staging",      "kv_step_failed", "undelivered"};
// clang-format on
static_assert(static_cast<std::size_t>(kv_failure::undelivered) + 1 == kv_failure_own_names.size(),
              "kv_failure_own_names names every kv_failure of the kv actor's own, in order");

// Where each other set's values start.
inline constexpr std::size_t kv_failure_file_first = kv_failure_own_names.size();
inline constexpr std::size_t kv_failure_gpu_first = kv_failure_file_first + enum_count<kv_error>;
inline constexpr std::size_t kv_failure_delivery_first =
    kv_failure_gpu_first + enum_count<gpu::gpu_failure>;

inline constexpr auto kv_failure_names = names_joined(
    kv_failure_own_names, kv_error_names, gpu::gpu_failure_names, actors::delivery_outcome_names);
constexpr const auto& names_of(kv_failure) {
    return kv_failure_names;
}
static_assert(kv_failure_names.size() <= 256, "kv_failure's values fit its uint8_t");

constexpr kv_failure kv_failure_of(kv_error e) {
    return static_cast<kv_failure>(kv_failure_file_first + static_cast<std::size_t>(e));
}
constexpr kv_failure kv_failure_of(gpu::gpu_failure f) {
    return static_cast<kv_failure>(kv_failure_gpu_first + static_cast<std::size_t>(f));
}
constexpr kv_failure kv_failure_of(actors::delivery_outcome o) {
    return static_cast<kv_failure>(kv_failure_delivery_first + static_cast<std::size_t>(o));
}

}  // namespace ordo::kv

MSGPACK_ADD_ENUM(ordo::kv::kv_failure);
