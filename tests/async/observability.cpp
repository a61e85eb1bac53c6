// One observability model: every primitive's wait (and service) histogram read exactly on the manual clock,
// its observer's events in order, names in events and errors, and the one-line formatting of snapshots.
#include "support/async.hpp"
#include "support/catch.hpp"

#include <rein/adaptive_limiter.hpp>
#include <rein/adaptive_rate_limiter.hpp>
#include <rein/algo/aimd.hpp>
#include <rein/keyed.hpp>
#include <rein/observer.hpp>
#include <rein/quota_gate.hpp>
#include <rein/retry.hpp>
#include <rein/semaphore.hpp>
#include <rein/sliding_window.hpp>
#include <rein/throttle.hpp>
#include <rein/token_bucket.hpp>

#include <chrono>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
namespace net = rein::net;
using rein::error_code;
using rein::permit;
using rein_test::advance_and_poll;
using rein_test::manual_clock;
using rein_test::poll;

using timed_semaphore = rein::basic_semaphore<net::any_io_executor, manual_clock>;
using timed_bucket = rein::basic_token_bucket<net::any_io_executor, manual_clock>;
using timed_window = rein::basic_sliding_window<net::any_io_executor, manual_clock>;
using timed_gate = rein::basic_quota_gate<net::any_io_executor, manual_clock>;
using timed_aimd = rein::basic_adaptive_limiter<rein::algo::aimd, net::any_io_executor, manual_clock>;
using timed_adaptive_rate = rein::basic_adaptive_rate_limiter<net::any_io_executor, manual_clock>;

// Collects every event as its one-line form.
struct recorder {
  std::shared_ptr<std::vector<std::string>> lines = std::make_shared<std::vector<std::string>>();
  rein::limiter_observer observer() const {
    return [lines = lines](const rein::limiter_event& e) {
      std::ostringstream out;
      out << e;
      lines->push_back(out.str());
    };
  }
  const std::vector<std::string>& operator*() const { return *lines; }
};

template <class T>
std::string line(const T& value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

}  // namespace

TEST_CASE("semaphore: the wait histogram holds one zero per immediate grant and each measured wait",
          "[observability][semaphore]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  recorder events;
  timed_semaphore sem(io, 1, {.name = "db", .max_waiters = 2, .observer = events.observer()});
  permit held = sem.try_acquire();  // at once: a zero wait
  REQUIRE(held);
  error_code e1, e2, e3;
  permit p1;
  bool d1 = false, d2 = false, d3 = false;
  sem.async_acquire(1, [&](error_code ec, permit p) { e1 = ec, p1 = std::move(p), d1 = true; });
  sem.async_acquire_for(1, 5ms, [&](error_code ec, permit) { e2 = ec, d2 = true; });
  sem.async_acquire(1, [&](error_code ec, permit) { e3 = ec, d3 = true; });  // a third waiter: queue_full
  poll(io);
  CHECK((d3 && e3 == rein::errc::queue_full));
  advance_and_poll(io, 5ms);
  CHECK((d2 && e2 == rein::errc::timed_out));
  advance_and_poll(io, 5ms);
  held.release();  // w1 has waited 10 ms
  poll(io);
  REQUIRE(d1);
  CHECK(p1);
  sem.add_permits(2);

  const rein::semaphore_snapshot s = sem.snapshot();
  CHECK(s.acquired_total == 2);
  CHECK(s.rejected_total == 2);
  CHECK(s.queue_full_total == 1);
  CHECK(s.timed_out_total == 1);
  CHECK(s.wait.count() == 2);
  CHECK(s.wait.bucket(0) == 1);
  CHECK(s.wait.p50() == 0ns);
  CHECK(s.wait.p90() == 10ms);  // the bucket's midpoint, 10,092,544 ns, clamped to max
  CHECK(s.wait.p99() == 10ms);
  CHECK(s.wait.max() == 10ms);
  CHECK(s.wait_total == 10ms);
  CHECK(s.limit == 3.0);
  CHECK(s.in_flight == 1);
  CHECK(*events == std::vector<std::string>{"rejected reason=queue_full count=1 name=db",
                                            "rejected reason=timed_out count=1 name=db",
                                            "limit_changed from=1 to=3 name=db"});
  CHECK(line(s) ==
        "in_flight=1 limit=3 utilisation=0.33 available=2 waiting=0 acquired=2 rejected=2 (queue_full=1 timed_out=1) "
        "wait[n=2 p50=0 p90=10.0ms p99=10.0ms max=10.0ms]");
}

