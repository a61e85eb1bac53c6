// rein::prometheus::collector read directly, without a server: family names and types, the label set,
// rejections by reason, exact histogram buckets, keyed per-key series and the cardinality cap.
#include "support/async.hpp"
#include "support/catch.hpp"
#include "redis/scripted_fixture.hpp"

#include <rein/adaptive_limiter.hpp>
#include <rein/fixed_window.hpp>
#include <rein/rate_limiter.hpp>
#include <rein/sliding_window.hpp>
#include <rein/admission_throttle.hpp>
#include <rein/algo/aimd.hpp>
#include <rein/algo/all_of.hpp>
#include <rein/algo/sliding_window.hpp>
#include <rein/hedge.hpp>
#include <rein/keyed.hpp>
#include <rein/outcome.hpp>
#include <rein/prometheus/collector.hpp>
#include <rein/redis/detail/semaphore_admission.hpp>
#include <rein/semaphore.hpp>
#include <rein/throttle.hpp>
#include <rein/token_bucket.hpp>

#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
namespace net = rein::net;
using rein_test::manual_clock;
using timed_semaphore = rein::basic_semaphore<net::any_io_executor, manual_clock>;

using circuit_aimd = rein::basic_adaptive_limiter<rein::algo::aimd, net::any_io_executor, manual_clock>;

rein::algo::aimd_options floor_of_one() {
  rein::algo::aimd_options at_floor;
  at_floor.initial_limit = 1;
  return at_floor;
}

// Named "upstream"; three congestion outcomes at the floor in a row open its circuit for 1 s.
rein::adaptive_limiter_options circuit_options() {
  rein::adaptive_limiter_options o;
  o.circuit.open_after = 3;
  o.circuit.open_for = 1s;
  return o;
}

const prometheus::MetricFamily* find(const std::vector<prometheus::MetricFamily>& families, const std::string& name) {
  for (const auto& f : families)
    if (f.name == name) return &f;
  return nullptr;
}

// The metric of `family` whose labels include every (name, value) of `want`.
const prometheus::ClientMetric* metric(const std::vector<prometheus::MetricFamily>& families, const std::string& family,
                                       const std::vector<prometheus::ClientMetric::Label>& want) {
  const prometheus::MetricFamily* f = find(families, family);
  if (f == nullptr) return nullptr;
  for (const auto& m : f->metric) {
    bool all = true;
    for (const auto& w : want) {
      bool found = false;
      for (const auto& l : m.label) found = found || l == w;
      all = all && found;
    }
    if (all) return &m;
  }
  return nullptr;
}

}  // namespace

TEST_CASE("collector: a semaphore's counters, gauges and exact wait buckets", "[prometheus]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  timed_semaphore sem(io, 1, {.name = "db", .max_waiters = 1});
  rein::permit held = sem.try_acquire();
  rein::permit later;
  sem.async_acquire(1, [&](rein::error_code, rein::permit p) { later = std::move(p); });
  sem.async_acquire(1, [](rein::error_code, rein::permit) {});  // queue_full
  rein_test::poll(io);
  rein_test::advance_and_poll(io, 3ms);  // 3,000,000 ns: between 2^20 and 2^22 ns
  held.release();
  rein_test::poll(io);

  rein::prometheus::collector c;
  c.add(sem);
  CHECK(c.names() == std::vector<std::string>{"db"});
  const auto families = c.Collect();
  CHECK(find(families, "rein_acquired_total")->type == prometheus::MetricType::Counter);
  CHECK(metric(families, "rein_acquired_total", {{"limiter", "db"}})->counter.value == 2.0);
  CHECK(metric(families, "rein_rejected_total", {{"limiter", "db"}, {"reason", "queue_full"}})->counter.value == 1.0);
  CHECK(metric(families, "rein_rejected_total", {{"limiter", "db"}, {"reason", "timed_out"}})->counter.value == 0.0);
  CHECK(metric(families, "rein_in_flight", {{"limiter", "db"}})->gauge.value == 1.0);
  CHECK(metric(families, "rein_limit", {{"limiter", "db"}})->gauge.value == 1.0);
  const auto* wait = metric(families, "rein_wait_seconds", {{"limiter", "db"}});
  REQUIRE(wait != nullptr);
  CHECK(find(families, "rein_wait_seconds")->type == prometheus::MetricType::Histogram);
  CHECK(wait->histogram.sample_count == 2);
  CHECK(wait->histogram.sample_sum == 0.003);
  const auto& buckets = wait->histogram.bucket;
  REQUIRE(buckets.size() == 18);  // 2^10, 2^12, ... 2^42 ns, and +Inf
  CHECK(buckets[0].upper_bound == 1024e-9);
  CHECK(buckets[0].cumulative_count == 1);   // the immediate grant: 0
  CHECK(buckets[5].upper_bound == 1048576e-9);
  CHECK(buckets[5].cumulative_count == 1);   // 2^20 ns: 3 ms not yet
  CHECK(buckets[6].cumulative_count == 2);   // 2^22 ns = 4.19 ms
  CHECK(buckets[17].cumulative_count == 2);  // +Inf
  CHECK(c.remove("db"));
  CHECK(c.Collect().empty());
}

