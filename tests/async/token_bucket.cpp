// rein::token_bucket (async layer): its acceptance cases on the manual clock, re-timing of queued
// waiters, refunds, snapshots, deadlines, cancellation, close, destruction, completion tokens, the single
// timer (no thundering herd), long-run accuracy, and concurrent use from several threads.
#include "support/catch.hpp"

#include <rein/error.hpp>
#include <rein/testing/manual_clock.hpp>
#include <rein/token_bucket.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/bind_allocator.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/redirect_error.hpp>
#include <asio/strand.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#if REIN_ASIO_VERSION >= 102400
#include <asio/as_tuple.hpp>
#else
#include <asio/experimental/as_tuple.hpp>
#endif
#else
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_allocator.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#endif

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <future>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
namespace net = rein::net;
using clock_type = rein::testing::manual_clock;
using time_point = clock_type::time_point;
using bucket = rein::basic_token_bucket<net::any_io_executor, clock_type>;
using rein::errc;
using rein::error_code;

#if defined(REIN_STANDALONE_ASIO) && REIN_ASIO_VERSION < 102400
using net::experimental::as_tuple;
#else
using net::as_tuple;
#endif

// "t1" in the issue is 0.1 s.
time_point tick(int k) { return time_point{} + k * 100ms; }
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
  auto handler(int id) {
    return [this, id](error_code ec) {
      lines.push_back(std::to_string(id) + " " + show(clock_type::now()) + " " + show(ec));
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

// Runs a coroutine on `io`; an exception escaping it fails the test (it propagates out of poll()).
template <class Awaitable>
void spawn(net::io_context& io, Awaitable coroutine) {
  net::co_spawn(io, std::move(coroutine), [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
  });
}

}  // namespace

// ---- Acceptance cases --------------------------------------------------------------------------------------

TEST_CASE("case 3: waits of 2, 2, 2 started at t0, t0, t3 complete at t0, t2, t4", "[token_bucket][acceptance]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 10, .capacity = 2});
  b.async_acquire(2, log.handler(0));
  b.async_acquire(2, log.handler(1));
  f.run_to(tick(3), 10ms);
  b.async_acquire(2, log.handler(2));
  f.run_to(tick(6), 10ms);
  CHECK(log.lines == std::vector<std::string>{"0 0ms ok", "1 200ms ok", "2 400ms ok"});
  CHECK(b.snapshot().acquired_total == 3);
  CHECK(b.snapshot().wait_total == 300ms);  // 200 ms for the second, 100 ms for the third
}

TEST_CASE("case 4: a deadline that cannot be met fails at once; a cancelled wait took nothing",
          "[token_bucket][acceptance]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 10, .capacity = 3});
  b.async_acquire(2, log.handler(0));
  b.async_acquire_for(3, 100ms, log.handler(1));  // 1 token left: 3 are there at t2, after the deadline
  net::cancellation_signal cancel;
  b.async_acquire(3, net::bind_cancellation_slot(cancel.slot(), log.handler(2)));
  f.poll_at(tick(0));
  CHECK(log.lines == std::vector<std::string>{"0 0ms ok", "1 0ms timed_out"});
  CHECK(b.tokens() == 1.0);

  f.poll_at(tick(1));
  cancel.emit(net::cancellation_type::terminal);
  CHECK(b.tokens() == 2.0);  // the cancelled wait had taken nothing, so there is nothing to refund
  b.async_acquire(2, log.handler(3));
  f.poll_at(tick(1));
  CHECK(log.lines == std::vector<std::string>{"0 0ms ok", "1 0ms timed_out", "2 100ms aborted", "3 100ms ok"});
  CHECK(b.tokens() == 0.0);
}

TEST_CASE("case 8: exceeds_capacity and an unreachable deadline fail at once and leave the bucket untouched",
          "[token_bucket][acceptance]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 10, .capacity = 2});
  CHECK(b.try_acquire(2));
  f.poll_at(at(50ms));
  CHECK_FALSE(b.try_acquire(3));
  b.async_acquire(3, log.handler(0));
  b.async_acquire_for(2, 100ms, log.handler(1));  // 2 tokens are there at 0.2 s, the deadline is 0.15 s
  f.poll_at(at(50ms));
  CHECK(log.lines == std::vector<std::string>{"0 50ms exceeds_capacity", "1 50ms timed_out"});
  CHECK(b.snapshot().waiting == 0);

  f.poll_at(tick(2) - 1ns);
  CHECK_FALSE(b.try_acquire(2));
  f.poll_at(tick(2));
  CHECK(b.try_acquire(2));
  CHECK_FALSE(b.try_acquire(1));
}

TEST_CASE("case 8 variant: a deadline exactly at the grant time is met", "[token_bucket][acceptance]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 10, .capacity = 2});
  CHECK(b.try_acquire(2));
  f.poll_at(at(50ms));
  b.async_acquire_for(2, 150ms, log.handler(0));  // ready at 0.2 s, deadline 0.2 s: the grant wins
  f.run_to(tick(3), 10ms);
  CHECK(log.lines == std::vector<std::string>{"0 200ms ok"});
  CHECK(b.snapshot().timed_out_total == 0);
}

TEST_CASE("case 9 (bucket side): rate 0.2/s, burst 2 grants waits from 0.00 .. 0.04 at 0, 0.01, 5, 10, 15 s",
          "[token_bucket][acceptance]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 0.2, .capacity = 2});
  for (int i = 0; i < 5; ++i) {
    clock_type::set(at(i * 10ms));
    b.async_acquire(1, log.handler(i));
    f.poll_at(at(i * 10ms));
  }
  f.run_to(at(16s), 10ms);
  CHECK(log.lines == std::vector<std::string>{"0 0ms ok", "1 10ms ok", "2 5000ms ok", "3 10000ms ok", "4 15000ms ok"});
}

TEST_CASE("case 10: 1,000 coroutines waiting on rate 10/s, burst 1 wake only as tokens arrive",
          "[token_bucket][acceptance]") {
  fixture f;
  bucket b(f.io, {.rate = 10, .capacity = 1});
  std::size_t resumed = 0;
  std::size_t closed = 0;
  for (int i = 0; i < 1000; ++i) {
    spawn(f.io, [&]() -> net::awaitable<void> {
      try {
        co_await b.acquire();
        ++resumed;
      } catch (const rein::system_error& e) {
        if (e.code() == errc::closed) ++closed;
      }
    });
  }
  f.poll_at(time_point{});
  CHECK(resumed == 1);
  CHECK(b.snapshot().waiting == 999);

  // One virtual second in steps of 1 ms, counting every handler the io_context runs (timer expiries,
  // completions, coroutine resumptions). A design in which every waiter wakes to re-check would run about
  // 1,000 handlers per token here.
  std::size_t handlers = 0;
  for (int ms = 1; ms <= 1000; ++ms) handlers += f.poll_at(at(ms * 1ms));
  CHECK(resumed == 11);
  CHECK(b.snapshot().acquired_total == 11);
  CHECK(b.snapshot().waiting == 989);
  INFO("handlers run over the virtual second: " << handlers);
  CHECK(handlers >= 10);
  CHECK(handlers <= 3 * 10);  // a few per grant: the timer expiry, the completion that resumes the coroutine
  b.close();
  f.poll_at(at(1s));
  CHECK(b.snapshot().waiting == 0);
  CHECK(closed == 989);
}

// ---- Re-timing queued waiters ---------------------------------------------------------------------------

TEST_CASE("a faster rate moves a queued waiter's grant earlier at once", "[token_bucket][set_rate]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 1, .capacity = 1});
  CHECK(b.try_acquire());
  b.async_acquire(1, log.handler(0));  // due at 1 s
  f.poll_at(tick(1));
  b.set_rate(10);  // 0.1 token arrived at the old rate; the other 0.9 take 0.09 s at the new one
  f.poll_at(at(190ms) - 1ns);
  CHECK(log.lines.empty());
  f.poll_at(at(190ms));
  CHECK(log.lines == std::vector<std::string>{"0 190ms ok"});
  CHECK(b.rate() == 10.0);
}

TEST_CASE("a slower rate moves a queued waiter's grant later at once", "[token_bucket][set_rate]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 10, .capacity = 1});
  CHECK(b.try_acquire());
  b.async_acquire(1, log.handler(0));  // due at 0.1 s
  f.poll_at(at(50ms));
  b.set_rate(1);  // 0.5 token there, 0.5 more at 1/s
  f.run_to(at(550ms) - 10ms, 10ms);
  CHECK(log.lines.empty());
  f.poll_at(at(550ms) - 1ns);
  CHECK(log.lines.empty());
  f.poll_at(at(550ms));
  CHECK(log.lines == std::vector<std::string>{"0 550ms ok"});
}

TEST_CASE("a rate change re-times every queued waiter, in order", "[token_bucket][set_rate]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 10, .capacity = 2, .initial_tokens = 0});
  for (int i = 0; i < 3; ++i) b.async_acquire(2, log.handler(i));  // due at 0.2, 0.4, 0.6 s
  f.poll_at(tick(1));
  b.set_rate(20);  // 1 token there; then 20/s: 0.15, 0.25, 0.35 s
  f.run_to(tick(7), 10ms);
  CHECK(log.lines == std::vector<std::string>{"0 150ms ok", "1 250ms ok", "2 350ms ok"});
}

TEST_CASE("a waiter queued for more than a lowered capacity is served when the bucket is full",
          "[token_bucket][set_capacity]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 10, .capacity = 3});
  CHECK(b.try_acquire(3));
  b.async_acquire(3, log.handler(0));  // due at 0.3 s
  f.poll_at(at(50ms));
  b.set_capacity(1);  // the waiter now counts as "the whole bucket": due at 0.1 s
  b.async_acquire(2, log.handler(1));
  f.poll_at(at(50ms));
  CHECK(log.lines == std::vector<std::string>{"1 50ms exceeds_capacity"});

  SECTION("earlier") {
    f.run_to(tick(3), 10ms);
    CHECK(log.lines == std::vector<std::string>{"1 50ms exceeds_capacity", "0 100ms ok"});
    CHECK(b.tokens() == 1.0);  // full again at 0.2 s, and capped there
  }
  SECTION("and back later when the capacity is raised again") {
    f.poll_at(at(60ms));
    b.set_capacity(3);
    f.run_to(tick(4), 10ms);
    CHECK(log.lines == std::vector<std::string>{"1 50ms exceeds_capacity", "0 300ms ok"});
    CHECK(b.capacity() == 3);
  }
}

TEST_CASE("setters reject invalid values, naming the field, and change nothing", "[token_bucket][validation]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 10, .capacity = 2});
  CHECK(b.try_acquire(2));
  b.async_acquire(2, log.handler(0));
  CHECK_THROWS_WITH(b.set_rate(0),
                    "rein::token_bucket: rate must be > 0, finite and at most 1e9 tokens per second, got 0");
  CHECK_THROWS_WITH(b.set_rate(std::numeric_limits<double>::quiet_NaN()),
                    "rein::token_bucket: rate must be > 0, finite and at most 1e9 tokens per second, got nan");
  CHECK_THROWS_WITH(b.set_capacity(0), "rein::token_bucket: capacity must be in [1, 1e15] tokens, got 0");
  CHECK(b.rate() == 10.0);
  CHECK(b.capacity() == 2);
  f.run_to(tick(2), 10ms);
  CHECK(log.lines == std::vector<std::string>{"0 200ms ok"});
}

TEST_CASE("invalid options throw std::invalid_argument naming the type, the field and the value",
          "[token_bucket][validation]") {
  net::io_context io;
  const std::string rate_rule = "rein::token_bucket: rate must be > 0, finite and at most 1e9 tokens per second, got ";
  CHECK_THROWS_WITH(bucket(io, {.rate = -1, .capacity = 1}), rate_rule + "-1");
  CHECK_THROWS_WITH(bucket(io, {.rate = 0, .capacity = 1}), rate_rule + "0");
  CHECK_THROWS_WITH(bucket(io, {.rate = std::numeric_limits<double>::quiet_NaN(), .capacity = 1}), rate_rule + "nan");
  CHECK_THROWS_WITH(bucket(io, {.rate = std::numeric_limits<double>::infinity(), .capacity = 1}), rate_rule + "inf");
  CHECK_THROWS_WITH(bucket(io, {.rate = 1, .capacity = 0}),
                    "rein::token_bucket: capacity must be in [1, 1e15] tokens, got 0");
  CHECK_THROWS_WITH(bucket(io, {.rate = 1, .capacity = 3, .initial_tokens = 4}),
                    "rein::token_bucket: initial_tokens must be in [0, capacity], got 4");
  CHECK_THROWS_WITH(bucket(io, {.rate = 1, .capacity = 3, .initial_tokens = -1}),
                    "rein::token_bucket: initial_tokens must be in [0, capacity], got -1");
}

// ---- The pacing margin -----------------------------------------------------------------------------------

TEST_CASE("a refusal widens the pacing margin and re-times a queued waiter at once", "[token_bucket][margin]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 33, .capacity = 1});
  CHECK(b.try_acquire());
  b.async_acquire(1, log.handler(0));  // due at 1/33 s
  b.refused(at(0ns));                  // margin 1/32: 33 / (1 + 1/32) = 32 per second
  CHECK(b.rate() == 32.0);
  CHECK(b.quota() == 33.0);
  CHECK(b.margin() == 1.0 / 32);
  f.poll_at(at(31'250'000ns) - 1ns);
  CHECK(log.lines.empty());
  f.poll_at(at(31'250'000ns));
  CHECK(log.lines == std::vector<std::string>{"0 31250000ns ok"});
  const rein::token_bucket_snapshot s = b.snapshot();
  CHECK(s.quota == 33.0);
  CHECK(s.margin == 1.0 / 32 * std::exp2(-0.03125 / 60));  // 31.25 ms of a 60 s half-life
  CHECK(s.refusals == 1);
  CHECK(s.rate == 32.0);  // the rate moves with the decay only when calls are reported
}

TEST_CASE("a refusal of a call sent before the latest widening changes nothing", "[token_bucket][margin]") {
  fixture f;
  bucket b(f.io, {.rate = 33, .capacity = 1});
  f.poll_at(at(1s));
  b.refused(at(1s));
  f.poll_at(at(1s + 10ms));
  b.refused(at(999ms));  // in flight when the margin widened: it reports on the old pace
  CHECK(b.snapshot().refusals == 1);
  b.refused(at(1s + 10ms));
  CHECK(b.snapshot().refusals == 2);
}

TEST_CASE("the margin decays as calls are reported, and set_rate keeps it", "[token_bucket][margin]") {
  fixture f;
  bucket b(f.io, {.rate = 33, .capacity = 1, .margin = {.half_life = 10s}});
  b.record(rein::outcome::success, at(0ns));  // no margin yet: nothing to do
  CHECK(b.rate() == 33.0);
  b.refused(at(0ns));
  f.poll_at(at(10s));
  CHECK(b.rate() == 32.0);                    // the decay reaches the rate only when a call is reported
  b.record(rein::outcome::success, at(10s));  // half the margin: 1/64
  CHECK(b.rate() == 33.0 / (1 + 1.0 / 64));
  b.set_rate(65);
  CHECK(b.rate() == 64.0);  // 65 / (1 + 1/64)
  CHECK(b.quota() == 65.0);
  f.poll_at(at(1000s));
  b.record(rein::outcome::ignored, at(1000s));  // decayed to nothing: the quota again
  CHECK(b.rate() == 65.0);
  CHECK(b.margin() == 0.0);
}

TEST_CASE("an initial margin paces below the quota from the start", "[token_bucket][margin]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 33, .capacity = 1, .margin = {.initial = 1.0 / 32}});
  CHECK(b.rate() == 32.0);
  CHECK(b.try_acquire());
  b.async_acquire(1, log.handler(0));
  f.run_to(at(40ms), 31'250'000ns);
  CHECK(log.lines == std::vector<std::string>{"0 31250000ns ok"});
}

TEST_CASE("bad margin options name the bucket, the field and the value", "[token_bucket][margin][validation]") {
  net::io_context io;
  CHECK_THROWS_WITH(bucket(io, {.rate = 1, .capacity = 1, .margin = {.step = 0}}),
                    "rein::token_bucket: margin.step must be in (0, max], got 0");
  CHECK_THROWS_WITH(bucket(io, {.rate = 1, .capacity = 1, .margin = {.initial = -1}}, {.name = "api"}),
                    "rein::token_bucket \"api\": margin.initial must be in [0, max], got -1");
}

// ---- Jittered wake-ups ------------------------------------------------------------------------------------

namespace {
// Grant instants (ns) of three waiters on a bucket of 10/s, burst 1, emptied at 0, with the given jitter.
std::vector<std::int64_t> jittered_grants(std::chrono::nanoseconds jitter, std::uint64_t seed) {
  fixture f;
  bucket b(f.io, {.rate = 10, .capacity = 1}, {.wake_jitter = jitter, .jitter_seed = seed});
  REQUIRE(b.try_acquire());
  std::vector<std::int64_t> grants;
  for (int id = 0; id < 3; ++id) {
    b.async_acquire(1, [&grants](error_code ec) {
      REQUIRE_FALSE(ec);
      grants.push_back(clock_type::now().time_since_epoch().count());
    });
  }
  f.run_to(at(500ms), 1ms);  // 1 ms steps: each grant is logged at the step that follows its instant
  return grants;
}
}  // namespace

TEST_CASE("jittered wake-ups: each grant within [ready, ready + jitter], reproducible by seed",
          "[token_bucket][jitter]") {
  CHECK(jittered_grants(0ns, 1) == std::vector<std::int64_t>{100'000'000, 200'000'000, 300'000'000});
  const std::vector<std::int64_t> a = jittered_grants(20ms, 1);
  REQUIRE(a.size() == 3);
  std::int64_t previous = 0;  // the first waiter's tokens are there at 100 ms, each next one 100 ms after a grant
  for (const std::int64_t g : a) {
    const std::int64_t ready = std::chrono::nanoseconds(100ms).count() + previous;
    CHECK(g >= ready);
    CHECK(g <= ready + std::chrono::nanoseconds(20ms + 1ms).count());  // the jitter, and the 1 ms step
    previous = g;
  }
  CHECK(jittered_grants(20ms, 1) == a);  // the same seed, the same instants
  CHECK(jittered_grants(20ms, 2) != a);  // another replica's seed, other instants
}

TEST_CASE("a negative wake_jitter is refused with the type, the field and the value", "[token_bucket][jitter]") {
  net::io_context io;
  CHECK_THROWS_WITH(bucket(io, {.rate = 1, .capacity = 1}, {.wake_jitter = -1ns}),
                    "rein::token_bucket: wake_jitter must be >= 0, got -1 ns");
}

// ---- Refunds, snapshots, try_acquire ----------------------------------------------------------------------

TEST_CASE("a refund wakes the head waiter at once when it makes room", "[token_bucket][refund]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 10, .capacity = 2});
  CHECK(b.try_acquire(2));
  b.async_acquire(2, log.handler(0));  // due at 0.2 s
  b.async_acquire(2, log.handler(1));  // due at 0.4 s
  f.poll_at(at(50ms));
  b.refund(2);  // 0.5 + 2 tokens, capped at 2: the head is served now
  f.poll_at(at(50ms));
  CHECK(log.lines == std::vector<std::string>{"0 50ms ok"});
  b.refund(1);  // 1 of 2: the next is due 0.1 s sooner, at 0.15 s
  f.run_to(tick(3), 10ms);
  CHECK(log.lines == std::vector<std::string>{"0 50ms ok", "1 150ms ok"});
}

TEST_CASE("a refund never fills the bucket above its capacity", "[token_bucket][refund]") {
  fixture f;
  bucket b(f.io, {.rate = 10, .capacity = 3});
  CHECK(b.try_acquire(1));
  b.refund(100);
  CHECK(b.tokens() == 3.0);
  CHECK(b.try_acquire(3));
  CHECK_FALSE(b.try_acquire(1));
}

TEST_CASE("snapshot reports tokens, waiting, totals and wait times exactly", "[token_bucket][snapshot]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 10, .capacity = 3});
  CHECK(b.try_acquire(2));
  b.async_acquire(3, log.handler(0));            // due at 0.2 s
  b.async_acquire_for(1, 50ms, log.handler(1));  // behind 3 tokens: 0.3 s, past its deadline: fails at once
  f.poll_at(time_point{});
  f.poll_at(tick(1));
  rein::token_bucket_snapshot s = b.snapshot();
  CHECK(s.tokens == 2.0);
  CHECK(s.rate == 10.0);
  CHECK(s.capacity == 3);
  CHECK(s.waiting == 1);
  CHECK(s.acquired_total == 1);
  CHECK(s.rejected_total == 1);
  CHECK(s.timed_out_total == 1);
  CHECK(s.queue_full_total == 0);
  CHECK(s.cancelled_total == 0);
  CHECK(s.wait_total == 0ns);

  f.run_to(tick(2), 10ms);
  f.poll_at(at(250ms));
  s = b.snapshot();
  CHECK(log.lines == std::vector<std::string>{"1 0ms timed_out", "0 200ms ok"});
  CHECK(s.tokens == 0.5);
  CHECK(s.waiting == 0);
  CHECK(s.acquired_total == 2);
  CHECK(s.rejected_total == 1);
  CHECK(s.wait_total == 200ms);
  CHECK(s.wait_max == 200ms);
}

TEST_CASE("try_acquire never overtakes a waiter", "[token_bucket][fifo]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 10, .capacity = 3});
  CHECK(b.try_acquire(3));
  b.async_acquire(3, log.handler(0));  // due at 0.3 s
  f.poll_at(tick(2));
  CHECK(b.tokens() == 2.0);
  CHECK_FALSE(b.try_acquire(1));  // two tokens are there, but they are the head's
  b.async_acquire(1, log.handler(1));
  f.run_to(tick(4), 10ms);
  CHECK(log.lines == std::vector<std::string>{"0 300ms ok", "1 400ms ok"});
}

TEST_CASE("a grant never runs the handler inside the initiating function", "[token_bucket][completion]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 10, .capacity = 3});
  b.async_acquire(1, log.handler(0));
  b.async_acquire(9, log.handler(1));
  CHECK(log.lines.empty());
  f.poll_at(time_point{});
  CHECK(log.lines == std::vector<std::string>{"0 0ms ok", "1 0ms exceeds_capacity"});
}

TEST_CASE("acquire(0) succeeds at once and takes nothing", "[token_bucket]") {
  fixture f;
  bucket b(f.io, {.rate = 10, .capacity = 1, .initial_tokens = 0});
  CHECK(b.try_acquire(0));
  bool done = false;
  spawn(f.io, [&]() -> net::awaitable<void> {
    co_await b.acquire(0);
    done = true;
  });
  f.poll_at(time_point{});
  CHECK(done);
  CHECK(b.tokens() == 0.0);
}

// ---- Deadlines ------------------------------------------------------------------------------------------

TEST_CASE("a waiter whose deadline passes because the rate dropped times out at the deadline, taking nothing",
          "[token_bucket][deadline]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 10, .capacity = 1});
  CHECK(b.try_acquire());
  b.async_acquire_until(1, tick(2), log.handler(0));  // due at 0.1 s, deadline 0.2 s
  b.async_acquire(1, log.handler(1));
  f.poll_at(at(50ms));
  b.set_rate(1);  // now due at 0.55 s
  f.run_to(tick(2), 10ms);
  CHECK(log.lines == std::vector<std::string>{"0 200ms timed_out"});
  CHECK(b.tokens() == Approx(0.65).margin(1e-12));  // 0.05 s at 10/s + 0.15 s at 1/s
  f.run_to(tick(10), 10ms);
  CHECK(log.lines == std::vector<std::string>{"0 200ms timed_out", "1 550ms ok"});
  CHECK(b.snapshot().timed_out_total == 1);
}

TEST_CASE("a deadline behind other waiters is judged against the whole line, at once", "[token_bucket][deadline]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 10, .capacity = 2});
  CHECK(b.try_acquire(2));
  b.async_acquire(2, log.handler(0));                   // at 0.2 s
  b.async_acquire_until(1, at(250ms), log.handler(1));  // behind it: at 0.3 s, after its deadline
  b.async_acquire_until(1, at(300ms), log.handler(2));  // the same place in line: meets it exactly
  b.async_acquire_until(2, at(499ms), log.handler(3));  // then 2 more: at 0.5 s
  f.poll_at(time_point{});
  CHECK(log.lines == std::vector<std::string>{"1 0ms timed_out", "3 0ms timed_out"});
  f.run_to(tick(6), 10ms);
  CHECK(log.lines == std::vector<std::string>{"1 0ms timed_out", "3 0ms timed_out", "0 200ms ok", "2 300ms ok"});
}

TEST_CASE("a deadline already past fails at once unless tokens are there", "[token_bucket][deadline]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 10, .capacity = 1});
  f.poll_at(tick(1));
  b.async_acquire_until(1, time_point{}, log.handler(0));
  b.async_acquire_until(1, time_point{}, log.handler(1));
  f.poll_at(tick(1));
  CHECK(log.lines == std::vector<std::string>{"0 100ms ok", "1 100ms timed_out"});
}

TEST_CASE("acquire_for and acquire_until throw timed_out from a coroutine", "[token_bucket][deadline]") {
  fixture f;
  bucket b(f.io, {.rate = 1, .capacity = 1, .initial_tokens = 0});
  std::vector<std::string> seen;
  spawn(f.io, [&]() -> net::awaitable<void> {
    try {
      co_await b.acquire_for(1, 500ms);
    } catch (const rein::system_error& e) {
      seen.push_back(show(e.code()));
    }
    try {
      co_await b.acquire_until(1, clock_type::now() + 2s);
      seen.push_back("granted at " + show(clock_type::now()));
    } catch (const rein::system_error& e) {
      seen.push_back(show(e.code()));
    }
  });
  f.run_to(at(2s), 10ms);
  CHECK(seen == std::vector<std::string>{"timed_out", "granted at 1000ms"});
}

TEST_CASE("a huge timeout means no deadline, not one in the past", "[token_bucket][deadline]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 10, .capacity = 1, .initial_tokens = 0});
  f.poll_at(at(1s));
  CHECK(b.try_acquire());
  b.async_acquire_for(1, clock_type::duration::max(), log.handler(0));
  f.run_to(at(1100ms), 10ms);
  CHECK(log.lines == std::vector<std::string>{"0 1100ms ok"});
}

// ---- Cancellation ---------------------------------------------------------------------------------------

TEST_CASE("terminal, partial and total cancellation remove a waiter, which took nothing",
          "[token_bucket][cancellation]") {
  const auto type = GENERATE(net::cancellation_type::terminal, net::cancellation_type::partial,
                             net::cancellation_type::total);
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 10, .capacity = 2});
  CHECK(b.try_acquire(2));
  net::cancellation_signal cancel;
  b.async_acquire(2, net::bind_cancellation_slot(cancel.slot(), log.handler(0)));
  b.async_acquire(1, log.handler(1));
  f.poll_at(at(50ms));
  cancel.emit(type);
  f.poll_at(at(50ms));
  CHECK(log.lines == std::vector<std::string>{"0 50ms aborted"});
  f.run_to(tick(2), 10ms);
  CHECK(log.lines == std::vector<std::string>{"0 50ms aborted", "1 100ms ok"});  // next in line, no token lost
  CHECK(b.snapshot().cancelled_total == 1);
  CHECK(b.snapshot().rejected_total == 0);
}

