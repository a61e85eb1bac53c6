// Pure retry rules: exponential backoff with full jitter, and the retry budget.
#include <rein/algo/backoff.hpp>
#include <rein/algo/retry_budget.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>

#include "support/catch.hpp"

using namespace std::chrono_literals;
using std::chrono::nanoseconds;
using rein::algo::backoff;
using rein::algo::backoff_options;

namespace {

backoff_options options(nanoseconds base, nanoseconds cap, std::uint32_t max_attempts = 4,
                        nanoseconds max_retry_after = 120s) {
  backoff_options o;
  o.base = base;
  o.cap = cap;
  o.max_attempts = max_attempts;
  o.max_retry_after = max_retry_after;
  return o;
}

}  // namespace

TEST_CASE("the jitter window doubles per failure from base up to cap", "[backoff]") {
  const backoff b;  // defaults: base 100 ms, cap 10 s
  CHECK(b.ceiling(1) == 100ms);
  CHECK(b.ceiling(2) == 200ms);
  CHECK(b.ceiling(3) == 400ms);
  CHECK(b.ceiling(7) == 6400ms);
  CHECK(b.ceiling(8) == 10s);  // 12.8 s capped
  CHECK(b.ceiling(1000) == 10s);
  CHECK(b.ceiling(std::numeric_limits<std::uint32_t>::max()) == 10s);
}

TEST_CASE("the window never overflows, even with the largest cap", "[backoff]") {
  const backoff b{options(1ns, nanoseconds::max())};
  CHECK(b.ceiling(63) == nanoseconds{std::int64_t{1} << 62});
  CHECK(b.ceiling(64) == nanoseconds::max());  // 2^63 ns would overflow
  CHECK(b.ceiling(100) == nanoseconds::max());
  CHECK(b.delay(64, 1.0) == nanoseconds::max());  // the product rounds up to 2^63 in double: clamped
}

TEST_CASE("full jitter scales the window by the random number", "[backoff]") {
  const backoff b;
  CHECK(b.delay(1, 0.5) == 50ms);
  CHECK(b.delay(3, 0.25) == 100ms);
  CHECK(b.delay(8, 0.5) == 5s);
  CHECK(b.delay(2, 0.0) == 0ns);
  CHECK(b.delay(2, 1.0) == 200ms);
  CHECK(b.delay(1, std::nextafter(1.0, 0.0)) == 100ms - 1ns);
}

TEST_CASE("a Retry-After is a floor under the jittered delay", "[backoff]") {
  const backoff b;
  CHECK(b.delay(1, 0.5, 3s) == 3s);               // server asks for more than the jitter
  CHECK(b.delay(8, 0.9, 1s) == 9s);               // jitter already waits longer
  CHECK(b.delay(1, 0.5, 0ns) == 50ms);            // "0": no floor beyond the jitter
  CHECK(b.delay(1, 0.5, std::nullopt) == 50ms);
}

TEST_CASE("a Retry-After longer than max_retry_after is cut to it", "[backoff]") {
  const backoff b;  // max_retry_after 120 s
  CHECK(b.delay(1, 0.5, 1h) == 120s);
  CHECK(b.delay(1, 0.5, nanoseconds::max()) == 120s);
  CHECK(b.delay(1, 0.5, 120s) == 120s);
  const backoff small{options(1s, 10s, 4, 2s)};
  CHECK(small.delay(4, 0.5, 1h) == 4s);  // the cut is on the server's wish, not on the jitter
}

TEST_CASE("max_attempts counts the first attempt", "[backoff]") {
  const backoff b;  // 4 attempts: the first and 3 retries
  CHECK(b.may_retry(1));
  CHECK(b.may_retry(3));
  CHECK_FALSE(b.may_retry(4));
  CHECK_FALSE(b.may_retry(5));
  const backoff once{options(1s, 1s, 1)};
  CHECK_FALSE(once.may_retry(1));
}

TEST_CASE("backoff rejects bad options, naming the field and value", "[backoff]") {
  CHECK_THROWS_WITH(backoff(options(0ns, 1s)), "rein::algo::backoff: base must be > 0, got 0 ns");
  CHECK_THROWS_WITH(backoff(options(-1ms, 1s)), "rein::algo::backoff: base must be > 0, got -1000000 ns");
  CHECK_THROWS_WITH(backoff(options(2s, 1s)),
                    "rein::algo::backoff: cap must be >= base (2000000000 ns), got 1000000000 ns");
  CHECK_THROWS_WITH(backoff(options(1s, 1s, 0)), "rein::algo::backoff: max_attempts must be >= 1, got 0");
  CHECK_THROWS_WITH(backoff(options(1s, 1s, 1, -1ns)),
                    "rein::algo::backoff: max_retry_after must be >= 0, got -1 ns");
  CHECK_THROWS_AS(backoff(options(0ns, 1s)), std::invalid_argument);
  CHECK_NOTHROW(backoff(options(1s, 1s, 1, 0ns)));
}

