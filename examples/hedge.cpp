// Hedged requests against a slow tail, in real time on Asio timers.
//
// A fake upstream answers most calls in 5 to 10 ms, but 3% of them take 200 ms (a slow replica, a garbage
// collection, a queue behind a big request: the causes "The Tail at Scale" lists). 500 calls arrive, one a
// millisecond, each through a rein::semaphore of 64 in-flight calls. They run twice: plain, then through
// rein::hedge with the delay at the 95th percentile of the policy's own recent latencies. The program prints
// the callers' p50 and p99 both ways, and what the hedges cost:
//
//     hedge
//
// Both attempts of a hedged call acquire their own permit (the op acquires): the semaphore counts both, and
// the loser's permit comes back when its cancellation unwinds it.
#include "usage.hpp"

#include <rein/hedge.hpp>
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

#include <chrono>
#include <cstdio>
#include <random>

namespace net = rein::net;
using namespace std::chrono_literals;

namespace {

constexpr const char* usage = "usage: hedge\n";
constexpr int calls = 500;

// Answers in 5 to 10 ms, or in 200 ms for 3% of calls; draws from a fixed seed.
class upstream {
 public:
  net::awaitable<rein::attempt<int>> call(rein::semaphore& limiter) {
    rein::permit permit = co_await limiter.acquire();
    net::steady_timer timer(co_await net::this_coro::executor, latency());
    co_await timer.async_wait(net::use_awaitable);  // a cancelled loser throws here; its permit goes back
    co_return rein::attempt<int>::success(200);
  }

 private:
  std::chrono::microseconds latency() {
    if (std::uniform_real_distribution<double>(0.0, 1.0)(random_) < 0.03) return 200ms;
    return std::chrono::microseconds(std::uniform_int_distribution<int>(5'000, 10'000)(random_));
  }

  std::mt19937_64 random_{42};
};

struct run_result {
  rein::duration_histogram latency;  // as the callers saw it
  std::uint64_t attempts = 0;
};

// One caller: times the whole call, hedged or not.
net::awaitable<void> one_call(upstream& up, rein::semaphore& limiter, rein::hedge_policy* policy, run_result& out) {
  const auto start = std::chrono::steady_clock::now();
  auto attempt = [&] { return up.call(limiter); };
  if (policy) co_await rein::hedge(*policy, attempt);
  else co_await attempt();
  out.latency.record(std::chrono::steady_clock::now() - start);
}

// Starts one call a millisecond.
net::awaitable<void> arrivals(upstream& up, rein::semaphore& limiter, rein::hedge_policy* policy, run_result& out) {
  auto executor = co_await net::this_coro::executor;
  net::steady_timer tick(executor);
  for (int i = 0; i < calls; ++i) {
    net::co_spawn(executor, one_call(up, limiter, policy, out), net::detached);
    tick.expires_after(1ms);
    co_await tick.async_wait(net::use_awaitable);
  }
}

run_result run(rein::hedge_policy* policy) {
  net::io_context io;
  rein::semaphore limiter(io, 64);
  upstream up;
  run_result out;
  net::co_spawn(io, arrivals(up, limiter, policy, out), net::detached);
  io.run();
  out.attempts = limiter.snapshot().acquired_total;
  return out;
}

double ms(std::chrono::nanoseconds d) { return std::chrono::duration<double, std::milli>(d).count(); }

void print(const char* label, const run_result& r) {
  std::printf("%-16s calls=%llu p50=%.1f ms p99=%.1f ms max=%.1f ms attempts=%llu\n", label,
              static_cast<unsigned long long>(r.latency.count()), ms(r.latency.p50()), ms(r.latency.p99()),
              ms(r.latency.max()), static_cast<unsigned long long>(r.attempts));
}

}  // namespace

int main(int argc, char** argv) {
  if (rein_example::asked_for_help(argc, argv, usage)) return 0;
  if (rein_example::unexpected_arguments(argc, argv, usage)) return 2;

  rein::hedge_options options;
  options.quantile = 95.0;         // hedge the calls slower than 95% of recent ones
  options.min_samples = 20;        // until 20 latencies are known ...
  options.delay = 20ms;            // ... hedge after 20 ms
  options.latency_period = 100ms;  // latencies of the last full 100 ms
  options.name = "upstream";       // the default budget: 10% of calls, plus 1 a second
  rein::hedge_policy policy(options);

  print("without hedging", run(nullptr));
  print("with hedging", run(&policy));
  const auto s = policy.snapshot();
  std::printf("hedges: started=%llu won=%llu cancelled=%llu refused=%llu\n",
              static_cast<unsigned long long>(s.hedges_total), static_cast<unsigned long long>(s.hedges_won_total),
              static_cast<unsigned long long>(s.hedges_cancelled_total),
              static_cast<unsigned long long>(s.hedges_refused_total));
  return 0;
}