TEST_CASE("a cancelled head lets a smaller waiter behind it through at once", "[token_bucket][cancellation]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 10, .capacity = 3});
  CHECK(b.try_acquire(3));
  net::cancellation_signal cancel;
  b.async_acquire(3, net::bind_cancellation_slot(cancel.slot(), log.handler(0)));
  b.async_acquire(1, log.handler(1));
  f.poll_at(tick(1));
  CHECK(log.lines.empty());  // a token is there, but the head needs 3
  cancel.emit(net::cancellation_type::terminal);
  f.poll_at(tick(1));
  CHECK(log.lines == std::vector<std::string>{"0 100ms aborted", "1 100ms ok"});
}

TEST_CASE("a cancellation signal of type none does nothing", "[token_bucket][cancellation]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 10, .capacity = 1, .initial_tokens = 0});
  net::cancellation_signal cancel;
  b.async_acquire(1, net::bind_cancellation_slot(cancel.slot(), log.handler(0)));
  cancel.emit(net::cancellation_type::none);
  f.run_to(tick(1), 10ms);
  CHECK(log.lines == std::vector<std::string>{"0 100ms ok"});
}

TEST_CASE("a cancellation after the grant, before the handler ran, gives the token back",
          "[token_bucket][cancellation]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 10, .capacity = 1, .initial_tokens = 0});
  net::cancellation_signal cancel;
  b.async_acquire(1, net::bind_cancellation_slot(cancel.slot(), log.handler(0)));
  f.poll_at(time_point{});
  clock_type::set(tick(1));
  f.io.restart();
  // Run handlers one at a time until the timer has granted the waiter; its completion is then queued.
  for (int i = 0; i < 100 && b.snapshot().acquired_total == 0; ++i) f.io.poll_one();
  REQUIRE(b.snapshot().acquired_total == 1);
  CHECK(log.lines.empty());
  cancel.emit(net::cancellation_type::terminal);
  f.poll_at(tick(1));
  CHECK(log.lines == std::vector<std::string>{"0 100ms aborted"});
  const auto snap = b.snapshot();
  CHECK(snap.cancelled_total == 1);
  CHECK(snap.acquired_total == 0);
  CHECK(b.tokens() == 1.0);  // the token the grant took is back: the next caller gets it at once
  CHECK(b.try_acquire());
  CHECK(b.tokens() == 0.0);
}

