// Debt and upstream corrections on the async rate limiters: charge(n) takes a limiter below zero and
// re-times queued waiters; limit_remaining(remaining, reset_after) lowers it from a provider's count. Manual
// clock, exact grant times.
#include "support/catch.hpp"

#include <rein/adaptive_rate_limiter.hpp>
#include <rein/algo/all_of.hpp>
#include <rein/algo/sliding_window_counter.hpp>
#include <rein/rate_limit_headers.hpp>
#include <rein/rate_limiter.hpp>
#include <rein/sliding_window.hpp>
#include <rein/testing/manual_clock.hpp>
#include <rein/token_bucket.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/io_context.hpp>
#else
#include <boost/asio/io_context.hpp>
#endif

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
namespace net = rein::net;
using clock_type = rein::testing::manual_clock;
using time_point = clock_type::time_point;
using bucket = rein::basic_token_bucket<net::any_io_executor, clock_type>;
using window = rein::basic_sliding_window<net::any_io_executor, clock_type>;
using adaptive = rein::basic_adaptive_rate_limiter<net::any_io_executor, clock_type>;
using algo_bucket = rein::algo::basic_token_bucket<clock_type>;
using budgets = rein::basic_rate_limiter<rein::algo::all_of<algo_bucket, algo_bucket>>;
using rein::error_code;

// The members exist exactly where the limit has them.
template <class L>
concept has_limit_remaining = requires(L& l) { l.limit_remaining(std::int64_t{1}, std::chrono::nanoseconds{1}); };
template <class L>
concept has_charge = requires(L& l) { l.charge(std::size_t{1}); };
using counter_limiter = rein::basic_rate_limiter<rein::algo::basic_sliding_window_counter<clock_type>>;
static_assert(has_limit_remaining<bucket> && has_limit_remaining<window> && has_limit_remaining<adaptive>);
static_assert(!has_limit_remaining<counter_limiter> && has_charge<counter_limiter>);
static_assert(has_charge<bucket> && has_charge<window> && has_charge<adaptive> && has_charge<budgets>);

time_point at(std::chrono::nanoseconds d) { return time_point{} + d; }

std::string show(time_point t) {
  const std::int64_t ns = t.time_since_epoch().count();
  if (ns % 1'000'000 == 0) return std::to_string(ns / 1'000'000) + "ms";
  return std::to_string(ns) + "ns";
}

struct completion_log {
  std::vector<std::string> lines;
  auto handler(int id) {
    return [this, id](error_code ec) {
      lines.push_back(std::to_string(id) + " " + show(clock_type::now()) + " " + (ec ? ec.message() : "ok"));
    };
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

  // Polls one nanosecond before and at each step, so a logged time is the exact grant time.
  void run_to(time_point end, std::chrono::nanoseconds step) {
    poll_at(clock_type::now());
    for (time_point t = clock_type::now() + step; t <= end; t += step) {
      poll_at(t - 1ns);
      poll_at(t);
    }
  }
};

}  // namespace

TEST_CASE("a charge into debt delays the next callers until the rate repays it", "[debt][token_bucket]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 10, .capacity = 5});
  CHECK(b.try_acquire(5));
  b.charge(3);  // the call used 8, not 5: 3 in debt
  CHECK(b.tokens() == -3.0);
  CHECK_FALSE(b.try_acquire(1));
  CHECK(b.try_acquire(1).retry_after() == 400ms);
  b.async_acquire(1, log.handler(0));
  f.run_to(at(1s), 50ms);
  CHECK(log.lines == std::vector<std::string>{"0 400ms ok"});
}

TEST_CASE("a charge re-times a queued waiter later at once", "[debt][token_bucket]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 10, .capacity = 2, .initial_tokens = 0});
  b.async_acquire(2, log.handler(0));  // due at 200 ms
  f.poll_at(at(100ms));
  b.charge(4);  // 1 - 4 = -3: two tokens are there 500 ms later, at 600 ms
  f.run_to(at(600ms), 50ms);
  CHECK(log.lines == std::vector<std::string>{"0 600ms ok"});
  CHECK(b.snapshot().tokens == 0.0);
}

TEST_CASE("a charge above the capacity never fails and is repaid", "[debt][token_bucket]") {
  fixture f;
  bucket b(f.io, {.rate = 100, .capacity = 10});
  b.charge(1000);
  CHECK(b.tokens() == -990.0);
  f.poll_at(at(9900ms));
  CHECK(b.tokens() == 0.0);
  f.poll_at(at(10s));
  CHECK(b.try_acquire(10));
}

