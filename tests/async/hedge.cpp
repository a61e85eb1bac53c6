// rein::hedge: no hedge when the first attempt answers before the delay, a hedge at exactly the delay, the
// loser cancelled with its permit back, the budget refusing a hedge, the delay from a known histogram's
// quantile and from the policy's own latencies, failures, caller cancellation, validation; all on the
// manual clock.
#include "support/async.hpp"
#include "support/catch.hpp"

#include <rein/error.hpp>
#include <rein/hedge.hpp>
#include <rein/null_mutex.hpp>
#include <rein/semaphore.hpp>
#include <rein/testing/manual_clock.hpp>

#include <chrono>
#include <cstdint>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace std::chrono_literals;
namespace net = rein::net;
using rein::errc;
using rein::error_code;
using rein::testing::manual_clock;
using rein_test::poll;
using policy_t = rein::basic_hedge_policy<manual_clock>;
using ns = std::chrono::nanoseconds;
using manual_timer = net::basic_waitable_timer<manual_clock, net::wait_traits<manual_clock>, net::any_io_executor>;

// Options with a fixed delay and no budget (a test that needs one sets it).
rein::hedge_options fixed(ns delay) {
  rein::hedge_options o;
  o.delay = delay;
  o.budget.reset();
  return o;
}

// What one attempt of the fake upstream does: answer after `latency` with `answer`.
struct step {
  ns latency;
  rein::attempt<int> answer;
};

// A fake upstream behind a semaphore: attempt n takes a permit, waits script[n - 1].latency on the manual
// clock, and returns its answer (a success carries the attempt number). It records when each attempt
// started and how its wait ended (operation_aborted when cancelled); a cancelled attempt returns retryable.
struct upstream {
  rein::semaphore* limiter;
  std::vector<step> script;
  std::vector<ns> started{};
  std::vector<error_code> ended{};

  net::awaitable<rein::attempt<int>> call(std::uint32_t n) {
    rein::permit permit = co_await limiter->acquire();
    started.push_back(rein_test::since_epoch());
    manual_timer timer(co_await net::this_coro::executor);
    timer.expires_after(script.at(n - 1).latency);
    error_code ec;
    co_await timer.async_wait(net::redirect_error(net::use_awaitable, ec));
    ended.push_back(ec);
    if (ec) co_return rein::attempt<int>::retryable(ec);
    co_return script.at(n - 1).answer;
  }
};

rein::attempt<int> ok(int v) { return rein::attempt<int>::success(v); }
rein::attempt<int> busy() { return rein::attempt<int>::retryable(errc::timed_out); }

// Runs hedge(policy, op) on `io`, stepping the manual clock 1 ms at a time until it completes. Returns when
// it completed (since the epoch) and the result.
template <class Start>
std::pair<ns, rein::hedge_result<int>> run(net::io_context& io, Start start, ns horizon = 10s) {
  std::optional<rein::hedge_result<int>> result;
  std::exception_ptr error;
  ns at{};
  net::co_spawn(io, start(), [&](std::exception_ptr e, rein::hedge_result<int> r) {
    at = rein_test::since_epoch();
    error = e;
    if (!e) result.emplace(std::move(r));
  });
  poll(io);
  for (ns t = 1ms; !result && !error && t <= horizon; t += 1ms)
    rein_test::set_and_poll(io, manual_clock::time_point{} + t);
  if (error) std::rethrow_exception(error);
  REQUIRE(result);
  return {at, std::move(*result)};
}

auto call_of(upstream& u) {
  return [&u](std::uint32_t n) { return u.call(n); };
}

}  // namespace

