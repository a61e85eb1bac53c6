// The fixed (calendar-aligned) window counter as a pure value type: at most `limit` units per window, the
// windows aligned to the clock's epoch plus an offset.
#pragma once

#include <rein/algo/rate_limit.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>

namespace rein::algo {

/// A fixed window: at most `limit` units in each window [epoch + offset + k * window, epoch + offset +
/// (k + 1) * window), k any integer, and the count starts again from zero at each window's start.
///
/// It is the rule of quotas published per calendar unit ("1,000 requests per clock minute", "10,000 per
/// UTC day") and of the rate limiter pattern in Redis's `INCR` documentation (one counter per client and
/// clock second, key `ip:timestamp`): the upstream resets its count at each window's start, so the local
/// limit should too, or it wastes quota (a sliding window of the same limit admits less just after a
/// reset). On `std::chrono::system_clock` (Unix time, which C++20 defines as UTC without leap seconds) a
/// window of one minute and offset 0 gives UTC minutes, one day gives UTC days; an offset of `5h` (or
/// `-19h`) with a day gives days starting at 05:00 UTC. On `std::chrono::steady_clock` the epoch is unspecified (often
/// boot), so the windows are aligned to nothing a provider publishes; use it for a local rule only.
///
/// @par The boundary burst
/// A fixed window admits up to `2 * limit` units within any interval shorter than a window: `limit` at the
/// end of one window and `limit` again at the start of the next. With 100 per minute, 100 calls at 12:00:59
/// and 100 at 12:01:00 are all admitted, 200 within one second. That is what the provider's own counter
/// allows too, so matching it wastes no quota; a rule that must never exceed `limit` in *any* window of
/// that length wants `basic_sliding_window` (each unit counts for a whole window after its own start, so
/// the room freed at 12:01:00 is only what left the window, not all of it), at the cost of O(limit) memory;
/// Cloudflare's post on sliding windows contrasts the two and describes the approximation between them
/// (`basic_sliding_window_counter`, which weighs the previous fixed window's count).
///
/// Units: time is `Clock::time_point`, computed internally in whole nanoseconds; `window` and `offset` are
/// durations; counts are units (one request may count as n).
///
/// @par Time
/// Time is clamped to be monotonic: a stamp earlier than `last_time()` is treated as `last_time()`. Any
/// reading is a valid stamp, `time_point::min()` and `max()` included (see rein::algo::rate_limit).
///
/// @par Thread Safety
/// A plain value: distinct objects are independent; one object must not be used concurrently.
///
/// @tparam Clock a Chrono clock whose tick is a nanosecond or coarser (default `std::chrono::steady_clock`).
template <class Clock = std::chrono::steady_clock>
class basic_fixed_window {
  static_assert(detail::tick_at_least_a_nanosecond<Clock>, "rein::algo: the clock's tick must be >= 1 ns");

 public:
  /// The clock that times the rule.
  using clock = Clock;
  /// A point in time of `clock`.
  using time_point = typename Clock::time_point;
  /// A duration of `clock`.
  using duration = typename Clock::duration;

  /// Construction options; write `{.limit = 1000, .window = std::chrono::minutes(1)}`.
  struct options {
    std::int64_t limit = 0;  ///< most units per window, in [1, max_limit]
    duration window{};       ///< the window's length, > 0
    /// Where windows start: at the clock's epoch plus `offset` plus a whole number of windows. Any value;
    /// only its remainder modulo `window` matters. Default: 0 (aligned to the epoch).
    duration offset{};
  };

  /// The largest limit, 2^62 units per window.
  static constexpr std::int64_t max_limit = std::int64_t(1) << 62;

  /// Makes a window with nothing counted yet at time `now`.
  /// @throws std::invalid_argument if the limit is not in [1, max_limit] or the window is not > 0.
  basic_fixed_window(const options& o, time_point now)
      : limit_(checked_limit(o.limit)),
        window_ns_(checked_window(o.window)),
        offset_ns_(detail::duration_ns(o.offset)),
        last_ns_(detail::to_ns(now)),
        index_(index_of(last_ns_)) {}

  /// Counts n units at time t if the window containing t has room for all n.
  ///
  /// @returns `allowed` (counted), `denied` (fewer than n free in this window), or `exceeds_capacity`
  /// (n > limit). Only `allowed` changes the state; n = 0 is always `allowed` and changes nothing.
  /// @throws std::invalid_argument if n < 0.
  take_result try_take(std::int64_t n, time_point t) {
    detail::check_request(type_name, n);
    if (n > limit_) return take_result::exceeds_capacity;
    if (n == 0) return take_result::allowed;  // even in debt
    const std::int64_t now = clamp(t);
    const std::int64_t used = count_ns(now);
    if (used > limit_ - n) return take_result::denied;
    roll(now);
    count_ = used + n;
    return take_result::allowed;
  }

