// rein/quota.hpp: quotas in the user's units, converted to exact rates, and bad input refused.
#include "support/catch.hpp"

#include <rein/algo/token_bucket.hpp>
#include <rein/quota.hpp>

#include <chrono>
#include <limits>
#include <stdexcept>
#include <string>

namespace {

using namespace std::chrono_literals;
using time_point = std::chrono::steady_clock::time_point;

const time_point t0{};

std::string message_of(auto make) {
  try {
    make();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no exception)";
}

}  // namespace

TEST_CASE("quotas per period are rates per second", "[quota]") {
  CHECK(rein::per_second(5).per_second() == 5.0);
  CHECK(rein::per_minute(600).per_second() == 10.0);
  CHECK(rein::per_hour(90).per_second() == 0.025);
  CHECK(rein::per_day(86'400).per_second() == 1.0);
  CHECK(rein::every(250ms).per_second() == 4.0);
  CHECK(rein::every(std::chrono::minutes(2)).per_second() == 1.0 / 120);
  const rein::quota q(3, std::chrono::duration<double>(1.5));
  CHECK(q.count() == 3.0);
  CHECK(q.period().count() == 1.5);
  CHECK(q.per_second() == 2.0);
  const double rate = rein::per_minute(90'000);  // a provider's TPM where a rate option is a double
  CHECK(rate == 1500.0);
}

TEST_CASE("a per-day quota in a token bucket grants at exact instants", "[quota]") {
  // 1000 per day is 5/432 per second: one token every 86.4 s exactly.
  rein::algo::token_bucket b({.rate = rein::per_day(1000), .capacity = 1}, t0);
  CHECK(b.try_take(1, t0) == rein::algo::take_result::allowed);
  CHECK(b.ready_at(1, t0) == t0 + 86'400ms);
  CHECK(b.try_take(1, t0 + 86'399'999'999ns) == rein::algo::take_result::denied);
  CHECK(b.try_take(1, t0 + 86'400ms) == rein::algo::take_result::allowed);
  CHECK(b.ready_at(1, t0 + 86'400ms) == t0 + 172'800ms);
}

TEST_CASE("a per-minute quota with a stated burst", "[quota]") {
  rein::algo::token_bucket b({.rate = rein::per_minute(60), .capacity = 3}, t0);
  CHECK(b.try_take(3, t0) == rein::algo::take_result::allowed);
  CHECK(b.ready_at(1, t0) == t0 + 1s);
  CHECK(b.ready_at(3, t0) == t0 + 3s);
  CHECK(b.try_take(4, t0 + 1h) == rein::algo::take_result::exceeds_capacity);  // a charge above the burst
}

TEST_CASE("bad quotas are refused with the type, the field and the value", "[quota][errors]") {
  constexpr double nan = std::numeric_limits<double>::quiet_NaN();
  constexpr double inf = std::numeric_limits<double>::infinity();
  CHECK(message_of([] { rein::per_minute(0); }) == "rein::quota: count must be finite and > 0, got 0");
  CHECK(message_of([] { rein::per_minute(-5); }) == "rein::quota: count must be finite and > 0, got -5");
  CHECK(message_of([&] { rein::per_hour(nan); }) == "rein::quota: count must be finite and > 0, got nan");
  CHECK(message_of([&] { rein::per_day(inf); }) == "rein::quota: count must be finite and > 0, got inf");
  CHECK(message_of([] { rein::every(0ms); }) == "rein::quota: period must be finite and > 0 seconds, got 0 s");
  CHECK(message_of([] { rein::every(-2s); }) == "rein::quota: period must be finite and > 0 seconds, got -2 s");
  CHECK(message_of([&] { rein::every(std::chrono::duration<double>(nan)); }) ==
        "rein::quota: period must be finite and > 0 seconds, got nan s");
  CHECK(message_of([&] { rein::quota(1, std::chrono::duration<double>(inf)); }) ==
        "rein::quota: period must be finite and > 0 seconds, got inf s");
  CHECK(message_of([] { rein::quota(1e300, std::chrono::duration<double>(1e-300)); }) ==
        "rein::quota: count / period must be a finite rate > 0 per second, got inf");
  CHECK(message_of([] { rein::quota(1e-300, std::chrono::duration<double>(1e300)); }) ==
        "rein::quota: count / period must be a finite rate > 0 per second, got 0");
}
