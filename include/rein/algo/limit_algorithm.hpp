// The common shape of rein's adaptive concurrency algorithms.
//
// An algorithm is a plain value type: no Asio, no clock reads, no locking. `adaptive_limiter<Algorithm>`
// owns one, calls it under its own lock, and admits a call while `in_flight < floor(limit())`. Everything an
// algorithm knows arrives through `on_sample`, so a test can replay any history exactly.
#pragma once

#include <rein/detail/invalid_option.hpp>
#include <rein/outcome.hpp>

#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace rein::algo {

/// One completed call, as an adaptive algorithm sees it.
///
/// @tparam Clock supplies `time_point`; nothing here ever calls `Clock::now()`.
template <class Clock = std::chrono::steady_clock>
struct basic_sample {
  /// The clock that times the rule and the deadlines.
  using clock_type = Clock;
  /// A point in time of `clock_type`.
  using time_point = typename Clock::time_point;

  /// Service time: from the moment the call was granted its slot to the moment its outcome was reported,
  /// never including time spent waiting for the slot (counting queue time as service time would make a
  /// limit cut itself for its own queue).
  /// For a `congestion` outcome it is the time until the failure was seen (e.g. the timeout).
  std::chrono::nanoseconds latency{};
  /// What the call said about the dependency's capacity. `ignored` samples never change anything.
  outcome result = outcome::success;
  /// Calls holding a slot of this limiter right after this call was granted, this call included (as Netflix
  /// concurrency-limits passes `inflight` to `Limit.onSample`). Used by the "app-limited" guards: a limiter
  /// that is barely used learns nothing about whether a higher limit would be safe.
  std::size_t in_flight = 0;
  /// When the outcome was reported. The call therefore started at `now - latency`.
  time_point now{};
  /// Optional work hint: how much work the call asked of the dependency (an answer's tokens, bytes), in any
  /// unit, the same for every call of one limiter. Given, latency is judged per unit of work (scaled to the
  /// work of the first hint, `detail::work_scale`), so that a long answer is not read as a queue. 0: a call
  /// that did no work (a cached or empty answer) says nothing about queueing; its latency is neither judged
  /// nor learned, its outcome still counts. Unset: latency is judged as it is. Negative, NaN or infinite:
  /// refused with `std::invalid_argument` where the hint is given (`check_work`).
  std::optional<double> work{};
};

/// Validates a work hint (`basic_sample::work`): finite and >= 0.
/// @throws std::invalid_argument "rein::algo::sample: work must be >= 0 and finite, got <value>".
inline void check_work(double work) { (void)rein::detail::checked_work("rein::algo::sample", work); }

/// `basic_sample` on `std::chrono::steady_clock`.
using sample = basic_sample<>;

/// What `adaptive_limiter` requires of an algorithm.
///
/// - `options`: a plain aggregate; the constructor `A(options)` validates it and throws
///   `std::invalid_argument` naming the type, the field and the value.
/// - `limit()`: the current limit, fractional allowed; the limiter admits while `in_flight < floor(limit())`.
///   It always lies in `[min_limit(), max_limit()]`, which are whole numbers >= 1.
/// - `on_sample(s)`: feed one completed call. An `ignored` sample changes nothing at all.
/// - `decreases()` / `increases()`: how many samples strictly lowered / raised the limit (for snapshots and
///   alerting: alert on the decrease rate and on sitting at the floor).
/// - `rebind_clock<C>`: the same algorithm on another clock (the limiter's), with the same `options` type.
///
/// rein's algorithms also have `set_options(options)` (validated as the constructor validates, nothing
/// changed on a throw; the limit learned so far is kept, moved into the new [min_limit, max_limit], and
/// `initial_limit` is checked but unused), which `adaptive_limiter::set_options` calls.
template <class A>
concept limit_algorithm =
    std::constructible_from<A, typename A::options> &&
    requires(A& a, const A& ca, const typename A::sample_type& s) {
      typename A::clock_type;
      typename A::template rebind_clock<typename A::clock_type>;
      { ca.limit() } -> std::same_as<double>;
      { ca.min_limit() } -> std::same_as<double>;
      { ca.max_limit() } -> std::same_as<double>;
      { ca.decreases() } -> std::same_as<std::uint64_t>;
      { ca.increases() } -> std::same_as<std::uint64_t>;
      a.on_sample(s);
    };

