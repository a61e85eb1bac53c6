// rein::redis::shared_token_bucket against a real redis-server, in one process.
#include "support.hpp"

#include <rein/error.hpp>
#include <rein/keyed.hpp>
#include <rein/redis/shared_token_bucket.hpp>
#include <rein/semaphore.hpp>
#include <rein/throttle.hpp>

#include <algorithm>
#include <thread>
#include <vector>

using namespace rein_test;
using rein::redis::reply;
using rein::redis::shared_token_bucket;
using rein::redis::shared_token_bucket_options;

namespace {

shared_token_bucket_options quota(const std::string& name, double rate, std::int64_t capacity) {
  return {.key = unique_key(name), .rate = rate, .capacity = capacity};
}

// Any rein rate limiter: what rein::throttle and user code write against.
template <class RateLimiter>
net::awaitable<void> start_call(RateLimiter& limiter, std::size_t cost, int& started) {
  co_await limiter.acquire(cost);
  ++started;
}

// A clock `Hours` ahead of the machine's steady clock: a client whose clock is wrong by hours.
template <int Hours>
struct skewed_clock {
  using rep = steady::rep;
  using period = steady::period;
  using duration = steady::duration;
  using time_point = std::chrono::time_point<skewed_clock, duration>;
  static constexpr bool is_steady = true;
  static time_point now() noexcept { return time_point(steady::now().time_since_epoch() + std::chrono::hours(Hours)); }
};

}  // namespace

TEST_CASE("clients whose clocks disagree by hours share the bucket exactly: only Redis's clock counts") {
  redis_server server;
  net::io_context io;
  const auto options = quota("skew", 5, 2);  // burst 2, then a token every 200 ms
  rein::redis::basic_shared_token_bucket<net::any_io_executor, skewed_clock<10>, std::mutex> ahead(
      io.get_executor(), local(server.port()), options);
  rein::redis::basic_shared_token_bucket<net::any_io_executor, skewed_clock<1>, std::mutex> behind(
      io.get_executor(), local(server.port()), options);
  recorder r(6);
  const auto start = steady::now();
  for (std::size_t i = 0; i < 3; ++i) ahead.async_acquire(1, r.handler(i));
  for (std::size_t i = 3; i < 6; ++i) behind.async_acquire(1, r.handler(i));
  REQUIRE(run_until(io, [&] { return r.all_done(); }, std::chrono::seconds(5)));
  CHECK(r.succeeded() == 6);
  std::vector<steady::duration> at;
  for (const auto& result : r.results) at.push_back(result->at - start);
  std::sort(at.begin(), at.end());
  CHECK(at[1] < std::chrono::milliseconds(190));  // the burst of 2, before the first refill
  for (std::size_t k = 2; k < 6; ++k) {
    INFO("grant " << k);
    CHECK(at[k] >= std::chrono::milliseconds(200 * (k - 1) - 30));  // then no faster than the rate
  }
  CHECK(at[5] < std::chrono::milliseconds(2000));
}

TEST_CASE("an initiating function called with a named handler copies it") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  shared_token_bucket bucket(c, quota("named", 2, 5));
  int calls = 0;
  int failures = 0;
  const auto handler = [&](rein::error_code ec) {
    ++calls;
    if (ec) ++failures;
  };
  bucket.async_acquire(1, handler);  // an lvalue, as Asio allows: each operation keeps its own copy
  bucket.async_acquire(2, handler);
  REQUIRE(run_until(io, [&] { return calls == 2; }));
  CHECK(failures == 0);
  CHECK(bucket.snapshot().acquired_total == 2);
}

