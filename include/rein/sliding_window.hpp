// An awaitable exact sliding window: at most `limit` starts in any window of length W.
#pragma once

#include <rein/algo/sliding_window.hpp>
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

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>

namespace rein {

/// The rule of a sliding window: `{.limit = 100, .window = std::chrono::seconds(1)}`, Duration being the clock's
/// (basic_sliding_window's Clock::duration). The waiting line's options (name, max_waiters, ...) are
/// rein::line_options, the constructor's next argument.
template <class Duration>
struct basic_sliding_window_options {
  std::int64_t limit = 0;  ///< most starts in any window, in [1, 2^27]
  Duration window{};       ///< the window's length, > 0
};

/// The rule of a sliding window on std::chrono::steady_clock.
using sliding_window_options = basic_sliding_window_options<std::chrono::steady_clock::duration>;

/// A sliding window's state, copied out under its lock.
template <class Duration>
struct sliding_window_snapshot : wait_stats, reservation_stats {
  std::int64_t in_window = 0;  ///< starts in the window ending now (those a reservation logged later: not yet)
  std::int64_t available = 0;  ///< starts that fit now (if nobody waits): at most limit - in_window, less
                               ///< while a reservation's starts ahead need the room
  std::int64_t limit = 0;      ///< most starts in any window
  Duration window{};           ///< the window's length
  double utilisation = 0.0;    ///< in_window / limit
};

/// One line: `in_window=3 limit=5 window=1.00s utilisation=0.6 available=2 waiting=0 acquired=3 ...`.
template <class Duration>
std::ostream& operator<<(std::ostream& os, const sliding_window_snapshot<Duration>& s) {
  os << "in_window=" << s.in_window << " limit=" << s.limit << " window=";
  detail::write_duration(os, std::chrono::duration_cast<std::chrono::nanoseconds>(s.window));
  os << " utilisation=";
  detail::write_number(os, s.utilisation);
  os << " available=" << s.available;
  detail::write_reservations(os, s);
  os << ' ';
  detail::write_wait_stats(os, s);
  return os;
}

/// An awaitable exact sliding window: at most `limit` calls start in any window of length `window`, and a
/// call waits until its start fits. It is what a published quota of "N per window, measured on a sliding
/// window" needs: unlike a token bucket of the same average rate it never lets `limit + 1` starts into any
/// window, because room comes back only when a start leaves the window.
///
/// ```
/// rein::sliding_window window(io, {.limit = 500, .window = std::chrono::minutes(1)});
/// co_await window.acquire();
/// ```
/// (From tests/async/doc_snippets.cpp, which compiles and runs it.)
///
/// The rule is `rein::algo::basic_sliding_window` (a log of the last `limit` start times: exact, O(limit)
/// memory). A start at s counts during [s, s + window). With 2 per 10 s, five
/// waiters started at 0.00 .. 0.04 s are granted at 0.00, 0.01, 10.00, 10.01, 20.00 (a token bucket of 0.2 per
/// second and burst 2 grants them at 0.00, 0.01, 5.0, 10.0, 15.0). For limits in the millions use
/// `rein::basic_rate_limiter<algo::basic_sliding_window_counter<Clock>>` (O(1) memory, bounded overshoot).
///
/// Waiters are served in FIFO order (or the order the options choose: rein::queue_order), each at the instant
/// its starts fit, by one timer per window; a waiter records its starts only when granted, so cancelling it
/// costs nothing. The operations (`acquire`, `async_acquire`, `_for`, `_until`, `try_acquire`, `refund`,
/// `charge`, `limit_remaining`, `close`) are those of rein::basic_rate_limiter, with starts as units:
/// `charge(n)` records n starts now even beyond the limit (later callers wait until they have left the window;
/// see `algo::basic_sliding_window::charge`), and `limit_remaining` applies an upstream's count for resets
/// shorter than the window. A deadline that cannot be met fails at once with errc::timed_out whenever even
/// single-start waiters ahead could not make it in time (exact when every waiter asks for one start).
///
/// `reserve(n)` (rein::basic_reservation) records n starts at the first time they fit (never before an
/// earlier reservation's) and says when that is: wait for it, act elsewhere, or `cancel()` before then to
/// take its n starts out of the log again, all n unless later reservations pushed some out of a full log
/// (cancel the latest first; see `algo::basic_sliding_window::cancel_reservation`).
///
/// @tparam Executor the I/O executor; completions default to it.
/// @tparam Clock    the clock of the window and of deadlines; tick of a nanosecond or coarser.
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
class basic_sliding_window : public basic_rate_limiter<algo::basic_sliding_window<Clock>, Executor, Mutex> {
  using base = basic_rate_limiter<algo::basic_sliding_window<Clock>, Executor, Mutex>;

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
  using snapshot_type = sliding_window_snapshot<duration>;

