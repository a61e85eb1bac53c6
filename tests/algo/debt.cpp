// Debt and upstream corrections in the pure rate limits: charge(n, t) (a cost charged after the fact, which
// may take a limit below zero) and limit_remaining(remaining, reset_after, t) (a provider's count lowering
// the local one). Every value is exact.
#include "support/catch.hpp"

#include <rein/algo/adaptive_rate.hpp>
#include <rein/algo/all_of.hpp>
#include <rein/algo/sliding_window.hpp>
#include <rein/algo/sliding_window_counter.hpp>
#include <rein/algo/token_bucket.hpp>

#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <stdexcept>
#include <vector>

namespace {

using namespace std::chrono_literals;
using rein::algo::take_result;
using bucket = rein::algo::token_bucket;
using window = rein::algo::sliding_window;
using counter = rein::algo::sliding_window_counter;
using time_point = bucket::time_point;
using ns = std::chrono::nanoseconds;
using opt_time = std::optional<time_point>;

constexpr take_result allow = take_result::allowed;
constexpr take_result deny = take_result::denied;

const time_point t0 = time_point{} + 1000h;

static_assert(rein::algo::chargeable_rate_limit<bucket>);
static_assert(rein::algo::chargeable_rate_limit<window>);
static_assert(rein::algo::chargeable_rate_limit<counter>);
static_assert(rein::algo::chargeable_rate_limit<rein::algo::adaptive_rate>);
static_assert(rein::algo::chargeable_rate_limit<rein::algo::all_of<bucket, window>>);
static_assert(rein::algo::remaining_limited_rate_limit<bucket>);
static_assert(rein::algo::remaining_limited_rate_limit<window>);
static_assert(rein::algo::remaining_limited_rate_limit<rein::algo::adaptive_rate>);
static_assert(!rein::algo::remaining_limited_rate_limit<counter>);

// A limit with no charge: all_of over it has none either, and the concept says so.
struct no_charge {
  using clock = std::chrono::steady_clock;
  using time_point = clock::time_point;
  using duration = clock::duration;
  take_result try_take(std::int64_t, time_point) { return allow; }
  std::optional<time_point> ready_at(std::int64_t, time_point t) const { return t; }
  std::int64_t capacity() const { return 1; }
  time_point last_time() const { return {}; }
  void refund(std::int64_t, time_point) {}
};
static_assert(rein::algo::rate_limit<no_charge> && !rein::algo::chargeable_rate_limit<no_charge>);
static_assert(!rein::algo::chargeable_rate_limit<rein::algo::all_of<bucket, no_charge>>);

}  // namespace

// ---- token bucket: charge -------------------------------------------------------------------------------

TEST_CASE("token_bucket charge takes the bucket into debt that delays the next callers", "[debt][token_bucket]") {
  bucket b({.rate = 10, .capacity = 10}, t0);
  b.charge(15, t0);  // 10 there: 5 in debt
  CHECK(b.tokens(t0) == -5.0);
  CHECK(b.try_take(1, t0) == deny);
  // 6 tokens must arrive (5 of debt + 1) at 10 per second: 0.6 s, to the nanosecond.
  CHECK(b.ready_at(1, t0) == opt_time{t0 + 600ms});
  CHECK(b.try_take(1, t0 + 600ms - 1ns) == deny);
  CHECK(b.try_take(1, t0 + 600ms) == allow);
  CHECK(b.tokens(t0 + 600ms) == 0.0);
  CHECK(b.last_time() == t0 + 600ms);
}

TEST_CASE("token_bucket charge above the capacity is allowed and repaid at the rate", "[debt][token_bucket]") {
  bucket b({.rate = 2, .capacity = 4, .initial_tokens = 0}, t0);
  b.charge(40, t0);  // ten capacities
  CHECK(b.tokens(t0) == -40.0);
  CHECK(b.ready_at(4, t0) == opt_time{t0 + 22s});  // 44 tokens at 2 per second
  CHECK(b.tokens(t0 + 20s) == 0.0);
  b.charge(0, t0 + 20s);
  CHECK(b.tokens(t0 + 20s) == 0.0);
}

TEST_CASE("token_bucket refund repays debt exactly and never above capacity", "[debt][token_bucket]") {
  bucket b({.rate = 1, .capacity = 3}, t0);
  b.charge(7, t0);  // -4
  b.refund(2, t0);
  CHECK(b.tokens(t0) == -2.0);
  CHECK(b.ready_at(3, t0) == opt_time{t0 + 5s});
  b.refund(100, t0);
  CHECK(b.tokens(t0) == 3.0);
}