TEST_CASE("backoff rejects bad arguments to delay", "[backoff]") {
  const backoff b;
  CHECK_THROWS_WITH(b.delay(1, 1.5), "rein::algo::backoff: delay: uniform01 must be in [0, 1], got 1.5");
  CHECK_THROWS_WITH(b.delay(1, -0.25), "rein::algo::backoff: delay: uniform01 must be in [0, 1], got -0.25");
  CHECK_THROWS_WITH(b.delay(1, std::nan("")), "rein::algo::backoff: delay: uniform01 must be in [0, 1], got nan");
  CHECK_THROWS_WITH(b.delay(0, 0.5), "rein::algo::backoff: ceiling: failed_attempts must be >= 1, got 0");
  CHECK_THROWS_WITH(b.delay(1, 0.5, -5s),
                    "rein::algo::backoff: delay: retry_after must be >= 0, got -5000000000 ns");
}

// ---------------------------------------------------------------------------------------------------------
// retry budget (Finagle RetryBudget)

namespace {

using rein::algo::retry_budget;
using rein::algo::retry_budget_options;
using time_point = std::chrono::steady_clock::time_point;

constexpr std::int64_t unit = retry_budget::units_per_retry;
const time_point t0{};

retry_budget_options budget_options(double min_per_second, double ratio, nanoseconds ttl = 10s) {
  retry_budget_options o;
  o.ttl = ttl;
  o.min_retries_per_second = min_per_second;
  o.retry_ratio = ratio;
  return o;
}

int withdraw_all(retry_budget& budget, time_point now) {
  int granted = 0;
  while (budget.try_withdraw(now)) ++granted;
  return granted;
}

}  // namespace

TEST_CASE("a fresh budget holds the reserve: min retries per second times ttl", "[retry_budget]") {
  retry_budget budget;  // Finagle defaults: 10 s, 10/s, 20%
  CHECK(budget.units(t0) == 100 * unit);
  CHECK(budget.retries_available(t0) == 100);
  CHECK(withdraw_all(budget, t0) == 100);
  CHECK(budget.units(t0) == 0);
}