TEST_CASE("collector: a semaphore's expired leases", "[prometheus]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  timed_semaphore sem(io, 3, {.name = "db"});
  rein::permit a = sem.with_lease(1s).try_acquire(1);
  rein::permit b = sem.with_lease(2s).try_acquire(2);
  rein::prometheus::collector c;
  c.add(sem);
  CHECK(metric(c.Collect(), "rein_leases_expired_total", {{"limiter", "db"}})->counter.value == 0.0);
  rein_test::advance_and_poll(io, 2s);
  const auto families = c.Collect();
  CHECK(find(families, "rein_leases_expired_total")->type == prometheus::MetricType::Counter);
  CHECK(metric(families, "rein_leases_expired_total", {{"limiter", "db"}})->counter.value == 2.0);
  CHECK(metric(families, "rein_in_flight", {{"limiter", "db"}})->gauge.value == 0.0);
}

TEST_CASE("collector: a partitioned semaphore exports each partition, the rest without a partition label",
          "[prometheus]") {
  net::io_context io;
  timed_semaphore sem(io, 10, {.name = "db", .partitions = {{"batch", 0.3}, {"live", 0.6}}});
  rein::permit batch = sem.partition("batch").try_acquire(4);
  rein::permit live = sem.partition("live").try_acquire(6);
  sem.partition("live").async_acquire(1, [](rein::error_code, rein::permit) {});
  rein::prometheus::collector c;
  c.add(sem);
  const auto families = c.Collect();
  CHECK(find(families, "rein_partition_acquired_total")->type == prometheus::MetricType::Counter);
  CHECK(metric(families, "rein_partition_guaranteed", {{"partition", "batch"}})->gauge.value == 3.0);
  CHECK(metric(families, "rein_partition_in_flight", {{"partition", "batch"}})->gauge.value == 4.0);
  CHECK(metric(families, "rein_partition_waiting", {{"partition", "live"}})->gauge.value == 1.0);
  CHECK(metric(families, "rein_partition_acquired_total", {{"partition", "live"}})->counter.value == 1.0);
  const auto* rest = metric(families, "rein_partition_guaranteed", {{"limiter", "db"}});  // the first: the rest
  REQUIRE(rest != nullptr);
  CHECK(rest->label.size() == 1);
  CHECK(rest->gauge.value == 1.0);  // floor(0.1 x 10), 0.1 within 1e-9
  CHECK(find(families, "rein_partition_guaranteed")->metric.size() == 3);
}

