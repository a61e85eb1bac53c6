// rein::algo::tuned_aimd: its acceptance cases (baseline, one cut per round trip, growth guard) and a trace replay.
#include <rein/algo/aimd.hpp>
#include <rein/algo/tuned_aimd.hpp>

#include "support/catch.hpp"

#include <chrono>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

using namespace std::chrono_literals;
using rein::outcome;
using rein::algo::sample;
using rein::algo::tuned_aimd;
using rein::algo::tuned_aimd_options;
using time_point = sample::time_point;

namespace {

time_point at(std::chrono::nanoseconds t) { return time_point{} + t; }

sample ok(std::chrono::nanoseconds latency, std::chrono::nanoseconds now, std::size_t in_flight = 64) {
  return sample{latency, outcome::success, in_flight, at(now)};
}

sample congestion(std::chrono::nanoseconds latency, std::chrono::nanoseconds now) {
  return sample{latency, outcome::congestion, 1, at(now)};
}

// The cases built on it test how a cut is made, so every congestion outcome counts (the textbook rule,
// `learn_failure_rate` false): by default a lone failure is no burst (`detail::failure_baseline::min_rate`).
tuned_aimd make(double initial, double backoff = 0.5) {
  tuned_aimd_options o;
  o.initial_limit = initial;
  o.backoff = backoff;
  o.learn_failure_rate = false;
  return tuned_aimd{o};
}

}  // namespace

TEST_CASE("tuned_aimd: five congestion samples inside one round trip cut once, 11 to 9.9") {
  tuned_aimd t = make(11, 0.9);
  for (int i = 0; i < 5; ++i) t.on_sample(congestion(10ms, 100ms + i * 1ms));  // all started before 100 ms
  REQUIRE(t.limit() == 9.9);
  REQUIRE(t.decreases() == 1);
  REQUIRE(t.held() == 4);
}

TEST_CASE("tuned_aimd: congestion from a call that started after the last cut cuts again") {
  tuned_aimd t = make(16);
  t.on_sample(congestion(10ms, 100ms));
  REQUIRE(t.limit() == 8.0);
  t.on_sample(congestion(10ms, 109ms));  // started at 99 ms, under the old limit
  REQUIRE(t.limit() == 8.0);
  t.on_sample(congestion(10ms, 110ms));  // started at 100 ms, exactly at the cut: the new limit's call
  REQUIRE(t.limit() == 4.0);
  REQUIRE(t.decreases() == 2);
  REQUIRE(t.held() == 1);
}

TEST_CASE("tuned_aimd: a slow call cuts by the calls queued ahead of it, at least one, at most half") {
  tuned_aimd t = make(20);
  for (int i = 0; i < 3; ++i) t.on_sample(ok(5ms, 1ms * i, 20));
  REQUIRE(t.limit() == 21.0);  // the third success makes a baseline, and slow start adds one
  t.on_sample(ok(10ms, 100ms, 20));  // 10 / 5 - 1 = one call queued ahead of it: 20 out were one too many
  REQUIRE(t.limit() == 19.0);
  REQUIRE_FALSE(t.in_slow_start());
  t.on_sample(ok(80ms, 110ms, 20));  // started before the cut: held
  REQUIRE(t.limit() == 19.0);
  REQUIRE(t.held() == 1);
  t.on_sample(ok(80ms, 200ms, 19));  // 15 queued ahead, but one round trip cuts at most by half
  REQUIRE(t.limit() == 9.5);
  REQUIRE(t.decreases() == 2);
}

TEST_CASE("tuned_aimd: a fixed hold ignores congestion for 40 ms after a cut") {
  tuned_aimd_options o;
  o.initial_limit = 16;
  o.backoff = 0.75;
  o.hold = 40ms;
  o.learn_failure_rate = false;  // every congestion outcome counts: the case is about the hold
  tuned_aimd t{o};
  t.on_sample(congestion(5ms, 100ms));
  REQUIRE(t.limit() == 12.0);
  t.on_sample(congestion(5ms, 120ms));  // within 40 ms: ignored, though it started after the cut
  REQUIRE(t.limit() == 12.0);
  REQUIRE(t.held() == 1);
  t.on_sample(congestion(5ms, 141ms));  // after 40 ms: a second cut
  REQUIRE(t.limit() == 9.0);
}

