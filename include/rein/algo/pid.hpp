// A PID controller that drives the concurrency limit from the windowed failure rate.
#pragma once

#include <rein/algo/limit_algorithm.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>

namespace rein::algo {

/// Options of `basic_pid`. Gains are in calls per unit of error, where the error is a failure-rate
/// difference (0.05 = five percentage points). ki is 20 rather than a textbook 0.5, which would move the
/// limit by 0.025 calls per healthy window: 20 moves it by about one call per healthy window at the
/// default 5 % target.
struct pid_options {
  /// Starting limit and the controller's operating point (the output at zero error and zero integral), in
  /// calls; in [min_limit, max_limit].
  double initial_limit = 4.0;
  /// Floor, in calls: a whole number >= 1.
  double min_limit = 1.0;
  /// Ceiling, in calls: a whole number in [min_limit, 1e9] (`max_limit_ceiling`).
  double max_limit = 64.0;
  /// Samples per window (non-ignored outcomes, of calls that started after the latest decrease); >= 1. The
  /// controller runs once per window. A window holds at least a round trip of samples (`floor(limit)`), so
  /// that one healthy window raises the limit by about one call per round trip at any limit, and closes
  /// early once more than `target_failure_rate x window` of its samples failed (its error is then negative
  /// whatever the rest would say): a window of 20 samples is five round trips at a limit of 4.
  std::size_t window = 20;
  /// The failure rate the controller steers towards; in [0, 1). A failure is a `congestion` outcome or a
  /// slow success (`latency_tolerance`, `latency_target`), so by default this is mostly a share of slow
  /// calls: a controller that steers towards a rate needs some of them to find the capacity, and a slow
  /// call is the cheap sign of being past it (calls queue at the capacity and fail only past the hard
  /// limit beyond it). Against a dependency that fails fast without slowing down, it is a share of failed
  /// calls, as it was before slow calls counted.
  double target_failure_rate = 0.05;
  /// Proportional gain: calls per unit of the current window's error; finite and >= 0.
  double kp = 20.0;
  /// Integral gain: calls per unit of accumulated error (summed once per window); finite and >= 0.
  double ki = 20.0;
  /// Derivative gain: calls per unit of change in error since the previous window; finite and >= 0.
  double kd = 5.0;
  /// Anti-windup: the accumulated error is clamped to [-integral_limit, +integral_limit]; > 0.
  double integral_limit = 50.0;
  /// Optional: a success slower than this (strictly) counts as a failure; > 0 when set.
  std::optional<std::chrono::nanoseconds> latency_target{};
  /// A success slower than `detail::allowed_latency(fastest, latency_tolerance, noise_floor)` (strictly),
  /// `fastest` the fastest of the last 200 successes that were not slow themselves (a slow one joins them
  /// only if granted at the floor, as `tuned_aimd`'s baseline), counts as a failure: a target relative to
  /// what the dependency has shown it can do, so it needs no guess. While the limit sits above a capacity
  /// that dropped every call queues, and 200 queued calls made the queue the norm; at the floor the limit
  /// can do no more, and a dependency that became slower for good becomes the new norm. 1.75 (as
  /// `aimd_options::latency_tolerance`):
  /// +-20 % jitter puts the slowest unqueued call at 1.5 x the fastest, a call queued behind another takes
  /// twice as long. Finite and > 1 when set; unset: only `congestion` outcomes and `latency_target` count.
  std::optional<double> latency_tolerance = 1.75;
  /// Jitter that is not proportional to the latency (scheduling delays on a fast path), in nanoseconds: a
  /// success within `fastest + noise_floor` is never slow (`detail::allowed_latency`). >= 0; 0: the
  /// tolerance alone. 0.5 ms, as `aimd_options::noise_floor` and `tuned_aimd_options::noise_floor`: on
  /// the generated family (`examples/adaptive_family`, base latencies 1-20 ms) every figure is the same as
  /// with 0, and on a sub-millisecond path a scheduling delay is not taken for a queue.
  std::chrono::nanoseconds noise_floor = std::chrono::microseconds{500};
  /// One window lowers the limit at most to `backoff x` the limit; in (0, 1). A window of slow calls is an
  /// error of -0.95 (at the default target), which kp and kd alone turn into a fall of 24 calls; 0.8 (as
  /// `aimd_options::backoff`): one window over the capacity leaves the limit above 0.8 x the capacity.
  /// Deeper, down to `backoff^2 x` the limit, only where the window's slow calls say the capacity is lower
  /// (TCP Vegas' queue estimate, in calls: a call granted with n calls out that took `k + 1` times the
  /// fastest latency queued behind about k calls, so about n - k were within the capacity; the window's
  /// highest estimate counts): after a deep drop the calls queue many deep, every round trip gets longer,
  /// and a cut of 0.8 per round trip took many of them to get below the new capacity. A window with such
  /// an estimate cuts at least to it, whatever its failure rate: one that closed early at its second
  /// failure, its other samples from before a drop, lowered the limit by a call or two.
  double backoff = 0.8;
  /// The growth guard (`detail::tested_ceiling`): a window raises the limit to at most
  /// `max(n + 1, n / min_utilisation)`, n the most calls out at any grant of its samples. In [0, 1]; 0
  /// disables it.
  double min_utilisation = 0.85;
  /// Slow start (TCP's, RFC 5681), from `initial_limit` up: until the first failure, each success adds one
  /// call, so the limit doubles per round trip, within the growth guard; the first failure (of a call that
  /// started after the latest decrease) cuts to `backoff x` the calls out at its grant (at most the limit)
  /// and hands the limit to the controller without a bump, as a PID switched from manual to automatic: the
  /// integral takes the limit, so that a healthy window then raises it by one integral step. The
  /// controller alone moves the limit by about one call per window, so from 4 calls it took dozens of
  /// windows to reach a capacity of 40. false: the controller from the start.
  bool slow_start = true;
  /// true: while latency is judged, a congestion outcome counts only when failures come faster than the rate
  /// learned so far (`detail::failure_baseline`, at least 15 %): 1-5 % of calls failing at random, whatever
  /// the limit, is not congestion, and such a failure is no sample at all. false: every one counts as a failed call.
  /// With the latency signal off (`latency_tolerance`) failures are the only signal and every one counts: a limit
  /// held back only by refusals past a hard cap would otherwise grow until 16 of 50 calls were refused.
  bool learn_failure_rate = true;
};

/// PID control of the limit from the failure rate, once per window (`window`, at least a round trip of
/// samples; early once its error is sure to be negative), after a slow start (`slow_start`):
///
///     error    = target_failure_rate - failures / samples      (positive: room to go faster)
///     integral = clamp(integral + error, -integral_limit, integral_limit)
///     limit    = clamp(initial_limit + kp x error + ki x integral + kd x (error - previous error))
///
/// Anti-windup is threefold: the clamp above; back-calculation at the bounds: a window whose output is
/// pinned in the direction of its error, at the floor or ceiling or at the growth guard's ceiling, moves
/// the integral only as far as the bound, so a long stay at a bound does not have to be unwound before the
/// limit can move the other way (without the guard's part, a long quiet spell winds the integral up, and
/// the limit climbs past the dependency's hard limit when the demand returns); and back-calculation at
/// every decrease: the integral takes the limit applied (at most `backoff x` the limit, see `backoff`), so
/// that the next healthy window climbs one integral step from there (ki x target_failure_rate, a call at
/// the defaults) instead of undoing the cut with the proportional term's swing. The window after a
/// decrease has no derivative term: its change of error is the cut's own effect, not a trend of the
/// dependency (differentiated, it threw the limit kd x 0.95 calls back up, past the capacity).
///
/// A textbook PID output has no operating point (its output at zero error is zero, i.e. the floor);
/// rein uses `initial_limit` as the bias so that the integral term carries only the learned offset.
/// Failures are congestion outcomes and slow successes (`latency_tolerance`, `latency_target`); a call that
/// started before the latest decrease is not counted (it reports on the limit before it: at most one
/// decrease per round trip, RFC 5681); `ignored` is not counted.
///
/// @tparam Clock only names the `time_point` in samples; windows are counted in samples, not time.
template <class Clock = std::chrono::steady_clock>
class basic_pid {
 public:
  /// The clock that times the rule and the deadlines.
  using clock_type = Clock;
  /// The options type, as the constructor takes them.
  using options = pid_options;
  /// What one completed call reports: `sample<Clock>`.
  using sample_type = basic_sample<Clock>;
  template <class OtherClock>
  /// The same algorithm on clock `C`, with the same options type.
  using rebind_clock = basic_pid<OtherClock>;

