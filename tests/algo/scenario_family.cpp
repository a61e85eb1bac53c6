// The generated family of upstreams (rein/testing/scenario_family.hpp): the generator is a pure function of
// its seed, and rein's default adaptive limits are held to bounds over the family's worst case.
//
// Two tiers: seeds 1-100 (and 50 noisy ones) run in CI, about 5 s in a Debug build; seeds 1-1000 (and
// 200 noisy ones), take about 50 s in Debug (several minutes under the sanitizers) and
// are tagged [.thorough]: run them by hand with `rein_tests_algo "[thorough]"`.
// examples/adaptive_family prints the same figures as a table.
#include <rein/algo/aimd.hpp>
#include <rein/algo/circuit.hpp>
#include <rein/algo/gradient.hpp>
#include <rein/algo/pid.hpp>
#include <rein/algo/tuned_aimd.hpp>
#include <rein/algo/vegas.hpp>
#include <rein/algo/windowed_aimd.hpp>
#include <rein/testing/scenario_family.hpp>

#include "support/catch.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

using namespace rein::testing;

TEST_CASE("generate_scenario: a pure function of the seed") {
  const scenario a = generate_scenario(7), b = generate_scenario(7), c = generate_scenario(8);
  CHECK(a.description == b.description);
  CHECK(a.calls() == b.calls());
  CHECK(a.description != c.description);
  CHECK(a.name == "seed 7");
  CHECK(a.description == "capacity 11, base 16.1 ms, load 1.01, 561 calls; drop to 3 at 277 ms, back to 9 at 466 ms");
  for (std::uint64_t seed = 1; seed <= 200; ++seed) {
    const scenario s = generate_scenario(seed);
    INFO(s.name << ": " << s.description);
    for (std::size_t k = 0; k < s.keys(); ++k) {
      const upstream_key key = s.key(k);
      std::size_t highest = key.upstream.capacity;
      for (const auto& ch : key.changes) highest = std::max(highest, ch.capacity);
      CHECK(key.upstream.hard_cap >= highest + 2);  // a fixed limit at any capacity of the run never fails
      CHECK(key.upstream.capacity >= 2);
      CHECK(key.upstream.noise < 0.21);
    }
  }
}

TEST_CASE("measure_yardsticks: the oracle never queues inside the upstream; recoveries get a fixed yardstick") {
  const scenario s = generate_scenario(7);
  const yardsticks y = measure_yardsticks(s);
  REQUIRE(y.fixed_makespan.has_value());  // its capacity comes back to 9
  std::vector<yardstick_limit> oracle{yardstick_limit{s.upstream.capacity, true}};
  const report r = simulate("oracle", std::span{oracle}, s);
  CHECK(r.makespan == y.oracle_makespan);
  CHECK(r.failed == 0);
  CHECK(r.slow == 0);
}

TEST_CASE("blind_reference: starts from 4, never fails, learns the capacity from the first call over it") {
  const family f = family::generate(1, 100);
  const auto blind = [](const upstream_key& k) { return blind_reference{k}; };
  const family_summary s = evaluate("blind_reference", f, blind);
  CHECK(s.scenarios_with_failures == 0);
  CHECK(s.worst_slow < 0.028);
  CHECK(s.median_makespan < 1.036);
  const family_summary late =
      evaluate("blind_reference_late", f, [](const upstream_key& k) { return blind_reference{k, 4.0, true}; });
  CHECK(late.scenarios_with_failures == 0);
  CHECK(late.median_makespan >= s.median_makespan);  // seeing drops late costs; it never helps

  // Where even this idealised start misses 1.3x the oracle's makespan (seeds 1-1000: 1.317 in seed 462, 1.314
  // in 569, 1.307 in 918): a high capacity that drops soon after the start, so the work the start could not
  // do is done at the lower capacity. No rule that starts from 4 without being told the capacity and never
  // fails a call in this family is likely to meet 1.3x in every scenario.
  for (const std::uint64_t seed : {std::uint64_t{462}, std::uint64_t{918}}) {
    const scenario sc = generate_scenario(seed);
    const family_score one = score(sc, measure_yardsticks(sc), blind);
    INFO(sc.name << ": " << sc.description);
    CHECK(one.failed == 0);
    CHECK(one.makespan_ratio > 1.3);
  }
}

