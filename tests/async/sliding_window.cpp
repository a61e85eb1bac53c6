// rein::sliding_window (async layer), and rein::basic_rate_limiter over other pure limits (all_of, the
// sliding window counter): grant times on the manual clock, deadlines judged at once, re-timing of queued
// waiters, refunds, snapshots, and the comparison with the token bucket of issue 3's case 9.
#include "support/catch.hpp"

#include <rein/algo/all_of.hpp>
#include <rein/algo/sliding_window_counter.hpp>
#include <rein/error.hpp>
#include <rein/rate_limiter.hpp>
#include <rein/sliding_window.hpp>
#include <rein/testing/manual_clock.hpp>
#include <rein/token_bucket.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#else
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
namespace net = rein::net;
using clock_type = rein::testing::manual_clock;
using time_point = clock_type::time_point;
using window_limiter = rein::basic_sliding_window<net::any_io_executor, clock_type>;
using bucket = rein::basic_token_bucket<net::any_io_executor, clock_type>;
using algo_bucket = rein::algo::basic_token_bucket<clock_type>;
using algo_window = rein::algo::basic_sliding_window<clock_type>;
using rein::errc;
using rein::error_code;

time_point at(std::chrono::nanoseconds d) { return time_point{} + d; }

std::string show(time_point t) {
  const std::int64_t ns = t.time_since_epoch().count();
  if (ns % 1'000'000 == 0) return std::to_string(ns / 1'000'000) + "ms";
  return std::to_string(ns) + "ns";
}

std::string show(const error_code& ec) {
  if (!ec) return "ok";
  if (ec == errc::timed_out) return "timed_out";
  if (ec == errc::queue_full) return "queue_full";
  if (ec == errc::closed) return "closed";
  if (ec == errc::exceeds_capacity) return "exceeds_capacity";
  if (ec == net::error::operation_aborted) return "aborted";
  return ec.message();
}

// Completions in the order they ran, as "<id> <manual time> <outcome>".
struct completion_log {
  std::vector<std::string> lines;
  std::vector<time_point> granted;  // the times of the successful ones
  auto handler(int id) {
    return [this, id](error_code ec) {
      lines.push_back(std::to_string(id) + " " + show(clock_type::now()) + " " + show(ec));
      if (!ec) granted.push_back(clock_type::now());
    };
  }
};

// A test's io_context on a manual clock starting at zero.
struct fixture {
  net::io_context io;
  fixture() { clock_type::reset(); }

  // Restarts first: an io_context that ran out of work is stopped, and poll() would then run nothing.
  std::size_t poll_at(time_point t) {
    clock_type::set(t);
    io.restart();
    return io.poll();
  }

  // Polls now, then steps to `end` by `step`, polling one nanosecond before and at each step: a completion
  // logged at a step's time was granted at exactly that time (the clock's tick is a nanosecond).
  std::size_t run_to(time_point end, std::chrono::nanoseconds step) {
    std::size_t handlers = poll_at(clock_type::now());
    for (time_point t = clock_type::now() + step; t <= end; t += step) {
      handlers += poll_at(t - 1ns);
      handlers += poll_at(t);
    }
    return handlers;
  }
};

// The most starts in any window of length w (closed on the left, open on the right) among sorted times.
std::size_t most_in_any_window(const std::vector<time_point>& starts, std::chrono::nanoseconds w) {
  std::size_t most = 0;
  for (std::size_t i = 0; i < starts.size(); ++i) {
    const auto end = std::lower_bound(starts.begin(), starts.end(), starts[i] + w);
    most = std::max(most, static_cast<std::size_t>(end - starts.begin()) - i);
  }
  return most;
}

}  // namespace

// ---- Issue 3, case 9 ------------------------------------------------------------------------------------

TEST_CASE("case 9: 2 per 10 s grants waits from 0.00 .. 0.04 at 0.00, 0.01, 10.00, 10.01, 20.00; the bucket "
          "of the same average rate at 0, 0.01, 5, 10, 15",
          "[sliding_window][acceptance]") {
  fixture f;
  completion_log window_log, bucket_log;
  window_limiter w(f.io, {.limit = 2, .window = 10s});
  bucket b(f.io, {.rate = 0.2, .capacity = 2});
  for (int i = 0; i < 5; ++i) {
    clock_type::set(at(i * 10ms));
    w.async_acquire(1, window_log.handler(i));
    b.async_acquire(1, bucket_log.handler(i));
    f.poll_at(at(i * 10ms));
  }
  f.run_to(at(21s), 10ms);
  CHECK(window_log.lines ==
        std::vector<std::string>{"0 0ms ok", "1 10ms ok", "2 10000ms ok", "3 10010ms ok", "4 20000ms ok"});
  CHECK(bucket_log.lines ==
        std::vector<std::string>{"0 0ms ok", "1 10ms ok", "2 5000ms ok", "3 10000ms ok", "4 15000ms ok"});
  // Why the difference matters: the bucket let 3 calls start within one 10 s window (0.01, 5, 10); the
  // window never lets more than 2.
  CHECK(most_in_any_window(window_log.granted, 10s) == 2);
  CHECK(most_in_any_window(bucket_log.granted, 10s) == 3);
}

