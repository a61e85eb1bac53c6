// One process of a fleet sharing a token bucket, a sliding window or a quota gate (tests/redis/
// quota_processes.cpp and shared_processes.cpp start several). From a common wall-clock start, for a given
// duration, coroutines acquire one at a time:
//
//   rein_redis_shared_worker bucket <port> <key> <start: unix us> <duration ms> <coroutines> <rate> <capacity>
//   rein_redis_shared_worker batched ...  (as bucket, taking tokens 8 at a time: batch = 8)
//   rein_redis_shared_worker window <port> <key> <start: unix us> <duration ms> <coroutines> <limit> <window ms>
//   rein_redis_shared_worker gate <port> <key> <start: unix us> <duration ms> <coroutines> <pause at ms> <pause ms>
//   rein_redis_shared_worker semaphore <port> <key> <start: unix us> <duration ms> <coroutines> <limit> <hold ms>
//   -> "admitted 251 errors 0", then for the gate one line per admission: "grant <called us> <granted us>",
//      for the semaphore one per permit: "held <granted us> <released us>"
//   rein_redis_shared_worker holder <port> <key> <limit> <lease ms> <permits>
//   -> takes <permits> permits of a shared semaphore, prints "holding", and keeps them until killed
//   rein_redis_shared_worker staller <port> <key> <limit> <lease ms> <acquire at: unix us>
//   -> connects, asks for one permit at the given time (the test stops it while the reply is on its way),
//      prints "granted <unix us> lease_held <0|1>" once it holds it, releases it, then prints
//      "stale_grants <n> leases_lost <n>"
//
// A bucket's admission counts when its reply came back before start + duration and its request left after
// start, so every counted admission was decided by Redis inside the duration. The window's workers acquire
// back to back (the last acquire may be granted after the duration); the
// gate's pause 5 ms between acquires, and worker with a
// pause at >= 0 ms calls pause_for(pause ms) that long after the start (as on a 429). Times are unix
// microseconds by this machine's clock, the one Redis reads.
#include "support/asio.hpp"

#include <rein/permit.hpp>
#include <rein/redis/connection.hpp>
#include <rein/redis/shared_quota_gate.hpp>
#include <rein/redis/shared_semaphore.hpp>
#include <rein/redis/shared_sliding_window.hpp>
#include <rein/redis/shared_token_bucket.hpp>

#include <sys/prctl.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace net = rein::net;
using std::chrono::system_clock;
using steady = std::chrono::steady_clock;

