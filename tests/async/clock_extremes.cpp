// Any clock reading, time_point::min() and max() included, reaching a limiter's try_acquire_at or record
// (or read from its own clock) gives defined, exact results: readings are clamped to the latest one seen,
// distances between readings saturate at the range of nanoseconds. The sanitizer presets run this file, so
// an overflow on the way fails it.
#include "support/catch.hpp"
#include "support/manual_time.hpp"

#include <rein/adaptive_rate_limiter.hpp>
#include <rein/algo/sliding_window_counter.hpp>
#include <rein/fixed_window.hpp>
#include <rein/quota_gate.hpp>
#include <rein/rate_limiter.hpp>
#include <rein/sliding_window.hpp>
#include <rein/token_bucket.hpp>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
namespace net = rein::net;
using rein_test::manual_clock;
using time_point = manual_clock::time_point;
using ns = std::chrono::nanoseconds;
using executor = net::any_io_executor;
using rein::outcome;
using rein::try_status;

// The same steps for every rate limiter of limit 2 (a burst of 2, or 2 per window), made while its clock
// reads time_point::min(): the limit is spent at min(), the next unit is `wait` away, then a reading of
// max() finds the limit whole again, and a reading of min() after that counts as max(): the limit is spent
// there, and the wait counted from min() does not fit in nanoseconds.
template <class Limiter>
void spend_from_min_to_max(Limiter& l, ns wait) {
  CHECK(l.try_acquire_at(2, time_point::min()));
  const rein::try_result busy = l.try_acquire_at(1, time_point::min());
  CHECK(busy.status() == try_status::busy);
  CHECK(busy.retry_after() == std::optional<ns>(wait));
  CHECK(l.try_acquire_at(2, time_point::max()));
  const rein::try_result spent = l.try_acquire_at(1, time_point::min());
  CHECK(spent.status() == try_status::busy);
  CHECK(spent.retry_after() == std::optional<ns>(ns::max()));
}

}  // namespace

TEST_CASE("clock extremes: a token bucket from time_point::min() to max()", "[clock_extremes]") {
  net::io_context io;
  manual_clock::set(time_point::min());
  rein::basic_token_bucket<executor, manual_clock> bucket(io, {.rate = 10, .capacity = 2});
  spend_from_min_to_max(bucket, 100ms);
  // Feedback at both ends: a refusal of a send from min() widens the margin (nothing was refused before).
  bucket.refused(time_point::min());
  bucket.record(outcome::success, time_point::max());
  manual_clock::set(time_point::max());
  bucket.record(outcome::success, time_point::min());
  CHECK(bucket.margin() == 0.0);  // a margin learned at min() is forgotten by max()
  CHECK(bucket.rate() == 10.0);
}

TEST_CASE("clock extremes: windows from time_point::min() to max()", "[clock_extremes]") {
  net::io_context io;
  manual_clock::set(time_point::min());
  rein::basic_sliding_window<executor, manual_clock> sliding(io, {.limit = 2, .window = 1s});
  spend_from_min_to_max(sliding, 1s);

  // Fixed windows start at whole seconds since the epoch: the one holding min() began before min(), and
  // the next one starts at -9223372036 s, 854775808 ns after min().
  manual_clock::set(time_point::min());
  rein::basic_fixed_window<executor, manual_clock> fixed(io, {.limit = 2, .window = 1s});
  spend_from_min_to_max(fixed, ns(-9'223'372'036'000'000'000) - time_point::min().time_since_epoch());

  manual_clock::set(time_point::min());
  using counter = rein::algo::basic_sliding_window_counter<manual_clock>;
  rein::basic_rate_limiter<counter, executor> estimated(io, counter({.limit = 2, .window = 1s}, time_point::min()));
  spend_from_min_to_max(estimated, 1500ms);  // the 2 weigh 1 when half the next window has passed
}

TEST_CASE("clock extremes: an adaptive rate limiter from time_point::min() to max()", "[clock_extremes]") {
  net::io_context io;
  manual_clock::set(time_point::min());
  rein::basic_adaptive_rate_limiter<executor, manual_clock> limiter(io, {.initial_rate = 10, .burst = 2});
  // Congestion from a send at min() seen at min(), with a pause to the end of time: the cut (half, in slow
  // start with a pause) starts the curve at max(), and a success seen at min() raises nothing.
  limiter.record(outcome::congestion, time_point::min(), ns::max());
  limiter.record(outcome::success, time_point::min());
  CHECK(limiter.rate() == 5.0);
  spend_from_min_to_max(limiter, 200ms);
  // Seen at max(): congestion from a send before the curve's start is stale.
  manual_clock::set(time_point::max());
  limiter.record(outcome::congestion, time_point::min());
  const auto s = limiter.snapshot();
  CHECK(s.rate == 5.0);
  CHECK(s.decreases == 1);
  CHECK(s.stale_congestion == 1);
  CHECK(s.service.count() == 3);
  CHECK(s.service.max() == ns::max());  // from min() to max(): saturated
}

TEST_CASE("clock extremes: a quota gate from time_point::min() to max()", "[clock_extremes]") {
  net::io_context io;
  manual_clock::set(time_point::min());
  std::vector<std::string> pauses_seen;
  const auto seen = [&](const rein::limiter_event& e) {
    if (e.kind == rein::event_kind::pause_started) pauses_seen.push_back("pause_started " + std::to_string(e.pause.count()));
    if (e.kind == rein::event_kind::pause_ended) pauses_seen.push_back("pause_ended " + std::to_string(e.pause.count()));
  };
  rein::basic_quota_gate<executor, manual_clock> gate(io, {.seed = 1}, {.observer = seen});
  // A pause until max() is cut to max_pause (10 minutes by default).
  CHECK(gate.pause_until(time_point::max()) == time_point::min() + 10min);
  const rein::try_result paused = gate.try_acquire_at(1, time_point::min());
  CHECK(paused.status() == try_status::busy);
  CHECK(paused.retry_after() == std::optional<ns>(10min));
  CHECK(gate.try_acquire_at(1, time_point::max()));
  // A gate takes each reading as it comes (an earlier one only ends a pause later): paused until 1 s after
  // the epoch, a reading of min() is further from the pause's end than nanoseconds count.
  manual_clock::set(time_point{});
  CHECK(gate.pause_for(1s) == time_point{} + 1s);
  const rein::try_result far = gate.try_acquire_at(1, time_point::min());
  CHECK(far.status() == try_status::busy);
  CHECK(far.retry_after() == std::optional<ns>(ns::max()));
  manual_clock::set(time_point{} + 2s);
  CHECK(gate.pause_for(0s) == time_point{} + 1s);  // seen over
  manual_clock::set(time_point::min());
  CHECK(gate.pause_for(1s) == time_point{} + 1s);  // pauses only extend; seen as ahead again, saturated
  // At max(), a pause of 1 s would end at max() itself: it pauses nothing.
  manual_clock::set(time_point::max());
  CHECK(gate.pause_for(1s) == time_point{} + 1s);
  CHECK_FALSE(gate.snapshot().paused);
  CHECK(pauses_seen == std::vector<std::string>{"pause_started 600000000000", "pause_ended 0",
                                                "pause_started 9223372036854775807", "pause_ended 0"});
}