  /// Counts one unit at time t if there is room; see `try_take(n, t)`.
  take_result try_take(time_point t) { return try_take(1, t); }

  /// The earliest time, not before `max(t, last_time())`, at which n more units fit, assuming nothing else
  /// is taken in between: now if this window has room, else the start of the first window that has (the
  /// next one, or a later one while a `charge` is being repaid). Reads only.
  /// @returns that time, or `std::nullopt` (never) if n > limit or the time lies beyond the clock's range.
  /// @throws std::invalid_argument if n < 0.
  std::optional<time_point> ready_at(std::int64_t n, time_point t) const {
    detail::check_request(type_name, n);
    if (n > limit_) return std::nullopt;
    return detail::from_ns<time_point>(ready_ns(n, clamp(t)));
  }

  /// The earliest time, not before `max(t, last_time())`, at which the last of `total` single units, queued
  /// one after the other and each taken the instant it fits, is taken: each window from this one on admits
  /// what it has room for. A lower bound for any FIFO backlog of `total` units (splitting requests into
  /// single units only makes them earlier), exact when every request is for one unit. Reads only.
  /// @returns that time, or `std::nullopt` if it lies beyond the clock's range.
  std::optional<time_point> backlog_ready_at(std::uint64_t total, time_point t) const {
    const std::int64_t now = clamp(t);
    if (total == 0) return detail::from_ns<time_point>(now);
    // The backlog's last unit is the `count + total`-th of this window's count: window k (0 = this one)
    // holds units k * limit + 1 .. (k + 1) * limit.
    const detail::int128 last = detail::int128(count_ns(now)) + detail::int128(total);
    const detail::int128 k = detail::ceil_div(last, limit_) - 1;
    if (k <= 0) return detail::from_ns<time_point>(now);
    return detail::from_ns<time_point>(start_ns(index_of(now) + k));
  }

  /// The units counted in the window containing t (with what a `charge` carried over from earlier windows
  /// and not yet repaid; above `limit()` while in debt). Reads only.
  std::int64_t count(time_point t) const { return count_ns(clamp(t)); }

  /// The start of the window containing t (t clamped as everywhere), or `std::nullopt` before the clock's
  /// range. Reads only.
  std::optional<time_point> window_start(time_point t) const { return start_of(start_ns(index_of(clamp(t)))); }

  /// The end of the window containing t, which is the next window's start: when the count resets.
  /// @returns that time, or `std::nullopt` if it lies beyond the clock's range. Reads only.
  std::optional<time_point> window_end(time_point t) const { return detail::from_ns<time_point>(start_ns(index_of(clamp(t)) + 1)); }

  /// Gives back n units at t (e.g. the unused part of an estimate, or a request admitted but never sent):
  /// the count of the window containing t goes down by n, never below zero, so that window never admits
  /// more than `limit` in all. Refund in the window the units were taken in: a later refund gives back room
  /// in the current window for units that an earlier window counted (or repays a `charge`'s debt first).
  /// @throws std::invalid_argument if n < 0.
  void refund(std::int64_t n, time_point t) {
    detail::check_request(type_name, n);
    give_back(n, false, {}, clamp(t));
  }

  /// Counts n units at t even beyond the limit (a cost found after the fact; see `chargeable_rate_limit`).
  /// What the window cannot hold is debt carried into the next windows: each window start repays `limit`
  /// units of it, so later requests wait for the first window whose share is free, exactly as if the units
  /// had been admitted one window after the other. n may exceed the limit; the count saturates at 2^62.
  /// @throws std::invalid_argument if n < 0.
  void charge(std::int64_t n, time_point t) {
    detail::check_request(type_name, n);
    const std::int64_t now = clamp(t);
    const std::int64_t used = count_ns(now);
    roll(now);
    count_ = saturated(detail::int128(used) + n);
  }