TEST_CASE("collector: a shared semaphore's limit, in_flight, held, free, waiting and Redis round trips",
          "[prometheus][redis]") {
  // The shared semaphore's admission rule on the wait line, with verdicts made by hand (no Redis).
  using policy = rein::redis::detail::semaphore_admission<manual_clock>;
  rein_test::scripted::scripted_fixture<policy, void(rein::error_code, rein::permit)> pool({.key = "pool", .limit = 3},
                                                                                           {.name = "pool"});
  rein_test::scripted::result r[2];
  pool.acquire(r[0], 2);
  pool.acquire(r[1], 2);
  rein_test::advance_and_poll(pool.io, 2ms);
  pool.settle(0, rein_test::scripted::allowed(1));
  pool.settle(1, rein_test::scripted::denied(10000, 1));  // 1 free: not enough for 2
  rein_test::poll(pool.io);
  REQUIRE(r[0].ec == rein::error_code{});

  rein::prometheus::collector c;
  c.add(pool, "pool");
  const auto families = c.Collect();
  const auto gauge = [&](const char* name) { return metric(families, name, {{"limiter", "pool"}})->gauge.value; };
  CHECK(gauge("rein_limit") == 3.0);
  CHECK(gauge("rein_in_flight") == 2.0);  // permits callers hold, not requests awaiting Redis
  CHECK(gauge("rein_held") == 2.0);
  CHECK(gauge("rein_free") == 1.0);
  CHECK(gauge("rein_waiting") == 1.0);
  CHECK(find(families, "rein_held")->type == prometheus::MetricType::Gauge);
  CHECK(metric(families, "rein_acquired_total", {{"limiter", "pool"}})->counter.value == 1.0);
  CHECK(metric(families, "rein_fail_open_acquired_total", {{"limiter", "pool"}})->counter.value == 0.0);
  CHECK(metric(families, "rein_rejected_total", {{"limiter", "pool"}, {"reason", "unavailable"}})->counter.value ==
        0.0);
  const auto* rtt = metric(families, "rein_redis_round_trip_seconds", {{"limiter", "pool"}});
  REQUIRE(rtt != nullptr);
  CHECK(find(families, "rein_redis_round_trip_seconds")->type == prometheus::MetricType::Histogram);
  CHECK(rtt->histogram.sample_count == 2);
  CHECK(rtt->histogram.sample_sum == 0.004);
  CHECK(rtt->histogram.bucket[5].cumulative_count == 0);  // 2^20 ns: 2 ms not yet
  CHECK(rtt->histogram.bucket[6].cumulative_count == 2);  // 2^22 ns
  CHECK(find(families, "rein_tokens") == nullptr);
}

TEST_CASE("collector: names must be given and unique", "[prometheus]") {
  net::io_context io;
  rein::semaphore unnamed(io, 1);
  rein::prometheus::collector c;
  CHECK_THROWS_AS(c.add(unnamed), std::invalid_argument);
  c.add(unnamed, "a");
  CHECK_THROWS_AS(c.add(unnamed, "a"), std::invalid_argument);
}

TEST_CASE("collector: a hedge policy's attempts and its hedges by outcome", "[prometheus]") {
  rein_test::manual_clock_at_epoch epoch;
  rein::hedge_options o;
  o.name = "search";
  o.budget = rein::algo::retry_budget_options{};
  o.budget->min_retries_per_second = 0.0;
  o.budget->retry_ratio = 1.0;  // one hedge per call
  rein::basic_hedge_policy<manual_clock> policy(o);
  policy.on_request();
  CHECK(policy.try_hedge());
  policy.on_end(true, true, false);  // the hedge won
  CHECK_FALSE(policy.try_hedge());   // the one hedge earned is spent
  rein::prometheus::collector c;
  c.add(policy);
  const auto families = c.Collect();
  CHECK(metric(families, "rein_hedge_attempts_total", {{"limiter", "search"}})->counter.value == 2.0);
  const auto hedges = [&](const std::string& outcome) {
    return metric(families, "rein_hedges_total", {{"limiter", "search"}, {"outcome", outcome}})->counter.value;
  };
  CHECK(hedges("won") == 1.0);
  CHECK(hedges("cancelled") == 0.0);
  CHECK(hedges("lost") == 0.0);
  CHECK(hedges("refused") == 1.0);
  CHECK(metric(families, "rein_acquired_total", {{"limiter", "search"}})->counter.value == 1.0);
}