TEST_CASE("a coroutine cancelled while waiting gets operation_aborted", "[token_bucket][cancellation]") {
  fixture f;
  bucket b(f.io, {.rate = 10, .capacity = 1, .initial_tokens = 0});
  net::cancellation_signal cancel;
  std::string seen;
  net::co_spawn(
      f.io,
      [&]() -> net::awaitable<void> {
        try {
          co_await b.acquire();
          seen = "granted";
        } catch (const rein::system_error& e) {
          seen = show(e.code());
        }
      },
      net::bind_cancellation_slot(cancel.slot(), [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      }));
  f.poll_at(at(50ms));
  cancel.emit(net::cancellation_type::terminal);
  f.poll_at(at(50ms));
  CHECK(seen == "aborted");
  CHECK(b.snapshot().waiting == 0);
}

// ---- Bounded waiting line, close, destruction -----------------------------------------------------------

TEST_CASE("one waiter more than max_waiters fails at once with queue_full", "[token_bucket][queue_full]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 10, .capacity = 1, .initial_tokens = 0}, {.max_waiters = 2});
  for (int i = 0; i < 3; ++i) b.async_acquire(1, log.handler(i));
  f.poll_at(time_point{});
  CHECK(log.lines == std::vector<std::string>{"2 0ms queue_full"});
  CHECK(b.snapshot().queue_full_total == 1);
  CHECK(b.snapshot().rejected_total == 1);
  f.run_to(tick(2), 10ms);
  CHECK(log.lines == std::vector<std::string>{"2 0ms queue_full", "0 100ms ok", "1 200ms ok"});
}