  /// Counts n units at t for a caller who acts later (Go's `ReserveN` on a window): they go to the first
  /// window from t on that has room for all n (this one if it has, else a window start while earlier
  /// counts and reservations fill the windows before), and count there at once, so that later requests
  /// and reservations are timed behind them. The room a full window's end leaves unused before that start
  /// stays counted, as a FIFO waiter for n would leave it.
  /// @returns the time from which the n are the caller's (t itself when this window has room); or
  /// `std::nullopt`, with nothing counted, if n > limit, if that time lies beyond the clock's range, or if
  /// the count would pass 2^62.
  /// @throws std::invalid_argument if n < 0.
  std::optional<time_point> reserve(std::int64_t n, time_point t) { return reserve(n, t, time_point::min()); }

  /// As `reserve(n, t)`, for a caller who will not act before `not_before`: the units count in the window
  /// that holds the time returned, the later of the two.
  std::optional<time_point> reserve(std::int64_t n, time_point t, time_point not_before) {
    detail::check_request(type_name, n);
    if (n > limit_) return std::nullopt;
    const std::int64_t now = clamp(t);
    const detail::int128 at = std::max<detail::int128>(ready_ns(n, now), detail::to_ns(not_before));
    const std::optional<time_point> when = detail::from_ns<time_point>(at);
    if (!when) return std::nullopt;
    // Window k (0 = this one) holds the units; the windows before it count full.
    const detail::int128 k = index_of(detail::to_ns(*when)) - index_of(now);
    const detail::int128 count = std::max<detail::int128>(count_ns(now), k * limit_) + n;
    if (count > max_limit) return std::nullopt;
    roll(now);
    count_ = static_cast<std::int64_t>(count);
    reserved_ns_ = std::max(reserved_ns_, detail::to_ns(*when));
    return when;
  }

  /// Gives back at t what a cancelled reservation of n units acting at `at` may return while the
  /// reservations `standing` (sorted by time, without this one) still stand; see `reservable_rate_limit`.
  ///
  /// The rule. The count of window j (0 = the one holding t) is N(j) = max(0, C - j x limit), C the count
  /// now: what `charge` and `reserve` carried past a window start is repaid `limit` per start. A standing
  /// reservation's units are in N(j) of its own window j; a refund x lowers every N(j) by x (down to 0).
  /// So x is the largest in [0, n] with N(j) - x >= P(j) for every window j holding standing reservations
  /// of P(j) units in all; and, when this reservation's window is a later one, with N(0) - x >= limit (the
  /// current window stays full: what it holds besides reservations is not known, and this reservation's
  /// units were never in it). Then no window ever admits anyone in a standing reservation's units. Nothing
  /// comes back once `at` is before t. The room a reservation left unused before its window (see
  /// `reserve`) stays counted. As with the token bucket, units kept back for a later reservation stay
  /// counted even if that one is cancelled afterwards (with limit 3, reservations of 3 in windows 0, 1 and
  /// 2 cancelled earliest first give back 0, 0 and 3, and window 1 stays full): cancel the latest first
  /// to get everything back.
  /// @returns the units given back.
  /// @throws std::invalid_argument if n < 0.
  std::int64_t cancel_reservation(std::int64_t n, time_point at, std::span<const standing_reservation<time_point>> standing,
                                  time_point t) {
    detail::check_request(type_name, n);
    const std::int64_t now = clamp(t);
    if (detail::to_ns(at) < now) return 0;
    return give_back(n, index_of(detail::to_ns(at)) > index_of(now), standing, now);
  }

  /// As `refund(n, t)` while the reservations `standing` (sorted by time) stand: gives back only what
  /// leaves every standing reservation's window its units, by the rule of `cancel_reservation` for units
  /// of the current window. A plain refund could lower a later window's count below what a reservation in
  /// it holds, and a newcomer would act in its units. The async layer refunds this way.
  /// @returns the units given back.
  /// @throws std::invalid_argument if n < 0.
  std::int64_t refund(std::int64_t n, std::span<const standing_reservation<time_point>> standing, time_point t) {
    detail::check_request(type_name, n);
    return give_back(n, false, standing, clamp(t));
  }

