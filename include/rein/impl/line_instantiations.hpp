// The instantiations of a waiting line (detail/limiter_core.hpp) that REIN_SEPARATE_COMPILATION compiles
// once (rein/config.hpp): the public headers declare theirs extern with the macros below, and
// rein/impl/src.hpp defines them. Not API.
#pragma once

#include <rein/config.hpp>
#include <rein/detail/limiter_core.hpp>

// Header-only builds instantiate nothing ahead: rein/impl/src.hpp refuses to compile there.
#if defined(REIN_SEPARATE_COMPILATION)
#include <rein/detail/asio_header.hpp>

#include REIN_ASIO_HEADER(bind_cancellation_slot.hpp)
#include REIN_ASIO_HEADER(cancellation_signal.hpp)
#include REIN_ASIO_HEADER(use_awaitable.hpp)

#include <cstddef>

namespace rein::detail {

// The handlers with which a coroutine awaits a wait on the line `Core`: through use_awaitable, bound or not
// to a cancellation slot (a throttle's async_acquire), and (Asio 1.26 on) as a deferred operation. The last
// is named from Asio's detail namespace: a later Asio that renames it fails here, in src.hpp, loudly.
template <class Core>
using use_awaitable_handler = typename net::async_result<net::use_awaitable_t<typename Core::executor_type>,
                                                         typename Core::signature>::handler_type;
template <class Core>
using bound_awaitable_handler = net::cancellation_slot_binder<use_awaitable_handler<Core>, net::cancellation_slot>;
#if REIN_HAS_AWAIT_DEFERRED
template <class Core>
using await_deferred_handler =
    net::detail::awaitable_async_op_handler<typename Core::signature, typename Core::executor_type>;
#endif

}  // namespace rein::detail

// The instantiations of the line `...` (a limiter_core) that REIN_SEPARATE_COMPILATION compiles once: the
// class, and its waits as coroutines await them, which every unit that co_awaits a limiter would otherwise
// compile again (a waiting line's operation with its handler: about a tenth of such a unit's code).
#define REIN_DETAIL_AWAIT_INSTANTIATION(kind, handler, ...)                                  \
  kind template void __VA_ARGS__::async_acquire<detail::handler<__VA_ARGS__>>(                 \
      detail::handler<__VA_ARGS__>&&, std::size_t, __VA_ARGS__::time_point, detail::line_place);
#if REIN_HAS_AWAIT_DEFERRED
#define REIN_DETAIL_DEFERRED_AWAIT_INSTANTIATION(kind, ...) \
  REIN_DETAIL_AWAIT_INSTANTIATION(kind, await_deferred_handler, __VA_ARGS__)
#else
#define REIN_DETAIL_DEFERRED_AWAIT_INSTANTIATION(kind, ...)
#endif
#define REIN_DETAIL_LINE_INSTANTIATIONS(kind, ...)                             \
  kind template class __VA_ARGS__;                                             \
  REIN_DETAIL_AWAIT_INSTANTIATION(kind, use_awaitable_handler, __VA_ARGS__)   \
  REIN_DETAIL_AWAIT_INSTANTIATION(kind, bound_awaitable_handler, __VA_ARGS__) \
  REIN_DETAIL_DEFERRED_AWAIT_INSTANTIATION(kind, __VA_ARGS__)
#endif
