// rein::redis::shared_semaphore against a real redis-server, in one process: two semaphore objects on two
// connections stand for two processes (each has its own lease). Real time with margins.
#include "redis/semaphore_support.hpp"

#include <rein/error.hpp>
#include <rein/permit.hpp>
#include <rein/keyed.hpp>
#include <rein/observer.hpp>
#include <rein/redis/shared_semaphore.hpp>
#include <rein/semaphore.hpp>
#include <rein/throttle.hpp>

#include <algorithm>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

using namespace rein_test;
using rein::redis::shared_semaphore;
using rein::redis::shared_semaphore_options;


TEST_CASE("two semaphores on one key hold at most the limit together; a release lets the other in") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c1(io, local(server.port()));
  rein::redis::connection c2(io, local(server.port()));
  const shared_semaphore_options options{.key = unique_key("sem"), .limit = 3};
  shared_semaphore a(c1, options);
  shared_semaphore b(c2, options);
  taken t[4];
  a.async_acquire(2, into(t[0]));
  b.async_acquire(1, into(t[1]));
  REQUIRE(run_until(io, [&] { return t[0].ec && t[1].ec; }));
  REQUIRE(*t[0].ec == rein::error_code{});
  REQUIRE(*t[1].ec == rein::error_code{});
  CHECK(t[0].permit.count() == 2);
  CHECK(execute(io, c1, {"GET", total_key(options)}).text == "3");
  // Full: b waits its turn, and a's deadline passes.
  b.async_acquire(1, into(t[2]));
  a.async_acquire_for(1, std::chrono::milliseconds(200), into(t[3]));
  REQUIRE(run_until(io, [&] { return t[3].ec.has_value(); }));
  CHECK(*t[3].ec == rein::errc::timed_out);
  CHECK_FALSE(t[2].ec);
  const auto released = steady::now();
  t[0].permit.release();  // two come back from a: b's waiter sees them at its next poll (10 ms)
  REQUIRE(run_until(io, [&] { return t[2].ec.has_value(); }));
  CHECK(*t[2].ec == rein::error_code{});
  CHECK(t[2].at - released < std::chrono::milliseconds(500));
  CHECK(execute(io, c1, {"GET", total_key(options)}).text == "2");
  t[1].permit.release();
  t[2].permit.release();
  CHECK(execute(io, c2, {"GET", total_key(options)}).text == "0");
  const auto s = b.snapshot();
  CHECK(s.remote_allowed == 2);
  CHECK(s.remote_denied >= 1);
  CHECK(s.lease == 1);
  CHECK(s.leases_lost == 0);
  CHECK(s.held == 0);
}

TEST_CASE("a held permit's lease is renewed; one whose holder goes silent comes back within a lease") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c1(io, local(server.port()));
  rein::redis::connection c2(io, local(server.port()));
  const shared_semaphore_options options{.key = unique_key("lease"), .limit = 2, .lease = std::chrono::milliseconds(300)};
  auto a = std::make_unique<shared_semaphore>(c1, options);
  shared_semaphore b(c2, options);
  taken held, other, late;
  a->async_acquire(2, into(held));
  REQUIRE(run_until(io, [&] { return held.ec.has_value(); }));
  REQUIRE(*held.ec == rein::error_code{});
  // Three leases long: the renewals (every 100 ms) keep a's permits counted, so b gets nothing.
  b.async_acquire_for(1, std::chrono::milliseconds(900), into(other));
  REQUIRE(run_until(io, [&] { return other.ec.has_value(); }));
  CHECK(*other.ec == rein::errc::timed_out);
  CHECK(a->snapshot().renewals >= 6);
  // a goes silent with its permits (as a process that hangs or crashes): they come back one lease after
  // its last renewal, at most 300 ms (plus b's poll) after now.
  a.reset();
  const auto silent = steady::now();
  b.async_acquire(2, into(late));
  REQUIRE(run_until(io, [&] { return late.ec.has_value(); }));
  CHECK(*late.ec == rein::error_code{});
  INFO("came back after " << std::chrono::duration_cast<std::chrono::milliseconds>(late.at - silent).count() << " ms");
  CHECK(late.at - silent < std::chrono::milliseconds(300 + 200));
  // The silent holder's permits given back now: its lease is gone, so nothing is counted twice.
  held.permit.release();
  run_for(io, std::chrono::milliseconds(50));
  CHECK(execute(io, c2, {"GET", total_key(options)}).text == "2");
  late.permit.release();
  CHECK(execute(io, c2, {"GET", total_key(options)}).text == "0");
}

