// outbox.hpp: a typed, type-erased address of another actor.
//
// An actor that must send to another holds an outbox listing exactly the messages it sends
// there: `outbox<step_done, step_failed> to_scheduler;`. It is built from any actor that
// accepts all of them (checked at compile time by that actor's tell()), so the sender never
// includes the receiver's header and tests can point it at a recording actor instead.
// tell() is thread-safe (it is the receiver's mailbox push); an unbound outbox refuses with
// `not_connected`.
#pragma once

#include <array>
#include <string>
#include <type_traits>

#include "actors/runtime/actor.hpp"

namespace ordo::actors {

template <message_type... Msgs>
class outbox {
public:
    outbox() = default;

    template <typename Actor>
    outbox(Actor& target, std::string sender)
        : _target(&target), _sender(std::move(sender)), _fns{&forward<Actor, Msgs>...} {}

    template <typename T>
    tell_status tell(const T& msg) const {
        constexpr size_t index = index_of<T>();
        static_assert(index < sizeof...(Msgs), "this outbox does not carry that message type");
        if (_target == nullptr) {
            return refusal{delivery_outcome::not_connected,
                           std::string("no receiver for ") + T::msg_name};
        }
        return _fns[index](_target, &msg, _sender);
    }

    bool bound() const { return _target != nullptr; }

private:
    using forward_fn = tell_status (*)(void*, const void*, const std::string&);

    template <typename Actor, typename T>
    static tell_status forward(void* target, const void* msg, const std::string& sender) {
        return static_cast<Actor*>(target)->tell(*static_cast<const T*>(msg), sender);
    }

    template <typename T, size_t I = 0>
    static constexpr size_t index_of() {
        if constexpr (I == sizeof...(Msgs)) {
            return I;
        } else if constexpr (std::is_same_v<std::tuple_element_t<I, std::tuple<Msgs...>>, T>) {
            return I;
        } else {
            return index_of<T, I + 1>();
        }
    }

    void* _target = nullptr;
    std::string _sender;
    std::array<forward_fn, sizeof...(Msgs)> _fns{};
};

// outbox_for<type_list<Msgs...>>: outbox<Msgs...> (type_list.hpp).
struct outbox_fn {
    template <message_type... Msgs>
    using fn = outbox<Msgs...>;
};
template <typename List>
using outbox_for = list_apply_t<outbox_fn, List>;

}  // namespace ordo::actors
