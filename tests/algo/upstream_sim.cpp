// rein::testing's degrading-upstream simulation: the harness against the figures of an independent model of the
// same experiment (reproduced exactly), then rein's default algorithms against the experiment's targets.
#include <rein/testing/scenario_family.hpp>
#include <rein/testing/upstream_sim.hpp>

#include "support/catch.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <optional>
#include <cstdio>
#include <limits>
#include <span>
#include <stdexcept>
#include <sstream>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using namespace rein::testing;

namespace {

std::string two_decimals(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

struct expected {
  std::size_t completed, failed;
  std::chrono::milliseconds p50, p95, p99;
  std::size_t slower_than_10ms;
  std::chrono::milliseconds makespan;
  std::string final_limit;
  std::uint64_t decreases;
};

void check(const report& r, const expected& e) {
  INFO(r.strategy << " in scenario " << r.scenario);
  CHECK(r.completed == e.completed);
  CHECK(r.failed == e.failed);
  CHECK(r.p50 == e.p50);
  CHECK(r.p95 == e.p95);
  CHECK(r.p99 == e.p99);
  CHECK(r.slower_than_10ms == e.slower_than_10ms);
  CHECK(r.makespan == e.makespan);
  CHECK(two_decimals(r.final_limit) == e.final_limit);
  CHECK(r.decreases == e.decreases);
}

const report& find(const std::vector<report>& rs, const std::string& name) {
  for (const auto& r : rs)
    if (r.strategy == name) return r;
  FAIL("no strategy " << name);
  return rs.front();
}

}  // namespace

TEST_CASE("upstream_model: service time grows by one base per call over capacity; past the hard cap it fails") {
  const upstream_model::options o{};
  CHECK(upstream_model::plan(1, 16, o).service_time == 5ms);
  CHECK(upstream_model::plan(16, 16, o).service_time == 5ms);
  CHECK(upstream_model::plan(17, 16, o).service_time == 10ms);
  CHECK(upstream_model::plan(16, 4, o).service_time == 65ms);
  CHECK(upstream_model::plan(25, 4, o).ok);
  const auto over = upstream_model::plan(26, 4, o);
  CHECK_FALSE(over.ok);
  CHECK(over.service_time == 5ms);

  upstream_model up{o};
  for (int i = 0; i < 17; ++i) up.enter();
  CHECK(up.inside() == 17);
  up.set_capacity(4);
  CHECK(up.enter().service_time == 75ms);  // 18 inside: 14 over capacity
  up.leave();
  CHECK(up.peak() == 18);
}

TEST_CASE("nearest_rank: the smallest value with at least p percent of the values at or below it") {
  std::vector<std::chrono::nanoseconds> xs;
  for (int i = 1; i <= 1000; ++i) xs.emplace_back(i);
  CHECK(nearest_rank(xs, 95) == 950ns);
  CHECK(nearest_rank(xs, 50) == 500ns);
  CHECK(nearest_rank(xs, 99) == 990ns);
  const std::vector<std::chrono::nanoseconds> one{7ns};
  CHECK(nearest_rank(one, 95) == 7ns);
}

TEST_CASE("simulation: a limit of 1 serialises everything at base latency") {
  fixed_limit one{1};
  const report r = simulate("fixed(1)", one, scenario::a());
  CHECK(r.makespan == 5000ms);
  CHECK(r.p99 == 5ms);
  CHECK(r.failed == 0);
}

TEST_CASE("simulation: past the hard cap calls fail; the oracle never lets a call queue inside the upstream") {
  fixed_limit thirty{30};
  const report over = simulate("fixed(30)", thirty, scenario::a());
  CHECK(over.failed > 0);
  CHECK(over.peak_inside == 30);

  oracle_limit oracle{16};
  const report r = simulate("oracle", oracle, scenario::a());
  CHECK(r.max == 5ms);
  CHECK(r.peak_inside == 10);  // 2 calls a millisecond for 5 ms each: the demand never reaches 16
}

TEST_CASE("experiment A: fixed, aimd and the oracle reproduce the independent model exactly") {
  const auto rs = run_experiment(scenario::a());
  check(find(rs, "fixed(16)"), {1000, 0, 5ms, 65ms, 65ms, 500, 2298ms, "16.00", 0});
  check(find(rs, "aimd"), {991, 9, 5ms, 25ms, 60ms, 265, 1592ms, "3.83", 93});
  check(find(rs, "oracle"), {1000, 0, 5ms, 5ms, 5ms, 0, 879ms, "4.00", 1});
  CHECK(find(rs, "fixed(16)").peak_inside == 16);
}

TEST_CASE("experiment B: fixed, aimd and the oracle reproduce the independent model exactly") {
  const auto rs = run_experiment(scenario::b());
  check(find(rs, "fixed(16)"), {1000, 0, 5ms, 65ms, 65ms, 96, 747ms, "16.00", 0});
  check(find(rs, "aimd"), {991, 9, 5ms, 25ms, 60ms, 133, 882ms, "16.68", 40});
  check(find(rs, "oracle"), {1000, 0, 5ms, 5ms, 5ms, 0, 670ms, "16.00", 1});
}

TEST_CASE("experiment A: rein's default tuned_aimd and gradient") {
  const auto rs = run_experiment(scenario::a());
  check(find(rs, "tuned_aimd"), {1000, 0, 5ms, 5ms, 35ms, 17, 931ms, "4.09", 12});
  check(find(rs, "gradient"), {1000, 0, 5ms, 10ms, 35ms, 23, 976ms, "4.79", 16});
}

TEST_CASE("experiment B: rein's default tuned_aimd and gradient find the capacity again") {
  const auto rs = run_experiment(scenario::b());
  check(find(rs, "tuned_aimd"), {1000, 0, 5ms, 10ms, 35ms, 34, 762ms, "16.81", 9});
  check(find(rs, "gradient"), {1000, 0, 5ms, 10ms, 35ms, 23, 756ms, "16.05", 13});
}

TEST_CASE("experiment: rein's defaults meet the experiment's targets; the textbook AIMD stays within its figures") {
  const auto a = run_experiment(scenario::a());
  const auto b = run_experiment(scenario::b());
  const auto oracle_a = find(a, "oracle").makespan;
  const auto fixed_b = find(b, "fixed(16)").makespan;
  for (const char* name : {"tuned_aimd", "gradient"}) {
    INFO(name);
    const report& ra = find(a, name);
    CHECK(ra.failed == 0);
    CHECK(ra.slower_than_10ms <= 50);
    CHECK(ra.p95 <= 10ms);
    CHECK(ra.makespan * 10 <= oracle_a * 14);
    const report& rb = find(b, name);
    CHECK(rb.failed == 0);
    CHECK(rb.makespan * 10 <= fixed_b * 11);
  }
  const report& aimd = find(a, "aimd");
  CHECK(aimd.p95 >= 20ms);
  CHECK(aimd.p95 <= 25ms);
  CHECK(aimd.failed > 0);
  CHECK(aimd.failed < 20);
}

TEST_CASE("upstream_model: noise scales each call's base within +-noise, repeatably; a stall delays entrants") {
  upstream_model::options o;
  o.base = 10ms;
  o.capacity = 100;
  o.hard_cap = 200;
  o.noise = 0.2;
  o.noise_seed = 7;
  upstream_model a{o}, b{o};
  bool varied = false;
  for (int i = 0; i < 100; ++i) {
    const auto pa = a.enter(), pb = b.enter();
    CHECK(pa.service_time == pb.service_time);
    CHECK(pa.service_time >= 8ms);
    CHECK(pa.service_time <= 12ms);
    CHECK(pa.unloaded == pa.service_time);  // below capacity
    varied = varied || pa.service_time != 10ms;
  }
  CHECK(varied);

  upstream_model::options q;
  q.base = 5ms;
  q.capacity = 1;
  q.stalls = {{100ms, 30ms}};
  upstream_model up{q};
  const auto before = up.enter(99ms);
  CHECK(before.service_time == 5ms);
  const auto during = up.enter(110ms);  // two inside: one over capacity, plus 20 ms left of the stall
  CHECK(during.service_time == 30ms);
  CHECK(during.unloaded == 25ms);
  CHECK(up.enter(130ms).service_time == 15ms);  // the stall is over; three inside
}

TEST_CASE("upstream_model: payload shapes keep a mean of 1; random failures come at their rate, whatever the load") {
  upstream_model::options o;
  o.base = 10ms;
  o.capacity = 100000;
  o.hard_cap = 200000;
  o.noise_seed = 11;
  const auto mean_and_extremes = [&](payload_shape shape, double spread) {
    o.payload = shape;
    o.payload_spread = spread;
    upstream_model up{o};
    double sum = 0.0, lo = 1e9, hi = 0.0;
    for (int i = 0; i < 20000; ++i) {
      const auto p = up.enter();
      CHECK(p.unloaded == p.service_time);
      CHECK(p.service_time.count() == std::llround(10e6 * p.work));  // the work hint is the payload factor
      sum += p.work;
      lo = std::min(lo, p.work);
      hi = std::max(hi, p.work);
    }
    return std::array<double, 3>{sum / 20000.0, lo, hi};
  };
  const auto uniform = mean_and_extremes(payload_shape::uniform, 0.6);
  CHECK(std::abs(uniform[0] - 1.0) < 0.01);
  CHECK(uniform[1] >= 0.4);
  CHECK(uniform[2] <= 1.6);
  const auto lognormal = mean_and_extremes(payload_shape::lognormal, 1.0);
  CHECK(std::abs(lognormal[0] - 1.0) < 0.03);
  CHECK(lognormal[2] > 5.0);  // a long tail
  const auto bimodal = mean_and_extremes(payload_shape::bimodal, 0.0);
  CHECK(std::abs(bimodal[0] - 1.0) < 0.03);
  CHECK(bimodal[1] == 0.5);
  CHECK(bimodal[2] == 3.0);

  upstream_model::options f;
  f.capacity = 100000;
  f.hard_cap = 200000;
  f.failure_rate = 0.05;
  f.failure_seed = 3;
  upstream_model up{f};
  int failed = 0;
  for (int i = 0; i < 20000; ++i) {
    const auto p = up.enter();
    CHECK(p.ok == !p.random_failure);
    failed += p.random_failure ? 1 : 0;
  }
  CHECK(failed > 900);
  CHECK(failed < 1100);
}

TEST_CASE("simulation: random failures are reported apart, and work hints reach the samples") {
  scenario sc = generate_shaped_scenario(5, world_shapes()[6]);  // failures 5%
  rein::testing::oracle_limit oracle{sc.upstream.capacity};
  const report r = simulate("oracle", oracle, sc);
  CHECK(r.failed == r.failed_at_random);
  CHECK(r.failed > 0);
  CHECK(r.slow == 0);

  struct recorder {
    using sample_type = rein::algo::sample;
    std::vector<std::optional<double>> work;
    double limit() const { return 4.0; }
    std::uint64_t decreases() const { return 0; }
    void on_sample(const sample_type& s) { work.push_back(s.work); }
  };
  for (const bool hints : {false, true}) {
    const scenario shaped = generate_shaped_scenario(5, world_shapes()[4], hints);  // bimodal
    recorder rec;
    (void)simulate("recorder", rec, shaped);
    REQUIRE(rec.work.size() == shaped.calls());
    for (const auto& w : rec.work) {
      CHECK(w.has_value() == hints);
      if (w) CHECK((*w == 0.5 || *w == 3.0));
    }
  }
}

TEST_CASE("simulation: keys behind a global limit; a key at its own limit does not hold the others back") {
  scenario sc;
  sc.upstream.capacity = 4;
  sc.upstream.hard_cap = 100;
  sc.changes.clear();
  sc.ticks = 1;
  sc.per_tick = 10;  // ten calls for key 0 at once
  upstream_key other;
  other.upstream.capacity = 4;
  other.upstream.hard_cap = 100;
  other.arrivals = {arrival_phase{1ms, 1ms, 1, 2}};  // two calls for key 1 at 1 ms
  sc.more_keys = {other};
  sc.global_limit = 6;
  std::vector<fixed_limit> limits{fixed_limit{2}, fixed_limit{4}};
  const report r = simulate("fixed", std::span{limits}, sc);
  CHECK(r.completed == 12);
  CHECK(r.failed == 0);
  // Key 0 runs two at a time (5 rounds of 5 ms); key 1's two calls start at 1 ms, beside them.
  CHECK(r.makespan == 25ms);
  CHECK(r.peak_inside == 2);
  std::vector<fixed_limit> one{fixed_limit{2}};
  CHECK_THROWS_AS(simulate("fixed", std::span{one}, sc), std::invalid_argument);
  // With a global limit of 2, key 1 waits for a global slot, which it takes before key 0's later calls.
  sc.global_limit = 2;
  std::vector<fixed_limit> tight{fixed_limit{4}, fixed_limit{4}};
  const report t = simulate("fixed", std::span{tight}, sc);
  CHECK(t.makespan == 30ms);  // 12 calls, 2 at a time, 5 ms each
}

TEST_CASE("simulation: report::slow counts calls slower than twice their unloaded time; lowest_cut the deepest cut") {
  fixed_limit sixteen{16};
  const report r = simulate("fixed(16)", sixteen, scenario::a());
  CHECK(r.slow == 500);  // the same 500 calls that are slower than 10 ms at a 5 ms base
  CHECK(r.lowest_cut == std::numeric_limits<double>::infinity());
  // The textbook AIMD cuts on every slow call: from 16, with 4 left, down to its floor of 1 (a quarter of 4).
  rein::algo::aimd guide{experiment_aimd_options()};
  CHECK(simulate("aimd", guide, scenario::a()).lowest_cut == 0.25);
  // rein's tuned_aimd cuts by the calls queued ahead of the slow one: never below the capacity here.
  rein::algo::tuned_aimd t{};
  CHECK(simulate("tuned_aimd", t, scenario::a()).lowest_cut == 1.0);
}

TEST_CASE("simulation: the same run twice gives the same report") {
  rein::algo::gradient g1{}, g2{};
  const report r1 = simulate("gradient", g1, scenario::b());
  const report r2 = simulate("gradient", g2, scenario::b());
  CHECK(r1.p99 == r2.p99);
  CHECK(r1.makespan == r2.makespan);
  CHECK(r1.final_limit == r2.final_limit);
  CHECK(r1.decreases == r2.decreases);
  REQUIRE(r1.timeline.size() == r2.timeline.size());
  for (std::size_t i = 0; i < r1.timeline.size(); ++i) CHECK(r1.timeline[i].limit == r2.timeline[i].limit);
}

TEST_CASE("timeline: a point every 25 ms up to the makespan, after every event at that instant") {
  oracle_limit oracle{16};
  const report r = simulate("oracle", oracle, scenario::b());
  REQUIRE(r.makespan == 670ms);
  REQUIRE(r.timeline.size() == 27);  // 0, 25, ..., 650
  CHECK(r.timeline.back().at == 650ms);
  CHECK(r.timeline[9].at == 225ms);
  CHECK(r.timeline[9].limit == 16.0);
  CHECK(r.timeline[10].limit == 4.0);  // the drop at 250 ms is in the 250 ms point
  CHECK(r.timeline[10].capacity == 4);
  CHECK(r.timeline[24].capacity == 16);  // 600 ms: capacity back
  CHECK(r.timeline[24].limit == 16.0);
  for (const auto& p : r.timeline) CHECK(p.capacity == scenario::b().capacity_at(p.at));
}

TEST_CASE("print_table: one aligned row per strategy, times in milliseconds") {
  fixed_limit fixed{16};
  const std::vector<report> rs{simulate("fixed(16)", fixed, scenario::a())};
  std::ostringstream out;
  print_table(out, rs);
  CHECK(out.str() ==
        "strategy   completed   failed   p50 ms   p95 ms   p99 ms   >10 ms  makespan ms  final limit  decreases\n"
        "fixed(16)       1000        0        5       65       65      500         2298        16.00          0\n");
}

TEST_CASE("print_timeline: '#' per admitted call, '|' after the capacity-th column") {
  report r;
  r.strategy = "x";
  r.timeline = {{0ms, 6.5, 4}, {25ms, 3.0, 4}};
  std::ostringstream out;
  print_timeline(out, r);
  CHECK(out.str() ==
        "x: limit (#) vs capacity (|)\n"
        "     0 ms   6.50   4  ####|##\n"
        "    25 ms   3.00   4  ### |\n");
}

TEST_CASE("print_timeline_csv: one row per point") {
  report r;
  r.strategy = "x";
  r.scenario = "A";
  r.timeline = {{25ms, 3.5, 4}};
  std::ostringstream out;
  print_timeline_csv(out, std::vector<report>{r});
  CHECK(out.str() == "strategy,scenario,t_ms,limit,capacity\nx,A,25,3.50,4\n");
}
