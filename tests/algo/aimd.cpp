// rein::algo::aimd: the textbook rule's acceptance cases (growth, cuts, floor, ceiling, latency target).
#include <rein/algo/aimd.hpp>
#include <rein/algo/gradient.hpp>
#include <rein/algo/limit_algorithm.hpp>
#include <rein/algo/pid.hpp>
#include <rein/algo/tuned_aimd.hpp>
#include <rein/algo/vegas.hpp>
#include <rein/algo/windowed_aimd.hpp>

#include "support/catch.hpp"

#include <chrono>
#include <cstdint>
#include <limits>
#include <ratio>
#include <type_traits>
#include <cstdio>
#include <stdexcept>
#include <string>

using namespace std::chrono_literals;
using rein::outcome;
using rein::algo::aimd;
using rein::algo::aimd_options;
using rein::algo::sample;

static_assert(rein::algo::limit_algorithm<rein::algo::aimd>);
static_assert(rein::algo::limit_algorithm<rein::algo::tuned_aimd>);
static_assert(rein::algo::limit_algorithm<rein::algo::windowed_aimd>);
static_assert(rein::algo::limit_algorithm<rein::algo::pid>);
static_assert(rein::algo::limit_algorithm<rein::algo::gradient>);
static_assert(rein::algo::limit_algorithm<rein::algo::vegas>);

