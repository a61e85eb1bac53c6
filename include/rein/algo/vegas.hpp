// TCP Vegas applied to a concurrency limit (Netflix concurrency-limits' VegasLimit).
#pragma once

#include <rein/algo/limit_algorithm.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>

namespace rein::algo {

/// Options of `basic_vegas`. Defaults are Netflix VegasLimit's, except the floor and ceiling (Netflix: 1 and
/// 1000) and the probe jitter, which rein draws from a seeded generator so that a run is repeatable.
///
/// The thresholds scale with `log10(limit)`, written L below: `L = max(1, floor(log10(limit)))`, so 1 for any
/// limit below 100, 2 below 1000, and so on (Netflix's Log10RootFunction, which switches to sqrt at 1000;
/// rein keeps log10).
struct vegas_options {
  /// Starting limit, in calls; in [min_limit, max_limit]. Netflix: 20, which bursts 20 calls into a
  /// dependency that may fail past 4; rein starts at 4 and lets the fast growth below the threshold find more.
  double initial_limit = 4.0;
  /// Floor, in calls: a whole number >= 1.
  double min_limit = 1.0;
  /// Ceiling, in calls: a whole number in [min_limit, 1e9] (`max_limit_ceiling`).
  double max_limit = 1000.0;
  /// Estimated queue at or below `threshold_factor x L` calls: grow fast, by `beta_factor x L`. >= 0.
  double threshold_factor = 1.0;
  /// Estimated queue below `alpha_factor x L` calls (and above the threshold): grow by `step_factor x L`.
  /// >= threshold_factor. Classic TCP Vegas uses alpha 2-3.
  double alpha_factor = 3.0;
  /// Estimated queue above `beta_factor x L` calls: shrink by `step_factor x L`. >= alpha_factor. Classic
  /// TCP Vegas uses beta 4-6. Between alpha and beta the limit holds still.
  double beta_factor = 6.0;
  /// The small-limit rule: the thresholds may not exceed their share of the limit, beta `queue_share x
  /// limit`, alpha and threshold in proportion (`queue_share x alpha_factor / beta_factor x limit`, ...),
  /// compared with the unrounded estimate `1 - no_load / latency` of the share queued. Netflix's thresholds
  /// are whole calls (beta 6 below a limit of 100), so a limit of 8 holds still with 6 of its calls queued,
  /// past the hard limit of a dependency of capacity 5 that fails beyond 7; above a limit of
  /// `beta_factor / queue_share` (14 by default) Netflix's thresholds are the smaller and rule as before.
  /// 3/7, in (0, 1): a share of 3/7 queued is a latency of 1 / (1 - 3/7) = 1.75 x the no-load latency,
  /// `aimd_options::latency_tolerance`'s bound (+-20 % jitter stays within 1.5 x the fastest call, a call
  /// queued behind another one takes 2 x).
  double queue_share = 3.0 / 7.0;
  /// Size of one linear step, in units of L; > 0. A congestion outcome also shrinks by one step.
  double step_factor = 1.0;
  /// Weight of the new limit: `limit = limit x (1 - s) + new x s`; in (0, 1]. Netflix: 1 (no smoothing).
  double smoothing = 1.0;
  /// Every `probe_multiplier x limit x jitter` samples (jitter uniform in [0.5, 1)) the no-load latency is
  /// probed, so that a baseline which is no longer reachable is forgotten; >= 1. Netflix adopts the next
  /// sample; rein adopts the fastest sample of the next round trip, and only tentatively when it is slower
  /// than the baseline (see `basic_vegas`).
  double probe_multiplier = 30.0;
  /// Seed of the probe jitter. Give limiters in different processes different seeds, or they probe in step.
  std::uint64_t probe_seed = 0;
  /// The growth guard (`detail::tested_ceiling`): a success granted with n calls out raises the limit to at
  /// most `max(n + 1, n / min_utilisation)` (Netflix instead ignores samples below `limit / 2`, which lets
  /// the limit double the demand untested). In [0, 1]; 0 disables it.
  double min_utilisation = 0.85;
};

/// Vegas: estimate the queue inside the dependency from how far the latency is above the no-load latency,
/// and keep it between alpha and beta calls.
///
///     queue = ceil(limit x (1 - no_load_latency / latency))
///     queue <= threshold: limit += beta;   queue < alpha: limit += step;   queue > beta: limit -= step
///
/// where each threshold also holds as a share of the limit (`queue_share`): `1 - no_load / latency` may not
/// exceed `queue_share x threshold_factor / beta_factor` to grow by beta, `queue_share x alpha_factor /
/// beta_factor` to grow by a step, and shrinks past `queue_share`.
///
/// Departures from Netflix's VegasLimit, which applies the rule to every sample:
///
/// - Once per round trip, from its fastest success (Linux `tcp_vegas.c`: `minRTT` of the last round trip
///   against `baseRTT`, cwnd adjusted once per RTT; Brakmo and Peterson compute Diff once per RTT). A round
///   trip ends with the first success that started after it began; that success ends it, the rule is applied
///   to the fastest success of the round trip, and a new one begins. One sample's +-20 % noise against the
///   fastest of many reads as up to a third of the limit queued, which Netflix's beta of 6 cuts at limits
///   14-99; the fastest of a round trip does not. At most one change per round trip follows.
/// - The growth guard takes the calls out when the fastest success was granted: that call alone showed no
///   queue, and a call granted while the dependency had just drained says nothing about the limit.
/// - The probe adopts the fastest success of the round trip after it is due instead of the next sample
///   (a sample taken while calls queue is a queued latency). If that is slower than the baseline, the old
///   baseline is kept aside and the new one is tentative: while it is, the limit grows by a step at most,
///   never by beta; a round trip that then reads more than the threshold queued shows the rise was our own
///   queue, and the old baseline comes back; two round trips in a row that read no queue, each with more
///   calls out than the one before (the first: than the probe's fastest success), confirm it (the dependency
///   is slower: more calls, no slower). One such round trip is not enough: a capacity that grew by one call
///   between the probe and the round trip reads the same as a slower dependency. A sample faster than the
///   tentative baseline (and still slower than the old one) becomes the tentative baseline, with its own calls
///   out to beat. Netflix adopts the next
///   sample whatever it is, and a probe taken while calls queue reads the queue as no-load and grows by beta
///   per sample past the dependency's hard limit.
///
/// The no-load latency is the minimum latency seen since the last probe; a sample that sets a new minimum
/// changes nothing else and takes no part in the round trip. A congestion outcome shrinks the limit by one
/// step (Netflix's `didDrop`), after taking part in the no-load estimate as Netflix does, and starts a new
/// round trip; like every decrease it is gated to one per round trip. `ignored` changes nothing.
/// Source: Brakmo and Peterson, "TCP Vegas" (1995); Linux net/ipv4/tcp_vegas.c; Netflix concurrency-limits'
/// VegasLimit.
///
/// @tparam Clock only names the `time_point` in samples; Vegas counts samples, not time.
template <class Clock = std::chrono::steady_clock>
class basic_vegas {
 public:
  /// The clock that times the rule and the deadlines.
  using clock_type = Clock;
  /// The options type, as the constructor takes them.
  using options = vegas_options;
  /// What one completed call reports: `sample<Clock>`.
  using sample_type = basic_sample<Clock>;
  template <class OtherClock>
  /// The same algorithm on clock `C`, with the same options type.
  using rebind_clock = basic_vegas<OtherClock>;

