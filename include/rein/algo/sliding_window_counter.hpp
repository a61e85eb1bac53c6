// The sliding window counter as a pure value type: O(1) memory, an approximation of the sliding window.
#pragma once

#include <rein/algo/rate_limit.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>

namespace rein::algo {

/// An approximate sliding window in O(1) memory: the count of the previous fixed window, weighted by how
/// much of it the sliding window still overlaps, plus the count of the current fixed window, must stay
/// within `limit` (Cloudflare, "How we built rate limiting capable of scaling to millions of domains").
///
/// Fixed windows are [origin + k W, origin + (k + 1) W), with the origin at construction. A request for n
/// at time t, elapsed e into the current window, is admitted when
/// `previous * (W - e) / W + current + n <= limit`, computed exactly in integers.
///
/// @par Overshoot bound
/// The estimate assumes the previous window's starts were spread evenly. When they were not, the exact
/// count can differ both ways:
/// - At most `limit` starts in any one fixed window, and at most `2 * limit - 1` in any window of length W.
///   (A sliding window overlaps two fixed windows; admitting the last of the current window's starts at
///   fraction f required current <= limit - previous * (1 - f), so the total is at most
///   limit + previous * f < 2 * limit.) The bound is reached when the previous window's starts all came at
///   its very end: then nearly another `limit` fit before they leave the sliding window.
/// - It may also deny a start that the exact window would admit: when the previous window's starts came
///   early and have already left, they still weigh `previous * (W - e) / W` (less than `limit`).
/// With evenly spread traffic, the error is small (Cloudflare measured 0.003% of requests wrongly allowed).
/// When no window may ever hold more than `limit`, use the exact `basic_sliding_window`.
///
/// Units: time is `Clock::time_point`, computed internally in whole nanoseconds; `window` is a duration;
/// counts are starts (one request may count as n).
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
class basic_sliding_window_counter {
  static_assert(detail::tick_at_least_a_nanosecond<Clock>, "rein::algo: the clock's tick must be >= 1 ns");

 public:
  /// The clock that times the rule.
  using clock = Clock;
  /// A point in time of `clock`.
  using time_point = typename Clock::time_point;
  /// A duration of `clock`.
  using duration = typename Clock::duration;

  /// Construction options; write `{.limit = 5'000'000, .window = std::chrono::minutes(1)}`.
  struct options {
    std::int64_t limit = 0;  ///< most starts per window (see the overshoot bound), in [1, max_limit]
    duration window{};       ///< the window's length, > 0
  };

  static constexpr std::int64_t max_limit = 1'000'000'000'000'000;  ///< 1e15 starts

  /// Makes an empty counter whose first fixed window starts at `now`.
  /// @throws std::invalid_argument if the limit is not in [1, 1e15] or the window is not > 0.
  basic_sliding_window_counter(const options& o, time_point now)
      : limit_(checked_limit(o.limit)), window_ns_(checked_window(o.window)), last_ns_(detail::to_ns(now)) {
    state_.start = last_ns_;
  }

  /// Counts n starts at time t if the estimate leaves room for them.
  ///
  /// @returns `allowed` (counted), `denied` (the estimate has no room for n now), or `exceeds_capacity`
  /// (n > limit). Only `allowed` changes the state; n = 0 is always `allowed` and changes nothing.
  /// @throws std::invalid_argument if n < 0.
  take_result try_take(std::int64_t n, time_point t) {
    detail::check_request(type_name, n);
    if (n > limit_) return take_result::exceeds_capacity;
    if (n == 0) return take_result::allowed;
    const std::int64_t now = clamp(t);
    state s = at(now);
    if (!fits(s, n, now)) return take_result::denied;
    s.current += n;
    commit(s, now);
    return take_result::allowed;
  }

  /// Counts one start at time t if there is room; see `try_take(n, t)`.
  take_result try_take(time_point t) { return try_take(1, t); }

  /// The earliest time, not before `max(t, last_time())`, at which the estimate leaves room for n,
  /// assuming no other start in between. Reads only.
  /// @returns that time, or `std::nullopt` (never) if n > limit or the time lies beyond the clock's range.
  /// @throws std::invalid_argument if n < 0.
  std::optional<time_point> ready_at(std::int64_t n, time_point t) const {
    detail::check_request(type_name, n);
    if (n > limit_) return std::nullopt;
    const std::int64_t now = clamp(t);
    const state s = at(now);
    if (n == 0 || fits(s, n, now)) return detail::from_ns<time_point>(now);
    // The estimate falls linearly within a window; room >= 0 means it falls far enough in this one.
    const std::int64_t room = limit_ - n - s.current;
    if (room >= 0) return detail::from_ns<time_point>(s.start + elapsed_for(s.previous, room));
    // Otherwise in the next one, where the current count becomes the previous one.
    return detail::from_ns<time_point>(detail::int128(s.start) + window_ns_ + elapsed_for(s.current, limit_ - n));
  }

