// rein::redis::shared_sliding_window against a real redis-server, in one process.
#include "support.hpp"

#include <rein/error.hpp>
#include <rein/redis/shared_sliding_window.hpp>

#include <string>
#include <vector>

using namespace rein_test;
using rein::redis::shared_sliding_window;
using rein::redis::shared_sliding_window_options;

namespace {

shared_sliding_window_options per(const std::string& name, std::int64_t limit, std::chrono::milliseconds window) {
  return {.key = unique_key(name), .limit = limit, .window = window};
}

}  // namespace

TEST_CASE("the window admits its limit at once, then the next when the oldest admission leaves") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  const auto options = per("window", 3, std::chrono::milliseconds(400));
  shared_sliding_window window(c, options);
  recorder r(5);
  const auto start = steady::now();
  for (std::size_t i = 0; i < 5; ++i) window.async_acquire(1, r.handler(i));
  REQUIRE(run_until(io, [&] { return r.completed() == 3; }));
  CHECK(execute(io, c, {"ZCARD", "rein:{" + options.key + "}:window"}).integer == 3);
  CHECK(execute(io, c, {"GET", "rein:{" + options.key + "}:window:seq"}).text == "3");
  REQUIRE(run_until(io, [&] { return r.all_done(); }));
  CHECK(r.succeeded() == 5);
  CHECK(r.order == std::vector<std::size_t>{0, 1, 2, 3, 4});  // FIFO
  // The fourth and fifth were admitted when the first and second left: 400 ms after them at the earliest.
  CHECK(r.results[3]->at - r.results[0]->at >= std::chrono::milliseconds(399));
  CHECK(r.results[4]->at - r.results[1]->at >= std::chrono::milliseconds(399));
  CHECK(r.results[4]->at - start < std::chrono::seconds(2));
  const auto s = window.snapshot();
  CHECK(s.remote_allowed == 5);
  CHECK(s.remote_denied >= 1);
  CHECK(s.acquired_total == 5);
}

TEST_CASE("a deadline before the oldest admission leaves fails at once; a refund frees a place") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  shared_sliding_window window(c, per("refund", 1, std::chrono::seconds(30)));
  recorder r(3);
  window.async_acquire(1, r.handler(0));
  REQUIRE(run_until(io, [&] { return r.completed() == 1; }));
  const auto asked = steady::now();
  window.async_acquire_for(1, std::chrono::seconds(10), r.handler(1));  // the place frees in 30 s
  REQUIRE(run_until(io, [&] { return r.completed() == 2; }));
  CHECK(r.results[1]->ec == rein::errc::timed_out);
  CHECK(r.results[1]->at - asked < std::chrono::seconds(10));  // at once, not at the deadline
  window.refund(1);
  window.async_acquire_for(1, std::chrono::seconds(10), r.handler(2));
  REQUIRE(run_until(io, [&] { return r.all_done(); }));
  CHECK_FALSE(r.results[2]->ec);
  CHECK(window.snapshot().refunds == 1);
}

TEST_CASE("after SCRIPT FLUSH, the window's script is loaded again and the admission retried") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  shared_sliding_window window(c, per("noscript", 10, std::chrono::seconds(1)));
  recorder r(2);
  window.async_acquire(1, r.handler(0));
  REQUIRE(run_until(io, [&] { return r.completed() == 1; }));
  CHECK(execute(io, c, {"SCRIPT", "FLUSH"}).text == "OK");
  window.async_acquire(2, r.handler(1));
  REQUIRE(run_until(io, [&] { return r.all_done(); }));
  CHECK_FALSE(r.results[1]->ec);
  const auto s = window.snapshot();
  CHECK(s.script_loads == 1);
  CHECK(s.remote_allowed == 2);
  CHECK(s.free == 7);
}

TEST_CASE("fail_closed: a window whose Redis is gone completes acquires with unavailable") {
  net::io_context io;
  auto options = per("gone", 10, std::chrono::seconds(1));
  rein::redis::connection_options redis = local(1);  // nothing listens on port 1
  shared_sliding_window window(io, redis, options);
  recorder r(1);
  window.async_acquire(1, r.handler(0));
  REQUIRE(run_until(io, [&] { return r.all_done(); }));
  CHECK(r.results[0]->ec == rein::redis::errc::unavailable);
  window.close();
}

TEST_CASE("set_limit changes the window's limit for every process at its next request") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c1(io, local(server.port()));
  rein::redis::connection c2(io, local(server.port()));
  const auto options = per("set_limit", 5, std::chrono::seconds(60));
  shared_sliding_window a(c1, options);
  shared_sliding_window b(c2, options);  // another process: it only learns the limit from Redis
  REQUIRE(a.set_limit(2));
  CHECK(execute(io, c1, {"GET", "rein:{" + options.key + "}:window:limit"}).text == "2");  // after the SET
  recorder r(6);
  b.async_acquire(1, r.handler(0));
  b.async_acquire(1, r.handler(1));
  b.async_acquire_for(1, std::chrono::milliseconds(200), r.handler(2));  // the window holds 2 now, not 5
  REQUIRE(run_until(io, [&] { return r.completed() == 3; }));
  CHECK_FALSE(r.results[0]->ec);
  CHECK_FALSE(r.results[1]->ec);
  CHECK(r.results[2]->ec == rein::errc::timed_out);
  // More than the stored limit could only wait forever: an error, at once; the process's own limit holds
  // too. (Asked of `a`: b holds its line until the place it was denied frees, as every window does.)
  a.async_acquire(3, r.handler(3));
  a.async_acquire(6, r.handler(4));
  REQUIRE(run_until(io, [&] { return r.completed() == 5; }));
  CHECK(r.results[3]->ec == rein::redis::errc::server_error);
  CHECK(r.results[4]->ec == rein::errc::exceeds_capacity);
  // Raised again: three more fit beside the two in the window.
  REQUIRE(a.set_limit(5));
  CHECK(execute(io, c1, {"GET", "rein:{" + options.key + "}:window:limit"}).text == "5");
  a.async_acquire(3, r.handler(5));
  REQUIRE(run_until(io, [&] { return r.all_done(); }));
  CHECK_FALSE(r.results[5]->ec);
  CHECK(execute(io, c2, {"ZCARD", "rein:{" + options.key + "}:window"}).integer == 5);
  CHECK_THROWS_WITH(a.set_limit(0), "rein::redis::shared_sliding_window: limit must be in [1, 2^27] admissions, got 0");
  CHECK_THROWS_WITH(a.set_limit((std::int64_t{1} << 27) + 1),
                    "rein::redis::shared_sliding_window: limit must be in [1, 2^27] admissions, got 134217729");
}