  /// @throws std::invalid_argument naming the field and value if `o` is invalid.
  explicit basic_vegas(const options& o = {})
      : options_{validated(o)}, limit_{o.min_limit, o.initial_limit, o.max_limit}, random_{o.probe_seed} {
    jitter_ = next_jitter();
  }

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
  /// The current no-load latency estimate (zero before the first sample).
  std::chrono::nanoseconds no_load_latency() const noexcept { return no_load_; }
  /// Samples since the last probe.
  std::uint64_t probe_count() const noexcept { return probe_count_; }
  /// True while a probe's no-load latency is tentative (not yet confirmed or rejected).
  bool probe_tentative() const noexcept { return tentative_; }

  /// Replaces the options at run time, validated as the constructor validates them (nothing changes on a
  /// throw). The limit learned so far is kept, moved into the new [min_limit, max_limit] (`initial_limit` is
  /// checked, not used). The no-load latency and the probe countdown carry on; a new `probe_seed` reseeds the
  /// probe jitter from the next probe.
  /// @throws std::invalid_argument naming the field and value if `o` is invalid.
  void set_options(const options& o) {
    validated(o);
    if (o.probe_seed != options_.probe_seed) random_ = o.probe_seed;
    options_ = o;
    limit_.rebound(o.min_limit, o.max_limit);
  }

