// When to hedge a call: a fixed delay, or a percentile of the latencies of the last full period (tower's
// hedge reads a rotating histogram the same way). Pure: time is an argument.
#pragma once

#include <rein/algo/log_histogram.hpp>
#include <rein/detail/invalid_option.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace rein::algo {

/// Options of `basic_hedge_delay`.
struct hedge_delay_options {
  /// The delay when `quantile` is unset, and while the latencies read hold fewer than `min_samples` values.
  /// > 0. Default 2 s (Polly's HedgingStrategyOptions.Delay).
  std::chrono::nanoseconds delay{std::chrono::seconds{2}};
  /// Set: the delay is this percentile, in (0, 100), of the latencies read (nearest rank, as
  /// log_histogram::percentile reads it). Unset: the fixed `delay`.
  std::optional<double> quantile{};
  /// The fewest latencies a percentile is read from (tower's min_data_points); >= 1.
  std::uint64_t min_samples = 20;
  /// Latencies are read from the last full period of this length; > 0.
  std::chrono::nanoseconds latency_period{std::chrono::seconds{10}};
};

/// The hedge delay of a call: the fixed delay, or the `quantile` percentile of recent latencies once enough
/// are known.
///
/// Recent latencies are kept as tower's RotatingHistogram keeps them: `record` writes into the current
/// period's histogram, `delay` reads the previous full period's; the first call at or after the current
/// period's end rotates (the current becomes the previous, and a new period starts at that call's time), and
/// a rotation after two periods or more without one leaves nothing to read (stale latencies are dropped).
/// The first period starts at the first call. A time earlier than the period's start counts as its start.
///
/// A percentile of zero (every latency read was under 16 ns) is a delay of zero: every call hedges at once,
/// as far as a hedge budget allows.
///
/// @tparam Clock supplies `time_point` and `duration`; only its types are used, never `now()`.
/// @par Thread Safety
/// Distinct objects: safe. Shared objects: unsafe (the async layer guards it with its mutex).
template <class Clock = std::chrono::steady_clock>
class basic_hedge_delay {
 public:
  /// The clock whose time points the calls take.
  using clock_type = Clock;
  /// A point in time of `clock_type`.
  using time_point = typename Clock::time_point;
  /// The options type, as the constructor takes them.
  using options_type = hedge_delay_options;

  /// @throws std::invalid_argument naming rein::algo::hedge_delay, the field and the value when an option
  /// is out of range.
  explicit basic_hedge_delay(const hedge_delay_options& options = {}) : options_(options) {
    if (options.delay <= std::chrono::nanoseconds::zero()) fail("delay must be > 0", rein::detail::show(options.delay));
    if (options.quantile && !(*options.quantile > 0.0 && *options.quantile < 100.0))
      fail("quantile must be in (0, 100)", rein::detail::show(*options.quantile));
    if (options.min_samples == 0) fail("min_samples must be >= 1", rein::detail::show(options.min_samples));
    if (options.latency_period <= std::chrono::nanoseconds::zero())
      fail("latency_period must be > 0", rein::detail::show(options.latency_period));
  }

  /// The options in force (as validated at construction).
  const hedge_delay_options& get_options() const noexcept { return options_; }

  /// The delay read from `latencies`: its `quantile` percentile once it holds min_samples values,
  /// otherwise (or without a quantile) the fixed delay.
  std::chrono::nanoseconds delay_for(const log_histogram& latencies) const noexcept {
    if (!options_.quantile || latencies.count() < options_.min_samples) return options_.delay;
    return latencies.percentile(*options_.quantile);
  }

  /// The delay at `now`, read from the last full period's latencies.
  std::chrono::nanoseconds delay(time_point now) noexcept {
    rotate(now);
    return delay_for(previous_);
  }

  /// Records an attempt's latency, ended at `now`.
  void record(time_point now, std::chrono::nanoseconds latency) noexcept {
    rotate(now);
    current_.record(latency);
  }

  /// The latencies recorded in the current period.
  const log_histogram& current() const noexcept { return current_; }

  /// The latencies of the last full period (what delay() reads).
  const log_histogram& previous() const noexcept { return previous_; }

 private:
  void rotate(time_point now) noexcept {
    if (!started_) {
      started_ = true;
      start_ = now;
      return;
    }
    if (now <= start_) return;
    const std::chrono::nanoseconds elapsed = now - start_;
    if (elapsed < options_.latency_period) return;
    previous_ = elapsed - options_.latency_period >= options_.latency_period ? log_histogram{} : std::move(current_);
    current_.reset();
    start_ = now;
  }

  [[noreturn]] static void fail(const std::string& rule, const std::string& got) {
    rein::detail::throw_invalid("rein::algo::hedge_delay", rule, got);
  }

  hedge_delay_options options_;
  log_histogram previous_{};
  log_histogram current_{};
  time_point start_{};
  bool started_ = false;
};

/// The hedge delay on std::chrono::steady_clock.
using hedge_delay = basic_hedge_delay<>;

}  // namespace rein::algo
