// Gradient concurrency limit: scale the limit by baseline latency / current latency, plus a small queue
// allowance, smoothed (Netflix concurrency-limits' Gradient2Limit; Envoy's adaptive concurrency filter).
#pragma once

#include <rein/algo/limit_algorithm.hpp>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <utility>

namespace rein::algo {

/// What "normal" latency is, for `basic_gradient`.
enum class gradient_baseline {
  /// The minimum successful latency over the last `baseline_window` samples, as Envoy's gradient controller
  /// uses a measured minRTT. It does not drift upwards while the dependency degrades, which is what makes the
  /// limit fall; it does trust the fastest call seen, so a dependency with rare, very fast answers (cache
  /// hits) should pair it with a `tolerance` above 1.
  minimum,
  /// Netflix Gradient2's long-term RTT: the plain mean of the first 10 samples, then an exponential average
  /// with factor 2 / (baseline_window + 1); when it exceeds twice the current sample it is multiplied by 0.95
  /// so it comes back down quickly after a long overload. It follows a degradation upwards, so the gradient
  /// returns to 1 while the dependency is still slow.
  long_average,
};

/// Options of `basic_gradient`.
///
/// Defaults are rein's, chosen on the worst case of a generated family of upstreams
/// (`rein/testing/scenario_family.hpp`), with rein's rules (a rise spread over the round trip, one fall per
/// round trip, the tested growth guard, no queue allowance for a queued sample, an unsmoothed fall past the
/// clamp, slow start, the climb back to the level of a fall and the plateau above it; see
/// `basic_gradient`). Gradient2's own defaults (queue 4, tolerance 1.5, long average, failures as plain
/// samples) keep a queue of about 4 calls inside the dependency, let the baseline drift up with the degradation, and take a fast
/// failure for a fast success. Gradient2's defaults are: `queue_size = 4`, `tolerance = 1.5`,
/// `baseline = long_average`, `baseline_window = 600`, `smoothing = 0.2`, `failures_as_congestion = false`.
/// Envoy's are: `baseline = minimum`, `tolerance = 1.25` (its 25 % minRTT buffer), `max_gradient = 2`,
/// `queue_size = 0`, `queue_sqrt_scale = 1` (headroom sqrt(limit)), `min_utilisation = 0`.
struct gradient_options {
  /// Starting limit, in calls; in [min_limit, max_limit]. 4 (Gradient2: 20): a start above the capacity
  /// bursts into a dependency that may fail just past it, and slow start finds a larger capacity within a
  /// few round trips.
  double initial_limit = 4.0;
  /// Floor, in calls: a whole number >= 1.
  double min_limit = 1.0;
  /// Ceiling, in calls: a whole number in [min_limit, 1e9] (`max_limit_ceiling`).
  double max_limit = 64.0;
  /// Weight of the new estimate per round trip, in (0, 1]: a fall moves `smoothing` of the way to its
  /// estimate at once (at most once per round trip; all the way past the clamp, see `min_gradient`); a rise
  /// moves `smoothing / limit` of the way per sample, about `smoothing` per round trip of `limit` samples,
  /// whatever the limit, and up to the whole way after round trips without a fall (see the class).
  /// (Gradient2 applies `smoothing` per sample, so its gain per round trip grows with the limit and
  /// overshoots when capacity returns.)
  double smoothing = 0.5;
  /// The gradient is `tolerance x baseline / latency` before clamping: latencies up to `tolerance x baseline`
  /// count as "no queueing". Finite and >= 1. 1.5 (Gradient2's): the noise floor against a minimum
  /// baseline, which +-20 % jitter puts at 0.8 x the typical latency and the slowest unqueued call at 1.2 x,
  /// 1.5 x the minimum (Envoy's 1.25 takes that jitter for queueing); below 2, so one call over capacity in a
  /// dependency whose latency doubles still counts. Unset (`std::nullopt`): the latency signal is off, every
  /// success reads as served at the baseline (gradient 1, with the queue allowance; one call more per success
  /// in slow start), so only congestion outcomes lower the limit (with `failures_as_congestion`; without it
  /// nothing does): for a dependency that refuses calls past its capacity without getting slower, or whose
  /// latency follows the payload rather than a queue (as `aimd_options::latency_tolerance` and
  /// `tuned_aimd_options::tolerance` switch theirs off).
  std::optional<double> tolerance = 1.5;
  /// Jitter that does not scale with the latency, in nanoseconds; >= 0 (0: none). The gradient is `max(tolerance x
  /// baseline, baseline + noise_floor) / latency` (`detail::allowed_latency`): on a fast path (a 150 us loopback
  /// call) a scheduling delay of a few hundred microseconds is many times the fastest call, but no queueing at the
  /// dependency. 0.5 ms. The default was measured, not guessed: on the generated family (`examples/adaptive_family`,
  /// base latencies 1-20 ms) every figure is the same for floors from 0 to 0.6 ms and gets worse from about 0.8 ms (a
  /// floor near the base hides a call queued behind one other), and on loopback HTTP (sub-millisecond calls) 0.5 ms
  /// removes most of the cuts that scheduling jitter caused with no floor.
  std::chrono::nanoseconds noise_floor = std::chrono::microseconds{500};
  /// Lower clamp of the gradient, so one outlier cannot cut more than this factor at once; in (0, 1].
  /// A latency beyond the clamp (slower than `allowed / min_gradient`: 3 x the baseline by default) and a
  /// congestion outcome (when `failures_as_congestion` is set) fall all the way to `limit x min_gradient`,
  /// without smoothing: smoothing filters jitter, which stays within the tolerance, and a latency that far
  /// beyond the allowed one is a queue, not jitter (TCP halves its window on a loss, RFC 5681). A deep drop
  /// of the capacity, where every call is queued until the limit is below it, then drains in fewer than
  /// half the round trips that a quarter per round trip takes.
  double min_gradient = 0.5;
  /// Upper clamp of the gradient; finite and >= 1. 1 (Gradient2) means growth comes only from the queue
  /// allowance; Envoy allows 2.
  double max_gradient = 1.0;
  /// Constant part of the queue allowance, in calls: how far above `limit x gradient` a sample served
  /// within the allowed latency puts the estimate; finite and >= 0. At the baseline it is the growth per
  /// round trip, times smoothing: one call, so a probe above the capacity costs one queued call at a time.
  /// A sample that queued (slower than allowed) gets no allowance: the probe has been answered. (Gradient2
  /// and Envoy add it to every sample, which keeps a standing queue: with it, `limit x tolerance x baseline /
  /// latency + 1` settles at or above `tolerance x capacity + 1` calls wherever latency grows in steps of
  /// the base per call over the capacity, i.e. calls queued for good at a capacity of 3 or less.)
  double queue_size = 1.0;
  /// Part of the queue allowance that grows with the limit: `queue_sqrt_scale x sqrt(limit)` calls (Envoy's
  /// headroom and Netflix GradientLimit's are about sqrt(limit)), added as `queue_size` is; finite and >= 0.
  double queue_sqrt_scale = 0.0;
  /// Which latency is "normal"; see `gradient_baseline`.
  gradient_baseline baseline = gradient_baseline::minimum;
  /// Samples the baseline spans (see `gradient_baseline`); >= 1.
  std::size_t baseline_window = 200;
  /// true: a `congestion` outcome applies `min_gradient` at once and is kept out of the latency estimates.
  /// false (Netflix): it is a latency sample like any other, so a fast failure looks like a fast success.
  bool failures_as_congestion = true;
  /// The growth guard (`detail::tested_ceiling`): a success granted with n calls out raises the limit to at
  /// most `max(n + 1, n / min_utilisation)` (Gradient2 instead ignores samples below `limit / 2`, letting the
  /// limit double the tested demand). Falls are not guarded. In [0, 1]; 0 disables it.
  double min_utilisation = 0.85;
  /// Slow start (TCP's, RFC 5681): until the first fall, each success within the allowed latency adds one
  /// call, so the limit doubles per round trip, within the growth guard (at most `1 / min_utilisation` of
  /// what was tested). Without it the limit grows by the queue allowance, at most `queue_size` calls per
  /// round trip, from `initial_limit`: 36 round trips or more from 4 to 40 calls. Gradient2 and Envoy have
  /// none.
  bool slow_start = true;
  /// true: while latency is judged, a `congestion` outcome counts only when failures come faster than the
  /// rate learned so far (`detail::failure_baseline`, at least 15 %): 1-5 % of calls failing at random,
  /// whatever the limit, is not congestion, and such a failure is no sample at all. false: every one counts
  /// (Gradient2, Envoy). Only with `failures_as_congestion`. With the latency signal off (`tolerance`)
  /// failures are the only signal and every one counts: a limit held back only by refusals past a hard cap
  /// would otherwise grow until 16 of 50 calls were refused.
  bool learn_failure_rate = true;
};

namespace detail {

/// Netflix concurrency-limits' ExpAvgMeasurement: a plain mean over the first `warmup` samples, then an
/// exponential average with factor 2 / (window + 1).
class exp_average {
 public:
  exp_average(std::size_t window, std::size_t warmup) noexcept
      : factor_{2.0 / (static_cast<double>(window) + 1.0)}, warmup_{warmup} {}