/// How many calls a limit admits: `floor(limit)`, the admission rule of every adaptive limiter in rein.
constexpr std::size_t admitted(double limit) noexcept {
  return limit < 1.0 ? 0 : static_cast<std::size_t>(limit);
}

namespace detail {

using rein::detail::show;

/// Throws "rein::algo::<type>: <field> must be <requirement>, got <value>".
template <class Value>
[[noreturn]] void invalid_option(std::string_view type, std::string_view field, std::string_view requirement,
                                 Value value) {
  std::string name{"rein::algo::"};
  name.append(type);
  std::string rule(field);
  rule.append(" must be ").append(requirement);
  rein::detail::throw_invalid(name, rule, show(value));
}

inline bool finite(double v) noexcept {
  return v == v && v != std::numeric_limits<double>::infinity() && v != -std::numeric_limits<double>::infinity();
}

/// True for a finite integral value. Compares with its floor instead of converting to an integer, which is
/// undefined behaviour for a double outside the integer's range (1e20 for std::int64_t).
inline bool whole(double v) noexcept { return finite(v) && std::floor(v) == v; }

}  // namespace detail

/// The largest floor or ceiling an algorithm accepts, in calls: a billion in flight. Far above any real
/// limit, and below 2^53, so that every limit up to it is exact in a double and `admitted()` converts it
/// safely.
inline constexpr double max_limit_ceiling = 1e9;

namespace detail {

/// Validates the floor, ceiling and starting point shared by every algorithm:
/// 1 <= min_limit <= initial_limit <= max_limit <= max_limit_ceiling, floor and ceiling whole numbers,
/// everything finite.
inline void check_limits(std::string_view type, double min_limit, double initial_limit, double max_limit) {
  if (!whole(min_limit) || min_limit < 1.0)
    invalid_option(type, "min_limit", "a whole number >= 1", min_limit);
  if (!whole(max_limit) || max_limit < min_limit || max_limit > max_limit_ceiling)
    invalid_option(type, "max_limit",
                   "a whole number in [min_limit, 1e9] = [" + show(min_limit) + ", 1e9]", max_limit);
  if (!finite(initial_limit) || initial_limit < min_limit || initial_limit > max_limit)
    invalid_option(type, "initial_limit",
                   "in [min_limit, max_limit] = [" + show(min_limit) + ", " + show(max_limit) + "]",
                   initial_limit);
}

inline void check_open_unit(std::string_view type, std::string_view field, double v) {
  if (!finite(v) || v <= 0.0 || v >= 1.0) invalid_option(type, field, "in (0, 1)", v);
}

inline void check_positive(std::string_view type, std::string_view field, double v) {
  if (!finite(v) || v <= 0.0) invalid_option(type, field, "> 0 and finite", v);
}

inline void check_positive(std::string_view type, std::string_view field, std::chrono::nanoseconds v) {
  if (v <= std::chrono::nanoseconds::zero()) invalid_option(type, field, "> 0", v);
}

inline void check_non_negative(std::string_view type, std::string_view field, std::chrono::nanoseconds v) {
  if (v < std::chrono::nanoseconds::zero()) invalid_option(type, field, ">= 0", v);
}

/// The growth guard shared by the algorithms ("probe above the demand only as far as it is tested"): a
/// success of a call granted while `in_flight` calls were out may raise the limit to at most
/// `max(in_flight + 1, in_flight / min_utilisation)`, so the limit never runs ahead of what the calls have
/// shown to be safe. Netflix concurrency-limits checks `inflight >= limit / 2` instead, which lets the limit
/// double the tested demand and freezes a fractional limit whose floor is below that half (a limit of 1.9
/// admits 1, and 1 < 0.8 x 1.9); comparing with what a call saw at its grant does neither.
/// `min_utilisation` 0: no guard.
inline double tested_ceiling(std::size_t in_flight, double min_utilisation) noexcept {
  if (min_utilisation <= 0.0) return std::numeric_limits<double>::infinity();
  const double n = static_cast<double>(in_flight);
  return n + 1.0 > n / min_utilisation ? n + 1.0 : n / min_utilisation;
}

/// `next` if that is a rise within `tested_ceiling(in_flight, min_utilisation)`, the ceiling if it is
/// beyond, and `current` if the ceiling is below it: growth never lowers a limit.
inline double guarded_growth(double current, double next, std::size_t in_flight, double min_utilisation) noexcept {
  const double ceiling = tested_ceiling(in_flight, min_utilisation);
  if (next > ceiling) next = ceiling;
  return next > current ? next : current;
}

/// At most one decrease per round trip (RFC 5681: one reduction per window of data): a congestion signal
/// from a call that started before the latest decrease was caused by the limit before that decrease, which
/// has already been cut.
template <class TimePoint>
class round_trip_gate {
 public:
  /// True if a call that ended at `now` after `latency` started before the latest decrease.
  bool stale(TimePoint now, std::chrono::nanoseconds latency) const noexcept {
    return last_ != TimePoint::min() && now - latency < last_;
  }
  void decreased(TimePoint now) noexcept { last_ = now; }
  /// The latest decrease (`TimePoint::min()` before any).
  TimePoint last() const noexcept { return last_; }

