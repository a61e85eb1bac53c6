// The throttle guard: stage order, give-back on failure, try mode, 429 pauses, and issue 5's cases 4 and 5.
#include "support/asio.hpp"
#include "support/catch.hpp"
#include "support/manual_time.hpp"

#include <rein/adaptive_limiter.hpp>
#include <rein/keyed.hpp>
#include <rein/quota_gate.hpp>
#include <rein/semaphore.hpp>
#include <rein/throttle.hpp>
#include <rein/token_bucket.hpp>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

using namespace std::chrono_literals;
namespace net = rein::net;
using rein_test::advance_and_poll;
using rein_test::manual_clock;
using rein_test::since_epoch;

namespace {

using executor = net::any_io_executor;
using gate_type = rein::basic_quota_gate<executor, manual_clock>;
using bucket_type = rein::basic_token_bucket<executor, manual_clock>;
using sem_type = rein::basic_semaphore<executor, std::mutex, manual_clock>;

rein::quota_gate_options no_jitter() {
  rein::quota_gate_options o;
  o.jitter = 0.0;
  return o;
}

// The stages of issue 5's cases: rate 100/s burst 100, global 10, per-key 1, gates without jitter.
struct stages {
  net::io_context io;
  rein::keyed<gate_type> gates{io.get_executor(), rein::keyed_options{}, no_jitter()};
  bucket_type rate{io.get_executor(), rein::token_bucket_options{.rate = 100, .capacity = 100}};
  sem_type global{io.get_executor(), 10};
  rein::keyed<sem_type> per_key{io.get_executor(), rein::keyed_options{}, std::size_t{1}};
  rein::throttle<rein::keyed<gate_type>, bucket_type, sem_type, rein::keyed<sem_type>> throttle{gates, rate, global,
                                                                                                 per_key};
};

}  // namespace

TEST_CASE("try mode: requests refused at the key stage consume nothing (issue 5 case 4)", "[throttle]") {
  rein_test::manual_clock_at_epoch epoch;
  stages s;
  std::vector<rein::throttle_guard<decltype(s.throttle)>> admitted;
  int refused_at_key = 0;
  for (int i = 0; i < 20; ++i) {
    auto g = s.throttle.try_acquire("K");
    if (g) admitted.push_back(std::move(g));
    else if (g.rejected_at() == rein::throttle_stage::per_key) ++refused_at_key;
  }
  CHECK(admitted.size() == 1);
  CHECK(refused_at_key == 19);
  CHECK(s.global.snapshot().in_flight == 1);
  CHECK(s.rate.tokens() == 99.0);  // the 19 refused requests had their tokens refunded

  manual_clock::advance(10ms);
  auto l = s.throttle.try_acquire("L");
  CHECK(static_cast<bool>(l));
  CHECK(s.global.snapshot().in_flight == 2);
  const auto snap = s.throttle.snapshot();
  CHECK(snap.admitted_total == 2);
  CHECK(snap.rejected_per_key == 19);
}

TEST_CASE("waiting mode: one key's backlog holds no global slot (issue 5 case 5)", "[throttle]") {
  rein_test::manual_clock_at_epoch epoch;
  stages s;
  std::vector<double> k_admitted_at;
  std::optional<double> l_admitted_at;
  auto hold = [&](std::string key, bool is_l) -> net::awaitable<void> {
    auto g = co_await s.throttle.acquire(key);
    const double t = std::chrono::duration<double>(since_epoch()).count();
    if (is_l) l_admitted_at = t;
    else k_admitted_at.push_back(t);
    net::basic_waitable_timer<manual_clock> timer(s.io, 1s);
    co_await timer.async_wait(net::use_awaitable);
    g.complete(rein::outcome::success);
  };
  for (int i = 0; i < 20; ++i) net::co_spawn(s.io, hold("K", false), net::detached);
  rein_test::poll(s.io);
  CHECK(k_admitted_at.size() == 1);
  CHECK(s.global.snapshot().in_flight == 1);  // 19 wait for K's permit, holding no global slot

  advance_and_poll(s.io, 100ms);
  net::co_spawn(s.io, hold("L", true), net::detached);
  rein_test::poll(s.io);
  REQUIRE(l_admitted_at.has_value());
  CHECK(*l_admitted_at == 0.1);
  CHECK(s.global.snapshot().in_flight == 2);

  // K's callers go one per second, each as the previous one completes.
  for (int i = 1; i <= 25; ++i) rein_test::set_and_poll(s.io, manual_clock::time_point(i * 1s));
  REQUIRE(k_admitted_at.size() == 20);
  CHECK(k_admitted_at[1] == 1.0);
  CHECK(k_admitted_at[19] == 19.0);
  CHECK(s.global.snapshot().in_flight == 0);
}