TEST_CASE("a first attempt that answers before the delay is the only one", "[hedge]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::semaphore limiter(io, 2);
  policy_t policy(fixed(100ms));
  upstream u{&limiter, {{99ms, ok(1)}}};
  const auto [at, r] = run(io, [&] { return rein::hedge(policy, call_of(u)); });
  CHECK(r);
  CHECK(r.last.value() == 1);
  CHECK(r.attempts == 1);
  CHECK(r.winner == 1);
  CHECK(r.hedge == rein::hedge_decision::not_needed);
  CHECK(at == 99ms);
  CHECK(u.started == std::vector<ns>{0ms});
  const auto s = policy.snapshot();
  CHECK(s.requests_total == 1);
  CHECK(s.attempts_total == 1);
  CHECK(s.hedges_total == 0);
  CHECK(s.succeeded_total == 1);
  CHECK(s.acquired_total == 1);
  CHECK(s.latency.count() == 1);
  CHECK(s.latency.max() == 99ms);
}

TEST_CASE("the hedge starts at exactly the delay, and the faster one wins", "[hedge]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::semaphore limiter(io, 2);
  policy_t policy(fixed(100ms));
  upstream u{&limiter, {{500ms, ok(1)}, {50ms, ok(2)}}};
  const auto [at, r] = run(io, [&] { return rein::hedge(policy, call_of(u)); });
  CHECK(u.started == std::vector<ns>{0ms, 100ms});
  CHECK(at == 150ms);
  CHECK(r.last.value() == 2);
  CHECK(r.attempts == 2);
  CHECK(r.winner == 2);
  CHECK(r.hedge == rein::hedge_decision::started);
  // The hedge answered first; the first attempt was cancelled, saw operation_aborted and gave its permit back.
  CHECK(u.ended == std::vector<error_code>{error_code{}, net::error::operation_aborted});
  CHECK(limiter.snapshot().in_flight == 0);
  CHECK(limiter.snapshot().acquired_total == 2);  // both attempts charged through the limiter
  const auto s = policy.snapshot();
  CHECK(s.attempts_total == 2);
  CHECK(s.hedges_total == 1);
  CHECK(s.hedges_won_total == 1);
  CHECK(s.hedges_cancelled_total == 0);
  CHECK(s.latency.count() == 1);  // the cancelled attempt's latency is unknown: not recorded
  CHECK(s.latency.max() == 50ms);
}

TEST_CASE("a first attempt that answers after the hedge started cancels the hedge", "[hedge][cancel]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::semaphore limiter(io, 2);
  policy_t policy(fixed(100ms));
  upstream u{&limiter, {{130ms, ok(1)}, {200ms, ok(2)}}};
  const auto [at, r] = run(io, [&] { return rein::hedge(policy, call_of(u)); });
  CHECK(at == 130ms);
  CHECK(r.last.value() == 1);
  CHECK(r.winner == 1);
  CHECK(r.attempts == 2);
  CHECK(u.ended == std::vector<error_code>{error_code{}, net::error::operation_aborted});
  CHECK(limiter.snapshot().in_flight == 0);
  const auto s = policy.snapshot();
  CHECK(s.hedges_total == 1);
  CHECK(s.hedges_won_total == 0);
  CHECK(s.hedges_cancelled_total == 1);
}

TEST_CASE("a hedge waits for the limiter like any call, and is charged there", "[hedge][limiter]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::semaphore limiter(io, 1);  // the first attempt holds the only permit
  policy_t policy(fixed(100ms));
  upstream u{&limiter, {{300ms, ok(1)}, {10ms, ok(2)}}};
  const auto [at, r] = run(io, [&] { return rein::hedge(policy, call_of(u)); });
  CHECK(at == 300ms);
  CHECK(r.winner == 1);
  CHECK(u.started == std::vector<ns>{0ms});  // the hedge never got a permit: cancelled in the line
  CHECK(limiter.snapshot().cancelled_total == 1);
  CHECK(limiter.snapshot().in_flight == 0);
  CHECK(policy.snapshot().hedges_cancelled_total == 1);
}