 private:
  TimePoint last_ = TimePoint::min();
};

/// Minimum of the last `capacity` values in O(1) amortised: a deque of candidates, increasing from front to
/// back, each tagged with its position; a value is dropped once a smaller one arrives after it or it ages out.
class sliding_minimum {
 public:
  explicit sliding_minimum(std::size_t capacity) noexcept : capacity_{capacity} {}

  /// Keeps the minimum of the last `capacity` values from now on (the values already pushed keep their age).
  void set_capacity(std::size_t capacity) noexcept {
    capacity_ = capacity;
    while (!candidates_.empty() && candidates_.front().first + capacity_ < count_) candidates_.pop_front();
  }

  void push(std::int64_t v) {
    while (!candidates_.empty() && candidates_.back().second >= v) candidates_.pop_back();
    candidates_.emplace_back(count_, v);
    ++count_;
    while (candidates_.front().first + capacity_ < count_) candidates_.pop_front();
  }

  /// Precondition: at least one value was pushed.
  std::int64_t value() const noexcept { return candidates_.front().second; }

 private:
  std::size_t capacity_;
  std::uint64_t count_ = 0;
  std::deque<std::pair<std::uint64_t, std::int64_t>> candidates_;
};

/// The slowest latency that still counts as "no queueing" against a baseline (the dependency's typical
/// unqueued latency): `max(tolerance x baseline, baseline + noise_floor)`, in nanoseconds. The tolerance
/// absorbs jitter proportional to the latency; the noise floor absorbs jitter that is not, such as
/// scheduling delays on a fast path (a 100 us loopback call delayed 300 us by the scheduler is not
/// queueing at the dependency). A call queued behind another one takes at least one more baseline.
inline double allowed_latency(double baseline, double tolerance, std::chrono::nanoseconds noise_floor) noexcept {
  const double proportional = baseline * tolerance;
  const double absolute = baseline + static_cast<double>(noise_floor.count());
  return proportional > absolute ? proportional : absolute;
}

/// Judges successes against the fastest of the last `window` of them (`allowed_latency`): the relative
/// latency rule of the loss-driven algorithms, which need no guess of the dependency's latency.
class relative_latency {
 public:
  explicit relative_latency(std::size_t window = 200) : fastest_{window} {}

