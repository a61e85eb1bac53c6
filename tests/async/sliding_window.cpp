// rein::sliding_window and rein::fixed_window (async layer), and rein::basic_rate_limiter over other pure
// limits (all_of, the sliding window counter): grant times on the manual clock, deadlines judged at once,
// re-timing of queued waiters, refunds, snapshots, the comparison with the token bucket (a burst at a window edge),
// and the fixed window as a keyed and a throttle stage.
#include "support/catch.hpp"

#include <rein/algo/all_of.hpp>
#include <rein/algo/sliding_window_counter.hpp>
#include <rein/error.hpp>
#include <rein/fixed_window.hpp>
#include <rein/keyed.hpp>
#include <rein/rate_limiter.hpp>
#include <rein/sliding_window.hpp>
#include <rein/testing/manual_clock.hpp>
#include <rein/throttle.hpp>
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
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
namespace net = rein::net;
using clock_type = rein::testing::manual_clock;
using time_point = clock_type::time_point;
using window_limiter = rein::basic_sliding_window<net::any_io_executor, clock_type>;
using fixed_limiter = rein::basic_fixed_window<net::any_io_executor, clock_type>;
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

// ---- The sliding window against the token bucket at a window edge ----------------------------------------

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
  window_limiter w(f.io, {.limit = 1, .window = 1s}, {.max_waiters = 1});
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

// ---- The fixed (calendar-aligned) window ----------------------------------------------------------------

TEST_CASE("case 9 on a fixed window: 2 per 10 s grants waits from 0.00 .. 0.04 at 0.00, 0.01, 10.00, 10.00, "
          "20.00: the next window's whole limit at its start",
          "[fixed_window][acceptance]") {
  fixture f;
  completion_log log;
  fixed_limiter w(f.io, {.limit = 2, .window = 10s});
  for (int i = 0; i < 5; ++i) {
    clock_type::set(at(i * 10ms));
    w.async_acquire(1, log.handler(i));
    f.poll_at(at(i * 10ms));
  }
  f.run_to(at(21s), 10ms);
  CHECK(log.lines == std::vector<std::string>{"0 0ms ok", "1 10ms ok", "2 10000ms ok", "3 10000ms ok", "4 20000ms ok"});
  CHECK(most_in_any_window(log.granted, 10s) == 3);  // 0.01, 10.00, 10.00: the edge lets more than 2 in
}

TEST_CASE("fixed window: waiters of a full window are granted at the next window's start, limit at a time",
          "[fixed_window]") {
  fixture f;
  completion_log log;
  fixed_limiter w(f.io, {.limit = 2, .window = 1s});
  CHECK(w.try_acquire(2));
  CHECK_FALSE(w.try_acquire());
  f.poll_at(at(300ms));
  for (int i = 0; i < 5; ++i) w.async_acquire(1, log.handler(i));
  f.run_to(at(3500ms), 10ms);
  // Polled one nanosecond before each step too: every grant is at exactly a window's start.
  CHECK(log.lines == std::vector<std::string>{"0 1000ms ok", "1 1000ms ok", "2 2000ms ok", "3 2000ms ok",
                                              "4 3000ms ok"});
}

TEST_CASE("fixed window: windows start at the epoch plus the offset", "[fixed_window]") {
  fixture f;
  completion_log log;
  fixed_limiter w(f.io, {.limit = 1, .window = 1s, .offset = 250ms});
  f.poll_at(at(100ms));
  CHECK(w.try_acquire());
  w.async_acquire(1, log.handler(0));
  w.async_acquire(1, log.handler(1));
  CHECK(w.window_end() == at(250ms));
  f.run_to(at(1500ms), 10ms);
  CHECK(log.lines == std::vector<std::string>{"0 250ms ok", "1 1250ms ok"});
}

TEST_CASE("fixed window: a single-unit wait that would be granted after its deadline fails at once",
          "[fixed_window][deadline]") {
  fixture f;
  completion_log log;
  fixed_limiter w(f.io, {.limit = 2, .window = 1s});
  CHECK(w.try_acquire(2));
  w.async_acquire(1, log.handler(0));                    // at 1 s
  w.async_acquire_until(1, at(999ms), log.handler(1));   // second in line, at 1 s: after its deadline
  w.async_acquire_until(1, at(1000ms), log.handler(2));  // second in line: at 1 s, meets it exactly
  w.async_acquire_until(1, at(1999ms), log.handler(3));  // third: at 2 s, the window after
  w.async_acquire(1, log.handler(4));                    // third: at 2 s
  f.poll_at(time_point{});
  CHECK(log.lines == std::vector<std::string>{"1 0ms timed_out", "3 0ms timed_out"});
  f.run_to(at(2500ms), 10ms);
  CHECK(log.lines == std::vector<std::string>{"1 0ms timed_out", "3 0ms timed_out", "0 1000ms ok", "2 1000ms ok",
                                              "4 2000ms ok"});
  CHECK(w.snapshot().timed_out_total == 2);
}

