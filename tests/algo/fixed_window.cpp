// rein::algo::fixed_window: calendar-aligned counts, exact ready_at at the window's edge, the boundary
// burst (and the sliding window that avoids it), refunds, charges into debt and upstream corrections.
#include "support/catch.hpp"

#include <rein/algo/all_of.hpp>
#include <rein/algo/fixed_window.hpp>
#include <rein/algo/sliding_window.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <stdexcept>
#include <vector>

namespace {

using namespace std::chrono_literals;
using rein::algo::take_result;
using fixed = rein::algo::fixed_window;
using time_point = fixed::time_point;
using ns = std::chrono::nanoseconds;

constexpr take_result allow = take_result::allowed;
constexpr take_result deny = take_result::denied;
constexpr take_result exceeds = take_result::exceeds_capacity;

// A whole number of seconds, minutes and hours after the steady clock's epoch: window starts of 1 s, 1 min.
const time_point t0 = time_point{} + 1000h;

static_assert(rein::algo::rate_limit<fixed>);
static_assert(rein::algo::chargeable_rate_limit<fixed>);
static_assert(rein::algo::remaining_limited_rate_limit<fixed>);
static_assert(rein::algo::rate_limit<rein::algo::all_of<fixed, rein::algo::sliding_window>>);

// Deterministic on every standard library: the engine's output is specified, the reduction is ours.
std::int64_t below(std::mt19937_64& random, std::int64_t bound) {
  return static_cast<std::int64_t>(random() % static_cast<std::uint64_t>(bound));
}

// The most starts in any interval [s, s + w) of a sorted log.
std::int64_t densest(const std::vector<time_point>& starts, ns w) {
  std::int64_t most = 0;
  for (std::size_t i = 0; i < starts.size(); ++i) {
    const auto end = std::lower_bound(starts.begin(), starts.end(), starts[i] + w);
    most = std::max(most, static_cast<std::int64_t>(end - starts.begin()) - static_cast<std::int64_t>(i));
  }
  return most;
}

}  // namespace

TEST_CASE("fixed_window admits limit units per window and the next one at the window's start", "[fixed_window]") {
  fixed w({.limit = 3, .window = 1s}, t0 + 100ms);
  CHECK(w.try_take(t0 + 100ms) == allow);
  CHECK(w.try_take(t0 + 200ms) == allow);
  CHECK(w.try_take(t0 + 900ms) == allow);
  CHECK(w.try_take(t0 + 950ms) == deny);
  CHECK(w.count(t0 + 950ms) == 3);
  // Not when the first unit has been counted for a second (1.1 s), as a sliding window would say: the count
  // starts again at 1.0 s, for all three at once.
  CHECK(w.ready_at(1, t0 + 950ms) == t0 + 1s);
  CHECK(w.ready_at(3, t0 + 950ms) == t0 + 1s);
  CHECK(w.try_take(t0 + 1s - 1ns) == deny);
  CHECK(w.count(t0 + 1s - 1ns) == 3);
  CHECK(w.count(t0 + 1s) == 0);
  CHECK(w.ready_at(3, t0 + 1s) == t0 + 1s);
  CHECK(w.try_take(3, t0 + 1s) == allow);
  CHECK(w.window_start(t0 + 1500ms) == t0 + 1s);
  CHECK(w.window_end(t0 + 1500ms) == t0 + 2s);
  // An idle stretch of many windows forgets everything: the count is that of the window holding t.
  CHECK(w.count(t0 + 1h) == 0);
  CHECK(w.try_take(3, t0 + 1h + 999ms) == allow);
  CHECK(w.ready_at(1, t0 + 1h + 999ms) == t0 + 1h + 1s);
}

TEST_CASE("fixed_window ready_at at the boundary is exact: the window's start, denied one tick earlier",
          "[fixed_window]") {
  fixed w({.limit = 2, .window = 1min}, t0);
  CHECK(w.try_take(2, t0 + 59s) == allow);
  const std::optional<time_point> ready = w.ready_at(1, t0 + 59s);
  REQUIRE(ready == t0 + 1min);
  fixed copy = w;
  CHECK(copy.try_take(1, *ready - 1ns) == deny);
  CHECK(w.try_take(1, *ready) == allow);
  // At the start itself the window has all its room but what was just taken.
  CHECK(w.ready_at(1, t0 + 1min) == t0 + 1min);
  CHECK(w.ready_at(2, t0 + 1min) == t0 + 2min);
}