TEST_CASE("max_waiters 0 never queues, but immediate grants still succeed", "[token_bucket][queue_full]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 10, .capacity = 1}, {.max_waiters = 0});
  b.async_acquire(1, log.handler(0));
  b.async_acquire(1, log.handler(1));
  f.poll_at(time_point{});
  CHECK(log.lines == std::vector<std::string>{"0 0ms ok", "1 0ms queue_full"});
}

TEST_CASE("close completes every waiter with closed; later acquires fail the same way", "[token_bucket][close]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 10, .capacity = 1, .initial_tokens = 0});
  b.async_acquire(1, log.handler(0));
  b.async_acquire(1, log.handler(1));
  f.poll_at(at(50ms));
  b.close();
  b.async_acquire(1, log.handler(2));
  f.poll_at(at(50ms));
  CHECK(log.lines == std::vector<std::string>{"0 50ms closed", "1 50ms closed", "2 50ms closed"});
  f.poll_at(tick(5));
  CHECK_FALSE(b.try_acquire());
  b.close();  // idempotent
  std::string seen;
  spawn(f.io, [&]() -> net::awaitable<void> {
    try {
      co_await b.acquire();
    } catch (const rein::system_error& e) {
      seen = show(e.code());
    }
  });
  f.poll_at(tick(5));
  CHECK(seen == "closed");
}