TEST_CASE("limit_remaining lowers the bucket from a provider's count and re-times waiters",
          "[remaining][token_bucket]") {
  fixture f;
  completion_log log;
  bucket b(f.io, {.rate = 10, .capacity = 100});
  CHECK(b.limit_remaining(2, 1s));  // 2 more until the reset in 1 s; the bucket keeps its 100
  CHECK(b.tokens() == 100.0);
  for (int id = 0; id < 3; ++id) b.async_acquire(1, log.handler(id));
  f.run_to(at(1200ms), 50ms);
  // Two at once within the provider's second, the third at its reset.
  CHECK(log.lines == std::vector<std::string>{"0 0ms ok", "1 0ms ok", "2 1000ms ok"});
  CHECK_FALSE(b.limit_remaining(1000, 1s));
  CHECK(b.limit_remaining(-5, -1s));  // read as 0 left, reset now: the balance goes to at most 0
  CHECK(b.tokens() == 0.0);
}

TEST_CASE("a provider's headers correct the bucket through rein::limit_remaining", "[remaining][token_bucket]") {
  fixture f;
  bucket b(f.io, {.rate = 1, .capacity = 60});
  const auto now = std::chrono::system_clock::time_point{} + 1000h;
  const auto lookup = [](std::string_view name) -> std::optional<std::string_view> {
    if (name == "x-ratelimit-remaining-requests") return "3";
    if (name == "x-ratelimit-reset-requests") return "2s";
    return std::nullopt;
  };
  const rein::upstream_response r = rein::read_response(200, lookup, now);
  CHECK(rein::limit_remaining(b, r.requests));
  CHECK(b.tokens() == 3.0);  // OpenAI's count refills continuously: 3 now, and "2s" is the time until full
  CHECK_FALSE(rein::limit_remaining(b, r.tokens));  // no token headers: nothing to apply
  // The same count as a window's (GitHub-style): at most 3 until the reset in 2 s, then the bucket's own.
  const auto window = [](std::string_view name) -> std::optional<std::string_view> {
    if (name == "x-ratelimit-remaining") return "3";
    if (name == "x-ratelimit-reset") return "2";
    return std::nullopt;
  };
  bucket w(f.io, {.rate = 1, .capacity = 60});
  CHECK(rein::limit_remaining(w, rein::read_response(200, window, now).requests));
  CHECK(w.tokens() == 60.0);
  CHECK(w.try_acquire(3));
  CHECK_FALSE(w.try_acquire(1));
  f.poll_at(at(2s));
  CHECK(w.try_acquire(57));
}

TEST_CASE("sliding_window charge and limit_remaining on the async window", "[debt][sliding_window]") {
  fixture f;
  completion_log log;
  window w(f.io, {.limit = 3, .window = 1s});
  w.charge(5);  // 5 starts at 0 in a window of 3
  CHECK_FALSE(w.try_acquire(1));
  w.async_acquire(3, log.handler(0));
  f.run_to(at(1500ms), 100ms);
  CHECK(log.lines == std::vector<std::string>{"0 1000ms ok"});
  // At 1.5 s: 1 left until 1.8 s; the 3 starts of 1 s count then, so nothing is recorded.
  CHECK_FALSE(w.limit_remaining(1, 300ms));
  f.poll_at(at(2s));
  CHECK(w.limit_remaining(1, 300ms));  // window empty at 2 s: 2 starts recorded, leaving at 2.3 s
  CHECK(w.try_acquire(1));
  CHECK_FALSE(w.try_acquire(1));
  f.poll_at(at(2300ms));
  CHECK_FALSE(w.try_acquire(1));
  f.poll_at(at(2300ms + 1ns));
  CHECK(w.try_acquire(2));
}

TEST_CASE("rate_limits charge each budget its own count", "[debt][all_of]") {
  fixture f;
  completion_log log;
  using counts = budgets::limit_type::counts;
  const time_point now = clock_type::now();
  budgets limits(f.io, rein::algo::all_of{algo_bucket({.rate = 1, .capacity = 10}, now),
                                          algo_bucket({.rate = 100, .capacity = 1000}, now)});
  limits.update([](budgets::limit_type& l, time_point t) { CHECK(l.try_take(counts{1, 900}, t) == rein::algo::take_result::allowed); });
  limits.charge(0);  // no-op
  limits.update([](budgets::limit_type& l, time_point t) { l.charge(counts{0, 400}, t); });  // used 1,300
  limits.async_acquire(1, log.handler(0));  // needs 1 token of the second: 301 at 100 per second
  f.run_to(at(4s), 10ms);
  CHECK(log.lines == std::vector<std::string>{"0 3010ms ok"});
}

TEST_CASE("adaptive_rate_limiter charge takes its bucket into debt", "[debt][adaptive_rate]") {
  fixture f;
  completion_log log;
  adaptive a(f.io, {.initial_rate = 10, .burst = 2, .min_rate = 1, .max_rate = 100});
  a.charge(4);  // 2 - 4 = -2
  a.async_acquire(1, log.handler(0));
  f.run_to(at(1s), 50ms);
  CHECK(log.lines == std::vector<std::string>{"0 300ms ok"});
  CHECK(a.limit_remaining(0, 1s));
}
