// rein::algo::token_bucket: its acceptance cases (pure layer), exactness, extremes, accuracy.
#include "support/catch.hpp"

#include <rein/algo/token_bucket.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace Catch {
template <>
struct StringMaker<rein::algo::take_result> {
  static std::string convert(rein::algo::take_result r) {
    switch (r) {
      case rein::algo::take_result::allowed: return "allowed";
      case rein::algo::take_result::denied: return "denied";
      case rein::algo::take_result::exceeds_capacity: return "exceeds_capacity";
    }
    return "?";
  }
};
}  // namespace Catch

namespace {

using namespace std::chrono_literals;
using rein::algo::take_result;
using bucket = rein::algo::token_bucket;
using time_point = bucket::time_point;
using ns = std::chrono::nanoseconds;

constexpr take_result allow = take_result::allowed;
constexpr take_result deny = take_result::denied;
constexpr take_result exceeds = take_result::exceeds_capacity;

// Far from the clock's epoch, so that nothing depends on starting at zero.
const time_point t0 = time_point{} + 1000h;

// "t1" in the issue is 0.1 s.
time_point tick(int k) { return t0 + k * 100ms; }

// Deterministic, portable pseudo-random numbers (splitmix64).
struct splitmix {
  std::uint64_t state;
  std::uint64_t operator()() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  std::int64_t below(std::int64_t bound) { return static_cast<std::int64_t>((*this)() % static_cast<std::uint64_t>(bound)); }
};

// The ceiling of p / q for positive integers.
constexpr std::int64_t ceil_div(std::int64_t p, std::int64_t q) { return (p + q - 1) / q; }

}  // namespace

TEST_CASE("token_bucket case 1: rate 10/s, burst 1", "[token_bucket][acceptance]") {
  bucket b({.rate = 10, .capacity = 1}, t0);
  CHECK(b.try_take(1, tick(0)) == allow);
  CHECK(b.try_take(1, tick(0)) == deny);
  CHECK(b.try_take(1, tick(0)) == deny);
  CHECK(b.try_take(1, tick(1)) == allow);
  CHECK(b.try_take(1, tick(1)) == deny);
  CHECK(b.try_take(1, tick(1)) == deny);
  CHECK(b.try_take(2, tick(2)) == exceeds);
  CHECK(b.try_take(1, tick(2)) == allow);
  CHECK(b.try_take(1, tick(2)) == deny);
}

TEST_CASE("token_bucket case 2: rate 10/s, burst 3", "[token_bucket][acceptance]") {
  bucket b({.rate = 10, .capacity = 3}, t0);
  CHECK(b.try_take(2, tick(0)) == allow);
  CHECK(b.try_take(2, tick(0)) == deny);
  CHECK(b.try_take(1, tick(0)) == allow);
  CHECK(b.try_take(1, tick(0)) == deny);

  CHECK(b.tokens(tick(1)) == 1.0);
  CHECK(b.try_take(4, tick(1)) == exceeds);
  CHECK(b.tokens(tick(1)) == 1.0);
  CHECK(b.last_time() == tick(0));

  CHECK(b.try_take(1, tick(2)) == allow);
  CHECK(b.try_take(1, tick(3)) == allow);
  CHECK(b.try_take(1, tick(4)) == allow);
  CHECK(b.try_take(1, tick(4)) == allow);
  CHECK(b.try_take(1, tick(4)) == deny);
  CHECK(b.try_take(1, tick(4)) == deny);
  CHECK(b.try_take(3, tick(9)) == allow);
  CHECK(b.try_take(0, tick(9)) == allow);
}

TEST_CASE("token_bucket case 3: reservations of 2, 2, 2 at t0, t0, t3 are good at t0, t2, t4",
          "[token_bucket][acceptance]") {
  SECTION("as reservations (debt)") {
    bucket b({.rate = 10, .capacity = 2}, t0);
    CHECK(b.reserve(2, tick(0)) == tick(0));
    CHECK(b.reserve(2, tick(0)) == tick(2));
    CHECK(b.reserve(2, tick(3)) == tick(4));
  }
  SECTION("as a FIFO that asks ready_at for its head and takes at exactly that instant") {
    bucket b({.rate = 10, .capacity = 2}, t0);
    const std::array<time_point, 3> requested{tick(0), tick(0), tick(3)};
    std::vector<time_point> granted;
    for (const time_point r : requested) {
      const time_point from = granted.empty() ? r : std::max(r, granted.back());
      const std::optional<time_point> ready = b.ready_at(2, from);
      REQUIRE(ready);
      if (*ready > from) CHECK(b.try_take(2, *ready - 1ns) == deny);
      CHECK(b.try_take(2, *ready) == allow);
      granted.push_back(*ready);
    }
    CHECK(granted == std::vector<time_point>{tick(0), tick(2), tick(4)});
  }
}