TEST_CASE("semaphore: with measure_wait off the histogram stays empty", "[observability][semaphore]") {
  net::io_context io;
  rein::semaphore sem(io, 1, {.measure_wait = false});
  permit p = sem.try_acquire();
  CHECK(sem.snapshot().acquired_total == 1);
  CHECK(sem.snapshot().wait.count() == 0);
}

TEST_CASE("semaphore: a named semaphore's acquire names it in the error", "[observability][semaphore]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  timed_semaphore gate(io, 0, {.name = "db"});
  std::string what;
  net::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        try {
          co_await gate.acquire_for(1, 1ms);
        } catch (const rein::system_error& e) {
          CHECK(e.code() == rein::errc::timed_out);
          what = e.what();
        }
      },
      net::detached);
  poll(io);
  advance_and_poll(io, 1ms);
  CHECK(what.rfind("rein::semaphore \"db\"", 0) == 0);
  CHECK(gate.name() == "db");
}

TEST_CASE("token_bucket: waits of 0, 100 and 200 ms, and a rate change", "[observability][token_bucket]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  recorder events;
  timed_bucket bucket(io, {.rate = 10, .capacity = 1}, {.name = "api", .observer = events.observer()});
  int granted = 0;
  for (int i = 0; i < 3; ++i) bucket.async_acquire(1, [&](error_code ec) { granted += ec ? 0 : 1; });
  poll(io);
  advance_and_poll(io, 100ms);
  advance_and_poll(io, 100ms);
  CHECK(granted == 3);
  bucket.set_rate(20);
  const rein::token_bucket_snapshot s = bucket.snapshot();
  CHECK(s.wait.count() == 3);
  CHECK(s.wait.p50() == 99'614'720ns);   // 100 ms's bucket [98,566,144, 100,663,296), its midpoint
  CHECK(s.wait.p90() == 199'229'440ns);  // 200 ms's bucket [197,132,288, 201,326,592)
  CHECK(s.wait.max() == 200ms);
  CHECK(s.limit == 20.0);
  CHECK(*events == std::vector<std::string>{"limit_changed from=10 to=20 name=api"});
}

TEST_CASE("token_bucket: a named bucket's configuration errors name it", "[observability][token_bucket]") {
  net::io_context io;
  std::string what;
  try {
    rein::token_bucket bucket(io, {.rate = -1, .capacity = 1}, {.name = "api"});
  } catch (const std::invalid_argument& e) {
    what = e.what();
  }
  CHECK(what.rfind("rein::token_bucket \"api\": rate must be", 0) == 0);
  rein::token_bucket bucket(io, {.rate = 1, .capacity = 1}, {.name = "api"});
  CHECK_THROWS_WITH(bucket.set_rate(0), Catch::Matchers::StartsWith("rein::token_bucket \"api\": rate must be"));
  rein::token_bucket unnamed(io, {.rate = 1, .capacity = 1});
  CHECK_THROWS_WITH(unnamed.set_rate(0), Catch::Matchers::StartsWith("rein::token_bucket: rate must be"));
}

TEST_CASE("sliding_window: a deadline it cannot meet is a timed_out event; set_limit a limit change",
          "[observability][sliding_window]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  recorder events;
  timed_window window(io, {.limit = 1, .window = 1s}, {.name = "win", .observer = events.observer()});
  CHECK(window.try_acquire());
  error_code ec;
  window.async_acquire_for(1, 10ms, [&](error_code e) { ec = e; });
  poll(io);
  CHECK(ec == rein::errc::timed_out);
  window.set_limit(2);
  const auto s = window.snapshot();
  CHECK(s.utilisation == 0.5);
  CHECK(s.wait.count() == 1);
  CHECK(s.wait.p99() == 0ns);
  CHECK(*events == std::vector<std::string>{"rejected reason=timed_out count=1 name=win",
                                            "limit_changed from=1 to=2 name=win"});
}