TEST_CASE("a full bucket admits its capacity at once; the next caller waits for the refill") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  shared_token_bucket bucket(c, quota("burst", 2, 5));  // a token every 500 ms
  recorder r(6);
  const auto start = steady::now();
  for (std::size_t i = 0; i < 6; ++i) bucket.async_acquire(1, r.handler(i));
  REQUIRE(run_until(io, [&] { return r.completed() == 5; }));
  CHECK(r.succeeded() == 5);
  CHECK_FALSE(r.results[5].has_value());  // the sixth waits about 500 ms; we are at a few ms
  auto s = bucket.snapshot();
  CHECK(s.acquired_total == 5);
  CHECK(s.remote_allowed == 5);
  REQUIRE(run_until(io, [&] { return r.all_done(); }, std::chrono::seconds(5)));
  CHECK_FALSE(r.results[5]->ec);
  const auto waited = r.results[5]->at - start;
  CHECK(waited >= std::chrono::milliseconds(400));
  CHECK(waited < std::chrono::milliseconds(1500));
  s = bucket.snapshot();
  CHECK(s.acquired_total == 6);
  CHECK(s.remote_allowed == 6);
  CHECK(s.waiting == 0);
  CHECK(s.requests_in_flight == 0);
  CHECK(s.round_trips == s.remote_allowed + s.remote_denied);
  // The limiter saw the bucket empty in the fifth reply and waited for the refill before asking again:
  // one request per admission (a retry or two if its estimate falls a microsecond short of Redis's).
  CHECK(s.round_trips <= 8);
  CHECK(s.round_trip_total > std::chrono::nanoseconds(0));
  CHECK(s.round_trip_max >= s.round_trip_last);
  CHECK(s.wait_max >= std::chrono::milliseconds(400));
  CHECK(s.connected);
  CHECK_FALSE(s.degraded);
}

TEST_CASE("a denied caller waits out the retry-after Redis returned, then asks once more") {
  redis_server server;
  net::io_context io;
  const auto options = quota("retry_after", 2, 1);  // a token every 500 ms
  // Two limiters on separate connections, as two processes: the second cannot know what the first took.
  shared_token_bucket first(io, local(server.port()), options);
  shared_token_bucket second(io, local(server.port()), options);
  recorder r(2);
  first.async_acquire(1, r.handler(0));
  REQUIRE(run_until(io, [&] { return r.completed() == 1; }));
  const auto start = steady::now();
  second.async_acquire(1, r.handler(1));
  REQUIRE(run_until(io, [&] { return r.all_done(); }, std::chrono::seconds(5)));
  CHECK_FALSE(r.results[1]->ec);
  CHECK(r.results[1]->at - start >= std::chrono::milliseconds(400));
  const auto s = second.snapshot();
  CHECK(s.remote_denied == 1);
  CHECK(s.retry_after_last > std::chrono::microseconds(400'000));
  CHECK(s.retry_after_last <= std::chrono::microseconds(500'000));
  CHECK(s.remote_allowed == 1);
  CHECK(s.round_trips <= 3);  // denied, then (after the wait) allowed; not a poll loop
}

TEST_CASE("waiters are served in arrival order, at the bucket's rate, without polling Redis") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  shared_token_bucket bucket(c, quota("fifo", 20, 1));  // one token every 50 ms
  recorder r(8);
  const auto start = steady::now();
  for (std::size_t i = 0; i < 8; ++i) bucket.async_acquire(1, r.handler(i));
  REQUIRE(run_until(io, [&] { return r.all_done(); }, std::chrono::seconds(10)));
  CHECK(r.succeeded() == 8);
  CHECK(r.order == std::vector<std::size_t>{0, 1, 2, 3, 4, 5, 6, 7});
  // Seven refills of 50 ms at least: the bucket never gives more than capacity + rate * t.
  CHECK(r.results[7]->at - start >= std::chrono::milliseconds(350));
  const auto s = bucket.snapshot();
  CHECK(s.remote_allowed == 8);
  // Waiting is local, on the retry-after: about one request per admission, not a stream of polls.
  CHECK(s.round_trips <= 3 * 8);
}

TEST_CASE("a large request at the head is not overtaken by a later small one") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  shared_token_bucket bucket(c, quota("head", 10, 4));
  recorder r(3);
  bucket.async_acquire(4, r.handler(0));  // empties the bucket
  REQUIRE(run_until(io, [&] { return r.completed() == 1; }));
  bucket.async_acquire(3, r.handler(1));  // needs 300 ms
  bucket.async_acquire(1, r.handler(2));  // would fit after 100 ms, but waits behind
  REQUIRE(run_until(io, [&] { return r.all_done(); }, std::chrono::seconds(5)));
  CHECK(r.order == std::vector<std::size_t>{0, 1, 2});
  CHECK(r.succeeded() == 3);
}

TEST_CASE("requests of 0 and above the capacity are answered at once, without Redis") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  shared_token_bucket bucket(c, quota("edges", 10, 3));
  recorder r(2);
  bucket.async_acquire(0, r.handler(0));
  bucket.async_acquire(4, r.handler(1));
  REQUIRE(run_until(io, [&] { return r.all_done(); }));
  CHECK_FALSE(r.results[0]->ec);
  CHECK(r.results[1]->ec == rein::errc::exceeds_capacity);
  CHECK(bucket.snapshot().round_trips == 0);
  CHECK(c.snapshot().requests == 0);
}

TEST_CASE("a deadline ends the wait with timed_out and takes nothing") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  auto options = quota("deadline", 1, 1);
  shared_token_bucket bucket(c, options);
  recorder r(3);
  bucket.async_acquire(1, r.handler(0));
  REQUIRE(run_until(io, [&] { return r.completed() == 1; }));
  const auto start = steady::now();
  bucket.async_acquire_for(1, std::chrono::milliseconds(100), r.handler(1));
  bucket.async_acquire_until(1, steady::now() - std::chrono::milliseconds(1), r.handler(2));  // already past
  REQUIRE(run_until(io, [&] { return r.all_done(); }));
  CHECK(r.results[2]->ec == rein::errc::timed_out);
  CHECK(r.order[1] == 2);  // at once
  CHECK(r.results[1]->ec == rein::errc::timed_out);
  const auto waited = r.results[1]->at - start;
  CHECK(waited >= std::chrono::milliseconds(100));
  CHECK(waited < std::chrono::milliseconds(600));
  const auto s = bucket.snapshot();
  CHECK(s.timed_out_total == 2);
  CHECK(s.rejected_total == 2);
  CHECK(s.acquired_total == 1);
  CHECK(s.remote_allowed == 1);
  CHECK(s.refunds == 0);
}