  /// @throws std::invalid_argument naming the field and value if `o` is invalid.
  explicit basic_pid(const options& o = {})
      : options_{validated(o)}, limit_{o.min_limit, o.initial_limit, o.max_limit}, slow_start_{o.slow_start} {}

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
  /// The accumulated error (unitless: failure-rate points summed over windows).
  double integral() const noexcept { return integral_; }
  /// True while in slow start (see `pid_options::slow_start`).
  bool in_slow_start() const noexcept { return slow_start_; }

  /// Replaces the options at run time, validated as the constructor validates them (nothing changes on a
  /// throw). The limit learned so far is kept, moved into the new [min_limit, max_limit]; `slow_start` false
  /// ends slow start (true does not restart it). The window being filled carries on and closes once it
  /// holds the new `window` samples and a round trip of them (at the next sample if it already holds as
  /// many), or early as `window` says; the integral is kept, within the new `integral_limit`;
  /// `initial_limit` is the controller's bias (its output at zero error), so a new one takes effect at the
  /// next window.
  /// @throws std::invalid_argument naming the field and value if `o` is invalid.
  void set_options(const options& o) {
    options_ = validated(o);
    limit_.rebound(o.min_limit, o.max_limit);
    if (!o.slow_start) slow_start_ = false;
    integral_ = clamp(integral_, -o.integral_limit, o.integral_limit);
  }

