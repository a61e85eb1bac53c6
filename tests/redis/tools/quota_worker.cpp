// One process of a fleet sharing a quota (tests/redis/quota_processes.cpp starts several). From a common
// wall-clock start, for a given duration, it runs coroutines that take one token at a time from the shared
// bucket, then prints how many admissions it got inside the window:
//
//   rein_redis_quota_worker <port> <key> <rate> <capacity> <start: unix microseconds> <duration ms> <coroutines>
//   -> "admitted 251 errors 0"
//
// An admission counts when its reply came back before start + duration (by the same machine's clock that
// Redis reads), and its request left after start: so every counted admission was decided by Redis inside
// the window.
#include "support/asio.hpp"

#include <rein/redis/connection.hpp>
#include <rein/redis/shared_token_bucket.hpp>

#include <sys/prctl.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

namespace net = rein::net;
using std::chrono::system_clock;
using steady = std::chrono::steady_clock;

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: %s port key rate capacity start_unix_us duration_ms coroutines\n", argv[0]);
    return 2;
  }
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
  const auto port = static_cast<std::uint16_t>(std::stoi(argv[1]));
  const std::string key = argv[2];
  const double rate = std::stod(argv[3]);
  const std::int64_t capacity = std::stoll(argv[4]);
  const system_clock::time_point start{std::chrono::microseconds(std::stoll(argv[5]))};
  const system_clock::time_point end = start + std::chrono::milliseconds(std::stoll(argv[6]));
  const int coroutines = std::stoi(argv[7]);

  net::io_context io;
  rein::redis::connection_options options;
  options.port = port;
  rein::redis::connection connection(io, options);
  rein::redis::shared_token_bucket bucket(connection, {.key = key, .rate = rate, .capacity = capacity});

  long admitted = 0;
  long errors = 0;
  int running = coroutines;
  const auto worker = [&]() -> net::awaitable<void> {
    const steady::time_point deadline = steady::now() + (end - system_clock::now());
    while (system_clock::now() < end) {
      auto [ec] = co_await bucket.async_acquire_until(1, deadline, rein_test::as_tuple(net::use_awaitable));
      if (!ec && system_clock::now() < end) ++admitted;
      else if (ec && ec != rein::errc::timed_out) ++errors;
    }
    if (--running == 0) connection.close();
  };
  net::co_spawn(io, [&]() -> net::awaitable<void> {
    // Connect (and load the script) before the window opens, then start together with the others.
    // (A braced list inside co_await trips GCC 12: "array used as initializer".)
    static constexpr std::array<std::string_view, 1> ping{"PING"};
    co_await connection.async_execute(ping, net::use_awaitable);
    net::steady_timer timer(io, start - system_clock::now());
    co_await timer.async_wait(net::use_awaitable);
    for (int i = 0; i < coroutines; ++i) net::co_spawn(io, worker, net::detached);
  }, [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
  });
  io.run();
  std::printf("admitted %ld errors %ld\n", admitted, errors);
  return 0;
}
