// model_failover: reserve on the preferred model's quota, and go to the fallback when the wait is too long.
//
// Two models each have a token bucket (the preferred one 50 tokens per second, bursts of 40; the fallback
// 25 per second, bursts of 20). Sixteen requests of 10 tokens arrive 80 ms apart. Each reserves on the
// preferred model (rein::token_bucket::reserve, Go's ReserveN): if its tokens are there within 200 ms it
// waits for them and goes; otherwise it cancels (the tokens go back, so the next request is not held
// behind an unused reservation) and tries the fallback the same way; if neither can serve it in time it
// is shed. The program prints where each request went and when, then both buckets' snapshots. It takes
// about a second and a half.
#include "usage.hpp"

#include <rein/token_bucket.hpp>

// rein::net is boost::asio, or asio when REIN_STANDALONE_ASIO is defined (rein/config.hpp).
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

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <iostream>

namespace net = rein::net;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr int requests = 16;
constexpr std::size_t cost = 10;  // tokens per request
constexpr auto spacing = 80ms;
constexpr auto longest_wait = 200ms;

struct demo {
  rein::token_bucket preferred;
  rein::token_bucket fallback;
  clock_type::time_point start = clock_type::now();

  long elapsed_ms() const {
    return static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - start).count());
  }

  // Waits for `cost` tokens of `model` if they are there within longest_wait; otherwise gives them back.
  static net::awaitable<bool> take_if_soon(rein::token_bucket& model) {
    rein::token_bucket::reservation r = model.reserve(cost);
    if (!r || r.delay() > longest_wait) {
      r.cancel();
      co_return false;
    }
    co_await r.wait();
    co_return true;
  }

  net::awaitable<void> request(int id) {
    const long arrived = elapsed_ms();
    const char* where = "shed";
    if (co_await take_if_soon(preferred)) where = "preferred";
    else if (co_await take_if_soon(fallback)) where = "fallback";
    std::printf("request %2d: arrived at %4ld ms, %-9s at %4ld ms\n", id, arrived, where, elapsed_ms());
  }

  net::awaitable<void> arrivals() {
    net::steady_timer timer(co_await net::this_coro::executor);
    for (int id = 1; id <= requests; ++id) {
      net::co_spawn(timer.get_executor(), request(id), net::detached);
      timer.expires_after(spacing);
      co_await timer.async_wait(net::use_awaitable);
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  static const char* const usage = "usage: model_failover\n";
  if (rein_example::asked_for_help(argc, argv, usage)) return 0;
  if (rein_example::unexpected_arguments(argc, argv, usage)) return 2;
  net::io_context io;
  demo d{rein::token_bucket(io, {.rate = 50, .capacity = 40}, {.name = "preferred"}),
         rein::token_bucket(io, {.rate = 25, .capacity = 20}, {.name = "fallback"})};
  net::co_spawn(io, d.arrivals(), net::detached);
  io.run();
  std::cout << "preferred: " << d.preferred.snapshot() << "\nfallback:  " << d.fallback.snapshot() << '\n';
}
