// The exact sliding window log as a pure value type: at most `limit` starts in any window of length W.
#pragma once

#include <rein/algo/rate_limit.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace rein::algo {

/// An exact sliding window: at most `limit` starts in any window of length `window`.
///
/// A start at time s counts at every time in [s, s + window): the window at time t is (t - window, t].
/// So with 2 per 10 s, starts at 0.00 and 0.01 make the next one wait until 10.00, the one after until
/// 10.01. Unlike a token bucket with the same average rate, it never lets `limit + 1` starts into any
/// window, and it never refills early: it is what a published quota of "N per window, measured on a
/// sliding window" needs (a log of timestamps, as a deque would hold them); Cloudflare's post on sliding
/// windows contrasts it with the counter approximation (`basic_sliding_window_counter`).
///
/// Memory is O(limit): the time of each of the last `limit` starts (8 bytes each), in a ring that grows
/// with use up to `limit` entries. A request for n starts records n entries. For limits in the millions,
/// use `basic_sliding_window_counter`.
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
class basic_sliding_window {
  static_assert(detail::tick_at_least_a_nanosecond<Clock>, "rein::algo: the clock's tick must be >= 1 ns");

 public:
  /// The clock that times the rule.
  using clock = Clock;
  /// A point in time of `clock`.
  using time_point = typename Clock::time_point;
  /// A duration of `clock`.
  using duration = typename Clock::duration;

  /// Construction options; write `{.limit = 100, .window = std::chrono::seconds(1)}`.
  struct options {
    std::int64_t limit = 0;  ///< most starts in any window, in [1, max_limit]
    duration window{};       ///< the window's length, > 0
  };

  /// The largest limit: 2^27 starts, a 1 GiB log. Larger limits want `basic_sliding_window_counter`.
  static constexpr std::int64_t max_limit = std::int64_t(1) << 27;

  /// Makes an empty window (no starts yet) at time `now`.
  /// @throws std::invalid_argument if the limit is not in [1, max_limit] or the window is not > 0.
  basic_sliding_window(const options& o, time_point now)
      : limit_(checked_limit(o.limit)),
        window_ns_(checked_window(o.window)),
        last_ns_(detail::to_ns(now)) {}

  /// Records n starts at time t if the window has room for all n.
  ///
  /// @returns `allowed` (recorded), `denied` (fewer than n free now), or `exceeds_capacity` (n > limit).
  /// Only `allowed` changes the state; n = 0 is always `allowed` and changes nothing.
  /// @throws std::invalid_argument if n < 0.
  take_result try_take(std::int64_t n, time_point t) {
    detail::check_request(type_name, n);
    if (n > limit()) return take_result::exceeds_capacity;
    const std::int64_t now = clamp(t);
    if (ready_ns(n, now) != now) return take_result::denied;
    make_room(n);
    for (std::int64_t i = 0; i < n; ++i) push(now);
    last_ns_ = now;
    return take_result::allowed;
  }

  /// Records one start at time t if there is room; see `try_take(n, t)`.
  take_result try_take(time_point t) { return try_take(1, t); }

  /// The earliest time, not before `max(t, last_time())`, at which n more starts fit, assuming no other
  /// start in between: when the start that leaves room for n has left the window. Reads only.
  /// @returns that time, or `std::nullopt` (never) if n > limit or the time lies beyond the clock's range.
  /// @throws std::invalid_argument if n < 0.
  std::optional<time_point> ready_at(std::int64_t n, time_point t) const {
    detail::check_request(type_name, n);
    if (n > limit()) return std::nullopt;
    return detail::from_ns<time_point>(ready_ns(n, clamp(t)));
  }

  /// The number of starts in the window (t - window, t]. Reads only.
  /// Reservations' starts, recorded at their later times to act, count from those times on.
  std::int64_t count(time_point t) const {
    const std::int64_t now = clamp(t);
    return static_cast<std::int64_t>(first_after(now) - first_in_window(now));
  }

