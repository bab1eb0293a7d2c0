// fault_kind.hpp: the kinds of fault the harness and the config's fault plan inject
// (docs/protocol.md "fault"), one enum for every actor that arms one. The `fault` op reads the
// name once (net/ops.cpp parse_fault), the config reads it for [fault] plan; from there on the
// kind travels as this enum: the scheduler maps each kind to its target in one switch
// (scheduler_actor::arm_fault), and the gpu, kv and front-door actors switch on the kinds they
// are sent. A new kind is added here, in that switch and in its target, nowhere else.
#pragma once

#include <array>
#include <cstdint>
#include <msgpack.hpp>
#include <string_view>

#include "actors/runtime/enum_names.hpp"

namespace ordo {

// In groups: the gpu kinds (is_gpu_fault), mailbox_refuse, the kv kinds (is_kv_fault), then
// the net kinds (is_net_fault), the draft kinds (is_draft_fault).
enum class fault_kind : std::uint8_t {
    device_lost,       // the submission's wait returns VK_ERROR_DEVICE_LOST
    hang,              // the submission outlives the watchdog
    nan_logits,        // the step's logits are NaN
    step_delay,        // the step waits before it runs (fails nothing)
    mailbox_refuse,    // an actor's mailbox refuses its next pushes
    kv_enospc,         // a save's write fails with ENOSPC
    kv_eio,            // a save's write fails with EIO
    kv_torn_exit,      // the server exits halfway through a save's write
    kv_flip_read,      // a restore reads one bit flipped
    kv_stall_read,     // a restore's read waits (a slow or hung disk) before it reads
    kv_stall_unlink,   // a session_delete's unlink waits (a slow or hung disk) before it runs
    kv_fingerprint,    // a save's file names another model
    net_fin,           // the request's connection is closed (FIN)
    net_rst,           // the request's connection is reset (RST)
    net_stop_reading,  // the request's connection is not read for a while
    draft_fail,        // a speculating sequence's drafter fails
    draft_garbage,     // a speculating sequence's drafter proposes random tokens
    draft_eos,         // a speculating sequence's drafter proposes end of generation first
};

inline constexpr std::array<std::string_view, 18> fault_kind_names = {
    "device_lost",     "hang",           "nan_logits",   "step_delay",   "mailbox_refuse",
    "kv_enospc",       "kv_eio",         "kv_torn_exit", "kv_flip_read", "kv_stall_read",
    "kv_stall_unlink", "kv_fingerprint", "net_fin",      "net_rst",      "net_stop_reading",
    "draft_fail",      "draft_garbage",  "draft_eos"};
constexpr const auto& names_of(fault_kind) {
    return fault_kind_names;
}
static_assert(static_cast<std::size_t>(fault_kind::draft_eos) + 1 == fault_kind_names.size(),
              "fault_kind_names names every fault_kind, in order");

inline constexpr bool is_gpu_fault(fault_kind k) {
    return k <= fault_kind::step_delay;
}
inline constexpr bool is_kv_fault(fault_kind k) {
    return k >= fault_kind::kv_enospc && k <= fault_kind::kv_fingerprint;
}
// The kv kinds that hold a disk job's thread for the fault's `ms` (the others take no ms).
inline constexpr bool is_kv_stall_fault(fault_kind k) {
    return k == fault_kind::kv_stall_read || k == fault_kind::kv_stall_unlink;
}
inline constexpr bool is_net_fault(fault_kind k) {
    return k >= fault_kind::net_fin && k <= fault_kind::net_stop_reading;
}
inline constexpr bool is_draft_fault(fault_kind k) {
    return k >= fault_kind::draft_fail;
}

}  // namespace ordo

MSGPACK_ADD_ENUM(ordo::fault_kind);