TEST_CASE("fixed_window boundary burst: 2 x limit within one tick across an edge; the sliding window of the "
          "same limit never lets more than limit into any window",
          "[fixed_window][sliding_window]") {
  // 100 per minute; 100 calls at 59.999999999 s and 100 more at 60 s, greedy, one unit each.
  fixed f({.limit = 100, .window = 1min}, t0);
  rein::algo::sliding_window s({.limit = 100, .window = 1min}, t0);
  std::vector<time_point> fixed_starts, sliding_starts;
  for (const time_point t : {t0 + 1min - 1ns, t0 + 1min}) {
    for (int i = 0; i < 100; ++i) {
      if (f.try_take(t) == allow) fixed_starts.push_back(t);
      if (s.try_take(t) == allow) sliding_starts.push_back(t);
    }
  }
  CHECK(fixed_starts.size() == 200);
  CHECK(densest(fixed_starts, 1ns + 1ns) == 200);  // 200 starts within 2 ns
  CHECK(sliding_starts.size() == 100);            // the second 100 wait until 1 min - 1 ns + 1 min
  CHECK(s.ready_at(1, t0 + 1min) == t0 + 2min - 1ns);
  CHECK(f.ready_at(1, t0 + 1min) == t0 + 2min);

  // A minute of calls, one per millisecond from 0:30 to 1:30, admitted greedily: the fixed window takes
  // 100 at 0:30 and 100 more at 1:00, 200 within that minute; the sliding window takes the limit, 100.
  fixed f2({.limit = 100, .window = 1min}, t0);
  rein::algo::sliding_window s2({.limit = 100, .window = 1min}, t0);
  std::vector<time_point> a, b;
  for (time_point t = t0 + 30s; t < t0 + 90s; t += 1ms) {
    if (f2.try_take(t) == allow) a.push_back(t);
    if (s2.try_take(t) == allow) b.push_back(t);
  }
  CHECK(a.size() == 200);
  CHECK(b.size() == 100);
  CHECK(densest(a, 1min) == 200);
  CHECK(a[100] == t0 + 1min);
  CHECK(densest(b, 1min) == 100);
}

TEST_CASE("fixed_window windows are aligned to the epoch plus the offset: UTC minutes on system_clock",
          "[fixed_window]") {
  using utc = rein::algo::utc_fixed_window;
  using sys = std::chrono::system_clock;
  using std::chrono::sys_days;
  using std::chrono::year_month_day;
  // 2026-12-01 12:00:59.5 UTC.
  const sys::time_point noon = sys_days{year_month_day{std::chrono::year{2026}, std::chrono::December, std::chrono::day{1}}} + 12h;
  const sys::time_point t = noon + 59s + 500ms;
  utc per_minute({.limit = 1000, .window = 1min}, t);
  CHECK(per_minute.window_start(t) == noon);
  CHECK(per_minute.window_end(t) == noon + 1min);
  CHECK(per_minute.try_take(1000, t) == allow);
  CHECK(per_minute.ready_at(1, t) == noon + 1min);  // 12:01:00 UTC, half a second later
  CHECK(per_minute.try_take(1000, noon + 1min) == allow);

  // Daily windows that start at 05:00 UTC: offset -19 h and +5 h are the same windows.
  utc daily({.limit = 10, .window = 24h, .offset = 5h}, noon);
  utc same({.limit = 10, .window = 24h, .offset = -19h}, noon);
  CHECK(daily.offset() == 5h);
  CHECK(same.offset() == 5h);
  CHECK(daily.window_start(noon) == noon - 7h);
  CHECK(daily.window_end(noon) == noon + 17h);
  CHECK(same.window_end(noon) == noon + 17h);
  // Before 05:00 a time belongs to the previous day's window.
  CHECK(daily.window_start(noon + 16h) == noon - 7h);
  CHECK(daily.window_start(noon + 17h) == noon + 17h);

  // The offset on a steady clock: windows of 1 s starting at 250 ms past each second.
  fixed shifted({.limit = 1, .window = 1s, .offset = 250ms}, t0);
  CHECK(shifted.try_take(t0 + 100ms) == allow);
  CHECK(shifted.ready_at(1, t0 + 100ms) == t0 + 250ms);
  CHECK(shifted.try_take(t0 + 250ms) == allow);
  CHECK(shifted.ready_at(1, t0 + 250ms) == t0 + 1250ms);
}