TEST_CASE("collector: a keyed registry exports at most max_keys keys", "[prometheus]") {
  net::io_context io;
  rein::keyed<rein::semaphore> per_host(io.get_executor(), std::size_t{2}, {}, {.name = "per_host"});
  auto a = per_host.get("a");
  auto b = per_host.get("b");
  auto c1 = per_host.get("c");
  rein::permit p = a->try_acquire();
  rein::prometheus::collector c;
  c.add_keyed(per_host, {}, {.max_keys = 2});
  const auto families = c.Collect();
  CHECK(metric(families, "rein_keys", {{"limiter", "per_host"}})->gauge.value == 3.0);
  CHECK(metric(families, "rein_keys_unexported", {{"limiter", "per_host"}})->gauge.value == 1.0);
  CHECK(find(families, "rein_limit")->metric.size() == 2);
  CHECK(metric(families, "rein_keys_created_total", {{"limiter", "per_host"}})->counter.value == 3.0);
}

TEST_CASE("collector: a throttle's rejections by stage, waiting and wait", "[prometheus]") {
  net::io_context io;
  rein::semaphore global(io, 1);
  rein::throttle t(global, {.name = "out"});
  auto g1 = t.try_acquire("k");
  auto g2 = t.try_acquire("k");
  rein::prometheus::collector c;
  c.add(t);
  const auto families = c.Collect();
  CHECK(metric(families, "rein_rejected_total", {{"limiter", "out"}, {"reason", "global"}})->counter.value == 1.0);
  CHECK(metric(families, "rein_acquired_total", {{"limiter", "out"}})->counter.value == 1.0);
  CHECK(metric(families, "rein_in_flight", {{"limiter", "out"}})->gauge.value == 1.0);
  const auto* wait = metric(families, "rein_wait_seconds", {{"limiter", "out"}});
  REQUIRE(wait != nullptr);
  CHECK(wait->histogram.sample_count == 1);  // the admission, at once
  CHECK(wait->histogram.sample_sum == 0.0);

  bool admitted = false;
  t.async_acquire("k", [&](rein::error_code ec, auto g) { admitted = !ec && g; });
  io.poll();
  CHECK(metric(c.Collect(), "rein_waiting", {{"limiter", "out"}})->gauge.value == 1.0);
  g1.complete(rein::outcome::success);
  io.poll();
  REQUIRE(admitted);
  const auto after = c.Collect();
  CHECK(metric(after, "rein_waiting", {{"limiter", "out"}})->gauge.value == 0.0);
  CHECK(metric(after, "rein_wait_seconds", {{"limiter", "out"}})->histogram.sample_count == 2);
}

TEST_CASE("collector: a throttle's takes per stage, each under one `as`, and its give-backs", "[prometheus]") {
  net::io_context io;
  rein::keyed<rein::semaphore> per_key(io, std::size_t{2});
  rein::semaphore global(io, 1);
  rein::throttle t(per_key, global, {.name = "out"});
  auto g1 = t.try_acquire("k");
  REQUIRE(g1);
  auto refused = t.try_acquire("k");  // takes the key's permit, finds no global slot: abandoned, given back
  REQUIRE_FALSE(refused);
  bool admitted = false;
  // Its first try keeps the key's permit and waits for the global slot (it re-takes nothing).
  t.async_acquire("k", [&](rein::error_code ec, auto g) { admitted = !ec && g; });
  io.poll();
  g1.complete(rein::outcome::success);
  io.poll();
  REQUIRE(admitted);

  rein::prometheus::collector c;
  c.add(t);
  c.add(global, "global");
  const auto families = c.Collect();
  CHECK(find(families, "rein_throttle_stage_acquired_total")->type == prometheus::MetricType::Counter);
  auto taken = [&](const std::string& stage, const std::string& as) {
    const auto* m =
        metric(families, "rein_throttle_stage_acquired_total", {{"limiter", "out"}, {"stage", stage}, {"as", as}});
    REQUIRE(m != nullptr);
    return m->counter.value;
  };
  CHECK(metric(families, "rein_acquired_total", {{"limiter", "out"}})->counter.value == 2.0);
  CHECK(taken("0", "admitted") == 2.0);
  CHECK(taken("0", "readmitted") == 0.0);
  CHECK(taken("0", "abandoned") == 1.0);
  CHECK(taken("0", "reconciled") == 0.0);
  CHECK(metric(families, "rein_throttle_stage_given_back_total",
               {{"limiter", "out"}, {"stage", "0"}, {"kind", "per_key"}})
            ->counter.value == 1.0);  // the refused try's
  CHECK(taken("1", "admitted") == 2.0);
  CHECK(taken("1", "readmitted") == 0.0);
  CHECK(taken("1", "abandoned") == 0.0);
  CHECK(
      metric(families, "rein_throttle_stage_given_back_total", {{"limiter", "out"}, {"stage", "1"}, {"kind", "global"}})
          ->counter.value == 0.0);
  // Summed over `as`, the global stage's series is its own rein_acquired_total: nothing counted twice.
  CHECK(metric(families, "rein_acquired_total", {{"limiter", "global"}})->counter.value ==
        taken("1", "admitted") + taken("1", "readmitted") + taken("1", "abandoned") + taken("1", "reconciled"));
  CHECK(find(families, "rein_throttle_stage_acquired_total")->metric.size() == 8);  // 2 stages x 4 `as`
}

