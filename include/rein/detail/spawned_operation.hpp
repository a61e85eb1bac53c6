// Runs a coroutine as an Asio asynchronous operation that honours the caller's cancellation slot: the
// canceller installed in the slot at initiation, and the completion handler that co_spawn is given (it keeps
// the caller's executor and allocator). Generic, and kept apart from the throttle so that Asio's co_composed
// can replace it.
#pragma once

#include <rein/config.hpp>
#include <rein/detail/asio_header.hpp>

#include REIN_ASIO_HEADER(associated_cancellation_slot.hpp)
#include REIN_ASIO_HEADER(associator.hpp)
#include REIN_ASIO_HEADER(cancellation_signal.hpp)

#include <atomic>
#include <exception>
#include <memory>
#include <utility>

namespace rein::detail {

// What a cancellation of async_acquire reaches: the stage being waited on (bound to `signal`), and the stages
// not yet started (`requested`). Shared by the initiation, its coroutine and the canceller in the caller's slot.
// Touched only on the handler's executor, where the coroutine runs and where Asio has the caller emit.
struct throttle_cancellation {
  net::cancellation_signal signal;
  std::atomic<bool> requested{false};
};

// Installed in the caller's cancellation slot at initiation, so that a cancellation emitted before the spawned
// coroutine first runs is not lost (co_spawn's own state would see only a terminal one, and only until the
// coroutine resets it). Every type is forwarded as it came: each stage honours terminal, partial and total.
struct throttle_canceller {
  explicit throttle_canceller(std::shared_ptr<throttle_cancellation> s) noexcept : state(std::move(s)) {}

  std::shared_ptr<throttle_cancellation> state;

  void operator()(net::cancellation_type_t type) const {
    if ((type & (net::cancellation_type::terminal | net::cancellation_type::partial | net::cancellation_type::total)) ==
        net::cancellation_type::none)
      return;
    state->requested.store(true, std::memory_order_relaxed);
    state->signal.emit(type);
  }
};

// Makes a co_spawn completion (exception_ptr, pair<error_code, Guard>) into the (error_code, Guard) a caller
// of async_acquire expects, keeping the handler's executor and allocator. Its cancellation slot is not shown to
// co_spawn (the throttle_canceller serves it); it is cleared before the handler runs, as Asio's operations do.
//
// run() reports its errors as error codes; a rein::system_error that still reaches here means that run() took
// nothing, and it becomes an error code too, as the completion signature promises. Any other exception
// (bad_alloc) is rethrown out of the handler, as co_spawn with `detached` would.
template <class Handler>
struct spawn_adapter {
  Handler handler;
  std::shared_ptr<throttle_cancellation> cancellation;

  using cancellation_slot_type = net::cancellation_slot;
  cancellation_slot_type get_cancellation_slot() const noexcept { return {}; }

  template <class Guard>
  void operator()(std::exception_ptr e, std::pair<error_code, Guard> result) {
    if (cancellation) net::get_associated_cancellation_slot(handler).clear();
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const system_error& error) {
        result.first = error.code();
      }
    }
    std::move(handler)(result.first, std::move(result.second));
  }
};

}  // namespace rein::detail

/// @cond
template <template <class, class> class Associator, class Handler, class DefaultCandidate>
struct REIN_ASIO_NAMESPACE::associator<Associator, rein::detail::spawn_adapter<Handler>, DefaultCandidate>
    : Associator<Handler, DefaultCandidate> {
  static typename Associator<Handler, DefaultCandidate>::type get(
      const rein::detail::spawn_adapter<Handler>& h, const DefaultCandidate& c = DefaultCandidate()) noexcept {
    return Associator<Handler, DefaultCandidate>::get(h.handler, c);
  }
};
/// @endcond