TEST_CASE("token_bucket debt stays exact with a fractional rate", "[debt][token_bucket]") {
  bucket b({.rate = 1.0 / 3.0, .capacity = 1}, t0);  // held as exactly 1/3 token per second
  b.charge(2, t0);                                    // -1
  CHECK(b.ready_at(1, t0) == opt_time{t0 + 6s});
  CHECK(b.try_take(1, t0 + 6s - 1ns) == deny);
  CHECK(b.try_take(1, t0 + 6s) == allow);
}

TEST_CASE("token_bucket charge saturates at a debt of max_capacity", "[debt][token_bucket]") {
  bucket b({.rate = 1e9, .capacity = bucket::max_capacity}, t0);
  b.charge(std::numeric_limits<std::int64_t>::max(), t0);
  CHECK(b.tokens(t0) == -1e15);
  b.charge(std::numeric_limits<std::int64_t>::max(), t0);
  CHECK(b.tokens(t0) == -1e15);
  // 1e15 of debt and one token at 1e9 per second: 1e6 s and one nanosecond.
  CHECK(b.ready_at(1, t0) == opt_time{t0 + 1'000'000s + 1ns});
}

TEST_CASE("token_bucket charge rejects a negative count and changes nothing", "[debt][token_bucket]") {
  bucket b({.rate = 1, .capacity = 3}, t0);
  CHECK_THROWS_AS(b.charge(-1, t0 + 1s), std::invalid_argument);
  CHECK(b.tokens(t0) == 3.0);
  CHECK(b.last_time() == t0);
}

