// Batch-wise adaptive concurrency: judge a window of samples by its failure rate.
#pragma once

#include <rein/algo/limit_algorithm.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>

namespace rein::algo {

/// Options of `basic_windowed_aimd`. Defaults: batches of 20, step 1, threshold 15 %, backoff 0.8, with rein's
/// usual floor 1 and ceiling 64 and a starting point of 4 rather than the floor, and rein's rules: slow
/// successes count as failures (`latency_tolerance`), the growth guard, one change per round trip and a
/// plateau at a level found again. Closest to the classic rule (grow by 3, halve, count failed calls only):
/// step 3, backoff 0.5, `latency_tolerance` unset, `min_utilisation` 0 and `plateau_windows` 0.
struct windowed_aimd_options {
  /// Starting limit, in calls; in [min_limit, max_limit].
  double initial_limit = 4.0;
  /// Floor, in calls: a whole number >= 1.
  double min_limit = 1.0;
  /// Ceiling, in calls: a whole number in [min_limit, 1e9] (`max_limit_ceiling`).
  double max_limit = 64.0;
  /// Samples per window (non-ignored outcomes); >= 1. The limit changes once per window. A window of as many
  /// samples as the limit admits closes early if none failed (one step per round trip, as TCP).
  std::size_t window = 20;
  /// A window whose failure rate (failures / window) is at or below this grows; above it shrinks. In [0, 1).
  /// Only failed calls have this allowance: a window with a slow success shrinks at once.
  double failure_threshold = 0.15;
  /// Growth per healthy window, in calls; > 0. 1, as TCP's congestion avoidance adds one segment per round
  /// trip (RFC 5681): a step past the capacity then puts one call over it, which queues behind one other
  /// call; a step of 3 put up to three over it, and a call behind two or three others takes three or four
  /// times as long, for a whole window before the slow calls return.
  double step = 1.0;
  /// Factor applied per unhealthy window, the shallowest cut; in (0, 1). The limit keeps its fraction (no
  /// integer division). A slow success can cut deeper, to the level its queue shows (see the class). 0.8
  /// (as `aimd_options::backoff`), not the usual 0.5: now that slow calls count, a window turns unhealthy
  /// as soon as the limit is a call over the capacity, and halving from there leaves the limit near half
  /// the capacity; one cut of 0.8 leaves it above 0.8 x the capacity.
  double backoff = 0.8;
  /// Optional: a success slower than this (strictly) counts as a failure; > 0 when set.
  std::optional<std::chrono::nanoseconds> latency_target{};
  /// A success slower than `detail::allowed_latency(fastest, latency_tolerance, noise_floor)` (strictly),
  /// `fastest` the fastest of the last 200 successes, counts as a failure: a target relative to what the
  /// dependency has shown it can do, so it needs no guess. Without it only failed calls count, so the limit
  /// learns nothing until it is past the dependency's hard limit, and a window with up to 15 % of its calls
  /// failing still grows. 1.75 (as `aimd_options::latency_tolerance`): +-20 % jitter puts the slowest
  /// unqueued call at 1.5 x the fastest, a call queued behind another takes twice as long. Finite and > 1
  /// when set; unset (`std::nullopt`, the textbook rule): only `congestion` outcomes and `latency_target`
  /// count, so the limit grows until calls fail.
  std::optional<double> latency_tolerance = 1.75;
  /// Jitter that is not proportional to the latency (scheduling delays on a fast path), in nanoseconds: a
  /// success within `fastest + noise_floor` is never slow (`detail::allowed_latency`). >= 0; 0: the
  /// tolerance alone. 0.5 ms, as `aimd_options::noise_floor` and `tuned_aimd_options::noise_floor`: on a
  /// loopback call of a few hundred microseconds a scheduling delay is many times the fastest call but no
  /// queueing, and the floor stays below the 1 ms that a call queued behind one other adds at the
  /// generated family's shortest base latency (`examples/adaptive_family`).
  std::chrono::nanoseconds noise_floor = std::chrono::microseconds{500};
  /// The growth guard (`detail::tested_ceiling`): a window raises the limit to at most
  /// `max(n + 1, n / min_utilisation)`, n the most calls out at any grant of its samples. In [0, 1]; 0
  /// disables it.
  double min_utilisation = 0.85;
  /// The longest wait at a level found again, in windows; >= 0 and finite, 0: no wait. After a cut, growth
  /// stops at the level the cut found (the whole calls its slow call showed, at least where the cut left
  /// the limit); after a cut that found the level the cut before it found (within a call), it waits there
  /// `2^k - 1` healthy windows, k the cuts in a row before this one that found it (1, 3, 7, ...), at most
  /// this many, before it steps past: a level found again and again is the capacity, and each probe past it
  /// costs a window of calls over it. CUBIC's plateau around the window of the last loss (RFC 8312); 31, as
  /// `aimd_options::plateau_rounds` (on the generated family 15 does a little worse, 0 worse still).
  double plateau_windows = 31.0;
  /// Slow start (TCP's, RFC 5681, as `tuned_aimd_options::slow_start`): until the first slow or failed call
  /// or the first cut, each success that is not slow adds one call, within the growth guard, so the limit
  /// grows by up to `1 / min_utilisation` per round trip instead of a step per window; windows judge as
  /// usual, and add their step only after slow start. false (the default): windows alone. On the generated
  /// family (`examples/adaptive_family`) it reaches the capacity sooner (worst makespan over the oracle's
  /// 1.68 instead of 1.77, after a recovery 1.40 instead of 1.56), and so meets a later deep drop with more
  /// calls to queue: the worst share of calls slower than twice their base rises from 4.3 % to 6.2 %, and
  /// the share is over 5 % in 10 of 1000 scenarios instead of none.
  bool slow_start = false;
  /// true: while latency is judged, a congestion outcome counts only when failures come faster than the rate
  /// learned so far (`detail::failure_baseline`, at least 15 %): 1-5 % of calls failing at random, whatever
  /// the limit, is not congestion, and such a failure is no sample at all. false: every one counts as a failed call.
  /// With the latency signal off (`latency_tolerance`) failures are the only signal and every one counts: a limit
  /// held back only by refusals past a hard cap would otherwise grow until 16 of 50 calls were refused.
  bool learn_failure_rate = true;
};

/// Windowed AIMD: count failures (congestion outcomes, and successes slower than `latency_target` or than
/// `latency_tolerance` allows) over `window` samples; at the end of each window add `step` if the failure
/// rate is at or below `failure_threshold`, and otherwise multiply by `backoff`.
///
/// - A window closes early, and grows, once it holds a round trip of calls (`floor(limit)` samples) without
///   a failure (TCP's one step per round trip). It closes early, and shrinks, once its failures exceed
///   `failure_threshold x window`, or at its first slow success: a call queued at the limit in force,
///   whereas the threshold is for failed calls, a background that says nothing about the limit.
/// - After a slow success the cut goes down to the level its queue shows, if that is below
///   `limit x backoff` (TCP Vegas' queue estimate: each call queued ahead of it added one fastest latency,
///   so of the n calls out at its grant that many were too many), by at most half.
/// - After a cut, growth stops at the level the cut found, and waits there longer each time a cut finds it
///   again (`plateau_windows`).
/// - A call that started before the latest change of the limit is not counted: at most one decrease per
///   round trip (RFC 5681), and each window judges the limit in force, not the one before it (TCP Vegas'
///   once per round trip). `ignored` samples are not counted at all.
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
  /// Samples and failures counted so far in the current window.
  std::size_t window_samples() const noexcept { return samples_; }
  /// Failures (congestion outcomes and slow successes) among them.
  std::size_t window_failures() const noexcept { return failures_; }
  /// True while in slow start (see `windowed_aimd_options::slow_start`).
  bool in_slow_start() const noexcept { return slow_start_; }