namespace {

struct bounds {
  double worst_slow;       // the largest share of calls slower than 2x their unloaded time, any scenario
  double median_makespan;  // makespan / the oracle's
  double worst_makespan;
  double median_recovery;  // after a recovery: makespan / a fixed limit's at the recovered capacity
  double worst_recovery;
};

template <class Make>
void check_family(const char* name, const family& f, const bounds& b, Make make) {
  const family_summary s = evaluate(name, f, make);
  INFO(name << ": slowest " << s.worst_slow_at << ", longest " << s.worst_makespan_at << ", worst recovery "
            << s.worst_recovery_at);
  CHECK(s.scenarios_with_failures == 0);
  CHECK(s.worst_failed == 0);
  CHECK(s.worst_slow <= b.worst_slow);
  CHECK(s.median_makespan <= b.median_makespan);
  CHECK(s.worst_makespan <= b.worst_makespan);
  REQUIRE(s.recoveries > 0);
  CHECK(s.median_recovery <= b.median_recovery);
  CHECK(s.worst_recovery <= b.worst_recovery);
}

// The bounds aimed at are 5 % slow calls in every scenario, makespan <= 1.15x the oracle's (median) and
// <= 1.3x (worst), and <= 1.1x a fixed limit at the recovered capacity after a recovery. The start from 4
// calls (the largest start that cannot burst past a hard limit of 4), seeing a drop only when a call granted
// over it completes, and a slow call at every probe cost what the oracle never pays: blind_reference_late,
// which pays only these and plays them as fast as is safe, is at 5.4 % / 1.066 / 1.531 / 0.947 / 1.203, so
// the worst-case slow share, makespan and recovery bounds are out of reach without being told the capacity.
// Each algorithm below is held, with its default options, to what it reaches over seeds 1-1000
// (examples/adaptive_family), rounded up: a change that makes any worst case worse fails here.
//
// tuned_aimd, the recommended default: 7.4 % / 1.133 / 1.616 / 1.013 / 1.304 (before the noisy rule was on by
// default: 7.4 % / 1.132 / 1.616 / 1.012 / 1.304; before the guard rounded up
// after slow start: 7.4 % / 1.132 / 1.616 / 1.014 / 1.322; before the probe calls went on after a fast one,
// at twice the distance: 7.4 % / 1.136 / 1.616 / 1.014 / 1.322; before a probe let one call in and held
// until it returned: 7.4 % / 1.184 / 1.682 / 1.046 / 1.340; before the binary search back after a cut ended
// and futile probes were spaced out: 7.4 % / 1.207 / 1.802 / 1.063 / 1.505).
constexpr bounds tuned_aimd_bounds{0.075, 1.14, 1.62, 1.02, 1.31};
// aimd (latency_tolerance 1.75, noise floor 0.5 ms, plateau wait): 6.0 % / 1.228 / 1.646 / 1.066 / 1.481.
constexpr bounds aimd_bounds{0.061, 1.23, 1.65, 1.07, 1.49};
// gradient: 6.8 % / 1.221 / 1.716 / 1.067 / 1.387 (before slow start, the climb back to the level of a fall
// and the plateau: 61.1 % / 1.355 / 2.618 / 1.152 / 1.832). Its worst cases: the first queued call of a
// deep drop returns after as many base latencies as calls over the capacity, and slow start overshoots by
// up to the growth guard's 17.6 %.
constexpr bounds gradient_bounds{0.07, 1.23, 1.72, 1.07, 1.39};
// windowed_aimd: 4.3 % / 1.224 / 1.767 / 1.077 / 1.560 (before windows of a round trip judged on calls
// after the last change, a step of one call, a cut by the queue estimate and the plateau wait: 38.1 % /
// 1.514 / 2.723 / 1.326 / 2.474). Without slow start (off by default) its climb from 4 is slow.
constexpr bounds windowed_aimd_bounds{0.044, 1.23, 1.77, 1.08, 1.57};
// pid: 6.9 % / 1.321 / 1.870 / 1.136 / 1.648 (before slow start, round-trip windows, anti-windup and the
// cut to the queue estimate: 68.0 % / 1.449 / 6.993 / 1.243 / 6.450).
constexpr bounds pid_bounds{0.07, 1.33, 1.88, 1.14, 1.65};
// vegas: 11.6 % / 1.269 / 1.806 / 1.106 / 1.658 (before slow start, the sized decrease, the hold after a
// decrease and a probed baseline confirmed over two round trips: 70.2 % / 2.062 / 5.169 / 1.832 / 3.551,
// and 4 failed calls in seed 47). A stalled call looks like a queue to it, and it regrows a call per round
// trip.
constexpr bounds vegas_bounds{0.117, 1.27, 1.81, 1.11, 1.66};

// Every adaptive algorithm with its default options.
void check_defaults(const family& f) {
  check_family("tuned_aimd", f, tuned_aimd_bounds, [] { return rein::algo::tuned_aimd{}; });
  check_family("aimd", f, aimd_bounds, [] { return rein::algo::aimd{}; });
  check_family("gradient", f, gradient_bounds, [] { return rein::algo::gradient{}; });
  check_family("windowed_aimd", f, windowed_aimd_bounds, [] { return rein::algo::windowed_aimd{}; });
  check_family("pid", f, pid_bounds, [] { return rein::algo::pid{}; });
  check_family("vegas", f, vegas_bounds, [] { return rein::algo::vegas{}; });
}

template <class Make>
void check_quiet(const char* name, const family& quiet, Make make) {
  const auto s = evaluate(name, quiet, make);
  INFO(name << " deepest cut in " << s.lowest_cut_at);
  CHECK(s.lowest_cut >= 0.8);
  CHECK(s.scenarios_with_failures == 0);
}

void check_noise(std::uint64_t seeds) {
  // +-20 % latency noise, no capacity change: no decrease may leave the limit below 0.8 x the capacity.
  family quiet;
  for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
    quiet.scenarios.push_back(generate_noise_scenario(seed));
    quiet.marks.push_back(measure_yardsticks(quiet.scenarios.back()));
  }
  check_quiet("tuned_aimd", quiet, [] { return rein::algo::tuned_aimd{}; });
  check_quiet("aimd", quiet, [] { return rein::algo::aimd{}; });
  check_quiet("gradient", quiet, [] { return rein::algo::gradient{}; });
  check_quiet("windowed_aimd", quiet, [] { return rein::algo::windowed_aimd{}; });
  check_quiet("pid", quiet, [] { return rein::algo::pid{}; });
  check_quiet("vegas", quiet, [] { return rein::algo::vegas{}; });
}