// ---- Deadlines ------------------------------------------------------------------------------------------

TEST_CASE("a single-start wait that would be granted after its deadline fails at once", "[sliding_window][deadline]") {
  fixture f;
  completion_log log;
  window_limiter w(f.io, {.limit = 2, .window = 10s});
  CHECK(w.try_acquire());
  f.poll_at(at(10ms));
  CHECK(w.try_acquire());
  w.async_acquire(1, log.handler(0));                    // at 10.00 s
  w.async_acquire_until(1, at(10005ms), log.handler(1));  // at 10.01 s: after its deadline
  w.async_acquire_until(1, at(10010ms), log.handler(2));  // second in line: at 10.01 s, meets it exactly
  w.async_acquire_until(1, at(19999ms), log.handler(3));  // third: when 10.00 s's start leaves, at 20.00 s
  f.poll_at(at(10ms));
  CHECK(log.lines == std::vector<std::string>{"1 10ms timed_out", "3 10ms timed_out"});
  f.run_to(at(21s), 10ms);
  CHECK(log.lines == std::vector<std::string>{"1 10ms timed_out", "3 10ms timed_out", "0 10000ms ok", "2 10010ms ok"});
  CHECK(w.snapshot().timed_out_total == 2);
}

TEST_CASE("behind a multi-start waiter, a wait the prediction lets through still times out at its deadline",
          "[sliding_window][deadline]") {
  fixture f;
  completion_log log;
  window_limiter w(f.io, {.limit = 2, .window = 10s});
  CHECK(w.try_acquire());
  f.poll_at(at(10ms));
  CHECK(w.try_acquire());
  w.async_acquire(2, log.handler(0));  // both starts at 10.01 s
  // Counted as single starts, this one could go at 20.00 s; behind a pair it goes at 20.01 s. The lower
  // bound keeps it waiting, and it expires at its deadline, having taken nothing.
  w.async_acquire_until(1, at(20005ms), log.handler(1));
  w.async_acquire(1, log.handler(2));
  f.run_to(at(21s), 5ms);
  CHECK(log.lines == std::vector<std::string>{"0 10010ms ok", "1 20005ms timed_out", "2 20010ms ok"});
}

// ---- Re-timing queued waiters ---------------------------------------------------------------------------

TEST_CASE("a raised limit grants queued waiters at once; a lowered one holds them back",
          "[sliding_window][set_limit]") {
  fixture f;
  completion_log log;
  window_limiter w(f.io, {.limit = 2, .window = 1s});
  CHECK(w.try_acquire(2));
  for (int i = 0; i < 3; ++i) w.async_acquire(1, log.handler(i));
  f.poll_at(at(100ms));
  w.set_limit(3);
  f.poll_at(at(100ms));
  CHECK(log.lines == std::vector<std::string>{"0 100ms ok"});
  f.poll_at(at(200ms));
  w.set_limit(1);  // keeps the latest start (0.1 s): the next fits at 1.1 s
  f.run_to(at(2500ms), 10ms);
  CHECK(log.lines == std::vector<std::string>{"0 100ms ok", "1 1100ms ok", "2 2100ms ok"});
  CHECK(w.limit() == 1);
}

TEST_CASE("a shorter window grants queued waiters earlier, a longer one later", "[sliding_window][set_window]") {
  fixture f;
  completion_log log;
  window_limiter w(f.io, {.limit = 1, .window = 1s});
  CHECK(w.try_acquire());
  w.async_acquire(1, log.handler(0));  // at 1 s
  w.async_acquire(1, log.handler(1));
  f.poll_at(at(100ms));
  w.set_window(500ms);
  f.run_to(at(600ms), 10ms);
  CHECK(log.lines == std::vector<std::string>{"0 500ms ok"});
  w.set_window(2s);  // the start at 0.5 s now counts until 2.5 s
  f.run_to(at(3s), 10ms);
  CHECK(log.lines == std::vector<std::string>{"0 500ms ok", "1 2500ms ok"});
  CHECK(w.window() == 2s);
}