TEST_CASE("destroying the bucket completes its waiters with operation_aborted", "[token_bucket][lifetime]") {
  fixture f;
  completion_log log;
  {
    bucket b(f.io, {.rate = 10, .capacity = 1, .initial_tokens = 0});
    b.async_acquire(1, log.handler(0));
    b.async_acquire_for(1, 1s, log.handler(1));
    f.poll_at(at(50ms));
  }
  f.poll_at(at(50ms));
  CHECK(log.lines == std::vector<std::string>{"0 50ms aborted", "1 50ms aborted"});
  CHECK(f.run_to(tick(20), 100ms) == 0);  // the timer is gone too
}

// ---- Completion tokens ----------------------------------------------------------------------------------

TEST_CASE("use_awaitable, deferred, as_tuple and redirect_error deliver success, a wait and errors",
          "[token_bucket][tokens]") {
  fixture f;
  bucket b(f.io, {.rate = 10, .capacity = 2});
  std::vector<std::string> seen;
  spawn(f.io, [&]() -> net::awaitable<void> {
    co_await b.async_acquire(1, net::use_awaitable);
#if REIN_ASIO_VERSION >= 102600
    co_await b.async_acquire(1);  // the default token, deferred
#else
    co_await b.async_acquire(1)(net::use_awaitable);
#endif
    seen.push_back("two at " + show(clock_type::now()));
    auto [too_big] = co_await b.async_acquire(3, as_tuple(net::use_awaitable));
    seen.push_back("as_tuple " + show(too_big));
    auto [waited] = co_await b.async_acquire(1, as_tuple(net::use_awaitable));
    seen.push_back("as_tuple " + show(waited) + " at " + show(clock_type::now()));
    error_code ec = errc::closed;
    co_await b.async_acquire(1, net::redirect_error(net::use_awaitable, ec));
    seen.push_back("redirect_error " + show(ec) + " at " + show(clock_type::now()));
    co_await b.async_acquire(3, net::redirect_error(net::use_awaitable, ec));
    seen.push_back("redirect_error " + show(ec));
    try {
      co_await b.async_acquire(3, net::use_awaitable);
    } catch (const rein::system_error& e) {
      seen.push_back("use_awaitable " + show(e.code()));
    }
  });
  f.run_to(tick(3), 10ms);
  CHECK(seen == std::vector<std::string>{"two at 0ms", "as_tuple exceeds_capacity", "as_tuple ok at 100ms",
                                         "redirect_error ok at 200ms", "redirect_error exceeds_capacity",
                                         "use_awaitable exceeds_capacity"});
}

