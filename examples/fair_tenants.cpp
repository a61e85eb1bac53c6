// Three tenants share one upstream limit of 8 calls in flight: "bulk" floods it with 60 callers, "alice" has 6
// and "bob", on a plan twice as large, 6 at weight 2.
//
// Each caller goes through a throttle whose global stage is the shared limit, makes a 10 ms call, and asks
// again at once. First the limit serves its line in fifo order: bulk, with ten times the callers, takes most
// calls. Then in fair order (rein::queue_order::fair): while tenants wait, each gets its weight's share,
// alice 25%, bob 50%, bulk 25%, whatever their numbers of callers. The program runs for about 0.6 s.
#include "usage.hpp"

#include <rein/queue_order.hpp>
#include <rein/semaphore.hpp>
#include <rein/throttle.hpp>

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
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>

namespace net = rein::net;
using namespace std::chrono_literals;

namespace {

struct tenant {
  const char* name;
  int callers;
};
constexpr tenant tenants[] = {{"bulk", 60}, {"alice", 6}, {"bob", 6}};

// Runs every tenant's callers against a limit of 8 in `order` for `how_long`; returns calls made per tenant.
std::map<std::string, int> run(rein::queue_order order, std::chrono::milliseconds how_long) {
  net::io_context io;
  rein::semaphore upstream(io, 8, {.name = "upstream", .order = order});
  rein::throttle_options options;
  // Weights need a line that serves by them: a throttle refuses key_weight with no fair stage to read it.
  if (order == rein::queue_order::fair)
    options.key_weight = [](std::string_view tenant) -> std::uint32_t { return tenant == "bob" ? 2 : 1; };
  rein::throttle throttle(rein::unlimited, upstream, std::move(options));
  std::map<std::string, int> calls;
  const auto end = std::chrono::steady_clock::now() + how_long;
  auto caller = [&](std::string name) -> net::awaitable<void> {
    for (;;) {
      auto guard = co_await throttle.acquire(name);
      if (std::chrono::steady_clock::now() >= end) co_return;  // time is up: the callers still waiting leave
      ++calls[name];
      net::steady_timer call(co_await net::this_coro::executor, 10ms);  // the upstream call
      co_await call.async_wait(net::use_awaitable);
      guard.complete(rein::outcome::success);
    }
  };
  for (const tenant& t : tenants)
    for (int i = 0; i < t.callers; ++i) net::co_spawn(io, caller(t.name), net::detached);
  io.run();
  return calls;
}

// Prints each tenant's share; returns the largest distance from `expected` (percentage points).
double report(const char* title, const std::map<std::string, int>& calls, const std::map<std::string, double>& expected) {
  int total = 0;
  for (const auto& [name, n] : calls) total += n;
  std::printf("%s (%d calls)\n", title, total);
  double worst = 0;
  for (const tenant& t : tenants) {
    const double share = total == 0 ? 0 : 100.0 * calls.at(t.name) / total;
    std::printf("  %-5s %2d callers: %5.1f%% of the calls (fair share %4.1f%%)\n", t.name, t.callers, share,
                expected.at(t.name));
    worst = std::max(worst, std::abs(share - expected.at(t.name)));
  }
  return worst;
}

}  // namespace

constexpr const char* usage =
    "usage: fair_tenants [--help]\n"
    "  3 tenants (60, 6 and 6 callers, weights 1, 1, 2) share 8 calls in flight: fifo, then fair (about 0.6 s)\n";

int main(int argc, char** argv) {
  if (rein_example::asked_for_help(argc, argv, usage)) return 0;
  if (rein_example::unexpected_arguments(argc, argv, usage)) return 2;
  const std::map<std::string, double> fair = {{"bulk", 25.0}, {"alice", 25.0}, {"bob", 50.0}};
  report("fifo order: served by arrival", run(rein::queue_order::fifo, 300ms), fair);
  const double off = report("fair order: each tenant its weight's share", run(rein::queue_order::fair, 300ms), fair);
  // Real timers finish a batch of calls at once, so the shares are close to exact, not exact (the tests show
  // them exact on the manual clock).
  return off <= 5.0 ? 0 : 1;
}