  /// Records a success and says whether it was slower than allowed. A zero latency (a clock too coarse for
  /// the call) says nothing about how fast the dependency can be: neither recorded nor slow. No tolerance:
  /// latency is not judged, and nothing is recorded.
  bool slow(std::chrono::nanoseconds latency, const std::optional<double>& tolerance,
            std::chrono::nanoseconds noise_floor) {
    if (!tolerance || latency <= std::chrono::nanoseconds::zero()) return false;
    fastest_.push(latency.count());
    return static_cast<double>(latency.count()) >
           allowed_latency(static_cast<double>(fastest_.value()), *tolerance, noise_floor);
  }

  /// Validates the rule's options as `type` names them (`latency_tolerance`, `noise_floor`).
  static void check(std::string_view type, const std::optional<double>& tolerance,
                    std::chrono::nanoseconds noise_floor) {
    if (tolerance && (!finite(*tolerance) || *tolerance <= 1.0))
      invalid_option(type, "latency_tolerance", "> 1 and finite", *tolerance);
    check_non_negative(type, "noise_floor", noise_floor);
  }

 private:
  sliding_minimum fastest_;
};

/// Latency per unit of work (`basic_sample::work`), scaled to the work of the first call that gave a hint so
/// that it stays a latency in nanoseconds (noise floors and tolerances keep their meaning):
/// `latency x first_work / work`. A fixed scale: one that followed the mean work would move every latency
/// learned so far while the mean settles. No hint: the latency as it is. A hint of 0: nothing to judge
/// (`std::nullopt`). A long answer that took three times the work and three times the latency is then an
/// ordinary call, not a queue.
class work_scale {
 public:
  /// The latency to judge, or nullopt for a call that did no work. Precondition: `work` passed `check_work`.
  std::optional<std::chrono::nanoseconds> judged(std::chrono::nanoseconds latency, const std::optional<double>& work) noexcept {
    if (!work) return latency;
    if (*work <= 0.0) return std::nullopt;
    if (unit_ == 0.0) unit_ = *work;
    return rounded_ns(static_cast<double>(latency.count()) * unit_ / *work);
  }

  /// A noise floor (jitter that does not scale with the work, `allowed_latency`) as it shows in a latency
  /// judged per unit of work: `floor x first_work / work`. Scaling the latency alone shrank the floor with it
  /// when the first hint was small (a lognormal payload's first draw at 0.1 of the mean made a 0.5 ms floor
  /// hide a queue of five 1 ms calls). Precondition: `judged` was called with a hint of `work` > 0 first.
  std::chrono::nanoseconds floor(std::chrono::nanoseconds noise_floor, const std::optional<double>& work) const noexcept {
    if (!work || *work <= 0.0 || unit_ == 0.0) return noise_floor;
    return rounded_ns(static_cast<double>(noise_floor.count()) * unit_ / *work);
  }

  // Nanoseconds, rounded to the nearest, saturated: a tiny work hint scales a latency past any duration.
  static std::chrono::nanoseconds rounded_ns(double ns) noexcept {
    constexpr double most = 9.0e18;  // below the largest int64, exactly representable as a double
    return std::chrono::nanoseconds{ns < most ? std::llround(ns) : static_cast<std::int64_t>(most)};
  }