  /// Lowers what the window admits so that from t until just before `t + reset_after` (the instant the
  /// upstream's count starts again) at most `remaining` more units fit: an upstream's count (`x-ratelimit-remaining-*` with `x-ratelimit-reset-*`, or `RateLimit-Remaining`
  /// and `-Reset` of the IETF draft) correcting the local one. If the reset falls in this window (the usual
  /// case when both count the same calendar window) this window's count is raised to `limit - remaining`;
  /// if it lies b window starts ahead, the count is raised to `(b + 1) * limit - remaining`, a debt that the
  /// b window starts repay (so the windows up to the reset admit `remaining` in all). It never admits more
  /// than before; reset_after = 0 (the upstream's count resets now) changes nothing.
  /// @returns true if the count was raised.
  /// @throws std::invalid_argument if remaining < 0 or reset_after < 0.
  bool limit_remaining(std::int64_t remaining, std::chrono::nanoseconds reset_after, time_point t) {
    if (remaining < 0) detail::throw_invalid(type_name, "remaining must be >= 0", detail::show(remaining));
    if (reset_after.count() < 0) {
      detail::throw_invalid(type_name, "reset_after must be >= 0", detail::show(reset_after.count()) + " ns");
    }
    const std::int64_t now = clamp(t);
    const std::int64_t used = count_ns(now);
    if (reset_after.count() == 0) return false;
    // The windows that [now, now + reset_after) touches; the reset instant belongs to the next count.
    const detail::int128 end = detail::int128(now) + reset_after.count();
    const detail::int128 starts = index_of(end - 1) - index_of(now);
    const std::int64_t wanted = saturated((starts + 1) * limit_ - remaining);
    if (wanted <= used) return false;
    roll(now);
    count_ = wanted;
    return true;
  }

  /// Changes the limit from time t on; the units counted in this window stay counted. Units that `reserve`
  /// counted in a later window stay there: the count of the latest window a reservation was made for (if
  /// the count still reaches it) stays as it was, and the windows before it stay full at the new limit, so
  /// a raised limit never lets anyone act in a reservation's units (with limit 4, a reservation of 4 in the
  /// next window keeps that window's 4 of a new limit of 8, not 4 - 4 = 0). What a `charge` or
  /// `limit_remaining` carried beyond is repaid at the new limit from the next window start on.
  /// @throws std::invalid_argument as the constructor, and leaves the window unchanged.
  void set_limit(std::int64_t limit, time_point t) {
    checked_limit(limit);
    const std::int64_t now = clamp(t);
    const std::int64_t used = count_ns(now);
    // The count reaches window k (0 = this one) holding a reservation: its count used - k x limit_ stays.
    const detail::int128 k = std::clamp<detail::int128>(detail::ceil_div(used, limit_) - 1, 0,
                                                        std::max<detail::int128>(0, index_of(reserved_ns_) - index_of(now)));
    roll(now);
    count_ = saturated(used + k * (detail::int128(limit) - limit_));
    limit_ = limit;
  }

  /// Changes the window's length from time t on (the offset stays): the units counted so far count in the
  /// new window containing t.
  /// @throws std::invalid_argument as the constructor, and leaves the window unchanged.
  void set_window(duration window, time_point t) {
    const std::int64_t ns = checked_window(window);
    const std::int64_t now = clamp(t);
    const std::int64_t used = count_ns(now);
    window_ns_ = ns;
    last_ns_ = now;
    index_ = index_of(now);
    count_ = used;
  }

  /// The most units per window: the largest n a single request may ask for.
  std::int64_t limit() const noexcept { return limit_; }
  /// The same as `limit()`, under the name the `rate_limit` concept uses.
  std::int64_t capacity() const noexcept { return limit(); }
  /// The window's length.
  duration window() const noexcept { return std::chrono::duration_cast<duration>(std::chrono::nanoseconds(window_ns_)); }
  /// The offset of the windows' starts from the clock's epoch, reduced to [0, window).
  duration offset() const noexcept {
    const auto r = static_cast<std::int64_t>(offset_ns_ - detail::floor_div(offset_ns_, window_ns_) * window_ns_);
    return std::chrono::duration_cast<duration>(std::chrono::nanoseconds(r));
  }
  /// The latest time at which the state changed; earlier stamps are treated as this one.
  time_point last_time() const noexcept { return time_point(std::chrono::ceil<duration>(std::chrono::nanoseconds(last_ns_))); }

  /// The async layer's grant prediction (found by argument-dependent lookup from rein::basic_rate_limiter):
  /// the backlog's exact time, so that a deadline that single-unit waiters ahead make impossible fails at
  /// once.
  friend std::optional<time_point> earliest_grant(const basic_fixed_window& w, std::uint64_t ahead, std::uint64_t n,
                                                  time_point now) {
    constexpr std::uint64_t most = std::numeric_limits<std::uint64_t>::max();
    const std::uint64_t total = ahead > most - n ? most : ahead + n;
    if (n > static_cast<std::uint64_t>(w.limit_)) return std::nullopt;
    return w.backlog_ready_at(total, now);
  }

 private:
  static constexpr const char* type_name = "rein::algo::fixed_window";