TEST_CASE("tuned_aimd: no judgement and no growth before three successes, then the fastest tenth decides") {
  tuned_aimd t = make(16);
  t.on_sample(ok(5ms, 1ms));
  t.on_sample(ok(5ms, 2ms));
  REQUIRE_FALSE(t.baseline().has_value());
  REQUIRE(t.limit() == 16.0);  // nothing is known yet that could tell a slow call
  t.on_sample(ok(100ms, 20ms));  // third success: not judged, it joins the baseline and slow start adds one
  REQUIRE(*t.baseline() == 5e6);  // the nearest-rank 10th percentile of {5, 5, 100} ms
  REQUIRE(t.decreases() == 0);
  REQUIRE(t.limit() == 17.0);
  t.on_sample(ok(100ms, 200ms));  // 100 > 1.5 x 5: 19 queued ahead, so half
  REQUIRE(t.limit() == 8.5);
}

TEST_CASE("tuned_aimd: congestion outcomes cut before any baseline exists, and stay out of it") {
  tuned_aimd t = make(16);
  t.on_sample(congestion(5ms, 10ms));
  REQUIRE(t.limit() == 8.0);
  REQUIRE_FALSE(t.baseline().has_value());
}

TEST_CASE("tuned_aimd: a success at exactly baseline x tolerance is not congestion") {
  tuned_aimd t = make(16);
  for (int i = 0; i < 10; ++i) t.on_sample(ok(10ms, 1ms * i));
  const double before = t.limit();
  t.on_sample(ok(15ms, 20ms));  // baseline 10 ms x 1.5
  REQUIRE(t.limit() > before);
  REQUIRE(t.decreases() == 0);
}

TEST_CASE("tuned_aimd: on a fast path a success is congestion only when also more than noise_floor above the baseline") {
  // Baseline 200 us: 1.5 x is 300 us, the floor's 200 + 500 = 700 us.
  for (const auto floor : {500us, 0us}) {
    tuned_aimd_options o;
    o.initial_limit = 16;
    o.noise_floor = floor;
    tuned_aimd t{o};
    REQUIRE(tuned_aimd{}.get_options().noise_floor == 500us);
    for (int i = 0; i < 10; ++i) t.on_sample(ok(200us, 1ms * i));
    REQUIRE(t.limit() == 24.0);  // slow start: one call per success from the third
    t.on_sample(ok(600us, 20ms));  // 3 x the baseline
    INFO(floor.count());
    if (floor == 500us) {
      REQUIRE(t.decreases() == 0);
      REQUIRE(t.limit() == 25.0);
      t.on_sample(ok(701us, 30ms));
      REQUIRE(t.decreases() == 1);
    } else {
      REQUIRE(t.decreases() == 1);
      REQUIRE(t.limit() == 22.0);  // 24 - floor(600 / 200 - 1): two calls were queued ahead
    }
  }
}

TEST_CASE("tuned_aimd: a success lifts the limit at most to max(n + 1, n / 0.85) of the n calls out at its grant") {
  tuned_aimd t = make(4);
  for (int i = 0; i < 10; ++i) t.on_sample(ok(5ms, 1ms * i, 4));
  REQUIRE(t.limit() == 5.0);  // 4 out tested 4: one more is the probe, no further
  t.on_sample(ok(5ms, 20ms, 5));
  REQUIRE(t.limit() == 6.0);
  for (int i = 0; i < 30; ++i) t.on_sample(ok(5ms, 30ms + 1ms * i, 17));
  REQUIRE(t.limit() == 20.0);  // slow start stops at 17 / 0.85
  t.on_sample(ok(5ms, 80ms, 2));
  REQUIRE(t.limit() == 20.0);  // a call granted while the limiter was barely used never lowers it
}

TEST_CASE("tuned_aimd: after slow start the growth guard's ceiling is rounded up to a whole call") {
  tuned_aimd t = make(20);
  for (int i = 0; i < 3; ++i) t.on_sample(ok(5ms, 1ms * i, 20));
  t.on_sample(ok(100ms, 100ms, 20));  // cut by half, to 10; 19 is the level to search back to
  REQUIRE(t.limit() == 10.0);
  REQUIRE_FALSE(t.in_slow_start());
  for (int i = 0; i < 20; ++i) t.on_sample(ok(5ms, 200ms + 1ms * i, 9));
  CHECK(t.limit() == 11.0);  // granted with 9 out: ceil(9 / 0.85) = ceil(10.59); it admitted 10 before
}

