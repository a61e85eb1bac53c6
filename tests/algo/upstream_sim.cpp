// rein::testing's degrading-upstream simulation (issue 4): the harness against the Python reference model
// (../shared/reference/upstream_sim.py), then rein's default algorithms against the targets.
#include <rein/testing/upstream_sim.hpp>

#include "support/catch.hpp"

#include <chrono>
#include <cstdio>
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

TEST_CASE("experiment A: fixed, aimd and the oracle reproduce the reference model exactly") {
  const auto rs = run_experiment(scenario::a());
  check(find(rs, "fixed(16)"), {1000, 0, 5ms, 65ms, 65ms, 500, 2298ms, "16.00", 0});
  check(find(rs, "aimd"), {991, 9, 5ms, 25ms, 60ms, 265, 1592ms, "3.83", 93});
  check(find(rs, "oracle"), {1000, 0, 5ms, 5ms, 5ms, 0, 879ms, "4.00", 1});
  CHECK(find(rs, "fixed(16)").peak_inside == 16);
}

TEST_CASE("experiment B: fixed, aimd and the oracle reproduce the reference model exactly") {
  const auto rs = run_experiment(scenario::b());
  check(find(rs, "fixed(16)"), {1000, 0, 5ms, 65ms, 65ms, 96, 747ms, "16.00", 0});
  check(find(rs, "aimd"), {991, 9, 5ms, 25ms, 60ms, 133, 882ms, "16.68", 40});
  check(find(rs, "oracle"), {1000, 0, 5ms, 5ms, 5ms, 0, 670ms, "16.00", 1});
}

TEST_CASE("experiment: the guide's tuned AIMD and Gradient2's defaults reproduce the reference's failures") {
  rein::algo::tuned_aimd_options t;
  t.initial_limit = 16;
  t.window = 50;
  t.tolerance = 2.0;
  t.backoff = 0.75;
  t.hold = 40ms;
  t.min_utilisation = 0;
  rein::algo::tuned_aimd guide{t};
  check(simulate("guide tuned_aimd", guide, scenario::a()), {923, 77, 5ms, 105ms, 110ms, 423, 2032ms, "24.56", 5});

  rein::algo::gradient_options g;
  g.initial_limit = 16;
  g.queue_size = 4;
  g.tolerance = 1.5;
  g.smoothing = 0.2;
  g.baseline = rein::algo::gradient_baseline::long_average;
  g.baseline_window = 600;
  g.failures_as_congestion = false;
  rein::algo::gradient gradient2{g};
  check(simulate("gradient2", gradient2, scenario::a()), {900, 100, 5ms, 75ms, 90ms, 400, 1794ms, "64.00", 160});
}

TEST_CASE("experiment A: rein's default tuned_aimd and gradient") {
  const auto rs = run_experiment(scenario::a());
  check(find(rs, "tuned_aimd"), {1000, 0, 5ms, 10ms, 35ms, 27, 1168ms, "2.96", 30});
  check(find(rs, "gradient"), {1000, 0, 5ms, 10ms, 85ms, 33, 1069ms, "4.39", 151});
}

TEST_CASE("experiment B: rein's default tuned_aimd and gradient find the capacity again") {
  const auto rs = run_experiment(scenario::b());
  check(find(rs, "tuned_aimd"), {1000, 0, 5ms, 10ms, 35ms, 27, 773ms, "10.89", 13});
  check(find(rs, "gradient"), {1000, 0, 5ms, 10ms, 85ms, 37, 770ms, "15.98", 79});
}

TEST_CASE("experiment: rein's defaults meet issue 4's targets; the guide's AIMD stays within its figures") {
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