TEST_CASE("a lease lost while the process was silent starts a new one; the old permits no longer count") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  const shared_semaphore_options options{.key = unique_key("lost"), .limit = 2, .lease = std::chrono::milliseconds(100)};
  shared_semaphore sem(c, options);
  taken first, second;
  sem.async_acquire(1, into(first));
  REQUIRE(run_until(io, [&] { return first.ec.has_value(); }));
  REQUIRE(*first.ec == rein::error_code{});
  // Redis forgets the lease as if the process had been stopped for longer than it: the next renewal is
  // answered "lost".
  execute(io, c, {"DEL", "rein:{" + options.key + "}:sem:leases", "rein:{" + options.key + "}:sem:holders"});
  REQUIRE(run_until(io, [&] { return sem.snapshot().leases_lost == 1; }, std::chrono::seconds(2)));
  CHECK(sem.snapshot().lease == 2);
  sem.async_acquire(1, into(second));
  REQUIRE(run_until(io, [&] { return second.ec.has_value(); }));
  CHECK(*second.ec == rein::error_code{});
  first.permit.release();  // of lease 1: sends nothing
  second.permit.release();
  run_for(io, std::chrono::milliseconds(50));
  const auto s = sem.snapshot();
  CHECK(s.held == 0);
  CHECK(s.refunds == 1);
  CHECK(s.leases_lost == 1);
}

TEST_CASE("a release lost with its connection is corrected by the next renewal, not by the lease's end") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  rein::redis::connection watcher(io, local(server.port()));
  const shared_semaphore_options options{.key = unique_key("heal"), .limit = 2, .lease = std::chrono::milliseconds(600)};
  shared_semaphore sem(c, options);
  taken t;
  sem.async_acquire(2, into(t));
  REQUIRE(run_until(io, [&] { return t.ec.has_value(); }));
  REQUIRE(*t.ec == rein::error_code{});
  // The server drops the semaphore's connection, and the release goes out on it before the client notices:
  // Redis still counts 2.
  execute(io, watcher, {"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"});
  t.permit.release();
  CHECK(execute(io, watcher, {"GET", total_key(options)}).text == "2");
  // The connection comes back; the next renewal (every 200 ms) says this process holds nothing.
  const auto since = steady::now();
  REQUIRE(run_until(io, [&] { return execute(io, watcher, {"GET", total_key(options)}).text == "0"; },
                    std::chrono::seconds(2)));
  CHECK(steady::now() - since < std::chrono::milliseconds(500));
  CHECK(sem.snapshot().leases_lost == 0);  // the lease held throughout: the renewal corrected the count
}

TEST_CASE("inside rein::throttle as its global concurrency stage: the fleet's permits, per host first") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  const shared_semaphore_options options{.key = unique_key("throttle"), .limit = 2};
  shared_semaphore global(c, options);
  rein::keyed<rein::semaphore> per_host(io.get_executor(), std::size_t{4});
  rein::throttle t(per_host, global);
  CHECK(t.try_acquire("db").rejected_at() == rein::throttle_stage::global);  // Redis must be asked

  int in_flight = 0, most = 0, done = 0;
  for (int i = 0; i < 6; ++i) {
    net::co_spawn(io, [&]() -> net::awaitable<void> {
      auto guard = co_await t.acquire("db");
      most = std::max(most, ++in_flight);
      net::steady_timer call(io, std::chrono::milliseconds(30));
      co_await call.async_wait(net::use_awaitable);
      --in_flight;
      guard.complete(rein::outcome::success);
      ++done;
    }, net::detached);
  }
  REQUIRE(run_until(io, [&] { return done == 6; }, std::chrono::seconds(5)));
  CHECK(most == 2);
  CHECK(global.snapshot().acquired_total == 6);
  CHECK(global.snapshot().held == 0);
  CHECK(execute(io, c, {"GET", total_key(options)}).text == "0");
}

TEST_CASE("set_limit changes the limit for every process at its next request") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c1(io, local(server.port()));
  rein::redis::connection c2(io, local(server.port()));
  const shared_semaphore_options options{.key = unique_key("set-limit"), .limit = 1};
  shared_semaphore a(c1, options);
  shared_semaphore b(c2, options);
  REQUIRE(a.set_limit(3));
  execute(io, c1, {"PING"});  // after the SET on the same connection: Redis has it
  taken t[4];
  for (int i = 0; i < 3; ++i) b.async_acquire(1, into(t[i]));
  REQUIRE(run_until(io, [&] { return t[0].ec && t[1].ec && t[2].ec; }));
  for (int i = 0; i < 3; ++i) CHECK(*t[i].ec == rein::error_code{});
  CHECK(execute(io, c2, {"GET", total_key(options)}).text == "3");
  b.async_acquire_for(1, std::chrono::milliseconds(200), into(t[3]));
  REQUIRE(run_until(io, [&] { return t[3].ec.has_value(); }));
  CHECK(*t[3].ec == rein::errc::timed_out);
  // Lowered below what is held: the permits stay valid, nobody else gets one until the count is below it.
  REQUIRE(a.set_limit(2));
  execute(io, c1, {"PING"});
  taken after;
  a.async_acquire(1, into(after));
  t[0].permit.release();
  run_for(io, std::chrono::milliseconds(100));
  CHECK_FALSE(after.ec);  // 2 held, limit 2
  t[1].permit.release();
  REQUIRE(run_until(io, [&] { return after.ec.has_value(); }));
  CHECK(*after.ec == rein::error_code{});
  CHECK_THROWS_WITH(a.set_limit(0), "rein::redis::shared_semaphore: limit must be in [1, 2^31) permits, got 0");
}

