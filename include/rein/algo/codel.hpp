// Shedding by queueing time (CoDel as a server's request queue runs it): once a waiting line has stood
// for a whole interval, waiters that have queued past twice the target are failed instead of granted.
// Pure: time is an argument.
#pragma once

#include <rein/detail/clock_time.hpp>
#include <rein/detail/invalid_option.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

namespace rein::algo {

/// Options of the sojourn rule (`basic_codel`, and `rein::line_options::sojourn` on a semaphore's or an
/// adaptive limiter's line in fifo order).
struct codel_options {
  /// The queueing time the line aims at, >= 0. A line stands (is overloaded) when, over a whole `interval`,
  /// it never emptied and no grant had waited `target` or less; while it stands, a waiter that has waited
  /// more than 2 x target is failed instead of granted. Default 0: off (nothing is measured or shed).
  std::chrono::nanoseconds target{0};
  /// How long a queue must stand before waiters are shed, > 0 when `target` is set. Default 100 ms, CoDel's
  /// (Nichols and Jacobson; folly's Codel also uses 100 ms, with a 5 ms target for a server's own queue).
  std::chrono::nanoseconds interval = std::chrono::milliseconds(100);
};

/// The sojourn rule of CoDel (K. Nichols and V. Jacobson, "Controlling Queue Delay", ACM Queue 10(5), 2012;
/// RFC 8289), in the form folly's `Codel` gives it for a server's queue of requests rather than a router's
/// of packets: time is cut into intervals of at least `interval`; at the end of one, the line is judged to
/// stand when the shortest queueing time of the waiters it granted during it exceeded `target` and it was
/// never empty during it (a line with no grant at all during an interval but waiters throughout stands,
/// too: nothing drained it). While it stands, a waiter whose queueing time exceeds 2 x target is shed: it
/// fails at once (`rein::errc::overloaded`) and the next is judged. CoDel proper instead drops one packet
/// at intervals shrinking as 1 / sqrt(drops); for callers who wait on a line, shedding every waiter past the
/// slough time is what folly measured to serve better, and it gives a bound:
///
///  - every waiter granted while the line stands has queued at most 2 x target;
///  - the line stops standing at the end of the first interval in which it emptied or granted a waiter
///    that had queued `target` or less; it starts standing only after a whole interval of neither, so a
///    burst that drains within an interval is never shed, however deep.
///
/// Shed waiters never reach the upstream: under a load above what the line grants, the line grants as many
/// as it would without shedding (the grants come from the same permits or tokens), and what is shed is the
/// part of the queue that would have been served too late.
///
/// The interval in force starts at the first event (a judgement or an emptying) at or after the previous
/// one's end, so an idle line does not count intervals. A time earlier than the interval's start (a clock
/// set back) closes nothing; a queueing time is measured from the arrival to the time given, never below 0.
///
/// @tparam Clock supplies `time_point`; only its types are used, never `now()`.
/// @par Thread Safety
/// Distinct objects: safe. Shared objects: unsafe (a waiting line calls it under its lock).
template <class Clock = std::chrono::steady_clock>
class basic_codel {
 public:
  /// The clock whose time points the methods take.
  using clock_type = Clock;
  /// A point in time of `clock_type`.
  using time_point = typename Clock::time_point;

  /// @throws std::invalid_argument naming the field and value: a negative target, or a target set with an
  /// interval <= 0.
  explicit basic_codel(const codel_options& o = {}, std::string_view type = "rein::algo::codel") : options_(o) {
    if (o.target < std::chrono::nanoseconds::zero())
      rein::detail::throw_invalid(type, "sojourn.target must be >= 0", rein::detail::show(o.target));
    if (o.target > std::chrono::nanoseconds::zero() && o.interval <= std::chrono::nanoseconds::zero())
      rein::detail::throw_invalid(type, "sojourn.interval must be > 0", rein::detail::show(o.interval));
    if (o.target > std::chrono::nanoseconds::max() / 2)
      rein::detail::throw_invalid(type, "sojourn.target must be at most nanoseconds::max() / 2",
                                  rein::detail::show(o.target));
  }