TEST_CASE("adaptive_limiter: service times from grant to outcome; a cut reports limit, floor and ceiling",
          "[observability][adaptive_limiter]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  recorder events;
  timed_aimd limiter(io, {.initial_limit = 2, .min_limit = 1, .max_limit = 2, .backoff = 0.5, .learn_failure_rate = false},
                     {.name = "up", .observer = events.observer()});
  permit a = limiter.try_acquire();
  manual_clock::advance(5ms);
  a.complete(rein::outcome::success);  // at the ceiling already: no change
  permit b = limiter.try_acquire();
  manual_clock::advance(7ms);
  b.complete(rein::outcome::congestion);  // 2 * 0.5 = 1: the floor
  const rein::adaptive_limiter_snapshot s = limiter.snapshot();
  CHECK(s.service.count() == 2);
  CHECK(s.service.p50() == 5'046'272ns);  // 5 ms's bucket [4,980,736, 5,111,808), its midpoint
  CHECK(s.service.max() == 7ms);
  CHECK(s.wait.count() == 2);
  CHECK(s.wait.max() == 0ns);
  CHECK(s.limit == 1.0);
  CHECK(*events == std::vector<std::string>{"limit_changed from=2 to=1 name=up", "at_floor limit=1 name=up",
                                            "left_ceiling limit=1 name=up"});
}

TEST_CASE("adaptive_rate_limiter: a congestion report cuts the rate, with its service time",
          "[observability][adaptive_rate_limiter]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  recorder events;
  timed_adaptive_rate limiter(io, {.initial_rate = 10, .burst = 1, .min_rate = 1},
                              {.name = "llm", .observer = events.observer()});
  CHECK(limiter.try_acquire());
  const auto sent = manual_clock::now();
  manual_clock::advance(3ms);
  limiter.record(rein::outcome::congestion, sent);
  const auto s = limiter.snapshot();
  CHECK(s.service.count() == 1);
  CHECK(s.service.p50() == 3ms);
  CHECK(s.decreases == 1);
  REQUIRE((*events).size() == 1);
  CHECK((*events)[0] == "limit_changed from=10 to=" + line(s.rate) + " name=llm");
  CHECK(s.rate == 7.0);  // beta 0.7
}

TEST_CASE("quota_gate: a pause starts and ends; the waiter's wait is the pause", "[observability][quota_gate]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  recorder events;
  timed_gate gate(io, {.jitter = 0}, {.name = "host", .observer = events.observer()});
  gate.pause_for(1s);
  bool through = false;
  gate.async_acquire(1, [&](error_code ec) { through = !ec; });
  poll(io);
  CHECK_FALSE(through);
  advance_and_poll(io, 1s);
  CHECK(through);
  const auto s = gate.snapshot();
  CHECK(s.wait.count() == 1);
  CHECK(s.wait.p50() == 1s);
  CHECK(*events == std::vector<std::string>{"pause_started pause=1000000000ns name=host", "pause_ended name=host"});
}

TEST_CASE("keyed: snapshot(), refusals at the cap and evictions are reported with their key", "[observability][keyed]") {
  net::io_context io;
  recorder events;
  rein::keyed<rein::semaphore> per_host(io.get_executor(), 1, {},
                                        {.max_keys = 1, .name = "hosts", .observer = events.observer()});
  auto a = per_host.get("a");
  error_code ec;
  auto refused = per_host.get("b", ec);
  CHECK(ec == rein::errc::queue_full);
  a.reset();
  auto b = per_host.get("b");  // "a" is idle and unpinned: evicted to make room
  const rein::keyed_snapshot s = per_host.snapshot();
  CHECK(s.keys == 1);
  CHECK(s.created_total == 2);
  CHECK(s.evicted_total == 1);
  CHECK(s.rejected_total == 1);
  CHECK(s.utilisation == 1.0);
  CHECK(*events == std::vector<std::string>{"rejected reason=max_keys count=1 key=b name=hosts",
                                            "key_evicted key=a name=hosts"});
  CHECK(line(s) == "keys=1 max_keys=1 utilisation=1 created=2 evicted=1 rejected=1 (max_keys=1)");
  std::size_t visited = per_host.for_each_snapshot([](const std::string& key, const rein::semaphore_snapshot& k) {
    CHECK(key == "b");
    CHECK(k.limit == 1.0);
  });
  CHECK(visited == 1);
}

