// rein/algo/pacing_margin.hpp: the margin learned from refusals, exact on explicit times.
#include "support/catch.hpp"

#include <rein/algo/pacing_margin.hpp>

#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace {

using namespace std::chrono_literals;
using margin_type = rein::algo::pacing_margin;
using time_point = margin_type::time_point;

const time_point t0{};

std::string message_of(const rein::algo::pacing_margin_options& o) {
  try {
    margin_type m(o, t0);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no exception)";
}

}  // namespace

TEST_CASE("pacing margin: none until a refusal, then step, growing per fresh refusal", "[pacing_margin]") {
  margin_type m({}, t0);
  CHECK(m.margin(t0 + 1h) == 0.0);
  CHECK(m.paced_rate(20, t0) == 20.0);
  CHECK(m.on_refused(t0 + 1s, t0 + 1s));
  CHECK(m.margin(t0 + 1s) == 1.0 / 32);
  CHECK(m.paced_rate(33, t0 + 1s) == 32.0);  // 33 / (1 + 1/32)
  // A refusal of a send from before the widening reports on the old pace: stale.
  CHECK_FALSE(m.on_refused(t0 + 999ms, t0 + 1100ms));
  CHECK(m.stale_refusals() == 1);
  CHECK(m.margin(t0 + 1100ms) == Approx(1.0 / 32 * std::exp2(-0.1 / 60)).epsilon(1e-15));
  // A fresh one grows the margin as it is then (decayed a little) by 1.5.
  CHECK(m.on_refused(t0 + 2s, t0 + 2s));
  CHECK(m.margin(t0 + 2s) == 1.5 * ((1.0 / 32) * std::exp2(-1.0 / 60)));
  CHECK(m.widenings() == 2);
}

TEST_CASE("pacing margin: halves every half-life, never below initial", "[pacing_margin]") {
  margin_type m({.initial = 1.0 / 64, .step = 1.0 / 16, .half_life = 10s}, t0);
  CHECK(m.margin(t0) == 1.0 / 64);
  CHECK(m.on_refused(t0, t0 + 5s));
  CHECK(m.margin(t0 + 5s) == 1.0 / 16);  // the step: twice 1/64 is below it
  CHECK(m.margin(t0 + 15s) == 1.0 / 32);
  CHECK(m.margin(t0 + 25s) == 1.0 / 64);
  CHECK(m.margin(t0 + 35s) == 1.0 / 64);  // the floor
}

TEST_CASE("pacing margin: held at max, where a refusal restarts its decay", "[pacing_margin]") {
  margin_type m({.step = 0.25, .max = 0.5, .growth = 2, .half_life = 1s}, t0);
  CHECK(m.on_refused(t0, t0));
  CHECK(m.margin(t0) == 0.25);
  CHECK(m.on_refused(t0, t0));  // sent at the widening: not before it
  CHECK(m.margin(t0) == 0.5);
  CHECK_FALSE(m.on_refused(t0, t0));  // at max: not widened
  CHECK(m.widenings() == 2);
  CHECK(m.margin(t0 + 500ms) == 0.5 * std::exp2(-0.5));
  CHECK(m.on_refused(t0 + 500ms, t0 + 500ms));  // back to max, and its decay starts again from 500 ms
  CHECK(m.margin(t0 + 1500ms) == 0.25);
  CHECK(m.widenings() == 3);
}

TEST_CASE("pacing margin: max 0 turns it off", "[pacing_margin]") {
  margin_type m({.step = 0, .max = 0}, t0);  // step and initial are not used: not checked
  CHECK_FALSE(m.on_refused(t0, t0));
  CHECK(m.margin(t0 + 1s) == 0.0);
  CHECK(m.widenings() == 0);
}

TEST_CASE("pacing margin: readings as far apart as time_point::min() and max() saturate", "[pacing_margin]") {
  // Under UBSan: the time since the latest widening overflowed from min() to any later reading.
  margin_type early({}, time_point::min());
  CHECK(early.on_refused(time_point::min(), time_point::min()));
  CHECK(early.margin(time_point::min()) == 1.0 / 32);
  CHECK(early.margin(time_point{}) == 0.0);  // more than 2^63 ns of half-lives later: forgotten
  CHECK(early.margin(time_point::max()) == 0.0);
  // A reading before the latest widening is taken at it.
  margin_type late({.initial = 1.0 / 64}, time_point::max());
  CHECK(late.margin(time_point::min()) == 1.0 / 64);
  CHECK(late.on_refused(time_point::max(), time_point::max()));
  CHECK(late.margin(time_point::min()) == 1.0 / 32);  // 1/64 grown to at least a step
}

TEST_CASE("pacing margin: bad options name the field and the value", "[pacing_margin][errors]") {
  constexpr double nan = std::numeric_limits<double>::quiet_NaN();
  CHECK(message_of({.initial = -0.5}) == "rein::algo::pacing_margin: initial must be in [0, max], got -0.5");
  CHECK(message_of({.initial = 2}) == "rein::algo::pacing_margin: initial must be in [0, max], got 2");
  CHECK(message_of({.step = 0}) == "rein::algo::pacing_margin: step must be in (0, max], got 0");
  CHECK(message_of({.step = nan}) == "rein::algo::pacing_margin: step must be in (0, max], got nan");
  CHECK(message_of({.max = 9}) ==
        "rein::algo::pacing_margin: max must be in [0, 8] (a share of the pacing interval), got 9");
  CHECK(message_of({.max = nan}) ==
        "rein::algo::pacing_margin: max must be in [0, 8] (a share of the pacing interval), got nan");
  CHECK(message_of({.half_life = 0s}) == "rein::algo::pacing_margin: half_life must be > 0, got 0 ns");
  CHECK(message_of({.growth = 1}) == "rein::algo::pacing_margin: growth must be in (1, 4], got 1");
  CHECK(message_of({.growth = nan}) == "rein::algo::pacing_margin: growth must be in (1, 4], got nan");
}
