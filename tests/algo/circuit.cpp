// rein::algo::circuit (fail fast at the floor) and set_options of every adaptive algorithm: exact states,
// counts and limits, time given as arguments.
#include <rein/algo/aimd.hpp>
#include <rein/algo/circuit.hpp>
#include <rein/algo/gradient.hpp>
#include <rein/algo/pid.hpp>
#include <rein/algo/tuned_aimd.hpp>
#include <rein/algo/vegas.hpp>
#include <rein/algo/windowed_aimd.hpp>

#include "support/catch.hpp"

#include <chrono>
#include <stdexcept>

using namespace std::chrono_literals;
using rein::outcome;
using rein::algo::circuit;
using rein::algo::circuit_options;
using rein::algo::circuit_state;
using time_point = circuit::time_point;

namespace {

time_point at(std::chrono::milliseconds ms) { return time_point(ms); }

circuit_options opens_after(std::size_t n, std::chrono::nanoseconds open_for = 1s, std::size_t probes = 1) {
  circuit_options o;
  o.open_after = n;
  o.open_for = open_for;
  o.probes = probes;
  return o;
}

}  // namespace

TEST_CASE("circuit: off by default; congestion at the floor never opens it") {
  circuit c;
  CHECK_FALSE(c.enabled());
  for (int i = 0; i < 100; ++i) c.on_sample(outcome::congestion, at(0ms), at(1ms), true);
  CHECK(c.state(at(1ms)) == circuit_state::closed);
  CHECK_FALSE(c.refuses(at(1ms)));
  CHECK(c.opens() == 0);
}

TEST_CASE("circuit: opens after open_after congestion outcomes in a row at the floor; a success restarts the count") {
  circuit c{opens_after(3)};
  c.on_sample(outcome::congestion, at(0ms), at(10ms), true);
  c.on_sample(outcome::congestion, at(10ms), at(20ms), true);
  CHECK(c.streak() == 2);
  c.on_sample(outcome::success, at(20ms), at(30ms), true);
  CHECK(c.streak() == 0);
  c.on_sample(outcome::ignored, at(30ms), at(40ms), true);  // says nothing: neither counts nor restarts
  c.on_sample(outcome::congestion, at(40ms), at(50ms), true);
  c.on_sample(outcome::congestion, at(50ms), at(60ms), false);  // above the floor: does not count
  c.on_sample(outcome::congestion, at(60ms), at(70ms), true);
  CHECK(c.streak() == 2);
  CHECK_FALSE(c.refuses(at(70ms)));
  c.on_sample(outcome::congestion, at(70ms), at(80ms), true);
  CHECK(c.state(at(80ms)) == circuit_state::open);
  CHECK(c.open_until() == at(1080ms));
  CHECK(c.opens() == 1);
  CHECK(c.streak() == 0);
  CHECK(c.refuses(at(80ms)));
  CHECK(c.refuses(at(1079ms)));
}

TEST_CASE("circuit: open for open_for, then half-open grants `probes` calls and refuses the rest") {
  circuit c{opens_after(1, 500ms, 2)};
  c.on_sample(outcome::congestion, at(0ms), at(100ms), true);
  CHECK(c.state(at(599ms)) == circuit_state::open);
  c.on_sample(outcome::success, at(50ms), at(200ms), true);  // a call from before the opening: changes nothing
  CHECK(c.state(at(599ms)) == circuit_state::open);
  CHECK(c.state(at(600ms)) == circuit_state::half_open);
  CHECK_FALSE(c.refuses(at(600ms)));
  c.on_grant(at(600ms));
  CHECK_FALSE(c.refuses(at(601ms)));
  c.on_grant(at(601ms));
  CHECK(c.refuses(at(602ms)));  // both probes out
  c.on_sample(outcome::ignored, at(600ms), at(650ms), true);  // a probe that says nothing frees its place
  CHECK_FALSE(c.refuses(at(650ms)));
  CHECK(c.state(at(650ms)) == circuit_state::half_open);
}