TEST_CASE("use_future: success and errors through a future", "[token_bucket][tokens]") {
  fixture f;
  bucket b(f.io, {.rate = 10, .capacity = 1});
  std::future<void> granted = b.async_acquire(1, net::use_future);
  std::future<void> waiting = b.async_acquire(1, net::use_future);
  std::future<void> too_big = b.async_acquire(2, net::use_future);
  f.poll_at(time_point{});
  CHECK_NOTHROW(granted.get());
  CHECK_THROWS_AS(too_big.get(), rein::system_error);
  CHECK(waiting.wait_for(0s) == std::future_status::timeout);
  f.poll_at(tick(1));
  CHECK_NOTHROW(waiting.get());
}

TEST_CASE("deferred: the operation starts only when launched", "[token_bucket][tokens]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 10, .capacity = 1});
  auto op = b.async_acquire(1);  // the default token
  CHECK(b.tokens() == 1.0);      // nothing taken yet
  std::move(op)(log.handler(0));
  f.poll_at(time_point{});
  CHECK(log.lines == std::vector<std::string>{"0 0ms ok"});
  CHECK(b.tokens() == 0.0);
}

TEST_CASE("detached: the wait still takes its token when granted", "[token_bucket][tokens]") {
  fixture f;
  bucket b(f.io, {.rate = 10, .capacity = 1, .initial_tokens = 0});
  b.async_acquire(1, net::detached);
  f.run_to(tick(1), 10ms);
  CHECK(b.snapshot().acquired_total == 1);
  CHECK(b.tokens() == 0.0);
}