// An algorithm with a circuit beside it, fed as adaptive_limiter feeds its own (the sample first, then the
// circuit with the limit as the sample left it); `*opened` counts its openings. The simulation refuses no
// call, so this says whether the circuit would fire on these upstreams (none is ever down), not what
// refusing would cost.
template <class Algorithm>
struct circuit_probe {
  using sample_type = typename Algorithm::sample_type;
  Algorithm algorithm;
  rein::algo::basic_circuit<typename Algorithm::clock_type> circuit;
  std::size_t* opened;

  double limit() const { return algorithm.limit(); }
  std::uint64_t decreases() const { return algorithm.decreases(); }
  void on_sample(const sample_type& s) {
    algorithm.on_sample(s);
    const bool at_floor = static_cast<double>(rein::algo::admitted(algorithm.limit())) <= algorithm.min_limit();
    const std::uint64_t before = circuit.opens();
    circuit.on_sample(s.result, s.now - s.latency, s.now, at_floor);
    if (circuit.opens() != before) ++*opened;
  }
};

// Scenarios of `f` where a circuit with open_after 5 (Envoy's consecutive_5xx) beside an `Algorithm` with
// default options would open.
template <class Algorithm>
std::size_t circuit_openings(const family& f) {
  rein::algo::circuit_options c;
  c.open_after = 5;
  std::size_t scenarios = 0;
  for (std::size_t i = 0; i < f.scenarios.size(); ++i) {
    std::size_t opened = 0;
    (void)score(f.scenarios[i], f.marks[i], [&] {
      return circuit_probe<Algorithm>{Algorithm{}, rein::algo::basic_circuit<typename Algorithm::clock_type>{c}, &opened};
    });
    if (opened != 0) ++scenarios;
  }
  return scenarios;
}

}  // namespace

TEST_CASE("family, seeds 1-100: every adaptive algorithm with its defaults never fails a call, within its bounds") {
  check_defaults(family::generate(1, 100));
}