namespace {

// Each sample ends 10 ms after the previous one and took 5 ms, so it started after every earlier cut;
// `in_flight` 64: the limiter was full when it was granted (the growth guard does not bind).
sample::time_point next_end() {
  static sample::time_point t{};
  t += 10ms;
  return t;
}
sample fast() { return sample{5ms, outcome::success, 64, next_end()}; }
sample failure() { return sample{5ms, outcome::congestion, 64, next_end()}; }
sample ignored() { return sample{5ms, outcome::ignored, 64, next_end()}; }
sample taking(std::chrono::nanoseconds latency) { return sample{latency, outcome::success, 64, next_end()}; }

std::string two_decimals(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

aimd make(double min, double initial, double max, double backoff = 0.75) {
  aimd_options o;
  o.min_limit = min;
  o.initial_limit = initial;
  o.max_limit = max;
  o.backoff = backoff;
  o.latency_target = 20ms;
  o.learn_failure_rate = false;  // every congestion outcome cuts: the rule these cases pin down
  return aimd{o};
}

}  // namespace

TEST_CASE("aimd: from 4, one round of fast successes takes the limit past 5; a lone failure is no congestion "
          "until a run of them is, and with the rate not learned one failure takes 20% off") {
  aimd a{};  // initial 4, floor 1, ceiling 64, backoff 0.8, learn_failure_rate
  REQUIRE(a.limit() == 4.0);
  for (int i = 0; i < 4; ++i) a.on_sample(fast());
  REQUIRE(a.limit() < 5.0);  // four calls are one round at a limit of 4: +1/4, +1/4.25, ...
  a.on_sample(fast());
  REQUIRE(a.limit() == Approx(5.123863972061165).margin(1e-12));
  REQUIRE(a.increases() == 5);
  aimd textbook = a;
  const double before = a.limit();
  // Of the last n <= 50 outcomes, a failure counts past 0.15 n + 3 sqrt(0.15 n): with 5 successes first,
  // the 6th failure in a row is the first over (6 of 11 > 1.65 + 3.85; 5 of 10 < 1.5 + 3.67), and it cuts.
  for (int i = 0; i < 5; ++i) a.on_sample(failure());
  REQUIRE(a.limit() == before);
  REQUIRE(a.decreases() == 0);
  a.on_sample(failure());
  REQUIRE(a.limit() == before * 0.8);
  REQUIRE(a.decreases() == 1);

  aimd_options o = textbook.get_options();
  o.learn_failure_rate = false;
  textbook.set_options(o);
  textbook.on_sample(failure());
  REQUIRE(textbook.limit() == before * 0.8);
  REQUIRE(textbook.decreases() == 1);
}

TEST_CASE("aimd: 200 fast successes take 8 to 21.56, five congestion samples, each counted, take it to 5.12") {
  aimd a = make(2, 8, 32);
  for (int i = 0; i < 200; ++i) a.on_sample(fast());
  REQUIRE(two_decimals(a.limit()) == "21.56");
  REQUIRE(a.decreases() == 0);
  for (std::uint64_t i = 1; i <= 5; ++i) {
    const double before = a.limit();
    a.on_sample(failure());
    REQUIRE(a.limit() == before * 0.75);
    REQUIRE(a.decreases() == i);
  }
  REQUIRE(two_decimals(a.limit()) == "5.12");
}

TEST_CASE("aimd: at the ceiling, successes keep the limit there and count as nothing") {
  aimd a = make(1, 21, 21);
  for (int i = 0; i < 5; ++i) a.on_sample(fast());
  REQUIRE(a.limit() == 21.0);
  REQUIRE(a.increases() == 0);
  REQUIRE(a.decreases() == 0);
}

TEST_CASE("aimd: ignored outcomes change nothing; one congestion sample at 20 with backoff 0.9 gives 18") {
  aimd a = make(1, 20, 64, 0.9);
  for (int i = 0; i < 5; ++i) a.on_sample(ignored());
  REQUIRE(a.limit() == 20.0);
  REQUIRE(a.increases() == 0);
  a.on_sample(failure());
  REQUIRE(a.limit() == 18.0);
}

TEST_CASE("aimd: at the floor a congestion sample leaves the limit and is not a decrease") {
  aimd a = make(5, 5, 64);
  a.on_sample(failure());
  REQUIRE(a.limit() == 5.0);
  REQUIRE(a.decreases() == 0);
}

TEST_CASE("aimd: a success slower than the target is congestion; one exactly at the target is not") {
  aimd a = make(1, 10, 64);
  a.on_sample(taking(20ms));
  REQUIRE(a.limit() == 10.1);
  a.on_sample(taking(20ms + 1ns));
  REQUIRE(a.limit() == 10.1 * 0.75);
}

TEST_CASE("aimd: with latency_tolerance unset and no latency target only congestion outcomes cut") {
  aimd_options o;
  o.latency_tolerance = std::nullopt;  // the textbook rule
  aimd a{o};
  a.on_sample(taking(5ms));
  a.on_sample(taking(10s));
  REQUIRE(a.limit() == 4.25 + 1 / 4.25);
  REQUIRE(a.decreases() == 0);
}

TEST_CASE("aimd: with latency_tolerance a success slower than that x the fastest of the last 200 is congestion") {
  aimd_options o;
  o.latency_tolerance = 1.75;
  aimd a{o};
  a.on_sample(taking(10ms));
  a.on_sample(taking(17500us));  // exactly 1.75 x: not congestion
  REQUIRE(a.decreases() == 0);
  const double before = a.limit();
  a.on_sample(taking(17501us));
  REQUIRE(a.limit() == before * 0.8);
  for (int i = 0; i < 200; ++i) a.on_sample(taking(15ms));  // the 10 ms call ages out of the 200
  REQUIRE(a.decreases() == 1);
  a.on_sample(taking(26250us));  // 1.75 x 15 ms: the fastest is now 15 ms
  REQUIRE(a.decreases() == 1);
  a.on_sample(taking(26251us));
  REQUIRE(a.decreases() == 2);
}

TEST_CASE("aimd: congestion from calls that started before the latest cut cuts once per round trip") {
  aimd a = make(1, 16, 64, 0.5);
  const sample::time_point t{1s};
  a.on_sample(sample{10ms, outcome::congestion, 16, t});
  REQUIRE(a.limit() == 8.0);
  a.on_sample(sample{10ms, outcome::congestion, 16, t + 9ms});  // started at t - 1 ms: under the old limit
  a.on_sample(sample{30ms, outcome::success, 16, t + 9ms});    // slower than the target, same story
  REQUIRE(a.limit() == 8.0);
  REQUIRE(a.decreases() == 1);
  a.on_sample(sample{10ms, outcome::congestion, 8, t + 10ms});  // started exactly at the cut
  REQUIRE(a.limit() == 4.0);
  REQUIRE(a.decreases() == 2);
}

TEST_CASE("aimd: a success lifts the limit at most to max(n + 1, n / 0.85) of the n calls out at its grant") {
  aimd a = make(1, 4, 64);
  for (int i = 0; i < 50; ++i) a.on_sample(sample{5ms, outcome::success, 4, next_end()});
  REQUIRE(a.limit() == 5.0);  // 4 calls out tested 4: one more is the probe, no further
  for (int i = 0; i < 200; ++i) a.on_sample(sample{5ms, outcome::success, 17, next_end()});
  REQUIRE(a.limit() == 20.0);  // 17 / 0.85
  a.on_sample(sample{5ms, outcome::success, 2, next_end()});
  REQUIRE(a.limit() == 20.0);  // a call granted while the limiter was barely used never lowers it
  aimd_options textbook;
  textbook.min_utilisation = 0;
  aimd unguarded{textbook};
  for (int i = 0; i < 50; ++i) unguarded.on_sample(sample{5ms, outcome::success, 1, next_end()});
  REQUIRE(unguarded.limit() > 10.0);
}

TEST_CASE("aimd: the increase option scales the additive step") {
  aimd_options o;
  o.increase = 2.0;
  aimd a{o};
  a.on_sample(fast());
  REQUIRE(a.limit() == 4.5);
}

TEST_CASE("aimd: by default a success slower than 1.75 x the fastest and 0.5 ms above it cuts by 0.8") {
  aimd a{};
  REQUIRE(a.get_options().latency_tolerance == 1.75);
  REQUIRE(a.get_options().noise_floor == 500us);
  a.on_sample(fast());  // 5 ms: the fastest; 4 + 1/4
  REQUIRE(a.limit() == 4.25);
  a.on_sample(taking(8750us));  // exactly 1.75 x 5 ms (5.5 ms is the floor's): not slow
  REQUIRE(a.decreases() == 0);
  const double before = a.limit();
  a.on_sample(taking(8751us));
  REQUIRE(a.limit() == before * 0.8);
  REQUIRE(a.decreases() == 1);
}

TEST_CASE("aimd: on a fast path a success is slow only when also more than noise_floor above the fastest") {
  // Fastest 200 us: 1.75 x is 350 us, the floor's 200 + 500 = 700 us.
  aimd a{};
  a.on_sample(taking(200us));
  a.on_sample(taking(700us));  // 3.5 x the fastest, but jitter within the floor
  REQUIRE(a.decreases() == 0);
  const double before = a.limit();
  a.on_sample(taking(701us));
  REQUIRE(a.limit() == before * 0.8);
  // Without the floor, 1.75 x alone: 351 us is slow.
  aimd_options o;
  o.noise_floor = 0ns;
  aimd b{o};
  b.on_sample(taking(200us));
  b.on_sample(taking(350us));
  REQUIRE(b.decreases() == 0);
  b.on_sample(taking(351us));
  REQUIRE(b.decreases() == 1);
}

namespace {
// A congestion outcome of a call granted with `in_flight` calls out.
sample refused_at(std::size_t in_flight) { return sample{5ms, outcome::congestion, in_flight, next_end()}; }

aimd loss_only(double initial) {
  aimd_options o;
  o.latency_tolerance = std::nullopt;
  o.initial_limit = initial;
  o.learn_failure_rate = false;
  return aimd{o};
}

// Successes until the limit passes `level`; returns how many of them found it at `level` exactly.
int grow_past(aimd& a, double level) {
  int at_level = 0;
  while (a.limit() <= level) {
    a.on_sample(fast());
    if (a.limit() == level) ++at_level;
  }
  return at_level;
}
}  // namespace

TEST_CASE("aimd: a cut at the level the cut before found waits a call below it, 1, 3, 7, ... 31 round trips") {
  aimd a = loss_only(9);
  a.on_sample(refused_at(9));  // a new level: plain AIMD
  REQUIRE(a.limit() == 9 * 0.8);
  REQUIRE(a.waiting() == 0.0);
  REQUIRE(grow_past(a, 8.0) == 0);
  for (const double rounds : {1.0, 3.0, 7.0, 15.0, 31.0, 31.0}) {
    grow_past(a, 8.99);  // back to 9 calls, which fail again
    a.on_sample(refused_at(9));
    INFO(rounds);
    REQUIRE(a.waiting() == rounds * 8);  // a round trip is 8 successes at the plateau of 8
    // It lands on 8, then holds there for the wait, then grows on as before.
    REQUIRE(grow_past(a, 8.0) == static_cast<int>(rounds * 8) + 1);
    REQUIRE(a.limit() == 8.125);
    REQUIRE(a.waiting() == 0.0);
  }
}

TEST_CASE("aimd: a cut at a new level waits nothing, and plateau_rounds 0 never waits (the textbook rule)") {
  aimd a = loss_only(9);
  a.on_sample(refused_at(9));
  grow_past(a, 8.99);
  a.on_sample(refused_at(9));
  REQUIRE(a.waiting() == 8.0);
  grow_past(a, 11.99);
  a.on_sample(refused_at(12));  // the capacity rose: the level is new
  REQUIRE(a.waiting() == 0.0);
  a.on_sample(refused_at(7));  // the call was granted with 7 out: the level is 7, not the limit's 9
  REQUIRE(a.waiting() == 0.0);
  a.on_sample(refused_at(7));
  REQUIRE(a.waiting() == 6.0);  // one round trip at 6

  aimd_options o;
  o.latency_tolerance = std::nullopt;
  o.initial_limit = 9;
  o.plateau_rounds = 0;
  o.learn_failure_rate = false;
  aimd b{o};
  for (int i = 0; i < 3; ++i) {
    b.on_sample(refused_at(9));
    REQUIRE(b.waiting() == 0.0);
    REQUIRE(grow_past(b, 8.0) == 0);
    grow_past(b, 8.99);
  }
}

TEST_CASE("aimd: set_options cuts a wait under way to the new plateau_rounds") {
  aimd a = loss_only(9);
  for (int i = 0; i < 3; ++i) {
    a.on_sample(refused_at(9));
    grow_past(a, 8.99);
  }
  a.on_sample(refused_at(9));
  REQUIRE(a.waiting() == 7.0 * 8);
  aimd_options o = a.get_options();
  o.plateau_rounds = 2;
  a.set_options(o);
  REQUIRE(a.waiting() == 2.0 * 8);
  o.plateau_rounds = 0;
  a.set_options(o);
  REQUIRE(a.waiting() == 0.0);
  REQUIRE(grow_past(a, 8.0) == 0);
}

TEST_CASE("level_memory: counts the cuts in a row that found the same level within a call") {
  rein::algo::detail::level_memory m;
  REQUIRE(m.found(9) == 0);
  REQUIRE(m.found(9.5) == 1);
  REQUIRE(m.found(8.6) == 2);  // within a call of 9.5
  REQUIRE(m.found(12) == 0);
  REQUIRE(m.level() == 12.0);
  REQUIRE(m.repeats() == 0);
}

TEST_CASE("aimd: invalid options throw std::invalid_argument naming the type, field and value") {
  auto message = [](aimd_options o) -> std::string {
    try {
      aimd a{o};
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no exception";
  };
  aimd_options o;
  o.backoff = 1.5;
  REQUIRE(message(o) == "rein::algo::aimd: backoff must be in (0, 1), got 1.5");
  o = {};
  o.backoff = 0.0;
  REQUIRE(message(o) == "rein::algo::aimd: backoff must be in (0, 1), got 0");
  o = {};
  o.min_limit = 0;
  REQUIRE(message(o) == "rein::algo::aimd: min_limit must be a whole number >= 1, got 0");
  o = {};
  o.min_limit = 1.5;
  REQUIRE(message(o) == "rein::algo::aimd: min_limit must be a whole number >= 1, got 1.5");
  o = {};
  o.max_limit = 0.5;
  REQUIRE(message(o) == "rein::algo::aimd: max_limit must be a whole number in [min_limit, 1e9] = [1, 1e9], got 0.5");
  o = {};
  o.initial_limit = 65;
  REQUIRE(message(o) == "rein::algo::aimd: initial_limit must be in [min_limit, max_limit] = [1, 64], got 65");
  o = {};
  o.increase = -1;
  REQUIRE(message(o) == "rein::algo::aimd: increase must be > 0 and finite, got -1");
  o = {};
  o.latency_target = -5ms;
  REQUIRE(message(o) == "rein::algo::aimd: latency_target must be > 0, got -5000000 ns");
  o = {};
  o.latency_tolerance = 1.0;
  REQUIRE(message(o) == "rein::algo::aimd: latency_tolerance must be > 1 and finite, got 1");
  o = {};
  o.noise_floor = -1ns;
  REQUIRE(message(o) == "rein::algo::aimd: noise_floor must be >= 0, got -1 ns");
  o = {};
  o.noise_floor = 0ns;
  REQUIRE(message(o) == "no exception");
  o = {};
  o.plateau_rounds = -1;
  REQUIRE(message(o) == "rein::algo::aimd: plateau_rounds must be >= 0 and finite, got -1");
  o = {};
  o.initial_limit = std::numeric_limits<double>::quiet_NaN();
  REQUIRE(message(o) == "rein::algo::aimd: initial_limit must be in [min_limit, max_limit] = [1, 64], got nan");
}

TEST_CASE("aimd: a ceiling beyond 1e9 or beyond any integer is refused, not converted") {
  auto message = [](double max) -> std::string {
    aimd_options o;
    o.max_limit = max;
    try {
      aimd a{o};
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no exception";
  };
  // 1e20 is a whole number, but beyond std::int64_t: the check must not convert it (undefined behaviour).
  REQUIRE(message(1e20) == "rein::algo::aimd: max_limit must be a whole number in [min_limit, 1e9] = [1, 1e9], got 1e+20");
  REQUIRE(message(1e9 + 1) == "rein::algo::aimd: max_limit must be a whole number in [min_limit, 1e9] = [1, 1e9], got 1000000001");
  REQUIRE(message(std::numeric_limits<double>::infinity()) ==
          "rein::algo::aimd: max_limit must be a whole number in [min_limit, 1e9] = [1, 1e9], got inf");
  REQUIRE(message(-1e300) == "rein::algo::aimd: max_limit must be a whole number in [min_limit, 1e9] = [1, 1e9], got -1e+300");
  aimd_options o;
  o.max_limit = 1e9;
  REQUIRE(aimd{o}.max_limit() == 1e9);
  o.min_limit = 1e20;
  o.initial_limit = 1e20;
  try {
    aimd a{o};
    FAIL("no exception");
  } catch (const std::invalid_argument& e) {
    REQUIRE(std::string{e.what()} == "rein::algo::aimd: max_limit must be a whole number in [min_limit, 1e9] = [1e+20, 1e9], got 1e+09");
  }
}

TEST_CASE("admitted: a fractional limit admits its whole part") {
  REQUIRE(rein::algo::admitted(4.99) == 4);
  REQUIRE(rein::algo::admitted(5.0) == 5);
  REQUIRE(rein::algo::admitted(0.5) == 0);
}

namespace {
struct other_clock {
  using rep = std::int64_t;
  using period = std::nano;
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::time_point<other_clock>;
  [[maybe_unused]] static constexpr bool is_steady = true;
  static time_point now() noexcept { return time_point{}; }
};
}  // namespace

TEST_CASE("aimd: rebinding the clock keeps the options type") {
  using rebound = aimd::rebind_clock<other_clock>;
  static_assert(std::is_same_v<rebound::options, aimd::options>);
  static_assert(std::is_same_v<rebound::sample_type::time_point, other_clock::time_point>);
  rebound a{aimd_options{}};
  a.on_sample(rebound::sample_type{5ms, outcome::success, 4, other_clock::time_point{}});
  REQUIRE(a.limit() == 4.25);
}
