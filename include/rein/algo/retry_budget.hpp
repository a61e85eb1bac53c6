// A retry budget: retries may be at most a fraction of recent requests, plus a small floor, so that retries
// cannot snowball into a retry storm when a dependency fails (Finagle's RetryBudget; gRPC's retry throttling
// is the same idea with a different bookkeeping). Pure: time is an argument.
#pragma once

#include <rein/detail/epoch_slices.hpp>
#include <rein/detail/invalid_option.hpp>

#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace rein::algo {

/// Options of `basic_retry_budget`. Defaults are Finagle's (RetryBudget.apply: 10 s, 10/s, 20%).
struct retry_budget_options {
  /// How long a request's deposit (and a retry's withdrawal) counts. Must be a positive multiple of
  /// 10 ticks of the clock (the window moves in tenths of it).
  std::chrono::nanoseconds ttl{std::chrono::seconds{10}};
  /// Retries allowed even with no requests at all, per second: a floor so that a quiet client can still
  /// retry. Finite, >= 0; `min_retries_per_second * ttl` retries may be spent per window.
  double min_retries_per_second = 10.0;
  /// Retries allowed per request: 0.2 lets 20% of requests be retried once. Finite, in [0, 1000] (above 1
  /// when several retries per request are acceptable).
  double retry_ratio = 0.2;
};

/// Limits retries to a fraction of the requests made within a recent window, plus a fixed reserve.
///
/// Bookkeeping is Finagle's RetryBudget (a "leaky" token bucket): every original request deposits
/// `retry_ratio` of a retry, every retry withdraws one whole retry if the balance allows it, and both expire
/// after `ttl`; the balance is the unexpired sum plus a reserve of `min_retries_per_second * ttl` retries.
/// Amounts are kept as integers in millionths of a retry (`units_per_retry`), so `retry_ratio` and the
/// reserve are rounded to the nearest millionth and every result is exact.
///
/// The window is `slices` = 10 slices of `ttl / 10`, aligned to the clock's epoch: an entry made at `t` counts
/// until the start of the slice `ttl` after the slice holding `t`, i.e. for between `ttl - ttl/10` and `ttl`.
/// The balance may go negative when deposits expire before the retries they paid for; retries then wait until
/// those withdrawals expire too. A time earlier than the latest one seen counts as the latest (a clock is not
/// expected to go backwards; this keeps the object consistent if a caller's reads interleave).
///
/// Deposit for original requests only; a retry calls `try_withdraw` and, if refused, is not made.
/// @tparam Clock supplies `time_point` and `duration`; only its types are used, never `now()`.
/// @par Thread Safety
/// Distinct objects: safe. Shared objects: unsafe (the async layer guards it with its mutex).
template <class Clock = std::chrono::steady_clock>
class basic_retry_budget {
 public:
  /// The clock that times the rule and the deadlines.
  using clock_type = Clock;
  /// A point in time of `clock_type`.
  using time_point = typename Clock::time_point;
  /// A duration of `clock_type`.
  using duration = typename Clock::duration;
  /// The options type, as the constructor takes them.
  using options_type = retry_budget_options;

  /// Slices per window.
  static constexpr std::int64_t slices = 10;
  /// One retry, in the integer units of the balance.
  static constexpr std::int64_t units_per_retry = 1'000'000;

  /// @throws std::invalid_argument naming the field and value when an option is out of range.
  explicit basic_retry_budget(const retry_budget_options& options = {})
      : options_(options), slice_(slice_width(options.ttl)), deposit_(per_request(options.retry_ratio)),
        reserve_(reserve_units(options)) {}

  /// The options in force (as validated at construction).
  const retry_budget_options& get_options() const noexcept { return options_; }

  /// Records one original request at `now`, adding `retry_ratio` of a retry to the balance for `ttl`.
  void deposit(time_point now) noexcept {
    std::int64_t& slot = advance(now);
    slot = slot > slot_cap - deposit_ ? slot_cap : slot + deposit_;
  }

  /// Asks to make one retry at `now`: if the balance holds at least one retry, charges it and returns true;
  /// otherwise changes nothing and returns false (the caller gives up instead of retrying).
  [[nodiscard]] bool try_withdraw(time_point now) noexcept {
    std::int64_t& slot = advance(now);
    if (units(now) < units_per_retry) return false;
    slot -= units_per_retry;
    return true;
  }