  /// Applies one completed call.
  void on_sample(const sample_type& s) noexcept {
    if (s.result == outcome::ignored) return;
    const auto latency = s.latency > std::chrono::nanoseconds::zero() ? s.latency : std::chrono::nanoseconds{1};
    ++probe_count_;
    if (jitter_ * options_.probe_multiplier * limit_.value() <= static_cast<double>(probe_count_)) {
      jitter_ = next_jitter();
      probe_count_ = 0;
      probe_pending_ = true;
    }
    if (no_load_ == std::chrono::nanoseconds::zero() || latency < no_load_) {
      no_load_ = latency;
      if (latency <= previous_no_load_) tentative_ = false;
      // A faster tentative baseline was seen with its own calls out: only more calls than that can confirm it.
      if (tentative_) probe_in_flight_ = s.in_flight, probe_rises_ = 0;
      if (s.result != outcome::congestion) {
        if (round_start_ == time_point::min()) round_start_ = s.now;
        return;
      }
    }
    if (s.result == outcome::congestion) {
      congested(s);
      return;
    }
    if (round_start_ == time_point::min()) round_start_ = s.now;
    if (latency < round_min_) {
      round_min_ = latency;
      round_in_flight_ = s.in_flight;
    }
    // The round trip ends with the first call that started after it began: that call saw its start.
    if (s.now - s.latency < round_start_) return;
    const auto fastest = round_min_;
    const auto tested = round_in_flight_;
    const bool probe = probing_;
    start_round(s.now);
    if (probe) {
      probing_ = false;
      if (fastest > no_load_) {
        tentative_ = true;
        probe_rises_ = 0;
        previous_no_load_ = no_load_;
        probe_in_flight_ = tested;
        no_load_ = fastest;
      }
      return;
    }
    if (probe_pending_) {
      probe_pending_ = false;
      probing_ = true;
    }
    update(fastest, tested, s);
  }

 private:
  static double log10_root(double limit) noexcept {
    const double l = std::floor(std::log10(limit));
    return l < 1.0 ? 1.0 : l;
  }

  using time_point = typename Clock::time_point;

  void start_round(time_point now) noexcept {
    round_start_ = now;
    round_min_ = std::chrono::nanoseconds::max();
    round_in_flight_ = 0;
  }

  void congested(const sample_type& s) noexcept {
    const double current = limit_.value();
    const double step = options_.step_factor * log10_root(std::floor(current));
    set(current, current - step, s.in_flight, s);
  }

  void update(std::chrono::nanoseconds latency, std::size_t in_flight, const sample_type& s) noexcept {
    const double current = limit_.value();
    const double l = log10_root(std::floor(current));
    const double step = options_.step_factor * l;
    double next = current;
    const double f = options_.queue_share;  // the small-limit rule: at most this share of the limit queued
    double share = 1.0 - static_cast<double>(no_load_.count()) / static_cast<double>(latency.count());
    double queue = std::ceil(current * share);
    const bool unqueued =
        queue <= options_.threshold_factor * l && share <= f * options_.threshold_factor / options_.beta_factor;
    bool confirmed = true;
    if (tentative_) {
      if (!unqueued) {
        // The probe's baseline queues behind one more call: it was our own queue, not a slower dependency.
        tentative_ = false;
        no_load_ = previous_no_load_;
        share = 1.0 - static_cast<double>(no_load_.count()) / static_cast<double>(latency.count());
        queue = std::ceil(current * share);
      } else if (in_flight > probe_in_flight_ && ++probe_rises_ == 2) {
        // Two round trips in a row, each with more calls out than the one before, and no slower: the
        // dependency is slower. One is not enough: a capacity that grew by one call between them reads the
        // same.
        tentative_ = false;
      } else {
        if (in_flight > probe_in_flight_) probe_in_flight_ = in_flight;
        else probe_rises_ = 0;
        confirmed = false;
      }
    }
    if (queue <= options_.threshold_factor * l && share <= f * options_.threshold_factor / options_.beta_factor)
      next = current + (confirmed ? options_.beta_factor * l : step);
    else if (queue < options_.alpha_factor * l && share < f * options_.alpha_factor / options_.beta_factor)
      next = current + step;
    else if (queue > options_.beta_factor * l || share > f)
      next = current - step;
    else
      return;
    set(current, next, in_flight, s);
  }

