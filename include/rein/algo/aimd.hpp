// Additive increase, multiplicative decrease of a concurrency limit.
#pragma once

#include <rein/algo/limit_algorithm.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>

namespace rein::algo {

/// Options of `basic_aimd`. Defaults: initial 4, floor 1, ceiling 64, backoff 0.8, a success slower than 1.75 x
/// the fastest recent one (and 0.5 ms above it) counts as congestion, with rein's rules: the growth guard and one
/// decrease per round trip, and a wait below a level that cuts keep finding. For the textbook rule set
/// `latency_target` 20 ms, `latency_tolerance` unset (`std::nullopt`), `backoff` 0.75, `min_utilisation` 0,
/// `once_per_round_trip` false, `plateau_rounds` 0 and `learn_failure_rate` false.
struct aimd_options {
  /// Starting limit, in calls; in [min_limit, max_limit].
  double initial_limit = 4.0;
  /// Floor, in calls: a whole number >= 1. Without one a failing dependency drives the limit to zero and
  /// a partial outage becomes a total one.
  double min_limit = 1.0;
  /// Ceiling, in calls: a whole number in [min_limit, 1e9] (`max_limit_ceiling`).
  double max_limit = 64.0;
  /// Multiplicative decrease: the limit is multiplied by this on congestion; in (0, 1). 0.8: one cut from
  /// one call over the capacity leaves the limit above 0.8 x the capacity, so latency jitter that reads as
  /// congestion costs little (Netflix concurrency-limits uses 0.9, which in the generated family leaves the
  /// limit above a capacity that dropped for too long).
  double backoff = 0.8;
  /// Additive increase: each fast success adds `increase / max(1, limit)` calls, so the limit grows by
  /// about `increase` per round of `limit` calls (TCP's congestion avoidance). > 0.
  double increase = 1.0;
  /// Optional: a success slower than this (strictly) counts as congestion. > 0 when set.
  std::optional<std::chrono::nanoseconds> latency_target{};
  /// Optional: a success slower than `latency_tolerance x` the fastest of the last 200 successes (strictly), and
  /// more than `noise_floor` above it, counts as congestion (`detail::relative_latency`): a target relative to
  /// what the dependency has shown it can do, so it needs no guess (a fixed `latency_target` of 20 ms would
  /// collapse the limit of any dependency that is normally slower). 1.75: +-20 % jitter puts the fastest call at
  /// 0.8 x the typical latency and the slowest unqueued one at 1.2 x (1.5 x the fastest), while a call queued
  /// behind another one takes twice as long. Finite and > 1 when set; unset (`std::nullopt`, the textbook rule):
  /// only `congestion` outcomes and `latency_target` count. Without it the limit climbs until calls fail: on the
  /// generated family (`examples/adaptive_family`) calls failed in 867 of 1000 scenarios, none with it. Unset it
  /// for a dependency whose latency does not grow with the calls in flight but that refuses calls past a limit
  /// (a server that paces each connection, such as the integration tests' nginx `/conn`: its calls take either
  /// well under a millisecond or the 100 ms of the pacing, whatever the limit, and the limit would sink to 2).
  std::optional<double> latency_tolerance = 1.75;
  /// Jitter that does not scale with the latency, in nanoseconds; >= 0 (0: none). A success is slow only when it is
  /// also more than this above the fastest (`detail::allowed_latency`): on a fast path (a 150 us loopback call) a
  /// scheduling delay of a few hundred microseconds is many times the fastest call, but no queueing at the
  /// dependency. 0.5 ms. The default was measured, not guessed: on the generated family (`examples/adaptive_family`,
  /// base latencies 1-20 ms) every figure is the same for floors from 0 to 0.6 ms and gets worse from about 0.8 ms (a
  /// floor near the base hides a call queued behind one other), and on loopback HTTP (sub-millisecond calls) 0.5 ms
  /// removes most of the cuts that scheduling jitter caused with no floor.
  std::chrono::nanoseconds noise_floor = std::chrono::microseconds{500};
  /// The growth guard (`detail::tested_ceiling`): a success granted with n calls out raises the limit to at
  /// most `max(n + 1, n / min_utilisation)`, so the limit does not grow far above the demand while it is
  /// low, to land beyond the dependency's hard limit when demand returns. In [0, 1]; 0 disables it (the
  /// textbook rule).
  double min_utilisation = 0.85;
  /// true: at most one decrease per round trip (a congestion signal from a call that started before the
  /// latest cut reports on the limit before it). false: every congested call cuts (the textbook rule, which
  /// collapses the limit when many calls are out at once).
  bool once_per_round_trip = true;
  /// The longest wait below a level found again, in round trips; >= 0 and finite, 0: no wait (the textbook
  /// rule). After a cut that found the level the cut before it found (within a call), the limit stops a call
  /// below that level for `2^k - 1` round trips of calls, k the cuts in a row before this one that found it
  /// (1, 3, 7, 15, ...), at most this many: a level found again and again is the capacity, and each probe past it
  /// costs a call over it (against a hard limit, a failed call). A cut at a new level waits nothing, so a
  /// capacity that changed is followed as before; one that rose after a long steady stretch is probed
  /// `plateau_rounds` round trips late. The idea of CUBIC's plateau around the window of the last loss (RFC 8312)
  /// and of `tuned_aimd`'s longer plateau after a futile probe. 31: on the generated family every figure is better
  /// than without a wait, a little better with 31 than with 15, and no better with 63 or more, while a later
  /// probe of a capacity that rose costs more; against a connection limit it leaves about one failed call in
  /// 30 round trips.
  double plateau_rounds = 31.0;
  /// true: while latency is judged, a congestion outcome counts only when failures come faster than the rate
  /// learned so far (`detail::failure_baseline`, at least 15 %): 1-5 % of calls failing at random, whatever
  /// the limit, is not congestion, and such a failure neither cuts nor grows. false: every congestion outcome
  /// cuts (the textbook rule).
  /// With the latency signal off (`latency_tolerance`) failures are the only signal and every one counts: a limit
  /// held back only by refusals past a hard cap would otherwise grow until 16 of 50 calls were refused.
  bool learn_failure_rate = true;
};

/// AIMD: `+increase/limit` on a fast success (within the growth guard), `x backoff` on congestion (a
/// `congestion` outcome, or a success slower than `latency_target` or than `latency_tolerance` allows) at most
/// once per round trip (a signal from a call that started before the latest cut reports on the old limit:
/// RFC 5681), nothing on `ignored`. The control law TCP uses for its window (RFC 5681), applied to a client's
/// concurrency limit as in Netflix concurrency-limits' `AIMDLimit`. After a cut at the level the cut before
/// found, growth stops a call below that level for longer each time (`plateau_rounds`), as CUBIC's window
/// stays near the one of the last loss (RFC 8312).
///
/// It judges each slow call, so isolated outliers cost a cut each (at most one per round trip);
/// `basic_tuned_aimd` judges against a rolling baseline and sizes its cut by the queue it estimates.
///
/// @tparam Clock only names the `time_point` in samples; AIMD itself does not look at time.
template <class Clock = std::chrono::steady_clock>
class basic_aimd {
 public:
  /// The clock that times the rule and the deadlines.
  using clock_type = Clock;
  /// The options type, as the constructor takes them.
  using options = aimd_options;
  /// What one completed call reports: `sample<Clock>`.
  using sample_type = basic_sample<Clock>;
  template <class OtherClock>
  /// The same algorithm on clock `C`, with the same options type.
  using rebind_clock = basic_aimd<OtherClock>;