TEST_CASE("token_bucket case 5: rate 1 per 1.3 s, burst 1", "[token_bucket][acceptance]") {
  bucket b({.rate = 1 / 1.3, .capacity = 1}, t0);
  CHECK(b.try_take(1, t0) == allow);
  CHECK(b.try_take(1, t0 + 500ms) == deny);
  CHECK(b.ready_at(1, t0 + 500ms) == t0 + 1300ms);
  CHECK(b.try_take(1, t0 + 1301ms) == allow);
}

TEST_CASE("token_bucket case 6: reads of the tokens change nothing", "[token_bucket][acceptance]") {
  bucket b({.rate = 1, .capacity = 10, .initial_tokens = 0}, t0);
  for (int k = 1; k <= 10; ++k) {
    const time_point t = t0 + k * 600ms;
    CHECK(b.tokens(t) == Approx(0.6 * k).margin(1e-12));
    CHECK(b.ready_at(0, t) == t);
    CHECK(b.last_time() == t0);
  }
  CHECK(b.try_take(6, t0 + 6s) == allow);
  CHECK(b.try_take(1, t0 + 6s) == deny);
}

TEST_CASE("token_bucket case 7: a new rate applies from the time of the change", "[token_bucket][acceptance]") {
  bucket b({.rate = 0.1, .capacity = 1}, t0);
  CHECK(b.try_take(1, t0) == allow);
  b.set_rate(1, t0 + 1s);
  CHECK(b.rate() == 1.0);
  // 0.1 token arrived at the old rate; the other 0.9 take 0.9 s at the new one.
  CHECK(b.ready_at(1, t0 + 1s) == t0 + 1900ms);
  CHECK(b.try_take(1, t0 + 1500ms) == deny);
  CHECK(b.try_take(1, t0 + 2s) == allow);
}

TEST_CASE("token_bucket case 8: impossible or late requests leave the state untouched", "[token_bucket][acceptance]") {
  bucket b({.rate = 10, .capacity = 2}, t0);
  CHECK(b.try_take(2, t0) == allow);
  CHECK(b.try_take(3, t0 + 50ms) == exceeds);
  CHECK(b.ready_at(3, t0 + 50ms) == std::nullopt);
  const std::optional<time_point> ready = b.ready_at(2, t0 + 50ms);
  CHECK(ready == tick(2));
  // A wait with a deadline 0.1 s away (at 0.15 s) would fail at once.
  CHECK(*ready > t0 + 150ms);
  CHECK(b.last_time() == t0);
  CHECK(b.try_take(2, tick(2)) == allow);
  CHECK(b.try_take(1, tick(2)) == deny);
}

TEST_CASE("token_bucket rejects invalid options, naming the field and the value", "[token_bucket][validation]") {
  const std::string rate_rule = "rein::algo::token_bucket: rate must be > 0, finite and at most 1e9 tokens per second, got ";
  CHECK_THROWS_WITH(bucket({.rate = -1, .capacity = 1}, t0), rate_rule + "-1");
  CHECK_THROWS_WITH(bucket({.rate = 0, .capacity = 1}, t0), rate_rule + "0");
  CHECK_THROWS_WITH(bucket({.rate = std::numeric_limits<double>::quiet_NaN(), .capacity = 1}, t0), rate_rule + "nan");
  CHECK_THROWS_WITH(bucket({.rate = std::numeric_limits<double>::infinity(), .capacity = 1}, t0), rate_rule + "inf");
  CHECK_THROWS_WITH(bucket({.rate = 2e9, .capacity = 1}, t0), rate_rule + "2e+09");

  const std::string capacity_rule = "rein::algo::token_bucket: capacity must be in [1, 1e15] tokens, got ";
  CHECK_THROWS_WITH(bucket({.rate = 1, .capacity = 0}, t0), capacity_rule + "0");
  CHECK_THROWS_WITH(bucket({.rate = 1, .capacity = -5}, t0), capacity_rule + "-5");
  CHECK_THROWS_WITH(bucket({.rate = 1, .capacity = bucket::max_capacity + 1}, t0), capacity_rule + "1000000000000001");

  const std::string initial_rule = "rein::algo::token_bucket: initial_tokens must be in [0, capacity], got ";
  CHECK_THROWS_WITH(bucket({.rate = 1, .capacity = 3, .initial_tokens = -1}, t0), initial_rule + "-1");
  CHECK_THROWS_WITH(bucket({.rate = 1, .capacity = 3, .initial_tokens = 4}, t0), initial_rule + "4");

  CHECK_THROWS_AS(bucket({}, t0), std::invalid_argument);
}

