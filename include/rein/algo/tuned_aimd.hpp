// AIMD judged against a rolling-median baseline, one cut per round trip (seed 000, step 4).
#pragma once

#include <rein/algo/limit_algorithm.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace rein::algo {

/// Options of `basic_tuned_aimd`.
///
/// The defaults are rein's, not the guide's: seed 000's `TunedAIMD` (window 50, tolerance 2.0, a 40 ms hold,
/// backoff 0.75, no app-limited guard) is the worst adaptive strategy in its own degrading-upstream
/// experiment (see `rein/testing/upstream_sim.hpp` and `../shared/reference/README.md`): the limit balloons
/// while demand is low, a tolerance of exactly 2 never flags a call one above capacity (5 ms median, 10 ms
/// call), and a short window lets the degradation become the new normal. With these defaults the experiment
/// has no failures and a p95 of 10 ms. To get the guide's limiter, set window 50, tolerance 2, backoff 0.75,
/// hold 40 ms and min_utilisation 0.
struct tuned_aimd_options {
  /// Starting limit, in calls; in [min_limit, max_limit].
  double initial_limit = 4.0;
  /// Floor, in calls: a whole number >= 1.
  double min_limit = 1.0;
  /// Ceiling, in calls: a whole number in [min_limit, 1e9] (`max_limit_ceiling`).
  double max_limit = 64.0;
  /// Multiplicative decrease on congestion; in (0, 1). 0.5 (TCP's) rather than the guide's 0.75: the cut
  /// is rate-limited to one per round trip, so each one must count.
  double backoff = 0.5;
  /// Each uncongested success adds `increase / max(1, limit)` calls; > 0.
  double increase = 1.0;
  /// Successful latencies kept for the rolling median baseline, in samples; in [min_samples, 100000]
  /// (`tuned_aimd_max_window`: the window is allocated up front and each sample costs O(window)). Long enough
  /// that a sustained degradation does not become "normal" before the limit has been cut.
  std::size_t window = 200;
  /// No latency judgement before this many successes are in the window (seed 000: 10); in [1, window].
  /// Congestion outcomes count from the first sample.
  std::size_t min_samples = 10;
  /// A success is congestion when its latency exceeds `median x tolerance`; finite and >= 1. Must stay
  /// below 2 for an upstream whose latency steps in multiples of its base (one call over capacity doubles it).
  double tolerance = 1.5;
  /// How long congestion is ignored after a cut. Unset (the default): exactly one round trip, i.e. a
  /// congested sample whose call started before the last cut was caused by the old limit and cuts nothing.
  /// Set: a fixed hold (seed 000 uses 2 x its 20 ms target = 40 ms); > 0 when set.
  std::optional<std::chrono::nanoseconds> hold{};
  /// The app-limited guard: grow only while `in_flight >= min_utilisation x limit`, so the limit does not
  /// balloon while demand is low (Netflix concurrency-limits uses 1/2). In [0, 1]; 0 disables it.
  double min_utilisation = 0.5;
};

/// The longest baseline window `basic_tuned_aimd` accepts, in samples.
inline constexpr std::size_t tuned_aimd_max_window = 100000;

namespace detail {

/// The median of the last `capacity` values: a ring buffer for age plus a sorted copy for rank.
/// O(capacity) per insertion (two shifts in a small contiguous vector), O(1) per query.
class rolling_median {
 public:
  explicit rolling_median(std::size_t capacity) : ring_(capacity) { sorted_.reserve(capacity); }

  std::size_t size() const noexcept { return sorted_.size(); }

  void push(std::int64_t v) {
    if (sorted_.size() == ring_.size()) {
      sorted_.erase(std::lower_bound(sorted_.begin(), sorted_.end(), ring_[next_]));
    }
    ring_[next_] = v;
    next_ = next_ + 1 == ring_.size() ? 0 : next_ + 1;
    sorted_.insert(std::upper_bound(sorted_.begin(), sorted_.end(), v), v);
  }

  /// The median; for an even count the mean of the two middle values. Precondition: size() > 0.
  double median() const noexcept {
    const std::size_t n = sorted_.size();
    const auto upper = static_cast<double>(sorted_[n / 2]);
    if (n % 2 == 1) return upper;
    return (static_cast<double>(sorted_[n / 2 - 1]) + upper) / 2.0;
  }

 private:
  std::vector<std::int64_t> ring_;
  std::vector<std::int64_t> sorted_;
  std::size_t next_ = 0;
};

}  // namespace detail

