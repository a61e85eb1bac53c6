// rein::algo::windowed_aimd and pid, gradient (Gradient2 / Envoy) and vegas (Netflix VegasLimit); then work
// hints and learned failure rates across them and aimd.
#include <rein/algo/aimd.hpp>
#include <rein/algo/gradient.hpp>
#include <rein/algo/pid.hpp>
#include <rein/algo/vegas.hpp>
#include <rein/algo/windowed_aimd.hpp>

#include "support/catch.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
using rein::outcome;
using rein::algo::sample;

namespace {

// Each sample ends 10 s after the previous one, so it started after every earlier decrease (none is stale).
sample::time_point next_end() {
  static sample::time_point t{};
  t += 10s;
  return t;
}
sample ok(std::chrono::nanoseconds latency = 5ms, std::size_t in_flight = 64) {
  return sample{latency, outcome::success, in_flight, next_end()};
}
sample congestion(std::chrono::nanoseconds latency = 5ms, std::size_t in_flight = 64) {
  return sample{latency, outcome::congestion, in_flight, next_end()};
}
sample ignored() { return sample{5ms, outcome::ignored, 64, next_end()}; }

template <class Algorithm>
std::string error_of(const typename Algorithm::options& o) {
  try {
    Algorithm a{o};
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no exception";
}

// A window of `n` samples of which the first `failures` are congestion.
template <class Algorithm>
void window(Algorithm& a, int n, int failures) {
  for (int i = 0; i < n; ++i) a.on_sample(i < failures ? congestion() : ok());
}

// windowed_aimd's defaults but every failure one of the window's (`learn_failure_rate` off): the window's
// own rule, which these cases pin down.
rein::algo::windowed_aimd windowed() {
  rein::algo::windowed_aimd_options o;
  o.learn_failure_rate = false;
  return rein::algo::windowed_aimd{o};
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// windowed_aimd
// ---------------------------------------------------------------------------------------------------------

TEST_CASE("windowed_aimd: the limit moves only at the end of a window") {
  rein::algo::windowed_aimd w = windowed();
  window(w, 19, 1);  // a failure: the window waits for its 20 samples
  REQUIRE(w.limit() == 4.0);
  REQUIRE(w.window_samples() == 19);
  w.on_sample(ok());
  REQUIRE(w.limit() == 5.0);  // + step 1
  REQUIRE(w.window_samples() == 0);
}

TEST_CASE("windowed_aimd: a round trip of calls without a failure closes the window early") {
  rein::algo::windowed_aimd w = windowed();
  window(w, 3, 0);
  REQUIRE(w.limit() == 4.0);
  w.on_sample(ok());  // 4 samples: as many as the limit admits
  REQUIRE(w.limit() == 5.0);
  REQUIRE(w.window_samples() == 0);
  window(w, 4, 0);
  REQUIRE(w.limit() == 5.0);
  w.on_sample(ok());
  REQUIRE(w.limit() == 6.0);
}

TEST_CASE("windowed_aimd: a failure rate at the threshold grows, above it cuts by the backoff at once") {
  rein::algo::windowed_aimd w = windowed();
  window(w, 20, 3);  // 15 %: at the threshold
  REQUIRE(w.limit() == 5.0);
  window(w, 4, 4);  // the 4th failure exceeds 15 % of 20: the window closes without waiting for the rest
  REQUIRE(w.limit() == Approx(4.0).margin(1e-12));
  REQUIRE(w.window_samples() == 0);
  REQUIRE(w.decreases() == 1);
  REQUIRE(w.increases() == 1);
}

TEST_CASE("windowed_aimd: a slow success closes the window at once and cuts; failures have the threshold") {
  rein::algo::windowed_aimd w = windowed();  // latency_tolerance 1.75, noise_floor 0.5 ms (below 1.75 x 5 ms)
  for (int i = 0; i < 3; ++i) w.on_sample(congestion());  // 15 % of the window failed: grows
  for (int i = 0; i < 17; ++i) w.on_sample(ok(5ms));
  REQUIRE(w.limit() == 5.0);
  w.on_sample(congestion());
  for (int i = 0; i < 18; ++i) w.on_sample(ok(8750us));  // exactly 1.75 x the fastest: not slow
  REQUIRE(w.window_samples() == 19);
  w.on_sample(ok(5ms));
  REQUIRE(w.limit() == 6.0);
  for (int i = 0; i < 5; ++i) w.on_sample(ok(5ms));
  w.on_sample(ok(8751us));  // one slow success: the window closes after 6 samples and cuts
  REQUIRE(w.window_samples() == 0);
  REQUIRE(w.limit() == Approx(4.8).margin(1e-12));
  REQUIRE(w.decreases() == 1);
}

TEST_CASE("windowed_aimd: slow calls cut to the level their queue shows, by half at most") {
  rein::algo::windowed_aimd_options o;
  o.initial_limit = 20;
  rein::algo::windowed_aimd w{o};
  for (int i = 0; i < 10; ++i) w.on_sample(ok(5ms, 20));  // the fastest: 5 ms
  w.on_sample(ok(30ms, 20));  // 5 calls queued ahead of it: 20 - 5 = 15, above 20 x 0.5
  REQUIRE(w.limit() == 15.0);
  w.on_sample(ok(100ms, 15));  // 19 queued ahead: 15 - 19 < 0, so half of the limit
  REQUIRE(w.limit() == 7.5);
  w.on_sample(ok(10ms, 64));  // 1 queued ahead, n the limit: 6.5 is above 7.5 x 0.8, so the backoff
  REQUIRE(w.limit() == Approx(6.0).margin(1e-12));
  w.on_sample(ok(10ms, 4));  // 1 queued ahead of a call granted with 4 out: 3, below 6 x 0.8
  REQUIRE(w.limit() == 3.0);
}

TEST_CASE("windowed_aimd: growth stops at the level a cut found, and waits longer there each time") {
  rein::algo::windowed_aimd_options o;
  o.initial_limit = 10;
  rein::algo::windowed_aimd w{o};
  w.on_sample(ok(5ms, 10));
  w.on_sample(ok(10ms, 10));  // 1 queued ahead: the level is 9; the cut, 10 x 0.8
  REQUIRE(w.limit() == 8.0);
  window(w, 8, 0);  // a clean round trip: + step, up to the level
  REQUIRE(w.limit() == 9.0);
  window(w, 9, 0);  // a new level: no wait
  REQUIRE(w.limit() == 10.0);
  for (int wait = 1; wait <= 3; wait += 2) {  // the level found again once, then twice: wait 1, then 3
    w.on_sample(ok(10ms, 10));
    REQUIRE(w.limit() == 8.0);
    window(w, 8, 0);
    REQUIRE(w.limit() == 9.0);
    window(w, 9 * wait, 0);  // healthy windows at the level
    REQUIRE(w.limit() == 9.0);
    window(w, 9, 0);
    REQUIRE(w.limit() == 10.0);
  }
  o.plateau_windows = 0;  // no wait
  w.set_options(o);
  w.on_sample(ok(10ms, 10));
  window(w, 8, 0);
  window(w, 9, 0);
  REQUIRE(w.limit() == 10.0);
}

TEST_CASE("windowed_aimd: slow start adds a call per success within the growth guard, until a slow one") {
  rein::algo::windowed_aimd_options o;
  o.slow_start = true;
  rein::algo::windowed_aimd w{o};
  REQUIRE(w.in_slow_start());
  w.on_sample(ok(5ms, 4));
  REQUIRE(w.limit() == 5.0);  // within max(4 + 1, 4 / 0.85)
  w.on_sample(ok(5ms, 5));
  w.on_sample(ok(5ms, 6));
  REQUIRE(w.limit() == 7.0);
  w.on_sample(ok(5ms, 7));
  REQUIRE(w.limit() == 8.0);
  w.on_sample(ok(5ms, 2));  // granted with 2 out: tested only up to 3
  REQUIRE(w.limit() == 8.0);
  REQUIRE(w.in_slow_start());
  w.on_sample(ok(10ms, 8));  // slow: slow start ends, and the window cuts by the backoff (its level, 7, is above)
  REQUIRE_FALSE(w.in_slow_start());
  REQUIRE(w.limit() == Approx(6.4).margin(1e-12));
  o.slow_start = true;
  w.set_options(o);
  REQUIRE_FALSE(w.in_slow_start());  // not restarted
  rein::algo::windowed_aimd off{};  // the default: windows alone
  REQUIRE_FALSE(off.in_slow_start());
  off.on_sample(ok(5ms, 4));
  REQUIRE(off.limit() == 4.0);
}

TEST_CASE("windowed_aimd: the noise floor keeps a success within fastest + floor from being slow") {
  rein::algo::windowed_aimd_options o;
  o.learn_failure_rate = false;
  o.noise_floor = 10ms;
  rein::algo::windowed_aimd w{o};
  w.on_sample(congestion());
  for (int i = 0; i < 18; ++i) w.on_sample(ok(5ms));
  w.on_sample(ok(15ms));  // max(1.75 x 5, 5 + 10) = 15 ms: not slow
  REQUIRE(w.limit() == 5.0);
  w.on_sample(ok(15001us));  // slow: the window closes and cuts, to 5 - floor(15.001 / 5 - 1) = 3
  REQUIRE(w.limit() == 3.0);
}

TEST_CASE("windowed_aimd: without a latency tolerance only failed calls count (the textbook rule)") {
  rein::algo::windowed_aimd_options o;
  o.latency_tolerance.reset();
  rein::algo::windowed_aimd w{o};
  for (int i = 0; i < 2; ++i) w.on_sample(ok(5ms));
  for (int i = 0; i < 2; ++i) w.on_sample(ok(50ms));
  REQUIRE(w.limit() == 5.0);  // a round trip without a failure
}

TEST_CASE("windowed_aimd: calls that started before the latest decrease are not counted") {
  rein::algo::windowed_aimd w = windowed();
  window(w, 4, 4);
  REQUIRE(w.limit() == Approx(3.2).margin(1e-12));
  const auto later = next_end();  // 10 s after the cut: a call of more than 10 s started before it
  w.on_sample(sample{10s + 1ns, outcome::congestion, 4, later});
  w.on_sample(sample{10s + 1ns, outcome::success, 4, later});
  REQUIRE(w.window_samples() == 0);
  w.on_sample(sample{10s, outcome::congestion, 4, later});  // started with the cut
  REQUIRE(w.window_samples() == 1);
  REQUIRE(w.window_failures() == 1);
}

TEST_CASE("windowed_aimd: calls that started before the latest rise are not counted either") {
  rein::algo::windowed_aimd w = windowed();
  window(w, 4, 0);
  REQUIRE(w.limit() == 5.0);
  const auto later = next_end();  // 10 s after the rise: a call of more than 10 s was granted below it
  for (int i = 0; i < 20; ++i) w.on_sample(sample{10s + 1ns, outcome::success, 64, later});
  REQUIRE(w.window_samples() == 0);
  REQUIRE(w.limit() == 5.0);
  w.on_sample(sample{5ms, outcome::success, 64, later});  // granted after the rise
  REQUIRE(w.window_samples() == 1);
}

TEST_CASE("windowed_aimd: ignored samples are not counted; slow successes count as failures with a target") {
  rein::algo::windowed_aimd_options o;
  o.latency_target = 20ms;
  o.latency_tolerance.reset();
  rein::algo::windowed_aimd w{o};
  for (int i = 0; i < 50; ++i) w.on_sample(ignored());
  REQUIRE(w.window_samples() == 0);
  for (int i = 0; i < 3; ++i) w.on_sample(ok());
  REQUIRE(w.limit() == 4.0);
  w.on_sample(ok(21ms));  // slower than the target: slow, the window closes and cuts
  REQUIRE(w.limit() == 2.0);  // 3 calls queued ahead of it (21 / 5 - 1): 4 - 3 = 1, so half the limit
}

TEST_CASE("windowed_aimd: floor and ceiling hold") {
  rein::algo::windowed_aimd_options o;
  o.min_limit = 2;
  o.initial_limit = 3;
  o.max_limit = 5;
  rein::algo::windowed_aimd w{o};
  window(w, 20, 20);  // five windows of 4 failures: 3 x 0.8^5 is below the floor
  REQUIRE(w.limit() == 2.0);
  window(w, 20, 0);
  window(w, 20, 0);
  window(w, 20, 0);
  REQUIRE(w.limit() == 5.0);
}

TEST_CASE("windowed_aimd: invalid options name the type, field and value") {
  using W = rein::algo::windowed_aimd;
  rein::algo::windowed_aimd_options o;
  o.failure_threshold = 1;
  REQUIRE(error_of<W>(o) == "rein::algo::windowed_aimd: failure_threshold must be in [0, 1), got 1");
  o = {};
  o.window = 0;
  REQUIRE(error_of<W>(o) == "rein::algo::windowed_aimd: window must be >= 1, got 0");
  o = {};
  o.step = 0;
  REQUIRE(error_of<W>(o) == "rein::algo::windowed_aimd: step must be > 0 and finite, got 0");
  o = {};
  o.backoff = -0.5;
  REQUIRE(error_of<W>(o) == "rein::algo::windowed_aimd: backoff must be in (0, 1), got -0.5");
  o = {};
  o.latency_tolerance = 1.0;
  REQUIRE(error_of<W>(o) == "rein::algo::windowed_aimd: latency_tolerance must be > 1 and finite, got 1");
  o = {};
  o.noise_floor = -1ns;
  REQUIRE(error_of<W>(o) == "rein::algo::windowed_aimd: noise_floor must be >= 0, got -1 ns");
  o = {};
  o.plateau_windows = -1;
  REQUIRE(error_of<W>(o) == "rein::algo::windowed_aimd: plateau_windows must be >= 0 and finite, got -1");
}

// ---------------------------------------------------------------------------------------------------------
// pid
// ---------------------------------------------------------------------------------------------------------

namespace {

// The controller alone, from the first window (no slow start).
rein::algo::pid_options controller() {
  rein::algo::pid_options o;
  o.slow_start = false;
  o.learn_failure_rate = false;  // every failure is one of the window's: the rule these cases pin down
  return o;
}

}  // namespace

TEST_CASE("pid: healthy windows raise the limit through P, I and D around the initial limit") {
  rein::algo::pid p{controller()};  // kp 20, ki 20, kd 5, target 5 %, window 20, from 4
  window(p, 20, 0);
  // error 0.05: 4 + 20 x 0.05 + 20 x 0.05 + 5 x (0.05 - 0)
  REQUIRE(p.limit() == Approx(6.25).margin(1e-12));
  window(p, 20, 0);
  // error 0.05 again: integral 0.1, derivative 0
  REQUIRE(p.limit() == Approx(7.0).margin(1e-12));
  REQUIRE(p.integral() == Approx(0.1).margin(1e-15));
}

TEST_CASE("pid: slow start adds a call per success within the guard, then hands over without a bump") {
  rein::algo::pid p{};
  REQUIRE(p.in_slow_start());
  p.on_sample(ok(5ms, 3));  // the guard: max(3 + 1, 3 / 0.85) = 4
  REQUIRE(p.limit() == 4.0);
  p.on_sample(ok(5ms, 4));
  p.on_sample(ok(5ms, 5));  // max(6, 5.88)
  REQUIRE(p.limit() == 6.0);
  p.on_sample(ok(5ms, 64));
  REQUIRE(p.limit() == 7.0);
  REQUIRE(p.integral() == 0.0);
  p.on_sample(ok(10ms, 6));  // slow (> 1.75 x 5 ms), granted with 6 out: 0.8 x 6
  REQUIRE_FALSE(p.in_slow_start());
  REQUIRE(p.limit() == Approx(4.8).margin(1e-12));
  REQUIRE(p.decreases() == 1);
  // The integral takes the limit: a healthy window outputs it plus one integral step (ki x target).
  REQUIRE(p.integral() == Approx((4.8 - 4 - 1) / 20).margin(1e-15));
  window(p, 20, 0);
  REQUIRE(p.limit() == Approx(5.8).margin(1e-12));  // no derivative in the window after a decrease
  rein::algo::pid q{};
  q.set_options(controller());  // false ends slow start
  REQUIRE_FALSE(q.in_slow_start());
}

TEST_CASE("pid: a window pinned at the guard moves the integral as far as the guard's ceiling") {
  rein::algo::pid p{};
  for (int i = 0; i < 8; ++i) p.on_sample(ok(5ms, 64));
  REQUIRE(p.limit() == 12.0);
  p.on_sample(ok(10ms, 12));  // ends slow start at 0.8 x 12, integral (9.6 - 5) / 20
  REQUIRE(p.limit() == Approx(9.6).margin(1e-12));
  // 9 calls out (the limit admits 9): output 4 + 1 + 20 x 0.28 = 10.6, above the guard's 9 / 0.85. Without
  // this window's integration the output is 9.6, so keeping the integral where it was froze the limit.
  for (int i = 0; i < 20; ++i) p.on_sample(ok(5ms, 9));
  REQUIRE(p.limit() == 9.0 / 0.85);
  REQUIRE(p.integral() == Approx(0.23 + (9.0 / 0.85 - 9.6) / 20).margin(1e-12));
}

TEST_CASE("pid: a window pinned at the floor does not wind the integral down") {
  rein::algo::pid_options o = controller();
  o.min_limit = 4;  // the floor is the initial limit
  rein::algo::pid p{o};
  window(p, 20, 20);  // error -0.95: 4 - 19 - 19 - 4.75 is far below the floor
  REQUIRE(p.limit() == 4.0);
  REQUIRE(p.integral() == Approx(-0.05).margin(1e-15));  // where a healthy window outputs 4 + 1
  window(p, 20, 20);
  window(p, 20, 20);
  REQUIRE(p.integral() == Approx(-0.05).margin(1e-15));
  window(p, 20, 0);  // error 0.05, no derivative after a decrease, integral 0: 4 + 1
  REQUIRE(p.limit() == Approx(5.0).margin(1e-12));
}

TEST_CASE("pid: the integral is clamped to +-integral_limit") {
  rein::algo::pid_options o = controller();
  o.integral_limit = 0.12;
  o.max_limit = 1000;
  rein::algo::pid p{o};
  for (int i = 0; i < 10; ++i) window(p, 20, 0);
  REQUIRE(p.integral() == 0.12);
  REQUIRE(p.limit() == Approx(4 + 1 + 20 * 0.12).margin(1e-12));
}

TEST_CASE("pid: slow successes count as failures against the target") {
  rein::algo::pid p{controller()};  // latency_tolerance 1.75, noise_floor 0.5 ms
  for (int i = 0; i < 19; ++i) p.on_sample(ok(5ms));
  p.on_sample(ok(8751us));  // > 1.75 x 5 ms: 5 % of the window, the target: error 0
  REQUIRE(p.limit() == 4.0);
  REQUIRE(p.integral() == 0.0);
}

TEST_CASE("pid: a slow success joins the baseline only when granted at the floor") {
  rein::algo::pid_options o = controller();
  o.window = 10000;  // closes early at the 501st failure
  rein::algo::pid p{o};
  p.on_sample(ok(5ms, 2));
  for (int i = 0; i < 500; ++i) p.on_sample(ok(10ms, 2));  // all slow against 5 ms: the queue never the norm
  REQUIRE(p.decreases() == 0);
  p.on_sample(ok(10ms, 2));
  REQUIRE(p.decreases() == 1);

  rein::algo::pid q{o};
  q.on_sample(ok(5ms, 1));
  for (int i = 0; i < 501; ++i) q.on_sample(ok(10ms, 1));  // at the floor: 10 ms becomes the norm
  REQUIRE(q.decreases() == 0);
}

TEST_CASE("pid: the noise floor keeps a success within fastest + floor from being slow") {
  rein::algo::pid_options o = controller();
  o.noise_floor = 10ms;
  rein::algo::pid p{o};
  for (int i = 0; i < 19; ++i) p.on_sample(ok(5ms));
  p.on_sample(ok(15ms));  // max(1.75 x 5, 5 + 10) = 15 ms: not slow, error 0.05
  REQUIRE(p.limit() == Approx(6.25).margin(1e-12));

  rein::algo::pid d{controller()};  // the default floor, 0.5 ms: 200 us + 0.5 ms > 1.75 x 200 us
  for (int i = 0; i < 19; ++i) d.on_sample(ok(200us));
  d.on_sample(ok(700us));
  REQUIRE(d.limit() == Approx(6.25).margin(1e-12));
  rein::algo::pid e{controller()};
  for (int i = 0; i < 19; ++i) e.on_sample(ok(200us));
  e.on_sample(ok(701us));  // slow: error 0
  REQUIRE(e.limit() == 4.0);
}

TEST_CASE("pid: without a latency tolerance only failed calls count") {
  rein::algo::pid_options o = controller();
  o.latency_tolerance.reset();
  rein::algo::pid p{o};
  for (int i = 0; i < 19; ++i) p.on_sample(ok(5ms));
  p.on_sample(ok(50ms));
  REQUIRE(p.limit() == Approx(6.25).margin(1e-12));
}

TEST_CASE("pid: a window closes as soon as its failures exceed the target's share of a window") {
  rein::algo::pid p{controller()};
  p.on_sample(congestion());  // 1 of 20 is the target: the window goes on
  REQUIRE(p.limit() == 4.0);
  p.on_sample(congestion());  // 2 > 0.05 x 20: negative whatever follows; rate 2 / 2
  REQUIRE(p.limit() == Approx(3.2).margin(1e-12));
  REQUIRE(p.decreases() == 1);
}

TEST_CASE("pid: a window holds at least a round trip of samples") {
  rein::algo::pid_options o = controller();
  o.initial_limit = 30;
  rein::algo::pid p{o};
  window(p, 20, 0);  // the limit admits 30: 20 samples are two thirds of a round trip
  REQUIRE(p.limit() == 30.0);
  window(p, 10, 0);
  REQUIRE(p.limit() == Approx(32.25).margin(1e-12));  // 30 + 1 + 1 + 0.25
}

TEST_CASE("pid: one window cuts at most to backoff x the limit, and the integral takes the limit applied") {
  rein::algo::pid p{controller()};
  window(p, 20, 0);
  window(p, 20, 0);
  REQUIRE(p.limit() == Approx(7.0).margin(1e-12));
  window(p, 2, 2);  // error -0.95: 4 - 19 + 20 x (0.1 - 0.95) - 5 is far below 0.8 x 7
  REQUIRE(p.limit() == Approx(5.6).margin(1e-12));
  REQUIRE(p.integral() == Approx((5.6 - 4 - 1) / 20).margin(1e-12));  // a healthy window outputs 5.6 + 1
  window(p, 20, 0);
  // error 0.05, integral 0.08, no derivative in the window after a decrease (it would add 5 x 1): 4 + 1 + 1.6
  REQUIRE(p.limit() == Approx(6.6).margin(1e-12));
}

TEST_CASE("pid: a window whose slow calls show a deeper queue cuts deeper, down to backoff^2") {
  rein::algo::pid_options o = controller();
  o.initial_limit = 40;
  const auto cut = [&](std::chrono::nanoseconds first, std::chrono::nanoseconds second) {
    rein::algo::pid p{o};
    p.on_sample(ok(5ms, 40));
    p.on_sample(ok(first, 40));
    p.on_sample(ok(second, 40));
    return p.limit();
  };
  REQUIRE(cut(10ms, 10ms) == Approx(32.0).margin(1e-12));  // queued behind 1: 39 > 0.8 x 40
  REQUIRE(cut(50ms, 50ms) == Approx(31.0).margin(1e-12));  // behind 9: 31 calls were within the capacity
  REQUIRE(cut(200ms, 200ms) == Approx(25.6).margin(1e-12));  // 1, but at most 0.8 x 0.8 x 40
  REQUIRE(cut(200ms, 50ms) == Approx(31.0).margin(1e-12));   // the window's highest estimate
}

TEST_CASE("pid: a window with a queue estimate below the controller's output cuts to the estimate") {
  rein::algo::pid_options o = controller();
  o.initial_limit = 40;  // a window is 40 samples, and closes at its second failure
  const auto cut = [&](std::chrono::nanoseconds slow) {
    rein::algo::pid p{o};
    for (int i = 0; i < 18; ++i) p.on_sample(ok(5ms, 40));
    p.on_sample(ok(slow, 40));
    p.on_sample(ok(slow, 40));
    return p.limit();
  };
  // Rate 2 / 20, error -0.05: the output is 40 - 1 - 1 - 0.25.
  REQUIRE(cut(10ms) == Approx(37.75).margin(1e-12));  // queued behind 1: 39 is above the output
  REQUIRE(cut(20ms) == Approx(37.0).margin(1e-12));   // behind 3: 37
}

TEST_CASE("pid: a window pinned by the growth guard does not wind the integral up") {
  rein::algo::pid p{controller()};
  for (int i = 0; i < 20; ++i) p.on_sample(ok(5ms, 2));  // tested ceiling max(3, 2 / 0.85) = 3 < 4
  REQUIRE(p.limit() == 4.0);
  REQUIRE(p.integral() == 0.0);
  for (int i = 0; i < 20; ++i) p.on_sample(ok(5ms, 4));  // ceiling max(5, 4.7) = 5: output 4 + 1 + 1 + 0
  REQUIRE(p.limit() == 5.0);
  REQUIRE(p.integral() == 0.0);  // pinned at the guard again: the integral only as far as the bound
}

TEST_CASE("pid: calls that started before the latest decrease are not counted") {
  rein::algo::pid p{controller()};
  window(p, 20, 0);
  window(p, 2, 2);
  REQUIRE(p.decreases() == 1);
  const auto later = next_end();  // 10 s after the cut: a call of more than 10 s started before it
  for (int i = 0; i < 19; ++i) p.on_sample(sample{10s + 1ns, outcome::congestion, 64, later});
  REQUIRE(p.decreases() == 1);  // counted, the second of them would have closed a window
  p.on_sample(sample{10s, outcome::congestion, 64, later});  // started at the cut: counted
  REQUIRE(p.decreases() == 1);  // 1 failure: the target's share of a window
  p.on_sample(sample{10s, outcome::congestion, 64, later});
  REQUIRE(p.decreases() == 2);
}

TEST_CASE("pid: ignored samples are not counted") {
  rein::algo::pid p{};
  for (int i = 0; i < 100; ++i) p.on_sample(ignored());
  REQUIRE(p.limit() == 4.0);
}

TEST_CASE("pid: invalid options name the type, field and value") {
  using P = rein::algo::pid;
  rein::algo::pid_options o;
  o.kp = -1;
  REQUIRE(error_of<P>(o) == "rein::algo::pid: kp must be >= 0 and finite, got -1");
  o = {};
  o.target_failure_rate = 1.5;
  REQUIRE(error_of<P>(o) == "rein::algo::pid: target_failure_rate must be in [0, 1), got 1.5");
  o = {};
  o.integral_limit = 0;
  REQUIRE(error_of<P>(o) == "rein::algo::pid: integral_limit must be > 0 and finite, got 0");
  o = {};
  o.latency_tolerance = 0.5;
  REQUIRE(error_of<P>(o) == "rein::algo::pid: latency_tolerance must be > 1 and finite, got 0.5");
  o = {};
  o.noise_floor = -1ns;
  REQUIRE(error_of<P>(o) == "rein::algo::pid: noise_floor must be >= 0, got -1 ns");
  o = {};
  o.backoff = 1;
  REQUIRE(error_of<P>(o) == "rein::algo::pid: backoff must be in (0, 1), got 1");
}

// ---------------------------------------------------------------------------------------------------------
// gradient
// ---------------------------------------------------------------------------------------------------------

TEST_CASE("gradient: latency at the baseline grows the limit by the queue allowance, spread over a round trip") {
  rein::algo::gradient_options o;  // from 4, smoothing 0.5, tolerance 1.5, queue 1
  o.slow_start = false;
  rein::algo::gradient g{o};
  g.on_sample(ok(10ms));
  REQUIRE(g.last_gradient() == 1.0);  // 1.5 x 10 / 10, clamped to 1
  REQUIRE(g.limit() == 4.125);        // 4 + (4 + 1 - 4) x 0.5 / 4
}

TEST_CASE("gradient: the gradient is max(tolerance x baseline, baseline + noise_floor) / latency") {
  rein::algo::gradient g{};  // tolerance 1.5, noise floor 0.5 ms
  REQUIRE(g.get_options().noise_floor == 500us);
  g.on_sample(ok(200us));
  g.on_sample(ok(700us));  // 3.5 x the minimum, but within the floor: (200 + 500) / 700
  REQUIRE(g.last_gradient() == 1.0);
  g.on_sample(ok(1000us));
  REQUIRE(g.last_gradient() == 0.7);  // 700 / 1000 (1.5 x 200 = 300 would give the clamp's 0.5)
  rein::algo::gradient_options o;
  o.noise_floor = 0ns;
  rein::algo::gradient h{o};
  h.on_sample(ok(200us));
  h.on_sample(ok(500us));
  REQUIRE(h.last_gradient() == 0.6);  // 1.5 x 200 / 500
}

TEST_CASE("gradient: with tolerance unset a slow success grows as one at the baseline; congestion still falls") {
  rein::algo::gradient_options o;  // from 4, smoothing 0.5, queue 1
  o.slow_start = false;
  o.learn_failure_rate = false;
  rein::algo::gradient judged{o};
  o.tolerance.reset();
  rein::algo::gradient g{o};
  for (auto* a : {&judged, &g}) a->on_sample(ok(10ms));
  REQUIRE(g.limit() == 4.125);  // 4 + (4 + 1 - 4) x 0.5 / 4, as at the baseline
  for (auto* a : {&judged, &g}) a->on_sample(ok(100ms));
  REQUIRE(judged.limit() == 2.0625);  // 1.5 x 10 / 100 is past the clamp: 4.125 x 0.5 at once
  REQUIRE(g.last_gradient() == 1.0);
  // A quarter of a round trip doubled the pace by 2^0.25: 4.125 + (5.125 - 4.125) x 0.5 x 2^0.25 / 4.125.
  REQUIRE(g.limit() == Approx(4.125 + 0.5 * std::exp2(0.25) / 4.125).margin(1e-12));
  const double before = g.limit();
  g.on_sample(congestion());
  REQUIRE(g.limit() == Approx(before * 0.5).margin(1e-12));  // min_gradient, unsmoothed
}

TEST_CASE("gradient: with tolerance unset slow start adds a call per success, however slow") {
  rein::algo::gradient_options o;
  o.tolerance.reset();
  rein::algo::gradient g{o};
  g.on_sample(ok(10ms));
  g.on_sample(ok(100ms));
  g.on_sample(ok(1s));
  REQUIRE(g.limit() == 7.0);
  REQUIRE(g.in_slow_start());
}

TEST_CASE("gradient: the gain per round trip does not grow with the limit") {
  // One round trip is `limit` samples: at 8 and at 32 a round at the baseline adds about smoothing x queue,
  // times the pace, which doubles over the round trip (0.5 / ln 2 = 0.72 calls for a smooth doubling).
  for (const double start : {8.0, 32.0}) {
    rein::algo::gradient_options o;
    o.initial_limit = start;
    o.slow_start = false;
    rein::algo::gradient g{o};
    for (int i = 0; i < static_cast<int>(start); ++i) g.on_sample(ok(10ms));
    INFO(start);
    REQUIRE(g.limit() - start > 0.65);
    REQUIRE(g.limit() - start < 0.75);
  }
}

TEST_CASE("gradient: slow start adds one call per success until the first fall, within the growth guard") {
  rein::algo::gradient g{};  // from 4
  REQUIRE(g.in_slow_start());
  for (std::size_t n = 4; n < 8; ++n) g.on_sample(ok(10ms, n));  // a round trip of calls doubles the limit
  REQUIRE(g.limit() == 8.0);
  g.on_sample(ok(10ms, 2));  // 2 out tested 3 calls at most
  REQUIRE(g.limit() == 8.0);
  g.on_sample(ok(10ms, 8));
  REQUIRE(g.limit() == 9.0);
  g.on_sample(ok(20ms, 9));  // queued: the fall ends slow start
  REQUIRE(g.limit() == 7.875);  // 9 + (9 x 0.75 - 9) x 0.5
  REQUIRE_FALSE(g.in_slow_start());
  g.on_sample(ok(10ms, 7));
  REQUIRE(g.limit() == 8.0);  // back to the level the fall found, one call below its 9 out
}

TEST_CASE("gradient: after a fall the limit climbs back half the way per round trip to below the queued call") {
  rein::algo::gradient_options o;
  o.initial_limit = 16;
  o.slow_start = false;
  rein::algo::gradient g{o};
  g.on_sample(ok(10ms, 16));
  g.on_sample(ok(40ms, 16));  // beyond the clamp: 16.03125 x 0.5; 16 calls out were too many, 15 may not be
  REQUIRE(g.limit() == 8.015625);
  g.on_sample(ok(10ms, 16));  // (15 - 8.015625) / 2 calls per round trip of 8.015625 samples
  REQUIRE(g.limit() == Approx(8.015625 + (15 - 8.015625) / 2 / 8.015625).margin(1e-12));
  int samples = 1;
  while (g.limit() < 15.0 && samples < 1000) {
    g.on_sample(ok(10ms, 16));
    ++samples;
  }
  REQUIRE(samples == 55);  // about 4 round trips: 8 -> 11.5 -> 13.3 -> 14.1 -> 15, at least a call each
  REQUIRE(g.limit() == 15.0);  // not past the level in this phase
  g.on_sample(ok(10ms, 16));
  REQUIRE(g.limit() == Approx(15.0 + 0.5 / 15.0).margin(1e-12));  // then the queue allowance
  g.on_sample(ok(10ms, 2));   // the growth guard holds here too
  REQUIRE(g.limit() == Approx(15.0 + 0.5 / 15.0).margin(1e-12));
}

TEST_CASE("gradient: a fall that finds the level of the fall before it halves the rise above the level") {
  rein::algo::gradient_options o;
  o.initial_limit = 16;
  o.slow_start = false;
  o.min_utilisation = 0;
  rein::algo::gradient g{o};
  g.on_sample(ok(10ms, 16));
  g.on_sample(ok(20ms, 5));  // 5 out were too many: level 4, below the limit
  const double first = g.limit();
  REQUIRE(first == Approx(16.03125 * 0.875).margin(1e-12));  // half the way to x 0.75
  g.on_sample(ok(10ms, 16));
  REQUIRE(g.limit() == Approx(first + 0.5 / first).margin(1e-12));  // a new level: the whole allowance
  g.on_sample(ok(20ms, 5));  // level 4 again: the probe was futile
  const double second = g.limit();
  g.on_sample(ok(10ms, 16));
  REQUIRE(g.limit() == Approx(second + 0.5 * 0.5 / second).margin(1e-12));  // half of it
  for (int i = 0; i < 60; ++i) g.on_sample(ok(10ms, 16));  // 4 round trips: the pace is at its most, 2
  const double later = g.limit();
  g.on_sample(ok(10ms, 16));
  REQUIRE(g.limit() == Approx(later + 1.0 / later).margin(1e-12));  // the whole way to limit + 1 per round trip
}

TEST_CASE("gradient: latency twice the minimum scales the estimate by 1.5 / 2, at once") {
  rein::algo::gradient_options o;
  o.min_utilisation = 0;
  rein::algo::gradient g{o};
  g.on_sample(ok(5ms, 1));
  const double before = g.limit();
  g.on_sample(ok(10ms, 1));
  REQUIRE(g.last_gradient() == 0.75);
  REQUIRE(g.limit() == Approx(before + (before * 0.75 - before) * 0.5).margin(1e-12));  // queued: no allowance
}

TEST_CASE("gradient: a sample that queued gets no queue allowance, so no call stays queued at capacity 1") {
  // Capacity 1, latency the base plus one base per call over it: 2 calls out take 20 ms.
  rein::algo::gradient_options o;
  o.initial_limit = 2;
  o.slow_start = false;
  rein::algo::gradient g{o};
  g.on_sample(ok(10ms, 2));
  REQUIRE(g.limit() == 2.25);  // within the allowed latency: 2 + (2 + 1 - 2) x 0.5 / 2
  g.on_sample(ok(20ms, 2));
  REQUIRE(g.last_gradient() == 0.75);
  // 2.25 x 0.75 = 1.6875, half the way: 1.96875 admits 1 call. With the allowance the estimate would be
  // 2.6875, above the limit: a rise, and the second call would stay queued for good.
  REQUIRE(g.limit() == 1.96875);
  REQUIRE(g.decreases() == 1);
}

TEST_CASE("gradient: slow calls that started before the latest fall do not fall again") {
  rein::algo::gradient_options o;
  o.initial_limit = 16;
  rein::algo::gradient g{o};
  g.on_sample(ok(5ms));
  const sample::time_point t = next_end();
  g.on_sample(sample{20ms, outcome::success, 16, t});
  const double after_one = g.limit();
  REQUIRE(g.decreases() == 1);
  g.on_sample(sample{20ms, outcome::success, 16, t + 19ms});  // started 1 ms before the fall
  g.on_sample(sample{5ms, outcome::congestion, 16, t + 4ms});
  REQUIRE(g.limit() == after_one);
  REQUIRE(g.decreases() == 1);
  g.on_sample(sample{20ms, outcome::success, 16, t + 20ms});  // started at the fall: the new limit's call
  REQUIRE(g.decreases() == 2);
}

TEST_CASE("gradient: a latency beyond the clamp falls all the way, one within it is smoothed") {
  rein::algo::gradient_options o;
  o.initial_limit = 16;
  o.min_utilisation = 0;
  o.slow_start = false;
  rein::algo::gradient within{o}, beyond{o};
  within.on_sample(ok(10ms));
  beyond.on_sample(ok(10ms));
  REQUIRE(within.limit() == 16.03125);  // 16 + 1 x 0.5 / 16
  within.on_sample(ok(25ms));  // 15 / 25 = 0.6: half the way to 16.03125 x 0.6
  REQUIRE(within.limit() == Approx(16.03125 * 0.8).margin(1e-12));
  beyond.on_sample(ok(40ms));  // 15 / 40 = 0.375, clamped to 0.5: all the way
  REQUIRE(beyond.last_gradient() == 0.5);
  REQUIRE(beyond.limit() == 16.03125 * 0.5);
}

TEST_CASE("gradient: the gradient is clamped to [min_gradient, max_gradient]") {
  rein::algo::gradient g{};
  g.on_sample(ok(5ms));
  g.on_sample(ok(1s));
  REQUIRE(g.last_gradient() == 0.5);
}

TEST_CASE("gradient: congestion applies the minimum gradient at once, whatever the utilisation") {
  rein::algo::gradient_options every_failure;
  every_failure.learn_failure_rate = false;
  rein::algo::gradient g{every_failure};
  g.on_sample(congestion(5ms, 1));
  REQUIRE(g.limit() == 2.0);  // 4 x 0.5, not smoothed
  REQUIRE(g.decreases() == 1);
}

TEST_CASE("gradient: with failures_as_congestion off a fast failure is just a fast sample (Netflix)") {
  rein::algo::gradient_options o;
  o.failures_as_congestion = false;
  rein::algo::gradient g{o};
  g.on_sample(congestion(10ms));
  REQUIRE(g.limit() == 5.0);  // slow start: one call, as for a success
  REQUIRE(g.decreases() == 0);
}

TEST_CASE("gradient: a success granted with few calls out lifts the limit at most to max(n + 1, n / 0.85)") {
  rein::algo::gradient_options o;
  o.initial_limit = 16;
  rein::algo::gradient g{o};
  g.on_sample(ok(5ms, 7));  // 7 calls out tested 8.24 at most: below 16, so nothing moves
  REQUIRE(g.limit() == 16.0);
  g.on_sample(ok(10ms, 8));
  REQUIRE(g.last_gradient() == 0.75);  // the 5 ms sample set the minimum
  rein::algo::gradient low{};
  for (int i = 0; i < 100; ++i) low.on_sample(ok(5ms, 4));
  REQUIRE(low.limit() == 5.0);  // 4 out: one more call is the probe
}

TEST_CASE("gradient: the minimum baseline forgets samples older than its window") {
  rein::algo::gradient_options o;
  o.baseline_window = 3;
  rein::algo::gradient g{o};
  g.on_sample(ok(5ms));
  g.on_sample(ok(10ms));
  g.on_sample(ok(10ms));
  REQUIRE(g.last_gradient() == 0.75);  // 5 ms still among the last three
  g.on_sample(ok(10ms));
  REQUIRE(g.last_gradient() == 1.0);  // minimum is now 10 ms
}

TEST_CASE("gradient: Gradient2's long average is a plain mean over the warm-up") {
  rein::algo::gradient_options o;
  o.initial_limit = 16;
  o.baseline = rein::algo::gradient_baseline::long_average;
  o.baseline_window = 600;
  o.tolerance = 1.5;
  o.queue_size = 4;
  o.smoothing = 0.2;
  o.slow_start = false;
  rein::algo::gradient g{o};
  g.on_sample(ok(10ms));
  REQUIRE(g.limit() == Approx(16.05).margin(1e-12));  // gradient 1: 16 + (20 - 16) x 0.2 / 16
  g.on_sample(ok(40ms));
  REQUIRE(g.last_gradient() == 0.9375);  // 1.5 x mean(10, 40) / 40
  REQUIRE(g.limit() == Approx(16.05 + (16.05 * 0.9375 - 16.05) * 0.2).margin(1e-12));  // queued: a fall
}

TEST_CASE("gradient: ignored samples change nothing") {
  rein::algo::gradient g{};
  g.on_sample(ignored());
  REQUIRE(g.limit() == 4.0);
  REQUIRE(g.last_gradient() == 1.0);
}

TEST_CASE("gradient: invalid options name the type, field and value") {
  using G = rein::algo::gradient;
  rein::algo::gradient_options o;
  o.smoothing = 0;
  REQUIRE(error_of<G>(o) == "rein::algo::gradient: smoothing must be in (0, 1], got 0");
  o = {};
  o.tolerance = 0.5;
  REQUIRE(error_of<G>(o) == "rein::algo::gradient: tolerance must be >= 1 and finite, got 0.5");
  o = {};
  o.noise_floor = -1ns;
  REQUIRE(error_of<G>(o) == "rein::algo::gradient: noise_floor must be >= 0, got -1 ns");
  o = {};
  o.min_gradient = 0;
  REQUIRE(error_of<G>(o) == "rein::algo::gradient: min_gradient must be in (0, 1], got 0");
  o = {};
  o.max_gradient = 0.9;
  REQUIRE(error_of<G>(o) == "rein::algo::gradient: max_gradient must be >= 1 and finite, got 0.9");
  o = {};
  o.queue_size = -1;
  REQUIRE(error_of<G>(o) == "rein::algo::gradient: queue_size must be >= 0 and finite, got -1");
  o = {};
  o.baseline_window = 0;
  REQUIRE(error_of<G>(o) == "rein::algo::gradient: baseline_window must be >= 1, got 0");
}

// ---------------------------------------------------------------------------------------------------------
// vegas
// ---------------------------------------------------------------------------------------------------------

namespace {

// Netflix's start, and its utilisation factor: growth up to twice what was tested.
rein::algo::vegas_options netflix_start() {
  rein::algo::vegas_options o;
  o.initial_limit = 20;
  o.min_utilisation = 0.5;
  o.learn_failure_rate = false;  // Netflix's: every failure shrinks
  return o;
}

// A vegas that never probes for a lower no-load latency (a probe every million samples).
rein::algo::vegas no_probe_vegas(rein::algo::vegas_options o = netflix_start()) {
  o.probe_multiplier = 1e6;
  return rein::algo::vegas{o};
}

}  // namespace

TEST_CASE("vegas: the first sample only sets the no-load latency") {
  auto v = no_probe_vegas();
  v.on_sample(ok(10ms, 20));
  REQUIRE(v.no_load_latency() == 10ms);
  REQUIRE(v.limit() == 20.0);
}

TEST_CASE("vegas: no queue grows by beta, a small one by a step, a large one shrinks, between holds") {
  auto v = no_probe_vegas();  // from 20: L = 1, threshold 1, alpha 3, beta 6
  v.on_sample(ok(10ms, 20));
  v.on_sample(ok(10ms, 20));  // queue ceil(20 x 0) = 0
  REQUIRE(v.limit() == 26.0);
  v.on_sample(ok(11ms, 20));  // queue ceil(26 x 1/11) = 3: alpha <= 3 <= beta
  REQUIRE(v.limit() == 26.0);
  v.on_sample(ok(10500us, 20));  // queue ceil(26 x 0.5/10.5) = 2 < alpha
  REQUIRE(v.limit() == 27.0);
  v.on_sample(ok(20ms, 20));  // queue ceil(27 x 0.5) = 14 > beta; granted with 20 out, one call ahead of it
  REQUIRE(v.limit() == 19.0);
  v.on_sample(congestion(20ms, 1));  // a drop shrinks by a step, whatever the utilisation
  REQUIRE(v.limit() == 18.0);
  REQUIRE(v.decreases() == 2);
  REQUIRE(v.increases() == 2);
}

TEST_CASE("vegas: below a limit of 14 the thresholds are shares of the limit, not whole calls") {
  rein::algo::vegas_options o;
  o.min_utilisation = 0.5;
  auto v = no_probe_vegas(o);  // from 4: Netflix's thresholds 1, 3, 6 calls; shares 1/14, 3/14, 3/7
  v.on_sample(ok(10ms, 4));
  v.on_sample(ok(20ms, 4));  // half the limit queued: 2 calls < alpha, but 0.5 > 3/7
  REQUIRE(v.limit() == 3.0);
  rein::algo::vegas w{o};
  w.on_sample(ok(10ms, 4));
  w.on_sample(ok(12ms, 4));  // 1/6 queued: ceil(4 / 6) = 1 call <= threshold, but 1/6 > 1/14: a step
  REQUIRE(w.limit() == 5.0);
  rein::algo::vegas x{o};
  x.on_sample(ok(10ms, 4));
  x.on_sample(ok(10700us, 4));  // 0.065 queued, below 1/14: grow by beta, within the guard (8)
  REQUIRE(x.limit() == 8.0);
}

TEST_CASE("vegas: a decrease removes the calls queued ahead of the success, at most half the limit") {
  auto v = no_probe_vegas();  // from 20
  v.on_sample(ok(10ms, 20));
  v.on_sample(ok(30ms, 20));  // 3 x the no-load latency: 2 calls queued ahead, 18 of the 20 were unqueued
  REQUIRE(v.limit() == 18.0);  // Netflix: 19
  v.on_sample(ok(200ms, 18));  // 19 calls ahead: at most half
  REQUIRE(v.limit() == 9.0);
}

TEST_CASE("vegas: the success that ends a round trip decides a decrease when it queued behind a call") {
  auto v = no_probe_vegas();  // from 20
  const sample::time_point t{1000s};
  v.on_sample(sample{10ms, outcome::success, 20, t});        // no-load 10 ms; a round trip begins
  v.on_sample(sample{10ms, outcome::success, 20, t + 5ms});  // within it: the fastest, no queue
  v.on_sample(sample{20ms, outcome::success, 20, t + 25ms});  // started within it, twice the no-load latency
  REQUIRE(v.limit() == 19.0);  // the fastest alone would grow by beta
}

TEST_CASE("vegas: after the first decrease growth is a step, from a round trip that tested the limit") {
  auto v = no_probe_vegas();  // from 20
  v.on_sample(ok(10ms, 20));
  REQUIRE(v.in_slow_start());
  v.on_sample(ok(30ms, 20));
  REQUIRE(v.limit() == 18.0);
  REQUIRE_FALSE(v.in_slow_start());
  v.on_sample(ok(10ms, 17));  // no queue, but 17 calls out did not test a limit of 18
  REQUIRE(v.limit() == 18.0);
  REQUIRE(v.waiting() == 1.0);  // and does not count as the round trip held after a decrease
  v.on_sample(ok(10ms, 18));  // tested, no queue: held
  REQUIRE(v.limit() == 18.0);
  v.on_sample(ok(10ms, 18));  // a step, not beta
  REQUIRE(v.limit() == 19.0);
}

TEST_CASE("vegas: growth waits a round trip after a decrease, longer at a level decreases keep finding") {
  auto v = no_probe_vegas();  // from 20
  v.on_sample(ok(10ms, 20));
  v.on_sample(ok(20ms, 20));  // to 19: a new level, one round trip
  REQUIRE(v.limit() == 19.0);
  REQUIRE(v.waiting() == 1.0);
  v.on_sample(ok(10ms, 19));
  REQUIRE(v.limit() == 19.0);
  v.on_sample(ok(10ms, 19));
  REQUIRE(v.limit() == 20.0);
  v.on_sample(ok(20ms, 20));  // 19 again: three round trips
  REQUIRE(v.waiting() == 3.0);
  for (int i = 0; i < 3; ++i) v.on_sample(ok(10ms, 19));
  REQUIRE(v.limit() == 19.0);
  v.on_sample(ok(10ms, 19));
  REQUIRE(v.limit() == 20.0);
  v.on_sample(ok(20ms, 20));  // a third time: seven
  REQUIRE(v.waiting() == 7.0);
}

TEST_CASE("vegas: with judge_latency false every round trip grows as one without a queue; congestion shrinks") {
  rein::algo::vegas judged = no_probe_vegas();  // from 20, growth up to twice the calls tested
  rein::algo::vegas_options o = netflix_start();
  o.judge_latency = false;
  rein::algo::vegas v = no_probe_vegas(o);
  for (auto* a : {&judged, &v}) a->on_sample(ok(5ms, 20));  // begins the first round trip
  REQUIRE(v.limit() == 20.0);
  for (auto* a : {&judged, &v}) a->on_sample(ok(50ms, 20));  // ends it, 10 x the first latency
  REQUIRE(judged.limit() == 11.0);  // queued behind 9 calls: 20 - 9
  REQUIRE(v.limit() == 26.0);       // slow start: 20 + beta 6 x L 1
  v.on_sample(congestion(5ms, 26));  // one step down, and slow start ends
  REQUIRE(v.limit() == 25.0);
  REQUIRE_FALSE(v.in_slow_start());
  v.on_sample(ok(50ms, 24));  // fewer calls out than the limit admits: the round trip did not test it
  REQUIRE(v.limit() == 25.0);
  v.on_sample(ok(50ms, 25));
  REQUIRE(v.limit() == 26.0);  // a step
}

TEST_CASE("vegas: plateau_rounds 0 never waits") {
  rein::algo::vegas_options o;
  o.initial_limit = 20;
  o.plateau_rounds = 0;
  auto v = no_probe_vegas(o);
  v.on_sample(ok(10ms, 20));
  v.on_sample(ok(20ms, 20));
  v.on_sample(ok(10ms, 19));
  v.on_sample(ok(20ms, 20));  // 19 again
  REQUIRE(v.waiting() == 0.0);
  v.on_sample(ok(10ms, 19));
  REQUIRE(v.limit() == 20.0);
}

TEST_CASE("vegas: a faster sample resets the no-load latency and changes nothing else") {
  auto v = no_probe_vegas();
  v.on_sample(ok(10ms, 20));
  v.on_sample(ok(5ms, 20));
  REQUIRE(v.no_load_latency() == 5ms);
  REQUIRE(v.limit() == 20.0);
}

TEST_CASE("vegas: a success granted with few calls out does not raise the limit above what they tested") {
  auto v = no_probe_vegas();
  v.on_sample(ok(10ms, 9));
  v.on_sample(ok(10ms, 9));
  REQUIRE(v.limit() == 20.0);
}

TEST_CASE("vegas: above 1000 the step is log10 of the limit") {
  rein::algo::vegas_options o;
  o.initial_limit = 1500;
  o.max_limit = 5000;
  o.learn_failure_rate = false;
  auto v = no_probe_vegas(o);
  v.on_sample(ok(10ms, 1500));
  v.on_sample(congestion(10ms, 1500));
  REQUIRE(v.limit() == 1497.0);  // L = floor(log10(1500)) = 3
}

TEST_CASE("vegas: a probe adopts the current latency as the no-load latency within multiplier x limit samples") {
  rein::algo::vegas_options o;
  o.probe_multiplier = 1;
  rein::algo::vegas v{o};
  v.on_sample(ok(10ms, 1));
  for (int i = 0; i < 20; ++i) v.on_sample(ok(50ms, 1));  // jitter < 1: a probe within 20 samples
  REQUIRE(v.no_load_latency() == 50ms);
  REQUIRE(v.probe_count() < 20);
}

TEST_CASE("vegas: once per round trip, from the fastest success of the round trip") {
  auto v = no_probe_vegas();  // from 20
  const sample::time_point t{1000s};
  v.on_sample(sample{10ms, outcome::success, 20, t});  // no-load 10 ms; a round trip begins
  v.on_sample(sample{20ms, outcome::success, 20, t + 5ms});     // started before it: within it
  v.on_sample(sample{10500us, outcome::success, 20, t + 9ms});  // within it too
  REQUIRE(v.limit() == 20.0);  // Netflix would have cut on the 20 ms sample (queue ceil(20 x 0.5) = 10 > 6)
  v.on_sample(sample{15ms, outcome::success, 20, t + 25ms});  // started after it began: ends it
  REQUIRE(v.limit() == 26.0);  // fastest 10.5 ms: 0.048 queued, below 1/14: grow by beta
  v.on_sample(sample{15ms, outcome::success, 20, t + 30ms});  // started before the new round trip began
  REQUIRE(v.limit() == 26.0);
}

TEST_CASE("vegas: the growth guard takes the calls out at the grant of the round trip's fastest success") {
  auto v = no_probe_vegas();  // from 20, growth up to twice what was tested
  const sample::time_point t{1000s};
  v.on_sample(sample{10ms, outcome::success, 20, t});
  v.on_sample(sample{10200us, outcome::success, 12, t + 5ms});  // the fastest: granted with 12 out
  v.on_sample(sample{15ms, outcome::success, 30, t + 25ms});    // ends the round trip, granted with 30 out
  REQUIRE(v.limit() == 24.0);  // beta would reach 26, 30 out would allow 60; 12 out allow 24
}

TEST_CASE("vegas: of equally fast successes, the growth guard takes the one granted with the most calls out") {
  auto v = no_probe_vegas();  // from 20, growth up to twice what was tested
  const sample::time_point t{1000s};
  v.on_sample(sample{10ms, outcome::success, 20, t});
  v.on_sample(sample{10ms, outcome::success, 8, t + 5ms});   // the fastest, granted with 8 out
  v.on_sample(sample{10ms, outcome::success, 12, t + 6ms});  // as fast, granted with 12 out
  v.on_sample(sample{10ms, outcome::success, 9, t + 7ms});
  v.on_sample(sample{15ms, outcome::success, 30, t + 25ms});  // ends the round trip
  REQUIRE(v.limit() == 24.0);  // beta would reach 26; 12 out allow 24 (8 out: 16)
}

namespace {

// A vegas whose limit may not fall below 10, probing within 10-20 samples, after a no-load latency of 10 ms
// and a probe round trip whose fastest success took 20 ms with 64 calls out; each sample ends 10 s after
// the previous one unless the test says otherwise.
struct probed_vegas {
  rein::algo::vegas v{[] {
    rein::algo::vegas_options o;
    o.probe_multiplier = 2;
    o.min_limit = 10;
    o.initial_limit = 10;
    o.min_utilisation = 0.5;
    return o;
  }()};
  sample::time_point t{1000s};

  probed_vegas() {
    v.on_sample(sample{10ms, outcome::success, 64, t});
    for (int i = 0; i < 40 && !v.probe_tentative(); ++i) {
      t += 10s;
      v.on_sample(sample{20ms, outcome::success, 64, t});
    }
  }
  void next(std::chrono::nanoseconds latency, std::size_t in_flight) {
    t += 10s;
    v.on_sample(sample{latency, outcome::success, in_flight, t});
  }
};

}  // namespace

TEST_CASE("vegas: a probe adopts the fastest success of the next round trip, not the next sample") {
  rein::algo::vegas_options o;
  o.probe_multiplier = 2;
  o.min_limit = 10;
  o.initial_limit = 10;
  o.max_limit = 10;  // the probe comes within 10-20 samples
  rein::algo::vegas v{o};
  sample::time_point t{1000s};
  v.on_sample(sample{10ms, outcome::success, 64, t});
  for (int i = 0; i < 40; ++i) {  // until the probe is due (the count starts over), each sample a round trip
    t += 10s;
    v.on_sample(sample{10ms, outcome::success, 64, t});
    if (v.probe_count() == 0) break;
  }
  REQUIRE(v.probe_count() == 0);
  v.on_sample(sample{30ms, outcome::success, 64, t + 20ms});  // the probe round trip began at t
  v.on_sample(sample{20ms, outcome::success, 64, t + 15ms});
  REQUIRE(v.no_load_latency() == 10ms);
  v.on_sample(sample{30ms, outcome::success, 64, t + 40ms});  // started after t: ends it
  REQUIRE(v.no_load_latency() == 20ms);                       // Netflix: the next sample, 30 ms
  REQUIRE(v.probe_tentative());
}

TEST_CASE("vegas: a slower probed baseline grows the limit by a step at most until confirmed") {
  probed_vegas p;
  REQUIRE(p.v.probe_tentative());
  REQUIRE(p.v.no_load_latency() == 20ms);
  REQUIRE(p.v.limit() == 10.0);
  p.next(20ms, 64);  // no queue, but no more calls out than at the probe: a step, not beta
  REQUIRE(p.v.limit() == 11.0);
  REQUIRE(p.v.probe_tentative());
}

TEST_CASE("vegas: a slower probed baseline that reads a queue gives the old baseline back") {
  probed_vegas p;
  p.next(25ms, 64);  // 0.2 queued against 20 ms: our own queue
  REQUIRE_FALSE(p.v.probe_tentative());
  REQUIRE(p.v.no_load_latency() == 10ms);
}

TEST_CASE("vegas: a slower probed baseline is confirmed by two round trips of no queue with more calls out") {
  probed_vegas p;
  p.next(20ms, 65);  // one more call out than at the probe, no slower: one round trip of two
  REQUIRE(p.v.probe_tentative());
  REQUIRE(p.v.limit() == 11.0);  // still a step
  p.next(20ms, 66);  // again more calls out, no slower: the dependency is slower
  REQUIRE_FALSE(p.v.probe_tentative());
  REQUIRE(p.v.no_load_latency() == 20ms);
  REQUIRE(p.v.limit() == 17.0);  // confirmed: beta
}

TEST_CASE("vegas: a rise of calls out must repeat in the next round trip to confirm a probed baseline") {
  probed_vegas p;
  p.next(20ms, 65);  // a rise
  p.next(20ms, 65);  // no rise: the count starts over
  p.next(20ms, 66);  // a rise, the first again
  REQUIRE(p.v.probe_tentative());
  REQUIRE(p.v.limit() == 13.0);  // a step per round trip
}

TEST_CASE("vegas: a faster tentative baseline counts the calls out it was seen with") {
  probed_vegas p;
  p.next(15ms, 70);  // faster than the probe's 20 ms, still slower than 10 ms: tentative, seen with 70 out
  REQUIRE(p.v.probe_tentative());
  REQUIRE(p.v.no_load_latency() == 15ms);
  p.next(15ms, 68);  // no more calls out than 70: no rise
  p.next(15ms, 69);
  REQUIRE(p.v.probe_tentative());
  p.next(15ms, 71);
  p.next(15ms, 72);  // two rises past 70
  REQUIRE_FALSE(p.v.probe_tentative());
}

TEST_CASE("vegas: ignored samples change nothing, not even the probe count") {
  auto v = no_probe_vegas();
  v.on_sample(ignored());
  REQUIRE(v.probe_count() == 0);
  REQUIRE(v.no_load_latency() == 0ns);
}

TEST_CASE("vegas: invalid options name the type, field and value") {
  using V = rein::algo::vegas;
  rein::algo::vegas_options o;
  o.alpha_factor = 0.5;
  REQUIRE(error_of<V>(o) == "rein::algo::vegas: alpha_factor must be >= threshold_factor and finite, got 0.5");
  o = {};
  o.beta_factor = 2;
  REQUIRE(error_of<V>(o) == "rein::algo::vegas: beta_factor must be >= alpha_factor and finite, got 2");
  o = {};
  o.queue_share = 1;
  REQUIRE(error_of<V>(o) == "rein::algo::vegas: queue_share must be in (0, 1), got 1");
  o = {};
  o.probe_multiplier = 0;
  REQUIRE(error_of<V>(o) == "rein::algo::vegas: probe_multiplier must be >= 1 and finite, got 0");
  o = {};
  o.plateau_rounds = -1;
  REQUIRE(error_of<V>(o) == "rein::algo::vegas: plateau_rounds must be >= 0 and finite, got -1");
  o = {};
  o.max_limit = 10;
  o.initial_limit = 20;
  REQUIRE(error_of<V>(o) ==
          "rein::algo::vegas: initial_limit must be in [min_limit, max_limit] = [1, 10], got 20");
}

// ---------------------------------------------------------------------------------------------------------
// Every loss- and delay-driven algorithm but tuned_aimd (tests/algo/tuned_aimd.cpp): work hints and failures
// at a rate that does not change with the limit (issue 42's shapes, which the family measures at scale).
// ---------------------------------------------------------------------------------------------------------

namespace {

// Calls whose latency follows their work (5 ms per unit, 1 to 5 units, the first 1), each granted with the
// limit's calls out; `hinted`: each says its work. Returns the algorithm's decreases.
template <class Algorithm>
std::uint64_t payload_run(bool hinted) {
  Algorithm a{};
  for (int i = 0; i < 400; ++i) {
    const int units = 1 + (i * 7) % 5;
    sample s = ok(5ms * units, static_cast<std::size_t>(std::floor(a.limit())));
    if (hinted) s.work = units;
    a.on_sample(s);
  }
  return a.decreases();
}

// Fast successes with every 20th call failing (5 %), with the algorithm's defaults and with
// `learn_failure_rate` off; returns both decreases.
template <class Algorithm>
std::pair<std::uint64_t, std::uint64_t> random_failures_run() {
  typename Algorithm::options textbook;
  textbook.learn_failure_rate = false;
  Algorithm learned{}, every{textbook};
  for (int i = 1; i <= 400; ++i) {
    for (Algorithm* a : {&learned, &every}) {
      const auto n = static_cast<std::size_t>(std::floor(a->limit()));
      a->on_sample(i % 20 == 0 ? congestion(5ms, n) : ok(5ms, n));
    }
  }
  return {learned.decreases(), every.decreases()};
}

}  // namespace

TEMPLATE_TEST_CASE("a work hint: latency that follows the payload is not read as a queue", "[hints]",
                   rein::algo::aimd, rein::algo::gradient, rein::algo::vegas, rein::algo::windowed_aimd,
                   rein::algo::pid) {
  CHECK(payload_run<TestType>(true) == 0);  // 5 ms per unit, every call: no queue
  CHECK(payload_run<TestType>(false) > 0);  // the same calls unhinted: a 25 ms call is 5 times the fastest
}

TEMPLATE_TEST_CASE("learn_failure_rate: 5 % of calls failing whatever the limit cut nothing; off, they cut",
                   "[hints]", rein::algo::aimd, rein::algo::gradient, rein::algo::vegas, rein::algo::windowed_aimd,
                   rein::algo::pid) {
  const auto [learned, every] = random_failures_run<TestType>();
  CHECK(learned == 0);  // at most 3 of any 50 outcomes fail: under the 15 % floor's 16 of 50
  if constexpr (std::is_same_v<TestType, rein::algo::windowed_aimd>)
    CHECK(every == 0);  // its own window tolerates up to failure_threshold (15 %)
  else
    CHECK(every > 0);
}

TEMPLATE_TEST_CASE("a work hint of 0 says nothing about latency; a negative, NaN or infinite one is refused, "
                   "changing nothing",
                   "[hints]", rein::algo::aimd, rein::algo::gradient, rein::algo::vegas, rein::algo::windowed_aimd,
                   rein::algo::pid) {
  TestType a{};
  for (int i = 0; i < 20; ++i) a.on_sample(ok(5ms, 4));
  const double before = a.limit();
  const std::uint64_t increases = a.increases();
  for (const double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    sample s = ok(5ms, 4);
    s.work = bad;
    CHECK_THROWS_WITH(a.on_sample(s), Catch::Matchers::StartsWith("rein::algo::sample: work must be >= 0 and finite, got "));
    CHECK(a.limit() == before);
    CHECK(a.increases() == increases);
  }
  sample none = ok(500ms, 4);  // a cached answer: 100 times the fastest, and no work
  none.work = 0.0;
  for (int i = 0; i < 20; ++i) a.on_sample(none);
  CHECK(a.decreases() == 0);
}

TEMPLATE_TEST_CASE("learn_failure_rate with the latency signal off: every failure counts, as with it off",
                   "[hints]", rein::algo::aimd, rein::algo::gradient, rein::algo::vegas, rein::algo::windowed_aimd,
                   rein::algo::pid) {
  typename TestType::options learned;
  if constexpr (std::is_same_v<TestType, rein::algo::vegas>)
    learned.judge_latency = false;
  else if constexpr (std::is_same_v<TestType, rein::algo::gradient>)
    learned.tolerance.reset();
  else
    learned.latency_tolerance.reset();
  typename TestType::options every = learned;
  every.learn_failure_rate = false;
  TestType a{learned}, b{every};
  for (int i = 1; i <= 400; ++i) {
    for (TestType* x : {&a, &b}) {
      const auto n = static_cast<std::size_t>(std::floor(x->limit()));
      x->on_sample(i % 20 == 0 ? congestion(5ms, n) : ok(5ms, n));
    }
  }
  CHECK(a.limit() == b.limit());
  CHECK(a.decreases() == b.decreases());
  if constexpr (!std::is_same_v<TestType, rein::algo::windowed_aimd>) CHECK(a.decreases() > 0);
}

TEST_CASE("vegas with the latency signal off: a success that did no work grows the limit as any success",
          "[hints]") {
  rein::algo::vegas_options o;
  o.judge_latency = false;
  rein::algo::vegas hinted{o}, plain{o};
  for (int i = 0; i < 200; ++i) {
    sample none = ok(5ms, static_cast<std::size_t>(std::floor(hinted.limit())));
    none.work = 0.0;
    hinted.on_sample(none);
    plain.on_sample(ok(5ms, static_cast<std::size_t>(std::floor(plain.limit()))));
  }
  CHECK(hinted.limit() == plain.limit());
  CHECK(hinted.limit() > 4.0);
}

// The failure baseline keeps its windows as a ring of bits with running counts; this checks it against the
// rule written plainly (a list of every outcome, the windows counted afresh on each one) on random runs whose
// failure rate moves between 0 and 60 %, so that windows fill, slide and wrap the ring many times over.
TEST_CASE("failure_baseline: the ring and its running counts decide as the plain rule, over 40,000 outcomes") {
  using baseline = rein::algo::detail::failure_baseline;
  const auto plain_rate = [](const std::vector<bool>& before) {
    const std::size_t n_long = std::min(before.size(), baseline::long_window);
    std::size_t long_failures = 0;
    for (std::size_t i = before.size() - n_long; i < before.size(); ++i) long_failures += before[i] ? 1 : 0;
    const double p = n_long >= baseline::warmup ? static_cast<double>(long_failures) / static_cast<double>(n_long) : 0.0;
    return std::clamp(p, baseline::min_rate, baseline::max_rate);
  };
  const auto plain = [&](const std::vector<bool>& before, bool failed) {
    const double p = plain_rate(before);
    if (!failed) return false;
    const std::size_t n = std::min(before.size() + 1, baseline::short_window);
    std::size_t recent = 1;
    for (std::size_t i = before.size() + 1 - n; i < before.size(); ++i) recent += before[i] ? 1 : 0;
    const double expected = p * static_cast<double>(n);
    return static_cast<double>(recent) > expected + baseline::z * std::sqrt(expected);
  };
  baseline ring;
  std::vector<bool> seen;
  std::uint64_t state = 12345;
  std::size_t counted = 0;
  for (std::size_t i = 0; i < 40000; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;  // Knuth's MMIX LCG
    const double rate = 0.3 + 0.3 * std::sin(static_cast<double>(i) / 700.0);
    const bool failed = static_cast<double>(state >> 11) / 9007199254740992.0 < rate;
    REQUIRE(ring.rate() == plain_rate(seen));  // the same sum over the same outcomes: exactly equal
    const bool expected = plain(seen, failed);
    REQUIRE(ring.congested(failed) == expected);
    counted += expected ? 1 : 0;
    seen.push_back(failed);
  }
  CHECK(counted > 100);  // the bursts of the run count as congestion, so both answers were exercised
}