  /// Replaces the options at run time, validated as the constructor validates them (nothing changes on a
  /// throw). The limit learned so far is kept, moved into the new [min_limit, max_limit] (`initial_limit` is
  /// checked, not used). The window being filled carries on and closes once it holds the new `window`
  /// samples (at the next sample if it already holds as many); a wait under way is cut to the new
  /// `plateau_windows`. `slow_start` false ends slow start (true does not restart it).
  /// @throws std::invalid_argument naming the field and value if `o` is invalid.
  void set_options(const options& o) {
    options_ = validated(o);
    limit_.rebound(o.min_limit, o.max_limit);
    if (!o.slow_start) slow_start_ = false;
    if (waiting_ > o.plateau_windows) waiting_ = o.plateau_windows;
  }

  /// Applies one completed call. With a work hint (`basic_sample::work`) latency is judged per unit of work.
  /// @throws std::invalid_argument if the sample's work hint is negative, NaN or infinite.
  void on_sample(const sample_type& s) {
    // With the latency signal off, failures are the only signal: every one counts.
    const bool learn = options_.learn_failure_rate && options_.latency_tolerance.has_value();
    if (s.result == outcome::ignored || !signals_.counts(s, learn)) return;
    const judgement j = judge(s);
    // A call that started before the latest change of the limit reports on the limit before it: it is not
    // counted in the window that judges this one. After a cut, the old limit is already cut (RFC 5681's one
    // reduction per window of data); after a rise, a call granted below the new limit says nothing about it,
    // and a window of them would grow again before the first rise was tried (TCP Vegas judges each
    // window from the segments sent after its last change, as Linux tcp_vegas.c's beg_snd_nxt).
    if (changed_.stale(s.now, s.latency)) return;
    if (slow_start_) {
      if (j == judgement::fine)
        limit_.set(detail::guarded_growth(limit_.value(), limit_.value() + 1.0, s.in_flight, options_.min_utilisation));
      else
        slow_start_ = false;
    }
    ++samples_;
    if (s.in_flight > window_in_flight_) window_in_flight_ = s.in_flight;
    if (j != judgement::fine) ++failures_;
    if (j == judgement::slow) {
      // TCP Vegas' queue estimate, in calls: each call queued ahead of this one added about one fastest
      // latency, so of the n calls out at its grant (at most the limit) that many were too many. The window
      // closes at this call (below), so this is the level it shows.
      const double n = std::min(static_cast<double>(s.in_flight), limit_.value());
      // A call slow by latency_target alone with no latency to judge (no work) shows no queue: one call over.
      const bool known = judged_.count() > 0 && fastest_ > 0.0;
      level_ = n - (known ? std::floor(static_cast<double>(judged_.count()) / fastest_ - 1.0) : 1.0);
      ++slow_;
    }
    // A window closes after `window` samples; as soon as its failures exceed what a healthy one may hold
    // (waiting for the rest would only let the limit that fails them run on); and as soon as it holds a slow
    // success. A slow success is a call queued at the limit in force, which no background rate explains:
    // the threshold is for failed calls, the background of a dependency that fails a little all the time.
    // Waiting for more (a window used to hold, not grow, with up to the threshold's share of them) let the
    // queue run on for the rest of the window, and a limit that the capacity fell below sit there for good.
    const bool unhealthy = slow_ > 0 || static_cast<double>(failures_) >
                                            options_.failure_threshold * static_cast<double>(options_.window);
    // And once it holds a round trip of calls (as many as the limit admits) that all went well: TCP's
    // congestion avoidance grows once per round trip of acknowledged data (RFC 5681), and a window of 20
    // samples at a limit of 2 waited ten round trips to add a call.
    const bool clean_round_trip = failures_ == 0 && samples_ >= admitted(limit_.value());
    if (samples_ < options_.window && !unhealthy && !clean_round_trip) return;
    const std::size_t in_flight = window_in_flight_;
    const std::size_t slow_window = slow_;
    samples_ = failures_ = slow_ = window_in_flight_ = 0;
    const double current = limit_.value();
    if (!unhealthy) {
      double next = current + options_.step;
      const double good = levels_.level();
      if (current < good) {
        next = std::min(next, good);  // a step at a time back to the level the latest cut found, not past it
      } else if (waiting_ > 0.0) {
        waiting_ -= 1.0;  // a window at the level: one of the wait
        next = current;
      }
      if (!slow_start_ && limit_.set(detail::guarded_growth(current, next, in_flight, options_.min_utilisation)))
        changed_.decreased(s.now);
    } else {
      // A cut by `backoff`, and down to the level the slow call shows if that is lower, by at most half
      // (`deepest_cut`): a dependency whose capacity fell far below the limit queues calls so deep that their
      // verdicts take many base latencies to return, and cuts of 0.8 each one such round trip apart took
      // several of those to get there.
      const double cut = current * options_.backoff;
      const bool slow = slow_window > 0;
      changed_.decreased(s.now);
      slow_start_ = false;
      limit_.set(slow ? std::min(cut, std::max(level_, current * deepest_cut)) : cut);
      // The level this cut found: the whole calls the slow call showed, at least where the cut left the
      // limit. Found again (within a call), the next probe past it waits `2^k - 1` windows, k the cuts in
      // a row that found it, at most `plateau_windows`.
      const double found = std::floor(slow ? std::max(level_, limit_.value()) : limit_.value());
      const std::uint64_t repeats = levels_.found(found);
      const double doubling = std::exp2(static_cast<double>(repeats < 64 ? repeats : 64)) - 1.0;
      waiting_ = std::min(doubling, options_.plateau_windows);
    }
  }

