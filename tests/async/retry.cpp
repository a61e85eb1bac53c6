// rein::retry: exact backoff delays on the manual clock (full jitter drawn from a fixed source), the cap, the
// maximum number of attempts, Retry-After honoured and capped, permanent failures, the retry budget shared
// between calls, one permit and one sample per attempt, cancellation during the sleep, exceptions, the seeded
// jitter, validation.
#include "support/async.hpp"
#include "support/catch.hpp"

#include <rein/adaptive_limiter.hpp>
#include <rein/error.hpp>
#include <rein/retry.hpp>
#include <rein/semaphore.hpp>
#include <rein/testing/manual_clock.hpp>

#include <chrono>
#include <cstdint>
#include <exception>
#include <limits>
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
using policy_t = rein::basic_retry_policy<manual_clock>;
using ns = std::chrono::nanoseconds;

// Options with a fixed "random" number, so that every delay is known: floor(u * ceiling(n)).
rein::retry_options fixed(double u, ns base = 100ms, ns cap = 10s, std::uint32_t max_attempts = 4) {
  rein::retry_options o;
  o.backoff.base = base;
  o.backoff.cap = cap;
  o.backoff.max_attempts = max_attempts;
  o.budget.reset();
  o.random = [u] { return u; };
  return o;
}

// An operation that fails (retryably, or as told) a given number of times, then succeeds with the attempt
// number; it records the manual time of each attempt.
struct scripted_op {
  std::vector<rein::attempt<int>> script;  // what attempts 1..n return; later ones succeed
  std::vector<ns>* times;

  net::awaitable<rein::attempt<int>> operator()(std::uint32_t n) {
    times->push_back(manual_clock::now().time_since_epoch());
    if (n <= script.size()) co_return script[n - 1];
    co_return rein::attempt<int>::success(static_cast<int>(n));
  }
};

rein::attempt<int> busy(std::optional<ns> retry_after = std::nullopt) {
  return rein::attempt<int>::retryable(errc::timed_out, retry_after);
}

// Runs retry(policy, op) on `io`, stepping the manual clock 1 ms at a time until it completes (at most
// `horizon`). Returns the result.
template <class Op>
rein::retry_result<int> run(net::io_context& io, policy_t& policy, Op op, ns horizon = 60s) {
  std::optional<rein::retry_result<int>> result;
  std::exception_ptr error;
  net::co_spawn(io, rein::retry(policy, std::move(op)), [&](std::exception_ptr e, rein::retry_result<int> r) {
    error = e;
    if (!e) result.emplace(std::move(r));
  });
  poll(io);
  for (ns t = 1ms; !result && !error && t <= horizon; t += 1ms) rein_test::set_and_poll(io, manual_clock::time_point{} + t);
  if (error) std::rethrow_exception(error);
  REQUIRE(result);
  return std::move(*result);
}

}  // namespace

TEST_CASE("a first success is one attempt and no sleep", "[retry]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  policy_t policy(fixed(0.5));
  std::vector<ns> times;
  const auto r = run(io, policy, scripted_op{{}, &times});
  CHECK(r);
  CHECK(r.stop == rein::retry_stop::succeeded);
  CHECK(r.attempts == 1);
  CHECK(r.last.value() == 1);
  CHECK(times == std::vector<ns>{0ms});
  const auto s = policy.snapshot();
  CHECK(s.requests_total == 1);
  CHECK(s.attempts_total == 1);
  CHECK(s.retries_total == 0);
  CHECK(s.succeeded_total == 1);
}

TEST_CASE("delays double per failure, with full jitter drawn per delay", "[retry][backoff]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  policy_t policy(fixed(0.5));  // base 100 ms: windows 100, 200, 400 ms; u = 0.5 halves them
  std::vector<ns> times;
  const auto r = run(io, policy, scripted_op{{busy(), busy(), busy()}, &times});
  CHECK(r.stop == rein::retry_stop::succeeded);
  CHECK(r.attempts == 4);
  CHECK(r.last.value() == 4);
  CHECK(times == std::vector<ns>{0ms, 50ms, 150ms, 350ms});
  CHECK(policy.snapshot().retries_total == 3);
}