 private:
  double unit_ = 0.0;  // the first hint's work
};

/// Whether a failure is congestion: only when failures come faster than the rate the dependency has shown
/// whatever the load. A dependency that fails 1-5 % of its calls at random (a flaky backend's 503s) fails them
/// at any limit, and cutting for each one drives the limit to its floor for nothing; failures caused by too
/// many calls come in bursts, as the limit crosses a hard cap. The rule: a failure counts when the failures of
/// the last `short_window` outcomes (this one included) exceed the count the baseline rate explains by more
/// than `z` standard deviations, `p n + z sqrt(p n)`, where p is the failure rate of the `long_window`
/// outcomes before this one (a Poisson bound on the count of rare independent failures; the learned base
/// rate as a detector of excess loss, as in Google's SRE client-side throttling, which tolerates the rate a
/// backend normally rejects). p is at least `min_rate` (a lone failure, or a few in a row, is no burst) and
/// at most `max_rate` (a dependency that fails more and more is still read as congested); before `warmup`
/// outcomes it is `min_rate` (a few calls say nothing about a rate). So a failure counts when more than
/// `p n + 3 sqrt(p n)` of the last n <= 50 outcomes failed: 16 of 50 at a rate below 15 %, 4 of the first 5.
class failure_baseline {
 public:
  static constexpr std::size_t short_window = 50;   ///< outcomes whose failures are counted
  static constexpr std::size_t long_window = 1000;  ///< outcomes the base rate is learned over
  static constexpr double z = 3.0;                  ///< standard deviations of excess that count
  static constexpr double max_rate = 0.2;           ///< the highest base rate learned
  /// The lowest base rate assumed, learned or not: a few failures are no burst. Without it the first failure
  /// of a run (before `warmup`) cut by half, and later three failures in 50 at a learned 1 %: on the grown
  /// family (`adaptive_family --shapes`, seeds 1-100) tuned_aimd kept 0.56 / 0.46 of the oracle's throughput
  /// at 1 % / 5 % random failures in the worst seed. With 0.05: 0.84 / 0.69; 0.1: 0.84 / 0.77; 0.15: 0.84 /
  /// 0.84, the start's own cost (the blind reference's worst is 0.86), so chance runs no longer cut. The price:
  /// failures over a hard cap cut only past 16 of the last 50 outcomes, so the algorithms ask this rule only
  /// while they judge latency (which sees the queue before the cap); with latency off every failure counts.
  static constexpr double min_rate = 0.15;
  static constexpr std::size_t warmup = 100;       ///< outcomes seen before a rate is learned

  /// Records one outcome (`failed`: a congestion outcome); true if it is a failure that counts as congestion.
  bool congested(bool failed) noexcept {
    const double p = rate();
    push(failed);
    if (!failed) return false;
    const std::size_t n = count_ < short_window ? count_ : short_window;
    const double expected = p * static_cast<double>(n);
    return static_cast<double>(recent_) > expected + z * std::sqrt(expected);
  }

  /// The base rate the next outcome is judged against: the failure rate of the last `long_window` outcomes,
  /// within [min_rate, max_rate]; before `warmup` outcomes no rate is known and the floor stands for it.
  double rate() const noexcept {
    const std::size_t n_long = count_ < long_window ? count_ : long_window;
    const double p = n_long >= warmup ? static_cast<double>(failures_) / static_cast<double>(n_long) : 0.0;
    return p < min_rate ? min_rate : p > max_rate ? max_rate : p;
  }

 private:
  // The last long_window outcomes as a ring of bits (no allocation per outcome), with the failures counted
  // over both windows as outcomes enter and leave them.
  static constexpr std::size_t ring_bits = 1024;  // > long_window: the outcome leaving a window is still there
  static_assert(ring_bits > long_window && long_window > short_window);

  bool at(std::uint64_t i) const noexcept { return ((ring_[(i % ring_bits) / 64] >> (i % 64)) & 1U) != 0; }

  void push(bool failed) noexcept {
    std::uint64_t& word = ring_[(count_ % ring_bits) / 64];
    const std::uint64_t bit = std::uint64_t{1} << (count_ % 64);
    word = failed ? word | bit : word & ~bit;
    ++count_;
    failures_ += failed ? 1 : 0;
    recent_ += failed ? 1 : 0;
    if (count_ > long_window) failures_ -= at(count_ - long_window - 1) ? 1 : 0;
    if (count_ > short_window) recent_ -= at(count_ - short_window - 1) ? 1 : 0;
  }