TEST_CASE("a cancelled waiter completes with operation_aborted and the line moves on") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  shared_token_bucket bucket(c, quota("cancel", 1, 1));
  recorder r(2);
  bucket.async_acquire(1, r.handler(0));
  REQUIRE(run_until(io, [&] { return r.completed() == 1; }));
  net::cancellation_signal signal;
  bucket.async_acquire(1, net::bind_cancellation_slot(signal.slot(), r.handler(1)));
  run_for(io, std::chrono::milliseconds(50));
  CHECK_FALSE(r.results[1].has_value());
  signal.emit(net::cancellation_type::terminal);
  REQUIRE(run_until(io, [&] { return r.all_done(); }));
  CHECK(r.results[1]->ec == net::error::operation_aborted);
  const auto s = bucket.snapshot();
  CHECK(s.cancelled_total == 1);
  CHECK(s.waiting == 0);
  CHECK(s.remote_allowed == 1);
}

TEST_CASE("cancelled or timed out while its request is on the wire: no hang, and the tokens are refunded") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  auto options = quota("wire", 10, 5);
  shared_token_bucket bucket(c, options);
  recorder warm(1);
  bucket.async_acquire(1, warm.handler(0));  // connects and loads the script
  REQUIRE(run_until(io, [&] { return warm.all_done(); }));
  CHECK(execute(io, c, {"EVAL", "return redis.call('DEL', KEYS[1])", "1", options.key}).integer == 1);

  server.pause();  // requests go out, replies wait
  recorder r(2);
  net::cancellation_signal signal;
  bucket.async_acquire(2, net::bind_cancellation_slot(signal.slot(), r.handler(0)));
  const auto start = steady::now();
  bucket.async_acquire_for(3, std::chrono::milliseconds(100), r.handler(1));
  run_for(io, std::chrono::milliseconds(20));
  CHECK(bucket.snapshot().requests_in_flight == 2);
  signal.emit(net::cancellation_type::terminal);
  REQUIRE(run_until(io, [&] { return r.all_done(); }));
  CHECK(r.results[0]->ec == net::error::operation_aborted);
  CHECK(r.results[1]->ec == rein::errc::timed_out);
  CHECK(r.results[1]->at - start < std::chrono::milliseconds(400));  // the server is still paused

  server.resume();  // Redis grants both (5 tokens), nobody wants them: both are refunded
  REQUIRE(run_until(io, [&] { return bucket.snapshot().requests_in_flight == 0 && bucket.snapshot().refunds == 2; }));
  REQUIRE(run_until(io, [&] { return c.snapshot().pending == 0; }));
  CHECK(bucket.snapshot().remote_allowed == 3);
  // Full again: the refunds brought the debt back to zero, which deletes the key.
  CHECK(execute(io, c, {"EXISTS", options.key}).integer == 0);
}

