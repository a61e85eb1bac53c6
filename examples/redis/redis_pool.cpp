// One concurrency limit for a whole fleet: every process running this program against the same Redis shares
// 3 permits ("the database takes at most 3 of our queries at once"). Each of 4 workers holds a permit for
// 200 ms per query. Start it in two terminals and they take turns: together never more than 3 queries at
// once. Kill one with Ctrl-C while it holds permits and the other gets them back within the lease (2 s).
//
//   redis_pool [host [port]]      default 127.0.0.1 6379
#include "../usage.hpp"

#include <rein/redis/shared_semaphore.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#else
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#endif

#include <array>
#include <chrono>
#include <cstdio>
#include <string>
#include <string_view>

namespace net = rein::net;

constexpr const char* usage =
    "usage: redis_pool [host [port]]      default 127.0.0.1 6379\n"
    "  four workers run 5 queries each, 200 ms apiece, under 3 permits shared through Redis\n";

int main(int argc, char** argv) {
  if (rein_example::asked_for_help(argc, argv, usage)) return 0;
  rein::redis::connection_options redis;
  if (argc > 1) redis.host = argv[1];
  if (argc > 2) redis.port = static_cast<std::uint16_t>(std::stoi(argv[2]));

  net::io_context io;
  rein::redis::connection connection(io, redis);  // shared, so that the last releases can be waited for
  rein::redis::shared_semaphore pool(connection, {.key = "rein:example:pool", .limit = 3, .lease = std::chrono::seconds(2)});

  const auto start = std::chrono::steady_clock::now();
  const auto ms = [&] {
    return static_cast<long long>(
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count());
  };
  int running = 4;
  for (int worker = 0; worker < 4; ++worker) {
    net::co_spawn(io, [&, worker]() -> net::awaitable<void> {
      net::steady_timer query(io);
      for (int call = 0; call < 5; ++call) {
        rein::permit permit = co_await pool.acquire();  // counted in Redis for the whole fleet
        std::printf("%6lld ms  worker %d  query %d starts\n", ms(), worker, call);
        query.expires_after(std::chrono::milliseconds(200));
        co_await query.async_wait(net::use_awaitable);
      }  // the permit goes back here, at the end of each iteration
      if (--running == 0) {
        // The releases went out before this PING on the same connection: its reply means Redis has them.
        static constexpr std::array<std::string_view, 1> ping{"PING"};
        co_await connection.async_execute(ping, net::use_awaitable);
        pool.close();        // stops the lease renewals
        connection.close();  // and with nothing left to do, run() returns
      }
    }, net::detached);
  }
  io.run();

  const auto s = pool.snapshot();
  std::printf("granted %llu; %llu asks refused for now; %llu renewals of lease %llu; longest wait %.0f ms\n",
              static_cast<unsigned long long>(s.acquired_total), static_cast<unsigned long long>(s.remote_denied),
              static_cast<unsigned long long>(s.renewals), static_cast<unsigned long long>(s.lease),
              std::chrono::duration<double, std::milli>(s.wait_max).count());
}