TEST_CASE("token_bucket setters validate and leave the bucket unchanged on error", "[token_bucket][validation]") {
  bucket b({.rate = 10, .capacity = 2}, t0);
  REQUIRE(b.try_take(2, t0) == allow);
  CHECK_THROWS_AS(b.set_rate(std::numeric_limits<double>::quiet_NaN(), tick(5)), std::invalid_argument);
  CHECK_THROWS_AS(b.set_rate(-3, tick(5)), std::invalid_argument);
  CHECK_THROWS_AS(b.set_capacity(0, tick(5)), std::invalid_argument);
  CHECK_THROWS_WITH(b.try_take(-1, tick(5)), "rein::algo::token_bucket: n must be >= 0, got -1");
  CHECK_THROWS_AS(b.ready_at(-1, tick(5)), std::invalid_argument);
  CHECK_THROWS_AS(b.refund(-1, tick(5)), std::invalid_argument);
  CHECK(b.rate() == 10.0);
  CHECK(b.capacity() == 2);
  CHECK(b.last_time() == t0);
  CHECK(b.ready_at(2, t0) == tick(2));
}

TEST_CASE("token_bucket treats a stamp earlier than the last change as the last change", "[token_bucket]") {
  bucket b({.rate = 10, .capacity = 1}, t0);
  CHECK(b.try_take(1, tick(10)) == allow);
  CHECK(b.try_take(1, tick(5)) == deny);
  CHECK(b.tokens(tick(5)) == 0.0);
  CHECK(b.ready_at(1, tick(5)) == tick(11));
  CHECK(b.try_take(1, tick(11)) == allow);
}

TEST_CASE("token_bucket: a denied take leaves the state untouched", "[token_bucket]") {
  bucket b({.rate = 10, .capacity = 1}, t0);
  CHECK(b.try_take(1, t0) == allow);
  CHECK(b.try_take(1, t0 + 50ms) == deny);
  CHECK(b.last_time() == t0);
  // Had the denied take moved the clock, a stamp between t0 and 50 ms would be treated as 50 ms.
  CHECK(b.tokens(t0 + 20ms) == Approx(0.2).margin(1e-12));
}

TEST_CASE("token_bucket refunds never go above capacity", "[token_bucket]") {
  bucket b({.rate = 1, .capacity = 3}, t0);
  CHECK(b.try_take(2, t0) == allow);
  b.refund(5, t0);
  CHECK(b.tokens(t0) == 3.0);
  CHECK(b.try_take(3, t0) == allow);
  b.refund(1, t0 + 500ms);
  CHECK(b.tokens(t0 + 500ms) == 1.5);
  b.refund(std::numeric_limits<std::int64_t>::max(), t0 + 500ms);
  CHECK(b.tokens(t0 + 500ms) == 3.0);
}

TEST_CASE("token_bucket reservations go into debt, bounded, and can be refunded", "[token_bucket]") {
  bucket b({.rate = 1, .capacity = 4}, t0);
  CHECK(b.reserve(5, t0) == std::nullopt);
  CHECK(b.reserve(4, t0) == t0);
  CHECK(b.reserve(3, t0) == t0 + 3s);
  CHECK(b.tokens(t0) == -3.0);
  CHECK(b.try_take(1, t0 + 3s) == deny);
  CHECK(b.ready_at(1, t0) == t0 + 4s);
  b.refund(3, t0);
  CHECK(b.tokens(t0) == 0.0);
  CHECK(b.ready_at(1, t0) == t0 + 1s);
}

TEST_CASE("token_bucket debt is bounded by max_capacity", "[token_bucket]") {
  bucket b({.rate = 1e9, .capacity = bucket::max_capacity}, t0);
  CHECK(b.reserve(bucket::max_capacity, t0) == t0);
  CHECK(b.reserve(bucket::max_capacity, t0) == t0 + 1'000'000s);
  CHECK(b.reserve(1, t0) == std::nullopt);
  CHECK(b.tokens(t0) == -1e15);
}

TEST_CASE("token_bucket capacity changes apply from the time of the change", "[token_bucket]") {
  bucket b({.rate = 1, .capacity = 10}, t0);
  b.set_capacity(4, t0);
  CHECK(b.tokens(t0) == 4.0);
  CHECK(b.try_take(5, t0) == exceeds);
  b.set_capacity(8, t0 + 1s);  // the bucket was full at 4 until now
  CHECK(b.tokens(t0 + 1s) == 4.0);
  CHECK(b.tokens(t0 + 3s) == 6.0);
  CHECK(b.ready_at(8, t0 + 1s) == t0 + 5s);
  CHECK(b.try_take(8, t0 + 5s) == allow);
}

