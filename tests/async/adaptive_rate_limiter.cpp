// rein::adaptive_rate_limiter (async layer) on the manual clock: feedback re-times queued waiters both ways,
// stale congestion is ignored, snapshots, option errors, and completion through the usual doors.
#include "support/catch.hpp"

#include <rein/adaptive_rate_limiter.hpp>
#include <rein/error.hpp>
#include <rein/testing/manual_clock.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#else
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>
#endif

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
namespace net = rein::net;
using clock_type = rein::testing::manual_clock;
using time_point = clock_type::time_point;
using limiter = rein::basic_adaptive_rate_limiter<net::any_io_executor, clock_type>;
using rein::errc;
using rein::error_code;
using rein::outcome;

time_point at(std::chrono::nanoseconds d) { return time_point{} + d; }

std::string show(time_point t) {
  const std::int64_t ns = t.time_since_epoch().count();
  if (ns % 1'000'000 == 0) return std::to_string(ns / 1'000'000) + "ms";
  return std::to_string(ns) + "ns";
}

std::string show(const error_code& ec) {
  if (!ec) return "ok";
  if (ec == errc::timed_out) return "timed_out";
  if (ec == errc::closed) return "closed";
  if (ec == net::error::operation_aborted) return "aborted";
  return ec.message();
}

struct completion_log {
  std::vector<std::string> lines;
  auto handler(int id) {
    return [this, id](error_code ec) { lines.push_back(std::to_string(id) + " " + show(clock_type::now()) + " " + show(ec)); };
  }
};

struct fixture {
  net::io_context io;
  fixture() { clock_type::reset(); }

  std::size_t poll_at(time_point t) {
    clock_type::set(t);
    io.restart();
    return io.poll();
  }
};

// The cubic curve alone (no measuring window closes in these tests, no slow start), with exact decimal rates.
limiter::rule_type options(double initial, std::int64_t burst) {
  limiter::rule_type o;
  o.initial_rate = initial;
  o.burst = burst;
  o.beta = 0.5;
  o.measure_interval = 1000h;
  o.slow_start = false;
  return o;
}

}  // namespace

TEST_CASE("adaptive_rate_limiter: a 429 re-times the queued waiter later, from that instant") {
  fixture f;
  completion_log log;
  limiter l(f.io, options(10, 1));
  REQUIRE(l.try_acquire());
  l.async_acquire(1, log.handler(0));  // due at 100 ms at 10/s
  f.poll_at(at(50ms));
  l.record(outcome::congestion, at(0ms));  // half a token is there; the other half takes 100 ms at 5/s
  CHECK(l.rate() == 5);
  f.poll_at(at(100ms));
  CHECK(log.lines.empty());
  f.poll_at(at(150ms) - 1ns);
  CHECK(log.lines.empty());
  f.poll_at(at(150ms));
  CHECK(log.lines == std::vector<std::string>{"0 150ms ok"});
}

TEST_CASE("adaptive_rate_limiter: a success that raises the rate grants the queued waiter earlier") {
  fixture f;
  completion_log log;
  auto o = options(1, 1);
  o.scale = 1;  // 1 + t^3 per second before any congestion
  limiter l(f.io, o);
  REQUIRE(l.try_acquire());
  l.async_acquire(1, log.handler(0));  // due at 1 s at 1/s
  f.poll_at(at(500ms));
  CHECK(log.lines.empty());
  // At 0.5 s: half a token is there; the rate becomes 1 + 0.125 = 1.125, so the other half takes 4/9 s.
  l.record(outcome::success, at(400ms));
  CHECK(l.rate() == 1.125);
  f.poll_at(at(500ms) + 444'444'444ns);
  CHECK(log.lines.empty());
  f.poll_at(at(500ms) + 444'444'445ns);
  CHECK(log.lines == std::vector<std::string>{"0 944444445ns ok"});
}

TEST_CASE("adaptive_rate_limiter: congestion from before the latest cut is ignored; ignored outcomes do nothing") {
  fixture f;
  limiter l(f.io, options(100, 1));
  f.poll_at(at(10ms));
  l.record(outcome::congestion, at(0ms));
  CHECK(l.rate() == 50);
  f.poll_at(at(12ms));
  l.record(outcome::congestion, at(5ms));  // sent under the old rate
  l.record(outcome::ignored, at(11ms));
  CHECK(l.rate() == 50);
  l.record(outcome::congestion, at(10ms));
  CHECK(l.rate() == 25);
  const auto s = l.snapshot();
  CHECK(s.decreases == 2);
  CHECK(s.stale_congestion == 1);
  CHECK(s.rate_at_decrease == 50);
}

TEST_CASE("adaptive_rate_limiter: any clock reading as the send time is safe, the extremes included") {
  // Under UBSan: `now - sent` overflowed for time_point::min(). A send time in the future reads as no
  // service time at all; one as far back as min() as the longest.
  fixture f;
  limiter l(f.io, options(100, 1));
  f.poll_at(at(10ms));
  l.record(outcome::success, time_point::min());
  l.record(outcome::success, time_point::max());
  l.record(outcome::congestion, time_point::max(), std::chrono::nanoseconds::max());
  l.record(outcome::congestion, time_point::min(), std::chrono::nanoseconds::min());
  const auto s = l.snapshot();
  CHECK(s.service.count() == 4);
  CHECK(s.service.max() == std::chrono::nanoseconds::max());
  CHECK(s.decreases == 1);  // the send from max() cut; the one from min() is before that cut, stale
  CHECK(s.stale_congestion == 1);
}