  /// @throws std::invalid_argument naming the field and value if `o` is invalid.
  explicit basic_aimd(const options& o = {})
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

  /// Replaces the options at run time, validated as the constructor validates them (nothing changes on a
  /// throw). The limit learned so far is kept, moved into the new [min_limit, max_limit] (`initial_limit` is
  /// checked, not used); a wait under way is cut to the new `plateau_rounds`.
  /// @throws std::invalid_argument naming the field and value if `o` is invalid.
  void set_options(const options& o) {
    options_ = validated(o);
    limit_.rebound(o.min_limit, o.max_limit);
    const double longest = o.plateau_rounds * below_;  // a shorter bound shortens the wait under way
    if (waiting_ > longest) waiting_ = longest;
  }

  /// Applies one completed call. With a work hint (`basic_sample::work`) latency is judged per unit of work.
  /// @throws std::invalid_argument if the sample's work hint is negative, NaN or infinite.
  void on_sample(const sample_type& s) {
    // With the latency signal off, failures are the only signal: every one counts.
    const bool learn = options_.learn_failure_rate && options_.latency_tolerance.has_value();
    if (s.result == outcome::ignored || !signals_.counts(s, learn)) return;
    const double current = limit_.value();
    if (congested(s)) {
      if (options_.once_per_round_trip && gate_.stale(s.now, s.latency)) return;
      gate_.decreased(s.now);
      limit_.set(current * options_.backoff);
      if (options_.plateau_rounds > 0.0) wait_below(s, current);
      return;
    }
    double next = current + options_.increase / (current > 1.0 ? current : 1.0);
    if (waiting_ > 0.0 && next > below_) {
      if (current >= below_) waiting_ -= 1.0;  // a success at the plateau: one call of the wait
      next = below_;                           // never lowers the limit (guarded_growth keeps current)
    }
    limit_.set(detail::guarded_growth(current, next, s.in_flight, options_.min_utilisation));
  }