TEST_CASE("the hedge budget refuses a hedge; the first attempt then runs alone", "[hedge][budget]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::semaphore limiter(io, 2);
  rein::hedge_options o = fixed(100ms);
  rein::algo::retry_budget_options budget;
  budget.ttl = 10s;
  budget.min_retries_per_second = 0.0;
  budget.retry_ratio = 0.5;  // each call earns half a hedge
  o.budget = budget;
  policy_t policy(o);

  upstream first{&limiter, {{300ms, ok(1)}, {10ms, ok(2)}}};
  const auto [at1, r1] = run(io, [&] { return rein::hedge(policy, call_of(first)); });  // balance 0.5: refused
  CHECK(at1 == 300ms);
  CHECK(r1.hedge == rein::hedge_decision::refused);
  CHECK(r1.attempts == 1);
  CHECK(first.started == std::vector<ns>{0ms});

  upstream second{&limiter, {{300ms, ok(1)}, {10ms, ok(2)}}};
  const auto [at2, r2] = run(io, [&] { return rein::hedge(policy, call_of(second)); });  // balance 1.0
  CHECK(r2.hedge == rein::hedge_decision::started);
  CHECK(r2.winner == 2);
  CHECK(at2 == 300ms + 110ms);
  CHECK(second.started == std::vector<ns>{300ms, 400ms});

  const auto s = policy.snapshot();
  CHECK(s.requests_total == 2);
  CHECK(s.hedges_total == 1);
  CHECK(s.hedges_refused_total == 1);
  CHECK(policy.hedges_available() == 0);
}

TEST_CASE("the delay is the quantile of a known histogram, or the fixed delay below min_samples", "[hedge][quantile]") {
  rein::hedge_options o = fixed(2s);
  o.quantile = 95.0;
  o.min_samples = 20;
  policy_t policy(o);
  rein::duration_histogram latencies;
  for (int i = 1; i <= 19; ++i) latencies.record(ns(i * 10ms));
  CHECK(policy.delay_for(latencies) == 2s);  // 19 values: too few
  latencies.record(200ms);
  // 20 values, 10 ms .. 200 ms: p95 is rank 19, 190 ms, read as its bucket's midpoint (bucket width 4,194,304 ns
  // for [134 ms, 268 ms): 190 ms falls in [188,743,680, 192,937,984) ns).
  CHECK(policy.delay_for(latencies) == ns(190'840'832));
  CHECK(latencies.percentile(95.0) == ns(190'840'832));

  rein::hedge_options without = fixed(2s);
  CHECK(policy_t(without).delay_for(latencies) == 2s);  // no quantile: the fixed delay
}

TEST_CASE("a hedge at the quantile of the caller's histogram", "[hedge][quantile]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::semaphore limiter(io, 2);
  rein::hedge_options o = fixed(2s);
  o.quantile = 50.0;
  o.min_samples = 1;
  policy_t policy(o);
  rein::duration_histogram latencies;
  latencies.record(60ms, 2);
  latencies.record(70ms);
  // The median is rank 2, 60 ms, read as the midpoint of its bucket: 60,000,000 ns lies in the octave
  // [2^25, 2^26) ns of 32 buckets of 1,048,576 ns, in bucket [59,768,832, 60,817,408).
  const ns delay = policy.delay_for(latencies);
  CHECK(delay == ns(60'293'120));
  upstream u{&limiter, {{1s, ok(1)}, {10ms, ok(2)}}};
  std::optional<rein::hedge_result<int>> result;
  net::co_spawn(io, rein::hedge(policy, call_of(u), latencies),
                [&](std::exception_ptr, rein::hedge_result<int> r) { result.emplace(std::move(r)); });
  poll(io);
  rein_test::set_and_poll(io, manual_clock::time_point{} + delay - 1ns);
  CHECK(u.started == std::vector<ns>{0ms});
  rein_test::set_and_poll(io, manual_clock::time_point{} + delay);
  CHECK(u.started == std::vector<ns>{0ms, delay});
  rein_test::set_and_poll(io, manual_clock::time_point{} + delay + 10ms);
  REQUIRE(result);
  CHECK(result->winner == 2);
}

