// One rule for every pause rein takes: a wait of zero or less is already over and pauses nothing; only an
// absent one (none given, or a Retry-After field that does not parse) takes the default pause. The same in
// quota_gate::pause_for and on_retry_after, throttle_guard::reject, adaptive_rate_limiter::record and
// attempt::retryable.
#include "support/asio.hpp"
#include "support/catch.hpp"
#include "support/manual_time.hpp"

#include <rein/adaptive_rate_limiter.hpp>
#include <rein/quota_gate.hpp>
#include <rein/retry.hpp>
#include <rein/throttle.hpp>

#include <chrono>
#include <optional>
#include <string_view>

namespace {

using namespace std::chrono_literals;
namespace net = rein::net;
using rein_test::manual_clock;
using time_point = manual_clock::time_point;
using duration = manual_clock::duration;
using executor = net::any_io_executor;
using gate_type = rein::basic_quota_gate<executor, manual_clock>;
using rate_type = rein::basic_adaptive_rate_limiter<executor, manual_clock>;
using rein::outcome;

const time_point never_paused = time_point::min();

}  // namespace

TEST_CASE("pause rule: a quota gate pauses for no wait of zero or less", "[pause_rule]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  gate_type gate(io, {.jitter = 0});
  CHECK(gate.pause_for(-1s) == never_paused);
  CHECK(gate.pause_for(0s) == never_paused);
  CHECK(gate.pause_for(duration::min()) == never_paused);
  CHECK(gate.on_retry_after("0", 5s) == never_paused);  // the upstream says "go ahead"
  CHECK(gate.on_retry_after("Thu, 01 Jan 1970 00:00:00 GMT", 5s, std::chrono::system_clock::time_point(1h)) ==
        never_paused);  // a date already past
  CHECK(gate.snapshot().pause_requests == 0);
  // Absent: a field that does not parse, "-5" included (delta-seconds has no sign), takes the default.
  CHECK(gate.on_retry_after("-5", 2s) == time_point(2s));
  CHECK(gate.on_retry_after("soon", 3s) == time_point(3s));
}

TEST_CASE("pause rule: guard.reject with a wait of zero or less pauses nothing, and is congestion", "[pause_rule]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  gate_type gate(io, {.jitter = 0});
  rate_type rate(io, {.initial_rate = 10, .burst = 10});
  rein::throttle t(gate, rate);  // default_pause: 1 s

  auto first = t.try_acquire("host");
  REQUIRE(first);
  first.reject(std::optional<duration>(-1s));
  CHECK(gate.paused_until() == never_paused);
  // The congestion reached the rate, as a cut with no pause: beta (0.7), not slow start's 1/2 after a pause.
  CHECK(rate.rate() == 0.7 * 10);
  CHECK(rate.snapshot().decreases == 1);

  manual_clock::advance(10ms);
  auto second = t.try_acquire("host");
  REQUIRE(second);
  second.reject(std::optional<duration>(0s));
  CHECK(gate.paused_until() == never_paused);
  CHECK(t.snapshot().rejections_reported == 2);

  // Absent: the default pause, from the duration overload and from a field that does not parse.
  auto third = t.try_acquire("host");
  REQUIRE(third);
  third.reject();
  CHECK(gate.paused_until() == time_point(10ms + 1s));
  manual_clock::advance(2s);
  auto fourth = t.try_acquire("host");
  REQUIRE(fourth);
  fourth.reject(std::string_view("-5"));
  CHECK(gate.paused_until() == time_point(2010ms + 1s));
}

TEST_CASE("pause rule: an adaptive rate and a retry read a wait below zero as none", "[pause_rule]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  // Congestion with a negative pause cuts as congestion without one (beta, 0.7); with a pause, slow start
  // cuts by 1/2.
  rate_type negative(io, {.initial_rate = 10, .burst = 10});
  negative.record(outcome::congestion, manual_clock::now(), -1s);
  CHECK(negative.rate() == 0.7 * 10);
  rate_type paused(io, {.initial_rate = 10, .burst = 10});
  paused.record(outcome::congestion, manual_clock::now(), 1s);
  CHECK(paused.rate() == 5.0);
  // A retry's attempt carries no Retry-After for a negative one: the delay has no floor.
  CHECK(rein::attempt<int>::retryable(net::error::try_again, -1s).retry_after() == std::nullopt);
  CHECK(rein::attempt<int>::retryable(net::error::try_again, 0s).retry_after() == std::optional<std::chrono::nanoseconds>(0s));
}