TEST_CASE("fixed window: a refund lowers the window's count and lets a waiter in at once",
          "[fixed_window][refund]") {
  fixture f;
  completion_log log;
  fixed_limiter w(f.io, {.limit = 2, .window = 10s});
  CHECK(w.try_acquire(2));
  w.async_acquire(1, log.handler(0));
  w.async_acquire(1, log.handler(1));
  f.poll_at(at(1s));
  w.refund(1);  // e.g. the call was never sent
  f.poll_at(at(1s));
  CHECK(log.lines == std::vector<std::string>{"0 1000ms ok"});
  CHECK(w.snapshot().in_window == 2);
  f.run_to(at(10s), 10ms);
  CHECK(log.lines == std::vector<std::string>{"0 1000ms ok", "1 10000ms ok"});
}

TEST_CASE("fixed window: a charge beyond the limit is repaid by the next windows; an upstream's remaining "
          "count holds waiters until its reset",
          "[fixed_window][charge][limit_remaining]") {
  fixture f;
  completion_log log;
  fixed_limiter w(f.io, {.limit = 2, .window = 1s});
  CHECK(w.try_acquire());
  w.charge(4);                         // 5 counted: 2 in the windows of 0 s and 1 s, 1 in that of 2 s
  w.async_acquire(1, log.handler(0));  // at 2 s, beside the last unit of debt
  w.async_acquire(1, log.handler(1));  // at 3 s
  CHECK(w.snapshot().in_window == 5);
  CHECK(w.snapshot().available == 0);
  f.run_to(at(3500ms), 10ms);
  CHECK(log.lines == std::vector<std::string>{"0 2000ms ok", "1 3000ms ok"});

  // At 3.5 s the upstream says: none left until its reset in 1.5 s (at 5 s): this window and the next.
  CHECK(w.limit_remaining(0, 1500ms));
  w.async_acquire(1, log.handler(2));
  f.run_to(at(5500ms), 10ms);
  CHECK(log.lines == std::vector<std::string>{"0 2000ms ok", "1 3000ms ok", "2 5000ms ok"});
  CHECK_FALSE(w.limit_remaining(5, 500ms));  // above what the window itself allows: no change
}

TEST_CASE("fixed window: snapshot and its one line", "[fixed_window][snapshot]") {
  fixture f;
  completion_log log;
  fixed_limiter w(f.io, {.limit = 4, .window = 1s}, {.name = "api"});
  f.poll_at(at(250ms));
  CHECK(w.try_acquire(3));
  w.async_acquire(2, log.handler(0));
  f.poll_at(at(250ms));
  const auto s = w.snapshot();
  CHECK(s.in_window == 3);
  CHECK(s.available == 1);
  CHECK(s.limit == 4);
  CHECK(s.window == 1s);
  CHECK(s.resets_in == 750ms);
  CHECK(s.utilisation == 0.75);
  CHECK(s.waiting == 1);
  CHECK(s.acquired_total == 1);
  std::ostringstream line;
  line << s;
  CHECK(line.str().rfind("in_window=3 limit=4 window=1.00s resets_in=750ms utilisation=0.75 available=1 waiting=1 ",
                         0) == 0);
  f.run_to(at(1s), 10ms);
  CHECK(log.lines == std::vector<std::string>{"0 1000ms ok"});
  CHECK(w.snapshot().in_window == 2);
  CHECK(w.snapshot().resets_in == 1s);
}

