// Exponential backoff with full jitter (AWS Architecture Blog, "Exponential Backoff And Jitter", 2015), with
// an upstream's Retry-After honoured on top. Pure: the random number is an argument, so every delay is exact
// and testable; rein::retry draws it.
#pragma once

#include <rein/detail/invalid_option.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>

namespace rein::algo {

/// Options of `backoff`. All durations in nanoseconds (any coarser std::chrono duration converts implicitly).
struct backoff_options {
  /// Upper bound of the first retry's jitter window; doubles per failed attempt. Must be > 0.
  std::chrono::nanoseconds base{std::chrono::milliseconds{100}};
  /// Largest jitter window, however many attempts failed. Must be >= base.
  std::chrono::nanoseconds cap{std::chrono::seconds{10}};
  /// Most attempts in total, the first included (gRPC's maxAttempts); 1 disables retries. Must be >= 1.
  std::uint32_t max_attempts = 4;
  /// Longest wait an upstream's Retry-After may impose; a longer one is cut to this. Must be >= 0.
  std::chrono::nanoseconds max_retry_after{std::chrono::seconds{120}};
};

/// Decides whether to retry and how long to wait first: exponential backoff with full jitter.
///
/// After the n-th failed attempt the window is `ceiling(n) = min(cap, base * 2^(n-1))` and the delay is
/// `floor(uniform01 * ceiling(n))` nanoseconds: "full jitter" of the AWS Architecture Blog, which spreads
/// competing clients over the whole window and completes the work with the fewest calls of the schemes it
/// compares. When the failure carries a Retry-After (see `rein::parse_retry_after`), the delay is the larger of
/// the jittered delay and the Retry-After capped at `max_retry_after`: the server's word is a floor, never
/// shortened by jitter, and an absurd one cannot stall the caller for hours.
///
/// A plain value type: no clock, no randomness, no allocation after construction.
/// @par Thread Safety
/// Distinct objects: safe. Shared objects: safe (all members are const).
class backoff {
 public:
  /// The options type, as the constructor takes them.
  using options_type = backoff_options;

  /// @throws std::invalid_argument naming the field and value when an option is out of range.
  explicit backoff(const backoff_options& options = {}) : options_(validated(options)) {}

  /// The options in force (as validated at construction).
  const backoff_options& get_options() const noexcept { return options_; }

  /// Whether another attempt may follow `failed_attempts` failed ones: `failed_attempts < max_attempts`.
  bool may_retry(std::uint32_t failed_attempts) const noexcept { return failed_attempts < options_.max_attempts; }

  /// The jitter window after the `failed_attempts`-th failure: `min(cap, base * 2^(failed_attempts-1))`,
  /// computed without overflow for any count.
  /// @throws std::invalid_argument if `failed_attempts` is 0 (no failure, nothing to back off from).
  std::chrono::nanoseconds ceiling(std::uint32_t failed_attempts) const {
    if (failed_attempts == 0) fail("ceiling: failed_attempts must be >= 1", 0);
    const auto base = options_.base.count();
    const auto cap = options_.cap.count();
    const std::uint32_t doublings = failed_attempts - 1;
    if (doublings >= 63 || base > (cap >> doublings)) return options_.cap;
    return std::chrono::nanoseconds{base << doublings};
  }

  /// The delay before the next attempt after `failed_attempts` failures, in nanoseconds.
  ///
  /// @param failed_attempts failures so far, >= 1.
  /// @param uniform01 a random number drawn uniformly from [0, 1) (1 is accepted too and gives the ceiling).
  /// @param retry_after the wait the upstream asked for, if any (>= 0): the result is at least
  ///        `min(*retry_after, max_retry_after)`.
  /// @throws std::invalid_argument if `failed_attempts` is 0, `uniform01` is not in [0, 1] (NaN included), or
  ///         `retry_after` is negative.
  std::chrono::nanoseconds delay(std::uint32_t failed_attempts, double uniform01,
                                 std::optional<std::chrono::nanoseconds> retry_after = std::nullopt) const {
    rein::detail::checked_draw("rein::algo::backoff", "delay: uniform01", uniform01);
    if (retry_after && *retry_after < retry_after->zero())
      fail("delay: retry_after must be >= 0", *retry_after);
    const auto jittered = jitter(ceiling(failed_attempts), uniform01);
    if (!retry_after) return jittered;
    return std::max(jittered, std::min(*retry_after, options_.max_retry_after));
  }

 private:
  static std::chrono::nanoseconds jitter(std::chrono::nanoseconds window, double uniform01) noexcept {
    // Past 2^53 ns (104 days) the product is inexact and may round above the window; clamp so the cast
    // below never sees a value outside the integer range.
    const double product = std::floor(uniform01 * static_cast<double>(window.count()));
    if (product >= static_cast<double>(window.count())) return window;
    return std::chrono::nanoseconds{static_cast<std::chrono::nanoseconds::rep>(product)};
  }

  static backoff_options validated(const backoff_options& o) {
    if (o.base <= o.base.zero()) fail("base must be > 0", o.base);
    if (o.cap < o.base) fail("cap must be >= base (" + rein::detail::show(o.base) + ")", o.cap);
    if (o.max_attempts < 1) fail("max_attempts must be >= 1", 0);
    if (o.max_retry_after < o.max_retry_after.zero())
      fail("max_retry_after must be >= 0", o.max_retry_after);
    return o;
  }



  template <class Value>
  [[noreturn]] static void fail(const std::string& rule, Value got) {
    rein::detail::throw_invalid("rein::algo::backoff", rule, rein::detail::show(got));
  }

  backoff_options options_;
};

}  // namespace rein::algo