TEST_CASE("max_waiters bounds the line; one more completes with queue_full") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  shared_token_bucket bucket(c, quota("bounded", 1, 1), {.max_waiters = 1});
  recorder r(3);
  bucket.async_acquire(1, r.handler(0));
  REQUIRE(run_until(io, [&] { return r.completed() == 1; }));
  bucket.async_acquire(1, r.handler(1));
  REQUIRE(run_until(io, [&] { return bucket.snapshot().waiting == 1 && bucket.snapshot().requests_in_flight == 0; }));
  bucket.async_acquire(1, r.handler(2));
  REQUIRE(run_until(io, [&] { return r.completed() == 2; }));
  CHECK(r.results[2]->ec == rein::errc::queue_full);
  CHECK_FALSE(r.results[1].has_value());
  const auto s = bucket.snapshot();
  CHECK(s.queue_full_total == 1);
  CHECK(s.rejected_total == 1);
  CHECK(s.waiting == 1);
  bucket.close();
  REQUIRE(run_until(io, [&] { return r.all_done(); }));
  CHECK(r.results[1]->ec == rein::errc::closed);
}

TEST_CASE("close() completes waiters with closed, and later acquires fail the same way") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  shared_token_bucket bucket(c, quota("close", 1, 1));
  recorder r(3);
  bucket.async_acquire(1, r.handler(0));
  bucket.async_acquire(1, r.handler(1));
  REQUIRE(run_until(io, [&] { return r.completed() == 1 && bucket.snapshot().requests_in_flight == 0; }));
  bucket.close();
  bucket.async_acquire(1, r.handler(2));
  REQUIRE(run_until(io, [&] { return r.all_done(); }));
  CHECK(r.results[1]->ec == rein::errc::closed);
  CHECK(r.results[2]->ec == rein::errc::closed);
  CHECK(c.connected());  // a shared connection stays open
}

TEST_CASE("destroying the limiter completes its waiters with operation_aborted") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  recorder r(2);
  {
    shared_token_bucket bucket(c, quota("destroy", 1, 1));
    bucket.async_acquire(1, r.handler(0));
    bucket.async_acquire(1, r.handler(1));
    REQUIRE(run_until(io, [&] { return r.completed() == 1 && bucket.snapshot().requests_in_flight == 0; }));
  }
  REQUIRE(run_until(io, [&] { return r.all_done(); }));
  CHECK(r.results[1]->ec == net::error::operation_aborted);
}

TEST_CASE("after SCRIPT FLUSH, the script is loaded again and the admission retried") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  shared_token_bucket bucket(c, quota("noscript", 100, 10));
  recorder r(2);
  bucket.async_acquire(1, r.handler(0));
  REQUIRE(run_until(io, [&] { return r.completed() == 1; }));
  CHECK(bucket.snapshot().script_loads == 0);  // loaded once when the connection started
  CHECK(execute(io, c, {"SCRIPT", "FLUSH"}).text == "OK");
  bucket.async_acquire(1, r.handler(1));
  REQUIRE(run_until(io, [&] { return r.all_done(); }));
  CHECK_FALSE(r.results[1]->ec);
  const auto s = bucket.snapshot();
  CHECK(s.script_loads == 1);
  CHECK(s.remote_allowed == 2);
  CHECK(s.server_errors == 0);
}

TEST_CASE("a key of the wrong type is a server error, not a hang") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  auto options = quota("wrongtype", 10, 10);
  execute(io, c, {"SET", options.key, "not a hash"});
  shared_token_bucket bucket(c, options);
  recorder r(1);
  bucket.async_acquire(1, r.handler(0));
  REQUIRE(run_until(io, [&] { return r.all_done(); }));
  CHECK(r.results[0]->ec == rein::redis::errc::server_error);
  CHECK(bucket.snapshot().server_errors == 1);
}