TEST_CASE("fixed window: requests above the limit fail at once; a cancelled waiter counts nothing; invalid "
          "options name the field and the value",
          "[fixed_window][validation][cancellation]") {
  fixture f;
  completion_log log;
  fixed_limiter w(f.io, {.limit = 1, .window = 1s});
  CHECK_FALSE(w.try_acquire(2));
  w.async_acquire(2, log.handler(0));
  f.poll_at(time_point{});
  CHECK(w.try_acquire());
  net::cancellation_signal cancel;
  w.async_acquire(1, net::bind_cancellation_slot(cancel.slot(), log.handler(1)));
  w.async_acquire(1, log.handler(2));
  f.poll_at(at(500ms));
  cancel.emit(net::cancellation_type::partial);
  f.run_to(at(1500ms), 10ms);
  CHECK(log.lines == std::vector<std::string>{"0 0ms exceeds_capacity", "1 500ms aborted", "2 1000ms ok"});
  CHECK(w.snapshot().in_window == 1);
  CHECK_THROWS_WITH(fixed_limiter(f.io, {.limit = 0, .window = 1s}), "rein::fixed_window: limit must be in [1, 2^62], got 0");
  CHECK_THROWS_WITH(fixed_limiter(f.io, {.limit = 1}), "rein::fixed_window: window must be > 0, got 0 ns");
  CHECK_THROWS_WITH(fixed_limiter(f.io, {.limit = 1, .window = 1s}, {.name = "api"}).set_limit(-2),
                    "rein::fixed_window \"api\": limit must be in [1, 2^62], got -2");
  CHECK_THROWS_WITH(w.set_window(-1s), "rein::fixed_window: window must be > 0, got -1000000000 ns");
  w.set_limit(3);
  w.set_window(2s);
  CHECK(w.limit() == 3);
  CHECK(w.window() == 2s);
}

TEST_CASE("fixed window per key: a key is idle once its window has passed, and only then evicted",
          "[fixed_window][keyed]") {
  fixture f;
  rein::keyed<fixed_limiter> tenants(f.io, fixed_limiter::rule_type{.limit = 2, .window = 1s});
  CHECK(tenants.get("a")->try_acquire(2));
  CHECK_FALSE(tenants.get("a")->try_acquire());
  CHECK(tenants.get("b")->try_acquire());
  CHECK(tenants.sweep() == 0);  // both counted units in the current window
  clock_type::set(at(1s));
  CHECK(tenants.get("a")->try_acquire(2));  // a new window: the whole limit again
  CHECK(tenants.sweep() == 1);              // "b", counted in the last window only
  CHECK_FALSE(tenants.contains("b"));
  CHECK(tenants.contains("a"));
  clock_type::set(at(2s));
  CHECK(tenants.sweep() == 1);
  CHECK(tenants.size() == 0);
}

TEST_CASE("fixed window as the throttle's rate stages: per key and global, a refused call consumes nothing",
          "[fixed_window][throttle]") {
  fixture f;
  rein::keyed<fixed_limiter> per_key(f.io, fixed_limiter::rule_type{.limit = 1, .window = 1s});
  fixed_limiter global(f.io, {.limit = 3, .window = 1s});
  rein::throttle<rein::keyed<fixed_limiter>, fixed_limiter> throttle{per_key, global};
  auto a = throttle.try_acquire("a");
  CHECK(static_cast<bool>(a));
  auto refused = throttle.try_acquire("a");  // a's window is used up; the global units go back
  CHECK_FALSE(refused);
  CHECK(refused.rejected_at() == rein::throttle_stage::rate);
  CHECK(global.snapshot().in_window == 1);
  auto b = throttle.try_acquire("b");
  auto c = throttle.try_acquire("c");
  CHECK(static_cast<bool>(b));
  CHECK(static_cast<bool>(c));
  CHECK_FALSE(throttle.try_acquire("d"));  // the global window is full
  CHECK(per_key.get("d")->snapshot().in_window == 0);
  a.complete(rein::outcome::success);
  b.complete(rein::outcome::success);
  c.complete(rein::outcome::success);

  // A waiting acquire is admitted at the next window's start.
  std::vector<std::string> seen;
  net::co_spawn(
      f.io,
      [&]() -> net::awaitable<void> {
        auto g = co_await throttle.acquire("a");
        seen.push_back(show(clock_type::now()));
        g.complete(rein::outcome::success);
      },
      [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
  f.run_to(at(1500ms), 10ms);
  CHECK(seen == std::vector<std::string>{"1000ms"});
  CHECK(global.snapshot().in_window == 1);
}

TEST_CASE("a coroutine waits on a UTC-minute window with acquire()", "[fixed_window][coroutine]") {
  net::io_context io;
  bool done = false;
  net::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        rein::utc_fixed_window per_minute(io, {.limit = 1000, .window = std::chrono::minutes(1)});
        co_await per_minute.acquire();
        // The window is a UTC minute: it ends on a whole minute of Unix time, within a minute from now.
        const auto end = per_minute.window_end();
        CHECK(end.time_since_epoch() % std::chrono::minutes(1) == std::chrono::system_clock::duration::zero());
        CHECK(end - std::chrono::system_clock::now() <= std::chrono::minutes(1));
        CHECK(per_minute.snapshot().acquired_total == 1);
        done = true;
      },
      [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
  io.run();
  CHECK(done);
}