TEST_CASE("tuned_aimd: min_utilisation 0.8 does not freeze a limit whose floor is below its 80 %") {
  // Comparing in_flight with 0.8 x limit would: a limit of 1.9 admits 1 call, and 1 < 1.52.
  tuned_aimd_options o;
  o.initial_limit = 1.9;
  o.min_utilisation = 0.8;
  tuned_aimd t{o};
  for (int i = 0; i < 3; ++i) t.on_sample(ok(5ms, 1ms * i, 1));
  REQUIRE(t.limit() == 2.0);
}

TEST_CASE("tuned_aimd: after a cut the limit climbs back slowly, then faster every round trip") {
  tuned_aimd t = make(10);
  for (int i = 0; i < 3; ++i) t.on_sample(ok(5ms, 1ms * i, 10));
  t.on_sample(ok(10ms, 100ms, 11));  // one call queued ahead at 11 out: 10 is the level found
  REQUIRE(t.limit() == 10.0);
  // A round trip is about `limit` samples: the first adds about 0.01 calls, and the step doubles each round.
  std::chrono::nanoseconds now = 200ms;
  const auto round = [&] {
    const double before = t.limit();
    for (int i = 0; i < 10; ++i) t.on_sample(ok(5ms, now += 1ms, 11));
    return t.limit() - before;
  };
  const double first = round();
  REQUIRE(first > 0.009);
  REQUIRE(first < 0.02);
  double previous = first;
  for (int r = 0; r < 5; ++r) {
    const double step = round();
    REQUIRE(step > 1.8 * previous);
    REQUIRE(step < 2.2 * previous);
    previous = step;
  }
  REQUIRE(t.limit() < 11.0);  // six round trips later, still at the level found
}

TEST_CASE("tuned_aimd: after a deep cut the limit returns to the level found within a few round trips") {
  tuned_aimd t = make(20);
  for (int i = 0; i < 3; ++i) t.on_sample(ok(5ms, 1ms * i, 20));
  t.on_sample(ok(100ms, 100ms, 20));  // 19 queued ahead (as a stall looks) with 20 out: cut by half, to 10
  REQUIRE(t.limit() == 10.0);
  std::chrono::nanoseconds now = 200ms;
  const auto round = [&] {
    const int n = static_cast<int>(t.limit());
    for (int i = 0; i < n; ++i) t.on_sample(ok(5ms, now += 1ms, 64));
    return t.limit();
  };
  // Half the way back to 19 (the level below the slow call's) each round trip, at least one call, and not
  // past it: halving alone crept the last call at 0.01 a round trip.
  REQUIRE(round() < 15.0);
  int rounds = 1;
  while (t.limit() < 19.0 && rounds < 10) round(), ++rounds;
  REQUIRE(rounds == 6);  // about 10, 14.5, 16.75, 17.9, 18.9, 19 (halving alone: 18.5 after six)
  REQUIRE(t.limit() < 19.01);  // from there the probe starts at `increase`
}

TEST_CASE("tuned_aimd: a probe that finds the level the last one found makes the next plateau a round trip longer") {
  tuned_aimd t = make(10);
  for (int i = 0; i < 3; ++i) t.on_sample(ok(5ms, 1ms * i, 10));
  std::chrono::nanoseconds now = 100ms;
  // One probe: 11 out, one queued ahead, so 10 is the level found; then the samples it takes to reach 11
  // again (about 10 a round trip), all granted with 11 out.
  const auto probe = [&](std::size_t out, std::chrono::nanoseconds latency) {
    t.on_sample(ok(latency, now += 100ms, out));
    int samples = 0;
    while (t.limit() < 11.0 && samples < 100000) t.on_sample(ok(5ms, now += 1ms, 11)), ++samples;
    return samples;
  };
  const int first = probe(11, 10ms);  // from 11: 10 is found for the first time
  const int second = probe(11, 10ms);  // 10 again: the probe starts at half the step
  const int third = probe(11, 10ms);
  CHECK(second - first >= 9);  // about one round trip (10 samples) more each time
  CHECK(second - first <= 11);
  CHECK(third - second >= 9);
  CHECK(third - second <= 11);
  int longest = third;
  for (int i = 0; i < 10; ++i) longest = probe(11, 10ms);
  CHECK(longest - first <= 75);  // at most `increase` squared: 6.6 round trips more, the plateau doubled
  CHECK(probe(11, 5ms) == 0);  // a fast sample changes nothing
  CHECK(probe(9, 10ms) < first + 20);  // 8, a new level: the full step again (from 8, not 10)
}