TEST_CASE("fixed_window weighted requests take n units or none", "[fixed_window]") {
  fixed w({.limit = 5, .window = 10s}, t0);
  CHECK(w.try_take(3, t0) == allow);
  CHECK(w.try_take(3, t0 + 1s) == deny);
  CHECK(w.count(t0 + 1s) == 3);
  CHECK(w.try_take(2, t0 + 1s) == allow);
  CHECK(w.try_take(6, t0 + 1s) == exceeds);
  CHECK(w.try_take(0, t0 + 1s) == allow);
  CHECK(w.ready_at(6, t0) == std::nullopt);
  CHECK(w.ready_at(0, t0 + 2s) == t0 + 2s);
  CHECK(w.ready_at(5, t0 + 2s) == t0 + 10s);
  CHECK(w.count(t0 + 2s) == 5);
}

TEST_CASE("fixed_window treats a stamp earlier than the last change as the last change", "[fixed_window]") {
  fixed w({.limit = 1, .window = 1s}, t0);
  CHECK(w.try_take(t0 + 5s) == allow);
  CHECK(w.try_take(t0 + 1s) == deny);  // judged at 5 s, in the window [5 s, 6 s)
  CHECK(w.ready_at(1, t0) == t0 + 6s);
  CHECK(w.last_time() == t0 + 5s);
  CHECK(w.count(t0) == 1);
}

TEST_CASE("fixed_window refund lowers the current window's count, never below zero", "[fixed_window][refund]") {
  fixed w({.limit = 3, .window = 1s}, t0);
  CHECK(w.try_take(3, t0 + 100ms) == allow);
  w.refund(1, t0 + 200ms);
  CHECK(w.count(t0 + 200ms) == 2);
  CHECK(w.ready_at(1, t0 + 200ms) == t0 + 200ms);
  CHECK(w.ready_at(2, t0 + 200ms) == t0 + 1s);
  w.refund(10, t0 + 300ms);
  CHECK(w.count(t0 + 300ms) == 0);
  CHECK(w.try_take(3, t0 + 300ms) == allow);
  CHECK(w.try_take(t0 + 300ms) == deny);
  // A refund in a later window gives room in that window, which never holds more than the limit.
  CHECK(w.try_take(3, t0 + 1s) == allow);
  w.refund(1, t0 + 1s);
  CHECK(w.count(t0 + 1s) == 2);
  w.refund(0, t0 + 1s);
  CHECK(w.count(t0 + 1s) == 2);
  CHECK_THROWS_WITH(w.refund(-1, t0 + 1s), "rein::algo::fixed_window: n must be >= 0, got -1");
}

TEST_CASE("fixed_window charge carries debt into the next windows, limit repaid at each start",
          "[fixed_window][charge]") {
  fixed w({.limit = 10, .window = 1s}, t0);
  CHECK(w.try_take(4, t0) == allow);
  w.charge(21, t0 + 500ms);  // 25 counted: this window, 10 of the next, 5 of the one after
  CHECK(w.count(t0 + 500ms) == 25);
  CHECK(w.count(t0 + 1s) == 15);
  CHECK(w.count(t0 + 2s) == 5);
  CHECK(w.count(t0 + 3s) == 0);
  CHECK(w.ready_at(1, t0 + 500ms) == t0 + 2s);
  CHECK(w.ready_at(5, t0 + 500ms) == t0 + 2s);
  CHECK(w.ready_at(6, t0 + 500ms) == t0 + 3s);
  CHECK(w.ready_at(0, t0 + 500ms) == t0 + 500ms);  // nothing asked: now, even in debt
  CHECK(w.try_take(0, t0 + 500ms) == allow);
  CHECK(w.try_take(1, t0 + 2s - 1ns) == deny);
  CHECK(w.try_take(5, t0 + 2s) == allow);
  CHECK(w.try_take(1, t0 + 2s) == deny);
  // A refund repays debt first.
  w.charge(20, t0 + 2s);  // 30 in the window of 2 s
  w.refund(15, t0 + 2s);
  CHECK(w.count(t0 + 2s) == 15);
  CHECK(w.ready_at(5, t0 + 2s) == t0 + 3s);
  // The count saturates instead of overflowing.
  w.charge(fixed::max_limit, t0 + 2s);
  w.charge(fixed::max_limit, t0 + 2s);
  CHECK(w.count(t0 + 2s) == fixed::max_limit);
  CHECK(w.ready_at(1, t0 + 2s) == std::nullopt);  // 2^62 / 10 windows of 1 s: beyond the clock's range
  CHECK_THROWS_WITH(w.charge(-3, t0 + 2s), "rein::algo::fixed_window: n must be >= 0, got -3");
}