  /// Successes still to wait at the plateau, a call below the level of the latest cut, before growing past it
  /// (0: not waiting).
  double waiting() const noexcept { return waiting_; }

 private:
  bool congested(const sample_type& s) {
    if (s.result == outcome::congestion) return true;
    if (options_.latency_target && s.latency > *options_.latency_target) return true;  // a call's, whatever its work
    const auto judged = signals_.judged(s.latency, s.work);
    return judged && judge_.slow(*judged, options_.latency_tolerance, signals_.floor(options_.noise_floor, s.work));
  }

  // After a cut by a call granted with n calls out (at most the limit): n calls were too many, so the plateau
  // is n - 1, and the wait is `2^k - 1` round trips (see `plateau_rounds`), counted in successes at the
  // plateau, `n - 1` of them a round trip.
  void wait_below(const sample_type& s, double current) noexcept {
    const double at = static_cast<double>(s.in_flight);
    const double n = at > 0.0 && at < std::floor(current) ? at : std::floor(current);
    const std::uint64_t repeats = levels_.found(n);
    below_ = n - 1.0 > limit_.min() ? n - 1.0 : limit_.min();
    const double doubling = std::exp2(static_cast<double>(repeats < 64 ? repeats : 64)) - 1.0;
    waiting_ = (doubling < options_.plateau_rounds ? doubling : options_.plateau_rounds) * below_;
  }

  static const options& validated(const options& o) {
    detail::check_limits("aimd", o.min_limit, o.initial_limit, o.max_limit);
    detail::check_open_unit("aimd", "backoff", o.backoff);
    detail::check_positive("aimd", "increase", o.increase);
    if (o.latency_target) detail::check_positive("aimd", "latency_target", *o.latency_target);
    detail::relative_latency::check("aimd", o.latency_tolerance, o.noise_floor);
    if (!detail::finite(o.min_utilisation) || o.min_utilisation < 0.0 || o.min_utilisation > 1.0)
      detail::invalid_option("aimd", "min_utilisation", "in [0, 1]", o.min_utilisation);
    if (!detail::finite(o.plateau_rounds) || o.plateau_rounds < 0.0)
      detail::invalid_option("aimd", "plateau_rounds", ">= 0 and finite", o.plateau_rounds);
    return o;
  }

  options options_;
  detail::bounded_limit limit_;
  detail::round_trip_gate<typename Clock::time_point> gate_{};
  detail::relative_latency judge_{200};
  detail::sample_signals signals_{};
  detail::level_memory levels_{};
  double below_ = 0.0;    // the plateau: a call below the level of the latest cut
  double waiting_ = 0.0;  // successes still to wait there
};

/// `basic_aimd` on `std::chrono::steady_clock`.
using aimd = basic_aimd<>;

}  // namespace rein::algo
