// type_list.hpp: a list of message types written once and used wherever the runtime wants them
// as template arguments (an actor's message table, an outbox, a delivery, a std::variant).
//
// Compile time only; no state, no thread. Without it a set of messages that several actors
// send or accept (the events the scheduler sends every front door, door/door_msgs.hpp) is
// spelled out in each of their headers, and the copies drift apart. With it the set is one
// `type_list<...>`, and `variant_for<L>`, `actor_for<Derived, L>` (actor.hpp), `outbox_for<L>`
// (outbox.hpp) and `delivery_for<L>` (delivery.hpp) expand it in place.
#pragma once

#include <type_traits>
#include <variant>

namespace ordo::actors {

template <typename... Ts>
struct type_list {};

// type_list_cat_t<type_list<A...>, type_list<B...>, ...>: type_list<A..., B..., ...>.
template <typename... Lists>
struct type_list_cat;
template <>
struct type_list_cat<> {
    using type = type_list<>;
};
template <typename... Ts>
struct type_list_cat<type_list<Ts...>> {
    using type = type_list<Ts...>;
};
template <typename... A, typename... B, typename... Rest>
struct type_list_cat<type_list<A...>, type_list<B...>, Rest...> {
    using type = typename type_list_cat<type_list<A..., B...>, Rest...>::type;
};
template <typename... Lists>
using type_list_cat_t = typename type_list_cat<Lists...>::type;

// Whether T is one of the list's types.
template <typename T, typename List>
struct in_type_list;
template <typename T, typename... Ts>
struct in_type_list<T, type_list<Ts...>> : std::bool_constant<(std::is_same_v<T, Ts> || ...)> {};
template <typename T, typename List>
inline constexpr bool in_type_list_v = in_type_list<T, List>::value;

// list_apply_t<F, type_list<Ts...>>: F::fn<Ts...>. F names a template through a member alias
// template, so one specialization serves every template, those whose parameters are constrained
// to message types included (actor_for, outbox_for, delivery_for): a constrained template is not
// portably a `template <typename...> class` argument.
template <typename F, typename List>
struct list_apply;
template <typename F, typename... Ts>
struct list_apply<F, type_list<Ts...>> {
    using type = typename F::template fn<Ts...>;
};
template <typename F, typename List>
using list_apply_t = typename list_apply<F, List>::type;

// variant_for<type_list<Ts...>>: std::variant<Ts...>.
struct variant_fn {
    template <typename... Ts>
    using fn = std::variant<Ts...>;
};
template <typename List>
using variant_for = list_apply_t<variant_fn, List>;

}  // namespace ordo::actors