TEST_CASE("fixed_window limit_remaining applies an upstream's count until its reset, never raising",
          "[fixed_window][limit_remaining]") {
  fixed w({.limit = 100, .window = 1min}, t0);
  CHECK(w.try_take(10, t0 + 10s) == allow);
  // The upstream counted more (other clients): 30 left until its reset at the end of this minute.
  CHECK(w.limit_remaining(30, 50s, t0 + 10s));
  CHECK(w.count(t0 + 10s) == 70);
  CHECK(w.try_take(30, t0 + 10s) == allow);
  CHECK(w.try_take(1, t0 + 10s) == deny);
  CHECK(w.ready_at(1, t0 + 10s) == t0 + 1min);
  // A count above what the window knows changes nothing.
  CHECK_FALSE(w.limit_remaining(50, 50s, t0 + 10s));
  CHECK(w.count(t0 + 10s) == 100);
  // The reset at the window's start: the next count starts from zero, nothing to lower.
  CHECK_FALSE(w.limit_remaining(0, 0s, t0 + 1min));
  CHECK(w.count(t0 + 1min) == 0);

  // A reset two window starts away: 50 in all until then, over this window and the next two.
  fixed v({.limit = 100, .window = 1min}, t0);
  CHECK(v.limit_remaining(50, 2min + 30s, t0 + 10s));  // resets at 2:40, in the window of 2:00
  CHECK(v.count(t0 + 10s) == 250);
  CHECK(v.ready_at(1, t0 + 10s) == t0 + 2min);
  CHECK(v.ready_at(50, t0 + 10s) == t0 + 2min);
  CHECK(v.ready_at(51, t0 + 10s) == t0 + 3min);
  // A reset exactly at a window's start belongs to that start: only this window is limited.
  fixed u({.limit = 100, .window = 1min}, t0);
  CHECK(u.limit_remaining(5, 50s, t0 + 10s));
  CHECK(u.count(t0 + 10s) == 95);
  CHECK(u.count(t0 + 1min) == 0);

  CHECK_THROWS_WITH(u.limit_remaining(-1, 1s, t0), "rein::algo::fixed_window: remaining must be >= 0, got -1");
  CHECK_THROWS_WITH(u.limit_remaining(1, -1s, t0),
                    "rein::algo::fixed_window: reset_after must be >= 0, got -1000000000 ns");
}

TEST_CASE("fixed_window limit and window changes apply from the time of the change", "[fixed_window]") {
  fixed w({.limit = 4, .window = 1s}, t0);
  CHECK(w.try_take(3, t0 + 100ms) == allow);
  w.set_limit(2, t0 + 200ms);  // 3 counted, limit 2: nothing more in this window
  CHECK(w.limit() == 2);
  CHECK(w.try_take(1, t0 + 200ms) == deny);
  CHECK(w.ready_at(1, t0 + 200ms) == t0 + 1s);
  CHECK(w.try_take(3, t0 + 1s) == exceeds);
  w.set_limit(5, t0 + 300ms);
  CHECK(w.try_take(2, t0 + 300ms) == allow);
  CHECK(w.count(t0 + 300ms) == 5);
  // Windows of 10 s from 0.4 s on: the 5 counted stay in the window [0 s, 10 s).
  w.set_window(10s, t0 + 400ms);
  CHECK(w.window() == 10s);
  CHECK(w.count(t0 + 5s) == 5);
  CHECK(w.ready_at(1, t0 + 5s) == t0 + 10s);
  CHECK(w.count(t0 + 10s) == 0);
}