TEST_CASE("a waiter queued for more than a lowered limit is served when the window is empty",
          "[sliding_window][set_limit]") {
  fixture f;
  completion_log log;
  window_limiter w(f.io, {.limit = 3, .window = 1s});
  CHECK(w.try_acquire(1));
  f.poll_at(at(200ms));
  CHECK(w.try_acquire(2));
  w.async_acquire(3, log.handler(0));  // at 1.2 s
  f.poll_at(at(300ms));
  w.set_limit(1);  // keeps the start at 0.2 s; the waiter, asking for more than 1, goes when it leaves
  w.async_acquire(2, log.handler(1));
  f.run_to(at(1500ms), 10ms);
  CHECK(log.lines == std::vector<std::string>{"1 300ms exceeds_capacity", "0 1200ms ok"});
  CHECK(w.snapshot().in_window == 1);
}

TEST_CASE("a refund forgets the oldest start in the window and lets a waiter in at once", "[sliding_window][refund]") {
  fixture f;
  completion_log log;
  window_limiter w(f.io, {.limit = 2, .window = 10s});
  CHECK(w.try_acquire(2));
  w.async_acquire(1, log.handler(0));
  f.poll_at(at(1s));
  w.refund(1);  // e.g. the call was never sent
  f.poll_at(at(1s));
  CHECK(log.lines == std::vector<std::string>{"0 1000ms ok"});
  CHECK(w.snapshot().in_window == 2);
}

TEST_CASE("snapshot: starts in the window, room left, waiting, totals", "[sliding_window][snapshot]") {
  fixture f;
  completion_log log;
  window_limiter w(f.io, {.limit = 3, .window = 1s});
  CHECK(w.try_acquire(2));
  f.poll_at(at(400ms));
  CHECK(w.try_acquire());
  w.async_acquire(2, log.handler(0));             // at 1 s, when both starts of 0 s have left
  w.async_acquire_for(1, 500ms, log.handler(1));  // third in line: at 1.4 s, past 0.9 s: fails at once
  f.poll_at(at(400ms));
  f.poll_at(at(500ms));
  auto s = w.snapshot();
  CHECK(s.in_window == 3);
  CHECK(s.available == 0);
  CHECK(s.limit == 3);
  CHECK(s.window == 1s);
  CHECK(s.waiting == 1);
  CHECK(s.acquired_total == 2);
  CHECK(s.timed_out_total == 1);
  CHECK(s.rejected_total == 1);
  f.run_to(at(1500ms), 10ms);
  s = w.snapshot();
  CHECK(log.lines == std::vector<std::string>{"1 400ms timed_out", "0 1000ms ok"});
  CHECK(s.in_window == 2);  // the two of 1 s; 0.4 s's has left
  CHECK(s.available == 1);
  CHECK(s.waiting == 0);
  CHECK(s.acquired_total == 3);
  CHECK(s.wait_total == 600ms);
}

TEST_CASE("requests above the limit fail at once; invalid options name the field and the value",
          "[sliding_window][validation]") {
  fixture f;
  completion_log log;
  window_limiter w(f.io, {.limit = 2, .window = 1s});
  CHECK_FALSE(w.try_acquire(3));
  w.async_acquire(3, log.handler(0));
  f.poll_at(time_point{});
  CHECK(log.lines == std::vector<std::string>{"0 0ms exceeds_capacity"});
  CHECK_THROWS_WITH(window_limiter(f.io, {.limit = 0, .window = 1s}),
                    "rein::sliding_window: limit must be in [1, 2^27], got 0");
  CHECK_THROWS_WITH(window_limiter(f.io, {.limit = 1, .window = -1s}),
                    "rein::sliding_window: window must be > 0, got -1000000000 ns");
  CHECK_THROWS_WITH(window_limiter(f.io, {.limit = 1}), "rein::sliding_window: window must be > 0, got 0 ns");
  CHECK_THROWS_WITH(w.set_limit(-2), "rein::sliding_window: limit must be in [1, 2^27], got -2");
  CHECK_THROWS_WITH(w.set_window(0s), "rein::sliding_window: window must be > 0, got 0 ns");
  CHECK(w.limit() == 2);
  CHECK(w.window() == 1s);
}

TEST_CASE("a cancelled window waiter records no start", "[sliding_window][cancellation]") {
  fixture f;
  completion_log log;
  window_limiter w(f.io, {.limit = 1, .window = 1s});
  CHECK(w.try_acquire());
  net::cancellation_signal cancel;
  w.async_acquire(1, net::bind_cancellation_slot(cancel.slot(), log.handler(0)));
  w.async_acquire(1, log.handler(1));
  f.poll_at(at(500ms));
  cancel.emit(net::cancellation_type::partial);
  f.run_to(at(2500ms), 10ms);
  CHECK(log.lines == std::vector<std::string>{"0 500ms aborted", "1 1000ms ok"});
  CHECK(w.snapshot().in_window == 0);
}

