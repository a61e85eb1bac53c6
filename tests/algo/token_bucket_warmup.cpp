// rein::algo::token_bucket with warm-up (Guava's SmoothWarmingUp): the ramp, cooling when idle, refunds,
// set_rate, and bad input; exact times on explicit instants.
#include "support/catch.hpp"

#include <rein/algo/token_bucket.hpp>

#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace {

using namespace std::chrono_literals;
using rein::algo::take_result;
using bucket = rein::algo::token_bucket;
using time_point = bucket::time_point;

const time_point t0 = time_point{} + 1000h;

// 10 tokens per second, one at a time, a 10 s warm-up at Guava's cold factor 3: the threshold is at 5 s
// of coldness, and each token is 0.1 s of it. The interval after a take that leaves coldness c (in units
// of 0.1 s, c >= 50) is 100 + 4 (c - 50) ms: 1 / rate x (1 + 2 (c - 50) / 50).
bucket cold_bucket() { return bucket({.rate = 10, .capacity = 1, .warmup = {.period = 10s}}, t0); }

// Takes a token whenever the bucket has one, `count` times from `t`; returns the time of the last take.
time_point take_at_full_speed(bucket& b, time_point t, int count) {
  for (int i = 0; i < count; ++i) {
    t = *b.ready_at(1, t);
    REQUIRE(b.try_take(1, t) == take_result::allowed);
  }
  return t;
}

}  // namespace

TEST_CASE("token_bucket warm-up: a cold bucket starts at rate / cold_factor", "[token_bucket][warmup]") {
  bucket b = cold_bucket();
  CHECK(b.coldness() == 10s);
  CHECK(b.current_rate() == 10.0 / 3);
  CHECK(b.rate() == 10);
  // The first token is there (capacity is still a burst); the next one comes at the coldness it leaves.
  CHECK(b.try_take(1, t0) == take_result::allowed);
  CHECK(b.coldness() == 9900ms);
  CHECK(b.ready_at(1, t0) == t0 + 296ms);
  CHECK(b.try_take(1, t0 + 296ms - 1ns) == take_result::denied);
  CHECK(b.try_take(1, t0 + 296ms) == take_result::allowed);
  CHECK(b.ready_at(1, t0 + 296ms) == t0 + 296ms + 292ms);
}

TEST_CASE("token_bucket warm-up: used at full speed, the interval falls by 4 ms a token to the stable one",
          "[token_bucket][warmup]") {
  bucket b = cold_bucket();
  time_point t = t0;
  REQUIRE(b.try_take(1, t) == take_result::allowed);
  for (int k = 1; k <= 50; ++k) {
    const time_point next = *b.ready_at(1, t);
    CHECK(next - t == std::chrono::milliseconds(100 + 4 * (50 - k)));
    REQUIRE(b.try_take(1, next) == take_result::allowed);
    t = next;
  }
  // 50 intervals of 100 + 4 j ms, j = 0..49: 5 s + 4.9 s. Guava's trapezoid is 10 s; whole tokens cut a step.
  CHECK(t == t0 + 9900ms);
  CHECK(b.coldness() == 4900ms);
  CHECK(b.current_rate() == 10);
  CHECK(*b.ready_at(1, t) - t == 100ms);
  CHECK(take_at_full_speed(b, t, 100) == t + 10s);
  CHECK(b.coldness() == 0s);
}

TEST_CASE("token_bucket warm-up: only time spent full cools the bucket", "[token_bucket][warmup]") {
  bucket b = cold_bucket();
  REQUIRE(b.try_take(1, t0) == take_result::allowed);
  const time_point warm = take_at_full_speed(b, t0, 50);
  REQUIRE(b.coldness() == 4900ms);
  const time_point full = warm + 100ms;  // the bucket is full again 100 ms after the last take

  SECTION("a short pause stays below the threshold: still the stable rate") {
    REQUIRE(b.try_take(1, full + 100ms) == take_result::allowed);
    CHECK(b.coldness() == 4900ms);  // +0.1 s idle, -0.1 s for the token
    CHECK(*b.ready_at(1, full + 100ms) - (full + 100ms) == 100ms);
  }
  SECTION("a second idle: 5.9 s of coldness, 5.8 s after the token: 132 ms to the next") {
    REQUIRE(b.try_take(1, full + 1s) == take_result::allowed);
    CHECK(b.coldness() == 5800ms);
    CHECK(*b.ready_at(1, full + 1s) - (full + 1s) == 132ms);
  }
  SECTION("idle for the period: cold again, capped") {
    REQUIRE(b.try_take(1, full + 1h) == take_result::allowed);
    CHECK(b.coldness() == 9900ms);
    CHECK(*b.ready_at(1, full + 1h) - (full + 1h) == 296ms);
  }
  SECTION("a bucket waiting for tokens is not idle, however long between calls") {
    bucket c = cold_bucket();
    REQUIRE(c.try_take(1, t0) == take_result::allowed);
    CHECK(c.try_take(1, t0 + 100ms) == take_result::denied);  // a refusal changes nothing
    REQUIRE(c.try_take(1, t0 + 296ms) == take_result::allowed);
    CHECK(c.coldness() == 9800ms);
  }
}