TEST_CASE("fixed_window ready_at is exact and agrees with a model count per window under random use",
          "[fixed_window]") {
  constexpr std::int64_t limit = 7, length = 1'000'000;  // 7 per ms, windows offset by 0.3 ms
  fixed w({.limit = limit, .window = ns(length), .offset = ns(300'000)}, t0);
  std::mt19937_64 random(17);
  std::map<std::int64_t, std::int64_t> model;  // window number -> units taken in it
  std::int64_t elapsed = 0;
  for (int i = 0; i < 100'000; ++i) {
    elapsed += below(random, 150'000);
    const std::int64_t n = below(random, limit + 2);
    const time_point t = t0 + ns(elapsed);
    const std::int64_t window = (elapsed - 300'000 + 1'000 * length) / length;  // t0 is a whole ms
    const std::optional<time_point> ready = w.ready_at(n, t);
    if (n > limit) {
      REQUIRE(!ready);
      REQUIRE(w.try_take(n, t) == exceeds);
      continue;
    }
    REQUIRE(ready);
    REQUIRE(w.count(t) == model[window]);
    // Exact: room at `ready`, none one tick before (unless ready is now).
    if (*ready > t) {
      fixed copy = w;
      REQUIRE(copy.try_take(n, *ready - 1ns) == deny);
      REQUIRE(copy.try_take(n, *ready) == allow);
    }
    const take_result r = w.try_take(n, t);
    REQUIRE(r == (*ready == t ? allow : deny));
    if (r == allow) model[window] += n;
    REQUIRE(model[window] <= limit);
  }
  std::int64_t full = 0;
  for (const auto& [window, taken] : model) full += taken == limit ? 1 : 0;
  CHECK(full > 1000);  // the test did reach the limit often
}

TEST_CASE("fixed_window backlog_ready_at is when a FIFO of single units would take the last one",
          "[fixed_window]") {
  fixed w({.limit = 3, .window = 1s}, t0);
  CHECK(w.try_take(2, t0 + 100ms) == allow);
  CHECK(w.backlog_ready_at(0, t0 + 100ms) == t0 + 100ms);
  CHECK(w.backlog_ready_at(1, t0 + 100ms) == t0 + 100ms);
  CHECK(w.backlog_ready_at(2, t0 + 100ms) == t0 + 1s);
  CHECK(w.backlog_ready_at(4, t0 + 100ms) == t0 + 1s);
  CHECK(w.backlog_ready_at(5, t0 + 100ms) == t0 + 2s);
  CHECK(w.backlog_ready_at(7, t0 + 100ms) == t0 + 2s);
  CHECK(w.backlog_ready_at(8, t0 + 100ms) == t0 + 3s);

  // Against the FIFO itself, after a charge, for every backlog up to 40.
  w.charge(5, t0 + 200ms);
  for (std::uint64_t total = 1; total <= 40; ++total) {
    fixed copy = w;
    time_point t = t0 + 200ms;
    for (std::uint64_t i = 0; i < total; ++i) {
      t = *copy.ready_at(1, t);
      REQUIRE(copy.try_take(1, t) == allow);
    }
    REQUIRE(w.backlog_ready_at(total, t0 + 200ms) == t);
  }
}

TEST_CASE("fixed_window rejects invalid options, naming the field and the value", "[fixed_window][validation]") {
  CHECK_THROWS_WITH(fixed({.limit = 0, .window = 1s}, t0), "rein::algo::fixed_window: limit must be in [1, 2^62], got 0");
  CHECK_THROWS_WITH(fixed({.limit = fixed::max_limit + 1, .window = 1s}, t0),
                    "rein::algo::fixed_window: limit must be in [1, 2^62], got 4611686018427387905");
  CHECK_THROWS_WITH(fixed({.limit = 1, .window = 0s}, t0), "rein::algo::fixed_window: window must be > 0, got 0 ns");
  CHECK_THROWS_WITH(fixed({.limit = 1, .window = -1s}, t0),
                    "rein::algo::fixed_window: window must be > 0, got -1000000000 ns");
  fixed w({.limit = 2, .window = 1s}, t0);
  CHECK(w.try_take(t0) == allow);
  CHECK_THROWS_AS(w.set_limit(-1, t0), std::invalid_argument);
  CHECK_THROWS_AS(w.set_window(0s, t0), std::invalid_argument);
  CHECK_THROWS_WITH(w.try_take(-2, t0), "rein::algo::fixed_window: n must be >= 0, got -2");
  CHECK_THROWS_WITH(w.ready_at(-2, t0), "rein::algo::fixed_window: n must be >= 0, got -2");
  CHECK(w.limit() == 2);
  CHECK(w.window() == 1s);
  CHECK(w.count(t0) == 1);
}