  /// Applies one completed call. With a work hint (`basic_sample::work`) latency is judged per unit of work.
  /// @throws std::invalid_argument if the sample's work hint is negative, NaN or infinite.
  void on_sample(const sample_type& s) {
    // With the latency signal off, failures are the only signal: every one counts.
    const bool learn = options_.learn_failure_rate && options_.latency_tolerance.has_value();
    if (s.result == outcome::ignored || !signals_.counts(s, learn)) return;
    const bool failure = failed(s);
    if (gate_.stale(s.now, s.latency)) return;
    if (slow_start_) {
      if (failure)
        end_slow_start(s);
      else
        limit_.set(detail::guarded_growth(limit_.value(), limit_.value() + 1.0, s.in_flight, options_.min_utilisation));
      return;
    }
    ++samples_;
    if (s.in_flight > window_in_flight_) window_in_flight_ = s.in_flight;
    if (failure) {
      ++failures_;
      estimate_capacity(s);
    }
    // A window holds `window` samples and at least a round trip of them (as many as the limit admits), so
    // that the integral's step per round trip does not grow with the limit; it closes early once its verdict
    // is known: more failures than the target allows in `window` samples make its error negative whatever
    // the samples still to come, and waiting for them let the limit sit above a capacity that dropped for
    // many round trips at a small limit. The rate is then that of the samples so far.
    const bool decided =
        static_cast<double>(failures_) > options_.target_failure_rate * static_cast<double>(options_.window);
    if (samples_ < std::max(options_.window, admitted(limit_.value())) && !decided) return;
    const double rate = static_cast<double>(failures_) / static_cast<double>(samples_);
    const std::size_t in_flight = window_in_flight_;
    const double estimate = window_estimate_;
    samples_ = failures_ = window_in_flight_ = 0;
    window_estimate_ = 0.0;
    control(options_.target_failure_rate - rate, in_flight, estimate, s);
  }

 private:
  /// A congestion outcome, or a success slower than the tolerance allows or than the target.
  bool failed(const sample_type& s) {
    if (s.result == outcome::congestion) return true;
    judged_ = signals_.judged(s.latency, s.work).value_or(std::chrono::nanoseconds::zero());  // 0: no work
    const bool slow = options_.latency_tolerance && slow_against_baseline(s);
    return slow || (options_.latency_target && s.latency > *options_.latency_target);
  }