TEST_CASE("family, noise only, seeds 1-50: +-20 % jitter never cuts below 0.8 x the capacity") { check_noise(50); }

// Whether a circuit on by default would cost anything on the family: it opens only on congestion outcomes at
// the floor, which no default meets there (no call fails, and none sits at its floor), so it never fires.
TEST_CASE("family, seeds 1-100: a circuit opening after 5 congestions at the floor never opens beside any default") {
  const family f = family::generate(1, 100);
  CHECK(circuit_openings<rein::algo::tuned_aimd>(f) == 0);
  CHECK(circuit_openings<rein::algo::aimd>(f) == 0);
  CHECK(circuit_openings<rein::algo::gradient>(f) == 0);
  CHECK(circuit_openings<rein::algo::windowed_aimd>(f) == 0);
  CHECK(circuit_openings<rein::algo::pid>(f) == 0);
  CHECK(circuit_openings<rein::algo::vegas>(f) == 0);
}

TEST_CASE("family, seeds 1-1000: every adaptive algorithm with its defaults never fails a call, within its bounds",
          "[.thorough]") {
  check_defaults(family::generate(1, 1000));
}

TEST_CASE("family, noise only, seeds 1-200: +-20 % jitter never cuts below 0.8 x the capacity", "[.thorough]") {
  check_noise(200);
}

// The grown family's shapes (world_shapes: payload-shaped latency, random failures; issue 42), for tuned_aimd
// with its defaults. What it covers, and what it does not yet:
// - random failures (1 %, 5 %, on +-10 % noise), with or without work hints: >= 0.8 of the oracle's
//   throughput in every seed, >= 0.88 median (measured over seeds 1-100: 0.84 / 0.91 and 0.84 / 0.90; before
//   the failure baseline's 15 % floor, 0.56 / 0.79 and 0.46 / 0.65);
// - payload-shaped latency with a work hint per call, failures or not: >= 0.8 in every seed, >= 0.9 median
//   (seeds 1-100: 0.83-0.89 worst, 0.91-0.94 median; the blind reference's worst is 0.86-0.92);
// - payload-shaped latency without a hint, under the noisy rule (`tuned_aimd_options::median_window`): each
//   shape's worst seed, rounded down, and >= 0.55 median; far from issue 42's 0.8 (before the rule was on by
//   default: 0.03 worst, 0.05 median on each);
// - every shape: no call fails because of the load.
struct payload_floor {
  const char* shape;
  double worst;  // the lowest throughput over the oracle's in any seed
};

// Seeds 1-50 (`adaptive_family --shapes --seeds 50 --algorithm tuned_aimd`; to 3 decimals 0.443, 0.391, 0.482,
// 0.309, 0.598, 0.267; medians 0.563-0.721).
constexpr payload_floor payload_floors_50[] = {
    {"uniform 40%", 0.44},      {"uniform 60%", 0.39}, {"lognormal cv 0.5", 0.48},
    {"lognormal cv 1", 0.30},   {"bimodal", 0.59},     {"lognormal cv 1 + failures 5%", 0.26},
};
// Seeds 1-1000 (0.436, 0.373, 0.352, 0.272, 0.321, 0.267; medians 0.553-0.718). With a work hint over these
// seeds the worst seeds are 0.78 (lognormal cv 1) and 0.77 (failures 5 %), so the thorough tier asserts only
// the absence of failed calls there.
constexpr payload_floor payload_floors_1000[] = {
    {"uniform 40%", 0.43},      {"uniform 60%", 0.37}, {"lognormal cv 0.5", 0.35},
    {"lognormal cv 1", 0.27},   {"bimodal", 0.32},     {"lognormal cv 1 + failures 5%", 0.26},
};

template <std::size_t N>
double floor_of(const payload_floor (&floors)[N], const std::string& shape) {
  for (const payload_floor& f : floors)
    if (shape == f.shape) return f.worst;
  FAIL("no payload floor for " << shape);
  return 0.0;
}