  /// The options in force.
  const codel_options& get_options() const noexcept { return options_; }

  /// Whether the rule is on (a target above 0).
  bool enabled() const noexcept { return options_.target > std::chrono::nanoseconds::zero(); }

  /// Whether a waiter that joined the line at `arrived` is to be shed at `now`: the line stands and the
  /// waiter has queued more than 2 x target. A line asks this of its next waiter before granting it, and
  /// of waiting ones whenever it looks (a shed waiter need not wait for a grant to fail). Closes the
  /// interval in force if `now` is past its end. Always false when the rule is off.
  [[nodiscard]] bool should_shed(time_point arrived, time_point now) noexcept {
    if (!enabled()) return false;
    roll(now);
    return standing_ && waited(arrived, now) > 2 * options_.target.count();
  }

  /// A waiter that joined the line at `arrived` was granted at `now`: its queueing time counts towards the
  /// judgement of the interval in force.
  void granted(time_point arrived, time_point now) noexcept {
    if (!enabled()) return;
    roll(now);
    shortest_ = std::min(shortest_, waited(arrived, now));
  }

  /// The first instant at which a waiter that joined at `arrived` is past the slough time (2 x target),
  /// saturated at time_point::max(): while the line stands, a line wakes then to shed it.
  time_point slough_at(time_point arrived) const noexcept {
    return at_ns(rein::detail::ns_after(ns(arrived), 2 * options_.target.count() + 1));
  }

  /// The end of the interval in force (its judgement comes with the first event at or after it), or
  /// time_point::max() before the first event: a line with waiters wakes then, so that a line that stands
  /// still is judged.
  time_point interval_end() const noexcept {
    return started_ ? at_ns(rein::detail::ns_after(start_, options_.interval.count())) : time_point::max();
  }

  /// The line had no waiter at `now` (its last waiter left, or one joined an empty line): it drained.
  void empty_at(time_point now) noexcept {
    if (!enabled()) return;
    roll(now);
    emptied_ = true;
  }

  /// Whether the line was judged to stand at the end of the last interval (waiters past 2 x target are
  /// shed until the end of the interval in force).
  bool standing() const noexcept { return standing_; }

  /// Intervals judged standing so far (each one a stretch in which waiters could be shed).
  std::uint64_t standing_intervals() const noexcept { return standing_intervals_; }

 private:
  static std::int64_t ns(time_point t) noexcept { return rein::detail::to_ns_saturated(t); }

  // The queueing time from `arrived` to `now`, saturated, never below 0 (a clock set back).
  static std::int64_t waited(time_point arrived, time_point now) noexcept {
    return std::max<std::int64_t>(rein::detail::ns_between(ns(now), ns(arrived)), 0);
  }

  // The instant `t` nanoseconds after the epoch, rounded up to the clock's tick; max() at saturation.
  static time_point at_ns(std::int64_t t) noexcept {
    if (t == std::numeric_limits<std::int64_t>::max()) return time_point::max();
    return time_point(std::chrono::ceil<typename time_point::duration>(std::chrono::nanoseconds(t)));
  }

  // Closes the interval in force if `now` is past its end (an earlier time than its start counts as the start).
  void roll(time_point now) noexcept {
    const std::int64_t t = ns(now);
    if (!started_) {
      started_ = true;
      start_ = t;
      return;
    }
    if (t < start_ || rein::detail::ns_between(t, start_) < options_.interval.count()) return;
    standing_ = !emptied_ && shortest_ > options_.target.count();
    if (standing_) ++standing_intervals_;
    start_ = t;
    shortest_ = std::numeric_limits<std::int64_t>::max();
    emptied_ = false;
  }

  codel_options options_;
  std::int64_t start_ = 0;
  std::int64_t shortest_ = std::numeric_limits<std::int64_t>::max();  // of the grants judged in the interval
  std::uint64_t standing_intervals_ = 0;
  bool started_ = false;
  bool emptied_ = false;
  bool standing_ = false;
};

/// The sojourn rule on std::chrono::steady_clock.
using codel = basic_codel<>;

}  // namespace rein::algo