TEST_CASE("the delay never exceeds the cap", "[retry][backoff]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  policy_t policy(fixed(1.0, 100ms, 300ms, 6));  // u = 1: the whole window
  std::vector<ns> times;
  const auto r = run(io, policy, scripted_op{{busy(), busy(), busy(), busy()}, &times});
  CHECK(r.attempts == 5);
  CHECK(times == std::vector<ns>{0ms, 100ms, 300ms, 600ms, 900ms});
}

TEST_CASE("max_attempts bounds the attempts, the first included", "[retry]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  policy_t policy(fixed(0.5, 100ms, 10s, 3));
  std::vector<ns> times;
  const auto r = run(io, policy, scripted_op{{busy(), busy(), busy(), busy()}, &times});
  CHECK_FALSE(r);
  CHECK(r.stop == rein::retry_stop::attempts_exhausted);
  CHECK(r.attempts == 3);
  CHECK(r.last.kind() == rein::attempt_kind::retryable);
  CHECK(r.last.error() == errc::timed_out);
  CHECK(times == std::vector<ns>{0ms, 50ms, 150ms});
  CHECK(policy.snapshot().attempts_exhausted_total == 1);
}

TEST_CASE("a Retry-After longer than the jitter is waited exactly, and capped by max_retry_after", "[retry]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::retry_options o = fixed(0.5);
  o.backoff.max_retry_after = 2s;
  policy_t policy(o);
  std::vector<ns> times;
  const auto r = run(io, policy, scripted_op{{busy(1500ms), busy(30s), busy(10ms)}, &times});
  CHECK(r.attempts == 4);
  // 1.5 s as asked; 30 s cut to 2 s; 10 ms is below the jittered 200 ms, which wins.
  CHECK(times == std::vector<ns>{0ms, 1500ms, 3500ms, 3700ms});
}

TEST_CASE("a permanent failure stops at once", "[retry]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  policy_t policy(fixed(0.5));
  std::vector<ns> times;
  const auto r = run(io, policy, scripted_op{{busy(), rein::attempt<int>::permanent(errc::closed).with_value(404)}, &times});
  CHECK(r.stop == rein::retry_stop::permanent_failure);
  CHECK(r.attempts == 2);
  CHECK(r.last.error() == errc::closed);
  REQUIRE(r.last.has_value());
  CHECK(r.last.value() == 404);  // the failure's own value (e.g. the response) reaches the caller
  CHECK(times == std::vector<ns>{0ms, 50ms});
  CHECK(policy.snapshot().permanent_total == 1);
}

TEST_CASE("the retry budget, shared by calls, stops retries from snowballing", "[retry][budget]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::retry_options o = fixed(0.5, 100ms, 10s, 10);
  rein::algo::retry_budget_options budget;
  budget.ttl = 10s;
  budget.min_retries_per_second = 0.0;
  budget.retry_ratio = 0.5;  // each call earns half a retry
  o.budget = budget;
  policy_t policy(o);
  auto always_busy = [](std::vector<ns>* times) {
    return scripted_op{std::vector<rein::attempt<int>>(10, busy()), times};
  };

  std::vector<ns> first_times;
  const auto first = run(io, policy, always_busy(&first_times));  // balance 0.5: no retry
  CHECK(first.stop == rein::retry_stop::budget_exhausted);
  CHECK(first.attempts == 1);

  std::vector<ns> second_times;
  const auto second = run(io, policy, always_busy(&second_times));  // balance 1.0: one retry, then none
  CHECK(second.stop == rein::retry_stop::budget_exhausted);
  CHECK(second.attempts == 2);
  CHECK(second_times.size() == 2);

  const auto s = policy.snapshot();
  CHECK(s.requests_total == 2);
  CHECK(s.retries_total == 1);
  CHECK(s.budget_exhausted_total == 2);
  CHECK(policy.retries_available() == 0);
}