  void set(double current, double next, std::size_t in_flight, const sample_type& s) noexcept {
    if (next < limit_.min()) next = limit_.min();
    if (next > limit_.max()) next = limit_.max();
    next = (1.0 - options_.smoothing) * current + options_.smoothing * next;
    if (next < current) {
      // At most one decrease per round trip: a call that started before the latest one reports on the old limit.
      if (gate_.stale(s.now, s.latency)) return;
      gate_.decreased(s.now);
      limit_.set(next);
      start_round(s.now);
    } else {
      limit_.set(detail::guarded_growth(current, next, in_flight, options_.min_utilisation));
    }
  }

  /// splitmix64 (Steele, Lea and Flood, 2014): a tiny, seedable generator, so probes are jittered yet
  /// repeatable.
  double next_jitter() noexcept {
    random_ += 0x9e3779b97f4a7c15ULL;
    std::uint64_t z = random_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return 0.5 + 0.5 * static_cast<double>(z >> 11) * 0x1.0p-53;
  }

  static const options& validated(const options& o) {
    constexpr auto type = "vegas";
    detail::check_limits(type, o.min_limit, o.initial_limit, o.max_limit);
    if (!detail::finite(o.threshold_factor) || o.threshold_factor < 0.0)
      detail::invalid_option(type, "threshold_factor", ">= 0 and finite", o.threshold_factor);
    if (!detail::finite(o.alpha_factor) || o.alpha_factor < o.threshold_factor)
      detail::invalid_option(type, "alpha_factor", ">= threshold_factor and finite", o.alpha_factor);
    if (!detail::finite(o.beta_factor) || o.beta_factor < o.alpha_factor)
      detail::invalid_option(type, "beta_factor", ">= alpha_factor and finite", o.beta_factor);
    detail::check_open_unit(type, "queue_share", o.queue_share);
    detail::check_positive(type, "step_factor", o.step_factor);
    if (!detail::finite(o.smoothing) || o.smoothing <= 0.0 || o.smoothing > 1.0)
      detail::invalid_option(type, "smoothing", "in (0, 1]", o.smoothing);
    if (!detail::finite(o.probe_multiplier) || o.probe_multiplier < 1.0)
      detail::invalid_option(type, "probe_multiplier", ">= 1 and finite", o.probe_multiplier);
    if (!detail::finite(o.min_utilisation) || o.min_utilisation < 0.0 || o.min_utilisation > 1.0)
      detail::invalid_option(type, "min_utilisation", "in [0, 1]", o.min_utilisation);
    return o;
  }

  options options_;
  detail::bounded_limit limit_;
  std::uint64_t random_;
  double jitter_ = 1.0;
  std::uint64_t probe_count_ = 0;
  std::chrono::nanoseconds no_load_{0};
  detail::round_trip_gate<typename Clock::time_point> gate_{};
  time_point round_start_ = time_point::min();
  std::chrono::nanoseconds round_min_ = std::chrono::nanoseconds::max();
  std::size_t round_in_flight_ = 0;
  bool probe_pending_ = false;
  bool probing_ = false;
  bool tentative_ = false;
  std::chrono::nanoseconds previous_no_load_{0};
  std::size_t probe_in_flight_ = 0;
  int probe_rises_ = 0;  // round trips in a row whose fastest success had more calls out, unqueued
};

/// `basic_vegas` on `std::chrono::steady_clock`.
using vegas = basic_vegas<>;

}  // namespace rein::algo
