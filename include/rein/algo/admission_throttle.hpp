// Client-side adaptive throttling: refuse locally the share of calls the backend would refuse anyway, so
// that an overloaded backend spends nothing on them (the Google SRE book, "Handling Overload"). Pure: time
// and the random draw are arguments.
#pragma once

#include <rein/detail/epoch_slices.hpp>
#include <rein/detail/invalid_option.hpp>
#include <rein/outcome.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

namespace rein::algo {

/// Options of `basic_admission_throttle` (and of the I/O object `rein::admission_throttle`).
struct admission_throttle_options {
  /// The trailing window over which requests and accepts are counted; a positive multiple of 10 ticks of
  /// the clock (it moves in tenths). Default 2 min, the SRE book's.
  std::chrono::nanoseconds window = std::chrono::minutes(2);
  /// K: the client may send K times what the backend accepts before it refuses anything itself. In
  /// [1, 1000], finite. Default 2, the SRE book's (Envoy's admission_control says the same with
  /// `sr_threshold` = 1 / K).
  double multiplier = 2.0;
  /// The most a call is refused with, in [0, 1]. Default 1: no cap beyond the rule's own (requests /
  /// (requests + 1)). Envoy caps at 0.8 (`max_rejection_probability`), so that some calls always probe.
  double max_rejection = 1.0;
};

/// The SRE book's client-side throttling rule: a new call is refused locally with probability
///
///     p = max(0, (requests - K x accepts) / (requests + 1)),
///
/// capped at `max_rejection`, where `requests` counts every call the application asked to make (those
/// refused locally included) and `accepts` those the backend accepted, both over the trailing `window`.
/// While the backend accepts more than 1 / K of the calls nothing is refused; beyond that the client sends
/// about K times what the backend accepts, so it learns quickly when the backend recovers, while the
/// share that would only be refused never leaves the client.
///
/// When a request counts: a call refused locally at once, an admitted one when its outcome is recorded (as
/// go-zero's and Kratos's implementations of the rule do). The book counts a request when it starts; then
/// calls still in flight count as refusals, and a new client's first burst of n concurrent calls would see
/// p = n / (n + 1) before any answer came back. An admitted call must therefore be recorded once.
///
/// What counts as accepted: an outcome other than `congestion` (`record(outcome, t)`). `congestion` is the
/// backend refusing for load (429, 503, 504, 408 and timeouts, see `classify_http_status`), so it is no
/// accept; `success` is one, and so is `ignored` (a 404 or a 500 was served: the backend did not refuse it
/// for load). A call abandoned before any answer should still be recorded, as `ignored`, unless the caller
/// wants its silence to count as a refusal.
///
/// Source: Beyer et al., *Site Reliability Engineering* (O'Reilly, 2016), ch. 21 "Handling Overload",
/// "Client-side throttling" (K = 2, a 2-minute window); Envoy's `admission_control` HTTP filter is the
/// same rule (`sampling_window`, `sr_threshold` = 1 / K, aggression 1).
///
/// The window is 10 slices of `window / 10`, aligned to the clock's epoch: a count made at t is included
/// until the start of the slice `window` after the slice holding t (for between 0.9 and 1 window). Counts
/// are exact integers; p is one division of doubles. A time earlier than the latest seen counts as the
/// latest.
///
/// The decision is deterministic: `try_admit(t, draw)` takes a number drawn uniformly from [0, 1] and admits
/// iff draw >= p, so a test can pass the draws it wants and the I/O object draws from a seeded generator.
///
/// @tparam Clock supplies `time_point` and `duration`; only its types are used, never `now()`.
/// @par Thread Safety
/// Distinct objects: safe. Shared objects: unsafe (rein::admission_throttle guards it with its mutex).
template <class Clock = std::chrono::steady_clock>
class basic_admission_throttle {
 public:
  /// The clock whose time points the methods take.
  using clock_type = Clock;
  /// A point in time of `clock_type`.
  using time_point = typename Clock::time_point;
  /// A duration of `clock_type`.
  using duration = typename Clock::duration;
  /// The options type, as the constructor takes them.
  using options_type = admission_throttle_options;

  /// Slices per window.
  static constexpr std::int64_t slices = 10;