  std::uint64_t ring_[ring_bits / 64] = {};
  std::uint64_t count_ = 0;     // outcomes recorded
  std::size_t failures_ = 0;    // failures among the last long_window
  std::size_t recent_ = 0;      // failures among the last short_window
};

/// The readings of a sample that the loss- and delay-driven rules share beyond their own: whether a
/// congestion outcome is congestion (`failure_baseline`, for a rule that learns the failure rate) and the
/// latency to judge, per unit of work (`work_scale`). One per algorithm, fed every sample that is not
/// `ignored`, in order.
class sample_signals {
 public:
  /// Checks the sample's work hint, then records its outcome. False for a failure at the rate the dependency
  /// shows whatever the load (`learn`: the rule's `learn_failure_rate`): it says nothing to the rule, neither
  /// congestion nor a success.
  /// @throws std::invalid_argument if the work hint is negative, NaN or infinite; nothing is recorded then.
  template <class Sample>
  bool counts(const Sample& s, bool learn) {
    if (s.work) check_work(*s.work);
    const bool failed = s.result == outcome::congestion;
    return !learn || failures_.congested(failed) || !failed;
  }

  /// The latency to judge (`work_scale::judged`): per unit of work, nullopt for a call that did no work.
  std::optional<std::chrono::nanoseconds> judged(std::chrono::nanoseconds latency,
                                                 const std::optional<double>& work) noexcept {
    return scale_.judged(latency, work);
  }

  /// A noise floor as it shows in the judged latency (`work_scale::floor`).
  std::chrono::nanoseconds floor(std::chrono::nanoseconds noise_floor, const std::optional<double>& work) const noexcept {
    return scale_.floor(noise_floor, work);
  }

 private:
  work_scale scale_{};
  failure_baseline failures_{};
};

/// Where the latest cut found the dependency's capacity, and how many cuts in a row before it found the same
/// level (within a call). A probe above a level that the cuts keep finding again is futile, and each one costs
/// calls over the capacity: the algorithms let the next probe wait longer (`tuned_aimd`'s longer plateau,
/// `aimd`'s wait below the level), as CUBIC holds its window near the one of the last loss (RFC 8312).
class level_memory {
 public:
  /// Records a cut that found `level` (in calls); returns how many cuts in a row before it found the same
  /// level within a call (0: a new level).
  std::uint64_t found(double level) noexcept {
    repeats_ = std::abs(level - level_) < 1.0 ? repeats_ + 1 : 0;
    level_ = level;
    return repeats_;
  }
  /// The level the latest cut found (0 before any).
  double level() const noexcept { return level_; }
  /// How many cuts in a row before the latest one found its level.
  std::uint64_t repeats() const noexcept { return repeats_; }

 private:
  double level_ = 0.0;
  std::uint64_t repeats_ = 0;
};

/// The limit itself: always clamped to [floor, ceiling]; counts strict moves down and up.
class bounded_limit {
 public:
  bounded_limit(double min_limit, double initial_limit, double max_limit) noexcept
      : value_{initial_limit}, min_{min_limit}, max_{max_limit} {}

  double value() const noexcept { return value_; }
  double min() const noexcept { return min_; }
  double max() const noexcept { return max_; }
  std::uint64_t decreases() const noexcept { return decreases_; }
  std::uint64_t increases() const noexcept { return increases_; }

  /// New floor and ceiling (a setter's); the value is moved into them without counting a decrease or an
  /// increase (no sample moved it).
  void rebound(double min_limit, double max_limit) noexcept {
    min_ = min_limit;
    max_ = max_limit;
    if (value_ < min_) value_ = min_;
    if (value_ > max_) value_ = max_;
  }

  /// Clamps `next` into [min, max] and stores it; returns true if the limit moved.
  bool set(double next) noexcept {
    if (next < min_) next = min_;
    if (next > max_) next = max_;
    if (next == value_) return false;
    if (next < value_)
      ++decreases_;
    else
      ++increases_;
    value_ = next;
    return true;
  }

 private:
  double value_;
  double min_;
  double max_;
  std::uint64_t decreases_ = 0;
  std::uint64_t increases_ = 0;
};

}  // namespace detail
}  // namespace rein::algo
