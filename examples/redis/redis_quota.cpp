// One quota for a whole fleet: every process running this program against the same Redis shares one token
// bucket of 5 calls per second (burst 5). Start it in two terminals and the calls split between them; the
// sum stays at 5 per second. Stop Redis and each process carries on alone at half the quota (fail_open
// with a share of 1/2, for a fleet of two); start it again and they share Redis's bucket once more.
//
//   redis_quota [host [port]]      default 127.0.0.1 6379
#include "../usage.hpp"

#include <rein/redis/shared_token_bucket.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#else
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#endif

#include <chrono>
#include <cstdio>
#include <string>

namespace net = rein::net;

constexpr const char* usage =
    "usage: redis_quota [host [port]]      default 127.0.0.1 6379\n"
    "  three workers take 10 tokens each from a bucket of 5 per second shared through Redis\n";

int main(int argc, char** argv) {
  if (rein_example::asked_for_help(argc, argv, usage)) return 0;
  rein::redis::connection_options redis;
  if (argc > 1) redis.host = argv[1];
  if (argc > 2) redis.port = static_cast<std::uint16_t>(std::stoi(argv[2]));

  net::io_context io;
  rein::redis::shared_token_bucket quota(io, redis,
                                         {.key = "rein:example:quota",
                                          .rate = 5,
                                          .capacity = 5,
                                          .on_failure = rein::redis::failure_policy::fail_open,
                                          .fail_open_share = 0.5});

  const auto start = std::chrono::steady_clock::now();
  int running = 3;
  for (int worker = 0; worker < 3; ++worker) {
    net::co_spawn(io, [&, worker]() -> net::awaitable<void> {
      for (int call = 0; call < 10; ++call) {
        co_await quota.acquire();  // one token from the fleet's bucket, or from the local share without Redis
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
        std::printf("%6lld ms  worker %d  call %d\n", static_cast<long long>(ms.count()), worker, call);
      }
      if (--running == 0) quota.close();  // closes its connection too, so run() returns
    }, net::detached);
  }
  io.run();

  const auto s = quota.snapshot();
  std::printf("admitted %llu: %llu by Redis, %llu locally; %llu round trips, mean %.0f us; longest wait %.0f ms\n",
              static_cast<unsigned long long>(s.acquired_total), static_cast<unsigned long long>(s.remote_allowed),
              static_cast<unsigned long long>(s.local_admitted), static_cast<unsigned long long>(s.round_trips),
              s.round_trips ? std::chrono::duration<double, std::micro>(s.round_trip_total).count() / static_cast<double>(s.round_trips) : 0.0,
              std::chrono::duration<double, std::milli>(s.wait_max).count());
}