  double add(double x) noexcept {
    if (count_ < warmup_) {
      ++count_;
      sum_ += x;
      value_ = sum_ / static_cast<double>(count_);
    } else {
      value_ = value_ * (1.0 - factor_) + x * factor_;
    }
    return value_;
  }

  double value() const noexcept { return value_; }
  void scale(double f) noexcept { value_ *= f; }
  void set_window(std::size_t window) noexcept { factor_ = 2.0 / (static_cast<double>(window) + 1.0); }

 private:
  double factor_;
  std::size_t warmup_;
  std::size_t count_ = 0;
  double sum_ = 0.0;
  double value_ = 0.0;
};

}  // namespace detail

/// Gradient limit, after Netflix concurrency-limits' Gradient2Limit and Envoy's adaptive concurrency filter.
///
/// For each success:
///
///     gradient = clamp(tolerance x baseline / latency, min_gradient, max_gradient)
///     estimate = limit x gradient + queue_size + queue_sqrt_scale x sqrt(limit)   within the allowed latency
///     estimate = limit x gradient                                                 slower (queued)
///     fall:  limit = limit + (estimate - limit) x smoothing             at most once per round trip
///            limit = estimate                      the same, when the latency is beyond the clamp
///     rise:  limit = limit + (estimate - limit) x smoothing x pace / limit     within the growth guard
///
/// - A fall is skipped when the call started before the latest fall (it reports on the limit before it).
///   Latency twice the baseline cuts once per round trip by `smoothing x (1 - tolerance / 2)`; a congestion
///   outcome applies `min_gradient` unsmoothed (unless `failures_as_congestion` is false).
/// - Until the first fall, slow start replaces the rise: one call per success within the allowed latency.
/// - After a fall, the limit climbs back first to the level the fall found, one call below the calls out
///   of the call that queued (those were too many; one fewer may not be): half the way per round trip, at
///   least one call, spread over the round trip's samples, within the growth guard (BIC-TCP's binary
///   search, as tuned_aimd's). A stall or a noisy call that cut below the capacity costs a round trip or
///   two instead of `2 x (level - limit)` round trips of queue allowance; a level above a lower capacity is
///   found again by the next fall, one call below its queued call.
/// - Above the level, the rise: `pace` starts at 1 (`smoothing x queue_size` calls per round trip) and
///   doubles every round trip without a fall, up to `1 / smoothing` (the whole way to the estimate per round
///   trip, `queue_size` calls: never past it). After a fall that finds the level the fall before it found (a
///   futile probe), it starts at `2^-k` instead, k such falls in a row: the limit stays at the level about
///   one round trip longer per futile probe, at most 30 (about `aimd`'s longest wait, 31 round trips). CUBIC's
///   plateau around the window of the last loss and its convex probe beyond (RFC 8312), as `tuned_aimd` and
///   `aimd` space their futile probes: a probe past a capacity that holds queues a round trip of calls
///   behind the one over it, while a capacity that grew is found at up to a call per round trip.
/// - `ignored` changes nothing. With `tolerance` unset every success has gradient 1 (latency is not judged).
///
/// Netflix feeds every sample, each one a short-term RTT; Envoy aggregates a time window into a percentile
/// and updates once per window. rein updates per sample, like Gradient2, which needs no timer.
///
/// @tparam Clock only names the `time_point` in samples; the gradient does not look at time.
template <class Clock = std::chrono::steady_clock>
class basic_gradient {
 public:
  /// The clock that times the rule and the deadlines.
  using clock_type = Clock;
  /// The options type, as the constructor takes them.
  using options = gradient_options;
  /// What one completed call reports: `sample<Clock>`.
  using sample_type = basic_sample<Clock>;
  template <class OtherClock>
  /// The same algorithm on clock `C`, with the same options type.
  using rebind_clock = basic_gradient<OtherClock>;