TEST_CASE("tuned_aimd: a probe past the level found lets one call in, then holds until that call returns") {
  tuned_aimd t = make(10);
  for (int i = 0; i < 3; ++i) t.on_sample(ok(5ms, 1ms * i, 10));
  t.on_sample(ok(10ms, 100ms, 11));  // 10 is the level found
  REQUIRE(t.limit() == 10.0);
  std::chrono::nanoseconds now = 200ms;
  // Climb (samples granted with 10 out) until the limit crosses 11: this sample's release lets the probe in.
  int samples = 0;
  while (t.limit() < 11.0 && samples < 1000) t.on_sample(ok(5ms, now += 1ms, 10)), ++samples;
  REQUIRE(t.limit() >= 11.0);
  const auto probe_sent = [&] {
    t.on_sample(ok(5ms, now += 1ms, 10));  // the next sample: the probe call is out, the limit holds at 10
    CHECK(t.limit() == 10.0);
    for (int i = 0; i < 15; ++i) t.on_sample(ok(5ms, now += 1ms, 10));  // no growth while it is out
    CHECK(t.limit() == 10.0);
  };
  SECTION("it returns fast: growth goes on, and the next probe call tests twice as far above the level") {
    probe_sent();
    t.on_sample(ok(5ms, now += 1ms, 11));
    CHECK(t.limit() >= 11.0);
    CHECK(t.decreases() == 1);
    samples = 0;
    while (t.limit() < 12.0 && samples < 1000) t.on_sample(ok(5ms, now += 1ms, 11)), ++samples;
    REQUIRE(t.limit() >= 12.0);  // 12 = 10 + 2: one call in at 12, then held at 11
    t.on_sample(ok(5ms, now += 1ms, 11));
    CHECK(t.limit() == 11.0);
    t.on_sample(ok(5ms, now += 1ms, 12));  // it returns fast: the next one tests 10 + 4
    CHECK(t.limit() >= 12.0);
    samples = 0;
    while (t.limit() < 14.0 && samples < 1000) t.on_sample(ok(5ms, now += 1ms, 12)), ++samples;
    REQUIRE(t.limit() >= 14.0);
    CHECK(samples > 0);  // 13 was not held
    t.on_sample(ok(5ms, now += 1ms, 12));
    CHECK(t.limit() == 13.0);
  }
  SECTION("it returns slow: the cut to the level, as any slow call's") {
    probe_sent();
    t.on_sample(ok(10ms, now += 1ms, 11));
    CHECK(t.limit() == 10.0);
    INFO("limit " << t.limit()); CHECK(t.decreases() == 2);
  }
  SECTION("it never returns (no call was waiting): after two round trips' worth of samples it is let in again") {
    probe_sent();
    for (int i = 0; i < 7; ++i) t.on_sample(ok(5ms, now += 1ms, 10));  // 23 samples, more than 2 x (10 + 1)
    CHECK(t.limit() >= 11.0);
    t.on_sample(ok(5ms, now += 1ms, 10));
    CHECK(t.limit() == 10.0);
  }
}

TEST_CASE("tuned_aimd: a probe call never holds the limit below min_limit") {
  tuned_aimd_options o;
  o.initial_limit = 10;
  o.min_limit = 6;
  o.learn_failure_rate = false;  // the lone congestion outcome below must cut
  tuned_aimd t{o};
  for (int i = 0; i < 3; ++i) t.on_sample(ok(5ms, 1ms * i, 10));
  t.on_sample(congestion(5ms, 10ms));  // x 0.5 = 5, below the floor: the limit stays at 6
  REQUIRE(t.limit() == 6.0);
  for (int i = 0; i < 200; ++i) {
    t.on_sample(ok(5ms, 100ms + 1ms * i, 6));
    REQUIRE(t.limit() >= 6.0);
  }
}