  /// The balance at `now` in millionths of a retry: reserve plus unexpired deposits minus unexpired
  /// withdrawals. May be negative (see the class notes).
  std::int64_t units(time_point now) const noexcept {
    const std::int64_t k = slice_index(now);
    const std::int64_t gap = k <= current_ ? 0 : distance(current_, k);
    std::int64_t sum = reserve_;
    for (std::int64_t back = 0; back + gap < slices && started_; ++back) sum += counts_[slot_of(current_ - back)];
    return sum;
  }

  /// Whole retries `try_withdraw` would grant at `now` if asked repeatedly (0 when the balance is negative).
  std::int64_t retries_available(time_point now) const noexcept {
    const std::int64_t balance = units(now);
    return balance <= 0 ? 0 : balance / units_per_retry;
  }

 private:
  static constexpr std::int64_t max = std::numeric_limits<std::int64_t>::max();
  // Deposits stop growing a slot here (half a trillion retries), so that ten slots plus the largest
  // reserve (1e18) always sum within int64 and a withdrawal, granted only while the sum is positive,
  // can never push a slot below -max/2.
  static constexpr std::int64_t slot_cap = std::int64_t{1} << 59;
  static_assert(std::is_integral_v<typename Clock::duration::rep>,
                "rein::algo::basic_retry_budget: the clock must count integer ticks");

  // The slot for `now`, after expiring the slices that left the window since the last call.
  std::int64_t& advance(time_point now) noexcept {
    const std::int64_t k = slice_index(now);
    if (!started_ || (k > current_ && distance(current_, k) >= slices)) {
      counts_.fill(0);
    } else {
      const std::int64_t gap = k > current_ ? distance(current_, k) : 0;
      for (std::int64_t i = 1; i <= gap; ++i) counts_[slot_of(current_ + i)] = 0;
    }
    if (!started_ || k > current_) current_ = k;
    started_ = true;
    return counts_[slot_of(current_)];
  }

  std::int64_t slice_index(time_point now) const noexcept { return rein::detail::slice_index(now, slice_); }

  // later - earlier for later > earlier, saturating instead of overflowing (the true difference fits u64).
  static std::int64_t distance(std::int64_t earlier, std::int64_t later) noexcept {
    const auto d = static_cast<std::uint64_t>(later) - static_cast<std::uint64_t>(earlier);
    return d > static_cast<std::uint64_t>(max) ? max : static_cast<std::int64_t>(d);
  }

  static std::size_t slot_of(std::int64_t slice) noexcept {
    return static_cast<std::size_t>(((slice % slices) + slices) % slices);
  }

  static duration slice_width(std::chrono::nanoseconds ttl) {
    return rein::detail::slice_width<duration>("rein::algo::retry_budget", "ttl", ttl, slices);
  }

  static std::int64_t per_request(double ratio) {
    if (!(ratio >= 0.0 && ratio <= 1000.0)) fail("retry_ratio must be in [0, 1000] and finite", ratio);
    return std::llround(ratio * static_cast<double>(units_per_retry));
  }

  static std::int64_t reserve_units(const retry_budget_options& o) {
    const double rate = o.min_retries_per_second;
    if (!(rate >= 0.0 && rate <= 1e9)) fail("min_retries_per_second must be in [0, 1e9] and finite", rate);
    // rate x ttl in seconds x units: ttl's nanoseconds over 1000 make it exact for whole microseconds.
    const double reserve = rate * static_cast<double>(o.ttl.count()) / 1000.0;
    if (reserve > 1e18) fail("min_retries_per_second x ttl must be at most 1e12 retries", reserve / 1e6);
    return std::llround(reserve);
  }


  template <class Value>
  [[noreturn]] static void fail(const std::string& rule, Value got) {
    rein::detail::throw_invalid("rein::algo::retry_budget", rule, rein::detail::show(got));
  }

  retry_budget_options options_;
  duration slice_;
  std::int64_t deposit_;
  std::int64_t reserve_;
  std::array<std::int64_t, slices> counts_{};
  std::int64_t current_ = 0;  // the latest slice seen; meaningful once started_
  bool started_ = false;
};

/// The retry budget on std::chrono::steady_clock.
using retry_budget = basic_retry_budget<>;

}  // namespace rein::algo
