// Shared vocabulary of the pure rate limiters: the result of a take, the `rate_limit` concept that
// `algo::all_of` and the async layer are written against, and the integer time arithmetic they share.
#pragma once

#include <rein/detail/clock_time.hpp>
#include <rein/detail/invalid_option.hpp>

#include <chrono>
#include <concepts>
#include <cstdint>
#include <limits>
#include <optional>
#include <ratio>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

#if !defined(__SIZEOF_INT128__)
#error "rein::algo's rate limiters need a 128-bit integer (__int128, as on 64-bit GCC and Clang)"
#endif

namespace rein::algo {

/// What a non-waiting take did.
///
/// `exceeds_capacity` is kept apart from `denied` because no amount of waiting helps it: the request asks
/// for more than the limiter can ever hold (the async layer fails such a wait at once with
/// `rein::errc::exceeds_capacity` instead of parking it forever).
enum class take_result {
  allowed,           ///< the request was admitted and its tokens (or starts) recorded
  denied,            ///< not now; nothing changed; `ready_at` says when
  exceeds_capacity,  ///< n is larger than `capacity()`: never, whatever the wait; nothing changed
};

/// A pure rate limit: a value type fed explicit times, with no clock reads and no waiting.
///
/// Every model (`basic_token_bucket`, `basic_sliding_window`, `basic_sliding_window_counter`, `all_of`)
/// follows the same rules, which the async layer relies on:
/// - `try_take(n, t)` admits all n or nothing. Anything but `allowed` leaves the state untouched.
/// - `ready_at(n, t)` is the earliest time, never before `max(t, last_time())`, at which `try_take(n, ·)`
///   would be `allowed` if nothing else happened in between; `std::nullopt` means never (n larger than
///   `capacity()`, or a wait beyond the range of the clock). It is exact: `try_take(n, *ready_at(n, t))` is
///   `allowed`, and one clock tick earlier it is `denied`. Availability only grows with time, so a FIFO of
///   waiters can arm one timer for its head at exactly that instant.
/// - `capacity()` is the largest n a single request may ask for.
/// - `last_time()` is the latest time at which the state changed. Time is clamped to be monotonic: a stamp
///   earlier than `last_time()` is treated as `last_time()`.
/// - Any clock reading is a valid stamp, `time_point::min()` and `max()` included (a clock read before it
///   was set, a sentinel passed by mistake): no call has undefined behaviour for it. Instants beyond what
///   64-bit nanoseconds hold (a coarser clock's extremes) read as the nearest one they hold, and the distance
///   between two readings saturates at that range (about 292 years), so a reading of max() is later than
///   any wait ends, and a wait counted from min() is "longer than nanoseconds count". The same holds for the
///   async layer's `try_acquire_at` and `record`, and for the clock a limiter reads itself.
/// - `refund(n, t)` gives back n (e.g. the unused part of an estimate), never beyond capacity.
/// - Optional: `charge(n, t)`, a forced take into debt (`chargeable_rate_limit`), and
///   `limit_remaining(remaining, reset_after, t)`, a correction from the upstream's count
///   (`remaining_limited_rate_limit`).
///
/// How a FIFO of waiters uses it: for the head, `try_take(n, now)`; if `denied`, arm the one timer for
/// `*ready_at(n, now)` and try again when it fires (after any `set_rate` or refund, ask again: the time moves
/// both ways). A waiter further back is granted no earlier than the FIFO allows; to predict when (e.g. to
/// fail a deadline at once), run the queue on a copy: `t = *copy.ready_at(n_i, t); copy.try_take(n_i, t);`
/// for each waiter in order. Nothing is taken until a waiter is granted, so a cancelled waiter costs nothing.
template <class L>
concept rate_limit = requires(L& limit, const L& view, std::int64_t n, typename L::time_point t) {
  typename L::clock;
  typename L::duration;
  { limit.try_take(n, t) } -> std::same_as<take_result>;
  { view.ready_at(n, t) } -> std::same_as<std::optional<typename L::time_point>>;
  { view.capacity() } -> std::same_as<std::int64_t>;
  { view.last_time() } -> std::same_as<typename L::time_point>;
  limit.refund(n, t);
};

/// A `rate_limit` that also takes a forced charge: `charge(n, t)` records n units at t even beyond what the
/// limit has room for, so that the limit is in debt and later requests wait until it is repaid (the cost of
/// a call found to be larger than its estimate, charged after the fact; never a silent overrun).
///
/// Rules of the member, for every model (`basic_token_bucket`, `basic_sliding_window`,
/// `basic_sliding_window_counter`, `basic_adaptive_rate`, and `all_of` when all its parts are):
/// - it never refuses and never waits; n may exceed `capacity()`; it throws std::invalid_argument only for
///   n < 0, and then changes nothing;
/// - afterwards `ready_at` and `try_take` stay exact: they see the debt, and availability still only grows
///   with time;
/// - the debt is bounded (each model says how) so that no arithmetic overflows.
///
/// It is optional: code generic over limits detects it with this concept (`if constexpr
/// (chargeable_rate_limit<L>)`), as the async layer and `all_of` do.
template <class L>
concept chargeable_rate_limit = rate_limit<L> && requires(L& limit, std::int64_t n, typename L::time_point t) {
  limit.charge(n, t);
};

/// A `rate_limit` that an upstream's own count can correct downwards: `limit_remaining(remaining,
/// reset_after, t)` makes the limit admit at most `remaining` units from t until `t + reset_after`, never
/// raising what it would admit, and returns whether it changed anything (see
/// `basic_token_bucket::limit_remaining`; `basic_sliding_window` has it for resets within its window).
/// Optional, detected like `chargeable_rate_limit`.
template <class L>
concept remaining_limited_rate_limit =
    rate_limit<L> && requires(L& limit, std::int64_t n, std::chrono::nanoseconds d, typename L::time_point t) {
      { limit.limit_remaining(n, d, t) } -> std::same_as<bool>;
    };

/// A reservation that still stands: `n` units taken by a `reserve` for the caller to use at `at`. The
/// async layer keeps the standing ones of a limit, sorted by `at`, and hands them to the limit's
/// `cancel_reservation` so that it can tell what a cancelled one may give back.
template <class TimePoint>
struct standing_reservation {
  std::int64_t n = 0;  ///< units reserved
  TimePoint at{};      ///< when they are the caller's (the reservation's time to act)
};

/// A `rate_limit` that reserves: units taken now for a caller who acts later (Go's `ReserveN`), and given
/// back by a rule of the limit's own when that caller cancels.
///
/// Rules of the members, for every model (`basic_token_bucket`, `basic_fixed_window`,
/// `basic_sliding_window`, and `all_of` when all its parts are):
/// - `reserve(n, t, not_before)` takes n units at t and returns the time from which they are the caller's,
///   never before `not_before` (`reserve(n, t)`: no such bound); units are counted now, so that later
///   requests and reservations are timed behind them. `std::nullopt` with nothing taken when n > capacity(),
///   or when the time or the debt lies beyond the limit's range. Throws std::invalid_argument for n < 0.
/// - `cancel_reservation(n, at, standing, t)` gives back, at t, what a reservation of n units acting at `at`
///   may return while the reservations `standing` (sorted by time, the cancelled one not among them) still
///   stand: the most that never lets anyone act in a standing reservation's units, nothing if `at` is before
///   t (the units are spent), and never more than n. It returns the units given back. Each model states its
///   rule.
/// - `refund(n, standing, t)` is `refund(n, t)` while the reservations `standing` (sorted by time) stand:
///   it gives back at most n, never any unit a standing reservation counts on, and returns the units given
///   back. The async layer refunds this way while reservations stand.
template <class L>
concept reservable_rate_limit =
    rate_limit<L> && requires(L& limit, std::int64_t n, typename L::time_point t,
                              std::span<const standing_reservation<typename L::time_point>> standing) {
      { limit.reserve(n, t) } -> std::same_as<std::optional<typename L::time_point>>;
      { limit.reserve(n, t, t) } -> std::same_as<std::optional<typename L::time_point>>;
      { limit.cancel_reservation(n, t, standing, t) } -> std::same_as<std::int64_t>;
      { limit.refund(n, standing, t) } -> std::same_as<std::int64_t>;
    };

namespace detail {

// Token counts scaled to sub-nanosecond units exceed 64 bits (1e15 tokens x 1e9 ns x a rate denominator);
// every intermediate product is bounded well below 2^126 by the limits the classes enforce.
__extension__ using int128 = __int128;
__extension__ using uint128 = unsigned __int128;

inline constexpr std::int64_t ns_per_second = 1'000'000'000;

// The limiters compute in whole nanoseconds; a finer clock tick could not be honoured exactly.
template <class Clock>
inline constexpr bool tick_at_least_a_nanosecond = std::ratio_greater_equal_v<typename Clock::period, std::nano>;

// Nanoseconds since the epoch, saturated: a clock coarser than a nanosecond holds instants (its min() and
// max()) that nanoseconds cannot.
template <class TimePoint>
std::int64_t to_ns(TimePoint t) noexcept {
  return rein::detail::to_ns_saturated(t);
}

/// The first time point at or after `ns` nanoseconds since the epoch, or nullopt past the clock's range.
template <class TimePoint>
std::optional<TimePoint> from_ns(int128 ns) noexcept {
  if (ns > std::numeric_limits<std::int64_t>::max()) return std::nullopt;
  const std::chrono::nanoseconds d(static_cast<std::int64_t>(ns));
  return TimePoint(std::chrono::ceil<typename TimePoint::duration>(d));
}

template <class Duration>
std::int64_t duration_ns(Duration d) noexcept {
  return std::chrono::ceil<std::chrono::nanoseconds>(d).count();
}

/// Division rounding towards minus infinity; `d > 0`.
constexpr int128 floor_div(int128 a, int128 d) noexcept {
  const int128 q = a / d;
  return (a % d != 0 && a < 0) ? q - 1 : q;
}

/// Division rounding towards plus infinity; `d > 0`.
constexpr int128 ceil_div(int128 a, int128 d) noexcept {
  const int128 q = a / d;
  return (a % d != 0 && a > 0) ? q + 1 : q;
}

using rein::detail::show;
using rein::detail::throw_invalid;

inline void check_request(std::string_view type, std::int64_t n) {
  if (n < 0) throw_invalid(type, "n must be >= 0", show(n));
}

}  // namespace detail
}  // namespace rein::algo