TEST_CASE("each attempt holds its own permit and reports its own outcome; none is held while sleeping",
          "[retry][limiter]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  using limiter_t = rein::basic_adaptive_limiter<rein::algo::aimd, net::any_io_executor, manual_clock>;
  limiter_t limiter(io);
  policy_t policy(fixed(0.5));
  std::vector<std::size_t> in_flight_during_sleep;

  auto op = [&](std::uint32_t n) -> net::awaitable<rein::attempt<int>> {
    rein::permit p = co_await limiter.acquire();
    if (n == 1) {
      p.complete(rein::outcome::congestion);  // a 429
      co_return rein::attempt<int>::retryable(errc::timed_out, 1s);
    }
    p.complete(rein::outcome::success);
    co_return rein::attempt<int>::success(200);
  };
  std::optional<rein::retry_result<int>> result;
  net::co_spawn(io, rein::retry(policy, op), [&](std::exception_ptr, rein::retry_result<int> r) { result.emplace(std::move(r)); });
  poll(io);
  rein_test::set_and_poll(io, manual_clock::time_point{} + 500ms);
  in_flight_during_sleep.push_back(limiter.snapshot().in_flight);
  rein_test::set_and_poll(io, manual_clock::time_point{} + 1s);
  REQUIRE(result);
  CHECK(result->last.value() == 200);
  CHECK(in_flight_during_sleep == std::vector<std::size_t>{0});
  const auto s = limiter.snapshot();
  CHECK(s.acquired_total == 2);  // two samples, not one slow success
  CHECK(s.congestion_total == 1);
  CHECK(s.success_total == 1);
}

TEST_CASE("cancelling the caller ends the sleep with operation_aborted", "[retry][cancel]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  policy_t policy(fixed(0.5));
  std::vector<ns> times;
  net::cancellation_signal signal;
  std::exception_ptr error;
  bool completed = false;
  net::co_spawn(io, rein::retry(policy, scripted_op{{busy(5s)}, &times}),
                net::bind_cancellation_slot(signal.slot(), [&](std::exception_ptr e, rein::retry_result<int>) {
                  completed = true;
                  error = e;
                }));
  poll(io);
  rein_test::set_and_poll(io, manual_clock::time_point{} + 1s);
  CHECK_FALSE(completed);
  signal.emit(net::cancellation_type::terminal);
  poll(io);
  REQUIRE(completed);
  REQUIRE(error);
  try {
    std::rethrow_exception(error);
  } catch (const rein::system_error& e) {
    CHECK(e.code() == net::error::operation_aborted);
  }
  CHECK(times.size() == 1);
}

TEST_CASE("an exception from the operation propagates and is not retried", "[retry]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  policy_t policy(fixed(0.5));
  int calls = 0;
  auto op = [&]() -> net::awaitable<rein::attempt<int>> {
    ++calls;
    throw std::runtime_error("boom");
    co_return rein::attempt<int>::success(0);
  };
  CHECK_THROWS_WITH(run(io, policy, op), "boom");
  CHECK(calls == 1);
}

TEST_CASE("attempt<void> and an operation without an attempt number", "[retry]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  policy_t policy(fixed(0.5));
  int calls = 0;
  auto op = [&]() -> net::awaitable<rein::attempt<>> {
    if (++calls < 3) co_return rein::attempt<>::retryable(errc::timed_out);
    co_return rein::attempt<>::success();
  };
  std::optional<rein::retry_result<>> result;
  net::co_spawn(io, rein::retry(policy, op), [&](std::exception_ptr, rein::retry_result<> r) { result.emplace(std::move(r)); });
  poll(io);
  rein_test::set_and_poll(io, manual_clock::time_point{} + 50ms);
  rein_test::set_and_poll(io, manual_clock::time_point{} + 150ms);
  REQUIRE(result);
  CHECK(result->stop == rein::retry_stop::succeeded);
  CHECK(result->attempts == 3);
}