namespace {

long long unix_us(system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

}  // namespace

// Takes permits and keeps them until the process is killed (its lease then runs out on the server).
int hold_until_killed(char** argv) {
  net::io_context io;
  rein::redis::connection_options options;
  options.port = static_cast<std::uint16_t>(std::stoi(argv[2]));
  rein::redis::shared_semaphore sem(io, options,
                                    {.key = argv[3], .limit = std::stoll(argv[4]), .lease = std::chrono::milliseconds(std::stoll(argv[5]))});
  const auto permits = static_cast<std::size_t>(std::stoul(argv[6]));
  rein::permit held;
  net::co_spawn(io, [&]() -> net::awaitable<void> {
    held = co_await sem.acquire(permits);
    std::printf("holding\n");
    std::fflush(stdout);
  }, [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
  });
  io.run();  // the renewals keep it running until the test kills the process
  return 1;
}

// Asks for one permit at a given time, while the test has Redis stopped, and is itself stopped by the test
// before Redis answers: the grant waits in its socket longer than the lease. The request timeout is longer
// than the stall, so that the reply, not the connection's watchdog, is what it finds on waking.
int stall_with_grant_on_wire(char** argv) {
  net::io_context io;
  rein::redis::connection_options options;
  options.port = static_cast<std::uint16_t>(std::stoi(argv[2]));
  options.request_timeout = std::chrono::seconds(10);
  rein::redis::connection connection(io, options);
  rein::redis::shared_semaphore sem(connection, {.key = argv[3],
                                                 .limit = std::stoll(argv[4]),
                                                 .lease = std::chrono::milliseconds(std::stoll(argv[5]))});
  const system_clock::time_point at{std::chrono::microseconds(std::stoll(argv[6]))};
  net::co_spawn(io, [&]() -> net::awaitable<void> {
    static constexpr std::array<std::string_view, 1> ping{"PING"};
    co_await connection.async_execute(ping, net::use_awaitable);  // connected, script loaded
    net::steady_timer timer(io, at - system_clock::now());
    co_await timer.async_wait(net::use_awaitable);
    rein::permit permit = co_await sem.acquire(1);
    std::printf("granted %lld lease_held %d\n", unix_us(system_clock::now()), sem.lease_held() ? 1 : 0);
    permit.release();
    const auto s = sem.snapshot();
    sem.close();
    co_await connection.async_execute(ping, net::use_awaitable);  // the release reached Redis
    connection.close();
    std::printf("stale_grants %llu leases_lost %llu\n", static_cast<unsigned long long>(s.stale_grants),
                static_cast<unsigned long long>(s.leases_lost));
  }, [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
  });
  io.run();
  return 0;
}

int main(int argc, char** argv) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
  if (argc == 7 && std::string_view(argv[1]) == "holder") return hold_until_killed(argv);
  if (argc == 7 && std::string_view(argv[1]) == "staller") return stall_with_grant_on_wire(argv);
  if (argc != 9) {
    std::fprintf(stderr, "usage: %s bucket|window|gate|semaphore port key start_unix_us duration_ms coroutines a b\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  const auto port = static_cast<std::uint16_t>(std::stoi(argv[2]));
  const std::string key = argv[3];
  const system_clock::time_point start{std::chrono::microseconds(std::stoll(argv[4]))};
  const system_clock::time_point end = start + std::chrono::milliseconds(std::stoll(argv[5]));
  const int coroutines = std::stoi(argv[6]);
  const long long a = std::stoll(argv[7]);
  const long long b = std::stoll(argv[8]);

  net::io_context io;
  rein::redis::connection_options options;
  options.port = port;
  rein::redis::connection connection(io, options);
  std::unique_ptr<rein::redis::shared_token_bucket> bucket;
  std::unique_ptr<rein::redis::shared_sliding_window> window;
  std::unique_ptr<rein::redis::shared_quota_gate> gate;
  std::unique_ptr<rein::redis::shared_semaphore> sem;
  if (mode == "semaphore") {
    sem = std::make_unique<rein::redis::shared_semaphore>(connection, rein::redis::shared_semaphore_options{.key = key, .limit = a});
  } else if (mode == "bucket" || mode == "batched") {
    bucket = std::make_unique<rein::redis::shared_token_bucket>(
        connection, rein::redis::shared_token_bucket_options{
                        .key = key, .rate = static_cast<double>(a), .capacity = b, .batch = mode == "batched" ? 8 : 1});
  } else if (mode == "window") {
    window = std::make_unique<rein::redis::shared_sliding_window>(
        connection, rein::redis::shared_sliding_window_options{.key = key, .limit = a, .window = std::chrono::milliseconds(b)});
  } else {
    gate = std::make_unique<rein::redis::shared_quota_gate>(connection, rein::redis::shared_quota_gate_options{.key = key, .jitter = 0.2});
  }

  long admitted = 0;
  long errors = 0;
  std::vector<std::pair<long long, long long>> grants;
  std::vector<std::pair<long long, long long>> holds;
  int running = coroutines;
  // The semaphore's workers: the logged span of each permit lies inside the span the server counted it.
  const auto holder = [&]() -> net::awaitable<void> {
    net::steady_timer hold(io);
    while (system_clock::now() < end) {
      auto [ec, permit] = co_await sem->async_acquire(1, rein_test::as_tuple(net::use_awaitable));
      if (ec) {
        ++errors;
        break;
      }
      const long long granted = unix_us(system_clock::now());
      hold.expires_after(std::chrono::milliseconds(b));
      co_await hold.async_wait(net::use_awaitable);
      holds.emplace_back(granted, unix_us(system_clock::now()));
      permit.release();
      ++admitted;
    }
    if (--running == 0) {
      sem->close();
      // The releases left before this PING on the same connection: its reply means Redis has them all.
      static constexpr std::array<std::string_view, 1> ping{"PING"};
      co_await connection.async_execute(ping, net::use_awaitable);
      connection.close();
    }
  };
  const auto worker = [&]() -> net::awaitable<void> {
    const steady::time_point deadline = steady::now() + (end - system_clock::now());
    net::steady_timer think(io);
    while (system_clock::now() < end) {
      const auto called = system_clock::now();
      // The window's acquires have no deadline, so none is refunded after a late grant: every stamp in the
      // log is an admission some process counted. (One co_await per statement: GCC 12 miscompiles co_await
      // inside a conditional expression.)
      rein::error_code ec;
      if (bucket) {
        std::tie(ec) = co_await bucket->async_acquire_until(1, deadline, rein_test::as_tuple(net::use_awaitable));
      } else if (window) {
        std::tie(ec) = co_await window->async_acquire(1, rein_test::as_tuple(net::use_awaitable));
      } else {
        std::tie(ec) = co_await gate->async_acquire_until(1, deadline, rein_test::as_tuple(net::use_awaitable));
      }
      const bool counted = !ec && !(bucket && system_clock::now() >= end);  // a bucket's: decided before the end
      if (counted) {
        ++admitted;
        if (gate) grants.emplace_back(unix_us(called), unix_us(system_clock::now()));
      } else if (ec && ec != rein::errc::timed_out) {
        ++errors;
      }
      if (gate) {
        think.expires_after(std::chrono::milliseconds(5));
        co_await think.async_wait(net::use_awaitable);
      }
    }
    if (--running == 0) connection.close();
  };
  net::co_spawn(io, [&]() -> net::awaitable<void> {
    // Connect (and load the script) before the window opens, then start together with the others.
    static constexpr std::array<std::string_view, 1> ping{"PING"};
    co_await connection.async_execute(ping, net::use_awaitable);
    net::steady_timer timer(io, start - system_clock::now());
    co_await timer.async_wait(net::use_awaitable);
    for (int i = 0; i < coroutines; ++i) {
      if (sem) net::co_spawn(io, holder, net::detached);
      else net::co_spawn(io, worker, net::detached);
    }
    if (gate && a >= 0) {
      timer.expires_after(std::chrono::milliseconds(a));
      co_await timer.async_wait(net::use_awaitable);
      gate->pause_for(std::chrono::milliseconds(b));
    }
  }, [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
  });
  io.run();
  std::printf("admitted %ld errors %ld\n", admitted, errors);
  for (const auto& [called, granted] : grants) std::printf("grant %lld %lld\n", called, granted);
  for (const auto& [granted, released] : holds) std::printf("held %lld %lld\n", granted, released);
  return 0;
}