  /// The estimated number of starts in the window ending at t: previous * (W - e) / W + current. Reads
  /// only; a double for display, decisions are exact.
  double estimate(time_point t) const {
    const std::int64_t now = clamp(t);
    const state s = at(now);
    const double remaining = static_cast<double>(window_ns_ - (now - s.start)) / static_cast<double>(window_ns_);
    return static_cast<double>(s.previous) * remaining + static_cast<double>(s.current);
  }

  /// Uncounts n starts of the current fixed window at t (e.g. a request admitted but never sent); at most
  /// the starts counted there.
  /// @throws std::invalid_argument if n < 0.
  void refund(std::int64_t n, time_point t) {
    detail::check_request(type_name, n);
    const std::int64_t now = clamp(t);
    state s = at(now);
    s.current -= std::min(s.current, n);
    commit(s, now);
  }

  /// Counts n starts in the current fixed window at t even beyond the limit (a cost found after the fact;
  /// see `chargeable_rate_limit`): the estimate stays above the limit, and later requests are denied,
  /// until the weight of those starts has slid out. n may exceed the limit; the count saturates at
  /// 4 * max_limit, so nothing overflows.
  /// @throws std::invalid_argument if n < 0.
  void charge(std::int64_t n, time_point t) {
    detail::check_request(type_name, n);
    const std::int64_t now = clamp(t);
    state s = at(now);
    s.current = n >= max_count - s.current ? max_count : s.current + n;
    commit(s, now);
  }

  /// Changes the limit from time t on; the counts so far are kept.
  /// @throws std::invalid_argument as the constructor, and leaves the counter unchanged.
  void set_limit(std::int64_t limit, time_point t) {
    limit_ = checked_limit(limit);
    const std::int64_t now = clamp(t);
    commit(at(now), now);
  }

  /// The most starts per window: the largest n a single request may ask for.
  std::int64_t limit() const noexcept { return limit_; }
  /// The same as `limit()`, under the name the `rate_limit` concept uses.
  std::int64_t capacity() const noexcept { return limit_; }
  /// The window's length.
  duration window() const noexcept { return std::chrono::duration_cast<duration>(std::chrono::nanoseconds(window_ns_)); }
  /// The latest time at which the state changed; earlier stamps are treated as this one.
  time_point last_time() const noexcept { return time_point(std::chrono::ceil<duration>(std::chrono::nanoseconds(last_ns_))); }

 private:
  static constexpr const char* type_name = "rein::algo::sliding_window_counter";
  // The most a fixed window's count holds (charges saturate there); products with the window stay < 2^127.
  static constexpr std::int64_t max_count = 4 * max_limit;

  struct state {
    std::int64_t start = 0;     // ns at which the current fixed window began
    std::int64_t previous = 0;  // starts counted in the fixed window before it
    std::int64_t current = 0;   // starts counted in the current one
  };

  static std::int64_t checked_limit(std::int64_t limit) {
    if (limit < 1 || limit > max_limit) detail::throw_invalid(type_name, "limit must be in [1, 1e15]", detail::show(limit));
    return limit;
  }

  static std::int64_t checked_window(duration window) {
    const std::int64_t ns = detail::duration_ns(window);
    if (ns <= 0) detail::throw_invalid(type_name, "window must be > 0", detail::show(ns) + " ns");
    return ns;
  }

  std::int64_t clamp(time_point t) const noexcept {
    const std::int64_t ns = detail::to_ns(t);
    return ns < last_ns_ ? last_ns_ : ns;
  }

  // The state rolled forward to the fixed window holding `now` (>= last_ns_).
  state at(std::int64_t now) const noexcept {
    const detail::int128 windows = (detail::int128(now) - state_.start) / window_ns_;
    if (windows == 0) return state_;
    const auto start = static_cast<std::int64_t>(state_.start + windows * window_ns_);
    return {start, windows == 1 ? state_.current : 0, 0};
  }

  // previous * (W - e) + (current + n) * W <= limit * W, all below 2^114.
  bool fits(const state& s, std::int64_t n, std::int64_t now) const noexcept {
    using detail::int128;
    const int128 elapsed = int128(now) - s.start;
    return int128(s.previous) * (window_ns_ - elapsed) + int128(s.current + n) * window_ns_ <= int128(limit_) * window_ns_;
  }

  // The least elapsed e in [0, W] with weight * (W - e) <= room * W (room >= 0).
  detail::int128 elapsed_for(std::int64_t weight, std::int64_t room) const noexcept {
    if (weight == 0) return 0;
    const detail::int128 allowed_rest = detail::int128(room) * window_ns_ / weight;
    return allowed_rest >= window_ns_ ? 0 : window_ns_ - allowed_rest;
  }

  void commit(const state& s, std::int64_t now) noexcept {
    state_ = s;
    last_ns_ = now;
  }

  std::int64_t limit_;
  std::int64_t window_ns_;
  std::int64_t last_ns_;
  state state_;
};

/// The sliding window counter on `std::chrono::steady_clock`.
using sliding_window_counter = basic_sliding_window_counter<>;

}  // namespace rein::algo