  /// Forgets n starts at t, as if they had not happened (e.g. a request that was admitted but never sent):
  /// the n oldest starts still in the window (t - window, t], or all of them if fewer are.
  ///
  /// The caller does not say which start it gives back, so the oldest is the safe one to forget: every later
  /// window that holds it also holds the starts after it, so forgetting it never lets more than `limit` real
  /// starts into any window, whichever start was refunded. (Forgetting the newest would: with 2 per 1 s,
  /// starts at 0.0 and 0.5 and the one of 0.0 refunded at 0.6, two more at 1.0 would join the one of 0.5.)
  /// Starts already out of the window are kept: they hold no capacity now, and a longer window set later
  /// judges them again. Refund while the start is still in the window; a later refund gives back the
  /// capacity of a start that still counts. Time: O(limit) (the log is compacted), where a take is O(1).
  /// @throws std::invalid_argument if n < 0.
  void refund(std::int64_t n, time_point t) {
    detail::check_request(type_name, n);
    const std::int64_t now = clamp(t);
    // Dropped starts are the oldest: they are forgotten first, and give back nothing the log holds.
    if (!dropped_ns_in_window(now)) dropped_ = 0;
    const std::int64_t cancelled = std::min(dropped_, n);
    dropped_ -= cancelled;
    n -= cancelled;
    const std::size_t first = first_in_window(now);
    const std::size_t forgotten = std::min(first_after(now) - first, static_cast<std::size_t>(n));
    last_ns_ = now;
    forget(first, forgotten);
  }

  /// As `refund(n, t)`: the oldest starts in the window are forgotten, which never frees room that a
  /// standing reservation counts on (its starts are logged at its time to act, the newest), so `standing`
  /// is not needed. The async layer refunds this way for every limit that reserves.
  /// @returns the starts given back, those in the log and those only counted as `dropped`.
  /// @throws std::invalid_argument if n < 0.
  std::int64_t refund(std::int64_t n, std::span<const standing_reservation<time_point>>, time_point t) {
    const std::int64_t before = count(t) + dropped(t);
    refund(n, t);
    return before - count(t) - dropped(t);
  }

  /// Records n starts at t for a caller who acts later (Go's `ReserveN` on a window): at the first time
  /// from t on at which they fit, and no earlier than the latest start recorded (a reservation's), so that
  /// later requests and reservations are timed behind them. The starts are recorded at that time, the time
  /// to act, and count from then on.
  /// @returns that time (rounded up to the clock's tick); or `std::nullopt`, with nothing recorded, if
  /// n > limit or the time lies beyond the clock's range.
  /// @throws std::invalid_argument if n < 0; std::bad_alloc (nothing recorded) if the log cannot grow.
  std::optional<time_point> reserve(std::int64_t n, time_point t) { return reserve(n, t, time_point::min()); }

  /// As `reserve(n, t)`, for a caller who will not act before `not_before`: the starts are recorded at the
  /// time returned, the later of the two.
  std::optional<time_point> reserve(std::int64_t n, time_point t, time_point not_before) {
    detail::check_request(type_name, n);
    if (n > limit()) return std::nullopt;
    const std::int64_t now = clamp(t);
    const std::optional<time_point> at =
        detail::from_ns<time_point>(std::max<detail::int128>(ready_ns(n, now), detail::to_ns(not_before)));
    if (!at) return std::nullopt;
    // Recorded at the tick the caller acts at, so that cancel_reservation finds them by that time.
    record(n, detail::to_ns(*at), now);
    last_ns_ = now;
    return at;
  }

  /// Gives back at t what a cancelled reservation of n starts acting at `at` may return; see
  /// `reservable_rate_limit`. `standing` is not needed here.
  ///
  /// The rule. The reservation's starts are in the log at `at`, its time to act, and every admission is
  /// decided by counting the log, standing reservations' starts included. Removing starts from the log
  /// only lowers counts: no window then holds more than `limit` starts of those that still stand, so a
  /// cancel at or before `at` gives back the n starts recorded at `at` that the log still holds (equal
  /// stamps are interchangeable): all n, unless a later reservation, a `charge` or a smaller `set_limit`
  /// has since pushed some out of the log (it keeps the newest `limit`), which then come back as nothing.
  /// Nothing comes back once `at` is before t. A reservation in a full log pushes out its oldest starts,
  /// which may still be in the window (they count as `dropped`): the slots a cancel frees take those back
  /// first, stamped at the newest pushed-out start's time (as in `set_limit`), so that the log never
  /// forgets a start that counts, at the price of counting such a start later than it was. So cancel the
  /// latest reservation first: each then finds its starts in the log and gives all n back.
  /// @returns the starts given back.
  /// @throws std::invalid_argument if n < 0.
  std::int64_t cancel_reservation(std::int64_t n, time_point at, std::span<const standing_reservation<time_point>>,
                                  time_point t) {
    detail::check_request(type_name, n);
    const std::int64_t now = clamp(t);
    const std::int64_t stamp = detail::to_ns(at);
    if (stamp < now) return 0;
    const std::size_t first = first_after(detail::int128(stamp) - 1);
    const std::size_t mine = std::min(first_after(stamp) - first, static_cast<std::size_t>(n));
    last_ns_ = now;
    forget(first, mine);
    // The room frees the log's slots: starts pushed out of it while still in the window (by this
    // reservation or a charge) come back first, stamped as late as the newest of them, older than every
    // start logged (the log drops its oldest). Within the capacity just freed: no allocation.
    if (!dropped_ns_in_window(now)) dropped_ = 0;
    const auto back = static_cast<std::size_t>(std::min(dropped_, static_cast<std::int64_t>(mine)));
    starts_.insert(starts_.begin(), back, newest_dropped_ns_);
    dropped_ -= static_cast<std::int64_t>(back);
    return static_cast<std::int64_t>(mine);
  }