  /// Judges a success against the fastest of the last 200 unqueued ones (`detail::allowed_latency`). A slow
  /// success joins them only if it was granted at the floor, where the limit can do no more (as
  /// `tuned_aimd`'s baseline): while the limit sits above a capacity that dropped, every call queues, and
  /// a window of queued calls would soon make their latency the fastest seen, and the queue normal.
  bool slow_against_baseline(const sample_type& s) {
    if (judged_ <= std::chrono::nanoseconds::zero()) return false;  // a clock too coarse, or no work: says nothing
    const auto latency = judged_.count();
    const double allowed = detail::allowed_latency(static_cast<double>(fastest_.value()), *options_.latency_tolerance,
                                                   signals_.floor(options_.noise_floor, s.work));
    const bool slow = baseline_known_ && static_cast<double>(latency) > allowed;
    if (!slow || static_cast<double>(s.in_flight) <= limit_.min()) {
      fastest_.push(latency);
      baseline_known_ = true;
    }
    return slow;
  }

  // The first failure: the cut, and the hand-over to the controller at the limit it leaves.
  void end_slow_start(const sample_type& s) noexcept {
    slow_start_ = false;
    const double n = std::min(static_cast<double>(s.in_flight), limit_.value());
    decrease_to(std::min(limit_.value(), n * options_.backoff), s);
    previous_error_ = 0.0;
  }

  // A decrease (at most one per round trip: the gate) and its back-calculation: the integral takes the limit
  // applied, so that a healthy window (error = target) after it outputs that limit plus one integral step
  // (ki x target), as every healthy window. From the limit the controller wished for (below the bound of
  // the cut), or with the proportional term's swing from this window's error to a healthy one's (kp x the
  // difference), the first healthy window undid the cut and climbed back over the capacity it had found:
  // a limit cycle, every other window slow. A PID handed a limit from outside (slow start, a cut bound)
  // takes it without a bump in the same way.
  void decrease_to(double next, const sample_type& s) noexcept {
    gate_.decreased(s.now);
    after_decrease_ = true;
    limit_.set(next);  // and at least the floor
    if (options_.ki > 0.0)
      integral_ = clamp((limit_.value() - options_.initial_limit - options_.kp * options_.target_failure_rate) /
                            options_.ki,
                        -options_.integral_limit, options_.integral_limit);
  }

  // TCP Vegas' queue estimate, as `tuned_aimd` sizes its cut: a slow success granted with n calls out that
  // took `latency` against the baseline queued behind `floor(latency / baseline - 1)` calls, so about n
  // minus that many were within the capacity. The window keeps the highest estimate of its slow calls
  // (jitter only ever makes a call look more queued than it was).
  void estimate_capacity(const sample_type& s) noexcept {
    if (s.result != outcome::success || !baseline_known_ || judged_.count() <= 0) return;  // no work: no queue to read
    const double base = static_cast<double>(fastest_.value());
    const double queued = std::floor(static_cast<double>(judged_.count()) / base - 1.0);
    const double estimate = static_cast<double>(s.in_flight) - queued;
    if (estimate > window_estimate_) window_estimate_ = estimate;
  }

