// The async layer over any pure rate limit: waiters, deadlines and one timer around an algo:: value.
#pragma once

#include <rein/algo/all_of.hpp>
#include <rein/algo/rate_limit.hpp>
#include <rein/algo/sliding_window.hpp>
#include <rein/algo/token_bucket.hpp>
#include <rein/config.hpp>
#include <rein/detail/acquire_doors.hpp>
#include <rein/detail/asio_header.hpp>
#include <rein/detail/core_owner.hpp>
#include <rein/detail/format.hpp>
#include <rein/detail/invalid_option.hpp>
#include <rein/detail/limiter_core.hpp>
#include <rein/detail/line_setup.hpp>
#include <rein/detail/rate_limit_policy.hpp>
#include <rein/error.hpp>
#include <rein/line_options.hpp>
#include <rein/line_view.hpp>
#include <rein/null_mutex.hpp>
#include <rein/observer.hpp>
#include <rein/outcome.hpp>
#include <rein/queue_order.hpp>
#include <rein/reservation.hpp>
#include <rein/try_result.hpp>
#include <rein/wait_stats.hpp>

#include REIN_ASIO_HEADER(any_io_executor.hpp)
#include REIN_ASIO_HEADER(async_result.hpp)
#include REIN_ASIO_HEADER(awaitable.hpp)
#include REIN_ASIO_HEADER(execution_context.hpp)
#include REIN_ASIO_HEADER(redirect_error.hpp)
#include REIN_ASIO_HEADER(use_awaitable.hpp)

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace rein {

/// A rate limiter's waiting statistics, and its reservations' counters (zero for a limit that does not
/// reserve), copied out under its lock.
struct rate_limiter_snapshot : wait_stats, reservation_stats {};

/// One line: `waiting=0 acquired=10 rejected=0 wait[...]`, then ` reserved=2 (cancelled=1 returned=2)` once
/// anything was reserved.
inline std::ostream& operator<<(std::ostream& os, const rate_limiter_snapshot& s) {
  detail::write_wait_stats(os, s);
  detail::write_reservations(os, s);
  return os;
}

namespace detail {
// What a limiter's reserve() returns: rein::basic_reservation for a limit that reserves, else nothing.
template <class Limit, class Executor, class Mutex>
struct reservation_of {
  using type = void;
};
template <algo::reservable_rate_limit Limit, class Executor, class Mutex>
struct reservation_of<Limit, Executor, Mutex> {
  using type = basic_reservation<Limit, Executor, Mutex>;
};
}  // namespace detail

/// An awaitable rate limiter over any pure rate limit (`rein::algo::rate_limit`): how many calls may start
/// per unit of time. `rein::basic_token_bucket` and `rein::basic_sliding_window` are this class over
/// `algo::basic_token_bucket` and `algo::basic_sliding_window`; use it directly for `algo::all_of` ("10 per
/// second and 1,000 per hour", all or nothing) or `algo::basic_sliding_window_counter`.
///
/// `co_await limiter.acquire(n)` returns once n units (tokens, starts) have been taken; a rate limiter hands out
/// nothing to hold or give back, so it completes with `void(error_code)`. Waiters are served in FIFO order (LIFO with
/// `order = queue_order::lifo`, by class with `queue_order::priority`) with head-of-line blocking (a big request is not
/// starved by small ones), take their units only when granted (a cancelled or timed-out waiter costs nothing), and are
/// granted at the instant the limit has room, by ONE timer per limiter armed for the head: 100,000 waiters are not
/// 100,000 timers, and a refill wakes only whom it can serve.
///
/// @tparam Limit    a model of `rein::algo::rate_limit` (its clock is the limiter's clock, e.g.
///                  `rein::testing::manual_clock` in tests).
/// @tparam Executor the I/O executor; completions default to it.
/// @tparam Mutex    std::mutex (default): safe from many threads and strands; rein::null_mutex: one thread
///                  or strand only, no locking.
///
/// @par Thread Safety
/// With std::mutex, every member function may be called concurrently, except destruction (which, as for
/// Asio's I/O objects, must not race with its own operations, their cancellation signals included).
/// With null_mutex, all use must happen on one thread or strand.
///
/// @par Lifetime
/// Movable, not copyable. Destroying it completes every waiter with `net::error::operation_aborted`.
template <algo::rate_limit Limit, class Executor = net::any_io_executor, class Mutex = std::mutex>
class basic_rate_limiter {
 protected:
  /// How the waiter core asks the rule (an implementation type).
  using policy_type = detail::rate_limit_policy<Limit>;
  /// The waiter core (an implementation type).
  using core_type = detail::limiter_core<policy_type, Executor, typename Limit::clock, Mutex, void(error_code)>;

 public:
  /// The rule that decides admissions, a plain class of rein::algo.
  using limit_type = Limit;
  /// The executor that runs completion handlers without an associated executor of their own.
  using executor_type = Executor;
  /// The clock that times the rule and the deadlines.
  using clock_type = typename Limit::clock;
  /// A point in time of `clock_type`.
  using time_point = typename Limit::time_point;
  /// A duration of `clock_type`.
  using duration = typename Limit::duration;

  /// The limiter type when rebound to another executor.
  template <class OtherExecutor>
  struct rebind_executor {
    /// The same limiter type on `OtherExecutor`.
    using other = basic_rate_limiter<Limit, OtherExecutor, Mutex>;
  };

  /// The rule it takes: the limit itself.
  using rule_type = Limit;

  /// What reserve() returns: rein::basic_reservation<Limit, Executor, Mutex> when `Limit` is an
  /// algo::reservable_rate_limit (token bucket, fixed and sliding windows, `all_of` of those), else void.
  using reservation = typename detail::reservation_of<Limit, Executor, Mutex>::type;

  /// Wraps `limit` (made at the clock's current time), completing operations on `ex` by default; `line` is
  /// its waiting line's (rein::line_options; partitions are refused: a rate limiter hands out no permits).
  /// @throws std::invalid_argument naming the type, the field and the value for an invalid line option.
  basic_rate_limiter(const executor_type& ex, Limit limit, line_options line = {});

  /// Wraps `limit`, on an execution context (an io_context).
  template <class ExecutionContext>
    requires std::is_convertible_v<ExecutionContext&, net::execution_context&>
  basic_rate_limiter(ExecutionContext& context, Limit limit, line_options line = {})
      : basic_rate_limiter(context.get_executor(), std::move(limit), std::move(line)) {}

  basic_rate_limiter(const basic_rate_limiter&) = delete;
  basic_rate_limiter& operator=(const basic_rate_limiter&) = delete;

  /// Moves the limiter: waiters, permits and state stay with it (permits point at its shared state, not at
  /// this object). The moved-from object may only be destroyed or assigned to.
  basic_rate_limiter(basic_rate_limiter&&) noexcept = default;

  /// Destroys this limiter's state as the destructor does, then takes `other`'s.
  basic_rate_limiter& operator=(basic_rate_limiter&&) noexcept = default;

  /// Completes every waiter with `net::error::operation_aborted`.
  ~basic_rate_limiter() = default;

  /// The executor given at construction.
  executor_type get_executor() const noexcept { return core_->get_executor(); }

  /// The name given in the options (empty if none).
  const std::string& name() const noexcept { return core_->name(); }

  /// Takes n units now if the limit has room and nobody waits (a waiter is never overtaken). Never waits,
  /// never allocates. The result is true when taken; otherwise its status() says why (try_status::busy,
  /// closed after close(), exceeds_capacity when n exceeds the capacity) and, when busy, retry_after() says
  /// how long until the same request would be taken at the current rate (behind waiters, a lower bound).
  try_result try_acquire(std::size_t n = 1) { return doors().try_acquire(n); }

  /// As try_acquire(n), decided at `now` instead of at a clock read of its own: callers that take from
  /// several limiters at one instant read the clock once (as Go's x/time/rate `AllowN(t, n)` takes t).
  /// Precondition: `now` is not later than `clock_type::now()` (a later instant would take units that have
  /// not arrived yet). A `now` earlier than the limit's latest instant counts as that instant, so the limit
  /// never goes back in time, whatever the order in which threads arrive with their readings. retry_after()
  /// counts from `now` (nanoseconds::max() when that distance does not fit, as from time_point::min()).
  try_result try_acquire_at(std::size_t n, time_point now) { return doors().try_acquire(n, &now); }

  /// Waits until n units can be taken, and takes them. The initiating function; every completion token works.
  ///
  /// @param n     units wanted (tokens, starts); at most the capacity. n == 0 takes nothing and is granted in
  ///              its FIFO turn (at once when nobody waits).
  /// @param token completion token; signature `void(error_code)`. Default: `deferred`.
  ///
  /// Errors: errc::exceeds_capacity (n above the capacity, at once), errc::queue_full (max_waiters waiting,
  /// at once), errc::closed, `net::error::operation_aborted` (cancelled, or the limiter was destroyed).
  /// The handler is never invoked from inside this function: it goes through its associated executor.
  ///
  /// @par Per-Operation Cancellation
  /// terminal, partial and total: a waiting operation is removed and completes with operation_aborted; it
  /// had taken nothing. A cancellation that arrives after the units were taken but before the handler runs
  /// takes the grant back: the handler gets operation_aborted, and if the limiter's clock still reads the
  /// instant of the grant, the units go back too (the limit's `refund`); once the clock moved, they stay
  /// spent, since a limit that refilled or slid since has no exact undo and a refund could let more through
  /// than the limit. Once the handler runs, the units are spent.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code)) Token = default_token_t>
  auto async_acquire(std::size_t n = 1, Token&& token = Token{}) {
    return doors().async_acquire_until(n, time_point::max(), std::forward<Token>(token));
  }

  /// As async_acquire, failing with errc::timed_out if not granted within `timeout` (a timeout too long to
  /// represent, such as duration::max(), means none).
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code)) Token = default_token_t>
  auto async_acquire_for(std::size_t n, duration timeout, Token&& token = Token{}) {
    return doors().async_acquire_for(n, timeout, std::forward<Token>(token));
  }

  /// As async_acquire, failing with errc::timed_out if not granted by `deadline` (time_point::max(): never).
  ///
  /// A wait that cannot be granted by the deadline, given the waiters ahead and the current rate, fails at
  /// once with errc::timed_out and takes nothing (for a token bucket the prediction is exact; for other
  /// limits it is a lower bound, and a wait it lets through still times out at the deadline). A grant due
  /// at the deadline's very instant wins over the timeout.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code)) Token = default_token_t>
  auto async_acquire_until(std::size_t n, time_point deadline, Token&& token = Token{}) {
    return doors().async_acquire_until(n, deadline, std::forward<Token>(token));
  }

  /// Waits for n units inside a coroutine: `co_await limiter.acquire();`.
  ///
  /// When the limit has room and nobody waits, it returns without suspending through the scheduler (the cost
  /// of a nested `co_await`, a lock and a clock read). Otherwise it waits as async_acquire does. Throws
  /// `rein::system_error` with the errors listed for async_acquire.
  net::awaitable<void> acquire(std::size_t n = 1) { return doors().acquire_until(n, time_point::max()); }

  /// As acquire, throwing errc::timed_out if not granted within `timeout` (a timeout too long to represent,
  /// such as duration::max(), means none).
  net::awaitable<void> acquire_for(std::size_t n, duration timeout) { return doors().acquire_for(n, timeout); }

  /// As acquire, throwing errc::timed_out if not granted by `deadline`. Behind other waiters it does not
  /// try first (that would fail, and cost a lock).
  net::awaitable<void> acquire_until(std::size_t n, time_point deadline) { return doors().acquire_until(n, deadline); }

  /// The order in which its line serves waiters (line_options::order).
  queue_order order() const noexcept { return core_->order(); }

  /// This limiter's acquire doors at priority class `c` (0 the most urgent; a plain acquire is class 0), for
  /// a limiter whose options chose `order = queue_order::priority`: `co_await lim.at_priority(2).acquire()`.
  /// See rein::line_view and queue_order::priority. Throws std::invalid_argument naming the limiter if
  /// its options chose another order (the class would be ignored).
  auto at_priority(std::uint8_t c) const { return detail::at_priority(doors(), c); }

  /// This limiter's acquire doors for the key `key` (a tenant, a host) at `weight` (1 to 1,000,000), for a
  /// limiter whose options chose `order = queue_order::fair`: `co_await lim.for_key(tenant, 2).acquire()`.
  /// While keys wait, each is served its weight's share of the units granted, whatever its arrival rate; a
  /// plain acquire is the key "" at weight 1. See rein::line_view and queue_order::fair for the rule and its
  /// bound. Throws std::invalid_argument naming the limiter if its options chose another order, or if the
  /// weight is out of range.
  auto for_key(std::string_view key, std::uint32_t weight = 1) const { return detail::for_key(doors(), key, weight); }

 protected:
  /// For the derived types: `type` names them in messages ("rein::token_bucket"; a static string).
  basic_rate_limiter(std::string_view type, const executor_type& ex, Limit limit, line_options line)
      : type_name_(type),
        core_(ex, detail::line_of(type, std::move(line), {.no_sojourn = detail::paced_line}), std::move(limit)) {}

  /// How messages name this limiter's type ("rein::token_bucket", ...).
  std::string_view type_name_;

  /// The waiter core, for a derived type's own steps under its lock.
  core_type* core() const noexcept { return core_.get(); }

  /// The book of reservations (nullptr before the first reserve); read it under the lock (in inspect).
  const detail::reservation_book<time_point>* reservations() const noexcept { return book_.get(); }

 public:

  /// Reserves n units now and says when they are the caller's (Go's `ReserveN`): they are counted at once
  /// (a token bucket goes into debt, a window counts them in the window they act in), and the
  /// reservation's `delay()` is how long until they are the caller's. Then `co_await r.wait()`, act at
  /// `r.time_to_act()`, or `r.cancel()` to give them back by the limit's rule; see rein::basic_reservation.
  /// Never waits, never blocks anyone already waiting. Present when `Limit` is an
  /// algo::reservable_rate_limit.
  ///
  /// The line's rule: a reservation never overtakes a waiter. While anyone waits on the line (an acquire,
  /// in any queue_order), reserve takes nothing and returns a reservation that is not ok, status busy (ask
  /// try_acquire().retry_after() when the line may be through). Acquires that come after a reservation
  /// queue behind it, and later reservations are timed after it: FIFO between reservations and acquires
  /// alike.
  ///
  /// Not ok, with nothing taken: exceeds_capacity if n > the capacity (a window's limit), closed after
  /// close(), busy as above or if the limit cannot count that far ahead (a token bucket's debt beyond 1e15
  /// tokens, a fixed window's count beyond 2^62, a time beyond the clock's range). Synchronous because
  /// reserving takes no time: only the wait does.
  /// @throws std::bad_alloc if the book of reservations (or a sliding window's log) cannot grow.
  /// @par Thread Safety
  /// As every member: safe concurrently with std::mutex.
  reservation reserve(std::size_t n = 1)
    requires algo::reservable_rate_limit<Limit>
  {
    return reservation::reserve(*core_.get(), book_, n);
  }

  /// Gives back n units taken earlier and not used (the unused part of an estimate, a call never made),
  /// never beyond what the limit allows (see the limit's own `refund`), and, while reservations stand,
  /// never any unit one of them counts on (the limit's `refund(n, standing, t)`: a fixed window or a token
  /// bucket then gives back less, or nothing). Waiters that now fit are granted.
  void refund(std::size_t n);

  /// Charges n units now whatever the limit holds, into debt if need be (the limit's `charge`: the cost of a
  /// call found to be larger than its estimate, charged after the fact). Never waits and never fails; n may
  /// exceed the capacity. Queued waiters are re-timed at once: the head's timer moves to when the debt is
  /// repaid, so the next callers wait for it instead of the limit being silently overrun. Present when
  /// `Limit` is an `algo::chargeable_rate_limit` (token bucket, sliding window and its counter, adaptive
  /// rate, `all_of` of those).
  /// @par Thread Safety
  /// As every member: safe concurrently with std::mutex.
  void charge(std::size_t n)
    requires algo::chargeable_rate_limit<Limit>
  {
    const auto count = static_cast<std::int64_t>(std::min<std::uint64_t>(n, std::numeric_limits<std::int64_t>::max()));
    update([count](Limit& limit, time_point now) { limit.charge(count, now); });
  }

  /// Corrects the limit downwards from an upstream's count: from now until `now + reset_after` it admits at
  /// most `remaining` units (the limit's `limit_remaining`; e.g. a window's count from rein::read_response,
  /// applied in its provider's meaning by rein::limit_remaining). Never raises what the limit
  /// admits. Queued waiters are re-timed at once. Present when `Limit` is an
  /// `algo::remaining_limited_rate_limit` (token bucket, adaptive rate; sliding window for resets shorter
  /// than its window).
  /// @param remaining   units the upstream still admits before its reset; negative values are read as 0
  /// @param reset_after time until the upstream's reset; negative values are read as 0 (already reset)
  /// @returns true if the limit was lowered.
  bool limit_remaining(std::int64_t remaining, std::chrono::nanoseconds reset_after)
    requires algo::remaining_limited_rate_limit<Limit>
  {
    const std::int64_t units = std::max<std::int64_t>(remaining, 0);
    const std::chrono::nanoseconds after = std::max(reset_after, std::chrono::nanoseconds::zero());
    return update([units, after](Limit& limit, time_point now) { return limit.limit_remaining(units, after, now); });
  }

  /// Runs `f(Limit&, time_point now)` under the lock, then grants whatever became grantable: the way to
  /// reconfigure a part of an `algo::all_of` at run time. `f` must not block or use this limiter. If it
  /// throws, the exception propagates after the waiters have been re-examined.
  template <class F>
  decltype(auto) update(F&& f) {
    return core_->update(
        [&](policy_type& p, time_point now) -> decltype(auto) { return std::forward<F>(f)(p.limit(), now); });
  }

  /// Runs `f(const Limit&, const wait_stats&)` under the lock and returns its result. `f` must not block or
  /// use this limiter.
  template <class F>
  decltype(auto) inspect(F&& f) const {
    return core_->inspect(
        [&](const policy_type& p, const wait_stats& w) -> decltype(auto) { return std::forward<F>(f)(p.limit(), w); });
  }

  /// Completes every waiter with errc::closed; later acquires fail the same way and try_acquire returns
  /// false. Idempotent.
  void close() { core_->close(); }

  /// Waiting statistics, copied under the lock in O(1).
  rate_limiter_snapshot snapshot() const {
    return inspect([this](const Limit&, const wait_stats& w) {
      rate_limiter_snapshot s;
      static_cast<wait_stats&>(s) = w;
      detail::copy_reservations(book_.get(), s);
      return s;
    });
  }

 private:
  // Every door is written once, in detail/acquire_doors.hpp.
  detail::line_doors<core_type> doors() const noexcept { return {core_.get(), type_name_}; }

  detail::core_owner<core_type> core_;
  // The reservations not yet acted (rein/reservation.hpp), made by the first reserve; under the line's lock.
  std::shared_ptr<detail::reservation_book<time_point>> book_;
};