TEST_CASE("tuned_aimd: ignored samples change nothing and do not enter the baseline") {
  tuned_aimd t = make(16);
  for (int i = 0; i < 20; ++i) t.on_sample(sample{1s, outcome::ignored, 64, at(1ms * i)});
  REQUIRE(t.limit() == 16.0);
  REQUIRE_FALSE(t.baseline().has_value());
}

TEST_CASE("tuned_aimd: the baseline is the chosen quantile of the last `window` successes") {
  tuned_aimd_options o;
  o.window = 10;
  o.baseline_quantile = 0.5;
  tuned_aimd median{o};
  o.baseline_quantile = 0.1;
  tuned_aimd fastest{o};
  for (auto* t : {&median, &fastest}) {
    for (int i = 0; i < 10; ++i) t->on_sample(ok(5ms, 1ms * i));
    for (int i = 0; i < 5; ++i) t->on_sample(ok(7ms, 20ms + 1ms * i));  // 7 < 1.5 x 5: not slow
  }
  REQUIRE(*median.baseline() == 6e6);   // five 5 ms and five 7 ms left: (5 + 7) / 2
  REQUIRE(*fastest.baseline() == 5e6);  // the fastest of ten
  for (int i = 0; i < 5; ++i) fastest.on_sample(ok(7ms, 30ms + 1ms * i));
  REQUIRE(*fastest.baseline() == 7e6);  // every 5 ms sample has aged out
}

TEST_CASE("tuned_aimd: slow calls stay out of the baseline, except those granted at the floor") {
  tuned_aimd t = make(8);
  for (int i = 0; i < 10; ++i) t.on_sample(ok(5ms, 1ms * i, 8));
  std::chrono::nanoseconds now = 100ms;
  for (int i = 0; i < 300; ++i) t.on_sample(ok(40ms, now += 1ms, 8));  // a sustained slowdown, 8 out
  REQUIRE(*t.baseline() == 5e6);  // still 5 ms: 40 ms calls with 8 out are queueing, not normal
  REQUIRE(t.limit() == 1.0);      // one cut per round trip (40 ms), down to the floor
  for (int i = 0; i < 200; ++i) t.on_sample(ok(40ms, now += 40ms, 1));  // at the floor, one at a time
  REQUIRE(*t.baseline() == 40e6);  // 40 ms with one call out is the new normal
  REQUIRE(t.limit() > 1.0);        // and the limit grows again
}

namespace {

// One sample per millisecond, 8 calls in flight, 5 ms normally. `hiccup(k)` says whether sample k is one of
// the four calls caught by a 40 ms stall (every 100 ms, as a GC pause stalls every call in flight).
template <class Latency>
void replay(rein::algo::aimd& a, tuned_aimd& t, int from, int to, Latency latency) {
  for (int k = from; k < to; ++k) {
    const sample s = ok(latency(k), 1ms * k, 8);
    a.on_sample(s);
    t.on_sample(s);
  }
}

}  // namespace

TEST_CASE("tuned_aimd vs aimd: occasional stalls cost one cut each instead of four") {
  rein::algo::aimd_options ao;
  ao.initial_limit = 8;
  ao.latency_target = 20ms;  // the textbook rule: every slow call cuts
  ao.once_per_round_trip = false;
  rein::algo::aimd a{ao};
  tuned_aimd t = make(8);

  auto stalls = [](int k) { return k % 100 >= 50 && k % 100 < 54 ? 40ms : 5ms; };
  replay(a, t, 0, 1000, stalls);
  REQUIRE(a.decreases() == 40);  // every slow call
  REQUIRE(t.decreases() == 10);  // one per stall: the other three calls started before the cut
  REQUIRE(t.held() == 30);
}