TEST_CASE("the policy's own latencies set the delay from the next period on", "[hedge][quantile]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::semaphore limiter(io, 2);
  rein::hedge_options o = fixed(2s);
  o.quantile = 50.0;
  o.min_samples = 2;
  o.latency_period = 1s;
  policy_t policy(o);
  for (int i = 0; i < 2; ++i) {  // two calls of 40 ms each, in the first period
    upstream u{&limiter, {{40ms, ok(1)}}};
    run(io, [&] { return rein::hedge(policy, call_of(u)); });
  }
  CHECK(policy.delay() == 2s);  // still the first period: nothing full to read
  rein_test::set_and_poll(io, manual_clock::time_point{} + 1s);
  CHECK(policy.delay() == 40ms);  // 40 ms exactly: clamped to [min, max] of the bucket's values
  rein_test::set_and_poll(io, manual_clock::time_point{} + 3s);
  CHECK(policy.delay() == 2s);  // two periods without calls: nothing to read
}

TEST_CASE("a retryable failure before the delay ends the call without a hedge", "[hedge][failure]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::semaphore limiter(io, 2);
  policy_t policy(fixed(100ms));
  upstream u{&limiter, {{20ms, busy()}}};
  const auto [at, r] = run(io, [&] { return rein::hedge(policy, call_of(u)); });
  CHECK_FALSE(r);
  CHECK(at == 20ms);
  CHECK(r.last.error() == errc::timed_out);
  CHECK(r.hedge == rein::hedge_decision::not_needed);
  CHECK(r.attempts == 1);
  CHECK(policy.snapshot().failed_total == 1);
}

TEST_CASE("a retryable failure while the other attempt runs waits for it", "[hedge][failure]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::semaphore limiter(io, 2);
  policy_t policy(fixed(100ms));
  SECTION("the other succeeds") {
    upstream u{&limiter, {{150ms, busy()}, {200ms, ok(2)}}};
    const auto [at, r] = run(io, [&] { return rein::hedge(policy, call_of(u)); });
    CHECK(at == 300ms);
    CHECK(r.winner == 2);
    CHECK(r.last.value() == 2);
    CHECK(u.ended == std::vector<error_code>{error_code{}, error_code{}});
  }
  SECTION("both fail: the later failure") {
    upstream u{&limiter, {{150ms, busy()}, {200ms, rein::attempt<int>::retryable(errc::closed)}}};
    const auto [at, r] = run(io, [&] { return rein::hedge(policy, call_of(u)); });
    CHECK(at == 300ms);
    CHECK(r.winner == 2);
    CHECK(r.last.error() == errc::closed);
    CHECK(policy.snapshot().failed_total == 1);
  }
}

TEST_CASE("a permanent failure ends the call and cancels the other attempt", "[hedge][failure]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::semaphore limiter(io, 2);
  policy_t policy(fixed(100ms));
  upstream u{&limiter, {{500ms, ok(1)}, {50ms, rein::attempt<int>::permanent(errc::closed).with_value(404)}}};
  const auto [at, r] = run(io, [&] { return rein::hedge(policy, call_of(u)); });
  CHECK(at == 150ms);
  CHECK(r.winner == 2);
  CHECK(r.last.kind() == rein::attempt_kind::permanent);
  CHECK(r.last.value() == 404);
  CHECK(u.ended == std::vector<error_code>{error_code{}, net::error::operation_aborted});
  CHECK(limiter.snapshot().in_flight == 0);
}