TEST_CASE("adaptive_rate_limiter: the snapshot shows rate, tokens, burst, bounds and waiting") {
  fixture f;
  completion_log log;
  auto o = options(2, 3);
  o.min_rate = 1;
  limiter l(f.io, o);
  CHECK(l.try_acquire(3));
  l.async_acquire(1, log.handler(0));
  auto s = l.snapshot();
  CHECK(s.rate == 2);
  CHECK(s.tokens == 0);
  CHECK(s.burst == 3);
  CHECK_FALSE(s.measured_rate);
  CHECK(s.waiting == 1);
  CHECK(s.acquired_total == 1);
  CHECK_FALSE(s.at_floor);
  l.record(outcome::congestion, at(0ms));
  s = l.snapshot();
  CHECK(s.rate == 1);
  CHECK(s.at_floor);
  f.poll_at(at(1s));
  CHECK(log.lines == std::vector<std::string>{"0 1000ms ok"});
  CHECK(l.snapshot().wait_total == 1s);
}

TEST_CASE("adaptive_rate_limiter: the sending rate is measured from the grants") {
  fixture f;
  auto o = options(100, 100);
  o.measure_interval = 1s;
  limiter l(f.io, o);
  for (int i = 0; i < 25; ++i) {  // 25 per second: one every 40 ms
    f.poll_at(at(40ms * i));
    REQUIRE(l.try_acquire());
  }
  f.poll_at(at(1s));
  CHECK_FALSE(l.measured_rate());  // measured when a take or feedback closes the window
  REQUIRE(l.try_acquire());
  CHECK(l.measured_rate() == 25);  // 24 grants after the first in 0.96 s
  f.poll_at(at(1500ms));  // the new window has one grant so far: no rate of its own yet
  l.record(outcome::congestion, at(1s));
  CHECK(l.rate() == 12.5);  // beta 0.5 times the 25 per second actually sent, not the 100 allowed
}

TEST_CASE("adaptive_rate_limiter: invalid options throw, naming rein::adaptive_rate_limiter") {
  fixture f;
  auto o = options(10, 1);
  o.initial_rate = 0;
  try {
    limiter l(f.io, o);
    FAIL("no exception");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()) == "rein::adaptive_rate_limiter: initial_rate must be in [min_rate, max_rate], got 0");
  }
  o = options(10, 0);
  CHECK_THROWS_WITH(limiter(f.io, o), "rein::adaptive_rate_limiter: burst must be in [1, 1e15] tokens, got 0");
  CHECK_THROWS_WITH(limiter(f.io, o, {.name = "llm"}),
                    "rein::adaptive_rate_limiter \"llm\": burst must be in [1, 1e15] tokens, got 0");
}

TEST_CASE("adaptive_rate_limiter: coroutines wait in FIFO order; deadlines and close complete as documented") {
  fixture f;
  limiter l(f.io, options(10, 1));
  std::vector<std::string> events;
  auto worker = [&](int id) -> net::awaitable<void> {
    try {
      co_await l.acquire();
      events.push_back(std::to_string(id) + " " + show(clock_type::now()));
    } catch (const rein::system_error& e) {
      events.push_back(std::to_string(id) + " " + show(e.code()));
    }
  };
  for (int id = 0; id < 3; ++id) {
    net::co_spawn(f.io, worker(id), [](std::exception_ptr e) {
      if (e) std::rethrow_exception(e);
    });
  }
  f.poll_at(at(0ms));
  completion_log log;
  l.async_acquire_for(1, 150ms, log.handler(9));  // third in line: due at 300 ms
  f.poll_at(at(100ms));
  f.poll_at(at(150ms));
  l.close();
  f.poll_at(at(150ms));
  CHECK(events == std::vector<std::string>{"0 0ms", "1 100ms", "2 closed"});
  CHECK(log.lines == std::vector<std::string>{"9 150ms timed_out"});
}

TEST_CASE("adaptive_rate_limiter: takes and feedback from several threads at once keep every count") {
  fixture f;
  auto o = options(1e6, 1000);
  o.measure_interval = 1ms;
  limiter l(f.io, o);
  constexpr int rounds = 20000;
  std::atomic<int> taken{0};
  std::thread taker([&] {
    for (int i = 0; i < rounds; ++i) {
      if (l.try_acquire()) ++taken;
      if (i % 64 == 0) clock_type::advance(1ms);
    }
  });
  std::thread reporter([&] {
    for (int i = 0; i < rounds; ++i) l.record(i % 8 == 0 ? outcome::congestion : outcome::success, clock_type::now());
  });
  taker.join();
  reporter.join();
  const auto s = l.snapshot();
  CHECK(s.acquired_total == static_cast<std::uint64_t>(taken.load()));
  CHECK(s.decreases + s.stale_congestion + s.margin_widenings + s.failed_probes == rounds / 8);
  CHECK(s.rate >= o.min_rate);
  CHECK(s.rate <= o.max_rate);
}