 private:
  enum class judgement { fine, failed, slow };

  /// The deepest cut of one window, by the slow calls' queue estimate: TCP's halving (RFC 5681), as
  /// `tuned_aimd_options::backoff`. A stall or an estimate off by noise costs at most half the limit.
  static constexpr double deepest_cut = 0.5;

  /// A congestion outcome fails; a success slower than the target or than the tolerance allows is slow.
  /// Every success is shown to the judge, so that its fastest call is the fastest seen.
  judgement judge(const sample_type& s) {
    if (s.result == outcome::congestion) return judgement::failed;
    bool slow = false;
    const auto judged = signals_.judged(s.latency, s.work);  // nullopt: no work, nothing to judge
    judged_ = judged.value_or(std::chrono::nanoseconds::zero());
    if (judged_ > std::chrono::nanoseconds::zero()) {  // a clock too coarse for the call says nothing
      fastest_window_.push(judged_.count());
      fastest_ = static_cast<double>(fastest_window_.value());
      slow = options_.latency_tolerance &&
             static_cast<double>(judged_.count()) >
                 detail::allowed_latency(fastest_, *options_.latency_tolerance,
                                         signals_.floor(options_.noise_floor, s.work));
    }
    return slow || (options_.latency_target && s.latency > *options_.latency_target) ? judgement::slow
                                                                                     : judgement::fine;
  }

