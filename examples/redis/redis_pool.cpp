// One concurrency limit for a whole fleet: every process running this program against the same Redis shares
// 3 permits ("the database takes at most 3 of our queries at once"). Each of 4 workers holds a permit for
// 200 ms per query. Start it in two terminals and they take turns: together never more than 3 queries at
// once. Kill one with Ctrl-C while it holds permits and the other gets them back within the lease (2 s).
// With --cluster, the same on a Redis Cluster: the seeds are any of its nodes.
//
//   redis_pool [host [port]]      default 127.0.0.1 6379
//   redis_pool --cluster host:port [host:port ...]
#include "../usage.hpp"

#include <rein/redis/cluster.hpp>
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
#include <memory>
#include <string>
#include <string_view>

namespace net = rein::net;

constexpr const char* usage =
    "usage: redis_pool [host [port]]      default 127.0.0.1 6379\n"
    "       redis_pool --cluster host:port [host:port ...]\n"
    "  four workers run 5 queries each, 200 ms apiece, under 3 permits shared through Redis\n";

int main(int argc, char** argv) {
  if (rein_example::asked_for_help(argc, argv, usage)) return 0;
  const bool on_cluster = argc > 1 && std::string_view(argv[1]) == "--cluster";
  rein::redis::connection_options redis;
  rein::redis::cluster_options cluster_seeds;
  if (on_cluster) {
    for (int i = 2; i < argc; ++i) {
      const std::string seed = argv[i];
      const auto colon = seed.rfind(':');
      if (colon == std::string::npos) return std::fprintf(stderr, "%s", usage), 2;
      cluster_seeds.seeds.push_back({seed.substr(0, colon), static_cast<std::uint16_t>(std::stoi(seed.substr(colon + 1)))});
    }
  } else {
    if (argc > 1) redis.host = argv[1];
    if (argc > 2) redis.port = static_cast<std::uint16_t>(std::stoi(argv[2]));
  }

  net::io_context io;
  // Shared with the pool, so that the last releases can be waited for: one server, or a cluster.
  rein::redis::connection connection(io, redis);
  std::unique_ptr<rein::redis::cluster> cluster;
  const rein::redis::shared_semaphore_options options{.key = "rein:example:pool", .limit = 3, .lease = std::chrono::seconds(2)};
  std::unique_ptr<rein::redis::shared_semaphore> pool_on;
  if (on_cluster) {
    cluster = std::make_unique<rein::redis::cluster>(io, cluster_seeds);
    pool_on = std::make_unique<rein::redis::shared_semaphore>(*cluster, options);  // on the master of its slot
  } else {
    pool_on = std::make_unique<rein::redis::shared_semaphore>(connection, options);
  }
  rein::redis::shared_semaphore& pool = *pool_on;

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
        // On a cluster, the PING goes to the node of the pool's hash tag (its key in braces).
        static constexpr std::array<std::string_view, 1> ping{"PING"};
        if (cluster) co_await cluster->async_execute("{rein:example:pool}", ping, net::use_awaitable);
        else co_await connection.async_execute(ping, net::use_awaitable);
        pool.close();        // stops the lease renewals
        connection.close();  // and with nothing left to do, run() returns
        if (cluster) cluster->close();
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