  /// The rule it takes.
  using rule_type = basic_sliding_window_options<duration>;

  /// The window type when rebound to another executor.
  template <class OtherExecutor>
  struct rebind_executor {
    /// The same limiter type on `OtherExecutor`.
    using other = basic_sliding_window<OtherExecutor, Clock, Mutex>;
  };

  /// Makes an empty window (no starts yet), completing operations on `ex` by default; `line` is its waiting
  /// line's (rein::line_options; partitions are refused).
  /// @throws std::invalid_argument if the limit is not in [1, 2^27], the window is not > 0 or a line option is
  /// invalid; the message names the type, the field and the value.
  basic_sliding_window(const executor_type& ex, const rule_type& o, line_options line = {})
      // `line` is copied: the name is read by another argument, and arguments run in any order.
      : base("rein::sliding_window", ex, make_window(o, line.name), line) {}

  /// Makes an empty window on an execution context (an io_context).
  template <class ExecutionContext>
    requires std::is_convertible_v<ExecutionContext&, net::execution_context&>
  basic_sliding_window(ExecutionContext& context, const rule_type& o, line_options line = {})
      : basic_sliding_window(context.get_executor(), o, std::move(line)) {}

  /// Changes the limit from now on, keeping the most recent starts the new limit can hold. Queued waiters
  /// are re-timed at once; one queued for more than a lowered limit is granted when the window is empty,
  /// counting as `limit` starts (new requests above it fail with errc::exceeds_capacity).
  /// @throws std::invalid_argument as the constructor does, changing nothing.
  void set_limit(std::int64_t limit) {
    renamed([&] { this->update([limit](limit_type& w, time_point now) { w.set_limit(limit, now); }); },
            this->name());
  }

  /// Changes the window's length from now on; the recorded starts are judged by the new length, and queued
  /// waiters are re-timed at once, earlier or later.
  /// @throws std::invalid_argument as the constructor does, changing nothing.
  void set_window(duration window) {
    renamed([&] { this->update([window](limit_type& w, time_point now) { w.set_window(window, now); }); },
            this->name());
  }

  /// The most starts in any window: the most one request may ask for.
  std::int64_t limit() const {
    return this->inspect([](const limit_type& w, const wait_stats&) { return w.limit(); });
  }

  /// The window's length.
  duration window() const {
    return this->inspect([](const limit_type& w, const wait_stats&) { return w.window(); });
  }

  /// Starts in, and room left in, the window ending now, with the waiting statistics; O(log^2 limit).
  snapshot_type snapshot() const {
    const time_point now = Clock::now();
    return this->inspect([this, now](const limit_type& w, const wait_stats& stats) {
      snapshot_type s;
      static_cast<wait_stats&>(s) = stats;
      detail::copy_reservations(this->reservations(), s);
      // Starts a charge or a reservation pushed out of the full log still count while in the window.
      s.in_window = w.count(now) + w.dropped(now);
      // A reservation's starts logged ahead hold room now too: what fits is what ready_at says fits now.
      std::int64_t fits = 0, above = std::max<std::int64_t>(0, w.limit() - s.in_window) + 1;
      while (above - fits > 1) {
        const std::int64_t mid = fits + (above - fits) / 2;
        (w.ready_at(mid, now) == std::max(now, w.last_time()) ? fits : above) = mid;
      }
      s.available = fits;
      s.limit = w.limit();
      s.window = w.window();
      s.utilisation = static_cast<double>(s.in_window) / static_cast<double>(s.limit);
      return s;
    });
  }

 private:
  template <class F>
  static decltype(auto) renamed(F&& f, std::string_view name = {}) {
    // A named limiter's errors name it too: rein::token_bucket "api": rate must be ...
    return detail::renaming_errors("rein::algo::sliding_window", {"rein::sliding_window", name}, std::forward<F>(f));
  }

  static limit_type make_window(const rule_type& o, std::string_view name) {
    return renamed([&] { return limit_type({.limit = o.limit, .window = o.window}, Clock::now()); }, name);
  }
};

/// The thread-safe sliding window on any I/O executor and std::chrono::steady_clock.
using sliding_window = basic_sliding_window<>;

/// The single-threaded sliding window: no locking; use from one thread or strand only.
using single_thread_sliding_window = basic_sliding_window<net::any_io_executor, std::chrono::steady_clock, null_mutex>;

}  // namespace rein
