// rein::admission_throttle (the I/O object): seeded decisions, outcomes as feedback, the snapshot, events with
// reason admission, error messages naming the throttle, and convergence against an upstream that accepts a
// fixed count per second, on the manual clock.
#include "support/catch.hpp"
#include "support/manual_time.hpp"

#include <rein/admission_throttle.hpp>
#include <rein/algo/fixed_window.hpp>
#include <rein/null_mutex.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace {

using namespace std::chrono_literals;
using rein::outcome;
using rein_test::manual_clock;
using throttle = rein::basic_admission_throttle<manual_clock>;

}  // namespace

TEST_CASE("admission_throttle: refuses the rule's share, reports each refusal", "[admission_throttle]") {
  rein_test::manual_clock_at_epoch epoch;
  std::vector<rein::limiter_event> events;
  throttle t({.window = 10s, .seed = 7, .name = "search", .observer = [&](const rein::limiter_event& e) {
                events.push_back(e);
              }});
  CHECK(t.try_acquire());  // nothing counted yet: p = 0
  t.record(outcome::congestion);
  for (int i = 0; i < 9; ++i) t.record(outcome::congestion);
  // 10 requests, 0 accepts: p = 10 / 11.
  CHECK(t.rejection_probability() == 10.0 / 11);
  int refused = 0;
  for (int i = 0; i < 1000; ++i) {
    const rein::try_result r = t.try_acquire();
    if (r) {
      t.record(outcome::congestion);
    } else {
      CHECK(r.status() == rein::try_status::unavailable);
      ++refused;
    }
  }
  const rein::admission_throttle_snapshot s = t.snapshot();
  CHECK(s.rejected_total == static_cast<std::uint64_t>(refused));
  CHECK(s.acquired_total == static_cast<std::uint64_t>(1 + 1000 - refused));
  CHECK(s.requests == 1010);
  CHECK(s.accepts == 0);
  CHECK(s.rejection_probability == 1010.0 / 1011);
  // With nothing accepted, p climbs from 10/11 towards 1: few are sent.
  CHECK(refused > 950);
  REQUIRE(events.size() == static_cast<std::size_t>(refused));
  CHECK(events.front().kind == rein::event_kind::rejected);
  CHECK(events.front().reason == rein::reject_reason::admission);
  CHECK(events.front().name == "search");
  CHECK(rein::to_string(rein::reject_reason::admission) == "admission");

  SECTION("the same seed replays the same decisions") {
    auto run = [] {
      manual_clock::reset();
      rein::basic_admission_throttle<manual_clock, rein::null_mutex> u({.window = 10s, .seed = 99});
      for (int i = 0; i < 20; ++i) u.record(outcome::congestion);
      std::vector<bool> decisions;
      decisions.reserve(64);
      for (int i = 0; i < 64; ++i) decisions.push_back(static_cast<bool>(u.try_acquire()));
      return decisions;
    };
    CHECK(run() == run());
  }
  SECTION("the counts leave with the window") {
    manual_clock::advance(10s);
    CHECK(t.snapshot().requests == 0);
    CHECK(t.rejection_probability() == 0);
    CHECK(t.try_acquire());
  }
}

TEST_CASE("admission_throttle: converges on an upstream that accepts 20 a second", "[admission_throttle]") {
  rein_test::manual_clock_at_epoch epoch;
  throttle t({.window = 10s, .seed = 3});
  rein::algo::basic_fixed_window<manual_clock> upstream({.limit = 20, .window = 1s}, manual_clock::now());
  std::int64_t sent = 0;
  std::uint64_t refused_before = 0;
  for (int i = 0; i < 120 * 100; ++i) {  // 100 calls a second for 2 minutes
    if (i == 60 * 100) refused_before = t.snapshot().rejected_total;
    if (t.try_acquire()) {
      const bool ok = upstream.try_take(1, manual_clock::now()) == rein::algo::take_result::allowed;
      t.record(ok ? outcome::success : outcome::congestion);
      sent += i >= 60 * 100;
    }
    manual_clock::advance(10ms);
  }
  // The rule's steady state over a 10 s window: p = (1000 - 2 x 200) / 1001; about K x 20 = 40 sent a second.
  const double share = static_cast<double>(t.snapshot().rejected_total - refused_before) / 6000;
  INFO("refused share " << share << ", sent " << sent << " in the last minute");
  CHECK(std::fabs(share - 600.0 / 1001) < 0.02);
  CHECK(std::fabs(static_cast<double>(sent) / 60 - 40) < 2);
}

TEST_CASE("admission_throttle: a bad option names the throttle, the field and the value", "[admission_throttle]") {
  CHECK_THROWS_WITH(throttle({.multiplier = 0.5, .name = "search"}),
                    "rein::admission_throttle \"search\": multiplier must be in [1, 1000], got 0.5");
  CHECK_THROWS_WITH(throttle({.window = 0s}),
                    "rein::admission_throttle: window must be a positive multiple of 10 clock ticks, got 0 ns");
}

TEST_CASE("admission_throttle: a snapshot prints as one line", "[admission_throttle]") {
  std::ostringstream out;
  out << rein::admission_throttle_snapshot{100, 30, 40.0 / 101, 12, 5};
  CHECK(out.str() == "requests=100 accepts=30 rejection_probability=0.396 acquired=12 rejected=5 (admission=5)");
  std::ostringstream none;
  none << rein::admission_throttle_snapshot{};
  CHECK(none.str() == "requests=0 accepts=0 rejection_probability=0 acquired=0 rejected=0");
}

// The header's example, run against a backend that answers every call 429: with no accepts a call is refused
// locally with p = requests / (requests + 1), and local refusals count as requests too, so after three 429s
// (p = 3/4, then 4/5, ...) the seeded draws send none of the other 97.
TEST_CASE("admission_throttle: the header's example sends less and less to a backend that refuses all") {
  const std::uint64_t replica_id = 3;
  int sent = 0;
  const auto fail_fast = [] { return -1; };
  const auto send = [&](int status) {
    ++sent;
    return status;
  };
  rein::admission_throttle admit({.seed = replica_id, .name = "search"});
  const auto call = [&](int request) {
    if (!admit.try_acquire()) return fail_fast();
    const int status = send(request);
    admit.record(rein::classify_http_status(status));
    return status;
  };
  int refused_locally = 0;
  for (int i = 0; i < 100; ++i) refused_locally += call(429) == -1 ? 1 : 0;
  CHECK(sent + refused_locally == 100);
  CHECK(sent == 3);
}