  /// @throws std::invalid_argument naming the field and value when an option is out of range.
  explicit basic_admission_throttle(const options_type& o = {})
      : options_(validated(o)), slice_(rein::detail::slice_width<duration>(type_name, "window", o.window, slices)) {}

  /// The options in force.
  const options_type& get_options() const noexcept { return options_; }

  /// The probability with which a call asking at `now` is refused: the rule above, in [0, max_rejection].
  double rejection_probability(time_point now) const noexcept {
    const counts c = totals(now);
    const double requests = static_cast<double>(c.requests);
    const double p = (requests - options_.multiplier * static_cast<double>(c.accepts)) / (requests + 1);
    return std::clamp(p, 0.0, options_.max_rejection);
  }

  /// A call asks at `now`: admitted iff `draw` >= rejection_probability(now). A refused call counts as a
  /// request at once; an admitted one counts when `record` reports its outcome. `draw` is uniform in
  /// [0, 1] (as every draw rein takes): with p = 0 every call is admitted, a draw of 0 is refused whenever
  /// p > 0, and a draw of 1 is admitted (p stays below 1: the rule's + 1 in the denominator).
  /// @throws std::invalid_argument if draw is not in [0, 1], NaN included (nothing is counted).
  [[nodiscard]] bool try_admit(time_point now, double draw) {
    rein::detail::checked_draw(type_name, "draw", draw);
    if (draw >= rejection_probability(now)) return true;
    ++slot_at(now).requests;
    return false;
  }

  /// An admitted call reported `result` at `now`: it counts as a request, and as an accept unless the
  /// result is `congestion`.
  void record(outcome result, time_point now) noexcept {
    slot& s = slot_at(now);
    ++s.requests;
    if (result != outcome::congestion) ++s.accepts;
  }

  /// Requests counted in the window at `now` (refused ones included).
  std::int64_t requests(time_point now) const noexcept { return totals(now).requests; }
  /// Accepts counted in the window at `now`.
  std::int64_t accepts(time_point now) const noexcept { return totals(now).accepts; }

 private:
  static constexpr const char* type_name = "rein::algo::admission_throttle";
  static_assert(std::is_integral_v<typename Clock::duration::rep>,
                "rein::algo::basic_admission_throttle: the clock must count integer ticks");

  struct counts {
    std::int64_t requests = 0;
    std::int64_t accepts = 0;
  };
  // A slice's counts, stamped with the slice they belong to: a stale stamp means zero, so nothing has to
  // be cleared as time moves on.
  struct slot : counts {
    std::int64_t slice = std::numeric_limits<std::int64_t>::min();
  };

  // The latest slice seen and `now`'s, whichever is later (time does not go back).
  std::int64_t settled(time_point now) const noexcept { return std::max(latest_, slice_index(now)); }

  slot& slot_at(time_point now) noexcept {
    latest_ = settled(now);
    slot& s = slots_[static_cast<std::size_t>(((latest_ % slices) + slices) % slices)];
    if (s.slice != latest_) s = slot{{}, latest_};
    return s;
  }

  counts totals(time_point now) const noexcept {
    const std::int64_t k = settled(now);
    counts sum;
    for (const slot& s : slots_) {
      // k - s.slice < slices, in unsigned arithmetic: the difference to the empty stamp overflows int64.
      if (s.slice <= k && static_cast<std::uint64_t>(k) - static_cast<std::uint64_t>(s.slice) < slices) {
        sum.requests += s.requests;
        sum.accepts += s.accepts;
      }
    }
    return sum;
  }

  std::int64_t slice_index(time_point now) const noexcept { return rein::detail::slice_index(now, slice_); }

  static const options_type& validated(const options_type& o) {
    if (!(o.multiplier >= 1.0 && o.multiplier <= 1000.0))
      rein::detail::throw_invalid(type_name, "multiplier must be in [1, 1000]", rein::detail::show(o.multiplier));
    if (!(o.max_rejection >= 0.0 && o.max_rejection <= 1.0))
      rein::detail::throw_invalid(type_name, "max_rejection must be in [0, 1]", rein::detail::show(o.max_rejection));
    return o;
  }

  options_type options_;
  duration slice_;
  std::array<slot, slices> slots_{};
  std::int64_t latest_ = std::numeric_limits<std::int64_t>::min();
};

/// The admission throttle on std::chrono::steady_clock.
using admission_throttle = basic_admission_throttle<>;

}  // namespace rein::algo