TEST_CASE("collector: an adaptive limiter's circuit state as a gauge, 0 closed, 1 half-open, 2 open",
          "[prometheus]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  circuit_aimd limiter(io, floor_of_one(), {.name = "upstream"}, circuit_options());
  rein::prometheus::collector c;
  c.add(limiter);
  auto state = [&] {
    const auto families = c.Collect();
    CHECK(find(families, "rein_circuit_state")->type == prometheus::MetricType::Gauge);
    return metric(families, "rein_circuit_state", {{"limiter", "upstream"}})->gauge.value;
  };

  CHECK(state() == 0.0);
  for (int i = 0; i < 3; ++i) {
    rein::permit p = limiter.try_acquire();
    REQUIRE(p);
    p.complete(rein::outcome::congestion);
  }
  REQUIRE(limiter.circuit() == rein::circuit_state::open);
  CHECK(state() == 2.0);
  rein_test::advance_and_poll(io, 1s);
  rein::permit probe = limiter.try_acquire();  // the first acquire after open_for sees it half-open
  REQUIRE(probe);
  REQUIRE(limiter.circuit() == rein::circuit_state::half_open);
  CHECK(state() == 1.0);
  probe.complete(rein::outcome::success);
  REQUIRE(limiter.circuit() == rein::circuit_state::closed);
  CHECK(state() == 0.0);
}

TEST_CASE("collector: an adaptive limiter's circuit openings as a counter", "[prometheus]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  circuit_aimd limiter(io, floor_of_one(), {.name = "upstream"}, circuit_options());
  rein::prometheus::collector c;
  c.add(limiter);
  auto opens = [&] {
    const auto families = c.Collect();
    CHECK(find(families, "rein_circuit_opens_total")->type == prometheus::MetricType::Counter);
    return metric(families, "rein_circuit_opens_total", {{"limiter", "upstream"}})->counter.value;
  };
  auto congest = [&](int n) {
    for (int i = 0; i < n; ++i) {
      rein::permit p = limiter.try_acquire();
      REQUIRE(p);
      p.complete(rein::outcome::congestion);
    }
  };

  CHECK(opens() == 0.0);
  congest(3);
  REQUIRE(limiter.circuit() == rein::circuit_state::open);
  CHECK(opens() == 1.0);
  rein_test::advance_and_poll(io, 1s);
  congest(1);  // the half-open probe fails: the circuit opens again
  REQUIRE(limiter.circuit() == rein::circuit_state::open);
  CHECK(opens() == 2.0);
  rein_test::advance_and_poll(io, 1s);
  rein::permit probe = limiter.try_acquire();
  REQUIRE(probe);
  probe.complete(rein::outcome::success);
  REQUIRE(limiter.circuit() == rein::circuit_state::closed);
  CHECK(opens() == 2.0);  // closing does not count
}

