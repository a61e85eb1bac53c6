// TCP Vegas applied to a concurrency limit (Netflix concurrency-limits' VegasLimit).
#pragma once

#include <rein/algo/limit_algorithm.hpp>

#include <algorithm>
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
  /// Estimated queue at or below `threshold_factor x L` calls: grow fast, by `beta_factor x L`, during slow
  /// start (until the first decrease; Linux `tcp_vegas.c` leaves slow start at the first queue it sees), by
  /// one step after it. >= 0.
  double threshold_factor = 1.0;
  /// Estimated queue below `alpha_factor x L` calls (and above the threshold): grow by `step_factor x L`.
  /// >= threshold_factor. Classic TCP Vegas uses alpha 2-3.
  double alpha_factor = 3.0;
  /// Estimated queue above `beta_factor x L` calls: shrink, by at least `step_factor x L` and as far as the
  /// queue says (see `basic_vegas`). >= alpha_factor. Classic TCP Vegas uses beta 4-6. Between alpha and
  /// beta the limit holds still.
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
  /// The longest wait after a decrease, in round trips; >= 0 and finite, 0: no wait. After a decrease growth
  /// waits `2^(k + 1) - 1` round trips that tested the limit without a queue, k the decreases in a row before
  /// this one that found the same level within a call (1, 3, 7, 15, ...), at most this many. One round trip
  /// at a new level, as Brakmo and Peterson's Vegas holds its window every other round trip so that the
  /// comparison is made at the window it tests; longer at a level found again and again, which is the
  /// capacity, where each step past it queues a call behind another one (`aimd_options::plateau_rounds`'s
  /// rule and default, CUBIC's plateau around the window of the last loss, RFC 8312).
  double plateau_rounds = 31.0;
  /// The growth guard (`detail::tested_ceiling`): a success granted with n calls out raises the limit to at
  /// most `max(n + 1, n / min_utilisation)` (Netflix instead ignores samples below `limit / 2`, which lets
  /// the limit double the demand untested). In [0, 1]; 0 disables it.
  double min_utilisation = 0.85;
  /// false: the latency signal is off. Every round trip reads as no queue, so the limit grows as below the
  /// threshold (by `beta_factor x L` in slow start, then a step per round trip that tested the limit, after
  /// the wait of `plateau_rounds`, within the growth guard), and only congestion outcomes shrink it (a step
  /// each, at most once per round trip): for a dependency that refuses calls past its capacity without
  /// getting slower, or whose latency follows the payload rather than a queue (as
  /// `aimd_options::latency_tolerance` and `tuned_aimd_options::tolerance` switch theirs off). Vegas is a
  /// latency rule, so without it what is left is AIMD by steps of L. true (the default): Vegas.
  bool judge_latency = true;
  /// true: while latency is judged, a congestion outcome counts only when failures come faster than the rate
  /// learned so far (`detail::failure_baseline`, at least 15 %): 1-5 % of calls failing at random, whatever
  /// the limit, is not congestion, and such a failure is no sample at all. false: every one shrinks (Netflix's
  /// rule).
  /// With the latency signal off (`judge_latency`) failures are the only signal and every one counts: a limit
  /// held back only by refusals past a hard cap would otherwise grow until 16 of 50 calls were refused.
  bool learn_failure_rate = true;
};

