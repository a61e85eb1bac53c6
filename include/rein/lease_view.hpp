// The doors of a semaphore whose permits come back by themselves after a lease: what
// `sem.with_lease(30s)` returns.
#pragma once

#include <rein/config.hpp>
#include <rein/detail/acquire_doors.hpp>
#include <rein/detail/asio_header.hpp>
#include <rein/detail/invalid_option.hpp>
#include <rein/detail/lease_table.hpp>
#include <rein/error.hpp>
#include <rein/permit.hpp>
#include <rein/try_result.hpp>

#include REIN_ASIO_HEADER(associator.hpp)
#include REIN_ASIO_HEADER(async_result.hpp)
#include REIN_ASIO_HEADER(awaitable.hpp)

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <utility>

namespace rein {

namespace detail {

// The completion handler of a leased acquire: puts the permit it receives under its lease (with the nodes
// reserved at initiation: nothing allocates), then calls the caller's handler. Its executor, allocator and
// cancellation slot are the caller's handler's (the associator below).
template <class Handler, class Core>
struct lease_handler {
  Handler handler;
  Core* core;
  lease_table::reserved nodes;
  std::chrono::nanoseconds lease;
  std::uint8_t partition;

  void operator()(error_code ec, permit p) {
    // A granted permit keeps its line alive; an empty one may outlive it, and is not touched.
    if (p) p = core->lease_permit(std::move(p), nodes, lease, partition);
    std::move(handler)(ec, std::move(p));
  }
};

}  // namespace detail

/// A semaphore's acquire doors whose permits are leased: made by `sem.with_lease(lease)`, used as the
/// semaphore's own doors are, each permit granted through them coming back by itself once `lease()` has
/// run out (Redisson's expirable permits, `RPermitExpirableSemaphore.acquire(leaseTime, unit)`):
///
///     auto p = co_await sem.with_lease(30s).acquire();   // back by itself 30 s after it was handed over
///
/// A view rather than an option of acquire: the semaphore's doors take their count and deadline as their
/// arguments and their placement from a view (at_priority, for_key, partition), so the lease is placed the
/// same way, composes with them (`sem.partition("live").with_lease(30s)`: rein::line_view::with_lease), and
/// every door (try, async with any token, coroutine; _for and _until) takes it alike.
///
/// The lease runs from the moment the permit is handed over: when try_acquire returns, or when an
/// acquire's handler (or coroutine) receives it (an acquire that waited is leased when its grant is
/// delivered, not when it was made). When the lease has run out and the permit has not been given back, the
/// semaphore takes its slots back as a release would (waiters are granted at that very instant, in the
/// line's order), counts it in semaphore_snapshot::leases_expired_total and reports an
/// event_kind::lease_expired event; the permit becomes inert: its complete(), release() or destruction
/// gives nothing back, and it still reports count() and true (it cannot know; a lease id in it tells the
/// semaphore). A permit given back before its lease ends cancels the lease. A permit split from a leased
/// one shares its lease: the lease ends when all of its parts are given back, or takes back all that is
/// left of them at its end. The instant decides: a permit given back at or after its lease's end, even
/// before the line's timer has woken, finds its lease expired.
///
/// Leases run on the semaphore's one timer (its line's, also serving deadlines), with no timer of their own:
/// a semaphore that never leased runs no lease code but a test of a null pointer where its timer is armed
/// or wakes (see docs/choosing-a-limiter.md, "Leased permits", for what it measures). A leased acquire allocates the two nodes of its lease (about 100 bytes)
/// before it starts; while any lease is live, permits go through the lock, not the lock-free word (see the
/// semaphore's "Fast path"). async_drain does not wait for inert permits. After the semaphore is destroyed
/// nothing expires any more, and a leased permit given back later is safe, as any permit is.
///
/// Errors, cancellation and thread safety are the semaphore's, as documented for its try_acquire,
/// async_acquire and acquire; a leased acquire may also throw std::bad_alloc before it starts. A view is a
/// few words and refers to the semaphore's state, as a permit does (see rein::line_view).
///
/// @tparam Doors the semaphore's doors (an implementation type: name the view with `auto`).
template <class Doors>
class lease_view {
 public:
  /// The executor that runs completion handlers without an associated executor of their own.
  using executor_type = typename Doors::executor_type;
  /// A point in time of the semaphore's clock.
  using time_point = typename Doors::time_point;
  /// A duration of the semaphore's clock.
  using duration = typename Doors::duration;

  /// The view of `doors` with leases of `lease` (> 0: the semaphore's with_lease checks it).
  lease_view(Doors doors, std::chrono::nanoseconds lease) noexcept : doors_(doors), lease_(lease) {}

  /// Each permit's lease, in nanoseconds.
  std::chrono::nanoseconds lease() const noexcept { return lease_; }