TEST_CASE("cancelling the caller cancels both attempts and throws operation_aborted", "[hedge][cancel]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::semaphore limiter(io, 2);
  policy_t policy(fixed(100ms));
  upstream u{&limiter, {{500ms, ok(1)}, {500ms, ok(2)}}};
  net::cancellation_signal signal;
  std::exception_ptr error;
  bool completed = false;
  net::co_spawn(io, rein::hedge(policy, call_of(u)),
                net::bind_cancellation_slot(signal.slot(), [&](std::exception_ptr e, rein::hedge_result<int>) {
                  completed = true;
                  error = e;
                }));
  poll(io);
  rein_test::set_and_poll(io, manual_clock::time_point{} + 100ms);
  rein_test::set_and_poll(io, manual_clock::time_point{} + 150ms);
  CHECK(u.started == std::vector<ns>{0ms, 100ms});
  CHECK(limiter.snapshot().in_flight == 2);
  signal.emit(net::cancellation_type::terminal);
  poll(io);
  REQUIRE(completed);
  REQUIRE(error);
  try {
    std::rethrow_exception(error);
  } catch (const rein::system_error& e) {
    CHECK(e.code() == net::error::operation_aborted);
  }
  CHECK(u.ended == std::vector<error_code>{net::error::operation_aborted, net::error::operation_aborted});
  CHECK(limiter.snapshot().in_flight == 0);
}

TEST_CASE("cancelling the caller before the delay cancels the first attempt and starts no hedge", "[hedge][cancel]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::semaphore limiter(io, 2);
  policy_t policy(fixed(100ms));
  upstream u{&limiter, {{500ms, ok(1)}, {500ms, ok(2)}}};
  net::cancellation_signal signal;
  std::exception_ptr error;
  net::co_spawn(
      io, rein::hedge(policy, call_of(u)),
      net::bind_cancellation_slot(signal.slot(), [&](std::exception_ptr e, rein::hedge_result<int>) { error = e; }));
  poll(io);
  rein_test::set_and_poll(io, manual_clock::time_point{} + 50ms);
  signal.emit(net::cancellation_type::terminal);
  poll(io);
  rein_test::set_and_poll(io, manual_clock::time_point{} + 200ms);
  REQUIRE(error);
  CHECK(u.started == std::vector<ns>{0ms});
  CHECK(u.ended == std::vector<error_code>{net::error::operation_aborted});
  CHECK(policy.snapshot().hedges_total == 0);
}

TEST_CASE("a partial cancellation the caller lets through, then a terminal one, each cancel both attempts",
          "[hedge][cancel]") {
  // Each arm reads what passed the caller's filter as terminal: a partial cancellation that the arms ignored
  // used up the one forwarding of the parallel group, and the terminal one after it never reached them.
  for (const auto first : {net::cancellation_type::partial, net::cancellation_type::total}) {
    rein_test::manual_clock_at_epoch epoch;
    net::io_context io;
    rein::semaphore limiter(io, 2);
    policy_t policy(fixed(100ms));
    upstream u{&limiter, {{300ms, ok(1)}, {1000ms, ok(2)}}};
    net::cancellation_signal signal;
    std::exception_ptr error;
    ns at{};
    auto caller = [&]() -> net::awaitable<rein::hedge_result<int>> {
      co_await net::this_coro::reset_cancellation_state(net::enable_total_cancellation());
      co_return co_await rein::hedge(policy, call_of(u));
    };
    net::co_spawn(io, caller(), net::bind_cancellation_slot(signal.slot(), [&](std::exception_ptr e, rein::hedge_result<int>) {
                    at = rein_test::since_epoch();
                    error = e;
                  }));
    poll(io);
    rein_test::set_and_poll(io, manual_clock::time_point{} + 100ms);
    rein_test::set_and_poll(io, manual_clock::time_point{} + 150ms);
    signal.emit(first);
    poll(io);
    REQUIRE(error);
    CHECK(at == 150ms);
    CHECK(u.started == std::vector<ns>{0ms, 100ms});
    CHECK(u.ended == std::vector<error_code>{net::error::operation_aborted, net::error::operation_aborted});
    CHECK(limiter.snapshot().in_flight == 0);
  }
}