TEST_CASE("each request deposits retry_ratio of a retry", "[retry_budget]") {
  retry_budget budget{budget_options(0, 0.2)};
  CHECK_FALSE(budget.try_withdraw(t0));
  for (int i = 0; i < 10; ++i) budget.deposit(t0);
  CHECK(budget.units(t0) == 2 * unit);
  CHECK(withdraw_all(budget, t0) == 2);
  for (int i = 0; i < 4; ++i) budget.deposit(t0);
  CHECK(budget.units(t0) == 800'000);  // 0.8 of a retry: not enough for one
  CHECK_FALSE(budget.try_withdraw(t0));
  budget.deposit(t0);
  CHECK(budget.try_withdraw(t0));
}

TEST_CASE("a refused withdrawal changes nothing", "[retry_budget]") {
  retry_budget budget{budget_options(0, 0.5)};
  budget.deposit(t0);
  CHECK_FALSE(budget.try_withdraw(t0 + 1s));
  CHECK(budget.units(t0 + 1s) == unit / 2);
}

TEST_CASE("deposits expire a window after their slice starts", "[retry_budget]") {
  retry_budget budget{budget_options(0, 0.5)};  // ttl 10 s: slices of 1 s
  for (int i = 0; i < 4; ++i) budget.deposit(t0 + 500ms);  // slice [0 s, 1 s)
  CHECK(budget.retries_available(t0 + 9999ms) == 2);
  CHECK(budget.retries_available(t0 + 10s) == 0);
  CHECK(budget.try_withdraw(t0 + 9999ms));
  CHECK(budget.units(t0 + 10s) == -unit);  // the deposits left; the retry of t = 9.999 s still counts
  CHECK_FALSE(budget.try_withdraw(t0 + 10s));
}

TEST_CASE("withdrawals from the reserve come back after the window", "[retry_budget]") {
  retry_budget budget{budget_options(1, 0)};  // reserve: 1/s x 10 s = 10 retries
  CHECK(withdraw_all(budget, t0) == 10);
  CHECK(withdraw_all(budget, t0 + 9s) == 0);
  CHECK(withdraw_all(budget, t0 + 10s) == 10);
}

TEST_CASE("retries outliving their deposits leave the balance negative until they expire", "[retry_budget]") {
  retry_budget budget{budget_options(0, 1.0)};
  budget.deposit(t0);
  budget.deposit(t0);
  CHECK(withdraw_all(budget, t0 + 5s) == 2);
  CHECK(budget.units(t0 + 10s) == -2 * unit);  // deposits gone, withdrawals still count
  CHECK(budget.retries_available(t0 + 10s) == 0);
  budget.deposit(t0 + 10s);
  budget.deposit(t0 + 10s);
  CHECK_FALSE(budget.try_withdraw(t0 + 10s));
  CHECK(budget.units(t0 + 15s) == 2 * unit);  // the withdrawals of t = 5 s have expired
}

TEST_CASE("a window of silence clears everything but the reserve", "[retry_budget]") {
  retry_budget budget{budget_options(0.5, 1.0)};  // reserve 5 retries
  for (int i = 0; i < 7; ++i) budget.deposit(t0);
  CHECK(budget.retries_available(t0) == 12);
  CHECK(budget.retries_available(t0 + 1h) == 5);
  budget.deposit(t0 + 1h);
  CHECK(budget.units(t0 + 1h) == 6 * unit);
}

TEST_CASE("a time earlier than the latest seen counts in the latest slice", "[retry_budget]") {
  retry_budget budget{budget_options(0, 1.0)};
  budget.deposit(t0 + 5s);
  budget.deposit(t0 + 2s);  // charged to slice 5, so it lives until t = 15 s, not 12 s
  CHECK(budget.units(t0 + 14s) == 2 * unit);
  CHECK(budget.units(t0 + 15s) == 0);
  CHECK(budget.units(t0) == 2 * unit);  // reading the past reads the latest state
}

TEST_CASE("retry_ratio and the reserve are rounded to millionths of a retry", "[retry_budget]") {
  retry_budget third{budget_options(0, 1.0 / 3.0)};
  for (int i = 0; i < 3; ++i) third.deposit(t0);
  CHECK(third.units(t0) == 999'999);
  CHECK_FALSE(third.try_withdraw(t0));
  third.deposit(t0);
  CHECK(third.try_withdraw(t0));
  const retry_budget tenth{budget_options(0.1, 0)};  // 0.1/s x 10 s: exactly one retry
  CHECK(tenth.units(t0) == unit);
}

TEST_CASE("retry budget slices follow the clock's own ticks and epoch", "[retry_budget]") {
  struct ms_clock {
    using duration = std::chrono::milliseconds;
    using time_point = std::chrono::time_point<ms_clock>;
  };
  using ms = std::chrono::milliseconds;
  rein::algo::basic_retry_budget<ms_clock> budget{budget_options(0, 1.0, 100ms)};  // slices of 10 ms
  const ms_clock::time_point start{ms{-15}};  // a negative time: slice [-20, -10) ms
  budget.deposit(start);
  CHECK(budget.units(ms_clock::time_point{ms{79}}) == unit);
  CHECK(budget.units(ms_clock::time_point{ms{80}}) == 0);
  CHECK_THROWS_WITH(rein::algo::basic_retry_budget<ms_clock>(budget_options(0, 1, 15ms)),
                    "rein::algo::retry_budget: ttl must be a positive multiple of 10 clock ticks, got 15000000 ns");
  CHECK_THROWS_WITH(rein::algo::basic_retry_budget<ms_clock>(budget_options(0, 1, 100500us)),
                    "rein::algo::retry_budget: ttl must be a positive multiple of 10 clock ticks, got 100500000 ns");
}

TEST_CASE("retry budget rejects bad options, naming the field and value", "[retry_budget]") {
  CHECK_THROWS_WITH(retry_budget(budget_options(10, 0.2, 0s)),
                    "rein::algo::retry_budget: ttl must be a positive multiple of 10 clock ticks, got 0 ns");
  CHECK_THROWS_WITH(retry_budget(budget_options(10, 0.2, 5ns)),
                    "rein::algo::retry_budget: ttl must be a positive multiple of 10 clock ticks, got 5 ns");
  CHECK_THROWS_WITH(retry_budget(budget_options(10, -0.5)),
                    "rein::algo::retry_budget: retry_ratio must be in [0, 1000] and finite, got -0.5");
  CHECK_THROWS_WITH(retry_budget(budget_options(10, std::nan(""))),
                    "rein::algo::retry_budget: retry_ratio must be in [0, 1000] and finite, got nan");
  CHECK_THROWS_WITH(retry_budget(budget_options(10, 1001)),
                    "rein::algo::retry_budget: retry_ratio must be in [0, 1000] and finite, got 1001");
  CHECK_THROWS_WITH(retry_budget(budget_options(-1, 0.2)),
                    "rein::algo::retry_budget: min_retries_per_second must be in [0, 1e9] and finite, got -1");
  CHECK_THROWS_WITH(retry_budget(budget_options(std::numeric_limits<double>::infinity(), 0.2)),
                    "rein::algo::retry_budget: min_retries_per_second must be in [0, 1e9] and finite, got inf");
  CHECK_THROWS_WITH(retry_budget(budget_options(1e9, 0.2, 10000s)),
                    "rein::algo::retry_budget: min_retries_per_second x ttl must be at most 1e12 retries, got 1e+13");
  CHECK_NOTHROW(retry_budget(budget_options(0, 0)));
  CHECK_NOTHROW(retry_budget(budget_options(1e9, 1000, 1000s)));
}