/// Vegas: estimate the queue inside the dependency from how far the latency is above the no-load latency,
/// and keep it between alpha and beta calls.
///
///     queue = ceil(limit x (1 - no_load_latency / latency))
///     queue <= threshold: limit += beta (slow start) or step;   queue < alpha: limit += step
///     queue > beta: limit = max(limit / 2, min(limit - step, n - floor(latency / no_load_latency - 1)))
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
/// - Slow start, then congestion avoidance (Linux `tcp_vegas.c`, which leaves slow start at the first queue
///   it sees and then moves cwnd by one per RTT): growth by beta only until the first decrease, then by one
///   step per round trip, and only from a round trip that tested the limit (its fastest success was granted
///   with `floor(limit)` calls out; RFC 7661's rule that a window not used is not grown). Netflix grows by
///   beta whenever the queue reads below the threshold, so at a dependency whose latency doubles one call
///   past its capacity the limit jumps beta calls past it every few round trips.
/// - A decrease goes as far as the queue says: n calls out when the success was granted (at most the
///   limit), each call queued ahead of it added one no-load latency, so `floor(latency / no_load - 1)` of
///   them were too many (a single-server queue, as `tuned_aimd` sizes its cut); at least one step, at most
///   half the limit per round trip (TCP's multiplicative decrease, RFC 5681). Netflix shrinks by one step per
///   sample, and at a dependency whose capacity fell to a third, where each round trip lasts many no-load
///   latencies, one step per round trip takes as many round trips as calls to lose.
/// - The success that ends a round trip started within it and reports on the limit in force: if it took at
///   least twice the no-load latency (queued behind at least one call; +-20 % noise stays within
///   1.2 / 0.8 = 1.5 x), the limit decreases as above whatever the fastest success says, which may have
///   started before the dependency slowed (not while a probed baseline is tentative).
/// - After a decrease growth waits a round trip, longer at a level found again (`plateau_rounds`).
/// - The growth guard takes the calls out when the fastest success was granted (of equally fast ones, the
///   one granted with the most calls out): that call alone showed no queue, and a call granted while the
///   dependency had just drained says nothing about the limit.
/// - The probe adopts the fastest success of the round trip after it is due instead of the next sample
///   (a sample taken while calls queue is a queued latency). If that is slower than the baseline, the old
///   baseline is kept aside and the new one is tentative: while it is, the limit grows by a step at most,
///   never by beta; a round trip that then reads more than the threshold queued shows the rise was our own
///   queue, and the old baseline comes back; two round trips in a row that read no queue, each with more
///   calls out than the one before (the first: than the probe's fastest success), confirm it (the dependency
///   is slower: more calls, no slower). One such round trip is not enough: a capacity that grew by one call
///   between the probe and the round trip reads the same as a slower dependency. A sample faster than the
///   tentative baseline (and still slower than the old one) becomes the tentative baseline, with its own calls
///   out to beat. Netflix adopts the next sample whatever it is, and a probe taken while calls queue reads
///   the queue as no-load and grows by beta per sample past the dependency's hard limit.
///
/// The no-load latency is the minimum latency seen since the last probe; a sample that sets a new minimum
/// changes nothing else and takes no part in the round trip. A congestion outcome shrinks the limit by one
/// step (Netflix's `didDrop`), after taking part in the no-load estimate as Netflix does, and starts a new
/// round trip; like every decrease it is gated to one per round trip and ends slow start. `ignored` changes
/// nothing. With `judge_latency` false no latency is judged: a round trip ends as above, and grows as one
/// that read no queue, from the most calls out of its successes.
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
  /// True until the first decrease (see `threshold_factor`).
  bool in_slow_start() const noexcept { return slow_start_; }
  /// Round trips still to wait at the level of the latest decrease before growing (see `plateau_rounds`).
  double waiting() const noexcept { return waiting_; }

  /// Replaces the options at run time, validated as the constructor validates them (nothing changes on a
  /// throw). The limit learned so far is kept, moved into the new [min_limit, max_limit] (`initial_limit` is
  /// checked, not used). The no-load latency and the probe countdown carry on; a new `probe_seed` reseeds the
  /// probe jitter from the next probe; a wait under way is cut to the new `plateau_rounds`.
  /// @throws std::invalid_argument naming the field and value if `o` is invalid.
  void set_options(const options& o) {
    validated(o);
    if (o.probe_seed != options_.probe_seed) random_ = o.probe_seed;
    options_ = o;
    limit_.rebound(o.min_limit, o.max_limit);
    if (waiting_ > o.plateau_rounds) waiting_ = o.plateau_rounds;
  }

  /// Applies one completed call. With a work hint (`basic_sample::work`) latency is judged per unit of work.
  /// A success that did no work (a hint of 0) says nothing to the latency rule, whose round trips compare
  /// latencies; with `judge_latency` false it counts as any success.
  /// @throws std::invalid_argument if the sample's work hint is negative, NaN or infinite.
  void on_sample(const sample_type& s) {
    // With the latency signal off, failures are the only signal: every one counts.
    const bool learn = options_.learn_failure_rate && options_.judge_latency;
    if (s.result == outcome::ignored || !signals_.counts(s, learn)) return;
    const auto judged = signals_.judged(s.latency, s.work);
    if (!options_.judge_latency) {
      unjudged(s, judged);
      return;
    }
    if (!judged) {  // no work: no latency to learn; a failure still shrinks
      if (s.result == outcome::congestion) congested(s);
      return;
    }
    const auto latency = *judged > std::chrono::nanoseconds::zero() ? *judged : std::chrono::nanoseconds{1};
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
    // The fastest success; of equally fast ones, the one granted with the most calls out (it tested more).
    if (latency < round_min_ || (latency == round_min_ && s.in_flight > round_in_flight_)) {
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
    update(fastest, tested, latency, s);
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

  // The latency signal off: congestion outcomes shrink as always; a round trip ends with the first success
  // that started after it began and grows as one that read no queue, from the most calls out of its
  // successes (each showed no queue). The no-load latency is still learned, for a `judge_latency` set later.
  // `judged`: the latency per unit of work, none for a call that did no work.
  void unjudged(const sample_type& s, const std::optional<std::chrono::nanoseconds>& judged) noexcept {
    if (judged) {
      const auto latency = *judged > std::chrono::nanoseconds::zero() ? *judged : std::chrono::nanoseconds{1};
      if (no_load_ == std::chrono::nanoseconds::zero() || latency < no_load_) no_load_ = latency;
    }
    if (s.result == outcome::congestion) {
      congested(s);
      return;
    }
    if (round_start_ == time_point::min()) round_start_ = s.now;
    if (s.in_flight > round_in_flight_) round_in_flight_ = s.in_flight;
    if (s.now - s.latency < round_start_) return;
    const std::size_t tested = round_in_flight_;
    start_round(s.now);
    grow(limit_.value(), true, true, tested, s);
  }

  void congested(const sample_type& s) noexcept {
    const double current = limit_.value();
    const double step = options_.step_factor * log10_root(std::floor(current));
    set(current, current - step, s.in_flight, s);
  }

  // `fastest`: the round trip's fastest judged latency; `own`: the judged latency of `s`, which ends it.
  void update(std::chrono::nanoseconds latency, std::size_t in_flight, std::chrono::nanoseconds own,
              const sample_type& s) noexcept {
    const double current = limit_.value();
    const double l = log10_root(std::floor(current));
    const double step = options_.step_factor * l;
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
    // The call that ended the round trip started within it: it reports on the limit in force. Queued behind
    // at least one call (twice the no-load latency, where +-20 % noise reaches 1.5 x), it is a queue whatever
    // the fastest success, which may have started before the dependency slowed, says.
    if (!tentative_ && static_cast<double>(own.count()) >= 2.0 * static_cast<double>(no_load_.count())) {
      cut(current, std::min(unqueued_calls(own, s.in_flight, current), current - step), s);
      return;
    }
    const bool grow_fast =
        queue <= options_.threshold_factor * l && share <= f * options_.threshold_factor / options_.beta_factor;
    if (grow_fast || (queue < options_.alpha_factor * l && share < f * options_.alpha_factor / options_.beta_factor)) {
      grow(current, grow_fast, confirmed, in_flight, s);
    } else if (queue > options_.beta_factor * l || share > f) {
      cut(current, std::min(unqueued_calls(latency, in_flight, current), current - step), s);
    }
  }

  // Growth from a round trip that read a queue below alpha (`fast`: below the threshold; `confirmed`: no
  // tentative baseline), its fastest success granted with `in_flight` calls out.
  void grow(double current, bool fast, bool confirmed, std::size_t in_flight, const sample_type& s) noexcept {
    const double l = log10_root(std::floor(current));
    if (!slow_start_) {
      // Congestion avoidance grows only from a round trip that tested the limit (its fastest success was
      // granted with the limit's calls out), and not while it waits at the level of a decrease.
      if (static_cast<double>(in_flight) < std::floor(current)) return;
      if (waiting_ > 0.0) {
        waiting_ -= 1.0;
        return;
      }
    }
    set(current, current + (fast && confirmed && slow_start_ ? options_.beta_factor : options_.step_factor) * l,
        in_flight, s);
  }

  /// The calls that a success granted with `in_flight` out (at most the limit's) and served in `latency`
  /// shows the dependency to serve unqueued: each call queued ahead of it added one no-load latency.
  double unqueued_calls(std::chrono::nanoseconds latency, std::size_t in_flight, double current) const noexcept {
    const double n = std::min(static_cast<double>(in_flight), std::floor(current));
    return n - std::floor(static_cast<double>(latency.count()) / static_cast<double>(no_load_.count()) - 1.0);
  }

  /// A decrease from a queue: to `next`, at most by half, and a wait before growing (see `plateau_rounds`).
  void cut(double current, double next, const sample_type& s) noexcept {
    next = std::max(next, current * 0.5);
    if (next < limit_.min()) next = limit_.min();
    if (next >= current || gate_.stale(s.now, s.latency)) return;
    const auto repeats = levels_.found(std::floor(next));
    const double doubling = std::exp2(static_cast<double>(repeats < 63 ? repeats + 1 : 64)) - 1.0;
    waiting_ = doubling < options_.plateau_rounds ? doubling : options_.plateau_rounds;
    set(current, next, s.in_flight, s);
  }

  void set(double current, double next, std::size_t in_flight, const sample_type& s) noexcept {
    if (next < limit_.min()) next = limit_.min();
    if (next > limit_.max()) next = limit_.max();
    next = (1.0 - options_.smoothing) * current + options_.smoothing * next;
    if (next < current) {
      // At most one decrease per round trip: a call that started before the latest one reports on the old limit.
      if (gate_.stale(s.now, s.latency)) return;
      gate_.decreased(s.now);
      slow_start_ = false;
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
    if (!detail::finite(o.plateau_rounds) || o.plateau_rounds < 0.0)
      detail::invalid_option(type, "plateau_rounds", ">= 0 and finite", o.plateau_rounds);
    return o;
  }

  options options_;
  detail::bounded_limit limit_;
  detail::sample_signals signals_{};
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
  bool slow_start_ = true;
  detail::level_memory levels_{};
  double waiting_ = 0.0;  // round trips still to wait at the level of the latest decrease
};

/// `basic_vegas` on `std::chrono::steady_clock`.
using vegas = basic_vegas<>;

}  // namespace rein::algo