TEST_CASE("a process with a short lease does not shorten the keys under another's longer lease") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  const auto key = unique_key("mixed-lease");
  shared_semaphore a(c, {.key = key, .limit = 2, .lease = std::chrono::seconds(3)});
  taken held, brief, late;
  a.async_acquire(2, into(held));
  REQUIRE(run_until(io, [&] { return held.ec.has_value(); }));
  REQUIRE(*held.ec == rein::error_code{});
  {
    shared_semaphore b(c, {.key = key, .limit = 2, .lease = std::chrono::milliseconds(60)});
    b.async_acquire_for(1, std::chrono::milliseconds(20), into(brief));
    REQUIRE(run_until(io, [&] { return brief.ec.has_value(); }));
    CHECK(*brief.ec == rein::errc::timed_out);
  }
  run_for(io, std::chrono::milliseconds(200));  // b's lease is long gone; a's (3 s) holds the keys
  shared_semaphore c2(c, {.key = key, .limit = 2, .lease = std::chrono::milliseconds(60)});
  c2.async_acquire_for(1, std::chrono::milliseconds(100), into(late));
  REQUIRE(run_until(io, [&] { return late.ec.has_value(); }));
  CHECK(*late.ec == rein::errc::timed_out);
  CHECK(a.snapshot().leases_lost == 0);
}

namespace {

// Redis's TIME, microseconds since the Unix epoch.
long long server_now_us(net::io_context& io, rein::redis::connection& c) {
  const auto r = execute(io, c, {"TIME"});
  REQUIRE(r.elements.size() == 2);
  return std::stoll(r.elements[0].text) * 1000000 + std::stoll(r.elements[1].text);
}

long long us_since_epoch(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

}  // namespace

TEST_CASE("a shared semaphore's snapshot: limit, held by this process, free as last seen, waiting; a named "
          "semaphore's observer hears its rejections; each permit carries the server's time of its grant") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c1(io, local(server.port()));
  rein::redis::connection c2(io, local(server.port()));
  std::vector<std::string> events;
  shared_semaphore_options options{.key = unique_key("vocabulary"), .limit = 3};
  shared_semaphore other(c2, options);
  rein::line_options line{.name = "db"};
  line.observer = [&events](const rein::limiter_event& e) {
    std::ostringstream text;
    text << e;
    events.push_back(text.str());
  };
  shared_semaphore mine(c1, options, std::move(line));
  taken t[4];
  const long long before = server_now_us(io, c1);
  mine.async_acquire(2, into(t[0]));
  REQUIRE(run_until(io, [&] { return t[0].ec.has_value(); }));
  REQUIRE(*t[0].ec == rein::error_code{});
  const long long after = server_now_us(io, c1);
  const long long granted = us_since_epoch(rein::redis::server_time(t[0].permit));
  CHECK(granted >= before);
  CHECK(granted <= after);
  CHECK(us_since_epoch(mine.snapshot().server_time_last) == granted);
  other.async_acquire(1, into(t[1]));
  REQUIRE(run_until(io, [&] { return t[1].ec.has_value(); }));
  REQUIRE(*t[1].ec == rein::error_code{});
  CHECK(rein::redis::server_time(t[1].permit) >= rein::redis::server_time(t[0].permit));
  // Full: one of mine waits (polling Redis), another is turned away at its deadline.
  mine.async_acquire(1, into(t[2]));
  mine.async_acquire_for(1, std::chrono::milliseconds(100), into(t[3]));
  REQUIRE(run_until(io, [&] { return t[3].ec.has_value(); }));
  CHECK(*t[3].ec == rein::errc::timed_out);
  auto s = mine.snapshot();
  CHECK(s.limit == 3);
  CHECK(s.in_flight == 2);
  CHECK(s.held == 2);
  CHECK(s.free == 0);  // as last seen: the other semaphore holds the third
  CHECK(s.waiting == 1);
  CHECK(s.acquired_total == 1);
  CHECK(s.timed_out_total == 1);
  CHECK(s.round_trip.count() == s.round_trips);
  CHECK(s.round_trip.count() >= 2);
  CHECK(events == std::vector<std::string>{"rejected reason=timed_out count=1 name=db"});
  t[1].permit.release();  // the other's permit frees: mine's waiter takes it at its next poll
  REQUIRE(run_until(io, [&] { return t[2].ec.has_value(); }));
  REQUIRE(*t[2].ec == rein::error_code{});
  s = mine.snapshot();
  CHECK(s.in_flight == 3);
  CHECK(s.held == 3);
  CHECK(s.free == 0);
  CHECK(s.waiting == 0);
  CHECK(s.requests_in_flight == 0);
  CHECK(other.snapshot().in_flight == 0);
}
