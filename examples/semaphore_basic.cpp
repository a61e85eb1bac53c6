// semaphore_basic: twelve workers share three permits around a simulated 40 ms call.
//
// Each worker makes three calls; `co_await sem.acquire()` admits at most three at a time, in the order they
// asked, and the permit goes back when it leaves scope. One impatient caller uses acquire_for and gives up
// when its deadline passes first. The program prints each call as it starts, then the semaphore's snapshot.
// It takes about half a second (36 calls / 3 at a time x 40 ms).
#include "usage.hpp"

#include <rein/semaphore.hpp>

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

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace net = rein::net;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr int workers = 12;
constexpr int calls_per_worker = 3;
constexpr std::size_t permits = 3;
constexpr auto call_time = 40ms;

struct demo {
  rein::semaphore sem;
  clock_type::time_point start = clock_type::now();
  int in_flight = 0;
  int max_in_flight = 0;

  long elapsed_ms() const {
    return static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - start).count());
  }

  // The call a real program would make (an HTTP request, a database query), simulated by a timer.
  net::awaitable<void> simulated_call() {
    net::steady_timer timer(co_await net::this_coro::executor, call_time);
    co_await timer.async_wait(net::use_awaitable);
  }

  net::awaitable<void> worker(int id) {
    for (int call = 1; call <= calls_per_worker; ++call) {
      const auto asked = clock_type::now();
      rein::permit permit = co_await sem.acquire();  // waits here while three calls are in flight
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - asked);
      max_in_flight = std::max(max_in_flight, ++in_flight);
      std::printf("%4ld ms  worker %2d call %d starts (waited %3ld ms, %d in flight)\n", elapsed_ms(), id, call,
                  static_cast<long>(waited.count()), in_flight);
      co_await simulated_call();
      --in_flight;
    }  // the permit goes back here
  }

  net::awaitable<void> impatient() {
    try {
      rein::permit permit = co_await sem.acquire_for(1, 10ms);
      std::printf("%4ld ms  the impatient caller got a permit\n", elapsed_ms());
    } catch (const rein::system_error& e) {
      std::printf("%4ld ms  the impatient caller gave up: %s\n", elapsed_ms(), e.code().message().c_str());
    }
  }
};

}  // namespace

constexpr const char* usage =
    "usage: semaphore_basic [--help]\n"
    "  twelve workers share three permits around a simulated 40 ms call (about 0.5 s)\n";

int main(int argc, char** argv) {
  if (rein_example::asked_for_help(argc, argv, usage)) return 0;
  if (rein_example::unexpected_arguments(argc, argv, usage)) return 2;
  net::io_context io;
  demo d{rein::semaphore(io, permits)};
  for (int id = 1; id <= workers; ++id) net::co_spawn(io, d.worker(id), net::detached);
  net::co_spawn(io, d.impatient(), net::detached);
  io.run();

  const rein::semaphore_snapshot s = d.sem.snapshot();
  std::printf("\n%d workers x %d calls of %lld ms through %zu permits took %ld ms\n", workers, calls_per_worker,
              static_cast<long long>(call_time.count()), permits, d.elapsed_ms());
  std::printf("most in flight at once: %d (never more than the %zu permits)\n", d.max_in_flight, s.permits);
  std::printf("snapshot: available %zu of %zu, waiting %zu, acquired %llu, timed out %llu, longest wait %lld ms\n",
              s.available, s.permits, s.waiting, static_cast<unsigned long long>(s.acquired_total),
              static_cast<unsigned long long>(s.timed_out_total),
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(s.wait_max).count()));
  return d.max_in_flight <= static_cast<int>(permits) && s.available == permits ? 0 : 1;
}