TEST_CASE("world shapes, seeds 1-50: tuned_aimd holds 0.8 of the oracle on random failures and hinted payloads") {
  for (const bool hints : {false, true}) {
    for (const world_shape& shape : world_shapes()) {
      const family f = family::generate_shaped(shape, 1, 50, hints);
      const family_summary s = evaluate("tuned_aimd", f, [] { return rein::algo::tuned_aimd{}; });
      INFO(shape.name << (hints ? ", work hints" : "") << ": worst in " << s.worst_makespan_at);
      CHECK(s.scenarios_with_failures == 0);
      const bool payload = shape.payload != payload_shape::none;
      if (payload && !hints) {
        CHECK(s.worst_throughput() >= floor_of(payload_floors_50, shape.name));
        CHECK(s.median_throughput() >= 0.55);
        continue;
      }
      CHECK(s.worst_throughput() >= 0.8);
      CHECK(s.median_throughput() >= (payload ? 0.9 : 0.88));
    }
  }
}

TEST_CASE("world shapes, seeds 1-1000: tuned_aimd never fails a call, and holds its payload floors",
          "[.thorough]") {
  for (const bool hints : {false, true}) {
    for (const world_shape& shape : world_shapes()) {
      const family f = family::generate_shaped(shape, 1, 1000, hints);
      const family_summary s = evaluate("tuned_aimd", f, [] { return rein::algo::tuned_aimd{}; });
      INFO(shape.name << (hints ? ", work hints" : "") << ": worst in " << s.worst_makespan_at);
      CHECK(s.scenarios_with_failures == 0);
      if (shape.payload == payload_shape::none || hints) continue;
      CHECK(s.worst_throughput() >= floor_of(payload_floors_1000, shape.name));
      CHECK(s.median_throughput() >= 0.55);
    }
  }
}

// Every other adaptive algorithm on the grown family's shapes, with its defaults: no failed call anywhere;
// with a work hint per call, or on random failures (their `learn_failure_rate`), >= 0.6 of the oracle's
// throughput in every seed. Measured over seeds 1-100 (`adaptive_family --shapes --seeds 100 [--work-hints]
// --algorithm NAME`), worst with hints / worst on random failures unhinted: aimd 0.69 / 0.71, gradient 0.75 /
// 0.76, vegas 0.70 / 0.62, windowed_aimd 0.67 / 0.67, pid 0.65 / 0.67 (before the hints and the learned
// rate: 0.03 on every payload shape, and 0.22, 0.11, 0.39, 0.60, 0.04 at 5 % failures). Without a hint,
// payload-shaped latency still holds them near their floor (0.03 worst): only tuned_aimd's noisy rule reads
// such spread, so it is the one to use for LLM calls without a hint.
template <class Algorithm>
void check_other_shapes(const char* name) {
  for (const bool hints : {false, true}) {
    for (const world_shape& shape : world_shapes()) {
      const family f = family::generate_shaped(shape, 1, 50, hints);
      const family_summary s = evaluate(name, f, [] { return Algorithm{}; });
      INFO(name << ", " << shape.name << (hints ? ", work hints" : "") << ": worst in " << s.worst_makespan_at);
      CHECK(s.scenarios_with_failures == 0);
      if (shape.payload != payload_shape::none && !hints) continue;
      CHECK(s.worst_throughput() >= 0.6);
    }
  }
}

TEST_CASE("world shapes, seeds 1-50: every other algorithm holds 0.6 of the oracle with hints and on random "
          "failures") {
  check_other_shapes<rein::algo::aimd>("aimd");
  check_other_shapes<rein::algo::gradient>("gradient");
  check_other_shapes<rein::algo::vegas>("vegas");
  check_other_shapes<rein::algo::windowed_aimd>("windowed_aimd");
  check_other_shapes<rein::algo::pid>("pid");
}

// The per-call rule alone (`median_window` 0) on the same payload shapes: it reads the spread as a queue and
// sits near its floor (0.03-0.06 of the oracle on seeds 1-100), which is why the noisy rule is on by default.
// Held here so that a change which makes the noisy rule unnecessary shows.
TEST_CASE("world shapes, seeds 1-20: without the noisy rule, tuned_aimd reads payload spread as a queue") {
  rein::algo::tuned_aimd_options o;
  o.median_window = 0;
  for (const world_shape& shape : world_shapes()) {
    if (shape.payload == payload_shape::none) continue;
    const family f = family::generate_shaped(shape, 1, 20);
    const family_summary s = evaluate("tuned_aimd per-call", f, [&] { return rein::algo::tuned_aimd{o}; });
    INFO(shape.name);
    CHECK(s.scenarios_with_failures == 0);
    CHECK(s.median_throughput() < 0.1);
  }
}