TEST_CASE("the seeded jitter is reproducible and stays within the window", "[retry][jitter]") {
  auto delays = [](std::uint64_t seed) {
    rein::retry_options o;
    o.backoff.base = 100ms;
    o.backoff.cap = 1s;
    o.budget.reset();
    o.seed = seed;
    policy_t policy(o);
    std::vector<ns> out;
    for (std::uint32_t n = 1; n <= 3; ++n) out.push_back(policy.on_attempt(n, busy()).delay);
    return out;
  };
  const auto first = delays(1);
  CHECK(delays(1) == first);
  CHECK(delays(2) != first);
  for (std::size_t i = 0; i < first.size(); ++i) {
    CHECK(first[i] >= 0ms);
    CHECK(first[i] < 100ms * (1 << i));
  }
}

TEST_CASE("invalid options are rejected with the field and the value", "[retry][validation]") {
  rein::retry_options o;
  o.backoff.base = 0ms;
  CHECK_THROWS_WITH(policy_t(o), "rein::retry_policy: backoff.base must be > 0, got 0 ns");
  o = {};
  o.backoff.max_attempts = 0;
  CHECK_THROWS_WITH(policy_t(o), "rein::retry_policy: backoff.max_attempts must be >= 1, got 0");
  o = {};
  rein::algo::retry_budget_options budget;
  budget.retry_ratio = -1;
  o.budget = budget;
  CHECK_THROWS_WITH(policy_t(o), "rein::retry_policy: budget.retry_ratio must be in [0, 1000] and finite, got -1");
  o = {};
  o.name = "payments";
  o.backoff.cap = 1ms;
  o.backoff.base = 2ms;
  CHECK_THROWS_WITH(policy_t(o), "rein::retry_policy \"payments\": backoff.cap must be >= base (2000000 ns), got 1000000 ns");
}

TEST_CASE("a bad jitter draw throws and charges nothing; a negative Retry-After reads as none",
          "[retry][validation]") {
  rein_test::manual_clock_at_epoch epoch;
  const std::pair<double, std::string> draws[] = {
      {std::numeric_limits<double>::quiet_NaN(), "nan"}, {2.0, "2"}, {-0.5, "-0.5"}};
  for (const auto& [bad, shown] : draws) {
    rein::retry_options o = fixed(bad);
    o.budget = rein::algo::retry_budget_options{};
    o.name = "payments";
    policy_t drawing(o);
    const std::int64_t available = drawing.retries_available();
    REQUIRE(available == 100);  // the budget's reserve: 10 per second over its 10 s window
    CHECK_THROWS_WITH(drawing.on_attempt(1, busy()),
                      "rein::retry_policy \"payments\": random() must be in [0, 1], got " + shown);
    CHECK(drawing.retries_available() == available);
    CHECK(drawing.snapshot().retries_total == 0);
    CHECK(drawing.snapshot().attempts_total == 0);
  }

  // The server's negative Retry-After says nothing usable: the attempt carries none, and the delay is the
  // jittered one (u = 0.5 of the first window of 100 ms).
  CHECK(busy(-1s).retry_after() == std::nullopt);
  CHECK(busy(0s).retry_after() == std::optional<ns>(0s));
  rein::retry_options negative = fixed(0.5);
  negative.budget = rein::algo::retry_budget_options{};
  policy_t told(negative);
  CHECK(told.on_attempt(1, busy(-1s)).delay == 50ms);
  CHECK(told.snapshot().retries_total == 1);
  CHECK(told.on_attempt(2, busy(1s)).delay == 1s);  // a valid one is honoured as before
}