  static const options& validated(const options& o) {
    constexpr auto type = "windowed_aimd";
    detail::check_limits(type, o.min_limit, o.initial_limit, o.max_limit);
    if (o.window < 1) detail::invalid_option(type, "window", ">= 1", o.window);
    if (!detail::finite(o.failure_threshold) || o.failure_threshold < 0.0 || o.failure_threshold >= 1.0)
      detail::invalid_option(type, "failure_threshold", "in [0, 1)", o.failure_threshold);
    detail::check_positive(type, "step", o.step);
    detail::check_open_unit(type, "backoff", o.backoff);
    if (o.latency_target) detail::check_positive(type, "latency_target", *o.latency_target);
    detail::relative_latency::check(type, o.latency_tolerance, o.noise_floor);
    if (!detail::finite(o.min_utilisation) || o.min_utilisation < 0.0 || o.min_utilisation > 1.0)
      detail::invalid_option(type, "min_utilisation", "in [0, 1]", o.min_utilisation);
    if (!detail::finite(o.plateau_windows) || o.plateau_windows < 0.0)
      detail::invalid_option(type, "plateau_windows", ">= 0 and finite", o.plateau_windows);
    return o;
  }

  options options_;
  detail::bounded_limit limit_;
  detail::sample_signals signals_{};
  std::chrono::nanoseconds judged_{};  // the latest success's latency as judged (per unit of work)
  std::size_t samples_ = 0;
  std::size_t failures_ = 0;
  std::size_t slow_ = 0;  // slow successes among the failures
  std::size_t window_in_flight_ = 0;  // the most calls out at any grant of the window's samples
  // The latest change of the limit, up or down (the gate of RFC 5681, applied to every change).
  detail::round_trip_gate<typename Clock::time_point> changed_{};
  // The fastest of the last 200 successes (as `detail::relative_latency`), kept here for the queue estimate.
  detail::sliding_minimum fastest_window_{200};
  double fastest_ = 0.0;
  double level_ = 0.0;  // the level the window's slow call shows, in calls
  detail::level_memory levels_{};  // the level the latest cut found, and how many cuts in a row found it
  double waiting_ = 0.0;           // windows still to wait at that level before probing past it
  bool slow_start_;
};

/// `basic_windowed_aimd` on `std::chrono::steady_clock`.
using windowed_aimd = basic_windowed_aimd<>;

}  // namespace rein::algo