TEST_CASE("circuit: a probe's success closes it; a probe's congestion opens it again for open_for") {
  circuit c{opens_after(2, 1s)};
  c.on_sample(outcome::congestion, at(0ms), at(10ms), true);
  c.on_sample(outcome::congestion, at(10ms), at(20ms), true);
  CHECK(c.state(at(1020ms)) == circuit_state::half_open);
  c.on_grant(at(1020ms));
  c.on_sample(outcome::congestion, at(1020ms), at(1030ms), true);
  CHECK(c.state(at(1030ms)) == circuit_state::open);
  CHECK(c.open_until() == at(2030ms));
  CHECK(c.opens() == 2);
  c.on_grant(at(2030ms));
  c.on_sample(outcome::success, at(2030ms), at(2040ms), true);
  CHECK(c.state(at(2040ms)) == circuit_state::closed);
  CHECK_FALSE(c.refuses(at(2040ms)));
  CHECK(c.streak() == 0);
  c.on_sample(outcome::congestion, at(2040ms), at(2050ms), true);  // the count starts again from zero
  CHECK(c.state(at(2050ms)) == circuit_state::closed);
  CHECK(c.streak() == 1);
}

TEST_CASE("circuit: while half-open, a call granted before it became half-open is not a probe") {
  circuit c{opens_after(1, 1s)};
  c.on_sample(outcome::congestion, at(0ms), at(100ms), true);  // open until 1100 ms
  c.on_grant(at(1100ms));                                       // the probe
  CHECK(c.refuses(at(1100ms)));
  c.on_sample(outcome::success, at(90ms), at(1200ms), true);    // granted at 90 ms, long before: not a probe
  CHECK(c.state(at(1200ms)) == circuit_state::half_open);
  CHECK(c.refuses(at(1200ms)));                                 // the probe is still out
  c.on_sample(outcome::congestion, at(1100ms), at(1300ms), true);
  CHECK(c.state(at(1300ms)) == circuit_state::open);
}

TEST_CASE("circuit: set_options with open_after 0 closes an open circuit; invalid options name field and value") {
  circuit c{opens_after(1)};
  c.on_sample(outcome::congestion, at(0ms), at(10ms), true);
  CHECK(c.refuses(at(10ms)));
  c.set_options({});
  CHECK(c.state(at(10ms)) == circuit_state::closed);
  CHECK_FALSE(c.refuses(at(10ms)));
  CHECK_THROWS_WITH(circuit{opens_after(1, 0s)}, "rein::algo::circuit: open_for must be > 0, got 0 ns");
  CHECK_THROWS_WITH(circuit{opens_after(1, 1s, 0)}, "rein::algo::circuit: probes must be >= 1, got 0");
  CHECK_THROWS_WITH(c.set_options(opens_after(5, -1ns)), "rein::algo::circuit: open_for must be > 0, got -1 ns");
  CHECK_FALSE(c.enabled());  // the failed set_options changed nothing
  CHECK(rein::algo::to_string(circuit_state::half_open) == "half_open");
}

// ---- set_options of every algorithm: validated as the constructor, the limit kept and moved into the
// new bounds.

TEST_CASE("aimd: set_options keeps the limit, moves it into the new bounds, and validates like the constructor") {
  rein::algo::aimd_options o;
  o.initial_limit = 10;
  rein::algo::aimd a{o};
  o.max_limit = 6;
  o.initial_limit = 1;  // checked, not used
  a.set_options(o);
  CHECK(a.limit() == 6.0);
  CHECK(a.max_limit() == 6.0);
  CHECK(a.decreases() == 0);  // no sample moved it
  o.min_limit = 8;
  o.max_limit = 64;
  o.initial_limit = 8;
  a.set_options(o);
  CHECK(a.limit() == 8.0);
  o.backoff = 1.5;
  CHECK_THROWS_WITH(a.set_options(o), "rein::algo::aimd: backoff must be in (0, 1), got 1.5");
  CHECK(a.get_options().backoff == 0.8);  // unchanged
  a.on_sample({1ms, outcome::congestion, 8, time_point(1s)});
  CHECK(a.limit() == 8.0);  // the new floor holds
}