TEST_CASE("the handler runs on its associated executor (a strand)", "[token_bucket][tokens]") {
  fixture f;
  bucket b(f.io, {.rate = 10, .capacity = 1, .initial_tokens = 0});
  auto strand = net::make_strand(f.io);
  bool on_strand = false;
  b.async_acquire(1, net::bind_executor(strand, [&](error_code) { on_strand = strand.running_in_this_thread(); }));
  f.run_to(tick(1), 10ms);
  CHECK(on_strand);
}

namespace {
// Counts what the waiter core allocates through the handler's associated allocator.
template <class T>
struct counting_allocator {
  using value_type = T;
  std::size_t* count;
  explicit counting_allocator(std::size_t* c) noexcept : count(c) {}
  template <class U>
  counting_allocator(const counting_allocator<U>& other) noexcept : count(other.count) {}
  T* allocate(std::size_t n) {
    ++*count;
    return std::allocator<T>().allocate(n);
  }
  void deallocate(T* p, std::size_t n) noexcept { std::allocator<T>().deallocate(p, n); }
  template <class U>
  bool operator==(const counting_allocator<U>& other) const noexcept { return count == other.count; }
};
}  // namespace

TEST_CASE("the waiting operation is allocated with the handler's associated allocator", "[token_bucket][tokens]") {
  fixture f;
  completion_log log;
  std::size_t allocations = 0;
  bucket b(f.io, {.rate = 10, .capacity = 1, .initial_tokens = 0});
  b.async_acquire(1, net::bind_allocator(counting_allocator<int>(&allocations), log.handler(0)));
  CHECK(allocations >= 1);
  f.run_to(tick(1), 10ms);
  CHECK(log.lines == std::vector<std::string>{"0 100ms ok"});
}

