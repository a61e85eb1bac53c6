// Batch-wise adaptive concurrency: judge a window of samples by its failure rate.
#pragma once

#include <rein/algo/limit_algorithm.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>

namespace rein::algo {

/// Options of `basic_windowed_aimd`. Defaults: batches of 20, step 3, threshold 15 %, halve, with rein's
/// usual floor 1 and ceiling 64 and a starting point of 4 rather than the floor.
struct windowed_aimd_options {
  /// Starting limit, in calls; in [min_limit, max_limit].
  double initial_limit = 4.0;
  /// Floor, in calls: a whole number >= 1.
  double min_limit = 1.0;
  /// Ceiling, in calls: a whole number in [min_limit, 1e9] (`max_limit_ceiling`).
  double max_limit = 64.0;
  /// Samples per window (non-ignored outcomes); >= 1. The limit changes once per window.
  std::size_t window = 20;
  /// A window whose failure rate (failures / window) is at or below this grows; above it shrinks. In [0, 1).
  double failure_threshold = 0.15;
  /// Growth per healthy window, in calls; > 0.
  double step = 3.0;
  /// Factor applied per unhealthy window; in (0, 1). The limit keeps its fraction (no integer
  /// division).
  double backoff = 0.5;
  /// Optional: a success slower than this (strictly) counts as a failure; > 0 when set.
  std::optional<std::chrono::nanoseconds> latency_target{};
  /// The growth guard (`detail::tested_ceiling`): a window raises the limit to at most
  /// `max(n + 1, n / min_utilisation)`, n the most calls out at any grant of its samples. In [0, 1]; 0
  /// disables it.
  double min_utilisation = 0.85;
};

/// Windowed AIMD: count failures (congestion outcomes, and successes slower than `latency_target`) over
/// `window` samples; at the end of each window add `step` if the failure rate is at or below
/// `failure_threshold`, otherwise multiply by `backoff`. `ignored` samples are not counted at all.
///
/// Coarser than `basic_aimd` (it reacts once per window, not per call), so it tolerates a background failure
/// rate up to the threshold, which suits batch jobs against APIs that fail a little all the time.
///
/// @tparam Clock only names the `time_point` in samples; windows are counted in samples, not time.
template <class Clock = std::chrono::steady_clock>
class basic_windowed_aimd {
 public:
  /// The clock that times the rule and the deadlines.
  using clock_type = Clock;
  /// The options type, as the constructor takes them.
  using options = windowed_aimd_options;
  /// What one completed call reports: `sample<Clock>`.
  using sample_type = basic_sample<Clock>;
  template <class OtherClock>
  /// The same algorithm on clock `C`, with the same options type.
  using rebind_clock = basic_windowed_aimd<OtherClock>;

  /// @throws std::invalid_argument naming the field and value if `o` is invalid.
  explicit basic_windowed_aimd(const options& o = {})
      : options_{validated(o)}, limit_{o.min_limit, o.initial_limit, o.max_limit} {}

  /// The current limit, in calls (fractional; a call is admitted while in flight < floor(limit)).
  double limit() const noexcept { return limit_.value(); }
  /// The floor of the limit, in calls.
  double min_limit() const noexcept { return limit_.min(); }
  /// The ceiling of the limit, in calls.
  double max_limit() const noexcept { return limit_.max(); }
  /// How many samples strictly lowered the limit so far.
  std::uint64_t decreases() const noexcept { return limit_.decreases(); }
  /// How many samples strictly raised the limit so far.
  std::uint64_t increases() const noexcept { return limit_.increases(); }
  /// The options in force (as validated at construction or by set_options).
  const options& get_options() const noexcept { return options_; }
  /// Samples and failures counted so far in the current window.
  std::size_t window_samples() const noexcept { return samples_; }
  /// Failures (congestion outcomes) among them.
  std::size_t window_failures() const noexcept { return failures_; }

  /// Replaces the options at run time, validated as the constructor validates them (nothing changes on a
  /// throw). The limit learned so far is kept, moved into the new [min_limit, max_limit] (`initial_limit` is
  /// checked, not used). The window being filled carries on and closes once it holds the new `window`
  /// samples (at the next sample if it already holds as many).
  /// @throws std::invalid_argument naming the field and value if `o` is invalid.
  void set_options(const options& o) {
    options_ = validated(o);
    limit_.rebound(o.min_limit, o.max_limit);
  }

  /// Applies one completed call.
  void on_sample(const sample_type& s) noexcept {
    if (s.result == outcome::ignored) return;
    ++samples_;
    if (s.in_flight > window_in_flight_) window_in_flight_ = s.in_flight;
    if (s.result == outcome::congestion || (options_.latency_target && s.latency > *options_.latency_target))
      ++failures_;
    if (samples_ < options_.window) return;
    const double rate = static_cast<double>(failures_) / static_cast<double>(samples_);
    const std::size_t in_flight = window_in_flight_;
    samples_ = failures_ = window_in_flight_ = 0;
    const double current = limit_.value();
    if (rate <= options_.failure_threshold) {
      limit_.set(detail::guarded_growth(current, current + options_.step, in_flight, options_.min_utilisation));
    } else if (!gate_.stale(s.now, s.latency)) {  // at most one decrease per round trip
      gate_.decreased(s.now);
      limit_.set(current * options_.backoff);
    }
  }

 private:
  static const options& validated(const options& o) {
    constexpr auto type = "windowed_aimd";
    detail::check_limits(type, o.min_limit, o.initial_limit, o.max_limit);
    if (o.window < 1) detail::invalid_option(type, "window", ">= 1", o.window);
    if (!detail::finite(o.failure_threshold) || o.failure_threshold < 0.0 || o.failure_threshold >= 1.0)
      detail::invalid_option(type, "failure_threshold", "in [0, 1)", o.failure_threshold);
    detail::check_positive(type, "step", o.step);
    detail::check_open_unit(type, "backoff", o.backoff);
    if (o.latency_target) detail::check_positive(type, "latency_target", *o.latency_target);
    if (!detail::finite(o.min_utilisation) || o.min_utilisation < 0.0 || o.min_utilisation > 1.0)
      detail::invalid_option(type, "min_utilisation", "in [0, 1]", o.min_utilisation);
    return o;
  }

  options options_;
  detail::bounded_limit limit_;
  std::size_t samples_ = 0;
  std::size_t failures_ = 0;
  std::size_t window_in_flight_ = 0;  // the most calls out at any grant of the window's samples
  detail::round_trip_gate<typename Clock::time_point> gate_{};
};

/// `basic_windowed_aimd` on `std::chrono::steady_clock`.
using windowed_aimd = basic_windowed_aimd<>;

}  // namespace rein::algo