  /// @throws std::invalid_argument naming the field and value if `o` is invalid.
  explicit basic_gradient(const options& o = {})
      : options_{validated(o)},
        limit_{o.min_limit, o.initial_limit, o.max_limit},
        minimum_{o.baseline_window},
        average_{o.baseline_window, 10},
        slow_start_{o.slow_start} {}

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
  /// The gradient of the last update that changed the estimate (1 before any).
  double last_gradient() const noexcept { return last_gradient_; }
  /// True while in slow start (see `gradient_options::slow_start`).
  bool in_slow_start() const noexcept { return slow_start_; }

  /// Replaces the options at run time, validated as the constructor validates them (nothing changes on a
  /// throw). The limit learned so far is kept, moved into the new [min_limit, max_limit] (`initial_limit` is
  /// checked, not used). A new `baseline_window` applies to the baseline learned so far: the minimum keeps the
  /// values still inside the new window, the average takes the new weight from the next sample.
  /// `slow_start` false ends slow start (true does not restart it).
  /// @throws std::invalid_argument naming the field and value if `o` is invalid.
  void set_options(const options& o) {
    options_ = validated(o);
    if (!o.slow_start) slow_start_ = false;
    limit_.rebound(o.min_limit, o.max_limit);
    minimum_.set_capacity(o.baseline_window);
    average_.set_window(o.baseline_window);
  }

