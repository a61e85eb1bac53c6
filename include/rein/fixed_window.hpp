// An awaitable fixed (calendar-aligned) window: at most `limit` units per window, the count starting again
// at each window's start.
#pragma once

#include <rein/algo/fixed_window.hpp>
#include <rein/config.hpp>
#include <rein/detail/asio_header.hpp>
#include <rein/detail/format.hpp>
#include <rein/line_options.hpp>
#include <rein/null_mutex.hpp>
#include <rein/observer.hpp>
#include <rein/queue_order.hpp>
#include <rein/rate_limiter.hpp>
#include <rein/reservation.hpp>
#include <rein/wait_stats.hpp>

#include REIN_ASIO_HEADER(any_io_executor.hpp)
#include REIN_ASIO_HEADER(execution_context.hpp)

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace rein {

/// The rule of a fixed window: `{.limit = 1000, .window = std::chrono::minutes(1)}`, Duration being the clock's
/// (basic_fixed_window's Clock::duration). The waiting line's options (name, max_waiters, ...) are
/// rein::line_options, the constructor's next argument.
template <class Duration>
struct basic_fixed_window_options {
  std::int64_t limit = 0;  ///< most units per window, in [1, 2^62]
  Duration window{};       ///< the window's length, > 0
  /// Windows start at the clock's epoch plus `offset` plus a whole number of windows; any value, only its
  /// remainder modulo `window` matters. Default: 0.
  Duration offset{};
};

/// The rule of a fixed window on std::chrono::steady_clock.
using fixed_window_options = basic_fixed_window_options<std::chrono::steady_clock::duration>;

/// A fixed window's state, copied out under its lock.
template <class Duration>
struct fixed_window_snapshot : wait_stats, reservation_stats {
  std::int64_t in_window = 0;  ///< units counted in the current window (above `limit` while a charge is repaid)
  std::int64_t available = 0;  ///< max(0, limit - in_window): units that fit now (if nobody waits)
  std::int64_t limit = 0;      ///< most units per window
  Duration window{};           ///< the window's length
  Duration resets_in{};        ///< time until the current window ends and the count starts again
  double utilisation = 0.0;    ///< in_window / limit
};

/// One line: `in_window=3 limit=5 window=60.0s resets_in=12.5s utilisation=0.6 available=2 waiting=0 ...`.
template <class Duration>
std::ostream& operator<<(std::ostream& os, const fixed_window_snapshot<Duration>& s) {
  os << "in_window=" << s.in_window << " limit=" << s.limit << " window=";
  detail::write_duration(os, std::chrono::duration_cast<std::chrono::nanoseconds>(s.window));
  os << " resets_in=";
  detail::write_duration(os, std::chrono::duration_cast<std::chrono::nanoseconds>(s.resets_in));
  os << " utilisation=";
  detail::write_number(os, s.utilisation);
  os << " available=" << s.available;
  detail::write_reservations(os, s);
  os << ' ';
  detail::write_wait_stats(os, s);
  return os;
}

/// An awaitable fixed window: at most `limit` units per window, the windows aligned to the clock's epoch
/// plus an offset, and a call waits until its units fit. It is the rule of quotas published per calendar
/// unit ("1,000 per clock minute", "10,000 per UTC day"): the provider resets its count at each window's
/// start, and so does this limiter, so it can use the whole quota of every window.
///
/// ```
/// rein::utc_fixed_window per_minute(io, {.limit = 1000, .window = std::chrono::minutes(1)});
/// co_await per_minute.acquire();
/// ```
/// (From tests/async/sliding_window.cpp, which compiles and runs it.)
///
/// The rule is `rein::algo::basic_fixed_window` (one count per window: O(1) memory). On
/// `std::chrono::system_clock` (`utc_fixed_window`) windows of a minute, an hour or a day are UTC minutes,
/// hours or days; `offset` shifts them (`5h` with a day: days starting at 05:00 UTC). On the default
/// `std::chrono::steady_clock` the epoch is unspecified, so use it for local rules only.
///
/// The boundary burst: up to `2 * limit` units can start within less than one window, `limit` at the end
/// of a window and `limit` at the start of the next (100 per minute: 100 at 12:00:59 and 100 at 12:01:00).
/// The provider's counter allows the same, so this wastes no quota; where no interval of one window may see
/// more than `limit` (an upstream measuring a sliding window), use rein::basic_sliding_window, where a unit
/// frees its room only one window after its own start.
///
/// Waiters are served in FIFO order (or the order the options choose: rein::queue_order), each at the instant
/// its units fit (the next window's start when this one is full), by one timer; a waiter counts its units only
/// when granted, so cancelling it costs nothing. The operations (`acquire`, `async_acquire`, `_for`, `_until`,
/// `try_acquire`, `refund`, `charge`, `limit_remaining`, `close`) are those of rein::basic_rate_limiter:
/// `refund(n)` lowers the current window's count (refund in the window the units were taken in), `charge(n)`
/// counts n units now even beyond the limit (the excess is a debt the next window starts repay, `limit` each),
/// and `limit_remaining` applies an upstream's remaining count until its reset. A deadline that cannot be met
/// fails at once with errc::timed_out whenever even single-unit waiters ahead could not make it in time (exact
/// when every waiter asks for one unit).
///
/// `reserve(n)` (rein::basic_reservation) counts n units now in the first window with room for them and
/// says when that window starts (now, if this one has room): wait for it, act elsewhere, or `cancel()` to
/// take them off the count again, unless a later reservation's window still needs the count (cancel the
/// latest first; see `algo::basic_fixed_window::cancel_reservation`).
///
/// @tparam Executor the I/O executor; completions default to it.
/// @tparam Clock    the clock of the windows and of deadlines; tick of a nanosecond or coarser.
/// @tparam Mutex    std::mutex (default): safe from many threads and strands; rein::null_mutex: one thread or
///                  strand only.
///
/// @par Thread Safety
/// With std::mutex, every member function may be called concurrently, except destruction (which, as for
/// Asio's I/O objects, must not race with its own operations, their cancellation signals included).
/// With null_mutex, all use must happen on one thread or strand.
///
/// @par Lifetime
/// Movable, not copyable. Destroying it completes every waiter with `net::error::operation_aborted`.
template <class Executor = net::any_io_executor, class Clock = std::chrono::steady_clock, class Mutex = std::mutex>
class basic_fixed_window : public basic_rate_limiter<algo::basic_fixed_window<Clock>, Executor, Mutex> {
  using base = basic_rate_limiter<algo::basic_fixed_window<Clock>, Executor, Mutex>;

 public:
  /// The clock that times the rule and the deadlines.
  using typename base::clock_type;
  /// A duration of `clock_type`.
  using typename base::duration;
  /// The executor that runs completion handlers without an associated executor of their own.
  using typename base::executor_type;
  /// The rule that decides admissions, a plain class of rein::algo.
  using typename base::limit_type;
  /// A point in time of `clock_type`.
  using typename base::time_point;
  /// What snapshot() returns.
  using snapshot_type = fixed_window_snapshot<duration>;

  /// The rule it takes.
  using rule_type = basic_fixed_window_options<duration>;

  /// The window type when rebound to another executor.
  template <class OtherExecutor>
  struct rebind_executor {
    /// The same limiter type on `OtherExecutor`.
    using other = basic_fixed_window<OtherExecutor, Clock, Mutex>;
  };

  /// Makes a window with nothing counted yet, completing operations on `ex` by default; `line` is its
  /// waiting line's (rein::line_options; partitions are refused).
  /// @throws std::invalid_argument if the limit is not in [1, 2^62], the window is not > 0 or a line option is
  /// invalid; the message names the type, the field and the value.
  basic_fixed_window(const executor_type& ex, const rule_type& o, line_options line = {})
      // `line` is copied: the name is read by another argument, and arguments run in any order.
      : base("rein::fixed_window", ex, make_window(o, line.name), line) {}

  /// Makes a window on an execution context (an io_context).
  template <class ExecutionContext>
    requires std::is_convertible_v<ExecutionContext&, net::execution_context&>
  basic_fixed_window(ExecutionContext& context, const rule_type& o, line_options line = {})
      : basic_fixed_window(context.get_executor(), o, std::move(line)) {}

  /// Changes the limit from now on; the units counted in the current window stay counted. Queued waiters
  /// are re-timed at once; one queued for more than a lowered limit is granted when a window is empty,
  /// counting as `limit` units (new requests above it fail with errc::exceeds_capacity).
  /// @throws std::invalid_argument as the constructor does, changing nothing.
  void set_limit(std::int64_t limit) {
    renamed([&] { this->update([limit](limit_type& w, time_point now) { w.set_limit(limit, now); }); },
            this->name());
  }

  /// Changes the window's length from now on (the offset stays); the units counted so far count in the new
  /// window containing now, and queued waiters are re-timed at once.
  /// @throws std::invalid_argument as the constructor does, changing nothing.
  void set_window(duration window) {
    renamed([&] { this->update([window](limit_type& w, time_point now) { w.set_window(window, now); }); },
            this->name());
  }

  /// The most units per window: the most one request may ask for.
  std::int64_t limit() const {
    return this->inspect([](const limit_type& w, const wait_stats&) { return w.limit(); });
  }

  /// The window's length.
  duration window() const {
    return this->inspect([](const limit_type& w, const wait_stats&) { return w.window(); });
  }

  /// When the current window ends and its count starts again (`time_point::max()` beyond the clock's range).
  time_point window_end() const {
    const time_point now = Clock::now();
    return this->inspect([now](const limit_type& w, const wait_stats&) { return w.window_end(now).value_or(time_point::max()); });
  }

  /// The current window's count and room, when it resets, and the waiting statistics; O(1).
  snapshot_type snapshot() const {
    const time_point now = Clock::now();
    return this->inspect([this, now](const limit_type& w, const wait_stats& stats) {
      snapshot_type s;
      static_cast<wait_stats&>(s) = stats;
      detail::copy_reservations(this->reservations(), s);
      s.in_window = w.count(now);
      s.available = std::max<std::int64_t>(0, w.limit() - s.in_window);
      s.limit = w.limit();
      s.window = w.window();
      const time_point from = std::max(now, w.last_time());
      const std::optional<time_point> end = w.window_end(now);
      s.resets_in = end ? duration(*end - from) : duration::max();
      s.utilisation = static_cast<double>(s.in_window) / static_cast<double>(s.limit);
      return s;
    });
  }

 private:
  template <class F>
  static decltype(auto) renamed(F&& f, std::string_view name = {}) {
    // A named limiter's errors name it too: rein::fixed_window "api": limit must be ...
    return detail::renaming_errors("rein::algo::fixed_window", {"rein::fixed_window", name},
                                   std::forward<F>(f));
  }

  static limit_type make_window(const rule_type& o, std::string_view name) {
    return renamed([&] { return limit_type({.limit = o.limit, .window = o.window, .offset = o.offset}, Clock::now()); },
                   name);
  }
};

/// The thread-safe fixed window on any I/O executor and std::chrono::steady_clock.
using fixed_window = basic_fixed_window<>;

/// The single-threaded fixed window: no locking; use from one thread or strand only.
using single_thread_fixed_window = basic_fixed_window<net::any_io_executor, std::chrono::steady_clock, null_mutex>;

/// The thread-safe fixed window on std::chrono::system_clock: windows aligned to UTC minutes, hours, days.
using utc_fixed_window = basic_fixed_window<net::any_io_executor, std::chrono::system_clock>;

}  // namespace rein