TEST_CASE("throttle: a refusal at the rate stage is a rejection with reason rate", "[observability][throttle]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  recorder events;
  timed_bucket rate(io, {.rate = 1, .capacity = 1});
  rein::throttle t(rate, {.name = "out", .observer = events.observer()});
  auto g1 = t.try_acquire("k");
  REQUIRE(g1);
  auto g2 = t.try_acquire("k");
  CHECK_FALSE(g2);
  rein::throttle_snapshot s = t.snapshot();
  CHECK(s.acquired_total == 1);
  CHECK(s.in_flight == 1);
  CHECK(s.rejected_total == 1);
  CHECK(s.rejected_rate == 1);
  CHECK(s.waiting == 0);
  CHECK(s.wait.count() == 1);
  CHECK(line(s) == "acquired=1 in_flight=1 waiting=0 rejected=1 (rate=1) cancelled=0 failed=0 reported=0 "
                   "readmitted=0 given_back=0 wait[n=1 p50=0 p90=0 p99=0 max=0]");
  g1.complete(rein::outcome::success);
  CHECK(t.snapshot().in_flight == 0);
  CHECK(*events == std::vector<std::string>{"rejected reason=rate count=1 name=out"});
}

TEST_CASE("throttle: waiting counts the callers past the fast path; wait times every admission, across stages",
          "[observability][throttle]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  timed_semaphore global(io, 1);
  timed_bucket rate(io, {.rate = 10, .capacity = 1});
  rein::throttle t(global, rate);
  auto first = t.try_acquire("k");  // at once: a zero wait
  REQUIRE(first);
  error_code waited_ec;
  rein::throttle<timed_semaphore, timed_bucket>::guard waited;
  t.async_acquire("k", [&](error_code ec, auto g) { waited_ec = ec, waited = std::move(g); });
  bool timed_out = false;
  net::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        try {
          co_await t.acquire_for("k", 5ms);
        } catch (const rein::system_error& e) {
          timed_out = e.code() == rein::errc::timed_out;
        }
      },
      net::detached);
  // async_acquire's coroutine starts 1 ms after its call: its wait counts from the call.
  manual_clock::advance(1ms);
  poll(io);
  CHECK(t.snapshot().waiting == 2);
  advance_and_poll(io, 5ms);
  REQUIRE(timed_out);
  CHECK(t.snapshot().waiting == 1);  // a failed wait leaves the count, and times nothing
  advance_and_poll(io, 5ms);
  first.complete(rein::outcome::success);  // at 11 ms: the global slot is free, the rate's next token at 100 ms
  poll(io);
  CHECK_FALSE(waited);
  advance_and_poll(io, 89ms);
  REQUIRE(waited);
  CHECK_FALSE(waited_ec);

  const rein::throttle_snapshot s = t.snapshot();
  CHECK(s.acquired_total == 2);
  CHECK(s.waiting == 0);
  CHECK(s.timed_out_total == 1);
  CHECK(s.wait.count() == 2);
  CHECK(s.wait.bucket(0) == 1);
  CHECK(s.wait.p50() == 0ns);
  CHECK(s.wait.p90() == 99'614'720ns);  // 100 ms's bucket [98,566,144, 100,663,296), its midpoint
  CHECK(s.wait.max() == 100ms);  // from the call at 0, not from the coroutine's start at 1 ms
  CHECK(line(s) == "acquired=2 in_flight=1 waiting=0 rejected=1 (timed_out=1) cancelled=0 failed=1 reported=0 "
                   "readmitted=0 given_back=0 wait[n=2 p50=0 p90=99.6ms p99=99.6ms max=100ms]");
}

TEST_CASE("retry: snapshot() counts the calls that ended without success by reason", "[observability][retry]") {
  rein::retry_policy policy({.budget = std::nullopt, .seed = 1, .name = "calls"});
  policy.on_request();
  const auto d = policy.on_attempt(1, rein::attempt<>::permanent(rein::errc::closed));
  CHECK(d.stop == rein::retry_stop::permanent_failure);
  const rein::retry_snapshot s = policy.snapshot();
  CHECK(s.rejected_total == 1);
  CHECK(s.permanent_total == 1);
  CHECK(policy.name() == "calls");
  CHECK(line(s) == "requests=1 attempts=1 retries=0 succeeded=0 rejected=1 (permanent=1)");
}