  /// Applies one completed call. With a work hint (`basic_sample::work`) latency is judged per unit of work;
  /// a call that did no work (a hint of 0) counts as one as fast as the baseline.
  /// @throws std::invalid_argument if the sample's work hint is negative, NaN or infinite.
  void on_sample(const sample_type& s) {
    // A failure that is no congestion (failures_as_congestion off) is a latency sample: no rate to learn.
    const bool learn =
        options_.learn_failure_rate && options_.failures_as_congestion && options_.tolerance.has_value();
    if (s.result == outcome::ignored || !signals_.counts(s, learn)) return;
    if (s.result == outcome::congestion && options_.failures_as_congestion) {
      apply(options_.min_gradient, true, true, s);
      return;
    }
    const auto judged = signals_.judged(s.latency, s.work);
    if (!judged) {
      apply(1.0, false, false, s);  // no work, nothing to judge
      return;
    }
    // A zero latency (a clock too coarse for the call) would divide by zero; one nanosecond is as fast.
    const double latency = static_cast<double>(judged->count() > 0 ? judged->count() : 1);
    const double base = baseline(latency);  // learned even when unjudged, for a tolerance set later
    if (!options_.tolerance) {
      apply(1.0, false, false, s);  // the latency signal is off: as fast as the baseline
      return;
    }
    const double allowed =
        detail::allowed_latency(base, *options_.tolerance, signals_.floor(options_.noise_floor, s.work));
    const double ratio = allowed / latency;
    apply(clamp(ratio, options_.min_gradient, options_.max_gradient), latency > allowed,
          ratio < options_.min_gradient, s);
  }

 private:
  static double clamp(double v, double lo, double hi) noexcept { return v < lo ? lo : (v > hi ? hi : v); }

  double baseline(double latency) {
    if (options_.baseline == gradient_baseline::minimum) {
      minimum_.push(static_cast<std::int64_t>(latency));
      return static_cast<double>(minimum_.value());
    }
    const double base = average_.add(latency);
    // Gradient2: after a long overload the average is far above a recovered latency; pull it down faster.
    if (base / latency > 2.0) average_.scale(0.95);
    return base;
  }