TEST_CASE("tuned_aimd: invalid options throw std::invalid_argument naming the type, field and value") {
  auto message = [](tuned_aimd_options o) -> std::string {
    try {
      tuned_aimd t{o};
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no exception";
  };
  tuned_aimd_options o;
  o.tolerance = 0.9;
  REQUIRE(message(o) == "rein::algo::tuned_aimd: tolerance must be >= 1 and finite, got 0.9");
  o = {};
  o.noise_floor = -1ns;
  REQUIRE(message(o) == "rein::algo::tuned_aimd: noise_floor must be >= 0, got -1 ns");
  o = {};
  o.window = 2;
  REQUIRE(message(o) == "rein::algo::tuned_aimd: min_samples must be in [1, window], got 3");
  o = {};
  o.window = 0;
  REQUIRE(message(o) == "rein::algo::tuned_aimd: window must be in [1, 100000], got 0");
  // Allocated up front: a huge window must be a clear error, not std::length_error or std::bad_alloc.
  o.window = 100001;
  REQUIRE(message(o) == "rein::algo::tuned_aimd: window must be in [1, 100000], got 100001");
  o.window = std::numeric_limits<std::size_t>::max();
  REQUIRE(message(o) == "rein::algo::tuned_aimd: window must be in [1, 100000], got " +
                            std::to_string(std::numeric_limits<std::size_t>::max()));
  o.window = rein::algo::tuned_aimd_max_window;
  REQUIRE(message(o) == "no exception");
  o = {};
  o.hold = 0ms;
  REQUIRE(message(o) == "rein::algo::tuned_aimd: hold must be > 0, got 0 ns");
  o = {};
  o.min_utilisation = 1.5;
  REQUIRE(message(o) == "rein::algo::tuned_aimd: min_utilisation must be in [0, 1], got 1.5");
  o = {};
  o.backoff = 1;
  REQUIRE(message(o) == "rein::algo::tuned_aimd: backoff must be in (0, 1), got 1");
  o = {};
  o.baseline_quantile = 0;
  REQUIRE(message(o) == "rein::algo::tuned_aimd: baseline_quantile must be in (0, 1], got 0");
  o = {};
  o.min_limit = 8;
  REQUIRE(message(o) == "rein::algo::tuned_aimd: initial_limit must be in [min_limit, max_limit] = [8, 64], got 4");
}

TEST_CASE("tuned_aimd: failures at the rate seen whatever the load are not congestion; a burst above it is") {
  tuned_aimd t;
  // The first failure is no burst: the base rate is taken to be at least 15 % (`failure_baseline::min_rate`;
  // before it, the first failure ever cut by half, and on the grown family 1-5 % random failures kept 0.46-0.56
  // of the oracle's throughput in the worst seed of 100).
  for (int i = 0; i < 20; ++i) t.on_sample(ok(5ms, std::chrono::milliseconds{10 + i}, 4));
  const double before = t.limit();
  t.on_sample(congestion(5ms, 100ms));
  CHECK(t.limit() == before);
  CHECK(t.decreases() == 0);
  // Then one failure in twenty (5 %): none cuts, before or after a rate is learned.
  for (int i = 0; i < 1000; ++i) {
    const auto now = std::chrono::milliseconds{200 + 10 * i};
    t.on_sample(i % 20 == 19 ? congestion(5ms, now) : ok(5ms, now, 4));
  }
  CHECK(t.decreases() == 0);
  // Twenty failures in a row are far more than 15 % explains (16 of the last 50): congestion.
  for (int i = 0; i < 20; ++i) t.on_sample(congestion(5ms, std::chrono::milliseconds{20000 + 10 * i}));
  CHECK(t.decreases() > 0);

  tuned_aimd_options textbook;
  textbook.learn_failure_rate = false;
  tuned_aimd every{textbook};
  every.on_sample(congestion(5ms, 10ms));
  every.on_sample(congestion(5ms, 20ms));  // started after the first cut: cuts again
  CHECK(every.decreases() == 2);
}

TEST_CASE("tuned_aimd: tolerance unset switches the latency signal off; only congestion outcomes cut") {
  tuned_aimd_options o;
  o.tolerance.reset();
  o.learn_failure_rate = false;  // the lone congestion outcome below must cut
  tuned_aimd t{o};
  for (int i = 0; i < 50; ++i) t.on_sample(ok(i % 2 == 0 ? 5ms : 500ms, std::chrono::milliseconds{1000 + i}, 64));
  CHECK(t.decreases() == 0);
  CHECK(t.limit() > 4.0);
  t.on_sample(congestion(5ms, 2000ms));
  CHECK(t.decreases() == 1);
}

TEST_CASE("tuned_aimd: a work hint judges latency per unit of work; 0 is no judgement; bad hints are refused") {
  tuned_aimd t;
  for (int i = 0; i < 10; ++i) {
    sample s = ok(5ms, std::chrono::milliseconds{10 + i}, 4);
    s.work = 1.0;
    t.on_sample(s);
  }
  // Three times the work in three times the time: an ordinary call, not a queue.
  sample longer = ok(15ms, 100ms, 4);
  longer.work = 3.0;
  t.on_sample(longer);
  CHECK(t.decreases() == 0);
  // The same latency for the usual work is a queue.
  sample queued = ok(15ms, 200ms, 4);
  queued.work = 1.0;
  t.on_sample(queued);
  CHECK(t.decreases() == 1);
  // Work 0: no work to judge the latency by; the call is neither judged nor learned.
  sample empty = ok(500ms, 1000ms, 4);
  empty.work = 0.0;
  t.on_sample(empty);
  CHECK(t.decreases() == 1);
  // A tiny hint scales the latency past any duration: it saturates instead of overflowing (a float-to-int
  // cast out of range, which clang's UBSan flags), and the noise floor scales alike, so nothing is cut.
  sample tiny = ok(5ms, 5000ms, 2);
  tiny.work = 1e-300;
  t.on_sample(tiny);
  CHECK(t.decreases() == 1);
  CHECK(t.limit() == 2.5);
  const auto refused = [&](double w) {
    sample s = ok(5ms, 2000ms, 4);
    s.work = w;
    try {
      t.on_sample(s);
    } catch (const std::invalid_argument& e) {
      return std::string{e.what()};
    }
    return std::string{"no exception"};
  };
  CHECK(refused(-1.0) == "rein::algo::sample: work must be >= 0 and finite, got -1");
  CHECK(refused(std::numeric_limits<double>::quiet_NaN()).find("work must be >= 0 and finite") != std::string::npos);
  CHECK(refused(std::numeric_limits<double>::infinity()).find("work must be >= 0 and finite") != std::string::npos);
}

TEST_CASE("tuned_aimd: the noisy rule reads a wide spread at one level as noise and a doubling as a queue") {
  tuned_aimd_options o;
  o.initial_limit = 8;
  o.median_window = 200;
  tuned_aimd t{o};
  // Each call's own payload, 2 to 16 ms in steps of 2 (a fixed LCG), whatever the calls out: no queue. The
  // per-call rule cuts on the first ones (16 ms against a fastest tenth of 2 ms); once the spread within a
  // level is seen, the noisy rule forgets those cuts and grows by its step test, cutting a call now and then.
  std::chrono::milliseconds now{0};
  std::uint32_t lcg = 1;
  const auto payload = [&] {
    lcg = lcg * 1664525u + 1013904223u;
    return std::chrono::milliseconds{2 + 2 * static_cast<int>((lcg >> 16) % 8)};
  };
  for (int i = 0; i < 800; ++i) {
    now += 1ms;
    t.on_sample(ok(payload(), now, rein::algo::admitted(t.limit())));
  }
  CHECK(t.limit() >= 16.0);  // the per-call rule alone: 1
  // The same payloads, every one twice as long (a queue of one call): a cut within 30 calls.
  const std::uint64_t cuts = t.decreases();
  for (int i = 0; i < 30 && t.decreases() == cuts; ++i) {
    now += 1ms;
    t.on_sample(ok(2 * payload(), now, rein::algo::admitted(t.limit())));
  }
  CHECK(t.decreases() == cuts + 1);

  tuned_aimd per_call{tuned_aimd_options{.initial_limit = 8, .median_window = 0}};  // the noisy rule off
  lcg = 1;
  for (int i = 0; i < 800; ++i) {
    now += 1ms;
    per_call.on_sample(ok(payload(), now, rein::algo::admitted(per_call.limit())));
  }
  CHECK(per_call.limit() < 2.0);
}