  /// As the semaphore's try_acquire; a permit it returns is leased from now.
  /// @throws std::bad_alloc (nothing taken).
  try_permit try_acquire(std::size_t n = 1) const {
    auto nodes = doors_.core->reserve_lease();
    try_permit p = doors_.try_acquire(n);
    if (!p) return p;
    return try_permit(doors_.core->lease_permit(std::move(p), nodes, lease_, doors_.place.partition));
  }

  /// As the semaphore's async_acquire; the permit is leased when the handler receives it.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code, permit)) Token = default_token_t>
  auto async_acquire(std::size_t n = 1, Token&& token = Token{}) const {
    return async_acquire_until(n, time_point::max(), std::forward<Token>(token));
  }

  /// As the semaphore's async_acquire_for (errc::timed_out after `timeout`), leased.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code, permit)) Token = default_token_t>
  auto async_acquire_for(std::size_t n, duration timeout, Token&& token = Token{}) const {
    return async_acquire_until(n, Doors::deadline_after(timeout), std::forward<Token>(token));
  }

  /// As the semaphore's async_acquire_until (errc::timed_out at `deadline`), leased.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code, permit)) Token = default_token_t>
  auto async_acquire_until(std::size_t n, time_point deadline, Token&& token = Token{}) const {
    return net::async_initiate<Token, void(error_code, permit)>(initiate{doors_.core, lease_, doors_.place}, token, n, deadline);
  }

  /// As the semaphore's acquire: `auto p = co_await sem.with_lease(30s).acquire();`, leased.
  net::awaitable<permit> acquire(std::size_t n = 1) const { return acquire_until(n, time_point::max()); }

  /// As the semaphore's acquire_for, leased.
  net::awaitable<permit> acquire_for(std::size_t n, duration timeout) const {
    return acquire_until(n, Doors::deadline_after(timeout));
  }

  /// As the semaphore's acquire_until, leased.
  net::awaitable<permit> acquire_until(std::size_t n, time_point deadline) const {
    return wait(doors_, lease_, n, deadline);  // the coroutine keeps copies: this view is a temporary
  }

 private:
  using core_type = std::remove_pointer_t<decltype(Doors::core)>;

  static net::awaitable<permit> wait(Doors doors, std::chrono::nanoseconds lease, std::size_t n,
                                     time_point deadline) {
    auto nodes = doors.core->reserve_lease();
    permit p = co_await doors.acquire_until(n, deadline);
    // A permit keeps its line alive (see rein::permit's Lifetime): the line is there to lease it.
    co_return doors.core->lease_permit(std::move(p), nodes, lease, doors.place.partition);
  }

  struct initiate {
    core_type* core;
    std::chrono::nanoseconds lease;
    detail::line_place place;
    using executor_type = typename Doors::executor_type;
    executor_type get_executor() const noexcept { return core->get_executor(); }

    template <class Handler>
    void operator()(Handler&& handler, std::size_t n, time_point deadline) const {
      auto nodes = core->reserve_lease();  // before the acquire: if it throws, nothing started
      core->async_acquire(detail::lease_handler<std::decay_t<Handler>, core_type>{std::forward<Handler>(handler), core,
                                                                                  std::move(nodes), lease,
                                                                                  place.partition},
                          n, deadline, place);
    }
  };

  Doors doors_;
  std::chrono::nanoseconds lease_;
};

namespace detail {

/// `doors` (a semaphore's, at any class, partition or key) with leases of `lease`; throws
/// std::invalid_argument naming the limiter, the field and the value unless lease > 0. A lease too long to
/// count in nanoseconds never ends.
template <class Doors, class Rep, class Period>
lease_view<Doors> with_lease(Doors doors, std::chrono::duration<Rep, Period> lease) {
  if (lease <= lease.zero())
    throw_invalid(describe(doors.type, doors.core->name()), "with_lease's lease must be > 0",
                  show(std::chrono::duration_cast<std::chrono::nanoseconds>(lease)));
  const auto ns = lease >= std::chrono::duration_cast<std::chrono::duration<Rep, Period>>(std::chrono::nanoseconds::max())
                      ? std::chrono::nanoseconds::max()
                      : std::chrono::duration_cast<std::chrono::nanoseconds>(lease);
  return lease_view<Doors>(doors, ns);
}

}  // namespace detail

}  // namespace rein

/// @cond
template <template <class, class> class Associator, class Handler, class Core, class DefaultCandidate>
struct REIN_ASIO_NAMESPACE::associator<Associator, rein::detail::lease_handler<Handler, Core>, DefaultCandidate>
    : Associator<Handler, DefaultCandidate> {
  static typename Associator<Handler, DefaultCandidate>::type get(
      const rein::detail::lease_handler<Handler, Core>& h, const DefaultCandidate& c = DefaultCandidate()) noexcept {
    return Associator<Handler, DefaultCandidate>::get(h.handler, c);
  }
};
/// @endcond