  /// Records n starts at t even beyond the limit (a cost found after the fact; see
  /// `chargeable_rate_limit`): the window is then over its limit, and later requests wait until enough of
  /// the starts have left it, exactly as if each had been admitted. n may exceed the limit.
  ///
  /// Memory stays O(limit): the log keeps the newest `limit` starts, which is all that `ready_at` and
  /// `try_take` need to stay exact (a request for m <= limit waits for the start m places from the newest
  /// `limit` to leave; older ones left before it). Older starts pushed out while still in the window are
  /// only counted (`dropped()`): a later `refund` cancels them first, and they give back no room, since the
  /// log no longer knows when they leave (so a refund after a charge never admits more than the true log
  /// would); a larger `set_limit` takes them back into the log, stamped as late as the newest of them
  /// could be. The count saturates at 2^62.
  /// @throws std::invalid_argument if n < 0.
  void charge(std::int64_t n, time_point t) {
    detail::check_request(type_name, n);
    const std::int64_t now = clamp(t);
    const std::int64_t logged = std::min(n, limit_);
    const std::int64_t beyond = n - logged;  // starts older than the newest `limit`, never logged
    // Never before the newest start (a reservation's, later than now): the log stays sorted, and the
    // starts count a little longer, never less.
    const std::int64_t stamp = starts_.empty() ? now : std::max(now, at(starts_.size() - 1));
    record(logged, stamp, now);
    if (beyond > 0) newest_dropped_ns_ = stamp;
    add_dropped(beyond);
    last_ns_ = now;
  }

  /// Starts that a `charge` or a smaller `set_limit` pushed out of the log while they were in the window
  /// and that may still be in it at t (0 once the newest of them has left). Reads only.
  std::int64_t dropped(time_point t) const { return dropped_ns_in_window(clamp(t)) ? dropped_ : 0; }

  /// Lowers what the window admits so that from t until `t + reset_after` at most `remaining` more starts
  /// fit: an upstream's count (`x-ratelimit-remaining-*` with `x-ratelimit-reset-*`) correcting the local
  /// log. Every start admitted in [t, t + reset_after] lies in the window ending at `t + reset_after`, as do
  /// the logged starts after `t + reset_after - window`; so when fewer than `limit - remaining` of those are
  /// logged, the difference is recorded as starts at the latest instant that keeps the log in order
  /// (`max(newest start, t + reset_after - window + 1 ns)`, so they leave just after the reset). It never
  /// admits more than before.
  ///
  /// Only for `reset_after < window()`: over a longer interval a window admits `limit` again once its
  /// starts have left, which no set of starts recorded now can prevent; then it returns false and changes
  /// nothing (use a token bucket, whose debt lasts, for long resets).
  /// @returns true if starts were recorded.
  /// @throws std::invalid_argument if remaining < 0 or reset_after < 0.
  bool limit_remaining(std::int64_t remaining, std::chrono::nanoseconds reset_after, time_point t) {
    if (remaining < 0) detail::throw_invalid(type_name, "remaining must be >= 0", detail::show(remaining));
    if (reset_after.count() < 0) {
      detail::throw_invalid(type_name, "reset_after must be >= 0", detail::show(reset_after.count()) + " ns");
    }
    if (reset_after.count() >= window_ns_ || remaining >= limit_) return false;
    const std::int64_t now = clamp(t);
    const std::int64_t end = now + reset_after.count();  // < now + window: no overflow past the window's end
    const std::size_t kept = starts_.size() - first_in_window(end);
    const std::int64_t wanted = limit_ - remaining - static_cast<std::int64_t>(kept);
    if (wanted <= 0) return false;
    const std::int64_t earliest = end - window_ns_ + 1;
    const std::int64_t stamp = starts_.empty() ? earliest : std::max(at(starts_.size() - 1), earliest);
    // The stamp is at most `now` (as reset_after < window) and at least the newest start, so the log stays
    // sorted: record the starts as a charge at `now` would, then restamp them.
    charge_at(wanted, stamp, now);
    return true;
  }