TEST_CASE("a hedge that succeeds in the instant the first attempt does is not counted cancelled", "[hedge][cancel]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::semaphore limiter(io, 2);
  policy_t policy(fixed(100ms));
  upstream u{&limiter, {{150ms, ok(1)}, {50ms, ok(2)}}};
  const auto [at, r] = run(io, [&] { return rein::hedge(policy, call_of(u)); });
  CHECK(at == 150ms);
  CHECK(r.attempts == 2);
  CHECK(u.ended == std::vector<error_code>{error_code{}, error_code{}});
  const auto s = policy.snapshot();
  CHECK(s.hedges_total == 1);
  CHECK(r.winner == 1);  // the first attempt's end is seen first
  CHECK(s.hedges_won_total == 0);
  CHECK(s.hedges_cancelled_total == 0);
  CHECK(s.latency.count() == 2);  // both ended by themselves: both latencies recorded
}

TEST_CASE("an exception from the deciding attempt propagates after the other ended", "[hedge]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::semaphore limiter(io, 2);
  policy_t policy(fixed(100ms));
  upstream u{&limiter, {{500ms, ok(1)}}};
  auto op = [&](std::uint32_t n) -> net::awaitable<rein::attempt<int>> {
    if (n == 2) throw std::runtime_error("boom");
    co_return co_await u.call(n);
  };
  CHECK_THROWS_WITH(run(io, [&] { return rein::hedge(policy, op); }), "boom");
  CHECK(u.ended == std::vector<error_code>{net::error::operation_aborted});
  CHECK(limiter.snapshot().in_flight == 0);
}

TEST_CASE("invalid hedge options are refused with the type, field and value", "[hedge][validation]") {
  rein::hedge_options o;
  o.delay = 0ms;
  CHECK_THROWS_WITH(policy_t(o), "rein::hedge_policy: delay must be > 0, got 0 ns");
  o = {};
  o.quantile = 100.0;
  CHECK_THROWS_WITH(policy_t(o), "rein::hedge_policy: quantile must be in (0, 100), got 100");
  o = {};
  o.name = "search";
  o.min_samples = 0;
  CHECK_THROWS_WITH(policy_t(o), "rein::hedge_policy \"search\": min_samples must be >= 1, got 0");
  o = {};
  o.latency_period = -1s;
  CHECK_THROWS_WITH(policy_t(o), "rein::hedge_policy: latency_period must be > 0, got -1000000000 ns");
  o = {};
  rein::algo::retry_budget_options budget;
  budget.retry_ratio = -1;
  o.budget = budget;
  CHECK_THROWS_WITH(policy_t(o), "rein::hedge_policy: budget.retry_ratio must be in [0, 1000] and finite, got -1");
}

TEST_CASE("the default budget allows 10 hedges of reserve and a tenth of the calls", "[hedge][budget]") {
  rein_test::manual_clock_at_epoch epoch;
  policy_t policy;
  CHECK(policy.hedges_available() == 10);  // 1 per second over 10 s
  for (int i = 0; i < 10; ++i) policy.on_request();
  CHECK(policy.hedges_available() == 11);
}

TEST_CASE("attempt<void>, an op without an attempt number, and a policy for one thread", "[hedge]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::basic_hedge_policy<manual_clock, rein::null_mutex> policy(fixed(100ms));
  int calls = 0;
  auto op = [&]() -> net::awaitable<rein::attempt<>> {
    manual_timer timer(co_await net::this_coro::executor);
    timer.expires_after(++calls == 1 ? ns(1s) : ns(10ms));
    co_await timer.async_wait(net::use_awaitable);  // the loser throws operation_aborted: dropped
    co_return rein::attempt<>::success();
  };
  std::optional<rein::hedge_result<>> result;
  net::co_spawn(io, rein::hedge(policy, op), [&](std::exception_ptr, rein::hedge_result<> r) { result.emplace(r); });
  poll(io);
  rein_test::set_and_poll(io, manual_clock::time_point{} + 100ms);
  CHECK_FALSE(result);
  rein_test::set_and_poll(io, manual_clock::time_point{} + 110ms);
  REQUIRE(result);
  CHECK(*result);
  CHECK(result->winner == 2);
  CHECK(calls == 2);
  CHECK(policy.snapshot().hedges_won_total == 1);
}
