// rein::algo::sliding_window (exact log) and sliding_window_counter (O(1) approximation).
#include "support/catch.hpp"

#include <rein/algo/sliding_window.hpp>
#include <rein/algo/sliding_window_counter.hpp>
#include <rein/algo/token_bucket.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
using rein::algo::take_result;
using window = rein::algo::sliding_window;
using counter = rein::algo::sliding_window_counter;
using time_point = window::time_point;
using ns = std::chrono::nanoseconds;

constexpr take_result allow = take_result::allowed;
constexpr take_result deny = take_result::denied;
constexpr take_result exceeds = take_result::exceeds_capacity;

const time_point t0 = time_point{} + 1000h;

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

// Serves requests of n, made at the given times, one after the other in FIFO order: each is granted at
// the earliest time at or after its request and the previous grant, the way the async layer's head waiter
// is. Checks on the way that the grant time is exact (one nanosecond earlier is denied).
template <class Limit>
std::vector<time_point> fifo_grants(Limit& limit, const std::vector<time_point>& requested, std::int64_t n) {
  std::vector<time_point> granted;
  for (const time_point r : requested) {
    const time_point from = granted.empty() ? r : std::max(r, granted.back());
    const std::optional<time_point> ready = limit.ready_at(n, from);
    REQUIRE(ready);
    if (*ready > from) REQUIRE(limit.try_take(n, *ready - 1ns) == deny);
    REQUIRE(limit.try_take(n, *ready) == allow);
    granted.push_back(*ready);
  }
  return granted;
}

// The most starts in any window (t - w, t] of a sorted log: the window ending at each start is the one to
// check, since the count only rises at starts.
std::int64_t densest_window(const std::vector<std::int64_t>& starts, std::int64_t w) {
  std::int64_t most = 0;
  std::size_t first = 0;
  for (std::size_t last = 0; last < starts.size(); ++last) {
    while (starts[first] <= starts[last] - w) ++first;
    most = std::max(most, static_cast<std::int64_t>(last - first + 1));
  }
  return most;
}

}  // namespace

TEST_CASE("case 9: a sliding window and a token bucket of the same average rate grant differently",
          "[sliding_window][token_bucket][acceptance]") {
  const std::vector<time_point> requested{t0, t0 + 10ms, t0 + 20ms, t0 + 30ms, t0 + 40ms};

  // 2 per 10 s, exactly: the third start waits until the first leaves the window.
  window w({.limit = 2, .window = 10s}, t0);
  CHECK(fifo_grants(w, requested, 1) == std::vector<time_point>{t0, t0 + 10ms, t0 + 10s, t0 + 10010ms, t0 + 20s});

  // 0.2 per second with a burst of 2: after the burst, one every 5 s, whoever asked when.
  rein::algo::token_bucket b({.rate = 0.2, .capacity = 2}, t0);
  CHECK(fifo_grants(b, requested, 1) == std::vector<time_point>{t0, t0 + 10ms, t0 + 5s, t0 + 10s, t0 + 15s});
}

TEST_CASE("sliding_window admits limit starts per window and says when the next one fits", "[sliding_window]") {
  window w({.limit = 3, .window = 1s}, t0);
  CHECK(w.try_take(t0) == allow);
  CHECK(w.try_take(t0 + 200ms) == allow);
  CHECK(w.try_take(t0 + 400ms) == allow);
  CHECK(w.try_take(t0 + 500ms) == deny);
  CHECK(w.count(t0 + 500ms) == 3);
  CHECK(w.ready_at(1, t0 + 500ms) == t0 + 1s);
  CHECK(w.ready_at(2, t0 + 500ms) == t0 + 1200ms);
  CHECK(w.ready_at(3, t0 + 500ms) == t0 + 1400ms);
  CHECK(w.try_take(t0 + 1s - 1ns) == deny);
  CHECK(w.try_take(t0 + 1s) == allow);
  CHECK(w.count(t0 + 1s) == 3);
  CHECK(w.count(t0 + 1400ms) == 1);
}