  // A rise is spread over the round trip: each sample moves the limit `smoothing x pace / limit` of the way
  // to its estimate, so the gain per round trip does not grow with the limit (Gradient2 moves `smoothing`
  // per sample, i.e. `limit x smoothing` per round trip). A fall is taken at once, `smoothing` of the way, and
  // at most once per round trip (a slow call that started before the latest fall reports on the old limit).
  // The queue allowance goes only to a sample that did not queue (`queued`: slower than allowed, or a
  // congestion outcome). A fall `beyond` the clamp (or for a congestion outcome) is not smoothed.
  void apply(double gradient, bool queued, bool beyond, const sample_type& s) noexcept {
    const double current = limit_.value();
    const double headroom = queued ? 0.0 : options_.queue_size + options_.queue_sqrt_scale * std::sqrt(current);
    const double estimate = current * gradient + headroom;
    last_gradient_ = gradient;
    if (estimate < current) {
      if (gate_.stale(s.now, s.latency)) return;
      gate_.decreased(s.now);
      slow_start_ = false;
      level_ = static_cast<double>(s.in_flight) - 1.0;
      const std::uint64_t futile = levels_.found(level_);
      pace_ = std::exp2(-static_cast<double>(futile < max_futile ? futile : max_futile));
      limit_.set(beyond ? estimate : current + (estimate - current) * options_.smoothing);
      return;
    }
    if (slow_start_) {
      if (!queued) limit_.set(detail::guarded_growth(current, current + 1.0, s.in_flight, options_.min_utilisation));
      return;
    }
    if (current < level_) {
      const double rounds = 1.0 / current;  // of a round trip, per sample (current >= min_limit >= 1)
      const double step = (level_ - current) / 2.0 > 1.0 ? (level_ - current) / 2.0 : 1.0;
      const double next = current + step * rounds < level_ ? current + step * rounds : level_;
      limit_.set(detail::guarded_growth(current, next, s.in_flight, options_.min_utilisation));
      return;
    }
    const double rounds = 1.0 / (current > 1.0 ? current : 1.0);
    const double weight = options_.smoothing * pace_ * rounds;
    const double most = 1.0 / options_.smoothing;  // the whole way to the estimate per round trip
    pace_ = pace_ * std::exp2(rounds) < most ? pace_ * std::exp2(rounds) : most;
    limit_.set(detail::guarded_growth(current, current + (estimate - current) * weight, s.in_flight,
                                      options_.min_utilisation));
  }

  // The most futile probes in a row that lengthen the wait above the level (about a round trip each).
  static constexpr std::uint64_t max_futile = 30;

  static const options& validated(const options& o) {
    constexpr auto type = "gradient";
    detail::check_limits(type, o.min_limit, o.initial_limit, o.max_limit);
    if (!detail::finite(o.smoothing) || o.smoothing <= 0.0 || o.smoothing > 1.0)
      detail::invalid_option(type, "smoothing", "in (0, 1]", o.smoothing);
    if (o.tolerance && (!detail::finite(*o.tolerance) || *o.tolerance < 1.0))
      detail::invalid_option(type, "tolerance", ">= 1 and finite", *o.tolerance);
    detail::check_non_negative(type, "noise_floor", o.noise_floor);
    if (!detail::finite(o.min_gradient) || o.min_gradient <= 0.0 || o.min_gradient > 1.0)
      detail::invalid_option(type, "min_gradient", "in (0, 1]", o.min_gradient);
    if (!detail::finite(o.max_gradient) || o.max_gradient < 1.0)
      detail::invalid_option(type, "max_gradient", ">= 1 and finite", o.max_gradient);
    if (!detail::finite(o.queue_size) || o.queue_size < 0.0)
      detail::invalid_option(type, "queue_size", ">= 0 and finite", o.queue_size);
    if (!detail::finite(o.queue_sqrt_scale) || o.queue_sqrt_scale < 0.0)
      detail::invalid_option(type, "queue_sqrt_scale", ">= 0 and finite", o.queue_sqrt_scale);
    if (o.baseline != gradient_baseline::minimum && o.baseline != gradient_baseline::long_average)
      detail::invalid_option(type, "baseline", "minimum or long_average", static_cast<std::size_t>(o.baseline));
    if (o.baseline_window < 1) detail::invalid_option(type, "baseline_window", ">= 1", o.baseline_window);
    if (!detail::finite(o.min_utilisation) || o.min_utilisation < 0.0 || o.min_utilisation > 1.0)
      detail::invalid_option(type, "min_utilisation", "in [0, 1]", o.min_utilisation);
    return o;
  }

  options options_;
  detail::bounded_limit limit_;
  detail::sliding_minimum minimum_;
  detail::exp_average average_;
  detail::sample_signals signals_{};
  double last_gradient_ = 1.0;
  bool slow_start_;
  double level_ = 0.0;  // one call below the calls out of the call behind the latest fall (0 before any)
  detail::level_memory levels_{};  // the level of the latest fall, and how many falls in a row found it
  double pace_ = 1.0;   // a rise above the level moves `smoothing x pace_` of the way per round trip
  detail::round_trip_gate<typename Clock::time_point> gate_{};
};

/// `basic_gradient` on `std::chrono::steady_clock`.
using gradient = basic_gradient<>;

}  // namespace rein::algo
