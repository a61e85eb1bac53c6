// statsd: rein's events and snapshots as StatsD lines on UDP, through the observer adaptor of
// examples/statsd.hpp (metrics_sink, forward_events, snapshot_reporter, statsd_sink).
//
//     statsd [--port P]
//
// For about a second, eight workers share a semaphore "pool" of 2 permits (2 may wait, each at most 50 ms)
// behind a quota gate "api" that pauses once for 200 ms; the limiters' observers send their events and a
// timer sends the pool's snapshot every 250 ms, as `rein.pool.rejected.timed_out:3|c`,
// `rein.pool.in_flight:2|g`, `rein.api.pause:200|ms`, to 127.0.0.1:P (default 8125, StatsD's port). Watch
// them with `nc -ulk 8125`; it prints how many lines it sent.
#include "statsd.hpp"
#include "usage.hpp"

#include <rein/quota_gate.hpp>
#include <rein/semaphore.hpp>

#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string_view>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#else
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#endif

namespace {

namespace net = rein::net;
using namespace std::chrono_literals;

constexpr const char* usage = "usage: statsd [--port P]   (StatsD lines to 127.0.0.1:P, default 8125)\n";

// The StatsD sink, counting the lines it sends for the summary.
class counted_sink : public rein_example::statsd_sink {
 public:
  using statsd_sink::statsd_sink;
  void count(std::string_view name, std::uint64_t n) override { ++lines; statsd_sink::count(name, n); }
  void gauge(std::string_view name, double value) override { ++lines; statsd_sink::gauge(name, value); }
  void timing(std::string_view name, std::chrono::nanoseconds d) override { ++lines; statsd_sink::timing(name, d); }
  int lines = 0;
};

net::awaitable<void> worker(rein::quota_gate& gate, rein::semaphore& pool) {
  auto ex = co_await net::this_coro::executor;
  for (int i = 0; i < 4; ++i) {
    co_await gate.acquire();
    try {
      auto permit = co_await pool.acquire_for(1, 50ms);
      co_await net::steady_timer(ex, 60ms).async_wait(net::use_awaitable);  // the call
    } catch (const rein::system_error&) {
      // refused (timed out or the line was full): the observer has counted it
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (rein_example::asked_for_help(argc, argv, usage)) return 0;
  unsigned short port = 8125;
  if (argc == 3 && std::string_view(argv[1]) == "--port") {
    const std::string_view text = argv[2];
    if (std::from_chars(text.data(), text.data() + text.size(), port).ec != std::errc{}) port = 0;
  }
  if ((argc != 1 && argc != 3) || port == 0) {
    std::fputs(usage, stderr);
    return 2;
  }
  try {
    net::io_context io;
    counted_sink sink(io.get_executor(), {net::ip::address_v4::loopback(), port});
    rein::quota_gate gate(io, {}, {.name = "api", .observer = rein_example::forward_events(sink)});
    rein::semaphore pool(io, 2, {.name = "pool", .max_waiters = 2, .observer = rein_example::forward_events(sink)});
    rein_example::snapshot_reporter reporter(sink);

    for (int i = 0; i < 8; ++i) net::co_spawn(io, worker(gate, pool), net::detached);
    gate.pause_for(200ms);  // as a 429's Retry-After would
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
          net::steady_timer every(io);
          for (int i = 0; i < 5; ++i) {
            every.expires_after(250ms);
            co_await every.async_wait(net::use_awaitable);
            reporter.report(pool.name(), pool.snapshot());
          }
        },
        net::detached);
    io.run();
    std::printf("sent %d StatsD lines to 127.0.0.1:%u\n", sink.lines, unsigned{port});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "statsd: %s\n", e.what());
    return 1;
  }
  return 0;
}