TEST_CASE("token_bucket set_rate keeps the tokens that arrived at the old rate", "[token_bucket]") {
  bucket b({.rate = 0.3, .capacity = 1}, t0);
  CHECK(b.try_take(1, t0) == allow);
  b.set_rate(7, t0 + 1s);  // 0.3 token is there; 0.7 more at 7/s take 0.1 s
  CHECK(b.ready_at(1, t0 + 1s) == t0 + 1100ms);
  b.set_rate(0.5, t0 + 1050ms);  // 0.65 there; 0.35 more at 0.5/s take 0.7 s
  CHECK(b.ready_at(1, t0) == t0 + 1750ms);
  CHECK(b.try_take(1, t0 + 1750ms - 1ns) == deny);
  CHECK(b.try_take(1, t0 + 1750ms) == allow);
}

TEST_CASE("token_bucket grants each token at the exact nanosecond, with no drift over many grants",
          "[token_bucket][exact]") {
  struct exact_rate {
    std::int64_t tokens, per_seconds;
  };
  const exact_rate rates[] = {{3, 1}, {10, 3}, {3, 10}, {10, 13}, {7, 1}, {123'456'789, 1000}, {1, 1'000'000}, {1'000'000'000, 1}};
  for (const exact_rate r : rates) {
    const double rate = static_cast<double>(r.tokens) / static_cast<double>(r.per_seconds);
    INFO("rate " << r.tokens << "/" << r.per_seconds);
    // Capacity 2, so that the part of a token that arrives in the nanosecond a token is rounded up to
    // is kept (with capacity 1, a full bucket would rightly drop it).
    bucket b({.rate = rate, .capacity = 2, .initial_tokens = 0}, t0);
    for (std::int64_t k = 1; k <= 1000; ++k) {
      // Token k arrives once rate x elapsed >= k, i.e. after ceil(k x per_seconds x 1e9 / tokens) ns.
      const time_point expected = t0 + ns(ceil_div(k * r.per_seconds * 1'000'000'000, r.tokens));
      const std::optional<time_point> ready = b.ready_at(1, t0);
      REQUIRE(ready == expected);
      REQUIRE(b.try_take(1, expected - 1ns) == deny);
      REQUIRE(b.try_take(1, expected) == allow);
    }
  }
}

TEST_CASE("token_bucket takes a decimal rate as its decimal fraction, not as the double's binary value",
          "[token_bucket][exact]") {
  // The double nearest 999999.7 is 4.7e-17 below it: taken literally, 9,999,997 tokens would need 0.5 fs
  // more than 10 s, so they would come a nanosecond late.
  bucket b({.rate = 999'999.7, .capacity = 10'000'000, .initial_tokens = 0}, t0);
  CHECK(b.ready_at(9'999'997, t0) == t0 + 10s);
  CHECK(b.try_take(9'999'997, t0 + 10s) == allow);
}

TEST_CASE("token_bucket at the extremes of rate and capacity does not overflow", "[token_bucket][extreme]") {
  const time_point end_of_time = time_point::max();

  SECTION("1e-6 per second") {
    bucket b({.rate = 1e-6, .capacity = 1}, t0);
    CHECK(b.try_take(1, t0) == allow);
    CHECK(b.ready_at(1, t0) == t0 + 1'000'000s);
    CHECK(b.tokens(end_of_time) == 1.0);
  }
  SECTION("a rate so small that the wait passes the end of the clock: never") {
    for (const double rate : {1e-12, 1e-300, std::numeric_limits<double>::denorm_min()}) {
      bucket b({.rate = rate, .capacity = 1}, t0);
      CHECK(b.try_take(1, t0) == allow);
      CHECK(b.ready_at(1, t0) == std::nullopt);
      CHECK(b.reserve(1, t0) == std::nullopt);
      CHECK(b.try_take(1, end_of_time) == deny);
      CHECK(b.tokens(end_of_time) < 0.01);
      CHECK(b.last_time() == t0);
    }
  }
  SECTION("1e9 per second with a capacity of 1e15") {
    bucket b({.rate = 1e9, .capacity = bucket::max_capacity}, t0);
    CHECK(b.try_take(bucket::max_capacity, t0) == allow);
    CHECK(b.ready_at(1, t0) == t0 + 1ns);
    CHECK(b.ready_at(bucket::max_capacity, t0) == t0 + 1'000'000s);
    CHECK(b.tokens(t0 + 500'000s) == 5e14);
    CHECK(b.tokens(end_of_time) == 1e15);
    CHECK(b.try_take(bucket::max_capacity, end_of_time) == allow);
  }
  SECTION("an awkward rate near the top with the largest capacity") {
    bucket b({.rate = 987'654'321.123, .capacity = bucket::max_capacity, .initial_tokens = 0}, t0);
    CHECK(b.tokens(end_of_time) == 1e15);
    const std::optional<time_point> full = b.ready_at(bucket::max_capacity, t0);
    REQUIRE(full);
    CHECK(b.try_take(bucket::max_capacity, *full - 1ns) == deny);
    CHECK(b.try_take(bucket::max_capacity, *full) == allow);
  }
}

namespace {

struct competition {
  std::int64_t admitted = 0;
  std::int64_t worst_excess = std::numeric_limits<std::int64_t>::min();  // admitted - (rate x t + burst), max
  double tokens_at_end = 0;
};

// Eight competitors poll one bucket at irregular steps of 1..max_step ns, each asking for 1..max_n tokens.
// The bucket cannot tell callers apart, so the competitors are one interleaved stream of polls. The first
// one takes the whole burst at t0, as a deploy stampede would; from then on the bucket is never full, so no
// token that arrives is lost and each one must be admitted.
competition compete(std::int64_t rate, std::int64_t burst, ns duration, std::int64_t max_step, std::int64_t max_n,
                    std::uint64_t seed) {
  bucket b({.rate = static_cast<double>(rate), .capacity = burst}, t0);
  splitmix random{seed};
  competition result;
  REQUIRE(b.try_take(burst, t0) == allow);
  result.admitted = burst;
  for (std::int64_t elapsed = 0; elapsed < duration.count();) {
    elapsed = std::min(duration.count(), elapsed + 1 + random.below(max_step));
    const std::int64_t n = 1 + random.below(max_n);
    if (b.try_take(n, t0 + ns(elapsed)) == allow) result.admitted += n;
    const std::int64_t bound = burst + elapsed * rate / 1'000'000'000;  // whole tokens arrived so far
    result.worst_excess = std::max(result.worst_excess, result.admitted - bound);
  }
  result.tokens_at_end = b.tokens(t0 + duration);
  return result;
}

}  // namespace

TEST_CASE("token_bucket accuracy: 8 competitors over 10 s at 100,000/s get exactly rate x t + burst",
          "[token_bucket][accuracy]") {
  constexpr std::int64_t rate = 100'000, burst = 100;
  struct polling {
    const char* name;
    ns duration;
    std::int64_t max_step, max_n;
  };
  // Very different polling frequencies; each run asks for more than arrives.
  const polling runs[] = {{"steps of 1-100 ns for 0.1 s", 100ms, 100, 1},
                          {"steps of 1-4,000 ns for 10 s", 10s, 4000, 1},
                          {"steps of 1-60,000 ns for 10 s, 1-8 tokens each", 10s, 60'000, 8}};
  for (const polling& p : runs) {
    INFO(p.name);
    const competition c = compete(rate, burst, p.duration, p.max_step, p.max_n, 42);
    const double promised = static_cast<double>(burst + rate * p.duration.count() / 1'000'000'000);
    CHECK(c.worst_excess <= 0);
    CHECK(static_cast<double>(c.admitted) + c.tokens_at_end == promised);
    CHECK(static_cast<double>(c.admitted) >= 0.9999 * promised);
  }
}

namespace {

// A clock that ticks in milliseconds: times handed back are rounded up to its tick.
struct millisecond_clock {
  using rep = std::int64_t;
  using period = std::milli;
  using duration = std::chrono::milliseconds;
  using time_point = std::chrono::time_point<millisecond_clock>;
  [[maybe_unused]] static constexpr bool is_steady = true;
  static time_point now() noexcept { return time_point{}; }
};

}  // namespace

TEST_CASE("token_bucket on a millisecond clock rounds waits up to the tick", "[token_bucket]") {
  using coarse = rein::algo::basic_token_bucket<millisecond_clock>;
  const millisecond_clock::time_point start{std::chrono::hours(1)};
  coarse b({.rate = 3, .capacity = 1, .initial_tokens = 0}, start);
  // The token arrives after 333.33 ms: the first tick at which it is there is 334 ms.
  CHECK(b.ready_at(1, start) == start + 334ms);
  CHECK(b.try_take(1, start + 333ms) == deny);
  CHECK(b.try_take(1, start + 334ms) == allow);
  CHECK(b.last_time() == start + 334ms);
}