TEST_CASE("token_bucket charge is the same as a reserve of the same amount", "[debt][token_bucket]") {
  // Randomized: a charge never refuses, a reserve within its bounds does the same arithmetic.
  std::mt19937_64 random(13);
  for (int round = 0; round < 200; ++round) {
    const auto capacity = static_cast<std::int64_t>(random() % 50 + 1);
    const double rate = static_cast<double>(random() % 1000 + 1) / 7.0;
    bucket charged({.rate = rate, .capacity = capacity}, t0), reserved = charged;
    time_point t = t0;
    for (int step = 0; step < 20; ++step) {
      t += ns(static_cast<std::int64_t>(random() % 1'000'000'000));
      const auto n = static_cast<std::int64_t>(random() % static_cast<std::uint64_t>(capacity + 1));
      charged.charge(n, t);
      REQUIRE(reserved.reserve(n, t).has_value());
      REQUIRE(charged.tokens(t) == reserved.tokens(t));
      REQUIRE(charged.ready_at(capacity, t) == reserved.ready_at(capacity, t));
    }
  }
}

// ---- token bucket: limit_remaining ----------------------------------------------------------------------

TEST_CASE("token_bucket limit_remaining admits at most remaining until the reset", "[remaining][token_bucket]") {
  bucket b({.rate = 10, .capacity = 100}, t0);  // full: it believes it has 100
  // The provider: 5 left, reset in 1 s. The bucket keeps its tokens; the cap holds until the reset.
  CHECK(b.limit_remaining(5, 1s, t0));
  CHECK(b.tokens(t0) == 100.0);
  int admitted = 0;
  for (time_point t = t0; t < t0 + 1s; t += 1ms) admitted += b.try_take(1, t) == allow ? 1 : 0;
  CHECK(admitted == 5);
  CHECK(b.ready_at(1, t0 + 500ms) == opt_time{t0 + 1s});  // held until the reset, not in debt past it
  CHECK(b.try_take(1, t0 + 1s) == allow);                  // the provider's next window: the bucket's own
  CHECK(b.try_take(90, t0 + 1s) == allow);
}

TEST_CASE("token_bucket limit_remaining never raises what the bucket admits", "[remaining][token_bucket]") {
  bucket b({.rate = 10, .capacity = 100, .initial_tokens = 3}, t0);
  CHECK_FALSE(b.limit_remaining(50, 1s, t0));  // 50 >= 3 + 10: the bucket alone admits less
  CHECK_FALSE(b.limit_remaining(13, 1s, t0));  // 13 >= 3 + 10: already so
  CHECK(b.tokens(t0) == 3.0);
  CHECK(b.last_time() == t0);
  CHECK(b.limit_remaining(11, 1s, t0));  // 11 < 13
  int admitted = 0;
  for (time_point t = t0; t < t0 + 1s; t += 1ms) admitted += b.try_take(1, t) == allow ? 1 : 0;
  CHECK(admitted == 11);
  CHECK_FALSE(b.limit_remaining(std::numeric_limits<std::int64_t>::max(), 0s, t0));
}

TEST_CASE("token_bucket limit_remaining: while a cap holds, a hint only lowers it", "[remaining][token_bucket]") {
  bucket b({.rate = 10, .capacity = 100}, t0);
  CHECK(b.limit_remaining(5, 1s, t0));
  CHECK(b.try_take(2, t0) == allow);             // 3 left under the cap
  CHECK_FALSE(b.limit_remaining(4, 500ms, t0));  // allows more: nothing
  CHECK_FALSE(b.limit_remaining(5, 2s, t0 + 100ms));  // a later reset with more: nothing (it could raise)
  CHECK(b.limit_remaining(1, 500ms, t0));        // allows less: 1 left, the cap still ends at 1 s
  CHECK(b.try_take(2, t0) == deny);
  CHECK(b.ready_at(2, t0) == opt_time{t0 + 1s});
  CHECK(b.limit_remaining(0, 2s, t0 + 100ms));   // less, with a later reset: 0 until 2.1 s
  CHECK(b.try_take(1, t0 + 1s) == deny);
  CHECK(b.ready_at(1, t0 + 1s) == opt_time{t0 + 2100ms});
  CHECK(b.limit_remaining(20, 1s, t0 + 2100ms));  // the cap has ended: a new one
  CHECK(b.try_take(20, t0 + 2100ms) == allow);
  CHECK(b.try_take(1, t0 + 2100ms) == deny);
  b.refund(1, t0 + 2100ms);                       // a refund gives back to the cap ...
  CHECK(b.try_take(1, t0 + 2100ms) == allow);
  b.refund(5, t0 + 2100ms);                       // ... never above the count it was set to
  CHECK(b.try_take(2, t0 + 2100ms) == allow);
  CHECK(b.try_take(1, t0 + 2100ms) == allow);
}

TEST_CASE("token_bucket limit_remaining keeps the refill that arrived before the hint", "[remaining][token_bucket]") {
  bucket b({.rate = 1, .capacity = 10, .initial_tokens = 0}, t0);
  CHECK(b.limit_remaining(3, 10s, t0 + 5s));
  CHECK(b.tokens(t0 + 5s) == 5.0);
  CHECK(b.try_take(3, t0 + 5s) == allow);
  CHECK(b.try_take(1, t0 + 5s) == deny);
}

TEST_CASE("token_bucket limit_remaining: a refund of what was taken before the cap does not lift it",
          "[remaining][token_bucket]") {
  bucket b({.rate = 10, .capacity = 100}, t0);
  CHECK(b.try_take(1, t0) == allow);
  CHECK(b.limit_remaining(0, 10s, t0));
  b.refund(1, t0);
  CHECK(b.try_take(1, t0) == deny);
}

TEST_CASE("token_bucket limit_remaining with a zero reset caps the balance at remaining", "[remaining][token_bucket]") {
  bucket b({.rate = 10, .capacity = 100}, t0);
  CHECK(b.limit_remaining(7, 0s, t0));
  CHECK(b.tokens(t0) == 7.0);
  CHECK(b.limit_remaining(0, 0s, t0));
  CHECK(b.tokens(t0) == 0.0);
  CHECK(b.ready_at(1, t0) == opt_time{t0 + 100ms});
}

TEST_CASE("token_bucket limit_remaining is exact for a reset that is not a whole number of tokens",
          "[remaining][token_bucket]") {
  bucket b({.rate = 10, .capacity = 100, .initial_tokens = 0}, t0);
  // 2 left until 250 ms: the bucket alone would admit 2.5, so the cap matters for a third.
  CHECK(b.limit_remaining(2, 250ms, t0));
  CHECK(b.ready_at(1, t0) == opt_time{t0 + 100ms});
  CHECK(b.ready_at(2, t0) == opt_time{t0 + 200ms});
  CHECK(b.try_take(2, t0 + 200ms) == allow);
  CHECK(b.ready_at(1, t0 + 200ms) == opt_time{t0 + 300ms});  // at the rate: the cap has ended by then
  CHECK(b.try_take(1, t0 + 249ms) == deny);
}

TEST_CASE("token_bucket limit_remaining with huge values neither overflows nor throws",
          "[remaining][token_bucket]") {
  bucket b({.rate = 1e9, .capacity = 10}, t0);
  CHECK(b.limit_remaining(0, ns::max(), t0));  // nothing more, for ever: the cap saturates at the clock's end
  CHECK(b.tokens(t0) == 10.0);
  CHECK(b.try_take(1, t0 + 1000h) == deny);
  bucket c({.rate = 1e-9, .capacity = 10}, t0);
  CHECK_FALSE(c.limit_remaining(std::numeric_limits<std::int64_t>::max(), ns::max(), t0));
  CHECK(c.tokens(t0) == 10.0);
}

TEST_CASE("token_bucket limit_remaining rejects negative arguments and names them", "[remaining][token_bucket]") {
  bucket b({.rate = 10, .capacity = 100}, t0);
  CHECK_THROWS_WITH(b.limit_remaining(-1, 1s, t0), "rein::algo::token_bucket: remaining must be >= 0, got -1");
  CHECK_THROWS_WITH(b.limit_remaining(1, -1ns, t0),
                    "rein::algo::token_bucket: reset_after must be >= 0, got -1 ns");
  CHECK(b.tokens(t0) == 100.0);
}

TEST_CASE("token_bucket limit_remaining bounds admissions for any reset, randomized", "[remaining][token_bucket]") {
  // Property: after limit_remaining(r, d, t), greedy takes of 1 in [t, t + d) number at most r (the reset
  // instant belongs to the provider's next count), and nothing is admitted earlier than before.
  std::mt19937_64 random(7);
  for (int round = 0; round < 300; ++round) {
    const auto capacity = static_cast<std::int64_t>(random() % 40 + 1);
    const double rate = static_cast<double>(random() % 400 + 1) / 10.0;
    bucket b({.rate = rate, .capacity = capacity}, t0);
    const auto remaining = static_cast<std::int64_t>(random() % 30);
    const ns reset(static_cast<std::int64_t>(random() % 2'000'000'000));
    const opt_time before = b.ready_at(capacity, t0);
    b.limit_remaining(remaining, reset, t0);
    REQUIRE(b.ready_at(capacity, t0) >= before);  // never admits earlier
    std::int64_t admitted = 0;
    for (time_point t = t0; t < t0 + reset;) {
      if (b.try_take(1, t) == allow) {
        ++admitted;
        continue;
      }
      const opt_time next = b.ready_at(1, t);
      REQUIRE(next.has_value());
      t = *next;
    }
    REQUIRE(admitted <= remaining);
  }
}

// ---- sliding window and counter --------------------------------------------------------------------------

TEST_CASE("sliding_window charge records starts beyond the limit", "[debt][sliding_window]") {
  window w({.limit = 3, .window = 10s}, t0);
  CHECK(w.try_take(2, t0) == allow);
  w.charge(4, t0 + 1s);  // 6 starts in the window, 3 above the limit
  CHECK(w.count(t0 + 1s) == 3);     // the log holds the newest 3
  CHECK(w.dropped(t0 + 1s) == 3);   // 2 of t0 and one of t0 + 1 s pushed out while in the window
  // Every start is counted: the window has room again only when starts of t0 + 1 s leave, at t0 + 11 s.
  CHECK(w.ready_at(1, t0 + 1s) == opt_time{t0 + 11s});
  CHECK(w.try_take(1, t0 + 11s - 1ns) == deny);
  CHECK(w.try_take(3, t0 + 11s) == allow);
  CHECK(w.dropped(t0 + 11s) == 0);
}

TEST_CASE("sliding_window charge keeps ready_at exact against a log that keeps every start",
          "[debt][sliding_window]") {
  // Oracle: an unbounded log of every start; m more fit at t when at most limit - m starts lie in (t - W, t].
  std::mt19937_64 random(11);
  for (int round = 0; round < 100; ++round) {
    const auto limit = static_cast<std::int64_t>(random() % 6 + 1);
    const ns length(static_cast<std::int64_t>(random() % 5'000 + 1));
    window w({.limit = limit, .window = length}, t0);
    std::vector<time_point> all;
    time_point t = t0;
    for (int step = 0; step < 60; ++step) {
      t += ns(static_cast<std::int64_t>(random() % 2'000));
      const auto n = static_cast<std::int64_t>(random() % static_cast<std::uint64_t>(2 * limit + 1));
      if (random() % 2 == 0) {
        w.charge(n, t);
        all.insert(all.end(), static_cast<std::size_t>(n), t);
      } else if (n <= limit && w.try_take(n, t) == allow) {
        all.insert(all.end(), static_cast<std::size_t>(n), t);
      }
      for (std::int64_t m = 1; m <= limit; ++m) {
        // The oracle's earliest time: when entry (size - (limit - m) - 1) from the oldest has left.
        const auto size = static_cast<std::int64_t>(all.size());
        time_point expected = t;
        if (size > limit - m) expected = std::max(t, all[static_cast<std::size_t>(size - (limit - m) - 1)] + length);
        REQUIRE(w.ready_at(m, t) == opt_time{expected});
      }
    }
  }
}

TEST_CASE("sliding_window refund after a charge cancels the dropped starts first", "[debt][sliding_window]") {
  window w({.limit = 2, .window = 10s}, t0);
  CHECK(w.try_take(2, t0) == allow);
  w.charge(1, t0 + 1s);  // true log: t0, t0, t0 + 1 s; the log keeps t0, t0 + 1 s
  CHECK(w.dropped(t0 + 1s) == 1);
  w.refund(1, t0 + 1s);  // forgets the oldest, which is the dropped one: still full
  CHECK(w.dropped(t0 + 1s) == 0);
  CHECK(w.try_take(1, t0 + 1s) == deny);
  CHECK(w.ready_at(1, t0 + 1s) == opt_time{t0 + 10s});
  w.refund(1, t0 + 1s);  // now a logged one
  CHECK(w.try_take(1, t0 + 1s) == allow);
}

TEST_CASE("sliding_window set_limit takes dropped starts back into a larger log", "[debt][sliding_window]") {
  window w({.limit = 2, .window = 10s}, t0);
  w.charge(5, t0);  // 2 logged, 3 dropped
  w.set_limit(4, t0 + 1s);
  CHECK(w.count(t0 + 1s) == 4);
  CHECK(w.dropped(t0 + 1s) == 1);
  CHECK(w.try_take(1, t0 + 1s) == deny);
  CHECK(w.ready_at(1, t0 + 1s) == opt_time{t0 + 10s});
  // A smaller limit drops the oldest logged starts that are still in the window.
  w.set_limit(1, t0 + 2s);
  CHECK(w.count(t0 + 2s) == 1);
  CHECK(w.dropped(t0 + 2s) == 4);
}

TEST_CASE("sliding_window limit_remaining admits at most remaining until a reset within the window",
          "[remaining][sliding_window]") {
  window w({.limit = 10, .window = 10s}, t0);
  CHECK(w.try_take(2, t0) == allow);
  // At t0 + 4 s the provider says 3 left until t0 + 7 s: 10 - 3 = 7 must count at t0 + 7 s; the 2 of t0 do,
  // so 5 starts are recorded, stamped t0 + 7 s - 10 s + 1 ns, raised to the newest start (t0).
  CHECK(w.limit_remaining(3, 3s, t0 + 4s));
  CHECK(w.count(t0 + 4s) == 7);
  CHECK(w.try_take(3, t0 + 4s) == allow);
  CHECK(w.try_take(1, t0 + 7s) == deny);
  CHECK(w.ready_at(1, t0 + 7s) == opt_time{t0 + 10s});
  CHECK_FALSE(w.limit_remaining(5, 1s, t0 + 8s));  // already at most 0 more fit until t0 + 9 s
}

TEST_CASE("sliding_window limit_remaining stamps starts to leave just after the reset",
          "[remaining][sliding_window]") {
  window w({.limit = 4, .window = 10s}, t0);
  CHECK(w.limit_remaining(1, 2s, t0 + 20s));  // empty log: 3 starts stamped t0 + 12 s + 1 ns
  CHECK(w.try_take(1, t0 + 20s) == allow);
  CHECK(w.try_take(1, t0 + 22s) == deny);
  CHECK(w.ready_at(1, t0 + 22s) == opt_time{t0 + 22s + 1ns});
}

TEST_CASE("sliding_window limit_remaining bounds admissions and never admits earlier, randomized",
          "[remaining][sliding_window]") {
  // Property: after limit_remaining(r, d, t) with d < W, greedy takes of 1 in [t, t + d] number at most r,
  // and no request size is ready earlier than before the call.
  std::mt19937_64 random(5);
  for (int round = 0; round < 300; ++round) {
    const auto limit = static_cast<std::int64_t>(random() % 8 + 1);
    const ns length(static_cast<std::int64_t>(random() % 10'000 + 10));
    window w({.limit = limit, .window = length}, t0);
    time_point t = t0;
    for (int step = 0; step < 10; ++step) {  // some history, charges included
      t += ns(static_cast<std::int64_t>(random() % 3'000));
      const auto n = static_cast<std::int64_t>(random() % static_cast<std::uint64_t>(limit + 1));
      if (random() % 3 == 0) w.charge(n, t);
      else static_cast<void>(w.try_take(n, t));
    }
    const auto remaining = static_cast<std::int64_t>(random() % static_cast<std::uint64_t>(limit + 1));
    const ns reset(static_cast<std::int64_t>(random() % static_cast<std::uint64_t>(length.count())));
    std::vector<opt_time> before;
    for (std::int64_t m = 1; m <= limit; ++m) before.push_back(w.ready_at(m, t));
    w.limit_remaining(remaining, reset, t);
    for (std::int64_t m = 1; m <= limit; ++m) REQUIRE(w.ready_at(m, t) >= before[static_cast<std::size_t>(m - 1)]);
    std::int64_t admitted = 0;
    for (time_point at = t; at <= t + reset;) {
      if (w.try_take(1, at) == allow) {
        ++admitted;
        continue;
      }
      at = *w.ready_at(1, at);
    }
    REQUIRE(admitted <= remaining);
  }
}

TEST_CASE("sliding_window limit_remaining ignores resets of a window or longer", "[remaining][sliding_window]") {
  window w({.limit = 4, .window = 10s}, t0);
  CHECK_FALSE(w.limit_remaining(0, 10s, t0));
  CHECK_FALSE(w.limit_remaining(4, 1s, t0));
  CHECK(w.count(t0) == 0);
  CHECK_THROWS_WITH(w.limit_remaining(-2, 1s, t0), "rein::algo::sliding_window: remaining must be >= 0, got -2");
}

TEST_CASE("sliding_window_counter charge counts beyond the limit", "[debt][sliding_window_counter]") {
  counter c({.limit = 10, .window = 10s}, t0);
  c.charge(15, t0 + 1s);
  CHECK(c.estimate(t0 + 1s) == 15.0);
  CHECK(c.try_take(1, t0 + 9s) == deny);
  // Next window: 15 * (10 - e) / 10 + 1 <= 10 from e = 4 s.
  CHECK(c.ready_at(1, t0 + 9s) == opt_time{t0 + 14s});
  CHECK(c.try_take(1, t0 + 14s) == allow);
  c.charge(std::numeric_limits<std::int64_t>::max(), t0 + 14s);
  c.charge(std::numeric_limits<std::int64_t>::max(), t0 + 14s);
  CHECK(c.estimate(t0 + 14s) == 4e15 + 9.0);  // saturated, 9 still weighing from the window before
}

// ---- all_of and adaptive_rate ----------------------------------------------------------------------------

TEST_CASE("all_of charge charges each limit its own count", "[debt][all_of]") {
  rein::algo::all_of limits{bucket({.rate = 1, .capacity = 10}, t0), bucket({.rate = 100, .capacity = 1000}, t0)};
  CHECK(limits.try_take({1, 800}, t0) == allow);
  limits.charge({0, 500}, t0);  // the call used 1,300 tokens, not 800
  CHECK(limits.get<0>().tokens(t0) == 9.0);
  CHECK(limits.get<1>().tokens(t0) == -300.0);
  CHECK(limits.ready_at({1, 100}, t0) == opt_time{t0 + 4s});
  CHECK_THROWS_AS(limits.charge({1, -1}, t0), std::invalid_argument);
  CHECK(limits.get<0>().tokens(t0) == 9.0);
  limits.charge(2, t0);
  CHECK(limits.get<0>().tokens(t0) == 7.0);
  CHECK(limits.get<1>().tokens(t0) == -302.0);
}

TEST_CASE("adaptive_rate charge and limit_remaining act on its bucket", "[debt][adaptive_rate]") {
  rein::algo::adaptive_rate a({.initial_rate = 10, .burst = 10, .min_rate = 1, .max_rate = 100}, t0);
  a.charge(15, t0);
  CHECK(a.tokens(t0) == -5.0);
  CHECK(a.ready_at(1, t0) == opt_time{t0 + 600ms});
  CHECK(a.limit_remaining(0, 1s, t0));  // nothing more until the reset in 1 s
  CHECK(a.tokens(t0) == -5.0);
  CHECK(a.ready_at(1, t0) == opt_time{t0 + 1s});  // the debt is repaid at 600 ms, the cap ends at 1 s
  CHECK_FALSE(a.limit_remaining(100, 1s, t0));
}