TEST_CASE("two quotas on one connection are independent; two limiters on one key share it") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  const auto a = quota("a", 1, 3);
  const auto b = quota("b", 1, 2);
  shared_token_bucket on_a(c, a);
  shared_token_bucket on_b(c, b);
  shared_token_bucket also_a(io, local(server.port()), a);  // its own connection, same key
  recorder r(10);
  for (std::size_t i = 0; i < 4; ++i) on_a.async_acquire(1, r.handler(i));
  for (std::size_t i = 4; i < 7; ++i) on_b.async_acquire(1, r.handler(i));
  for (std::size_t i = 7; i < 10; ++i) also_a.async_acquire(1, r.handler(i));
  run_for(io, std::chrono::milliseconds(300));  // a token every second: nothing refills meanwhile
  std::size_t granted_a = 0;
  std::size_t granted_b = 0;
  for (std::size_t i = 0; i < 10; ++i) {
    if (r.results[i] && !r.results[i]->ec) (i >= 4 && i < 7 ? granted_b : granted_a) += 1;
  }
  CHECK(granted_a == 3);  // one bucket of 3 for both limiters on key a
  CHECK(granted_b == 2);
  CHECK(on_a.snapshot().acquired_total + also_a.snapshot().acquired_total == 3);
}

TEST_CASE("many coroutines on two threads: every admission is counted once") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  shared_token_bucket bucket(c, quota("threads", 1e6, 1'000'000));
  std::atomic<int> done{0};
  constexpr int coroutines = 16;
  constexpr int each = 50;
  for (int i = 0; i < coroutines; ++i) {
    net::co_spawn(io, [&]() -> net::awaitable<void> {
      for (int k = 0; k < each; ++k) co_await bucket.acquire();
      if (done.fetch_add(1) + 1 == coroutines) c.close();  // the pending read is what keeps run() going
    }, net::detached);
  }
  std::thread other([&] { io.run(); });
  io.run();
  other.join();
  CHECK(done.load() == coroutines);
  const auto s = bucket.snapshot();
  CHECK(s.acquired_total == coroutines * each);
  CHECK(s.remote_allowed == coroutines * each);
  CHECK(s.waiting == 0);
}

TEST_CASE("it is used like any rein rate limiter: co_await acquire(n), throwing rein errors") {
  redis_server server;
  net::io_context io;
  shared_token_bucket bucket(io, local(server.port()), quota("generic", 10, 3));
  int started = 0;
  std::optional<rein::error_code> thrown;
  net::co_spawn(io, [&]() -> net::awaitable<void> {
    co_await start_call(bucket, 2, started);
    try {
      co_await bucket.acquire_for(2, std::chrono::milliseconds(1));
    } catch (const rein::system_error& e) {
      thrown = e.code();
    }
    co_await start_call(bucket, 1, started);
  }, net::detached);
  REQUIRE(run_until(io, [&] { return started == 2; }));
  REQUIRE(thrown.has_value());
  CHECK(*thrown == rein::errc::timed_out);
}