TEST_CASE("sliding_window weighted requests take n entries or none", "[sliding_window]") {
  window w({.limit = 5, .window = 10s}, t0);
  CHECK(w.try_take(3, t0) == allow);
  CHECK(w.try_take(3, t0 + 1s) == deny);
  CHECK(w.try_take(2, t0 + 1s) == allow);
  CHECK(w.try_take(6, t0 + 1s) == exceeds);
  CHECK(w.try_take(0, t0 + 1s) == allow);
  CHECK(w.ready_at(6, t0) == std::nullopt);
  CHECK(w.ready_at(3, t0 + 2s) == t0 + 10s);  // the three starts at t0 leave
  CHECK(w.ready_at(4, t0 + 2s) == t0 + 11s);  // and one of the two at 1 s
  CHECK(w.try_take(4, t0 + 11s) == allow);
  CHECK(w.count(t0 + 11s) == 4);
}

TEST_CASE("sliding_window never lets more than limit starts into any window", "[sliding_window]") {
  constexpr std::int64_t limit = 7, length = 1'000'000;  // 7 per ms
  window w({.limit = limit, .window = ns(length)}, t0);
  splitmix random{7};
  std::vector<std::int64_t> log;
  std::int64_t elapsed = 0;
  for (int i = 0; i < 200'000; ++i) {
    elapsed += random.below(40'000);
    const std::int64_t n = random.below(4);
    const time_point t = t0 + ns(elapsed);
    const std::optional<time_point> ready = w.ready_at(n, t);
    const take_result r = w.try_take(n, t);
    REQUIRE(r == (ready == t ? allow : deny));
    if (r == allow) log.insert(log.end(), static_cast<std::size_t>(n), elapsed);
  }
  CHECK(densest_window(log, length) == limit);
}

TEST_CASE("sliding_window treats a stamp earlier than the last change as the last change", "[sliding_window]") {
  window w({.limit = 1, .window = 1s}, t0);
  CHECK(w.try_take(t0 + 5s) == allow);
  CHECK(w.try_take(t0 + 1s) == deny);
  CHECK(w.ready_at(1, t0) == t0 + 6s);
  CHECK(w.last_time() == t0 + 5s);
}

TEST_CASE("sliding_window refund forgets the oldest starts still in the window", "[sliding_window][refund]") {
  window w({.limit = 3, .window = 1s}, t0);
  CHECK(w.try_take(t0) == allow);
  CHECK(w.try_take(2, t0 + 100ms) == allow);
  w.refund(1, t0 + 200ms);  // forgets the start of 0.0 s
  CHECK(w.count(t0 + 200ms) == 2);
  CHECK(w.ready_at(1, t0 + 200ms) == t0 + 200ms);
  CHECK(w.ready_at(2, t0 + 200ms) == t0 + 1100ms);
  w.refund(10, t0 + 200ms);
  CHECK(w.count(t0 + 200ms) == 0);
  CHECK(w.try_take(3, t0 + 200ms) == allow);
}

TEST_CASE("sliding_window refund never lets limit + 1 real starts into a window", "[sliding_window][refund]") {
  // 2 per 1 s: A at 0.0 and B at 0.5; A's call is never sent and is refunded at 0.6. Its start is the one
  // forgotten, so at 1.0 only one more fits beside B's (forgetting B's would let C and D both in: three
  // real starts, B, C and D, in (0.0, 1.0]).
  window w({.limit = 2, .window = 1s}, t0);
  CHECK(w.try_take(t0) == allow);
  CHECK(w.try_take(t0 + 500ms) == allow);
  w.refund(1, t0 + 600ms);
  CHECK(w.try_take(t0 + 1s) == allow);
  CHECK(w.try_take(t0 + 1s) == deny);
  CHECK(w.ready_at(1, t0 + 1s) == t0 + 1500ms);
}

TEST_CASE("sliding_window refund skips starts that already left the window", "[sliding_window][refund]") {
  window w({.limit = 2, .window = 1s}, t0);
  CHECK(w.try_take(t0) == allow);
  CHECK(w.try_take(t0 + 1500ms) == allow);
  w.refund(1, t0 + 1600ms);  // the start of 0.0 s holds nothing any more: the one of 1.5 s is forgotten
  CHECK(w.count(t0 + 1600ms) == 0);
  CHECK(w.try_take(2, t0 + 1600ms) == allow);
  w.refund(1, t0 + 5s);  // nothing left in the window: a no-op
  CHECK(w.count(t0 + 5s) == 0);
  w.set_window(10s, t0 + 5s);  // the kept starts count again under a longer window
  CHECK(w.count(t0 + 5s) == 2);
}

TEST_CASE("sliding_window refund agrees with a model log under random use", "[sliding_window][refund]") {
  // Model: a sorted log; refund drops the oldest entries still inside the window. Checked after every step.
  splitmix rng{42};
  const std::int64_t limit = 5;
  const ns width = 1s;
  window w({.limit = limit, .window = width}, t0);
  std::vector<std::int64_t> model;  // ns since t0
  std::int64_t now = 0;
  for (int step = 0; step < 20000; ++step) {
    now += rng.below(300'000'000);
    const auto in_window_from = [&] {
      return std::upper_bound(model.begin(), model.end(), now - width.count()) - model.begin();
    };
    const std::int64_t n = rng.below(3) + 1;
    if (rng.below(4) == 0) {
      w.refund(n, t0 + ns(now));
      const auto first = model.begin() + in_window_from();
      model.erase(first, first + std::min<std::ptrdiff_t>(n, model.end() - first));
    } else {
      const std::int64_t room = limit - static_cast<std::int64_t>(model.end() - (model.begin() + in_window_from()));
      const take_result expected = n <= room ? allow : deny;
      REQUIRE(w.try_take(n, t0 + ns(now)) == expected);
      if (expected == allow) model.insert(model.end(), static_cast<std::size_t>(n), now);
      // Keep the newest `limit` entries, as the log does.
      if (model.size() > static_cast<std::size_t>(limit)) model.erase(model.begin(), model.end() - limit);
    }
    const auto first = model.begin() + in_window_from();
    REQUIRE(w.count(t0 + ns(now)) == static_cast<std::int64_t>(model.end() - first));
    // The next start: now if there is room, else when the oldest start in the window leaves it.
    const time_point next = model.end() - first < limit ? t0 + ns(now) : t0 + ns(*first) + width;
    REQUIRE(w.ready_at(1, t0 + ns(now)) == next);
  }
}

TEST_CASE("sliding_window limit and window changes apply from the time of the change", "[sliding_window]") {
  window w({.limit = 4, .window = 1s}, t0);
  CHECK(w.try_take(t0) == allow);
  CHECK(w.try_take(t0 + 100ms) == allow);
  CHECK(w.try_take(t0 + 200ms) == allow);
  w.set_limit(2, t0 + 300ms);  // keeps the two most recent starts
  CHECK(w.limit() == 2);
  CHECK(w.count(t0 + 300ms) == 2);
  CHECK(w.ready_at(1, t0 + 300ms) == t0 + 1100ms);
  CHECK(w.try_take(3, t0 + 300ms) == exceeds);
  // A larger limit takes back the start of t0 that the smaller one dropped while it was in the window:
  // 3 starts count, so 2 more fit (3 would make 6 real starts in the window ending at t0 + 300 ms).
  w.set_limit(5, t0 + 300ms);
  CHECK(w.count(t0 + 300ms) == 3);
  CHECK(w.try_take(3, t0 + 300ms) == deny);
  CHECK(w.try_take(2, t0 + 300ms) == allow);
  CHECK(w.ready_at(1, t0 + 300ms) == t0 + 1000ms);
  w.set_window(500ms, t0 + 400ms);
  CHECK(w.window() == 500ms);
  CHECK(w.count(t0 + 400ms) == 5);
  CHECK(w.ready_at(1, t0 + 400ms) == t0 + 500ms);
}

TEST_CASE("sliding_window keeps its log in order across wrap-around, refunds and resizing", "[sliding_window]") {
  window w({.limit = 3, .window = 1s}, t0);
  for (const auto at : {0ms, 400ms, 800ms, 1000ms, 1400ms}) REQUIRE(w.try_take(t0 + at) == allow);
  // The log has wrapped twice and holds 0.8 s, 1.0 s, 1.4 s.
  CHECK(w.ready_at(1, t0 + 1400ms) == t0 + 1800ms);
  CHECK(w.ready_at(2, t0 + 1400ms) == t0 + 2000ms);
  CHECK(w.ready_at(3, t0 + 1400ms) == t0 + 2400ms);
  w.refund(1, t0 + 1400ms);  // forgets 0.8 s, the oldest start in the window
  CHECK(w.try_take(t0 + 1500ms) == allow);
  CHECK(w.ready_at(1, t0 + 1500ms) == t0 + 2000ms);
  CHECK(w.ready_at(3, t0 + 1500ms) == t0 + 2500ms);
  w.set_limit(4, t0 + 1500ms);  // 1.0 s, 1.4 s, 1.5 s and room for one more
  CHECK(w.ready_at(1, t0 + 1500ms) == t0 + 1500ms);
  CHECK(w.ready_at(2, t0 + 1500ms) == t0 + 2000ms);
  CHECK(w.ready_at(4, t0 + 1500ms) == t0 + 2500ms);
  w.set_limit(1, t0 + 1500ms);  // keeps 1.5 s only
  CHECK(w.ready_at(1, t0 + 1500ms) == t0 + 2500ms);
  CHECK(w.count(t0 + 1500ms) == 1);
}

TEST_CASE("sliding_window with the largest limit records only what it is given", "[sliding_window]") {
  window w({.limit = window::max_limit, .window = 1h}, t0);
  CHECK(w.try_take(1000, t0) == allow);
  CHECK(w.count(t0 + 1s) == 1000);
  CHECK(w.ready_at(window::max_limit - 1000, t0) == t0);
  CHECK(w.ready_at(window::max_limit, t0) == t0 + 1h);
}

TEST_CASE("sliding_window rejects invalid options, naming the field and the value", "[sliding_window][validation]") {
  CHECK_THROWS_WITH(window({.limit = 0, .window = 1s}, t0), "rein::algo::sliding_window: limit must be in [1, 2^27], got 0");
  CHECK_THROWS_WITH(window({.limit = window::max_limit + 1, .window = 1s}, t0),
                    "rein::algo::sliding_window: limit must be in [1, 2^27], got 134217729");
  CHECK_THROWS_WITH(window({.limit = 1, .window = 0s}, t0), "rein::algo::sliding_window: window must be > 0, got 0 ns");
  CHECK_THROWS_WITH(window({.limit = 1, .window = -1s}, t0),
                    "rein::algo::sliding_window: window must be > 0, got -1000000000 ns");
  window w({.limit = 2, .window = 1s}, t0);
  CHECK_THROWS_AS(w.set_limit(-1, t0), std::invalid_argument);
  CHECK_THROWS_AS(w.set_window(0s, t0), std::invalid_argument);
  CHECK_THROWS_WITH(w.try_take(-2, t0), "rein::algo::sliding_window: n must be >= 0, got -2");
  CHECK(w.limit() == 2);
  CHECK(w.window() == 1s);
}

TEST_CASE("sliding_window_counter weighs the previous fixed window by its overlap", "[sliding_window_counter]") {
  counter c({.limit = 10, .window = 10s}, t0);
  CHECK(c.try_take(8, t0 + 5s) == allow);
  CHECK(c.try_take(3, t0 + 6s) == deny);
  CHECK(c.try_take(2, t0 + 6s) == allow);
  // At 12 s, 80% of the previous window still overlaps: 10 x 0.8 = 8 estimated.
  CHECK(c.estimate(t0 + 12s) == Approx(8.0));
  CHECK(c.try_take(3, t0 + 12s) == deny);
  // 3 fit once 10 x (W - e) / W <= 7, at e = 3 s.
  CHECK(c.ready_at(3, t0 + 12s) == t0 + 13s);
  CHECK(c.try_take(3, t0 + 13s - 1ns) == deny);
  CHECK(c.try_take(3, t0 + 13s) == allow);
  // With 3 in this window, 8 more fit when the previous window's 10 weigh at most -1: never in this window;
  // in the next, the 3 weigh 3 x (W - e) / W <= 2 from e = 10/3 s.
  CHECK(c.ready_at(8, t0 + 13s) == t0 + 20s + ns(3'333'333'334));
  CHECK(c.try_take(11, t0 + 13s) == exceeds);
  CHECK(c.ready_at(11, t0 + 13s) == std::nullopt);
  // Two windows later nothing is left.
  CHECK(c.estimate(t0 + 35s) == 0.0);
}

TEST_CASE("sliding_window_counter ready_at is exact", "[sliding_window_counter]") {
  constexpr std::int64_t limit = 50;
  counter c({.limit = limit, .window = 1s}, t0);
  splitmix random{11};
  std::int64_t elapsed = 0;
  for (int i = 0; i < 100'000; ++i) {
    elapsed += random.below(30'000'000);
    const std::int64_t n = 1 + random.below(10);
    const time_point t = t0 + ns(elapsed);
    const std::optional<time_point> ready = c.ready_at(n, t);
    REQUIRE(ready);
    REQUIRE(*ready >= t);
    if (*ready > t) REQUIRE(c.try_take(n, *ready - 1ns) == deny);
    REQUIRE(c.try_take(n, *ready) == allow);
    elapsed = (*ready - t0).count();
  }
}

TEST_CASE("sliding_window_counter overshoot: at most limit per fixed window and 2 x limit - 1 in any window",
          "[sliding_window_counter]") {
  constexpr std::int64_t limit = 10, length = 10'000'000'000;

  SECTION("the bound is reached when the previous window's starts all came at its very end") {
    counter c({.limit = limit, .window = ns(length)}, t0);
    std::vector<std::int64_t> log;
    CHECK(c.try_take(limit, t0 + ns(length - 1)) == allow);
    log.insert(log.end(), limit, length - 1);
    // Then greedy polling every millisecond through the next window.
    for (std::int64_t e = length; e < 2 * length; e += 1'000'000) {
      while (c.try_take(1, t0 + ns(e)) == allow) log.push_back(e);
    }
    CHECK(densest_window(log, length) == 2 * limit - 1);
  }
  SECTION("random traffic never passes the bound") {
    splitmix random{3};
    for (int run = 0; run < 20; ++run) {
      counter c({.limit = limit, .window = ns(length)}, t0);
      std::vector<std::int64_t> log;
      std::int64_t elapsed = 0;
      for (int i = 0; i < 5'000; ++i) {
        elapsed += random.below(length / 5);
        const std::int64_t n = 1 + random.below(4);
        if (c.try_take(n, t0 + ns(elapsed)) == allow) log.insert(log.end(), static_cast<std::size_t>(n), elapsed);
      }
      CHECK(densest_window(log, length) <= 2 * limit - 1);
      // Within each fixed window [k W, (k + 1) W) (the origin is t0), at most limit.
      std::int64_t most_in_fixed = 0;
      for (std::size_t i = 0, j = 0; i < log.size(); i = j) {
        while (j < log.size() && log[j] / length == log[i] / length) ++j;
        most_in_fixed = std::max(most_in_fixed, static_cast<std::int64_t>(j - i));
      }
      CHECK(most_in_fixed <= limit);
    }
  }
}

TEST_CASE("sliding_window_counter refund, limit changes and monotonic time", "[sliding_window_counter]") {
  counter c({.limit = 4, .window = 1s}, t0);
  CHECK(c.try_take(4, t0 + 100ms) == allow);
  c.refund(3, t0 + 200ms);
  CHECK(c.estimate(t0 + 200ms) == 1.0);
  CHECK(c.try_take(3, t0 + 200ms) == allow);
  c.set_limit(6, t0 + 300ms);
  CHECK(c.limit() == 6);
  CHECK(c.try_take(2, t0 + 300ms) == allow);
  CHECK(c.try_take(1, t0) == deny);  // treated as 300 ms
  CHECK(c.last_time() == t0 + 300ms);
}

TEST_CASE("sliding_window_counter rejects invalid options", "[sliding_window_counter][validation]") {
  CHECK_THROWS_WITH(counter({.limit = 0, .window = 1s}, t0),
                    "rein::algo::sliding_window_counter: limit must be in [1, 1e15], got 0");
  CHECK_THROWS_WITH(counter({.limit = 5, .window = 0s}, t0),
                    "rein::algo::sliding_window_counter: window must be > 0, got 0 ns");
  counter c({.limit = 5, .window = 1s}, t0);
  CHECK_THROWS_AS(c.set_limit(0, t0), std::invalid_argument);
  CHECK_THROWS_AS(c.refund(-1, t0), std::invalid_argument);
  CHECK(c.limit() == 5);
}

TEST_CASE("sliding_window_counter handles a limit in the millions in O(1) memory", "[sliding_window_counter]") {
  static_assert(sizeof(counter) <= 64);
  counter c({.limit = 5'000'000, .window = 1min}, t0);
  CHECK(c.try_take(4'000'000, t0) == allow);
  CHECK(c.try_take(1'000'001, t0 + 30s) == deny);
  CHECK(c.try_take(1'000'000, t0 + 30s) == allow);
  // Next window: 5e6 x (60 - e) / 60 <= 5e6 - 2.5e6 from e = 30 s.
  CHECK(c.ready_at(2'500'000, t0 + 30s) == t0 + 90s);
}