/// Seed 000's tuned AIMD, with rein's defaults.
///
/// - Baseline: the median latency of the last `window` successes (this one included). A success slower than
///   `median x tolerance` is congestion; so is every `congestion` outcome. No latency judgement before
///   `min_samples` successes.
/// - Congestion multiplies the limit by `backoff`, at most once per round trip (see `hold`); congestion inside
///   the hold changes nothing (it neither cuts nor grows).
/// - An uncongested success adds `increase / limit`, but only while the limiter is used (`min_utilisation`).
/// - `ignored` changes nothing and is not part of the baseline.
///
/// Compared with `basic_aimd`: occasional isolated slow calls cost far fewer cuts (a slow call is long, so it
/// usually started before the last cut), while a sustained slowdown still shrinks the limit.
///
/// @tparam Clock supplies the `time_point` of samples; time is only compared, never read.
template <class Clock = std::chrono::steady_clock>
class basic_tuned_aimd {
 public:
  using clock_type = Clock;
  using time_point = typename Clock::time_point;
  using options = tuned_aimd_options;
  using sample_type = basic_sample<Clock>;
  template <class OtherClock>
  using rebind_clock = basic_tuned_aimd<OtherClock>;

  /// @throws std::invalid_argument naming the field and value if `o` is invalid.
  explicit basic_tuned_aimd(const options& o = {})
      : options_{validated(o)}, limit_{o.min_limit, o.initial_limit, o.max_limit}, baseline_{o.window} {}

  double limit() const noexcept { return limit_.value(); }
  double min_limit() const noexcept { return limit_.min(); }
  double max_limit() const noexcept { return limit_.max(); }
  std::uint64_t decreases() const noexcept { return limit_.decreases(); }
  std::uint64_t increases() const noexcept { return limit_.increases(); }
  /// Congested samples that fell inside a hold and changed nothing.
  std::uint64_t held() const noexcept { return held_; }
  const options& get_options() const noexcept { return options_; }

  /// The current baseline in nanoseconds (the rolling median), or nullopt before `min_samples` successes.
  std::optional<double> baseline() const noexcept {
    if (baseline_.size() < options_.min_samples) return std::nullopt;
    return baseline_.median();
  }

  /// Applies one completed call.
  void on_sample(const sample_type& s) {
    if (s.result == outcome::ignored) return;
    if (congested(s)) {
      cut(s);
    } else if (used(s)) {
      limit_.set(limit_.value() + options_.increase / (limit_.value() > 1.0 ? limit_.value() : 1.0));
    }
  }

 private:
  bool congested(const sample_type& s) {
    if (s.result == outcome::congestion) return true;
    baseline_.push(s.latency.count());
    if (baseline_.size() < options_.min_samples) return false;
    return static_cast<double>(s.latency.count()) > baseline_.median() * options_.tolerance;
  }

  void cut(const sample_type& s) noexcept {
    if (holding(s)) {
      ++held_;
      return;
    }
    last_cut_ = s.now;
    limit_.set(limit_.value() * options_.backoff);
  }

  bool holding(const sample_type& s) const noexcept {
    if (!last_cut_) return false;
    if (options_.hold) return s.now - *last_cut_ < *options_.hold;
    return s.now - s.latency < *last_cut_;
  }

  bool used(const sample_type& s) const noexcept {
    return static_cast<double>(s.in_flight) >= options_.min_utilisation * limit_.value();
  }

  static const options& validated(const options& o) {
    detail::check_limits("tuned_aimd", o.min_limit, o.initial_limit, o.max_limit);
    detail::check_open_unit("tuned_aimd", "backoff", o.backoff);
    detail::check_positive("tuned_aimd", "increase", o.increase);
    if (o.window < 1 || o.window > tuned_aimd_max_window)
      detail::invalid_option("tuned_aimd", "window", "in [1, 100000]", o.window);
    if (o.min_samples < 1 || o.min_samples > o.window)
      detail::invalid_option("tuned_aimd", "min_samples", "in [1, window]", o.min_samples);
    if (!detail::finite(o.tolerance) || o.tolerance < 1.0)
      detail::invalid_option("tuned_aimd", "tolerance", ">= 1 and finite", o.tolerance);
    if (o.hold) detail::check_positive("tuned_aimd", "hold", *o.hold);
    if (!detail::finite(o.min_utilisation) || o.min_utilisation < 0.0 || o.min_utilisation > 1.0)
      detail::invalid_option("tuned_aimd", "min_utilisation", "in [0, 1]", o.min_utilisation);
    return o;
  }

  options options_;
  detail::bounded_limit limit_;
  detail::rolling_median baseline_;
  std::optional<time_point> last_cut_{};
  std::uint64_t held_ = 0;
};

/// `basic_tuned_aimd` on `std::chrono::steady_clock`.
using tuned_aimd = basic_tuned_aimd<>;

}  // namespace rein::algo
