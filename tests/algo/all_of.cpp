// rein::algo::all_of: several limits checked together, all or nothing.
#include "support/catch.hpp"

#include <rein/algo/all_of.hpp>
#include <rein/algo/sliding_window.hpp>
#include <rein/algo/sliding_window_counter.hpp>
#include <rein/algo/token_bucket.hpp>

#include <chrono>
#include <cstdint>
#include <optional>

namespace {

using namespace std::chrono_literals;
using rein::algo::take_result;
using rein::algo::token_bucket;
using rein::algo::sliding_window;
using time_point = token_bucket::time_point;

constexpr take_result allow = take_result::allowed;
constexpr take_result deny = take_result::denied;
constexpr take_result exceeds = take_result::exceeds_capacity;

const time_point t0 = time_point{} + 1000h;

static_assert(rein::algo::rate_limit<token_bucket>);
static_assert(rein::algo::rate_limit<sliding_window>);
static_assert(rein::algo::rate_limit<rein::algo::sliding_window_counter>);
static_assert(rein::algo::rate_limit<rein::algo::all_of<token_bucket, sliding_window>>);

}  // namespace

TEST_CASE("all_of: 10 per second and 15 per hour, a request takes from both or from neither", "[all_of]") {
  rein::algo::all_of limits{token_bucket({.rate = 10, .capacity = 10}, t0),
                            sliding_window({.limit = 15, .window = 1h}, t0)};
  for (int i = 0; i < 10; ++i) CHECK(limits.try_take(1, t0) == allow);
  // The bucket is empty; the window, which would admit, is not charged.
  CHECK(limits.try_take(1, t0) == deny);
  CHECK(limits.get<1>().count(t0) == 10);
  CHECK(limits.ready_at(1, t0) == t0 + 100ms);

  CHECK(limits.try_take(5, t0 + 1s) == allow);
  // The window is full for the hour; the bucket, which would admit, is not charged.
  CHECK(limits.try_take(1, t0 + 1s) == deny);
  CHECK(limits.get<0>().tokens(t0 + 1s) == 5.0);
  // The earliest time is the latest of the parts': the bucket has a token now, the window only in an hour.
  CHECK(limits.get<0>().ready_at(1, t0 + 1s) == t0 + 1s);
  CHECK(limits.ready_at(1, t0 + 1s) == t0 + 1h);
  CHECK(limits.try_take(1, t0 + 1h - 1ns) == deny);
  CHECK(limits.try_take(1, t0 + 1h) == allow);
}

TEST_CASE("all_of charges each limit its own count: requests and tokens per minute", "[all_of]") {
  // 3 requests per minute, exactly, and 1,000 tokens per minute with a full minute's burst.
  rein::algo::all_of limits{sliding_window({.limit = 3, .window = 1min}, t0),
                            token_bucket({.rate = 1000.0 / 60, .capacity = 1000}, t0)};
  using counts = decltype(limits)::counts;
  CHECK(limits.try_take(counts{1, 600}, t0) == allow);
  CHECK(limits.try_take(counts{1, 600}, t0) == deny);
  CHECK(limits.get<0>().count(t0) == 1);
  CHECK(limits.try_take(counts{1, 400}, t0) == allow);
  // The first call used 450 of its estimated 600: reconcile by refunding tokens only.
  limits.refund(counts{0, 150}, t0 + 1s);
  CHECK(limits.get<0>().count(t0 + 1s) == 2);
  // 150 refunded plus 1 s at 1000/60 per second: 166.67 tokens; 200 need 33.33 more, i.e. 2 s more.
  CHECK(limits.ready_at(counts{1, 200}, t0 + 1s) == t0 + 3s);
  CHECK(limits.try_take(counts{1, 1001}, t0 + 1s) == exceeds);
  CHECK(limits.try_take(counts{4, 1}, t0 + 1s) == exceeds);
  CHECK(limits.ready_at(counts{1, 1001}, t0 + 1s) == std::nullopt);
  CHECK(limits.try_take(counts{1, 200}, t0 + 3s) == allow);
  // Now the window is full until the first call leaves it.
  CHECK(limits.ready_at(counts{1, 0}, t0 + 3s) == t0 + 1min);
}

TEST_CASE("all_of capacity is the smallest part's and last_time the latest", "[all_of]") {
  rein::algo::all_of limits{token_bucket({.rate = 1, .capacity = 8}, t0), sliding_window({.limit = 5, .window = 1s}, t0)};
  CHECK(limits.capacity() == 5);
  CHECK(limits.try_take(6, t0) == exceeds);
  CHECK(limits.ready_at(6, t0) == std::nullopt);
  CHECK(limits.try_take(5, t0 + 2s) == allow);
  CHECK(limits.last_time() == t0 + 2s);
  // A part changed directly moves the common clock: earlier stamps are judged at its time.
  limits.get<0>().set_rate(2, t0 + 3s);
  CHECK(limits.last_time() == t0 + 3s);
  // At 3 s the bucket holds 3 + 1 tokens and the window's five starts from 2 s have just left it.
  CHECK(limits.ready_at(4, t0) == t0 + 3s);
  CHECK(limits.ready_at(5, t0) == t0 + 3500ms);
  CHECK(limits.try_take(4, t0) == allow);
  CHECK(limits.get<1>().count(t0 + 3s) == 4);
}

TEST_CASE("all_of nests and validates its counts", "[all_of]") {
  rein::algo::all_of inner{token_bucket({.rate = 10, .capacity = 2}, t0), sliding_window({.limit = 3, .window = 1s}, t0)};
  rein::algo::all_of outer{inner, rein::algo::sliding_window_counter({.limit = 100, .window = 1min}, t0)};
  CHECK(outer.try_take(2, t0) == allow);
  CHECK(outer.try_take(1, t0 + 100ms) == allow);
  CHECK(outer.try_take(1, t0 + 200ms) == deny);  // the inner window is full until 1 s
  CHECK(outer.ready_at(1, t0 + 200ms) == t0 + 1s);
  CHECK(outer.get<1>().estimate(t0 + 200ms) == 3.0);
  CHECK_THROWS_WITH(outer.try_take(-1, t0), "rein::algo::all_of: n must be >= 0, got -1");
}
