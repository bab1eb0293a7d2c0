// delivery_outcome.hpp: why a message was not taken, the one closed set every sender of a
// message decides on. A mailbox refuses a push (mailbox_full, actor_stopped), an unbound outbox
// refuses a tell (not_connected), and a delivery gives a message up with one of those or with
// its own two (delivery_overflow, delivery_timeout; delivery.hpp's table). The refusal carries
// the outcome as this enum, so a sender's choice (retry later, answer shutting_down, stay
// quiet while stopping) compares enum values; its names, for logs and for a failure code that
// travels on (a kv save given up), are the table below.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "actors/runtime/enum_names.hpp"
#include "actors/runtime/result.hpp"

namespace ordo::actors {

enum class delivery_outcome : std::uint8_t {
    mailbox_full,       // the receiver's mailbox is at capacity (or refuses on a fault): later
    actor_stopped,      // the receiver (or the delivery's owner) is stopping: it never takes it
    not_connected,      // no receiver is bound (an outbox or delivery not initialised)
    delivery_overflow,  // a delivery's FIFO already holds pending_max messages
    delivery_timeout,   // the receiver refused it past the delivery's deadline
};

inline constexpr std::array<std::string_view, 5> delivery_outcome_names = {
    "mailbox_full", "actor_stopped", "not_connected", "delivery_overflow", "delivery_timeout"};
constexpr const auto& names_of(delivery_outcome) {
    return delivery_outcome_names;
}
static_assert(static_cast<std::size_t>(delivery_outcome::delivery_timeout) + 1 ==
                  delivery_outcome_names.size(),
              "delivery_outcome_names names every delivery_outcome, in order");

// A message not taken: the outcome, and human text naming the message and the receiver.
struct refusal {
    delivery_outcome outcome = delivery_outcome::mailbox_full;
    std::string message;

    // For a caller that reports it as an ordinary failure: the outcome's name is the code.
    error as_error() const { return error{std::string(enum_name(outcome)), message}; }
};

// What tell() returns: the message was queued, or the refusal.
using tell_status = result<void, refusal>;

}  // namespace ordo::actors
