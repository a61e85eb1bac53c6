// The pure hedge delay: the fixed delay, a percentile once min_samples latencies are known, and the rotating
// periods (the current one written, the last full one read, both dropped after two idle periods).
#include <rein/algo/hedge_delay.hpp>

#include <chrono>
#include <cstdint>
#include <limits>
#include <stdexcept>

#include "support/catch.hpp"

using namespace std::chrono_literals;
using rein::algo::hedge_delay;
using rein::algo::hedge_delay_options;
using rein::algo::log_histogram;
using std::chrono::nanoseconds;

namespace {

using time_point = hedge_delay::time_point;
time_point at(nanoseconds d) { return time_point(d); }

hedge_delay_options median_of(std::uint64_t min_samples, nanoseconds period = 1s) {
  hedge_delay_options o;
  o.delay = 2s;
  o.quantile = 50.0;
  o.min_samples = min_samples;
  o.latency_period = period;
  return o;
}

}  // namespace

TEST_CASE("without a quantile the delay is fixed", "[hedge_delay]") {
  hedge_delay_options o;
  o.delay = 30ms;
  hedge_delay rule(o);
  log_histogram many;
  many.record(1ms, 1000);
  CHECK(rule.delay_for(many) == 30ms);
  rule.record(at(0s), 1ms);
  CHECK(rule.delay(at(5s)) == 30ms);
}

TEST_CASE("the percentile is read once min_samples latencies are known", "[hedge_delay]") {
  const hedge_delay rule(median_of(3));
  log_histogram h;
  h.record(1024ns);  // 1,024 ns and 2,048 ns are bucket lower bounds: both read back exactly
  h.record(2048ns);
  CHECK(rule.delay_for(h) == 2s);  // two: too few
  h.record(2048ns);
  // Rank 2 of 3 is 2,048 ns, in bucket [2,048, 2,112) ns whose midpoint, 2,080 ns, is clamped to max().
  CHECK(rule.delay_for(h) == 2048ns);
  h.record(4096ns, 3);  // rank 3 of 6: still 2,048 ns, its midpoint 2,080 ns now within [min, max]
  CHECK(rule.delay_for(h) == 2080ns);
}

TEST_CASE("latencies are read from the last full period only", "[hedge_delay]") {
  hedge_delay rule(median_of(1, 1s));
  rule.record(at(0ms), 1024ns);  // the first period starts here
  rule.record(at(900ms), 1024ns);
  CHECK(rule.delay(at(999ms)) == 2s);  // nothing full yet
  CHECK(rule.current().count() == 2);
  CHECK(rule.delay(at(1s)) == 1024ns);  // rotated at 1 s: the first period is read
  CHECK(rule.current().count() == 0);
  rule.record(at(1500ms), 8192ns);
  CHECK(rule.delay(at(1999ms)) == 1024ns);  // the period from 1 s is not full
  CHECK(rule.delay(at(2500ms)) == 8192ns);  // rotated at 2.5 s, 1.5 s after the last rotation
  CHECK(rule.previous().count() == 1);
  CHECK(rule.delay(at(4500ms)) == 2s);  // two periods without a rotation: stale, nothing read
  CHECK(rule.previous().count() == 0);
}

TEST_CASE("a time before the period's start counts as its start", "[hedge_delay]") {
  hedge_delay rule(median_of(1, 1s));
  rule.record(at(5s), 1024ns);
  rule.record(at(4s), 1024ns);
  CHECK(rule.current().count() == 2);
  CHECK(rule.delay(at(5999ms)) == 2s);
  CHECK(rule.delay(at(6s)) == 1024ns);
}

TEST_CASE("invalid hedge delay options name the field and the value", "[hedge_delay][validation]") {
  hedge_delay_options o;
  o.delay = -1ns;
  CHECK_THROWS_WITH(hedge_delay(o), "rein::algo::hedge_delay: delay must be > 0, got -1 ns");
  o = {};
  o.quantile = 0.0;
  CHECK_THROWS_WITH(hedge_delay(o), "rein::algo::hedge_delay: quantile must be in (0, 100), got 0");
  o.quantile = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH(hedge_delay(o), "rein::algo::hedge_delay: quantile must be in (0, 100), got nan");
  o = {};
  o.min_samples = 0;
  CHECK_THROWS_WITH(hedge_delay(o), "rein::algo::hedge_delay: min_samples must be >= 1, got 0");
  o = {};
  o.latency_period = 0s;
  CHECK_THROWS_WITH(hedge_delay(o), "rein::algo::hedge_delay: latency_period must be > 0, got 0 ns");
}

TEST_CASE("a period past half the range of nanoseconds rotates without overflow", "[hedge_delay]") {
  hedge_delay_options o = median_of(1, nanoseconds(std::numeric_limits<std::int64_t>::max() / 2 + 1));
  hedge_delay rule(o);
  rule.record(at(0ns), 5ms);
  rule.record(at(o.latency_period), 5ms);  // one full period later: the first period is the last full one
  CHECK(rule.previous().count() == 1);
  CHECK(rule.delay(at(o.latency_period)) == 5ms);
}
