// rein::algo::admission_throttle (the SRE book's client-side throttling): the formula's exact values, the
// draw, the window, bad options, and convergence against an upstream that accepts a fixed count per second.
#include "support/catch.hpp"

#include <rein/algo/admission_throttle.hpp>
#include <rein/algo/fixed_window.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>

namespace {

using namespace std::chrono_literals;
using rein::outcome;
using throttle = rein::algo::admission_throttle;
using time_point = throttle::time_point;

// On a slice boundary (window 10 s: slices of 1 s), far from the epoch.
const time_point t0 = time_point{} + 1000h;

throttle ten_seconds(double multiplier = 2.0, double max_rejection = 1.0) {
  return throttle({.window = 10s, .multiplier = multiplier, .max_rejection = max_rejection});
}

void record(throttle& t, outcome o, int n, time_point at) {
  for (int i = 0; i < n; ++i) t.record(o, at);
}

// splitmix64, as a draw in [0, 1).
double draw(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return static_cast<double>((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
}

}  // namespace

TEST_CASE("admission_throttle: p = max(0, (requests - K accepts) / (requests + 1))", "[admission_throttle]") {
  throttle t = ten_seconds();
  CHECK(t.rejection_probability(t0) == 0);
  record(t, outcome::success, 30, t0);
  record(t, outcome::congestion, 70, t0);
  CHECK(t.requests(t0) == 100);
  CHECK(t.accepts(t0) == 30);
  CHECK(t.rejection_probability(t0) == 40.0 / 101);

  SECTION("a draw below p is refused and counts as a request; at p it is admitted and counts nothing yet") {
    CHECK_FALSE(t.try_admit(t0, std::nextafter(40.0 / 101, 0.0)));
    CHECK(t.requests(t0) == 101);
    CHECK(t.rejection_probability(t0) == 41.0 / 102);
    CHECK(t.try_admit(t0, 41.0 / 102));
    CHECK(t.requests(t0) == 101);
  }
  SECTION("K = 3 tolerates more refusals") {
    throttle k3 = ten_seconds(3.0);
    record(k3, outcome::success, 30, t0);
    record(k3, outcome::congestion, 70, t0);
    CHECK(k3.rejection_probability(t0) == 10.0 / 101);
  }
  SECTION("max_rejection caps p") {
    throttle capped = ten_seconds(2.0, 0.8);
    record(capped, outcome::congestion, 100, t0);
    CHECK(capped.rejection_probability(t0) == 0.8);
    CHECK_FALSE(capped.try_admit(t0, 0.7999));
    CHECK(capped.try_admit(t0, 0.8));
  }
}

TEST_CASE("admission_throttle: nothing is refused while the backend accepts 1 / K or more", "[admission_throttle]") {
  throttle t = ten_seconds();
  record(t, outcome::success, 50, t0);
  record(t, outcome::congestion, 50, t0);
  CHECK(t.rejection_probability(t0) == 0);
  CHECK(t.try_admit(t0, 0.0));
  // `ignored` (a 404, a 500: served, not refused for load) is an accept; one more refusal tips the balance.
  record(t, outcome::ignored, 1, t0);
  record(t, outcome::congestion, 3, t0);
  CHECK(t.requests(t0) == 104);
  CHECK(t.accepts(t0) == 51);
  CHECK(t.rejection_probability(t0) == 2.0 / 105);
}

TEST_CASE("admission_throttle: counts leave the window slice by slice", "[admission_throttle]") {
  throttle t = ten_seconds();
  record(t, outcome::success, 10, t0);
  record(t, outcome::congestion, 30, t0 + 5s);
  CHECK(t.rejection_probability(t0 + 10s - 1ns) == 20.0 / 41);
  CHECK(t.rejection_probability(t0 + 10s) == 30.0 / 31);  // slice [t0, t0 + 1 s) has left
  CHECK(t.rejection_probability(t0 + 15s - 1ns) == 30.0 / 31);
  CHECK(t.rejection_probability(t0 + 15s) == 0);
  CHECK(t.requests(t0 + 15s) == 0);

  SECTION("a time earlier than the latest counts as the latest") {
    record(t, outcome::congestion, 1, t0 + 15s);
    record(t, outcome::congestion, 1, t0);
    CHECK(t.requests(t0) == 2);
    CHECK(t.requests(t0 + 15s) == 2);
  }
}

TEST_CASE("admission_throttle: bad options and draws are refused, naming field and value", "[admission_throttle]") {
  CHECK_THROWS_WITH(throttle({.window = 0s}),
                    "rein::algo::admission_throttle: window must be a positive multiple of 10 clock ticks, got 0 ns");
  CHECK_THROWS_WITH(throttle({.window = 15ns}),
                    "rein::algo::admission_throttle: window must be a positive multiple of 10 clock ticks, got 15 ns");
  CHECK_THROWS_WITH(throttle({.multiplier = 0.5}),
                    "rein::algo::admission_throttle: multiplier must be in [1, 1000], got 0.5");
  CHECK_THROWS_AS(throttle({.multiplier = std::numeric_limits<double>::quiet_NaN()}), std::invalid_argument);
  CHECK_THROWS_WITH(throttle({.max_rejection = 1.5}),
                    "rein::algo::admission_throttle: max_rejection must be in [0, 1], got 1.5");
  throttle t = ten_seconds();
  // A draw outside [0, 1] (NaN included) throws and counts nothing, as every draw rein takes.
  CHECK_THROWS_WITH((void)t.try_admit(t0, 1.5), "rein::algo::admission_throttle: draw must be in [0, 1], got 1.5");
  CHECK_THROWS_WITH((void)t.try_admit(t0, -0.5), "rein::algo::admission_throttle: draw must be in [0, 1], got -0.5");
  CHECK_THROWS_WITH((void)t.try_admit(t0, std::numeric_limits<double>::quiet_NaN()),
                    "rein::algo::admission_throttle: draw must be in [0, 1], got nan");
  CHECK(t.requests(t0) == 0);
  // 1 is in range, and above any p: after 100 congestions p = 100 / 101, which 1 passes.
  record(t, outcome::congestion, 100, t0);
  CHECK_FALSE(t.try_admit(t0, std::nextafter(100.0 / 101, 0.0)));
  CHECK(t.try_admit(t0, 1.0));
  CHECK(t.requests(t0) == 101);
}

TEST_CASE("admission_throttle: against an upstream that accepts 20 a second, the client refuses the rule's share",
          "[admission_throttle]") {
  // 100 calls a second (one each 10 ms) into an upstream that accepts the first 20 of each second and refuses
  // the rest. In the steady state a window of 10 s holds 1,000 requests and 200 accepts, so the rule refuses
  // p = (1000 - 2 x 200) / 1001 of the calls locally and sends about K x 20 = 40 a second.
  throttle t = ten_seconds();
  rein::algo::fixed_window upstream({.limit = 20, .window = 1s}, t0);
  std::uint64_t random = 42;
  const double expected = (1000.0 - 2 * 200) / 1001;
  std::int64_t asked = 0, refused = 0, sent = 0, accepted = 0;
  for (int i = 0; i < 120 * 100; ++i) {
    const time_point now = t0 + i * 10ms;
    const bool counting = now >= t0 + 60s;  // the last minute
    asked += counting;
    if (!t.try_admit(now, draw(random))) {
      refused += counting;
      continue;
    }
    const bool ok = upstream.try_take(1, now) == rein::algo::take_result::allowed;
    t.record(ok ? outcome::success : outcome::congestion, now);
    sent += counting;
    accepted += counting && ok;
  }
  const double share = static_cast<double>(refused) / static_cast<double>(asked);
  INFO("refused " << refused << " of " << asked << ", sent " << sent << ", accepted " << accepted);
  CHECK(asked == 6000);
  CHECK(accepted == std::int64_t{60} * 20);
  CHECK(std::fabs(share - expected) < 0.02);
  CHECK(std::fabs(static_cast<double>(sent) / 60 - 40) < 2);
  CHECK(std::fabs(t.rejection_probability(t0 + 120s) - expected) < 0.03);
}
