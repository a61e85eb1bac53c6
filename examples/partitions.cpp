// One pool of 10 database connections shared by live requests (70% guaranteed) and batch jobs (30%).
//
// Batch jobs arrive first and borrow the whole idle pool; live requests then arrive in a burst. Without
// partitions they would queue behind every batch job; with them, each connection that comes free goes to a
// live request until live holds its 7, while batch keeps its 3. The calls are simulated by 20 ms timers; the
// program runs for about 0.3 s and prints each kind's longest wait.
#include "usage.hpp"

#include <rein/partition.hpp>
#include <rein/semaphore.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#else
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

namespace net = rein::net;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr auto call_time = 20ms;

struct pool {
  rein::semaphore connections;
  std::size_t most_in_flight = 0;
  std::size_t most_live = 0;
  clock_type::duration longest_wait[2]{};  // batch, live

  net::awaitable<void> call(const char* kind) {
    const bool live = std::string(kind) == "live";
    const auto asked = clock_type::now();
    rein::permit connection = co_await connections.partition(kind).acquire();
    longest_wait[live] = std::max(longest_wait[live], clock_type::now() - asked);
    const rein::semaphore_snapshot s = connections.snapshot();
    most_in_flight = std::max(most_in_flight, s.in_flight);
    most_live = std::max(most_live, s.partitions[2].in_flight);  // the rest, batch, live
    net::steady_timer query(co_await net::this_coro::executor, call_time);
    co_await query.async_wait(net::use_awaitable);
  }  // the connection goes back here, to its partition

  net::awaitable<void> live_burst(int requests) {
    net::steady_timer later(co_await net::this_coro::executor, 5ms);  // once batch holds the whole pool
    co_await later.async_wait(net::use_awaitable);
    const auto executor = co_await net::this_coro::executor;
    for (int i = 0; i < requests; ++i) net::co_spawn(executor, call("live"), net::detached);
  }
};

long ms(clock_type::duration d) {
  return static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
}

}  // namespace

constexpr const char* usage =
    "usage: partitions [--help]\n"
    "  40 batch jobs and 14 live requests share 10 connections, live guaranteed 70% (about 0.3 s)\n";

int main(int argc, char** argv) {
  if (rein_example::asked_for_help(argc, argv, usage)) return 0;
  if (rein_example::unexpected_arguments(argc, argv, usage)) return 2;
  net::io_context io;
  pool p{rein::semaphore(io, 10, {.name = "db", .partitions = {{"batch", 0.3}, {"live", 0.7}}})};
  for (int i = 0; i < 40; ++i) net::co_spawn(io, p.call("batch"), net::detached);
  net::co_spawn(io, p.live_burst(14), net::detached);
  io.run();

  const rein::semaphore_snapshot s = p.connections.snapshot();
  for (const rein::partition_snapshot& part : s.partitions) {
    if (part.name.empty()) continue;
    std::printf("%-5s guaranteed %zu of %zu connections, %llu calls, longest wait %ld ms\n", part.name.c_str(),
                part.guaranteed, s.permits, static_cast<unsigned long long>(part.acquired_total),
                ms(p.longest_wait[part.name == "live"]));
  }
  std::printf("most in flight at once: %zu (never more than %zu); most live at once: %zu\n", p.most_in_flight,
              s.permits, p.most_live);
  // Live's 14 requests need two rounds of 20 ms at 7 connections; behind 40 batch jobs in one line they
  // would have waited for four rounds of the whole pool.
  return p.most_in_flight <= s.permits && p.most_live == 7 ? 0 : 1;
}