// Members defined outside the class, so that REIN_SEPARATE_COMPILATION compiles them in one unit only: a
// unit that declares the class extern then neither instantiates them nor copies them in (config.hpp).
template <algo::rate_limit Limit, class Executor, class Mutex>
REIN_SEPARATE_INLINE basic_rate_limiter<Limit, Executor, Mutex>::basic_rate_limiter(const executor_type& ex,
                                                                                    Limit limit,
                                                                                    line_options line)
    : basic_rate_limiter("rein::rate_limiter", ex, std::move(limit), std::move(line)) {}

template <algo::rate_limit Limit, class Executor, class Mutex>
REIN_SEPARATE_INLINE void basic_rate_limiter<Limit, Executor, Mutex>::refund(std::size_t n) {
  const auto count = static_cast<std::int64_t>(std::min<std::uint64_t>(n, std::numeric_limits<std::int64_t>::max()));
  if constexpr (algo::reservable_rate_limit<Limit>) {
    update([this, count](Limit& limit, time_point now) {
      // Units a standing reservation counts on stay counted (the limit's refund while they stand).
      if (book_) return static_cast<void>(book_->refund(limit, count, now));
      limit.refund(count, now);
    });
  } else {
    update([count](Limit& limit, time_point now) { limit.refund(count, now); });
  }
}

/// Several pure rate limits enforced together, all or nothing, behind one waiting line:
/// `rein::rate_limits<algo::token_bucket, algo::sliding_window> limits(io, algo::all_of{...});`
/// A request for n takes n from every limit. (Different counts per limit, like "1 request and
/// 800 tokens", need one limiter per limit, acquired in turn: see examples/llm_quota.cpp.)
template <algo::rate_limit... Limits>
using rate_limits = basic_rate_limiter<algo::all_of<Limits...>>;

}  // namespace rein
