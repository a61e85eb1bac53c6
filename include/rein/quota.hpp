// A quota in the user's units: "600 per minute", "1,000 per day", "one every 250 ms". Pure, no Asio.
#pragma once

#include <rein/detail/invalid_option.hpp>

#include <chrono>
#include <cmath>
#include <string>

namespace rein {

/// A rate written as a provider publishes it: `count` units per `period`, refilled evenly (greedy refill:
/// one unit every `period / count`, never the whole count at once).
///
/// A quota converts to a rate in units per second, so every option that takes one accepts it directly:
/// `rein::token_bucket_options{.rate = rein::per_minute(600), .capacity = 10}` (10 per second),
/// `.rate = rein::per_day(1000)` (1000 / 86400 per second, held exactly as 5/432 by the bucket),
/// `.rate = rein::every(250ms)` (4 per second, Go's `rate.Every`). The peers: Go's `rate.Every`, governor's
/// `Quota::per_minute`, Bucket4j's `Bandwidth` with `refillGreedy`.
///
/// @par The burst
/// A quota says how fast units come back, not how many may go at once: that is the bucket's capacity, and
/// it is the caller's to state. Take the upstream's own: the per-period count where the provider's bucket
/// holds a whole period (OpenAI's RPM and TPM), 1 where it refuses any arrival earlier than its interval
/// (nginx `limit_req` without `burst`), N where it allows N early arrivals (`burst=N`). A call whose charge
/// exceeds the capacity can never be admitted (rein::errc::exceeds_capacity), so the capacity must hold the
/// largest single charge (an LLM call's token estimate).
///
/// @par Interval refill
/// A provider that grants the whole count at each period's start (a fixed window, "1,000 per calendar
/// day") is a rein::fixed_window with `{.limit = count, .window = period}`; a quota counted over any
/// period-long window is a rein::sliding_window with the same two fields. Windows count whole units, so
/// they take the count and period as they are.
///
/// @par Thread Safety
/// A plain value.
class quota {
 public:
  /// `count` units per `period`.
  /// @throws std::invalid_argument naming rein::quota, the field and the value, if `count` or `period` is
  /// not finite and > 0 (NaN, infinities, 0 and negatives refused), or if their quotient is not a finite
  /// positive number of units per second.
  template <class Rep, class Period>
  quota(double count, std::chrono::duration<Rep, Period> period)
      : count_(checked_count(count)), period_(checked_period(std::chrono::duration<double>(period))) {
    per_second_ = count_ / period_.count();
    if (!(std::isfinite(per_second_) && per_second_ > 0)) {
      detail::throw_invalid(type_name, "count / period must be a finite rate > 0 per second", detail::show(per_second_));
    }
  }

  /// Units per period, as given.
  double count() const noexcept { return count_; }
  /// The period, in seconds.
  std::chrono::duration<double> period() const noexcept { return period_; }
  /// The rate: units per second.
  double per_second() const noexcept { return per_second_; }
  /// The rate in units per second, so that a quota can stand wherever a rate option is a `double`.
  operator double() const noexcept { return per_second_; }

 private:
  static constexpr const char* type_name = "rein::quota";

  static double checked_count(double count) {
    if (!(std::isfinite(count) && count > 0)) detail::throw_invalid(type_name, "count must be finite and > 0", detail::show(count));
    return count;
  }

  static std::chrono::duration<double> checked_period(std::chrono::duration<double> period) {
    const double seconds = period.count();
    if (!(std::isfinite(seconds) && seconds > 0)) {
      detail::throw_invalid(type_name, "period must be finite and > 0 seconds", detail::show(seconds) + " s");
    }
    return period;
  }

  double count_;
  std::chrono::duration<double> period_;
  double per_second_;
};

/// `count` units per second.
inline quota per_second(double count) { return quota(count, std::chrono::seconds(1)); }
/// `count` units per minute (a provider's RPM or TPM).
inline quota per_minute(double count) { return quota(count, std::chrono::minutes(1)); }
/// `count` units per hour.
inline quota per_hour(double count) { return quota(count, std::chrono::hours(1)); }
/// `count` units per day (86,400 s; a calendar day that starts at midnight is a rein::fixed_window).
inline quota per_day(double count) { return quota(count, std::chrono::hours(24)); }

/// One unit every `interval` (Go's `rate.Every`).
/// @throws std::invalid_argument if `interval` is not finite and > 0.
template <class Rep, class Period>
quota every(std::chrono::duration<Rep, Period> interval) {
  return quota(1.0, interval);
}

}  // namespace rein