TEST_CASE("max_waiters and close apply to the window as to every limiter", "[sliding_window][close]") {
  fixture f;
  completion_log log;
  window_limiter w(f.io, {.limit = 1, .window = 1s, .max_waiters = 1});
  CHECK(w.try_acquire());
  w.async_acquire(1, log.handler(0));
  w.async_acquire(1, log.handler(1));
  f.poll_at(time_point{});
  f.poll_at(at(100ms));
  w.close();
  f.poll_at(at(100ms));
  CHECK(log.lines == std::vector<std::string>{"1 0ms queue_full", "0 100ms closed"});
  CHECK_FALSE(w.try_acquire());
}

// ---- Several limits together (rein::rate_limits over algo::all_of) --------------------------------------

TEST_CASE("all_of: a bucket of 10/s burst 2 and 3 starts per second, all or nothing", "[rate_limits]") {
  fixture f;
  completion_log log;
  using limits_type = rein::basic_rate_limiter<rein::algo::all_of<algo_bucket, algo_window>>;
  limits_type limits(f.io, rein::algo::all_of{algo_bucket({.rate = 10, .capacity = 2}, time_point{}),
                                              algo_window({.limit = 3, .window = 1s}, time_point{})});
  for (int i = 0; i < 5; ++i) limits.async_acquire(1, log.handler(i));
  // The window's 4th start waits for 0 s's first to leave (1.0 s), though the bucket had a token at 0.2 s;
  // the 5th goes at 1.0 s too, with the bucket's second token and the window's second free place.
  f.run_to(at(1500ms), 10ms);
  CHECK(log.lines == std::vector<std::string>{"0 0ms ok", "1 0ms ok", "2 100ms ok", "3 1000ms ok", "4 1000ms ok"});
  const auto tokens =
      limits.inspect([](const auto& l, const rein::wait_stats&) { return l.template get<0>().tokens(at(1050ms)); });
  CHECK(tokens == 0.5);  // full (2) at 1.0 s, both taken then, 0.05 s of refill
}

TEST_CASE("all_of: a deadline is judged against every limit at once", "[rate_limits][deadline]") {
  fixture f;
  completion_log log;
  using limits_type = rein::rate_limits<algo_bucket, algo_window>;
  limits_type limits(f.io, rein::algo::all_of{algo_bucket({.rate = 100, .capacity = 1}, time_point{}),
                                              algo_window({.limit = 1, .window = 1s}, time_point{})});
  CHECK(limits.try_acquire());
  limits.async_acquire_for(1, 500ms, log.handler(0));  // the bucket could at 0.01 s, the window only at 1 s
  limits.async_acquire_for(1, 1s, log.handler(1));
  f.run_to(at(1100ms), 10ms);
  CHECK(log.lines == std::vector<std::string>{"0 0ms timed_out", "1 1000ms ok"});
}

TEST_CASE("all_of: update() reconfigures one part and re-times the waiters", "[rate_limits][update]") {
  fixture f;
  completion_log log;
  rein::rate_limits<algo_bucket, algo_window> limits(
      f.io, rein::algo::all_of{algo_bucket({.rate = 1, .capacity = 1}, time_point{}),
                               algo_window({.limit = 100, .window = 1s}, time_point{})});
  CHECK(limits.try_acquire());
  limits.async_acquire(1, log.handler(0));  // at 1 s
  f.poll_at(at(100ms));
  limits.update([](auto& l, time_point now) { l.template get<0>().set_rate(10, now); });  // 0.9 more at 10/s
  f.run_to(at(300ms), 10ms);
  CHECK(log.lines == std::vector<std::string>{"0 190ms ok"});
}

TEST_CASE("the sliding window counter behind the generic limiter", "[rate_limits][counter]") {
  fixture f;
  completion_log log;
  using counter = rein::algo::basic_sliding_window_counter<clock_type>;
  rein::basic_rate_limiter<counter> limiter(f.io, counter({.limit = 2, .window = 1s}, time_point{}));
  CHECK(limiter.try_acquire(2));
  limiter.async_acquire(1, log.handler(0));
  f.run_to(at(1600ms), 10ms);
  // At 1 s the previous window's 2 starts weigh 2 * (1 - e); one more fits once that is <= 1: e = 0.5 s.
  CHECK(log.lines == std::vector<std::string>{"0 1500ms ok"});
}

TEST_CASE("a coroutine waits on the window with acquire()", "[sliding_window][coroutine]") {
  fixture f;
  window_limiter w(f.io, {.limit = 2, .window = 1s});
  std::vector<std::string> seen;
  net::co_spawn(
      f.io,
      [&]() -> net::awaitable<void> {
        for (int i = 0; i < 5; ++i) {
          co_await w.acquire();
          seen.push_back(show(clock_type::now()));
        }
      },
      [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
  f.run_to(at(2500ms), 10ms);
  CHECK(seen == std::vector<std::string>{"0ms", "0ms", "1000ms", "1000ms", "2000ms"});
}