TEST_CASE("collector: limiters without a circuit export no circuit state", "[prometheus]") {
  net::io_context io;
  rein::semaphore sem(io, 1, {.name = "db"});
  rein::prometheus::collector c;
  c.add(sem);
  const auto families = c.Collect();
  CHECK(find(families, "rein_circuit_state") == nullptr);
  CHECK(find(families, "rein_circuit_opens_total") == nullptr);
}

TEST_CASE("collector: an admission throttle's admissions and its refusals, reason admission", "[prometheus]") {
  rein_test::manual_clock_at_epoch epoch;
  rein::basic_admission_throttle<manual_clock> admit({.window = 10s, .name = "search"});
  CHECK(admit.try_acquire());
  for (int i = 0; i < 100; ++i) admit.record(rein::outcome::congestion);
  int refused = 0;
  for (int i = 0; i < 10; ++i) refused += admit.try_acquire() ? 0 : 1;  // admitted ones are never recorded here
  rein::prometheus::collector c;
  c.add(admit);
  const auto families = c.Collect();
  CHECK(metric(families, "rein_acquired_total", {{"limiter", "search"}})->counter.value == 11 - refused);
  CHECK(metric(families, "rein_rejected_total", {{"limiter", "search"}, {"reason", "admission"}})->counter.value ==
        refused);
  CHECK(refused > 0);
}

TEST_CASE("collector: a token bucket's reservations, those cancelled and the tokens they gave back", "[prometheus]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::basic_token_bucket<net::any_io_executor, manual_clock> b(io, {.rate = 10, .capacity = 10}, {.name = "api"});
  auto first = b.reserve(10);
  auto second = b.reserve(5);  // 500 ms into debt
  REQUIRE(first.ok());
  REQUIRE(second.ok());
  second.cancel();  // the last one: all 5 come back
  rein::prometheus::collector c;
  c.add(b);
  const auto families = c.Collect();
  CHECK(metric(families, "rein_reserved_total", {{"limiter", "api"}})->counter.value == 2);
  CHECK(metric(families, "rein_reservations_cancelled_total", {{"limiter", "api"}})->counter.value == 1);
  CHECK(metric(families, "rein_reserved_returned_total", {{"limiter", "api"}})->counter.value == 5);
}

TEST_CASE("collector: the windows' and rate_limits' reservations are exported as the bucket's", "[prometheus]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::basic_fixed_window<net::any_io_executor, manual_clock> fixed(io, {.limit = 3, .window = 1s}, {.name = "fixed"});
  rein::basic_sliding_window<net::any_io_executor, manual_clock> sliding(io, {.limit = 3, .window = 1s},
                                                                        {.name = "sliding"});
  rein::basic_rate_limiter<rein::algo::all_of<rein::algo::basic_sliding_window<manual_clock>>, net::any_io_executor>
      both(io, rein::algo::all_of{rein::algo::basic_sliding_window<manual_clock>({.limit = 3, .window = 1s},
                                                                                manual_clock::now())},
           {.name = "both"});
  auto f1 = fixed.reserve(3), f2 = fixed.reserve(2);   // the second in the next window
  auto s1 = sliding.reserve(3), s2 = sliding.reserve(2);  // the second when the first leaves
  auto b1 = both.reserve(1);
  CHECK(f2.cancel() == 2);
  CHECK(s2.cancel() == 2);
  rein::prometheus::collector c;
  c.add(fixed);
  c.add(sliding);
  c.add(both);
  const auto families = c.Collect();
  for (const char* name : {"fixed", "sliding"}) {
    CHECK(metric(families, "rein_reserved_total", {{"limiter", name}})->counter.value == 2);
    CHECK(metric(families, "rein_reservations_cancelled_total", {{"limiter", name}})->counter.value == 1);
    CHECK(metric(families, "rein_reserved_returned_total", {{"limiter", name}})->counter.value == 2);
  }
  CHECK(metric(families, "rein_reserved_total", {{"limiter", "both"}})->counter.value == 1);
  CHECK(metric(families, "rein_reservations_cancelled_total", {{"limiter", "both"}})->counter.value == 0);
}