TEST_CASE("token_bucket warm-up: refunds cool back, charges and reservations warm", "[token_bucket][warmup]") {
  bucket b({.rate = 10, .capacity = 5, .warmup = {.period = 10s}}, t0);
  REQUIRE(b.try_take(3, t0) == take_result::allowed);
  CHECK(b.coldness() == 9700ms);
  b.refund(2, t0);
  CHECK(b.coldness() == 9900ms);
  b.refund(5, t0);  // a refund past what was taken cools no further than the period
  CHECK(b.coldness() == 10s);
  CHECK(b.current_rate() == 10.0 / 3);
  b.charge(20, t0);
  CHECK(b.coldness() == 8s);
  REQUIRE(b.reserve(1, t0).has_value());
  CHECK(b.coldness() == 7900ms);
  // 10 x 50 / (50 + 2 x 29) = 500 / 108 tokens per second: 0.216 s a token, 16 owed tokens.
  CHECK(b.tokens(t0) == -16);
  CHECK(b.ready_at(0, t0) == t0);
  CHECK(b.ready_at(1, t0) == t0 + 17 * 216ms);
}

TEST_CASE("token_bucket warm-up: set_rate changes the stable rate, not the coldness", "[token_bucket][warmup]") {
  bucket b = cold_bucket();
  REQUIRE(b.try_take(1, t0) == take_result::allowed);
  b.set_rate(20, t0);
  CHECK(b.rate() == 20);
  CHECK(b.coldness() == 9900ms);
  CHECK(b.ready_at(1, t0) == t0 + 148ms);  // half of 296 ms
}

TEST_CASE("token_bucket warm-up: other cold factors", "[token_bucket][warmup]") {
  // f = 7: threshold P x 8 / 12, a token is P / M = 1 / (rate x 12 / 16) s = 0.1 s for rate 40 / 3.
  // At f = 1 the interval never grows: warm-up is a no-op.
  bucket flat({.rate = 10, .capacity = 1, .warmup = {.period = 10s, .cold_factor = 1}}, t0);
  CHECK(flat.current_rate() == 10);
  REQUIRE(flat.try_take(1, t0) == take_result::allowed);
  CHECK(flat.ready_at(1, t0) == t0 + 100ms);

  bucket steep({.rate = 12, .capacity = 1, .warmup = {.period = 12s, .cold_factor = 7}}, t0);
  CHECK(steep.current_rate() == 12.0 / 7);
  REQUIRE(steep.try_take(1, t0) == take_result::allowed);
  // M = 12 x 12 x 12 / 16 = 108 tokens over 12 s: 1 / 9 s a token, 111111111 ns rounded down.
  CHECK(steep.coldness() == 12s - 111'111'111ns);
}

TEST_CASE("token_bucket warm-up: period 0 is the plain bucket", "[token_bucket][warmup]") {
  bucket plain({.rate = 0.7, .capacity = 3}, t0);
  bucket off({.rate = 0.7, .capacity = 3, .warmup = {.period = 0s, .cold_factor = 9}}, t0);
  time_point t = t0;
  for (int i = 0; i < 40; ++i) {
    t += std::chrono::milliseconds(337 * (i % 7));
    const auto n = static_cast<std::int64_t>(i % 4);
    CHECK(plain.try_take(n, t) == off.try_take(n, t));
    CHECK(plain.ready_at(2, t) == off.ready_at(2, t));
    CHECK(plain.tokens(t) == off.tokens(t));
  }
  CHECK(off.coldness() == 0s);
  CHECK(off.current_rate() == 0.7);
}

TEST_CASE("token_bucket warm-up: bad options are refused, naming field and value", "[token_bucket][warmup]") {
  CHECK_THROWS_WITH(bucket({.rate = 1, .capacity = 1, .warmup = {.period = -1ns}}, t0),
                    "rein::algo::token_bucket: warmup.period must be >= 0, got -1 ns");
  CHECK_THROWS_WITH(bucket({.rate = 1, .capacity = 1, .warmup = {.period = 1s, .cold_factor = 0.5}}, t0),
                    "rein::algo::token_bucket: warmup.cold_factor must be in [1, 1000], got 0.5");
  CHECK_THROWS_WITH(bucket({.rate = 1, .capacity = 1, .warmup = {.period = 1s, .cold_factor = 1001}}, t0),
                    "rein::algo::token_bucket: warmup.cold_factor must be in [1, 1000], got 1001");
  CHECK_THROWS_AS(
      bucket(
          {.rate = 1, .capacity = 1, .warmup = {.period = 1s, .cold_factor = std::numeric_limits<double>::quiet_NaN()}},
          t0),
      std::invalid_argument);
}
