// The contended handoff of benchmarks/semaphore.cpp (64 coroutines share 4 permits: acquire, co_await post,
// release) for an exact number of iterations, so that an instruction counter (callgrind) can compare the
// idioms without the timing noise of code placement, which moves the contended rows of the timed benchmark
// by up to 15% between builds of the same code. instructions.sh runs it.
//
//   rein_handoff_count <idiom> <iterations> [reactor: 0|1, default 1]
//   idioms: floor, bare_semaphore (rein_bench::handoff_floor), single_thread_semaphore, semaphore,
//           single_thread_semaphore_untimed, semaphore_untimed,
//           single_thread_semaphore_observed, semaphore_observed (an observer set that counts events),
//           single_thread_semaphore_coarse, semaphore_coarse (waits timed on the coarse clock),
//           single_thread_semaphore_direct, semaphore_direct (semaphore_options::direct_handoff),
//           channel_async_send, channel_try_send_then_async_send, concurrent_channel_async_send,
//           concurrent_channel_try_send_then_async_send
#include "../support/channel_semaphore.hpp"
#include "../support/floors.hpp"

#include <rein/config.hpp>
#include <rein/observer.hpp>
#include <rein/permit.hpp>
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

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

namespace {

namespace net = rein::net;
using rein_bench::channel_semaphore;
using rein_bench::post_round_trip;

constexpr int coroutines = 64;
constexpr std::size_t permits = 4;
long remaining = 0;

bool next() noexcept { return remaining-- > 0; }

net::awaitable<void> floor_loop() {
  while (next()) co_await post_round_trip();
}

template <class Sem>
net::awaitable<void> rein_loop(Sem& sem) {
  while (next()) {
    rein::permit p = co_await sem.acquire();
    co_await post_round_trip();
  }
}

template <class Sem>
net::awaitable<void> idiom_loop(Sem& sem) {
  while (next()) {
    co_await sem.acquire();
    co_await post_round_trip();
    sem.release();
  }
}

template <class Sem, class Loop>
void run(net::io_context& io, Sem& sem, Loop loop) {
  for (int i = 0; i < coroutines; ++i) net::co_spawn(io, loop(sem), net::detached);
  io.run();
}

template <class Channel, bool TrySendFirst>
void run_channel(net::io_context& io) {
  channel_semaphore<Channel, TrySendFirst> sem(io.get_executor(), permits);
  run(io, sem, [](auto& s) { return idiom_loop(s); });
}

long observed_events = 0;

template <class Sem>
void run_rein(net::io_context& io, bool measure_wait, bool observed = false, bool coarse = false,
              bool direct = false) {
  rein::limiter_observer observer;
  if (observed) observer = [](const rein::limiter_event&) { ++observed_events; };
  Sem sem(io.get_executor(), permits,
          {.measure_wait = measure_wait,
           .coarse_wait_clock = coarse,
           .observer = std::move(observer),
           .direct_handoff = direct});
  run(io, sem, [](auto& s) { return rein_loop(s); });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s <idiom> <iterations> [reactor 0|1]\n", argv[0]);
    return 2;
  }
  const std::string idiom = argv[1];
  remaining = std::atol(argv[2]);
  net::io_context io;
  std::optional<net::steady_timer> reactor;  // a timer starts the io_context's reactor
  if (argc < 4 || std::atoi(argv[3]) != 0) reactor.emplace(io);
  using rein_bench::channel;
  using rein_bench::concurrent_channel;
  if (idiom == "floor") {
    for (int i = 0; i < coroutines; ++i) net::co_spawn(io, floor_loop(), net::detached);
    io.run();
  } else if (idiom == "bare_semaphore") {
    rein_bench::handoff_floor sem(io.get_executor(), permits);
    run(io, sem, [](auto& s) { return idiom_loop(s); });
  } else if (idiom == "single_thread_semaphore") {
    run_rein<rein::single_thread_semaphore>(io, true);
  } else if (idiom == "semaphore") {
    run_rein<rein::semaphore>(io, true);
  } else if (idiom == "single_thread_semaphore_untimed") {
    run_rein<rein::single_thread_semaphore>(io, false);
  } else if (idiom == "semaphore_untimed") {
    run_rein<rein::semaphore>(io, false);
  } else if (idiom == "single_thread_semaphore_observed") {
    run_rein<rein::single_thread_semaphore>(io, true, true);
  } else if (idiom == "semaphore_observed") {
    run_rein<rein::semaphore>(io, true, true);
  } else if (idiom == "single_thread_semaphore_coarse") {
    run_rein<rein::single_thread_semaphore>(io, true, false, true);
  } else if (idiom == "semaphore_coarse") {
    run_rein<rein::semaphore>(io, true, false, true);
  } else if (idiom == "single_thread_semaphore_direct") {
    run_rein<rein::single_thread_semaphore>(io, true, false, false, true);
  } else if (idiom == "semaphore_direct") {
    run_rein<rein::semaphore>(io, true, false, false, true);
  } else if (idiom == "channel_async_send") {
    run_channel<channel, false>(io);
  } else if (idiom == "channel_try_send_then_async_send") {
    run_channel<channel, true>(io);
  } else if (idiom == "concurrent_channel_async_send") {
    run_channel<concurrent_channel, false>(io);
  } else if (idiom == "concurrent_channel_try_send_then_async_send") {
    run_channel<concurrent_channel, true>(io);
  } else {
    std::fprintf(stderr, "unknown idiom: %s\n", idiom.c_str());
    return 2;
  }
  return remaining < 0 ? 0 : 1;  // every iteration ran
}