  /// Changes the limit from time t on, keeping the most recent starts that the new log can hold (the others
  /// still in the window count as `dropped`; a larger limit takes dropped starts back, stamped at the newest
  /// dropped start's time, which is no earlier than any of theirs).
  /// @throws std::invalid_argument as the constructor, and leaves the window unchanged.
  void set_limit(std::int64_t limit, time_point t) {
    checked_limit(limit);
    const std::int64_t now = clamp(t);
    if (!dropped_ns_in_window(now)) dropped_ = 0;
    const auto size = static_cast<std::int64_t>(starts_.size());
    const std::int64_t back = size < limit ? std::min(dropped_, limit - size) : 0;
    const auto kept = static_cast<std::size_t>(std::min(size, limit));
    const std::size_t lost = starts_.size() - kept;
    const std::size_t first = first_in_window(now);
    const std::size_t lost_in_window = lost > first ? lost - first : 0;
    std::vector<std::int64_t> next;
    next.reserve(static_cast<std::size_t>(back) + kept);
    for (std::int64_t i = 0; i < back; ++i) next.push_back(newest_dropped_ns_);
    for (std::size_t i = 0; i < kept; ++i) next.push_back(at(lost + i));
    if (lost_in_window > 0) newest_dropped_ns_ = std::max(newest_dropped_ns_, at(lost - 1));
    starts_ = std::move(next);
    dropped_ -= back;
    add_dropped(static_cast<std::int64_t>(lost_in_window));
    limit_ = limit;
    head_ = 0;
    last_ns_ = now;
  }

  /// Changes the window's length from time t on; the recorded starts are judged by the new length.
  /// @throws std::invalid_argument as the constructor, and leaves the window unchanged.
  void set_window(duration window, time_point t) {
    window_ns_ = checked_window(window);
    last_ns_ = clamp(t);
  }

  /// The most starts in any window: the largest n a single request may ask for.
  std::int64_t limit() const noexcept { return limit_; }
  /// The same as `limit()`, under the name the `rate_limit` concept uses.
  std::int64_t capacity() const noexcept { return limit(); }
  /// The window's length.
  duration window() const noexcept { return std::chrono::duration_cast<duration>(std::chrono::nanoseconds(window_ns_)); }
  /// The latest time at which the state changed; earlier stamps are treated as this one.
  time_point last_time() const noexcept { return time_point(std::chrono::ceil<duration>(std::chrono::nanoseconds(last_ns_))); }

 private:
  static constexpr const char* type_name = "rein::algo::sliding_window";