TEST_CASE("a timeout at the per-key stage refunds the rate token and holds nothing", "[throttle]") {
  rein_test::manual_clock_at_epoch epoch;
  stages s;
  auto first = s.throttle.try_acquire("K");
  REQUIRE(first);
  CHECK(s.rate.tokens() == 99.0);
  std::optional<rein::error_code> result;
  s.throttle.async_acquire_until("K", manual_clock::now() + 50ms,
                                 [&](rein::error_code ec, rein::throttle_guard<decltype(s.throttle)> g) {
                                   result = ec;
                                   CHECK_FALSE(g);
                                 });
  rein_test::poll(s.io);
  CHECK_FALSE(result.has_value());
  CHECK(s.rate.tokens() == 98.0);  // taken while it waits for K's permit
  advance_and_poll(s.io, 50ms);
  REQUIRE(result.has_value());
  CHECK(*result == rein::errc::timed_out);
  // 98 + 5 refilled in 50 ms + 1 refunded
  CHECK(s.rate.tokens() == 100.0);
  CHECK(s.global.snapshot().in_flight == 1);
  CHECK(s.throttle.snapshot().failed_total == 1);
}

TEST_CASE("cancelling the waiting coroutine gives back what earlier stages took", "[throttle]") {
  rein_test::manual_clock_at_epoch epoch;
  stages s;
  auto first = s.throttle.try_acquire("K");
  REQUIRE(first);
  net::cancellation_signal signal;
  std::optional<rein::error_code> result;
  s.throttle.async_acquire("K", net::bind_cancellation_slot(signal.slot(), [&](rein::error_code ec, auto g) {
                             result = ec;
                             CHECK_FALSE(g);
                           }));
  rein_test::poll(s.io);
  CHECK(s.per_key.snapshot("K")->waiting == 1);
  CHECK(s.rate.tokens() == 98.0);
  signal.emit(net::cancellation_type::partial);
  rein_test::poll(s.io);
  REQUIRE(result.has_value());
  CHECK(*result == net::error::operation_aborted);
  CHECK(s.rate.tokens() == 99.0);
  CHECK(s.per_key.snapshot("K")->waiting == 0);
}

TEST_CASE("reject pauses the key for every caller until Retry-After passes", "[throttle]") {
  rein_test::manual_clock_at_epoch epoch;
  stages s;
  {
    auto g = s.throttle.try_acquire("K");
    REQUIRE(g);
    g.reject(std::optional<manual_clock::duration>(2s));
    CHECK_FALSE(g);
  }
  CHECK(s.throttle.try_acquire("K").rejected_at() == rein::throttle_stage::gate);
  CHECK(static_cast<bool>(s.throttle.try_acquire("L")));  // other keys are not paused

  std::optional<double> admitted_at;
  net::co_spawn(
      s.io,
      [&]() -> net::awaitable<void> {
        auto g = co_await s.throttle.acquire("K");
        admitted_at = std::chrono::duration<double>(since_epoch()).count();
      },
      net::detached);
  advance_and_poll(s.io, 1999ms);
  CHECK_FALSE(admitted_at.has_value());
  advance_and_poll(s.io, 1ms);
  REQUIRE(admitted_at.has_value());
  CHECK(*admitted_at == 2.0);
  CHECK(s.throttle.snapshot().rejections_reported == 1);
}

TEST_CASE("reject with a Retry-After field value pauses for that many seconds", "[throttle]") {
  rein_test::manual_clock_at_epoch epoch;
  stages s;
  s.throttle.try_acquire("K").reject(std::string_view("3"));
  CHECK(s.gates.get("K")->paused_until() == manual_clock::time_point(3s));
  s.throttle.try_acquire("L").reject(std::string_view("soon"));  // unusable: the default pause, 1 s
  CHECK(s.gates.get("L")->paused_until() == manual_clock::time_point(1s));
}

TEST_CASE("a guard dropped without an outcome releases everything", "[throttle]") {
  rein_test::manual_clock_at_epoch epoch;
  stages s;
  { auto g = s.throttle.try_acquire("K"); }
  CHECK(s.global.snapshot().in_flight == 0);
  CHECK(s.per_key.snapshot("K")->in_flight == 0);
  CHECK(s.rate.tokens() == 99.0);  // an admitted request's token is spent, not refunded
}

TEST_CASE("stages may be unlimited; an adaptive global limiter learns from guards", "[throttle]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::basic_adaptive_limiter<rein::algo::basic_aimd<manual_clock>, executor, manual_clock> global(
      io.get_executor(), rein::algo::aimd_options{.initial_limit = 4, .min_limit = 1, .max_limit = 10, .backoff = 0.5});
  rein::throttle t(rein::unlimited, rein::unlimited, global, rein::unlimited);
  auto g = t.try_acquire("any");
  REQUIRE(g);
  g.complete(rein::outcome::congestion);
  CHECK(global.snapshot().limit == 2.0);
  CHECK(global.snapshot().in_flight == 0);
}

TEST_CASE("throttle rejects a default_pause that is not positive", "[throttle]") {
  stages s;
  rein::throttle_options bad;
  bad.default_pause = 0s;
  CHECK_THROWS_WITH((rein::throttle(s.gates, s.rate, s.global, s.per_key, bad)),
                    "rein::throttle: default_pause must be > 0, got 0 ns");
}