  static std::int64_t checked_limit(std::int64_t limit) {
    if (limit < 1 || limit > max_limit) detail::throw_invalid(type_name, "limit must be in [1, 2^62]", detail::show(limit));
    return limit;
  }

  static std::int64_t checked_window(duration window) {
    const std::int64_t ns = detail::duration_ns(window);
    if (ns <= 0) detail::throw_invalid(type_name, "window must be > 0", detail::show(ns) + " ns");
    return ns;
  }

  static std::int64_t saturated(detail::int128 v) noexcept {
    return v > max_limit ? max_limit : static_cast<std::int64_t>(v);
  }

  std::int64_t clamp(time_point t) const noexcept {
    const std::int64_t ns = detail::to_ns(t);
    return ns < last_ns_ ? last_ns_ : ns;
  }

  // The number of the window holding `ns`: window k is [offset + k * window, offset + (k + 1) * window).
  detail::int128 index_of(detail::int128 ns) const noexcept { return detail::floor_div(ns - offset_ns_, window_ns_); }
  detail::int128 start_ns(detail::int128 index) const noexcept { return index * window_ns_ + offset_ns_; }

  static std::optional<time_point> start_of(detail::int128 ns) noexcept {
    if (ns < std::numeric_limits<std::int64_t>::min()) return std::nullopt;
    return detail::from_ns<time_point>(ns);
  }

  // The count of the window holding `now` (>= last_ns_): each window start since the counted one repays
  // `limit` of the count, which is only ever above `limit` after a charge.
  std::int64_t count_ns(std::int64_t now) const noexcept {
    const detail::int128 passed = index_of(now) - index_;
    if (passed == 0) return count_;
    const detail::int128 left = detail::int128(count_) - passed * limit_;
    return left > 0 ? static_cast<std::int64_t>(left) : 0;
  }

  // The first instant at or after `now` at which the count leaves room for n <= limit.
  detail::int128 ready_ns(std::int64_t n, std::int64_t now) const noexcept {
    const std::int64_t used = count_ns(now);
    if (n == 0 || used <= limit_ - n) return now;
    // k window starts from now on leave max(0, used - k * limit) counted: the first k with room for n.
    const detail::int128 k = detail::ceil_div(detail::int128(used) - (limit_ - n), limit_);
    return start_ns(index_of(now) + k);
  }

  // What cancel_reservation and refund give back at `now`: at most n, leaving every standing reservation's
  // window its units, and the current window full when `later` (the units were counted in a later window).
  std::int64_t give_back(std::int64_t n, bool later, std::span<const standing_reservation<time_point>> standing,
                         std::int64_t now) {
    const detail::int128 here = index_of(now);
    const detail::int128 count = count_ns(now);
    auto counted = [&](detail::int128 window) { return std::max<detail::int128>(0, count - (window - here) * limit_); };
    detail::int128 back = std::min<detail::int128>(n, count);
    if (later) back = std::min(back, count - limit_);
    // P(j), summed over the standing reservations of one window at a time (they are sorted by time).
    for (std::size_t i = 0; i < standing.size();) {
      const detail::int128 window = index_of(detail::to_ns(standing[i].at));
      detail::int128 units = 0;
      for (; i < standing.size() && index_of(detail::to_ns(standing[i].at)) == window; ++i) {
        if (detail::to_ns(standing[i].at) >= now) units += standing[i].n;
      }
      if (window >= here) back = std::min(back, counted(window) - units);
    }
    const auto given = static_cast<std::int64_t>(std::max<detail::int128>(0, back));
    roll(now);
    count_ = static_cast<std::int64_t>(count - given);
    return given;
  }

  void roll(std::int64_t now) noexcept {
    last_ns_ = now;
    index_ = index_of(now);
  }

  std::int64_t limit_;
  std::int64_t window_ns_;
  std::int64_t offset_ns_;
  std::int64_t last_ns_;
  detail::int128 index_;    // the window whose count count_ is
  std::int64_t count_ = 0;  // units counted in window index_, above limit_ while a charge is repaid
  // The latest reservation's time to act: set_limit keeps the count of its window.
  std::int64_t reserved_ns_ = std::numeric_limits<std::int64_t>::min();
};

/// The fixed window on `std::chrono::steady_clock` (windows aligned to its epoch).
using fixed_window = basic_fixed_window<>;

/// The fixed window on `std::chrono::system_clock`: windows aligned to UTC (minutes, hours, days).
using utc_fixed_window = basic_fixed_window<std::chrono::system_clock>;

}  // namespace rein::algo