TEST_CASE("acquire() inside a coroutine: at once with tokens, after a wait without", "[token_bucket][tokens]") {
  fixture f;
  bucket b(f.io, {.rate = 10, .capacity = 2});
  std::vector<std::string> seen;
  spawn(f.io, [&]() -> net::awaitable<void> {
    for (int i = 0; i < 4; ++i) {
      co_await b.acquire();
      seen.push_back(show(clock_type::now()));
    }
    try {
      co_await b.acquire(3);
    } catch (const rein::system_error& e) {
      seen.push_back(show(e.code()));
    }
  });
  f.run_to(tick(3), 10ms);
  CHECK(seen == std::vector<std::string>{"0ms", "0ms", "100ms", "200ms", "exceeds_capacity"});
}

// ---- Accuracy and threads -------------------------------------------------------------------------------

TEST_CASE("8 competing coroutines over 10 simulated seconds at 100,000/s get exactly rate x time + burst",
          "[token_bucket][accuracy]") {
  fixture f;
  constexpr double rate = 100'000;
  constexpr std::int64_t burst = 100;
  bucket b(f.io, {.rate = rate, .capacity = burst});
  std::uint64_t admitted = 0;
  int stopped = 0;
  for (int i = 0; i < 8; ++i) {
    spawn(f.io, [&]() -> net::awaitable<void> {
      try {
        for (;;) {
          co_await b.acquire();
          ++admitted;
        }
      } catch (const rein::system_error& e) {
        CHECK(e.code() == errc::closed);
        ++stopped;
      }
    });
  }
  // Irregular steps between 1 us and 0.99 ms: less than a burst's worth (1 ms) arrives between two polls, and
  // each poll drains every whole token, so the cap never drops one.
  std::uint64_t state = 42;
  std::uint64_t violations = 0;
  time_point t{};
  f.poll_at(t);  // the coroutines drain the full bucket at once
  CHECK(admitted == burst);
  while (t < at(10s)) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    const auto step = std::chrono::microseconds(1 + (state >> 33) % 990);
    t = std::min(t + step, at(10s));
    f.poll_at(t);
    const auto arrived = static_cast<std::uint64_t>(t.time_since_epoch().count()) / 10'000;  // one per 10 us
    const auto bound = static_cast<std::uint64_t>(burst) + arrived;
    if (admitted > bound) ++violations;
  }
  CHECK(violations == 0);
  const double ceiling = rate * 10 + burst;
  CHECK(static_cast<double>(admitted) <= ceiling);
  CHECK(static_cast<double>(admitted) >= 0.9999 * ceiling);
  CHECK(admitted == 1'000'100);
  CHECK(b.snapshot().acquired_total == admitted);
  b.close();
  f.poll_at(t);
  CHECK(stopped == 8);
}

TEST_CASE("acquire, try_acquire, refund and snapshot from several threads keep exact totals",
          "[token_bucket][threads]") {
  fixture f;  // the manual time stands still: only refunds bring tokens back
  bucket b(f.io, {.rate = 1, .capacity = 4});
  constexpr int coroutines = 8;
  constexpr int rounds = 500;
  std::atomic<int> finished{0};
  std::atomic<std::uint64_t> tried{0};
  for (int i = 0; i < coroutines; ++i) {
    net::co_spawn(
        f.io,
        [&]() -> net::awaitable<void> {
          for (int r = 0; r < rounds; ++r) {
            co_await b.acquire();
            b.refund(1);
            if (b.try_acquire()) {
              tried.fetch_add(1, std::memory_order_relaxed);
              b.refund(1);
            }
          }
          if (finished.fetch_add(1) + 1 == coroutines) f.io.stop();  // the bucket's timer would keep run() busy
        },
        net::detached);
  }
  std::atomic<bool> reading{true};
  std::thread reader([&] {
    while (reading.load()) (void)b.snapshot();
  });
  std::thread second([&] { f.io.run(); });
  f.io.run();
  second.join();
  reading.store(false);
  reader.join();
  CHECK(finished.load() == coroutines);
  const rein::token_bucket_snapshot s = b.snapshot();
  CHECK(s.tokens == 4.0);
  CHECK(s.waiting == 0);
  CHECK(s.acquired_total == coroutines * rounds + tried.load());
}

TEST_CASE("try_acquire_at(n, now) decides at the caller's reading; an earlier one counts as the latest",
          "[token_bucket][fast_path]") {
  fixture f;
  bucket b(f.io, {.rate = 10, .capacity = 1});
  CHECK(b.try_acquire_at(1, tick(0)));
  f.poll_at(tick(1));
  const rein::try_result early = b.try_acquire_at(1, at(50ms));  // half a token had arrived by then
  CHECK_FALSE(early);
  CHECK(early.status() == rein::try_status::busy);
  CHECK(early.retry_after() == 50ms);
  CHECK(b.try_acquire_at(1, tick(1)));
  // 0.1 s is the bucket's latest instant, so nothing arrived since; the wait counts from the reading.
  const rein::try_result before = b.try_acquire_at(1, tick(0));
  CHECK_FALSE(before);
  CHECK(before.retry_after() == 200ms);
  // The oldest reading there is: a wait too long to count from it in nanoseconds saturates (never 0, which
  // would have the caller spin).
  const rein::try_result oldest = b.try_acquire_at(1, time_point::min());
  CHECK_FALSE(oldest);
  CHECK(oldest.retry_after() == std::chrono::nanoseconds::max());
  CHECK(b.tokens() == 0.0);
}