TEST_CASE("tuned_aimd: set_options with a smaller window keeps the newest latencies") {
  rein::algo::tuned_aimd_options o;
  o.window = 10;
  o.min_samples = 1;
  o.baseline_quantile = 0.5;
  o.tolerance = 100;  // no latency judgement here: every success joins the baseline
  rein::algo::tuned_aimd a{o};
  for (int i = 1; i <= 10; ++i)
    a.on_sample({std::chrono::milliseconds(i), outcome::success, 1, time_point(std::chrono::seconds(i))});
  CHECK(a.baseline() == 5.5e6);  // median of 1..10 ms
  o.window = 3;
  a.set_options(o);
  CHECK(a.baseline() == 9e6);  // 8, 9, 10 ms
  o.window = 5;
  a.set_options(o);
  CHECK(a.baseline() == 9e6);  // a larger window brings nothing back
  a.on_sample({11ms, outcome::success, 1, time_point(11s)});
  CHECK(a.baseline() == 9.5e6);  // 8, 9, 10, 11 ms
  o.min_samples = 6;
  CHECK_THROWS_WITH(a.set_options(o), "rein::algo::tuned_aimd: min_samples must be in [1, window], got 6");
  CHECK(a.get_options().window == 5);
}

TEST_CASE("tuned_aimd: set_options slow_start false ends slow start; a new increase restarts the probe") {
  rein::algo::tuned_aimd a;
  CHECK(a.in_slow_start());
  rein::algo::tuned_aimd_options o;
  o.slow_start = false;
  a.set_options(o);
  CHECK_FALSE(a.in_slow_start());
  o.slow_start = true;
  a.set_options(o);
  CHECK_FALSE(a.in_slow_start());  // not restarted
}

TEST_CASE("gradient, vegas, windowed_aimd, pid: set_options clamps the limit into the new bounds") {
  rein::algo::gradient_options g;
  g.initial_limit = 20;
  rein::algo::gradient ga{g};
  g.max_limit = 5;
  g.initial_limit = 5;
  ga.set_options(g);
  CHECK(ga.limit() == 5.0);
  g.smoothing = 0;
  CHECK_THROWS_WITH(ga.set_options(g), "rein::algo::gradient: smoothing must be in (0, 1], got 0");

  rein::algo::vegas_options v;
  v.initial_limit = 20;
  rein::algo::vegas va{v};
  v.min_limit = 30;
  v.initial_limit = 30;
  va.set_options(v);
  CHECK(va.limit() == 30.0);
  CHECK(va.min_limit() == 30.0);

  rein::algo::windowed_aimd_options w;
  w.initial_limit = 20;
  rein::algo::windowed_aimd wa{w};
  w.max_limit = 12;
  w.initial_limit = 12;
  wa.set_options(w);
  CHECK(wa.limit() == 12.0);
  w.window = 0;
  CHECK_THROWS_WITH(wa.set_options(w), "rein::algo::windowed_aimd: window must be >= 1, got 0");

  rein::algo::pid_options p;
  p.initial_limit = 1;
  p.window = 1;
  p.slow_start = false;
  rein::algo::pid pa{p};
  // Windows of a round trip (the calls the limit admits): 1, 3, 4 and 5 samples.
  for (int i = 0; i < 13; ++i) pa.on_sample({1ms, outcome::success, 64, time_point(std::chrono::seconds(i))});
  double four_windows = 0.0;  // each window's error: target 0.05 - failure rate 0
  for (int i = 0; i < 4; ++i) four_windows += 0.05;
  CHECK(pa.integral() == four_windows);
  p.integral_limit = 0.1;
  pa.set_options(p);
  CHECK(pa.integral() == 0.1);
  CHECK(pa.limit() == Approx(6.0).margin(1e-12));  // 1 + 1 + 20 x 0.2
  p.max_limit = 5;
  p.initial_limit = 5;
  pa.set_options(p);
  CHECK(pa.limit() == 5.0);
}