TEST_CASE("inside rein::throttle as its rate stage: the fleet's quota, then the concurrency stages") {
  redis_server server;
  net::io_context io;
  shared_token_bucket rate(io, local(server.port()), quota("throttle", 2, 3));  // burst 3, then 2 per second
  rein::semaphore global(io, 10);
  rein::keyed<rein::semaphore> per_key(io.get_executor(), std::size_t{10});
  rein::throttle t(per_key, global, rate);
  CHECK_FALSE(rate.try_acquire());  // no synchronous answer: the throttle waits through async_acquire_until
  CHECK(t.try_acquire("host").rejected_at() == rein::throttle_stage::rate);

  std::vector<steady::time_point> admitted;
  const auto start = steady::now();
  for (int i = 0; i < 5; ++i) {
    net::co_spawn(io, [&]() -> net::awaitable<void> {
      auto guard = co_await t.acquire("host");
      admitted.push_back(steady::now());
      guard.complete(rein::outcome::ignored);
    }, net::detached);
  }
  REQUIRE(run_until(io, [&] { return admitted.size() == 5; }, std::chrono::seconds(5)));
  std::sort(admitted.begin(), admitted.end());
  CHECK(admitted[2] - start < std::chrono::milliseconds(300));   // the burst
  CHECK(admitted[4] - start >= std::chrono::milliseconds(800));  // then 500 ms a token
  CHECK(rate.snapshot().remote_allowed == 5);
  CHECK(global.snapshot().in_flight == 0);

  // A caller that gives up while waiting for the rate stage loses nothing there.
  std::optional<rein::error_code> timed_out;
  net::co_spawn(io, [&]() -> net::awaitable<void> {
    try {
      co_await t.acquire_for("host", std::chrono::milliseconds(50));
    } catch (const rein::system_error& e) {
      timed_out = e.code();
    }
  }, net::detached);
  REQUIRE(run_until(io, [&] { return timed_out.has_value(); }));
  CHECK(*timed_out == rein::errc::timed_out);
  rate.close();
}

TEST_CASE("fail_closed without a server: acquires complete with unavailable, nothing admitted") {
  net::io_context io;
  auto options = quota("closed", 100, 10);
  shared_token_bucket bucket(io, local(free_port()), options);
  recorder r(3);
  for (std::size_t i = 0; i < 3; ++i) bucket.async_acquire(1, r.handler(i));
  REQUIRE(run_until(io, [&] { return r.all_done(); }, std::chrono::seconds(5)));
  for (const auto& result : r.results) CHECK(result->ec == rein::redis::errc::unavailable);
  const auto s = bucket.snapshot();
  CHECK(s.acquired_total == 0);
  CHECK(s.unavailable_total == 3);
  CHECK(s.degraded);
}

TEST_CASE("fail_open without a server: the local bucket admits its share of the quota") {
  net::io_context io;
  auto options = quota("open", 2, 10);
  options.on_failure = rein::redis::failure_policy::fail_open;
  options.fail_open_share = 0.5;  // locally 1 per second, burst 5
  shared_token_bucket bucket(io, local(free_port()), options);
  recorder r(6);
  const auto start = steady::now();
  for (std::size_t i = 0; i < 6; ++i) bucket.async_acquire(1, r.handler(i));
  REQUIRE(run_until(io, [&] { return r.completed() == 5; }, std::chrono::seconds(5)));
  CHECK(r.succeeded() == 5);
  CHECK_FALSE(r.results[5].has_value());  // the sixth waits for the local refill (1 s)
  REQUIRE(run_until(io, [&] { return r.all_done(); }, std::chrono::seconds(5)));
  CHECK_FALSE(r.results[5]->ec);
  CHECK(r.results[5]->at - start >= std::chrono::milliseconds(900));
  CHECK(r.order == std::vector<std::size_t>{0, 1, 2, 3, 4, 5});
  const auto s = bucket.snapshot();
  CHECK(s.local_admitted == 6);
  CHECK(s.remote_allowed == 0);
  CHECK(s.degraded);
}

TEST_CASE("set_rate changes the rate for every process sharing the key") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c1(io, local(server.port()));
  rein::redis::connection c2(io, local(server.port()));
  const auto options = quota("set-rate", 1, 1);  // 1 per second, burst 1, in each process's options
  shared_token_bucket a(c1, options);
  shared_token_bucket b(c2, options);
  REQUIRE(a.set_rate(100, 10));
  execute(io, c1, {"PING"});  // after the HSET on the same connection: Redis has it
  recorder r(10);
  const auto start = steady::now();
  for (std::size_t i = 0; i < 10; ++i) b.async_acquire(1, r.handler(i));
  REQUIRE(run_until(io, [&] { return r.all_done(); }, std::chrono::seconds(5)));
  CHECK(r.succeeded() == 10);
  CHECK(steady::now() - start < std::chrono::milliseconds(500));  // the fleet's burst of 10, not 1 per second
  CHECK_THROWS_WITH(a.set_rate(0, 10), "rein::redis::shared_token_bucket: rate must be > 0, finite and at most 1e9 tokens per second, got 0");
}