  static std::int64_t checked_limit(std::int64_t limit) {
    if (limit < 1 || limit > max_limit) {
      detail::throw_invalid(type_name, "limit must be in [1, 2^27]", detail::show(limit));
    }
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

  // The i-th recorded start, oldest first.
  std::int64_t at(std::size_t i) const noexcept { return starts_[(head_ + i) % starts_.size()]; }

  // The index of the oldest start inside (now - window, now]: binary search, the log is sorted oldest first.
  std::size_t first_in_window(std::int64_t now) const noexcept { return first_after(detail::int128(now) - window_ns_); }

  // Think of the log as `limit` entries, oldest first, the missing ones at minus infinity. n more starts
  // fit once at most limit - n entries remain in the window, i.e. once entry n - 1 has left it; and not
  // before the newest start, which is later than now only for a reservation (nobody overtakes it).
  detail::int128 ready_ns(std::int64_t n, std::int64_t now) const noexcept {
    if (n == 0) return now;
    const std::int64_t missing = limit_ - static_cast<std::int64_t>(starts_.size());
    const detail::int128 behind = starts_.empty() ? now : std::max(now, at(starts_.size() - 1));
    if (n <= missing) return behind;
    const detail::int128 leaves = detail::int128(at(static_cast<std::size_t>(n - 1 - missing))) + window_ns_;
    return std::max(leaves, behind);
  }

  // The index of the first start after `ns` (for ns = now: the log's end unless reservations stand).
  std::size_t first_after(detail::int128 ns) const noexcept {
    std::size_t first = 0, last = starts_.size();
    while (first < last) {
      const std::size_t middle = first + (last - first) / 2;
      if (at(middle) > ns) last = middle;
      else first = middle + 1;
    }
    return first;
  }

  // Removes `count` starts from the `first`-th on. Unwraps the ring (oldest at index 0), then closes the
  // gap: no allocation, so no throw.
  void forget(std::size_t first, std::size_t count) noexcept {
    if (count == 0) return;
    std::rotate(starts_.begin(), starts_.begin() + static_cast<std::ptrdiff_t>(head_), starts_.end());
    const auto gap = starts_.begin() + static_cast<std::ptrdiff_t>(first);
    starts_.erase(gap, gap + static_cast<std::ptrdiff_t>(count));
    head_ = 0;
  }

  // Allocates up front, so that a failed allocation leaves the state untouched; grows geometrically.
  void make_room(std::int64_t n) {
    const auto wanted = static_cast<std::size_t>(std::min(limit_, static_cast<std::int64_t>(starts_.size()) + n));
    if (wanted > starts_.capacity()) starts_.reserve(std::min(static_cast<std::size_t>(limit_), std::max(wanted, 2 * starts_.capacity())));
  }

  // The vector holds exactly the recorded starts: it grows at the back, unwrapped,
  // until it holds `limit` of them, and from then on is a full ring whose oldest entry each start replaces.
  void push(std::int64_t stamp) noexcept {
    if (starts_.size() < static_cast<std::size_t>(limit_)) {
      starts_.push_back(stamp);  // capacity reserved by make_room
    } else {
      starts_[head_] = stamp;
      head_ = (head_ + 1) % starts_.size();
    }
  }

  // Logs n <= limit starts at `stamp` (>= the newest one). Once the log is full they replace the oldest
  // entries; those still in the window at `now` count as dropped (see charge). Allocates first, so that a
  // failed allocation changes nothing.
  void record(std::int64_t n, std::int64_t stamp, std::int64_t now) {
    make_room(n);
    if (!dropped_ns_in_window(now)) dropped_ = 0;
    const std::size_t first = first_in_window(now);
    const std::size_t free = static_cast<std::size_t>(limit_) - starts_.size();
    const std::size_t replaced = static_cast<std::size_t>(n) > free ? static_cast<std::size_t>(n) - free : 0;
    const std::size_t replaced_in_window = replaced > first ? replaced - first : 0;
    if (replaced_in_window > 0) newest_dropped_ns_ = at(replaced - 1);
    add_dropped(static_cast<std::int64_t>(replaced_in_window));
    for (std::int64_t i = 0; i < n; ++i) push(stamp);
  }

  bool dropped_ns_in_window(std::int64_t now) const noexcept {
    return dropped_ > 0 && detail::int128(newest_dropped_ns_) + window_ns_ > now;
  }

  void add_dropped(std::int64_t n) noexcept {
    constexpr std::int64_t most = std::int64_t(1) << 62;
    dropped_ = n >= most - dropped_ ? most : dropped_ + n;
  }

  // Records n starts stamped `stamp` (<= now, >= the newest logged start), as charge records them at now.
  void charge_at(std::int64_t n, std::int64_t stamp, std::int64_t now) {
    charge(n, time_point(std::chrono::ceil<duration>(std::chrono::nanoseconds(now))));
    const std::size_t logged = static_cast<std::size_t>(std::min(n, limit_));
    for (std::size_t i = 0; i < logged; ++i) starts_[(head_ + starts_.size() - 1 - i) % starts_.size()] = stamp;
  }

  std::int64_t limit_;
  std::vector<std::int64_t> starts_;  // ring of the recorded start times in ns, oldest at head_
  std::size_t head_ = 0;
  std::int64_t window_ns_;
  std::int64_t last_ns_;
  std::int64_t dropped_ = 0;            // starts pushed out of the log while in the window (see charge)
  std::int64_t newest_dropped_ns_ = 0;  // the latest stamp among them
};

/// The exact sliding window on `std::chrono::steady_clock`.
using sliding_window = basic_sliding_window<>;

}  // namespace rein::algo