  void control(double error, std::size_t in_flight, double estimate, const sample_type& s) noexcept {
    // The window after a decrease ran at a new limit: the change in error from the window before is the
    // cut's own effect, not a trend of the dependency, and differentiating it kicked the limit back up by
    // kd x 0.95 calls, past the capacity it had just found. No derivative across a decrease.
    const double derivative = after_decrease_ ? 0.0 : error - previous_error_;
    after_decrease_ = false;
    previous_error_ = error;
    const double previous_integral = integral_;
    integral_ = clamp(integral_ + error, -options_.integral_limit, options_.integral_limit);
    const double current = limit_.value();
    // Where the output is pinned: the ceiling and the growth guard above, the floor below.
    const double highest =
        std::min(limit_.max(), std::max(current, detail::tested_ceiling(in_flight, options_.min_utilisation)));
    double output = output_for(error, derivative);
    const bool pinned = (output > highest && error > 0.0) || (output < limit_.min() && error < 0.0);
    if (pinned && options_.ki > 0.0) {
      // The integral moves only as far as the bound (back-calculation), never past it and never back.
      // Keeping it where it was (conditional integration alone) froze a limit whose output without this
      // window's integration was below the bound: the guard's ceiling rises with the calls out, but the
      // limit never reached it.
      const double bound = output > highest ? highest : limit_.min();
      const double at_bound = integral_ + (bound - output) / options_.ki;
      integral_ = output > highest ? std::clamp(at_bound, previous_integral, integral_)
                                   : std::clamp(at_bound, integral_, previous_integral);
      // The bound itself where the integral reached it: recomputed, the output can round to just below a
      // whole call, which admits one call fewer and is never tested above (a limit stuck at 3.999...).
      output = integral_ == at_bound ? bound : output_for(error, derivative);
    } else if (pinned) {
      integral_ = previous_integral;
      output = output_for(error, derivative);
    }
    if (output >= current) {
      limit_.set(std::min(output, highest));
      return;
    }
    // The deepest cut: `backoff x` the limit, or where the window's queue estimate puts the capacity if that
    // is lower, down to `backoff^2 x` the limit (two windows' cuts in one round trip). And at least to the
    // estimate: a window that closed at its second failure has a small failure rate, and the controller's
    // output little below the limit, however deep the queue its slow calls report.
    double lowest = current * options_.backoff;
    if (estimate > 0.0 && estimate < lowest) lowest = std::max(estimate, lowest * options_.backoff);
    decrease_to(std::max(estimate > 0.0 ? std::min(output, estimate) : output, lowest), s);
  }

  double output_for(double error, double derivative) const noexcept {
    return options_.initial_limit + options_.kp * error + options_.ki * integral_ + options_.kd * derivative;
  }

  static double clamp(double v, double lo, double hi) noexcept { return v < lo ? lo : (v > hi ? hi : v); }

  static const options& validated(const options& o) {
    constexpr auto type = "pid";
    detail::check_limits(type, o.min_limit, o.initial_limit, o.max_limit);
    if (o.window < 1) detail::invalid_option(type, "window", ">= 1", o.window);
    if (!detail::finite(o.target_failure_rate) || o.target_failure_rate < 0.0 || o.target_failure_rate >= 1.0)
      detail::invalid_option(type, "target_failure_rate", "in [0, 1)", o.target_failure_rate);
    if (!detail::finite(o.kp) || o.kp < 0.0) detail::invalid_option(type, "kp", ">= 0 and finite", o.kp);
    if (!detail::finite(o.ki) || o.ki < 0.0) detail::invalid_option(type, "ki", ">= 0 and finite", o.ki);
    if (!detail::finite(o.kd) || o.kd < 0.0) detail::invalid_option(type, "kd", ">= 0 and finite", o.kd);
    detail::check_positive(type, "integral_limit", o.integral_limit);
    if (o.latency_target) detail::check_positive(type, "latency_target", *o.latency_target);
    detail::relative_latency::check(type, o.latency_tolerance, o.noise_floor);
    detail::check_open_unit(type, "backoff", o.backoff);
    if (!detail::finite(o.min_utilisation) || o.min_utilisation < 0.0 || o.min_utilisation > 1.0)
      detail::invalid_option(type, "min_utilisation", "in [0, 1]", o.min_utilisation);
    return o;
  }

  options options_;
  detail::bounded_limit limit_;
  detail::sample_signals signals_{};
  std::chrono::nanoseconds judged_{};  // the latest success's latency as judged (per unit of work)
  std::size_t samples_ = 0;
  std::size_t failures_ = 0;
  std::size_t window_in_flight_ = 0;  // the most calls out at any grant of the window's samples
  double window_estimate_ = 0.0;      // the highest capacity estimate of the window's slow calls (0: none)
  detail::round_trip_gate<typename Clock::time_point> gate_{};
  double integral_ = 0.0;
  double previous_error_ = 0.0;
  bool slow_start_;
  bool after_decrease_ = false;  // the next window is the first after a decrease (no derivative)
  detail::sliding_minimum fastest_{200};  // of the unqueued successes (see slow_against_baseline)
  bool baseline_known_ = false;
};

/// `basic_pid` on `std::chrono::steady_clock`.
using pid = basic_pid<>;

}  // namespace rein::algo
