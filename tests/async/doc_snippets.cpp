// The code snippets of the headers' doc comments, verbatim, compiled and run: each header's snippet names
// this file as its source. docs/testing.md shows the manual-clock case below (between its snippet
// markers). The calls they make are stand-ins that answer at once (no network, no sleeping),
// with the status a test chooses, so every snippet completes within one io.run() and what it did is checked.
#include "support/catch.hpp"

#include <rein/adaptive_rate_limiter.hpp>
#include <rein/error.hpp>
#include <rein/keyed.hpp>
#include <rein/outcome.hpp>
#include <rein/quota_gate.hpp>
#include <rein/retry.hpp>
#include <rein/retry_after.hpp>
#include <rein/semaphore.hpp>
#include <rein/sliding_window.hpp>
#include <rein/testing.hpp>
#include <rein/token_bucket.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/co_spawn.hpp>
#include <asio/error.hpp>
#include <asio/io_context.hpp>
#else
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/io_context.hpp>
#endif

#include <chrono>
#include <cstddef>
#include <exception>
#include <string>
#include <string_view>
#include <utility>

namespace {

namespace net = rein::net;
using namespace std::chrono_literals;

struct response {
  int status = 200;
  std::string retry_after;
  std::string header(std::string_view) const { return retry_after; }
};

// The stand-in upstream: answers at once with the status (and Retry-After) the test set.
response next_response;
net::awaitable<response> call() { co_return next_response; }

// Runs a coroutine to completion, rethrowing what it threw.
void run(net::io_context& io, net::awaitable<void> work) {
  bool done = false;
  net::co_spawn(io, std::move(work), [&done](std::exception_ptr e) {
    done = true;
    if (e) std::rethrow_exception(e);
  });
  io.run();
  io.restart();
  REQUIRE(done);
}

}  // namespace

TEST_CASE("doc snippet: token_bucket.hpp", "[doc]") {
  net::io_context io;
  const std::size_t estimate = 8;
  const std::size_t actual = 3;
  rein::token_bucket bucket(io, {.rate = 100, .capacity = 20});
  run(io, [&]() -> net::awaitable<void> {
    co_await bucket.acquire();          // one token; returns at once while the burst lasts
    co_await bucket.acquire(estimate);  // weighted: e.g. tokens of an LLM prompt
    bucket.refund(estimate - actual);   // give back what the call did not use
  }());
  CHECK(bucket.snapshot().acquired_total == 2);
  CHECK(bucket.snapshot().tokens >= 16.0);  // 20 - 1 - 8 + 5 refunded, plus what flowed in meanwhile
}

TEST_CASE("doc snippet: sliding_window.hpp", "[doc]") {
  net::io_context io;
  rein::sliding_window window(io, {.limit = 500, .window = std::chrono::minutes(1)});
  run(io, [&]() -> net::awaitable<void> { co_await window.acquire(); }());
  CHECK(window.snapshot().acquired_total == 1);
}

TEST_CASE("doc snippet: quota_gate.hpp", "[doc]") {
  net::io_context io;
  next_response = {429, "30"};
  rein::quota_gate gate(io);
  run(io, [&]() -> net::awaitable<void> {
    co_await gate.acquire();                     // at once unless a pause is in effect
    auto response = co_await call();
    if (response.status == 429) gate.on_retry_after(response.header("Retry-After"), 1s);
  }());
  CHECK(gate.snapshot().pauses == 1);
  CHECK(gate.snapshot().paused);
}

TEST_CASE("doc snippet: adaptive_rate_limiter.hpp", "[doc]") {
  net::io_context io;
  next_response = {503, {}};
  rein::adaptive_rate_limiter limiter(io, {.initial_rate = 1000, .burst = 10});
  run(io, [&]() -> net::awaitable<void> {
    co_await limiter.acquire();
    const auto sent = std::chrono::steady_clock::now();
    auto response = co_await call();
    limiter.record(rein::classify_http_status(response.status), sent);
  }());
  CHECK(limiter.rate() < 1000.0);  // a 503 is congestion: the rate was cut
}

TEST_CASE("doc snippet: keyed.hpp", "[doc]") {
  net::io_context io;
  const std::string host = "slow-site.example";
  rein::keyed<rein::semaphore> per_host(io, 4);   // semaphore(io, 4) for every host...
  per_host.set_override("slow-site.example", 1);  // ...but semaphore(io, 1) for this one
  run(io, [&]() -> net::awaitable<void> {
    auto permit = co_await per_host.get(host)->acquire();
    CHECK(per_host.get(host)->snapshot().available == 0);
    CHECK(per_host.get("other.example")->snapshot().available == 4);
  }());
}

TEST_CASE("doc snippet: retry.hpp", "[doc]") {
  next_response = {429, "2"};
  const auto now = std::chrono::system_clock::now();
  auto attempt_once = [&]() -> net::awaitable<rein::attempt<response>> {
    response r = co_await call();
    if (r.status == 429)  // net::error::try_again: any error code of the caller's
      co_return rein::attempt<response>::retryable(net::error::try_again,
                                                   rein::parse_retry_after(r.header("Retry-After"), now))
          .with_value(std::move(r));
    co_return rein::attempt<response>::success(std::move(r));
  };
  net::io_context io;
  run(io, [&]() -> net::awaitable<void> {
    const rein::attempt<response> a = co_await attempt_once();
    CHECK(a.kind() == rein::attempt_kind::retryable);
    CHECK(a.retry_after() == std::chrono::nanoseconds{2s});
  }());
}

TEST_CASE("docs/testing.md: a token bucket on the manual clock", "[doc]") {
  //! [manual clock]
  using clock = rein::testing::manual_clock;
  using bucket_type = rein::basic_token_bucket<net::any_io_executor, clock>;

  net::io_context io;
  clock::set(clock::time_point{});                      // the origin of this test's time
  bucket_type bucket(io, {.rate = 10, .capacity = 1});  // one token every 100 ms
  int granted = 0;
  auto count = [&granted](rein::error_code ec) {
    if (!ec) ++granted;
  };
  bucket.async_acquire(1, count);  // the burst: granted at once
  bucket.async_acquire(1, count);  // waits for the next token
  io.poll();
  CHECK(granted == 1);

  clock::advance(std::chrono::milliseconds(99));
  io.poll();
  CHECK(granted == 1);  // at 99 ms, still waiting

  clock::advance(std::chrono::milliseconds(1));
  io.poll();
  CHECK(granted == 2);  // granted exactly at 100 ms
  //! [manual clock]
}
